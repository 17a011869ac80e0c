"""The one-stage time floor bounds only the plans it is the optimum of (issue 22; 2026-12-02, h30i).

At ``pp = 1`` the search bounds every later ZeRO group of a micro-batch by the DP optimum of the first
(:attr:`planner.search.pipeline._Slot.time_floor`). Where the 0-1 group is split (some op's tree all-reduce
across nodes beats ZeRO-1's rings), the first group is ZeRO-0's alone, and its optimum need not bound ZeRO-1's or
ZeRO-2's plans: on GPT-3 175B / 1,024 A100s, Megatron-LM's rules, ZeRO-0's optimum of the 1,536-sample
micro-batch is 17.67 s (each rank steps the optimizer over its whole ``tp = 2`` shard of the weights), while a
ZeRO-2 plan of it takes 16.850103968417404 s at 324 GB. The old floor pruned that plan whenever another
micro-batch's point dominated (17.67 s, its memory bound), so the answer hung on which points were found
first: with every pipeline size searched the plan was listed (its bound checked before such a point was
found), with ``--pp 1`` it was not, and ``planner plan``'s table depended on the cost cache's history
(docs/PERFORMANCE.md, sixteenth round). The oracle: the same search without pruning, which prices every
combination (pruning only skips combinations whose points are provably dominated, so the two frontiers must
be equal, every point to the bit).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader, pipeline_search

ROOT = Path(__file__).resolve().parents[2]
GPT3_175B = ROOT / "examples" / "large" / "gpt3_175b.onnx"


@pytest.mark.slow
def test_pruned_search_at_one_stage_lists_what_the_unpruned_one_lists():
    from planner.core.settings import TrainingSettings

    cluster = make_cluster("a100-80gb", devices=1024, devices_per_node=8)
    cache = PipelineCostCache(graph_loader(GPT3_175B, {"seq": 2048}), cluster=cluster,
                              settings=TrainingSettings(engine="fused", attention="flash"))
    options = PipelineOptions(global_batch=1536, pipeline_sizes=(1,), recompute=("none",), zero_stages=(0, 1, 2),
                              fill_pipeline=False)
    plain, pruned = (
        pipeline_search(cache, cluster=cluster, options=dataclasses.replace(options, prune=prune), target="megatron")
        for prune in (False, True)
    )
    assert pruned.pruned > 0 and plain.pruned == 0
    assert [(p.time_s, p.memory_bytes, p.summary) for p in pruned.points] == [
        (p.time_s, p.memory_bytes, p.summary) for p in plain.points
    ]
    fastest = pruned.points[0]  # the plan the old floor pruned
    assert (fastest.zero_stage, fastest.dp, fastest.tp, fastest.micro_batch_samples) == (2, 512, 2, 1536)
