"""The printed data-parallel baseline is a row of the launchable frontier (issue 22, "Exact"/pick):
a search stopped by its time limit never picks slower than the baseline line printed under it.

Oracles: :func:`planner.estimate.estimate` of ``tp = pp = 1``, ``dp = devices`` (one configuration priced
alone, no search), the exporters themselves (each launcher listed on the row exports it), and the
frontier's own baseline line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.baseline_rows import baseline_searched, data_parallel_points
from planner.core.degrees import Degrees, Pins
from planner.estimate import estimate
from planner.launchable import export_row, launch_frontier
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.plan import PlanRequest

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
DEVICES, GLOBAL_BATCH = 8, 16


def _is_data_parallel(row) -> bool:
    """Pure data parallelism, one micro-batch per step, at any ZeRO stage (the baselines' rows)."""
    point = row.point
    return (row.degrees == Degrees(dp=DEVICES) and (point.micro_batch, point.micro_batches) == (GLOBAL_BATCH // DEVICES, 1)
            and point.recompute == "none")


def _is_baseline(row) -> bool:
    return _is_data_parallel(row) and row.point.zero_stage == 0


@pytest.fixture(scope="module")
def stopped():
    """GPT-2 tiny on 8 devices with a time limit that stops every search after its first combination."""
    loader = graph_loader(GPT2, {"seq": 64})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=DEVICES), time_limit_s=1e-6)
    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=GLOBAL_BATCH), headroom=False,
                               collapse=0.0)
    return loader, request, frontier


class TestStoppedSearch:
    def test_the_search_was_stopped(self, stopped):
        assert any("time limit" in note for note in stopped[2].notes)

    def test_the_pick_is_no_slower_than_the_printed_baseline(self, stopped):
        frontier = stopped[2]
        assert frontier.baseline is not None and frontier.baseline.fits
        assert frontier.best.time_s <= frontier.baseline.time_s * (1 + 1e-12)

    def test_the_baseline_is_listed_or_dominated(self, stopped):
        frontier = stopped[2]
        baseline = frontier.baseline
        listed = [row for row in frontier.rows if _is_baseline(row) and row.priced_as == baseline.priced_as]
        dominated = [row for row in frontier.rows
                     if row.time_s <= baseline.time_s and row.memory_bytes <= baseline.memory_bytes and not _is_baseline(row)]
        assert listed or dominated

    def test_the_baseline_row_is_the_estimate_and_exports_to_each_listed_launcher(self, stopped):
        loader, request, frontier = stopped
        rows = [(i, row) for i, row in enumerate(frontier.rows) if _is_data_parallel(row)]
        assert rows, "no pure data-parallel row listed"
        for index, row in rows:
            rules = [TARGETS[name] for name in row.targets if TARGETS[name].restricts]
            alone = estimate(row.cache, cluster=request.cluster, tp=1, pp=1, dp=DEVICES, micro_batch=GLOBAL_BATCH // DEVICES,
                             global_batch=GLOBAL_BATCH, zero=row.point.zero_stage, settings=row.cache.settings,
                             sequence_shard_saved=row.point.sequence_shard_saved, fused_swiglu=row.point.fused_swiglu,
                             grad_accumulator=rules[0].grad_accumulator)  # fmt: skip
            assert row.time_s == pytest.approx(alone.point.time_s, rel=1e-12)
            assert row.memory_bytes == pytest.approx(alone.point.memory_bytes, rel=1e-12)
            for name in row.targets:
                assert export_row(frontier, index, name)


class TestPricedPerLauncher:
    def test_each_launcher_gets_its_own_memory_rules_and_runs_its_row(self):
        loader = graph_loader(GPT2, {"seq": 64})
        cluster = make_cluster("a100-80gb", devices=DEVICES)
        cache = PipelineCostCache(loader, cluster=cluster)
        rules = {"megatron": None, "deepspeed": None}
        from planner.pipeline import target_rules

        rules = {name: target_rules(name) for name in rules}
        points = data_parallel_points(list(rules), rules.get, lambda name: cache, {n: None for n in rules},
                                      global_batch=GLOBAL_BATCH, memory_limit_bytes=None)
        assert points and all(("megatron" in p.runners) or ("deepspeed" in p.runners) for p in points)
        for found in points:
            name = found.runners[0]
            target = TARGETS[name]
            alone = estimate(cache, cluster=cluster, tp=1, pp=1, dp=DEVICES, micro_batch=2, global_batch=GLOBAL_BATCH,
                             sequence_shard_saved=target.sequence_shard_saved, fused_swiglu=target.fused_swiglu,
                             grad_accumulator=target.grad_accumulator)  # fmt: skip
            assert found.point.memory_bytes == pytest.approx(alone.point.memory_bytes, rel=1e-12)

    def test_a_batch_that_does_not_split_prices_none(self):
        cache = PipelineCostCache(graph_loader(GPT2, {"seq": 64}), cluster=make_cluster("a100-80gb", devices=DEVICES))
        assert data_parallel_points(["megatron"], lambda n: None, lambda n: cache, {"megatron": None},
                                    global_batch=12, memory_limit_bytes=None) == []


