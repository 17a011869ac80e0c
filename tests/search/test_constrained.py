"""The pick under a memory limit and "nothing fits", against exhaustive enumeration.

Random small problems (tests/search/random_tables.py); limits at every memory of the exact frontier
(where they bind), between them and below the least memory. The oracle is
:func:`planner.search.exhaustive.exhaustive_frontier` (enumeration, no shared code with the
elimination).
"""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.errors import InputError
from planner.core.tables import CostTables, EdgeCost
from planner.search.constrained import fastest_within_exact, min_memory
from planner.search.exhaustive import exhaustive_frontier, exhaustive_min
from planner.search.frontier import DEFAULT_EPSILON, pareto_frontier
from planner.search.pareto import fastest_within
from planner.search.problem import evaluate_many
from planner.search.synthetic import simple_space
from tests.search.random_tables import random_tables


def _binding_limits(oracle_memories: list[float]) -> list[float]:
    """Every frontier memory (binds exactly), just below each (the next point must be taken), and
    below the least (nothing fits)."""
    limits = {m for m in oracle_memories} | {np.nextafter(m, 0.0) for m in oracle_memories}
    limits.add(min(oracle_memories) / 2)
    return sorted(x for x in limits if x > 0)


def _oracle_pick(oracle, limit):
    fitting = [p for p in oracle if p.memory_bytes <= limit]
    return min((p.time_s for p in fitting), default=None)


@pytest.mark.parametrize(
    "epsilon, max_points", [(DEFAULT_EPSILON, 256), (DEFAULT_EPSILON, 2)], ids=["default", "capped"]
)
def test_pick_and_nothing_fits_match_enumeration(epsilon: float, max_points: int) -> None:
    checked = nothing = from_frontier_wrong = 0
    proofs: set[str] = set()
    for seed in range(36):
        tables = random_tables(seed, infinite=0.2 if seed % 4 == 0 else 0.0, max_combinations=2000)
        oracle = exhaustive_frontier(tables).points
        if not oracle:
            assert min_memory(tables).choice is None
            continue
        front = pareto_frontier(tables, epsilon=epsilon, max_points=max_points)
        for limit in _binding_limits([p.memory_bytes for p in oracle]):
            want = _oracle_pick(oracle, limit)
            pick = fastest_within_exact(tables, limit, frontier=front)
            assert pick.proven
            proofs.add(pick.proof)
            checked += 1
            if want is None:
                nothing += 1
                assert pick.point is None and pick.proof == "no strategy fits"
                assert pick.min_memory_bytes == oracle[-1].memory_bytes > limit
                continue
            assert pick.point is not None
            assert pick.point.time_s == want and pick.point.memory_bytes <= limit
            t, m = evaluate_many(tables, pick.point.choice[None, :])
            assert (float(t[0]), float(m[0])) == (pick.point.time_s, pick.point.memory_bytes)
            naive = fastest_within(front, limit)
            if not naive.feasible or naive.point.time_s != want:
                from_frontier_wrong += 1
    assert checked > 200 and nothing >= 25
    if max_points < 256:
        # the test bites: the bucketed frontier alone picks wrong (or says nothing fits) here
        assert from_frontier_wrong > 0 and "pruned exact elimination" in proofs


def test_min_memory_is_the_exhaustive_minimum_over_finite_choices() -> None:
    for seed in range(60):
        tables = random_tables(seed, infinite=0.3, max_combinations=3000)
        oracle = exhaustive_frontier(tables).points
        least = min_memory(tables)
        if not oracle:
            assert least.memory_bytes == np.inf and least.choice is None
            continue
        assert least.memory_bytes == oracle[-1].memory_bytes
        assert np.isfinite(least.time_s)


def test_min_memory_needs_the_dp_when_minimisers_clash() -> None:
    """Each op's least memory (config 0) cannot be combined: the edge between them is infinite, so
    the answer is min(4 + 1, 1 + 5, 4 + 5) = 5 KiB, not 1 + 1 (by hand)."""
    kib = 1024.0
    tables = CostTables(
        configs=(simple_space(2), simple_space(2)),
        node_time_s=(np.array([1.0, 1.0]), np.array([1.0, 1.0])),
        node_memory_bytes=(np.array([1.0, 4.0]) * kib, np.array([1.0, 5.0]) * kib),
        edges=(EdgeCost(u=0, v=1, time_s=np.array([[np.inf, 0.0], [0.0, 0.0]])),),
    )
    least = min_memory(tables)
    assert least.memory_bytes == 5.0 * kib and least.choice.tolist() == [1, 0]
    assert exhaustive_min(tables, objective="memory").memory_bytes == 2.0 * kib  # infinite time: not a strategy
    pick = fastest_within_exact(tables, 4.5 * kib)
    assert pick.point is None and pick.proof == "no strategy fits"


