r"""Ops that feed every layer: fix them, with a proven bound, so the layers eliminate block by block.

A causal mask built once and read by every attention, rotary or position tables, an encoder's
output read by every decoder layer: such an op :math:`S` (outside every block instance, with edges
into two or more instances of one block group, :func:`find_shared_ops`) joins all the layers in one
elimination: every table of a layer carries :math:`S`'s :math:`K_S` configurations, and block reuse
(:mod:`planner.search.blocks`) sees :math:`S` in each layer's separator.

Fixing :math:`S` to one configuration :math:`s_0` cuts its edges: each edge :math:`(S, v)` becomes
a unary cost :math:`t_{Sv}(s_0, \cdot)` of :math:`v` (:func:`fix_ops`), :math:`S` keeps one row, and
the layers are independent again, so block reuse holds. What it may cost is bounded: switching any
strategy :math:`c` from :math:`c_S` to :math:`s_0` changes its time by at most

.. math::

    \pi(c_S \to s_0) = t_S(s_0) - t_S(c_S)
        + \sum_{(S,v)} \max_{c_v} \big(t_{Sv}(s_0, c_v) - t_{Sv}(c_S, c_v)\big)

(each edge's worst case over the configurations of its other op) and its memory by
:math:`m_S(s_0) - m_S(c_S)`. So for every Pareto-optimal :math:`(T^*, M^*)` of the full problem there
is a strategy with :math:`S = s_0` within :math:`\Delta_T = \max_{c_S} \pi(c_S \to s_0)` seconds and
:math:`\Delta_M = \max_{c_S} (m_S(s_0) - m_S(c_S))` bytes of it (summed over the fixed ops, each
switched in turn). :func:`best_rows` picks the :math:`s_0` of least :math:`\Delta_T` (then
:math:`\Delta_M`). When both are 0 (:math:`s_0` dominates every other row: no slower, no larger, no
dearer an edge to any configuration) the fixed problem has the same optimum and the same frontier:
the fix is exact, and the notes say so; otherwise they quote the bound.

References
----------
The bound is the usual exchange argument of variable fixing in (min,+) problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from planner.core.tables import CostTables, EdgeCost
from planner.search.problem import interaction_graph

__all__ = ["SharedOp", "Fixed", "find_shared_ops", "switch_penalties", "best_rows", "fix_ops", "decouple"]

# Rows of S compared at once when bounding the switch penalties (a (chunk, K_S, K_v) temporary).
_CHUNK_CELLS = 1 << 23


@dataclass(frozen=True, slots=True, kw_only=True)
class SharedOp:
    """An op outside a block group that feeds several of its instances."""

    op: int
    group: str
    instances: int
    """Instances of the group it has an edge into."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fixed:
    """Tables with some ops fixed to one configuration, and how far that may be from the full problem."""

    tables: CostTables
    rows: dict[int, int]
    """Fixed op -> its configuration (row in the original tables)."""
    time_gap_s: float
    """:math:`\\Delta_T`: every Pareto point of the full problem has a point of the fixed one at most this much slower (s)."""
    memory_gap_bytes: float
    """:math:`\\Delta_M`: ... and at most this much larger (bytes per device)."""

    @property
    def exact(self) -> bool:
        """The fixed problem has the full problem's optimum and frontier."""
        return self.time_gap_s <= 0 and self.memory_gap_bytes <= 0

    def to_original(self, choice: Sequence[int] | np.ndarray) -> np.ndarray:
        """A choice of the fixed tables as original configuration indices."""
        picks = np.array(choice, dtype=np.int64)
        for op, row in self.rows.items():
            picks[op] = row
        return picks

    def to_fixed(self, choice: Sequence[int] | np.ndarray) -> np.ndarray:
        """An original choice with the fixed ops moved to their row (index 0 of the fixed tables)."""
        picks = np.array(choice, dtype=np.int64)
        for op in self.rows:
            picks[op] = 0
        return picks


def find_shared_ops(tables: CostTables, graph: nx.Graph | None = None) -> tuple[SharedOp, ...]:
    """Ops outside every instance of a block group with edges into at least two of its instances.

    Examples
    --------
    >>> from planner.search.synthetic import transformer_tables
    >>> find_shared_ops(transformer_tables(3, devices=4, batch=2, seq=4, hidden=4))  # a plain chain
    ()
    """
    graph = interaction_graph(tables) if graph is None else graph
    found: dict[int, SharedOp] = {}
    for group in tables.blocks:
        where = {op: k for k, instance in enumerate(group.instances) for op in instance}
        for v in graph:
            if v in where or v in found:
                continue
            reached = {where[u] for u in graph[v] if u in where}
            if len(reached) >= 2:
                found[v] = SharedOp(op=v, group=group.name, instances=len(reached))
    return tuple(found[v] for v in sorted(found))


def _oriented(tables: CostTables, op: int) -> list[np.ndarray]:
    """Each edge table touching ``op`` as ``(K_op, K_other)``."""
    return [e.time_s if e.u == op else e.time_s.T for e in tables.edges if op in (e.u, e.v)]


