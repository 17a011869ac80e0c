r"""Synthetic search problems: for doctests, benchmarks and scaling checks, never for planning.

* :func:`chain_tables`: a chain (plus optional extra edges) with random small-integer costs, so sums
  are exact in any order.
* :func:`transformer_tables`: a GPT-like stack of identical layers whose costs follow a crude but
  structured model (a configuration splits each iteration dim by a power of two; time = work /
  devices + partial-sum all-reduce; memory = parameter shard + activation shard; an edge costs the
  part of the consumer's input tile the producer's output tile does not already hold, as in PaSE).
  Identical layers share their arrays and are listed as one :class:`BlockGroup`, like the importer
  does for real transformers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from planner.core.configs import ConfigSpace
from planner.core.graph import BlockGroup
from planner.core.tables import CostTables, EdgeCost

__all__ = ["chain_tables", "transformer_tables", "simple_space"]


def simple_space(size: int) -> ConfigSpace:
    """A one-dim configuration space with ``size`` rows (factors 1..size): a stand-in for tests."""
    factors = np.arange(1, size + 1, dtype=np.int64).reshape(-1, 1)
    return ConfigSpace(dim_names=("c",), factors=factors, inter_factors=np.ones_like(factors))


def chain_tables(
    sizes: Sequence[int], *, seed: int = 0, extra_edges: Sequence[tuple[int, int]] = ()
) -> CostTables:
    """Ops ``0..n-1`` joined in a chain (``i -> i+1``) plus ``extra_edges``, random integer costs.

    Times are multiples of 1/4 s and 1/8 s (nodes, edges), memories multiples of 1 KiB: every sum is
    exact in float64, whatever the order.

    Examples
    --------
    >>> tables = chain_tables([2, 3], seed=1)
    >>> tables.num_ops, [e.time_s.shape for e in tables.edges]
    (2, [(2, 3)])
    """
    rng = np.random.default_rng(seed)
    node_time = tuple(rng.integers(0, 64, size=k).astype(np.float64) / 4 for k in sizes)
    node_memory = tuple(rng.integers(0, 64, size=k).astype(np.float64) * 1024 for k in sizes)
    pairs = [(i, i + 1) for i in range(len(sizes) - 1)] + list(extra_edges)
    edges = tuple(
        EdgeCost(u=u, v=v, time_s=rng.integers(0, 32, size=(sizes[u], sizes[v])).astype(np.float64) / 8)
        for u, v in pairs
    )
    return CostTables(
        configs=tuple(simple_space(k) for k in sizes),
        node_time_s=node_time,
        node_memory_bytes=node_memory,
        edges=edges,
    )


# --- transformer-like problem -------------------------------------------------------------------

_PEAK_FLOP_S = 1.0e14
_LINK_BYTES_S = 1.0e11
_LATENCY_S = 5.0e-6
_BYTES = 2  # bf16 activations


def _exponents(sizes: Sequence[int], max_exp: int) -> np.ndarray:
    """All power-of-two split exponents per dim, factor dividing the dim, total <= max_exp."""
    per_dim = [range(0, int(np.log2(s & -s)) + 1) for s in sizes]  # largest power of 2 dividing s
    rows = [c for c in itertools.product(*per_dim) if sum(c) <= max_exp]
    return np.array(rows, dtype=np.int64)


class _OpModel:
    """One op of the synthetic layer: iteration dims (b, s, n[, k]) and its config table."""

    def __init__(self, sizes: Sequence[int], max_exp: int, *, params: bool, seed: int) -> None:
        self.sizes = np.array(sizes, dtype=np.float64)
        self.exp = _exponents(sizes, max_exp)
        f = 2.0 ** self.exp
        devices = f.prod(axis=1)
        rng = np.random.default_rng(seed)
        work = 2.0 * self.sizes.prod() * 3.0  # forward + backward
        compute = work / (_PEAK_FLOP_S * devices) * (1.0 + 0.05 * rng.random(len(f)))
        out_bytes = self.sizes[:3].prod() * _BYTES / f[:, :3].prod(axis=1)
        comm = np.zeros(len(f))
        if len(sizes) == 4:  # a reduction dim k: all-reduce the partial output over f_k devices
            fk = f[:, 3]
            comm = np.where(fk > 1, 2 * (fk - 1) / fk * out_bytes / _LINK_BYTES_S + _LATENCY_S, 0.0)
        memory = 2.0 * out_bytes  # saved activations
        if params:
            # Adam mixed precision: 16 bytes per weight, shared by the splits of n and k only;
            # replicated weights need a gradient all-reduce over the other devices.
            weights = self.sizes[2] * self.sizes[3]
            shard = f[:, 2] * f[:, 3]
            memory = memory + 16.0 * weights / shard
            replicas = devices / shard
            comm = comm + np.where(
                replicas > 1, 2 * (replicas - 1) / replicas * 2 * weights / shard / _LINK_BYTES_S, 0.0
            )
        self.time_s = compute + comm
        self.memory_bytes = memory
        self.factors = f

    def out_split(self) -> np.ndarray:
        return self.factors[:, :3]

    def in_split(self) -> np.ndarray:
        """Split of the (b, s, last) input tile: k for matmuls, n for elementwise ops."""
        return self.factors[:, [0, 1, 3]] if self.factors.shape[1] == 4 else self.factors[:, :3]


def _redistribution(u: _OpModel, v: _OpModel, shape: Sequence[int]) -> np.ndarray:
    """PaSE-style edge cost: 2 x (consumer tile - part of it the producer tile holds) / bandwidth."""
    size = np.array(shape, dtype=np.float64)
    src = size / u.out_split()[:, None, :]
    tgt = size / v.in_split()[None, :, :]
    held = np.minimum(src, tgt).prod(axis=2)
    missing = tgt.prod(axis=2) - held
    return 2.0 * missing * _BYTES / _LINK_BYTES_S + np.where(missing > 0, _LATENCY_S, 0.0)


def transformer_tables(
    num_layers: int = 48,
    *,
    devices: int = 256,
    batch: int = 16,
    seq: int = 1024,
    hidden: int = 1024,
    seed: int = 0,
) -> CostTables:
    """A GPT-like stack: embed, ``num_layers`` x (ln1 qkv attn proj add1 ln2 fc1 fc2 add2), head.

    Matmul-like ops have dims (b, s, n, k), the others (b, s, h); a configuration splits each dim by
    a power of two with product at most ``devices`` (about 400 configurations per matmul at 256
    devices). Residual edges (previous add2 -> ln1 and add1; add1 -> add2) make each layer two
    cycles.

    Examples
    --------
    >>> tables = transformer_tables(2, devices=8, batch=4, seq=8, hidden=8)
    >>> tables.num_ops, len(tables.blocks[0].instances), tables.blocks[0].instances[1][0]
    (21, 2, 10)
    """
    max_exp = int(np.log2(devices))
    h = hidden
    ew = (batch, seq, h)
    models = {
        "ln": _OpModel(ew, max_exp, params=False, seed=seed + 1),
        "add": _OpModel(ew, max_exp, params=False, seed=seed + 2),
        "qkv": _OpModel((batch, seq, 3 * h, h), max_exp, params=True, seed=seed + 3),
        "attn": _OpModel((batch, seq, h, 3 * h), max_exp, params=False, seed=seed + 4),
        "proj": _OpModel((batch, seq, h, h), max_exp, params=True, seed=seed + 5),
        "fc1": _OpModel((batch, seq, 4 * h, h), max_exp, params=True, seed=seed + 6),
        "fc2": _OpModel((batch, seq, h, 4 * h), max_exp, params=True, seed=seed + 7),
    }
    layer = ["ln", "qkv", "attn", "proj", "add", "ln", "fc1", "fc2", "add"]
    # (producer position, consumer position, tensor shape) inside a layer; -1 = previous layer's add2
    inner = [
        (0, 1, ew), (1, 2, (batch, seq, 3 * h)), (2, 3, ew), (3, 4, ew), (4, 5, ew),
        (4, 8, ew), (5, 6, ew), (6, 7, (batch, seq, 4 * h)), (7, 8, ew),
    ]  # fmt: skip
    cache: dict[tuple[str, str, tuple[int, ...]], np.ndarray] = {}

    def edge_table(a: str, b: str, shape: tuple[int, ...]) -> np.ndarray:
        key = (a, b, shape)
        if key not in cache:  # identical op pairs share one array, as real cost tables do
            cache[key] = _redistribution(models[a], models[b], shape)
        return cache[key]

    kinds = ["add"]  # the embedding output behaves like an elementwise op
    edges: list[EdgeCost] = []
    instances = []
    for layer_index in range(num_layers):
        base = len(kinds)
        prev_out = base - 1
        kinds += layer
        instances.append(tuple(range(base, base + len(layer))))
        edges.append(EdgeCost(u=prev_out, v=base, time_s=edge_table("add", "ln", ew)))
        edges.append(EdgeCost(u=prev_out, v=base + 4, time_s=edge_table("add", "add", ew)))
        for a, b, shape in inner:
            edges.append(
                EdgeCost(u=base + a, v=base + b, time_s=edge_table(layer[a], layer[b], shape))
            )
    last = len(kinds) - 1
    kinds += ["ln", "proj"]  # final norm and a head-like matmul
    edges.append(EdgeCost(u=last, v=last + 1, time_s=edge_table("add", "ln", ew)))
    edges.append(EdgeCost(u=last + 1, v=last + 2, time_s=edge_table("ln", "proj", ew)))
    return CostTables(
        configs=tuple(simple_space(len(models[k].time_s)) for k in kinds),
        node_time_s=tuple(models[k].time_s for k in kinds),
        node_memory_bytes=tuple(models[k].memory_bytes for k in kinds),
        edges=tuple(edges),
        blocks=(BlockGroup(name="layers", instances=tuple(instances)),),
    )
