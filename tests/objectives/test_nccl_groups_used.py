"""NCCL's buffers for the groups a plan's ranks form, not its stage's (objectives.nccl_memory.plan_groups,
2026-12-02, h29f): a plan that leaves devices of its stage idle builds no communicator over them. Bytes counted
by hand from NCCL's defaults (Simple 4 MiB, LL 8 x 512 x 8 x 16, LL128 120 x 640 x 8 x 8 bytes per connection and
channel, 32 channels): 308,281,344 B per ring a rank joins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.pipeline_price import evaluate_pipeline
from planner.estimate import estimate
from planner.pipeline import PipelineCostCache, graph_loader
from planner.render import _memory_json

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, 4 heads, FFN 256
PER_GROUP = 32 * (4 * 1024 * 1024 + 524_288 + 4_915_200)  # 308,281,344 B, by hand
BATCH = 8


@pytest.fixture(scope="module")
def at_batch():
    return graph_loader(TINY, {"seq": 128})


def _cache(at_batch, devices: int) -> PipelineCostCache:
    return PipelineCostCache(at_batch, cluster=make_cluster("a100-80gb", devices=devices))


def _same_splits(source: PipelineCostCache, choice, target: PipelineCostCache) -> list[int]:
    """``choice`` (a plan on ``source``'s devices) as the configurations of ``target``'s larger stage: the same
    factors and copies per op (an op copied on every device of the smaller stage runs once where the larger stage
    has no such number of copies: the whole stage's copies only, ``planner.core.configs``), the other devices idle."""
    src = source.arrays(source.cluster.devices, BATCH, 0, "none").spaces
    dst = target.arrays(target.cluster.devices, BATCH, 0, "none").spaces
    rows = []
    for s, d, c in zip(src, dst, choice):
        same = np.all(d.factors == s.factors[c], axis=1)
        copies = same & (d.replica_counts == s.replica_counts[c])
        rows.append(int(np.flatnonzero(copies if copies.any() else same & (d.replica_counts == 1))[0]))
    return rows


def _priced(cache: PipelineCostCache, choice, limit: float | None = None):
    layers = cache.structure(BATCH).num_layers
    return evaluate_pipeline(cache, pp=1, batch=BATCH, zero_stage=0, recompute="none", choice=choice,
                             bounds=(0, layers), global_batch=BATCH, memory_limit_bytes=limit)


def _layout(at_batch, devices: int, tp: int):
    cache = _cache(at_batch, devices)
    result = estimate(cache, cluster=cache.cluster, tp=tp, pp=1, micro_batch=BATCH * tp // devices, global_batch=BATCH)
    assert result.valid, result.reason
    return cache, result.point


def test_a_one_device_plan_on_two_devices_holds_no_ring(at_batch):
    cache = _cache(at_batch, 2)
    spaces = cache.arrays(2, BATCH, 0, "none").spaces
    one = [int(np.flatnonzero((s.devices_held == 1))[0]) for s in spaces]
    point = _priced(cache, one)
    assert (point.dp, point.tp) == (1, 1)
    assert point.memory.nccl_bytes == 0.0  # before h29f: a dp ring of the stage's 2 devices, 308,281,344 B
    # the same plan on one device costs the same bytes: nothing of it sees the idle device
    alone = _priced(_cache(at_batch, 1), [0] * len(one))
    assert point.memory_bytes == pytest.approx(alone.memory_bytes, rel=1e-12)


@pytest.mark.parametrize("devices,tp,groups", [(2, 1, 1), (4, 2, 2)])
def test_dp_and_tp_rows_by_hand_alone_and_with_idle_devices(at_batch, devices, tp, groups):
    # dp=2 on 2 devices: the gradient ring; tp=2 x dp=2 on 4: a tensor ring and a gradient ring
    cache, point = _layout(at_batch, devices, tp)
    assert (point.dp, point.tp) == (devices // tp, tp)
    assert point.memory.nccl_bytes == groups * PER_GROUP
    # the same per-op splits on a stage of 8 devices, half or more of them idle: the same groups, not the stage's
    wide = _cache(at_batch, 8)
    moved = _priced(wide, _same_splits(cache, point.choice, wide))
    assert (moved.dp, moved.tp) == (point.dp, point.tp)
    assert moved.memory.nccl_bytes == groups * PER_GROUP  # before h29f: tp=2 x dp=4 or dp=8's rings
    assert _memory_json(moved.memory)["nccl_buffers"] == groups * PER_GROUP


def test_the_fit_check_and_the_printed_memory_agree(at_batch):
    cache, point = _layout(at_batch, 4, 2)
    memory = point.memory
    assert memory.total_bytes == pytest.approx(point.memory_bytes, rel=1e-12)
    assert _memory_json(memory)["nccl_buffers"] == memory.nccl_bytes == 2 * PER_GROUP
    wide = _cache(at_batch, 8)
    choice = _same_splits(cache, point.choice, wide)
    between = memory.allocator_bytes + PER_GROUP  # above the plan with two rings' worth less, below with them
    assert not _priced(wide, choice, limit=between).fits
    assert _priced(wide, choice, limit=memory.allocator_bytes + 2 * PER_GROUP + 1.0).fits
