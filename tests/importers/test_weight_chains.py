"""Trainable initializers read through an elementwise chain before compute are parameters (issue 25, task H3).

Two forms the importer dropped without a warning:

* a weight norm computed in the graph, ``w = g * v / ||v||`` (torch's ``weight_norm`` parametrization, which
  a training-mode export keeps: Wav2Vec2's positional Conv, TorchScript's ``ReduceL2 / Div / Mul`` of the named
  ``parametrizations.weight.original0`` and ``original1``), read by a Conv: the zoo's
  ``wav2vec2_ts_train_bare.onnx`` counted 78,048 of torch's 94,448 (``original0`` [1, 1, 16] and
  ``original1`` [64, 16, 16]: 16 + 16,384 = 16,400 short);
* a log-scale read through ``Exp -> Neg -> Gather`` at a constant index before it meets the activations:
  Zamba's Mamba mixer runs its heads apart and reads ``-exp(A_log)[head]`` (TorchScript keeps ``A_log`` as
  ``onnx::Exp_N``): ``tests/data/weight_chain_cases/zamba_ts_bare.onnx`` (``make_weight_chain_cases.py``)
  counted 44,352 of torch's 45,376, 2 mixers x A_log [2, 32, 8] short.

Torch's counts are ``sum(p.numel() for p in model.parameters())`` of the model built from its config in
``.venv-integration`` (torch 2.13.0+cpu, transformers 5.24.0), recorded in the fixtures' ``counts.json`` /
the zoo's ``zoo.json``; the small graphs' counts are the products of the initializers' shapes named in each
test. A constant combined with a table computed from weights, or a product with positions computed from the
batch's shape, stays a constant (``test_parameter_fed_weights.py``, ``test_param_patterns.py``: RWKV's folded
``1 - time_mix`` is counted once).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "data" / "weight_chain_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())
ZOO = ROOT / "zoo"


def test_zamba_counts_its_a_log_read_per_head():
    record = COUNTS["zamba_ts"]
    graph = import_model(CASES / "zamba_ts_bare.onnx", {"batch": 2, "seq": 8})
    a_logs = [math.prod(shape) for name, shape in record["shapes"].items() if name.endswith("A_log")]
    assert a_logs == [2 * 32 * 8] * 2  # n_mamba_heads x (expand x hidden / heads) x d_state, two mixers
    assert graph.parameter_count == record["param_count"] == 44_352 + sum(a_logs) == 45_376


def test_wav2vec2_training_export_counts_its_weight_norm():
    record = json.loads((ZOO / "zoo.json").read_text())["files"]["wav2vec2_ts_train_bare.onnx"]
    graph = import_model(ZOO / "wav2vec2_ts_train_bare.onnx", {"batch": 4, "samples": 4000})
    # g [1, 1, 16] (one per kernel tap: weight_norm over dim 2) and v [64, 16, 16] (hidden 64, 16 channels per group)
    assert graph.parameter_count == record["param_count"] == 78_048 + 16 + 64 * 16 * 16 == 94_448


# Small graphs, one pattern each: a Conv of O = 8 output channels over I = 4 input channels, kernel K = 3.
O, I, K, L = 8, 4, 3, 16


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _import(tmp_path: Path, nodes, initializers, x_shape) -> int:
    x = helper.make_tensor_value_info("x", T.FLOAT, x_shape)
    y = helper.make_tensor_value_info("y", T.FLOAT, None)
    graph = helper.make_graph(nodes, "m", [x], [y], initializer=initializers)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return import_model(path, {"batch": 2}).parameter_count


G, V = "conv.parametrizations.weight.original0", "conv.parametrizations.weight.original1"


def _weight_norm(norm_nodes, w_from: str = "w"):
    """y = Conv(x, g * v / ||v||) + bias, ||v|| over every axis but the first (torch's weight_norm, dim 0)."""
    nodes = [*norm_nodes, helper.make_node("Div", [V, "norm"], ["direction"]),
             helper.make_node("Mul", ["direction", G], ["w"]),
             helper.make_node("Conv", ["x", w_from, "conv.bias"], ["y"], pads=[1, 1])]
    inits = [_tensor(G, (O, 1, 1), 0), _tensor(V, (O, I, K), 1), _tensor("conv.bias", (O,), 2), _ints("axes", [1, 2])]
    return nodes, inits


@pytest.mark.parametrize("form", ["ReduceL2", "Pow-ReduceSum-Sqrt"])
def test_a_weight_norm_computed_in_the_graph_counts_g_and_v(tmp_path, form):
    norm = ([helper.make_node("ReduceL2", [V, "axes"], ["norm"], keepdims=1)] if form == "ReduceL2" else [
        helper.make_node("Pow", [V, "two"], ["sq"]), helper.make_node("ReduceSum", ["sq", "axes"], ["ss"], keepdims=1),
        helper.make_node("Sqrt", ["ss"], ["norm"])])
    nodes, inits = _weight_norm(norm)
    inits += [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")] if form != "ReduceL2" else []
    # g 8 x 1 x 1 + v 8 x 4 x 3 + bias 8 (before: only the bias, 8)
    assert _import(tmp_path, nodes, inits, ["batch", I, L]) == O + O * I * K + O == 112


def test_a_weight_scaled_by_positions_from_the_inputs_shape_stays_a_constant(tmp_path):
    # a named [O, I, L] tensor times positions 0..L-1 computed from the input's shape (ALiBi's slopes x
    # positions form) before the Conv reads it: no weights' values alone, so only the bias is counted
    nodes = [helper.make_node("Shape", ["x"], ["length"], start=2, end=3),
             helper.make_node("Squeeze", ["length"], ["end"]),
             helper.make_node("Range", ["zero", "end", "one"], ["steps"]),
             helper.make_node("Cast", ["steps"], ["positions"], to=T.FLOAT),
             helper.make_node("Mul", [V, "positions"], ["w"]),
             helper.make_node("Conv", ["x", "w", "conv.bias"], ["y"])]
    inits = [_tensor(V, (O, I, L), 1), _tensor("conv.bias", (O,), 2), _ints_scalar("zero", 0), _ints_scalar("one", 1)]
    assert _import(tmp_path, nodes, inits, ["batch", I, L]) == O


# Mamba heads: H = 2 heads of D = 8 channels, N = 4 states; x [batch, H, D, N].
H, D, N = 2, 8, 4


def _per_head(name: str, first: str | None):
    """y = sum over heads of x[:, h] * (-first(name))[h] (``first`` None: the table itself, negated)."""
    a = "e" if first else name
    nodes = [helper.make_node(first, [name], ["e"])] if first else []
    nodes += [helper.make_node("Neg", [a], ["a"])]
    for head in range(H):
        nodes += [helper.make_node("Gather", ["a", f"i{head}"], [f"a{head}"], axis=0),
                  helper.make_node("Gather", ["x", f"i{head}"], [f"x{head}"], axis=1),
                  helper.make_node("Mul", [f"x{head}", f"a{head}"], [f"y{head}"])]
    nodes.append(helper.make_node("Sum", [f"y{h}" for h in range(H)], ["y"]))
    inits = [_tensor(name, (H, D, N), 3)] + [_ints_scalar(f"i{h}", h) for h in range(H)]
    return nodes, inits


def _ints_scalar(name: str, value: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=np.int64), name)


def test_an_exponentiated_table_read_per_head_is_a_parameter(tmp_path):
    # Zamba's -exp(A_log)[h]: A_log 2 x 8 x 4 = 64 (before: 0)
    assert _import(tmp_path, *_per_head("onnx::Exp_7", "Exp"), ["batch", H, D, N]) == H * D * N == 64


def test_an_anonymous_table_read_per_head_without_exp_stays_a_constant(tmp_path):
    # an anonymous [2, 8, 4] constant (two axes over 1, as a mask) negated and read per head: nothing says it trains
    assert _import(tmp_path, *_per_head("onnx::Neg_7", None), ["batch", H, D, N]) == 0
