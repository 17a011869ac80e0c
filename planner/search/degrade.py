r"""Search that degrades, never fails: the best frontier (or optimum) a time and memory budget allows.

Exact search is tried first and given up, *before* anything large is allocated, when its
predicted cost (:func:`planner.search.budget.estimate_plan`) passes the budget; each step down says
which and why (``Degraded.notes``):

1. **exact**: the FT elimination (:func:`planner.search.frontier.pareto_frontier`) when its largest
   table is small, with a work budget scaled to the time left; the ``dp`` method's exact minimum.
2. **hull**: the weighted hull (:func:`planner.search.hull.supported_frontier`): exact DPs, one
   per hull edge, stopped at the deadline (each vertex is Pareto-optimal).
3. **restricted configurations**: each op splits at most :math:`k` of its dims
   (:func:`split_masks`; :math:`k = 3, 2, 1`, Megatron-style layouts split two: the batch and one
   model dim), the least restriction whose DP fits; then 1-2 on those tables. Exact *within* the
   restriction only, and the notes say so.
4. **NSGA-II** (:func:`planner.search.nsga2.nsga2_frontier`) for what is left of the time: no
   optimality guarantee; its memory is a population, never a table.

Every result is in the original tables' configuration indices.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables
from planner.core.units import format_bytes
from planner.search.blocks import plan_elimination
from planner.search.budget import PlanEstimate, SearchBudget, estimate_plan
from planner.search.nsga2_seeds import baseline_seeds, combine_seeds, merge_seeds
from planner.search.restrict import Restricted, restrict
from planner.search.results import FrontierPoint, FrontierResult

__all__ = [
    "Tier",
    "Degraded",
    "split_masks",
    "frontier_within",
    "fastest_within",
    "RESTRICTION_LEVELS",
    "FRONTIER_WORK_PER_S",
    "exact_fits",
    "degraded_seeds",
    "MoreSeeds",
]

Tier = Literal["exact", "hull", "restricted", "nsga2"]

RESTRICTION_LEVELS = (3, 2, 1)
"""Most dims an op may split at each restricted step, least restrictive first."""

# The FT elimination multiplies its tables by the memory levels of each cell: above this largest
# DP table it is not tried (as plan.py's _FRONTIER_MAX_TABLE_CELLS before this module).
FRONTIER_MAX_TABLE_CELLS = 10_000_000
FRONTIER_WORK_PER_S = 1e9
"""[Empirical] FT work units (``pareto_frontier(max_work=)``) per second: 3e10 took 5-10 s on an
idle core, 27 s on this project's shared 2-core machine (GPT-2 TorchScript export, 64 devices)."""
FRONTIER_MAX_WORK = 3e10
# A full solve (DP or hull) is started only when its predicted time is within this fraction of the
# time left: the hull needs two solves and gains from more, the exact pick and export follow.
_SOLVE_SHARE = 1 / 3
# NSGA-II needs a few seconds to be worth running at all.
_NSGA2_MIN_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Degraded:
    """A result within the budget and how it was reached."""

    result: FrontierResult
    """Points in the original tables' indices."""
    tier: Tier
    notes: tuple[str, ...]
    """One line per step down, saying which and why."""
    max_split_dims: int | None = None
    """The restriction the result was searched under (``None``: every configuration)."""


def split_masks(tables: CostTables, max_split_dims: int, seeds: np.ndarray | None = None) -> list[np.ndarray]:
    """Per op, the configurations that split at most ``max_split_dims`` dims (replicated rows stay),
    plus the rows any of ``seeds`` (``(n, num_ops)`` choices, e.g. the baselines) uses, so the
    restricted search never misses a strategy the caller already knows.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> tables = chain_tables([3, 2])
    >>> [int(m.sum()) for m in split_masks(tables, 0)]  # one dim: only the replicated row splits none
    [1, 1]
    """
    masks = [np.count_nonzero(np.asarray(space.factors) > 1, axis=1) <= max_split_dims for space in tables.configs]
    if seeds is not None:
        for i, mask in enumerate(masks):
            mask[np.asarray(seeds, dtype=np.int64).reshape(-1, tables.num_ops)[:, i]] = True
    return masks


def _describe(estimate: PlanEstimate) -> str:
    return f"~{estimate.time_s:.3g} s and {format_bytes(estimate.memory_bytes)} per exact DP"


def _remap(result: FrontierResult, restricted: Restricted | None, *, exact: bool) -> FrontierResult:
    if restricted is None:
        return result
    points = tuple(
        FrontierPoint(time_s=p.time_s, memory_bytes=p.memory_bytes, choice=restricted.to_original(p.choice))
        for p in result.points
    )
    # exact only within the restriction: no guarantee on the full problem
    return replace(result, points=points, exact=exact and result.exact, memory_bound_factor=None)


