"""Batch axes set by a shape computation, not by data flow (:func:`tiled_batch_axes`).

:func:`importers.build_ops._mark_batch` follows the inputs' batch axes through the ops' accesses. A tensor
that is a parameter repeated once per sample carries none: DETR's decoder starts from its learned queries,
``query_position_embeddings.weight.unsqueeze(0).repeat(batch, 1, 1)``, which TorchScript writes as
``Tile(table, Concat(Unsqueeze(Gather(Shape(pixel_values), 0)), 1, 1))``. Its first axis is the samples all
the same (the repeat count is the input's batch size), and without it the decoder's first self-attention,
which reads only those queries, took its ``batch x heads`` for its heads.

A repeat the importer folds leaves no op to read it from: XLNet expands its sinusoid position table over the
batch, ``pos_emb.expand(-1, bsz, -1)`` (TorchScript: ``Expand(table, Where(Equal(Concat(-1, Shape(x)[1], -1),
-1), ..))``), a shape computation folded to a constant at the bound dims, so its projection ``einsum("ibh,hnd->ibnd",
pos_emb, r)`` iterates a batch axis no operand brings (the constant is not an operand). Data parallelism runs
that einsum on each rank's own samples like every other op; :func:`generated_batch_dims` marks such an axis a
batch dim where every consumer reads it as one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection

if TYPE_CHECKING:
    from importers.coarse_model import _Model
    from planner.core.graph import Op

__all__ = ["tiled_batch_axes", "generated_batch_dims", "selected_batch_axes"]

_PASS_THROUGH = {"Unsqueeze", "Squeeze", "Cast", "Identity", "Reshape"}
"""Nodes that keep a one-element shape value as it is."""


def tiled_batch_axes(m: _Model, op: Op, samples: dict[str, set[int]]) -> set[int]:
    """Output axes of ``op``'s ``Tile`` / ``Expand`` (its main node) that repeat a one-row axis as many times as
    a tensor in ``samples`` has samples (``samples``: its axes that are the samples alone, not a flattened
    ``batch x heads``): the repeat count or target size is ``Shape(x)[i]``, through ``Gather``, ``Concat``,
    ``Unsqueeze``, ``Cast``; empty for any other op."""
    if not op.onnx_nodes or not {"Tile", "Expand"} & set(op.node_types):
        return set()  # before the name lookup, which is linear in the nodes
    index = m.names.index(op.onnx_nodes[0])
    if index < 0 or m.nodes[index].op_type not in ("Tile", "Expand") or len(m.nodes[index].input) < 2:
        return set()
    sizes = m.nodes[index].input[1]  # Tile's repeats, Expand's shape: one entry per output axis
    shape, tiled = m.shape(sizes), m.shape(m.nodes[index].input[0]) or ()
    rank = shape[0] if shape else 0
    found: set[int] = set()
    for axis in range(rank):
        if len(tiled) != rank or tiled[axis] != 1:
            continue  # DeBERTa's [heads, ..] repeated per sample is batch x heads: not the samples alone
        source = _element_source(m, sizes, axis, depth=0)
        if source is not None and source[1] in samples.get(source[0], set()):
            found.add(axis)
    return found


_PICKED_HOPS = 6
"""Nodes from a ``NonZero`` to the indices of the ``Gather`` that picks its rows (TorchScript's per-expert loop:
``Transpose``, ``Split``, ``Squeeze``; :mod:`importers.expert_loop`)."""


def selected_batch_axes(m: _Model, op: Op, batch_axes: dict[str, set[int]]) -> set[int]:
    """Output axes of ``op``, a ``Gather`` that picks rows of its data's batch axes by indices a ``NonZero`` lists
    (a traced per-expert loop's tokens, :mod:`importers.expert_loop`): the rows picked are tokens of the batch, so
    data parallelism splits them as it splits the batch. ``batch_axes``: the tensors' batch axes so far. Empty
    for any other op (an embedding's table is no batch; a gather by positions keeps its batch axes already)."""
    if "Gather" not in op.node_types or len(op.inputs) < 2 or not op.outputs or not _from_nonzero(m, op.inputs[1].tensor):
        return set()
    data, indices = op.inputs[0], op.inputs[1]
    kept = {names[0] for names in op.outputs[0].axes if names}
    # a batch axis the gather indexes (no dim of the op: a data-movement op maps only its output's) or reduces away
    gathered = [a for a in batch_axes.get(data.tensor, ()) if a < len(data.axes) and not kept.intersection(data.axes[a])]
    picked = {names[0] for names in indices.axes if names}
    if not gathered:
        return set()  # the batch axes reach the output already
    return {axis for axis, names in enumerate(op.outputs[0].axes) if names and names[0] in picked}


def _from_nonzero(m: _Model, name: str) -> bool:
    """Whether the value ``name`` is a ``NonZero``'s output within :data:`_PICKED_HOPS` views of it."""
    for _ in range(_PICKED_HOPS):
        if name not in m.producer:
            return False
        node = m.nodes[m.producer[name][0]]
        if node.op_type == "NonZero":
            return True
        if node.op_type not in {"Transpose", "Split", "Squeeze", "Unsqueeze", "Cast", "Reshape", "Identity"} or not node.input:
            return False
        name = node.input[0]
    return False


def _element_source(m: _Model, name: str, element: int, *, depth: int) -> tuple[str, int] | None:
    """``(tensor, axis)`` when element ``element`` of the 1-D shape value ``name`` is ``tensor``'s size on ``axis``."""
    if depth > 12 or name not in m.producer:
        return None
    node = m.nodes[m.producer[name][0]]
    if node.op_type == "Shape":
        start = next((a.i for a in node.attribute if a.name == "start"), 0)
        return (node.input[0], start + element) if start >= 0 else None
    if node.op_type in _PASS_THROUGH:
        return _element_source(m, node.input[0], element, depth=depth + 1)
    if node.op_type == "Concat":
        offset = 0
        for piece in node.input:
            shape = m.shape(piece)
            length = shape[0] if shape else 1  # a scalar piece (or one of unknown shape) is one element
            if element < offset + length:
                return _element_source(m, piece, element - offset, depth=depth + 1)
            offset += length
        return None
    if node.op_type == "Gather" and len(node.input) == 2:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        indices = m.constant(node.input[1])
        if axis != 0 or indices is None or indices.size <= element:
            return None
        return _element_source(m, node.input[0], int(indices.reshape(-1)[element if indices.ndim else 0]), depth=depth + 1)
    return None


def generated_batch_dims(ops: list[Op], weights: Collection[str] = ()) -> list[Op]:
    """``ops`` with every output dim that every consumer of its axis reads as a batch dim marked a batch dim
    itself (module docstring): a dim no input of its op indexes (a folded repeat's or a broadcast's axis), or
    one its op reads from an activation whose producer is marked the same way, walked from the graph's end so
    that a chain of such ops (transformers 5's padding mask, gathered at ``arange(batch)`` and combined with the
    causal mask before the scores read it) is marked in one pass. ``weights``: the tensors with no samples
    (the file's initializers); a dim read from one is never marked.

    A dim that cannot be split (DeBERTa's position table repeated over a folded ``batch x heads`` axis, which
    the data-parallel plans price whole) or that an axis shares with other dims is left as it is.
    """
    from dataclasses import replace  # local: the module's other users need no dataclasses

    readers: dict[str, list[tuple[int, tuple[tuple[str, ...], ...]]]] = {}
    for index, op in enumerate(ops):
        for access in op.inputs:
            readers.setdefault(access.tensor, []).append((index, access.axes))
    marked = list(ops)
    for index in reversed(range(len(ops))):  # consumers first: a chain is marked from its reader back
        op = marked[index]
        fixed = {d for access in op.inputs if access.tensor in weights for axis in access.axes for d in axis}
        batch: set[str] = set()
        for access in op.outputs:
            for position, dims in enumerate(access.axes):
                if len(dims) != 1 or dims[0] in fixed or op.dim(dims[0]).is_batch or not op.dim(dims[0]).splittable:
                    continue
                users = [(j, axes[position]) for j, axes in readers.get(access.tensor, ()) if position < len(axes)]
                if users and all(len(d) == 1 and marked[j].dim(d[0]).is_batch for j, d in users):
                    batch.add(dims[0])
        if batch:
            marked[index] = replace(op, dims=tuple(replace(d, is_batch=True) if d.name in batch else d for d in op.dims))
    return marked
