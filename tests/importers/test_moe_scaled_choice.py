"""A router whose top-k values are multiplied by a scalar straight after the choice (DeepSeek-V2's
``topk_weight * routed_scaling_factor``) is read as MoE, by both of torch's exporters' files (new-user
sweep, issue 25: the TorchScript file was read as dense, Megatron refused "the MLP blocks differ in
size" and torchtitan "routed experts were not found in full", while the dynamo file at a factor of 1.0,
which folds the multiply away, was read as MoE).

The importer folds the ``Mul`` into the TopK's op, whose outputs are then the indices, then the scaled
weights (:func:`importers.moe.choice_outputs`). The files are transformers' ``DeepseekV2ForCausalLM``
traced by ``make_moe_v2_cases.py``; every expected number is its config's (``counts.json``) or torch's
parameter count, never the planner's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.megatron.families import megatron_family
from exporters.torchtitan.families import torchtitan_arch
from importers.moe import choice_outputs, find_moe_layers
from importers.moe_router import router_reading
from importers.transformer import analyze_transformer, moe_summary
from planner.plan import load_graph

CASES = Path(__file__).resolve().parents[1] / "data" / "moe_v2_cases"
RECORD = json.loads((CASES / "counts.json").read_text())
CONFIG = RECORD["config"]
FILES = sorted(RECORD["files"])
DIMS = {"batch": 2, "seq": 16}


@pytest.fixture(scope="module", params=FILES)
def graph(request):
    return request.param, load_graph(CASES / request.param, DIMS)


def test_the_scaled_choice_is_one_op_with_the_indices_first(graph) -> None:
    """The form this file is about: both exporters' files hold ``TopK`` and ``Mul`` in one op, the int64
    indices listed before the float weights (ONNX's TopK writes the values first)."""
    _, routed = graph
    for layer in find_moe_layers(routed):
        choice = routed.ops[layer.topk_op]
        assert choice.node_types == ("TopK", "Mul")
        weights, indices = choice_outputs(routed, choice)
        assert [o.tensor for o in choice.outputs] == [indices, weights]
        assert (routed.tensors[weights].dtype, routed.tensors[indices].dtype) == ("float32", "int64")


def test_each_moe_layer_has_the_configs_numbers(graph) -> None:
    name, routed = graph
    layers = find_moe_layers(routed)
    assert len(layers) == CONFIG["num_hidden_layers"] - CONFIG["first_k_dense_replace"] == 2
    h, f, e = CONFIG["hidden_size"], CONFIG["moe_intermediate_size"], CONFIG["n_routed_experts"]
    for layer in layers:
        assert (layer.num_experts, layer.top_k) == (e, CONFIG["num_experts_per_tok"]) == (8, 2)
        assert (layer.hidden, layer.ffn) == (h, f) == (64, 32)
        assert layer.shared_ffn == CONFIG["n_shared_experts"] * f == 64
        assert (layer.groups, layer.score_function, layer.tokens) == (1, "softmax", DIMS["batch"] * DIMS["seq"])
        # fused gate+up [E, 2f, h] and down [E, h, f] per layer: 8 x 3 x 32 x 64 = 49,152 elements
        assert sum(routed.tensors[p].num_elements for p in layer.expert_parameters) == e * 3 * f * h == 49_152
    # DeepseekV2Moe's greedy router divides nothing: the softmax over all 8 experts is kept
    summary = moe_summary(routed)
    assert summary is not None
    assert (summary.layers, summary.num_experts, summary.top_k, summary.score_function, summary.renormalized) == (
        2, 8, 2, "softmax", False)
    # the multiply is the router's scaling, read from the file: routed_scaling_factor
    assert {router_reading(routed, layer).scaling for layer in layers} == {CONFIG["routed_scaling_factor"]} == {16.0}
    assert routed.parameter_count == RECORD["files"][name]["param_count"] == 202_736


def test_megatron_and_torchtitan_read_the_dense_layer_beside_the_moe_ones(graph) -> None:
    """Megatron writes the dense first layer as ``--moe-layer-freq`` (no "MLP blocks differ" refusal);
    torchtitan's deepseek_v3 family takes the config's MoE numbers, the scale included."""
    _, routed = graph
    assert megatron_family(routed, analyze_transformer(routed)).family == "gpt"
    arch = torchtitan_arch(routed)
    assert arch.family.name == "deepseek_v3"
    routing = arch.routing
    assert routing is not None
    assert (routing.n_dense_layers, routing.expert_ffn, routing.num_shared_experts) == (
        CONFIG["first_k_dense_replace"], CONFIG["moe_intermediate_size"], CONFIG["n_shared_experts"])
    assert (routing.router.num_experts, routing.router.top_k, routing.router.scaling) == (
        CONFIG["n_routed_experts"], CONFIG["num_experts_per_tok"], CONFIG["routed_scaling_factor"])
