"""Trainable weights that act on constant tables, or are read through ``Exp``, are counted (issue 25, task H8).

A second new user's sweep (task H7, finding A) found three exporter forms whose weights the count dropped
with no warning:

* Swin-v2's continuous position bias MLP maps a constant coordinate table to the bias added to the
  attention scores: ``relu(table @ W0.T + b0) @ W2.T``. No operand is computed from the inputs, so the
  importer took it for a constant fold. ``importers.parameters._linears_on_constants``: an Add of a named
  ``.bias`` and a MatMul of an initializer is a Linear (both counted); the next layer then reads a
  parameter-fed value (``_trained_through_parameters``).
* Swin-v2's ``logit_scale`` is read as ``exp(clamp(logit_scale, max=log 100))``: ``Clip`` with constant
  bounds now keeps it the weight (``_passes_weight``).
* Mamba-1's ``A_log`` [d_inner, d_state] is read as ``-exp(A_log)`` (TorchScript keeps it as
  ``onnx::Exp_N``): an anonymous weight of two axes over 1 added to or multiplied with an activation was
  taken for a mask; one that is exponentiated first is a learned log-scale (``_exponentiated``), and so
  is an anonymous scalar (SigLIP's ``logit_scale.exp()``, TorchScript's ``onnx::Exp_N`` [1]).

The dynamo exporter computes Swin-v2's ``table @ W0.T`` at export time, so that file does not hold ``W0``:
a warning says so (``_warn_folded_linear_weights``).

Files: ``tests/data/table_weight_cases`` (``tests/importers/make_table_weight_cases.py``; ``counts.json``
holds torch 2.13 / transformers 5.24's ``sum(p.numel() for p in model.parameters())`` and the shapes of
the parameters named above).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "table_weight_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())


def _graph(name: str, **dims: int):
    return import_model(CASES / f"{name}_bare.onnx", dims)


def _shapes(case: str, suffix: str) -> list[list[int]]:
    return [s for n, s in sorted(COUNTS[case]["shapes"].items()) if n.endswith(suffix)]


def _numel(case: str, suffix: str) -> int:
    return sum(math.prod(s) for s in _shapes(case, suffix))


def test_swinv2_torchscript_counts_the_position_bias_mlp_and_logit_scale():
    graph = _graph("swinv2_ts", batch=2)
    # config: heads [2, 4], one block per stage; MLP .0 is Linear(2, 512) with bias, .2 Linear(512, heads)
    assert _shapes("swinv2_ts", "mlp.2.weight") == [[2, 512], [4, 512]]
    mlp = _numel("swinv2_ts", "mlp.0.weight") + _numel("swinv2_ts", "mlp.0.bias") + _numel("swinv2_ts", "mlp.2.weight")
    assert mlp == (1024 + 512 + 1024) + (1024 + 512 + 2048) == 6_144
    assert _numel("swinv2_ts", "logit_scale") == 2 + 4
    # before: 18,682 (the sweep's count), torch's 24,832 less the MLPs and the logit scales
    assert graph.parameter_count == COUNTS["swinv2_ts"]["param_count"] == 18_682 + 6_144 + 6 == 24_832
    counted = {p.name: p.num_elements for p in graph.parameters}
    assert counted["swinv2.encoder.layers.1.blocks.0.attention.self.logit_scale"] == 4
    assert counted["swinv2.encoder.layers.0.blocks.0.attention.self.continuous_position_bias_mlp.0.bias"] == 512
    assert not graph.warnings


def test_mamba1_torchscript_counts_a_log_read_through_exp():
    graph = _graph("mamba1_ts", batch=2, seq=16)
    assert _shapes("mamba1_ts", "A_log") == [[128, 8], [128, 8]]  # [expand 2 x 64, state 8] per layer
    exp_read = sorted(p.num_elements for p in graph.parameters if p.name.startswith("onnx::Exp_"))
    assert exp_read == [1024, 1024]
    # untied head: torch's count is the file's (the head is warned as a possible tied copy, not dropped)
    assert graph.parameter_count == COUNTS["mamba1_ts"]["param_count"] == 185_280 + 2 * 1024 == 187_328


def test_swinv2_dynamo_says_the_folded_mlp_weights_are_not_in_the_file():
    graph = _graph("swinv2_dynamo", batch=2)
    folded = _numel("swinv2_dynamo", "mlp.0.weight")
    assert folded == 2 * 512 * 2  # two blocks' Linear(2, 512) weights, folded into table @ W.T
    assert graph.parameter_count == COUNTS["swinv2_dynamo"]["param_count"] - folded == 22_784
    (note,) = [w for w in graph.warnings if "Linear module(s) read a constant input" in w]
    assert note.startswith("2 Linear") and "[1, 7, 7, 512]" in note
    assert "higher by 1,024 x in_features" in note  # 2 x 512 out_features, in_features 2 here


# Small graphs, one pattern each (P = 8 positions, H = 16 hidden, C = 2 coordinates, M = 32 MLP width).
P, H, C, M = 8, 16, 2, 32


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _import(tmp_path: Path, nodes, initializers):
    x = helper.make_tensor_value_info("x", T.FLOAT, ["batch", P, H])
    y = helper.make_tensor_value_info("y", T.FLOAT, None)
    graph = helper.make_graph(nodes, "m", [x], [y], initializer=initializers)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return import_model(path, {"batch": 2})


def _table_mlp(bias: str):
    """Scores x x^T plus relu(table @ W0 + bias) @ W2, reshaped to [P, P]: Swin-v2's form, no weight on x."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["xT"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xT"], ["scores"]),
        helper.make_node("MatMul", ["onnx::Constant_1", "onnx::MatMul_2"], ["h0"]),
        helper.make_node("Add", [bias, "h0"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "onnx::MatMul_3"], ["h3"]),
        helper.make_node("Reshape", ["h3", "shape"], ["pb"]),
        helper.make_node("Add", ["scores", "pb"], ["y"]),
    ]
    inits = [_tensor("onnx::Constant_1", (P * P, C), 0), _tensor("onnx::MatMul_2", (C, M), 1),
             _tensor(bias, (M,), 2), _tensor("onnx::MatMul_3", (M, 1), 3),
             numpy_helper.from_array(np.array([P, P], dtype=np.int64), "shape")]
    return nodes, inits


