r"""The fastest strategy within a memory limit, exactly; and the exact minimum memory.

The problem: choose one configuration per op to

.. math::

    \min_c T(c) \quad \text{s.t.} \quad M(c) \le L, \qquad
    T(c) = T_0 + \sum_i t_i[c_i] + \sum_{(u,v)} t_{uv}[c_u, c_v], \quad M(c) = M_0 + \sum_i m_i[c_i]

(seconds, bytes per device; :class:`planner.core.tables.CostTables`). A bucketed frontier
(``epsilon > 0``) may miss its answer: it guarantees, for every Pareto-optimal :math:`(T^*, M^*)`, a
listed point with :math:`T \le T^*` and :math:`M \le \beta M^*`, so the optimum within :math:`L` can
hide behind a listed point of memory in :math:`(L, \beta L]`.

Minimum memory (:func:`min_memory`)
    Memory has no edge terms, so over the choices of finite cost it is a (min,+) problem whose
    edge factors are 0 (the pair has a finite time) or :math:`\infty`: PaSE's DP with the node
    memories as costs. When the per-op minimisers, restricted to the configurations of finite cost,
    combine into a choice of finite time (every real cost model: edges are finite), that choice is
    the minimum and no DP is needed. In float arithmetic too: rounded addition is monotone
    (:math:`a \le a', b \le b' \Rightarrow fl(a+b) \le fl(a'+b')`), so summing each op's least
    memory in ``CostTables.evaluate``'s order gives the least evaluated memory of all choices.
    "Nothing fits" is claimed only from this number.

Fastest within the limit (:func:`fastest_within_exact`), three proofs in turn
    1. *Nothing fits*: the minimum memory exceeds :math:`L`.
    2. *The frontier's bound* (or a caller's proven lower bound on time, e.g. the DP optimum): let :math:`c^*` be an optimum with the least memory among the optima,
       so :math:`(T^*, M^*)` is Pareto-optimal and :math:`M^* \le L`. The frontier lists a point with
       :math:`T \le T^*` and :math:`M \le \beta M^* \le \beta L`, so
       :math:`T^* \ge T_{lb} = \min\{T : \text{listed}, M \le \beta L\}`; the fastest listed point
       within :math:`L` has :math:`T_{inc} \ge T^*`. If :math:`T_{lb} = T_{inc}` the incumbent is
       optimal (no solve needed; always so for an exact frontier, :math:`\beta = 1`).
    3a. *A relaxed frontier* (:func:`planner.search.frontier.relaxed_points`): the same
       elimination with fine buckets that keep their *least* memory, so each returned pair
       bounds some choices from below; the least time of the pairs within :math:`L` is a lower
       bound of :math:`T^*`, and the pairs' own choices (priced exactly) may improve the
       incumbent. When the bound reaches the incumbent (to a relative 1e-12), it is optimal.
    3. *A pruned exact elimination*: the FT elimination at ``epsilon = 0`` with no cap on the
       levels (:func:`planner.search.frontier.pareto_frontier`, exact: tested against enumeration),
       dropping during elimination every entry all of whose completions exceed :math:`L` in memory
       or :math:`T_{inc}` in time (``memory_limit_bytes``/``time_limit_s``: the entry's excess over
       the least memory/time of its ops exceeds the slack left by the least memory/time of all
       ops; proof in ``frontier._Prune``). Every point within both limits survives, so its
       fastest point within :math:`L` is :math:`c^*`. The time bound is the Lagrangian one: with
       :math:`w` the listed points' slope at :math:`L` (:func:`_dual_weight`), a completion that
       beats the incumbent within the limit has :math:`T + wM < T_{inc} + wL`, and an entry is
       dropped when the least :math:`T + wM` of its completions is over that. It prunes well only
       when the ops' least :math:`t_i + w m_i` add up to nearly the optimum of :math:`T + wM`, so the
       elimination runs on the tables after min-sum diffusion of :math:`T + wM`
       (:func:`reparameterized`: edge time moved onto the ops, every choice's cost unchanged), in
       the order the blocks gave the original tables. A ``max_work`` budget
       bounds it; when the budget runs out the incumbent is returned with ``proven=False`` (and
       says so).

Float rounding: the elimination sums in its own order, ``CostTables.evaluate`` in op order; the
slacks are loosened by a relative 1e-9 and the final choice is checked on evaluated values, so
rounding can only keep extra candidates, never claim a point over the limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables, EdgeCost
from planner.search.blocks import EliminationPlan, plan_elimination
from planner.search.elimination import solve_min
from planner.search.problem import check_tables, evaluate_many
from planner.search.restrict import restrict
from planner.search.results import DPResult, FrontierPoint, FrontierResult

__all__ = ["MinMemory", "ConstrainedPick", "min_memory", "fastest_within_exact", "reparameterized", "DEFAULT_MAX_WORK"]

DEFAULT_MAX_WORK = 3e10
"""Budget of the pruned exact elimination, in summed entries (as ``pareto_frontier(max_work=)``;
about 5-10 s on one core)."""

# A relative margin for float rounding when comparing sums computed in different orders.
_ROUNDING = 1e-9
# Bucket widths of the relaxed frontiers tried before the exact elimination (proof 3a).
_RELAXED_EPSILONS = (2.0**-9, 2.0**-12)
# Rounds of min-sum diffusion before the pruned elimination (about 0.4 s on BERT-base at p = 8).
_DIFFUSION_ROUNDS = 30

ProofName = Literal[
    "no strategy fits", "fastest overall", "frontier bound", "relaxed bound", "pruned exact elimination", "not proven"
]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class MinMemory:
    """The least memory per device of any choice of finite cost."""

    memory_bytes: float
    """Bytes per device, from ``CostTables.evaluate`` (``inf``: no choice has a finite cost)."""
    choice: np.ndarray | None
    """``(num_ops,)`` int64: a choice that needs it (the fastest such when the per-op minimisers
    suffice), ``None`` when none is finite."""
    time_s: float
    """Seconds per step of ``choice`` (``inf`` when none)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ConstrainedPick:
    """The fastest strategy within a memory limit, or the proof that none fits."""

    memory_limit_bytes: float
    point: FrontierPoint | None
    """The fastest choice with memory <= the limit (``None``: nothing fits)."""
    min_memory_bytes: float
    """The exact least memory of any finite choice (:func:`min_memory`)."""
    proven: bool
    """True when ``point`` is the exact optimum within the limit (or nothing fits, proven)."""
    proof: ProofName
    """How: ``no strategy fits`` (minimum memory over the limit), ``fastest overall`` (the incumbent
    reaches the caller's lower bound on time), ``frontier bound`` (the listed
    frontier's guarantee), ``pruned exact elimination``, or ``not proven`` (the budget ran out:
    ``point`` is the fastest listed point within the limit)."""
    work: float = 0.0
    """Summed entries the exact elimination was allowed before it finished (0: not run)."""

    @property
    def feasible(self) -> bool:
        return self.point is not None


