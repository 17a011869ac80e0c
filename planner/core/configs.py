r"""Configurations of an op: split factors per iteration dim, placed on a two-level cluster.

A configuration (PaSE) assigns each iteration dim :math:`d` of size :math:`n_d` a split factor
:math:`f_d` that divides :math:`n_d`; the op then runs on :math:`P = \prod_d f_d` devices.

The cluster has ``nodes x devices_per_node`` devices. To price collectives on the link they cross,
each factor is split into an intra-node and an inter-node part, :math:`f_d = a_d \cdot e_d`
(``factors`` and ``inter_factors``; the intra part is ``factors // inter_factors``). Devices are
filled node by node: a configuration on :math:`P \le g` devices (``g = devices_per_node``) lies in one
node (every :math:`e_d = 1`); a larger one fills whole nodes, :math:`\prod_d a_d = g` and
:math:`\prod_d e_d = P / g`. A collective over the devices that split dim ``d`` stays inside a node
exactly when :math:`e_d = 1`. On a single node this reduces to PaSE's factor tuples.

Which products are allowed (``product_rule``):

* ``"divides"`` (default): :math:`P` divides the device count, so a power-of-two cluster gets
  power-of-two products. Keeps the space small enough for 256-device searches.
* ``"at_most"``: PaSE's rule, any :math:`P \le` devices (devices may stay idle; factors such as 3 or
  6 appear). Used by the PaSE cost model.

``min_tile`` is PaSE's cutoff: a factor :math:`e` of a dim of size :math:`n` is allowed only if
:math:`n / e \ge` ``min_tile``.

Redundant replicas (``replicate``). Real launchers run cheap ops *redundantly*: Megatron-LM computes
a LayerNorm, a residual add or a dropout on every tensor-parallel rank, each rank holding the whole
tensor of its data-parallel shard. Under PaSE's rule such an op "uses" only its ``P`` devices and the
others idle, so every tensor-parallel consumer would first have to receive the tile it already
computed. With ``replicate``, every configuration on :math:`P` devices that does not fill the
cluster also appears *replicated* :math:`r = \text{devices} / P` times, beside the idle one: the
same shard computed on :math:`r` groups at once (``replicas``). Both are kept: copies pay to receive
their inputs, so where no consumer uses them (pure data parallelism over fewer samples than
devices) the idle configuration is the cheaper. Compute per device and memory per device are those
of the shard; the output is held on :math:`P r` devices, so a consumer splitting the tensor over
those devices needs no data (:mod:`objectives.redistribution`), and replicas need no gradient
synchronisation among themselves (they compute the same gradient). Only cheap kinds are replicated
(not :data:`HEAVY_KINDS`). Replicas take the innermost places of a node (``inter_replicas``
minimal: tensor-parallel ranks are innermost in Megatron's rank order), so the split dims take the
inter-node places; an op without a batch dim also has its copies outermost (they are the
data-parallel ranks, its split the tensor-parallel ones). PaSE's own model (``"at_most"``) has none.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from planner.core.errors import InputError
from planner.core.graph import Op

__all__ = ["ProductRule", "ConfigOptions", "ConfigSpace", "enumerate_configs", "divisors", "split_products", "batch_products", "pads_to_split"]

ProductRule = Literal["divides", "at_most"]

HEAVY_KINDS = frozenset({"matmul", "conv", "rnn"})
"""Op kinds never run as redundant replicas: launchers split or idle them, never repeat their FLOPs
(and leaving them out keeps the configuration spaces of the ops that dominate the tables small)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigOptions:
    """Which configurations of each op the search considers."""

    devices: int
    """Total devices in the cluster."""
    devices_per_node: int
    """Devices per node; equal to ``devices`` for a single node."""
    product_rule: ProductRule = "divides"
    """See the module docstring."""
    min_tile: int = 1
    """PaSE's cutoff: smallest per-device size of a split dim (elements)."""
    max_split_dims: int | None = None
    """At most this many dims split at once (``None``: no limit)."""
    pad: bool = False
    """Also split a large non-batch dim by a factor that does not divide it, padding the last shard
    (at most :data:`PAD_WASTE_MAX` more elements; dims of at least :data:`PAD_MIN_SIZE`): Megatron-LM
    pads the vocabulary to a multiple of 128 x tp so that the embedding and the LM head split over
    tensor-parallel ranks. Shards are priced at their padded (ceil-divided) size."""
    replicate: bool = False
    """Also enumerate each configuration that does not fill the devices as redundant replicas
    filling them (module docstring); only under ``product_rule="divides"``."""
    context_dims: frozenset[tuple[str, str]] = frozenset()
    """``(op name, dim name)`` of each sequence dim context parallelism splits: with ``max_split_dims = 2``,
    such an op also gets the configurations of 3 split dims that Megatron-LM's and torchtitan's ``dp x cp x
    tp`` layout runs (a linear layer's batch, sequence and weight dims; the attention core's batch, query
    sequence and heads): a batch dim, its sequence dim (named here, not told by its length: a weight dim as
    long as the sequence is no sequence), and one more dim inside a node, with no redundant copies across
    nodes (:func:`_context_rows`). Empty: none (the search's caches name them for long sequences only:
    ``objectives.pipeline_cost.PipelineCostCache.context_splits``)."""

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise InputError(f"--devices must be at least 1 (got {self.devices})")
        if self.devices_per_node < 1:
            raise InputError(f"--devices-per-node must be at least 1 (got {self.devices_per_node})")
        if self.devices > self.devices_per_node and self.devices % self.devices_per_node:
            raise InputError(
                f"--devices {self.devices} is not a multiple of --devices-per-node "
                f"{self.devices_per_node}; use whole nodes"
            )
        if self.min_tile < 1:
            raise InputError(f"min_tile must be at least 1 (got {self.min_tile})")

    @property
    def intra_devices(self) -> int:
        """Devices in one node that a configuration may use."""
        return min(self.devices, self.devices_per_node)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigSpace:
    """All configurations of one op, as dense tables (row = configuration)."""

    dim_names: tuple[str, ...]
    factors: np.ndarray
    """``(K, n_dims)`` int64: total split factor of each dim."""
    inter_factors: np.ndarray
    """``(K, n_dims)`` int64: the inter-node part of each factor (1 on a single node)."""
    replicas: np.ndarray | None = None
    """``(K,)`` int64: redundant copies of the shard computation (``None``: 1 for every row)."""
    inter_replicas: np.ndarray | None = None
    """``(K,)`` int64: the inter-node part of ``replicas`` (``None``: 1 for every row)."""

    @property
    def size(self) -> int:
        """Number of configurations K."""
        return int(self.factors.shape[0])

    @property
    def replica_counts(self) -> np.ndarray:
        """``(K,)``: redundant copies of each configuration (1 when not replicated)."""
        if self.replicas is None:
            return np.ones(self.size, dtype=np.int64)
        return self.replicas

    @property
    def inter_replica_counts(self) -> np.ndarray:
        """``(K,)``: the inter-node part of :attr:`replica_counts`."""
        if self.inter_replicas is None:
            return np.ones(self.size, dtype=np.int64)
        return self.inter_replicas

    @property
    def table_key(self) -> tuple:
        """Equal for spaces that share their tables (ops of one shape, :func:`enumerate_configs`):
        a memo key for results that read only the tables and dim names, valid while the spaces live
        (it holds the tables' ids)."""
        return (id(self.factors), id(self.inter_factors), id(self.replicas), id(self.inter_replicas), self.dim_names)

    @property
    def has_replicas(self) -> bool:
        """Whether any configuration is replicated."""
        return self.replicas is not None and bool((self.replicas > 1).any())

    @property
    def devices_held(self) -> np.ndarray:
        """``(K,)``: devices that hold the op's output (its shard devices times its replicas)."""
        return self.devices_used * self.replica_counts

    def subset(self, rows: np.ndarray) -> "ConfigSpace":
        """The configurations at ``rows`` (an index array or a boolean mask), as a new space."""
        return ConfigSpace(
            dim_names=self.dim_names,
            factors=self.factors[rows],
            inter_factors=self.inter_factors[rows],
            replicas=None if self.replicas is None else self.replicas[rows],
            inter_replicas=None if self.inter_replicas is None else self.inter_replicas[rows],
        )

    @property
    def intra_factors(self) -> np.ndarray:
        """``(K, n_dims)``: the intra-node part of each factor."""
        return self.factors // self.inter_factors

    @property
    def devices_used(self) -> np.ndarray:
        """``(K,)``: devices each configuration runs on."""
        return np.prod(self.factors, axis=1, dtype=np.int64)

    def index_of(
        self,
        factors: dict[str, int],
        inter_factors: dict[str, int] | None = None,
        *,
        replicas: int | None = 1,
        inter_replicas: int | None = None,
    ) -> int:
        """Row of the configuration with the given factors (missing dims: 1) and replicas.

        ``replicas=None`` matches any number of copies (the first row); ``inter_replicas=None``
        any placement of them. Raises ``KeyError`` when it is not in the space.
        """
        want = np.array([factors.get(n, 1) for n in self.dim_names], dtype=np.int64)
        match = np.all(self.factors == want, axis=1)
        if replicas is not None:
            match &= self.replica_counts == replicas
        if inter_replicas is not None:
            match &= self.inter_replica_counts == inter_replicas
        if inter_factors is not None:
            want_inter = np.array([inter_factors.get(n, 1) for n in self.dim_names], dtype=np.int64)
            match &= np.all(self.inter_factors == want_inter, axis=1)
        rows = np.flatnonzero(match)
        if rows.size == 0:
            raise KeyError(f"configuration {factors} is not in the space")
        return int(rows[0])

    def describe(self, row: int) -> dict[str, int]:
        """``{dim: factor}`` of one configuration, split dims only."""
        return {n: int(f) for n, f in zip(self.dim_names, self.factors[row]) if f > 1}


