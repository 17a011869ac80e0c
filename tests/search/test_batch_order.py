"""The order a pipeline search walks its micro-batches (planner.search.pipeline_space._batches): a search
stopped by its time limit has seen the data parallelism as wide as the stage first (issue 22, "Exact"/pick).

Oracles: the divisors written out by hand, and :func:`planner.estimate.estimate` of pure data parallelism
(one configuration priced alone) against what a search stopped after its first combination found."""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from planner.estimate import estimate
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.search.pipeline import search_pipeline
from planner.search.pipeline_space import _batches

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"


@pytest.mark.parametrize("global_batch, devices, least, expected", [
    # divisors of 16 that 8 divides first (8, 16), then the rest widest first (4, 2, 1)
    (16, 8, 1, [8, 16, 4, 2, 1]),
    # 12 over 4 devices: 4, 12 split over every device; 6, 3, 2, 1 do not
    (12, 4, 1, [4, 12, 6, 3, 2, 1]),
    # a batch split that must span 2 nodes: 1 is left out
    (16, 8, 2, [8, 16, 4, 2]),
    # one device: every micro-batch splits over it, smallest first (the unfit skip reads its multiples)
    (8, 1, 1, [1, 2, 4, 8]),
])
def test_micro_batches_split_over_every_device_come_first(global_batch, devices, least, expected):
    assert [b for b, dp in _batches(PipelineOptions(global_batch=global_batch), devices, least)] == expected


def test_a_pinned_micro_batch_tries_the_widest_data_parallelism_first():
    pairs = _batches(PipelineOptions(global_batch=16, micro_batch=2), 8, 1)
    assert pairs == [(16, 8), (8, 4), (4, 2), (2, 1)]  # 2 samples per rank x dp, dp dividing 8 and 16 / 2


def test_a_search_stopped_after_one_combination_found_the_data_parallel_plan():
    cluster = make_cluster("a100-80gb", devices=8)
    cache = PipelineCostCache(graph_loader(GPT2, {"seq": 64}), cluster=cluster)
    stopped = search_pipeline(cache, options=PipelineOptions(global_batch=16, pipeline_sizes=(1,), recompute=("none",),
                                                             time_limit_s=1e-9))
    assert stopped.combinations == 1 and any("time limit" in note for note in stopped.notes)
    # the first combination is pp = 1 at 8 samples a micro-batch: dp = 8 with 1 sample per rank is in it
    assert {p.micro_batch_samples * p.dp for p in stopped.points} == {8}
    alone = estimate(cache, cluster=cluster, tp=1, pp=1, dp=8, micro_batch=1, global_batch=16, zero=0)
    assert stopped.points[0].time_s <= alone.point.time_s * (1 + 1e-9)


def test_a_pipeline_tries_the_most_micro_batches_first():
    # pp > 1: ascending samples per micro-batch (the least bubble first), pinned or not
    assert [b for b, _ in _batches(PipelineOptions(global_batch=16), 4, 1, pp=2)] == [1, 2, 4, 8, 16]
    assert _batches(PipelineOptions(global_batch=16, micro_batch=2), 4, 1, pp=2) == [(2, 1), (4, 2), (8, 4)]
