"""Pareto filter against brute force; hypervolume by hand; memory limits."""

from __future__ import annotations

import numpy as np
import pytest

from planner.search.pareto import TIME_TIE, dominated_by, dominates, fastest_within, hypervolume, pareto_mask
from planner.search.results import FrontierPoint, FrontierResult


@pytest.mark.parametrize("seed", range(20))
def test_pareto_mask_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 10, size=40).astype(float)
    m = rng.integers(0, 10, size=40).astype(float)
    mask = pareto_mask(t, m)
    dominated = np.array([any(dominates((t[j], m[j]), (t[i], m[i])) for j in range(t.size)) for i in range(t.size)])
    for i in range(t.size):
        duplicate_before = any(t[j] == t[i] and m[j] == m[i] for j in range(i))
        assert mask[i] == (not dominated[i] and not duplicate_before)
    # every dominated point is dominated by a Pareto point (transitivity)
    assert np.array_equal(dominated_by(t, m, t[mask], m[mask]), dominated)


@pytest.mark.parametrize("seed", range(20))
def test_tied_pareto_mask_matches_brute_force(seed: int) -> None:
    """Times a few ``TIME_TIE`` apart (some within it, some not): the mask is the points no other
    dominates in the tied sense (:func:`dominates` with ``time_tie``), pair by pair, and filtering the
    exact frontier with the tie gives the same set as filtering every point."""
    rng = np.random.default_rng(seed)
    t = 1.0 + rng.integers(0, 6, size=40) * 0.6 * TIME_TIE + rng.integers(0, 3, size=40) * 0.1
    m = rng.integers(0, 10, size=40).astype(float)
    mask = pareto_mask(t, m, time_tie=TIME_TIE)
    for i in range(t.size):
        beaten = any(dominates((t[j], m[j]), (t[i], m[i]), time_tie=TIME_TIE) for j in range(t.size))
        duplicate_before = any(t[j] == t[i] and m[j] == m[i] for j in range(i))
        assert mask[i] == (not beaten and not duplicate_before)
    exact = np.flatnonzero(pareto_mask(t, m))
    again = exact[pareto_mask(t[exact], m[exact], time_tie=TIME_TIE)]
    assert np.array_equal(again, np.flatnonzero(mask))


def test_tied_times_by_hand() -> None:
    # the README job's three rows (2026-12-02): 0.8 and 2.5 ns apart, 1.71 / 1.56 / 1.47 GiB
    t = np.array([0.037851408415890145, 0.03785140923982345, 0.03785141088769005, 0.03816472888823786])
    m = np.array([1.71, 1.56, 1.47, 1.45])
    assert pareto_mask(t, m).tolist() == [True, True, True, True]
    assert pareto_mask(t, m, time_tie=TIME_TIE).tolist() == [False, False, True, True]
    # a faster row with the same memory still dominates a tied slower one; a tied larger one never
    assert dominates((1.0, 2.0), (1.0 + 1e-7, 2.0), time_tie=TIME_TIE)
    assert not dominates((1.0 + 1e-7, 2.0), (1.0, 2.0), time_tie=TIME_TIE)
    assert not dominates((1.0 + 2e-6, 1.0), (1.0, 2.0), time_tie=TIME_TIE)  # beyond the tie: a trade-off


def test_hypervolume_by_hand() -> None:
    # staircase (1, 3), (2, 2), (3, 1) against reference (4, 4): 3 + 2 + 1 = 6
    assert hypervolume(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]), (4.0, 4.0)) == pytest.approx(6.0)
    assert hypervolume(np.array([]), np.array([]), (1.0, 1.0)) == 0.0


def _front(*pairs: tuple[float, float]) -> FrontierResult:
    points = tuple(FrontierPoint(time_s=t, memory_bytes=m, choice=np.array([i])) for i, (t, m) in enumerate(pairs))
    return FrontierResult(points=points, epsilon=0.0, exact=True, max_table_cells=0, order_name="test")


def test_fastest_within() -> None:
    front = _front((1.0, 9e9), (2.0, 5e9), (4.0, 2e9))
    fit = fastest_within(front, 6e9)
    assert fit.feasible and fit.point is not None and fit.point.time_s == 2.0
    assert fastest_within(front, 9e9).point.time_s == 1.0
    none = fastest_within(front, 1e9)
    assert not none.feasible and none.point is None
    assert none.smallest_memory_bytes == 2e9 and "smallest needs" in none.message
    empty = fastest_within(_front(), 1e9)
    assert not empty.feasible and empty.smallest_memory_bytes == float("inf")


def test_bound_text() -> None:
    exact = _front((1.0, 2.0))
    assert exact.bound_text() == "exact Pareto frontier"
    approx = FrontierResult(points=(), epsilon=0.01, exact=False, max_table_cells=0, order_name="x",
                            memory_bound_factor=1.02, bucket_depth=3)
    assert "1.02 x M*" in approx.bound_text() and "(1+eps)^3" in approx.bound_text()
    assert "0 points" in str(approx)
