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
    connection_bytes,
    layout_buffer_bytes,
    nccl_buffer_bytes,
    net_p2p_bytes,
    pipeline_links,
    pipeline_peers,
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


def test_the_bench_counts_the_verdict_with_them_and_compares_the_allocator_without(bench):  # noqa: F811
    # 8 FSDP GPUs on the H100 preset (84,351,123,456 B: 85,017,755,648 exposed less the 666,632,192 B CUDA
    # context): one communicator, 308,281,344 bytes of buffers. 84.2 GB of live tensors fit alone and not
    # with them (84.508e9 > 84.351e9): a false "does not fit" of the verdict, none without them; 83.0 GB fit
    # both ways. The predicted memory held against a measured peak is the allocator's, without them.
    def row(id):
        return StepRow(id=id, model={"kind": "gpt", "layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100},
                       device="h100-sxm", devices=8, devices_per_node=8, dp=8, micro_batch=1, global_batch=8,
                       step_s=1.0, zero=3, split="holdout", memory_bytes=80e9)

    nccl = 32 * PER_CONNECTION
    priced = [Priced(row=row("close"), time_s=1.0, memory_bytes=92.6e9, allocated_bytes=84.2e9, nccl_bytes=nccl),
              Priced(row=row("roomy"), time_s=1.0, memory_bytes=91.3e9, allocated_bytes=83.0e9, nccl_bytes=nccl)]
    result = bench.report(priced, split="holdout")
    assert result["false_does_not_fit"]["ids"] == ["close"]
    assert result["false_does_not_fit_without_nccl"]["ids"] == []
    assert [r["predicted_nccl_bytes"] for r in result["rows"]] == pytest.approx([nccl] * 2)
    assert [r["predicted_reserved_bytes"] for r in result["rows"]] == [92.6e9, 91.3e9]  # the allocator's, no NCCL


def test_a_plan_prices_them_per_communicator_and_pipeline_peer():
    # a rank of tp 2 x dp 4 on an inner pipeline stage: tp and dp rings, two neighbours; the first stage one
    assert layout_buffer_bytes(tp=2, dp=4, p2p_peers=2) == pytest.approx(4 * 32 * PER_CONNECTION)
    assert pipeline_peers(4) == [1, 2, 2, 1] and pipeline_peers(2) == [1, 1]
    # expert parallelism 4 over dp 8: the dp ring, the expert-gradient ring of 2 and three all-to-all peers
    assert layout_buffer_bytes(dp=8, ep=4) == pytest.approx(5 * 32 * PER_CONNECTION)
    # a neighbour on another node: the network transport's two shared pools, 32 x 16 x 128 KiB each, for
    # all such peers together (src/transport/net.cc), in place of a connection on 32 channels
    assert net_p2p_bytes() == 2 * 32 * 16 * 131_072
    assert layout_buffer_bytes(dp=8, net_peer=True) == pytest.approx(32 * PER_CONNECTION + 134_217_728)
    # stages of 4 devices on 8-device nodes: the 0|1 and 2|3 boundaries inside a node, 1|2 across
    assert pipeline_links(4, devices_per_stage=4, devices_per_node=8) == [(1, False), (1, True), (1, True), (1, False)]
    assert pipeline_links(4, devices_per_stage=2, devices_per_node=8, interleaved=True) == [(2, False)] * 4
    assert pipeline_links(4, devices_per_stage=4, devices_per_node=8, interleaved=True)[0] == (1, True)
    # NCCL_BUFFSIZE=1 MiB: the Simple buffer shrinks, LL and LL128 stay
    assert connection_bytes(1 << 20) == 1_048_576 + 524_288 + 4_915_200
    assert layout_buffer_bytes(dp=2, buffsize=1 << 20) == pytest.approx(32 * (1_048_576 + 524_288 + 4_915_200))
