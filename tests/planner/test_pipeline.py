"""The 3-D pipeline search: layers, stage pricing against the plain cost model, the end-to-end search."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.memory import OTHER_FRACTION
from objectives.schedules import in_flight_micro_batches, pipeline_time_s
from planner.core.errors import InputError
from planner.estimate import megatron_grid
from planner.pipeline import (
    PipelineCostCache,
    PipelineOptions,
    evaluate_pipeline,
    graph_loader,
    layer_structure,
    pipeline_search,
    stage_cluster,
)
from planner.pipeline import restricted as stage_restricted
from planner.search.pareto import pareto_mask

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, 4 heads, vocab 1000, tied head
HIDDEN, SEQ = 64, 128


@pytest.fixture(scope="module")
def at_batch():
    return graph_loader(TINY, {"seq": SEQ})


@pytest.fixture(scope="module")
def cluster():
    return make_cluster("a100-80gb", devices=8)


@pytest.fixture(scope="module")
def cache(at_batch, cluster):
    return PipelineCostCache(at_batch, cluster=cluster)


def _random_choice(model, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([rng.integers(space.size) for space in model.tables.configs])


def _without_unsharded_units(monkeypatch) -> None:
    """Price ZeRO-3 without FSDP's unsharded units (``objectives.memory.fsdp_unsharded_peak``): the
    per-op tables' sharded states only."""
    import objectives.pipeline_price
    from objectives.memory import UnshardedPeak

    monkeypatch.setattr(objectives.pipeline_price, "fsdp_unsharded_peak",
                        lambda units, **_: UnshardedPeak(params_bytes=0.0, grads_bytes=0.0))


def _bounds(point) -> tuple[int, ...]:
    return (*(s.layers[0] for s in point.stages), point.stages[-1].layers[1])


class TestLayerStructure:
    def test_gpt2_tiny(self, at_batch):
        graph = at_batch(8)
        structure = layer_structure(graph)
        assert structure.num_layers == 2
        # embeddings before the layers, final norm and head after them
        assert structure.position[:2].tolist() == [-1, -1] and structure.position[-2:].tolist() == [2, 2]
        # only the residual stream (batch x seq x hidden, bf16) crosses the cut between the layers
        assert structure.cut_bytes[1] == 8 * SEQ * HIDDEN * 2

    def test_every_edge_runs_forward(self, at_batch):
        graph = at_batch(4)
        position = layer_structure(graph).position
        assert all(position[e.producer] <= position[e.consumer] for e in graph.edges)

    def test_stage_of_ops(self, at_batch):
        structure = layer_structure(at_batch(4))
        stage = structure.stage_of_ops((0, 1, 2))
        assert stage[:2].tolist() == [0, 0] and stage[-2:].tolist() == [1, 1]
        assert set(stage[structure.position == 1].tolist()) == {1}


class TestStageCluster:
    def test_shapes(self, cluster):
        big = make_cluster("a100-80gb", devices=32)
        assert (stage_cluster(big, 16).nodes, stage_cluster(big, 16).devices_per_node) == (2, 8)
        assert (stage_cluster(cluster, 2).nodes, stage_cluster(cluster, 2).devices_per_node) == (1, 2)

    def test_straddling_stage(self):
        with pytest.raises(InputError, match="straddles"):
            stage_cluster(make_cluster("a100-80gb", devices=24, devices_per_node=8), 3)