@pytest.mark.parametrize("pins, options, expected", [
    (Pins(), PipelineOptions(global_batch=16), True),
    (Pins(tp=2), PipelineOptions(global_batch=16), False),
    (Pins(dp=8, zero=0), PipelineOptions(global_batch=16), True),
    (Pins(zero=1), PipelineOptions(global_batch=16), False),
    (Pins(mb=1), PipelineOptions(global_batch=16), False),
    (Pins(), PipelineOptions(global_batch=16, recompute=("full",)), False),
    (Pins(), PipelineOptions(global_batch=16, pipeline_sizes=(2,)), False),
    (Pins(), PipelineOptions(global_batch=12), False),
])
def test_the_baseline_is_listed_only_where_the_search_space_holds_it(pins, options, expected):
    assert baseline_searched(options, pins, DEVICES) is expected


@pytest.mark.parametrize("pins, zero, expected", [
    (Pins(zero=1), 1, True), (Pins(zero=1), 2, False), (Pins(), 3, True),
    (Pins(dp=8, tp=1), 2, True), (Pins(tp=2), 1, False),
])
def test_the_sharded_baselines_follow_the_pins(pins, zero, expected):
    assert baseline_searched(PipelineOptions(global_batch=16), pins, DEVICES, zero) is expected


def test_a_stopped_search_finds_sharded_data_parallelism_where_zero_0_does_not_fit():
    """Pure data parallelism at ZeRO 1-3 joins the rows and seeds the searches as ZeRO-0's does: with a limit
    between ZeRO-0's and ZeRO-1's memory, a search stopped after its first combination still picks no slower
    than the fastest sharded one that fits (StarCoder2-7B on 1,024 H100s picked 1.027 s beside 0.835 s, sweep H3)."""
    loader = graph_loader(GPT2, {"seq": 64})
    cluster = make_cluster("a100-80gb", devices=DEVICES)
    engine, attention = TARGETS["generic"].execution  # the generic plan's execution model, as its search prices it
    settings = dataclasses.replace(PlanRequest(cluster=cluster).settings, engine=engine, attention=attention)

    def alone(zero: int):
        cache = PipelineCostCache(loader, cluster=cluster, settings=settings)
        return estimate(cache, cluster=cluster, tp=1, pp=1, dp=DEVICES, micro_batch=GLOBAL_BATCH // DEVICES,
                        global_batch=GLOBAL_BATCH, zero=zero, settings=settings).point

    plain, sharded = alone(0), [alone(z) for z in (1, 2, 3)]
    limit = (plain.memory_bytes + max(p.memory_bytes for p in sharded)) / 2
    assert all(p.memory_bytes < limit < plain.memory_bytes for p in sharded)
    request = PlanRequest(cluster=cluster, time_limit_s=1e-6, memory_limit_bytes=limit)
    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=GLOBAL_BATCH), headroom=False,
                               collapse=0.0, launchers=("generic",))
    assert any("time limit" in note for note in frontier.notes)
    # the pick is the fastest fitting row or one within 0.01% of it with fewer ZeRO stages (planner.pick)
    assert frontier.best.time_s <= min(p.time_s for p in sharded) * (1 + 1e-4)
    assert {row.point.zero_stage for row in frontier.rows if _is_data_parallel(row)} & {1, 2, 3}


def test_the_baseline_line_is_priced_as_the_picks_launcher_runs_it():
    """Under ``--target deepspeed`` the printed baseline is DeepSpeed's ZeRO-0 data parallelism, whose gradient
    all-reduce runs after the backward (exporters/deepspeed/zero_sync.py), not the overlapped one of the plain
    pricing: the line beside DeepSpeed's rows is never faster than DeepSpeed can run it."""
    from planner.pipeline import target_rules

    loader = graph_loader(GPT2, {"seq": 64})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=DEVICES), time_limit_s=1e-6)
    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=GLOBAL_BATCH), headroom=False,
                               collapse=0.0, launchers=("deepspeed",))
    baseline, rules = frontier.baseline, target_rules("deepspeed")

    def alone(**rule):
        return estimate(baseline.cache, cluster=request.cluster, tp=1, pp=1, dp=DEVICES, micro_batch=GLOBAL_BATCH // DEVICES,
                        global_batch=GLOBAL_BATCH, zero=0, settings=baseline.cache.settings, **rule).point

    deepspeed, overlapped = alone(zero_sync=rules.zero_sync), alone()
    assert deepspeed.time_s > overlapped.time_s  # the rule's exposed all-reduce: the two prices differ
    assert baseline.time_s == pytest.approx(deepspeed.time_s, rel=1e-12)
    # and DeepSpeed's own ZeRO-0 data-parallel row, where listed, costs the same
    twins = [row for row in frontier.rows if _is_baseline(row) and row.priced_as == baseline.priced_as]
    assert all(row.time_s == pytest.approx(baseline.time_s, rel=1e-12) for row in twins)