def _finite_masks(tables: CostTables) -> list[np.ndarray]:
    return [np.isfinite(t) & np.isfinite(m) for t, m in zip(tables.node_time_s, tables.node_memory_bytes)]


def min_memory(tables: CostTables, *, deadline_s: float | None = None, max_memory_bytes: float | None = None) -> MinMemory:
    """The exact least memory per device over the choices of finite time and memory.

    The fastest of the per-op minimisers' combinations is a DP over their ties; when that DP is
    predicted (:func:`planner.search.budget.estimate_plan`) past ``deadline_s`` (a
    ``time.perf_counter()`` value) or ``max_memory_bytes``, each op takes its fastest minimiser
    instead (the memory is the same least one; the time is not minimised over the ties).

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.exhaustive import exhaustive_min
    >>> tables = chain_tables([3, 4, 2], seed=5)
    >>> min_memory(tables).memory_bytes == exhaustive_min(tables, objective="memory").memory_bytes
    True
    """
    check_tables(tables)
    finite = _finite_masks(tables)
    if any(not f.any() for f in finite):
        return MinMemory(memory_bytes=float("inf"), choice=None, time_s=float("inf"))
    # the per-op minimisers among the finite configurations, the fastest of their combinations
    masks = []
    for f, m in zip(finite, tables.node_memory_bytes):
        least = m[f].min()
        masks.append(f & (m == least))
    sub = restrict(tables, masks)
    inner = _ties_fastest(sub.tables, deadline_s, max_memory_bytes)
    if np.isfinite(inner.value):
        choice = sub.to_original(inner.choice)
    else:
        # an infinite edge between minimisers: the DP over memory with 0/inf edges finds the least
        feasible = CostTables(
            configs=tables.configs,
            node_time_s=tuple(np.where(f, m, np.inf) for f, m in zip(finite, tables.node_memory_bytes)),
            node_memory_bytes=tuple(np.zeros_like(m) for m in tables.node_memory_bytes),
            edges=tuple(
                EdgeCost(u=e.u, v=e.v, time_s=np.where(np.isfinite(e.time_s), 0.0, np.inf)) for e in tables.edges
            ),
            blocks=tables.blocks,
        )
        best = solve_min(feasible, objective="time")
        if not np.isfinite(best.value):
            return MinMemory(memory_bytes=float("inf"), choice=None, time_s=float("inf"))
        choice = best.choice
    time_s, memory = (float(x[0]) for x in evaluate_many(tables, choice[None, :]))
    return MinMemory(memory_bytes=memory, choice=np.asarray(choice, dtype=np.int64), time_s=time_s)


