"""A softmax whose probabilities two value matmuls read is named in the no-attention refusal (issue 25, task h26f).

DiffLlama's differential attention (transformers 5.24, ``DiffLlamaForCausalLM``, dynamo export) runs two
``scaled_dot_product_attention`` calls on the same queries and keys; the exporter's optimiser merges their score
product and softmax, so one map feeds two value matmuls and the reader, which takes one value matmul per map,
found no attention. The refusal said only "has no attention (matmul -> softmax -> matmul)", as for a CNN; it now
names the softmax and its value matmuls. The twin is that shape written by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport


def _weight(name: str, rows: int, cols: int, seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32), name)


def _model(tmp_path: Path, values: int) -> Path:
    """x [2, 8, 16] -> Q, K and ``values`` V projections; softmax(Q K^T) read by each V; the outputs subtracted
    (two values) and projected out."""
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["probs"], axis=-1)]
    weights = [_weight("wq", 16, 16, 0), _weight("wk", 16, 16, 1), _weight("wo", 16, 16, 9)]
    for i in range(values):
        weights.append(_weight(f"wv{i}", 16, 16, 2 + i))
        nodes += [helper.make_node("MatMul", ["x", f"wv{i}"], [f"v{i}"]),
                  helper.make_node("MatMul", ["probs", f"v{i}"], [f"a{i}"])]
    if values == 2:
        nodes.append(helper.make_node("Sub", ["a0", "a1"], ["mixed"]))
    nodes.append(helper.make_node("MatMul", ["mixed" if values == 2 else "a0", "wo"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 8, 16])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 8, 16])], weights)
    path = tmp_path / f"values{values}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def test_a_map_two_values_read_is_named_in_the_refusal(tmp_path):
    graph = import_model(_model(tmp_path, 2), {})
    with pytest.raises(UnsupportedExport, match=r"has no attention .* that the reader follows \(softmax \S+: 2 value "
                                                r"matmuls \(\S+, \S+\) read its probabilities"):
        analyze_transformer(graph)


def test_one_value_is_attention(tmp_path):
    # the same graph with one value matmul is read as one attention block: the note is for the refusal only
    model = analyze_transformer(import_model(_model(tmp_path, 1), {}))
    assert len(model.attention) == 1 and model.attention[0].hidden_size == 16
