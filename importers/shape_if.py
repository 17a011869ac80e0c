"""``If`` nodes whose condition reads only shapes, decided at the bound dims and replaced by the branch taken.

The TorchScript exporter writes ``x.squeeze(dim)`` on an axis whose size it does not know as
``If(Equal(Gather(Shape(x), k), 1), then: Squeeze(x, k), else: Identity(x))`` (transformers' Zamba and
Mamba mixers). The file is a trace; its only control flow asks a question about a shape, which the
``--dim`` bindings answer. So:

* :func:`importers.onnx_load.condition_data_read` (the loader's check) walks back from an If's
  condition through its producers, stopping at ``Shape`` / ``Size`` (their output is a shape, not the
  data) and at constants; the first graph input or random op it reaches is data the condition reads,
  and such an If stays refused as control flow;
* :func:`decide_shape_ifs` (used by :func:`importers.import_model`, before the shapes are resolved)
  computes each condition with :func:`importers.shapes.resolve_shapes` on the model cut down to the
  condition's ancestors (so a second If downstream of the first is decided in a later round, once the
  first is gone), and splices the taken branch's nodes in place of the If: the branch's outputs are
  renamed to the If's outputs, its inner names kept unless they clash with the outer graph's, and its
  reads of outer-scope values left as they are (they name the outer values).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from importers.onnx_load import condition_data_read
from importers.shapes import resolve_shapes
from importers.unrolled_loop import unrolled_loop_error
from planner.core.errors import ModelError

__all__ = ["decide_shape_ifs"]


def decide_shape_ifs(model: onnx.ModelProto, dims: Mapping[str, int]) -> int:
    """Replace every ``If`` of the main graph by the branch its condition takes at ``dims`` (in place).

    Parameters
    ----------
    model:
        A model as :func:`importers.onnx_load.load_onnx` returns it (its Ifs read only shapes).
    dims:
        Symbolic dim name -> size in elements, as for :func:`importers.shapes.resolve_shapes`.

    Returns
    -------
    int
        How many If nodes were replaced (0: the model is unchanged).

    Raises
    ------
    ModelError
        A condition reads tensor values, or could not be computed at these dims, or is not one value.
    UnboundDimError
        A dim the condition's shapes need has no value.

    Examples
    --------
    >>> from onnx import helper, TensorProto as T
    >>> x = helper.make_tensor_value_info("x", T.FLOAT, ["batch", 8])
    >>> y = helper.make_tensor_value_info("y", T.FLOAT, None)
    >>> axis = helper.make_tensor("axis", T.INT64, [1], [0])
    >>> then = helper.make_graph([helper.make_node("Squeeze", ["x", "axis"], ["sq"])], "then", [],
    ...                          [helper.make_empty_tensor_value_info("sq")])
    >>> other = helper.make_graph([helper.make_node("Identity", ["x"], ["id"])], "else", [],
    ...                           [helper.make_empty_tensor_value_info("id")])
    >>> nodes = [helper.make_node("Size", ["x"], ["n"]),
    ...          helper.make_node("Constant", [], ["eight"], value=helper.make_tensor("e", T.INT64, [], [8])),
    ...          helper.make_node("Equal", ["n", "eight"], ["one_row"]),
    ...          helper.make_node("If", ["one_row"], ["y"], then_branch=then, else_branch=other)]
    >>> m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [axis]),
    ...                       opset_imports=[helper.make_opsetid("", 18)])
    >>> decide_shape_ifs(m, {"batch": 1}), [n.op_type for n in m.graph.node][-1]
    (1, 'Squeeze')
    """
    graph = model.graph
    decided = 0
    while any(n.op_type == "If" for n in graph.node):
        ready = _ready_ifs(graph)
        for index in ready:
            read = condition_data_read(graph, graph.node[index])
            if read is not None:
                raise ModelError(_data_if_message(graph.node[index], read))
        conditions = [graph.node[index].input[0] for index in ready]
        shaped = resolve_shapes(_cone_model(model, conditions), dims)
        if any(shaped.constants.get(condition) is None for condition in conditions):
            # shapes stop before a condition: a loop traced at another length is the likelier cause, and says so
            unrolled = unrolled_loop_error(shaped.model, shaped.shapes, shaped.dtypes, shaped.constants,
                                           shaped.dim_bindings)
            if unrolled:
                raise ModelError(unrolled)
        taken = {index: _truth(graph.node[index], shaped.constants.get(graph.node[index].input[0])) for index in ready}
        _splice(graph, taken)
        decided += len(ready)
    return decided


def _data_if_message(node: onnx.NodeProto, read: str) -> str:
    """The loader's refusal of an If whose condition reads ``read``'s data (one line, with the fix)."""
    return (
        f"the model contains control flow (If node '{node.name}', whose condition reads tensor values, not "
        f"shapes: '{read}'), which is not supported; export with the control flow unrolled / traced (e.g. "
        "torch.onnx.export of a traced model with fixed loop counts)"
    )


def _ready_ifs(graph: onnx.GraphProto) -> list[int]:
    """Indices of the Ifs whose condition has no If among its ancestors (the first If of any order is one)."""
    producer = {out: n for n in graph.node for out in n.output if out}
    ready = []
    for index, node in enumerate(graph.node):
        if node.op_type != "If":
            continue
        ancestors = _ancestors(producer, node.input[:1])
        if not any(producer[name].op_type == "If" for name in ancestors if name in producer):
            ready.append(index)
    return ready


def _ancestors(producer: Mapping[str, onnx.NodeProto], names) -> set[str]:
    """Every value the values ``names`` are computed from, themselves included."""
    stack = [n for n in names if n]
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        source = producer.get(name)
        if source is not None:
            stack.extend(i for i in source.input if i)
    return seen


def _cone_model(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """``model`` cut down to the nodes ``outputs`` are computed from, with ``outputs`` as its outputs."""
    graph = model.graph
    producer = {out: n for n in graph.node for out in n.output if out}
    needed = _ancestors(producer, outputs)
    nodes = [n for n in graph.node if any(out in needed for out in n.output)]
    initializers = [t for t in graph.initializer if t.name in needed]
    weights = {t.name for t in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in weights or vi.name in needed]
    value_info = [vi for vi in graph.value_info if vi.name in needed]
    cone = helper.make_graph(
        nodes, f"{graph.name}_conditions", inputs,
        [helper.make_tensor_value_info(name, TensorProto.BOOL, None) for name in outputs],
        initializers, value_info=value_info,
    )
    result = onnx.ModelProto(ir_version=model.ir_version, graph=cone)
    result.opset_import.extend(model.opset_import)
    result.functions.extend(model.functions)
    return result


def _truth(node: onnx.NodeProto, value: np.ndarray | None) -> bool:
    """The branch an If takes: its condition's one value; ModelError when it is unknown or not one value."""
    if value is None or value.size != 1:
        what = "could not be computed" if value is None else f"has {value.size} values, not one"
        raise ModelError(
            f"If node '{node.name}': its condition reads only shapes but {what} at these dims; re-export "
            "with that axis static (torch.onnx.export without it in dynamic_axes), or with dynamo=True"
        )
    return bool(value.reshape(-1)[0])


