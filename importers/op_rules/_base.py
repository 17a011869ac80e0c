"""Shared types of the per-family op rules: what a rule sees and what it returns.

A rule turns one ONNX node, with concrete shapes, into an iteration space: named dims
(:class:`planner.core.graph.IterDim`), the dims indexing each axis of each operand, and the forward
FLOPs. Rules see the node's *immediate* operands; folding views and fusing elementwise chains is the
coarsening stage's job (:mod:`importers.coarsen`).

Conventions shared by every rule
--------------------------------
* Dims of size 1 are left out (they can never be split); the tensor axes they would index map to ``()``.
* FLOPs: a multiply-add counts 2; an elementwise op 1 per output element; see each family's module.
* ``backward_flops_factor``: 2 for matmul-like ops (one GEMM each for the input and the weight
  gradient), 1 for everything else (one elementwise pass of the upstream gradient).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from planner.core.graph import DimKind, IterDim, OpKind

__all__ = [
    "Axes",
    "NodeContext",
    "RuleResult",
    "Rule",
    "DimBuilder",
    "axes_of",
    "broadcast_axes",
    "numel",
    "normalize_axis",
]

Axes = tuple[tuple[str, ...], ...]
"""For each tensor axis, the op dims indexing it (outer to inner); ``()`` for an unsplit axis."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeContext:
    """One ONNX node as a rule sees it: attributes and concrete operand shapes."""

    name: str
    op_type: str
    domain: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    """Attribute values as Python objects (``onnx.helper.get_attribute_value``)."""
    input_shapes: tuple[tuple[int, ...] | None, ...] = ()
    """Concrete shape per input position; ``None`` for an absent optional input."""
    input_dtypes: tuple[str | None, ...] = ()
    output_shapes: tuple[tuple[int, ...] | None, ...] = ()
    output_dtypes: tuple[str | None, ...] = ()
    constants: Mapping[int, np.ndarray] = field(default_factory=dict)
    """Input position -> value, for inputs known at import time (shape arguments, scalars)."""
    parameters: frozenset[int] = frozenset()
    """Input positions that are trainable parameters (or layout views of one)."""
    opset: int = 18

    def attr(self, name: str, default: Any = None) -> Any:
        """Attribute ``name``, or ``default`` when absent."""
        return self.attrs.get(name, default)

    def shape(self, position: int) -> tuple[int, ...] | None:
        """Shape of input ``position`` (``None`` when absent)."""
        if position < len(self.input_shapes):
            return self.input_shapes[position]
        return None

    def constant(self, position: int) -> np.ndarray | None:
        """Value of input ``position`` when known at import time."""
        return self.constants.get(position)

    def out_shape(self, position: int = 0) -> tuple[int, ...] | None:
        """Shape of output ``position`` (``None`` when absent)."""
        if position < len(self.output_shapes):
            return self.output_shapes[position]
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleResult:
    """A node's iteration space and operand maps (see :mod:`planner.core.graph`)."""

    kind: OpKind
    dims: tuple[IterDim, ...]
    inputs: tuple[tuple[int, Axes], ...]
    """``(input position, axes)`` for every input the op reads; absent inputs left out."""
    outputs: tuple[tuple[int, Axes], ...]
    """``(output position, axes)`` for every output."""
    flops: float
    """Forward FLOPs at full size."""
    backward_flops_factor: float = 1.0
    pointwise: bool = False
    """An elementwise op that the coarsener may fuse into the op producing its input."""
    view: bool = False
    """A layout-only op (Reshape, Transpose...) that the coarsener folds into access maps."""
    note: str = ""
    warning: str = ""
    """Shown to the user (e.g. an unknown op type treated as opaque)."""


Rule = Callable[[NodeContext], RuleResult]


class DimBuilder:
    """Collects an op's iteration dims, leaving out size-1 dims and keeping names unique.

    Examples
    --------
    >>> dims = DimBuilder()
    >>> dims.add("m", 8), dims.add("b", 1), dims.add("m", 4)
    ('m', None, 'm_1')
    >>> [d.name for d in dims.build()]
    ['m', 'm_1']
    """

    __slots__ = ("_dims", "_used")

    def __init__(self) -> None:
        self._dims: list[IterDim] = []
        self._used: set[str] = set()

    def add(
        self,
        name: str,
        size: int,
        *,
        kind: DimKind = "parallel",
        splittable: bool = True,
        halo: int = 0,
        stride: int = 1,
    ) -> str | None:
        """Add a dim; returns its (unique) name, or ``None`` when ``size <= 1`` (left out)."""
        if size <= 1:
            return None
        unique = name
        counter = 1
        while unique in self._used:
            unique = f"{name}_{counter}"
            counter += 1
        self._used.add(unique)
        self._dims.append(
            IterDim(name=unique, size=int(size), kind=kind, splittable=splittable, halo=int(halo), stride=int(stride))
        )
        return unique

    def build(self) -> tuple[IterDim, ...]:
        """The dims added so far, in order."""
        return tuple(self._dims)


def axes_of(*names: str | None | tuple[str | None, ...]) -> Axes:
    """Axes tuple from one dim name (or a tuple of names, outer to inner) per axis; ``None`` -> ``()``.

    Examples
    --------
    >>> axes_of("b", None, ("g", "c"))
    (('b',), (), ('g', 'c'))
    """
    result = []
    for entry in names:
        if entry is None:
            result.append(())
        elif isinstance(entry, tuple):
            result.append(tuple(n for n in entry if n is not None))
        else:
            result.append((entry,))
    return tuple(result)


def broadcast_axes(shape: tuple[int, ...], out_shape: tuple[int, ...], out_names: tuple[str | None, ...]) -> Axes:
    """Axes of an input broadcast (numpy rules, right-aligned) against an output.

    A size-1 input axis, broadcast to a larger output axis, maps to ``()``.

    Examples
    --------
    >>> broadcast_axes((1, 768), (8, 128, 768), ("d0", "d1", "d2"))
    ((), ('d2',))
    """
    offset = len(out_shape) - len(shape)
    axes = []
    for i, size in enumerate(shape):
        j = i + offset
        name = out_names[j] if 0 <= j < len(out_names) else None
        if name is None or size == 1 or size != out_shape[j]:
            axes.append(())
        else:
            axes.append((name,))
    return tuple(axes)


def numel(shape: tuple[int, ...] | None) -> int:
    """Number of elements of a shape (1 for a scalar, 0 for ``None``).

    Examples
    --------
    >>> numel((2, 3, 4)), numel(()), numel(None)
    (24, 1, 0)
    """
    if shape is None:
        return 0
    count = 1
    for size in shape:
        count *= int(size)
    return count


def normalize_axis(axis: int, rank: int) -> int:
    """A possibly negative axis as a position in ``range(rank)`` (clamped for robustness).

    Examples
    --------
    >>> normalize_axis(-1, 3)
    2
    """
    axis = int(axis)
    if axis < 0:
        axis += rank
    return min(max(axis, 0), max(rank - 1, 0))
