"""Restrict the search to allowed configurations per op (baselines, memory ties, user pins).

A baseline such as "pure data parallel" or "uniform dp x tp" is a DP over restricted tables: the
caller builds a boolean mask per op from op semantics (which rows of its ``ConfigSpace`` split only
the batch, ...), :func:`restrict` keeps those rows of every table, and
:meth:`Restricted.to_original` maps the restricted choice back to the original row indices.

Arrays shared between ops stay shared after restriction when their masks are equal, so block
reuse (:mod:`planner.search.blocks`) still applies to restricted problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.tables import CostTables, EdgeCost

__all__ = ["Restricted", "restrict"]


class Restricted(NamedTuple):
    """Restricted tables and, per op, the original index of each kept configuration."""

    tables: CostTables
    index_maps: tuple[np.ndarray, ...]
    """Per op, ``(K'_i,)`` int64: restricted row -> original row."""

    def to_original(self, choice: Sequence[int] | np.ndarray) -> np.ndarray:
        """Map a choice on the restricted tables to original configuration indices."""
        picks = np.asarray(choice, dtype=np.int64)
        return np.array([int(m[c]) for m, c in zip(self.index_maps, picks)], dtype=np.int64)

    def to_restricted(self, choice: Sequence[int] | np.ndarray) -> np.ndarray | None:
        """The restricted indices of an original choice, or ``None`` if some op's row was dropped."""
        out = []
        for index_map, c in zip(self.index_maps, np.asarray(choice, dtype=np.int64)):
            where = np.flatnonzero(index_map == c)
            if where.size == 0:
                return None
            out.append(int(where[0]))
        return np.array(out, dtype=np.int64)


def restrict(tables: CostTables, masks: Sequence[np.ndarray]) -> Restricted:
    """Keep only the allowed configurations of each op.

    Parameters
    ----------
    tables:
        The problem.
    masks:
        Per op, a ``(K_i,)`` boolean array (True = allowed); at least one True per op.

    Returns
    -------
    Restricted
        ``(tables, index_maps)``; unpacks as a tuple.

    Raises
    ------
    InputError
        When a mask has the wrong length or allows nothing for some op.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> tables = chain_tables([3, 2])
    >>> sub, maps = restrict(tables, [np.array([True, False, True]), np.array([True, True])])
    >>> sub.edges[0].time_s.shape, maps[0].tolist()
    ((2, 2), [0, 2])
    """
    if len(masks) != tables.num_ops:
        raise InputError(f"restrict needs one mask per op ({tables.num_ops}), got {len(masks)}")
    keep = []
    for i, (mask, t) in enumerate(zip(masks, tables.node_time_s)):
        m = np.asarray(mask, dtype=bool)
        if m.shape != t.shape:
            raise InputError(f"mask of op {i} has shape {m.shape}, expected {t.shape}; build it over the op's ConfigSpace")
        if not m.any():
            raise InputError(f"mask of op {i} allows no configuration; allow at least one (e.g. replicated)")
        keep.append(np.flatnonzero(m))
    memo: dict[tuple, np.ndarray] = {}

    def cut(array: np.ndarray, *rows: np.ndarray) -> np.ndarray:
        # identical (array, rows) give one shared result, so shared tables stay shared
        key = (id(array), *(r.tobytes() for r in rows))
        if key not in memo:
            memo[key] = array[np.ix_(*rows)] if len(rows) > 1 else array[rows[0]]
        return memo[key]

    configs = tuple(
        c.subset(k) for c, k in zip(tables.configs, keep)
    )
    sub = CostTables(
        configs=configs,
        node_time_s=tuple(cut(t, k) for t, k in zip(tables.node_time_s, keep)),
        node_memory_bytes=tuple(cut(m, k) for m, k in zip(tables.node_memory_bytes, keep)),
        edges=tuple(
            EdgeCost(u=e.u, v=e.v, time_s=cut(e.time_s, keep[e.u], keep[e.v])) for e in tables.edges
        ),
        constant_time_s=tables.constant_time_s,
        constant_memory_bytes=tables.constant_memory_bytes,
        blocks=tables.blocks,
    )
    return Restricted(sub, tuple(k.astype(np.int64) for k in keep))
