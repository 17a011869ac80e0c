"""Vectorised helpers shared by the cost modules: shard sizes, group shapes, element sizes.

Every function takes an op and its :class:`~planner.core.configs.ConfigSpace` and returns one value
per configuration (arrays of length K), so per-family cost rules never loop over configurations.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from planner.core.configs import ConfigSpace
from planner.core.graph import Op, OpGraph, Tensor, TensorAccess
from planner.core.settings import TrainingSettings

__all__ = [
    "access_dims",
    "dim_mask",
    "group_shape",
    "axis_factor_matrix",
    "axis_inter_matrix",
    "shard_elements",
    "is_float",
    "element_bytes",
    "is_parameter_name",
    "canonical_parameter",
    "CROSS_ENTROPY_LOSSES",
]

CROSS_ENTROPY_LOSSES = frozenset({"SoftmaxCrossEntropyLoss"})
"""Op types of kind ``softmax`` whose output is a loss (``importers.op_rules.loss``): a class split
is a vocab-parallel cross entropy (:mod:`objectives.intra_op`), they keep their fp32 probabilities
for backward (:mod:`objectives.memory`) and selective recomputation leaves them alone."""


def access_dims(access: TensorAccess) -> frozenset[str]:
    """Op dims that index any axis of the tensor."""
    return frozenset(d for axis in access.axes for d in axis)


def dim_mask(op: Op, names: Iterable[str]) -> np.ndarray:
    """``(n_dims,)`` bool: which of ``op``'s dims are in ``names``."""
    wanted = set(names)
    return np.array([d.name in wanted for d in op.dims], dtype=bool)


def group_shape(space: ConfigSpace, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(intra_size, inter_size)``, each ``(K,)`` int64: the devices that split the masked dims.

    The devices that differ only in their coordinates along the masked dims form one group; it has
    ``prod(intra parts)`` devices in each of ``prod(inter parts)`` nodes.
    """
    if not mask.any():
        ones = np.ones(space.size, dtype=np.int64)
        return ones, ones
    intra = np.prod(space.intra_factors[:, mask], axis=1, dtype=np.int64)
    inter = np.prod(space.inter_factors[:, mask], axis=1, dtype=np.int64)
    return intra, inter


def _axis_matrix(space: ConfigSpace, op: Op, access: TensorAccess, table: np.ndarray) -> np.ndarray:
    position = {name: i for i, name in enumerate(space.dim_names)}
    out = np.ones((space.size, len(access.axes)), dtype=np.int64)
    for axis, dims in enumerate(access.axes):
        for dim in dims:
            column = position.get(dim)
            if column is not None:
                out[:, axis] *= table[:, column]
    return out


def axis_factor_matrix(space: ConfigSpace, op: Op, access: TensorAccess) -> np.ndarray:
    """``(K, rank)`` int64: split factor of each tensor axis under each configuration."""
    return _axis_matrix(space, op, access, space.factors)


def axis_inter_matrix(space: ConfigSpace, op: Op, access: TensorAccess) -> np.ndarray:
    """``(K, rank)`` int64: the inter-node part of each axis factor."""
    return _axis_matrix(space, op, access, space.inter_factors)


def shard_elements(space: ConfigSpace, op: Op, access: TensorAccess, shape: tuple[int, ...]) -> np.ndarray:
    """``(K,)`` float64: elements of the tensor's per-device shard (ceil division per axis)."""
    if not shape:
        return np.ones(space.size, dtype=np.float64)
    factors = axis_factor_matrix(space, op, access)
    sizes = np.asarray(shape, dtype=np.int64)[None, : factors.shape[1]]
    per_axis = -(-sizes // factors)
    extra = np.prod(shape[factors.shape[1] :], dtype=np.float64) if len(shape) > factors.shape[1] else 1.0
    return np.prod(per_axis.astype(np.float64), axis=1) * extra


def is_float(tensor: Tensor) -> bool:
    """True for floating-point tensors (the ones that carry gradients)."""
    return tensor.dtype.startswith("float") or tensor.dtype == "bfloat16"


def element_bytes(tensor: Tensor, settings: TrainingSettings) -> int:
    """Bytes per element as trained: float tensors at the training precision, others as stored.

    ``bf16-mixed`` keeps weights, activations and gradients in bf16 (2 bytes); ``fp32`` in 4 bytes.
    """
    if is_float(tensor):
        return 2 if settings.precision == "bf16-mixed" else 4
    return tensor.itemsize


def is_parameter_name(graph_tensors: Mapping[str, Tensor], aliases: Mapping[str, str], name: str) -> bool:
    """True when ``name`` is a trainable parameter or an alias of one (a tied weight)."""
    if name in aliases:
        return True
    tensor = graph_tensors.get(name)
    return tensor is not None and tensor.role == "parameter"


def canonical_parameter(graph: OpGraph, name: str) -> str:
    """The canonical name of a (possibly tied) parameter."""
    seen = set()
    while name in graph.parameter_aliases and name not in seen:
        seen.add(name)
        name = graph.parameter_aliases[name]
    return name
