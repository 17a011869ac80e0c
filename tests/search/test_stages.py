"""Stage partition: the DP over layer boundaries against the brute-force oracle."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.core.errors import InputError
from planner.search.stages import (
    StepCosts,
    least_bottleneck,
    pareto_cuts,
    pareto_cuts_brute_force,
    partition_brute_force,
    partition_layers,
    partition_step_time,
    partition_step_time_brute_force,
    stage_costs,
    stage_memories,
    step_time_of_cut,
)


def _random_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(1, 10))
    stages = int(rng.integers(1, layers + 1))
    costs = rng.uniform(0.0, 5.0, layers)
    if seed % 3 == 0:
        costs = np.round(costs)  # ties
    case = dict(
        layer_cost=costs, stages=stages, first_cost=float(rng.uniform(0, 4)), last_cost=float(rng.uniform(0, 4))
    )
    if seed % 2:
        case.update(
            layer_memory=rng.uniform(0.0, 3.0, (stages, layers)),
            first_memory=float(rng.uniform(0, 2)),
            last_memory=float(rng.uniform(0, 2)),
            memory_limit=float(rng.uniform(2.0, 10.0)),
        )
    return case


class TestPartitionLayers:
    @pytest.mark.parametrize("seed", range(150))
    def test_equals_brute_force(self, seed):
        case = _random_case(seed)
        dp = partition_layers(**case)
        oracle = partition_brute_force(**case)
        assert dp.feasible == oracle.feasible
        assert dp.bottleneck == pytest.approx(oracle.bottleneck, abs=1e-12)

    @pytest.mark.parametrize("seed", range(40))
    def test_partition_is_valid(self, seed):
        case = _random_case(seed)
        p = partition_layers(**case)
        layers, stages = len(case["layer_cost"]), case["stages"]
        assert p.bounds[0] == 0 and p.bounds[-1] == layers and len(p.bounds) == stages + 1
        assert all(a < b for a, b in zip(p.bounds, p.bounds[1:]))  # at least one layer each
        assert p.stage_cost.sum() == pytest.approx(
            case["layer_cost"].sum() + case["first_cost"] + case["last_cost"]
        )
        if case.get("memory_limit") is not None and p.feasible:
            assert (p.stage_memory <= case["memory_limit"] + 1e-12).all()

    def test_balances_a_heavy_head(self):
        # 24 equal layers, an LM head worth 2 layers on the last stage: 4 stages of 6 would give a
        # bottleneck of 8; the balanced cut gives the last stage 5 layers: bottleneck 7.
        p = partition_layers(np.ones(24), 4, last_cost=2.0)
        assert p.bottleneck == 7.0
        assert p.layers_per_stage[-1] == 5
        assert sum(p.layers_per_stage) == 24

    def test_memory_limit_moves_layers(self):
        # Stage 0 keeps 3 micro-batches of activations, stage 1 one (1F1B with 2 stages... a toy):
        # with a limit the first stage must take fewer layers than the time balance wants.
        memory = np.array([[3.0] * 6, [1.0] * 6])
        free = partition_layers(np.ones(6), 2, layer_memory=memory)
        limited = partition_layers(np.ones(6), 2, layer_memory=memory, memory_limit=6.0)
        assert free.layers_per_stage == (3, 3)
        assert limited.feasible and limited.layers_per_stage == (2, 4)
        assert limited.stage_memory.tolist() == [6.0, 4.0]

    def test_infeasible_limit_falls_back_to_the_time_balance(self):
        p = partition_layers(np.ones(4), 2, layer_memory=np.ones(4) * 10.0, memory_limit=1.0)
        assert not p.feasible
        assert p.layers_per_stage == (2, 2)

    def test_one_stage(self):
        p = partition_layers([1.0, 2.0], 1, first_cost=0.5, last_cost=0.25)
        assert p.bounds == (0, 2) and p.stage_cost.tolist() == [3.75]

    def test_more_stages_than_layers(self):
        with pytest.raises(InputError, match="smaller --pp"):
            partition_layers([1.0, 1.0], 3)


class TestStageSums:
    def test_costs_and_memories(self):
        assert stage_costs([1, 2, 3, 4], (0, 1, 4), first_cost=1.0, last_cost=0.5).tolist() == [2.0, 9.5]
        memory = np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
        assert stage_memories(memory, (0, 2, 3), first_memory=0.5).tolist() == [2.5, 2.0]


class TestLeastBottleneck:
    @pytest.mark.parametrize("seed", range(60))
    def test_equals_brute_force(self, seed):
        # per-stage layer costs (S, L): every cut enumerated
        import itertools

        rng = np.random.default_rng(seed)
        layers = int(rng.integers(1, 9))
        stages = int(rng.integers(1, layers + 1))
        cost = rng.uniform(0.0, 4.0, (stages, layers))
        if seed % 3 == 0:
            cost = np.round(cost)
        first, last = float(rng.uniform(0, 3)), float(rng.uniform(0, 3))
        best = np.inf
        for cuts in itertools.combinations(range(1, layers), stages - 1):
            bounds = (0, *cuts, layers)
            per = [cost[s, bounds[s] : bounds[s + 1]].sum() for s in range(stages)]
            per[0] += first
            per[-1] += last
            best = min(best, max(per))
        assert least_bottleneck(cost, stages, first_cost=first, last_cost=last) == pytest.approx(best, abs=1e-12)

    @pytest.mark.parametrize("seed", range(20))
    def test_one_dimensional_costs_equal_brute_force(self, seed):
        # the same cost on every stage (one span matrix for the stages between the ends)
        import itertools

        rng = np.random.default_rng(100 + seed)
        layers = int(rng.integers(1, 9))
        stages = int(rng.integers(1, layers + 1))
        cost = rng.uniform(0.0, 4.0, layers)
        first, last = float(rng.uniform(0, 3)), float(rng.uniform(0, 3))
        best = np.inf
        for cuts in itertools.combinations(range(1, layers), stages - 1):
            bounds = (0, *cuts, layers)
            per = [cost[bounds[s] : bounds[s + 1]].sum() for s in range(stages)]
            per[0] += first
            per[-1] += last
            best = min(best, max(per))
        assert least_bottleneck(cost, stages, first_cost=first, last_cost=last) == pytest.approx(best, abs=1e-12)

    @pytest.mark.parametrize("stages", [2, 3, 17, 39, 40])
    @pytest.mark.parametrize("per_stage", [False, True])
    def test_window_equals_the_whole_span_matrix_to_the_bit(self, stages, per_stage):
        # least_bottleneck reads only the (L - S + 1)-wide window of spans a cut can use: the same
        # sums, so the same float as the min-max over the whole (L+1, L+1) matrix (written out here)
        rng = np.random.default_rng(stages)
        layers = 40
        cost = rng.uniform(0.0, 1e9, (stages, layers) if per_stage else layers)
        first, last = float(rng.uniform(0, 1e9)), float(rng.uniform(0, 1e9))
        prefixes = np.concatenate((np.zeros((stages, 1)), np.cumsum(np.broadcast_to(cost, (stages, layers)), axis=1)), axis=1)
        best = prefixes[0] + first
        best[0] = np.inf
        for s in range(1, stages - 1):
            step = np.maximum(best[:, None], prefixes[s][None, :] - prefixes[s][:, None])
            step[np.tril(np.ones((layers + 1, layers + 1), dtype=bool))] = np.inf
            best = step.min(axis=0)
        whole = float(np.maximum(best[:layers], prefixes[-1, layers] - prefixes[-1, :layers] + last).min())
        assert least_bottleneck(cost, stages, first_cost=first, last_cost=last) == whole

    def test_one_dimensional_costs_match_the_partition(self):
        costs = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0]
        assert least_bottleneck(costs, 3, last_cost=1.0) == partition_layers(costs, 3, last_cost=1.0).bottleneck


# --------------------------------------------------------------------------------------------
# the cut of least step time


def _span(per_layer: np.ndarray) -> np.ndarray:
    prefix = np.concatenate(([0.0], np.cumsum(per_layer)))
    return np.triu(prefix[None, :] - prefix[:, None])


def _step_case(seed: int) -> tuple[StepCosts, int, float | None]:
    """Random segment costs: additive (layer sums, transfers alike at every boundary: the scalar DP)
    or not (random extras per segment, transfers by position, host floors: the Pareto DP)."""
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(1, 9))
    stages = int(rng.integers(1, min(layers, 4) + 1))
    schedule = str(rng.choice(["1f1b", "gpipe", "interleaved"]))
    chunks = int(rng.integers(2, 4)) if schedule == "interleaved" and seed % 4 else 1
    micro = int(rng.choice([1, 2, 3, 8])) * (stages if schedule == "interleaved" else 1)
    additive = seed % 2 == 0
    forward, backward = _span(rng.uniform(0, 2, layers)), _span(rng.uniform(0, 4, layers))
    step = _span(rng.uniform(0, 3, layers))
    forward[0, 1:] += rng.uniform(0, 1)  # the ops before the layers
    step[0, 1:] += rng.uniform(0, 5)
    step[:, layers] += rng.uniform(0, 5)  # the ops after them
    p2p = np.repeat(rng.uniform(0, 1, (max(stages - 1, 0), 1)), layers + 1, axis=1)
    floors: dict = {}
    if not additive:
        noise = np.triu(rng.uniform(0, 0.5, (layers + 1, layers + 1)), k=1)
        forward, backward, step = forward + noise, backward + 2 * noise, step + np.triu(rng.uniform(0, 2, noise.shape), 1)
        p2p = rng.uniform(0, 1, p2p.shape)
        host = rng.uniform(0, 2)
        n = np.arange(layers + 1, dtype=float)
        floors = dict(floor_forward=n * host + rng.uniform(0, 1), floor_backward=2 * n * host)
    if seed % 3 == 0:
        p2p = np.round(p2p)  # ties
    memory, limit = None, None
    if seed % 5 in (1, 2):
        per_layer = rng.uniform(0, 3, layers)
        memory = np.stack([_span(per_layer * (1 + stages - s)) for s in range(stages)])
        limit = float(rng.uniform(2.0, 12.0))
    # the optimizer step's part of the step (after every stage's synchronisation), on most seeds
    update = step * np.triu(rng.uniform(0, 1, step.shape), 1) if seed % 4 in (1, 2, 3) else None
    costs = StepCosts(forward=forward, backward=backward, step=step, p2p=p2p, memory=memory, schedule=schedule,
                      micro_batches=micro, chunks=chunks, update=update, **floors)
    return costs, stages, limit


class TestPartitionStepTime:
    @pytest.mark.parametrize("seed", range(300))
    def test_equals_brute_force(self, seed):
        costs, stages, limit = _step_case(seed)
        exact = partition_step_time(costs, stages, memory_limit=limit)
        oracle = partition_step_time_brute_force(costs, stages, memory_limit=limit)
        assert exact.feasible == oracle.feasible
        assert exact.step_s == pytest.approx(oracle.step_s, rel=1e-12, abs=1e-12)
        assert step_time_of_cut(costs, exact.bounds) == exact.step_s
        assert len(exact.bounds) == stages + 1 and all(a < b for a, b in zip(exact.bounds, exact.bounds[1:]))
        if exact.feasible and limit is not None:
            assert all(costs.memory[s, exact.bounds[s], exact.bounds[s + 1]] <= limit for s in range(stages))

    @pytest.mark.parametrize("seed", range(40))
    def test_never_slower_than_the_balanced_cut(self, seed):
        costs, stages, _ = _step_case(2 * seed)  # additive: the balanced cut of the layer times
        layer_time = np.diff(costs.forward[0] + costs.backward[0])
        balanced = partition_layers(layer_time, stages)
        assert partition_step_time(costs, stages).step_s <= step_time_of_cut(costs, balanced.bounds) + 1e-12

    def test_the_update_waits_for_every_stage(self):
        # 2 layers on 2 stages, one micro-batch: f = 1, b = 2 a layer, so the pipeline takes 6 s and stage 1
        # finishes its backward 2 s before stage 0. Its 3 s optimizer step hid under that drain (7 s);
        # clipped by the global gradient norm it starts after stage 0's backward too: 6 + 3 = 9 s
        fw, bw = _span(np.array([1.0, 1.0])), _span(np.array([2.0, 2.0]))
        step = np.zeros((3, 3))
        step[1, 2] = 3.0
        own = StepCosts(forward=fw, backward=bw, step=step, p2p=np.zeros((1, 3)))
        waits = StepCosts(forward=fw, backward=bw, step=step, update=step, p2p=np.zeros((1, 3)))
        assert step_time_of_cut(own, (0, 1, 2)) == 7.0
        assert step_time_of_cut(waits, (0, 1, 2)) == 9.0
        assert partition_step_time(waits, 2).step_s == 9.0

    def test_one_micro_batch_moves_work_off_the_first_stage(self):
        per_layer = np.array([1.0, 1.0, 2.0])
        costs = StepCosts(forward=_span(per_layer), backward=_span(per_layer), step=_span(np.full(3, 5.0)),
                          p2p=np.zeros((1, 4)))
        assert partition_layers(2 * per_layer, 2).bounds == (0, 2, 3)
        assert partition_step_time(costs, 2).bounds == (0, 1, 3)


# --------------------------------------------------------------------------------------------
# the trade-off of cuts: least step time under each cap of the stages' memory


def _pareto_case(seed: int) -> tuple[StepCosts, int]:
    """:func:`_step_case`'s costs with a stage memory always given: per layer and stage (1F1B's
    in-flight count), plus random extras per segment for odd seeds (not a sum over layers), rounded
    for every third seed (ties between cuts)."""
    costs, stages, _ = _step_case(seed)
    rng = np.random.default_rng(10_000 + seed)
    layers = costs.forward.shape[0] - 1
    per_layer = rng.uniform(0, 3, layers)
    memory = np.stack([_span(per_layer * (1 + stages - s)) for s in range(stages)])
    if seed % 2:
        memory = memory + np.triu(rng.uniform(0, 2, memory.shape), k=1)
    if seed % 3 == 0:
        memory = np.round(memory)
    return dataclasses.replace(costs, memory=memory), stages


def _dominance_filter(cuts) -> list[tuple[float, float]]:
    """``(step s, bytes)`` of the cuts no other cut dominates (equal points once), fastest first."""
    points = sorted({(c.step_s, c.memory_bytes) for c in cuts})
    kept: list[tuple[float, float]] = []
    for t, m in points:
        if not kept or m < kept[-1][1]:
            kept.append((t, m))
    return kept


class TestParetoCuts:
    def test_the_hand_example(self):
        """2, 2, 4 s layers (forward and backward alike), 4 micro-batches, 1F1B: sum t + 3 max t;
        stage 0 holds 2 B a layer, stage 1 one. (0, 2, 3): 8 + 3 x 4 = 20 s, stage 0 4 B;
        (0, 1, 3): 8 + 3 x 6 = 26 s, 2 B on each stage."""
        ones = _span(np.ones(3))
        costs = StepCosts(forward=_span(np.array([1.0, 1.0, 2.0])), backward=_span(np.array([1.0, 1.0, 2.0])),
                          step=np.zeros((4, 4)), p2p=np.zeros((1, 4)), memory=np.stack([2 * ones, ones]),
                          micro_batches=4)
        found = [(c.bounds, c.step_s, c.memory_bytes) for c in pareto_cuts(costs, 2)]
        assert found == [((0, 2, 3), 20.0, 4.0), ((0, 1, 3), 26.0, 2.0)]
        # a limit below the fastest cut's 4 B: the leaner cut comes first and is the only one
        assert [c.bounds for c in pareto_cuts(costs, 2, memory_limit=3.0)] == [(0, 1, 3)]

    @pytest.mark.parametrize("seed", range(200))
    def test_covers_the_brute_force_pareto_set(self, seed):
        """Every Pareto-optimal cut at or below the first cut's memory is found (equal in both), each
        step leaner and no faster than the one before; without a limit the first is the fastest."""
        costs, stages = _pareto_case(seed)
        found = pareto_cuts(costs, stages)
        oracle = pareto_cuts_brute_force(costs, stages)
        assert found[0].step_s == pytest.approx(oracle[0].step_s, rel=1e-12, abs=1e-12)
        for before, after in zip(found, found[1:]):
            assert after.memory_bytes < before.memory_bytes and after.step_s >= before.step_s - 1e-12
        for cut in found:
            assert cut.step_s == step_time_of_cut(costs, cut.bounds)
            assert cut.memory_bytes == max(costs.memory[s, cut.bounds[s], cut.bounds[s + 1]] for s in range(stages))
        ours = _dominance_filter(found)
        expected = [(c.step_s, c.memory_bytes) for c in oracle if c.memory_bytes <= found[0].memory_bytes]
        assert len(ours) == len(expected)
        for (t, m), (t_o, m_o) in zip(ours, expected):
            assert t == pytest.approx(t_o, rel=1e-12, abs=1e-12) and m == m_o

    @pytest.mark.parametrize("seed", range(60))
    def test_under_a_limit_starts_at_the_fastest_cut_that_fits(self, seed):
        costs, stages = _pareto_case(seed)
        oracle = pareto_cuts_brute_force(costs, stages)
        limit = float(np.median([c.memory_bytes for c in oracle]))
        found = pareto_cuts(costs, stages, memory_limit=limit)
        assert found[0].bounds == partition_step_time(costs, stages, memory_limit=limit).bounds
        fitting = [(c.step_s, c.memory_bytes) for c in oracle if c.memory_bytes <= limit]
        assert [m for _, m in _dominance_filter(found)] == [m for _, m in fitting]

    @pytest.mark.parametrize("seed", range(60))
    def test_a_ceiling_skips_only_dominated_cuts(self, seed):
        """With points found elsewhere (some of the oracle's, made a little better or worse), every
        Pareto cut at or below the first's memory is weakly dominated by a cut returned or by one of
        the points, and no more DPs run than without them."""
        costs, stages = _pareto_case(seed)
        oracle = pareto_cuts_brute_force(costs, stages)
        rng = np.random.default_rng(seed)
        points = [(c.step_s * rng.uniform(0.98, 1.02), c.memory_bytes * rng.uniform(0.98, 1.02))
                  for c in oracle if rng.random() < 0.5]

        def ceiling(time_s: float) -> float:
            return min((m for t, m in points if t <= time_s), default=np.inf)

        found = pareto_cuts(costs, stages, ceiling=ceiling)
        assert len(found) <= len(pareto_cuts(costs, stages))
        covering = [(c.step_s, c.memory_bytes) for c in found] + points
        for cut in oracle:
            if cut.memory_bytes <= found[0].memory_bytes:
                assert any(t <= cut.step_s + 1e-12 and m <= cut.memory_bytes for t, m in covering), cut
