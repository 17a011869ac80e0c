"""Shared experts computed before the router, and scalar shifts before the expert choice (issue 25, h27e).

1. transformers 5.24's ``Qwen2MoeSparseMoeBlock`` and ``Ernie4_5_MoeSparseMoeBlock`` call the shared expert before the
   router (``shared_expert(x)``, then ``gate(x)``), so every export writes its gate and up projections ahead of the
   router linear. :func:`importers.moe.find_moe_layers` looked for shared experts only after the expert choice: on
   ERNIE-4.5-MoE it found none (``shared_ffn`` 0), on Qwen2-MoE only the down projection and the sigmoid gate, the
   gate and up projections left out of :attr:`MoeLayer.shared_ops`.
2. An ``Add`` of a one-element constant between the scores and the TopK (``topk(probs + 0.5)``: a folded ``x + c``,
   a temperature offset) was read as an expert bias, and Megatron-LM's export refused the router ("softmax router
   adds a score bias") where the function is Qwen2-MoE's own (a constant added to every score changes no top-k).
   A per-expert vector ``[E]`` is a bias, and still read as one.

Files: ``tests/data/shared_first_cases`` (``tests/importers/make_shared_first_cases.py``: ``Qwen2MoeForCausalLM``,
plain, with the scalar shift and with a ``[4]`` vector; ``Cohere2MoeForCausalLM``, whose attention reads the router's
input before the router (parallel attention); both exporters, graph-only) and
``tests/data/ernie_router_cases`` (ERNIE-4.5-MoE, dynamo). Expected numbers come from the configs, by hand, and from
torch's own ``named_parameters`` (``counts.json``), never from the planner.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from exporters.megatron.moe import megatron_router_args
from importers import import_model
from importers.moe import find_moe_layers
from importers.moe_router import router_reading
from importers.transformer import moe_summary
from objectives.moe import routed_fraction
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "shared_first_cases"
RECORD = json.loads((CASES / "counts.json").read_text())
CONFIG = RECORD["config"]
FILES = sorted(n for n in RECORD["files"] if RECORD["files"][n]["case"].startswith("qwen2moe"))
COHERE_FILES = sorted(n for n in RECORD["files"] if RECORD["files"][n]["case"] == "cohere2moe")
ERNIE = ROOT / "tests" / "data" / "ernie_router_cases"
ERNIE_CONFIG = json.loads((ERNIE / "counts.json").read_text())["files"]["ernie4_5_moe_dynamo_bare.onnx"]["config"]
DIMS = {"batch": 2, "seq": 16}
TOKENS = DIMS["batch"] * DIMS["seq"]


def _shared_parameters(graph, layer) -> dict[str, int]:
    return {a.tensor: graph.tensors[a.tensor].num_elements for i in layer.shared_ops for a in graph.ops[i].inputs
            if graph.tensors.get(a.tensor) is not None and graph.tensors[a.tensor].role == "parameter"}


@pytest.mark.parametrize("name", FILES)
def test_the_shared_expert_before_the_router_is_read_whole(name: str):
    graph = load_graph(CASES / name, DIMS)
    layers = find_moe_layers(graph)
    h, f = CONFIG["hidden_size"], CONFIG["shared_expert_intermediate_size"]
    assert len(layers) == CONFIG["num_hidden_layers"]
    for layer in layers:
        assert layer.shared_ffn == f
        # the shared expert's gate and up projections come before the router linear in the file
        assert min(layer.shared_ops) < layer.router_op
        assert all(".mlp.shared_expert" in graph.ops[i].module_path for i in layer.shared_ops)
        assert not set(layer.shared_ops) & set(layer.expert_ops)
        # gate, up, down (h x f each) and the sigmoid gate's h x 1: by hand, and torch's count over the layers
        assert sum(_shared_parameters(graph, layer).values()) == 3 * h * f + h
    shared = sum(sum(_shared_parameters(graph, layer).values()) for layer in layers)
    assert shared == RECORD["files"][name]["shared_param_count"]
    experts = sum(graph.tensors[p].num_elements for layer in layers for p in layer.expert_parameters)
    assert experts == RECORD["files"][name]["expert_param_count"]


@pytest.mark.parametrize("name", FILES)
def test_the_shared_expert_is_priced_as_every_tokens_work(name: str):
    """Every token through gate, up and down (2 FLOPs a multiply-add) and the h x 1 sigmoid gate; nothing of it is an
    expert parameter, so expert parallelism leaves it whole (objectives.moe shards ``expert_parameters`` only)."""
    graph = load_graph(CASES / name, DIMS)
    h, f = CONFIG["hidden_size"], CONFIG["shared_expert_intermediate_size"]
    for layer in find_moe_layers(graph):
        matmuls = [i for i in layer.shared_ops if graph.ops[i].kind == "matmul"]
        flops = sum(2 * math.prod(d.size for d in graph.ops[i].dims) * routed_fraction(layer, graph.ops[i], graph)
                    for i in matmuls)
        assert flops == 2 * TOKENS * (3 * h * f + h)
        assert not set(_shared_parameters(graph, layer)) & set(layer.expert_parameters)


def test_erniess_shared_experts_before_the_router_are_read():
    """ERNIE-4.5-MoE: before, no shared expert at all (shared_ffn 0)."""
    graph = load_graph(ERNIE / "ernie4_5_moe_dynamo_bare.onnx", DIMS)
    h = ERNIE_CONFIG["hidden_size"]
    f = ERNIE_CONFIG["moe_intermediate_size"] * ERNIE_CONFIG["moe_num_shared_experts"]  # Ernie4_5_MoeMLP's width
    for layer in find_moe_layers(graph):
        assert layer.shared_ffn == f and min(layer.shared_ops) < layer.router_op
        assert all(".mlp.shared_experts" in graph.ops[i].module_path for i in layer.shared_ops)
        assert sum(_shared_parameters(graph, layer).values()) == 3 * h * f  # gate, up, down; no bias (use_bias False)


@pytest.mark.parametrize("name", [n for n in FILES if RECORD["files"][n]["case"] != "qwen2moe_bias"])
def test_parameter_count_is_torchs(name: str):
    assert import_model(CASES / name, DIMS).parameter_count == RECORD["files"][name]["param_count"]


@pytest.mark.parametrize("name", [n for n in FILES if RECORD["files"][n]["case"] == "qwen2moe_shift"])
def test_a_scalar_shift_before_the_choice_is_no_bias(name: str):
    graph = load_graph(CASES / name, DIMS)
    summary = moe_summary(graph)
    assert summary is not None and not summary.renormalized  # Qwen2MoeConfig.norm_topk_prob defaults to False
    for layer in find_moe_layers(graph):
        reading = router_reading(graph, layer)
        assert (reading.score_function, reading.expert_bias, reading.weights_unbiased) == ("softmax", False, True)
        # Qwen2-MoE's router as Megatron-LM builds it: softmax over every expert, then the top-k, not renormalised
        assert megatron_router_args(reading, renormalized=summary.renormalized) == ["--moe-router-pre-softmax"]


@pytest.mark.parametrize("name", [n for n in FILES if RECORD["files"][n]["case"] == "qwen2moe_bias"])
def test_a_per_expert_vector_before_the_choice_is_a_bias(name: str):
    graph = load_graph(CASES / name, DIMS)
    for layer in find_moe_layers(graph):
        reading = router_reading(graph, layer)
        # the weights are gathered from the softmax's output, not from the biased scores the choice read
        assert (reading.score_function, reading.expert_bias, reading.weights_unbiased) == ("softmax", True, True)
        with pytest.raises(UnsupportedExport, match="softmax router adds a score bias"):
            megatron_router_args(reading, renormalized=False)


@pytest.mark.parametrize("name", COHERE_FILES)
def test_parallel_attention_on_the_routers_input_is_no_shared_expert(name: str):
    """Cohere2-MoE: ``residual + attn(n) + mlp(n)``, so Q, K and V read the router's input ahead of the router, as a
    shared expert computed first would; they feed attention (a product of two activations, a softmax), never a down
    projection, so only the shared expert (gate, up, down of FFN ``intermediate_size x num_shared_experts``) is."""
    config = RECORD["cohere_config"]
    graph = load_graph(CASES / name, DIMS)
    layers = find_moe_layers(graph)
    h, f = config["hidden_size"], config["intermediate_size"] * config["num_shared_experts"]
    assert len(layers) == config["num_hidden_layers"]
    for layer in layers:
        assert layer.shared_ffn == f
        assert all(".mlp.shared_experts" in graph.ops[i].module_path for i in layer.shared_ops)
        assert not any(".self_attn" in graph.ops[i].module_path for i in layer.shared_ops)
        assert sum(_shared_parameters(graph, layer).values()) == 3 * h * f  # gate, up, down; no bias
    shared = sum(sum(_shared_parameters(graph, layer).values()) for layer in layers)
    assert shared == RECORD["files"][name]["shared_param_count"]
    if "_dynamo_" in name:  # the TorchScript file counts the tied LM head twice (VALIDATION.md, h27e's "Left")
        assert import_model(CASES / name, DIMS).parameter_count == RECORD["files"][name]["param_count"]
