"""What :func:`planner.plan.plan` takes and gives: the request (cluster, settings, method, limits),
the result (the frontier, the pick, the baselines and the context) and its rows.

``PlanRequest.__post_init__`` is the one place the CLI's choices are checked (``--cost``,
``--method``, the limits), so a bad value stops at construction with the fix in its message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Sequence, get_args

import numpy as np

from planner.core.cluster import Cluster
from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import CostModelName, TrainingSettings
from planner.core.strategy import Strategy

__all__ = ["Method", "ProgressFn", "PlanRequest", "PlanPoint", "Baseline", "PlanResult"]


Method = Literal["dp", "frontier", "nsga2", "exhaustive"]
ProgressFn = Callable[[str, float], None]
"""``progress(stage, fraction_done)``: called during long work (stage names: import, cost, search)."""


def _either(names: Sequence[str]) -> str:
    """``"a, b or c"``.

    >>> _either(("dp", "frontier", "nsga2"))
    'dp, frontier or nsga2'
    """
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanRequest:
    """Everything :func:`planner.plan.plan` needs besides the op graph."""

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
    max_points: int = 256
    """Cap on the memory levels of one frontier factor (``pareto_frontier(max_points=)``): more
    levels give a tighter ``PlanResult.memory_bound_factor`` and take longer."""
    time_limit_s: float = 60.0
    """Wall-clock seconds for the whole plan (cost, search, pick): the search degrades (hull,
    restricted configurations, NSGA-II) to end by then and says so in the notes (``--time-limit``)."""
    max_memory_bytes: float | None = None
    """Ceiling on the planner's own memory (bytes): no search step is started whose predicted
    tables pass it (``--max-memory``; ``None``: min(4 GiB, half of physical memory))."""

    def __post_init__(self) -> None:
        # the one place the choices are checked: the CLI passes its strings straight in
        if self.cost_model not in get_args(CostModelName):
            raise InputError(f"unknown --cost '{self.cost_model}'; use {_either(get_args(CostModelName))}")
        if self.method not in get_args(Method):
            raise InputError(f"unknown --method '{self.method}'; use {_either(get_args(Method))}")
        if not (self.time_limit_s > 0 and np.isfinite(self.time_limit_s)):
            raise InputError(f"--time-limit must be a positive number of seconds (got {self.time_limit_s}), e.g. --time-limit 60")
        if self.max_memory_bytes is not None and not (self.max_memory_bytes > 0 and np.isfinite(self.max_memory_bytes)):
            raise InputError(f"--max-memory must be a positive size (got {self.max_memory_bytes}), e.g. --max-memory 4GB")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise InputError("--mem-limit must be positive, e.g. --mem-limit 16GB")
        if not (np.isfinite(self.epsilon) and self.epsilon >= 0):
            raise InputError(f"--epsilon must be a finite number >= 0 (got {self.epsilon}); 0 means exact")
        if self.max_points < 1:
            raise InputError(f"the frontier's point cap must be at least 1 (got {self.max_points}); the default is 256")


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
    settings: TrainingSettings | None = None
    """The point's own training settings where they differ from the request's (an MoE model's
    searched expert-parallel degree); ``None``: the request's."""


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
    memory_bound_factor: float | None = 1.0
    """The frontier's guarantee: every Pareto-optimal (T*, M*) has a listed point with T <= T* and
    M <= this x M* (``FrontierResult.memory_bound_factor``; ``None``: no such bound, e.g. NSGA-II,
    the weighted hull or a target-restricted search)."""
    pick_proven: bool = True
    """``chosen`` is the exact fastest strategy within the limit, or nothing fits, proven
    (:func:`planner.search.constrained.fastest_within_exact`); ``False`` when its budget ran out."""
    pick_proof: str = ""
    """How the pick was proven (``ConstrainedPick.proof``)."""
    min_memory_bytes: float = float("nan")
    """The exact least memory per device of any strategy (:func:`planner.search.constrained.min_memory`)."""
    samples_per_step: int = 1
    cost: object | None = field(default=None, repr=False, compare=False)
    """The ``objectives.tables.CostModel`` the points were priced with (for explanations)."""

    @property
    def feasible(self) -> bool:
        return self.chosen is not None

    @property
    def best(self) -> PlanPoint | None:
        return None if self.chosen is None else self.points[self.chosen]
