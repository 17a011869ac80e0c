"""Elementwise ops: the iteration space is the output's axes.

Each input maps only the axes it has (numpy broadcasting, right-aligned); a size-1 axis broadcast to a
larger output axis maps to ``()``. FLOPs: 1 per output element (the op count convention of PaSE's
``pw`` pointwise ops; transcendental functions are not weighted more). Backward: 1x forward.
These ops are ``pointwise``: the coarsener fuses them into the op producing their input.
"""

from __future__ import annotations

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, broadcast_axes, numel

__all__ = ["ELEMENTWISE_OPS", "elementwise_rule", "output_dims"]

#: Op types computed element by element (after broadcasting), one output element per input position.
ELEMENTWISE_OPS: tuple[str, ...] = (
    # unary math
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Erf", "Exp",
    "Floor", "Log", "Neg", "Reciprocal", "Round", "Sign", "Sin", "Sinh", "Sqrt", "Tan", "Tanh",
    "IsInf", "IsNaN", "Not", "BitwiseNot",
    # activations
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "FastGelu", "BiasGelu", "QuickGelu",
    "Sigmoid", "HardSigmoid", "HardSwish", "Mish", "Softplus", "Softsign", "ThresholdedRelu", "Shrink",
    "Clip", "Dropout",
    # binary / variadic
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "And", "Or", "Xor",
    "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "BitShift", "BitwiseAnd",
    "BitwiseOr", "BitwiseXor",
    # ternary and quantization
    "Where", "QuantizeLinear", "DequantizeLinear",
)


def output_dims(dims: DimBuilder, shape: tuple[int, ...], prefix: str = "d") -> tuple[str | None, ...]:
    """Add one parallel dim per axis of ``shape`` (``d0``, ``d1``...); size-1 axes get ``None``."""
    return tuple(dims.add(f"{prefix}{i}", size) for i, size in enumerate(shape))


def elementwise_rule(ctx: NodeContext) -> RuleResult:
    """Iteration space of an elementwise op (see module docstring).

    Examples
    --------
    >>> ctx = NodeContext(name="add", op_type="Add", input_shapes=((4, 8), (8,)), output_shapes=((4, 8),))
    >>> r = elementwise_rule(ctx)
    >>> [d.name for d in r.dims], r.inputs, r.flops
    (['d0', 'd1'], ((0, (('d0',), ('d1',))), (1, (('d1',),))), 32.0)
    """
    out = ctx.out_shape(0) or ()
    dims = DimBuilder()
    names = output_dims(dims, out)
    inputs = tuple(
        (i, broadcast_axes(shape, out, names)) for i, shape in enumerate(ctx.input_shapes) if shape is not None
    )
    outputs = tuple(
        (j, axes_of(*names) if shape == out else broadcast_axes(shape, out, names))
        for j, shape in enumerate(ctx.output_shapes)
        if shape is not None
    )
    return RuleResult(
        kind="elementwise",
        dims=dims.build(),
        inputs=inputs,
        outputs=outputs,
        flops=float(numel(out)),
        backward_flops_factor=1.0,
        pointwise=True,
    )
