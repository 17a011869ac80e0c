"""FSDP2 / ZeRO-3 unsharded units (``objectives.memory.fsdp_unsharded_peak``, added per stage by
``objectives.pipeline_price``): the bytes counted by hand for small unit lists and for the 2-layer GPT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import objectives.pipeline_price as pipeline_price
from objectives.cluster import make_cluster
from objectives.memory import OTHER_FRACTION, REDUCE_BYTES, StateBytes, UnshardedPeak, fsdp_unsharded_peak
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader

BF16 = StateBytes(param=2.0, grad=2.0, optimizer=12.0)  # bf16-mixed + Adam
FP32 = StateBytes(param=4.0, grad=4.0, optimizer=8.0)

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000, tied head
# gpt2_tiny's parameters by unit, elements (read off the ONNX initializers), those ZeRO-3 shards: the
# position table wpe (128 x 64) is held whole (its lookup has no batch dim, so no configuration
# divides it: tests/objectives/test_memory.py's WPE) and gathers nothing
EMBEDDING = 1000 * 64  # the tied wte / lm_head (the embedding op owns it) = 64,000
BLOCK = (2 * 64) + (64 * 192 + 192) + (64 * 64 + 64) + (2 * 64) + (64 * 256 + 256) + (256 * 64 + 64)  # 49,984
HEAD = 2 * 64  # ln_f; the head's weight is the embedding's


class TestPeakByHand:
    def test_reduce_dtype_is_fp32(self):
        assert REDUCE_BYTES == 4.0

    def test_no_units(self):
        assert fsdp_unsharded_peak([], kept=[], per=BF16) == UnshardedPeak(params_bytes=0.0, grads_bytes=0.0)

    def test_two_units_whole_and_one_units_gradient_buffers(self):
        # units 10, 40, 20, 30 bytes of bf16; none kept. Backward of unit i holds u_i + u_(i-1) and
        # u_i x (2 + 4) / 2 of gradient + fp32 reduce-scatter input:
        # i=3: 30+20 + 90 = 140; i=2: 20+40 + 60 = 120; i=1: 40+10 + 120 = 170; i=0: 10 + 30 = 40
        peak = fsdp_unsharded_peak([10.0, 40.0, 20.0, 30.0], kept=[False] * 4, per=BF16)
        assert peak == UnshardedPeak(params_bytes=50.0, grads_bytes=120.0)

    def test_a_kept_unit_stays_until_its_backward(self):
        # unit 0 kept (not resharded after forward): whole while units 3 and 2 run backward, as
        # well as its own: i=3: 30+20+10 + 90 = 150; i=2: 20+40+10 + 60 = 130; i=1: 40+10 + 120 = 170
        peak = fsdp_unsharded_peak([10.0, 40.0, 20.0, 30.0], kept=[True, False, False, False], per=BF16)
        assert peak.total_bytes == 170.0
        big_last = fsdp_unsharded_peak([100.0, 1.0, 1.0, 1.0], kept=[True, False, False, False], per=BF16)
        # i=3: 1+1+100 + 3 = 105; i=0: 100 + 300 = 400
        assert big_last == UnshardedPeak(params_bytes=100.0, grads_bytes=300.0)

    def test_accumulation_keeps_every_unit_and_its_fp32_gradient(self):
        # a pipeline stage with several micro-batches: every unit whole (60) and, at unit i's
        # backward, the accumulated fp32 gradients of units >= i (2x their bf16 bytes) plus unit
        # i's buffers: i=2: 30 x 3 + 30 x 2 = 150; i=1: 20 x 3 + 50 x 2 = 160; i=0: 10 x 3 + 60 x 2 = 150
        peak = fsdp_unsharded_peak([10.0, 20.0, 30.0], kept=[True] * 3, per=BF16, accumulate=True)
        assert peak == UnshardedPeak(params_bytes=60.0, grads_bytes=160.0)

    def test_fp32_parameters(self):
        # fp32: gradient and reduce-scatter input are each the unit's size: 40 + 40 + 2 x 40
        peak = fsdp_unsharded_peak([40.0, 40.0], kept=[False, False], per=FP32)
        assert peak == UnshardedPeak(params_bytes=80.0, grads_bytes=80.0)


def _replicated(model, devices: int) -> np.ndarray:
    """Every op data-parallel over ``devices`` (each parameter whole on every device), else config 0."""
    choice = []
    for op, space in zip(model.graph.ops, model.tables.configs):
        batch = [d.name for d in op.dims if d.is_batch]
        choice.append(space.index_of({batch[0]: devices}) if batch else 0)
    return np.array(choice)


@pytest.fixture(scope="module")
def cache():
    return PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=8))


@pytest.fixture()
def without_units(monkeypatch):
    def switch_off():
        monkeypatch.setattr(pipeline_price, "fsdp_unsharded_peak",
                            lambda units, **_: UnshardedPeak(params_bytes=0.0, grads_bytes=0.0))
    return switch_off


class TestGpt2Tiny:
    def test_one_stage(self, cache, without_units):
        # ZeRO-3 over 8 data-parallel devices, no pipeline: units [embedding, block, block, ln_f],
        # each whole on every device, bf16 (2 B). Backward runs ln_f, block 1, block 0, embedding;
        # block 0's step holds it and the prefetched embedding, and its bf16 gradient + fp32
        # reduce-scatter input: 2 x (49,984 + 64,000) + (2 + 4) x 49,984 = 527,872 bytes, the largest
        # step (the embedding's own: 8 x 64,000 = 512,000; block 1's: 4 x 49,984 + 6 x 49,984)
        model = cache.model(8, 8, 3, "none")
        choice = _replicated(model, 8)
        point = evaluate_pipeline(cache, pp=1, batch=8, zero_stage=3, recompute="none", choice=choice,
                                  bounds=(0, 2), global_batch=8)
        without_units()
        bare = evaluate_pipeline(cache, pp=1, batch=8, zero_stage=3, recompute="none", choice=choice,
                                 bounds=(0, 2), global_batch=8)
        assert point.memory.params_bytes - bare.memory.params_bytes == pytest.approx(2 * (BLOCK + EMBEDDING))
        assert point.memory.grads_bytes - bare.memory.grads_bytes == pytest.approx(6 * BLOCK)
        assert point.memory_bytes - bare.memory_bytes == pytest.approx((1 + OTHER_FRACTION) * 527_872)
        assert 2 * (BLOCK + EMBEDDING) + 6 * BLOCK == 527_872 > 8 * EMBEDDING  # block 0's step is the peak
        # the tables' states (NCCL's buffers, a whole-plan term, are in no per-op table: objectives.nccl_memory)
        assert bare.memory.allocator_bytes == pytest.approx(model.tables.evaluate(choice)[1], rel=1e-12)

    def test_two_stages_accumulate(self, cache, without_units):
        # pp=2 (4 devices a stage), 4 micro-batches: torchtitan keeps every unit whole and the
        # gradients accumulate unsharded in fp32. Stage 0 = [embedding, block 0]: params
        # 2 x (64,000 + 49,984); at the embedding's backward 6 x 64,000 + 4 x (64,000 + 49,984).
        # Stage 1 = [block 1, ln_f]: params 2 x (49,984 + 128); at block 1's 6 x 49,984 + 4 x (49,984 + 128).
        model = cache.model(4, 2, 3, "none")
        choice = _replicated(model, 2)
        kwargs = dict(pp=2, batch=2, zero_stage=3, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=8)
        point = evaluate_pipeline(cache, **kwargs)
        without_units()
        bare = evaluate_pipeline(cache, **kwargs)
        params = [a.memory.params_bytes - b.memory.params_bytes for a, b in zip(point.stages, bare.stages)]
        grads = [a.memory.grads_bytes - b.memory.grads_bytes for a, b in zip(point.stages, bare.stages)]
        assert params == pytest.approx([2 * (EMBEDDING + BLOCK), 2 * (BLOCK + HEAD)])
        assert grads == pytest.approx([6 * EMBEDDING + 4 * (EMBEDDING + BLOCK), 6 * BLOCK + 4 * (BLOCK + HEAD)])

    @pytest.mark.parametrize("zero", [0, 1, 2])
    def test_below_zero3_nothing_is_added(self, cache, zero):
        model = cache.model(8, 8, zero, "none")
        choice = _replicated(model, 8)
        point = evaluate_pipeline(cache, pp=1, batch=8, zero_stage=zero, recompute="none", choice=choice,
                                  bounds=(0, 2), global_batch=8)
        assert point.memory.allocator_bytes == pytest.approx(model.tables.evaluate(choice)[1], rel=1e-12)
