r"""Whether each attention is causal or bidirectional, read from the ONNX nodes (issue 25).

A launcher that builds the model from flags fixes the attention mask by the model class it runs:
Megatron-LM's GPT is causal, its BERT bidirectional (a padding mask only). The coarse op graph cannot
tell them apart: it leaves constants out of the ops' inputs, and both exporters compute a causal
mask from the sequence's positions, so the mask is often no input at all (a graph of only
``input_ids``). The ONNX nodes that compute it are still in the file, graph-only exports too (only
the weights' values are gone, not the nodes or their shapes), so :func:`attention_masks` reads them.

For every ``Softmax`` it walks back from the softmax's input through elementwise ops and views to
the matmul of the scores (:math:`QK^T`); every other operand met on the way (an ``Add``'s mask, a
``Where``'s condition, a bias) is a *side input*, whose producers are walked back to the graph
inputs, the initializers and the ``Shape`` ops (sizes are not data). Then:

* ``causal``: a side input's lineage compares positions on the query x key grid: a ``Trilu``, or a
  comparison (``Less``, ``LessOrEqual``, ``Greater``, ``GreaterOrEqual``, ``Equal``) of an operand
  laid out ``[..., q, 1]`` with one laid out ``[..., 1, k]`` (``q, k > 1``), as
  ``kv_idx <= q_idx`` is written by transformers' ``sdpa_mask`` and by TorchScript's traced
  ``torch.tril``. A sliding window is such a comparison too: ``causal`` means *each query sees
  its own set of keys*, not which set.
* ``bidirectional``: no side input at all, or side inputs whose lineage has none of the above and
  no value laid out on both the query and the key axis except by broadcasting a per-key vector
  (a ``[b, 1, 1, s]`` padding mask expanded to ``[b, 1, s, s]`` is still per key): every query sees
  the same keys.
* ``unknown``: anything else: a constant ``[.., s, s]`` table (a causal buffer or a folded relative
  bias, whose values a graph-only file does not hold), a graph input with both axes (a 4-D mask
  given by the caller), arithmetic on the grid that is not a comparison (a relative-position
  bias's ``q - k``), a shape the importer could not resolve, or a walk that never reaches the scores.

Exporters refuse only what is proven: a GPT launch refuses ``bidirectional``, a BERT launch needs it.

:func:`attention_biases` reads the same side inputs for a position bias added to the scores:

* ``alibi`` (BLOOM, MPT; Press et al. 2022, "Train Short, Test Long", arXiv:2108.12409): a ``Mul`` of a
  per-head constant (the slopes: more than one element, all on axes before the key axis, as
  transformers' ``build_alibi_tensor`` lays them out ``[h, 1, 1]`` or ``[h, 1]``) by key positions
  (a value laid out along the key axis whose lineage holds a ``Range``, or the ``CumSum`` of the
  padding mask that BLOOM's TorchScript export counts positions with). A scalar factor (a padding
  mask's ``(1 - m) * min``) or a table gathered by bucket (T5's relative bias) is not one; or a constant
  table ``[h, 1, k]`` (``[1, h, 1, k]``) reached through views and slices, linear in the key position per
  head or with its values not in the file (MPT's bias, folded by both exporters:
  :mod:`importers.position_bias`). :func:`bias_past_table` refuses keys past such a table's width.
"""

from __future__ import annotations

import math
from typing import Mapping

import onnx

from importers.position_bias import UNREAD, BiasTable, bias_reach_error, bias_table
from planner.core.graph import AttentionBias, AttentionMask

__all__ = ["attention_masks", "attention_biases", "bias_past_table"]