def _ties_fastest(sub: CostTables, deadline_s: float | None, max_memory_bytes: float | None) -> DPResult:
    """The DP's fastest choice of ``sub`` (the minimisers' ties) if predicted within the limits, else
    each op's fastest row (``value`` inf when an edge between those rows is infinite, so the
    caller's feasibility DP runs). A bloom TorchScript export at 64 devices: the ties' DP alone
    was predicted at 400 s and 38 GB."""
    import time

    from planner.search.budget import estimate_plan

    plan = plan_elimination(sub)
    if deadline_s is not None or max_memory_bytes is not None:
        estimate = estimate_plan(sub, plan)
        late = deadline_s is not None and time.perf_counter() + estimate.time_s > deadline_s
        if late or (max_memory_bytes is not None and estimate.memory_bytes > max_memory_bytes):
            choice = np.array([int(np.argmin(t)) for t in sub.node_time_s], dtype=np.int64)
            time_s, memory = sub.evaluate(choice)
            return DPResult(choice=choice, time_s=float(time_s), memory_bytes=float(memory), value=float(time_s),
                            order_name="fastest row per op", max_table_cells=0)  # fmt: skip
    return solve_min(sub, objective="time", plan=plan)


def reparameterized(
    tables: CostTables, *, rounds: int = _DIFFUSION_ROUNDS, weight_s_per_byte: float = 0.0, deadline_s: float | None = None
) -> CostTables:
    r"""The same problem with edge time moved onto the ops, so that the ops' least times add up to
    (nearly) the optimum: min-sum diffusion (Kovalevsky and Koval; T. Werner, IEEE TPAMI 29(7), 2007).

    For op :math:`i` with incident edges :math:`e`, let :math:`\mu_e(c) = \min_{c'} t_e(c, c')`; each
    round sets :math:`t_i` and every :math:`\mu_e` to their mean :math:`a = (t_i + \sum_e \mu_e) / (d+1)`
    by adding :math:`a - \mu_e` to the edge's rows and :math:`a - t_i` to the op. Each step moves
    time between terms that every choice pays together, so :math:`T(c)` is unchanged for every
    choice (up to float rounding), and the terms stay >= 0 (a row's minimum becomes :math:`a \ge 0`).
    Finally each edge's row and column minima are moved onto its ops, leaving edges >= 0 with zero
    minima. :math:`T_0 + \sum_i \min_c t_i[c]` is then a lower bound of the optimum that diffusion
    raises towards the LP relaxation's (equal to the DP optimum on the tree-like graphs of real
    models: BERT-base at p = 8 goes from 69% to 100% of it in 30 rounds); it is what
    ``pareto_frontier(time_limit_s=)`` prunes with. With ``weight_s_per_byte`` :math:`w`, the
    diffused node terms are :math:`t_i + w m_i` and :math:`w m_i` is taken back off afterwards
    (node times may then be negative; edges stay >= 0), for the weighted bound
    (``pareto_frontier(limit_weight_s_per_byte=w)``). Tables with a negative or infinite time or
    memory are returned unchanged. Past ``deadline_s`` (a ``time.perf_counter()`` value) no further
    round starts: fewer rounds keep every :math:`T(c)`, only the bound is weaker (a ConvNeXt export at
    64 devices: 30 rounds over its 1e8 edge cells took 15 s of a 13 s pick).
    """
    import time

    times = [*tables.node_time_s, *(e.time_s for e in tables.edges), *tables.node_memory_bytes]
    if not all(np.isfinite(a).all() and not (a < 0).any() for a in times):
        return tables
    weight = float(weight_s_per_byte)
    node = [np.array(t, dtype=np.float64) + weight * m for t, m in zip(tables.node_time_s, tables.node_memory_bytes)]
    edge = [np.array(e.time_s, dtype=np.float64) for e in tables.edges]
    incident: list[list[tuple[int, int]]] = [[] for _ in node]
    for k, e in enumerate(tables.edges):
        incident[e.u].append((k, 1))  # the op's configurations are the rows: minimise over columns
        incident[e.v].append((k, 0))
    for _ in range(rounds):
        if deadline_s is not None and time.perf_counter() > deadline_s:
            break
        for i, edges_here in enumerate(incident):
            if not edges_here:
                continue
            minima = [edge[k].min(axis=axis) for k, axis in edges_here]
            mean = (node[i] + sum(minima)) / (len(minima) + 1)
            for (k, axis), least in zip(edges_here, minima):
                edge[k] += (mean - least)[:, None] if axis == 1 else (mean - least)[None, :]
            node[i] = mean
    for k, e in enumerate(tables.edges):
        rows = edge[k].min(axis=1)
        edge[k] -= rows[:, None]
        node[e.u] = node[e.u] + rows
        columns = edge[k].min(axis=0)
        edge[k] -= columns[None, :]
        node[e.v] = node[e.v] + columns
    for a in edge:
        np.maximum(a, 0.0, out=a)  # rounding may leave -1e-19: edges stay >= 0
    if weight:
        node = [h - weight * m for h, m in zip(node, tables.node_memory_bytes)]
    return CostTables(
        configs=tables.configs,
        node_time_s=tuple(node),
        node_memory_bytes=tables.node_memory_bytes,
        edges=tuple(EdgeCost(u=e.u, v=e.v, time_s=a) for e, a in zip(tables.edges, edge)),
        constant_time_s=tables.constant_time_s,
        constant_memory_bytes=tables.constant_memory_bytes,
        blocks=tables.blocks,
    )


