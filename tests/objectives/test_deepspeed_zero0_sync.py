"""DeepSpeed's ZeRO-0 gradient all-reduce as DeepSpeed 0.19.8 runs it (``exporters.deepspeed.zero_sync``): the engine's
``allreduce_gradients`` after the backward (``_backward_epilogue``; a ``PipelineEngine`` after the last micro-batch),
in 5e8-element buckets (``MEMORY_OPT_ALLREDUCE_SIZE``), in the gradients' dtype, nothing hidden; Megatron-LM's ZeRO-0
(DDP-style 25 MiB buckets beside backward) unchanged. Every expected number is a ring's bytes over bandwidth plus its
latencies, by hand (the package's side: tests/integration/test_deepspeed_zero_sync.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exporters.deepspeed import TARGET as DEEPSPEED
from exporters.deepspeed.zero_sync import BUCKET_ELEMENTS, zero_sync
from objectives.cluster import make_cluster
from objectives.intra_op import (
    GRAD_BUCKET_BYTES, CommTerm, bucketed_grad_sync_s, grad_bucket_bytes, hidden_under_backward, reductions_overlap_backward,
)
from planner.core.cluster import Link
from planner.core.settings import TrainingSettings, ZeroSync
from planner.pipeline import evaluate_pipeline
from tests.objectives.test_deepspeed_zero_sync import KAPPA, _exposed, _ops_by_hand, _plan, cache  # noqa: F401 - the fixture

MEGATRON_BUCKET_BYTES = 25 * 2**20  # PyTorch DDP's bucket_cap_mb, the pricing's own ZeRO-0 bucket


def _megatron_zero0(op: dict) -> float:
    """Megatron-LM / DDP: the all-reduce (twice a ring's pass, 2 (n-1) alphas per tensor, a 25 MiB bucket's share of
    them) beside the op's backward."""
    share = min(1.0, op["bytes"] / MEGATRON_BUCKET_BYTES)
    return _exposed(2 * op["ring"] + share * op["tensors"] * 2 * op["hop"], op["backward"])


def _deepspeed_zero0(op: dict) -> float:
    """DeepSpeed: the same all-reduce whole after the backward, a 5e8-element (bf16: 1e9-byte) bucket's share of the
    latencies."""
    share = min(1.0, op["bytes"] / (BUCKET_ELEMENTS * 2))
    return 2 * op["ring"] + share * op["tensors"] * 2 * op["hop"]


class TestTheRule:
    @pytest.mark.parametrize("precision", ["bf16-mixed", "fp32"])
    def test_every_zero0_plan_reduces_after_the_backward(self, precision):
        rule = zero_sync(zero_stage=0, precision=precision)
        assert rule == ZeroSync(bucket_elements=500_000_000, reduction="all_reduce",
                                reduction_overlaps_backward=False, gather_overlaps_forward=False)
        assert not reductions_overlap_backward(TrainingSettings(zero_stage=0, precision=precision, zero_sync=rule))
        assert reductions_overlap_backward(TrainingSettings(zero_stage=0, precision=precision))  # Megatron-LM's

    def test_a_rule_does_not_reach_zero3(self):
        rule = zero_sync(zero_stage=0, precision="bf16-mixed")
        assert reductions_overlap_backward(TrainingSettings(zero_stage=3, zero_sync=rule))


