"""Issue 25 with megatron-core itself: every Megatron-LM row of the launchable table of a Qwen2-MoE-style
model (shared expert with a sigmoid gate, top-k without renormalisation) exports flags that
megatron-core 0.16.1's TransformerConfig accepts, with the shared expert and the router the model has;
the flags match the Hugging Face config the fixture was built from; and the features refused for
Gemma-2 have no TransformerConfig field to express them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.settings import TrainingSettings
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "exporters" / "data"


@pytest.fixture(scope="module")
def qwen2_moe_rows():
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4, devices_per_node=4),
                          settings=TrainingSettings())
    # Megatron-LM's rows alone: what is checked (its flags of the model) is the same in every row, and the other
    # launchers' searches cost more than this one (h28b)
    _, (found,) = plan_launchable_file(DATA / "qwen2_moe_tiny.onnx", {"batch": 16, "seq": 16}, [request],
                                       launchers=("megatron",))
    rows = [row for row in found.rows if "megatron" in row.targets]
    assert rows, "the Qwen2-MoE-style model is no longer refused by Megatron-LM"
    return rows


def test_transformer_config_accepts_the_qwen2_moe_rows(qwen2_moe_rows):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    for row in qwen2_moe_rows:
        out = export("megatron", row_plan_input(row))
        args = parse_megatron_args(out["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert config.num_moe_experts == 4 and config.moe_router_topk == 2
        assert config.moe_shared_expert_intermediate_size == 64 and config.moe_shared_expert_gate
        assert config.moe_router_pre_softmax
        assert config.moe_ffn_hidden_size == 32  # defaults to --ffn-hidden-size
        assert config.gated_linear_unit


def test_flags_match_the_huggingface_config(qwen2_moe_rows):
    pytest.importorskip("transformers")
    from transformers import Qwen2MoeConfig

    from tests.integration.make_megatron_fixtures import CONFIGS

    hf = Qwen2MoeConfig(**CONFIGS["qwen2_moe_tiny"]["extra"])
    args = parse_megatron_args(export("megatron", row_plan_input(qwen2_moe_rows[0]))["args"])
    assert args["num-experts"] == hf.num_experts and args["moe-router-topk"] == hf.num_experts_per_tok
    assert args["ffn-hidden-size"] == hf.moe_intermediate_size
    assert args["moe-shared-expert-intermediate-size"] == hf.shared_expert_intermediate_size
    assert bool(args.get("moe-router-pre-softmax")) == (not hf.norm_topk_prob)


def test_megatron_core_has_no_field_for_the_refused_gemma2_features():
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    # what the export emits for shared experts and routing exists ...
    assert {"moe_shared_expert_intermediate_size", "moe_shared_expert_gate", "moe_router_pre_softmax"} <= names
    # ... and what it refuses for Gemma-2 does not: no soft-capping, no post-attention/post-MLP norm
    assert not [n for n in names if "softcap" in n or "soft_cap" in n]
    assert not [n for n in names if n.startswith("post_") and "norm" in n]
