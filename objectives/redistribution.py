r"""Re-layout of a tensor between its producer's output split and its consumer's input split.

For an edge :math:`u \to v` carrying tensor :math:`T`, every pair of configurations
:math:`(c_u, c_v)` gives each device a tile of :math:`T` it holds (u's output tile) and a tile it
needs (v's input tile). As in PaSE (DESIGN.md §5, edge rule), the volume a device must receive is

.. math::

    E_{fwd} = \prod_i t^v_i - I, \qquad
    I = [P_v \le P_u] \prod_i \min(t^u_i, t^v_i)

with :math:`t_i` the per-device tile extents and :math:`P` the devices each op runs on (times its
redundant replicas, :attr:`ConfigSpace.replicas`: a replicated op holds its output on every copy, so
Megatron's replicated LayerNorm feeds a column-parallel linear for free): a consumer
on more devices than the producer has devices that hold nothing (:math:`I = 0`). Unlike PaSE, the
producer's tile is replicated on all of its :math:`P_u` devices (partial sums are all-reduced inside
the op), so device counts, not tile counts, decide. Backward sends the gradient of :math:`T` the other
way: :math:`E_{bwd} = \prod_i t^u_i - [P_u \le P_v] \prod_i \min(t^u_i, t^v_i)`.

Node level. The tile rule assumes the best alignment of devices, which would let two placements of
the same split on the nodes (``ConfigSpace.inter_factors``) swap for free. So each node is also
treated as a holder: it holds the node tile :math:`N^u_i = n_i / e^u_i` (:math:`e` the inter-node part
of the axis' split) and its devices need data from their node tile :math:`N^v_i`; the share of a
device's tile its own node cannot supply must cross nodes:

.. math::

    C_{fwd} = \prod_i t^v_i \left(1 - [\nu_v \le \nu_u] \prod_i \frac{\min(N^u_i, N^v_i)}{N^v_i}\right)

(:math:`\nu` the nodes each op uses), and symmetrically :math:`C_{bwd}`. A direction moves
:math:`\max(E, C)` elements per device, :math:`C` of them over the inter-node link.

Merged axes. When an axis is indexed by several dims on one side (a folded Reshape:
``hidden -> heads x head_dim``), both sides are refined to common sub-axes (:func:`_refine`) and a
contiguous split of a dim is spread over its sub-axes outer-first, so splitting ``head_dim`` on one
side and ``hidden`` contiguously on the other is a real re-layout, not a free one. Sides whose
sub-axes do not nest fall back to whole-axis tiles.

Time per direction, all devices at once (``b`` bytes per element):

.. math::

    t = (\max(E, C) - C)\,b / bw_{intra} + \alpha_{intra}[\max(E, C) > C]
        + C\,b / bw_{inter} + \alpha_{inter}[C > 0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from objectives._common import axis_inter_matrix
from planner.core.cluster import Cluster
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, TensorAccess

__all__ = ["Redistribution", "ScatterRatios", "tile_extents", "redistribution", "redistribution_time_s", "scatter_ratios",
           "edge_scatter_ratios"]


_CHUNK_ROWS = 128
"""Rows of a ``(K_u, K_v)`` table assembled at once: small enough to stay in cache (:func:`scatter_ratios`)."""

_CHUNK_CELLS = 16_384
"""Cells of a ``(K_u, K_v)`` table :func:`redistribution_time_s` assembles at once: its seven work arrays of
this many cells (128 KiB each) stay in a core's L2 cache."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Redistribution:
    """Redistribution of one tensor over every pair of configurations (arrays ``(K_u, K_v)``)."""

    forward_elements: np.ndarray
    """Elements each device receives in forward: ``max(E, C)``."""
    backward_elements: np.ndarray
    """Elements each device receives in backward (the gradient)."""
    forward_inter_elements: np.ndarray
    """Of ``forward_elements``, those that cross nodes (``C``)."""
    backward_inter_elements: np.ndarray
    forward_s: np.ndarray
    backward_s: np.ndarray
    inter_s: np.ndarray
    """Seconds (both directions) spent on the inter-node link."""

    @property
    def time_s(self) -> np.ndarray:
        """Forward + backward seconds."""
        return self.forward_s + self.backward_s


def _side_sizes(op: Op, dims: tuple[str, ...], axis_size: int) -> list[int] | None:
    """Sizes of the dims indexing one axis, outer to inner, or None if they do not multiply to it."""
    if not dims:
        return [axis_size]
    sizes = []
    for name in dims:
        try:
            sizes.append(op.dim(name).size)
        except KeyError:
            return None
    return sizes if int(np.prod(sizes)) == axis_size else None


