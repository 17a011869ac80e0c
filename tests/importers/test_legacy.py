"""Old files made readable (importers/legacy.py): conversion, stand-in weights, a rebindable batch.

Expected values are counted by hand from each tiny graph.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from importers.legacy import default_dims, modernize

F = T.FLOAT


def _shape(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _fill(shape_name: str, out: str) -> onnx.NodeProto:
    value = helper.make_tensor("", F, [1], [0.02])
    return helper.make_node("ConstantOfShape", [shape_name], [out], value=value)


def _save(tmp_path, nodes, inputs, outputs, inits, opset=9, name="m"):
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, inits), opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 3
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _classifier(tmp_path, *, batch=1, reshape_target=(1, 32)):
    """Conv(3 -> 2 channels, 3x3, bias) on [batch, 3, 4, 4] -> Reshape to [1, 32] -> Gemm(32 -> 5)."""
    inputs = [
        helper.make_tensor_value_info("data", F, [batch, 3, 6, 6]),
        helper.make_tensor_value_info("conv_w__SHAPE", T.INT64, [4]),  # IR 3: initializers listed as inputs
    ]
    inits = [
        _shape("conv_w__SHAPE", [2, 3, 3, 3]),
        _shape("conv_b__SHAPE", [2]),
        _shape("fc_w__SHAPE", [5, 32]),
        _shape("fc_b__SHAPE", [5]),
        _shape("target", list(reshape_target)),
    ]
    nodes = [
        _fill("conv_w__SHAPE", "conv_w"),
        _fill("conv_b__SHAPE", "conv_b"),
        _fill("fc_w__SHAPE", "fc_w"),
        _fill("fc_b__SHAPE", "fc_b"),
        helper.make_node("Conv", ["data", "conv_w", "conv_b"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "target"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    outputs = [helper.make_tensor_value_info("y", F, [batch, 5])]
    return _save(tmp_path, nodes, inputs, outputs, inits)


def test_stand_in_weights_are_the_parameters(tmp_path):
    graph = import_model(_classifier(tmp_path))
    assert graph.parameter_count == (2 * 3 * 3 * 3 + 2) + (5 * 32 + 5)


def test_batch_of_one_rebinds_through_the_flatten(tmp_path):
    path = _classifier(tmp_path)
    one, four = import_model(path), import_model(path, {"batch": 4})
    # conv: 2 * (2 * 4 * 4 outputs) * 27 MACs + bias; relu 32; gemm 2 * 32 * 5 + 5: per sample
    per_sample = 2 * 32 * 27 + 32 + 32 + 2 * 32 * 5 + 5
    assert one.forward_flops() == per_sample
    assert four.forward_flops() == 4 * per_sample
    assert four.tensors["y"].shape == (4, 5)


def test_notes_say_what_changed_and_how_to_rebind(tmp_path):
    model = onnx.load(_classifier(tmp_path))
    new, notes = modernize(model, "'m.onnx'")
    assert notes == [
        "'m.onnx' uses opset 9: converted to opset 13 with onnx.version_converter",
        "1 initializers listed as graph inputs (IR 3) are taken as parameters, not inputs",
        "4 weights made by ConstantOfShape (a file shipped without its weights) are counted as parameters of their shapes",
        "'m.onnx' fixes the batch at 1 (axis 0 of data); that axis is now the dim 'batch': pass --dim batch=N to plan "
        "another batch (default: the file's 1)",
    ]
    assert default_dims(new) == {"batch": 1} and default_dims(model) == {}
    target = next(t for t in new.graph.initializer if t.name == "target")
    assert numpy_helper.to_array(target).tolist() == [0, 32]  # copies the batch instead of fixing it at 1
    assert model.graph.node[0].op_type == "ConstantOfShape"  # the caller's model is left alone


def test_batch_other_than_one_is_not_rebound(tmp_path):
    path = _classifier(tmp_path, batch=2, reshape_target=(2, 32))
    graph = import_model(path)
    assert not any("fixes the batch" in w for w in graph.warnings)
    assert graph.tensors["y"].shape == (2, 5)


def test_fill_that_is_not_a_weight_stays_a_constant(tmp_path):
    # A ConstantOfShape added to an activation is a fill value or a mask, not a stand-in weight.
    inputs = [helper.make_tensor_value_info("x", F, ["batch", 8])]
    nodes = [_fill("s", "zeros"), helper.make_node("Add", ["x", "zeros"], ["y"], name="add")]
    path = _save(tmp_path, nodes, inputs, [helper.make_tensor_value_info("y", F, ["batch", 8])], [_shape("s", [8])], opset=13)
    graph = import_model(path, {"batch": 2})
    assert graph.parameter_count == 0
    assert not any("ConstantOfShape" in w for w in graph.warnings)


@pytest.mark.parametrize("opset", [13, 18])
def test_current_opsets_are_not_converted(tmp_path, opset):
    inputs = [helper.make_tensor_value_info("x", F, [1, 8])]
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], inputs, [helper.make_tensor_value_info("y", F, [1, 8])], [], opset=opset)
    new, notes = modernize(onnx.load(path))
    assert notes == [] or notes == ["1 initializers listed as graph inputs (IR 3) are taken as parameters, not inputs"]
    assert new.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1  # only converted files are rebound


def test_reshape_of_a_value_not_led_by_the_batch_keeps_its_target(tmp_path):
    # [1, 3, 4] -> Transpose -> [3, 1, 4] -> Reshape [1, 12]: axis 0 of the reshaped value is 3, so
    # writing 0 ("copy axis 0") would ask for [3, 12]; the target must stay as the file wrote it.
    inputs = [helper.make_tensor_value_info("x", F, [1, 3, 4])]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2], name="t"),
        helper.make_node("Reshape", ["t", "target"], ["flat"], name="r"),
        helper.make_node("Relu", ["flat"], ["y"], name="relu"),
    ]
    path = _save(tmp_path, nodes, inputs, [helper.make_tensor_value_info("y", F, [1, 12])], [_shape("target", [1, 12])])
    new, notes = modernize(onnx.load(path))
    assert any("fixes the batch at 1" in n for n in notes)
    target = next(t for t in new.graph.initializer if t.name == "target")
    assert numpy_helper.to_array(target).tolist() == [1, 12]
    assert import_model(path).tensors["y"].shape == (1, 12)