def exact_fits(
    plan,
    estimate: PlanEstimate,
    budget: SearchBudget,
    deadline_s: float,
    *,
    frontier: bool,
    max_table_cells: int = FRONTIER_MAX_TABLE_CELLS,
) -> bool:
    """Whether the first rung fits: the FT elimination (``frontier``; its largest table at most
    ``max_table_cells``) or one exact DP (else), within the memory and a share of the time left."""
    if frontier:
        return plan.max_table_cells <= max_table_cells and _fits(estimate, budget, deadline_s)
    return _fits(estimate, budget, deadline_s, share=0.8)


def _fits(estimate: PlanEstimate, budget: SearchBudget, deadline_s: float, share: float = _SOLVE_SHARE) -> bool:
    return (
        estimate.memory_bytes <= budget.memory_left_bytes()
        and estimate.time_s <= share * (deadline_s - time.perf_counter())
    )


def frontier_within(
    tables: CostTables,
    budget: SearchBudget,
    *,
    deadline_s: float | None = None,
    epsilon: float = 0.01,
    max_points: int = 256,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
    frontier_max_table_cells: int = FRONTIER_MAX_TABLE_CELLS,
    frontier_max_work: float = FRONTIER_MAX_WORK,
    seeds: np.ndarray | None = None,
    more_seeds: MoreSeeds | None = None,
) -> Degraded:
    """The best (time, memory) frontier ``budget`` allows, degrading in the module's order.

    Parameters
    ----------
    tables:
        The problem.
    budget:
        Time and memory the process may spend.
    deadline_s:
        ``time.perf_counter()`` value by which the search must end (default: the budget's).
    epsilon, max_points:
        As :func:`planner.search.frontier.pareto_frontier`.
    seed:
        NSGA-II's seed, if it comes to that.
    progress:
        Fraction done of the current solve.
    frontier_max_table_cells, frontier_max_work:
        The FT elimination is tried only when the plan's largest table is at most this, with at
        most this work (less when the time left is short).
    seeds:
        ``(n, num_ops)`` known choices (e.g. the baselines): kept by every restriction and given
        to NSGA-II's first population.
    more_seeds:
        Called once, when the full problem does not fit, with a deadline (a share of the time
        left): more known choices (e.g. a smaller mesh's best plan, embedded). With ``seeds`` and
        the replicated plans (:func:`planner.search.nsga2_seeds.baseline_seeds`) they are kept by
        every restriction, start NSGA-II, and stay in a degraded result where nothing it found
        dominates them.

    Returns
    -------
    Degraded
        The frontier, the tier that produced it and the notes.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> degraded = frontier_within(chain_tables([3, 4, 2]), SearchBudget())
    >>> degraded.tier, degraded.result.exact, degraded.notes
    ('exact', True, ())
    """
    deadline = budget.deadline_s if deadline_s is None else deadline_s
    notes: list[str] = []
    levels: tuple[int | None, ...] = (None, *RESTRICTION_LEVELS)
    for level in levels:
        if level is not None and level == RESTRICTION_LEVELS[0]:
            seeds = degraded_seeds(tables, seeds, more_seeds, deadline, notes)
        restricted = None if level is None else restrict(tables, split_masks(tables, level, seeds))
        sub = tables if restricted is None else restricted.tables
        if level is not None and all(a.shape == b.shape for a, b in zip(sub.node_time_s, tables.node_time_s)):
            continue  # the restriction removes nothing: no cheaper than the step before
        plan = plan_elimination(sub)
        estimate = estimate_plan(sub, plan)
        where = "every configuration" if level is None else f"at most {level} split dims per op"
        if not _fits(estimate, budget, deadline):
            notes.append(
                f"search: {where} needs {_describe(estimate)} ({format_bytes(max(0.0, budget.memory_left_bytes()))} "
                f"and {max(0.0, deadline - time.perf_counter()):.3g} s left)"
            )
            continue
        if level is not None:
            notes.append(
                f"search: restricted configurations: each op splits at most {level} of its dims; the frontier "
                "is exact only within that restriction"
            )
        found = _exact_or_hull(
            sub, plan, estimate, deadline, epsilon, max_points, progress, notes,
            max_table_cells=frontier_max_table_cells, max_work=frontier_max_work, budget=budget,
        )  # fmt: skip
        if found is not None:
            result, tier = found
            tier = "restricted" if level is not None else tier
            result = _remap(result, restricted, exact=False)
            if level is not None:
                result = merge_seeds(tables, result, seeds)
            return Degraded(result=result, tier=tier, notes=tuple(notes), max_split_dims=level)
    from planner.search.nsga2 import nsga2_frontier

    seconds = max(_NSGA2_MIN_S, deadline - time.perf_counter())
    notes.append(f"search: NSGA-II answered within {seconds:.3g} s: an approximate frontier, no optimality guarantee")
    result = nsga2_frontier(tables, seed=seed, time_limit_s=seconds, initial=seeds)
    return Degraded(result=merge_seeds(tables, result, seeds), tier="nsga2", notes=tuple(notes))


