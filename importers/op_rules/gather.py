r"""Indexing ops: Gather (embedding or data movement), GatherElements, GatherND, ScatterND,
ScatterElements, OneHot.

* Gather on an embedding table (``data`` is a parameter, ``axis = 0``): dims are the indices' axes
  (``i0``...), the row width ``d`` (``d0``... for rank > 2 tables) and the table rows ``v`` (kind
  ``reduction``): splitting ``v`` is a vocab-parallel embedding, each device looks up its rows, masks
  the rest and the partial outputs are all-reduced. Kind ``embedding``.
* Any other Gather: kind ``data_movement``; dims over the output axes; the gathered data axis is not
  split (``()``), the indices' axes follow their output dims.
* GatherElements / ScatterElements: dims over the (output) axes; the indexed ``axis`` is not split.
  A GatherElements that picks one element per row of a wide float axis (``out[axis] == 1``,
  ``data[axis] >=`` :data:`PICK_MIN_WIDTH`: a decomposed loss's ``log_probs.gather(-1, labels)``)
  gets that axis as a ``reduction`` dim ``c``: split, each device picks where the index falls in
  its slice (0 elsewhere) and the picks are all-reduced, as vocab-parallel cross entropy's target
  logit.
* GatherND / ScatterND: the addressed data axes are not split; the rest pass through.

* An embedding bag (:mod:`importers.embedding_bag`'s ``EmbeddingBagSum`` / ``Mean`` / ``Max``, what
  torch's exporters write for ``nn.EmbeddingBag`` as a loop): ``(table [V, D], indices [nnz],
  offsets [B]) -> [B, D]``. Dims: the bags ``b`` (the output rows; the indices and offsets are
  split with them, contiguous bags per device), the row width ``d`` and the table rows ``v`` (kind
  ``reduction``), so the table shards as every embedding's does: column-wise (``d``), row-wise
  (``v``: each device sums the rows it holds, the partial bags all-reduced) or whole per device
  (table-wise: each bag op is its own op, placed by the search). Kind ``embedding``.

FLOPs: 0 for lookups (pure data movement; its time comes from bytes), except an embedding bag's
reduction: one add (sum, mean) or compare (max) per gathered element, ``nnz * D``, plus ``B * D``
divides for a mean. Backward: 1x.
"""

from __future__ import annotations

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, normalize_axis

__all__ = [
    "PICK_MIN_WIDTH",
    "gather_rule",
    "gather_elements_rule",
    "gather_nd_rule",
    "scatter_nd_rule",
    "scatter_elements_rule",
    "one_hot_rule",
    "embedding_bag_rule",
]


def gather_rule(ctx: NodeContext) -> RuleResult:
    """Gather: embedding lookup when the table is a parameter, else data movement.

    Examples
    --------
    >>> ctx = NodeContext(name="emb", op_type="Gather", input_shapes=((50257, 768), (8, 128)),
    ...                   output_shapes=((8, 128, 768),), parameters=frozenset({0}))
    >>> r = gather_rule(ctx)
    >>> r.kind, [(d.name, d.kind) for d in r.dims]
    ('embedding', [('i0', 'parallel'), ('i1', 'parallel'), ('d', 'parallel'), ('v', 'reduction')])
    >>> r.inputs
    ((0, (('v',), ('d',))), (1, (('i0',), ('i1',))))
    """
    data = ctx.shape(0) or ()
    indices = ctx.shape(1) or ()
    axis = normalize_axis(ctx.attr("axis", 0), len(data))
    dims = DimBuilder()
    if 0 in ctx.parameters and axis == 0 and len(data) >= 2:
        idx = tuple(dims.add(f"i{j}", size) for j, size in enumerate(indices))
        rest = data[1:]
        row = tuple(dims.add("d" if len(rest) == 1 else f"d{j}", size) for j, size in enumerate(rest))
        v = dims.add("v", data[0], kind="reduction")
        return RuleResult(
            kind="embedding",
            dims=dims.build(),
            inputs=((0, axes_of(v, *row)), (1, axes_of(*idx))),
            outputs=((0, axes_of(*idx, *row)),),
            flops=0.0,
        )
    out = ctx.out_shape(0) or ()
    names = tuple(dims.add(f"o{j}", size) for j, size in enumerate(out))
    r_idx = len(indices)
    data_axes = axes_of(*(names[:axis] + (None,) + names[axis + r_idx : axis + r_idx + len(data) - axis - 1]))
    idx_axes = axes_of(*names[axis : axis + r_idx])
    return RuleResult(
        kind="data_movement",
        dims=dims.build(),
        inputs=((0, data_axes), (1, idx_axes)),
        outputs=((0, axes_of(*names)),),
        flops=0.0,
    )


