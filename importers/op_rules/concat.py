r"""Ops that move data along one axis: Concat, Split, Slice, Pad, Tile; and value producers:
Shape, Size, Constant, ConstantOfShape, Range, Trilu, EyeLike.

Concat / Split / Slice / Pad / Tile pass every other axis through; the concatenated, split, sliced,
padded or tiled axis is an unsplittable dim of the op and maps to ``()`` in the operand where its
extent differs. FLOPs: 0. Trilu keeps every axis splittable (a device knows its row and column
offsets) and costs 1 FLOP per element. Shape/Size/Constant/ConstantOfShape/Range take no tensor
operand worth splitting (they are usually folded away as constants).
"""

from __future__ import annotations

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, normalize_axis, numel

__all__ = [
    "concat_rule",
    "split_rule",
    "slice_rule",
    "pad_rule",
    "tile_rule",
    "trilu_rule",
    "source_rule",
    "shape_rule",
]


def concat_rule(ctx: NodeContext) -> RuleResult:
    """Concat: output axes; the concatenated axis is not split.

    Examples
    --------
    >>> ctx = NodeContext(name="c", op_type="Concat", attrs={"axis": 1},
    ...                   input_shapes=((4, 3), (4, 5)), output_shapes=((4, 8),))
    >>> r = concat_rule(ctx)
    >>> [(d.name, d.splittable) for d in r.dims], r.inputs
    ([('d0', True), ('d1', False)], ((0, (('d0',), ())), (1, (('d0',), ()))))
    """
    out = ctx.out_shape(0) or ()
    axis = normalize_axis(ctx.attr("axis", 0), len(out))
    dims = DimBuilder()
    names = tuple(dims.add(f"d{i}", size, splittable=i != axis) for i, size in enumerate(out))
    inputs = []
    for position, shape in enumerate(ctx.input_shapes):
        if shape is None:
            continue
        axes = axes_of(
            *(None if i == axis or i >= len(out) or shape[i] != out[i] else names[i] for i in range(len(shape)))
        )
        inputs.append((position, axes))
    return RuleResult(
        kind="concat",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=((0, axes_of(*names)),),
        flops=0.0,
    )


