"""``plan()``: the one function that wires import, cost and search; the CLI and tests call it.

Data flows one way: the importer turns the ONNX file into an :class:`~planner.core.graph.OpGraph`;
``objectives`` prices every configuration of every op on the cluster (:class:`CostTables`);
``planner.search`` finds the exact optimum (``dp``), the time/memory frontier (``frontier``), an
independent approximate frontier (``nsga2``) or the brute-force oracle (``exhaustive``); the
baselines (pure data parallelism, the best uniform ``dp x tp``, and for CNNs the "one weird trick")
are exact searches over restricted tables, priced by the same cost model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

from planner import families
from planner.core.cluster import Cluster
from planner.core.configs import ConfigOptions, ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import TrainingSettings
from planner.core.strategy import MemoryBreakdown, Strategy, TimeBreakdown
from planner.core.tables import CostTables

__all__ = [
    "Method",
    "CostModelName",
    "PlanRequest",
    "PlanPoint",
    "Baseline",
    "PlanResult",
    "ProgressFn",
    "load_graph",
    "plan",
    "evaluate",
    "op_configurations",
]

Method = Literal["dp", "frontier", "nsga2", "exhaustive"]
CostModelName = Literal["roofline", "measured", "pase"]
ProgressFn = Callable[[str, float], None]
"""``progress(stage, fraction_done)``: called during long work (stage names: import, cost, search)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest:
    """Everything :func:`plan` needs besides the op graph."""

    cluster: Cluster
    settings: TrainingSettings = field(default_factory=TrainingSettings)
    method: Method = "frontier"
    cost_model: CostModelName = "roofline"
    memory_limit_bytes: float | None = None
    """Per-device memory limit; ``None``: the device's memory size."""
    profile_db: Path | None = None
    """SQLite profile database for ``cost_model="measured"``."""
    epsilon: float = 0.01
    """Relative memory bucket width of the frontier (0: exact)."""
    seed: int = 0
    """NSGA-II seed."""
    product_rule: Literal["divides", "at_most"] | None = None
    """Which device counts a configuration may use (``None``: ``at_most`` for PaSE, else ``divides``)."""
    min_tile: int | None = None
    """Smallest per-device size of a split dim (``None``: 4 for PaSE, else 1)."""

    def __post_init__(self) -> None:
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise InputError("--mem-limit must be positive, e.g. --mem-limit 16GB")
        if self.epsilon < 0:
            raise InputError(f"--epsilon must be >= 0 (got {self.epsilon})")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanPoint:
    """One strategy of the result, with what a table row shows."""

    strategy: Strategy
    samples_per_s: float
    speedup_vs_dp: float
    """Data-parallel step time / this step time (same cost model)."""
    devices_used: int
    fits: bool
    """Memory per device within the limit."""
    summary: str
    """E.g. ``"dp=4 x tp=4"``."""
    targets: tuple[str, ...] = ()
    """Export targets that can run this strategy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Baseline:
    """A reference strategy family evaluated with the same cost model."""

    name: str
    """``data_parallel``, ``best_uniform`` or ``weird_trick``."""
    label: str
    """E.g. ``"dp=4 x tp=4"``."""
    point: PlanPoint | None
    """``None`` when the family does not apply to this model."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanResult:
    """The search result: the frontier (or one optimum), the pick, the baselines and the context."""

    graph: OpGraph
    request: PlanRequest
    spaces: tuple[ConfigSpace, ...]
    points: tuple[PlanPoint, ...]
    """Sorted by step time, fastest first."""
    chosen: int | None
    """Index into ``points`` of the fastest point within the memory limit (``None``: none fits)."""
    memory_limit_bytes: float
    baselines: tuple[Baseline, ...]
    message: str = ""
    """Why nothing fits and what would, when ``chosen`` is ``None``."""
    import_time_s: float = 0.0
    cost_time_s: float = 0.0
    search_time_s: float = 0.0
    epsilon: float = 0.0
    exact: bool = True
    max_table_cells: int = 0
    order_name: str = ""
    roofline_fallbacks: int = 0
    """Ops priced by roofline because the profile database had no entry (measured cost model)."""
    samples_per_step: int = 1

    @property
    def feasible(self) -> bool:
        return self.chosen is not None

    @property
    def best(self) -> PlanPoint | None:
        return None if self.chosen is None else self.points[self.chosen]


def load_graph(path: str | Path, dims: Mapping[str, int] | None = None) -> OpGraph:
    """Import an ONNX file as an op graph with the symbolic dims bound (``{"batch": 32}``)."""
    from importers import import_model

    return import_model(path, dict(dims or {}))


def samples_per_step(graph: OpGraph) -> int:
    """Samples in one training step: the largest batch-dim size over the ops (1 if none)."""
    sizes = [d.size for op in graph.ops for d in op.dims if d.is_batch]
    return max(sizes) if sizes else 1