PICK_MIN_WIDTH = 1024
"""Smallest indexed axis a one-per-row GatherElements splits as a reduction (a vocabulary, not a
handful of positions; module docstring)."""


def gather_elements_rule(ctx: NodeContext) -> RuleResult:
    """GatherElements: output has the indices' shape; the indexed axis of ``data`` is not split,
    except by a one-per-row pick from a wide float axis (module docstring).

    Examples
    --------
    >>> ctx = NodeContext(name="pick", op_type="GatherElements", attrs={"axis": -1},
    ...                   input_shapes=((512, 32000), (512, 1)), input_dtypes=("float32", "int64"),
    ...                   output_shapes=((512, 1),))
    >>> r = gather_elements_rule(ctx)
    >>> [(d.name, d.kind) for d in r.dims], r.inputs[0]
    ([('d0', 'parallel'), ('c', 'reduction')], (0, (('d0',), ('c',))))
    """
    data = ctx.shape(0) or ()
    out = ctx.out_shape(0) or ()
    axis = normalize_axis(ctx.attr("axis", 0), len(data))
    dims = DimBuilder()
    names = tuple(dims.add(f"d{j}", size, splittable=j != axis) for j, size in enumerate(out))
    dtype = str(ctx.input_dtypes[0]) if ctx.input_dtypes else ""
    pick = len(out) == len(data) and out[axis] == 1 and data[axis] >= PICK_MIN_WIDTH and "float" in dtype
    classes = dims.add("c", data[axis], kind="reduction") if pick else None
    data_axes = axes_of(*(
        classes if j == axis else None if j >= len(out) or data[j] != out[j] else names[j]
        for j in range(len(data))
    ))
    return RuleResult(
        kind="gather",
        dims=dims.build(),
        inputs=((0, data_axes), (1, axes_of(*names))),
        outputs=((0, axes_of(*names)),),
        flops=0.0,
    )


def scatter_elements_rule(ctx: NodeContext) -> RuleResult:
    """ScatterElements: dims over ``data``'s axes; the indexed axis is not split."""
    data = ctx.shape(0) or ()
    upd = ctx.shape(2) or ()
    axis = normalize_axis(ctx.attr("axis", 0), len(data))
    dims = DimBuilder()
    names = tuple(dims.add(f"d{j}", size, splittable=j != axis) for j, size in enumerate(data))
    upd_axes = axes_of(*(None if j == axis or j >= len(data) or upd[j] != data[j] else names[j] for j in range(len(upd))))
    return RuleResult(
        kind="gather",
        dims=dims.build(),
        inputs=((0, axes_of(*names)), (1, upd_axes), (2, upd_axes)),
        outputs=((0, axes_of(*names)),),
        flops=0.0,
    )


def gather_nd_rule(ctx: NodeContext) -> RuleResult:
    """GatherND: batch axes shared, addressed data axes not split, trailing data axes pass through.

    Examples
    --------
    >>> ctx = NodeContext(name="g", op_type="GatherND", input_shapes=((4, 5, 6), (4, 3, 1)),
    ...                   attrs={"batch_dims": 1}, output_shapes=((4, 3, 6),))
    >>> gather_nd_rule(ctx).inputs
    ((0, (('o0',), (), ('o2',))), (1, (('o0',), ('o1',), ())))
    """
    data = ctx.shape(0) or ()
    indices = ctx.shape(1) or ()
    out = ctx.out_shape(0) or ()
    batch_dims = int(ctx.attr("batch_dims", 0))
    depth = indices[-1] if indices else 0
    dims = DimBuilder()
    names = tuple(dims.add(f"o{j}", size) for j, size in enumerate(out))
    trailing = names[len(indices) - 1 :]
    data_axes = axes_of(*(names[:batch_dims] + (None,) * depth + trailing))
    idx_axes = axes_of(*(names[: len(indices) - 1] + (None,)))
    return RuleResult(
        kind="gather",
        dims=dims.build(),
        inputs=((0, data_axes[: len(data)]), (1, idx_axes)),
        outputs=((0, axes_of(*names)),),
        flops=0.0,
    )


