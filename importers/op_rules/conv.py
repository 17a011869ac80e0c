r"""Convolutions: Conv and ConvTranspose.

Conv ``X[N, C, *in] * W[M, C/g, *k] -> Y[N, M, *out]`` iterates over ``b`` (N), ``g`` (groups, only
when ``group > 1``), ``co`` (M/g), the output spatial dims (``oh``, ``ow``; kind ``spatial`` with
``halo = (kernel - 1) * dilation`` and the window ``stride``), the input-channel reduction ``ci``
(C/g) and the kernel reductions (``kh``, ``kw``; never split). With groups, the channel axes of X, W
and Y are indexed by ``(g, ci)`` / ``(g, co)``, outer to inner.

FLOPs: :math:`2 N M \prod out \cdot (C/g) \prod k`, plus :math:`N M \prod out` for the bias.
ConvTranspose swaps the roles of the channel axes and counts
:math:`2 N C \prod in \cdot (M/g) \prod k`. Backward: 2x forward.
"""

from __future__ import annotations

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, numel

__all__ = ["conv_rule", "conv_transpose_rule", "spatial_names", "kernel_names"]


def spatial_names(rank: int, prefix: str = "o") -> tuple[str, ...]:
    """Names of output spatial dims: ``ow``; ``oh, ow``; ``od, oh, ow``; else ``o0``...

    Examples
    --------
    >>> spatial_names(2), spatial_names(4)
    (('oh', 'ow'), ('o0', 'o1', 'o2', 'o3'))
    """
    named = {1: ("w",), 2: ("h", "w"), 3: ("d", "h", "w")}
    if rank in named:
        return tuple(prefix + n for n in named[rank])
    return tuple(f"{prefix}{i}" for i in range(rank))


def kernel_names(rank: int) -> tuple[str, ...]:
    """Names of kernel window dims: ``kh, kw`` for 2-D."""
    return spatial_names(rank, "k")


def _checked_shapes(ctx: NodeContext) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    x, w, y = ctx.shape(0), ctx.shape(1), ctx.out_shape(0)
    if x is None or w is None or y is None or not (len(x) == len(w) == len(y) >= 3):
        raise ValueError(f"input, weight and output shapes {x}, {w}, {y} do not describe a convolution")
    return x, w, y


def _ints(value: object, rank: int, default: int) -> list[int]:
    if value is None:
        return [default] * rank
    values = [int(v) for v in value]  # type: ignore[union-attr]
    return values if len(values) == rank else [default] * rank


def conv_rule(ctx: NodeContext) -> RuleResult:
    """Conv (see module docstring).

    Examples
    --------
    >>> ctx = NodeContext(name="c", op_type="Conv", attrs={"pads": [1, 1, 1, 1]},
    ...                   input_shapes=((8, 3, 32, 32), (16, 3, 3, 3)), output_shapes=((8, 16, 32, 32),))
    >>> r = conv_rule(ctx)
    >>> [(d.name, d.kind, d.halo) for d in r.dims][:4]
    [('b', 'parallel', 0), ('co', 'parallel', 0), ('oh', 'spatial', 2), ('ow', 'spatial', 2)]
    >>> r.flops == 2 * 8 * 16 * 32 * 32 * 3 * 3 * 3
    True
    """
    x, w, y = _checked_shapes(ctx)
    rank = len(y) - 2
    groups = int(ctx.attr("group", 1))
    kernel = tuple(w[2:])
    strides = _ints(ctx.attr("strides"), rank, 1)
    dilations = _ints(ctx.attr("dilations"), rank, 1)
    n, m, out = y[0], y[1], tuple(y[2:])
    c = x[1]
    dims = DimBuilder()
    b = dims.add("b", n)
    g = dims.add("g", groups)
    co = dims.add("co", m // groups)
    spatial = tuple(
        dims.add(name, size, kind="spatial", halo=(k - 1) * d, stride=s)
        for name, size, k, d, s in zip(spatial_names(rank), out, kernel, dilations, strides)
    )
    ci = dims.add("ci", c // groups, kind="reduction")
    ks = tuple(dims.add(name, k, kind="reduction", splittable=False) for name, k in zip(kernel_names(rank), kernel))
    inputs = [
        (0, axes_of(b, (g, ci), *spatial)),
        (1, axes_of((g, co), ci, *ks)),
    ]
    flops = 2.0 * n * m * numel(out) * (c // groups) * numel(kernel)
    if ctx.shape(2) is not None:
        inputs.append((2, axes_of((g, co))))
        flops += n * m * numel(out)
    return RuleResult(
        kind="conv",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=((0, axes_of(b, (g, co), *spatial)),),
        flops=flops,
        backward_flops_factor=2.0,
    )


def conv_transpose_rule(ctx: NodeContext) -> RuleResult:
    """ConvTranspose: ``X[N, C, *in] -> Y[N, M, *out]`` with ``W[C, M/g, *k]``.

    Examples
    --------
    >>> ctx = NodeContext(name="ct", op_type="ConvTranspose", attrs={"strides": [2, 2]},
    ...                   input_shapes=((1, 4, 8, 8), (4, 2, 2, 2)), output_shapes=((1, 2, 16, 16),))
    >>> r = conv_transpose_rule(ctx)
    >>> r.flops == 2 * 1 * 4 * 64 * 2 * 4
    True
    """
    x, w, y = _checked_shapes(ctx)
    rank = len(y) - 2
    groups = int(ctx.attr("group", 1))
    kernel = tuple(w[2:])
    dilations = _ints(ctx.attr("dilations"), rank, 1)
    n, m, out = y[0], y[1], tuple(y[2:])
    c = x[1]
    dims = DimBuilder()
    b = dims.add("b", n)
    g = dims.add("g", groups)
    co = dims.add("co", m // groups)
    spatial = tuple(
        dims.add(name, size, kind="spatial", halo=(k - 1) * d)
        for name, size, k, d in zip(spatial_names(rank), out, kernel, dilations)
    )
    ci = dims.add("ci", c // groups, kind="reduction")
    ks = tuple(dims.add(name, k, kind="reduction", splittable=False) for name, k in zip(kernel_names(rank), kernel))
    inputs = [
        (0, axes_of(b, (g, ci), *spatial)),
        (1, axes_of((g, ci), co, *ks)),
    ]
    flops = 2.0 * n * c * numel(tuple(x[2:])) * (m // groups) * numel(kernel)
    if ctx.shape(2) is not None:
        inputs.append((2, axes_of((g, co))))
        flops += n * m * numel(out)
    return RuleResult(
        kind="conv",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=((0, axes_of(b, (g, co), *spatial)),),
        flops=flops,
        backward_flops_factor=2.0,
    )