class TestOneOpByHand:
    @pytest.mark.parametrize("precision, element", [("bf16-mixed", 2), ("fp32", 4)])
    def test_the_bucket_is_in_the_gradients_dtype(self, precision, element):
        """One 8M-parameter weight over 8 ranks on a 100 GB/s link: the all-reduce moves 2 x 7/8 of its gradient
        bytes (2 B per element in bf16, 4 in fp32: DeepSpeed's communication_data_type defaults to the gradients'),
        and pays 14 alphas times its share of a 5e8-element bucket; Megatron-LM's 25 MiB bucket pays them whole."""
        link = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=1e-5)
        cluster = dataclasses.replace(make_cluster("a100-80gb", devices=8), intra_link=link, inter_link=link)
        nbytes = 8e6 * element
        term = CommTerm(kind="grad_sync", collective="all_reduce", tensor="w", intra_size=np.array([8]),
                        inter_size=np.array([1]), num_bytes=np.array([nbytes]))
        settings = TrainingSettings(zero_stage=0, precision=precision, zero_sync=zero_sync(zero_stage=0, precision=precision))
        bucket = grad_bucket_bytes([term], settings)
        assert bucket == 500_000_000 * element
        assert grad_bucket_bytes([term], TrainingSettings(zero_stage=0, precision=precision)) == GRAD_BUCKET_BYTES
        ring = 7 / 8 * nbytes / (100e9 * link.collective_efficiency)
        whole = bucketed_grad_sync_s([term], cluster=cluster, size=1, bucket_bytes=bucket)["intra"][0]
        assert whole == pytest.approx(2 * ring + 14 * 1e-5 * nbytes / (500_000_000 * element))
        megatron = bucketed_grad_sync_s([term], cluster=cluster, size=1, bucket_bytes=GRAD_BUCKET_BYTES)["intra"][0]
        assert megatron == pytest.approx(2 * ring + 14 * 1e-5 * min(1.0, nbytes / 25 / 2**20))  # 32 MB fills one
        backward = np.array([1.0])  # a second of backward would hide it: Megatron-LM keeps its contention only
        assert hidden_under_backward({"intra": np.array([megatron])}, backward_s=backward)["intra"][0] == pytest.approx(
            KAPPA * megatron)


class TestRowsByHand:
    def test_deepspeed_zero0_row_against_megatrons(self, cache):
        """The same ZeRO-0 plan on the 2-layer GPT over 8 ranks: DeepSpeed's row is Megatron-LM's plus, per op, its
        whole all-reduce less Megatron-LM's overlapped one (a one-stage step adds the per-step syncs); same memory."""
        plan = _plan(cache, 0)
        megatron = evaluate_pipeline(cache, **plan)
        deepspeed = evaluate_pipeline(cache, **plan, zero_sync=DEEPSPEED.zero_sync)
        ops = _ops_by_hand(cache, plan["choice"])
        assert len(ops) == 14 and sum(op["bytes"] for op in ops) == 2 * (172_288 - 128 * 64)
        expected = sum(_deepspeed_zero0(op) - _megatron_zero0(op) for op in ops)
        assert expected > 0.0
        assert deepspeed.time_s - megatron.time_s == pytest.approx(expected, rel=1e-9)
        assert deepspeed.zero_sync == zero_sync(zero_stage=0, precision="bf16-mixed") and megatron.zero_sync is None
        assert deepspeed.memory_bytes == megatron.memory_bytes  # a time rule only

    def test_the_search_and_the_listing(self, cache):
        """DeepSpeed's search prices its ZeRO-0 rows under its rule and records it; Megatron-LM's ZeRO-0 row on more
        than one data-parallel rank (its all-reduce beside backward) is not DeepSpeed's, nor DeepSpeed's Megatron-LM's."""
        from exporters import export
        from exporters.targets import runnable_plan_targets
        from planner.core.errors import UnsupportedExport
        from planner.pipeline import PipelineOptions, pipeline_search, point_plan_input  # noqa: I001

        options = PipelineOptions(global_batch=8, micro_batch=1, pipeline_sizes=(1,), zero_stages=(0,), recompute=("none",),
                                  memory_search_steps=0)
        ours = pipeline_search(cache, cluster=cache.cluster, options=options, target="deepspeed").points
        rule = zero_sync(zero_stage=0, precision="bf16-mixed")
        assert any(p.dp > 1 for p in ours) and all(p.zero_sync == (rule if p.dp > 1 else None) for p in ours)
        mine = point_plan_input(next(p for p in ours if p.dp > 1), cache)
        theirs = evaluate_pipeline(cache, **_plan(cache, 0))  # dp = 8, priced as Megatron-LM runs ZeRO-0
        assert theirs.dp == 8 and theirs.zero_sync is None
        other = point_plan_input(theirs, cache)
        assert mine.settings.zero_sync == rule and other.settings.zero_sync is None
        assert "deepspeed" in runnable_plan_targets([mine])[0] and "megatron" not in runnable_plan_targets([mine])[0]
        assert "deepspeed" not in runnable_plan_targets([other])[0]
        with pytest.raises(UnsupportedExport, match="synchronises ZeRO-0's gradients otherwise"):
            export("deepspeed", other)
        # the export writes no ZeRO key that would move the all-reduce (overlap_comm is a ZeRO-1+ key)
        assert export("deepspeed", mine)["ds_config"]["zero_optimization"] == {"stage": 0}
