r"""What a heuristic search starts from and keeps: the replicated plan and smaller meshes' plans.

When the exact search degrades (a restriction, NSGA-II), nothing bounds its answer by what simpler
plans achieve. On scan-heavy graphs with no repeated blocks, NSGA-II's random first population at
64 devices sat far from any good plan, and its best was many times slower than the best plan found
at 8 devices (issue 25). So a degraded search is seeded with:

* the fully replicated plan (every op's first row: every factor 1, copies on every device,
  :func:`planner.core.configs.enumerate_configs`) and every op on one device (its first row with
  one copy);
* the best plan of a smaller mesh, **embedded**: each op keeps its configuration's split factors
  (and their node placement where the larger space has it) and the extra devices either idle or
  hold copies (the "replicas" rows the spaces offer for ops that are not
  :data:`~planner.core.configs.HEAVY_KINDS`). A plan on :math:`m` devices runs on :math:`N \ge m`
  this way, so the best plan at :math:`N` is never slower than those embeddings priced at :math:`N`
  (:func:`merge_seeds` keeps them in the result).

Everything here reads only configuration spaces and cost tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from planner.core.configs import ConfigSpace
from planner.core.tables import CostTables
from planner.search.pareto import pareto_mask
from planner.search.problem import evaluate_many
from planner.search.results import FrontierPoint, FrontierResult

__all__ = ["baseline_seeds", "embed_choice", "combine_seeds", "merge_seeds"]


def _first_row(space: ConfigSpace, *, copies: bool) -> int:
    """The first row with every factor 1: with copies on every device (``copies``) or on one."""
    unsplit = np.flatnonzero((np.asarray(space.factors) == 1).all(axis=1))
    if unsplit.size == 0:
        return 0
    replicas = space.replica_counts[unsplit]
    wanted = unsplit[replicas > 1] if copies else unsplit[replicas == 1]
    return int(wanted[0]) if wanted.size else int(unsplit[0])


def baseline_seeds(tables: CostTables) -> np.ndarray:
    """``(2, num_ops)``: the fully replicated plan (copies everywhere) and every op on one device.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> baseline_seeds(chain_tables([3, 2])).tolist()
    [[0, 0], [0, 0]]
    """
    return np.array(
        [[_first_row(s, copies=True) for s in tables.configs], [_first_row(s, copies=False) for s in tables.configs]],
        dtype=np.int64,
    ).reshape(2, tables.num_ops)


def _same_split_rows(small: ConfigSpace, row: int, large: ConfigSpace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``large`` with the split factors of ``small``'s ``row``: all of them, the idle ones
    (one copy) and the ones with copies; each ordered with the same node placement first."""
    factors = np.asarray(small.factors)[row]
    same = np.flatnonzero((np.asarray(large.factors) == factors).all(axis=1))
    if same.size == 0:
        return same, same, same
    placed = (np.asarray(large.inter_factors)[same] == np.asarray(small.inter_factors)[row]).all(axis=1)
    same = same[np.argsort(~placed, kind="stable")]  # the same inter-node parts first
    copies = large.replica_counts[same]
    return same, same[copies == 1], same[copies > 1]


def embed_choice(small_spaces: Sequence[ConfigSpace], choice: Sequence[int], tables: CostTables) -> np.ndarray:
    """Choices of ``tables`` (a larger mesh) that run ``choice`` (a plan over ``small_spaces``, the same
    ops on fewer devices) with the same split factors; ``(n, num_ops)``, up to three variants:

    0. copies where the small plan had copies, idle devices elsewhere;
    1. every op idle beyond its split (one copy);
    2. copies wherever the space offers them.

    An op whose split the larger space lacks (a factor no longer allowed) takes the row with the
    most of the same factors. Empty ``(0, num_ops)`` when the graphs differ.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> tables = chain_tables([3, 2])
    >>> embed_choice(tables.configs, [2, 1], tables)[0].tolist()
    [2, 1]
    """
    if len(small_spaces) != tables.num_ops:
        return np.zeros((0, tables.num_ops), dtype=np.int64)
    variants = np.zeros((3, tables.num_ops), dtype=np.int64)
    for i, (small, row, large) in enumerate(zip(small_spaces, choice, tables.configs)):
        if np.asarray(small.factors).shape[1] != np.asarray(large.factors).shape[1]:
            return np.zeros((0, tables.num_ops), dtype=np.int64)
        same, idle, copied = _same_split_rows(small, int(row), large)
        if same.size == 0:
            variants[:, i] = _nearest_row(np.asarray(small.factors)[int(row)], large)
            continue
        had_copies = int(small.replica_counts[int(row)]) > 1
        first_idle = int(idle[0]) if idle.size else int(same[0])
        first_copied = int(copied[0]) if copied.size else first_idle
        variants[0, i] = first_copied if had_copies else first_idle
        variants[1, i] = first_idle
        variants[2, i] = first_copied
    return np.unique(variants, axis=0)


def _nearest_row(factors: np.ndarray, large: ConfigSpace) -> int:
    """The row of ``large`` sharing the most factors with ``factors`` (fewest devices on ties)."""
    table = np.asarray(large.factors)
    shared = (table == factors).sum(axis=1)
    best = np.flatnonzero(shared == shared.max())
    return int(best[np.argmin(table[best].prod(axis=1))])


def combine_seeds(num_ops: int, *groups: np.ndarray | None) -> np.ndarray:
    """The rows of ``groups`` (each ``(n, num_ops)`` or ``None``) in order, duplicates dropped."""
    rows = [np.asarray(g, dtype=np.int64).reshape(-1, num_ops) for g in groups if g is not None and len(g)]
    if not rows:
        return np.zeros((0, num_ops), dtype=np.int64)
    stacked = np.concatenate(rows)
    _, first = np.unique(stacked, axis=0, return_index=True)
    return stacked[np.sort(first)]


def merge_seeds(tables: CostTables, result: FrontierResult, seeds: np.ndarray | None) -> FrontierResult:
    """``result`` with the seeds' points added where no point dominates them (Pareto union): a
    heuristic never returns less than the plans it started from.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.exhaustive import exhaustive_frontier
    >>> tables = chain_tables([3, 3], seed=2)
    >>> empty = replace(exhaustive_frontier(tables), points=())
    >>> len(merge_seeds(tables, empty, np.array([[0, 0]])).points)
    1
    """
    if seeds is None or not len(seeds):
        return result
    seeds = np.asarray(seeds, dtype=np.int64).reshape(-1, tables.num_ops)
    choices = np.concatenate([np.array([p.choice for p in result.points], dtype=np.int64).reshape(-1, tables.num_ops), seeds])
    time_s, memory = evaluate_many(tables, choices)
    keep = np.flatnonzero(pareto_mask(time_s, memory) & np.isfinite(time_s) & np.isfinite(memory))
    keep = keep[np.argsort(time_s[keep], kind="stable")]
    _, unique = np.unique(choices[keep], axis=0, return_index=True)
    keep = keep[np.sort(unique)]
    points = tuple(FrontierPoint(time_s=float(time_s[i]), memory_bytes=float(memory[i]), choice=choices[i]) for i in keep)
    return replace(result, points=points)
