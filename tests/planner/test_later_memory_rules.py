"""A launcher's search keeps its bounds for the later searches over its cache under their memory rules only
(issue 22, speed): Megatron-LM's search bounded every released pair under its own rules (the sequence shard, the
fused SwiGLU) and without them, and no later search over its cache (DeepSpeed's, the headroom search) reads the
first (``planner.launchable``: ``PipelineCostCache.later_memory_rules``; ``planner.search.pipeline._Slot.keep_own_bounds``).
The oracle is the frontier with every rule set kept, as before: the same rows, pick and headroom line."""

from __future__ import annotations

from pathlib import Path

import pytest

import planner.launchable
from objectives.cluster import make_cluster
from planner.launchable import launch_frontier
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest
from planner.search import pipeline as search

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"  # 2 layers, hidden 64, SwiGLU


def _frontier():
    # complete searches (no time limit reached), so the two frontiers can be compared; every row, uncollapsed (each
    # holds ~308 MB of NCCL's buffers, so the 1% collapse leaves one row of this tiny model)
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=16, devices_per_node=8), time_limit_s=1200)
    return launch_frontier(graph_loader(LLAMA, {"seq": 64}), request,
                           options=PipelineOptions(global_batch=8, pipeline_sizes=(1, 2)), collapse=0.0)


def _rows(frontier) -> list[tuple]:
    return [(r.time_s, r.memory_bytes, r.point.summary, r.targets) for r in frontier.rows]


def test_bounds_kept_under_the_later_searches_rules_change_no_row(monkeypatch):
    # the models' states "exceed a device": every search releases its pairs, and bounds are kept for the next
    monkeypatch.setattr(planner.launchable, "states_exceed_a_device", lambda graph, request: True)
    original, seen = search._Slot.keep_own_bounds, []

    def spy(slot, groups, recompute):
        seen.append((slot.search.rules.name, slot.search.pricing.later_memory_rules))
        return original(slot, groups, recompute)

    monkeypatch.setattr(search._Slot, "keep_own_bounds", spy)
    ours = _frontier()
    # Megatron-LM's cache is read after it by DeepSpeed's search and the headroom search, neither under memory rules
    assert ("megatron", frozenset({(False, False)})) in seen
    assert all(later is not None for _, later in seen)

    def unknown(slot, groups, recompute):  # as before: under the search's own rules and without any
        slot.search.pricing.later_memory_rules = None
        return original(slot, groups, recompute)

    monkeypatch.setattr(search._Slot, "keep_own_bounds", unknown)
    oracle = _frontier()
    assert _rows(ours) == _rows(oracle) and len(ours.rows) > 1
    assert ours.chosen == oracle.chosen and ours.headroom == oracle.headroom
