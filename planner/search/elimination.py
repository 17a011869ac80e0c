r"""PaSE DP: the exact minimum of one objective, by variable elimination in (min,+) algebra.

Minimise :math:`f(c) = \sum_i \phi_i(c_i) + \sum_{(u,v)} t_{uv}(c_u, c_v)` with
:math:`\phi_i = t_i + w\, m_i` (``objective="time"``, :math:`w` = ``memory_weight_s_per_byte``).
Every factor is a dense numpy array over the configurations of its ops (its *scope*). Eliminating
op :math:`v` (:func:`_eliminate`) adds the factors that touch it on the axes
:math:`(v, D(v))`, aligned by broadcasting, and keeps the minimum over :math:`v`:

.. math::

    \tau_v(c_D) = \min_{c_v} \sum_{\phi \ni v} \phi(c_v, c_D)

When :math:`D(v)` splits into two groups that no factor spans (an op between its producers and its
consumers), :math:`\tau_v` is a (min,+) matrix product, computed with bounds that skip the terms
which cannot be minimal (:func:`_min_plus`); otherwise by chunks or a running minimum over
:math:`c_v`, so no table larger than ``_CHUNK_CELLS`` cells is materialised beyond the result.
After the last op the remaining scalars sum to the optimum. The choices are read back in reverse
(:func:`_back_substitute`), parents before children: each op's choice is the argmin of the factors
it was eliminated with, at its dependent ops' chosen cell (large eliminations keep no argmin table;
small ones store it, cheaper than recomputing). Ties go to the lowest configuration index, so runs
are deterministic.

``objective="memory"`` minimises memory and, among the minimum-memory choices, time: memory is a
sum of per-op terms, so its minimisers are exactly the product of each op's minimisers, and the DP
runs on the tables restricted to those (:func:`planner.search.restrict.restrict`).

Block reuse and the order come from :func:`planner.search.blocks.plan_elimination`.

References
----------
V. Elango, "PaSE: Parallelization Strategies for Efficient DNN Training", IPDPS 2021, Sec. IV.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import networkx as nx
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
# Sums up to this many cells take numpy's argmin along v directly: below it, the three passes of _first_argmin cost
# more in calls than they save (medians on random tables, 2026-12-02, h27d: 0.08 against 0.11 ms at 40 x 200 cells).
_ARGMIN_DIRECT_CELLS = 1 << 13
# Results at least this large are minimised by a loop over the eliminated op's configurations.
_LOOP_MIN_CELLS = 1 << 14
# Refuse a single result table above this (float64: 2 GiB).
_MAX_RESULT_CELLS = 1 << 28
# ... or with more axes than a numpy array holds (64 in numpy 2: the eliminated op and its neighbours),
# which many ops of one configuration each reach within the cell limit (a 66-axis table crashed numpy).
_MAX_TABLE_AXES = 64
# Eliminations with at least this much work (result cells x configurations) and product structure
# use the bounded (min,+) product.
_MIN_PLUS_MIN_WORK = 1 << 22
# Candidates per row for its upper bound, and columns per coarse and per narrow bounded block
# (measured on GPT-2 at p = 64: narrower blocks bound tighter, at a test of each surviving pair).
_MIN_PLUS_CANDIDATES = 16
_MIN_PLUS_COARSE_BLOCK = 128
_MIN_PLUS_BLOCK = 8
# Above this fraction of possibly useful (row, k) pairs in a coarse block, summing the whole block
# is cheaper than testing and gathering the pairs (measured on GPT-2, a 48-layer decoder, ResNet-50).
_MIN_PLUS_DENSE_FRACTION = 0.5
# Below this many configurations of the eliminated op, the plain product summed in cache-sized column
# blocks beats the bounds, whose candidates alone cost 16 / k of it (docs/PERFORMANCE.md "Dense
# (min,+) products": 3-20x on the zoo's encoder-decoders and DeBERTa at k <= 79; the bounds win from
# about k = 1,000, GPT-2's research search at p = 64). Cells per dense block: 1 MiB of float64.
_MIN_PLUS_BOUNDED_MIN_K = 1024
_MIN_PLUS_DENSE_CELLS = 1 << 17


class _Table:
    """A dense factor; if produced by eliminating an op, also how to recover that op's choice."""

    __slots__ = ("scope", "values", "var", "inputs", "children", "argmin")

    def __init__(
        self,
        scope: tuple[int, ...],
        values: np.ndarray,
        var: int | None = None,
        inputs: tuple[tuple[tuple[int, ...], np.ndarray], ...] = (),
        children: tuple["_Table", ...] = (),
        argmin: np.ndarray | None = None,
    ) -> None:
        self.scope = scope
        self.values = values
        self.var = var
        """Op whose elimination produced this table (``None`` for an input table)."""
        self.inputs = inputs
        """``(axes, values)`` of the factors summed to eliminate ``var``, each axis a position in
        ``(var, *scope)`` (so renaming leaves them alone): once the dependent ops are chosen,
        ``var``'s best configuration is the argmin of their sum (recomputed for that one cell, which
        is cheaper than keeping an argmin table for every cell of a large table)."""
        self.children = children
        """Produced tables consumed when ``var`` was eliminated (to visit after it)."""
        self.argmin = argmin
        """Best configuration of ``var`` per cell, kept for small tables only (recomputing it from
        ``inputs`` costs more there than storing it)."""

    def renamed(self, rho: Mapping[int, int], memo: dict[int, object]) -> "_Table":
        if self.var is None:
            return self  # input tables carry no choice; nothing to rename
        key = id(self)
        if key not in memo:
            memo[key] = _Table(
                tuple(rho[v] for v in self.scope),
                self.values,
                rho[self.var],
                self.inputs,
                tuple(c.renamed(rho, memo) for c in self.children),
                self.argmin,
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

    When the dependent ops split into two groups no factor spans (the usual case on a chain: the
    op's producer side and consumer side), the minimum is a (min,+) matrix product, computed with
    bounds (:func:`_min_plus`). Otherwise small results are one table over ``(v, D)`` minimised
    along ``v`` in chunks, large ones a loop over ``v`` keeping a running minimum in place.
    """
    dependent = tuple(sorted({x for f in factors for x in f.scope} - {v}))
    out_shape = tuple(int(sizes[x]) for x in dependent)
    out_cells = int(np.prod(out_shape, dtype=np.int64))
    if out_cells > _MAX_RESULT_CELLS:
        raise InputError(
            f"eliminating op {v} needs a table of {out_cells:.3g} cells; the problem is too large "
            "for exact search: coarsen the graph, restrict configurations, or use NSGA-II"
        )
    if len(dependent) + 1 > _MAX_TABLE_AXES:
        raise InputError(
            f"eliminating op {v} joins it with {len(dependent)} other ops in one table, more than the "
            f"{_MAX_TABLE_AXES} axes an array holds; the problem is too large for exact search: coarsen the graph, "
            "restrict configurations, or use NSGA-II"
        )
    k_v = int(sizes[v])
    argmin = None
    groups = _two_groups(v, factors, dependent, sizes) if out_cells * k_v >= _MIN_PLUS_MIN_WORK else None
    if groups is not None:
        best = _min_plus_factors(v, factors, groups, dependent, sizes)
    else:
        target = (v, *dependent)
        aligned = [_align(f.values, f.scope, target) for f in factors]
        if out_cells >= _LOOP_MIN_CELLS and k_v > 1:
            best = _min_by_loop(aligned, out_shape, k_v)
        else:
            best, argmin = _min_by_chunks(aligned, out_shape, k_v)
    produced = tuple(f for f in factors if f.var is not None)
    local = (v, *dependent)
    inputs = tuple((tuple(local.index(x) for x in f.scope), f.values) for f in factors)
    return _Table(dependent, best, v, inputs, produced, argmin)


def _two_groups(
    v: int, factors: list[_Table], dependent: tuple[int, ...], sizes: np.ndarray
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Split the dependent ops into two groups such that no factor touches both, the cells of the
    two as balanced as possible; ``None`` when they are connected (no product structure)."""
    if len(dependent) < 2:
        return None
    linked = nx.Graph()
    linked.add_nodes_from(dependent)
    for f in factors:
        others = [x for x in f.scope if x != v]
        linked.add_edges_from(zip(others, others[1:]))
    components = sorted(
        (tuple(sorted(c)) for c in nx.connected_components(linked)),
        key=lambda c: (-int(np.prod([sizes[x] for x in c], dtype=np.int64)), c),
    )
    if len(components) < 2:
        return None
    first: list[int] = []
    second: list[int] = []
    cells = [1, 1]
    for component in components:  # greedy balance: each goes to the group with fewer cells
        size = int(np.prod([sizes[x] for x in component], dtype=np.int64))
        side = 0 if cells[0] <= cells[1] else 1
        (first if side == 0 else second).extend(component)
        cells[side] *= size
    return tuple(sorted(first)), tuple(sorted(second))


def _group_sum(v: int, factors: list[_Table], group: tuple[int, ...], sizes: np.ndarray) -> np.ndarray:
    """``(K_v, cells of group)``: the sum of the factors over ``(v, group)``, in the given order."""
    target = (v, *group)
    shape = tuple(int(sizes[x]) for x in target)
    if len(factors) == 1 and factors[0].values.shape == shape and factors[0].scope == target:
        return factors[0].values.reshape(shape[0], -1)  # already the sum: a view, no copy
    total = np.zeros(shape)
    for f in factors:
        total += _align(f.values, f.scope, target)
    return total.reshape(shape[0], -1)


def _min_plus_factors(
    v: int,
    factors: list[_Table],
    groups: tuple[tuple[int, ...], tuple[int, ...]],
    dependent: tuple[int, ...],
    sizes: np.ndarray,
) -> np.ndarray:
    """The elimination as a (min,+) product of the two groups' sums, reshaped onto ``dependent``."""
    first, second = groups
    unary = [f for f in factors if f.scope == (v,)]
    into_first = [f for f in factors if f.scope != (v,) and set(f.scope) <= {v, *first}]
    into_second = [f for f in factors if f.scope != (v,) and set(f.scope) <= {v, *second}]
    # the op's own costs ride on the smaller side (the sum there is a small new array)
    first_cells = int(np.prod([sizes[x] for x in first], dtype=np.int64))
    second_cells = int(np.prod([sizes[x] for x in second], dtype=np.int64))
    if first_cells <= second_cells:
        into_first = unary + into_first
    else:
        into_second = unary + into_second
    left = _group_sum(v, into_first, first, sizes)
    right = _group_sum(v, into_second, second, sizes)
    # bounds work per block of columns: the larger side as columns measured 2-3x faster
    product = _min_plus(left, right) if left.shape[1] <= right.shape[1] else _min_plus(right, left).T
    shaped = product.reshape([int(sizes[x]) for x in (*first, *second)])
    return shaped.transpose([(*first, *second).index(x) for x in dependent])


def _min_plus(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``out[i, j] = min_k left[k, i] + right[k, j]``: summed densely for few configurations ``k``,
    bounded for many (:data:`_MIN_PLUS_BOUNDED_MIN_K`); both exact."""
    if left.shape[0] < _MIN_PLUS_BOUNDED_MIN_K:
        return _dense_min_plus(left, right)
    return _bounded_min_plus(left, right)


def _dense_min_plus(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``out[i, j] = min_k left[k, i] + right[k, j]``, one ``k`` at a time over blocks of columns that
    stay in cache (:data:`_MIN_PLUS_DENSE_CELLS`), with no temporary allocated per ``k``."""
    k_count, rows = left.shape
    columns = right.shape[1]
    out = np.empty((rows, columns))
    width = max(1, _MIN_PLUS_DENSE_CELLS // max(rows, 1))
    for start in range(0, columns, width):
        block = right[:, start : start + width]
        lowest = np.full((rows, block.shape[1]), np.inf)  # contiguous: measured 1.5x faster than a view of out
        sums = np.empty_like(lowest)
        for k in range(k_count):
            np.add(left[k][:, None], block[k][None, :], out=sums)
            np.minimum(lowest, sums, out=lowest)
        out[:, start : start + width] = lowest
    return out


def _bounded_min_plus(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    r"""``out[i, j] = min_k left[k, i] + right[k, j]``, skipping the terms that cannot be minimal.

    An upper bound :math:`U` comes from a few candidate ``k`` per row (those with the smallest
    ``left[k, i] + min_j right[k, j]``). Then for each block of columns (ordered so that columns
    with the same best ``k`` sit together), a term ``k`` can only improve row ``i`` of the block if
    ``left[k, i] + min_{j \in block} right[k, j] < max_{j \in block} U[i, j]``; only those
    ``(i, k)`` pairs are summed. Blocks are bounded twice: coarse blocks select the pairs, narrow
    blocks inside them test only those; a coarse block where most pairs survive is summed densely.
    Exact: every skipped term is at least a value already in ``U``.
    """
    k_count, rows = left.shape
    columns = right.shape[1]
    # columns are visited in ``order`` (permuted blocks are gathered one coarse block at a time, so
    # no permuted copy of ``right`` is made); ``upper`` is kept in that order
    order = np.argsort(right.argmin(axis=0), kind="stable")
    candidates = min(_MIN_PLUS_CANDIDATES, k_count)
    score = left + right.min(axis=1)[:, None]
    picked = np.argpartition(score, candidates - 1, axis=0)[:candidates]
    every_row = np.arange(rows)
    upper = np.full((rows, columns), np.inf)
    for k in picked:
        np.minimum(upper, left[k, every_row][:, None] + right[k][:, order], out=upper)
    left_by_row = np.ascontiguousarray(left.T)
    for coarse_start in range(0, columns, _MIN_PLUS_COARSE_BLOCK):
        coarse_stop = min(columns, coarse_start + _MIN_PLUS_COARSE_BLOCK)
        coarse_bound = upper[:, coarse_start:coarse_stop].max(axis=1)
        coarse = right[:, order[coarse_start:coarse_stop]]  # a (k, block) copy, contiguous
        coarse_min = coarse.min(axis=1)
        pairs = left_by_row + coarse_min[None, :] < coarse_bound[:, None]
        if np.count_nonzero(pairs) > _MIN_PLUS_DENSE_FRACTION * pairs.size:
            # loose bounds: testing pairs block by block costs more than summing them all
            lowest = upper[:, coarse_start:coarse_stop].copy()
            sums = np.empty_like(lowest)
            for k in range(k_count):
                np.add(left[k][:, None], coarse[k][None, :], out=sums)
                np.minimum(lowest, sums, out=lowest)
            upper[:, coarse_start:coarse_stop] = lowest
            continue
        pair_row, pair_k = np.nonzero(pairs)
        pair_left = left_by_row[pair_row, pair_k]
        for start in range(coarse_start, coarse_stop, _MIN_PLUS_BLOCK):
            stop = min(coarse_stop, start + _MIN_PLUS_BLOCK)
            block = np.ascontiguousarray(coarse[:, start - coarse_start : stop - coarse_start])
            bound = upper[:, start:stop].max(axis=1)
            useful = np.flatnonzero(pair_left + block.min(axis=1)[pair_k] < bound[pair_row])
            step = max(1, _CHUNK_CELLS // (stop - start))
            for first in range(0, useful.size, step):
                chosen = useful[first : first + step]  # ascending, so rows stay grouped
                rows_here = pair_row[chosen]
                sums = pair_left[chosen][:, None] + block[pair_k[chosen]]
                starts = np.flatnonzero(np.concatenate(([True], rows_here[1:] != rows_here[:-1])))
                lowest = np.minimum.reduceat(sums, starts, axis=0)
                hit = rows_here[starts]
                upper[hit, start:stop] = np.minimum(upper[hit, start:stop], lowest)
    out = np.empty_like(upper)
    out[:, order] = upper
    return out


def _min_by_chunks(aligned: list[np.ndarray], out_shape: tuple[int, ...], k_v: int) -> tuple[np.ndarray, np.ndarray]:
    """Min and argmin over the first axis (``v``) of the broadcast sum, in chunks of the first
    dependent op (ties: the lowest configuration)."""
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
        acc = _broadcast_sum([a[:, start:stop] if a.shape[1] > 1 else a for a in aligned],
                             (k_v, stop - start, *out_shape[1:]))
        arg = _first_argmin(acc)
        best_arg[start:stop] = arg
        best[start:stop] = np.take_along_axis(acc, arg[None], axis=0)[0]
    return best, best_arg


def _broadcast_sum(parts: Sequence[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """``zeros(shape) + parts[0] + parts[1] + ...``, each cell the same float (the same additions in the same
    order), summed at the broadcast shape of the parts so far: only the additions once it is whole touch every cell
    (a chain op's factors span ``(v, 1, B)`` and ``(v, A, 1)``: one whole pass, not one per factor and the zeros).
    A read-only broadcast view when the parts never span ``shape``."""
    total: np.ndarray = np.zeros((1,) * len(shape))
    for part in parts:
        total = total + part
    return total if total.shape == shape else np.broadcast_to(total, shape)


def _first_argmin(acc: np.ndarray) -> np.ndarray:
    """``acc.argmin(axis=0)``, found faster: the column minima (a reduction along the rows, which numpy runs on
    contiguous rows), then the first row equal to each (``argmax`` of the equality: its first true). Equal to
    ``argmin`` wherever no column holds a NaN (``argmin``'s first NaN, taken from it there); ties (``-0.0`` and
    ``0.0`` among them) go to the lowest row, as ``argmin``'s do."""
    if acc.size <= _ARGMIN_DIRECT_CELLS:
        return acc.argmin(axis=0)
    lowest = acc.min(axis=0)
    if np.isnan(lowest).any():
        return acc.argmin(axis=0)
    return (acc == lowest[None]).argmax(axis=0)


def _min_by_loop(aligned: list[np.ndarray], out_shape: tuple[int, ...], k_v: int) -> np.ndarray:
    """Min over the first axis (``v``), one configuration of ``v`` at a time (in place)."""
    rows = [np.ascontiguousarray(a) if a.shape[0] > 1 else a for a in aligned]
    best = np.full(out_shape, np.inf)
    tmp = np.empty(out_shape)
    for c in range(k_v):
        tmp.fill(0.0)
        for a in rows:
            tmp += a[c] if a.shape[0] > 1 else a[0]
        np.minimum(best, tmp, out=best)
    return best


def _back_substitute(roots: Sequence[_Table], num_ops: int) -> np.ndarray:
    """Choose every op, parents before children: the argmin of the factors summed to eliminate it,
    at the dependent ops' choices (ties: the lowest configuration index)."""
    choice = np.full(num_ops, -1, dtype=np.int64)
    stack = list(reversed(roots))
    while stack:
        table = stack.pop()
        if table.var is None:
            continue
        v = table.var
        if table.argmin is not None:
            choice[v] = int(table.argmin[tuple(int(choice[d]) for d in table.scope)])
        else:
            cell = (slice(None), *(int(choice[d]) for d in table.scope))
            total: np.ndarray | float = 0.0
            for axes, values in table.inputs:
                total = total + values[tuple(cell[a] for a in axes)]
            choice[v] = int(np.argmin(total))
        stack.extend(reversed(table.children))
    return choice


def _solve(tables: CostTables, plan: EliminationPlan, node_cost: Sequence[np.ndarray],
           before_step: Callable[[], None] | None = None) -> tuple[np.ndarray, float]:
    """``(choice, value)`` of ``plan`` on ``node_cost``; ``before_step`` is called before each elimination
    (a search's deadline: it raises to stop the DP, :func:`planner.search.solve_clock.check`)."""
    sizes = np.array([t.shape[0] for t in node_cost], dtype=np.int64)
    factors = [_Table((i,), np.asarray(c, dtype=np.float64)) for i, c in enumerate(node_cost)]
    factors += [
        _Table((e.u, e.v), np.asarray(e.time_s, dtype=np.float64)) for e in tables.edges
    ]
    if before_step is None:
        roots = execute_plan(plan, factors, lambda v, fs: _eliminate(v, fs, sizes))
    else:
        roots = execute_plan(plan, factors, lambda v, fs: before_step() or _eliminate(v, fs, sizes))
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
    plan: EliminationPlan | None = None,
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
    plan:
        A plan from :func:`planner.search.blocks.plan_elimination` for tables of this structure
        (configuration counts, edges and equal arrays; values may differ), to skip choosing one:
        solving the same structure again, e.g. for several memory weights. ``objective="time"``
        only; overrides ``order`` and ``use_blocks``.

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
    if plan is not None and objective != "time":
        raise InputError("a given elimination plan needs objective='time' (memory restricts the tables)")
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
    if plan is None:
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
