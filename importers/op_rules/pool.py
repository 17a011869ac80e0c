r"""Pooling and resizing.

MaxPool / AveragePool / LpPool ``X[N, C, *in] -> Y[N, C, *out]`` iterate over ``b``, ``c`` and the
output spatial dims (kind ``spatial``, ``halo = (kernel - 1) * dilation``, window ``stride``); the
window itself is not a dim (it is never split). FLOPs: one per window element per output element.
Global pooling reduces the spatial axes: they are ``reduction`` dims (``ih``, ``iw``) and FLOPs are
one per input element. Resize: output spatial dims with a one-element halo, 4 FLOPs per output
element (bilinear). Backward: 1x forward.
"""

from __future__ import annotations

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, numel
from importers.op_rules.conv import spatial_names

__all__ = ["pool_rule", "global_pool_rule", "resize_rule"]


def _ints(value: object, rank: int, default: int) -> list[int]:
    if value is None:
        return [default] * rank
    values = [int(v) for v in value]  # type: ignore[union-attr]
    return values if len(values) == rank else [default] * rank


def pool_rule(ctx: NodeContext) -> RuleResult:
    """MaxPool, AveragePool, LpPool (see module docstring).

    Examples
    --------
    >>> ctx = NodeContext(name="p", op_type="MaxPool", attrs={"kernel_shape": [3, 3], "strides": [2, 2]},
    ...                   input_shapes=((8, 64, 112, 112),), output_shapes=((8, 64, 55, 55),))
    >>> r = pool_rule(ctx)
    >>> [(d.name, d.halo, d.stride) for d in r.dims], r.flops == 8 * 64 * 55 * 55 * 9
    ([('b', 0, 1), ('c', 0, 1), ('oh', 2, 2), ('ow', 2, 2)], True)
    """
    y = ctx.out_shape(0) or ()
    rank = len(y) - 2
    kernel = _ints(ctx.attr("kernel_shape"), rank, 1)
    strides = _ints(ctx.attr("strides"), rank, 1)
    dilations = _ints(ctx.attr("dilations"), rank, 1)
    dims = DimBuilder()
    b = dims.add("b", y[0])
    c = dims.add("c", y[1])
    spatial = tuple(
        dims.add(name, size, kind="spatial", halo=(k - 1) * d, stride=s)
        for name, size, k, d, s in zip(spatial_names(rank), y[2:], kernel, dilations, strides)
    )
    axes = axes_of(b, c, *spatial)
    outputs = tuple((j, axes) for j, shape in enumerate(ctx.output_shapes) if shape is not None)
    return RuleResult(
        kind="pool",
        dims=dims.build(),
        inputs=((0, axes),),
        outputs=outputs,
        flops=float(numel(y) * numel(tuple(kernel))),
    )


def global_pool_rule(ctx: NodeContext) -> RuleResult:
    """GlobalAveragePool / GlobalMaxPool / GlobalLpPool: spatial axes are reductions.

    Examples
    --------
    >>> ctx = NodeContext(name="gp", op_type="GlobalAveragePool", input_shapes=((8, 2048, 7, 7),),
    ...                   output_shapes=((8, 2048, 1, 1),))
    >>> r = global_pool_rule(ctx)
    >>> r.inputs, r.outputs
    (((0, (('b',), ('c',), ('ih',), ('iw',))),), ((0, (('b',), ('c',), (), ())),))
    """
    x = ctx.shape(0) or ()
    rank = len(x) - 2
    dims = DimBuilder()
    b = dims.add("b", x[0])
    c = dims.add("c", x[1])
    spatial = tuple(dims.add(name, size, kind="reduction") for name, size in zip(spatial_names(rank, "i"), x[2:]))
    return RuleResult(
        kind="pool",
        dims=dims.build(),
        inputs=((0, axes_of(b, c, *spatial)),),
        outputs=((0, axes_of(b, c, *([None] * rank))),),
        flops=float(numel(x)),
    )


def resize_rule(ctx: NodeContext) -> RuleResult:
    """Resize / Upsample: batch and channel pass through, output spatial dims with a 1-element halo.

    Examples
    --------
    >>> ctx = NodeContext(name="r", op_type="Resize", input_shapes=((1, 3, 8, 8),),
    ...                   output_shapes=((1, 3, 16, 16),))
    >>> [(d.name, d.kind) for d in resize_rule(ctx).dims]
    [('c', 'parallel'), ('oh', 'spatial'), ('ow', 'spatial')]
    """
    x = ctx.shape(0) or ()
    y = ctx.out_shape(0) or ()
    dims = DimBuilder()
    if len(y) < 3 or len(x) != len(y):
        names = tuple(dims.add(f"d{i}", size, splittable=False) for i, size in enumerate(y))
        return RuleResult(
            kind="data_movement",
            dims=dims.build(),
            inputs=((0, axes_of(*([None] * len(x)))),),
            outputs=((0, axes_of(*names)),),
            flops=float(4 * numel(y)),
        )
    rank = len(y) - 2
    b = dims.add("b", y[0]) if x[0] == y[0] else None
    c = dims.add("c", y[1]) if x[1] == y[1] else None
    spatial = tuple(
        dims.add(name, size, kind="spatial", halo=1) for name, size in zip(spatial_names(rank), y[2:])
    )
    return RuleResult(
        kind="pool",
        dims=dims.build(),
        inputs=((0, axes_of(b, c, *spatial)),),
        outputs=((0, axes_of(b, c, *spatial)),),
        flops=float(4 * numel(y)),
    )
