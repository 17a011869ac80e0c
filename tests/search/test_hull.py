"""The weighted-DP convex hull against the hull of the exhaustive frontier; the fill between vertices."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from planner.core.errors import InputError
from planner.search.exhaustive import exhaustive_frontier
from planner.search.hull import supported_frontier

from .random_tables import assert_valid_choice, random_tables

SEEDS = range(0, 240, 2)


def _hull_vertices(points: list[tuple[float, float]]) -> set[tuple[float, float]]:
    """Vertices of the lower-left convex hull of a Pareto set (time ascending), collinear points
    excluded, in exact rational arithmetic (the random tables hold dyadic values)."""
    exact = sorted((Fraction(t), Fraction(m)) for t, m in points)
    chain: list[tuple[Fraction, Fraction]] = []
    for p in exact:
        # pop while the last two and p do not turn strictly counter-clockwise (time right, memory up)
        while len(chain) >= 2:
            (t1, m1), (t2, m2) = chain[-2], chain[-1]
            cross = (t2 - t1) * (p[1] - m1) - (m2 - m1) * (p[0] - t1)
            if cross <= 0:
                chain.pop()
            else:
                break
        chain.append(p)
    return {(float(t), float(m)) for t, m in chain}


class TestSupportedFrontier:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_vertices_equal_hull_of_exhaustive_frontier(self, seed: int) -> None:
        tables = random_tables(seed)
        oracle = [(p.time_s, p.memory_bytes) for p in exhaustive_frontier(tables).points]
        ours = supported_frontier(tables, fill=False, max_solves=1000)
        found = {(p.time_s, p.memory_bytes) for p in ours.points}
        assert found == _hull_vertices(oracle)
        for p in ours.points:
            assert_valid_choice(tables, p.choice, p.time_s, p.memory_bytes)
        assert ours.method == "hull"
        assert ours.exact == (len(oracle) == 1)

    @pytest.mark.parametrize("seed", SEEDS)
    def test_fill_keeps_vertices_and_is_a_pareto_set(self, seed: int) -> None:
        tables = random_tables(seed)
        vertices = supported_frontier(tables, fill=False, max_solves=1000)
        filled = supported_frontier(tables, fill=True, max_solves=1000)
        values = [(p.time_s, p.memory_bytes) for p in filled.points]
        assert {(p.time_s, p.memory_bytes) for p in vertices.points} <= set(values)
        times, memories = filled.times_s, filled.memories_bytes
        assert np.all(np.diff(times) > 0) and np.all(np.diff(memories) < 0)
        oracle = exhaustive_frontier(tables).points
        for p in filled.points:  # points between vertices are real strategies
            assert_valid_choice(tables, p.choice, p.time_s, p.memory_bytes)
        assert values[0] == (oracle[0].time_s, oracle[0].memory_bytes)
        assert values[-1] == (oracle[-1].time_s, oracle[-1].memory_bytes)

    def test_solve_cap_keeps_the_extremes(self) -> None:
        tables = random_tables(11)
        oracle = exhaustive_frontier(tables).points
        capped = supported_frontier(tables, fill=False, max_solves=0)
        assert (capped.points[0].time_s, capped.points[-1].memory_bytes) == (oracle[0].time_s, oracle[-1].memory_bytes)
        assert "non-convex parts may be missed" in capped.bound_text() or capped.exact

    def test_negative_cap_is_an_input_error(self) -> None:
        with pytest.raises(InputError, match="max_solves"):
            supported_frontier(random_tables(0), max_solves=-1)

    def test_progress_rises_to_at_most_one(self) -> None:
        seen: list[float] = []
        supported_frontier(random_tables(3), max_solves=5, progress=seen.append)
        assert len(seen) >= 2 and seen == sorted(seen) and 0 < seen[0] and seen[-1] <= 1