def switch_penalties(tables: CostTables, op: int) -> np.ndarray:
    r"""``(K, K)`` seconds: ``P[c, s]`` bounds the time a strategy gains by switching ``op`` from row
    ``c`` to row ``s`` (:math:`\pi(c \to s)` in the module docstring; the diagonal is 0).

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> tables = chain_tables([2, 3], seed=1)
    >>> P = switch_penalties(tables, 0)
    >>> e, t = tables.edges[0].time_s, tables.node_time_s[0]
    >>> bool(P[1, 0] == t[0] - t[1] + (e[0] - e[1]).max())
    True
    """
    node = np.asarray(tables.node_time_s[op], dtype=np.float64)
    penalty = node[None, :] - node[:, None]  # [c, s] = t(s) - t(c)
    counts: dict[int, tuple[np.ndarray, int]] = {}
    for table in _oriented(tables, op):  # identical arrays (every layer's copy) computed once
        key = id(table)
        counts[key] = (table, counts[key][1] + 1) if key in counts else (table, 1)
    k = node.shape[0]
    for table, times in counts.values():
        step = max(1, _CHUNK_CELLS // max(1, table.size))
        worst = np.empty((k, k))
        for start in range(0, k, step):
            rows = table[start : start + step]  # candidate rows s
            # [s, c] = max over the other op's configurations of t(s, .) - t(c, .)
            worst[start : start + step] = (rows[:, None, :] - table[None, :, :]).max(axis=2)
        penalty += times * worst.T
    np.fill_diagonal(penalty, 0.0)
    return penalty


def best_rows(tables: CostTables, op: int) -> tuple[int, float, float]:
    """The row of ``op`` with the least worst-case switch penalty: ``(row, time gap s, memory gap bytes)``.

    Ties go to the smaller memory gap, then the lowest row.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> row, time_gap, memory_gap = best_rows(chain_tables([3, 4], seed=2), 0)
    >>> 0 <= row < 3 and time_gap >= 0 and memory_gap >= 0
    True
    """
    penalty = switch_penalties(tables, op)
    memory = np.asarray(tables.node_memory_bytes[op], dtype=np.float64)
    finite = np.isfinite(np.asarray(tables.node_time_s[op])) & np.isfinite(memory)
    # only strategies of finite cost need a partner: infinite rows are never Pareto-optimal
    time_gap = np.where(finite[:, None], penalty, -np.inf).max(axis=0)
    memory_gap = memory - memory[finite].min() if finite.any() else np.zeros_like(memory)
    time_gap = np.where(finite, np.maximum(time_gap, 0.0), np.inf)
    order = np.lexsort((np.arange(memory.size), memory_gap, time_gap))
    row = int(order[0])
    return row, float(time_gap[row]), float(max(0.0, memory_gap[row]))


def fix_ops(tables: CostTables, ops: Sequence[int]) -> Fixed:
    """Fix each op of ``ops`` to its :func:`best_rows` row and fold its edges into its neighbours.

    Returns
    -------
    Fixed
        Tables of the same ops (each fixed op keeps one configuration and no edge), the rows, and
        the summed bounds.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.exhaustive import exhaustive_min
    >>> tables = chain_tables([3, 4, 2], seed=5)
    >>> fixed = fix_ops(tables, [1])
    >>> full, mine = exhaustive_min(tables).time_s, exhaustive_min(fixed.tables).time_s
    >>> full <= mine <= full + fixed.time_gap_s
    True
    """
    current = tables
    rows: dict[int, int] = {}
    time_gap = memory_gap = 0.0
    for op in ops:
        row, t_gap, m_gap = best_rows(current, op)
        rows[op] = row
        time_gap += t_gap
        memory_gap += m_gap
        current = _fold(current, op, row)
    return Fixed(tables=current, rows=rows, time_gap_s=time_gap, memory_gap_bytes=memory_gap)


def _fold(tables: CostTables, op: int, row: int) -> CostTables:
    """``op`` restricted to ``row``; its edges added to its neighbours' node times (shared arrays
    stay shared: every layer's identical edge gives one folded array per identical node array)."""
    node_time = list(tables.node_time_s)
    memo: dict[tuple[int, int, bool], np.ndarray] = {}
    kept: list[EdgeCost] = []
    for e in tables.edges:
        if op not in (e.u, e.v):
            kept.append(e)
            continue
        other = e.v if e.u == op else e.u
        part = e.time_s[row, :] if e.u == op else e.time_s[:, row]
        key = (id(node_time[other]), id(e.time_s), e.u == op)
        if key not in memo:
            memo[key] = node_time[other] + part
        node_time[other] = memo[key]
    node_time[op] = np.asarray(tables.node_time_s[op][[row]], dtype=np.float64)
    node_memory = list(tables.node_memory_bytes)
    node_memory[op] = np.asarray(tables.node_memory_bytes[op][[row]], dtype=np.float64)
    configs = list(tables.configs)
    configs[op] = configs[op].subset(np.array([row], dtype=np.int64))
    return CostTables(
        configs=tuple(configs),
        node_time_s=tuple(node_time),
        node_memory_bytes=tuple(node_memory),
        edges=tuple(kept),
        constant_time_s=tables.constant_time_s,
        constant_memory_bytes=tables.constant_memory_bytes,
        blocks=tables.blocks,
    )


def decouple(tables: CostTables, *, fits) -> tuple[Fixed, tuple[SharedOp, ...]] | None:
    """Fix the shared ops when the full problem does not fit and fixing them lowers the work.

    Parameters
    ----------
    tables:
        The problem.
    fits:
        ``(tables, plan, estimate) -> bool``: whether the caller's best search of ``tables`` fits
        its budget (then nothing is fixed: the full problem stays exact).

    Returns
    -------
    tuple or None
        ``(Fixed, the shared ops)``, or ``None`` when there is no shared op, the full problem fits,
        or fixing does not reduce the predicted work.
    """
    from planner.search.blocks import plan_elimination
    from planner.search.budget import estimate_plan

    shared = find_shared_ops(tables)
    if not shared:
        return None
    plan = plan_elimination(tables)
    estimate = estimate_plan(tables, plan)
    if fits(tables, plan, estimate):
        return None
    fixed = fix_ops(tables, [s.op for s in shared])
    fixed_plan = plan_elimination(fixed.tables)
    if estimate_plan(fixed.tables, fixed_plan).work_cells >= estimate.work_cells:
        return None
    return fixed, shared
