"""DeepSpeed's ZeRO-3 gathers per sub-module (``objectives.memory.deepspeed_gathered_peak``, priced by
``objectives.pipeline_price`` when ``settings.zero3_gather`` is set): bytes counted by hand for small
sub-module lists and for the 2-layer GPT; the launcher's bounds come from its package and reach the
settings, the export and the fidelity rows."""

from __future__ import annotations

from pathlib import Path

import pytest

import objectives.pipeline_price as pipeline_price
from objectives.cluster import make_cluster
from objectives.execution import default_execution, execution_of
from objectives.memory import StateBytes, UnshardedPeak, deepspeed_gathered_peak
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings, Zero3Gather
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader
from tests.objectives.test_fsdp_memory import _replicated  # every op data-parallel: each parameter whole

BF16 = StateBytes(param=2.0, grad=2.0, optimizer=12.0)  # bf16-mixed + Adam
TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000, tied head


def _bounds(prefetch=0, live=10**9, reuse=0, persist=0, bucket=0) -> Zero3Gather:
    return Zero3Gather(prefetch_bucket=prefetch, max_live=live, max_reuse_distance=reuse, persistence_threshold=persist,
                       reduce_bucket=bucket)


class TestPeakByHand:
    def test_no_sub_modules(self):
        assert deepspeed_gathered_peak([], gather=_bounds(), per=BF16) == UnshardedPeak(params_bytes=0.0, grads_bytes=0.0)

    def test_no_prefetch_holds_the_largest_sub_module_and_its_gradient(self):
        # elements 10, 40, 20 (bytes x 2): nothing prefetched, no bucket; the 40's backward step holds
        # its parameters (80 bytes) and its bf16 gradient (80 bytes)
        peak = deepspeed_gathered_peak([20.0, 80.0, 40.0], gather=_bounds(), per=BF16)
        assert peak == UnshardedPeak(params_bytes=80.0, grads_bytes=80.0)

    def test_the_prefetch_takes_whole_sub_modules_past_the_bucket(self):
        # elements 10, 40, 20; bucket 5: forward at the 10 prefetches the whole 40, not 5 of it (50);
        # backward at the 40 prefetches the 10 and holds its gradient: 40 + 10 + 40 = 90, the peak
        # (backward at the 20 prefetches the 40: 20 + 40 + 20 = 80)
        peak = deepspeed_gathered_peak([20.0, 80.0, 40.0], gather=_bounds(prefetch=5), per=BF16)
        assert peak == UnshardedPeak(params_bytes=2 * 50.0, grads_bytes=2 * 40.0)

    def test_no_prefetch_once_the_live_maximum_is_reached(self):
        # elements 10, 40, 15 with max_live 40: the 40 fills it (room min(5, 40 - 40) = 0), so its
        # backward holds it alone: 40 + 40 (90 without the cap); the 15's backward prefetches the 40
        # (room 5): 15 + 40 + 15 = 70
        peak = deepspeed_gathered_peak([20.0, 80.0, 30.0], gather=_bounds(prefetch=5, live=40), per=BF16)
        assert peak == UnshardedPeak(params_bytes=2 * 40.0, grads_bytes=2 * 40.0)

    def test_persistent_parameters_are_always_whole_and_the_bucket_always_allocated(self):
        # elements 3 and 4 under the threshold 5: whole all the time (7); 30 gathered alone;
        # reduce bucket 100 elements in bf16
        peak = deepspeed_gathered_peak([6.0, 60.0, 8.0], gather=_bounds(persist=5, bucket=100), per=BF16)
        assert peak == UnshardedPeak(params_bytes=2 * (30.0 + 7.0), grads_bytes=2 * (30.0 + 100.0))

    def test_a_sub_module_used_again_within_the_reuse_distance_stays(self):
        # elements 50, 10, 20; reuse distance 50: after its forward the 10 is used again 2 x 20 = 40
        # elements later (< 50) and stays, the 50 only after 2 x 30 = 60 and is released. Backward
        # starts at the 20 with the 10 still whole: 30 elements + gradient 20 = 50; the 50's own
        # step, 50 + 50, is the peak
        peak = deepspeed_gathered_peak([100.0, 20.0, 40.0], gather=_bounds(reuse=50), per=BF16)
        assert peak == UnshardedPeak(params_bytes=100.0, grads_bytes=100.0)
        # with small sub-modules the kept tail is the peak: elements 5, 10, 20 (reuse 100 keeps all
        # three: 2 x 30 < 100) at the first backward step 35 + gradient 20
        peak = deepspeed_gathered_peak([10.0, 20.0, 40.0], gather=_bounds(reuse=100), per=BF16)
        assert peak == UnshardedPeak(params_bytes=70.0, grads_bytes=40.0)


# gpt2_tiny's sub-modules in op order, elements (read off the ONNX initializers; the tied head is
# the embedding's, the position table is held whole and gathers nothing): the embedding, then per
# block ln_1 (2 x 64), c_attn (64 x 192 + 192), c_proj (64 x 64 + 64), ln_2, c_fc (64 x 256 + 256),
# c_proj (256 x 64 + 64), then ln_f
EMBEDDING, NORM, ATTN, PROJ, FC, FC_PROJ = 64_000, 128, 12_480, 4_160, 16_640, 16_448
TINY_GATHER = Zero3Gather(prefetch_bucket=5_000, max_live=20_000, max_reuse_distance=0, persistence_threshold=1_000,
                          reduce_bucket=1_000)


