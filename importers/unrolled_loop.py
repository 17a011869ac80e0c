r"""Loops a trace unrolled over a sequence at the length it was traced at (issue 25, task H3).

A Python loop over the tokens (transformers' Mamba-1 and Jamba slow path,
``for i in range(seq_len): ... discrete_A[:, :, i, :] ...``, then ``torch.stack(scan_outputs, dim=-1)``)
is written by the TorchScript exporter as one copy of the body per step: a ``Gather`` at each constant position
``0, 1, ..., N - 1`` of the axis and a ``Concat`` of the ``N`` results. ``N`` is the length of the example
input, fixed in the file, while the axis keeps its symbolic dim (``seq``). Bound to another length ``L``, the
file reads positions ``0..N-1`` of ``L`` and adds the ``N``-step result to ``L``-long tensors: it does not
compute (onnxruntime fails the broadcast), and shape inference leaves every value after it unknown, so a plan
would price a fragment of the model. Pricing the scan at ``L`` steps instead would be pricing a graph the file
does not hold, so :func:`unrolled_loop_error` refuses, naming ``N``: re-export at the length to plan.

The reading (:func:`unrolled_loops`): the ``Gather``\ s of a floating-point value at constant scalar positions,
grouped by value and axis, whose positions are exactly ``0..N-1`` (``N >= 2``: a pooler's single ``[:, 0]``
is no loop) on an axis of another extent, with some value after them left without a shape. Shape vectors
(``Shape -> Gather``) are integers and never read. At ``L = N`` the file computes and nothing is said.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx

from importers.onnx_facts import facts_of_model

__all__ = ["UnrolledLoop", "unrolled_loops", "unrolled_loop_error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class UnrolledLoop:
    """One value read step by step at constant positions ``0..steps-1`` of one axis."""

    value: str
    """The value the steps read (the ``Gather``\\ s' data input)."""
    axis: int
    """The axis read, non-negative."""
    steps: int
    """``N``: the number of positions read, the traced length."""
    extent: int
    """The axis's size at the bound dims (``!= steps``)."""
    first_node: str
    """The name of the ``Gather`` at position 0."""


def _scalar_position(constants: Mapping[str, np.ndarray], name: str) -> int | None:
    """The value of a constant 0-d integer index, else ``None`` (a 1-d index keeps the axis: no step)."""
    value = constants.get(name)
    if value is None or np.ndim(value) != 0 or not np.issubdtype(np.asarray(value).dtype, np.integer):
        return None
    return int(value)


def _gather_steps(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str],
                  constants: Mapping[str, np.ndarray]) -> dict[tuple[str, int], dict[int, onnx.NodeProto]]:
    """``(value, axis) -> {position: Gather}`` of the floating-point values gathered at constant scalar positions."""
    steps: dict[tuple[str, int], dict[int, onnx.NodeProto]] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        data = node.input[0]
        shape = shapes.get(data)
        position = _scalar_position(constants, node.input[1])
        if shape is None or position is None or not str(dtypes.get(data, "")).startswith(("float", "bfloat")):
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        axis = axis + len(shape) if axis < 0 else axis
        if 0 <= axis < len(shape):
            steps.setdefault((data, axis), {}).setdefault(position, node)
    return steps


def _unshaped_after(model: onnx.ModelProto, starts: list[str], shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """Whether some value computed from ``starts`` (the steps' outputs) has no shape."""
    readers = facts_of_model(model).readers
    seen, frontier = set(starts), list(starts)
    while frontier:
        for node in readers.get(frontier.pop(), ()):
            for out in node.output:
                if out and out not in seen:
                    if out not in shapes:
                        return True
                    seen.add(out)
                    frontier.append(out)
    return False


def unrolled_loops(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str],
                   constants: Mapping[str, np.ndarray]) -> list[UnrolledLoop]:
    """The loops unrolled at a length other than the bound one (module docstring), in the graph's order.

    Examples
    --------
    >>> from onnx import helper, TensorProto as T
    >>> nodes = [helper.make_node("Constant", [], [f"i{k}"], value=helper.make_tensor("v", T.INT64, [], [k]))
    ...          for k in range(3)]
    >>> nodes += [helper.make_node("Gather", ["x", f"i{k}"], [f"g{k}"], axis=1, name=f"step{k}") for k in range(3)]
    >>> nodes.append(helper.make_node("Concat", ["g0", "g1", "g2"], ["y"], axis=1))
    >>> model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    >>> consts = {f"i{k}": np.array(k) for k in range(3)}
    >>> shapes = {"x": (2, 5, 4), **{f"g{k}": (2, 4) for k in range(3)}}  # y unknown: 3 steps of 5 positions
    >>> [(loop.steps, loop.extent, loop.first_node) for loop in unrolled_loops(model, shapes, {"x": "float32"}, consts)]
    [(3, 5, 'step0')]
    >>> unrolled_loops(model, {**shapes, "x": (2, 3, 4), "y": (2, 12)}, {"x": "float32"}, consts)
    []
    """
    out = []
    for (value, axis), steps in _gather_steps(model, shapes, dtypes, constants).items():
        count, extent = len(steps), shapes[value][axis]
        if count < 2 or set(steps) != set(range(count)) or extent == count:
            continue
        if _unshaped_after(model, [o for node in steps.values() for o in node.output], shapes):
            out.append(UnrolledLoop(value=value, axis=axis, steps=count, extent=int(extent),
                                    first_node=steps[0].name or steps[0].output[0]))
    return out


def unrolled_loop_error(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str],
                        constants: Mapping[str, np.ndarray], bindings: Mapping[str, int]) -> str | None:
    """One line refusing a file whose loops were unrolled at another length than the bound one, ``None`` when
    none was (:func:`unrolled_loops`). The dim is named from the bindings whose value is the axis's extent."""
    loops = unrolled_loops(model, shapes, dtypes, constants)
    if not loops:
        return None
    first = loops[0]
    names = sorted(n for n, v in bindings.items() if v == first.extent and n.isidentifier())
    dim = names[0] if len(names) == 1 else None
    traced, bound = (f"{dim}={first.steps}", f"{dim}={first.extent}") if dim else (f"{first.steps}", f"{first.extent}")
    where = f"--dim {traced}" if dim else f"the dims that make that axis {first.steps}"
    return (f"a loop over {f'{dim!r}' if dim else 'an axis'} was unrolled at {first.steps} steps when the file was "
            f"traced (Gathers at positions 0..{first.steps - 1} of axis {first.axis} of {first.value!r}, from "
            f"{first.first_node!r}), so the file computes only at {traced}, not {bound}: re-export it with example "
            f"inputs of the length to plan (a traced loop keeps the example's length), or plan with {where}")
