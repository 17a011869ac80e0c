"""torchtitan's deepseek_v3 MoE layers (issue 25): a DeepSeek-V3-style model (leading dense layers, shared
experts, sigmoid scores with a bias correction, group-limited top-k, a scaling factor) is written with
``build_mla_moe_layers``' MoE arguments as the file's config says, or refused one clause per difference.

The figures are the configs the fixtures were traced from (``counts.json`` of ``tests/data/megatron_moe``
and ``tests/data/moe_cases``, written by ``make_megatron_moe.py`` and ``make_moe_cases.py``), and the
parameter count is computed by hand from the written arguments (module ``build_mla_moe_layers`` builds,
``torchtitan/models/deepseek_v3/__init__.py`` 0.3.0) and held to the torch model's count. The written
module is read with ``ast``; ``tests/integration/test_torchtitan_deepseek_moe.py`` builds it in torchtitan.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from exporters._moe_layout import moe_layout
from exporters.torchtitan import families
from exporters.torchtitan import moe as tt_moe
from exporters.torchtitan.config_module import torchtitan_config_module
from exporters.torchtitan.experts import expert_parallel_refusal
from importers.moe_router import RouterReading
from importers.transformer import analyze_transformer, moe_summary
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.test_torchtitan_families import _assigned, _calls

ROOT = Path(__file__).resolve().parents[2]
MEGATRON_MOE = ROOT / "tests" / "data" / "megatron_moe"
MOE_CASES = ROOT / "tests" / "data" / "moe_cases"
FILE = MEGATRON_MOE / "deepseek_v3_megatron_ts_consts.onnx"
DIMS = {"batch": 2, "seq": 16}
DEEPSEEK_V3 = RouterReading(score_function="sigmoid", num_experts=256, top_k=8, groups=8, topk_groups=4,
                            group_score_k=2, expert_bias=True, scaling=2.5)
"""DeepSeek-V3's router (its config.json: 256 experts, 8 per token, 4 of 8 groups, top 2 summed, 2.5)."""


def _written(path: Path) -> tuple[dict, str]:
    """``(build_mla_moe_layers' literal keywords, the module text)`` of the module written for ``path``."""
    text = torchtitan_config_module(families.torchtitan_arch(load_graph(path, DIMS)))
    return _calls(text)["deepseek_v3._build_dsv3_layers"], text


@pytest.mark.parametrize("path, case", [
    (FILE, None),
    (MOE_CASES / "deepseek_v3_ts_consts.onnx", "deepseek_v3"),
    (MOE_CASES / "deepseek_v3_wide_dynamo_consts.onnx", "deepseek_v3_wide"),  # 2 shared experts, 64 in 8 groups
])
def test_the_moe_arguments_are_the_config(path, case):
    counts = json.loads((path.parent / "counts.json").read_text())
    hf = counts["config"] if case is None else counts["configs"][case]
    kwargs, text = _written(path)
    assert {k: kwargs[k] for k in (
        "n_layers", "n_dense_layers", "dense_hidden_dim", "moe_hidden_dim", "num_experts", "num_shared_experts",
        "router_top_k", "router_score_func", "router_num_expert_groups", "router_num_limited_groups",
        "router_route_norm", "router_route_scale")} == {
        "n_layers": hf["num_hidden_layers"], "n_dense_layers": hf["first_k_dense_replace"],
        "dense_hidden_dim": hf["intermediate_size"], "moe_hidden_dim": hf["moe_intermediate_size"],
        "num_experts": hf["n_routed_experts"], "num_shared_experts": hf["n_shared_experts"],
        "router_top_k": hf["num_experts_per_tok"], "router_score_func": "sigmoid",
        "router_num_expert_groups": hf["n_group"], "router_num_limited_groups": hf["topk_group"],
        "router_route_norm": hf["norm_topk_prob"], "router_route_scale": hf["routed_scaling_factor"]}
    # e_score_correction_bias: torchtitan's auxiliary-loss-free bias, in the MoE layers only
    assert f"for layer in layers[{hf['first_k_dense_replace']}:]:" in text
    assert "layer.moe.load_balance_coeff = 0.001" in text and "shared_experts = None" not in text
    # DeepseekV3Config's rms_norm_eps default (transformers 5), read from the file: the router's divide by
    # its top-k weights' sum (read as a norm) is neither counted nor asked for an epsilon
    assert _assigned(text, "dim, vocab, eps")[2] == 1e-6