def _dual_weight(points: list[FrontierPoint], limit: float) -> float:
    r"""The weight :math:`w \ge 0` (seconds per byte) maximising the Lagrangian bound of the listed
    points, :math:`\min_p T_p + w (M_p - L)`: the slope of their lower hull at the limit (0 when no
    listed point is over the limit). Any :math:`w \ge 0` keeps the pruning exact; this one makes it
    tight where the listed points are near the frontier."""
    times = np.array([p.time_s for p in points], dtype=np.float64)
    memories = np.array([p.memory_bytes for p in points], dtype=np.float64)
    ok = np.isfinite(times) & np.isfinite(memories)
    times, memories = times[ok], memories[ok]
    inside, over = memories <= limit, memories > limit
    if not over.any() or not inside.any():
        return 0.0
    a_t, a_m = times[inside][:, None], memories[inside][:, None]
    b_t, b_m = times[over][None, :], memories[over][None, :]
    slopes = ((a_t - b_t) / (b_m - a_m)).ravel()
    candidates = np.unique(np.concatenate(([0.0], slopes[np.isfinite(slopes) & (slopes > 0)])))
    bounds = (times[None, :] + candidates[:, None] * (memories[None, :] - limit)).min(axis=1)
    return float(candidates[int(np.argmax(bounds))])


def _flat_order(plan: EliminationPlan) -> list[int]:
    """Every op in the order ``plan`` eliminates them, its reused regions spelled out per instance."""
    order: list[int] = []
    for region in plan.regions:
        order += region.order
        for renaming in region.renamings:
            order += [renaming[v] for v in region.order]
    return order + list(plan.order)


def _fastest_listed(points: tuple[FrontierPoint, ...], limit: float) -> FrontierPoint | None:
    fitting = [p for p in points if p.memory_bytes <= limit and np.isfinite(p.time_s)]
    return min(fitting, key=lambda p: (p.time_s, p.memory_bytes)) if fitting else None


