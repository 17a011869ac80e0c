r"""PaSE DP: the exact minimum of one objective, by variable elimination in (min,+) algebra.

Minimise :math:`f(c) = \sum_i \phi_i(c_i) + \sum_{(u,v)} t_{uv}(c_u, c_v)` with
:math:`\phi_i = t_i + w\, m_i` (``objective="time"``, :math:`w` = ``memory_weight_s_per_byte``).
Every factor is a dense numpy array over the configurations of its ops (its *scope*). Eliminating
op :math:`v` (:func:`_eliminate`) adds the factors that touch it on the axes
:math:`(v, D(v))`, aligned by broadcasting, and keeps the minimum over :math:`v` and its argmin:

.. math::

    \tau_v(c_D) = \min_{c_v} \sum_{\phi \ni v} \phi(c_v, c_D), \qquad
    a_v(c_D) = \operatorname{argmin}_{c_v} \ldots

(in chunks of :math:`c_v` so no table larger than ``_CHUNK_CELLS`` cells is ever materialised
beyond the result). After the last op the remaining scalars sum to the optimum; the choices are
read back from the argmin tables in reverse (:func:`_back_substitute`), parents before children.
Ties go to the lowest configuration index, so runs are deterministic.

``objective="memory"`` minimises memory and, among the minimum-memory choices, time: memory is a
sum of per-op terms, so its minimisers are exactly the product of each op's minimisers, and the DP
runs on the tables restricted to those (:func:`planner.search.restrict.restrict`).

Block reuse and the order come from :func:`planner.search.blocks.plan_elimination`.

References
----------
V. Elango, "PaSE: Parallelization Strategies for Efficient DNN Training", IPDPS 2021, Sec. IV.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables
from planner.search.blocks import EliminationPlan, execute_plan, plan_elimination
from planner.search.ordering import OrderChoice
from planner.search.problem import check_tables, evaluate_many
from planner.search.restrict import restrict
from planner.search.results import DPResult

__all__ = ["solve_min", "DPResult"]

# Work on at most this many cells at once while minimising (float64: 32 MiB per temporary).
_CHUNK_CELLS = 1 << 22
# Results at least this large are minimised by a loop over the eliminated op's configurations.
_LOOP_MIN_CELLS = 1 << 14
# Refuse a single result table above this (float64 + index: about 3 GiB).
_MAX_RESULT_CELLS = 1 << 28


def _index_dtype(size: int) -> type[np.unsignedinteger]:
    """Smallest unsigned dtype that holds configuration indices ``0..size-1``."""
    if size <= 1 << 8:
        return np.uint8
    if size <= 1 << 16:
        return np.uint16
    return np.uint32


class _Table:
    """A dense factor; if produced by eliminating an op, also how to recover that op's choice."""

    __slots__ = ("scope", "values", "var", "argmin", "children")

    def __init__(
        self,
        scope: tuple[int, ...],
        values: np.ndarray,
        var: int | None = None,
        argmin: np.ndarray | None = None,
        children: tuple["_Table", ...] = (),
    ) -> None:
        self.scope = scope
        self.values = values
        self.var = var
        """Op whose elimination produced this table (``None`` for an input table)."""
        self.argmin = argmin
        """Best configuration of ``var`` for each cell of ``scope``."""
        self.children = children
        """Produced tables consumed when ``var`` was eliminated (to visit after it)."""

    def renamed(self, rho: Mapping[int, int], memo: dict[int, object]) -> "_Table":
        if self.var is None:
            return self  # input tables carry no choice; nothing to rename
        key = id(self)
        if key not in memo:
            memo[key] = _Table(
                tuple(rho[v] for v in self.scope),
                self.values,
                rho[self.var],
                self.argmin,
                tuple(c.renamed(rho, memo) for c in self.children),
            )
        return memo[key]  # type: ignore[return-value]


def _align(values: np.ndarray, scope: tuple[int, ...], target: tuple[int, ...]) -> np.ndarray:
    """View of ``values`` with one axis per ``target`` op (size 1 where ``scope`` lacks it)."""
    present = [x for x in target if x in scope]
    moved = values.transpose([scope.index(x) for x in present]) if values.ndim > 1 else values
    shape = [values.shape[scope.index(x)] if x in scope else 1 for x in target]
    return moved.reshape(shape)