def split_products(op: Op, space: ConfigSpace, row: int) -> tuple[int, int]:
    """``(product of the batch dims' factors, product of the other dims' factors)`` of one
    configuration of ``op``: its data-parallel and model-parallel degrees.

    Examples
    --------
    >>> from planner.core.graph import IterDim
    >>> op = Op(name="mm", kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=1.0,
    ...         dims=(IterDim(name="b", size=8, is_batch=True), IterDim(name="n", size=4)))
    >>> space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    >>> split_products(op, space, space.index_of({"b": 4, "n": 2}))
    (4, 2)
    """
    batch = other = 1
    for dim, factor in zip(op.dims, space.factors[row].tolist()):
        if dim.is_batch:
            batch *= factor
        else:
            other *= factor
    return batch, other


def batch_products(op: Op, space: ConfigSpace) -> tuple[np.ndarray, np.ndarray]:
    """Per configuration, ``(product of batch-dim factors, product of the other factors)``:
    :func:`split_products` of every row at once."""
    is_batch = np.array([d.is_batch for d in op.dims], dtype=bool)
    factors = space.factors
    if factors.shape[1] == 0:
        ones = np.ones(space.size, dtype=np.int64)
        return ones, ones
    batch = np.prod(np.where(is_batch, factors, 1), axis=1)
    other = np.prod(np.where(is_batch, 1, factors), axis=1)
    return batch, other