def fastest_within_exact(
    tables: CostTables,
    memory_limit_bytes: float,
    *,
    frontier: FrontierResult | None = None,
    candidates: np.ndarray | None = None,
    plan: EliminationPlan | None = None,
    max_work: float | None = DEFAULT_MAX_WORK,
    time_lower_bound_s: float | None = None,
    deadline_s: float | None = None,
    max_memory_bytes: float | None = None,
) -> ConstrainedPick:
    """The fastest choice with memory per device <= ``memory_limit_bytes``, proven exact.

    Parameters
    ----------
    tables:
        The search problem.
    memory_limit_bytes:
        Bytes per device.
    frontier:
        A frontier already found for ``tables`` (any method): its points are the first incumbents,
        and its ``memory_bound_factor`` may prove the pick without a solve.
    candidates:
        ``(n, num_ops)`` more choices to start from (e.g. a restricted search's points).
    plan:
        Elimination plan of ``tables`` for the exact elimination (default: chosen).
    max_work:
        Budget of the exact elimination (summed entries); ``None``: none. When it runs out, the
        result is the best incumbent with ``proven=False``.
    time_lower_bound_s:
        A time no choice beats, proven by the caller (e.g. the exact unconstrained minimum of
        :func:`planner.search.elimination.solve_min`): an incumbent that reaches it is optimal.
    deadline_s:
        ``time.perf_counter()`` value past which the exact elimination stops (as when
        ``max_work`` runs out: the incumbent, ``proven=False``); ``None``: none.
    max_memory_bytes:
        Bytes the least-memory step's DP may take (:func:`min_memory`); ``None``: no cap.

    Returns
    -------
    ConstrainedPick
        See the module docstring for the three proofs.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.exhaustive import exhaustive_frontier
    >>> tables = chain_tables([3, 4, 2, 5], seed=7)
    >>> oracle = exhaustive_frontier(tables).points
    >>> limit = oracle[len(oracle) // 2].memory_bytes
    >>> pick = fastest_within_exact(tables, limit)
    >>> pick.proven, pick.point.time_s == min(p.time_s for p in oracle if p.memory_bytes <= limit)
    (True, True)
    """
    check_tables(tables)
    limit = float(memory_limit_bytes)
    if not limit > 0 or not np.isfinite(limit):
        raise InputError(f"the memory limit must be a positive number of bytes (got {memory_limit_bytes})")
    least = min_memory(tables, deadline_s=deadline_s, max_memory_bytes=max_memory_bytes)
    if not least.memory_bytes <= limit:  # proof 1
        return _pick(limit, least, None, "no strategy fits")
    listed = _listed_points(tables, least, frontier, candidates)
    incumbent = _fastest_listed(tuple(listed), limit)
    assert incumbent is not None  # the least-memory choice fits
    if _listed_bound_proves(incumbent, limit, frontier, time_lower_bound_s):  # proof 2
        return _pick(limit, least, incumbent, "frontier bound")
    weight = _dual_weight(listed, limit)
    shifted = reparameterized(tables, weight_s_per_byte=weight, deadline_s=deadline_s)
    if plan is None:
        plan = plan_elimination(tables)
    if shifted is not tables:
        # the shifted arrays differ between block instances (no reuse), but the blocks' order stays good
        plan = plan_elimination(shifted, order=_flat_order(plan))
    work = float(max_work or 0.0)
    incumbent, proven = _relaxed_bound(tables, shifted, plan, limit, incumbent, weight, max_work, deadline_s)
    if proven:  # proof 3a
        return _pick(limit, least, incumbent, "relaxed bound", work)
    best = _pruned_exact(tables, shifted, plan, limit, incumbent, weight, max_work, deadline_s)
    if best is None:
        return _pick(limit, least, incumbent, "not proven", work)
    return _pick(limit, least, best, "pruned exact elimination", work)  # proof 3


def _pick(limit: float, least: MinMemory, point: FrontierPoint | None, proof: ProofName, work: float = 0.0) -> ConstrainedPick:
    """The result of :func:`fastest_within_exact` (proven unless ``proof`` is ``not proven``)."""
    return ConstrainedPick(
        memory_limit_bytes=limit, point=point, min_memory_bytes=least.memory_bytes, proven=proof != "not proven",
        proof=proof, work=work,
    )  # fmt: skip


def _listed_points(
    tables: CostTables, least: MinMemory, frontier: FrontierResult | None, candidates: np.ndarray | None
) -> list[FrontierPoint]:
    """The first incumbents: the frontier's points, the least-memory choice and the caller's
    ``candidates`` (priced on ``tables``)."""
    assert least.choice is not None
    listed = list(frontier.points) if frontier is not None else []
    listed.append(FrontierPoint(time_s=least.time_s, memory_bytes=least.memory_bytes, choice=least.choice))
    if candidates is not None and len(candidates):
        picks = np.asarray(candidates, dtype=np.int64).reshape(-1, tables.num_ops)
        times, memories = evaluate_many(tables, picks)
        listed += [FrontierPoint(time_s=float(t), memory_bytes=float(m), choice=c) for t, m, c in zip(times, memories, picks)]
    return listed


