"""A search that only informs prunes to its fastest plan that fits (issue 22, seventeenth speed round; h31b).

The launchable table's headroom search (``search_pipeline(informs=True)``) is read for one plan only, the
fastest that fits (``PipelineResult.best``, ``planner.launchable._headroom``). So once it has found a plan that
fits in ``t`` seconds, every combination whose step-time lower bound is above ``t`` holds no plan it could
report, whatever that combination's memory (``planner.search.running_frontier._Frontier.fastest_only``). The
oracle: the same search without pruning (every combination priced), whose fastest plan within the limit must be
the informing search's, to the bit, at several memory limits; and the rule must prune something there (fewer
intra-op searches than the same search as a launcher's), or the comparison would show nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from objectives.cluster import make_cluster
from planner.launchable import _headroom_seeds
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.search.pipeline import search_pipeline

ROOT = Path(__file__).resolve().parents[2]


def _identity(point):
    """Everything the headroom line reads of a plan, and its choice."""
    return (point.time_s, point.memory_bytes, point.summary, point.pp, point.micro_batch_samples, point.zero_stage,
            point.recompute, tuple(int(c) for c in point.choice), tuple(s.layers for s in point.stages))


def test_an_informing_search_finds_the_unpruned_searchs_fastest_plan_that_fits():
    loader = graph_loader(ROOT / "tests" / "data" / "gpt2_tiny.onnx", {"seq": 16})
    cluster = make_cluster("a100-80gb", devices=8, devices_per_node=4)
    options = PipelineOptions(global_batch=16)
    every = search_pipeline(PipelineCostCache(loader, cluster=cluster), options=dataclasses.replace(options, prune=False))
    memories = sorted(p.memory_bytes for p in every.points)
    assert len(memories) >= 4  # a frontier to cut: the fastest plan does not fit below its memory
    fewer = []
    for limit in (memories[len(memories) // 2], memories[-2]):  # (each limit: four searches)
        oracle = search_pipeline(PipelineCostCache(loader, cluster=cluster), memory_limit_bytes=limit,
                                 options=dataclasses.replace(options, prune=False))
        assert oracle.best is not None and oracle.best.time_s > every.points[0].time_s
        launcher = search_pipeline(PipelineCostCache(loader, cluster=cluster), options=options, memory_limit_bytes=limit)
        informs = search_pipeline(PipelineCostCache(loader, cluster=cluster), options=options, memory_limit_bytes=limit,
                                  informs=True)
        assert _identity(informs.best) == _identity(oracle.best)
        # seeded as the headroom search is: the table's pick (slower) and the limit
        seeded = search_pipeline(PipelineCostCache(loader, cluster=cluster), options=options, memory_limit_bytes=limit,
                                 informs=True, seeds=_headroom_seeds(oracle.best.time_s * 1.5, limit))
        assert _identity(seeded.best) == _identity(oracle.best)
        fewer.append(informs.intra_op_searches < launcher.intra_op_searches)
    assert any(fewer)  # the rule prunes here (before it, both searches ran the same intra-op searches)
