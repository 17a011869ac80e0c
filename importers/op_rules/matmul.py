r"""Matrix products: MatMul, Gemm, Einsum.

Iteration space of ``A[..., m, k] x B[..., k, n] -> Y[..., m, n]``: the broadcast batch dims
(``b0``, ``b1``...), ``m``, ``n`` and the reduction ``k`` (splitting ``k`` leaves partial sums).
FLOPs: :math:`2 \cdot batch \cdot m \cdot n \cdot k` (a multiply-add is 2), plus :math:`m n` for
Gemm's bias. Einsum: every index letter is a dim (letters absent from the output are reductions);
FLOPs are ``n_inputs * prod(all index sizes)`` (2 per point for a binary contraction).
Backward: 2x forward (one product each for the input and the weight gradient).

Operands whose shapes cannot multiply (inner dims differ, batch dims that do not broadcast, an
einsum index of two sizes) are a :class:`~planner.core.errors.ModelError` naming the node and the
shapes: planning a product that cannot run would price a model that does not exist.
"""

from __future__ import annotations

import re

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, broadcast_axes, numel
from planner.core.errors import ModelError

__all__ = ["matmul_rule", "gemm_rule", "einsum_rule"]


def _broadcast_batch(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """Broadcast batch shape of two operands, ``None`` when they do not broadcast."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + a
    b = (1,) * (rank - len(b)) + b
    if any(x != y and x != 1 and y != 1 for x, y in zip(a, b)):
        return None
    return tuple(max(x, y) for x, y in zip(a, b))


def _shape_error(ctx: NodeContext, a: tuple[int, ...], b: tuple[int, ...], what: str) -> ModelError:
    """One line naming the node, both operand shapes (at the bound dims) and the fix."""
    return ModelError(
        f"{ctx.op_type} node '{ctx.name}': operands {list(a)} and {list(b)} do not fit ({what}); the "
        "file's shapes are inconsistent: re-export the model (or check the --dim values)"
    )


def matmul_rule(ctx: NodeContext) -> RuleResult:
    """MatMul with numpy semantics (1-D operands promoted, batch dims broadcast).

    Examples
    --------
    >>> ctx = NodeContext(name="mm", op_type="MatMul", input_shapes=((2, 4, 8), (8, 16)),
    ...                   output_shapes=((2, 4, 16),))
    >>> r = matmul_rule(ctx)
    >>> [d.name for d in r.dims], r.flops
    (['b0', 'm', 'n', 'k'], 2048.0)
    >>> r.inputs
    ((0, (('b0',), ('m',), ('k',))), (1, (('k',), ('n',))))
    """
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None:
        raise ValueError("MatMul operand shapes are unknown")
    a_vec, b_vec = len(a) == 1, len(b) == 1
    a2 = (1,) + a if a_vec else a
    b2 = b + (1,) if b_vec else b
    if len(a2) < 2 or len(b2) < 2:
        raise ValueError("MatMul operands must have rank >= 1")
    batch = _broadcast_batch(a2[:-2], b2[:-2])
    m, k, n = a2[-2], a2[-1], b2[-1]
    if k != b2[-2]:
        raise _shape_error(ctx, a, b, f"inner dims {k} != {b2[-2]}")
    if batch is None:
        raise _shape_error(ctx, a, b, "batch dims do not broadcast")
    dims = DimBuilder()
    batch_names = tuple(dims.add(f"b{i}", size) for i, size in enumerate(batch))
    m_name = dims.add("m", m)
    n_name = dims.add("n", n)
    k_name = dims.add("k", k, kind="reduction")
    a_axes = broadcast_axes(a2[:-2], batch, batch_names) + axes_of(m_name, k_name)
    b_axes = broadcast_axes(b2[:-2], batch, batch_names) + axes_of(k_name, n_name)
    if a_vec:
        a_axes = a_axes[1:]
    if b_vec:
        b_axes = b_axes[:-1]
    y_axes = axes_of(*batch_names) + (() if a_vec else axes_of(m_name)) + (() if b_vec else axes_of(n_name))
    return RuleResult(
        kind="matmul",
        dims=dims.build(),
        inputs=((0, a_axes), (1, b_axes)),
        outputs=((0, y_axes),),
        flops=2.0 * numel(batch) * m * n * k,
        backward_flops_factor=2.0,
    )


def gemm_rule(ctx: NodeContext) -> RuleResult:
    """Gemm: ``Y = alpha * A' B' + beta * C`` with optional transposes.

    Examples
    --------
    >>> ctx = NodeContext(name="g", op_type="Gemm", attrs={"transB": 1},
    ...                   input_shapes=((4, 8), (16, 8), (16,)), output_shapes=((4, 16),))
    >>> r = gemm_rule(ctx)
    >>> r.inputs, r.flops
    (((0, (('m',), ('k',))), (1, (('n',), ('k',))), (2, (('n',),))), 1088.0)
    """
    a, b = ctx.shape(0), ctx.shape(1)
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        raise ValueError(f"Gemm operands {a}, {b} are not matrices")
    trans_a, trans_b = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    m, k = (a[1], a[0]) if trans_a else (a[0], a[1])
    n = b[0] if trans_b else b[1]
    k_b = b[1] if trans_b else b[0]
    if k != k_b:
        raise _shape_error(ctx, a, b, f"inner dims {k} != {k_b} with transA={trans_a}, transB={trans_b}")
    dims = DimBuilder()
    m_name = dims.add("m", m)
    n_name = dims.add("n", n)
    k_name = dims.add("k", k, kind="reduction")
    inputs = [
        (0, axes_of(k_name, m_name) if trans_a else axes_of(m_name, k_name)),
        (1, axes_of(n_name, k_name) if trans_b else axes_of(k_name, n_name)),
    ]
    flops = 2.0 * m * n * k
    c = ctx.shape(2)
    if c is not None:
        inputs.append((2, broadcast_axes(c, (m, n), (m_name, n_name))))
        flops += m * n
    return RuleResult(
        kind="matmul",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=((0, axes_of(m_name, n_name)),),
        flops=flops,
        backward_flops_factor=2.0,
    )


_EINSUM_TERM = re.compile(r"^[A-Za-z]*(\.\.\.)?[A-Za-z]*$")


def _einsum_terms(equation: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """Index letters of each input and of the output, with ``...`` expanded to ``E0``, ``E1``..."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"einsum equation '{equation}' has {len(terms)} terms for {len(ranks)} inputs")
    ellipsis_rank = 0
    for term, rank in zip(terms, ranks):
        if "..." in term:
            ellipsis_rank = max(ellipsis_rank, rank - (len(term) - 3))
    def expand(term: str, rank: int | None) -> list[str]:
        if not _EINSUM_TERM.match(term):
            raise ValueError(f"cannot read einsum term '{term}'")
        if "..." not in term:
            return list(term)
        head, _, tail = term.partition("...")
        width = ellipsis_rank if rank is None else rank - len(head) - len(tail)
        return list(head) + [f"E{ellipsis_rank - width + i}" for i in range(width)] + list(tail)
    inputs = [expand(t, r) for t, r in zip(terms, ranks)]
    if arrow:
        output = expand(rhs, None)
    else:
        counts: dict[str, int] = {}
        for letters in inputs:
            for letter in letters:
                counts[letter] = counts.get(letter, 0) + 1
        ell = [f"E{i}" for i in range(ellipsis_rank)]
        output = ell + sorted(l for l, c in counts.items() if c == 1 and not l.startswith("E"))
    return inputs, output


def einsum_rule(ctx: NodeContext) -> RuleResult:
    """Einsum: one dim per index letter; letters missing from the output are reductions.

    Examples
    --------
    >>> ctx = NodeContext(name="e", op_type="Einsum", attrs={"equation": "bij,bjk->bik"},
    ...                   input_shapes=((2, 3, 4), (2, 4, 5)), output_shapes=((2, 3, 5),))
    >>> r = einsum_rule(ctx)
    >>> [(d.name, d.kind) for d in r.dims], r.flops
    ([('b', 'parallel'), ('i', 'parallel'), ('k', 'parallel'), ('j', 'reduction')], 240.0)
    """
    equation = ctx.attr("equation", "")
    if isinstance(equation, bytes):
        equation = equation.decode()
    shapes = [s for s in ctx.input_shapes if s is not None]
    in_terms, out_term = _einsum_terms(equation, [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for letters, shape in zip(in_terms, shapes):
        for letter, size in zip(letters, shape):
            known = sizes.get(letter, 1)
            if known != 1 and size != 1 and known != size:
                raise ModelError(
                    f"Einsum node '{ctx.name}' ('{equation}'): index '{letter}' is {known} in one "
                    f"operand and {size} in another (shapes {[list(s) for s in shapes]}); the file's "
                    "shapes are inconsistent: re-export the model (or check the --dim values)"
                )
            sizes[letter] = max(known, int(size))
    dims = DimBuilder()
    names: dict[str, str | None] = {}
    for letter in out_term:
        if letter not in names:
            names[letter] = dims.add(letter, sizes.get(letter, 1))
    for letters in in_terms:
        for letter in letters:
            if letter not in names:
                names[letter] = dims.add(letter, sizes[letter], kind="reduction")
    inputs = []
    for position, (letters, shape) in enumerate(zip(in_terms, shapes)):
        seen: set[str] = set()
        axes = []
        for letter, size in zip(letters, shape):
            name = names.get(letter)
            # A repeated letter (a diagonal) is indexed once; broadcast size-1 axes are never split.
            axes.append(() if name is None or size == 1 or letter in seen else (name,))
            seen.add(letter)
        inputs.append((position, tuple(axes)))
    total = numel(tuple(sizes.values()))
    return RuleResult(
        kind="matmul",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=((0, axes_of(*(names.get(l) for l in out_term))),),
        flops=float(max(1, len(shapes)) * total),
        backward_flops_factor=2.0 if len(shapes) >= 2 else 1.0,
    )
