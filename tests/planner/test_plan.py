"""plan(): wiring of import, cost and search; baselines; memory limit; explicit evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from planner import families
from planner.core.errors import InputError
from planner.plan import PlanRequest, evaluate, load_graph, op_configurations, plan

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.onnx"
GPT2 = ROOT / "examples" / "gpt2.onnx"


@pytest.fixture(scope="module")
def mlp_graph():
    return load_graph(MLP, {"batch": 64})


@pytest.fixture(scope="module")
def gpt2_graph():
    return load_graph(GPT2, {"batch": 8, "seq": 128})


def _request(devices: int, **kwargs) -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=devices), **kwargs)


class TestPlan:
    def test_frontier_is_sorted_pareto_and_contains_dp_optimum(self, gpt2_graph):
        frontier = plan(gpt2_graph, _request(8, method="frontier", epsilon=0.0))
        fastest = plan(gpt2_graph, _request(8, method="dp"))
        times = [p.strategy.time_s for p in frontier.points]
        memories = [p.strategy.memory_bytes for p in frontier.points]
        assert times == sorted(times)
        assert all(a > b for a, b in zip(memories, memories[1:]))  # strictly less memory as time grows
        assert times[0] == pytest.approx(fastest.points[0].strategy.time_s, rel=1e-9)

    def test_large_frontier_falls_back_to_the_weighted_hull(self, gpt2_graph, monkeypatch):
        import planner.plan as plan_module

        from planner.search.frontier import pareto_frontier

        monkeypatch.setattr(plan_module, "_FRONTIER_MAX_TABLE_CELLS", 0)  # as if the tables were huge
        hull = plan(gpt2_graph, _request(2, method="frontier"), with_targets=False)
        assert "weighted hull" in hull.order_name and not hull.exact
        exact = pareto_frontier(hull.cost.tables, epsilon=0.0, max_points=100_000)  # no cap: exact
        assert exact.exact
        # both ends are exact DP optima: the fastest plan and the least memory
        assert hull.points[0].strategy.time_s == pytest.approx(exact.points[0].time_s, rel=1e-12)
        assert hull.points[-1].strategy.memory_bytes == pytest.approx(exact.points[-1].memory_bytes, rel=1e-12)
        # no hull point beats the exact frontier: each is matched or dominated by an exact point
        for p in hull.points:
            assert any(
                q.time_s <= p.strategy.time_s * (1 + 1e-12) and q.memory_bytes <= p.strategy.memory_bytes * (1 + 1e-12)
                for q in exact.points
            )

    def test_frontier_over_its_work_budget_falls_back_to_the_hull(self, gpt2_graph, monkeypatch):
        import planner.plan as plan_module

        monkeypatch.setattr(plan_module, "_FRONTIER_MAX_WORK", 1.0)  # as if the memory levels exploded
        hull = plan(gpt2_graph, _request(2, method="frontier"), with_targets=False)
        assert "weighted hull" in hull.order_name and hull.points
        monkeypatch.setattr(plan_module, "_FRONTIER_MAX_WORK", 1e18)
        full = plan(gpt2_graph, _request(2, method="frontier"), with_targets=False)
        assert "weighted hull" not in full.order_name
        # the hull's ends are the exact DP optima, which the FT frontier reaches too
        assert hull.points[0].strategy.time_s == pytest.approx(full.points[0].strategy.time_s, rel=1e-12)

    def test_fastest_is_never_slower_than_baselines(self, gpt2_graph):
        result = plan(gpt2_graph, _request(16, method="dp"))
        for baseline in result.baselines:
            if baseline.point is not None:
                assert result.points[0].strategy.time_s <= baseline.point.strategy.time_s * (1 + 1e-12)

    def test_speedup_is_relative_to_data_parallel(self, gpt2_graph):
        result = plan(gpt2_graph, _request(8, method="dp"))
        dp = next(b for b in result.baselines if b.name == "data_parallel").point
        assert dp.speedup_vs_dp == pytest.approx(1.0)
        best = result.points[0]
        assert best.speedup_vs_dp == pytest.approx(dp.strategy.time_s / best.strategy.time_s)

    def test_data_parallel_baseline_splits_only_batch_dims(self, gpt2_graph):
        result = plan(gpt2_graph, _request(8, method="dp"))
        dp = next(b for b in result.baselines if b.name == "data_parallel").point.strategy
        for op, row, space in zip(gpt2_graph.ops, dp.choice, result.spaces):
            batch, other = families.batch_products(op, space)
            assert other[row] == 1

    def test_too_many_splits_keep_two_split_dims_per_op(self, gpt2_graph, monkeypatch):
        import planner.pricing as pricing_module
        from planner.core.configs import ConfigOptions, enumerate_configs

        full = pricing_module._edge_table_cells(gpt2_graph, ConfigOptions(devices=16, devices_per_node=8))
        two = pricing_module._edge_table_cells(gpt2_graph, ConfigOptions(devices=16, devices_per_node=8, max_split_dims=2))
        # by hand: each edge's table is its two ops' configuration counts multiplied
        sizes = [enumerate_configs(op, ConfigOptions(devices=16, devices_per_node=8)).size for op in gpt2_graph.ops]
        assert full == sum(sizes[e.producer] * sizes[e.consumer] for e in gpt2_graph.edges if e.producer != e.consumer)
        assert two < full
        monkeypatch.setattr(pricing_module, "_MAX_EDGE_TABLE_CELLS", (two + full) // 2)
        result = plan(gpt2_graph, _request(16, method="dp"), with_targets=False)
        assert any("at most 2 of its dims" in note for note in result.cost.notes)
        assert all(int((s.factors > 1).sum(axis=1).max()) <= 2 for s in result.spaces)
        # below the two-dim tables: one split dim per op (issue 15: degrade, never "too large")
        one = pricing_module._edge_table_cells(gpt2_graph, ConfigOptions(devices=16, devices_per_node=8, max_split_dims=1))
        assert one < two
        monkeypatch.setattr(pricing_module, "_MAX_EDGE_TABLE_CELLS", two - 1)
        result = plan(gpt2_graph, _request(16, method="dp"), with_targets=False)
        assert any("at most 1 of its dims" in note for note in result.cost.notes)
        assert all(int((s.factors > 1).sum(axis=1).max()) <= 1 for s in result.spaces)
        monkeypatch.setattr(pricing_module, "_MAX_EDGE_TABLE_CELLS", one - 1)
        with pytest.raises(InputError, match="redistribution table cells"):
            plan(gpt2_graph, _request(16, method="dp"), with_targets=False)

    def test_deterministic(self, mlp_graph):
        a = plan(mlp_graph, _request(4, method="frontier"))
        b = plan(mlp_graph, _request(4, method="frontier"))
        assert [p.strategy.choice for p in a.points] == [p.strategy.choice for p in b.points]

    def test_nothing_fits_names_smallest_memory(self, mlp_graph):
        result = plan(mlp_graph, _request(2, method="frontier", memory_limit_bytes=1e6))
        assert not result.feasible
        smallest = min(p.strategy.memory_bytes for p in result.points)
        assert "smallest needs" in result.message
        assert result.points and smallest > 1e6

    def test_memory_limit_picks_fastest_that_fits(self, gpt2_graph):
        unlimited = plan(gpt2_graph, _request(8, method="frontier"))
        memories = sorted(p.strategy.memory_bytes for p in unlimited.points)
        limit = (memories[0] + memories[-1]) / 2
        limited = plan(gpt2_graph, _request(8, method="frontier", memory_limit_bytes=limit))
        chosen = limited.best
        assert chosen.strategy.memory_bytes <= limit
        fitting = [p.strategy.time_s for p in limited.points if p.strategy.memory_bytes <= limit]
        assert chosen.strategy.time_s == min(fitting)


class TestEvaluate:
    def test_explicit_splits_match_search_point(self, mlp_graph):
        result = plan(mlp_graph, _request(4, method="dp"))
        best = result.points[0].strategy
        again = evaluate(mlp_graph, _request(4), best.splits)
        assert again.time_s == pytest.approx(best.time_s, rel=1e-12)
        assert again.memory_bytes == pytest.approx(best.memory_bytes, rel=1e-12)

    def test_unknown_op(self, mlp_graph):
        with pytest.raises(InputError, match="no op called"):
            evaluate(mlp_graph, _request(4), {"nope": {"m": 2}})

    def test_invalid_split(self, mlp_graph):
        name = mlp_graph.ops[0].name
        with pytest.raises(InputError, match="has no configuration"):
            evaluate(mlp_graph, _request(4), {name: {mlp_graph.ops[0].dims[0].name: 3}})


class TestOpConfigurations:
    def test_matches_hand_count(self, mlp_graph):
        # First MLP layer: [batch=64, 1024] x [1024, 4096] -> dims m=64, n=4096, k=1024 (all powers of two).
        # On 4 devices with products dividing 4, factor tuples over 3 dims with product in {1, 2, 4}:
        # 1 + 3 + (3 + 3) = 10 configurations.
        op = next(op for op in mlp_graph.ops if op.kind == "matmul")
        configs = op_configurations(mlp_graph, _request(4), op.name)
        assert len(configs) == 10
        assert any(not c.splits and not c.inter_splits and c.replicas == 1 for c in configs)  # the whole op, once