def divisors(n: int) -> list[int]:
    """Sorted positive divisors of ``n``.

    Examples
    --------
    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


PAD_WASTE_MAX = 0.01
"""Largest share of padding a ``pad`` split may add to a dim (Megatron's vocabulary padding: 50,257
rows split 8 ways are 8 x 6,283 = 50,264, 0.014% more)."""

PAD_MIN_SIZE = 1024
"""Smallest dim padded to split (a vocabulary, not a handful of channels)."""


def pads_to_split(size: int, ways: int) -> bool:
    """Whether a dim of ``size`` elements splits ``ways`` ways by padding (:attr:`ConfigOptions.pad`):
    ``ways`` does not divide it, it has at least :data:`PAD_MIN_SIZE` elements, and padding adds at
    most :data:`PAD_WASTE_MAX` of them.

    Examples
    --------
    >>> pads_to_split(50257, 8), pads_to_split(50264, 8), pads_to_split(1000, 8)
    (True, False, False)
    """
    return bool(size % ways) and size >= PAD_MIN_SIZE and -(-size // ways) * ways - size <= PAD_WASTE_MAX * size


def _dim_factors(size: int, splittable: bool, options: ConfigOptions, *, is_batch: bool = False) -> list[int]:
    if not splittable or size <= 1:
        return [1]
    # factor 1 always: a dim shorter than min_tile stays whole (the op keeps its replicated row)
    exact = [e for e in divisors(size) if e == 1 or (e <= options.devices and size // e >= options.min_tile)]
    if not options.pad or is_batch:
        return exact
    padded = [e for e in divisors(options.devices) if pads_to_split(size, e) and size // e >= options.min_tile]
    return sorted(set(exact) | set(padded))


def _level_splits(factors: tuple[int, ...], options: ConfigOptions) -> tuple[tuple[int, ...], ...]:
    """Every inter-node part ``e`` of ``factors`` (``e_d`` divides ``f_d``) that fills whole nodes."""
    return _level_splits_on(factors, options.intra_devices)


@functools.lru_cache(maxsize=65536)
def _level_splits_on(factors: tuple[int, ...], per_node: int) -> tuple[tuple[int, ...], ...]:
    """:func:`_level_splits` with ``per_node`` devices a node (kept: the same factor combinations
    recur across ops, batch sizes and stage sizes, hundreds of thousands of times in a 1T search)."""
    product = math.prod(factors)
    if product <= per_node:
        return (tuple(1 for _ in factors),)
    if product % per_node:
        return ()  # cannot fill whole nodes (only possible under "at_most")
    inter_product = product // per_node
    choices = [[e for e in divisors(f) if inter_product % e == 0] for f in factors]
    return tuple(e for e in itertools.product(*choices) if math.prod(e) == inter_product)


def enumerate_configs(op: Op, options: ConfigOptions) -> ConfigSpace:
    """All configurations of ``op`` allowed by ``options``, in a deterministic order.

    The first row is always the fully replicated configuration (every factor 1).

    Examples
    --------
    >>> from planner.core.graph import IterDim, Op
    >>> op = Op(name="mm", kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=0.0,
    ...         dims=(IterDim(name="m", size=8), IterDim(name="k", size=4, kind="reduction")))
    >>> space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
    >>> space.factors.tolist()
    [[1, 1], [1, 2], [1, 4], [2, 1], [2, 2], [4, 1]]
    """
    replicate = options.replicate and op.kind not in HEAVY_KINDS
    sequence = _sequence_dims(op, options)
    # the named sequence dim is in the key: ops of equal sizes may have it at another place, or not at all
    key = (tuple((d.size, d.splittable, d.is_batch) for d in op.dims), options, replicate, sequence)
    cached = _ENUMERATED.get(key)
    if cached is None:
        cached = _ENUMERATED[key] = _enumerate_factors(op, options, replicate=replicate, sequence=sequence)
        if len(_ENUMERATED) > _ENUMERATED_MAX:
            _ENUMERATED.pop(next(iter(_ENUMERATED)))
    factors, inter, replicas, inter_replicas = cached
    # a new space per op (callers tell ops apart by their space objects); the arrays are shared
    return ConfigSpace(
        dim_names=op.dim_names, factors=factors, inter_factors=inter, replicas=replicas, inter_replicas=inter_replicas
    )


# Factor tables by (dim sizes and splittability, options): layers repeat the same shapes, and the
# pipeline search enumerates the same ops at many batch sizes and device counts. Oldest evicted.
_ENUMERATED: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]] = {}
_ENUMERATED_MAX = 4096


def _replica_splits(
    combo: tuple[int, ...], replicas: int, per_node: int, *, outermost_too: bool = False
) -> list[tuple[int, ...]]:
    """Node placements of ``combo`` run ``replicas`` times on nodes of ``per_node`` devices
    (:attr:`ConfigOptions.intra_devices`), replicas innermost (fewest nodes crossed)
    and, with ``outermost_too``, also outermost (most nodes crossed, the split dims inside a node).

    Each result is the inter-node part of ``(*combo, replicas)``.
    """
    splits = _level_splits_on((*combo, replicas), per_node)
    if not splits:
        return []
    fewest = min(split[-1] for split in splits)
    most = max(split[-1] for split in splits) if outermost_too else fewest
    return [split for split in splits if split[-1] in (fewest, most)]


@functools.lru_cache(maxsize=65536)
def _combination_rows(combo: tuple[int, ...], devices: int, per_node: int, replicate: bool,
                      copies_outermost: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(inter_factors (n, dims), (replicas, inter_replicas) (n, 2))`` of the rows :func:`_enumerate_factors` lists for
    one factor combination, in its order: with ``replicate``, where the combination does not fill the ``devices``,
    its placements as redundant copies (:func:`_replica_splits`), then its idle placements (:func:`_level_splits`).
    Read only. ``devices`` and ``per_node`` (:attr:`ConfigOptions.intra_devices`) are all those read of the options."""
    inter_rows: list[tuple[int, ...]] = []
    copy_rows: list[tuple[int, int]] = []
    product = math.prod(combo)
    if replicate and product < devices:
        copies = devices // product
        for split in _replica_splits(combo, copies, per_node, outermost_too=copies_outermost):
            inter_rows.append(split[:-1])
            copy_rows.append((copies, split[-1]))
    for split in _level_splits_on(combo, per_node):
        inter_rows.append(split)
        copy_rows.append((1, 1))
    inter = np.array(inter_rows, dtype=np.int64).reshape(len(inter_rows), len(combo))
    copies_table = np.array(copy_rows, dtype=np.int64).reshape(len(copy_rows), 2)
    inter.flags.writeable = False
    copies_table.flags.writeable = False
    return inter, copies_table