def test_the_parameter_count_is_the_torch_models():
    """``build_mla_moe_layers``' parameters from the written arguments, by hand, equal the traced model's."""
    counts = json.loads((MEGATRON_MOE / "counts.json").read_text())
    kwargs, text = _written(FILE)
    dim, vocab, _ = _assigned(text, "dim, vocab, eps")
    heads, q, kv = kwargs["n_heads"], kwargs["q_lora_rank"], kwargs["kv_lora_rank"]
    nope, rope, v = kwargs["qk_nope_head_dim"], kwargs["qk_rope_head_dim"], kwargs["v_head_dim"]
    # MLA: wq_a, q_norm, wq_b; wkv_a (latent + rope key), kv_norm, wkv_b; wo; then the layer's two norms
    attention = dim * q + q + q * heads * (nope + rope) + dim * (kv + rope) + kv + kv * heads * (nope + v)
    attention += heads * v * dim + 2 * dim
    dense = 3 * dim * kwargs["dense_hidden_dim"]  # w1, w2, w3
    ffn = kwargs["moe_hidden_dim"]
    routed = kwargs["num_experts"] * 3 * dim * ffn + 3 * dim * ffn * kwargs["num_shared_experts"]
    routed += dim * kwargs["num_experts"]  # the gate, no bias; expert_bias_E is a buffer
    layers, dense_layers = kwargs["n_layers"], kwargs["n_dense_layers"]
    total = 2 * vocab * dim + dim + layers * attention + dense_layers * dense + (layers - dense_layers) * routed
    # 6,144 x 2 + 64 + 3 x 12,976 + 24,576 + 2 x 55,808 = 187,472
    assert total == counts["files"][FILE.name]["param_count"] == 187472


def test_a_scaling_factor_the_file_lost_is_refused_in_one_line():
    with pytest.raises(UnsupportedExport) as info:
        families.torchtitan_arch(load_graph(MOE_CASES / "deepseek_v3_dynamo_bare.onnx", DIMS))
    message = str(info.value)
    assert "\n" not in message and "route_scale must say it" in message
    assert "is not one uniform stack" not in message and "norms where" not in message  # dense layers, router norm


@pytest.mark.parametrize("change, clause", [
    ({}, None),
    ({"group_score_k": 1}, "by the sum of its top 1 experts and torchtitan's group-limited routing by the sum"),
    ({"group_score_sum": False}, "by the reduction of its top 2"),
    ({"group_score_k": None}, "lost their shape"),
    ({"groups": 256, "topk_groups": 8}, "fewer than 2 of its 256 experts"),
    ({"score_function": "softmax"}, "softmax router adds a score bias"),
    ({"weights_unbiased": False}, "weights include the score bias"),
    ({"scaling": None}, "route_scale must say it"),
    ({"score_function": "unknown"}, "neither a softmax nor a sigmoid"),
])
def test_router_clauses(change, clause):
    found = tt_moe.router_refusals(dataclasses.replace(DEEPSEEK_V3, **change))
    assert found == [] if clause is None else (len(found) == 1 and clause in found[0]), found


def test_layer_clauses(monkeypatch):
    graph = load_graph(FILE, DIMS)
    model, moe = analyze_transformer(graph), moe_summary(graph)
    routing, why = tt_moe.deepseek_routing(graph, model, moe)
    assert why == [] and (routing.n_dense_layers, routing.num_shared_experts) == (1, 1)
    gated = dataclasses.replace(model, shared_expert_gate=True)
    assert "Qwen2-MoE's shared_expert_gate" in tt_moe.deepseek_routing(graph, gated, moe)[1][0]
    one = dataclasses.replace(model, shared_experts=model.shared_experts[:1])
    # the shared MLP left out reads as a dense MLP of another size too (moe_layout): two clauses
    assert any("1 of its 2 MoE layers have shared experts" in c for c in tt_moe.deepseek_routing(graph, one, moe)[1])
    layout = moe_layout(graph, model)
    monkeypatch.setattr(tt_moe, "moe_layout", lambda g, m: dataclasses.replace(layout, pattern=(1, 0, 1)))
    assert "its layers [0, 2] route" in tt_moe.deepseek_routing(graph, model, moe)[1][0]
    monkeypatch.setattr(tt_moe, "moe_layout", lambda g, m: dataclasses.replace(layout, router=None))
    assert "routers differ" in tt_moe.deepseek_routing(graph, model, moe)[1][0]


def test_expert_shards_use_the_routed_experts_ffn():
    """At ep 8 on 16 ranks torchtitan shards each of the 8 experts' ``[1, F, D]`` on dim 1 over efsdp = 2
    (``fsdp.py``: efsdp x ep = 16 > 8 experts): the routed experts' F, not the dense layers' FFN."""
    graph = load_graph(FILE, DIMS)
    model, moe = analyze_transformer(graph), moe_summary(graph)
    settings = TrainingSettings(zero_stage=3, expert_parallel=8)
    assert expert_parallel_refusal(settings, moe, model, dp=16, cp=1, tp=1, expert_ffn=32) is None
    odd = expert_parallel_refusal(settings, moe, model, dp=16, cp=1, tp=1, expert_ffn=33)
    assert "expert FFN size (33) does not split evenly over efsdp=2" in odd
    assert tt_moe.routed_ffn(graph, model) == 32 and model.ffn_hidden_size == 128
