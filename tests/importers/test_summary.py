"""The model summary of ``planner inspect``, against numbers computed by hand."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from importers.summary import ModelSummary, summarize


def test_summary_of_a_small_mlp(tmp_path):
    w1 = numpy_helper.from_array(np.ones((16, 32), np.float32), "fc1.weight")
    w2 = numpy_helper.from_array(np.full((32, 4), 2.0, np.float32), "fc2.weight")
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="relu"),
        helper.make_node("MatMul", ["a", "fc2.weight"], ["y"], name="fc2"),
        helper.make_node("Mystery", ["y"], ["z"], name="odd", domain="acme"),
    ]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("z", T.FLOAT, ["batch", 4])], [w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("acme", 1)])
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    # The custom op's output shape is unknown to inference: declare it.
    summary = summarize(import_model(path, {"batch": 8}))
    assert isinstance(summary, ModelSummary)
    assert (summary.raw_node_count, summary.coarse_op_count) == (4, 3)
    assert summary.raw_op_types == {"MatMul": 2, "Relu": 1, "Mystery": 1}
    assert summary.parameter_count == 16 * 32 + 32 * 4
    assert summary.parameter_bytes == 4 * summary.parameter_count
    fc1 = 2 * 8 * 32 * 16 + 8 * 32  # matmul + fused relu
    fc2 = 2 * 8 * 4 * 32
    odd = 8 * 4  # opaque: 1 FLOP per output element
    assert summary.forward_flops == fc1 + fc2 + odd
    # backward: 2x for the matmuls, 1x for the opaque op
    assert summary.training_flops == 3 * (fc1 + fc2) + 2 * odd
    assert summary.activation_bytes == 4 * (8 * 32 + 8 * 4 + 8 * 4)
    assert [(o.op_type, o.count, o.nodes) for o in summary.opaque] == [("Mystery", 1, ("odd",))]
    data = summary.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["opaque"] == [{"op_type": "Mystery", "count": 1, "nodes": ["odd"]}]
    assert data["dim_bindings"]["batch"] == 8
