"""Random search problems for the search tests (no importer, no cost model).

Costs are small integers scaled by powers of two (times in 1/4 s and 1/8 s, memories in KiB), so
every sum is exact in float64 whatever the order: the DP, the frontier and the oracle must agree to
the last bit. Some ops share their arrays (the same object), as identical ops do in real tables, and
the ``blocks`` kind builds chains of identical blocks with a :class:`BlockGroup`.
"""

from __future__ import annotations

import numpy as np

from planner.core.graph import BlockGroup
from planner.core.tables import CostTables, EdgeCost
from planner.search.problem import evaluate_many
from planner.search.synthetic import simple_space

KINDS = ("chain", "diamond", "skip", "tree", "dag", "blocks")


def _sizes(rng: np.random.Generator, n: int, max_combinations: int) -> list[int]:
    sizes = [int(k) for k in rng.integers(1, 7, size=n)]
    while np.prod(sizes, dtype=np.float64) > max_combinations:
        i = int(np.argmax(sizes))
        sizes[i] -= 1
    return sizes


def _pairs(rng: np.random.Generator, kind: str, n: int) -> list[tuple[int, int]]:
    if kind == "chain":
        return [(i, i + 1) for i in range(n - 1)]
    if kind == "diamond":  # 0 -> {1, 2} -> 3, then a tail
        pairs = [(0, 1), (0, 2), (1, 3), (2, 3)]
        return pairs + [(i, i + 1) for i in range(3, n - 1)]
    if kind == "skip":  # chain plus residual-like skips
        pairs = [(i, i + 1) for i in range(n - 1)]
        for i in range(n - 2):
            if rng.random() < 0.5:
                pairs.append((i, i + int(rng.integers(2, 4)) if i + 3 < n else i + 2))
        return sorted(set(pairs))
    if kind == "tree":
        return [(int(rng.integers(0, i)), i) for i in range(1, n)]
    if kind == "dag":
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
        return pairs
    raise ValueError(kind)


class _Costs:
    """Random integer-valued arrays, reusing earlier arrays of the same shape now and then."""

    def __init__(self, rng: np.random.Generator, share: float = 0.3, infinite: float = 0.0) -> None:
        self.rng = rng
        self.share = share
        self.infinite = infinite
        self.seen: dict[tuple, list[np.ndarray]] = {}

    def _fresh(self, kind: str, shape: tuple[int, ...]) -> np.ndarray:
        if kind == "time":
            a = self.rng.integers(0, 64, size=shape) / 4
        elif kind == "memory":
            a = self.rng.integers(0, 16, size=shape) * 1024.0
        else:
            a = self.rng.integers(0, 32, size=shape) / 8
            if self.infinite:
                a[self.rng.random(shape) < self.infinite] = np.inf
        return a.astype(np.float64)

    def array(self, kind: str, shape: tuple[int, ...]) -> np.ndarray:
        pool = self.seen.setdefault((kind, shape), [])
        if pool and self.rng.random() < self.share:
            return pool[int(self.rng.integers(0, len(pool)))]
        a = self._fresh(kind, shape)
        pool.append(a)
        return a


def _build(sizes, pairs, costs: _Costs, blocks=(), node_arrays=None, edge_arrays=None) -> CostTables:
    node_time = []
    node_memory = []
    for i, k in enumerate(sizes):
        if node_arrays and i in node_arrays:
            t, m = node_arrays[i]
        else:
            t, m = costs.array("time", (k,)), costs.array("memory", (k,))
        node_time.append(t)
        node_memory.append(m)
    edges = []
    for u, v in pairs:
        table = edge_arrays[(u, v)] if edge_arrays and (u, v) in edge_arrays else costs.array("edge", (sizes[u], sizes[v]))
        edges.append(EdgeCost(u=u, v=v, time_s=table))
    return CostTables(
        configs=tuple(simple_space(k) for k in sizes),
        node_time_s=tuple(node_time),
        node_memory_bytes=tuple(node_memory),
        edges=tuple(edges),
        constant_time_s=float(costs.rng.integers(0, 4)) / 2,
        constant_memory_bytes=float(costs.rng.integers(0, 4)) * 1024,
        blocks=tuple(blocks),
    )