def _listed_bound_proves(
    incumbent: FrontierPoint, limit: float, frontier: FrontierResult | None, time_lower_bound_s: float | None
) -> bool:
    """Proof 2: the incumbent reaches the caller's lower bound on time, or the frontier's points
    within ``beta * limit`` (a lower bound of the optimum) are no faster than it."""
    if time_lower_bound_s is not None and incumbent.time_s <= time_lower_bound_s:
        return True
    beta = frontier.memory_bound_factor if frontier is not None else None
    if beta is None or not np.isfinite(beta) or frontier is None:
        return False
    reach = beta * limit * (1.0 + _ROUNDING)
    lower = min((p.time_s for p in frontier.points if p.memory_bytes <= reach), default=-np.inf)
    return lower >= incumbent.time_s


def _relaxed_bound(
    tables: CostTables,
    shifted: CostTables,
    plan: EliminationPlan,
    limit: float,
    incumbent: FrontierPoint,
    weight: float,
    max_work: float | None,
    deadline_s: float | None,
) -> tuple[FrontierPoint, bool]:
    """Proof 3a: relaxed frontiers (least memory per bucket) at each of ``_RELAXED_EPSILONS`` bound
    the optimum from below, and their real choices may beat the incumbent. Returns the incumbent
    (improved) and whether the bound reached it."""
    from planner.search.frontier import FrontierTooCostly, relaxed_points

    for epsilon in _RELAXED_EPSILONS:
        try:
            lower_s, lower_bytes, traced = relaxed_points(
                shifted, epsilon=epsilon, memory_limit_bytes=limit, time_limit_s=incumbent.time_s,
                limit_weight_s_per_byte=weight, plan=plan, max_work=max_work, deadline_s=deadline_s,
            )  # fmt: skip
        except FrontierTooCostly:
            break
        times, memories = evaluate_many(tables, traced)
        for t, m, c in zip(times, memories, traced):  # its real choices may beat the incumbent
            if m <= limit and (float(t), float(m)) < (incumbent.time_s, incumbent.memory_bytes):
                incumbent = FrontierPoint(time_s=float(t), memory_bytes=float(m), choice=c)
        within = lower_bytes <= limit * (1.0 + _ROUNDING)
        bound_s = float(lower_s[within].min()) if within.any() else np.inf
        if bound_s >= incumbent.time_s * (1.0 - 1e-12):
            return incumbent, True
    return incumbent, False


def _pruned_exact(
    tables: CostTables,
    shifted: CostTables,
    plan: EliminationPlan,
    limit: float,
    incumbent: FrontierPoint,
    weight: float,
    max_work: float | None,
    deadline_s: float | None,
) -> FrontierPoint | None:
    """Proof 3: the exact elimination of ``shifted`` pruned to the limit and the incumbent's time;
    its fastest point within the limit priced on ``tables`` (the incumbent when none is faster).
    ``None`` when the budget or deadline ran out."""
    from planner.search.frontier import FrontierTooCostly, pareto_frontier

    try:
        exact = pareto_frontier(
            shifted, epsilon=0.0, max_points=1 << 40, plan=plan, max_work=max_work,
            memory_limit_bytes=limit, time_limit_s=incumbent.time_s, deadline_s=deadline_s,
            limit_weight_s_per_byte=weight,
        )  # fmt: skip
    except FrontierTooCostly:
        return None
    except InputError as too_large:
        if "memory levels" not in str(too_large):
            raise
        return None
    if not exact.exact:
        return None
    # the same choices priced on the given tables (the shifted ones differ in the last bits)
    choices = np.stack([p.choice for p in exact.points]) if exact.points else np.zeros((0, tables.num_ops), np.int64)
    times, memories = evaluate_many(tables, choices)
    repriced = tuple(FrontierPoint(time_s=float(t), memory_bytes=float(m), choice=c) for t, m, c in zip(times, memories, choices))
    best = _fastest_listed(repriced, limit)
    if best is None or (incumbent.time_s, incumbent.memory_bytes) <= (best.time_s, best.memory_bytes):
        best = incumbent  # the pruned elimination keeps only points no slower than the incumbent
    return best
