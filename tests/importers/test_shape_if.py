"""Ifs whose condition reads only shapes (TorchScript's squeeze of an axis of unknown size) are decided at the
bound dims and replaced by the branch taken (importers.shape_if); one reading tensor values stays refused.

Oracle: onnx's reference evaluator runs the file as written (with its If) on inputs of the bound sizes; the
imported graph must hold the taken branch's op and give the values the evaluator's output shapes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

from importers import import_model
from importers.onnx_load import load_onnx
from importers.shape_if import decide_shape_ifs
from planner.core.errors import ModelError

HIDDEN = 16


def _squeeze_if(value: str, axis: int, out: str, name: str) -> list[onnx.NodeProto]:
    """TorchScript's ``value.squeeze(axis)``: If(Shape(value)[axis] == 1, Squeeze, Identity), names as it writes them."""
    then = helper.make_graph(
        [helper.make_node("Constant", [], [f"{name}_axes"], value=helper.make_tensor("a", T.INT64, [1], [axis])),
         helper.make_node("Squeeze", [value, f"{name}_axes"], [f"{name}_squeezed"], name=f"{name}/Squeeze")],
        "then", [], [helper.make_empty_tensor_value_info(f"{name}_squeezed")])
    other = helper.make_graph([helper.make_node("Identity", [value], [f"{name}_kept"], name=f"{name}/Identity")],
                              "else", [], [helper.make_empty_tensor_value_info(f"{name}_kept")])
    return [
        helper.make_node("Shape", [value], [f"{name}_shape"], name=f"{name}/Shape"),
        helper.make_node("Constant", [], [f"{name}_k"], value=helper.make_tensor("k", T.INT64, [], [axis])),
        helper.make_node("Gather", [f"{name}_shape", f"{name}_k"], [f"{name}_size"], name=f"{name}/Gather", axis=0),
        helper.make_node("Constant", [], [f"{name}_one"], value=helper.make_tensor("o", T.INT64, [], [1])),
        helper.make_node("Equal", [f"{name}_size", f"{name}_one"], [f"{name}_cond"], name=f"{name}/Equal"),
        helper.make_node("If", [f"{name}_cond"], [out], name=f"{name}/If", then_branch=then, else_branch=other),
    ]