def _splice(graph: onnx.GraphProto, taken: Mapping[int, bool]) -> None:
    """Replace each If named in ``taken`` (by its index in ``graph.node``) by the nodes of its branch (in place)."""
    names = {out for n in graph.node for out in n.output if out}
    names.update(vi.name for vi in graph.input)
    names.update(t.name for t in graph.initializer)
    spliced: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        if index not in taken:
            kept = onnx.NodeProto()
            kept.CopyFrom(node)  # a copy: the field is cleared below, which may release what it held
            spliced.append(kept)
            continue
        branch_name = "then_branch" if taken[index] else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == branch_name)
        spliced.extend(_inline_branch(graph, node, branch, names))
    del graph.node[:]
    graph.node.extend(spliced)


def _inline_branch(
    graph: onnx.GraphProto, node: onnx.NodeProto, branch: onnx.GraphProto, names: set[str]
) -> list[onnx.NodeProto]:
    """The branch's nodes, computing the If's outputs; its initializers moved into ``graph``.

    ``names`` (the outer graph's value names, updated) keeps an inner name that clashes with an outer
    one from shadowing it: such a name gets the If's name as a suffix.
    """
    inner = {out for n in branch.node for out in n.output if out} | {t.name for t in branch.initializer}
    rename: dict[str, str] = {}
    for name in sorted(inner):
        fresh = name
        while fresh in names:
            fresh = f"{fresh}__{node.name or 'If'}"
        rename[name] = fresh
        names.add(fresh)
    for out, result in zip(branch.output, node.output):
        if out.name in inner and result:
            rename[out.name] = result
    for tensor in branch.initializer:
        moved = graph.initializer.add()
        moved.CopyFrom(tensor)
        moved.name = rename[tensor.name]
    nodes = []
    for inner_node in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner_node)
        copy.input[:] = [rename.get(name, name) for name in inner_node.input]
        copy.output[:] = [rename.get(name, name) for name in inner_node.output]
        nodes.append(copy)
    for out, result in zip(branch.output, node.output):
        if out.name not in inner and result:  # the branch hands an outer value through
            nodes.append(helper.make_node("Identity", [out.name], [result], name=f"{node.name}/taken"))
    return nodes
