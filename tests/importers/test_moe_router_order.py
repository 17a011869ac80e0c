"""Top-k-first MoE routers (issue 25, task H1): Granite-MoE's ``GraniteMoeTopKRouter`` takes the top-k of the raw
router logits, then a softmax over the k chosen logits. The importer read no score function there ("unknown"),
so every launcher that writes a router refused it or wrote it unnormalised. A softmax over the chosen logits
is the softmax over every expert with its top-k divided by their sum, so the layer reads as a renormalised
softmax router (Mixtral's, and Megatron-Core's default order).

Files: ``tests/data/moe_router_cases`` (``tests/importers/make_moe_router_cases.py``: transformers 5.24's
GraniteMoe and GraniteMoeShared, both exporters where they run, and a hand-written torch module with per-expert
linears and ``softmax(dtype=float32)``, graph-only); ``counts.json`` holds the configs and
torch's ``sum(p.numel() for p in model.parameters())``. Every expected number is computed here from the config or
by brute force, never read from the planner. The routing itself against megatron-core's and transformers' code:
``tests/integration/test_moe_router_order.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from exporters.deepspeed.autoep import moe_layer_gate_matches
from exporters.megatron.moe import megatron_router_args
from importers import import_model
from importers.moe import find_moe_layers
from importers.moe_router import router_reading
from importers.transformer import moe_summary
from objectives.moe import routed_fraction
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "moe_router_cases"
RECORD = json.loads((CASES / "counts.json").read_text())
FILES = sorted(RECORD["files"])
DIMS = {"batch": 4, "seq": 16}


def _config(name: str) -> dict:
    return RECORD["configs"][RECORD["files"][name]["case"]]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_topk_then_softmax_is_softmax_then_renormalised_topk():
    """The identity the reading rests on, brute force over random logits (ties have probability 0)."""
    rng = np.random.default_rng(0)
    for experts, k in [(8, 2), (8, 1), (64, 6), (4, 4)]:
        logits = rng.normal(scale=3.0, size=(500, experts))
        chosen = np.argsort(-logits, axis=-1)[:, :k]
        granite = _softmax(np.take_along_axis(logits, chosen, axis=-1))  # top-k of the logits, then softmax
        probs = _softmax(logits)
        by_probs = np.argsort(-probs, axis=-1)[:, :k]
        assert (np.sort(by_probs, axis=-1) == np.sort(chosen, axis=-1)).all()  # softmax keeps the order
        top = np.take_along_axis(probs, chosen, axis=-1)
        np.testing.assert_allclose(granite, top / top.sum(axis=-1, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("name", FILES)
def test_each_layer_is_a_renormalised_softmax_router(name: str):
    config = _config(name)
    raw = import_model(CASES / name, DIMS)
    layers = find_moe_layers(raw)
    assert len(layers) == config["num_hidden_layers"]
    h, f, e = config["hidden_size"], config["intermediate_size"], config["num_local_experts"]
    for layer in layers:
        assert (layer.num_experts, layer.top_k, layer.hidden, layer.ffn) == (e, config["num_experts_per_tok"], h, f)
        assert layer.tokens == DIMS["batch"] * DIMS["seq"]
        assert layer.score_function == "softmax" and layer.topk_first
        softmax = raw.ops[layer.weights_softmax]
        # the softmax reads the choice's values (the k chosen logits), after the choice
        assert softmax.op_type == "Softmax" and layer.weights_softmax > layer.topk_op
        assert raw.ops[layer.topk_op].outputs[0].tensor in {a.tensor for a in softmax.inputs}
        # gate+up [E, 2f, h] and down [E, h, f]
        assert sum(raw.tensors[p].num_elements for p in layer.expert_parameters) == e * 3 * f * h
        assert layer.shared_ffn == config.get("shared_intermediate_size", 0)
        reading = router_reading(raw, layer)
        # no scale (the hand-written combine's ``index == i`` mask selects, and scales nothing)
        assert (reading.score_function, reading.groups, reading.expert_bias, reading.scaling) == ("softmax", 1, False, 1.0)
    summary = moe_summary(load_graph(CASES / name, DIMS))
    assert summary is not None
    assert (summary.layers, summary.num_experts, summary.top_k, summary.score_function, summary.renormalized) == (
        config["num_hidden_layers"], e, config["num_experts_per_tok"], "softmax", True)


@pytest.mark.parametrize("name", FILES)
def test_parameter_count_is_torchs(name: str):
    expected = RECORD["files"][name]["param_count"]
    assert import_model(CASES / name, DIMS).parameter_count == expected
    graph = load_graph(CASES / name, DIMS)
    layers = find_moe_layers(graph)
    experts = sum(graph.tensors[p].num_elements for layer in layers for p in layer.expert_parameters)
    assert experts == RECORD["files"][name]["expert_param_count"]


@pytest.mark.parametrize("name", FILES)
def test_expert_matmuls_are_priced_over_the_routed_tokens(name: str):
    """Gate, up and down over T k token-expert pairs, 2 FLOPs a multiply-add: not every token through every
    expert (E / k = 4 times as much). Granite's batched_mm export computes T k rows; the hand-written one runs
    every token through each of the E per-expert linears, priced at T k / E of them."""
    config = _config(name)
    h, f, k, e = (config[key] for key in ("hidden_size", "intermediate_size", "num_experts_per_tok", "num_local_experts"))
    tokens = DIMS["batch"] * DIMS["seq"]
    graph = load_graph(CASES / name, DIMS)
    for layer in find_moe_layers(graph):
        assert layer.style == ("linears" if name.startswith("linears") else "routed")
        # a product's multiply-adds are its iteration space (a fused op's FLOPs add its elementwise tail)
        priced = sum(2 * math.prod(d.size for d in graph.ops[i].dims) * routed_fraction(layer, graph.ops[i], graph)
                     for i in layer.expert_matmuls)
        assert priced == tokens * k * 2 * 3 * h * f
        assert len(layer.expert_matmuls) == (3 * e if name.startswith("linears") else 2)  # gate, up, down / gate_up, down


@pytest.mark.parametrize("name", FILES)
def test_launchers_write_the_default_router_order(name: str):
    """Megatron-Core's ``TopKRouter`` without ``--moe-router-pre-softmax`` is top-k then softmax (``moe_utils.
    topk_routing_with_score_function``), the model's own; DeepSpeed-MoE's ``top2gating`` divides the two softmax
    gates by their sum (``sharded_moe.py:383-392``), the same weights."""
    graph = load_graph(CASES / name, DIMS)
    summary = moe_summary(graph)
    for layer in find_moe_layers(graph):
        assert megatron_router_args(router_reading(graph, layer), renormalized=summary.renormalized) == []
    assert moe_layer_gate_matches(summary)


@pytest.mark.parametrize("path, renormalized", [
    (ROOT / "tests" / "data" / "moe_sweep_cases" / "olmoe_ts_bare.onnx", False),  # softmax, top-k, kept as is
    (ROOT / "tests" / "data" / "mixtral_tiny.onnx", True),  # softmax, top-k, divided by their sum
])
def test_softmax_first_routers_are_not_topk_first(path: Path, renormalized: bool):
    graph = load_graph(path, DIMS)
    layers = find_moe_layers(graph)
    assert layers and not any(layer.topk_first for layer in layers)
    summary = moe_summary(graph)
    assert (summary.score_function, summary.renormalized) == ("softmax", renormalized)
