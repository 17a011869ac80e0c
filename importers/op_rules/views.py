r"""Layout-only ops (Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Identity, Cast, Expand) and the
algebra that folds them into access maps.

A view value is described by a :class:`ViewMap` relative to its *origin* (the tensor actually
stored: an op output, a graph input or a parameter). Both are factorised into *atoms*: each origin
axis is a run of atoms (outer to inner), each view axis a run of atoms in the view's memory order.
A transpose permutes the view's axes; a reshape regroups the atoms in order, splitting an atom when
a new axis boundary falls inside it (768 -> 12 x 64); an expand adds *broadcast* atoms that belong
to no origin axis. A reshape whose boundaries cannot be aligned with the atoms (``[6, 4] -> [4, 6]``)
is not a view of the origin in this sense: :meth:`ViewMap.reshape` returns ``None`` and the
coarsener keeps it as a ``data_movement`` op.

Consumers read the origin: the op dim indexing a view axis indexes, in the origin, the atoms of that
axis (:meth:`ViewMap.pieces`); the coarsener splits the op dim where those atoms come from several
origin axes (a ``[batch*seq, hidden]`` operand of a Gemm gives its ``m`` two sub-dims).

When a view is kept as an op (not folded), :func:`view_rule` gives it a ``data_movement`` iteration
space over its output axes, 0 FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, broadcast_axes

__all__ = ["VIEW_OPS", "ViewMap", "view_rule", "view_output", "Piece"]

VIEW_OPS: tuple[str, ...] = (
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "CastLike", "Expand",
)
"""Op types folded into access maps where possible."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of consecutive atoms of one view axis that come from one origin axis."""

    origin_axis: int | None
    """Origin axis the atoms belong to; ``None`` for broadcast atoms."""
    position: int
    """Index of the run's first atom within the origin axis (orders pieces outer to inner)."""
    size: int


