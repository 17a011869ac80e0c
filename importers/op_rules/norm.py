r"""Normalisations and softmax: every input axis is a dim; normalised axes have kind ``normalized``.

Splitting a ``normalized`` dim needs a small all-reduce of per-row statistics (max and sum for
softmax; mean and variance for a norm); the output stays split.

* LayerNormalization / RMSNormalization (and onnxruntime's Simplified/Skip variants): axes from
  ``axis`` (default -1) to the end are normalised; scale and bias map the axes they have.
* BatchNormalization ``X[N, C, *spatial]``: ``b`` and ``c`` are parallel, the spatial axes are
  normalised. Training statistics over the batch are per device, as in data-parallel training
  without SyncBatchNorm, so splitting ``b`` costs no collective. Running mean/var are buffers.
* GroupNormalization: ``b``, ``g`` (groups), and the normalised ``c`` (channels per group) and
  spatial axes; the channel axis is indexed ``(g, c)``.
* InstanceNormalization: ``b``, ``c`` parallel; spatial normalised.
* Softmax / LogSoftmax / Hardmax: the ``axis`` (opset >= 13; before 13, every axis from ``axis`` on)
  is normalised. LpNormalization: ``axis``. MeanVarianceNormalization: ``axes`` (default 0, 2, 3).

FLOPs: 5 per element for all of them (softmax: max, subtract, exp, sum, divide; a norm: mean,
subtract, square-sum, rsqrt, scale). Backward: 1x forward.
"""

from __future__ import annotations

from importers.op_rules._base import (
    DimBuilder,
    NodeContext,
    RuleResult,
    axes_of,
    broadcast_axes,
    normalize_axis,
    numel,
)
from importers.op_rules.conv import spatial_names

__all__ = [
    "FLOPS_PER_ELEMENT",
    "normalized_rule",
    "layer_norm_rule",
    "batch_norm_rule",
    "group_norm_rule",
    "instance_norm_rule",
    "softmax_rule",
]

FLOPS_PER_ELEMENT = 5
"""Forward FLOPs per element of a normalisation or softmax (see module docstring)."""


def normalized_rule(
    ctx: NodeContext,
    normalized: set[int],
    *,
    kind: str = "norm",
    param_positions: tuple[int, ...] = (),
) -> RuleResult:
    """Generic rule: dims over input 0's axes, those in ``normalized`` of kind ``normalized``.

    Inputs at ``param_positions`` (scale, bias) and every output map by right-aligned broadcasting.
    """
    x = ctx.shape(0) or ()
    dims = DimBuilder()
    names = tuple(
        dims.add(f"d{i}", size, kind="normalized" if i in normalized else "parallel") for i, size in enumerate(x)
    )
    inputs = [(0, axes_of(*names))]
    for position in param_positions:
        shape = ctx.shape(position)
        if shape is not None:
            inputs.append((position, broadcast_axes(shape, x, names)))
    outputs = tuple(
        (j, broadcast_axes(shape, x, names) if len(shape) == len(x) else axes_of(*([None] * len(shape))))
        for j, shape in enumerate(ctx.output_shapes)
        if shape is not None
    )
    return RuleResult(
        kind=kind,  # type: ignore[arg-type]
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=outputs,
        flops=float(FLOPS_PER_ELEMENT * numel(x)),
    )


def layer_norm_rule(ctx: NodeContext) -> RuleResult:
    """LayerNormalization and RMS-style norms: axes ``axis..-1`` normalised.

    Examples
    --------
    >>> ctx = NodeContext(name="ln", op_type="LayerNormalization", input_shapes=((8, 128, 768), (768,), (768,)),
    ...                   output_shapes=((8, 128, 768),))
    >>> r = layer_norm_rule(ctx)
    >>> [(d.name, d.kind) for d in r.dims], r.inputs[1]
    ([('d0', 'parallel'), ('d1', 'parallel'), ('d2', 'normalized')], (1, (('d2',),)))
    """
    x = ctx.shape(0) or ()
    if ctx.op_type in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        axis, params = len(x) - 1, (1, 2, 3, 4)
    else:
        axis, params = normalize_axis(ctx.attr("axis", -1), len(x)), (1, 2)
    return normalized_rule(ctx, set(range(axis, len(x))), kind="norm", param_positions=params)


