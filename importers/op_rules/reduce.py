r"""Reductions and scans: Reduce*, ArgMax/ArgMin, CumSum, TopK.

Every input axis is a dim. Reduced axes have kind ``reduction`` (splitting one leaves partial results
that need an all-reduce of the output); with ``keepdims`` they map to ``()`` in the output, without
it they disappear. FLOPs: one per input element. CumSum and TopK keep their scanned / selected axis
as an unsplittable dim (a split scan would need a prefix exchange, a split top-k a merge); TopK
costs ``n * log2(k)`` per row. Backward: 1x forward.
"""

from __future__ import annotations

import math

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, normalize_axis, numel

__all__ = ["REDUCE_OPS", "reduce_rule", "arg_reduce_rule", "cumsum_rule", "topk_rule"]

REDUCE_OPS: tuple[str, ...] = (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
)

# Ops that moved ``axes`` from an attribute to an input: ReduceSum at opset 13, the others at 18.
_AXES_AS_INPUT_SINCE = {"ReduceSum": 13}


def reduced_axes(ctx: NodeContext) -> set[int]:
    """Axes reduced by a Reduce* node, from its attribute or its constant second input."""
    rank = len(ctx.shape(0) or ())
    since = _AXES_AS_INPUT_SINCE.get(ctx.op_type, 18)
    axes = ctx.attr("axes")
    if axes is None and ctx.opset >= since and ctx.constant(1) is not None:
        axes = [int(a) for a in ctx.constant(1).reshape(-1)]
    if axes is None or len(axes) == 0:
        if ctx.opset >= since and int(ctx.attr("noop_with_empty_axes", 0)) and ctx.shape(1) is None:
            return set()
        if axes is None and ctx.opset >= since and ctx.shape(1) is not None:
            # Axes are a runtime value we could not read: infer them from the output shape.
            out = ctx.out_shape(0) or ()
            x = ctx.shape(0) or ()
            if len(out) == len(x):
                return {i for i, (a, b) in enumerate(zip(x, out)) if a != b}
        return set(range(rank))
    return {normalize_axis(a, rank) for a in axes if -rank <= int(a) < max(rank, 1)}


def _reduce(ctx: NodeContext, reduced: set[int], keepdims: bool) -> RuleResult:
    x = ctx.shape(0) or ()
    dims = DimBuilder()
    names = tuple(
        dims.add(f"d{i}", size, kind="reduction" if i in reduced else "parallel") for i, size in enumerate(x)
    )
    if keepdims:
        out_axes = axes_of(*(None if i in reduced else n for i, n in enumerate(names)))
    else:
        out_axes = axes_of(*(n for i, n in enumerate(names) if i not in reduced))
    outputs = tuple((j, out_axes) for j, shape in enumerate(ctx.output_shapes) if shape is not None and len(shape) == len(out_axes))
    return RuleResult(
        kind="reduce",
        dims=dims.build(),
        inputs=((0, axes_of(*names)),),
        outputs=outputs,
        flops=float(numel(x)),
    )


def reduce_rule(ctx: NodeContext) -> RuleResult:
    """Reduce* ops.

    Examples
    --------
    >>> ctx = NodeContext(name="r", op_type="ReduceMean", attrs={"axes": [-1]}, opset=17,
    ...                   input_shapes=((4, 8),), output_shapes=((4, 1),))
    >>> r = reduce_rule(ctx)
    >>> [(d.name, d.kind) for d in r.dims], r.outputs
    ([('d0', 'parallel'), ('d1', 'reduction')], ((0, (('d0',), ())),))
    """
    return _reduce(ctx, reduced_axes(ctx), bool(int(ctx.attr("keepdims", 1))))


def arg_reduce_rule(ctx: NodeContext) -> RuleResult:
    """ArgMax / ArgMin over ``axis``."""
    rank = len(ctx.shape(0) or ())
    return _reduce(ctx, {normalize_axis(ctx.attr("axis", 0), rank)}, bool(int(ctx.attr("keepdims", 1))))


def cumsum_rule(ctx: NodeContext) -> RuleResult:
    """CumSum: all axes; the scanned axis (constant input 1) is not splittable.

    Examples
    --------
    >>> import numpy as np
    >>> ctx = NodeContext(name="c", op_type="CumSum", input_shapes=((4, 8), ()), output_shapes=((4, 8),),
    ...                   constants={1: np.array(1)})
    >>> [(d.name, d.splittable) for d in cumsum_rule(ctx).dims]
    [('d0', True), ('d1', False)]
    """
    x = ctx.shape(0) or ()
    axis_value = ctx.constant(1)
    axis = normalize_axis(int(axis_value.reshape(-1)[0]), len(x)) if axis_value is not None else None
    dims = DimBuilder()
    names = tuple(
        dims.add(f"d{i}", size, splittable=axis is not None and i != axis) for i, size in enumerate(x)
    )
    axes = axes_of(*names)
    return RuleResult(
        kind="reduce",
        dims=dims.build(),
        inputs=((0, axes),),
        outputs=((0, axes),),
        flops=float(numel(x)),
    )


def topk_rule(ctx: NodeContext) -> RuleResult:
    """TopK over ``axis``: the selected axis is an unsplittable reduction.

    Examples
    --------
    >>> import numpy as np
    >>> ctx = NodeContext(name="t", op_type="TopK", input_shapes=((4, 1024), (1,)),
    ...                   output_shapes=((4, 8), (4, 8)), constants={1: np.array([8])})
    >>> r = topk_rule(ctx)
    >>> r.outputs, r.flops
    (((0, (('d0',), ())), (1, (('d0',), ()))), 12288.0)
    """
    x = ctx.shape(0) or ()
    axis = normalize_axis(ctx.attr("axis", -1), len(x))
    out = ctx.out_shape(0) or x
    k = out[axis] if axis < len(out) else 1
    dims = DimBuilder()
    names = tuple(
        dims.add(f"d{i}", size, kind="reduction" if i == axis else "parallel", splittable=i != axis)
        for i, size in enumerate(x)
    )
    out_axes = axes_of(*(None if i == axis else n for i, n in enumerate(names)))
    outputs = tuple((j, out_axes) for j, shape in enumerate(ctx.output_shapes) if shape is not None)
    return RuleResult(
        kind="reduce",
        dims=dims.build(),
        inputs=((0, axes_of(*names)),),
        outputs=outputs,
        flops=float(numel(x) * math.log2(max(k, 2))),
    )
