"""SparseMixer routers (issue 25, h26d): Phi-3.5-MoE's router (transformers' ``PhimoeTopKRouter`` and its
``sparsemixer``) chooses its top-2 experts without a TopK: an ``ArgMax`` of the logits, then an ``ArgMax`` of
the logits with the first choice scattered to ``-inf``, the two indices concatenated. Round 2 of the unseen
architectures (docs/VALIDATION.md) found it read as no MoE at all: no expert parallelism, and the per-token
gathers of whole expert matrices priced as real work.

Files: ``tests/data/sparsemixer_cases`` (``counts.json``: built by ``bench/unseen_archs.py --only phimoe``,
transformers 5.24's ``PhimoeForCausalLM`` with 2 layers, hidden 64, 4 experts of FFN 128, top-2, both torch
exporters, graph-only; ``router_jitter_noise`` at its default 0.01). Every expected number is computed here
from the config or by brute force (a numpy copy of ``sparsemixer``'s eval path), never read from the planner.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from exporters.deepspeed.autoep import moe_gate_problem
from exporters.megatron.moe import megatron_router_args
from exporters.torchtitan.moe import router_refusals
from importers import import_model
from importers.moe import find_moe_layers
from importers.moe_router import router_reading
from importers.transformer import analyze_transformer, moe_summary
from objectives.moe import routed_fraction
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "sparsemixer_cases"
RECORD = json.loads((CASES / "counts.json").read_text())
FILES = sorted(name for name in RECORD["files"] if name.startswith("phimoe"))
DIMS = {"batch": 4, "seq": 16}
JITTER_EPS = 0.01  # PhimoeConfig.router_jitter_noise's default (transformers 5.24 configuration_phimoe.py)


def _config(name: str) -> dict:
    return RECORD["files"][name]["config"]


def _masked_softmax(scores: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """One round's weights (``sparsemixer`` eval path): ``scores`` with every logit further than ``2 eps``
    (relative) below the round's maximum set to ``-inf``, then a softmax."""
    top = scores.max(axis=-1, keepdims=True)
    factor = np.maximum(np.abs(logits), top)
    masked = np.where((top - logits) / factor > 2 * JITTER_EPS, -np.inf, scores)
    e = np.exp(masked - masked.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sparsemixer(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(weights [T, 2], experts [T, 2])`` of transformers' ``sparsemixer(training=False)``, in numpy."""
    first = logits.argmax(axis=-1)[:, None]
    weight_1 = np.take_along_axis(_masked_softmax(logits, logits), first, axis=-1)
    rest = logits.copy()
    np.put_along_axis(rest, first, -np.inf, axis=-1)
    second = rest.argmax(axis=-1)[:, None]
    weight_2 = np.take_along_axis(_masked_softmax(rest, logits), second, axis=-1)
    return np.concatenate([weight_1, weight_2], axis=-1), np.concatenate([first, second], axis=-1)


def test_two_argmax_rounds_choose_the_top_2_but_weigh_them_otherwise():
    """The reading rests on this: the experts chosen are the top-2 of the logits (T k routed rows, as a TopK
    router's), while the weights are not the softmax's top-2, renormalised or not (so no launcher's softmax
    router reproduces them: the score function reads ``sparsemixer``)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=2.0, size=(2000, 4))
    weights, experts = _sparsemixer(logits)
    top2 = np.argsort(-logits, axis=-1)[:, :2]
    assert (experts == top2).all()
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = np.take_along_axis(e / e.sum(axis=-1, keepdims=True), top2, axis=-1)
    assert not np.allclose(weights, probs, atol=1e-3)
    assert not np.allclose(weights, probs / probs.sum(axis=-1, keepdims=True), atol=1e-3)
    # the margin 2 eps keeps only near-ties: the first weight is 1 unless another logit is within 2% of the max
    near = (np.sort(logits, axis=-1)[:, -2:-1] >= logits.max(axis=-1, keepdims=True) * (1 - 2 * JITTER_EPS))
    np.testing.assert_allclose(weights[~near[:, 0] & (logits.max(axis=-1) > 0), 0], 1.0)


@pytest.mark.parametrize("name", FILES)
def test_each_layer_is_a_sparsemixer_top_2(name: str):
    config = _config(name)
    raw = import_model(CASES / name, DIMS)
    layers = find_moe_layers(raw)
    assert len(layers) == config["num_hidden_layers"]
    h, f, e, k = (config[key] for key in ("hidden_size", "intermediate_size", "num_local_experts", "num_experts_per_tok"))
    for layer in layers:
        assert (layer.num_experts, layer.top_k, layer.hidden, layer.ffn) == (e, k, h, f)
        assert layer.tokens == DIMS["batch"] * DIMS["seq"]
        assert layer.score_function == "sparsemixer" and layer.sparsemixer and not layer.topk_first
        assert [raw.ops[i].op_type for i in layer.argmax_rounds] == ["ArgMax"] * k
        assert raw.ops[layer.topk_op].op_type == "Concat" and layer.router_op < layer.argmax_rounds[0]
        assert raw.tensors[raw.ops[layer.router_op].inputs[1].tensor].num_elements == e * h  # the router [E, h]
        assert layer.style == "gather" and len(layer.weight_gathers) == 2  # gate_up and down, gathered per token
        assert sum(raw.tensors[p].num_elements for p in layer.expert_parameters) == e * 3 * f * h
        assert (layer.shared_ops, layer.group_topks, layer.groups) == ((), (), 1)
        reading = router_reading(raw, layer)
        assert (reading.score_function, reading.num_experts, reading.top_k) == ("sparsemixer", e, k)
    summary = moe_summary(load_graph(CASES / name, DIMS))
    assert summary is not None
    assert (summary.layers, summary.num_experts, summary.top_k, summary.score_function, summary.renormalized) == (
        config["num_hidden_layers"], e, k, "sparsemixer", False)


@pytest.mark.parametrize("name", FILES)
def test_parameter_count_is_torchs(name: str):
    assert import_model(CASES / name, DIMS).parameter_count == RECORD["files"][name]["param_count"]


@pytest.mark.parametrize("name", FILES)
def test_expert_matmuls_are_priced_over_the_routed_tokens(name: str):
    """gate_up and down over T k token-expert pairs, 2 FLOPs a multiply-add, the weight gathers gone (read as
    the experts' own weights): not E / k = 2 times as much, and no [T k, 2f, h] copy of the weights."""
    config = _config(name)
    h, f, k = (config[key] for key in ("hidden_size", "intermediate_size", "num_experts_per_tok"))
    graph = load_graph(CASES / name, DIMS)
    raw = import_model(CASES / name, DIMS)

    def gathers(g) -> int:  # ops gathering whole [E, a, b] expert weights by the chosen indices
        return sum(op.kind in ("gather", "embedding") and any(
            g.tensors[a.tensor].role == "parameter" and len(g.tensors[a.tensor].shape) == 3 for a in op.inputs)
            for op in g.ops)

    assert (gathers(raw), gathers(graph)) == (2 * config["num_hidden_layers"], 0)
    for layer in find_moe_layers(graph):
        assert layer.style == "routed" and len(layer.expert_matmuls) == 2
        priced = sum(2 * math.prod(d.size for d in graph.ops[i].dims) * routed_fraction(layer, graph.ops[i], graph)
                     for i in layer.expert_matmuls)
        assert priced == DIMS["batch"] * DIMS["seq"] * k * 2 * 3 * h * f


@pytest.mark.parametrize("name", FILES)
def test_the_router_is_no_extra_linear(name: str):
    """The router reads no irregular "linear outside attention, MLP and LM head" (round 2's Megatron refusal)."""
    model = analyze_transformer(load_graph(CASES / name, DIMS))
    assert not [r for r in model.irregular if "linear layer(s) outside" in r]


@pytest.mark.parametrize("name", FILES)
def test_launchers_refuse_the_router_by_its_name(name: str):
    """megatron-core 0.16.1's ``moe_router_score_function`` is ``softmax`` or ``sigmoid``
    (``transformer_config.py:626``), torchtitan's ``TokenChoiceTopKRouter`` the same, DeepSpeed-MoE's gate a
    softmax top-k: none builds SparseMixer, and each says so rather than "neither a softmax nor a sigmoid"."""
    graph = load_graph(CASES / name, DIMS)
    summary = moe_summary(graph)
    reading = router_reading(graph, find_moe_layers(graph)[0])
    with pytest.raises(UnsupportedExport, match="its router is SparseMixer .*megatron-core 0.16.1's TopKRouter"):
        megatron_router_args(reading, renormalized=summary.renormalized)
    assert "SparseMixer" in moe_gate_problem(summary)
    assert [r for r in router_refusals(reading) if r.startswith("its router is SparseMixer")]


def _hand_built(path: Path, *, rounds: int, masked: bool) -> None:
    """A one-layer ONNX MoE written by hand (hidden 8, 4 experts of FFN 16, ``rounds`` argmax rounds): each round
    after the first takes the ``ArgMax`` of the previous round's scores with its choice scattered to ``-inf``
    (``masked``), or, unmasked, of the negated logits (the arg-min: two argmaxes, but no successive choice)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name) for name, shape in
             (("router", (8, 4)), ("up", (4, 8, 16)), ("down", (4, 16, 8)))]
    inits += [numpy_helper.from_array(np.array([-np.inf], np.float32), "neg_inf"),
              numpy_helper.from_array(np.array([1], np.int64), "one")]
    nodes = [helper.make_node("MatMul", ["x", "router"], ["s0"]),
             helper.make_node("ArgMax", ["s0"], ["i0"], axis=-1, keepdims=1)]
    for r in range(1, rounds):
        if masked:
            nodes += [helper.make_node("Shape", [f"i{r - 1}"], [f"shape{r}"]),
                      helper.make_node("Expand", ["neg_inf", f"shape{r}"], [f"fill{r}"]),
                      helper.make_node("ScatterElements", [f"s{r - 1}", f"i{r - 1}", f"fill{r}"], [f"s{r}"], axis=-1)]
        else:
            nodes.append(helper.make_node("Neg", [f"s{r - 1}"], [f"s{r}"]))
        nodes.append(helper.make_node("ArgMax", [f"s{r}"], [f"i{r}"], axis=-1, keepdims=1))
    nodes += [helper.make_node("Concat", [f"i{r}" for r in range(rounds)], ["chosen"], axis=-1),
              helper.make_node("Gather", ["up", "chosen"], ["up_w"], axis=0),  # [T, k, 8, 16]
              helper.make_node("Unsqueeze", ["x", "one"], ["x1"]),
              helper.make_node("Unsqueeze", ["x1", "one"], ["x2"]),  # [T, 1, 1, 8]
              helper.make_node("MatMul", ["x2", "up_w"], ["h"]),
              helper.make_node("Relu", ["h"], ["a"]),
              helper.make_node("Gather", ["down", "chosen"], ["down_w"], axis=0),
              helper.make_node("MatMul", ["a", "down_w"], ["d"]),  # [T, k, 1, 8]
              helper.make_node("ReduceSum", ["d", "one"], ["summed"], keepdims=0),
              helper.make_node("Squeeze", ["summed", "one"], ["y"])]
    graph = helper.make_graph(nodes, "hand", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("rounds, masked", [(2, True), (3, True), (2, False)])
def test_only_successive_masked_rounds_are_a_choice(tmp_path: Path, rounds: int, masked: bool):
    """k rounds, each masking the previous choice, are a top-k choice of k experts; an argmax and an arg-min
    concatenated (two rounds over unrelated scores) are not a router, and no MoE layer is read."""
    path = tmp_path / "hand.onnx"
    _hand_built(path, rounds=rounds, masked=masked)
    layers = find_moe_layers(import_model(path, {"tokens": 32}))
    if not masked:
        assert layers == ()
        return
    (layer,) = layers
    assert (layer.num_experts, layer.top_k, layer.tokens, layer.hidden, layer.ffn) == (4, rounds, 32, 8, 16)
    assert len(layer.argmax_rounds) == rounds and layer.score_function == "sparsemixer"
    assert layer.style == "gather" and len(layer.weight_gathers) == 2