def batch_norm_rule(ctx: NodeContext) -> RuleResult:
    """BatchNormalization: ``b``, ``c`` parallel, spatial axes normalised (see module docstring).

    Examples
    --------
    >>> ctx = NodeContext(name="bn", op_type="BatchNormalization",
    ...                   input_shapes=((8, 64, 56, 56), (64,), (64,), (64,), (64,)), output_shapes=((8, 64, 56, 56),))
    >>> r = batch_norm_rule(ctx)
    >>> [(d.name, d.kind) for d in r.dims], r.inputs[1]
    ([('b', 'parallel'), ('c', 'parallel'), ('h', 'normalized'), ('w', 'normalized')], (1, (('c',),)))
    """
    x = ctx.shape(0) or ()
    dims = DimBuilder()
    b = dims.add("b", x[0]) if len(x) > 0 else None
    c = dims.add("c", x[1]) if len(x) > 1 else None
    spatial = tuple(
        dims.add(name, size, kind="normalized") for name, size in zip(spatial_names(len(x) - 2, ""), x[2:])
    )
    axes = axes_of(b, c, *spatial)
    inputs = [(0, axes)] + [(p, axes_of(c)) for p in (1, 2, 3, 4) if ctx.shape(p) is not None]
    outputs = tuple(
        (j, axes if len(shape) == len(x) else axes_of(c)) for j, shape in enumerate(ctx.output_shapes) if shape is not None
    )
    return RuleResult(
        kind="norm",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=outputs,
        flops=float(FLOPS_PER_ELEMENT * numel(x)),
    )


def group_norm_rule(ctx: NodeContext) -> RuleResult:
    """GroupNormalization: channel axis indexed ``(g, c)``; ``c`` and spatial axes normalised.

    Examples
    --------
    >>> ctx = NodeContext(name="gn", op_type="GroupNormalization", attrs={"num_groups": 4},
    ...                   input_shapes=((2, 16, 8, 8), (16,), (16,)), output_shapes=((2, 16, 8, 8),))
    >>> r = group_norm_rule(ctx)
    >>> r.inputs[0], r.inputs[1]
    ((0, (('b',), ('g', 'c'), ('h',), ('w',))), (1, (('g', 'c'),)))
    """
    x = ctx.shape(0) or ()
    groups = int(ctx.attr("num_groups", 1))
    channels = x[1] if len(x) > 1 else 1
    dims = DimBuilder()
    b = dims.add("b", x[0]) if x else None
    g = dims.add("g", groups)
    c = dims.add("c", channels // max(groups, 1), kind="normalized")
    spatial = tuple(
        dims.add(name, size, kind="normalized") for name, size in zip(spatial_names(len(x) - 2, ""), x[2:])
    )
    axes = axes_of(b, (g, c), *spatial)
    inputs = [(0, axes)]
    for position in (1, 2):
        shape = ctx.shape(position)
        if shape is not None:
            # opset 18 scale/bias are per group, opset 21 per channel.
            inputs.append((position, axes_of(g) if numel(shape) == groups else axes_of((g, c))))
    return RuleResult(
        kind="norm",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=((0, axes),),
        flops=float(FLOPS_PER_ELEMENT * numel(x)),
    )


def instance_norm_rule(ctx: NodeContext) -> RuleResult:
    """InstanceNormalization: ``b``, ``c`` parallel, spatial normalised."""
    x = ctx.shape(0) or ()
    dims = DimBuilder()
    b = dims.add("b", x[0]) if x else None
    c = dims.add("c", x[1]) if len(x) > 1 else None
    spatial = tuple(
        dims.add(name, size, kind="normalized") for name, size in zip(spatial_names(len(x) - 2, ""), x[2:])
    )
    axes = axes_of(b, c, *spatial)
    inputs = [(0, axes)] + [(p, axes_of(c)) for p in (1, 2) if ctx.shape(p) is not None]
    return RuleResult(
        kind="norm",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=((0, axes),),
        flops=float(FLOPS_PER_ELEMENT * numel(x)),
    )


def softmax_rule(ctx: NodeContext) -> RuleResult:
    """Softmax / LogSoftmax / Hardmax over ``axis`` (every axis from ``axis`` on before opset 13).

    Examples
    --------
    >>> ctx = NodeContext(name="s", op_type="Softmax", input_shapes=((8, 12, 128, 128),),
    ...                   output_shapes=((8, 12, 128, 128),))
    >>> [d.kind for d in softmax_rule(ctx).dims]
    ['parallel', 'parallel', 'parallel', 'normalized']
    """
    x = ctx.shape(0) or ()
    rank = len(x)
    if ctx.opset >= 13:
        axis = normalize_axis(ctx.attr("axis", -1), rank)
        normalized = {axis}
    else:
        axis = normalize_axis(ctx.attr("axis", 1), rank)
        normalized = set(range(axis, rank))
    return normalized_rule(ctx, normalized, kind="softmax")


def lp_norm_rule(ctx: NodeContext) -> RuleResult:
    """LpNormalization over ``axis``."""
    rank = len(ctx.shape(0) or ())
    return normalized_rule(ctx, {normalize_axis(ctx.attr("axis", -1), rank)})


def mvn_rule(ctx: NodeContext) -> RuleResult:
    """MeanVarianceNormalization over ``axes`` (default 0, 2, 3)."""
    rank = len(ctx.shape(0) or ())
    axes = ctx.attr("axes", [0, 2, 3])
    return normalized_rule(ctx, {normalize_axis(a, rank) for a in axes if -rank <= int(a) < rank})


__all__ += ["lp_norm_rule", "mvn_rule"]
