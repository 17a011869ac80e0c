"""Whole-graph cost tables: evaluate() agrees with CostTables.evaluate, sharing, errors."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.pase import pase_config_options
from objectives.tables import build_cost_model, build_cost_tables
from planner.core.configs import ConfigOptions
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.core.tables import CostTables
from tests.objectives.graphs import conv_graph, gpt2_like, mlp_chain

SMALL = dict(layers=3, hidden=64, heads=4, vocab=256, positions=64, batch=8, seq=64)


def model_for(graph, devices=16, per_node=8, cost_model="roofline", measured=None, **settings):
    cluster = make_cluster("h100-sxm", devices=devices, devices_per_node=per_node)
    options = (pase_config_options(devices, cutoff=1) if cost_model == "pase"
               else ConfigOptions(devices=devices, devices_per_node=cluster.devices_per_node))
    return build_cost_model(graph, cluster=cluster, settings=TrainingSettings(**settings), config_options=options,
                            cost_model=cost_model, measured=measured)


def random_choices(tables: CostTables, count: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield [int(rng.integers(space.size)) for space in tables.configs]


@pytest.fixture(scope="module")
def small_gpt():
    return gpt2_like(**SMALL)


class TestEvaluateAgreesWithTables:
    @pytest.mark.parametrize("cost_model", ["roofline", "pase"])
    @pytest.mark.parametrize("settings", [{}, {"zero_stage": 3, "recompute": "selective"}, {"precision": "fp32"}])
    def test_random_choices(self, small_gpt, cost_model, settings):
        model = model_for(small_gpt, cost_model=cost_model, **settings)
        for choice in random_choices(model.tables, 5, seed=len(settings)):
            time_s, memory_bytes = model.tables.evaluate(choice)
            evaluation = model.evaluate(choice)
            assert evaluation.time_s == time_s and evaluation.memory_bytes == memory_bytes
            assert evaluation.time.total_s == pytest.approx(time_s, rel=1e-9)
            assert evaluation.memory.total_bytes == pytest.approx(memory_bytes, rel=1e-9)
            rows = sum(r.time_s for r in evaluation.ops) + sum(e.time_s for e in evaluation.edges)
            assert rows == pytest.approx(time_s, rel=1e-9)
            comm = evaluation.time.total_s - evaluation.time.compute_s
            assert sum(evaluation.comm_by_level_s.values()) == pytest.approx(comm, rel=1e-9, abs=1e-15)
            assert sum(evaluation.comm_by_kind_s.values()) == pytest.approx(comm, rel=1e-9, abs=1e-15)
            for row in evaluation.ops:
                assert row.time_s == pytest.approx(row.compute_s + sum(row.comm_s.values()) + row.grad_sync_s,
                                                   rel=1e-9)

    def test_strategy(self, small_gpt):
        model = model_for(small_gpt)
        choice = next(random_choices(model.tables, 1, seed=7))
        strategy = model.strategy(choice)
        assert strategy.time_s == model.tables.evaluate(choice)[0]
        evaluation = model.evaluate(choice)
        assert strategy.splits == {r.name: dict(r.splits) for r in evaluation.ops if r.splits}
        assert strategy.inter_splits == {r.name: dict(r.inter_splits) for r in evaluation.ops if r.inter_splits}
        assert strategy.memory is not None and strategy.time is not None

    def test_inter_node_edges_are_reported(self, small_gpt):
        model = model_for(small_gpt)
        worst = max(random_choices(model.tables, 20, seed=3), key=lambda c: model.evaluate(c).comm_by_level_s["inter"])
        evaluation = model.evaluate(worst)
        assert evaluation.comm_by_level_s["inter"] > 0
        assert all(0 <= e.inter_s <= e.time_s * (1 + 1e-12) for e in evaluation.edges)


class TestStructure:
    def test_repeated_layers_share_arrays(self, small_gpt):
        model = model_for(small_gpt)
        tables = model.tables
        assert tables.blocks == small_gpt.blocks
        first, second = small_gpt.blocks[0].instances[:2]
        for i, j in zip(first, second):
            assert tables.node_time_s[i] is tables.node_time_s[j]
            assert tables.node_memory_bytes[i] is tables.node_memory_bytes[j]
            assert tables.configs[i] is tables.configs[j]
        edge_of = {(e.u, e.v): e for e in tables.edges}
        shift = second[0] - first[0]
        shared = [edge_of[(e.u + shift, e.v + shift)].time_s is e.time_s
                  for e in tables.edges if e.u in first and e.v in first]
        assert shared and all(shared)
        assert model.distinct_ops < len(small_gpt.ops) / 2

    def test_one_edge_per_op_pair(self, small_gpt):
        tables = build_cost_tables(
            small_gpt, cluster=make_cluster("h100-sxm", devices=4), settings=TrainingSettings(),
            config_options=ConfigOptions(devices=4, devices_per_node=4),
        )
        pairs = [(e.u, e.v) for e in tables.edges]
        assert len(pairs) == len(set(pairs))
        assert all(e.u < e.v for e in tables.edges)
        for e in tables.edges:
            assert e.time_s.shape == (tables.configs[e.u].size, tables.configs[e.v].size)
            assert np.all(np.isfinite(e.time_s)) and np.all(e.time_s >= 0)

    def test_two_tensors_between_two_ops_are_summed(self, small_gpt):
        model = model_for(small_gpt, devices=4, per_node=4)
        u, v = small_gpt.op_index("h.0.attn.c_attn"), small_gpt.op_index("h.0.attn.qk")
        [detail] = [d for d in model.edge_details if (d.u, d.v) == (u, v)]
        assert set(detail.tensors) == {"h.0.attn.q", "h.0.attn.k"}

    def test_gpt2_at_64_devices(self):
        graph = gpt2_like(seq=1024, batch=8)
        model = model_for(graph, devices=64, per_node=8)
        assert model.distinct_ops <= 16
        assert max(space.size for space in model.tables.configs) > 1000
        for array in model.tables.node_time_s:
            assert np.all(np.isfinite(array)) and np.all(array > 0)


class TestModels:
    def test_measured_counts_fallbacks(self):
        graph = mlp_chain()
        every = sum(model_for(graph, devices=4, per_node=4).tables.configs[i].size for i in range(3))
        none = model_for(graph, devices=4, per_node=4, cost_model="measured", measured=lambda op, f: None)
        assert none.fallback_configs == every and none.measured_configs == 0
        timed = model_for(graph, devices=4, per_node=4, cost_model="measured", measured=lambda op, f: 1e-3)
        assert timed.fallback_configs == 0 and timed.measured_configs == every
        row = timed.tables.configs[0].index_of({"m": 4})
        assert timed.op_details[0].compute_s[row] == pytest.approx(1e-3 * (1 + 2.0))

    def test_pase_time_unit_and_memory(self):
        model = model_for(mlp_chain(), devices=4, cost_model="pase")
        assert model.time_unit == "flop-equivalents"
        # memory = per-device parameter bytes (bf16): fc0's w[32, 64] whole when replicated
        assert model.tables.node_memory_bytes[0][0] == 32 * 64 * 2

    def test_full_recompute_without_blocks_is_noted(self):
        model = model_for(conv_graph(), devices=4, per_node=4, recompute="full")
        assert any("recompute" in note for note in model.notes)


def _same_tables(a, b) -> bool:
    """Every array of two models' tables and op details equal, bit for bit."""
    ta, tb = a.tables, b.tables
    arrays = lambda m: [
        x for d in m.op_details
        for x in (d.compute_s, d.recompute_s, d.time_s, d.memory_bytes, *d.comm_s.values(), *d.grad_sync_s.values())
    ]
    return (
        all(np.array_equal(x.factors, y.factors) for x, y in zip(ta.configs, tb.configs))
        and all(np.array_equal(x, y) for x, y in zip(ta.node_time_s, tb.node_time_s))
        and all(np.array_equal(x, y) for x, y in zip(ta.node_memory_bytes, tb.node_memory_bytes))
        and [(e.u, e.v) for e in ta.edges] == [(e.u, e.v) for e in tb.edges]
        and all(np.array_equal(x.time_s, y.time_s) for x, y in zip(ta.edges, tb.edges))
        and all(np.array_equal(x, y) for x, y in zip(arrays(a), arrays(b)))
        and a.distinct_ops == b.distinct_ops
    )