def block_chain_tables(
    seed: int,
    *,
    num_blocks: int = 3,
    block_size: int | None = None,
    max_size: int = 4,
    perturb: bool = False,
    shared_op: bool = False,
) -> CostTables:
    """prefix -> block x num_blocks -> suffix; identical blocks share every array.

    A block is a random small DAG on ``block_size`` ops whose first op reads the previous block's
    last op (and, half the time, a second op reads it too: a residual). ``perturb`` gives one block
    its own, different arrays (still listed in the group); ``shared_op`` adds an op outside the chain
    that feeds every block (like an attention mask).
    """
    rng = np.random.default_rng(seed)
    costs = _Costs(rng, share=0.0)
    width = block_size if block_size is not None else int(rng.integers(2, 4))
    local_sizes = [int(k) for k in rng.integers(1, max_size + 1, size=width)]
    inner = sorted({(i, i + 1) for i in range(width - 1)} | {
        (i, j) for i in range(width) for j in range(i + 2, width) if rng.random() < 0.4
    })
    entry = [0] + ([int(rng.integers(1, width))] if width > 1 and rng.random() < 0.5 else [])
    prefix_size = int(rng.integers(1, max_size + 1))
    node_t = [costs.array("time", (k,)) for k in local_sizes]
    node_m = [costs.array("memory", (k,)) for k in local_sizes]
    inner_t = {p: costs.array("edge", (local_sizes[p[0]], local_sizes[p[1]])) for p in inner}
    link_t = {j: costs.array("edge", (local_sizes[-1], local_sizes[j])) for j in entry}
    first_t = {j: costs.array("edge", (prefix_size, local_sizes[j])) for j in entry}
    sizes = [prefix_size]
    pairs = []
    node_arrays = {}
    edge_arrays = {}
    instances = []
    mask_op = None
    if shared_op:
        mask_op = 0  # op 0 becomes the shared op; the prefix is op 1
        sizes = [int(rng.integers(1, max_size + 1)), prefix_size]
        mask_t = {j: costs.array("edge", (sizes[0], local_sizes[j])) for j in range(width)}
        mask_target = int(rng.integers(0, width))
    previous_last = len(sizes) - 1
    for b in range(num_blocks):
        base = len(sizes)
        ops = tuple(range(base, base + width))
        instances.append(ops)
        sizes += local_sizes
        own = perturb and b == num_blocks // 2
        for j in range(width):
            node_arrays[base + j] = (
                (costs._fresh("time", (local_sizes[j],)), costs._fresh("memory", (local_sizes[j],)))
                if own
                else (node_t[j], node_m[j])
            )
        for a, c in inner:
            pairs.append((base + a, base + c))
            edge_arrays[(base + a, base + c)] = inner_t[(a, c)]
        for j in entry:
            pairs.append((previous_last, base + j))
            edge_arrays[(previous_last, base + j)] = (first_t if b == 0 else link_t)[j]
        if mask_op is not None:
            pairs.append((mask_op, base + mask_target))
            edge_arrays[(mask_op, base + mask_target)] = mask_t[mask_target]
        previous_last = base + width - 1
    suffix = len(sizes)
    sizes.append(int(rng.integers(1, max_size + 1)))
    pairs.append((previous_last, suffix))
    return _build(
        sizes,
        pairs,
        costs,
        blocks=(BlockGroup(name="blocks", instances=tuple(instances)),),
        node_arrays=node_arrays,
        edge_arrays=edge_arrays,
    )


def random_tables(seed: int, kind: str | None = None, *, max_combinations: int = 50_000, infinite: float = 0.0) -> CostTables:
    """A random problem of ``kind`` (default: chosen by the seed) small enough for the oracle."""
    rng = np.random.default_rng(seed)
    kind = KINDS[seed % len(KINDS)] if kind is None else kind
    if kind == "blocks":
        for attempt in range(50):
            tables = block_chain_tables(
                seed * 100 + attempt,
                num_blocks=int(rng.integers(2, 4)),
                max_size=4,
                perturb=bool(rng.random() < 0.2),
                shared_op=bool(rng.random() < 0.3),
            )
            sizes = [t.shape[0] for t in tables.node_time_s]
            if np.prod(sizes, dtype=np.float64) <= max_combinations:
                return tables
        raise RuntimeError("could not draw a small enough block chain")
    n = int(rng.integers(4 if kind == "diamond" else 1, 8))
    sizes = _sizes(rng, n, max_combinations)
    pairs = _pairs(rng, kind, n)
    return _build(sizes, pairs, _Costs(rng, share=0.3, infinite=infinite))


def assert_valid_choice(tables: CostTables, choice: np.ndarray, time_s: float, memory_bytes: float) -> None:
    """One index per op, each in range, and the reported values equal ``tables.evaluate``."""
    choice = np.asarray(choice)
    assert choice.shape == (tables.num_ops,)
    assert np.issubdtype(choice.dtype, np.integer)
    sizes = np.array([t.shape[0] for t in tables.node_time_s])
    assert np.all((0 <= choice) & (choice < sizes))
    assert tables.evaluate(choice) == (time_s, memory_bytes)
    batch_t, batch_m = evaluate_many(tables, choice[None, :])
    assert (float(batch_t[0]), float(batch_m[0])) == (time_s, memory_bytes)
