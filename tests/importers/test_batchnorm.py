"""BatchNormalizations an inference export folded into convolutions come back as ops (importers.batchnorm).

The oracle is the same network written the way an export without the optimizer writes it (Conv
without bias -> BatchNormalization with its own scale and shift): both files must import to the
same op graph, parameter count, FLOPs and activation bytes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from importers.batchnorm import restore_folded_batchnorms

B, C_IN, C_OUT, HW = 2, 3, 8, 16


def _tensor(name, *shape):
    return numpy_helper.from_array(np.arange(math.prod(shape), dtype=np.float32).reshape(shape) / 7.0, name)


def _save(tmp_path, name, nodes, initializers):
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", T.FLOAT, ["batch", C_IN, HW, HW])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["batch", C_OUT, HW, HW])], initializers,
    )
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


def folded(tmp_path, bias_name="conv.weight_bias"):
    """What the dynamo exporter's optimizer writes: the BatchNorm folded into the Conv's new bias."""
    nodes = [helper.make_node("Conv", ["x", "conv.weight", bias_name], ["h"], name="conv", pads=[1] * 4),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    return _save(tmp_path, "folded", nodes, [_tensor("conv.weight", C_OUT, C_IN, 3, 3), _tensor(bias_name, C_OUT)])


def unfolded(tmp_path):
    """The same network as an export without the optimizer writes it."""
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("BatchNormalization", ["c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                              ["h"], name="bn"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    inits = [_tensor("conv.weight", C_OUT, C_IN, 3, 3)] + [
        _tensor(f"bn.{part}", C_OUT) for part in ("weight", "bias", "running_mean", "running_var")
    ]
    return _save(tmp_path, "unfolded", nodes, inits)


def test_folded_file_imports_as_the_unfolded_network(tmp_path):
    restored = import_model(folded(tmp_path), {"batch": B})
    reference = import_model(unfolded(tmp_path), {"batch": B})
    assert [(op.kind, op.op_type, op.fused_pointwise) for op in restored.ops] == [
        (op.kind, op.op_type, op.fused_pointwise) for op in reference.ops
    ] == [("conv", "Conv", 0), ("norm", "BatchNormalization", 1)]
    # conv weight + BatchNorm scale and shift; the running statistics are buffers
    assert restored.parameter_count == reference.parameter_count == C_OUT * C_IN * 9 + 2 * C_OUT
    assert restored.forward_flops() == reference.forward_flops()
    assert [[d.size for d in op.dims] for op in restored.ops] == [[d.size for d in op.dims] for op in reference.ops]
    assert any("1 BatchNormalization layer(s)" in w and "restored" in w for w in restored.warnings)
    # provenance stays the file's: 2 nodes, no BatchNormalization in it
    assert restored.raw_node_count == 2 and restored.raw_op_types == {"Conv": 1, "Relu": 1}


@pytest.mark.parametrize("bias_name", ["conv.bias", "onnx::Conv_7"])
def test_a_bias_the_model_has_is_kept(tmp_path, bias_name):
    graph = import_model(folded(tmp_path, bias_name), {"batch": B})
    assert [op.op_type for op in graph.ops] == ["Conv"]
    assert graph.parameter_count == C_OUT * C_IN * 9 + C_OUT
    assert not any("BatchNormalization" in w for w in graph.warnings)


def test_a_bias_read_twice_is_not_a_folded_batchnorm():
    w, b = _tensor("conv.weight", C_OUT, C_IN, 3, 3), _tensor("conv.weight_bias", C_OUT)
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.weight_bias"], ["h"]),
             helper.make_node("Add", ["h", "conv.weight_bias"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [], [], [w, b]))
    assert restore_folded_batchnorms(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Conv", "Add"]