@pytest.fixture(scope="module")
def cache():
    return PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=8),
                             settings=TrainingSettings(zero3_gather=TINY_GATHER))


class TestGpt2Tiny:
    def test_one_stage_by_hand(self, cache, monkeypatch):
        # ZeRO-3 over 8 devices, bf16. The five norms (128 < 1,000) are persistent: 640 elements.
        # The embedding (64,000 >= max_live 20,000) prefetches nothing; the peak is its backward
        # step: 64,000 + its gradient 64,000 (the largest otherwise: c_attn 0's backward with the
        # embedding prefetched, 12,480 + 64,000 + 12,480). Reduce bucket: 1,000 elements.
        model = cache.model(8, 8, 3, "none")
        choice = _replicated(model, 8)
        kwargs = dict(pp=1, batch=8, zero_stage=3, recompute="none", choice=choice, bounds=(0, 2), global_batch=8)
        point = evaluate_pipeline(cache, **kwargs)
        monkeypatch.setattr(pipeline_price, "deepspeed_gathered_peak",
                            lambda *_, **__: UnshardedPeak(params_bytes=0.0, grads_bytes=0.0))
        bare = evaluate_pipeline(cache, **kwargs)
        assert point.memory.params_bytes - bare.memory.params_bytes == pytest.approx(2 * (EMBEDDING + 5 * NORM))
        assert point.memory.grads_bytes - bare.memory.grads_bytes == pytest.approx(2 * (EMBEDDING + 1_000))
        assert EMBEDDING + EMBEDDING > ATTN + EMBEDDING + ATTN  # the embedding's step is the peak

    def test_a_pipeline_stage_is_bounded_by_the_whole_model(self, cache, monkeypatch):
        model = cache.model(4, 2, 3, "none")
        choice = _replicated(model, 2)
        kwargs = dict(pp=2, batch=2, zero_stage=3, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=8)
        point = evaluate_pipeline(cache, **kwargs)
        monkeypatch.setattr(pipeline_price, "deepspeed_gathered_peak",
                            lambda *_, **__: UnshardedPeak(params_bytes=0.0, grads_bytes=0.0))
        bare = evaluate_pipeline(cache, **kwargs)
        params = [a.memory.params_bytes - b.memory.params_bytes for a, b in zip(point.stages, bare.stages)]
        assert params == pytest.approx([2 * (EMBEDDING + 5 * NORM)] * 2)


class TestTheLauncherSetsIt:
    def test_deepspeed_gathers_per_sub_module_fsdp_launchers_per_block(self):
        from exporters.deepspeed.zero3 import ZERO3_GATHER
        from exporters.targets import TARGETS

        assert TARGETS["deepspeed"].zero3_gather == ZERO3_GATHER
        # DeepSpeed 0.19.8's DeepSpeedZeroConfig defaults
        assert (ZERO3_GATHER.prefetch_bucket, ZERO3_GATHER.max_live, ZERO3_GATHER.reduce_bucket) == (5 * 10**7, 10**9, 5 * 10**8)
        assert all(TARGETS[name].zero3_gather is None for name in ("torchtitan", "dtensor", "megatron", "generic"))

    def test_the_execution_model_carries_it_to_the_settings_and_back(self):
        model = default_execution(("fused", "flash"), zero3_gather=TINY_GATHER)
        assert model.zero3_gather == TINY_GATHER
        assert default_execution(model, engine="eager").zero3_gather == TINY_GATHER  # kept under overrides
        settings = TrainingSettings(engine="fused", attention="flash", zero3_gather=TINY_GATHER)
        assert execution_of(settings) == model

    def test_bad_bounds_are_input_errors(self):
        with pytest.raises(InputError, match="prefetch_bucket"):
            _bounds(prefetch=-1)
        with pytest.raises(InputError, match="zero3_gather"):
            TrainingSettings(zero3_gather=(1, 2))  # type: ignore[arg-type]

    def test_a_row_run_by_deepspeed_is_priced_with_its_bounds(self):
        from exporters.deepspeed.zero3 import ZERO3_GATHER
        from objectives.calibration import StepRow
        from planner.calibrate import row_settings

        def row(launcher):
            return StepRow(id="r", model={}, device="a100-80gb", devices=8, devices_per_node=8, micro_batch=1,
                           global_batch=8, zero=3, step_s=1.0, launcher=launcher)

        assert row_settings(row("deepspeed")).zero3_gather == ZERO3_GATHER
        assert row_settings(row(None)).zero3_gather is None
        with pytest.raises(InputError, match="launcher 'megatorn'"):
            row_settings(row("megatorn"))


def test_the_search_prices_every_cut_as_the_plan_is_priced(cache):
    # the pipeline search's per-cut memory (objectives.pipeline_price.unsharded_segment_bytes) adds the
    # same DeepSpeed term as the plan's price, so every point it returns re-prices to its own memory
    from planner.pipeline import PipelineOptions, search_pipeline

    result = search_pipeline(cache, options=PipelineOptions(global_batch=16, zero_stages=(3,)))
    assert result.points
    for point in result.points:
        again = evaluate_pipeline(cache, pp=point.pp, batch=point.micro_batch_samples, zero_stage=point.zero_stage,
                                  recompute=point.recompute, choice=point.choice,
                                  bounds=(*(s.layers[0] for s in point.stages), point.stages[-1].layers[1]),
                                  global_batch=16)
        assert again.memory_bytes == pytest.approx(point.memory_bytes, rel=1e-12)