def test_an_mlp_on_a_constant_table_is_trained(tmp_path):
    graph = _import(tmp_path, *_table_mlp("cpb_mlp.0.bias"))
    # W0 2 x 32 = 64, its bias 32, W2 32 x 1 = 32; the table [64, 2] itself is a constant
    assert graph.parameter_count == 64 + 32 + 32 == 128


def test_a_fold_of_constants_without_a_named_bias_stays_a_constant(tmp_path):
    # the same arithmetic with an anonymous addend: nothing in the file says a module trains it
    assert _import(tmp_path, *_table_mlp("onnx::Add_9")).parameter_count == 0


def _scaled(first: str, name: str, shape: tuple[int, ...]):
    """x times ``-first(name)``: Mamba's ``-exp(A_log)``, or a constant negated."""
    nodes = [helper.make_node(first, [name], ["e"]), helper.make_node("Neg", ["e"], ["n"]),
             helper.make_node("Mul", ["x", "n"], ["y"])]
    return nodes, [_tensor(name, shape, 4)]


def test_an_exponentiated_anonymous_weight_is_trained(tmp_path):
    assert _import(tmp_path, *_scaled("Exp", "onnx::Exp_5", (P, H))).parameter_count == P * H == 128


def test_an_anonymous_table_not_exponentiated_stays_a_constant(tmp_path):
    # a [P, H] constant (a mask's shape) negated and multiplied in: no rule makes it a weight
    assert _import(tmp_path, *_scaled("Abs", "onnx::Abs_5", (P, H))).parameter_count == 0


def test_a_clamped_then_exponentiated_scale_is_trained(tmp_path):
    nodes = [helper.make_node("Clip", ["attn.logit_scale", "", "max"], ["c"]),
             helper.make_node("Exp", ["c"], ["e"]), helper.make_node("Mul", ["x", "e"], ["y"])]
    inits = [_tensor("attn.logit_scale", (H,), 5),
             numpy_helper.from_array(np.array(math.log(100.0), dtype=np.float32), "max")]
    assert _import(tmp_path, nodes, inits).parameter_count == H == 16


def test_siglip_torchscript_counts_its_exponentiated_logit_scale():
    # tests/data/pooling_cases (make_pooling_cases.py): SiglipModel, torch's 250,114 with the root-module
    # logit_scale [1] and logit_bias [1]; TorchScript keeps exp(logit_scale) as Exp of 'onnx::Exp_N' (counted
    # now) and adds logit_bias as an anonymous 'onnx::Add_N' scalar, counted since 8a65a78 with the may-be-a-buffer
    # warning: it is added to the logits before their transpose (importers/param_evidence.py's _output_bias)
    pooling = ROOT / "tests" / "data" / "pooling_cases"
    torch_count = json.loads((pooling / "counts.json").read_text())["siglip_ts_bare.onnx"]["param_count"]
    graph = import_model(pooling / "siglip_ts_bare.onnx", {"batch": 2})
    assert graph.parameter_count == torch_count == 250_112 + 2
    assert [p.num_elements for p in graph.parameters if p.name.startswith("onnx::Exp_")] == [1]

