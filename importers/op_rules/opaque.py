"""The fallback for op types without a rule: kind ``opaque``, replicated only.

Every dim (one per output axis) has ``splittable=False`` and every operand axis maps to ``()``, so
the search can only replicate the op. FLOPs: 1 per output element (a placeholder so the op is not
free). The coarsener records a warning naming the op type and node.
"""

from __future__ import annotations

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, numel

__all__ = ["opaque_rule"]


def opaque_rule(ctx: NodeContext, reason: str = "") -> RuleResult:
    """Replicated-only iteration space for an op we cannot analyse.

    Examples
    --------
    >>> ctx = NodeContext(name="n1", op_type="FancyOp", domain="acme", input_shapes=((4, 8),),
    ...                   output_shapes=((4, 8),))
    >>> r = opaque_rule(ctx)
    >>> r.kind, [d.splittable for d in r.dims], r.inputs
    ('opaque', [False, False], ((0, ((), ())),))
    >>> r.warning
    "op type 'acme:FancyOp' (node n1) has no rule: treated as opaque (replicated, never split)"
    """
    out = ctx.out_shape(0) or ()
    dims = DimBuilder()
    names = tuple(dims.add(f"o{i}", size, splittable=False) for i, size in enumerate(out))
    inputs = tuple(
        (p, axes_of(*([None] * len(shape)))) for p, shape in enumerate(ctx.input_shapes) if shape is not None
    )
    outputs = tuple(
        (j, axes_of(*names) if j == 0 else axes_of(*([None] * len(shape))))
        for j, shape in enumerate(ctx.output_shapes)
        if shape is not None
    )
    op = f"{ctx.domain}:{ctx.op_type}" if ctx.domain not in ("", "ai.onnx") else ctx.op_type
    why = reason or "has no rule"
    return RuleResult(
        kind="opaque",
        dims=dims.build(),
        inputs=inputs,
        outputs=outputs,
        flops=float(sum(numel(s) for s in ctx.output_shapes if s is not None)),
        note=f"{op} {why}: replicated only",
        warning=f"op type '{op}' (node {ctx.name}) {why}: treated as opaque (replicated, never split)",
    )