MoreSeeds = Callable[[float], "np.ndarray | None"]
"""``deadline_s -> (n, num_ops)`` choices (or ``None``), computed only when a search degrades."""

_MORE_SEEDS_SHARE = 0.3
"""Share of the time left that ``more_seeds`` may take (a smaller mesh's search)."""


def degraded_seeds(
    tables: CostTables, seeds: np.ndarray | None, more_seeds: MoreSeeds | None, deadline: float, notes: list[str]
) -> np.ndarray:
    """What a degraded search starts from: ``seeds``, the replicated plans
    (:func:`~planner.search.nsga2_seeds.baseline_seeds`) and ``more_seeds`` (given
    :data:`_MORE_SEEDS_SHARE` of the time left), duplicates dropped.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> degraded_seeds(chain_tables([3, 2]), None, lambda deadline: np.array([[2, 1]]), 0.0, []).tolist()
    [[0, 0], [2, 1]]
    """
    extra = None
    if more_seeds is not None:
        share = max(0.0, deadline - time.perf_counter()) * _MORE_SEEDS_SHARE
        extra = more_seeds(time.perf_counter() + share)
        if extra is not None and len(extra):
            notes.append("search: the degraded search starts from the replicated plan and smaller meshes' best plans")
    return combine_seeds(tables.num_ops, seeds, baseline_seeds(tables), extra)


def _exact_or_hull(
    tables: CostTables,
    plan,
    estimate: PlanEstimate,
    deadline: float,
    epsilon: float,
    max_points: int,
    progress: Callable[[float], None] | None,
    notes: list[str],
    *,
    max_table_cells: int,
    max_work: float,
    budget: SearchBudget,
) -> tuple[FrontierResult, Tier] | None:
    """FT elimination if small, else (or when it runs out of work) the weighted hull; ``None``
    when even the hull fails for its size (a table too large after all). Each FT elimination
    step is refused before it allocates more than the memory ``budget`` has left."""
    from planner.search.frontier import FrontierTooCostly, pareto_frontier
    from planner.search.hull import supported_frontier

    if plan.max_table_cells <= max_table_cells:
        seconds = max(0.0, deadline - time.perf_counter()) * _SOLVE_SHARE
        work = min(max_work, FRONTIER_WORK_PER_S * seconds)
        try:
            found = pareto_frontier(
                tables, epsilon=epsilon, plan=plan, max_work=work, max_points=max_points,
                deadline_s=time.perf_counter() + seconds, max_step_bytes=budget.memory_left_bytes(),
            )  # fmt: skip
            return found, "exact"
        except FrontierTooCostly:
            notes.append(
                f"search: the exact frontier elimination would pass its budget ({work:.2g} summed entries or "
                f"{seconds:.3g} s); the weighted hull answered (its vertices are exact optima)"
            )
        except InputError as too_large:
            if "memory levels" not in str(too_large):
                raise
            notes.append("search: the exact frontier elimination has too many memory levels; the weighted hull answered")
        except MemoryError:
            notes.append("search: the exact frontier elimination ran out of memory; the weighted hull answered")
    try:
        # the fill (an FT elimination over the vertices' configurations) gets the first rung's caps:
        # its level combinations can still explode (a T5 fill step: 4.4e5 x 220 sums, 5.3 GB)
        result = supported_frontier(
            tables, plan=plan, epsilon=epsilon, progress=progress, deadline_s=deadline,
            fill_max_work=min(max_work, FRONTIER_WORK_PER_S * max(0.0, deadline - time.perf_counter())),
            fill_max_step_bytes=budget.memory_left_bytes(),
        )  # fmt: skip
    except MemoryError:
        notes.append(f"search: the weighted hull ran out of memory (predicted {_describe(estimate)})")
        return None
    except InputError as too_large:
        if "too large" not in str(too_large):
            raise
        notes.append(f"search: {too_large}")
        return None
    if result.order_name.endswith("(time limit)"):
        notes.append(
            "search: the weighted hull stopped at the time limit (or its fill at its work or memory cap); the "
            "points found are kept (each vertex is Pareto-optimal)"
        )
    return result, "hull"


