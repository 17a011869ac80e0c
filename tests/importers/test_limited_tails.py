"""The importers' "first N ... and M more" tails come from one helper, ``importers.onnx_protos._limited``
(issue 25 clean-up): declared shapes that contradict the computed ones are one warning, as the importer's
other lists are, and the folded-constant warning names its first three."""

from __future__ import annotations

from onnx import TensorProto, helper

from importers.param_evidence import _folded_warning
from importers.shapes import resolve_shapes

OPSET = [helper.make_opsetid("", 18)]


def test_contradicting_declared_shapes_are_one_warning() -> None:
    # x [batch, 4] through 7 Relus, each output declared [batch, 5]: 7 contradictions, the first 5 named
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    names = [f"r{i}" for i in range(7)]
    nodes = [helper.make_node("Relu", [src], [dst]) for src, dst in zip(["x", *names], names)]
    declared = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 5]) for n in names[:-1]]
    out = helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, ["batch", 5])
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [out], value_info=declared), opset_imports=OPSET)
    warnings = [w for w in resolve_shapes(model, {"batch": 2}).warnings if "declared" in w]
    assert warnings == [
        "7 declared shape(s) contradict the computed ones, which are used: "
        + ", ".join(f"'r{i}' declared [batch, 5], computed [2, 4]" for i in range(5)) + " and 2 more"
    ]


def test_folded_constants_name_three_and_count_the_rest() -> None:
    folded = [(f"val_{i}", [2, 4]) for i in range(5)]  # 5 x 8 = 40 elements
    text = _folded_warning(folded)
    assert text.startswith("40 elements of constants the exporter made ('val_0' [2, 4], 'val_1' [2, 4], "
                           "'val_2' [2, 4] and 2 more) are added to attention scores")
    assert "'val_2' [2, 4]) are added" in _folded_warning(folded[:3])  # three: no tail