def scatter_nd_rule(ctx: NodeContext) -> RuleResult:
    """ScatterND: dims over ``data``'s axes; the addressed leading axes are not split.

    Examples
    --------
    >>> ctx = NodeContext(name="s", op_type="ScatterND", input_shapes=((8, 16), (3, 1), (3, 16)),
    ...                   output_shapes=((8, 16),))
    >>> r = scatter_nd_rule(ctx)
    >>> [(d.name, d.splittable) for d in r.dims], r.inputs[2]
    ([('d0', False), ('d1', True)], (2, ((), ('d1',))))
    """
    data = ctx.shape(0) or ()
    indices = ctx.shape(1) or ()
    updates = ctx.shape(2) or ()
    depth = indices[-1] if indices else 0
    dims = DimBuilder()
    names = tuple(dims.add(f"d{j}", size, splittable=j >= depth) for j, size in enumerate(data))
    lead = len(indices) - 1
    upd_axes = axes_of(*((None,) * lead + names[depth:]))
    return RuleResult(
        kind="gather",
        dims=dims.build(),
        inputs=((0, axes_of(*names)), (1, axes_of(*((None,) * len(indices)))), (2, upd_axes[: len(updates)])),
        outputs=((0, axes_of(*names)),),
        flops=0.0,
    )


def one_hot_rule(ctx: NodeContext) -> RuleResult:
    """OneHot: the indices' axes plus the new depth axis, all parallel."""
    indices = ctx.shape(0) or ()
    out = ctx.out_shape(0) or ()
    axis = normalize_axis(ctx.attr("axis", -1), len(out))
    dims = DimBuilder()
    names = tuple(dims.add(f"d{j}", size) for j, size in enumerate(out))
    idx_names = names[:axis] + names[axis + 1 :]
    return RuleResult(
        kind="data_movement",
        dims=dims.build(),
        inputs=((0, axes_of(*idx_names[: len(indices)])),),
        outputs=((0, axes_of(*names)),),
        flops=0.0,
    )


def embedding_bag_rule(ctx: NodeContext) -> RuleResult:
    """An embedding bag: the table's rows gathered by each bag's indices and reduced per bag.

    Examples
    --------
    >>> ctx = NodeContext(name="bag", op_type="EmbeddingBagMean", domain="planner.importers",
    ...                   input_shapes=((1000, 16), (96,), (32,)), output_shapes=((32, 16),),
    ...                   parameters=frozenset({0}))
    >>> r = embedding_bag_rule(ctx)
    >>> r.kind, [(d.name, d.size, d.kind) for d in r.dims], r.flops
    ('embedding', [('b', 32, 'parallel'), ('d', 16, 'parallel'), ('v', 1000, 'reduction')], 2048.0)
    >>> r.inputs
    ((0, (('v',), ('d',))), (1, (('b',),)), (2, (('b',),)))
    """
    table = ctx.shape(0) or ()
    indices = ctx.shape(1) or ()
    out = ctx.out_shape(0) or ()
    if len(table) != 2 or len(indices) != 1 or len(out) != 2:
        raise ValueError(f"an embedding bag reads a [V, D] table and [nnz] indices, not {table} and {indices}")
    dims = DimBuilder()
    b = dims.add("b", out[0])
    d = dims.add("d", table[1])
    v = dims.add("v", table[0], kind="reduction")
    looked_up = float(indices[0] * table[1])
    flops = looked_up + (out[0] * table[1] if ctx.op_type.endswith("Mean") else 0.0)
    return RuleResult(
        kind="embedding",
        dims=dims.build(),
        inputs=((0, axes_of(v, d)), (1, axes_of(b)), (2, axes_of(b))),
        outputs=((0, axes_of(b, d)),),
        flops=flops,
        note=f"{ctx.op_type[len('EmbeddingBag'):].lower()} of {indices[0]} rows in {out[0]} bags",
    )