def split_rule(ctx: NodeContext) -> RuleResult:
    """Split: input axes; an axis cut into equal parts is ``(part, offset)``, the offset splittable.

    Unequal parts keep the split axis whole (not split across devices).

    Examples
    --------
    >>> ctx = NodeContext(name="s", op_type="Split", attrs={"axis": 2},
    ...                   input_shapes=((8, 128, 2304),), output_shapes=((8, 128, 768),) * 3)
    >>> r = split_rule(ctx)
    >>> r.inputs[0], r.outputs[0], [(d.name, d.size, d.splittable) for d in r.dims][2:]
    ((0, (('d0',), ('d1',), ('part', 'd2'))), (0, (('d0',), ('d1',), ('d2',))), [('d2', 768, True), ('part', 3, False)])
    >>> ctx = NodeContext(name="s", op_type="Split", attrs={"axis": 1},
    ...                   input_shapes=((8, 10),), output_shapes=((8, 4), (8, 6)))
    >>> split_rule(ctx).outputs[0], split_rule(ctx).dims[1].splittable
    ((0, (('d0',), ())), False)
    """
    x = ctx.shape(0) or ()
    axis = normalize_axis(ctx.attr("axis", 0), len(x))
    parts = _equal_parts(x, axis, ctx.output_shapes)
    dims = DimBuilder()
    if parts is None:
        names = tuple(dims.add(f"d{i}", size, splittable=i != axis) for i, size in enumerate(x))
        in_axes = axes_of(*names)
        out_axes = axes_of(*(None if i == axis else n for i, n in enumerate(names)))
    else:
        # k equal parts: the axis is (part, offset); splitting the offset gives every device the same
        # slice of each part (a fused QKV split per head, as Megatron lays it out)
        names = tuple(
            dims.add(f"d{i}", size // parts if i == axis else size) for i, size in enumerate(x)
        )
        part = dims.add("part", parts, splittable=False)
        in_axes = axes_of(*((part, n) if i == axis else n for i, n in enumerate(names)))
        out_axes = axes_of(*names)
    outputs = tuple((j, out_axes) for j, shape in enumerate(ctx.output_shapes) if shape is not None)
    return RuleResult(
        kind="slice",
        dims=dims.build(),
        inputs=((0, in_axes),),
        outputs=outputs,
        flops=0.0,
    )


def _equal_parts(shape: tuple[int, ...], axis: int, outputs) -> int | None:
    """How many equal parts a Split cuts its axis into (``None``: unequal, unknown, or one part)."""
    if not shape or not outputs or any(o is None or len(o) != len(shape) for o in outputs):
        return None
    extents = {o[axis] for o in outputs}
    if len(outputs) < 2 or len(extents) != 1:
        return None
    extent = extents.pop()
    if extent < 1 or extent * len(outputs) != shape[axis]:
        return None
    return len(outputs)


def _changed_axes_rule(ctx: NodeContext, kind: str, flops: float = 0.0) -> RuleResult:
    """Dims over the output axes; axes whose extent differs from the input's are not split."""
    x = ctx.shape(0) or ()
    out = ctx.out_shape(0) or ()
    dims = DimBuilder()
    same = [i < len(x) and len(x) == len(out) and x[i] == out[i] for i in range(len(out))]
    names = tuple(dims.add(f"d{i}", size, splittable=same[i]) for i, size in enumerate(out))
    in_axes = axes_of(*(names[i] if i < len(out) and same[i] else None for i in range(len(x))))
    return RuleResult(
        kind=kind,  # type: ignore[arg-type]
        dims=dims.build(),
        inputs=((0, in_axes),),
        outputs=((0, axes_of(*names)),),
        flops=flops,
    )


def slice_rule(ctx: NodeContext) -> RuleResult:
    """Slice: the sliced axes are not split; the others pass through.

    Examples
    --------
    >>> ctx = NodeContext(name="s", op_type="Slice", input_shapes=((8, 1024, 64),), output_shapes=((8, 128, 64),))
    >>> slice_rule(ctx).inputs
    ((0, (('d0',), (), ('d2',))),)
    """
    return _changed_axes_rule(ctx, "slice")


def pad_rule(ctx: NodeContext) -> RuleResult:
    """Pad: the padded axes are not split."""
    return _changed_axes_rule(ctx, "data_movement")


def tile_rule(ctx: NodeContext) -> RuleResult:
    """Tile: the repeated axes are not split."""
    return _changed_axes_rule(ctx, "data_movement")


def trilu_rule(ctx: NodeContext) -> RuleResult:
    """Trilu: every axis splittable (masking by global row/column index), 1 FLOP per element."""
    x = ctx.shape(0) or ()
    dims = DimBuilder()
    names = tuple(dims.add(f"d{i}", size) for i, size in enumerate(x))
    return RuleResult(
        kind="elementwise",
        dims=dims.build(),
        inputs=((0, axes_of(*names)),),
        outputs=((0, axes_of(*names)),),
        flops=float(numel(x)),
        pointwise=True,
    )


def source_rule(ctx: NodeContext) -> RuleResult:
    """Constant, ConstantOfShape, Range, EyeLike, RandomNormal...: output axes, no tensor operand split.

    Examples
    --------
    >>> ctx = NodeContext(name="r", op_type="Range", input_shapes=((), (), ()), output_shapes=((128,),))
    >>> r = source_rule(ctx)
    >>> r.kind, r.inputs, r.outputs
    ('data_movement', ((0, ()), (1, ()), (2, ())), ((0, (('d0',),)),))
    """
    out = ctx.out_shape(0) or ()
    dims = DimBuilder()
    names = tuple(dims.add(f"d{i}", size) for i, size in enumerate(out))
    inputs = tuple(
        (p, axes_of(*([None] * len(shape)))) for p, shape in enumerate(ctx.input_shapes) if shape is not None
    )
    return RuleResult(
        kind="data_movement",
        dims=dims.build(),
        inputs=inputs,
        outputs=((0, axes_of(*names)),),
        flops=0.0,
    )


def shape_rule(ctx: NodeContext) -> RuleResult:
    """Shape / Size: reads only metadata of its input; no dims."""
    x = ctx.shape(0) or ()
    out = ctx.out_shape(0) or ()
    return RuleResult(
        kind="data_movement",
        dims=(),
        inputs=((0, axes_of(*([None] * len(x)))),),
        outputs=((0, axes_of(*([None] * len(out)))),),
        flops=0.0,
    )
