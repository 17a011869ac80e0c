r"""The frontier's convex hull by exact weighted DPs, for problems too large for FT elimination.

Every strategy that minimises :math:`T + w M` for some weight :math:`w \ge 0` is Pareto-optimal,
and the minimisers over all :math:`w` are the *supported* points: the vertices of the frontier's
convex hull. They are found with as few DPs as the hull has edges (Aneja and Nair's method, also
called NISE): start from the fastest and the smallest strategy; for two neighbouring hull points
:math:`a, b` solve with the weight of the line through them,
:math:`w = (T_b - T_a) / (M_a - M_b)`; a strategy strictly below that line is a new vertex (recurse
on both sides), none means :math:`ab` is a hull edge. Each DP is PaSE's exact elimination
(:func:`planner.search.elimination.solve_min`) with one shared elimination plan.

Points between hull vertices (the non-convex parts of the frontier) are then filled in by the exact
FT elimination restricted to the configurations the vertices use (:func:`fill_between`): real
strategies, Pareto-optimal within that restricted space, but not proven optimal in the full one, so
the result is marked inexact and says so.

References
----------
Y. P. Aneja and K. P. K. Nair, "Bicriteria transportation problem", Management Science 25(1), 1979.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from collections.abc import Callable

import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables
from planner.search.blocks import EliminationPlan, plan_elimination
from planner.search.elimination import solve_min
from planner.search.frontier import FrontierTooCostly
from planner.search.pareto import pareto_mask
from planner.search.problem import check_tables, evaluate_many
from planner.search.restrict import restrict
from planner.search.results import DPResult, FrontierPoint, FrontierResult

__all__ = ["supported_frontier", "fill_between", "DEFAULT_MAX_SOLVES"]

DEFAULT_MAX_SOLVES = 6
"""Cap on the weighted DPs after the two extremes (breadth first, so the vertices spread over the
frontier; each DP costs as much as the fastest plan, and the fill adds the points between them)."""

# A weighted optimum counts as below the line through two vertices when lower by this fraction.
_RELATIVE_TOLERANCE = 1e-9


def supported_frontier(
    tables: CostTables,
    *,
    plan: EliminationPlan | None = None,
    max_solves: int = DEFAULT_MAX_SOLVES,
    fill: bool = True,
    epsilon: float = 0.0,
    progress: Callable[[float], None] | None = None,
    deadline_s: float | None = None,
    fill_max_work: float | None = None,
    fill_max_step_bytes: float | None = None,
) -> FrontierResult:
    """The supported points of the (time, memory) frontier, optionally with points between them: a
    :class:`FrontierResult`, ``method="hull"``, ``exact=False`` unless the hull has a single point and
    nothing was filled; values from ``tables.evaluate``.

    Parameters
    ----------
    tables:
        The search problem.
    plan:
        Elimination plan for ``tables`` (default: chosen once here and shared by every DP).
    max_solves:
        At most this many weighted DPs after the two extremes; when reached, some hull edges are
        left unrefined (the points found are still Pareto-optimal).
    fill:
        Add the points of the frontier restricted to the vertices' configurations
        (:func:`fill_between`).
    epsilon:
        Memory bucket width of that restricted frontier (0: exact; as
        :func:`planner.search.frontier.pareto_frontier`).
    progress:
        Called with the fraction of DPs done (each can take seconds on a large problem).
    deadline_s:
        ``time.perf_counter()`` value after which no further weighted DP is started (nor the
        fill); the vertices found so far are returned (each is Pareto-optimal) and the result's
        ``order_name`` ends with ``(time limit)``. ``None``: no deadline.
    fill_max_work, fill_max_step_bytes:
        The fill's work and per-step memory caps (``pareto_frontier(max_work=, max_step_bytes=)``):
        past either, predicted before allocating, the vertices stand alone. ``None``: no cap.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.exhaustive import exhaustive_frontier
    >>> tables = chain_tables([3, 4, 2, 5], seed=7)
    >>> hull = supported_frontier(tables, fill=False)
    >>> oracle = {(p.time_s, p.memory_bytes) for p in exhaustive_frontier(tables).points}
    >>> all((p.time_s, p.memory_bytes) in oracle for p in hull.points)
    True
    """
    check_tables(tables)
    if max_solves < 0:
        raise InputError(f"max_solves must be >= 0 (got {max_solves})")
    if plan is None:
        plan = plan_elimination(tables)
    report = progress or (lambda fraction: None)
    steps = max_solves + 2 + int(fill)  # an upper bound: the hull may need fewer
    began = time.perf_counter()
    fastest = solve_min(tables, objective="time", plan=plan)
    last_solve_s = time.perf_counter() - began
    report(1 / steps)
    smallest = solve_min(tables, objective="memory")
    report(2 / steps)
    vertices: list[DPResult] = [fastest, smallest]
    pending = deque([(fastest, smallest)])
    solves = 0
    stopped = False
    while pending and solves < max_solves:
        if deadline_s is not None and time.perf_counter() + last_solve_s > deadline_s:
            stopped = True  # the next DP would likely end past the deadline
            break
        faster, leaner = pending.popleft()
        time_gap = leaner.time_s - faster.time_s
        memory_gap = faster.memory_bytes - leaner.memory_bytes
        if not (time_gap > 0 and memory_gap > 0 and np.isfinite(time_gap) and np.isfinite(memory_gap)):
            continue
        weight = time_gap / memory_gap
        began = time.perf_counter()
        found = solve_min(tables, objective="time", memory_weight_s_per_byte=weight, plan=plan)
        last_solve_s = time.perf_counter() - began
        solves += 1
        report((2 + solves) / steps)
        on_line = faster.time_s + weight * faster.memory_bytes
        if found.time_s + weight * found.memory_bytes < on_line - _RELATIVE_TOLERANCE * abs(on_line):
            vertices.append(found)
            pending.extend([(faster, found), (found, leaner)])
    choices = np.stack([v.choice for v in vertices])
    fill = fill and not (deadline_s is not None and time.perf_counter() > deadline_s)
    if fill:
        try:
            choices = np.concatenate([choices, fill_between(
                tables, choices, epsilon=epsilon, deadline_s=deadline_s, max_work=fill_max_work,
                max_step_bytes=fill_max_step_bytes,
            )])
        except FrontierTooCostly:
            fill, stopped = False, True  # the deadline came first: the vertices stand alone
    result = _result(tables, choices, plan, filled=fill, complete=not pending, epsilon=epsilon)
    return replace(result, order_name=result.order_name + " (time limit)") if stopped else result


def fill_between(
    tables: CostTables,
    choices: np.ndarray,
    *,
    epsilon: float = 0.0,
    deadline_s: float | None = None,
    max_work: float | None = None,
    max_step_bytes: float | None = None,
) -> np.ndarray:
    """Choices of the frontier over only the configurations some of ``choices`` use.

    Parameters
    ----------
    tables:
        The search problem.
    choices:
        ``(n, num_ops)`` configuration indices (e.g. the hull's vertices).
    epsilon:
        Memory bucket width of the restricted frontier (0: exact).
    deadline_s:
        ``time.perf_counter()`` value past which the restricted elimination stops
        (:class:`~planner.search.frontier.FrontierTooCostly`); ``None``: none.
    max_work, max_step_bytes:
        As :func:`~planner.search.frontier.pareto_frontier`: caps checked before each elimination.

    Returns
    -------
    numpy.ndarray
        ``(m, num_ops)`` choices in the original indices: the Pareto-optimal points of the
        restricted problem (at most a few configurations per op, so the elimination is small).
    """
    from planner.search.frontier import pareto_frontier

    masks = []
    for i, t in enumerate(tables.node_time_s):
        mask = np.zeros(t.shape[0], dtype=bool)
        mask[choices[:, i]] = True
        masks.append(mask)
    restricted = restrict(tables, masks)
    front = pareto_frontier(
        restricted.tables, epsilon=epsilon, deadline_s=deadline_s, max_work=max_work, max_step_bytes=max_step_bytes
    )
    if not front.points:
        return np.zeros((0, tables.num_ops), dtype=np.int64)
    return np.stack([restricted.to_original(p.choice) for p in front.points])


def _result(
    tables: CostTables, choices: np.ndarray, plan: EliminationPlan, *, filled: bool, complete: bool, epsilon: float
) -> FrontierResult:
    time_s, memory = evaluate_many(tables, choices)
    keep = np.flatnonzero(pareto_mask(time_s, memory) & np.isfinite(time_s) & np.isfinite(memory))
    keep = keep[np.lexsort((memory[keep], time_s[keep]))]
    points = []
    seen: set[tuple[float, float]] = set()
    for i in keep:  # one point per (time, memory): equal strategies found twice are listed once
        key = (float(time_s[i]), float(memory[i]))
        if key not in seen:
            seen.add(key)
            points.append(FrontierPoint(time_s=key[0], memory_bytes=key[1], choice=choices[i]))
    return FrontierResult(
        points=tuple(points),
        epsilon=float(epsilon) if filled else float("nan"),  # the fill's buckets; none without it
        exact=len(points) <= 1 and complete,
        max_table_cells=plan.max_table_cells,
        order_name=f"{plan.name} weighted hull" + (" + fill" if filled else ""),
        method="hull",
        memory_bound_factor=None,
    )