def fastest_within(
    tables: CostTables,
    budget: SearchBudget,
    *,
    deadline_s: float | None = None,
    seed: int = 0,
    seeds: np.ndarray | None = None,
    more_seeds: MoreSeeds | None = None,
):
    """The exact fastest choice if a DP fits the budget, else the fastest within the first
    restriction that fits, else NSGA-II's fastest point; a degraded answer is never slower than
    ``seeds``, the replicated plans and ``more_seeds`` (as in :func:`frontier_within`).

    Returns
    -------
    tuple
        ``(choice, exact, notes, max_table_cells, order_name)``.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.exhaustive import exhaustive_min
    >>> tables = chain_tables([3, 4, 2])
    >>> choice, exact, notes, _, _ = fastest_within(tables, SearchBudget())
    >>> exact, tables.evaluate(choice)[0] == exhaustive_min(tables).time_s
    (True, True)
    """
    from planner.search.elimination import solve_min

    deadline = budget.deadline_s if deadline_s is None else deadline_s
    notes: list[str] = []
    for level in (None, *RESTRICTION_LEVELS):
        if level is not None and level == RESTRICTION_LEVELS[0]:
            seeds = degraded_seeds(tables, seeds, more_seeds, deadline, notes)
        restricted = None if level is None else restrict(tables, split_masks(tables, level, seeds))
        sub = tables if restricted is None else restricted.tables
        plan = plan_elimination(sub)
        estimate = estimate_plan(sub, plan)
        where = "every configuration" if level is None else f"at most {level} split dims per op"
        if not _fits(estimate, budget, deadline, share=0.8):
            notes.append(f"search: {where} needs {_describe(estimate)}")
            continue
        try:
            best = solve_min(sub, plan=plan)
        except MemoryError:
            notes.append(f"search: {where} ran out of memory (predicted {_describe(estimate)})")
            continue
        if level is not None:
            notes.append(f"search: restricted configurations: each op splits at most {level} of its dims; the optimum is exact only within that restriction")
        choice = best.choice if restricted is None else restricted.to_original(best.choice)
        return choice, level is None, tuple(notes), plan.max_table_cells, plan.name
    from planner.search.nsga2 import nsga2_frontier

    seconds = max(_NSGA2_MIN_S, deadline - time.perf_counter())
    notes.append(f"search: NSGA-II answered within {seconds:.3g} s (approximate, no optimality guarantee)")
    front = merge_seeds(tables, nsga2_frontier(tables, seed=seed, time_limit_s=seconds, initial=seeds), seeds)
    if not front.points:
        return np.zeros(tables.num_ops, dtype=np.int64), False, tuple(notes), 0, "nsga2"
    return front.points[0].choice, False, tuple(notes), 0, "nsga2"


def solve_fits(estimate: PlanEstimate, *, max_seconds: float, memory_left_bytes: float) -> bool:
    """Whether one exact DP predicted at ``estimate`` fits a solve's caps (seconds and bytes)."""
    return estimate.time_s <= max_seconds and estimate.memory_bytes <= memory_left_bytes


def quick_fastest(tables: CostTables, *, time_limit_s: float = _NSGA2_MIN_S, seed: int = 0, seeds: np.ndarray | None = None) -> np.ndarray | None:
    """A fast choice when no exact DP fits: NSGA-II for ``time_limit_s`` started from ``seeds``, the
    replicated plans and each op's fastest row alone, its fastest point or the fastest seed
    (whichever is faster); ``None`` when nothing is finite. For searches that solve many tables
    (a pipeline's per-stage intra-op choice), where the full ladder of :func:`fastest_within`
    would cost too much per solve. ``time_limit_s <= 0`` (a search past its deadline,
    :func:`planner.search.solve_clock.heuristic_seconds`): the fastest of those starts, no NSGA-II
    (its first call imports pymoo, 0.7 s of CPU, and sets up a population).

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> tables = chain_tables([3, 4, 2], seed=3)
    >>> choice = quick_fastest(tables, time_limit_s=1.0)
    >>> choice.shape, bool(np.isfinite(tables.evaluate(choice)[0]))
    ((3,), True)
    >>> starts = quick_fastest(tables, time_limit_s=0.0)  # no time: never slower than the replicated plans
    >>> bool(tables.evaluate(starts)[0] <= min(tables.evaluate(s)[0] for s in baseline_seeds(tables)))
    True
    """
    greedy = np.array([int(np.argmin(t)) for t in tables.node_time_s], dtype=np.int64)
    start = combine_seeds(tables.num_ops, seeds, baseline_seeds(tables), greedy)
    if time_limit_s <= 0:
        none = FrontierResult(points=(), epsilon=float("nan"), exact=False, max_table_cells=0, order_name="starts",
                              method="nsga2", memory_bound_factor=None)
        front = merge_seeds(tables, none, start)
        return front.points[0].choice if front.points else None
    from planner.search.nsga2 import nsga2_frontier

    front = merge_seeds(tables, nsga2_frontier(tables, seed=seed, population=40, time_limit_s=time_limit_s, initial=start), start)
    return front.points[0].choice if front.points else None
