"""DeepSpeed's ``BF16_Optimizer`` gradient accumulator: which settings select it (DeepSpeed 0.19.8's
``runtime/engine.py``, ``exporters.deepspeed.bf16_optimizer.grad_accumulator``), the bytes a stage prices for it
(``objectives.pipeline_price.grad_accumulator_scale``) counted by hand on the 2-layer GPT, and the launcher, export,
estimate rows and plan file carrying it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from exporters.deepspeed import TARGET as DEEPSPEED
from exporters.deepspeed.bf16_optimizer import grad_accumulator
from exporters.deepspeed.validate import deepspeed_violations
from objectives.cluster import make_cluster
from objectives.memory import OTHER_FRACTION
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader, target_rules
from tests.objectives.test_fsdp_memory import _replicated  # every op data-parallel: each parameter whole

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000, tied head

# gpt2_tiny's parameters, elements (its ONNX initializers): the token embedding, tied to the LM head,
# 1000 x 64; the position table 128 x 64; per block ln_1 128 + c_attn 64 x 192 + 192 + c_proj 64 x 64 + 64
# + ln_2 128 + c_fc 64 x 256 + 256 + c_proj 256 x 64 + 64 = 49,984; ln_f 128
WTE, WPE, BLOCK, LN_F = 64_000, 8_192, 49_984, 128
MODEL = WTE + WPE + 2 * BLOCK + LN_F  # 172,288


class TestWhichOptimizer:
    """engine.py ``_do_optimizer_sanity_check`` (0.19.8): ZeRO-1 + bf16 model + fp32 ``grad_accum_dtype`` + no
    CPU offload -> BFLOAT16; ZeRO 0 with equal dtypes and a ``PipelineModule`` -> BFLOAT16; ZeRO 0 without one
    -> DDP_BFLOAT16 (FP16_Optimizer); every other ZeRO stage -> the ZeRO optimizers. ``BF16_Optimizer`` then
    allocates ``zeros_like(bf16_groups_flat, dtype=grad_acc_dtype)``: 4 bytes per element in fp32, 2 in bf16."""

    @pytest.mark.parametrize("zero, pp, dtype, offload, expected", [
        (1, 1, "fp32", "none", 4.0),  # BF16_Optimizer, fp32 accumulator (BLOOM's path)
        (1, 8, "fp32", "none", 4.0),
        (1, 1, "bf16", "none", 0.0),  # DeepSpeedZeroOptimizer stage 1
        (1, 1, "fp32", "optimizer", 0.0),  # offload: the ZeRO optimizer
        (0, 4, "bf16", "none", 2.0),  # PipelineEngine: BF16_Optimizer accumulating in bf16
        (0, 1, "bf16", "none", 0.0),  # FP16_Optimizer in bf16: no accumulator
        (2, 1, "fp32", "none", 0.0),  # ZeRO-2/3: partitioned gradients
        (3, 1, "bf16", "none", 0.0),
    ])
    def test_rule(self, zero, pp, dtype, offload, expected):
        assert grad_accumulator(zero_stage=zero, pp=pp, grad_accum_dtype=dtype, offload=offload) == expected

    def test_the_exports_accumulation_and_the_launchers_rule(self):
        # the export asks for fp32 accumulation at ZeRO-1 (data_types.grad_accum_dtype), nowhere else
        assert [grad_accumulator(zero_stage=z, pp=pp) for z in range(4) for pp in (1, 2)] == [
            0.0, 2.0, 4.0, 4.0, 0.0, 0.0, 0.0, 0.0]
        assert DEEPSPEED.grad_accumulator is grad_accumulator
        assert target_rules("deepspeed").grad_accumulator is grad_accumulator
        assert target_rules("megatron").grad_accumulator is None and target_rules("torchtitan").grad_accumulator is None

    def test_fp32_accumulation_needs_zero(self):
        config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": 0}, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}
        assert any("unsupported mix" in v for v in deepspeed_violations(config, world_size=8))
        config["zero_optimization"]["stage"] = 1
        assert not deepspeed_violations(config, world_size=8)


@pytest.fixture(scope="module")
def cache():
    return PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=8))


class TestPricedByHand:
    def test_one_stage_zero1_fp32(self, cache):
        # 8 data-parallel devices, each holding all 172,288 parameters' bf16 gradients (2 B): the fp32
        # accumulator adds 4 x 172,288 = 689,152 bytes, and the allowance its OTHER_FRACTION share
        choice = _replicated(cache.model(8, 8, 1, "none"), 8)
        kwargs = dict(pp=1, batch=8, zero_stage=1, recompute="none", choice=choice, bounds=(0, 2), global_batch=8)
        bare = evaluate_pipeline(cache, **kwargs)
        point = evaluate_pipeline(cache, **kwargs, grad_accumulator=4.0)
        assert bare.memory.grads_bytes == pytest.approx(2 * MODEL)
        assert point.memory.grads_bytes - bare.memory.grads_bytes == pytest.approx(4 * MODEL) == 689_152
        assert point.memory_bytes - bare.memory_bytes == pytest.approx((1 + OTHER_FRACTION) * 689_152)
        assert (point.grad_accumulator_bytes, bare.grad_accumulator_bytes) == (4.0, 0.0)
        assert point.time_s == bare.time_s

    def test_two_stages_zero0_under_the_launchers_rule(self, cache):
        # pp=2, ZeRO-0: the PipelineEngine's BF16_Optimizer accumulates in bf16, 2 B per element. Stage 0 holds
        # the embeddings and block 0 (64,000 + 8,192 + 49,984 = 122,176), stage 1 block 1, ln_f and its own copy of
        # the tied head (49,984 + 128 + 64,000 = 114,112): 244,352 and 228,224 bytes
        choice = _replicated(cache.model(4, 4, 0, "none"), 4)
        kwargs = dict(pp=2, batch=4, zero_stage=0, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=8)
        bare = evaluate_pipeline(cache, **kwargs)
        point = evaluate_pipeline(cache, **kwargs, grad_accumulator=DEEPSPEED.grad_accumulator)
        added = [a.memory.grads_bytes - b.memory.grads_bytes for a, b in zip(point.stages, bare.stages)]
        assert added == pytest.approx([2 * (WTE + WPE + BLOCK), 2 * (BLOCK + LN_F + WTE)]) == [244_352, 228_224]
        assert point.grad_accumulator_bytes == 2.0

    @pytest.mark.parametrize("zero", [2, 3])
    def test_none_at_zero2_and_zero3(self, cache, zero):
        choice = _replicated(cache.model(8, 8, zero, "none"), 8)
        kwargs = dict(pp=1, batch=8, zero_stage=zero, recompute="none", choice=choice, bounds=(0, 2), global_batch=8)
        assert evaluate_pipeline(cache, **kwargs, grad_accumulator=4.0).memory_bytes == evaluate_pipeline(cache, **kwargs).memory_bytes

    def test_none_in_fp32_and_the_settings_fallback(self):
        graph = graph_loader(TINY, {"seq": 128})
        cluster = make_cluster("a100-80gb", devices=8)
        fp32 = PipelineCostCache(graph, cluster=cluster, settings=TrainingSettings(precision="fp32"))
        kept = PipelineCostCache(graph, cluster=cluster, settings=TrainingSettings(grad_accumulator_bytes=4.0))
        choice = _replicated(fp32.model(8, 8, 1, "none"), 8)
        kwargs = dict(pp=1, batch=8, zero_stage=1, recompute="none", choice=choice, bounds=(0, 2), global_batch=8)
        assert evaluate_pipeline(fp32, **kwargs, grad_accumulator=4.0).grad_accumulator_bytes == 0.0
        by_settings = evaluate_pipeline(kept, **kwargs)
        assert by_settings.grad_accumulator_bytes == 4.0
        assert by_settings.memory_bytes == pytest.approx(evaluate_pipeline(kept, **kwargs, grad_accumulator=4.0).memory_bytes)
        assert evaluate_pipeline(kept, **kwargs, grad_accumulator=0.0).memory_bytes < by_settings.memory_bytes

    def test_bad_settings(self):
        from planner.core.errors import InputError

        with pytest.raises(InputError, match="grad_accumulator_bytes"):
            TrainingSettings(grad_accumulator_bytes=-1.0)


def test_estimate_rows_naming_deepspeed_carry_it():
    from objectives.calibration import StepRow
    from planner.calibrate import row_settings

    fields = {f.name for f in dataclasses.fields(StepRow)}
    base = dict(id="r", model={}, device="a100-80gb", devices=8, devices_per_node=8, tp=1, pp=1, dp=8, micro_batch=1,
                global_batch=8, recompute="none", step_s=1.0)
    row = StepRow(**{k: v for k, v in base.items() if k in fields}, zero=1, launcher="deepspeed")
    assert row_settings(row).grad_accumulator_bytes == 4.0
    assert row_settings(dataclasses.replace(row, zero=3)).grad_accumulator_bytes == 0.0
    assert row_settings(dataclasses.replace(row, launcher="megatron")).grad_accumulator_bytes == 0.0
    assert row_settings(dataclasses.replace(row, launcher=None)).grad_accumulator_bytes == 0.0


def test_the_search_and_the_export_carry_it(cache):
    # DeepSpeed's search prices each row with its rule at the row's ZeRO stage and pipeline size (fp32 at ZeRO-1,
    # bf16 under a ZeRO-0 pipeline), its ZeRO-1 export asks DeepSpeed for that accumulation, and the plan's
    # settings record it
    from exporters.deepspeed import export_deepspeed
    from planner.pipeline import PipelineOptions, pipeline_search, point_plan_input

    options = PipelineOptions(global_batch=8, pipeline_sizes=(1, 2), zero_stages=(0, 1), recompute=("none",))
    points = pipeline_search(cache, cluster=cache.cluster, options=options, target="deepspeed").points
    assert points
    for p in points:
        assert p.grad_accumulator_bytes == grad_accumulator(zero_stage=p.zero_stage, pp=p.pp), p.summary
    zero1 = [p for p in points if p.zero_stage == 1]
    assert zero1  # ZeRO-1 holds 12/dp of the optimizer state + 4: leaner than ZeRO-0's 12
    plan_input = point_plan_input(zero1[0], cache)
    assert plan_input.settings.grad_accumulator_bytes == 4.0
    assert export_deepspeed(plan_input)["ds_config"]["data_types"] == {"grad_accum_dtype": "fp32"}
    assert np.isfinite([p.memory_bytes for p in points]).all()


def test_a_plan_priced_without_the_accumulator_is_not_deepspeeds(cache):
    # Megatron-LM's search prices a bf16 ZeRO-1 plan without DeepSpeed's BF16_Optimizer accumulator: DeepSpeed
    # would hold 4 B per parameter more than the row says, so the targets column leaves it out and the export
    # refuses it in one line; the same plan with the accumulator priced (DeepSpeed's own search) is DeepSpeed's
    from exporters import export, runnable_targets
    from exporters.targets import runnable_plan_targets
    from planner.core.errors import UnsupportedExport
    from planner.pipeline import PipelineOptions, pipeline_search, point_plan_input

    options = PipelineOptions(global_batch=8, pipeline_sizes=(1,), zero_stages=(1,), recompute=("none",))
    point = pipeline_search(cache, cluster=cache.cluster, options=options, target="deepspeed").points[0]
    priced = point_plan_input(point, cache)
    assert priced.settings.grad_accumulator_bytes == 4.0 and "deepspeed" in runnable_targets(priced)
    unpriced = dataclasses.replace(priced, settings=dataclasses.replace(priced.settings, grad_accumulator_bytes=0.0))
    assert DEEPSPEED.unpriced_accumulator(unpriced.settings, 1) == 4.0
    assert "deepspeed" not in runnable_plan_targets([unpriced])[0]
    assert "deepspeed" not in runnable_targets(unpriced)
    with pytest.raises(UnsupportedExport, match="4 B per parameter gradient accumulator at ZeRO-1"):
        export("deepspeed", unpriced)
    assert runnable_plan_targets([priced])[0] == runnable_targets(priced)