def test_a_hidden_optimum_is_found() -> None:
    """Two ops, by hand: the frontier is (2 s, 20 KiB), (3 s, 11 KiB), (4 s, 10 KiB). Bucketed at
    epsilon 0.5 and capped to one level per factor, the listed points miss (3 s, 11 KiB); at a limit
    of 11 KiB the exact pick must be 3 s."""
    kib = 1024.0
    tables = CostTables(
        configs=(simple_space(3), simple_space(1)),
        node_time_s=(np.array([2.0, 3.0, 4.0]), np.array([0.0])),
        node_memory_bytes=(np.array([20.0, 11.0, 10.0]) * kib, np.array([0.0])),
        edges=(),
    )
    front = pareto_frontier(tables, epsilon=0.5, max_points=1)
    naive = fastest_within(front, 11 * kib)
    assert not naive.feasible or naive.point.time_s != 3.0
    pick = fastest_within_exact(tables, 11 * kib, frontier=front)
    assert pick.proven and pick.point is not None and pick.point.time_s == 3.0
    assert pick.point.memory_bytes == 11 * kib


def test_the_exact_frontier_proves_by_its_bound() -> None:
    tables = random_tables(3, max_combinations=3000)
    front = pareto_frontier(tables, epsilon=0.0)
    limit = front.points[len(front.points) // 2].memory_bytes
    pick = fastest_within_exact(tables, limit, frontier=front)
    assert pick.proof == "frontier bound" and pick.point is not None
    assert pick.point.time_s == _oracle_pick(exhaustive_frontier(tables).points, limit)


def test_a_spent_budget_is_not_claimed_exact() -> None:
    tables = random_tables(5, max_combinations=3000)
    oracle = exhaustive_frontier(tables).points
    front = pareto_frontier(tables, epsilon=0.5, max_points=1)
    limit = oracle[len(oracle) // 2].memory_bytes
    pick = fastest_within_exact(tables, limit, frontier=front, max_work=1.0)
    if pick.proof != "frontier bound":
        assert not pick.proven and pick.proof == "not proven"
        assert pick.point is not None and pick.point.memory_bytes <= limit


def test_limits_prune_without_losing_points_within_them() -> None:
    """pareto_frontier(memory_limit_bytes=, time_limit_s=) at epsilon 0: every oracle point within
    both limits is listed, bit for bit."""
    for seed in range(40):
        tables = random_tables(seed, max_combinations=3000)
        oracle = exhaustive_frontier(tables).points
        if len(oracle) < 3:
            continue
        memory_limit = oracle[len(oracle) // 3].memory_bytes
        time_limit = oracle[-1 - len(oracle) // 3].time_s
        inside = {(p.time_s, p.memory_bytes) for p in oracle if p.memory_bytes <= memory_limit and p.time_s <= time_limit}
        for weight in (0.0, 1e-4, 1.0):  # any weight keeps them (the weighted bound, Lagrangian)
            pruned = pareto_frontier(
                tables, epsilon=0.0, memory_limit_bytes=memory_limit, time_limit_s=time_limit,
                limit_weight_s_per_byte=weight,
            )  # fmt: skip
            listed = {(p.time_s, p.memory_bytes) for p in pruned.points}
            assert inside <= listed


def test_a_bad_limit_is_an_input_error() -> None:
    with pytest.raises(InputError, match="positive"):
        fastest_within_exact(random_tables(1), 0.0)


# --- through plan(): random small MLPs priced by the real cost models, default epsilon --------------


def _random_mlps(count: int, seed: int):
    from tests.objectives.graphs import mlp_chain

    rng = np.random.default_rng(seed)
    for _ in range(count):
        widths = tuple(int(x) for x in rng.choice([8, 16, 32, 64, 128], size=int(rng.integers(3, 5))))
        devices = int(rng.choice([4, 8]))
        yield mlp_chain(batch=int(rng.choice([8, 16, 32])), widths=widths), devices


def test_plan_picks_the_exact_optimum_within_binding_limits() -> None:
    """plan() at the default epsilon, limits at every memory of the exhaustive frontier: the row
    picked is the oracle's fastest within the limit; below the least memory nothing fits and the
    message names the exact least memory. Two nodes, so placements across nodes are in play."""
    import dataclasses

    from objectives.cluster import make_cluster
    from planner.core.units import format_bytes
    from planner.plan import PlanRequest, build_model, plan

    checked = naive_wrong = 0
    for graph, devices in _random_mlps(6, seed=1):
        for cost in ("roofline", "pase"):
            base = PlanRequest(
                cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=devices // 2), cost_model=cost
            )
            tables = build_model(graph, base).tables
            oracle = exhaustive_frontier(tables).points
            listed = pareto_frontier(tables)  # what plan() lists at the default epsilon
            for limit in sorted({p.memory_bytes for p in oracle} | {oracle[-1].memory_bytes / 2}):
                want = _oracle_pick(oracle, limit)
                result = plan(graph, dataclasses.replace(base, memory_limit_bytes=limit), with_targets=False)
                checked += 1
                assert result.pick_proven
                if want is None:
                    assert result.best is None and result.min_memory_bytes == oracle[-1].memory_bytes
                    assert format_bytes(oracle[-1].memory_bytes) in result.message
                    continue
                assert result.best is not None and result.best.strategy.time_s == want
                assert result.best.strategy.memory_bytes <= limit
                naive = fastest_within(listed, limit)
                naive_wrong += not naive.feasible or naive.point.time_s != want
                # the listed rows stay a Pareto set after the pick is added
                t = np.array([p.strategy.time_s for p in result.points])
                m = np.array([p.strategy.memory_bytes for p in result.points])
                assert not any(((t <= t[i]) & (m <= m[i]) & ((t < t[i]) | (m < m[i]))).any() for i in range(t.size))
    assert checked > 70
    assert naive_wrong > 0  # the bucketed frontier alone would have picked wrong here


def test_repricing_a_multi_node_strategy_with_its_inter_splits_gives_its_cost() -> None:
    """evaluate(graph, request, splits, inter_splits) prices every exhaustive-frontier strategy of
    a two-node cluster bit for bit; without the placement some splits are several configurations,
    which evaluate refuses (InputError) rather than pricing one of them."""
    from objectives.cluster import make_cluster
    from planner.plan import PlanRequest, build_model, evaluate

    differs_without = 0
    for graph, devices in _random_mlps(4, seed=1):
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=devices // 2))
        model = build_model(graph, request)
        for point in exhaustive_frontier(model.tables).points:
            strategy = model.strategy(point.choice)
            again = evaluate(graph, request, strategy.splits, strategy.inter_splits)
            assert (again.time_s, again.memory_bytes) == (strategy.time_s, strategy.memory_bytes)
            assert again.choice == strategy.choice
            try:
                loose = evaluate(graph, request, strategy.splits)
            except InputError as refused:
                assert "configurations" in str(refused) and "inter_splits" in str(refused)
                differs_without += 1
                continue
            assert (loose.time_s, loose.memory_bytes) == (strategy.time_s, strategy.memory_bytes)
    assert differs_without > 0


def test_plan_request_sets_the_point_cap_and_result_states_the_bound() -> None:
    from objectives.cluster import make_cluster
    from planner.plan import PlanRequest, plan
    from tests.objectives.graphs import mlp_chain

    graph = mlp_chain(batch=32, widths=(64, 128, 64, 32))
    cluster = make_cluster("a100-80gb", devices=8, devices_per_node=4)
    capped = plan(graph, PlanRequest(cluster=cluster, max_points=1), with_targets=False)
    exact = plan(graph, PlanRequest(cluster=cluster, epsilon=0.0, max_points=1 << 20), with_targets=False)
    assert exact.memory_bound_factor == 1.0 and exact.exact
    assert capped.memory_bound_factor is not None and capped.memory_bound_factor > 1.0
    assert len(capped.points) < len(exact.points)
    with pytest.raises(InputError, match="at least 1"):
        PlanRequest(cluster=cluster, max_points=0)


@pytest.mark.parametrize("method", ["frontier", "dp"])
def test_no_row_is_dominated_by_its_values_or_its_breakdown(method: str) -> None:
    """At epsilon 0, the rows' (time, memory) are a Pareto set, and each row's memory breakdown adds
    up (by kind) to its memory bit for bit, so no row looks dominated by another's breakdown either."""
    from objectives.cluster import make_cluster
    from planner.plan import PlanRequest, plan

    def dominated(t: np.ndarray, m: np.ndarray) -> int:
        return sum(bool(((t <= t[i]) & (m <= m[i]) & ((t < t[i]) | (m < m[i]))).any()) for i in range(t.size))

    for graph, devices in _random_mlps(6, seed=3):
        request = PlanRequest(
            cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=devices // 2), epsilon=0.0, method=method
        )
        result = plan(graph, request, with_targets=False)
        t = np.array([p.strategy.time_s for p in result.points])
        m = np.array([p.strategy.memory_bytes for p in result.points])
        assert [p.strategy.memory.total_bytes for p in result.points] == m.tolist()
        assert dominated(t, m) == 0


def test_diffusion_keeps_every_choice_cost_and_raises_the_floor() -> None:
    """reparameterized(): every choice costs the same (enumerated), all terms stay >= 0, and the ops'
    least times add up to a lower bound of the optimum no lower than before (exact on chains)."""
    from planner.search.constrained import reparameterized
    from planner.search.exhaustive import _all_choices

    raised = 0
    for seed in range(24):
        tables = random_tables(seed, max_combinations=2000)
        shifted = reparameterized(tables)
        weighted = reparameterized(tables, weight_s_per_byte=1e-3)
        for _, choices, time_s, memory in _all_choices(tables, 10_000):
            for other in (shifted, weighted):
                t, m = evaluate_many(other, choices)
                np.testing.assert_allclose(t, time_s, rtol=1e-12, atol=1e-9)
                assert np.array_equal(m, memory)
        assert all((e.time_s >= 0).all() for e in weighted.edges)
        assert all((a >= 0).all() for a in (*shifted.node_time_s, *(e.time_s for e in shifted.edges)))
        optimum = exhaustive_min(tables).time_s
        before = tables.constant_time_s + sum(float(a.min()) for a in tables.node_time_s)
        after = shifted.constant_time_s + sum(float(a.min()) for a in shifted.node_time_s)
        assert before <= after + 1e-12 and after <= optimum + 1e-9
        raised += after > before
        if seed % 6 == 0:  # a chain is a tree: the LP bound is the optimum
            assert after == pytest.approx(optimum, rel=1e-6)
    assert raised > 5


def test_plan_with_target_families_picks_the_exact_optimum_over_their_union() -> None:
    """With a target filter (families of per-op masks), the pick is the fastest strategy within the
    limit that some family allows: enumerated family by family."""
    import dataclasses

    from objectives.cluster import make_cluster
    from planner.plan import PlanRequest, build_model, plan
    from planner.search.restrict import restrict

    def two_families(graph, spaces, cluster, settings):
        small = [np.prod(s.factors, axis=1) <= 2 for s in spaces]  # at most 2 devices per op
        even = [np.arange(s.size) % 2 == 0 for s in spaces]  # an arbitrary second family
        return [small, even]

    checked = 0
    for graph, devices in _random_mlps(3, seed=5):
        base = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=devices // 2))
        tables = build_model(graph, base).tables
        union = []
        for masks in two_families(graph, tables.configs, base.cluster, base.settings):
            sub = restrict(tables, masks)
            union += [(p.time_s, p.memory_bytes) for p in exhaustive_frontier(sub.tables).points]
        for limit in sorted({m for _, m in union})[::2] + [min(m for _, m in union) / 2]:
            want = min((t for t, m in union if m <= limit), default=None)
            result = plan(
                graph, dataclasses.replace(base, memory_limit_bytes=limit), target_filter=two_families, with_targets=False
            )
            checked += 1
            assert result.pick_proven
            if want is None:
                assert result.best is None
            else:
                assert result.best is not None and result.best.strategy.time_s == want
    assert checked > 10


def test_relaxed_points_bound_every_choice_within_the_limits_from_below() -> None:
    """relaxed_points(): buckets keep their least memory, so every enumerated choice within the
    limits has a returned pair no slower and needing no more memory, at any epsilon and cap."""
    from planner.search.frontier import relaxed_points

    for seed in range(30):
        tables = random_tables(seed, max_combinations=2000)
        oracle = exhaustive_frontier(tables).points
        if len(oracle) < 3:
            continue
        memory_limit = oracle[len(oracle) // 3].memory_bytes
        time_limit = oracle[-1 - len(oracle) // 3].time_s
        for epsilon, cap in ((0.3, 2), (0.01, 256)):
            lower_s, lower_bytes, traced = relaxed_points(
                tables, epsilon=epsilon, memory_limit_bytes=memory_limit, time_limit_s=time_limit, max_points=cap
            )
            assert traced.shape == (lower_s.size, tables.num_ops)
            for p in oracle:
                if p.memory_bytes <= memory_limit and p.time_s <= time_limit:
                    assert ((lower_s <= p.time_s) & (lower_bytes <= p.memory_bytes)).any()
