"""NCCL's buffers as a term of every plan's memory (objectives/nccl_memory.py, objectives/pipeline_price.py):
counted by hand from NCCL's defaults (Simple 4 MiB, LL 8 x 512 x 8 x 16, LL128 120 x 640 x 8 x 8 bytes per
connection and channel, 32 channels), per collective group with a peer and per pipeline neighbour; in the
fit check, the refusal's words, the JSON breakdown, and a saved plan priced again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import exporters
from objectives.cluster import make_cluster
from planner.estimate import estimate
from planner.launch_messages import fit_message, tight_pick
from planner.pipeline import PipelineCostCache, graph_loader, point_plan_input
from planner.render import _memory_json

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, 4 heads, FFN 256

PER_CONNECTION = 4 * 1024 * 1024 + 524_288 + 4_915_200  # 9,633,792 bytes per channel, by hand
PER_GROUP = 32 * PER_CONNECTION  # 308,281,344 bytes: one ring (or one pipeline peer) on 32 channels


@pytest.fixture(scope="module")
def at_batch():
    return graph_loader(TINY, {"seq": 128})


def _estimate(at_batch, cluster, **layout):
    cache = PipelineCostCache(at_batch, cluster=cluster)
    result = estimate(cache, cluster=cluster, micro_batch=1, global_batch=16, **layout)
    assert result.valid, result.reason
    return result, cache


def test_a_dp_tp_pp_row_by_hand(at_batch):
    # dp 2 x tp 2 x pp 2 on 8 A100s: each rank is in a tensor-parallel ring, a gradient ring and has one
    # pipeline neighbour (two stages: the same peer forward and back): 3 x 32 x 9,633,792 = 924,844,032 B
    result, _ = _estimate(at_batch, make_cluster("a100-80gb", devices=8), tp=2, pp=2)
    assert (result.point.dp, result.point.tp, result.point.pp) == (2, 2, 2)
    for stage in result.point.stages:
        assert stage.memory.nccl_bytes == 924_844_032
    memory = result.memory
    assert memory.nccl_bytes == 924_844_032 == 3 * PER_GROUP
    # a term of the whole: the allocator's part and NCCL's add up to the plan's memory per device
    assert memory.total_bytes == pytest.approx(result.memory_bytes, rel=1e-12)
    assert memory.allocator_bytes + memory.nccl_bytes == pytest.approx(result.memory_bytes, rel=1e-12)
    assert memory.allocated_bytes == pytest.approx(memory.allocator_bytes - memory.other_bytes, rel=1e-12)
    assert _memory_json(memory)["nccl_buffers"] == 924_844_032


def test_each_stage_and_nccl_buffsize(at_batch):
    # dp 2 x pp 2 on 4 devices: a gradient ring and one neighbour per rank (gpt2_tiny's two layers: two
    # stages at most; inner stages' two neighbours: tests/objectives/test_nccl_memory.py)
    result, _ = _estimate(at_batch, make_cluster("a100-80gb", devices=4), tp=1, pp=2)
    assert [s.memory.nccl_bytes for s in result.point.stages] == [2 * PER_GROUP] * 2
    # NCCL_BUFFSIZE=1 MiB (a cluster file's nccl_buffsize): the Simple buffer shrinks, LL and LL128 stay
    small = dataclasses.replace(make_cluster("a100-80gb", devices=4), nccl_buffsize_bytes=1 << 20)
    result, _ = _estimate(at_batch, small, tp=1, pp=2)
    assert result.memory.nccl_bytes == 2 * 32 * (1_048_576 + 524_288 + 4_915_200)
    # one device: no peer, no buffers
    one, _ = _estimate(at_batch, make_cluster("a100-80gb", devices=1), tp=1, pp=1)
    assert one.memory.nccl_bytes == 0.0


def test_a_plan_that_fits_only_without_them_is_refused_naming_them(at_batch):
    cluster = make_cluster("a100-80gb", devices=8)
    result, _ = _estimate(at_batch, cluster, tp=2, pp=2)
    memory = result.memory
    between = memory.allocator_bytes + memory.nccl_bytes / 2  # over the plan, under it without NCCL's buffers
    cache = PipelineCostCache(at_batch, cluster=cluster)
    limited = estimate(cache, cluster=cluster, tp=2, pp=2, micro_batch=1, global_batch=16, memory_limit_bytes=between)
    assert limited.valid and not limited.point.fits and result.point.fits
    row = SimpleNamespace(point=limited.point, memory_bytes=limited.memory_bytes, summary="dp=2 x tp=2 x pp=2")
    message = fit_message([row], between, ("megatron",))
    assert "would fit but for NCCL's buffers (882.00 MiB" in message and "nccl_buffsize" in message
    # the tight pick (no --mem-limit) needs the live tensors and NCCL's buffers on the device, not the reserve
    assert tight_pick([row], memory.allocated_bytes + memory.nccl_bytes) == 0
    assert tight_pick([row], memory.allocated_bytes + memory.nccl_bytes / 2) is None


def test_a_saved_plan_prices_again_to_the_same_bytes(at_batch, tmp_path):
    from planner.repriced import reprice_saved

    cluster = dataclasses.replace(make_cluster("a100-80gb", devices=8), nccl_buffsize_bytes=2 << 20)
    result, cache = _estimate(at_batch, cluster, tp=2, pp=2)
    document = exporters.export("generic", point_plan_input(result.point, cache))
    document["model"]["source_path"] = str(TINY)
    assert document["cluster"]["nccl_buffsize_bytes"] == 2 << 20
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(document))
    again = reprice_saved(saved)
    assert again.point.memory_bytes == pytest.approx(result.memory_bytes, rel=1e-12)
    assert again.point.memory.nccl_bytes == 3 * 32 * ((2 << 20) + 524_288 + 4_915_200)


def test_a_cluster_file_sets_nccl_buffsize(tmp_path):
    from objectives.cluster import load_cluster
    from planner.core.errors import InputError

    path = tmp_path / "c.yaml"
    path.write_text("device: h100-sxm\nnodes: 1\nnccl_buffsize: 1MiB\n")
    assert load_cluster(path).nccl_buffsize_bytes == 1_048_576
    path.write_text("device: h100-sxm\nnodes: 1\nnccl_buffsize: 2097152\n")
    assert load_cluster(path).nccl_buffsize_bytes == 2_097_152
    path.write_text("device: h100-sxm\nnodes: 1\n")
    assert load_cluster(path).nccl_buffsize_bytes == 4_194_304  # NCCL's DEFAULT_BUFFSIZE
    path.write_text("device: h100-sxm\nnodes: 1\nnccl_buffsize: 0\n")
    with pytest.raises(InputError, match="nccl_buffsize must be a positive number of bytes"):
        load_cluster(path)
