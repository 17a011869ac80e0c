"""``PlanResult.memory_bound_factor`` is a true statement about the rows plan() lists: every
Pareto-optimal (T*, M*), found by enumerating every choice (the exhaustive oracle), has a listed
row with T <= T* and M <= factor x M*, also when the rows are thinned after the search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import planner.plan as plan_module
from objectives.cluster import make_cluster
from planner.plan import PlanRequest, build_model, plan
from planner.search.exhaustive import MAX_COMBINATIONS, exhaustive_frontier
from planner.search.problem import config_counts
from tests.objectives.graphs import mlp_chain

SEEDS = range(8)


def _case(seed: int):
    """A random MLP on 16 devices (one node or four) whose choices the oracle enumerates; big
    enough frontiers (tens of points) that the default rows are thinned now and then."""
    rng = np.random.default_rng(seed)
    while True:
        widths = tuple(int(x) for x in rng.choice([16, 32, 64, 128, 256], size=int(rng.integers(4, 6))))
        graph = mlp_chain(batch=int(rng.choice([16, 32, 64])), widths=widths, relu=bool(rng.random() < 0.5))
        request = PlanRequest(
            cluster=make_cluster("a100-80gb", devices=16, devices_per_node=int(rng.choice([16, 4]))), epsilon=0.01
        )
        tables = build_model(graph, request).tables
        if np.prod(config_counts(tables), dtype=np.float64) <= MAX_COMBINATIONS:
            return graph, request, tables


def _needed_factor(oracle, rows) -> float:
    """The least factor that makes the statement true for ``rows`` (``(time, memory)`` pairs)."""
    need = 1.0
    for p in oracle:
        covering = [m for t, m in rows if t <= p.time_s * (1 + 1e-12)]
        need = max(need, min(covering) / p.memory_bytes if covering else float("inf"))
    return need


@pytest.mark.parametrize("rows_kept", [32, 6])
@pytest.mark.parametrize("seed", SEEDS)
def test_the_listed_rows_cover_the_pareto_set_within_the_stated_factor(seed: int, rows_kept: int, monkeypatch) -> None:
    """At the default epsilon, with the default row cap (32) and a small one (6: every frontier
    here is thinned): the factor needed never passes the factor stated, which multiplies the
    search's own bound by the thinning's."""
    monkeypatch.setattr(plan_module, "_MAX_INEXACT_ROWS", rows_kept)
    graph, request, tables = _case(seed)
    oracle = exhaustive_frontier(tables).points
    result = plan(graph, request, with_targets=False)
    listed = [(p.strategy.time_s, p.strategy.memory_bytes) for p in result.points]
    stated = result.memory_bound_factor
    assert stated is not None and stated >= 1.0
    assert _needed_factor(oracle, listed) <= stated * (1 + 1e-9)
    thinned = [n for n in result.cost.notes if "thinned to" in n]
    if rows_kept == 6 and len(oracle) > 6:
        assert thinned and len(result.points) <= 6 + 1  # the pick may add one row
        factor = float(thinned[0].split("at most ")[1].split("x")[0])
        assert stated >= factor * (1 - 1e-3)  # the note's factor (rounded) is part of the stated one


def _best_cover(memories: np.ndarray, rows: int) -> float:
    """Brute force: the least factor of any ``rows`` points, the first and the last among them."""
    n = memories.size
    best = float("inf")
    for size in range(2, min(rows, n) + 1):
        for middle in itertools.combinations(range(1, n - 1), size - 2):
            kept = (0, *middle, n - 1)
            factor = max(memories[max(k for k in kept if k <= i)] / memories[i] for i in range(n))
            best = min(best, factor)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_thinning_keeps_the_least_factor(seed: int) -> None:
    """_thinnest_cover against every subset: at most ``rows`` kept, both ends kept, every point
    covered within the factor it reports, and that factor the least any subset achieves."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 11))
    memories = np.sort(rng.uniform(1.0, 3.0, size=n))[::-1].copy()  # fastest first: memory decreasing
    if seed % 5 == 0:
        memories[1] = memories[0]  # ties
    rows = int(rng.integers(2, n + 1))
    kept, factor = plan_module._thinnest_cover(memories, rows)
    assert kept.size <= rows and kept[0] == 0 and kept[-1] == n - 1 and np.all(np.diff(kept) > 0)
    covering = kept[np.searchsorted(kept, np.arange(n), side="right") - 1]
    assert np.all(memories[covering] <= factor * memories * (1 + 1e-12))
    assert factor == pytest.approx(_best_cover(memories, rows), rel=1e-12)