@dataclass(frozen=True, slots=True)
class ViewMap:
    """A view of an origin tensor, as atoms (see module docstring).

    Examples
    --------
    >>> v = ViewMap.identity("x", (8, 128, 768)).reshape((8, 128, 12, 64)).transpose((0, 2, 1, 3))
    >>> v.shape
    (8, 12, 128, 64)
    >>> v.pieces(1), v.pieces(3)
    ((Piece(origin_axis=2, position=0, size=12),), (Piece(origin_axis=2, position=1, size=64),))
    >>> ViewMap.identity("x", (6, 4)).reshape((4, 6)) is None
    True
    """

    origin: str
    origin_axes: tuple[tuple[int, ...], ...]
    axes: tuple[tuple[int, ...], ...]
    sizes: tuple[int, ...]

    @classmethod
    def identity(cls, origin: str, shape: tuple[int, ...]) -> "ViewMap":
        """The trivial view of ``origin`` (size-1 axes have no atoms)."""
        sizes: list[int] = []
        axes = []
        for size in shape:
            if size > 1:
                axes.append((len(sizes),))
                sizes.append(int(size))
            else:
                axes.append(())
        return cls(origin, tuple(axes), tuple(axes), tuple(sizes))

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the view."""
        return tuple(math.prod(self.sizes[a] for a in axis) for axis in self.axes)

    @property
    def is_identity(self) -> bool:
        """True when the view has the same axes as its origin."""
        return self.axes == self.origin_axes

    def transpose(self, perm: tuple[int, ...] | None) -> "ViewMap":
        """Axes permuted (``perm=None`` reverses them, as ONNX Transpose)."""
        if perm is None:
            perm = tuple(reversed(range(len(self.axes))))
        if sorted(perm) != list(range(len(self.axes))):
            raise ValueError(f"perm {list(perm)} is not a permutation of {len(self.axes)} axes")
        return ViewMap(self.origin, self.origin_axes, tuple(self.axes[p] for p in perm), self.sizes)

    def reshape(self, new_shape: tuple[int, ...]) -> "ViewMap | None":
        """Atoms regrouped into ``new_shape`` (row-major), ``None`` when they cannot be aligned."""
        sizes = list(self.sizes)
        origin_axes = [list(axis) for axis in self.origin_axes]
        flat = [a for axis in self.axes for a in axis]
        new_axes: list[tuple[int, ...]] = []
        i = 0
        for n in new_shape:
            n = int(n)
            if n < 1:
                return None
            current: list[int] = []
            remaining = n
            while remaining > 1:
                if i >= len(flat):
                    return None
                atom = flat[i]
                size = sizes[atom]
                common = math.gcd(size, remaining)
                if common == 1:
                    return None
                if common == size:
                    current.append(atom)
                    i += 1
                    remaining //= size
                    continue
                outer, inner = len(sizes), len(sizes) + 1
                sizes.extend((common, size // common))
                for axis in origin_axes:
                    if atom in axis:
                        k = axis.index(atom)
                        axis[k : k + 1] = [outer, inner]
                        break
                current.append(outer)
                flat[i] = inner
                remaining //= common
            new_axes.append(tuple(current))
        if i != len(flat):
            return None
        return ViewMap(self.origin, tuple(tuple(a) for a in origin_axes), tuple(new_axes), tuple(sizes))

    def expand(self, out_shape: tuple[int, ...]) -> "ViewMap | None":
        """Broadcast to ``out_shape`` (numpy rules); new or size-1 axes get broadcast atoms."""
        rank = len(out_shape)
        if rank < len(self.axes):
            return None
        sizes = list(self.sizes)
        old = [()] * (rank - len(self.axes)) + list(self.axes)
        new_axes = []
        for axis, target in zip(old, out_shape):
            current = math.prod(sizes[a] for a in axis)
            target = int(target)
            if current == target or target == 1:
                new_axes.append(tuple(axis))
            elif current == 1:
                new_axes.append((len(sizes),))
                sizes.append(target)
            else:
                return None
        return ViewMap(self.origin, self.origin_axes, tuple(new_axes), tuple(sizes))

    def pieces(self, axis: int) -> tuple[Piece, ...]:
        """View axis ``axis`` as runs of atoms from one origin axis each, outer to inner."""
        where: dict[int, tuple[int, int]] = {}
        for o, atoms in enumerate(self.origin_axes):
            for position, atom in enumerate(atoms):
                where[atom] = (o, position)
        result: list[Piece] = []
        last: tuple[int, int] | None = None
        for atom in self.axes[axis]:
            loc = where.get(atom)
            size = self.sizes[atom]
            if (
                result
                and loc is not None
                and last is not None
                and loc[0] == last[0]
                and loc[1] == last[1] + 1
            ):
                prev = result[-1]
                result[-1] = Piece(prev.origin_axis, prev.position, prev.size * size)
            elif result and loc is None and last is None and result[-1].origin_axis is None:
                prev = result[-1]
                result[-1] = Piece(None, prev.position, prev.size * size)
            else:
                result.append(Piece(loc[0] if loc else None, loc[1] if loc else 0, size))
            last = loc
        return tuple(result)


def view_output(view: ViewMap, ctx: NodeContext) -> ViewMap | None:
    """Apply the view node ``ctx`` to ``view`` (the ViewMap of its data input); ``None`` if unfoldable."""
    out = ctx.out_shape(0)
    if out is None:
        return None
    op = ctx.op_type
    try:
        if op == "Transpose":
            perm = ctx.attr("perm")
            result = view.transpose(tuple(int(p) for p in perm) if perm is not None else None)
        elif op == "Expand":
            result = view.expand(out)
        elif op in ("Identity", "Cast", "CastLike"):
            result = view
        else:  # Reshape, Squeeze, Unsqueeze, Flatten: a regrouping to the output shape
            result = view.reshape(out)
    except (ValueError, IndexError, TypeError):
        return None  # a malformed node: kept as an op (its rule decides, or it becomes opaque)
    if result is None or result.shape != tuple(out):
        return None
    return result


def view_rule(ctx: NodeContext) -> RuleResult:
    """A view kept as an op: ``data_movement`` over the output axes, 0 FLOPs.

    Input axes map to the output dims they correspond to (by permutation, broadcasting or atom
    alignment); an axis that cannot be matched maps to ``()``.

    Examples
    --------
    >>> ctx = NodeContext(name="t", op_type="Transpose", attrs={"perm": [1, 0]},
    ...                   input_shapes=((4, 8),), output_shapes=((8, 4),))
    >>> r = view_rule(ctx)
    >>> r.inputs, r.outputs
    (((0, (('d1',), ('d0',))),), ((0, (('d0',), ('d1',))),))
    """
    x = ctx.shape(0) or ()
    out = ctx.out_shape(0) or ()
    dims = DimBuilder()
    names = tuple(dims.add(f"d{i}", size) for i, size in enumerate(out))
    op = ctx.op_type
    if op == "Transpose":
        perm = ctx.attr("perm") or list(reversed(range(len(x))))
        in_names: list[str | None] = [None] * len(x)
        for j, p in enumerate(perm):
            if j < len(names) and int(p) < len(x):
                in_names[int(p)] = names[j]
        in_axes = axes_of(*in_names)
    elif op in ("Identity", "Cast", "CastLike", "Expand"):
        in_axes = broadcast_axes(x, out, names)
    else:
        in_axes = _reshape_axes(x, out, names)
    inputs = [(0, in_axes)]
    return RuleResult(
        kind="data_movement",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=((0, axes_of(*names)),),
        flops=0.0,
        view=True,
    )


def _reshape_axes(x: tuple[int, ...], out: tuple[int, ...], names: tuple[str | None, ...]) -> tuple[tuple[str, ...], ...]:
    view = ViewMap.identity("x", x).reshape(out)
    if view is None:
        # Unalignable: only a preserved leading axis (the batch, usually) keeps its dim.
        lead = names[0] if x and out and x[0] == out[0] else None
        return axes_of(lead, *([None] * (len(x) - 1))) if x else ()
    per_axis: list[list[tuple[int, str]]] = [[] for _ in x]
    for j, name in enumerate(names):
        if name is None:
            continue
        pieces = view.pieces(j)
        if pieces and pieces[0].origin_axis is not None:
            per_axis[pieces[0].origin_axis].append((pieces[0].position, name))
    return tuple(tuple(n for _, n in sorted(entries)) for entries in per_axis)

