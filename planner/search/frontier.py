r"""FT: the (time, memory) Pareto frontier by the same variable elimination, on Pareto sets.

TensorOpt's FT runs PaSE's elimination where each table cell holds, instead of one minimum, the
Pareto set of (time, memory) pairs of the ops eliminated so far. Memory is a sum of per-op terms
and edges carry time only.

Data layout (:class:`_Front`)
    A set factor over a scope of ops has a *pool* of memory levels (ascending, shared by all its
    cells) and a dense ``time[*cells, level]`` array: the least time of the eliminated ops given the
    scope's configurations, with memory at most that level (``inf``: no point there, or dominated).
    So a cell's Pareto set is the finite entries of its row, and combining sets becomes dense
    broadcasting instead of per-pair work. Each entry keeps its provenance (the eliminated op's
    configuration and the level used in every consumed factor) to trace a full per-op choice
    (:func:`_trace`).

Eliminating op :math:`v` (:func:`_eliminate`)
    The factors touching :math:`v` are its own unary set (one level per memory bucket of its
    configurations), the set factors produced earlier, and edge tables (time only). For each
    combination of levels of all set factors but the one with the largest pool (the *vector*
    factor), the times are summed by broadcasting over :math:`(v, D(v), \text{vector levels})`
    and minimised over :math:`v` (:func:`_min_rows_loop`: one row of :math:`v` at a time, in
    place; :func:`_min_rows_chunked` for small tables). Rows of :math:`v` where a looped level is
    empty, and vector levels none of the remaining rows has, are skipped; the op's own unary set is
    always looped, so each row of :math:`v` is visited once per combination of the other levels.
    Each result lands in the bucket of its memory sum (consecutive vector levels sharing a bucket
    are merged with ``minimum.reduceat``). Finally a running minimum over levels keeps, per cell,
    only entries strictly faster than every smaller level (the Pareto filter), and empty levels are
    dropped from the pool. Work: (configurations of :math:`v`) x (cells of :math:`D(v)`) x (levels),
    i.e. the DP's table times the number of memory levels.

Bounding the set sizes (:func:`_grid`)
    Memory sums are bucketed on a geometric grid: the float's exponent and its leading :math:`b`
    mantissa bits, a relative width of at most :math:`2^{-b} \le \epsilon`. Each output level's
    memory is the largest sum that fell into its bucket (rounded up), so a listed point's memory is
    an upper bound of its true memory. ``epsilon = 0`` buckets by exact value: exact frontier.
    A rounded point covers every point of its bucket: no slower (it is the fastest), memory at most
    :math:`r = \max/\min` of the bucket's sums larger. Sums keep the ratio
    (:math:`(1+a)x + (1+b)y \le (1+\max(a,b))(x+y)`) and the Pareto filter only replaces a point by
    one that dominates it, so by induction over the elimination tree

    .. math::

        \forall (T^*, M^*) \text{ Pareto-optimal},\ \exists \text{ listed } (T, M):\quad
        T \le T^*,\quad M \le \beta M^*,\qquad \beta = \max_{\text{paths}} \prod_i r_i
        \le (1+\epsilon)^{d}

    with :math:`r_i` the largest measured ratio of a bucketing step on the path and :math:`d` the
    number of bucketing steps on the longest path from an op to the root (``bucket_depth``). The
    measured :math:`\beta` is ``memory_bound_factor``; ``exact`` means :math:`\beta = 1`. A cap
    ``max_points`` on a pool's levels merges consecutive levels (a coarser grid, then equal-count
    groups) when exceeded (:func:`_cap`), and an elimination whose sums would span more than
    ``4 * max_points`` buckets uses a coarser grid from the start (:func:`_output_keys`); their
    ratios are measured the same way and each counts as one more bucketing step.

References
----------
Z. Cai, X. Yan, K. Ma, et al., "TensorOpt: Exploring the Tradeoffs in Distributed DNN Training with
Auto-Parallelism", IEEE TPDS 33(8), 2022 (the FT algorithm).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables
from planner.search.blocks import EliminationPlan, execute_plan, plan_elimination
from planner.search.budget import frontier_step_bytes
from planner.search.ordering import OrderChoice
from planner.search.pareto import pareto_mask
from planner.search.problem import check_tables, evaluate_many
from planner.search.results import FrontierPoint, FrontierResult

__all__ = [
    "pareto_frontier",
    "FrontierResult",
    "FrontierPoint",
    "FrontierTooCostly",
    "DEFAULT_EPSILON",
    "DEFAULT_MAX_POINTS",
]

DEFAULT_EPSILON = 0.01
"""Default relative width of the memory buckets (1%)."""
DEFAULT_MAX_POINTS = 256
"""Default cap on the memory levels of one factor (and so on the points of one table cell)."""

# Elements of the (rows of v, cells, levels) sum handled at once (float64: 32 MiB).
_CHUNK = 1 << 22
# Memory levels an elimination may produce before its grid is coarsened, per allowed point.
_OUTPUT_LEVELS_PER_POINT = 4
# Per-row work (cells x levels) from which the minimum over v loops over rows instead of chunks.
_ROW_LOOP_MIN = 1 << 15
_LOW_KEY = -1  # memories <= 0 share one bucket below every positive one (positive keys are >= 0)
# What one combination of looped levels costs beyond its sums, in sums (its numpy calls on small
# arrays: about 0.2 ms at ~5e9 sums/s), for the work budget.
_COMBINATION_WORK = 1_000_000
# Refuse a result table above this many (cell, level) entries (about 2 GiB with provenance).
_MAX_ENTRIES = 1 << 27


class FrontierTooCostly(InputError):
    """The set-valued elimination would exceed its work budget (``pareto_frontier(max_work=...)``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Prune:
    r"""Limits under which entries are dropped during elimination (``pareto_frontier(memory_limit_bytes=,
    time_limit_s=)``), as slacks over the floors.

    Memory is :math:`M = M_0 + \sum_i m_i[c_i]`. Write :math:`\underline m_i = \min_c m_i[c]` and, for a
    factor, :math:`F` (``floor_bytes``) the sum of :math:`\underline m_i` over the ops eliminated into
    it. An entry of level :math:`\ell` (the memory of those ops) completes to
    :math:`M \ge M_0 + \ell - F + \sum_i \underline m_i`, whatever the other ops choose. So
    :math:`\ell - F > L - M_0 - \sum_i \underline m_i` (``memory_slack_bytes``) proves every completion
    exceeds the limit :math:`L`: the entry is dropped. The same holds, when every edge time is >= 0
    (edges then add >= 0 to any completion; ``time_slack_s`` is ``None`` otherwise), for the
    weighted time :math:`T + wM` (``weight_s_per_byte`` :math:`w \ge 0`) with the floors
    :math:`\underline h_i = \min_c (t_i[c] + w\, m_i[c])`: a completion faster than :math:`T_{lim}`
    within :math:`L` has :math:`T + wM < T_{lim} + wL`, so an entry of time :math:`t`, level
    :math:`\ell` and weighted floor :math:`H` is dropped when
    :math:`t + w\ell - H > T_{lim} + wL - T_0 - wM_0 - \sum_i \underline h_i` (``time_slack_s``;
    :math:`w = 0`: time alone; a good :math:`w` is the frontier's slope at :math:`L`, Lagrangian
    reduced-cost fixing). The excess :math:`\ell - F` depends only on the
    factor, not on which instance of a repeated block it came from, so block reuse stays valid.
    Nothing within the limits is lost: an entry is only ever dominated by entries with less memory
    and less time, which are dropped only if it is too. Slacks are loosened by a relative 1e-9 (float
    rounding of the floors), so the result may keep a few points just over a limit, never miss one.
    """

    memory_slack_bytes: float
    time_slack_s: float | None
    weight_s_per_byte: float = 0.0
    optimistic: bool = False
    """Buckets keep their *least* memory (``relaxed_points``): every level is then a lower bound
    of the memories it stands for, and the result a relaxation (see :func:`relaxed_points`)."""


class _Input:
    """An edge table (time only) over two ops."""

    __slots__ = ("scope", "time")

    def __init__(self, scope: tuple[int, ...], time: np.ndarray) -> None:
        self.scope = scope
        self.time = time

    def renamed(self, rho: Mapping[int, int], memo: dict) -> "_Input":
        return self


class _Front:
    """Pareto sets over a pool of memory levels for every cell of ``scope``, with provenance."""

    __slots__ = (
        "scope", "shape", "pool", "time", "var", "pick", "prov", "children", "bound", "depth", "floor_bytes", "floor_s",
    )

    def __init__(
        self,
        scope: tuple[int, ...],
        shape: tuple[int, ...],
        pool: np.ndarray,
        time: np.ndarray | None,
        *,
        var: int | None = None,
        pick: np.ndarray | None = None,
        prov: np.ndarray | None = None,
        children: tuple["_Front", ...] = (),
        bound: float = 1.0,
        depth: int = 0,
        floor_bytes: float = 0.0,
        floor_s: float = 0.0,
    ) -> None:
        self.scope = scope
        self.shape = shape
        self.pool = pool
        """``(P,)`` memory levels (bytes), ascending."""
        self.time = time
        """``(*shape, P)`` least time per cell and level (``inf``: none)."""
        self.var = var
        """The op eliminated to make this factor (``None`` for an op's unary set)."""
        self.pick = pick
        """``(cells, P)``: configuration of ``var`` behind each entry."""
        self.prov = prov
        """``(cells, P, len(children))``: level used in each child behind each entry."""
        self.children = children
        self.bound = bound
        """Measured memory ratio bound (see the module docstring)."""
        self.depth = depth
        """Bucketing steps on the longest path below."""
        self.floor_bytes = floor_bytes
        """Sum of the least memory of every op eliminated into this factor (bytes; a lower bound of
        any of its levels): what the limit-pruning of :class:`_Prune` measures excess from."""
        self.floor_s = floor_s
        """Sum of the least weighted node time :math:`t_i + w m_i` of every op eliminated into this
        factor (seconds; :math:`w` = ``_Prune.weight_s_per_byte``, 0 without a prune)."""

    def release(self) -> None:
        """Drop the times once consumed; provenance stays for tracing."""
        self.time = None

    def renamed(self, rho: Mapping[int, int], memo: dict) -> "_Front":
        if self.var is None:
            return self  # an unary set of an op inside the region: carries no choice
        key = id(self)
        if key not in memo:
            memo[key] = _Front(
                tuple(rho[v] for v in self.scope),
                self.shape,
                self.pool,
                self.time,
                var=rho[self.var],
                pick=self.pick,
                prov=self.prov,
                children=tuple(c.renamed(rho, memo) for c in self.children),
                bound=self.bound,
                depth=self.depth,
                floor_bytes=self.floor_bytes,
                floor_s=self.floor_s,
            )
        return memo[key]


def _mantissa_bits(epsilon: float) -> int:
    """Leading mantissa bits kept by the memory grid: relative bucket width <= 2**-bits <= epsilon."""
    return min(52, max(0, int(np.ceil(-np.log2(epsilon)))))


def _grid(memory: np.ndarray, epsilon: float) -> np.ndarray:
    r"""Integer bucket of each memory, monotone in memory (one shift, no logarithm).

    ``epsilon > 0``: the float's exponent and leading :math:`b` mantissa bits
    (:func:`_mantissa_bits`), so a bucket is at most :math:`2^{-b} \le \epsilon` wide relative to
    its lower edge; memories <= 0 share the lowest bucket. ``epsilon = 0``: the value itself (its
    order-preserving bit pattern), one bucket per distinct value.
    """
    values = np.asarray(memory, dtype=np.float64) + 0.0  # -0.0 -> 0.0
    if epsilon == 0:
        bits = values.view(np.int64)
        return np.where(bits < 0, bits ^ np.int64(0x7FFFFFFFFFFFFFFF), bits)
    positive = values > 0
    keys = np.where(positive, values, 1.0).view(np.int64) >> (52 - _mantissa_bits(epsilon))
    return np.where(positive, keys, _LOW_KEY)


def _output_keys(sums: np.ndarray, epsilon: float, limit: int) -> tuple[np.ndarray, bool]:
    """Buckets of the memory sums of an elimination; a coarser grid when they exceed ``limit``.

    Most of those levels would be dominated or merged by the ``max_points`` cap anyway; merging
    them before the dense table is built keeps it small. Returns the keys and whether coarsened.
    """
    keys = _grid(sums, epsilon)
    if np.unique(keys).size <= limit:
        return keys, False
    coarse = max(2 * epsilon, 1e-3)
    while coarse <= 1 << 20:
        keys = _grid(sums, coarse)
        if np.unique(keys).size <= limit:
            return keys, True
        coarse *= 2
    # equal-count groups of the distinct sums
    distinct = np.unique(sums)
    edges = distinct[np.linspace(0, distinct.size, limit, endpoint=False).astype(np.int64)]
    return np.searchsorted(edges, sums, side="right").astype(np.int64), True


def _unary(v: int, time: np.ndarray, memory: np.ndarray, epsilon: float, prune: _Prune | None = None) -> _Front:
    """The set of one op alone: per configuration one point, in its memory bucket (configurations
    over ``prune``'s slacks dropped)."""
    ok = np.isfinite(time) & np.isfinite(memory)
    floor_bytes = float(memory[ok].min()) if ok.any() else 0.0
    weight = prune.weight_s_per_byte if prune is not None else 0.0
    weighted = time + weight * memory if weight else time
    floor_s = float(weighted[ok].min()) if ok.any() else 0.0
    if prune is not None:
        ok &= memory - floor_bytes <= prune.memory_slack_bytes
        if prune.time_slack_s is not None:
            ok &= weighted - floor_s <= prune.time_slack_s
    keys = _grid(np.where(ok, memory, 0.0), epsilon)
    levels, level_of = np.unique(keys[ok], return_inverse=True)
    pool = np.full(levels.size, -np.inf)
    np.maximum.at(pool, level_of, memory[ok])
    low = np.full(levels.size, np.inf)
    np.minimum.at(low, level_of, memory[ok])
    table = np.full((time.size, levels.size), np.inf)
    table[np.flatnonzero(ok), level_of] = time[ok]
    bound = _ratio(pool, low)
    if prune is not None and prune.optimistic:
        pool = low
    return _Front(
        (v,), (time.size,), pool, table, bound=bound, depth=int(epsilon > 0),
        floor_bytes=floor_bytes, floor_s=floor_s,
    )  # fmt: skip


def _ratio(high: np.ndarray, low: np.ndarray) -> float:
    """Largest ``high / low`` over merged levels: ``inf`` if a zero memory was merged with a
    positive one (no relative bound), 1 when nothing was merged."""
    if ((low <= 0) & (high > 0)).any():
        return float("inf")
    positive = low > 0
    if not positive.any():
        return 1.0
    return max(1.0, float((high[positive] / low[positive]).max()))


def _align(array: np.ndarray, scope: tuple[int, ...], target: tuple[int, ...], levels: bool) -> np.ndarray:
    """View of a factor's array with one axis per ``target`` op (size 1 where absent), plus its
    level axis last when ``levels``."""
    present = [x for x in target if x in scope]
    axes = [scope.index(x) for x in present] + ([len(scope)] if levels else [])
    moved = array.transpose(axes)
    shape = [array.shape[scope.index(x)] if x in scope else 1 for x in target]
    return moved.reshape(shape + ([array.shape[-1]] if levels else []))


def _eliminate(
    v: int,
    factors: list,
    sizes: np.ndarray,
    epsilon: float,
    max_points: int,
    budget: list[float] | None = None,
    prune: _Prune | None = None,
) -> _Front:
    """Eliminate op ``v``: sum the factors touching it, minimise over its configurations, per level.

    ``budget``: ``[sums left]``; the elimination's sums (combinations of looped levels x rows of v x
    cells x vector levels, an upper bound) are taken from it first, and :class:`FrontierTooCostly`
    is raised when it runs out. ``prune``: memory sums and entries over its slacks are dropped.

    The steps: split the factors into looped ones and the vector one (:func:`_split_factors`),
    charge the work (:func:`_charge_work`), bucket every combination's memory sums
    (:func:`_output_buckets`), then per combination of looped levels minimise over the rows of v
    (:func:`_min_rows_loop` / :func:`_min_rows_chunked`) and file the minima under their buckets
    (:func:`_file_minima`); finally the Pareto filter and the cap (:func:`_finish_elimination`)."""
    fronts = [f for f in factors if isinstance(f, _Front)]
    edges = [f for f in factors if isinstance(f, _Input)]
    dependent = tuple(sorted({x for f in factors for x in f.scope} - {v}))
    target = (v, *dependent)
    out_shape = tuple(int(sizes[x]) for x in dependent)
    cells = int(np.prod(out_shape, dtype=np.int64))
    k_v = int(sizes[v])
    if any(f.pool.size == 0 for f in fronts):  # some factor has no finite point: neither has this
        for f in fronts:
            f.release()
        return _Front(
            dependent, out_shape, np.zeros(0), np.zeros((*out_shape, 0)), var=v,
            pick=np.zeros((cells, 0), np.int64), prov=np.zeros((cells, 0, 0), np.int32),
        )  # fmt: skip
    loops, vector = _split_factors(v, fronts)
    children = (*loops, vector)
    vector_al = _align(vector.time, vector.scope, target, True)
    loops_al = [_align(f.time, f.scope, target, True) for f in loops]
    edges_al = [_align(e.time, e.scope, target, False) for e in edges]
    width = vector.pool.size
    vector_rows = (
        np.isfinite(vector_al).reshape(vector_al.shape[0], -1, width).any(axis=1)
        if vector_al.shape[0] == k_v and k_v > 1
        else None
    )  # per row of v, the vector levels with some point

    # every combination of looped levels, the output buckets of its sums, and the output pool
    combos = list(itertools.product(*(range(f.pool.size) for f in loops)))
    _charge_work(budget, v, len(combos), k_v, cells, width)
    floor_bytes = sum(f.floor_bytes for f in children)
    floor_s = sum(f.floor_s for f in children)
    buckets = _output_buckets(loops, vector, combos, floor_bytes, epsilon, max_points, prune, cells, v)
    table = _EliminationTable.empty(cells, buckets.high.size, k_v, children)
    combo_floor_s = _combination_floors(loops, vector, edges, combos, prune)
    for index, combo in enumerate(combos):
        if budget is not None and len(budget) > 1 and index % 64 == 63 and time.perf_counter() > budget[1]:
            raise FrontierTooCostly(f"the exact frontier passed its deadline (eliminating op {v})")
        if combo_floor_s is not None and combo_floor_s[index] - floor_s > prune.time_slack_s:  # type: ignore[union-attr]
            continue  # every entry of this combination is over the time limit
        rows, live = _live_rows(loops_al, combo, k_v, vector_rows, width, buckets, index)
        if live.size == 0:
            continue
        levels = live if live.size < width else None
        loop_parts = [f_al[..., p] for f_al, p in zip(loops_al, combo)]
        if cells * live.size >= _ROW_LOOP_MIN:
            low_t, low_arg = _min_rows_loop(vector_al, levels, loop_parts, edges_al, rows, out_shape, live.size, k_v)
        else:
            low_t, low_arg = _min_rows_chunked(
                vector_al, levels, loop_parts, edges_al, rows, out_shape, live.size, k_v
            )
        _file_minima(table, combo, low_t.reshape(cells, live.size), low_arg.reshape(cells, live.size), live,
                     buckets.column[index][live])  # fmt: skip
    for f in fronts:
        f.release()
    return _finish_elimination(
        table, buckets, v, dependent, out_shape, fronts, children, floor_bytes, floor_s, epsilon, max_points, prune
    )


def _split_factors(v: int, fronts: list[_Front]) -> tuple[list[_Front], _Front]:
    """``(looped factors, vector factor)`` of an elimination of ``v``.

    The op's own unary set has one level per configuration: always loop over it (its rows of v
    split by level, so the loop costs one pass over v). Vectorise over the largest other pool."""
    own = [f for f in fronts if f.var is None and f.scope == (v,)]
    others = [f for f in fronts if not any(f is o for o in own)]
    vector = max(others, key=lambda f: f.pool.size) if others else _unit_front()
    return own + [f for f in others if f is not vector], vector


def _charge_work(budget: list[float] | None, v: int, combinations: int, k_v: int, cells: int, width: int) -> None:
    """Check the deadline (``budget[1]``) and take the elimination's sums, ``combinations x (k_v x
    cells x width + a fixed cost)``, from ``budget[0]`` (:class:`FrontierTooCostly` when either is
    passed)."""
    if budget is None:
        return
    if len(budget) > 1 and time.perf_counter() > budget[1]:
        raise FrontierTooCostly(f"the exact frontier passed its deadline (eliminating op {v})")
    if len(budget) > 2 and frontier_step_bytes(combinations, width) > budget[2]:
        raise FrontierTooCostly(
            f"the exact frontier would allocate {frontier_step_bytes(combinations, width) / 2**30:.3g} GiB "
            f"eliminating op {v} ({combinations} level combinations x {width} levels), over its memory cap"
        )
    budget[0] -= float(combinations) * (k_v * cells * width + _COMBINATION_WORK)
    if budget[0] < 0:
        raise FrontierTooCostly(
            f"the exact frontier needs more than the work budget of sums (eliminating op {v}: "
            f"{combinations} level combinations x {k_v} x {cells} cells x {width} levels)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Buckets:
    """The output memory levels of one elimination (:func:`_output_buckets`)."""

    column: np.ndarray
    """``(combinations, vector levels)``: the output level of each memory sum."""
    high: np.ndarray
    """``(levels,)`` bytes: the largest sum that fell into each level."""
    low: np.ndarray
    """``(levels,)`` bytes: the smallest."""
    keep: np.ndarray | None
    """``(combinations, vector levels)``: sums within the prune's memory slack (``None``: no prune)."""
    coarsened: bool
    """Whether a coarser grid than ``epsilon``'s was needed (one more bucketing step)."""


def _output_buckets(
    loops: list[_Front],
    vector: _Front,
    combos: list[tuple[int, ...]],
    floor_bytes: float,
    epsilon: float,
    max_points: int,
    prune: _Prune | None,
    cells: int,
    v: int,
) -> _Buckets:
    """Bucket the memory sum of every (combination of looped levels, vector level) pair; sums over
    the prune's memory slack share one last bucket that no entry ever fills."""
    base = np.array([sum(float(f.pool[p]) for f, p in zip(loops, combo)) for combo in combos])
    sums = base[:, None] + vector.pool[None, :]
    keep = None if prune is None else sums - floor_bytes <= prune.memory_slack_bytes
    keys, coarsened = _output_keys(sums, epsilon, _OUTPUT_LEVELS_PER_POINT * max_points)
    if keep is not None:
        keys = np.where(keep, keys, np.iinfo(np.int64).max)
    out_keys, column = np.unique(keys, return_inverse=True)
    column = column.reshape(keys.shape)
    if cells * out_keys.size > _MAX_ENTRIES:
        raise InputError(
            f"eliminating op {v} needs {cells} cells x {out_keys.size} memory levels; raise epsilon, "
            "lower max_points, restrict configurations or use NSGA-II"
        )
    high = np.full(out_keys.size, -np.inf)
    np.maximum.at(high, column.ravel(), sums.ravel())
    low = np.full(out_keys.size, np.inf)
    np.minimum.at(low, column.ravel(), sums.ravel())
    return _Buckets(column=column, high=high, low=low, keep=keep, coarsened=coarsened)


@dataclass(frozen=True, slots=True, kw_only=True)
class _EliminationTable:
    """The result table an elimination fills in place: per (cell, output level) the least time and
    its provenance (the arrays are written, the record is not)."""

    best: np.ndarray
    """``(cells, levels)`` seconds (``inf``: none yet)."""
    pick: np.ndarray
    """``(cells, levels)``: configuration of v behind each entry."""
    prov: np.ndarray
    """``(cells, levels, children)``: level used in each consumed factor (the vector one last)."""

    @classmethod
    def empty(cls, cells: int, levels: int, k_v: int, children: tuple[_Front, ...]) -> "_EliminationTable":
        level_type = np.min_scalar_type(max(f.pool.size for f in children))
        return cls(
            best=np.full((cells, levels), np.inf),
            pick=np.zeros((cells, levels), dtype=np.min_scalar_type(max(k_v - 1, 0))),
            prov=np.zeros((cells, levels, len(children)), dtype=level_type),
        )


def _combination_floors(
    loops: list[_Front], vector: _Front, edges: list[_Input], combos: list[tuple[int, ...]], prune: _Prune | None
) -> list[float] | None:
    """Per combination of looped levels, a lower bound of the weighted time of every entry it can
    make (``None`` without a time limit): its looped levels' fastest cells, the vector factor's
    fastest entry and each edge's least time (all >= 0 under a time limit)."""
    if prune is None or prune.time_slack_s is None:
        return None
    weight = prune.weight_s_per_byte
    level_min = [_level_min(f) + weight * f.pool for f in loops]
    assert vector.time is not None
    rest_min = float(np.min(vector.time + weight * vector.pool)) if vector.time.size else np.inf
    rest_min += sum(float(e.time.min()) for e in edges)
    return [sum(float(m[p]) for m, p in zip(level_min, combo)) + rest_min for combo in combos]


def _live_rows(
    loops_al: list[np.ndarray],
    combo: tuple[int, ...],
    k_v: int,
    vector_rows: np.ndarray | None,
    width: int,
    buckets: _Buckets,
    index: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(rows of v, vector levels)`` a combination can contribute: the rows where every looped
    level has some point, and the vector levels some of those rows have (within the memory slack).
    Both empty when nothing can."""
    rows_ok = np.ones(k_v, dtype=bool)
    for f_al, p in zip(loops_al, combo):
        finite = np.isfinite(f_al[..., p])
        rows_ok &= finite.reshape(finite.shape[0], -1).any(axis=1) if finite.shape[0] > 1 else finite.any()
    rows = np.flatnonzero(rows_ok)
    if rows.size == 0:
        return rows, rows
    live = np.flatnonzero(vector_rows[rows].any(axis=0)) if vector_rows is not None else np.arange(width)
    if buckets.keep is not None:
        live = live[buckets.keep[index, live]]
    return rows, live


def _file_minima(
    table: _EliminationTable,
    combo: tuple[int, ...],
    low_t: np.ndarray,
    low_arg: np.ndarray,
    live: np.ndarray,
    cols: np.ndarray,
) -> None:
    """Merge one combination's minima (``(cells, live levels)``) into ``table`` under their output
    levels ``cols``, where strictly faster; consecutive vector levels falling into one output
    bucket keep the fastest (the first on ties)."""
    n_live = live.size
    starts = np.flatnonzero(np.concatenate(([True], cols[1:] != cols[:-1])))
    if starts.size == n_live:  # every level its own bucket (the usual case)
        group_min, group_arg, group_level = low_t, low_arg, live
    else:
        group_min = np.minimum.reduceat(low_t, starts, axis=1)
        lengths = np.diff(np.append(starts, n_live))
        hits = low_t == np.repeat(group_min, lengths, axis=1)
        first = n_live - np.maximum.reduceat(hits * (n_live - np.arange(n_live)), starts, axis=1)
        group_arg = np.take_along_axis(low_arg, first, axis=1)
        group_level = live[first]
    targets = cols[starts]
    best, pick, prov = table.best, table.pick, table.prov
    last = prov.shape[2] - 1
    span = int(targets[-1]) - int(targets[0]) + 1
    if span <= 2 * targets.size:
        # (nearly) a run of columns: update views of it in place, gaps spread as inf
        cells = best.shape[0]
        where: slice | np.ndarray = slice(int(targets[0]), int(targets[-1]) + 1)
        if targets.size < span:
            offsets = targets - targets[0]
            spread = np.full((cells, span), np.inf)
            spread[:, offsets] = group_min
            spread_arg = np.zeros(spread.shape, dtype=group_arg.dtype)
            spread_arg[:, offsets] = group_arg
            spread_level = np.zeros(spread.shape, dtype=group_level.dtype)
            spread_level[:, offsets] = group_level
            group_min, group_arg, group_level = spread, spread_arg, spread_level
        better = group_min < best[:, where]
        np.copyto(best[:, where], group_min, where=better)
        np.copyto(pick[:, where], group_arg, where=better, casting="unsafe")  # values fit: < K_v
        for j, p in enumerate(combo):
            np.copyto(prov[:, where, j], p, where=better, casting="unsafe")
        np.copyto(prov[:, where, last], group_level, where=better, casting="unsafe")
    else:  # scattered columns (other combinations' levels in between): gather, merge, scatter
        current = best[:, targets]
        better = group_min < current
        best[:, targets] = np.where(better, group_min, current)
        pick[:, targets] = np.where(better, group_arg, pick[:, targets])
        for j, p in enumerate(combo):
            prov[:, targets, j] = np.where(better, p, prov[:, targets, j])
        prov[:, targets, last] = np.where(better, group_level, prov[:, targets, last])


def _finish_elimination(
    table: _EliminationTable,
    buckets: _Buckets,
    v: int,
    dependent: tuple[int, ...],
    out_shape: tuple[int, ...],
    fronts: list[_Front],
    children: tuple[_Front, ...],
    floor_bytes: float,
    floor_s: float,
    epsilon: float,
    max_points: int,
    prune: _Prune | None,
) -> _Front:
    """The eliminated factor: entries over the time slack dropped, the Pareto filter (per cell keep
    the levels strictly faster than every smaller level), empty levels dropped, then the cap."""
    best, low, high = table.best, buckets.low, buckets.high
    if prune is not None and prune.time_slack_s is not None:
        best[best + prune.weight_s_per_byte * low[None, :] - floor_s > prune.time_slack_s] = np.inf
    running = np.minimum.accumulate(best, axis=1)
    dominated = np.zeros(best.shape, dtype=bool)
    dominated[:, 1:] = best[:, 1:] >= running[:, :-1]
    best[dominated] = np.inf
    used = np.flatnonzero(np.isfinite(best).any(axis=0))
    ratio = _ratio(high[used], low[used])
    optimistic = prune is not None and prune.optimistic
    result = _Front(
        dependent,
        out_shape,
        (low if optimistic else high)[used],
        best[:, used].reshape(*out_shape, used.size),
        var=v,
        pick=table.pick[:, used],
        prov=table.prov[:, used, :],
        children=tuple(c for c in children if c.var is not None or c.scope),  # drop the unit
        bound=max(f.bound for f in fronts) * ratio,
        depth=max(f.depth for f in fronts) + (epsilon > 0) + buckets.coarsened,
        floor_bytes=floor_bytes,
        floor_s=floor_s,
    )
    return _cap(result, epsilon, max_points, optimistic=optimistic)


def _level_min(front: _Front) -> np.ndarray:
    """``(P,)`` the least time of each level over the factor's cells (``inf``: empty level)."""
    assert front.time is not None
    return front.time.reshape(-1, front.pool.size).min(axis=0) if front.time.size else np.full(front.pool.size, np.inf)


def _min_rows_chunked(
    vector_al: np.ndarray,
    levels: np.ndarray | None,
    loop_parts: list[np.ndarray],
    edges_al: list[np.ndarray],
    rows: np.ndarray,
    out_shape: tuple[int, ...],
    width: int,
    k_v: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Min and argmin over ``rows`` of v of the summed factors: whole chunks of rows at once."""
    cells = int(np.prod(out_shape, dtype=np.int64))
    low_t = np.full((*out_shape, width), np.inf)
    low_arg = np.zeros((*out_shape, width), dtype=np.int64)
    step = max(1, _CHUNK // max(cells * width, 1))
    for start in range(0, rows.size, step):
        chunk = rows[start : start + step]
        total = np.empty((chunk.size, *out_shape, width))
        rows_v = _take(vector_al, chunk, k_v)
        total[...] = rows_v if levels is None else rows_v[..., levels]
        for part in loop_parts:
            total += _take(part, chunk, k_v)[..., None]
        for e_al in edges_al:
            total += _take(e_al, chunk, k_v)[..., None]
        arg = total.argmin(axis=0)
        value = np.take_along_axis(total, arg[None], axis=0)[0]
        better = value < low_t  # strict: lower configurations of v win ties
        np.copyto(low_t, value, where=better)
        np.copyto(low_arg, chunk[arg], where=better)
    return low_t, low_arg


def _min_rows_loop(
    vector_al: np.ndarray,
    levels: np.ndarray | None,
    loop_parts: list[np.ndarray],
    edges_al: list[np.ndarray],
    rows: np.ndarray,
    out_shape: tuple[int, ...],
    width: int,
    k_v: int,
) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`_min_rows_chunked`, one row of v at a time with in-place running minima (faster
    when a row alone is large: no argmin across rows)."""
    low_t = np.full((*out_shape, width), np.inf)
    low_arg = np.zeros((*out_shape, width), dtype=np.int64)
    total = np.empty((*out_shape, width))
    better = np.empty((*out_shape, width), dtype=bool)
    parts = [p[..., None] for p in loop_parts] + [e[..., None] for e in edges_al]
    for row in rows:
        # add the small parts first, so the full-size sum is written once
        own = vector_al[row] if vector_al.shape[0] > 1 else vector_al[0]
        pieces = [own if levels is None else own[..., levels]]
        pieces += [p[row] if p.shape[0] > 1 else p[0] for p in parts]
        pieces.sort(key=lambda a: a.size)
        acc = pieces[0]
        for piece in pieces[1:-1]:
            acc = acc + piece
        if len(pieces) > 1:
            if np.broadcast_shapes(acc.shape, pieces[-1].shape) == total.shape:
                np.add(acc, pieces[-1], out=total)
            else:
                total[...] = acc + pieces[-1]
        else:
            total[...] = acc
        np.less(total, low_t, out=better)  # strict: lower configurations of v win ties
        np.copyto(low_t, total, where=better)
        np.copyto(low_arg, row, where=better)
    return low_t, low_arg


def _unit_front() -> _Front:
    """The neutral set: one level of zero memory and zero time, over no op."""
    return _Front((), (), np.zeros(1), np.zeros(1))


def _take(array: np.ndarray, rows: np.ndarray, k_v: int) -> np.ndarray:
    """Rows of ``v`` (axis 0) of an aligned array; broadcast when it has no ``v`` axis."""
    return array[rows] if array.shape[0] == k_v and k_v > 1 else array


def _cap(front: _Front, epsilon: float, max_points: int, *, optimistic: bool = False) -> _Front:
    """Merge consecutive levels until the pool has at most ``max_points`` levels.

    A coarser geometric grid (epsilon doubled) first; past 2**20 per bucket, equal-count groups.
    Each merged level keeps, per cell, its fastest entry; its memory is the largest merged level.
    """
    pool = front.pool
    if pool.size <= max_points:
        return front
    coarse = max(2 * epsilon, 1e-3)
    while True:
        keys = _grid(pool, coarse)
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        if starts.size <= max_points:
            break
        if coarse > 1 << 20:
            starts = np.unique(np.linspace(0, pool.size, max_points, endpoint=False).astype(np.int64))
            break
        coarse *= 2
    assert front.time is not None and front.pick is not None and front.prov is not None
    cells = int(np.prod(front.shape, dtype=np.int64))
    table = front.time.reshape(cells, pool.size)
    group_min = np.minimum.reduceat(table, starts, axis=1)
    lengths = np.diff(np.append(starts, pool.size))
    hits = table == np.repeat(group_min, lengths, axis=1)
    first = pool.size - np.maximum.reduceat(hits * (pool.size - np.arange(pool.size)), starts, axis=1)
    rows = np.arange(cells)[:, None]
    high = np.maximum.reduceat(pool, starts)
    low = np.minimum.reduceat(pool, starts)
    merged = _Front(
        front.scope,
        front.shape,
        low if optimistic else high,
        group_min.reshape(*front.shape, starts.size),
        var=front.var,
        pick=front.pick[rows, first],
        prov=front.prov[rows, first, :],
        children=front.children,
        bound=front.bound * _ratio(high, low),
        depth=front.depth + 1,
        floor_bytes=front.floor_bytes,
        floor_s=front.floor_s,
    )
    # merging can leave a level no faster than a smaller one
    running = np.minimum.accumulate(group_min, axis=1)
    stale = np.zeros(group_min.shape, dtype=bool)
    stale[:, 1:] = group_min[:, 1:] >= running[:, :-1]
    assert merged.time is not None
    merged.time.reshape(cells, starts.size)[stale] = np.inf
    return merged


def _trace(root: _Front, levels: np.ndarray, choice: np.ndarray) -> None:
    """Fill ``choice`` (points x ops) from the root's ``levels``, parents before children."""
    stack = [(root, levels)]
    while stack:
        front, level = stack.pop()
        if front.var is None:
            continue
        assert front.pick is not None and front.prov is not None
        if front.scope:
            cell = np.ravel_multi_index(tuple(choice[:, x] for x in front.scope), front.shape)
        else:
            cell = np.zeros(level.size, dtype=np.int64)
        choice[:, front.var] = front.pick[cell, level]
        for j, child in enumerate(front.children):
            stack.append((child, front.prov[cell, level, j].astype(np.int64)))


def _root_points(roots: Sequence[_Front]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Pareto points of the sum of the components' root sets: (time, memory, level per root)."""
    time = np.zeros(1)
    memory = np.zeros(1)
    picks: list[np.ndarray] = []
    for root in roots:
        assert root.time is not None
        row = root.time.reshape(-1)
        levels = np.flatnonzero(np.isfinite(row))
        t = (time[:, None] + row[levels][None, :]).ravel()
        m = (memory[:, None] + root.pool[levels][None, :]).ravel()
        previous = np.repeat(np.arange(time.size), levels.size)
        mine = np.tile(levels, time.size)
        keep = np.flatnonzero(pareto_mask(t, m))
        time, memory = t[keep], m[keep]
        picks = [p[previous[keep]] for p in picks] + [mine[keep]]
    return time, memory, picks


def _limits(
    tables: CostTables, memory_limit_bytes: float | None, time_limit_s: float | None, weight: float = 0.0
) -> _Prune | None:
    """The slacks of :class:`_Prune` for these limits (``None``: no limit given)."""
    if memory_limit_bytes is None and time_limit_s is None:
        return None
    if memory_limit_bytes is None:
        weight = 0.0  # the weighted bound needs the memory limit
    floors_m, floors_t, scale_m, scale_t = 0.0, 0.0, 0.0, 0.0
    for t, m in zip(tables.node_time_s, tables.node_memory_bytes):
        ok = np.isfinite(t) & np.isfinite(m)
        if not ok.any():
            return None  # no finite point at all: nothing to prune
        weighted = t[ok] + weight * m[ok] if weight else t[ok]
        floors_m += float(m[ok].min())
        floors_t += float(weighted.min())
        scale_m += abs(float(m[ok].min()))
        scale_t += float(np.abs(weighted).max())
    memory_slack = np.inf
    if memory_limit_bytes is not None:
        limit = float(memory_limit_bytes)
        memory_slack = limit - tables.constant_memory_bytes - floors_m
        memory_slack += 1e-9 * (abs(limit) + abs(tables.constant_memory_bytes) + scale_m)
    time_slack = None
    nonnegative = all(not (e.time_s < 0).any() for e in tables.edges)  # edges add >= 0 to a completion
    if time_limit_s is not None and nonnegative:
        target = float(time_limit_s) + (weight * float(memory_limit_bytes) if weight else 0.0)  # type: ignore[arg-type]
        constant = tables.constant_time_s + weight * tables.constant_memory_bytes
        time_slack = target - constant - floors_t
        time_slack += 1e-9 * (abs(target) + abs(constant) + scale_t)
    return _Prune(memory_slack_bytes=memory_slack, time_slack_s=time_slack, weight_s_per_byte=weight)


def pareto_frontier(
    tables: CostTables,
    *,
    epsilon: float = DEFAULT_EPSILON,
    max_points: int = DEFAULT_MAX_POINTS,
    order: Sequence[int] | OrderChoice | None = None,
    use_blocks: bool = True,
    plan: EliminationPlan | None = None,
    max_work: float | None = None,
    memory_limit_bytes: float | None = None,
    time_limit_s: float | None = None,
    limit_weight_s_per_byte: float = 0.0,
    deadline_s: float | None = None,
    max_step_bytes: float | None = None,
) -> FrontierResult:
    r"""The (time, memory) Pareto frontier by FT elimination, every point with its full choice.

    Parameters
    ----------
    tables:
        The search problem.
    epsilon:
        Relative width of the memory buckets (0: exact frontier). See the module docstring for the
        guarantee; the result states it (``bound_text()``).
    max_points:
        Cap on the memory levels of one factor (coarser buckets where exceeded).
    order:
        Elimination order of all ops; default: chosen, with block reuse where it pays.
    use_blocks:
        Allow block reuse.
    plan:
        An elimination plan from :func:`planner.search.blocks.plan_elimination` for these tables
        (overrides ``order`` and ``use_blocks``).
    max_work:
        Budget of summed entries (each elimination counts its combinations of looped levels x
        (configurations x cells x vector levels + a fixed cost per combination), an upper bound of
        its work, before it starts); ``None``: no budget.
        The DP table's size alone does not tell the frontier's cost, which also grows with the
        memory levels of every factor an elimination combines.
    memory_limit_bytes, time_limit_s:
        Drop, during elimination, every entry all of whose completions need more memory (bytes per
        device) or more time (seconds; used only when every node and edge time is >= 0) than these
        (see :class:`_Prune`): the result is then the frontier of the points within both limits
        (``exact`` says whether that part is exact), found with far fewer memory levels. ``None``:
        no limit. A point just over a limit (by float rounding) may remain.
    limit_weight_s_per_byte:
        :math:`w \ge 0` of the weighted time bound (:class:`_Prune`; with both limits): entries
        whose every completion has :math:`T + wM` over ``time_limit_s + w * memory_limit_bytes``
        are dropped too. Only at ``epsilon = 0`` (bucketed levels are not exact memories).
    deadline_s:
        ``time.perf_counter()`` value past which no further elimination starts
        (:class:`FrontierTooCostly`, as an exhausted ``max_work``); ``None``: none.
    max_step_bytes:
        Bytes one elimination's bucketing may allocate, predicted before it does
        (:func:`planner.search.budget.frontier_step_bytes`; :class:`FrontierTooCostly` when
        over); ``None``: no cap.

    Returns
    -------
    FrontierResult
        Points sorted by time (memory strictly decreasing), values from ``tables.evaluate``.

    Raises
    ------
    FrontierTooCostly
        The budget ran out (nothing is returned; callers fall back to another method).

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.exhaustive import exhaustive_frontier
    >>> tables = chain_tables([3, 4, 2, 5], seed=7, extra_edges=[(0, 3)])
    >>> ours = pareto_frontier(tables, epsilon=0.0)
    >>> oracle = exhaustive_frontier(tables)
    >>> ours.exact, [(p.time_s, p.memory_bytes) for p in ours.points] == [
    ...     (p.time_s, p.memory_bytes) for p in oracle.points]
    (True, True)
    """
    check_tables(tables)
    _check_arguments(epsilon, max_points, limit_weight_s_per_byte)
    if plan is None:
        plan = plan_elimination(tables, order=order, use_blocks=use_blocks)
    weight = float(limit_weight_s_per_byte) if epsilon == 0 else 0.0
    prune = _limits(tables, memory_limit_bytes, time_limit_s, weight)
    roots, _, _, choices = _run(tables, plan, epsilon, max_points, prune, max_work, deadline_s, max_step_bytes)
    bound = max([1.0, *(float(r.bound) for r in roots)])
    return FrontierResult(
        points=_evaluated_points(tables, choices),
        epsilon=float(epsilon),
        exact=bound == 1.0,
        max_table_cells=plan.max_table_cells,
        order_name=plan.name,
        method="elimination",
        memory_bound_factor=bound,
        bucket_depth=max([0, *(int(r.depth) for r in roots)]),
    )


def _check_arguments(epsilon: float, max_points: int, limit_weight_s_per_byte: float) -> None:
    """:class:`InputError` for a bucket width, point cap or limit weight :func:`pareto_frontier`
    cannot take."""
    if not (np.isfinite(epsilon) and epsilon >= 0):
        raise InputError(f"epsilon must be a finite number >= 0 (got {epsilon}); 0 means exact")
    if max_points < 1:
        raise InputError(f"max_points must be at least 1 (got {max_points})")
    if not (np.isfinite(limit_weight_s_per_byte) and limit_weight_s_per_byte >= 0):
        raise InputError(f"limit_weight_s_per_byte must be finite and >= 0 (got {limit_weight_s_per_byte})")


def _evaluated_points(tables: CostTables, choices: np.ndarray) -> tuple[FrontierPoint, ...]:
    """The Pareto-optimal finite points among ``choices`` (``(n, num_ops)``), priced by
    ``evaluate_many`` (the traced sums may differ in the last bits), sorted by time."""
    time_s, memory = evaluate_many(tables, choices)
    keep = np.flatnonzero(pareto_mask(time_s, memory) & np.isfinite(time_s) & np.isfinite(memory))
    keep = keep[np.argsort(time_s[keep], kind="stable")]
    return tuple(
        FrontierPoint(time_s=float(time_s[i]), memory_bytes=float(memory[i]), choice=choices[i]) for i in keep
    )


def relaxed_points(
    tables: CostTables,
    *,
    epsilon: float,
    memory_limit_bytes: float,
    time_limit_s: float | None = None,
    limit_weight_s_per_byte: float = 0.0,
    plan: EliminationPlan | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
    max_work: float | None = None,
    deadline_s: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""A *relaxed* frontier within the limits: each bucket keeps its least memory instead of its largest.

    By the induction of the module docstring with every inequality on memory reversed, for every
    choice within the limits with cost :math:`(T^*, M^*)` some returned pair has :math:`T \le T^*`
    and :math:`M \le M^*` (a lower bound; the pair's own choice may need up to the bucket ratio more
    memory). So the least time of the pairs with :math:`M \le L` is a lower bound of the fastest
    choice within :math:`L`, found with bucketed (few) memory levels. Pruning as
    :func:`pareto_frontier`'s limits (sound on least memories, at any epsilon).

    Returns
    -------
    tuple of ndarray
        ``(P,)`` seconds and ``(P,)`` bytes as the elimination summed them (lower bounds), and
        ``(P, num_ops)`` the choice traced for each (to price with ``evaluate_many``).
    """
    check_tables(tables)
    if plan is None:
        plan = plan_elimination(tables)
    prune = _limits(tables, memory_limit_bytes, time_limit_s, float(limit_weight_s_per_byte))
    if prune is None:  # a problem without finite points: nothing to return
        empty = np.zeros(0)
        return empty, empty, np.zeros((0, tables.num_ops), dtype=np.int64)
    prune = dataclasses.replace(prune, optimistic=True)
    _, time_s, memory, choices = _run(tables, plan, epsilon, max_points, prune, max_work, deadline_s)
    return time_s, memory, choices


def _run(
    tables: CostTables,
    plan: EliminationPlan,
    epsilon: float,
    max_points: int,
    prune: _Prune | None,
    max_work: float | None,
    deadline_s: float | None,
    max_step_bytes: float | None = None,
) -> tuple[list[_Front], np.ndarray, np.ndarray, np.ndarray]:
    """The elimination: roots, the root points' summed (time, memory) and their traced choices."""
    sizes = np.array([t.shape[0] for t in tables.node_time_s], dtype=np.int64)
    unary_cache: dict[tuple[int, int], _Front] = {}
    factors: list = []
    for i, (t, m) in enumerate(zip(tables.node_time_s, tables.node_memory_bytes)):
        key = (id(t), id(m))  # shared arrays give one pool and table (scope renamed below)
        if key not in unary_cache:
            unary_cache[key] = _unary(i, np.asarray(t, np.float64), np.asarray(m, np.float64), epsilon, prune)
        shared = unary_cache[key]
        factors.append(
            _Front(
                (i,), shared.shape, shared.pool, shared.time, bound=shared.bound, depth=shared.depth,
                floor_bytes=shared.floor_bytes, floor_s=shared.floor_s,
            )  # fmt: skip
        )
    factors += [_Input((e.u, e.v), np.asarray(e.time_s, np.float64)) for e in tables.edges]
    budget = None if max_work is None and deadline_s is None else [float("inf") if max_work is None else float(max_work)]
    if budget is not None and deadline_s is not None:
        budget.append(float(deadline_s))  # checked before each elimination (--time-limit)
    if max_step_bytes is not None:  # [work, deadline, bytes per step] (_charge_work)
        budget = [*(budget or [float("inf")]), *([] if deadline_s is not None else [float("inf")]), float(max_step_bytes)]
    roots = execute_plan(
        plan, factors, lambda v, fs: _eliminate(v, fs, sizes, epsilon, max_points, budget, prune)
    )
    time_s, memory, levels = _root_points(roots)
    choices = np.full((time_s.size, tables.num_ops), -1, dtype=np.int64)
    for root, level in zip(roots, levels):
        _trace(root, level, choices)
    if (choices < 0).any():
        raise RuntimeError("internal error: a frontier point misses an op's choice")
    return roots, tables.constant_time_s + time_s, tables.constant_memory_bytes + memory, choices
