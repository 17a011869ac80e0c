r"""What an elimination will cost before it runs, and the memory the process may still use.

The DP (:mod:`planner.search.elimination`) and the hull built on it keep every table they produce
until the choices are read back, so the memory of one solve is the sum of its produced tables plus
the temporaries of its largest step; its time grows with the cells it combines. Both follow from
the elimination plan alone (scopes and configuration counts), so :func:`estimate_plan` replays the
plan on symbolic factors (:func:`planner.search.blocks.execute_plan` with factors that carry only a
scope) and sums, per elimination of op :math:`v` with dependent set :math:`D`:

.. math::

    \text{work} = K_v \prod_{u \in D} K_u, \qquad \text{kept} = 8 \prod_{u \in D} K_u \ \text{bytes},

and, for its temporaries, three result-sized arrays plus the two group sums of a (min,+) product
(:math:`8 K_v \prod_{u \in G_1} K_u` and the same for :math:`G_2`) when :math:`D` splits into two
groups no factor spans, as ``_eliminate`` does. A reused block region is counted once (its renamed
copies share arrays). Time is ``work x`` :data:`SECONDS_PER_CELL` plus a fixed cost per
elimination: measured on this project's 2-core machine at 5-17 ns per cell (GPT-2, Llama, BERT
exports at 64 devices), so the estimate is an upper bound on one core in most cases, not a promise.

:class:`SearchBudget` is what ``plan`` may spend: a wall-clock deadline and a memory ceiling for
the whole process (``--time-limit``, ``--max-memory``); :func:`memory_left` reads what is in use now.
:class:`PlanDeadline` is ``--time-limit`` as one deadline from the start of a plan, handed down to
every phase (import, the tables of the pure data-parallel rows, the searches): what the phases before
the searches take, the searches do not get, and each phase's seconds are kept for the note that says
where the time went.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import networkx as nx

from planner.core.errors import InputError
from planner.core.tables import CostTables
from planner.search.blocks import EliminationPlan, execute_plan

__all__ = [
    "SECONDS_PER_CELL",
    "SearchBudget",
    "PlanDeadline",
    "PlanEstimate",
    "default_max_memory_bytes",
    "current_rss_bytes",
    "estimate_plan",
    "FRONTIER_BYTES_PER_SUM",
    "frontier_step_bytes",
]

SECONDS_PER_CELL = 6.0e-9
"""[Empirical] Seconds per combined cell of a DP elimination (6 ns). Measured on GPT-2 / Llama / BERT
exports at 64 devices on one shared core: 2-5 ns at 1e9-cell tables (the bounded (min,+) product
skips most terms), up to 17 ns at 1e7-cell ones, where the fixed cost per step (below) dominates."""

_SECONDS_PER_ELIMINATION = 2.0e-4
"""[Empirical] Fixed Python/numpy cost of one elimination step (s)."""

_BYTES_PER_CELL = 8  # float64 tables

FRONTIER_BYTES_PER_SUM = 64
"""[Measured] Peak bytes per memory sum of one FT elimination step's bucketing: each (combination
of looped levels, vector level) pair is summed, keyed, masked and ``np.unique``-d (the float64 sums,
int64 keys, the ``np.where`` copy, unique's sorted copy, its argsort and inverse: about seven 8-byte
arrays). tracemalloc measured 57.3-57.4 bytes per sum on 0.6e6-2.6e6-sum steps; 64 is one more
array, an upper bound."""
_DEFAULT_CEILING_BYTES = 4 * 2**30


def default_max_memory_bytes() -> float:
    """``min(4 GiB, half of physical memory)``: the default ``--max-memory``.

    Examples
    --------
    >>> 0 < default_max_memory_bytes() <= 4 * 2**30
    True
    """
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: keep the fixed ceiling
        return float(_DEFAULT_CEILING_BYTES)
    return float(min(_DEFAULT_CEILING_BYTES, physical // 2))


def frontier_step_bytes(combinations: int, width: int) -> float:
    """Peak bytes the bucketing of one FT elimination step allocates before its table (bytes).

    Parameters
    ----------
    combinations:
        Combinations of the looped factors' memory levels.
    width:
        Memory levels of the vectorised factor.

    Examples
    --------
    >>> round(frontier_step_bytes(441_396, 220) / 2**30, 2)  # a T5 fill step that took 5.3 GB of RSS
    5.79
    """
    return float(combinations) * float(width) * FRONTIER_BYTES_PER_SUM


def current_rss_bytes() -> float:
    """Resident memory of this process now (bytes; 0 where ``/proc`` is unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
        return float(resident_pages * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchBudget:
    """What one search may spend: wall-clock time and the process's memory."""

    time_limit_s: float = 60.0
    """Wall-clock seconds from ``started_s`` (the whole ``plan``: cost tables, search, pick)."""
    max_memory_bytes: float = field(default_factory=default_max_memory_bytes)
    """Ceiling on the process's resident memory (bytes)."""
    started_s: float = field(default_factory=time.perf_counter)
    """``time.perf_counter()`` when the budget started."""

    def __post_init__(self) -> None:
        if not (self.time_limit_s > 0 and math.isfinite(self.time_limit_s)):
            raise InputError(f"--time-limit must be a positive number of seconds (got {self.time_limit_s}), e.g. --time-limit 60")
        if not (self.max_memory_bytes > 0 and math.isfinite(self.max_memory_bytes)):
            raise InputError(f"--max-memory must be a positive size (got {self.max_memory_bytes}), e.g. --max-memory 4GB")

    @property
    def deadline_s(self) -> float:
        """``time.perf_counter()`` value at which the search must stop."""
        return self.started_s + self.time_limit_s

    def time_left_s(self) -> float:
        """Seconds until the deadline (negative once past it)."""
        return self.deadline_s - time.perf_counter()

    def memory_left_bytes(self) -> float:
        """Bytes the process may still allocate: the ceiling minus what it holds now."""
        return self.max_memory_bytes - current_rss_bytes()


def _seconds(seconds: float) -> str:
    """``"0.4 s"``, ``"12 s"``: a phase's seconds as the time-limit note writes them."""
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanDeadline:
    """``--time-limit`` as one deadline for a whole plan, from its start (import, tables, searches).

    Each phase run under :meth:`phase` is timed: its own seconds, less those of any phase run
    inside it (a graph imported during a search counts as import). The searches get
    :meth:`left_s`; :meth:`spent_note` says where the time went once the limit cut something
    (:meth:`mark_cut`) or the plan took longer than its limit.

    Examples
    --------
    >>> now = [0.0]
    >>> deadline = PlanDeadline(limit_s=60.0, clock=lambda: now[0])
    >>> with deadline.phase("import", cuttable=False):
    ...     now[0] += 4.0
    >>> deadline.left_s()
    56.0
    >>> with deadline.phase("searches"):
    ...     now[0] += 50.0
    ...     with deadline.phase("import", cuttable=False):
    ...         now[0] += 8.0
    >>> deadline.mark_cut("the searches")
    >>> deadline.spent_note()
    '--time-limit 60 s: import 12 s, searches 50 s, 62 s in all; the limit cut the searches'
    """

    limit_s: float
    """Seconds from :attr:`started_s` (``--time-limit``)."""
    clock: Callable[[], float] = time.perf_counter
    """Monotonic seconds (injected in tests)."""
    started_s: float = math.nan
    """``clock()`` when the plan started (default: at construction)."""
    _spent: dict[str, float] = field(default_factory=dict, repr=False)
    _fixed: set[str] = field(default_factory=set, repr=False)  # the phases no limit cuts (import, tables)
    _open: list[list[float]] = field(default_factory=list, repr=False)  # [started, seconds of nested phases]
    _cut: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not (self.limit_s > 0 and math.isfinite(self.limit_s)):
            raise InputError(f"--time-limit must be a positive number of seconds (got {self.limit_s}), e.g. --time-limit 60")
        if math.isnan(self.started_s):
            object.__setattr__(self, "started_s", self.clock())

    @property
    def deadline_s(self) -> float:
        """``clock()`` value at which the plan should be done."""
        return self.started_s + self.limit_s

    def elapsed_s(self) -> float:
        """Seconds since the plan started."""
        return self.clock() - self.started_s

    def left_s(self) -> float:
        """Seconds until the deadline (negative once past it)."""
        return self.deadline_s - self.clock()

    def restarted(self) -> "PlanDeadline":
        """A fresh deadline of the same limit and clock, starting now (the next plan of a sweep)."""
        return PlanDeadline(limit_s=self.limit_s, clock=self.clock)

    @contextmanager
    def phase(self, name: str, *, cuttable: bool = True) -> Iterator[None]:
        """Time the block as phase ``name`` (``cuttable=False``: a phase the limit cannot stop, such as
        importing the model, named when it alone takes the whole limit)."""
        entry = [self.clock(), 0.0]
        self._open.append(entry)
        if not cuttable:
            self._fixed.add(name)
        try:
            yield
        finally:
            self._open.pop()
            took = self.clock() - entry[0]
            self._spent[name] = self._spent.get(name, 0.0) + took - entry[1]
            if self._open:
                self._open[-1][1] += took

    def spent(self) -> dict[str, float]:
        """Seconds of each phase so far (nested phases apart), in the order they first ran."""
        return dict(self._spent)

    def mark_cut(self, what: str) -> None:
        """Record that the limit cut ``what`` short (``"searches"``, ``"the smaller mesh's search"``)."""
        if what not in self._cut:
            self._cut.append(what)

    @property
    def cut(self) -> tuple[str, ...]:
        """What the limit cut short, in order."""
        return tuple(self._cut)

    def spent_note(self) -> str | None:
        """One line: where the time went (``"--time-limit 20 s: import 3.1 s, baselines 5.0 s, searches
        12 s, 21 s in all; ..."``), when the limit cut something or the plan outlasted it; else ``None``.
        The phases the limit cannot stop are named with their seconds when they alone took the limit."""
        elapsed = self.elapsed_s()
        if not self._cut and elapsed <= self.limit_s:
            return None
        spent = [f"{name} {_seconds(seconds)}" for name, seconds in self._spent.items() if seconds >= 0.05]
        other = elapsed - sum(self._spent.values())
        spent += [f"other {_seconds(other)}"] if other >= 0.05 else []
        why = [f"the limit cut {', '.join(self._cut)}"] if self._cut else []
        fixed = {name: s for name, s in self._spent.items() if name in self._fixed}
        if fixed and sum(fixed.values()) >= self.limit_s:
            why.append(f"{' and '.join(fixed)}, which no limit cuts, took {_seconds(sum(fixed.values()))} alone")
        return f"--time-limit {self.limit_s:g} s: {', '.join(spent)}, {_seconds(elapsed)} in all" + "".join(f"; {w}" for w in why)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanEstimate:
    """What one exact DP solve over a plan costs, predicted from its scopes."""

    time_s: float
    """Predicted seconds of one solve (:data:`SECONDS_PER_CELL` per combined cell)."""
    memory_bytes: float
    """Predicted peak bytes of one solve: the tables it keeps plus its largest step's temporaries."""
    work_cells: int
    """Cells combined (each reused region counted once)."""
    kept_cells: int
    """Cells of the produced tables (kept until the choices are read back)."""


class _Scope:
    """A symbolic factor: only its scope (what :func:`execute_plan` needs)."""

    __slots__ = ("scope",)

    def __init__(self, scope: tuple[int, ...]) -> None:
        self.scope = scope

    def renamed(self, rho: Mapping[int, int], memo: dict) -> "_Scope":
        return _Scope(tuple(rho[v] for v in self.scope))


def _groups(v: int, factors: list[_Scope], dependent: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Connected groups of the dependent set (as ``elimination._two_groups`` sees them)."""
    linked = nx.Graph()
    linked.add_nodes_from(dependent)
    for f in factors:
        others = [x for x in f.scope if x != v]
        linked.add_edges_from(zip(others, others[1:]))
    return [tuple(sorted(c)) for c in nx.connected_components(linked)]


def estimate_plan(tables: CostTables, plan: EliminationPlan) -> PlanEstimate:
    """Predict the time and peak memory of one DP solve of ``tables`` with ``plan``.

    Parameters
    ----------
    tables:
        The problem (only configuration counts and edge scopes are read).
    plan:
        From :func:`planner.search.blocks.plan_elimination`.

    Returns
    -------
    PlanEstimate
        Seconds and bytes (module docstring for the model).

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.blocks import plan_elimination
    >>> tables = chain_tables([3, 4, 5])
    >>> est = estimate_plan(tables, plan_elimination(tables))
    >>> est.work_cells == plan_elimination(tables).total_table_cells
    True
    """
    sizes = [int(t.shape[0]) for t in tables.node_time_s]
    factors = [_Scope((i,)) for i in range(tables.num_ops)]
    factors += [_Scope((e.u, e.v)) for e in tables.edges]
    totals = {"work": 0, "kept": 0, "temporary": 0, "steps": 0}

    def eliminate(v: int, touching: list[_Scope]) -> _Scope:
        dependent = tuple(sorted({x for f in touching for x in f.scope} - {v}))
        result = math.prod(sizes[x] for x in dependent)
        totals["work"] += sizes[v] * result
        totals["kept"] += result
        totals["steps"] += 1
        temporary = 3 * result
        groups = _groups(v, touching, dependent) if len(dependent) >= 2 else []
        if len(groups) >= 2:
            temporary += sizes[v] * sum(math.prod(sizes[x] for x in g) for g in groups)
        totals["temporary"] = max(totals["temporary"], temporary)
        return _Scope(dependent)

    execute_plan(plan, factors, eliminate)
    seconds = totals["work"] * SECONDS_PER_CELL + totals["steps"] * _SECONDS_PER_ELIMINATION
    memory = _BYTES_PER_CELL * (totals["kept"] + totals["temporary"])
    return PlanEstimate(time_s=seconds, memory_bytes=float(memory), work_cells=totals["work"], kept_cells=totals["kept"])