_SCORES = frozenset({"MatMul", "Gemm", "Einsum"})
# Between the scores and the softmax: scaling, masking, soft-capping, a bias, and views.
_PASS = frozenset({
    "Add", "Sub", "Mul", "Div", "Where", "Cast", "Tanh", "Clip", "Max", "Min", "Neg", "Reshape", "Transpose",
    "Squeeze", "Unsqueeze", "Identity", "Expand",
})
_COMPARE = frozenset({"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal"})
_GRID_ARITHMETIC = frozenset({"Sub", "Add", "Mul", "Div", "Abs", "Min", "Max", "And", "Or", "BitwiseAnd", "BitwiseOr"})
_SIZE_OPS = frozenset({"Shape", "Size"})  # their outputs are sizes, not data: the lineage walk stops there
_MAX_SCORE_HOPS = 24  # views and elementwise ops between QK^T and the softmax (Gemma-2's softcap: 6)
_MAX_LINEAGE = 4000  # nodes of a mask's lineage walked (transformers' vmapped sdpa_mask: ~100)
_POSITIONS = frozenset({"Range", "CumSum"})  # what key positions are counted with (arange, or the mask's cumsum)
_POSITION_HOPS = 12  # ops from a Range/CumSum to the slopes' Mul (BLOOM's TorchScript export: 6)


def attention_masks(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, AttentionMask]:
    """Softmax node name -> :data:`~planner.core.graph.AttentionMask` (module docstring), for every
    named ``Softmax`` of the graph (``shapes``: value name -> concrete shape, as the importer resolved).

    Examples
    --------
    >>> from onnx import helper, TensorProto as T
    >>> q = helper.make_tensor_value_info("q", T.FLOAT, [2, 4, 8])
    >>> p = helper.make_tensor_value_info("p", T.FLOAT, [2, 4, 4])
    >>> nodes = [helper.make_node("MatMul", ["q", "q"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], name="sm")]
    >>> attention_masks(helper.make_model(helper.make_graph(nodes, "g", [q], [p])), {"s": (2, 4, 4)})
    {'sm': 'bidirectional'}
    >>> tril = [helper.make_node("Trilu", ["ones"], ["m"], upper=0), helper.make_node("MatMul", ["q", "q"], ["s"]),
    ...         helper.make_node("Add", ["s", "m"], ["a"]), helper.make_node("Softmax", ["a"], ["p"], name="sm")]
    >>> attention_masks(helper.make_model(helper.make_graph(tril, "g", [q], [p])), {"s": (2, 4, 4), "m": (4, 4)})
    {'sm': 'causal'}
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    initializers = {t.name for t in graph.initializer}
    inputs = {vi.name for vi in graph.input} - initializers
    found: dict[str, AttentionMask] = {}
    for node in graph.node:
        if node.op_type == "Softmax" and node.name and node.input:
            sides = _side_inputs(node.input[0], producer)
            found[node.name] = "unknown" if sides is None else _classify(sides, producer, shapes, initializers, inputs)
    return found


def _side_inputs(start: str, producer: Mapping[str, onnx.NodeProto]) -> list[str] | None:
    """The operands met between the scores' matmul and the softmax input ``start`` that do not come
    from the scores; ``None`` when the walk meets no matmul within :data:`_MAX_SCORE_HOPS` nodes."""
    sides: list[str] = []
    frontier, hops, reached = [start], 0, False
    while frontier:
        value = frontier.pop()
        node = producer.get(value)
        if node is None:
            return None  # a graph input or weight straight into the softmax: not attention scores we can see
        if node.op_type in _SCORES:
            reached = True
            continue
        hops += 1
        if node.op_type not in _PASS or hops > _MAX_SCORE_HOPS:
            return None
        # the operand that carries the scores is the one whose producers reach the matmul; the others are sides
        ins = [i for i in node.input if i]
        carrier = [i for i in ins if _reaches_scores(i, producer)]
        if not carrier:
            return None
        frontier.append(carrier[0])
        sides += [i for i in ins if i != carrier[0]]
    return sides if reached else None


def _reaches_scores(value: str, producer: Mapping[str, onnx.NodeProto]) -> bool:
    """Whether ``value`` comes from a score-like matmul through :data:`_PASS` ops alone (a bounded walk)."""
    stack, seen = [value], set()
    while stack and len(seen) < 4 * _MAX_SCORE_HOPS:
        node = producer.get(stack.pop())
        if node is None or id(node) in seen or node.op_type not in _PASS | _SCORES:
            continue
        if node.op_type in _SCORES:
            return True
        seen.add(id(node))
        stack += [i for i in node.input if i]
    return False


def _grid(shape: tuple[int, ...] | None) -> tuple[int, int] | None:
    """The last two axes, right-aligned (a vector ``[k]`` is ``(1, k)``); ``None`` when unknown."""
    if shape is None:
        return None
    padded = (1, 1, *shape)
    return padded[-2], padded[-1]


def _classify(
    sides: list[str],
    producer: Mapping[str, onnx.NodeProto],
    shapes: Mapping[str, tuple[int, ...]],
    initializers: set[str],
    inputs: set[str],
) -> AttentionMask:
    """``causal`` / ``bidirectional`` / ``unknown`` from the side inputs' lineage (module docstring)."""
    unsure = False
    seen: set[str] = set()
    stack = list(sides)
    while stack:
        value = stack.pop()
        if value in seen or not value:
            continue
        seen.add(value)
        if len(seen) > _MAX_LINEAGE:
            return "unknown"
        node = producer.get(value)
        if node is None:
            shape = shapes.get(value)
            grid = _grid(shape)
            # a constant [.., q, k] table, or a caller's mask of 3 axes or more ([b, 1, q, k]): their values
            # decide, and we do not read them; a 2-axis input is the [b, s] padding mask, per key
            table = value in initializers or (value in inputs and (shape is None or len(shape) >= 3))
            if table and (grid is None or (grid[0] > 1 and grid[1] > 1)):
                unsure = True
            continue
        if node.op_type in _SIZE_OPS or node.op_type == "Constant":
            continue
        if node.op_type == "Trilu":
            return "causal"
        operands = [_grid(shapes.get(i)) for i in node.input if i]
        if len(operands) >= 2 and node.op_type in _COMPARE | _GRID_ARITHMETIC:
            if any(g is None for g in operands):
                unsure = True
            elif _outer(operands):
                if node.op_type in _COMPARE:
                    return "causal"
                unsure = True  # q - k arithmetic: a relative-position bias, or a mask we cannot name
        stack += [i for i in node.input if i]
    return "unknown" if unsure else "bidirectional"