def _eliminate(v: int, factors: list[_Table], sizes: np.ndarray) -> _Table:
    """Minimise op ``v`` out of the sum of ``factors`` (all touching ``v``).

    Small results: one table over ``(D, v)`` with ``v`` last, so the argmin runs along contiguous
    memory (in chunks of the first dependent op). Large results: a loop over ``v`` that keeps a
    running minimum in place, touching each result cell a few times per configuration of ``v``.
    """
    dependent = tuple(sorted({x for f in factors for x in f.scope} - {v}))
    target = (*dependent, v)
    out_shape = tuple(int(sizes[x]) for x in dependent)
    out_cells = int(np.prod(out_shape, dtype=np.int64))
    if out_cells > _MAX_RESULT_CELLS:
        raise InputError(
            f"eliminating op {v} needs a table of {out_cells:.3g} cells; the problem is too large "
            "for exact search: coarsen the graph, restrict configurations, or use NSGA-II"
        )
    aligned = [_align(f.values, f.scope, target) for f in factors]
    k_v = int(sizes[v])
    if out_cells >= _LOOP_MIN_CELLS and k_v > 1:
        best, best_arg = _min_by_loop(aligned, out_shape, k_v)
    else:
        best, best_arg = _min_by_chunks(aligned, out_shape, k_v)
    produced = tuple(f for f in factors if f.var is not None)
    return _Table(dependent, best, v, best_arg.astype(_index_dtype(k_v)), produced)


