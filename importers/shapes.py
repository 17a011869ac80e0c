"""Concrete shapes for every value of an ONNX graph, at the caller's dim bindings.

Contract (used by the coarsening stage): :func:`resolve_shapes` returns a :class:`ShapedModel`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnx

__all__ = ["ShapedModel", "resolve_shapes"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapedModel:
    """An ONNX model with every value's concrete shape and dtype."""

    model: onnx.ModelProto
    """As loaded, weights not loaded (``load_external_data=False``)."""
    shapes: Mapping[str, tuple[int, ...]]
    """Value name (node outputs, graph inputs, initializers) -> concrete shape."""
    dtypes: Mapping[str, str]
    """Value name -> numpy dtype name (``"float32"``, ``"int64"``...)."""
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Values known at import time: Constant nodes, small inline initializers, and results of
    shape-computation subgraphs (Shape -> Gather -> Concat...), by value name."""
    dim_bindings: Mapping[str, int] = field(default_factory=dict)
    """The bindings used, symbolic name -> value (derived ones such as ``batch*seq`` included)."""
    warnings: tuple[str, ...] = ()


def resolve_shapes(model: onnx.ModelProto, dims: Mapping[str, int]) -> ShapedModel:
    """Concrete shape of every value (see module docstring). Implemented in this module."""
    raise NotImplementedError
