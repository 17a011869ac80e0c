"""How a configuration of an op splits each of its tensors."""

from __future__ import annotations

from typing import Mapping

from planner.core.graph import TensorAccess

__all__ = ["axis_factors", "shard_shape"]


def axis_factors(access: TensorAccess, factors: Mapping[str, int]) -> tuple[int, ...]:
    """Split factor of each tensor axis: the product of the factors of the dims indexing it.

    Examples
    --------
    >>> a = TensorAccess(tensor="x", axes=(("b",), (), ("h", "d")))
    >>> axis_factors(a, {"b": 2, "h": 4, "d": 1})
    (2, 1, 4)
    """
    result = []
    for dims in access.axes:
        factor = 1
        for dim in dims:
            factor *= factors.get(dim, 1)
        result.append(factor)
    return tuple(result)


def shard_shape(shape: tuple[int, ...], access: TensorAccess, factors: Mapping[str, int]) -> tuple[int, ...]:
    """Per-device shape of a tensor under a configuration (ceil division for uneven axes).

    Examples
    --------
    >>> shard_shape((8, 3, 64), TensorAccess(tensor="x", axes=(("b",), (), ("h",))), {"b": 2, "h": 4})
    (4, 3, 16)
    """
    return tuple(-(-size // f) for size, f in zip(shape, axis_factors(access, factors)))