def _model(*, chained: bool = False) -> onnx.ModelProto:
    """x [batch, n, 8] @ w [8, 16] -> h; y = h.squeeze(1) as TorchScript writes it; z = y @ w2 [16, 16].

    ``chained``: a second If, whose condition is the rank of y (so it can be decided only once the first is),
    picks Relu (rank 2, the squeeze taken) or Neg.
    """
    rng = np.random.default_rng(0)
    weights = [helper.make_tensor("w", T.FLOAT, [8, HIDDEN], rng.standard_normal(8 * HIDDEN).tolist()),
               helper.make_tensor("w2", T.FLOAT, [HIDDEN, HIDDEN], rng.standard_normal(HIDDEN * HIDDEN).tolist())]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj/MatMul")]
    nodes += _squeeze_if("h", 1, "y", "mixer")
    last = "y"
    if chained:
        then = helper.make_graph([helper.make_node("Relu", ["y"], ["r"], name="act/Relu")], "then", [],
                                 [helper.make_empty_tensor_value_info("r")])
        other = helper.make_graph([helper.make_node("Neg", ["y"], ["r"], name="act/Neg")], "else", [],
                                  [helper.make_empty_tensor_value_info("r")])
        nodes += [helper.make_node("Shape", ["y"], ["y_shape"], name="act/Shape"),
                  helper.make_node("Size", ["y_shape"], ["y_rank"], name="act/Size"),
                  helper.make_node("Constant", [], ["two"], value=helper.make_tensor("t", T.INT64, [], [2])),
                  helper.make_node("Equal", ["y_rank", "two"], ["is_matrix"], name="act/Equal"),
                  helper.make_node("If", ["is_matrix"], ["act"], name="act/If", then_branch=then, else_branch=other)]
        last = "act"
    nodes.append(helper.make_node("MatMul", [last, "w2"], ["z"], name="out/MatMul"))
    graph = helper.make_graph(nodes, "squeeze_if", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "n", 8])],
                              [helper.make_tensor_value_info("z", T.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _reference_shapes(model: onnx.ModelProto, batch: int, n: int) -> dict[str, tuple[int, ...]]:
    """Shapes of y and z as onnx's reference evaluator computes them, If and all."""
    x = np.ones((batch, n, 8), np.float32)
    y, z = ReferenceEvaluator(model).run(["y", "z"], {"x": x})
    return {"y": tuple(y.shape), "z": tuple(z.shape)}


@pytest.mark.parametrize("n", [1, 4])
def test_squeeze_if_decided_both_ways(tmp_path: Path, n: int) -> None:
    model = _model()
    path = tmp_path / "squeeze_if.onnx"
    onnx.save(model, str(path))
    expected = _reference_shapes(model, 3, n)  # n=1: y (3, 16), the squeeze taken; n=4: y (3, 4, 16), kept
    assert expected["y"] == ((3, HIDDEN) if n == 1 else (3, n, HIDDEN))
    graph = import_model(path, {"batch": 3, "n": n})
    assert [op.name for op in graph.ops] == ["proj/MatMul", "out/MatMul"]
    assert not any("If" in op.node_types for op in graph.ops)
    assert graph.raw_op_types["If"] == 1  # the file's histogram is the file's
    assert graph.tensors["h"].shape == (3, n, HIDDEN)
    assert graph.tensors["z"].shape == expected["z"]
    out = next(op for op in graph.ops if op.name == "out/MatMul")
    # taken Squeeze (a view folded into the reader): h's size-1 axis is read by no loop, and the matmul
    # has rows m = batch; kept Identity: h read whole, rows b0 x m = batch x n
    reads_h = next(a.axes for a in out.inputs if a.tensor == "h")
    assert reads_h == ((("m",), (), ("k",)) if n == 1 else (("b0",), ("m",), ("k",)))
    assert out.flops == 2 * 3 * n * HIDDEN * HIDDEN  # 1,536 at n=1, 6,144 at n=4
    assert graph.parameter_count == 8 * HIDDEN + HIDDEN * HIDDEN


@pytest.mark.parametrize(("n", "activation"), [(1, "Relu"), (4, "Neg")])
def test_chained_ifs_decided_in_rounds(n: int, activation: str) -> None:
    model = _model(chained=True)
    assert _reference_shapes(model, 2, n)["z"] == ((2, HIDDEN) if n == 1 else (2, n, HIDDEN))
    assert decide_shape_ifs(model, {"batch": 2, "n": n}) == 2
    ops = [node.op_type for node in model.graph.node]
    assert "If" not in ops and activation in ops and ({"Relu", "Neg"} - {activation}).isdisjoint(ops)
    # the spliced graph computes what the If graph computed
    x = np.random.default_rng(1).standard_normal((2, n, 8)).astype(np.float32)
    spliced = ReferenceEvaluator(model).run(["z"], {"x": x})[0]
    original = ReferenceEvaluator(_model(chained=True)).run(["z"], {"x": x})[0]
    np.testing.assert_array_equal(spliced, original)


def test_pass_through_branch_and_clashing_names() -> None:
    """A branch that hands an outer value through (no node) becomes an Identity; an inner name that an outer
    value already has is renamed, not shadowed."""
    model = _model()
    graph = model.graph
    if_node = next(n for n in graph.node if n.op_type == "If")
    then = next(a.g for a in if_node.attribute if a.name == "then_branch")
    then.node[0].output[0] = "w"  # the branch's axes constant now has the name of the outer weight w
    then.node[1].input[1] = "w"
    other = next(a.g for a in if_node.attribute if a.name == "else_branch")
    del other.node[:]
    other.output[0].name = "h"
    decide_shape_ifs(model, {"batch": 2, "n": 1})
    assert [n.input[1] for n in model.graph.node if n.op_type == "MatMul"] == ["w", "w2"]
    squeeze = next(n for n in model.graph.node if n.op_type == "Squeeze")
    assert squeeze.input[0] == "h" and squeeze.input[1] == "w__mixer/If" and squeeze.output[0] == "y"
    model = _model()
    other = next(a.g for a in next(n for n in model.graph.node if n.op_type == "If").attribute
                 if a.name == "else_branch")
    del other.node[:]
    other.output[0].name = "h"
    decide_shape_ifs(model, {"batch": 2, "n": 4})
    identity = next(n for n in model.graph.node if n.op_type == "Identity")
    assert (list(identity.input), list(identity.output)) == (["h"], ["y"])
    x = np.ones((2, 4, 8), np.float32)
    assert ReferenceEvaluator(model).run(["z"], {"x": x})[0].shape == (2, 4, HIDDEN)


def test_condition_on_values_refused(tmp_path: Path) -> None:
    """An If whose condition reads the data of x (ReduceMax(x) > 0) cannot be decided from shapes."""
    model = _model()
    graph = model.graph
    if_node = next(n for n in graph.node if n.op_type == "If")
    graph.node.insert(0, helper.make_node("ReduceMax", ["x"], ["peak"], name="peak/ReduceMax", keepdims=0))
    graph.node.insert(1, helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", T.FLOAT, [], [0.0])))
    graph.node.insert(2, helper.make_node("Greater", ["peak", "zero"], ["positive"], name="peak/Greater"))
    if_node = next(n for n in graph.node if n.op_type == "If")
    if_node.input[0] = "positive"
    path = tmp_path / "data_if.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError) as exc:
        load_onnx(path)
    text = str(exc.value)
    assert "If node 'mixer/If', whose condition reads tensor values, not shapes: 'x'" in text
    assert "export with the control flow unrolled / traced" in text and "\n" not in text


def test_condition_that_cannot_be_computed(tmp_path: Path) -> None:
    """A condition read from shapes through an op the importer cannot evaluate (another domain's) is refused
    at import, naming the If and a re-export that removes it."""
    model = _model()
    graph = model.graph
    equal = next(n for n in graph.node if n.op_type == "Equal")
    equal.op_type, equal.domain = "SizeIsOne", "com.example"
    del equal.input[1:]
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    path = tmp_path / "opaque_if.onnx"
    onnx.save(model, str(path))
    load_onnx(path)  # shapes alone feed it: not refused as control flow
    with pytest.raises(ModelError) as exc:
        import_model(path, {"batch": 2, "n": 1})
    assert str(exc.value).startswith("opaque_if.onnx: If node 'mixer/If': its condition reads only shapes but "
                                     "could not be computed at these dims; re-export with that axis static")
