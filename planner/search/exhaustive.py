"""The oracle: enumerate every choice. Exact minimum and exact Pareto frontier of tiny problems.

All :math:`\\prod_i K_i` choices are evaluated in chunks with
:func:`planner.search.problem.evaluate_many` (the same sums as ``CostTables.evaluate``), so the
oracle shares no code with the elimination it checks. Ties go to the lowest flat index (the
lexicographically smallest choice).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables
from planner.search.pareto import pareto_mask
from planner.search.problem import check_tables, config_counts, evaluate_many
from planner.search.results import DPResult, FrontierPoint, FrontierResult

__all__ = ["exhaustive_min", "exhaustive_frontier", "MAX_COMBINATIONS"]

MAX_COMBINATIONS = 2_000_000
"""Refuse problems with more choices than this (about a second of work)."""

_CHUNK = 1 << 16


def _all_choices(tables: CostTables, max_combinations: int) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """Yield ``(first flat index, choices, time_s, memory_bytes)`` chunk by chunk."""
    sizes = config_counts(tables)
    total = int(np.prod(sizes, dtype=np.float64))
    if total > max_combinations:
        raise InputError(
            f"exhaustive search over {total:.3g} choices exceeds the limit of {max_combinations}; "
            "use solve_min / pareto_frontier"
        )
    for start in range(0, total, _CHUNK):
        flat = np.arange(start, min(total, start + _CHUNK), dtype=np.int64)
        choices = np.stack(np.unravel_index(flat, tuple(sizes)), axis=1) if sizes.size else np.zeros((flat.size, 0), np.int64)
        time_s, memory = evaluate_many(tables, choices)
        yield start, choices, time_s, memory


def exhaustive_min(
    tables: CostTables,
    *,
    objective: Literal["time", "memory"] = "time",
    memory_weight_s_per_byte: float = 0.0,
    max_combinations: int = MAX_COMBINATIONS,
) -> DPResult:
    """The exact minimum by enumeration, with the same objectives as :func:`solve_min`.

    ``objective="memory"`` minimises memory, then time among the minimisers.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> result = exhaustive_min(chain_tables([2, 2], seed=3))
    >>> result.choice.tolist(), result.value == result.time_s
    ([1, 0], True)
    """
    check_tables(tables)
    best_key: tuple[float, float] | None = None
    best_choice = None
    for _, choices, time_s, memory in _all_choices(tables, max_combinations):
        if objective == "time":
            primary = time_s + memory_weight_s_per_byte * memory if memory_weight_s_per_byte else time_s
            secondary = np.zeros_like(primary)
        else:
            primary, secondary = memory, time_s
        # lexsort: last key is primary; ties keep the lowest index (stable)
        i = int(np.lexsort((secondary, primary))[0])
        key = (float(primary[i]), float(secondary[i]))
        if best_key is None or key < best_key:
            best_key, best_choice = key, choices[i].copy()
    assert best_key is not None and best_choice is not None
    time_s, memory = (float(x[0]) for x in evaluate_many(tables, best_choice[None, :]))
    return DPResult(
        choice=best_choice.astype(np.int64),
        time_s=time_s,
        memory_bytes=memory,
        value=best_key[0],
        order_name="exhaustive",
        max_table_cells=0,
    )


def exhaustive_frontier(tables: CostTables, *, max_combinations: int = MAX_COMBINATIONS) -> FrontierResult:
    """The exact Pareto frontier of (time, memory) by enumeration; one (lowest-index) choice per point.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> front = exhaustive_frontier(chain_tables([3, 3], seed=2))
    >>> bool(np.all(np.diff(front.times_s) > 0) and np.all(np.diff(front.memories_bytes) < 0))
    True
    """
    check_tables(tables)
    keep_t, keep_m, keep_c = [], [], []
    for _, choices, time_s, memory in _all_choices(tables, max_combinations):
        finite = np.isfinite(time_s) & np.isfinite(memory)
        t, m, c = time_s[finite], memory[finite], choices[finite]
        mask = pareto_mask(t, m)
        keep_t.append(t[mask])
        keep_m.append(m[mask])
        keep_c.append(c[mask])
    t = np.concatenate(keep_t)
    m = np.concatenate(keep_m)
    c = np.concatenate(keep_c)
    mask = pareto_mask(t, m)  # candidates are in flat-index order, so ties keep the lowest index
    order = np.argsort(t[mask], kind="stable")
    points = tuple(
        FrontierPoint(time_s=float(tt), memory_bytes=float(mm), choice=cc.astype(np.int64))
        for tt, mm, cc in zip(t[mask][order], m[mask][order], c[mask][order])
    )
    return FrontierResult(
        points=points,
        epsilon=0.0,
        exact=True,
        max_table_cells=0,
        order_name="exhaustive",
        method="exhaustive",
    )