class TestRepeatedBuilds:
    """Builds reuse per-graph work (sharing plans, a reused model's arrays): numbers never change."""

    @pytest.mark.parametrize("recompute", ["selective", "full"])
    def test_reuse_equals_a_fresh_build(self, small_gpt, recompute):
        base = model_for(small_gpt, devices=8)
        fresh = model_for(small_gpt, devices=8, recompute=recompute)
        cluster = make_cluster("h100-sxm", devices=8, devices_per_node=8)
        reused = build_cost_model(
            small_gpt, cluster=cluster, settings=TrainingSettings(recompute=recompute), reuse=base,
            config_options=ConfigOptions(devices=8, devices_per_node=8),
        )
        assert _same_tables(reused, fresh)
        # ops the variant does not recompute keep the base model's arrays (shared, not re-priced)
        kept = [not detail.recompute_s.any() for detail in fresh.op_details]
        assert 0 < sum(kept) < len(kept)
        for keep, detail, old in zip(kept, reused.op_details, base.op_details):
            assert (detail is old) == keep

    @pytest.mark.parametrize(("base_recompute", "recompute"), [
        ("selective", "full"), ("full", "none"),
        # op-level SAC keeps some ops that the donor does not recompute either: they run no second
        # forward (a reused "none" once added one: saved torchtitan rows priced 8.7% faster again)
        ("none", "op"), ("selective", "op"), ("mlp", "op"), ("full", "op"), ("op", "none"),
    ])
    def test_reuse_between_recompute_variants_equals_a_fresh_build(self, small_gpt, base_recompute, recompute):
        # the donor recomputes some ops itself: those are priced again, the rest derived or kept
        base = model_for(small_gpt, devices=8, recompute=base_recompute)
        fresh = model_for(small_gpt, devices=8, recompute=recompute)
        cluster = make_cluster("h100-sxm", devices=8, devices_per_node=8)
        reused = build_cost_model(
            small_gpt, cluster=cluster, settings=TrainingSettings(recompute=recompute), reuse=base,
            config_options=ConfigOptions(devices=8, devices_per_node=8),
        )
        assert _same_tables(reused, fresh)
        for detail, expected in zip(reused.op_details, fresh.op_details):
            assert np.array_equal(detail.recompute_s, expected.recompute_s)
            assert np.array_equal(detail.compute_s, expected.compute_s)
        if recompute == "op":  # SAC keeps some of the blocks' ops ("full" recomputes them all): no second forward
            in_blocks = [d.recompute_s.any() for d in model_for(small_gpt, devices=8, recompute="full").op_details]
            kept = [block and not d.recompute_s.any() for block, d in zip(in_blocks, reused.op_details)]
            assert 0 < sum(kept) < sum(in_blocks)

    def test_rebuilding_after_other_graphs_and_clusters_is_equal(self, small_gpt):
        first = model_for(small_gpt, devices=16, recompute="selective")
        model_for(mlp_chain(), devices=4, per_node=4)
        model_for(small_gpt, devices=4, per_node=4, precision="fp32")
        model_for(small_gpt, devices=16, cost_model="pase")
        assert _same_tables(model_for(small_gpt, devices=16, recompute="selective"), first)


class TestErrors:
    def test_measured_needs_a_callable(self):
        with pytest.raises(InputError, match="planner profile"):
            model_for(mlp_chain(), devices=4, cost_model="measured")

    def test_unknown_cost_model(self):
        with pytest.raises(InputError, match="roofline"):
            model_for(mlp_chain(), devices=4, cost_model="magic")

    def test_options_must_match_the_cluster(self):
        cluster = make_cluster("h100-sxm", devices=16)
        with pytest.raises(InputError, match="--devices"):
            build_cost_model(mlp_chain(), cluster=cluster, settings=TrainingSettings(),
                             config_options=ConfigOptions(devices=8, devices_per_node=8))
        with pytest.raises(InputError, match="--devices-per-node"):
            build_cost_model(mlp_chain(), cluster=cluster, settings=TrainingSettings(),
                             config_options=ConfigOptions(devices=16, devices_per_node=4))

    def test_bad_choices(self):
        model = model_for(mlp_chain(), devices=4, per_node=4)
        with pytest.raises(InputError, match="one configuration per op"):
            model.evaluate([0, 0])
        with pytest.raises(InputError, match="out of range"):
            model.evaluate([0, 0, 10_000])
