"""Budgeted search: estimates before allocating (budget.py) and the degradation ladder (degrade.py)."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.tables import CostTables, EdgeCost
from planner.search import budget as budget_module
from planner.search.blocks import plan_elimination
from planner.search.budget import SearchBudget, estimate_plan
from planner.search.degrade import fastest_within, frontier_within, split_masks
from planner.search.exhaustive import exhaustive_frontier, exhaustive_min
from planner.search.hull import supported_frontier
from planner.search.nsga2 import nsga2_frontier
from planner.search.restrict import restrict
from planner.search.synthetic import chain_tables


def _cube_space() -> ConfigSpace:
    """Three dims, each split 1, 2 or 4 ways: 27 rows; 1 + 6 split at most one dim."""
    factors = np.array(list(itertools.product((1, 2, 4), repeat=3)), dtype=np.int64)
    return ConfigSpace(dim_names=("a", "b", "c"), factors=factors, inter_factors=np.ones_like(factors))


def _cube_chain(ops: int, seed: int = 0) -> CostTables:
    """A chain of ops with 27 configurations each and integer-valued costs (exact sums)."""
    rng = np.random.default_rng(seed)
    space = _cube_space()
    k = space.size
    return CostTables(
        configs=tuple(space for _ in range(ops)),
        node_time_s=tuple(rng.integers(1, 64, size=k).astype(np.float64) for _ in range(ops)),
        node_memory_bytes=tuple(rng.integers(1, 64, size=k).astype(np.float64) * 1024 for _ in range(ops)),
        edges=tuple(
            EdgeCost(u=i, v=i + 1, time_s=rng.integers(0, 16, size=(k, k)).astype(np.float64)) for i in range(ops - 1)
        ),
    )


def _valid(tables: CostTables, choice: np.ndarray) -> None:
    assert choice.shape == (tables.num_ops,)
    assert all(0 <= c < t.shape[0] for c, t in zip(choice, tables.node_time_s))


class TestEstimate:
    def test_work_is_the_plans_table_cells(self):
        tables = chain_tables([3, 4, 5, 2], seed=3)
        plan = plan_elimination(tables)
        assert estimate_plan(tables, plan).work_cells == plan.total_table_cells

    def test_chain_by_hand(self):
        # chain 3-4-5 eliminated 0, 1, 2: tables 3*4 (keeps 4 cells), 4*5 (keeps 5), 5 (keeps 1)
        tables = chain_tables([3, 4, 5])
        plan = plan_elimination(tables, order=[0, 1, 2])
        estimate = estimate_plan(tables, plan)
        assert estimate.work_cells == 3 * 4 + 4 * 5 + 5
        assert estimate.kept_cells == 4 + 5 + 1
        # kept tables plus three result-sized temporaries of the largest step (5 cells), 8 bytes each
        assert estimate.memory_bytes == 8 * (10 + 3 * 5)
        assert estimate.time_s == pytest.approx(37 * budget_module.SECONDS_PER_CELL + 3 * 2.0e-4)

    def test_budget_validation(self):
        with pytest.raises(InputError, match="--time-limit"):
            SearchBudget(time_limit_s=0)
        with pytest.raises(InputError, match="--max-memory"):
            SearchBudget(max_memory_bytes=float("nan"))

    def test_default_ceiling(self):
        import os

        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        assert budget_module.default_max_memory_bytes() == min(4 * 2**30, physical // 2)


class TestSplitMasks:
    def test_counts_by_hand(self):
        tables = _cube_chain(2)
        # at most one split dim: the replicated row and 3 dims x 2 factors = 7 of 27
        assert [int(m.sum()) for m in split_masks(tables, 1)] == [7, 7]
        # at most two: 7 + 3 pairs x 2 x 2 = 19
        assert [int(m.sum()) for m in split_masks(tables, 2)] == [19, 19]
        assert [int(m.sum()) for m in split_masks(tables, 3)] == [27, 27]

    def test_seeds_survive(self):
        tables = _cube_chain(2)
        full = np.array([26, 26])  # (4, 4, 4): three split dims
        masks = split_masks(tables, 1, seeds=full[None, :])
        assert masks[0][26] and masks[1][26] and int(masks[0].sum()) == 8


class TestLadder:
    def test_exact_when_the_budget_allows(self):
        tables = _cube_chain(3)
        found = frontier_within(tables, SearchBudget(), epsilon=0.0)
        oracle = exhaustive_frontier(tables)
        assert found.tier == "exact" and found.notes == () and found.result.exact
        assert [(p.time_s, p.memory_bytes) for p in found.result.points] == [
            (p.time_s, p.memory_bytes) for p in oracle.points
        ]

    def test_restricted_when_the_full_search_is_predicted_too_slow(self, monkeypatch):
        # 0.05 s per cell: the full chain (~2.2e3 cells) and the <=2-split one (~1.1e3) are predicted
        # past a third of 60 s, the <=1-split one (~150 cells, 7.4 s) within it
        monkeypatch.setattr(budget_module, "SECONDS_PER_CELL", 0.05)
        tables = _cube_chain(4, seed=1)
        found = frontier_within(tables, SearchBudget(time_limit_s=60.0), epsilon=0.0)
        assert found.tier == "restricted" and found.max_split_dims == 1
        assert not found.result.exact and found.result.memory_bound_factor is None
        assert any("splits at most 1 of its dims" in note for note in found.notes)
        # the answer is the exact frontier of the restricted problem (brute force), in original indices
        restricted = restrict(tables, split_masks(tables, 1))
        oracle = exhaustive_frontier(restricted.tables)
        assert [(p.time_s, p.memory_bytes) for p in found.result.points] == [
            (p.time_s, p.memory_bytes) for p in oracle.points
        ]
        for point in found.result.points:
            _valid(tables, point.choice)
            assert tables.evaluate(point.choice) == (point.time_s, point.memory_bytes)
            assert all(np.count_nonzero(space.factors[c] > 1) <= 1 for space, c in zip(tables.configs, point.choice))

    def test_nsga2_when_no_memory_is_left(self):
        tables = _cube_chain(3, seed=2)
        found = frontier_within(tables, SearchBudget(max_memory_bytes=1.0), seed=0)
        assert found.tier == "nsga2"
        assert any("NSGA-II" in note for note in found.notes)
        oracle = exhaustive_frontier(tables)
        for point in found.result.points:
            _valid(tables, point.choice)
            # an approximation never beats the exact frontier
            assert any(q.time_s <= point.time_s and q.memory_bytes <= point.memory_bytes for q in oracle.points)

    def test_fastest_within_exact_or_restricted(self, monkeypatch):
        tables = _cube_chain(4, seed=4)
        choice, exact, notes, _, _ = fastest_within(tables, SearchBudget())
        assert exact and notes == ()
        assert tables.evaluate(choice)[0] == exhaustive_min(tables).time_s
        monkeypatch.setattr(budget_module, "SECONDS_PER_CELL", 0.05)
        # 0.8 x 60 s: the <=2-split problem (~1.1e3 cells, 54 s) does not fit, <=1 does
        choice, exact, notes, _, _ = fastest_within(tables, SearchBudget(time_limit_s=60.0))
        restricted = restrict(tables, split_masks(tables, 1))
        assert not exact and tables.evaluate(choice)[0] == exhaustive_min(restricted.tables).time_s


class TestDeadlines:
    def test_hull_past_its_deadline_keeps_the_two_exact_ends(self):
        tables = chain_tables([3, 4, 2, 5], seed=7)
        hull = supported_frontier(tables, fill=False, deadline_s=time.perf_counter() - 1.0)
        oracle = exhaustive_frontier(tables).points
        times = [p.time_s for p in hull.points]
        assert min(times) == oracle[0].time_s
        assert min(p.memory_bytes for p in hull.points) == oracle[-1].memory_bytes
        assert len(hull.points) <= 2

    def test_nsga2_stops_at_its_time_limit_and_keeps_known_choices(self):
        tables = _cube_chain(4, seed=5)
        best = exhaustive_min(tables)
        # a million generations would take hours: the time limit ends it (the test would hang otherwise)
        front = nsga2_frontier(tables, seed=1, generations=10**6, time_limit_s=1.0, initial=best.choice[None, :])
        assert math.isclose(front.points[0].time_s, best.time_s)  # the known optimum is never lost
