"""``planner.search.stages.least_bottleneck`` where the stages are as many as the layers (issue 22, tenth round):
one cut, a layer per stage, so its min-max DP is a running maximum, taken at once instead of one Python step per
stage. Checked by hand (integer-valued costs: every prefix difference is the layer's cost exactly) on one cost per
layer and on a cost per stage and layer, and against the brute force over cuts."""

from __future__ import annotations

import numpy as np

from planner.search.stages import least_bottleneck, partition_brute_force


def test_as_many_stages_as_layers_is_the_largest_stage():
    rng = np.random.default_rng(7)
    for layers in (3, 4, 9, 128):
        cost = rng.integers(1, 1000, size=layers).astype(np.float64)
        by_hand = max(cost[0] + 5.0, *cost[1:-1], cost[-1] + 11.0)
        assert least_bottleneck(cost, layers, first_cost=5.0, last_cost=11.0) == by_hand
        if layers <= 9:
            assert partition_brute_force(cost, layers, first_cost=5.0, last_cost=11.0).bottleneck == by_hand
        per_stage = rng.integers(1, 1000, size=(layers, layers)).astype(np.float64)  # stage s runs layer s
        diagonal = per_stage[np.arange(layers), np.arange(layers)]
        by_hand = max(diagonal[0] + 5.0, *diagonal[1:-1], diagonal[-1] + 11.0)
        assert least_bottleneck(per_stage, layers, first_cost=5.0, last_cost=11.0) == by_hand
