"""GPT-OSS-style models go to Megatron-LM exactly or are refused with the reason (issue 25, task h26e).

``tests/data/gpt_oss_cases`` holds transformers' ``GptOssForCausalLM`` with every GPT-OSS feature but its YaRN
scaling (``make_gpt_oss_cases.py``), both torch exporters; ``tests/data/sink_cases`` the same model with GptOssConfig's
default YaRN rope scaling. Every expected flag is derived here from the config the files were exported from and
from transformers 5.24's ``GptOssExperts`` / ``GptOssConfig`` defaults (``alpha = 1.702``, ``swiglu_limit = 7``, the
linear half's ``+ 1``; YaRN ``factor`` 32, ``beta_fast`` 32, ``beta_slow`` 1, ``original_max_position_embeddings``
4096, ``truncate`` false, ``rope_theta`` 150,000)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from exporters.megatron import export_megatron, megatron_masks, megatron_violations
from exporters.megatron.families import megatron_family
from exporters.megatron.quick_geglu import quick_geglu_refusal
from exporters.megatron.sinks import SINK_KERNEL_NOTE
from exporters.validate import parse_megatron_args
from importers.quick_geglu import QuickGeglu, quick_geglu_gates
from importers.rotary import rotary_frequencies
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = DATA / "gpt_oss_cases"
CONFIG = json.loads((CASES / "counts.json").read_text())["configs"]["gpt_oss_rope"]
FILES = sorted(json.loads((CASES / "counts.json").read_text())["files"])
YARN_FILES = sorted((DATA / "sink_cases").glob("*.onnx"))


@pytest.fixture(scope="module", params=FILES)
def gpt_oss(request):
    return load_graph(CASES / request.param, {"batch": 8, "seq": 16})


def _export(graph, *, dp=1, tp=1, settings=None):
    spaces = spaces_for(graph, dp * tp)
    masks = megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=False)
    assert masks is not None
    return export_megatron(make_input(graph, spaces, first_rows(masks), settings=settings or TrainingSettings(),
                                      global_batch=8))


def test_every_gpt_oss_feature_has_its_flag(gpt_oss):
    args = parse_megatron_args(_export(gpt_oss)["args"])
    # GptOssAttention.sinks (one logit per head) -> TransformerConfig.softmax_type
    assert args["softmax-type"] == "learnable"
    # GptOssExperts._apply_gate: clamp(gate, max=7) * sigmoid(1.702 gate) * (clamp(up, -7, 7) + 1)
    assert args["quick-geglu"] and args["no-bias-gelu-fusion"] and "swiglu" not in args
    assert (float(args["activation-func-clamp-value"]), float(args["glu-linear-offset"])) == (7.0, 1.0)
    # sliding_window 8: keys q-7..q, (7, 0); layer_types sliding, full: layer 2 of every 2 attends fully
    assert args["window-size"] == f"{CONFIG['sliding_window'] - 1},0" and args["window-attn-skip-freq"] == 2
    assert int(args["rotary-base"]) == CONFIG["rope_parameters"]["rope_theta"]
    # attention_bias and the experts' and router's biases: Megatron's add_bias_linear (no --disable-bias-linear)
    assert "disable-bias-linear" not in args and "add-qkv-bias" not in args
    assert (args["num-experts"], args["moe-router-topk"]) == (CONFIG["num_local_experts"], CONFIG["num_experts_per_tok"])
    assert "moe-router-pre-softmax" not in args  # GptOssTopKRouter: top-k of the logits, then their softmax
    assert args["num-query-groups"] == CONFIG["num_key_value_heads"]
    assert args["ffn-hidden-size"] == CONFIG["intermediate_size"] and args["untie-embeddings-and-output-weights"]


def test_the_quick_gelu_gate_constants_are_read_from_both_exporters(gpt_oss):
    gates = quick_geglu_gates(str(gpt_oss.source_path))
    assert len(gates) == CONFIG["num_hidden_layers"]
    assert set(gates) == {QuickGeglu(alpha=float(np.float32(1.702)), gate_clamp=(None, 7.0), linear_clamp=(-7.0, 7.0),
                                     linear_offset=1.0)}


def test_expert_bias_lookups_are_no_position_table_and_the_mlp_is_gated(gpt_oss):
    model = analyze_transformer(gpt_oss)
    assert model.position_table_rows is None  # gate_up_proj_bias[router indices] is no 4-row position table
    assert model.gated_mlp and model.ffn_hidden_size == CONFIG["intermediate_size"]


def test_flash_priced_plans_name_cudnn_and_say_so(gpt_oss):
    out = _export(gpt_oss, settings=TrainingSettings(engine="fused", attention="flash"))
    assert parse_megatron_args(out["args"])["attention-backend"] == "fused"
    assert SINK_KERNEL_NOTE in out["notes"]
    out = _export(gpt_oss, settings=TrainingSettings(engine="fused", attention="cudnn"))
    assert SINK_KERNEL_NOTE not in out["notes"]


def test_biased_experts_are_not_listed_at_tp_2(gpt_oss):
    # 4 heads and 2 query groups divide tp = 2: only the experts' biases (ETP == 1 in megatron-core) refuse it
    assert megatron_masks(gpt_oss, spaces_for(gpt_oss, 2), dp=1, tp=2) is None
    assert megatron_masks(gpt_oss, spaces_for(gpt_oss, 2), dp=2, tp=1) is not None


@pytest.mark.parametrize("path", YARN_FILES, ids=lambda p: p.name)
def test_yarn_is_refused_with_its_factors(path):
    graph = load_graph(path, {"batch": 2, "seq": 16})
    found = rotary_frequencies(path).yarn
    # transformers' _compute_yarn_parameters with truncate=False: d ln(L / (2 pi beta)) / (2 ln b), d = head_dim 16
    def dim(beta):
        return 16 * math.log(4096 / (2 * math.pi * beta)) / (2 * math.log(150000.0))
    assert (found.base, found.factor) == (150000.0, 32.0)
    assert found.ramp == pytest.approx((dim(32.0), dim(1.0)), rel=1e-4)
    with pytest.raises(UnsupportedExport) as refused:
        megatron_family(graph, analyze_transformer(graph))
    reason = str(refused.value)
    assert "YaRN's scaling of a geometric series (base 150000, factor 32, ramped between channel pairs 2.02 and 4.35" in reason
    assert "sink" not in reason and "quick-GELU" not in reason  # every other feature has its flag


def test_a_quick_gelu_gate_megatron_cannot_say_is_refused(gpt_oss, monkeypatch):
    import exporters.megatron.quick_geglu as module

    model = analyze_transformer(gpt_oss)
    assert quick_geglu_refusal(gpt_oss, model) == []
    monkeypatch.setattr(module, "quick_geglu_gates", lambda *a: (QuickGeglu(alpha=1.0, gate_clamp=(-7.0, 7.0),
                                                                             linear_clamp=(-7.0, 7.0)),))
    (clause,) = quick_geglu_refusal(gpt_oss, model)
    assert "its a is 1 and Megatron-LM's --quick-geglu fixes a = 1.702" in clause
    assert "clamps the gate to [-7, 7] and the linear half to [-7, 7]" in clause


def test_gates_whose_constants_are_external_are_refused_for_that_not_as_different(gpt_oss, monkeypatch):
    import exporters.megatron.quick_geglu as module

    model = analyze_transformer(gpt_oss)
    def external():  # each layer's a read as its own nan, as from a file whose constants are external
        return QuickGeglu(alpha=float("nan"), gate_clamp=(None, 7.0), linear_clamp=(-7.0, 7.0), linear_offset=1.0)

    monkeypatch.setattr(module, "quick_geglu_gates", lambda *a: (external(), external()))  # nan != nan: "differ"
    (clause,) = quick_geglu_refusal(gpt_oss, model)
    assert "is not in the file" in clause and "differ" not in clause


@pytest.mark.parametrize(("flags", "found"), [
    ("--softmax-type learnable --attention-backend flash", "does not run on TransformerEngine's FlashAttention"),
    ("--softmax-type learnable --context-parallel-size 2 --cp-comm-type all_gather", "only with --cp-comm-type a2a"),
    ("--num-experts 4 --moe-router-topk 2 --tensor-model-parallel-size 2", "Bias in Moe is only supported when ETP==1"),
    ("--quick-geglu --swiglu", "--quick-geglu does not go with --swiglu"),
])
def test_megatron_rules_of_these_flags(flags, found):
    assert any(found in v for v in megatron_violations(flags, world_size=8))


@pytest.mark.parametrize("flags", [
    "--softmax-type learnable --attention-backend fused --context-parallel-size 2 --cp-comm-type a2a",
    "--num-experts 4 --moe-router-topk 2 --tensor-model-parallel-size 2 --expert-tensor-parallel-size 1",
    "--num-experts 4 --moe-router-topk 2 --tensor-model-parallel-size 2 --disable-bias-linear",
])
def test_what_megatron_runs_passes(flags):
    assert not [v for v in megatron_violations(flags, world_size=8)
                if "a2a" in v or "ETP" in v or "FlashAttention" in v]