def _suffixes(sizes: list[int]) -> list[int]:
    out = [1]
    for size in reversed(sizes):
        out.append(out[-1] * size)
    return out  # 1, innermost, ..., axis size


def _refine(a: list[int] | None, b: list[int] | None) -> list[int] | None:
    """Common sub-axis sizes (outer to inner) of two decompositions of one axis, if they nest."""
    if a is None or b is None:
        return None
    bounds = sorted(set(_suffixes(a)) | set(_suffixes(b)))
    if any(hi % lo for lo, hi in zip(bounds, bounds[1:])):
        return None
    return [hi // lo for lo, hi in reversed(list(zip(bounds, bounds[1:])))]


def _factor_column(factors: np.ndarray, dim_names: tuple[str, ...], name: str) -> np.ndarray | float:
    try:
        return factors[:, dim_names.index(name)].astype(np.float64)
    except ValueError:
        return 1.0


def _axis_tiles(
    factors: np.ndarray, dim_names: tuple[str, ...], dims: tuple[str, ...], refined: list[int], sizes: list[int]
) -> np.ndarray:
    """``(R, len(refined))`` tile extents of one side over the refined sub-axes of one axis.

    A dim of size ``D`` split ``f`` ways holds a contiguous block of ``D / f`` elements; over its
    sub-axes (outer to inner, ``I_j`` the product of the sub-axes inside sub-axis ``j``) the block
    spans ``clip(D / f / I_j, 1, size_j)`` entries of sub-axis ``j``.
    """
    tiles = np.empty((factors.shape[0], len(refined)))
    inner_of = _suffixes(refined)[::-1][1:]  # product of refined sizes inside sub-axis j
    bounds = _suffixes(sizes)[::-1]  # axis size, ..., 1: each dim spans (bounds[i+1], bounds[i]]
    for j, sub in enumerate(refined):
        inner = inner_of[j]
        i = next(i for i in range(len(sizes)) if bounds[i + 1] <= inner < bounds[i])
        factor = _factor_column(factors, dim_names, dims[i]) if dims else 1.0
        block = (bounds[i] / bounds[i + 1]) / factor
        tiles[:, j] = np.clip(block / (inner / bounds[i + 1]), 1.0, float(sub))
    return tiles


def _tiles(
    factors: np.ndarray,
    dim_names: tuple[str, ...],
    op: Op,
    access: TensorAccess,
    shape: tuple[int, ...],
    other_op: Op | None,
    other_access: TensorAccess | None,
    free_axes: frozenset[int] = frozenset(),
) -> np.ndarray:
    columns = []
    for axis, size in enumerate(shape):
        dims = access.axes[axis] if axis < len(access.axes) else ()
        if size <= 1:
            columns.append(np.ones((factors.shape[0], 1)))
            continue
        sizes = _side_sizes(op, dims, size)
        refined = sizes
        if axis in free_axes:
            refined = None  # any order of the axis' entries can be had: only the tile sizes compare
        elif other_op is not None and other_access is not None:
            other_dims = other_access.axes[axis] if axis < len(other_access.axes) else ()
            refined = _refine(sizes, _side_sizes(other_op, other_dims, size))
        if refined is None or sizes is None:
            factor = np.ones(factors.shape[0])
            for dim in dims:
                factor = factor * _factor_column(factors, dim_names, dim)
            columns.append((size / factor)[:, None])
        else:
            columns.append(_axis_tiles(factors, dim_names, dims, refined, sizes))
    if not columns:
        return np.ones((factors.shape[0], 1))
    return np.concatenate(columns, axis=1)


def tile_extents(
    space: ConfigSpace,
    op: Op,
    access: TensorAccess,
    shape: tuple[int, ...],
    *,
    other_op: Op | None = None,
    other_access: TensorAccess | None = None,
) -> np.ndarray:
    """``(K, n_sub)`` per-device tile extents of a tensor under ``op``'s configurations.

    With ``other_op``/``other_access`` (the other end of an edge), axes are refined to the sub-axes
    both sides share, so the two sides' tiles compare axis by axis.

    Examples
    --------
    >>> from planner.core.configs import ConfigOptions, enumerate_configs
    >>> from planner.core.graph import IterDim
    >>> op = Op(name="p", kind="elementwise", op_type="Relu", inputs=(), outputs=(), flops=0.0,
    ...         dims=(IterDim(name="m", size=4), IterDim(name="n", size=8)))
    >>> space = enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2))
    >>> tile_extents(space, op, TensorAccess(tensor="t", axes=(("m",), ("n",))), (4, 8)).tolist()
    [[4.0, 8.0], [4.0, 4.0], [2.0, 8.0]]
    """
    return _tiles(space.factors, space.dim_names, op, access, shape, other_op, other_access)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Grid:
    """An edge's volumes on distinct factor rows, its node-level shares on distinct node layouts."""

    rows_u: np.ndarray
    """(K_u,) index of each producer configuration's distinct factor row."""
    rows_v: np.ndarray
    forward: np.ndarray
    """(n_u, n_v) tile-rule elements received per device in forward."""
    backward: np.ndarray
    volume_u: np.ndarray
    """(K_u,) elements of the producer's tile per device."""
    volume_v: np.ndarray
    row_volume_u: np.ndarray
    """(n_u,) the same per distinct factor row."""
    row_volume_v: np.ndarray
    row_devices_u: np.ndarray
    """(n_u,) devices holding the tensor (split factors x replicas) per distinct factor row."""
    row_devices_v: np.ndarray
    layout_u: np.ndarray
    """(K_u,) index of each producer configuration's distinct node layout."""
    layout_v: np.ndarray
    forward_missing: np.ndarray
    """(m_u, m_v) share of a consumer device's tile its node does not hold."""
    backward_missing: np.ndarray


def _unique_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a ``(K, n)`` table of non-negative ints, and each row's index among them.

    Each row is read as one mixed-radix number, so this is a 1-D ``np.unique`` (``np.unique(axis=0)``
    sorts structured rows, far slower on the small tables of every edge). The order of the distinct
    rows is lexicographic, as ``np.unique(axis=0)`` gives; tables too wide to encode use it.
    """
    table = np.asarray(table, dtype=np.int64)
    if table.shape[0] == 0 or table.shape[1] == 0:
        unique, inverse = np.unique(table, axis=0, return_inverse=True)
        return unique, inverse.reshape(-1)
    radix = table.max(axis=0) + 1
    if table.min() < 0 or float(np.prod(radix.astype(np.float64))) >= 2.0**62:
        unique, inverse = np.unique(table, axis=0, return_inverse=True)
        return unique, inverse.reshape(-1)
    weights = np.ones(table.shape[1], dtype=np.int64)
    weights[:-1] = np.cumprod(radix[::-1])[::-1][1:]
    codes = table @ weights
    _, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    return table[first], inverse.reshape(-1)


def _factor_keys(space: ConfigSpace) -> np.ndarray:
    """``(K, n_dims + 1)``: each configuration's factors and, last, its replicas."""
    return np.concatenate([space.factors, space.replica_counts[:, None]], axis=1)


def _node_layouts(
    space: ConfigSpace, op: Op, access: TensorAccess, shape: tuple[int, ...], devices_per_node: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct node layouts: ``(nodes used, node tile extents)`` rows and each configuration's row."""
    nodes = np.maximum(1, -(-space.devices_held // devices_per_node))
    layout = np.ones((space.size, 1 + len(shape)), dtype=np.int64)
    layout[:, 0] = nodes
    given = axis_inter_matrix(space, op, access)[:, : len(shape)]
    layout[:, 1 : 1 + given.shape[1]] = given
    # distinct (nodes, inter-node parts) rows are the distinct (nodes, node tile) rows: the tile is
    # shape / part, one-to-one for a fixed shape
    unique, inverse = _unique_rows(layout)
    extents = np.asarray(shape, dtype=np.float64)[None, :] / unique[:, 1:]
    return unique[:, 0].astype(np.float64), extents, inverse


def _missing(holder_nodes, holder_tiles, needer_nodes, needer_tiles) -> np.ndarray:
    """``(m_h, m_n)``: share of a needing device's tile that its node does not hold."""
    share = np.ones((holder_tiles.shape[0], needer_tiles.shape[0]))
    for axis in range(holder_tiles.shape[1]):
        share *= np.minimum(holder_tiles[:, None, axis], needer_tiles[None, :, axis]) / needer_tiles[None, :, axis]
    share = np.where(needer_nodes[None, :] <= holder_nodes[:, None], share, 0.0)
    return 1.0 - share


_last_grid: list = [None, None]
"""``[arguments, grid]`` of the latest :func:`_grid`: an edge's time table and its scatter ratios
(:func:`objectives.sequence_split.sequence_split_table`) are built one after the other from the same
grid. The arguments are held, so the identity test cannot match a recycled object."""


def _read_rows(keys: np.ndarray, rows: np.ndarray, configs: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, rows)`` narrowed to the configurations ``configs`` (``None``: all): the distinct rows they
    read, and each one's index among those."""
    if configs is None:
        return keys, rows
    used, inverse = np.unique(rows[np.asarray(configs, dtype=np.int64)], return_inverse=True)
    return keys[used], inverse.reshape(-1)


def _grid(
    shape: tuple[int, ...],
    producer: Op,
    producer_space: ConfigSpace,
    producer_access: TensorAccess,
    consumer: Op,
    consumer_space: ConfigSpace,
    consumer_access: TensorAccess,
    devices_per_node: int,
    free_axes: frozenset[int] = frozenset(),
    rows: np.ndarray | None = None,
    cols: np.ndarray | None = None,
) -> _Grid:
    """The grids of an edge; ``rows``, ``cols``: of the producer's and consumer's configurations ``rows``
    and ``cols`` only (``None``: all), its per-configuration arrays theirs, its tile-rule grids over the
    distinct factor rows they read (every cell of a grid is its own pair's alone: those cells of the
    whole grids), its node-level grids whole."""
    arguments = (producer, producer_space, producer_access, consumer, consumer_space, consumer_access)
    rest = (tuple(shape), devices_per_node, free_axes,
            None if rows is None else tuple(int(r) for r in rows), None if cols is None else tuple(int(c) for c in cols))
    last, grid = _last_grid
    if last is not None and all(a is b for a, b in zip(last[0], arguments)) and last[1:] == rest:
        return grid
    keys_u, rows_u = _read_rows(*_unique_rows(_factor_keys(producer_space)), rows)
    keys_v, rows_v = _read_rows(*_unique_rows(_factor_keys(consumer_space)), cols)
    factors_u, factors_v = keys_u[:, :-1], keys_v[:, :-1]
    tiles_u = _tiles(
        factors_u, producer_space.dim_names, producer, producer_access, shape, consumer, consumer_access, free_axes
    )
    tiles_v = _tiles(
        factors_v, consumer_space.dim_names, consumer, consumer_access, shape, producer, producer_access, free_axes
    )
    if tiles_u.shape[1] != tiles_v.shape[1]:  # refinement is symmetric; guard against odd accesses
        tiles_u = np.prod(tiles_u, axis=1, keepdims=True)
        tiles_v = np.prod(tiles_v, axis=1, keepdims=True)
    overlap = np.ones((tiles_u.shape[0], tiles_v.shape[0]))
    for column in range(tiles_u.shape[1]):
        overlap *= np.minimum(tiles_u[:, None, column], tiles_v[None, :, column])
    # devices holding the tensor: a replicated op holds its output on every replica
    devices_u = np.prod(factors_u, axis=1) * keys_u[:, -1]
    devices_v = np.prod(factors_v, axis=1) * keys_v[:, -1]
    volume_u = np.prod(tiles_u, axis=1)
    volume_v = np.prod(tiles_v, axis=1)
    forward = volume_v[None, :] - np.where(devices_v[None, :] <= devices_u[:, None], overlap, 0.0)
    backward = volume_u[:, None] - np.where(devices_u[:, None] <= devices_v[None, :], overlap, 0.0)
    nodes_u, node_tiles_u, layout_u = _node_layouts(producer_space, producer, producer_access, shape, devices_per_node)
    nodes_v, node_tiles_v, layout_v = _node_layouts(consumer_space, consumer, consumer_access, shape, devices_per_node)
    grid = _Grid(
        rows_u=rows_u,
        rows_v=rows_v,
        forward=np.maximum(forward, 0.0),
        backward=np.maximum(backward, 0.0),
        volume_u=volume_u[rows_u],
        volume_v=volume_v[rows_v],
        row_volume_u=volume_u,
        row_volume_v=volume_v,
        row_devices_u=devices_u,
        row_devices_v=devices_v,
        layout_u=layout_u if rows is None else layout_u[np.asarray(rows, dtype=np.int64)],
        layout_v=layout_v if cols is None else layout_v[np.asarray(cols, dtype=np.int64)],
        forward_missing=_missing(nodes_u, node_tiles_u, nodes_v, node_tiles_v),
        backward_missing=_missing(nodes_v, node_tiles_v, nodes_u, node_tiles_u).T,
    )
    _last_grid[:] = [(arguments, *rest), grid]
    return grid


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rates:
    scale_intra: float
    scale_inter: float
    latency_intra: float
    latency_inter: float


def _rates(element_bytes: int, cluster: Cluster) -> _Rates:
    return _Rates(
        scale_intra=element_bytes / cluster.intra_link.bandwidth_bytes_per_s,
        scale_inter=element_bytes / cluster.inter_link.bandwidth_bytes_per_s,
        latency_intra=cluster.intra_link.latency_s,
        latency_inter=cluster.inter_link.latency_s,
    )


def _direction_s(tile_rule: np.ndarray, crossing: np.ndarray, rates: _Rates) -> tuple[np.ndarray, np.ndarray]:
    """(total seconds, inter-node seconds) of one direction from its tile-rule and crossing volumes."""
    inside = tile_rule - crossing
    np.maximum(inside, 0.0, out=inside)
    inter = crossing * rates.scale_inter
    inter += (crossing > 0.0) * rates.latency_inter
    total = inside * rates.scale_intra
    total += (inside > 0.0) * rates.latency_intra
    total += inter
    return total, inter


def redistribution(
    shape: tuple[int, ...],
    element_bytes: int,
    *,
    producer: Op,
    producer_space: ConfigSpace,
    producer_access: TensorAccess,
    consumer: Op,
    consumer_space: ConfigSpace,
    consumer_access: TensorAccess,
    cluster: Cluster,
    free_axes: frozenset[int] = frozenset(),
) -> Redistribution:
    """Forward and backward re-layout of one tensor for every configuration pair, term by term.

    Parameters
    ----------
    shape:
        The tensor's shape.
    element_bytes:
        Bytes per element as trained.
    producer, producer_space, producer_access:
        The writing op, its configurations, and how it indexes the tensor (its output access).
    consumer, consumer_space, consumer_access:
        The reading op, its configurations, and its input access of the tensor.
    cluster:
        Devices per node and the two link levels.
    free_axes:
        Axes of the tensor whose entries the producer may emit in any order (a linear layer's output
        features: permuting its weight's columns permutes them, as Megatron packs a fused QKV
        weight per rank); only tile sizes, not their sub-axis structure, compare on them.

    Returns
    -------
    Redistribution
        Arrays of shape ``(K_u, K_v)``. For search tables use :func:`redistribution_time_s`, which
        builds only the total, faster.
    """
    grid = _grid(
        shape, producer, producer_space, producer_access, consumer, consumer_space, consumer_access,
        cluster.devices_per_node, free_axes,
    )
    rows, cols = grid.rows_u, grid.rows_v
    tile_f = grid.forward.take(rows, axis=0).take(cols, axis=1)
    tile_b = grid.backward.take(rows, axis=0).take(cols, axis=1)
    cross_f = grid.forward_missing.take(grid.layout_u, axis=0).take(grid.layout_v, axis=1) * grid.volume_v[None, :]
    cross_b = grid.backward_missing.take(grid.layout_u, axis=0).take(grid.layout_v, axis=1) * grid.volume_u[:, None]
    rates = _rates(element_bytes, cluster)
    forward_s, forward_inter = _direction_s(tile_f, cross_f, rates)
    backward_s, backward_inter = _direction_s(tile_b, cross_b, rates)
    return Redistribution(
        forward_elements=np.maximum(tile_f, cross_f),
        backward_elements=np.maximum(tile_b, cross_b),
        forward_inter_elements=cross_f,
        backward_inter_elements=cross_b,
        forward_s=forward_s,
        backward_s=backward_s,
        inter_s=forward_inter + backward_inter,
    )


def redistribution_time_s(
    shape: tuple[int, ...],
    element_bytes: int,
    *,
    producer: Op,
    producer_space: ConfigSpace,
    producer_access: TensorAccess,
    consumer: Op,
    consumer_space: ConfigSpace,
    consumer_access: TensorAccess,
    cluster: Cluster,
    free_axes: frozenset[int] = frozenset(),
    rows: np.ndarray | None = None,
    cols: np.ndarray | None = None,
) -> np.ndarray:
    """``(K_u, K_v)`` forward + backward seconds: ``redistribution(...).time_s``, built faster.

    Volumes are evaluated on distinct factor rows and distinct node layouts; only the assembly
    touches ``K_u x K_v`` cells, in cache-sized row chunks. ``rows``, ``cols``: the producer's and the
    consumer's configurations to assemble (``None``: all), a ``(len(rows), len(cols))`` table equal to
    those entries of the whole one (a plan priced at a choice fixed in advance reads one cell of each).
    """
    grid = _grid(
        shape, producer, producer_space, producer_access, consumer, consumer_space, consumer_access,
        cluster.devices_per_node, free_axes, rows, cols,
    )
    rates = _rates(element_bytes, cluster)
    # on the whole node-level grids, as for the whole table: the two branches below round differently
    any_crossing = bool(grid.forward_missing.any() or grid.backward_missing.any())
    out = np.empty((grid.rows_u.size, grid.rows_v.size))
    columns = _Columns.of(grid, rates, crossing=any_crossing)
    rows = max(1, _CHUNK_CELLS // max(out.shape[1], 1))
    buffers = _Buffers.of(min(rows, out.shape[0]), out.shape[1])
    for start in range(0, out.shape[0], rows):
        block = slice(start, start + rows)
        chunk = out[block]
        parts = buffers if chunk.shape[0] == buffers.tile_f.shape[0] else buffers.rows(chunk.shape[0])
        _assemble(chunk, grid, columns, block, rates, parts)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class _Columns:
    """An edge's grids with their columns expanded to the consumer's configurations, once per table: the
    chunks of :func:`redistribution_time_s` then read whole rows of them (a contiguous copy each), where
    gathering the columns per chunk was most of its time (issue 22, fourteenth round). The cells are the
    grids' own values and the products :func:`_direction_s` forms from them, so every second is the same float."""

    forward: np.ndarray
    """``(n_u, K_v)`` tile-rule volumes forward (``grid.forward``'s rows, the consumer's columns)."""
    backward: np.ndarray
    crossing_f: np.ndarray | None
    """``(m, K_v)`` elements crossing nodes forward, of the node layouts ``layouts`` (``None``: nothing crosses)."""
    inter_f: np.ndarray | None
    """``(m, K_v)`` their inter-node seconds (:func:`_direction_s`'s ``inter``)."""
    missing_b: np.ndarray | None
    """``(m, K_v)`` backward missing shares, before the producer's tile volume multiplies them."""
    layouts: np.ndarray | None
    """Per producer configuration, its row of the three tables above."""

    @staticmethod
    def of(grid: _Grid, rates: _Rates, *, crossing: bool) -> "_Columns":
        forward, backward = grid.forward.take(grid.rows_v, axis=1), grid.backward.take(grid.rows_v, axis=1)
        if not crossing:
            return _Columns(forward=forward, backward=backward, crossing_f=None, inter_f=None, missing_b=None, layouts=None)
        used, layouts = np.unique(grid.layout_u, return_inverse=True)  # the layouts these rows read
        crossing_f = grid.forward_missing.take(used, axis=0).take(grid.layout_v, axis=1) * grid.volume_v[None, :]
        inter_f = crossing_f * rates.scale_inter
        inter_f += (crossing_f > 0.0) * rates.latency_inter
        missing_b = grid.backward_missing.take(used, axis=0).take(grid.layout_v, axis=1)
        return _Columns(forward=forward, backward=backward, crossing_f=crossing_f, inter_f=inter_f, missing_b=missing_b,
                        layouts=layouts.reshape(-1))


@dataclass(frozen=True, slots=True)
class _Buffers:
    """The chunk-sized work arrays of :func:`redistribution_time_s`, allocated once per table."""

    tile_f: np.ndarray
    tile_b: np.ndarray
    cross_f: np.ndarray
    cross_b: np.ndarray
    inter: np.ndarray
    inside: np.ndarray
    scratch: np.ndarray

    @staticmethod
    def of(rows: int, columns: int) -> "_Buffers":
        return _Buffers(*(np.empty((rows, columns)) for _ in range(7)))

    def rows(self, count: int) -> "_Buffers":
        """The buffers' first ``count`` rows (the last chunk may be short)."""
        return _Buffers(*(getattr(self, name)[:count] for name in self.__slots__))


def _assemble(chunk: np.ndarray, grid: _Grid, columns: _Columns, block: slice, rates: _Rates, parts: _Buffers) -> None:
    """Write ``block``'s rows of the table into ``chunk``: each cell by the operations :func:`_direction_s` and the
    one-link sum apply to it, in the same order, on the same operands."""
    np.take(columns.forward, grid.rows_u[block], axis=0, out=parts.tile_f)
    np.take(columns.backward, grid.rows_u[block], axis=0, out=parts.tile_b)
    if columns.layouts is None:  # one node, or layouts that never cross: the intra link only
        np.add(parts.tile_f, parts.tile_b, out=chunk)
        chunk *= rates.scale_intra
        np.greater(parts.tile_f, 0.0, out=parts.scratch)  # (tile_f > 0).astype(float64)
        np.greater(parts.tile_b, 0.0, out=parts.inside)
        np.add(parts.scratch, parts.inside, out=parts.scratch)
        np.multiply(parts.scratch, rates.latency_intra, out=parts.scratch)
        chunk += parts.scratch
        return
    layouts = columns.layouts[block]
    np.take(columns.crossing_f, layouts, axis=0, out=parts.cross_f)
    np.take(columns.inter_f, layouts, axis=0, out=parts.inter)
    _total_into(chunk, parts.tile_f, parts.cross_f, parts.inter, rates, parts)
    np.take(columns.missing_b, layouts, axis=0, out=parts.cross_b)
    np.multiply(parts.cross_b, grid.volume_u[block, None], out=parts.cross_b)
    np.greater(parts.cross_b, 0.0, out=parts.inter)  # inter = crossing * scale_inter + (crossing > 0) * latency_inter
    np.multiply(parts.inter, rates.latency_inter, out=parts.inter)
    np.multiply(parts.cross_b, rates.scale_inter, out=parts.scratch)
    np.add(parts.scratch, parts.inter, out=parts.inter)
    _total_into(parts.tile_f, parts.tile_b, parts.cross_b, parts.inter, rates, parts)  # tile_f is read: free now
    chunk += parts.tile_f


def _total_into(total: np.ndarray, tile_rule: np.ndarray, crossing: np.ndarray, inter: np.ndarray, rates: _Rates,
                parts: _Buffers) -> None:
    """:func:`_direction_s`'s total seconds into ``total`` from its ``inter`` (the inter-node seconds of ``crossing``)."""
    np.subtract(tile_rule, crossing, out=parts.inside)
    np.maximum(parts.inside, 0.0, out=parts.inside)
    np.multiply(parts.inside, rates.scale_intra, out=total)
    np.greater(parts.inside, 0.0, out=parts.scratch)
    np.multiply(parts.scratch, rates.latency_intra, out=parts.scratch)
    total += parts.scratch
    total += inter


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ScatterRatios:
    """An edge's scatter ratios (:func:`scatter_ratios`) decided on its small grids, expanded to any
    configurations on demand (:meth:`block`), so a caller reads the cells it needs in chunks without
    the whole ``(K_u, K_v)`` tables."""

    grid: _Grid
    forward: np.ndarray
    """``(n_u, n_v)`` forward ratio of the distinct factor rows, before the node-level condition."""
    backward: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """``(K_u, K_v)``."""
        return self.grid.rows_u.size, self.grid.rows_v.size

    def block(self, direction: str, rows: np.ndarray | slice, cols: np.ndarray | slice) -> np.ndarray:
        """``(rows, cols)`` ratios of ``direction`` (``"forward"`` or ``"backward"``) at the producer's
        configurations ``rows`` and the consumer's ``cols`` (positions among those the ratios were built
        for, :func:`edge_scatter_ratios`): the ratio where no element crosses nodes, else 0."""
        grid = self.grid
        ratio, missing = ((self.forward, grid.forward_missing) if direction == "forward"
                          else (self.backward, grid.backward_missing))
        values = ratio.take(grid.rows_u[rows], axis=0).take(grid.rows_v[cols], axis=1)
        inside = (missing <= 0.0).take(grid.layout_u[rows], axis=0).take(grid.layout_v[cols], axis=1)
        return np.where(inside, values, 0.0)

    def columns(self, direction: str, cols: np.ndarray | slice) -> Callable[[np.ndarray | slice], np.ndarray]:
        """``rows -> self.block(direction, rows, cols)`` for many row chunks of the same ``cols``: the small grids'
        columns expanded to ``cols`` once, each chunk then row copies of them (the same values)."""
        grid = self.grid
        ratio, missing = ((self.forward, grid.forward_missing) if direction == "forward"
                          else (self.backward, grid.backward_missing))
        values = ratio.take(grid.rows_v[cols], axis=1)
        inside = (missing <= 0.0).take(grid.layout_v[cols], axis=1)
        return lambda rows: np.where(inside.take(grid.layout_u[rows], axis=0), values.take(grid.rows_u[rows], axis=0), 0.0)


def edge_scatter_ratios(
    shape: tuple[int, ...],
    *,
    producer: Op,
    producer_space: ConfigSpace,
    producer_access: TensorAccess,
    consumer: Op,
    consumer_space: ConfigSpace,
    consumer_access: TensorAccess,
    cluster: Cluster,
    free_axes: frozenset[int] = frozenset(),
    rows: np.ndarray | None = None,
    cols: np.ndarray | None = None,
) -> ScatterRatios:
    """An edge's :class:`ScatterRatios` (the arguments as :func:`scatter_ratios`'); ``rows``, ``cols``: of
    those configurations only (:func:`redistribution_time_s`'s), :meth:`ScatterRatios.block` then indexing them."""
    grid = _grid(
        shape, producer, producer_space, producer_access, consumer, consumer_space, consumer_access,
        cluster.devices_per_node, free_axes, rows, cols,
    )
    # devices, tile volumes and tile-rule volumes are functions of the distinct factor rows, the
    # crossing shares of the distinct node layouts: each is decided on its small grid, then expanded
    same = grid.row_devices_u[:, None] == grid.row_devices_v[None, :]
    volume_u, volume_v = grid.row_volume_u, grid.row_volume_v
    return ScatterRatios(
        grid=grid,
        forward=np.where(same & (grid.forward <= 0.0), volume_u[:, None] / volume_v[None, :], 0.0),
        backward=np.where(same & (grid.backward <= 0.0), volume_v[None, :] / volume_u[:, None], 0.0),
    )


def scatter_ratios(
    shape: tuple[int, ...],
    *,
    producer: Op,
    producer_space: ConfigSpace,
    producer_access: TensorAccess,
    consumer: Op,
    consumer_space: ConfigSpace,
    consumer_access: TensorAccess,
    cluster: Cluster,
    free_axes: frozenset[int] = frozenset(),
) -> tuple[np.ndarray, np.ndarray]:
    """``(K_u, K_v)`` forward and backward scatter ratios of an edge: where one side's tile is a share
    of the other's on as many devices, how many such shares make the larger tile; 0 elsewhere.

    Forward (``volume_u / volume_v``): the consumer's tile lies inside the producer's (the tile rule
    moves nothing forward, within and across nodes) and both ops run on the same devices, so a
    reduce-scatter of the producer's partial sums over a group of that size leaves each device its
    consumer tile (:mod:`objectives.sequence_split`). Backward (``volume_v / volume_u``): the mirror,
    the producer's tile inside the consumer's, for the consumer's partial input gradients.

    Examples
    --------
    >>> from planner.core.configs import ConfigOptions, enumerate_configs
    >>> from planner.core.graph import IterDim
    >>> from planner.core.cluster import Link
    >>> from objectives.cluster import make_cluster
    >>> op = Op(name="p", kind="elementwise", op_type="Relu", inputs=(), outputs=(), flops=0.0,
    ...         dims=(IterDim(name="s", size=4), IterDim(name="h", size=8)))
    >>> space = enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2))
    >>> access = TensorAccess(tensor="t", axes=(("s",), ("h",)))
    >>> fwd, bwd = scatter_ratios((4, 8), producer=op, producer_space=space, producer_access=access,
    ...     consumer=op, consumer_space=space, consumer_access=access, cluster=make_cluster("a100-80gb", devices=2))
    >>> fwd.tolist()  # rows: whole, h split, s split; the whole op runs on 1 device, the splits on 2
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    ratios = edge_scatter_ratios(
        shape, producer=producer, producer_space=producer_space, producer_access=producer_access, consumer=consumer,
        consumer_space=consumer_space, consumer_access=consumer_access, cluster=cluster, free_axes=free_axes,
    )
    # expanded in cache-sized row chunks, as redistribution_time_s assembles its table: whole-table temporaries
    # were fresh pages every edge, most of a 3,072-device plan's system time (issue 22, eighth round)
    forward, backward = np.empty(ratios.shape), np.empty(ratios.shape)
    every = slice(None)
    for start in range(0, forward.shape[0], _CHUNK_ROWS):
        block = slice(start, start + _CHUNK_ROWS)
        forward[block] = ratios.block("forward", block, every)
        backward[block] = ratios.block("backward", block, every)
    return forward, backward