def _allowed_combinations(
    per_dim: list[list[int]], options: ConfigOptions, wide: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[tuple[int, ...]]:
    """The factor combinations (one factor per dim, in ``itertools.product`` order) whose product is
    at most the devices (and divides them under the ``"divides"`` rule) and that split at most
    ``options.max_split_dims`` dims; with ``wide`` (:func:`_context_columns`: the op's batch and
    sequence columns), also those of 3 split dims that split a batch dim and the sequence dim.

    Built a dim at a time with a product over the devices dropped at once: on many devices a
    5-dim attention op has tens of thousands of combinations, most of them too large."""
    rows = np.ones((1, 0), dtype=np.int64)
    products = np.ones(1, dtype=np.int64)
    for factors in per_dim:
        column = np.asarray(factors, dtype=np.int64)
        rows = np.concatenate([np.repeat(rows, len(column), axis=0), np.tile(column, len(products))[:, None]], axis=1)
        products = np.repeat(products, len(column)) * rows[:, -1]
        keep = products <= options.devices
        rows, products = rows[keep], products[keep]
    keep = np.ones(len(products), dtype=bool)
    if options.product_rule == "divides":
        keep &= options.devices % products == 0
    if options.max_split_dims is not None:
        split = rows > 1
        allowed = split.sum(axis=1) <= options.max_split_dims
        if wide is not None:
            batch, sequence = wide
            allowed |= (split.sum(axis=1) == 3) & split[:, batch].any(axis=1) & (split[:, sequence].sum(axis=1) == 1)
        keep &= allowed
    return list(map(tuple, rows[keep].tolist()))


def _sequence_dims(op: Op, options: ConfigOptions) -> tuple[bool, ...]:
    """Per dim of ``op``, whether it is the sequence :attr:`ConfigOptions.context_dims` names (a non-batch
    ``parallel`` dim); ``()`` where no space is widened (no names, or not the spaces of 2 split dims)."""
    if not options.context_dims or options.max_split_dims != 2:
        return ()
    return tuple(not d.is_batch and d.kind == "parallel" and d.splittable and (op.name, d.name) in options.context_dims
                 for d in op.dims)


def _context_columns(op: Op, sequence: tuple[bool, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(batch columns, sequence columns)`` of ``op`` where its named sequence dim (:func:`_sequence_dims`) widens
    its space to 3 split dims (:attr:`ConfigOptions.context_dims`); ``None`` where it does not."""
    if not any(sequence):
        return None
    batch = np.array([d.is_batch for d in op.dims], dtype=bool)
    return (batch, np.array(sequence, dtype=bool)) if batch.any() else None


def _context_rows(wide: tuple[np.ndarray, np.ndarray], factors: np.ndarray, inter: np.ndarray,
                  inter_replicas: np.ndarray | None) -> np.ndarray:
    """Rows to keep of an op widened by :func:`_context_columns`: every row of at most 2 split dims, and those of 3
    whose dims other than the batch and the sequence split inside a node, without copies across nodes (tp innermost
    in Megatron-Core's ``tp-cp-ep-dp-pp`` order and torchtitan's mesh; the pipeline search's masks,
    ``PipelineCostCache.masks``, would drop the others)."""
    batch, sequence = wide
    inside = np.all(inter[:, ~(batch | sequence)] == 1, axis=1)
    if inter_replicas is not None:
        inside &= inter_replicas == 1
    return ((factors > 1).sum(axis=1) <= 2) | inside


def _enumerate_factors(
    op: Op, options: ConfigOptions, *, replicate: bool, sequence: tuple[bool, ...] = ()
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(factors, inter_factors, replicas, inter_replicas)`` of :func:`enumerate_configs`, read-only.

    ``replicas`` is ``None`` without ``replicate``; with it, a configuration that does not fill the
    devices appears also as replicas that do (module docstring), before its idle rows.
    """
    per_dim = [_dim_factors(d.size, d.splittable, options, is_batch=d.is_batch) for d in op.dims]
    replicate = replicate and options.product_rule == "divides"
    # an op without a batch dim (a position table's lookup) runs once per data-parallel rank: its
    # copies are the data-parallel ranks, outermost in Megatron's rank order (tp-cp-ep-dp-pp), so
    # its split (a sequence-parallel one) may sit inside a node with the copies across nodes
    copies_outermost = not any(d.is_batch for d in op.dims)
    wide = _context_columns(op, sequence)
    combos = _allowed_combinations(per_dim, options, wide)
    # each combination's rows (its replicated placements, then its idle ones), kept per combination: they
    # recur across ops, batch sizes and stage sizes (h32a: the rows appended one by one cost 3-4 ms a space)
    blocks = [_combination_rows(combo, options.devices, options.intra_devices, replicate, copies_outermost)
              for combo in combos]
    n_dims = len(op.dims)
    counts = [len(block[0]) for block in blocks]
    # rows given explicitly: a scalar op (no dims) has one empty row, which -1 cannot infer
    factors = np.repeat(np.array(combos, dtype=np.int64).reshape(len(combos), n_dims), counts, axis=0)
    inter = np.concatenate([block[0] for block in blocks]) if blocks else np.zeros((0, n_dims), dtype=np.int64)
    copies_table = np.concatenate([block[1] for block in blocks]) if blocks else np.zeros((0, 2), dtype=np.int64)
    if wide is not None:
        kept = _context_rows(wide, factors, inter, copies_table[:, 1] if replicate else None)
        factors, inter, copies_table = factors[kept], inter[kept], copies_table[kept]
    replicas = inter_replicas = None
    if replicate:
        replicas, inter_replicas = copies_table[:, 0].copy(), copies_table[:, 1].copy()
        replicas.flags.writeable = False
        inter_replicas.flags.writeable = False
    factors.flags.writeable = False  # shared by every op of this shape
    inter.flags.writeable = False
    return factors, inter, replicas, inter_replicas