def _outer(grids: list[tuple[int, int] | None]) -> bool:
    """Whether the operands meet as an outer product on the last two axes: one ``[q, 1]``, one ``[1, k]``."""
    rows = any(g is not None and g[0] > 1 and g[1] == 1 for g in grids)
    cols = any(g is not None and g[0] == 1 and g[1] > 1 for g in grids)
    return rows and cols


def attention_biases(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, AttentionBias]:
    """Softmax node name -> :data:`~planner.core.graph.AttentionBias` for every named ``Softmax`` whose
    scores get a position bias the importer recognises (module docstring: ALiBi); softmaxes without
    one are not listed.

    Examples
    --------
    >>> from onnx import helper, TensorProto as T
    >>> q = helper.make_tensor_value_info("q", T.FLOAT, [4, 8, 16])
    >>> p = helper.make_tensor_value_info("p", T.FLOAT, [4, 8, 8])
    >>> slopes = helper.make_tensor("slopes", T.FLOAT, [4, 1, 1], [0.5, 0.25, 0.125, 0.0625])
    >>> nodes = [helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
    ...          helper.make_node("Mul", ["slopes", "pos"], ["bias"]),
    ...          helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Add", ["s", "bias"], ["a"]),
    ...          helper.make_node("Softmax", ["a"], ["p"], name="sm")]
    >>> graph = helper.make_graph(nodes, "g", [q], [p], [slopes])
    >>> attention_biases(helper.make_model(graph), {"slopes": (4, 1, 1), "pos": (8,), "bias": (4, 1, 8), "s": (4, 8, 8)})
    {'sm': 'alibi'}
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output if out}
    constants = {t.name for t in graph.initializer} | {
        out for node in graph.node if node.op_type == "Constant" for out in node.output}
    tables = _bias_tables(model, producer)
    found: dict[str, AttentionBias] = {}
    for node in graph.node:
        if node.op_type == "Softmax" and node.name and node.input:
            sides = _side_inputs(node.input[0], producer)
            table = tables.get(node.name)
            if (sides and _has_alibi(sides, producer, shapes, constants)) or (
                    table is not None and table.values in ("linear", UNREAD)):
                found[node.name] = "alibi"
    return found


def bias_past_table(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], bindings: Mapping[str, int]) -> str | None:
    """The one-line refusal when some attention's keys (its softmax's last axis, at the bound dims) run past
    the constant bias table added to its scores (:func:`importers.position_bias.bias_reach_error`), else
    ``None``."""
    tables = _bias_tables(model, {out: node for node in model.graph.node for out in node.output if out})
    softmax_input = {node.name: node.input[0] for node in model.graph.node if node.name in tables}
    keys = {name: shapes[value][-1] for name, value in softmax_input.items() if shapes.get(value)}
    return bias_reach_error(tables, keys, bindings)


def _bias_tables(model: onnx.ModelProto, producer: Mapping[str, onnx.NodeProto]) -> dict[str, BiasTable]:
    """Softmax node name -> the constant per-head, per-key table a side input of its scores is
    (:func:`importers.position_bias.bias_table`), for the softmaxes that have one."""
    graph = model.graph
    constants = {t.name: t for t in graph.initializer} | {
        node.output[0]: attr.t for node in graph.node if node.op_type == "Constant" and node.output
        for attr in node.attribute if attr.name == "value"}
    found: dict[str, BiasTable] = {}
    for node in graph.node:
        if node.op_type == "Softmax" and node.name and node.input:
            tables = [bias_table(side, producer, constants) for side in _side_inputs(node.input[0], producer) or ()]
            table = next((t for t in tables if t is not None), None)
            if table is not None:
                found[node.name] = table
    return found


def _has_alibi(
    sides: list[str], producer: Mapping[str, onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]], constants: set[str]
) -> bool:
    """Whether the side inputs' lineage holds a ``Mul`` of per-head slopes by key positions."""
    seen: set[str] = set()
    stack = list(sides)
    while stack and len(seen) <= _MAX_LINEAGE:
        value = stack.pop()
        node = producer.get(value)
        if value in seen or node is None or node.op_type in _SIZE_OPS:
            continue
        seen.add(value)
        ins = [i for i in node.input if i]
        if node.op_type == "Mul" and len(ins) == 2:
            for slopes, positions in (ins, ins[::-1]):
                if _per_head(slopes, shapes, constants) and _key_positions(positions, producer, shapes):
                    return True
        stack += ins
    return False


def _per_head(value: str, shapes: Mapping[str, tuple[int, ...]], constants: set[str]) -> bool:
    """A constant of more than one element, all before the last (key) axis: ``[h, 1, 1]``, ``[h, 1]``."""
    shape = shapes.get(value)
    return value in constants and shape is not None and len(shape) >= 2 and shape[-1] == 1 and math.prod(shape) > 1


def _key_positions(value: str, producer: Mapping[str, onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """A value along the key axis (last axis above 1) computed from a ``Range`` or ``CumSum`` within
    :data:`_POSITION_HOPS` ops."""
    shape = shapes.get(value)
    if not shape or shape[-1] <= 1:
        return False
    frontier = [value]
    for _ in range(_POSITION_HOPS):
        nodes = [producer[v] for v in frontier if v in producer]
        if any(n.op_type in _POSITIONS for n in nodes):
            return True
        frontier = [i for n in nodes if n.op_type not in _SIZE_OPS | _SCORES for i in n.input if i]
    return False
