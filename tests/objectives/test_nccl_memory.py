"""NCCL's ring buffers outside PyTorch's allocator (objectives/nccl_memory.py), counted by hand from
NCCL's defaults (src/init.cc, src/include/device.h): Simple 4 MiB, LL 8 x 512 x 8 x 16 bytes, LL128
120 x 640 x 8 x 8 bytes per connection, one connection per ring channel, 32 channels at most; and the
fidelity bench's per-row figure and its verdict with NCCL counted beside the live tensors."""

from __future__ import annotations

import dataclasses

import pytest

from objectives.nccl_memory import (
    NCCL_CONNECTION_BYTES,
    NCCL_LL128_BUFFSIZE,
    NCCL_LL_BUFFSIZE,
    NCCL_SIMPLE_BUFFSIZE,
    communicator_sizes,
    nccl_buffer_bytes,
)
from objectives.calibration import StepRow
from planner.calibrate import Priced

from tests.objectives.test_fidelity_bench import bench  # noqa: F401 - the bench module, a fixture

PER_CONNECTION = 4 * 1024 * 1024 + 524_288 + 4_915_200  # 9,633,792 bytes, by hand


def test_buffer_sizes_are_nccls_defaults():
    assert NCCL_SIMPLE_BUFFSIZE == 4_194_304
    assert NCCL_LL_BUFFSIZE == 524_288
    assert NCCL_LL128_BUFFSIZE == 4_915_200
    assert NCCL_CONNECTION_BYTES == PER_CONNECTION


def test_one_rank_holds_a_ring_connection_per_channel_of_each_communicator():
    # Megatron tp 4 x pp 12 x dp 8 (BLOOM's layout): three communicators of 32 channels
    assert communicator_sizes(tp=4, pp=12, dp=8) == (4, 12, 8)
    assert nccl_buffer_bytes(communicator_sizes(tp=4, pp=12, dp=8)) == pytest.approx(3 * 32 * PER_CONNECTION)
    # FSDP over 8 GPUs with cp 2: the cp group and the folded dp x cp gradient group
    assert communicator_sizes(cp=2, dp=4) == (2, 8)
    # one GPU: no peer, no buffers; 16 channels halve them
    assert nccl_buffer_bytes(communicator_sizes()) == 0.0
    assert nccl_buffer_bytes([8], channels=16) == pytest.approx(16 * PER_CONNECTION)
    with pytest.raises(ValueError, match="channels must be at least 1"):
        nccl_buffer_bytes([8], channels=0)


def test_the_bench_reports_them_and_counts_the_verdict_with_them_apart(bench):  # noqa: F811
    # 8 FSDP GPUs on the H100 preset (84,351,123,456 B: 85,017,755,648 exposed less the 666,632,192 B CUDA
    # context): one communicator, 308,281,344 bytes of buffers. 84.2 GB of live tensors fit alone and not
    # with them (84.508e9 > 84.351e9); 83.0 GB fit both ways.
    def row(id):
        return StepRow(id=id, model={"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100},
                       device="h100-sxm", devices=8, devices_per_node=8, dp=8, micro_batch=1, global_batch=8,
                       step_s=1.0, zero=3, split="holdout")

    priced = [Priced(row=row("close"), time_s=1.0, memory_bytes=92.6e9, allocated_bytes=84.2e9),
              Priced(row=row("roomy"), time_s=1.0, memory_bytes=91.3e9, allocated_bytes=83.0e9)]
    assert bench.nccl_bytes(priced[0].row) == pytest.approx(32 * PER_CONNECTION)
    result = bench.report(priced, split="holdout")
    assert result["false_does_not_fit"]["ids"] == []
    assert result["false_does_not_fit_with_nccl"]["ids"] == ["close"]
    assert [r["predicted_nccl_bytes"] for r in result["rows"]] == pytest.approx([32 * PER_CONNECTION] * 2)
    one_gpu = dataclasses.replace(row("one"), devices=1, dp=1)
    assert bench.nccl_bytes(one_gpu) == 0.0