def _by_hand_split(sync: np.ndarray, zero: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(forward, backward, per step)`` of a step's synchronisation ``sync`` under gradient
    accumulation, by hand: a ring reduce-scatter and an all-gather of equal bytes cost the same, so
    ZeRO-1/2's RS + AG is half each and ZeRO-3's RS + 2 AG a third each (one AG before forward, the
    other AG and the RS in backward); ZeRO-2 reduce-scatters per micro-batch, gathers per step."""
    zero_array = np.zeros_like(sync)
    if zero <= 1:
        return zero_array, zero_array, sync
    if zero == 2:
        return zero_array, sync / 2.0, sync / 2.0
    return sync / 3.0, 2.0 * sync / 3.0, zero_array


class TestZeroPhases:
    @pytest.mark.parametrize("zero", [0, 1, 2, 3])
    @pytest.mark.parametrize("recomputed", [False, True])
    def test_one_rule_for_the_amounts(self, zero, recomputed):
        # every collective intra_op prices for a parameter's op is placed once (shares sum to 1);
        # a ZeRO-3 gather runs once before forward and its other count - 1 times in backward
        from objectives.intra_op import grad_sync_terms
        from objectives.parameters import ParameterView
        from objectives.pipeline_arrays import _phases
        from planner.core.configs import ConfigOptions, enumerate_configs
        from planner.core.settings import TrainingSettings
        from tests.exporters.graphs import gpt_graph

        graph = gpt_graph()
        op = next(o for o in graph.ops if o.op_type == "Gemm" or o.kind == "matmul")
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
        position = next(i for i, a in enumerate(op.inputs) if graph.tensors[a.tensor].role == "parameter")
        terms = grad_sync_terms(op, space, tensors=ParameterView(graph), settings=TrainingSettings(zero_stage=zero),
                                owned_inputs=(position,), recomputed=recomputed)  # fmt: skip
        assert {t.collective for t in terms} == {0: {"all_reduce"}, 1: {"reduce_scatter", "all_gather"},
                                                  2: {"reduce_scatter", "all_gather"},
                                                  3: {"reduce_scatter", "all_gather"}}[zero]  # fmt: skip
        for term in terms:
            forward, backward, step = _phases(term, zero)
            assert forward + backward + step == pytest.approx(1.0, abs=1e-15)
            if zero == 3 and term.collective == "all_gather":
                assert term.count == 2.0  # FSDP's rule: a recomputed forward reuses its unit's backward gather
                assert (forward * term.count, backward * term.count, step) == pytest.approx((1.0, term.count - 1.0, 0.0))
            if zero == 3:
                assert step == 0.0  # ZeRO-3 keeps no per-step traffic


class TestArrays:
    @pytest.mark.parametrize("zero", [0, 1, 2, 3])
    @pytest.mark.parametrize("recompute", ["none", "full"])
    def test_zero_stages_derived_from_zero_0_match_models_built_at_each(self, cache, zero, recompute):
        arrays = cache.arrays(8, 4, zero, recompute)  # derived from the ZeRO-0 model
        model = cache.model(8, 4, zero, recompute)  # built at this stage by objectives.tables
        for i, detail in enumerate(model.op_details):
            sync = sum(detail.grad_sync_s.values(), np.zeros(detail.time_s.shape))
            forward, backward, step = _by_hand_split(sync, zero)
            assert arrays.params_bytes[i] == pytest.approx(detail.memory.params_bytes, rel=1e-12)
            assert arrays.grads_bytes[i] == pytest.approx(detail.memory.grads_bytes, rel=1e-12)
            assert arrays.optimizer_bytes[i] == pytest.approx(detail.memory.optimizer_bytes, rel=1e-12)
            assert arrays.step_s[i] == pytest.approx(step, rel=1e-12, abs=1e-18)
            assert arrays.forward_s[i] + arrays.backward_s[i] == pytest.approx(
                detail.time_s - sync + forward + backward, rel=1e-12
            )

    @pytest.mark.parametrize("zero", [1, 2])
    def test_the_optimizer_step_shrinks_with_zero(self, at_batch, zero):
        # a device whose memory streams slowly, so the optimizer's pass outlasts its per-tensor host
        # floor, and links that cost nothing, so a step's per-step part is the optimizer's alone: from
        # ZeRO-1 on each of the 8 ranks updates an eighth of a data-parallel op's state, as the
        # tables built at that stage price it (objectives.compute.optimizer_step_time_s)
        import dataclasses

        from planner.core.settings import TrainingSettings

        base = make_cluster("a100-80gb", devices=8)
        free = dataclasses.replace(base.intra_link, bandwidth_bytes_per_s=1e30, latency_s=0.0)
        slow = dataclasses.replace(
            base, intra_link=free, inter_link=free,
            device=dataclasses.replace(base.device, memory_bandwidth_bytes_per_s=1e8, collective_overhead_s=0.0),
        )
        fused = PipelineCostCache(at_batch, cluster=slow, settings=TrainingSettings(engine="fused", attention="flash"))
        model0, model = fused.model(8, 8, 0, "none"), fused.model(8, 8, zero, "none")
        arrays = fused.arrays(8, 8, zero, "none")
        shrunk = 0
        for i, (detail0, detail) in enumerate(zip(model0.op_details, model.op_details)):
            if detail.optimizer_s is None or not np.any(detail0.optimizer_s > 0.0):
                continue
            np.testing.assert_allclose(arrays.step_s[i], detail.optimizer_s, rtol=1e-9, atol=1e-15)
            shrunk += bool(np.any(detail.optimizer_s < detail0.optimizer_s * 0.5))
        assert shrunk  # some op's step is at least halved (8 data-parallel ranks, streaming-bound)

    @pytest.mark.parametrize("zero", [0, 1, 2, 3])
    def test_under_an_execution_model_the_tables_rule_prices_zero(self, at_batch, zero):
        # one ZeRO rule: the synchronisation the pipeline derives at ZeRO z sums to what the tables
        # price in a model built at z (bucketed; hidden under backward as the tables hide it), except
        # ZeRO-3's, prefetched beside each phase's compute: there it is the tables' synchronisation
        # before overlap, a third before forward and two thirds in backward (_by_hand_split), each
        # exposed as max(0, comm - compute) + kappa min(comm, compute), kappa = 24 / 132
        from planner.core.settings import TrainingSettings

        import dataclasses

        fast = make_cluster("a100-80gb", devices=16, devices_per_node=8)
        # slow links, so that the tiny model's synchronisation outlasts its backward (partly exposed)
        cluster = dataclasses.replace(
            fast, intra_link=dataclasses.replace(fast.intra_link, bandwidth_bytes_per_s=1e8),
            inter_link=dataclasses.replace(fast.inter_link, bandwidth_bytes_per_s=1e7),
        )
        fused = PipelineCostCache(
            at_batch, cluster=cluster, settings=TrainingSettings(engine="fused", attention="flash")
        )
        arrays, model = fused.arrays(16, 16, zero, "none"), fused.model(16, 16, zero, "none")
        plain, model0 = fused.arrays(16, 16, 0, "none"), fused.model(16, 16, 0, "none")
        checked = 0
        for i, detail in enumerate(model.op_details):
            levels = detail.grad_sync_unhidden_s if zero == 3 else detail.grad_sync_s
            table = sum(levels.values(), np.zeros(detail.time_s.shape))
            optimizer = model0.op_details[i].optimizer_s
            # the step's optimizer pass is the model built at this stage's (ZeRO >= 1: each rank its share)
            sharded_optimizer = detail.optimizer_s
            per_step = arrays.step_s[i] - (sharded_optimizer if sharded_optimizer is not None else 0.0)
            ours = (arrays.forward_s[i] - plain.forward_s[i]) + (arrays.backward_s[i] - plain.backward_s[i]) + per_step
            if zero == 3:
                base = model0.op_details[i]
                kappa = 24 / 132
                forward_compute = base.forward_s
                backward_compute = base.compute_s - (optimizer if optimizer is not None else 0.0) - base.forward_s
                table = sum(
                    np.maximum(comm - compute, 0.0) + kappa * np.minimum(comm, compute)
                    for comm, compute in ((table / 3.0, forward_compute), (2.0 * table / 3.0, backward_compute))
                )
            np.testing.assert_allclose(ours, table, rtol=1e-9, atol=1e-15)
            checked += bool(np.any(table > 0))
        assert checked > 0

    def test_edges_priced_late_equal_edges_priced_with_the_build(self, at_batch, cluster):
        # bounds build models without edge tables; a search there prices them afterwards
        late, early = PipelineCostCache(at_batch, cluster=cluster), PipelineCostCache(at_batch, cluster=cluster)
        for recompute in ("none", "selective", "full"):
            for zero in (1, 3):
                assert late.arrays(4, 8, zero, recompute, edges=False).edges == ()
        assert not late.model(4, 8, 0, "full", edges=False).edges_priced
        for recompute in ("none", "selective", "full"):
            for zero in (1, 3):
                a, b = late.arrays(4, 8, zero, recompute), early.arrays(4, 8, zero, recompute)
                assert a.model.edges_priced and a.model is late.model(4, 8, 0, recompute)
                assert len(a.edges) == len(b.edges) > 0
                for name in ("edge_offsets", "edge_strides", "edge_u", "edge_v", "edge_flat"):
                    assert np.array_equal(getattr(a, name), getattr(b, name))
                for name in ("forward_s", "backward_s", "step_s", "params_bytes", "activations_bytes"):
                    assert all(np.array_equal(x, y) for x, y in zip(getattr(a, name), getattr(b, name)))
        choice = _random_choice(early.model(4, 8, 0, "full"), seed=3)
        assert late.model(4, 8, 0, "full").tables.evaluate(choice) == early.model(4, 8, 0, "full").tables.evaluate(choice)

    def test_edge_times_read_each_pair_table_in_place(self, at_batch, cluster):
        # edge_time_s groups the pairs by shared table and reads them there: every entry must be
        # the pair's own table at (its producer's pick, its consumer's pick), and edge_flat's
        arrays = PipelineCostCache(at_batch, cluster=cluster).arrays(4, 8, 1, "selective")
        assert len({id(e.time_s) for e in arrays.edges}) < len(arrays.edges)  # some pairs share a table
        rng = np.random.default_rng(7)
        for _ in range(3):
            picks = np.array([rng.integers(space.size) for space in arrays.spaces], dtype=np.int64)
            expected = np.array([e.time_s[picks[e.u], picks[e.v]] for e in arrays.edges])
            flat = arrays.edge_flat[arrays.edge_offsets + picks[arrays.edge_u] * arrays.edge_strides + picks[arrays.edge_v]]
            assert np.array_equal(arrays.edge_time_s(picks), expected)
            assert np.array_equal(flat, expected)

    def test_flat_rows_by_hand(self):
        # five ops: details 10, 10, 20, 10, 20; the fourth has other batch dims. Rows: the first op of
        # each (detail, batch dims) pair in graph order (ops 0, 2, 3), laid out one after the other
        from types import SimpleNamespace

        from objectives.pipeline_arrays import _flat_rows

        spaces = [SimpleNamespace(size=n) for n in (4, 4, 7, 4, 7)]
        rows, offsets = _flat_rows((10, 10, 20, 10, 20), np.array([0, 0, 0, 1, 0]), spaces)
        assert rows == [0, 2, 3]
        assert offsets.tolist() == [0, 0, 4, 11, 4]

    def test_a_model_without_edges_refuses_to_explain(self, at_batch, cluster):
        model = PipelineCostCache(at_batch, cluster=cluster).model(4, 8, 0, "none", edges=False)
        with pytest.raises(ValueError, match="with_edges"):
            model.evaluate(np.zeros(len(model.tables.configs), dtype=np.int64))

    @pytest.mark.parametrize("batch", [4, 2, 8])
    @pytest.mark.parametrize("weight", [0.0, 1e-9])
    @pytest.mark.parametrize("recompute", ["none", "selective"])
    def test_reused_elimination_plans_find_the_dp_optimum(self, cache, weight, recompute, batch):
        # the pipeline's DP reuses elimination plans between searches (and between batches whose
        # tables have other configuration counts); solve_min plans afresh
        from planner.core.tables import CostTables
        from planner.pipeline import _choose_intra_op
        from planner.search.elimination import solve_min
        from planner.search.restrict import restrict

        for zero in (1, 3):
            restricted = stage_restricted(cache, 8, batch, zero, recompute, inside_node=True, data_parallel=None)
            arrays = cache.arrays(8, batch, zero, recompute)
            masks = cache.masks(8, batch, inside_node=True, data_parallel=None)
            picks = _choose_intra_op(cache, restricted, slots=5.0, in_flight=2.0, memory_weight_s_per_byte=weight)
            memory = [
                (1 + OTHER_FRACTION) * (p + g + o + 2.0 * a)
                for p, g, o, a in zip(arrays.params_bytes, arrays.grads_bytes, arrays.optimizer_bytes,
                                      arrays.activations_bytes)
            ]
            tables = CostTables(
                configs=arrays.spaces,
                node_time_s=tuple(5.0 * (f + b) + s + weight * m
                                  for f, b, s, m in zip(arrays.forward_s, arrays.backward_s, arrays.step_s, memory)),
                node_memory_bytes=tuple(memory),
                edges=tuple(type(e)(u=e.u, v=e.v, time_s=5.0 * e.time_s) for e in arrays.edges),
            )
            sub = restrict(tables, masks)
            best = solve_min(sub.tables, use_blocks=False)
            assert tables.evaluate(picks)[0] == pytest.approx(best.time_s, rel=1e-9)


class TestEvaluatePipeline:
    @pytest.mark.parametrize("zero", [0, 1, 2, 3])
    @pytest.mark.parametrize("recompute", ["none", "selective", "full"])
    def test_one_stage_one_micro_batch_is_the_cost_model(self, cache, zero, recompute, monkeypatch):
        # pp=1, m=1: the pipeline is the plain training step, priced by objectives.tables directly
        # (a cost model built at this ZeRO stage, not re-priced); ZeRO-3's unsharded units, which the
        # per-op tables cannot hold, are switched off (tests/objectives/test_fsdp_memory.py prices them)
        _without_unsharded_units(monkeypatch)
        model = cache.model(8, 8, zero, recompute)
        choice = _random_choice(model, seed=zero)
        time_s, memory_bytes = model.tables.evaluate(choice)
        point = evaluate_pipeline(
            cache, pp=1, batch=8, zero_stage=zero, recompute=recompute, choice=choice, bounds=(0, 2), global_batch=8
        )
        assert point.time_s == pytest.approx(time_s, rel=1e-12)
        # the per-op tables hold no NCCL buffers (a whole-plan term: objectives.nccl_memory)
        assert point.memory_bytes - point.memory.nccl_bytes == pytest.approx(memory_bytes, rel=1e-12)

    @pytest.mark.parametrize("zero", [0, 1, 2, 3])
    def test_gradient_accumulation(self, cache, zero, monkeypatch):
        # 4 micro-batches of 2: per-micro-batch work 4 times, per-step synchronisation once; ZeRO-2
        # reduce-scatters every micro-batch, ZeRO-3 also gathers parameters every micro-batch.
        _without_unsharded_units(monkeypatch)
        model = cache.model(8, 2, zero, "none")
        choice = _random_choice(model, seed=1)
        evaluation = model.evaluate(choice)
        sync = evaluation.time.grad_sync_s
        per_step = {0: sync, 1: sync, 2: sync / 2, 3: 0.0}[zero]
        point = evaluate_pipeline(
            cache, pp=1, batch=2, zero_stage=zero, recompute="none", choice=choice, bounds=(0, 2), global_batch=8
        )
        assert point.micro_batches == 4
        assert point.time_s == pytest.approx(4 * (evaluation.time_s - per_step) + per_step, rel=1e-9)
        assert point.memory_bytes - point.memory.nccl_bytes == pytest.approx(evaluation.memory_bytes, rel=1e-12)

    def test_two_stages_from_the_cost_model_rows(self, cache, cluster):
        model = cache.model(4, 2, 3, "none")  # ZeRO-3: all synchronisation per micro-batch
        choice = _random_choice(model, seed=3)
        evaluation = model.evaluate(choice)
        structure = cache.structure(2)
        stage = structure.stage_of_ops((0, 1, 2))
        expected = np.zeros(2)
        for row in evaluation.ops:
            expected[stage[row.index]] += row.time_s
        for edge in evaluation.edges:
            if stage[edge.u] == stage[edge.v]:
                expected[stage[edge.u]] += edge.time_s
        # The LM head's copy of the tied embedding (the tables count the weight once, at the
        # embedding) is synchronised in the last stage too, per micro-batch at ZeRO-3: intra_op's terms
        from objectives.intra_op import grad_sync_terms, price_terms
        from objectives.parameters import ParameterView

        graph = model.graph
        head = max(i for i, op in enumerate(graph.ops) if any(a.tensor == "lm_head.weight" for a in op.inputs))
        position = next(p for p, a in enumerate(graph.ops[head].inputs) if a.tensor == "lm_head.weight")
        space = model.tables.configs[head]
        terms = grad_sync_terms(graph.ops[head], space, tensors=ParameterView(graph), settings=model.settings,
                                owned_inputs=[position])
        copy = sum(price_terms(terms, cluster=stage_cluster(cluster, 4), size=space.size).values(), np.zeros(space.size))
        assert stage[head] == 1 and copy[choice[head]] > 0.0
        expected[1] += copy[choice[head]]
        point = evaluate_pipeline(
            cache, pp=2, batch=2, zero_stage=3, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=8
        )
        got = np.array([s.forward_s + s.backward_s for s in point.stages])
        assert got == pytest.approx(expected, rel=1e-9)
        # 4 devices per stage in one node: the boundary sends 1/4 of the residual over NVLink
        cut = 2 * SEQ * HIDDEN * 2 / 4
        p2p = cut / cluster.intra_link.bandwidth_bytes_per_s + cluster.intra_link.latency_s
        assert point.time.p2p_s == pytest.approx(p2p)
        closed = pipeline_time_s(
            "1f1b", forward_s=[s.forward_s for s in point.stages], backward_s=[s.backward_s for s in point.stages],
            p2p_s=[p2p], micro_batches=4,
        )
        assert point.time.pipeline_s == pytest.approx(float(closed))
        assert point.time_s >= point.time.pipeline_s

    def test_in_flight_activations(self, cache):
        model = cache.model(4, 2, 0, "none")
        choice = _random_choice(model, seed=5)
        evaluation = model.evaluate(choice)
        stage = cache.structure(2).stage_of_ops((0, 1, 2))
        act = np.zeros(2)
        for row in evaluation.ops:
            act[stage[row.index]] += row.memory.activations_bytes
        point = evaluate_pipeline(
            cache, pp=2, batch=2, zero_stage=0, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=8
        )
        k = in_flight_micro_batches("1f1b", stages=2, micro_batches=4)
        assert k.tolist() == [2.0, 1.0]
        for s, plan in enumerate(point.stages):
            assert plan.in_flight == k[s]
            assert plan.memory.activations_bytes == pytest.approx(k[s] * act[s])
            states = plan.memory.params_bytes + plan.memory.grads_bytes + plan.memory.optimizer_bytes
            assert plan.memory.other_bytes == pytest.approx(OTHER_FRACTION * (states + k[s] * act[s]))
        gpipe = evaluate_pipeline(
            cache, pp=2, batch=2, zero_stage=0, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=8,
            schedule="gpipe",
        )
        assert [s.memory.activations_bytes for s in gpipe.stages] == pytest.approx((4 * act).tolist())

    def test_tied_embedding_is_held_by_both_end_stages(self, cache):
        model = cache.model(4, 2, 0, "none")
        choice = np.zeros(len(model.graph.ops), dtype=np.int64)  # every op replicated
        one = evaluate_pipeline(
            cache, pp=1, batch=2, zero_stage=0, recompute="none", choice=choice, bounds=(0, 2), global_batch=8
        )
        two = evaluate_pipeline(
            cache, pp=2, batch=2, zero_stage=0, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=8
        )
        table = model.graph.tensors["lm_head.weight"]
        copy = table.num_elements * 2  # bf16 parameters of the LM head's copy of the embedding table
        total_one = one.stages[0].memory.params_bytes
        total_two = sum(s.memory.params_bytes for s in two.stages)
        assert total_two == pytest.approx(total_one + copy)
        assert two.stages[1].grad_sync_s > 0.0  # the copies' gradients are all-reduced once per step

    @pytest.mark.parametrize("zero", [1, 2, 3])
    def test_tied_copy_synchronises_by_the_zero_rule(self, cache, zero):
        # the LM head's copy of the embedding is synchronised where its owner's would be: by hand,
        # its ZeRO-0 all-reduce cut as _by_hand_split cuts it (one node: RS and AG cost half each)
        zero0, arrays = cache.arrays(8, 8, 0, "none"), cache.arrays(8, 8, zero, "none")
        assert len(arrays.tied) == 1
        base, copy = zero0.tied[0], arrays.tied[0]
        assert np.any(base.step_s > 0)
        # ZeRO-3 moves three ring halves (RS + 2 AG) where the all-reduce moves two
        whole = base.step_s * (1.5 if zero == 3 else 1.0)
        for mine, by_hand in zip((copy.forward_s, copy.backward_s, copy.step_s), _by_hand_split(whole, zero)):
            np.testing.assert_allclose(mine, by_hand, rtol=1e-12, atol=1e-18)


@pytest.fixture(scope="module")
def result(at_batch, cluster):
    return pipeline_search(at_batch, cluster=cluster, options=PipelineOptions(global_batch=16))


class TestSearch:
    def test_pareto_and_sorted(self, result):
        times = np.array([p.time_s for p in result.points])
        memories = np.array([p.memory_bytes for p in result.points])
        assert len(result.points) >= 2
        assert (np.diff(times) >= 0).all() and (np.diff(memories) < 0).all()
        assert pareto_mask(times, memories).all()
        assert result.best is not None and result.best.fits
        assert result.best is result.points[result.chosen]

    def test_points_are_valid_and_reprice_identically(self, result, cluster):
        for point in result.points:
            assert cluster.devices % point.pp == 0 and point.devices_per_stage * point.pp == cluster.devices
            assert sum(point.layers_per_stage) == 2 and min(point.layers_per_stage) >= 1
            assert point.micro_batch_samples * point.micro_batches == 16
            assert all(0 <= c < s.size for c, s in zip(point.choice, point.spaces))
            again = evaluate_pipeline(
                result.cache, pp=point.pp, batch=point.micro_batch_samples, zero_stage=point.zero_stage,
                recompute=point.recompute, choice=point.choice, bounds=_bounds(point), global_batch=16,
            )
            assert again.time_s == pytest.approx(point.time_s) and again.memory_bytes == pytest.approx(point.memory_bytes)

    def test_never_slower_than_the_megatron_grid(self, result, at_batch, cluster):
        grid = megatron_grid(at_batch, cluster=cluster, global_batch=16)
        assert grid.best is not None
        assert result.best.time_s <= grid.best.time_s * (1 + 1e-9)

    def test_memory_limit_picks_a_leaner_plan(self, at_batch, cluster, result):
        limit = float(np.median([p.memory_bytes for p in result.points]))
        limited = pipeline_search(
            at_batch, cluster=cluster, options=PipelineOptions(global_batch=16), memory_limit_bytes=limit
        )
        assert limited.best is not None and limited.best.memory_bytes <= limit
        assert limited.best.time_s >= result.best.time_s

    def test_fixed_micro_batch_and_pipeline(self, at_batch, cluster):
        result = pipeline_search(
            at_batch, cluster=cluster,
            options=PipelineOptions(global_batch=16, micro_batch=2, pipeline_sizes=(2,), recompute=("none",)),
        )
        assert {p.pp for p in result.points} == {2}
        assert all(p.micro_batch == 2 and p.micro_batch_samples == 2 * p.dp for p in result.points)

    def test_nothing_fits(self, at_batch, cluster):
        result = pipeline_search(
            at_batch, cluster=cluster, options=PipelineOptions(global_batch=16, recompute=("none",)),
            memory_limit_bytes=1.0,
        )
        assert result.best is None and "no plan fits" in result.message


class TestOptions:
    def test_micro_batch_must_divide(self):
        with pytest.raises(InputError, match="divide --global-batch"):
            PipelineOptions(global_batch=10, micro_batch=4)

    def test_chunks_need_interleaving(self):
        with pytest.raises(InputError, match="interleaved"):
            PipelineOptions(global_batch=8, chunks=2)

    def test_no_pipeline_size(self, at_batch, cluster):
        with pytest.raises(InputError, match="--pp"):
            pipeline_search(at_batch, cluster=cluster, options=PipelineOptions(global_batch=8, pipeline_sizes=(3,)))


# --------------------------------------------------------------------------------------------
# the search's pruning rules, each against the search without it


_FOUR_LAYER_GRAPHS: dict[int, object] = {}


def _four_layers():
    """``samples -> OpGraph``: a hand-built 4-layer GPT (pipelines of 1, 2 and 4 stages), large
    enough (hidden 2048, seq 1024) for compute to matter as on real models."""
    from tests.objectives.graphs import gpt2_like

    def at(samples: int):
        if samples not in _FOUR_LAYER_GRAPHS:
            _FOUR_LAYER_GRAPHS[samples] = gpt2_like(
                layers=4, hidden=2048, heads=16, vocab=16384, positions=1024, batch=samples, seq=1024
            )
        return _FOUR_LAYER_GRAPHS[samples]

    return at


def _random_bounds(rng, layers: int, pp: int) -> tuple[int, ...]:
    cuts = sorted(rng.choice(np.arange(1, layers), size=pp - 1, replace=False).tolist())
    return (0, *cuts, layers)


class TestLowerBounds:
    @pytest.mark.parametrize("devices, pp, batch", [(8, 1, 4), (8, 2, 2), (8, 4, 8), (16, 1, 8), (16, 2, 4)])
    @pytest.mark.parametrize("schedule, chunks", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
    def test_no_plan_goes_below_them(self, devices, pp, batch, schedule, chunks):
        # random splits within the masks and random stage cuts, every ZeRO stage and recomputation
        from objectives.schedules import in_flight_micro_batches
        from planner.pipeline import _lower_bounds

        if schedule == "interleaved" and pp == 1:
            pytest.skip("no interleaving on one stage")
        cluster = make_cluster("a100-80gb", devices=devices, devices_per_node=8)
        cache = PipelineCostCache(_four_layers(), cluster=cluster)
        d, m = devices // pp, 32 // batch
        structure = cache.structure(batch)
        in_flight = in_flight_micro_batches(schedule, stages=pp, micro_batches=m, chunks=chunks)
        masks = cache.masks(d, batch, inside_node=True, data_parallel=None)
        floor = cache.p2p_floor_s(structure, pp, d)
        rng = np.random.default_rng(devices + pp + batch)
        for recompute in ("none", "selective", "full"):
            for zero in (0, 1, 2, 3):
                bound_t, bound_m = _lower_bounds(
                    cache, cache.arrays(d, batch, zero, recompute), masks, structure, pp=pp, micro_batches=m,
                    in_flight=in_flight, p2p_floor_s=floor, schedule=schedule, chunks=chunks,
                )
                for _ in range(6):
                    choice = np.array([rng.choice(np.flatnonzero(mask)) for mask in masks])
                    point = evaluate_pipeline(
                        cache, pp=pp, batch=batch, zero_stage=zero, recompute=recompute, choice=choice,
                        bounds=_random_bounds(rng, 4, pp) if pp > 1 else (0, 4), global_batch=32,
                        schedule=schedule, chunks=chunks,
                    )
                    assert point.time_s >= bound_t and point.memory_bytes >= bound_m

    @pytest.mark.parametrize("devices, pp, batch", [(8, 2, 2), (8, 4, 8)])
    @pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
    def test_the_leanest_plans_under_recomputation_stay_above_the_memory_bound(self, devices, pp, batch, schedule):
        # the price holds the recomputation working set once per stage, not once per in-flight micro-batch
        # (objectives.memory.pipelined_activation_bytes): the memory bound must stay below the leanest
        # plans, where random splits leave slack; every op at its leanest configuration, every cut
        import itertools

        from objectives.schedules import in_flight_micro_batches
        from planner.pipeline import _lower_bounds

        cache = PipelineCostCache(_four_layers(), cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8))
        d, m = devices // pp, 32 // batch
        structure = cache.structure(batch)
        in_flight = in_flight_micro_batches(schedule, stages=pp, micro_batches=m, chunks=1)
        masks = cache.masks(d, batch, inside_node=True, data_parallel=None)
        floor = cache.p2p_floor_s(structure, pp, d)
        for recompute, zero in itertools.product(("selective", "full"), (1, 3)):
            arrays = cache.arrays(d, batch, zero, recompute)
            _, bound_m = _lower_bounds(cache, arrays, masks, structure, pp=pp, micro_batches=m, in_flight=in_flight,
                                       p2p_floor_s=floor, schedule=schedule, chunks=1)
            held = [arrays.params_bytes[i] + arrays.grads_bytes[i] + arrays.optimizer_bytes[i]
                    + float(in_flight.max()) * arrays.activations_bytes[i] for i in range(len(masks))]
            choice = np.array([np.flatnonzero(mask)[np.argmin(h[mask])] for h, mask in zip(held, masks)])
            for cuts in itertools.combinations(range(1, structure.num_layers), pp - 1):
                point = evaluate_pipeline(cache, pp=pp, batch=batch, zero_stage=zero, recompute=recompute, choice=choice,
                                          bounds=(0, *cuts, structure.num_layers), global_batch=32, schedule=schedule)
                assert point.memory_bytes >= bound_m, (recompute, zero, cuts)

    @pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
    def test_the_first_block_instance_is_bounded_as_it_is_priced(self, schedule):
        # Under an execution model the tables charge the first instance of the repeated block as not
        # recomputed; the price holds its checkpoints per in-flight micro-batch and the rest (the
        # working set) once (objectives.pipeline_price._working_set). At its own tables the bound of
        # the stage holding it, 8 micro-batches in flight, came out above the plan: 660.72 MiB against
        # 645.08 MiB (selective) and 491.08 MiB (full) on this model at b299882 (1T GPT at pp = 128:
        # the selective row 81.73 s / 35.47 GiB pruned). One layer per stage, a small head: the first
        # stage is the largest
        from objectives.schedules import in_flight_micro_batches
        from planner.core.settings import TrainingSettings
        from planner.pipeline import _lower_bounds
        from tests.objectives.graphs import gpt2_like

        layers, pp, batch, global_batch = 8, 8, 1, 64
        graph = gpt2_like(layers=layers, hidden=2048, heads=16, vocab=512, positions=1024, batch=batch, seq=1024)
        cache = PipelineCostCache(lambda samples: graph, cluster=make_cluster("a100-80gb", devices=16, devices_per_node=8),
                                  settings=TrainingSettings(engine="fused", attention="flash"))
        d, m = 16 // pp, global_batch // batch
        structure = cache.structure(batch)
        in_flight = in_flight_micro_batches(schedule, stages=pp, micro_batches=m, chunks=1)
        masks = cache.masks(d, batch, inside_node=True, data_parallel=None)
        rng = np.random.default_rng(7)
        for recompute in ("none", "selective", "full"):
            arrays = cache.arrays(d, batch, 1, recompute)
            _, bound_m = _lower_bounds(cache, arrays, masks, structure, pp=pp, micro_batches=m, in_flight=in_flight,
                                       p2p_floor_s=cache.p2p_floor_s(structure, pp, d), schedule=schedule, chunks=1)
            held = [arrays.params_bytes[i] + arrays.grads_bytes[i] + arrays.optimizer_bytes[i]
                    + float(in_flight.max()) * arrays.activations_bytes[i] for i in range(len(masks))]
            leanest = np.array([np.flatnonzero(mask)[np.argmin(h[mask])] for h, mask in zip(held, masks)])
            choices = [leanest] + [np.array([rng.choice(np.flatnonzero(mask)) for mask in masks]) for _ in range(4)]
            for choice in choices:
                point = evaluate_pipeline(cache, pp=pp, batch=batch, zero_stage=1, recompute=recompute, choice=choice,
                                          bounds=tuple(range(layers + 1)), global_batch=global_batch, schedule=schedule)
                assert point.memory_bytes >= bound_m, (recompute, point.memory_bytes / 2**20, bound_m / 2**20)

    @pytest.mark.parametrize("batch", [2, 8])
    def test_one_stage_dp_optimum_is_the_least_step_time(self, batch):
        # the rule behind the search's pp=1 time floor: the DP's choice at ZeRO-1 without
        # recomputation is at least as fast as any plan at any ZeRO stage and recomputation
        from planner.pipeline import _choose_intra_op

        cluster = make_cluster("a100-80gb", devices=8)
        cache = PipelineCostCache(_four_layers(), cluster=cluster)
        m = 32 // batch
        restricted = stage_restricted(cache, 8, batch, 1, "none", inside_node=True, data_parallel=None)
        picks = _choose_intra_op(cache, restricted, slots=float(m), in_flight=1.0)
        best = evaluate_pipeline(
            cache, pp=1, batch=batch, zero_stage=1, recompute="none", choice=picks, bounds=(0, 4), global_batch=32
        )
        model = cache.model(8, batch, 0, "none")
        rng = np.random.default_rng(batch)
        for _ in range(20):
            choice = _random_choice(model, int(rng.integers(1 << 30)))
            for zero in (0, 1, 2, 3):
                for recompute in ("none", "selective", "full"):
                    other = evaluate_pipeline(
                        cache, pp=1, batch=batch, zero_stage=zero, recompute=recompute, choice=choice,
                        bounds=(0, 4), global_batch=32,
                    )
                    assert other.time_s >= best.time_s * (1 - 1e-12)


class TestPruning:
    @pytest.mark.parametrize(
        "devices, options, limit",
        [
            (8, dict(global_batch=32), None),
            (16, dict(global_batch=32), None),
            (8, dict(global_batch=32, schedule="gpipe"), None),
            (8, dict(global_batch=32, recompute=("none", "full"), zero_stages=(0, 3)), None),
            (16, dict(global_batch=32), "median"),  # the memory-weighted searches run
        ],
    )
    def test_same_frontier_as_without(self, devices, options, limit):
        cluster = make_cluster("a100-80gb", devices=devices, devices_per_node=8)
        at = _four_layers()
        if limit == "median":
            free = pipeline_search(at, cluster=cluster, options=PipelineOptions(**options))
            limit = float(np.median([p.memory_bytes for p in free.points]))
        runs = [
            pipeline_search(at, cluster=cluster, options=PipelineOptions(**options, prune=prune),
                            memory_limit_bytes=limit)
            for prune in (False, True)
        ]
        plain, pruned = runs
        assert pruned.pruned > 0 and plain.pruned == 0
        assert pruned.intra_op_searches < plain.intra_op_searches
        assert pruned.chosen == plain.chosen
        assert len(pruned.points) == len(plain.points)
        for a, b in zip(plain.points, pruned.points):
            assert (a.time_s, a.memory_bytes, a.choice, a.summary, a.layers_per_stage, a.micro_batches) == (
                b.time_s, b.memory_bytes, b.choice, b.summary, b.layers_per_stage, b.micro_batches
            )

    def test_zero_0_searched_where_its_all_reduce_beats_zero_1(self):
        # Across 4 nodes a data-parallel all-reduce runs as a tree (objectives.collectives), while
        # ZeRO-1's reduce-scatter and all-gather run as rings: ZeRO-0 can be faster, so it gets its
        # own intra-op search, and the bounds stay valid (same frontier as without pruning).
        cluster = make_cluster("a100-80gb", devices=32, devices_per_node=8)
        plain, pruned = (
            pipeline_search(_four_layers(), cluster=cluster, options=PipelineOptions(global_batch=32, prune=prune))
            for prune in (False, True)
        )
        assert pruned.pruned > 0 and pruned.chosen == plain.chosen and len(pruned.points) == len(plain.points)
        for a, b in zip(plain.points, pruned.points):
            assert (a.time_s, a.memory_bytes, a.choice, a.summary) == (b.time_s, b.memory_bytes, b.choice, b.summary)
        zero0 = [p for p in plain.points if p.zero_stage == 0]
        assert zero0
        for point in zero0:  # each is faster than its ZeRO-1 twin, which holds less
            twin = evaluate_pipeline(
                plain.cache, pp=point.pp, batch=point.micro_batch_samples, zero_stage=1, recompute=point.recompute,
                choice=point.choice, bounds=_bounds(point), global_batch=32,
            )
            assert twin.time_s > point.time_s and twin.memory_bytes < point.memory_bytes

    @pytest.mark.parametrize("target, devices", [("megatron", 8), ("megatron", 16)])  # deepspeed: no DPs (tp = 1)
    def test_same_frontier_as_without_under_a_target(self, at_batch, target, devices):
        # with a target each family's DP is skipped when the family's own bounds are dominated
        cluster = make_cluster("a100-80gb", devices=devices, devices_per_node=8)
        plain, pruned = (
            pipeline_search(
                at_batch, cluster=cluster, options=PipelineOptions(global_batch=64, prune=prune), target=target
            )
            for prune in (False, True)
        )
        assert pruned.intra_op_searches < plain.intra_op_searches
        assert pruned.chosen == plain.chosen and len(pruned.points) == len(plain.points) > 0
        for a, b in zip(plain.points, pruned.points):
            assert (a.time_s, a.memory_bytes, a.choice, a.summary, a.layers_per_stage, a.micro_batches) == (
                b.time_s, b.memory_bytes, b.choice, b.summary, b.layers_per_stage, b.micro_batches
            )

    def test_running_frontier_is_the_pareto_filter(self):
        # first of equal points kept, as pareto_mask does over all the points at the end
        from types import SimpleNamespace

        from planner.pipeline import _Frontier

        rng = np.random.default_rng(7)
        for _ in range(50):
            times = rng.integers(0, 6, 25).astype(float)
            memories = rng.integers(0, 6, 25).astype(float)
            frontier = _Frontier()
            points = []
            for t, m in zip(times, memories):
                point = SimpleNamespace(time_s=t, memory_bytes=m)
                points.append(point)
                frontier.add(SimpleNamespace(time_s=t, memory_bytes=m, point=lambda p=point: p))
            kept = pareto_mask(times, memories)
            assert [id(p) for p in frontier.points] == [id(p) for p, k in zip(points, kept) if k]
            assert frontier.priced == 25


class TestRelease:
    def test_searches_keep_no_cost_models_and_rebuild_them_equal(self, at_batch, cluster):
        result = pipeline_search(at_batch, cluster=cluster, options=PipelineOptions(global_batch=16))
        cache = result.cache
        for point in result.points:
            assert not cache.holds(point.devices_per_stage, point.micro_batch_samples)
        point = result.points[0]
        model = result.cost_model(point)  # rebuilt on demand
        assert model.graph is point.graph
        assert [s.factors.tolist() for s in model.tables.configs] == [s.factors.tolist() for s in point.spaces]
        assert cache.holds(point.devices_per_stage, point.micro_batch_samples)

    def test_a_second_search_prunes_by_the_kept_bounds_without_building_models_again(self, cluster):
        # a launcher's search after another over the same cache (issue 22, sixth speed round): the
        # bounds over the search's own masks outlive the released models (pricing.lasting), so the
        # combinations they prune build nothing, and it finds what it finds on a fresh cache
        from planner.search.pipeline import search_pipeline

        options = PipelineOptions(global_batch=32)
        cache, fresh_cache = (PipelineCostCache(_four_layers(), cluster=cluster) for _ in range(2))
        first = search_pipeline(cache, options=options)
        seeds = [(p.time_s, p.memory_bytes) for p in first.points]
        built = cache.builds
        again = search_pipeline(cache, options=options, seeds=seeds)
        fresh = search_pipeline(fresh_cache, options=options, seeds=seeds)
        assert again.pruned == fresh.pruned > 0 and again.combinations == fresh.combinations
        assert [(p.time_s, p.memory_bytes, p.summary) for p in again.points] == [
            (p.time_s, p.memory_bytes, p.summary) for p in fresh.points
        ]
        assert cache.builds - built < fresh_cache.builds

    def test_a_targeted_search_keeps_the_bounds_of_the_search_masks_too(self, at_batch, cluster):
        # issue 22, seventh round: a launcher's search bounds a pair by its families' union once it
        # knows them; it keeps the bounds over the search's own masks as well, so the headroom
        # search after it (no target, same cache) prunes those pairs from the kept bounds. The
        # untargeted search finds the same points, prunes and counts as on a fresh cache, and builds
        # fewer models than after a targeted search that kept only the union's bounds (the base).
        # On the 2-layer GPT-2 (the 12-layer one's searches took ~2x the CPU): 19 builds kept against 27, 40 pairs pruned.
        from planner.pipeline import target_rules
        from planner.search import pipeline as search_module

        options = PipelineOptions(global_batch=16)

        def untargeted_after_megatron(keep_own: bool):
            cache = PipelineCostCache(at_batch, cluster=cluster)
            cache.searched_again = True  # (planner.launchable sets it where a search follows)
            keep = search_module._Slot.keep_own_bounds
            if not keep_own:  # the base: only the union's bounds
                search_module._Slot.keep_own_bounds = lambda *args: None
            try:
                first = search_module.search_pipeline(cache, options=options, rules=target_rules("megatron"))
            finally:
                search_module._Slot.keep_own_bounds = keep
            seeds = [(min(p.time_s for p in first.points), 0.0)]  # the headroom search's (planner.launchable)
            built = cache.builds
            return search_module.search_pipeline(cache, options=options, seeds=seeds), cache.builds - built, seeds

        kept, kept_builds, seeds = untargeted_after_megatron(True)
        base, base_builds, _ = untargeted_after_megatron(False)
        fresh = search_module.search_pipeline(PipelineCostCache(at_batch, cluster=cluster), options=options, seeds=seeds)
        for run in (kept, base):
            assert (run.pruned, run.combinations) == (fresh.pruned, fresh.combinations)
            assert [(p.time_s, p.memory_bytes, p.summary) for p in run.points] == [
                (p.time_s, p.memory_bytes, p.summary) for p in fresh.points
            ]
        assert kept_builds < base_builds

    def test_a_launcher_without_pipelines_builds_one_stage_models_only(self, gpt2_at_batch, cluster):
        # issue 22, eleventh round: DTensor runs no pipeline (its rules refuse pp > 1), so its
        # search builds no model of a pp > 1 pair (it used to, for the memory floor of each
        # micro-batch), and finds what the search without that check finds
        from planner.pipeline import target_rules
        from planner.search import pipeline as search_module

        options = PipelineOptions(global_batch=16)
        rules = target_rules("dtensor")
        assert not any(rules.allows(pp=2, zero_stage=z, recompute=r, schedule="1f1b", tp=tp)
                       for z in range(4) for r in ("none", "selective", "full") for tp in (None, 1, 2))

        def search(check: bool):
            cache = PipelineCostCache(gpt2_at_batch, cluster=cluster)
            cache.keep = True
            runs_any = search_module._Search.runs_any
            if not check:
                search_module._Search.runs_any = lambda *args: True
            try:
                result = search_module.search_pipeline(cache, options=options, rules=rules)
            finally:
                search_module._Search.runs_any = runs_any
            return result, {key[0] for key in cache._models}

        checked, stage_sizes = search(True)
        unchecked, unchecked_sizes = search(False)
        assert stage_sizes == {cluster.devices}  # pp = 1: every device in the one stage
        assert unchecked_sizes > stage_sizes  # without the check: models of smaller stages too
        assert [(p.time_s, p.memory_bytes, p.summary) for p in checked.points] == [
            (p.time_s, p.memory_bytes, p.summary) for p in unchecked.points
        ]


# --------------------------------------------------------------------------------------------
# the search restricted to what a launch target runs


GPT2 = ROOT / "examples" / "gpt2.onnx"  # 12 layers, hidden 768, 12 heads


@pytest.fixture(scope="module")
def gpt2_at_batch():
    return graph_loader(GPT2, {"seq": 128})


@pytest.fixture(scope="module")
def gpt2_free(gpt2_at_batch, cluster):
    """The unrestricted search on gpt2.onnx, per global batch."""
    return {g: pipeline_search(gpt2_at_batch, cluster=cluster, options=PipelineOptions(global_batch=g)) for g in (16, 64)}


def _pipeline_rules_hold(point, target: str) -> None:
    """The exporters' pipeline rules, read from their refusals (exporters/megatron/export.py, deepspeed/export.py)."""
    if point.pp > 1:
        assert point.zero_stage <= 1  # Megatron-FSDP / PipelineEngine: no ZeRO-2/3 with pp > 1
        assert point.dp * point.tp == point.devices_per_stage  # no idle stage devices
        if target == "deepspeed":
            assert point.tp == 1


class TestTarget:
    @pytest.mark.parametrize("target", ["megatron", "deepspeed"])
    @pytest.mark.parametrize("global_batch", [16, 64])
    def test_gpt2_rows_all_export(self, gpt2_at_batch, gpt2_free, cluster, target, global_batch):
        from exporters import export
        from planner.pipeline import pipeline_plan_input

        result = pipeline_search(
            gpt2_at_batch, cluster=cluster, options=PipelineOptions(global_batch=global_batch), target=target
        )
        assert result.points and result.best is not None and result.target == target
        for index, point in enumerate(result.points):
            document = export(target, pipeline_plan_input(result, index))  # raises UnsupportedExport if not
            # its processes: all 8 devices, or at pp = 1 the devices the plan holds (GPT-2's dp=4, ZeRO-2 at 8.0 ms
            # on 4 of them holds one NCCL group where a 2-stage plan's rank holds two, so it is on the frontier)
            assert document["world_size"] == (8 if point.pp > 1 else point.dp * point.tp)
            assert point.uniform
            _pipeline_rules_hold(point, target)
        # a subset of the plans: never faster than the unrestricted search
        assert result.points[0].time_s >= gpt2_free[global_batch].points[0].time_s * (1 - 1e-12)
        assert any("searched only plans" in note for note in result.notes)

    def test_unrestricted_unchanged_by_generic(self, at_batch, cluster, result):
        # target=None and target="generic" (every plan) run the same search
        again = pipeline_search(at_batch, cluster=cluster, options=PipelineOptions(global_batch=16), target="generic")
        assert again.target is None and again.intra_op_searches == result.intra_op_searches
        assert [(p.time_s, p.memory_bytes, p.choice, p.summary) for p in again.points] == [
            (p.time_s, p.memory_bytes, p.choice, p.summary) for p in result.points
        ]

    @pytest.mark.parametrize("target", ["megatron", "deepspeed"])
    def test_one_stage_fastest_is_the_exhaustive_optimum(self, at_batch, cluster, target):
        # Oracle: every plan of every family on 8 devices (each op's allowed configurations
        # enumerated), every micro-batch, priced by evaluate_pipeline; on one stage the search's
        # objective is the step time, so its fastest point is the oracle's minimum.
        import itertools

        from exporters.targets import TARGETS

        options = PipelineOptions(global_batch=16, pipeline_sizes=(1,), zero_stages=(1,), recompute=("none",), prune=False)
        found = pipeline_search(at_batch, cluster=cluster, options=options, target=target)
        cache = PipelineCostCache(at_batch, cluster=cluster)
        best = np.inf
        for batch in (1, 2, 4, 8, 16):
            spaces = cache.model(8, batch, 0, "none").tables.configs
            families = TARGETS[target].pipeline_families(cache.graph(batch), spaces, devices=8, devices_per_node=8, pp=1)
            for family in families:
                allowed = [np.flatnonzero(m) for m in family.masks]
                assert np.prod([a.size for a in allowed]) <= 64  # small enough to enumerate
                for choice in itertools.product(*allowed):
                    point = evaluate_pipeline(
                        cache, pp=1, batch=batch, zero_stage=1, recompute="none", choice=choice, bounds=(0, 2),
                        global_batch=16,
                    )
                    best = min(best, point.time_s)
        assert found.points[0].time_s == pytest.approx(best, rel=1e-12)

    @pytest.mark.parametrize("target", ["meshtf", "dtensor"])
    def test_targets_without_pipelines(self, at_batch, cluster, target):
        from exporters import export
        from planner.pipeline import pipeline_plan_input

        result = pipeline_search(at_batch, cluster=cluster, options=PipelineOptions(global_batch=16), target=target)
        assert result.points
        for index, point in enumerate(result.points):
            assert point.pp == 1
            assert point.zero_stage in ((0,) if target == "meshtf" else (0, 3))
            if target == "dtensor":
                assert point.recompute != "selective"
            export(target, pipeline_plan_input(result, index))

    def test_megatron_has_no_gpipe_pipeline(self, at_batch, cluster):
        result = pipeline_search(
            at_batch, cluster=cluster, options=PipelineOptions(global_batch=16, schedule="gpipe", pipeline_sizes=(2,)),
            target="megatron",
        )
        assert not result.points and "megatron runs no plan" in result.message

    def test_unknown_target(self, at_batch, cluster):
        with pytest.raises(InputError, match="unknown --target"):
            pipeline_search(at_batch, cluster=cluster, options=PipelineOptions(global_batch=16), target="jax")


class TestGraphLoader:
    @staticmethod
    def _mlp(tmp_path, batch) -> Path:
        import onnx
        from onnx import TensorProto, helper

        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])
        w = helper.make_tensor("fc.weight", TensorProto.FLOAT, [16, 8], [0.5] * 128)
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="fc")], "m", [x], [y], [w])
        path = tmp_path / f"mlp_{batch}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
        return path

    def test_the_models_own_batch_dim_is_varied(self, tmp_path):
        # a batch dim named N (not "batch"): each micro-batch imports at its own N; a user's N is replaced
        at = graph_loader(self._mlp(tmp_path, "N"), {"N": 3})
        assert [op.dims[0].size for op in at(4).ops] == [4]
        assert [op.dims[0].size for op in at(16).ops] == [16]

    def test_a_fixed_batch_is_refused(self, tmp_path):
        with pytest.raises(InputError, match="no named batch dim"):
            graph_loader(self._mlp(tmp_path, 2), {})


def test_across_nodes_the_search_is_never_slower_than_megatrons_data_parallel_layout():
    # Oracle: planner.estimate prices Megatron's dp x tp layout directly. A position table's lookup
    # (no batch dim) runs once per data-parallel rank, on every node: the search must allow those
    # copies across nodes, or its best plan is slower than plain data parallelism.
    from planner.estimate import estimate

    cluster = make_cluster("a100-80gb", devices=16, devices_per_node=8)
    cache = PipelineCostCache(graph_loader("examples/gpt2.onnx", {"seq": 1024}), cluster=cluster)
    layout = estimate(cache, cluster=cluster, tp=1, pp=1, micro_batch=4, global_batch=512, zero=0)
    result = pipeline_search(cache, cluster=cluster, options=PipelineOptions(
        global_batch=512, zero_stages=(0,), pipeline_sizes=(1,), micro_batch=4, recompute=("none",)))
    assert layout.valid
    assert min(p.time_s for p in result.points) <= layout.point.time_s * (1 + 1e-12)
