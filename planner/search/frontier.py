r"""FT: the (time, memory) Pareto frontier by the same variable elimination, on Pareto sets.

TensorOpt's FT runs PaSE's elimination where each table cell holds, instead of one minimum, the
Pareto set of (time, memory) pairs of the ops eliminated so far. Memory is a sum of per-op terms
and edges carry time only, which the code exploits below.

Data layout
    A set factor (:class:`_SetFactor`) over a scope of ops stores all its cells' points in flat
    arrays sorted by cell (CSR: ``offsets``, ``time``, ``memory``); every point keeps back-pointers
    (``pick``: the eliminated op's configuration, ``children``: the point used in each consumed
    set factor), so any point can be traced back to a full per-op choice (:func:`_trace`).

Eliminating op :math:`v` (:func:`_eliminate`)
    1. Join the set factors that touch :math:`v` (:func:`_join`): per cell of the union scope, all
       pairwise sums (Minkowski sum), then a Pareto filter.
    2. Add the unary term of :math:`v` and the edges to ops already in that scope to each point;
       these are the *candidates*, grouped by the rest of the scope (:math:`D_P`).
    3. The edges to the other ops :math:`D_X` shift a candidate's time by
       :math:`E(c_v, c_{D_X})` but never its memory, so candidates are sorted by memory bucket once
       and each new cell :math:`(c_{D_P}, c_{D_X})` is a row of a dense
       ``(candidates, rows)`` time matrix: per bucket the fastest (``minimum.reduceat``), then a
       running minimum over buckets keeps the Pareto points (strictly faster than every smaller
       bucket).
    4. Candidates that some candidate with no more memory beats in every row (its worst time
       :math:`\le` their best) are dropped before step 3 (exact).

Bounding the set sizes (:func:`_bucket_keys`)
    Memory is bucketed on a geometric grid: bucket :math:`\lfloor \ln M / \ln(1+\epsilon)
    \rfloor`; per cell and bucket only the fastest point survives. ``epsilon = 0`` buckets by exact
    value, which gives the exact frontier. A replaced point :math:`p` is covered by the kept point
    :math:`q` of its bucket: :math:`t_q \le t_p`, :math:`m_q < (1+\epsilon) m_p`; sums preserve
    the ratio (:math:`(1+a)x + (1+b)y \le (1+\max(a,b))(x+y)`) and Pareto filters only replace a
    point by one that dominates it, so by induction over the elimination tree:

    .. math::

        \forall (T^*, M^*) \text{ Pareto-optimal},\ \exists \text{ listed } (T, M):\quad
        T \le T^*,\quad M \le \beta M^*,\qquad \beta = \max_{\text{paths}} \prod r_i
        \le (1+\epsilon)^{d}

    where :math:`r_i` is the largest measured ratio :math:`m_q / m_p` of a bucketed filter on the
    path and :math:`d` the number of bucketed filters on the longest path from an op to the root
    (``bucket_depth``). The measured :math:`\beta` is ``memory_bound_factor``; ``exact`` is
    :math:`\beta = 1`. A per-cell cap ``max_points`` re-buckets an oversized cell with a doubled
    epsilon until it fits; the ratios it incurs are measured the same way.

References
----------
Z. Cai, X. Yan, K. Ma, et al., "TensorOpt: Exploring the Tradeoffs in Distributed DNN Training with
Auto-Parallelism", IEEE TPDS 33(8), 2022 (the FT algorithm).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables
from planner.search.blocks import EliminationPlan, execute_plan, plan_elimination
from planner.search.ordering import OrderChoice
from planner.search.pareto import pareto_mask
from planner.search.problem import check_tables, evaluate_many
from planner.search.results import FrontierPoint, FrontierResult

__all__ = ["pareto_frontier", "FrontierResult", "FrontierPoint", "DEFAULT_EPSILON", "DEFAULT_MAX_POINTS"]

DEFAULT_EPSILON = 0.01
"""Default relative width of the memory buckets (1%)."""
DEFAULT_MAX_POINTS = 512
"""Default cap on the points of one table cell."""

# Elements of the dense (candidates x rows) time matrix handled at once (float64: 16 MiB).
_CHUNK = 1 << 21
_LOW_BUCKET = -1  # memories <= 0 share one bucket below every positive one (keys of positives >= 0)
# Largest (cell, bucket) grid of the sort-free filter (float64: 64 MiB).
_DENSE_SLOTS = 1 << 23


class _Input:
    """An input table: the unary term of one op (time, memory) or an edge (time)."""

    __slots__ = ("scope", "time", "memory")

    def __init__(self, scope: tuple[int, ...], time: np.ndarray, memory: np.ndarray | None) -> None:
        self.scope = scope
        self.time = time
        self.memory = memory

    def renamed(self, rho: Mapping[int, int], memo: dict) -> "_Input":
        return self


class _SetFactor:
    """Pareto sets of (time, memory) per cell of ``scope``, with back-pointers."""

    __slots__ = ("scope", "shape", "offsets", "time", "memory", "var", "pick", "children", "bound", "depth")

    def __init__(
        self,
        scope: tuple[int, ...],
        shape: tuple[int, ...],
        offsets: np.ndarray | None,
        time: np.ndarray | None,
        memory: np.ndarray | None,
        *,
        var: int | None = None,
        pick: np.ndarray | None = None,
        children: tuple[tuple["_SetFactor", np.ndarray], ...] = (),
        bound: float = 1.0,
        depth: int = 0,
    ) -> None:
        self.scope = scope
        self.shape = shape
        self.offsets = offsets
        """``(cells + 1,)`` int64: points of cell ``c`` are ``offsets[c]:offsets[c+1]``."""
        self.time = time
        self.memory = memory
        self.var = var
        """The op eliminated to make this factor (``None`` for joins and unit factors)."""
        self.pick = pick
        """Per point, the configuration of ``var``."""
        self.children = children
        """Per consumed set factor, the index of the point used, per point."""
        self.bound = bound
        """Measured memory ratio bound of the points (see the module docstring)."""
        self.depth = depth
        """Bucketed filters on the longest path below."""

    def release(self) -> None:
        """Drop the values once consumed; back-pointers stay for tracing."""
        self.offsets = self.time = self.memory = None

    def renamed(self, rho: Mapping[int, int], memo: dict) -> "_SetFactor":
        key = id(self)
        if key not in memo:
            memo[key] = _SetFactor(
                tuple(rho[v] for v in self.scope),
                self.shape,
                self.offsets,
                self.time,
                self.memory,
                var=None if self.var is None else rho[self.var],
                pick=self.pick,
                children=tuple((c.renamed(rho, memo), p) for c, p in self.children),
                bound=self.bound,
                depth=self.depth,
            )
        return memo[key]


def _mantissa_bits(epsilon: float) -> int:
    """Leading mantissa bits kept by the memory grid: relative bucket width <= 2**-bits <= epsilon."""
    return min(52, max(0, int(np.ceil(-np.log2(epsilon)))))


def _bucket_keys(memory: np.ndarray, epsilon: float) -> np.ndarray:
    r"""Integer memory bucket of each point, monotone in memory.

    ``epsilon = 0``: the rank of the exact value. Otherwise the float's exponent and its leading
    ``b`` mantissa bits (:func:`_mantissa_bits`): a geometric grid whose buckets are at most
    :math:`2^{-b} \le \epsilon` wide relative to their lower edge (one shift, no logarithm).
    Memories <= 0 share the lowest bucket.
    """
    if epsilon == 0:
        return np.unique(memory, return_inverse=True)[1].astype(np.int64).reshape(-1)
    positive = memory > 0
    keys = np.where(positive, memory, 1.0).view(np.int64) >> (52 - _mantissa_bits(epsilon))
    return np.where(positive, keys, _LOW_BUCKET)


def _ragged_filter(
    cell: np.ndarray, time: np.ndarray, memory: np.ndarray, epsilon: float, num_cells: int | None = None
) -> tuple[np.ndarray, float]:
    """Bucketed Pareto filter of points grouped by ``cell`` (cell ids ``0..num_cells-1``).

    Returns the kept indices, sorted by cell, and the measured memory ratio of the merges.
    """
    finite = np.flatnonzero(np.isfinite(time) & np.isfinite(memory))
    if finite.size == 0:
        return finite, 1.0
    c, t, m = cell[finite], time[finite], memory[finite]
    keys = _bucket_keys(m, epsilon)
    if epsilon > 0:
        positive = keys != _LOW_BUCKET
        if positive.any() and not positive.all():  # keep the grid tight: zero memory just below
            keys = np.where(positive, keys, int(keys[positive].min()) - 1)
    low, high = int(keys.min()), int(keys.max())
    cells = int(c.max()) + 1 if num_cells is None else num_cells
    if epsilon > 0 and high - low < _DENSE_SLOTS and cells * (high - low + 1) <= _DENSE_SLOTS:
        keep, ratio = _dense_filter(c, t, m, keys - low, high - low + 1, cells)
    else:
        keep, ratio = _sorted_filter(c, t, m, keys, epsilon)
    return finite[keep], ratio


def _dense_filter(
    cell: np.ndarray, time: np.ndarray, memory: np.ndarray, bucket: np.ndarray, span: int, cells: int
) -> tuple[np.ndarray, float]:
    """:func:`_ragged_filter` on a dense (cell, bucket) grid: scatter-min, then a running minimum.

    Per slot the fastest point (lowest index on ties); a slot is kept when its time is below every
    smaller bucket's of the same cell. No sort: a few passes of ``ufunc.at`` over the points.
    """
    slot = cell * span + bucket
    fastest = np.full(cells * span, np.inf)
    np.minimum.at(fastest, slot, time)
    hit = np.flatnonzero(time == fastest[slot])
    first = np.full(cells * span, time.size, dtype=np.int64)
    np.minimum.at(first, slot[hit], hit)
    grid = fastest.reshape(cells, span)
    running = np.minimum.accumulate(grid, axis=1)
    keep_slot = np.empty(grid.shape, dtype=bool)
    keep_slot[:, 0] = np.isfinite(grid[:, 0])
    np.less(grid[:, 1:], running[:, :-1], out=keep_slot[:, 1:])
    kept_slots = np.flatnonzero(keep_slot)
    keep = first[kept_slots]
    ratio = 1.0
    if keep.size < time.size:
        floor = np.full(cells * span, np.inf)
        np.minimum.at(floor, slot, memory)
        low = floor[kept_slots]
        positive = low > 0
        if positive.any():
            ratio = max(1.0, float((memory[keep][positive] / low[positive]).max()))
    return keep, ratio


def _sorted_filter(
    cell: np.ndarray, time: np.ndarray, memory: np.ndarray, keys: np.ndarray, epsilon: float
) -> tuple[np.ndarray, float]:
    """:func:`_ragged_filter` by sorting: (cell, time, bucket) order, then a segmented running
    minimum of the bucket rank (cells offset so earlier cells never interfere)."""
    rank = np.unique(keys, return_inverse=True)[1].astype(np.int64).reshape(-1)
    span = int(rank.max()) + 1
    order = np.lexsort((rank, time, cell))
    c_s, r_s = cell[order], rank[order]
    combined = r_s + (int(c_s[-1]) - c_s) * span
    running = np.minimum.accumulate(combined)
    keep = np.empty(order.size, dtype=bool)
    keep[0] = True
    keep[1:] = combined[1:] < running[:-1]
    ratio = 1.0
    if epsilon > 0 and not keep.all():
        last = np.maximum.accumulate(np.where(keep, np.arange(order.size), 0))
        m_s = memory[order]
        merged = ~keep & (r_s == r_s[last]) & (m_s > 0)
        if merged.any():
            ratio = max(1.0, float((m_s[last][merged] / m_s[merged]).max()))
    return order[keep], ratio


def _cell_index(sub: tuple[int, ...], sub_shape: tuple[int, ...], full: tuple[int, ...], full_shape: tuple[int, ...]) -> np.ndarray:
    """For every cell of ``full`` (flat), the flat index of its projection onto ``sub``."""
    index = np.zeros(full_shape, dtype=np.int64)
    stride = 1
    for x, k in zip(reversed(sub), reversed(sub_shape)):
        axis = full.index(x)
        view = [1] * len(full)
        view[axis] = k
        index += (np.arange(k, dtype=np.int64) * stride).reshape(view)
        stride *= k
    return index.reshape(-1)


def _csr(cells: np.ndarray, num_cells: int) -> np.ndarray:
    offsets = np.zeros(num_cells + 1, dtype=np.int64)
    np.cumsum(np.bincount(cells, minlength=num_cells), out=offsets[1:])
    return offsets


def _join(a: _SetFactor, b: _SetFactor, epsilon: float, max_points: int) -> _SetFactor:
    """Minkowski sum of two set factors per cell of their union scope, Pareto-filtered."""
    assert a.offsets is not None and b.offsets is not None and a.time is not None and b.time is not None
    assert a.memory is not None and b.memory is not None
    scope = a.scope + tuple(x for x in b.scope if x not in a.scope)
    sizes = dict(zip(a.scope, a.shape)) | dict(zip(b.scope, b.shape))
    shape = tuple(sizes[x] for x in scope)
    num_cells = int(np.prod(shape, dtype=np.int64))
    ia = _cell_index(a.scope, a.shape, scope, shape)
    ib = _cell_index(b.scope, b.shape, scope, shape)
    na = np.diff(a.offsets)[ia]
    nb = np.diff(b.offsets)[ib]
    pairs = na * nb
    ends = np.cumsum(pairs)
    max_cells = num_cells
    if epsilon > 0 and a.time.size and b.time.size:
        # bucket range of any sum, to size chunks for the dense filter
        sums = np.array([a.memory.min() + b.memory.min(), a.memory.max() + b.memory.max()])
        keys = _bucket_keys(np.maximum(sums, np.finfo(float).tiny), epsilon)
        max_cells = max(1, _DENSE_SLOTS // int(keys[1] - keys[0] + 2))
    kept_cells, kept_a, kept_b = [], [], []
    ratio = 1.0
    first = 0
    while first < num_cells:
        # a run of cells whose pairs fit one chunk (at least one cell)
        base = ends[first - 1] if first else 0
        last = max(first + 1, int(np.searchsorted(ends, base + _CHUNK, side="right")))
        last = min(last, first + max_cells, num_cells)
        counts = pairs[first:last]
        total = int(counts.sum())
        if total:
            local = np.repeat(np.arange(last - first, dtype=np.int64), counts)
            within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
            cell_rep = local + first
            nb_rep = nb[cell_rep]
            pa = a.offsets[ia[cell_rep]] + within // nb_rep
            pb = b.offsets[ib[cell_rep]] + within % nb_rep
            keep, r = _ragged_filter(
                local, a.time[pa] + b.time[pb], a.memory[pa] + b.memory[pb], epsilon, last - first
            )
            ratio = max(ratio, r)
            kept_cells.append(cell_rep[keep])
            kept_a.append(pa[keep])
            kept_b.append(pb[keep])
        first = last
    cell = np.concatenate(kept_cells) if kept_cells else np.zeros(0, np.int64)
    pa = np.concatenate(kept_a) if kept_a else np.zeros(0, np.int64)
    pb = np.concatenate(kept_b) if kept_b else np.zeros(0, np.int64)
    joined = _SetFactor(
        scope,
        shape,
        _csr(cell, num_cells),
        a.time[pa] + b.time[pb],
        a.memory[pa] + b.memory[pb],
        children=((a, pa), (b, pb)),
        bound=max(a.bound, b.bound) * ratio,
        depth=max(a.depth, b.depth) + (epsilon > 0),
    )
    return _cap(joined, epsilon, max_points)


def _thin(cell: np.ndarray, time: np.ndarray, memory: np.ndarray, max_points: int) -> tuple[np.ndarray, float]:
    """Keep ``max_points`` evenly spaced points (fastest included) of each cell, in time order.

    Input must be a Pareto set per cell. A dropped point is covered by the nearest faster kept
    point; the returned ratio is the largest memory ratio of such a cover (``inf`` when a point
    with zero memory is covered by one with positive memory).
    """
    order = np.lexsort((time, cell))
    c = cell[order]
    start = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1])))
    count = np.diff(np.append(start, c.size))
    first = np.repeat(start, count)
    n = np.repeat(count, count)
    pos = np.arange(c.size) - first
    if max_points == 1:
        keep = pos == 0
    else:
        # kept positions are floor(q (n-1) / (max_points-1)), q = 0..max_points-1
        q = -((-pos * (max_points - 1)) // np.maximum(n - 1, 1))  # ceil
        keep = (n <= max_points) | ((q * (n - 1)) // (max_points - 1) == pos)
    last = np.maximum.accumulate(np.where(keep, np.arange(c.size), 0))
    m = memory[order]
    dropped = ~keep
    ratio = 1.0
    if dropped.any():
        cover, mine = m[last][dropped], m[dropped]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = np.where(mine > 0, cover / mine, np.where(cover > 0, np.inf, 1.0))
        ratio = max(1.0, float(ratios.max()))
    return np.sort(order[keep]), ratio


def _cap(factor: _SetFactor, epsilon: float, max_points: int) -> _SetFactor:
    """Re-bucket a factor with a coarser grid until no cell holds more than ``max_points``.

    Past a factor of 2**20 in memory per bucket, cells are thinned evenly instead (:func:`_thin`).
    """
    assert factor.offsets is not None and factor.time is not None and factor.memory is not None
    counts = np.diff(factor.offsets)
    if counts.size == 0 or int(counts.max()) <= max_points:
        return factor
    coarse = max(2 * epsilon, 1e-3)
    cell = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    while True:
        keep, ratio = _ragged_filter(cell, factor.time, factor.memory, coarse)
        kept_counts = np.bincount(cell[keep], minlength=counts.size)
        if int(kept_counts.max()) <= max_points:
            break
        if coarse > 1 << 20:
            sub, thin_ratio = _thin(cell[keep], factor.time[keep], factor.memory[keep], max_points)
            keep, ratio = keep[sub], ratio * thin_ratio
            break
        coarse *= 2
    keep = np.sort(keep)  # back to cell order
    return _SetFactor(
        factor.scope,
        factor.shape,
        _csr(cell[keep], counts.size),
        factor.time[keep],
        factor.memory[keep],
        children=((factor, keep.astype(np.int64)),),
        bound=factor.bound * ratio,
        depth=factor.depth + 1,
    )


def _unit(v: int, size: int) -> _SetFactor:
    """One zero-cost point per configuration of ``v``: the start when no set factor touches it."""
    return _SetFactor(
        (v,), (size,), np.arange(size + 1, dtype=np.int64), np.zeros(size), np.zeros(size)
    )


def _segmented_exclusive_min(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """For each position, the minimum of ``values`` at earlier positions of the same group.

    ``group`` must be non-decreasing. Exact for floats: values are replaced by their ranks so the
    group offsets are integers (``inf`` where there is no earlier position).
    """
    uniq, rank = np.unique(values, return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    span = uniq.size
    dense_group = np.concatenate(([0], np.cumsum(group[1:] != group[:-1])))
    offset = (int(dense_group[-1]) - dense_group) * span
    running = np.minimum.accumulate(rank + offset)
    out = np.full(values.shape, np.inf)
    same = np.flatnonzero(dense_group[1:] == dense_group[:-1]) + 1
    out[same] = uniq[running[same - 1] - offset[same]]
    return out


def _eliminate(v: int, factors: list, sizes: np.ndarray, epsilon: float, max_points: int) -> _SetFactor:
    """Eliminate op ``v`` from the set and input factors that touch it (steps 1-4 of the docs)."""
    sets = [f for f in factors if isinstance(f, _SetFactor)]
    inputs = [f for f in factors if isinstance(f, _Input)]
    k_v = int(sizes[v])
    # 1. join the set factors touching v
    joined = sets[0] if sets else _unit(v, k_v)
    for other in sets[1:]:
        joined = _join(joined, other, epsilon, max_points)
    if len(sets) > 1:
        for s in sets:
            s.release()
    assert joined.offsets is not None and joined.time is not None and joined.memory is not None
    if v not in joined.scope:
        raise RuntimeError("internal error: set factor without the eliminated op")
    # 2. candidates: points of the joined factor plus v's own terms and edges inside its scope
    counts = np.diff(joined.offsets)
    point_cell = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    coords = np.unravel_index(point_cell, joined.shape)
    position = {x: i for i, x in enumerate(joined.scope)}
    c_v = coords[position[v]]
    time = joined.time.copy()
    memory = joined.memory.copy()
    outside: dict[int, np.ndarray] = {}
    for f in inputs:
        if len(f.scope) == 1:
            time += f.time[c_v]
            assert f.memory is not None
            memory += f.memory[c_v]
            continue
        a, b = f.scope
        table, x = (f.time, b) if a == v else (f.time.T, a)
        if x in position:
            time += table[c_v, coords[position[x]]]
        else:
            outside[x] = outside[x] + table if x in outside else table
    rest_p = tuple(x for x in joined.scope if x != v)
    shape_p = tuple(int(sizes[x]) for x in rest_p)
    group = (
        np.ravel_multi_index(tuple(coords[position[x]] for x in rest_p), shape_p)
        if rest_p
        else np.zeros(point_cell.size, dtype=np.int64)
    )
    rest_x = tuple(sorted(outside))
    shape_x = tuple(int(sizes[x]) for x in rest_x)
    rows = int(np.prod(shape_x, dtype=np.int64))
    scope = rest_p + rest_x
    shape = shape_p + shape_x
    num_cells = int(np.prod(shape, dtype=np.int64))
    pointer = np.arange(point_cell.size, dtype=np.int64)

    finite = np.isfinite(time) & np.isfinite(memory)
    time, memory, c_v, group, pointer = time[finite], memory[finite], c_v[finite], group[finite], pointer[finite]
    keys = _bucket_keys(memory, epsilon)
    order = np.lexsort((keys, group))
    time, memory, c_v, group, pointer, keys = (
        time[order], memory[order], c_v[order], group[order], pointer[order], keys[order]
    )
    n = time.size
    new_segment = np.ones(n, dtype=bool)
    if n:
        new_segment[1:] = (group[1:] != group[:-1]) | (keys[1:] != keys[:-1])
    segment = np.cumsum(new_segment) - 1
    starts = np.flatnonzero(new_segment)
    smallest_memory = np.minimum.reduceat(memory, starts) if n else np.zeros(0)

    # 4. drop candidates beaten in every row by one with no more memory (sorted before them)
    if outside and n > 1:
        low = sum(t.min(axis=1) for t in outside.values())
        high = sum(t.max(axis=1) for t in outside.values())
        best_case = time + low[c_v]
        worst_case = time + high[c_v]
        resort = np.lexsort((np.arange(n), worst_case, keys, group))
        beaten = _segmented_exclusive_min(worst_case[resort], group[resort]) <= best_case[resort]
        survivors = resort[~beaten]
        survivors.sort()  # back to (group, bucket) order; ties inside a bucket by position
        time, memory, c_v, group, pointer, segment = (
            time[survivors], memory[survivors], c_v[survivors], group[survivors],
            pointer[survivors], segment[survivors],
        )  # fmt: skip
        n = time.size
        new_segment = np.ones(n, dtype=bool)
        new_segment[1:] = segment[1:] != segment[:-1]
        starts = np.flatnonzero(new_segment)

    # 3. dense rows: per bucket the fastest, then the running minimum over buckets of a group
    seg_of = np.cumsum(new_segment) - 1  # local segment of each candidate
    seg_lengths = np.diff(np.append(starts, n))
    seg_group = group[starts]
    seg_memory_floor = smallest_memory[segment[starts]] if n else np.zeros(0)
    dense_group = np.concatenate(([0], np.cumsum(seg_group[1:] != seg_group[:-1]))) if n else np.zeros(0, np.int64)
    num_groups = int(dense_group[-1]) + 1 if n else 0
    group_start = np.flatnonzero(np.concatenate(([True], dense_group[1:] != dense_group[:-1]))) if n else np.zeros(0, np.int64)
    local = np.arange(starts.size) - group_start[dense_group] if n else np.zeros(0, np.int64)
    width = int(local.max()) + 1 if n else 0
    tables_x = [outside[x] for x in rest_x]
    out_cell, out_time, out_memory, out_pick, out_pointer = [], [], [], [], []
    ratio = 1.0
    step = max(1, _CHUNK // max(n, 1))
    for r0 in range(0, rows if n else 0, step):
        r1 = min(rows, r0 + step)
        if tables_x:
            x_coords = np.unravel_index(np.arange(r0, r1), shape_x)
            shift = tables_x[0][:, x_coords[0]]
            for t, xc in zip(tables_x[1:], x_coords[1:]):
                shift = shift + t[:, xc]
            matrix = time[:, None] + shift[c_v]
        else:
            matrix = time[:, None]
        fastest = np.minimum.reduceat(matrix, starts, axis=0)
        if num_groups == 1:
            running = np.minimum.accumulate(fastest, axis=0)
            previous = np.vstack([np.full((1, fastest.shape[1]), np.inf), running[:-1]])
        else:
            padded = np.full((num_groups, width + 1, fastest.shape[1]), np.inf)
            padded[dense_group, local + 1] = fastest
            running = np.minimum.accumulate(padded, axis=1)
            previous = running[dense_group, local]
        keep = fastest < previous
        if not keep.any():
            continue
        hit = (matrix == np.repeat(fastest, seg_lengths, axis=0)) & np.repeat(keep, seg_lengths, axis=0)
        cand, row = np.nonzero(hit)
        _, first = np.unique(seg_of[cand] * (r1 - r0) + row, return_index=True)
        cand, row = cand[first], row[first]
        seg = seg_of[cand]
        out_cell.append(group[cand] * rows + r0 + row)
        out_time.append(matrix[cand, row])
        out_memory.append(memory[cand])
        out_pick.append(c_v[cand])
        out_pointer.append(pointer[cand])
        if epsilon > 0:
            floor = seg_memory_floor[seg]
            positive = floor > 0
            if positive.any():
                ratio = max(ratio, float((memory[cand][positive] / floor[positive]).max()))
    if out_cell:
        cell = np.concatenate(out_cell)
        by_cell = np.argsort(cell, kind="stable")
        cell = cell[by_cell]
        new_time = np.concatenate(out_time)[by_cell]
        new_memory = np.concatenate(out_memory)[by_cell]
        pick = np.concatenate(out_pick)[by_cell]
        pointers = np.concatenate(out_pointer)[by_cell]
    else:
        cell = pointers = pick = np.zeros(0, dtype=np.int64)
        new_time = new_memory = np.zeros(0)
    joined_bound, joined_depth = joined.bound, joined.depth
    joined.release()
    result = _SetFactor(
        scope,
        shape,
        _csr(cell, num_cells),
        new_time,
        new_memory,
        var=v,
        pick=pick.astype(np.min_scalar_type(max(k_v - 1, 0))),
        children=((joined, pointers),),
        bound=joined_bound * ratio,
        depth=joined_depth + (epsilon > 0),
    )
    return _cap(result, epsilon, max_points)


def _trace(root: _SetFactor, num_points: int, num_ops: int) -> np.ndarray:
    """Full per-op choices of every point of ``root`` (follow the back-pointers down the tree)."""
    choice = np.full((num_points, num_ops), -1, dtype=np.int64)
    stack: list[tuple[_SetFactor, np.ndarray]] = [(root, np.arange(num_points, dtype=np.int64))]
    while stack:
        factor, points = stack.pop()
        if factor.var is not None:
            assert factor.pick is not None
            choice[:, factor.var] = factor.pick[points]
        for child, pointers in factor.children:
            stack.append((child, pointers[points]))
    return choice


def pareto_frontier(
    tables: CostTables,
    *,
    epsilon: float = DEFAULT_EPSILON,
    max_points: int = DEFAULT_MAX_POINTS,
    order: Sequence[int] | OrderChoice | None = None,
    use_blocks: bool = True,
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
        Cap on the points of one table cell (coarser buckets where exceeded).
    order:
        Elimination order of all ops; default: chosen, with block reuse where it pays.
    use_blocks:
        Allow block reuse.

    Returns
    -------
    FrontierResult
        Points sorted by time (memory strictly decreasing), values from ``tables.evaluate``.

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
    if not (np.isfinite(epsilon) and epsilon >= 0):
        raise InputError(f"epsilon must be a finite number >= 0 (got {epsilon}); 0 means exact")
    if max_points < 1:
        raise InputError(f"max_points must be at least 1 (got {max_points})")
    plan: EliminationPlan = plan_elimination(tables, order=order, use_blocks=use_blocks)
    sizes = np.array([t.shape[0] for t in tables.node_time_s], dtype=np.int64)
    factors: list = [
        _Input((i,), np.asarray(t, np.float64), np.asarray(m, np.float64))
        for i, (t, m) in enumerate(zip(tables.node_time_s, tables.node_memory_bytes))
    ]
    factors += [_Input((e.u, e.v), np.asarray(e.time_s, np.float64), None) for e in tables.edges]
    roots = execute_plan(plan, factors, lambda v, fs: _eliminate(v, fs, sizes, epsilon, max_points))
    if roots:
        root = roots[0]
        for other in roots[1:]:
            root = _join(root, other, epsilon, max_points)
    else:  # no ops at all: one empty strategy
        root = _SetFactor((), (), np.array([0, 1]), np.zeros(1), np.zeros(1))
    assert root.time is not None
    num_points = int(root.time.size)
    choices = _trace(root, num_points, tables.num_ops)
    if (choices < 0).any():
        raise RuntimeError("internal error: a frontier point misses an op's choice")
    time_s, memory = evaluate_many(tables, choices)
    keep = np.flatnonzero(pareto_mask(time_s, memory) & np.isfinite(time_s) & np.isfinite(memory))
    keep = keep[np.argsort(time_s[keep], kind="stable")]
    points = tuple(
        FrontierPoint(time_s=float(time_s[i]), memory_bytes=float(memory[i]), choice=choices[i]) for i in keep
    )
    bound = float(root.bound)
    return FrontierResult(
        points=points,
        epsilon=float(epsilon),
        exact=bound == 1.0,
        max_table_cells=plan.max_table_cells,
        order_name=plan.name,
        method="elimination",
        memory_bound_factor=bound,
        bucket_depth=int(root.depth),
    )
