"""estimate(): one Megatron-style configuration priced with the search's cost model, ranked, or refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters.megatron import megatron_masks
from planner.core.errors import InputError
from objectives.cluster import make_cluster
from planner.core.configs import divisors
from planner.estimate import estimate, megatron_grid
from planner.pipeline import PipelineCostCache, PipelineOptions, evaluate_pipeline, graph_loader, pipeline_search
from planner.search.pareto import TIME_TIE

from tests.objectives.graphs import gpt2_like

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, 4 heads, FFN 256


@pytest.fixture(scope="module")
def at_batch():
    return graph_loader(TINY, {"seq": 128})


@pytest.fixture(scope="module")
def cluster():
    return make_cluster("a100-80gb", devices=8)


@pytest.fixture(scope="module")
def cache(at_batch, cluster):
    return PipelineCostCache(at_batch, cluster=cluster)


class TestValid:
    def test_megatron_layout_priced_by_the_pipeline(self, cache, cluster):
        e = estimate(cache, cluster=cluster, tp=2, pp=2, micro_batch=2, global_batch=16, zero=1,
                     recompute="selective")
        assert e.valid and e.reason == ""
        assert e.config.dp == 2 and e.config.micro_batches == 4
        point = e.point
        assert point.pp == 2 and point.layers_per_stage == (1, 1)
        assert (point.dp, point.tp, point.uniform) == (2, 2, True)
        # the same plan through the pipeline pricing gives the same numbers
        model = cache.model(4, 4, 0, "selective")
        masks = megatron_masks(model.graph, model.tables.configs, dp=2, tp=2, devices_per_node=8)
        assert all(m[c] for m, c in zip(masks, point.choice))
        again = evaluate_pipeline(cache, pp=2, batch=4, zero_stage=1, recompute="selective", choice=point.choice,
                                  bounds=(0, 1, 2), global_batch=16)
        assert again.time_s == pytest.approx(e.time_s) and again.memory_bytes == pytest.approx(e.memory_bytes)
        assert e.memory.total_bytes == pytest.approx(e.memory_bytes)

    def test_sequence_parallel_splits_norms_along_the_sequence(self, cache, cluster):
        plain = estimate(cache, cluster=cluster, tp=4, pp=1, micro_batch=1, global_batch=8)
        sp = estimate(cache, cluster=cluster, tp=4, pp=1, micro_batch=1, global_batch=8, sequence_parallel=True)
        assert plain.valid and sp.valid
        norms = [i for i, op in enumerate(sp.point.graph.ops) if op.kind == "norm"]
        spaces = sp.point.spaces
        assert all(spaces[i].devices_used[sp.point.choice[i]] == 8 for i in norms)
        assert all(spaces[i].devices_used[plain.point.choice[i]] == 2 for i in norms)
        assert sp.memory_bytes < plain.memory_bytes

    def test_uneven_stages(self, cache, cluster):
        e = estimate(cache, cluster=cluster, tp=1, pp=2, micro_batch=1, global_batch=8, stage_layers=(1, 1))
        assert e.valid and e.point.layers_per_stage == (1, 1)

    def test_zero_and_recompute_trade_memory(self, cache, cluster):
        base = estimate(cache, cluster=cluster, tp=1, pp=1, micro_batch=1, global_batch=8)
        lean = estimate(cache, cluster=cluster, tp=1, pp=1, micro_batch=1, global_batch=8, zero=3, recompute="full")
        assert lean.memory_bytes < base.memory_bytes
        # ZeRO-3 shards the states of every parameter the 8 data-parallel ranks replicate (the position
        # table is read by an op without a batch dim, which runs on one device: not sharded)
        assert lean.memory.optimizer_bytes < base.memory.optimizer_bytes / 4
        assert lean.memory.activations_bytes < base.memory.activations_bytes


class TestInvalid:
    @pytest.mark.parametrize(
        "kwargs, fragment",
        [
            (dict(tp=3, pp=1, micro_batch=1, global_batch=8), "does not divide 8 devices"),
            (dict(tp=2, pp=2, dp=4, micro_batch=1, global_batch=8), "make the product equal --devices"),
            (dict(tp=8, pp=1, micro_batch=1, global_batch=8), "4 attention heads are not divisible by tp=8"),
            (dict(tp=1, pp=4, micro_batch=1, global_batch=8), "needs at least that many layers"),
            (dict(tp=2, pp=1, micro_batch=3, global_batch=8), "not a multiple of micro-batch x dp"),
            (dict(tp=1, pp=1, micro_batch=1, global_batch=8, sequence_parallel=True), "needs tp > 1"),
            (dict(tp=2, pp=2, micro_batch=1, global_batch=6, schedule="interleaved", chunks=1),
             "multiple of pp=2"),
            (dict(tp=1, pp=2, micro_batch=1, global_batch=8, stage_layers=(2, 0)), "at least one layer"),
        ],
    )
    def test_reasons_end_with_a_fix(self, cache, cluster, kwargs, fragment):
        e = estimate(cache, cluster=cluster, **kwargs)
        assert not e.valid and e.point is None
        assert fragment in e.reason
        assert e.time_s == float("inf")

    def test_uneven_layers_need_stage_layers(self, cluster):
        graph = gpt2_like(layers=3, hidden=32, heads=4, vocab=100, positions=16, batch=2, seq=16)
        e = estimate(graph, cluster=cluster, tp=2, pp=2, micro_batch=1, global_batch=4)
        assert not e.valid and "3 layers do not split evenly into pp=2" in e.reason
        e = estimate(graph, cluster=cluster, tp=2, pp=2, micro_batch=1, global_batch=4, stage_layers=(2, 1))
        assert e.valid and e.point.layers_per_stage == (2, 1)
        # not a Megatron-LM GPT (a hand-built graph): priced as the uniform dp x tp family, and said so
        assert any("uniform dp x tp" in note for note in e.notes)

    def test_graph_at_another_batch(self, cluster):
        graph = gpt2_like(layers=2, hidden=32, heads=4, vocab=100, positions=16, batch=2, seq=16)
        with pytest.raises(InputError, match="graph_at_batch"):
            estimate(graph, cluster=cluster, tp=1, pp=1, micro_batch=1, global_batch=8)


class TestRank:
    def test_rank_against_the_frontier(self, cache, cluster):
        frontier = pipeline_search(cache, cluster=cluster, options=PipelineOptions(global_batch=16))
        e = estimate(cache, cluster=cluster, tp=2, pp=1, micro_batch=1, global_batch=16, frontier=frontier)
        fitting = [p for p in frontier.points if p.fits]
        assert e.rank == 1 + sum(p.time_s < e.time_s for p in fitting)
        assert e.fitting_points == len(fitting) and e.rank <= e.fitting_points + 1
        assert e.best_time_s == pytest.approx(min(p.time_s for p in fitting))
        assert e.slowdown_vs_best == pytest.approx(e.time_s / e.best_time_s)
        assert e.frontier_points == len(frontier.points)
        if e.dominated_by is not None:
            better = frontier.points[e.dominated_by]
            assert better.time_s <= e.time_s * (1 + TIME_TIE) and better.memory_bytes <= e.memory_bytes


class TestGrid:
    def test_every_configuration_and_the_best(self, at_batch, cluster):
        grid = megatron_grid(at_batch, cluster=cluster, global_batch=8, recompute=("none",), zero=(0, 1))
        # enumerate by hand: pp in {1, 2} (2 layers), tp | 8/pp with 4 heads -> tp in {1, 2, 4},
        # mb | 8/dp; heads limit tp to divisors of 4
        expected = 0
        for pp in (1, 2):
            for tp in divisors(8 // pp):
                dp = 8 // (pp * tp)
                if tp > 4 or 8 % dp:
                    continue
                expected += 2 * len(divisors(8 // dp))
        assert len(grid.estimates) == expected
        fitting = [e for e in grid.estimates if e.fits]
        assert grid.best is not None and grid.best.time_s == min(e.time_s for e in fitting)
        assert np.isfinite([e.time_s for e in grid.estimates]).all()

    def test_fresh_cost_models_give_the_same_numbers(self, at_batch, cluster):
        shared = megatron_grid(at_batch, cluster=cluster, global_batch=4, recompute=("none",), zero=(1,))
        fresh = megatron_grid(at_batch, cluster=cluster, global_batch=4, recompute=("none",), zero=(1,),
                              share_cost_models=False)
        assert [e.time_s for e in shared.estimates] == pytest.approx([e.time_s for e in fresh.estimates])
        assert fresh.cost_builds >= shared.cost_builds


def test_an_moe_model_at_tp_2_needs_sequence_parallelism():
    """megatron-core 0.16.1 trains MoE layers at tp > 1 only with --sequence-parallel (``MoELayer.forward`` raises
    without it; the export refuses it since 4008a67): the estimate says so and how to fix it, not "try another --tp",
    and prices the same degrees with sequence parallelism (Mixtral-tiny, 4 experts per layer; review h28r)."""
    mixtral = graph_loader(ROOT / "tests" / "data" / "mixtral_tiny.onnx", {"seq": 32})
    kwargs = dict(cluster=make_cluster("a100-80gb", devices=4), tp=2, pp=1, micro_batch=2, global_batch=8)
    refused = estimate(mixtral, **kwargs)
    assert not refused.valid and refused.reason.startswith("megatron-core 0.16.1 trains MoE layers at tp > 1 only with")
    assert refused.reason.endswith("pass --sequence-parallel or --tp 1")
    assert estimate(mixtral, sequence_parallel=True, **kwargs).valid
