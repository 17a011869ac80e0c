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
from objectives.parameters import parameter_ownership
from tests.objectives.test_deepspeed_zero_sync import RANKS, KAPPA, _exposed, _ops_by_hand, _plan, cache  # noqa: F401 - the fixture
from tests.objectives.test_fsdp_memory import _replicated

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
                                reduction_overlaps_backward=False, gather_overlaps_forward=False,
                                pipeline_partitions_optimizer=precision == "bf16-mixed")  # BF16_Optimizer's, pp > 1
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


STAGE = RANKS // 2  # pp = 2 on the 8 ranks: 4 data-parallel ranks per stage
TABLES = (64_000, 8_192)  # gpt2_tiny's word table (1,000 x 64, tied to the head) and position table (128 x 64)
LAYER, FINAL_NORM = 49_984, 128  # one block's parameters; ln_f's


def _pipeline_plan(cache) -> dict:
    """Both layers of gpt2_tiny over 2 stages of 4 data-parallel ranks, every op replicated on its stage."""
    choice = _replicated(cache.model(STAGE, STAGE, 0, "none"), STAGE)
    return dict(pp=2, batch=STAGE, zero_stage=0, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=RANKS)


class TestPipelineBf16Optimizer:
    """Under bf16 with a PipelineModule at ZeRO-0, DeepSpeed's BF16_Optimizer partitions the fp32 master weights and
    Adam's moments over the stage's data-parallel ranks and gathers the updated bf16 partitions after the step
    (the package's side: tests/integration/test_bf16_optimizer.py)."""

    def test_the_optimizer_state_per_rank_by_hand(self, cache):
        """Stage 0 holds the word and position tables and block 0, stage 1 block 1, ln_f and the tied word table's
        copy. 12 B per parameter (fp32 master + 2 moments) over the 4 ranks, except the position table, which no
        configuration splits (one replica in the pricing's reading); the bf16 gradients gain a 2-byte accumulator."""
        plan = _pipeline_plan(cache)
        deepspeed = evaluate_pipeline(cache, **plan, zero_sync=DEEPSPEED.zero_sync, grad_accumulator=DEEPSPEED.grad_accumulator)
        megatron = evaluate_pipeline(cache, **plan)
        words, positions = TABLES
        held = (words + positions + LAYER, LAYER + FINAL_NORM + words)
        assert [s.memory.optimizer_bytes for s in deepspeed.stages] == [
            12 * (words + LAYER) / STAGE + 12 * positions, 12 * held[1] / STAGE]  # 440,256 and 342,336 B
        assert [s.memory.optimizer_bytes for s in megatron.stages] == [12 * held[0], 12 * held[1]]
        assert [s.memory.params_bytes for s in deepspeed.stages] == [2 * n for n in held]
        assert [s.memory.grads_bytes for s in deepspeed.stages] == [(2 + 2) * n for n in held]
        assert deepspeed.zero_stage == 0 and deepspeed.grad_accumulator_bytes == 2.0

    def test_priced_as_its_zero1_row_but_the_accumulator(self, cache):
        """Same traffic and the same partitioned step as the export's ZeRO-1 (BF16_Optimizer with fp32 accumulation):
        the same seconds; the ZeRO-1 row holds 2 B more per parameter (its accumulator in fp32)."""
        plan = _pipeline_plan(cache)
        rules = dict(zero_sync=DEEPSPEED.zero_sync, grad_accumulator=DEEPSPEED.grad_accumulator)
        zero0 = evaluate_pipeline(cache, **plan, **rules)
        zero1 = evaluate_pipeline(cache, **{**plan, "zero_stage": 1}, **rules)
        assert zero0.time_s == zero1.time_s
        for a, b in zip(zero0.stages, zero1.stages):
            assert (a.memory.optimizer_bytes, a.grad_sync_s) == (b.memory.optimizer_bytes, b.grad_sync_s)
            assert b.memory.grads_bytes - a.memory.grads_bytes == a.memory.params_bytes  # (4 - 2) B x parameters

    def test_the_gather_after_the_step_by_hand(self, cache):
        """Per op of stage 0's model, the synchronisation the rule adds over the same all-reduce without it: the
        updated parameters' ring all-gather over the 4 ranks, (n-1)/n of its bf16 bytes over the link plus
        (n-1) alphas per tensor times its share of a 5e8-element bucket, whole after the step."""
        rule = zero_sync(zero_stage=0, precision="bf16-mixed")
        plan, link = _pipeline_plan(cache), cache.cluster.intra_link
        picks = np.asarray(plan["choice"])

        def sync_s(which) -> np.ndarray:
            arrays = cache.arrays(STAGE, STAGE, 0, "none", zero_sync=which)
            at = arrays.offsets + picks
            return arrays.flat["step_s"][at] - arrays.flat["update_s"][at]  # the step less the optimizer's update

        added = sync_s(rule) - sync_s(dataclasses.replace(rule, pipeline_partitions_optimizer=False))
        model = cache.model(STAGE, STAGE, 0, "none")
        expected = np.zeros(len(picks))
        for index, positions in enumerate(parameter_ownership(model.graph)):
            op = model.graph.ops[index]
            sizes = [2.0 * float(np.prod(model.graph.tensors[op.inputs[p].tensor].shape)) for p in positions]
            if sizes and any(d.is_batch for d in op.dims):  # the position table is on no group
                ring = sum(sizes) * (STAGE - 1) / STAGE / link.collective_bandwidth_bytes_per_s
                share = min(1.0, sum(sizes) / (BUCKET_ELEMENTS * 2))  # the bf16 gradient bytes of a 1e9-byte bucket
                expected[index] = ring + share * len(sizes) * (STAGE - 1) * link.latency_s
        assert np.count_nonzero(expected) == 14
        np.testing.assert_allclose(added, expected, rtol=1e-9, atol=1e-15)

    def test_only_under_a_pipeline_and_bf16(self, cache):
        """One stage (FP16_Optimizer over bf16) keeps every state whole, as fp32's bare optimizer does at any pp."""
        one = evaluate_pipeline(cache, **_plan(cache, 0), zero_sync=DEEPSPEED.zero_sync)
        assert one.memory_bytes == evaluate_pipeline(cache, **_plan(cache, 0)).memory_bytes
        assert not zero_sync(zero_stage=0, precision="fp32").pipeline_partitions_optimizer
        assert not zero_sync(zero_stage=1, precision="bf16-mixed").pipeline_partitions_optimizer

    def test_the_search_lists_zero0_where_it_holds_less(self, cache):
        """DeepSpeed's pipelined ZeRO-0 costs its ZeRO-1's seconds with 2 B per parameter less, so its search prices
        ZeRO-0 apart (not as ZeRO-1's leaner twin) and lists it where ZeRO-1 would have stood."""
        from planner.pipeline import PipelineOptions, pipeline_search

        options = PipelineOptions(global_batch=RANKS, micro_batch=1, pipeline_sizes=(2,), zero_stages=(0, 1),
                                  recompute=("none",), memory_search_steps=0)
        points = pipeline_search(cache, cluster=cache.cluster, options=options, target="deepspeed").points
        assert points and {p.zero_stage for p in points} == {0}
        zero1 = evaluate_pipeline(cache, **{**_pipeline_plan(cache), "zero_stage": 1}, zero_sync=DEEPSPEED.zero_sync,
                                  grad_accumulator=DEEPSPEED.grad_accumulator)
        assert any(p.time_s <= zero1.time_s and p.memory_bytes < zero1.memory_bytes for p in points)
