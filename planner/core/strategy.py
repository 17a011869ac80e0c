"""A strategy: one configuration per op, with what it costs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["MemoryBreakdown", "TimeBreakdown", "Strategy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Memory per device (bytes), by component."""

    params_bytes: float = 0.0
    grads_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    activations_bytes: float = 0.0
    other_bytes: float = 0.0
    """Workspace and fragmentation allowance."""

    @property
    def total_bytes(self) -> float:
        return (
            self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.other_bytes
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    """Time per step (seconds), by component."""

    compute_s: float = 0.0
    intra_op_comm_s: float = 0.0
    """Collectives inside ops (partial-sum all-reduces, halos, statistics)."""
    redistribution_s: float = 0.0
    """Re-layout of tensors between ops (forward and backward)."""
    grad_sync_s: float = 0.0
    """Gradient all-reduce / reduce-scatter + all-gather of replicated parameters."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.intra_op_comm_s + self.redistribution_s + self.grad_sync_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """One point of the search result."""

    choice: tuple[int, ...]
    """Configuration index per op (rows of each op's ``ConfigSpace``)."""
    time_s: float
    """Time per training step (seconds)."""
    memory_bytes: float
    """Memory per device (bytes)."""
    splits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per op name, ``{dim: factor}`` of its split dims."""
    inter_splits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per op name, ``{dim: inter-node part of its factor}`` where that part is > 1."""
    memory: MemoryBreakdown | None = None
    time: TimeBreakdown | None = None