def _min_by_chunks(aligned: list[np.ndarray], out_shape: tuple[int, ...], k_v: int) -> tuple[np.ndarray, np.ndarray]:
    """Min and argmin over the last axis of the broadcast sum, in chunks of the first axis."""
    if not out_shape:
        acc = np.zeros(k_v)
        for a in aligned:
            acc += a
        arg = np.asarray(acc.argmin())
        return np.asarray(acc[arg]), arg
    rest = int(np.prod(out_shape[1:], dtype=np.int64)) * k_v
    step = max(1, _CHUNK_CELLS // max(rest, 1))
    best = np.empty(out_shape)
    best_arg = np.empty(out_shape, dtype=np.int64)
    for start in range(0, out_shape[0], step):
        stop = min(out_shape[0], start + step)
        acc = np.zeros((stop - start, *out_shape[1:], k_v))
        for a in aligned:
            acc += a[start:stop] if a.shape[0] > 1 else a
        arg = acc.argmin(axis=-1)
        best_arg[start:stop] = arg
        best[start:stop] = np.take_along_axis(acc, arg[..., None], axis=-1)[..., 0]
    return best, best_arg


def _min_by_loop(aligned: list[np.ndarray], out_shape: tuple[int, ...], k_v: int) -> tuple[np.ndarray, np.ndarray]:
    """Min and argmin over the last axis, one configuration of ``v`` at a time (in place)."""
    best = np.full(out_shape, np.inf)
    best_arg = np.zeros(out_shape, dtype=np.int64)
    tmp = np.empty(out_shape)
    better = np.empty(out_shape, dtype=bool)
    for c in range(k_v):
        tmp.fill(0.0)
        for a in aligned:
            tmp += a[..., c] if a.shape[-1] > 1 else a[..., 0]
        np.less(tmp, best, out=better)  # strict: the lowest index wins ties
        if c == 0:
            better.fill(True)  # an all-infinite column still needs an argmin
        np.copyto(best, tmp, where=better)
        best_arg[better] = c
    return best, best_arg


def _back_substitute(roots: Sequence[_Table], num_ops: int) -> np.ndarray:
    """Read every op's choice from the argmin tables, parents before children."""
    choice = np.full(num_ops, -1, dtype=np.int64)
    stack = list(reversed(roots))
    while stack:
        table = stack.pop()
        if table.var is None:
            continue
        assert table.argmin is not None
        cell = tuple(int(choice[d]) for d in table.scope)
        choice[table.var] = int(table.argmin[cell])
        stack.extend(reversed(table.children))
    return choice


def _solve(tables: CostTables, plan: EliminationPlan, node_cost: Sequence[np.ndarray]) -> tuple[np.ndarray, float]:
    sizes = np.array([t.shape[0] for t in node_cost], dtype=np.int64)
    factors = [_Table((i,), np.asarray(c, dtype=np.float64)) for i, c in enumerate(node_cost)]
    factors += [
        _Table((e.u, e.v), np.asarray(e.time_s, dtype=np.float64)) for e in tables.edges
    ]
    roots = execute_plan(plan, factors, lambda v, fs: _eliminate(v, fs, sizes))
    value = float(sum(float(r.values) for r in roots))
    choice = _back_substitute(roots, tables.num_ops)
    if (choice < 0).any():
        raise RuntimeError("internal error: an op was never eliminated")
    return choice, value


def solve_min(
    tables: CostTables,
    *,
    objective: Literal["time", "memory"] = "time",
    memory_weight_s_per_byte: float = 0.0,
    order: Sequence[int] | OrderChoice | None = None,
    use_blocks: bool = True,
) -> DPResult:
    r"""The exact minimum of time (optionally + weighted memory) or of memory, by PaSE's DP.

    Parameters
    ----------
    tables:
        The search problem.
    objective:
        ``"time"``: minimise :math:`T + w M` (seconds). ``"memory"``: minimise :math:`M` (bytes),
        ties broken by the least time.
    memory_weight_s_per_byte:
        :math:`w` in seconds per byte (``time`` objective only; 0 = time alone).
    order:
        Elimination order of all ops (or an :class:`OrderChoice`); default: the best of the
        heuristics, with block reuse when ``tables.blocks`` make it pay.
    use_blocks:
        Allow block reuse when choosing the order.

    Returns
    -------
    DPResult
        ``choice``, its ``time_s`` and ``memory_bytes`` (from ``tables.evaluate``), the minimised
        ``value``, the order's name and largest table. An infinite ``value`` means every choice has
        an infinite (infeasible) cost.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.exhaustive import exhaustive_min
    >>> tables = chain_tables([3, 4, 2, 5], seed=7, extra_edges=[(0, 3)])
    >>> solve_min(tables).value == exhaustive_min(tables).value
    True
    """
    check_tables(tables)
    if objective not in ("time", "memory"):
        raise InputError(f"objective must be 'time' or 'memory' (got {objective!r})")
    if not np.isfinite(memory_weight_s_per_byte) or memory_weight_s_per_byte < 0:
        raise InputError(
            f"memory_weight_s_per_byte must be finite and >= 0 (got {memory_weight_s_per_byte})"
        )
    if objective == "memory":
        masks = [m == m.min() for m in tables.node_memory_bytes]
        sub = restrict(tables, masks)
        inner = solve_min(sub.tables, objective="time", order=order, use_blocks=use_blocks)
        choice = sub.to_original(inner.choice)
        time_s, memory = (float(x[0]) for x in evaluate_many(tables, choice[None, :]))
        value = tables.constant_memory_bytes + float(sum(float(m.min()) for m in tables.node_memory_bytes))
        return DPResult(
            choice=choice,
            time_s=time_s,
            memory_bytes=memory,
            value=value,
            order_name=inner.order_name,
            max_table_cells=inner.max_table_cells,
        )
    plan = plan_elimination(tables, order=order, use_blocks=use_blocks)
    weight = float(memory_weight_s_per_byte)
    node_cost = [
        t + weight * m if weight else t for t, m in zip(tables.node_time_s, tables.node_memory_bytes)
    ]
    choice, value = _solve(tables, plan, node_cost)
    value += tables.constant_time_s + weight * tables.constant_memory_bytes
    time_s, memory = (float(x[0]) for x in evaluate_many(tables, choice[None, :]))
    return DPResult(
        choice=choice,
        time_s=time_s,
        memory_bytes=memory,
        value=value,
        order_name=plan.name,
        max_table_cells=plan.max_table_cells,
    )
