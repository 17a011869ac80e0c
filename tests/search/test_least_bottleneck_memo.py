"""``planner.search.stages.least_bottleneck`` keeps its answers by content (issue 22, twelfth round): an answer
read back equals the DP run afresh and the brute force over every cut, and no two asks that differ in a cost,
the stage count or an extra share an answer."""

from __future__ import annotations

import numpy as np
import pytest

from planner.search import stages
from planner.search.stages import least_bottleneck, partition_brute_force


@pytest.fixture(autouse=True)
def _fresh_memo(monkeypatch):
    monkeypatch.setattr(stages, "_LEAST_BOTTLENECKS", {})


def test_answers_read_back_equal_the_dp_and_the_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(40):
        layers = int(rng.integers(2, 9))
        count = int(rng.integers(1, layers + 1))
        shape = (layers,) if rng.random() < 0.5 else (count, layers)
        cost = rng.integers(0, 50, size=shape).astype(np.float64)
        first, last = float(rng.integers(0, 20)), float(rng.integers(0, 20))
        fresh = stages._least_bottleneck(cost.copy(), count, first_cost=first, last_cost=last)
        answers = [least_bottleneck(cost, count, first_cost=first, last_cost=last) for _ in range(2)]
        assert answers == [fresh, fresh]
        if cost.ndim == 1:  # the brute force takes one cost per layer (integer costs: every sum is exact)
            assert partition_brute_force(cost, count, first_cost=first, last_cost=last).bottleneck == fresh


def test_a_changed_cost_stage_count_or_extra_is_asked_afresh():
    cost = np.array([4.0, 1.0, 1.0, 4.0])
    assert least_bottleneck(cost, 2) == 5.0  # [4, 1] [1, 4]
    cost[0] = 10.0  # the same array, another content
    assert least_bottleneck(cost, 2) == 10.0  # [10] [1, 1, 4] (by hand)
    assert least_bottleneck(cost, 3) == 10.0  # [10] [1, 1] [4]
    assert least_bottleneck(cost, 3, first_cost=1.0) == 11.0
    assert least_bottleneck(cost, 3, last_cost=7.0) == 11.0  # [10] [1, 1] [4 + 7]
    assert least_bottleneck(cost.reshape(1, 4), 1) == 16.0  # one stage: the sum, the (1, L) shape keyed apart
    assert len(stages._LEAST_BOTTLENECKS) == 6


def test_the_oldest_answer_goes_first_past_the_bound(monkeypatch):
    monkeypatch.setattr(stages, "_LEAST_BOTTLENECK_ENTRIES", 3)
    for value in range(5):
        least_bottleneck([float(value), 1.0, 2.0], 2)
    assert len(stages._LEAST_BOTTLENECKS) == 3
    assert sorted(stages._LEAST_BOTTLENECKS.values()) == [3.0, 3.0, 4.0]  # v = 2, 3, 4: min(max(v, 3), max(v + 1, 2))
