"""Launchers without an expert axis are not searched at ``ep > 1`` (:attr:`exporters._target.Target.expert_parallel`).

DTensor's (dp, tp) mesh and Mesh-TF's layouts keep every expert on each rank: their rules refuse any
plan at ``ep > 1``, so a search there builds stage models for rows that are all dropped. Oracle: the
same frontier with the narrowing switched off (every target marked as running experts), row for row.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters import targets as registry
from objectives.cluster import make_cluster
from planner import launchable
from planner.core.settings import TrainingSettings
from planner.launchable import launch_frontier
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest

MIXTRAL = Path(__file__).resolve().parents[1] / "data" / "mixtral_tiny.onnx"


def _searched(monkeypatch) -> tuple[list[tuple[str, int]], object]:
    """Plan the tiny Mixtral (4 experts) on 8 devices at global batch 4, recording each launcher search's (launcher,
    ep). (Batch 16 asked the same in twice the time: its frontier had 13 rows, this one 7, with ep = 1 and 4.)"""
    searched: list[tuple[str, int]] = []
    run = launchable._Searches.run

    def recording(self, cache, options, rules, report, seeds=(), **kwargs):
        searched.append((rules.name if rules is not None else "headroom", cache.settings.expert_parallel))
        return run(self, cache, options, rules, report, seeds, **kwargs)

    monkeypatch.setattr(launchable._Searches, "run", recording)
    loader = graph_loader(MIXTRAL, {"seq": 32})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=4), time_limit_s=1e6)
    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=4))
    return searched, frontier


def _rows(frontier) -> list[tuple]:
    return [(row.time_s, row.memory_bytes, row.degrees, row.targets) for row in frontier.rows]


def test_the_targets_without_an_expert_axis_refuse_every_ep_above_one():
    # the field says what the exporter's own settings rules say
    settings = TrainingSettings(expert_parallel=2)
    for name in ("dtensor", "meshtf"):
        assert not registry.TARGETS[name].expert_parallel
        assert not registry.TARGETS[name].runs_settings(settings)
    for name in ("megatron", "deepspeed", "torchtitan"):
        assert registry.TARGETS[name].expert_parallel


def test_no_search_without_an_expert_axis_at_ep_above_one_and_the_same_rows(monkeypatch):
    searched, frontier = _searched(monkeypatch)
    assert {ep for _, ep in searched} >= {1, 2}, searched  # experts are split for the launchers that can
    assert not [(name, ep) for name, ep in searched if name in ("dtensor", "meshtf") and ep > 1]
    assert any(name == "dtensor" for name, _ in searched) and any(name == "meshtf" for name, _ in searched)

    every = {name: dataclasses.replace(target, expert_parallel=True) for name, target in registry.TARGETS.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "TARGETS", every)
        unnarrowed, before = _searched(patch)
    assert [(name, ep) for name, ep in unnarrowed if name in ("dtensor", "meshtf") and ep > 1]
    assert _rows(frontier) == _rows(before)
