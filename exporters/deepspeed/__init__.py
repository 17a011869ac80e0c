"""DeepSpeed, one launcher in one package: its registry entry (:data:`TARGET`), what it runs
(:mod:`~exporters.deepspeed.rules`), its export (:mod:`~exporters.deepspeed.export`:
``ds_config.json`` and the launch line) and DeepSpeed's own config checks
(:mod:`~exporters.deepspeed.validate`).

Execution model: DeepSpeed trains GPTs as Megatron-DeepSpeed does, with fused kernels and flash
attention: ``("fused", "flash")``; its ZeRO-3 gathers one sub-module at a time under its config's
bounds (:data:`~exporters.deepspeed.zero3.ZERO3_GATHER`), which the export writes; under bf16 its
``BF16_Optimizer`` keeps a gradient accumulator at ZeRO 0-1 (:func:`~exporters.deepspeed.bf16_optimizer.grad_accumulator`);
at ZeRO-1/2 it all-reduces the gradient buckets and gathers the updated parameters after the step, unhidden
(:func:`~exporters.deepspeed.zero_sync.zero_sync`).

The exporter's and the validator's names are read from here (``from exporters.deepspeed import
export_deepspeed, deepspeed_masks``) and load on first use: reading :data:`TARGET` loads neither.
"""

from __future__ import annotations

from exporters._target import Target, lazy, lazy_attributes
from exporters.deepspeed import rules
from exporters.deepspeed.bf16_optimizer import grad_accumulator
from exporters.deepspeed.zero3 import ZERO3_GATHER
from exporters.deepspeed.zero_sync import zero_sync

__all__ = [
    "TARGET",
    # exporters.deepspeed.export
    "DEEPSPEED_VERSION",
    "deepspeed_masks",
    "layer_specs",
    "pipeline_parts",
    "deepspeed_moe",
    "export_deepspeed",
    # exporters.deepspeed.validate
    "deepspeed_violations",
    "validate_deepspeed",
]

TARGET = Target(
    name="deepspeed",
    help="DeepSpeed ds_config.json and launch line (ZeRO data parallelism, AutoTP, PipelineModule)",
    export=lazy("exporters.deepspeed.export", "export_deepspeed"),
    families=rules.families,
    allows=rules.allows,
    settings_allows=rules.settings_allows,
    pipeline_allows=rules.pipeline_allows,
    stage_rule=rules.stage_rule,
    execution=("fused", "flash"),
    zero3_gather=ZERO3_GATHER,
    offload=("none", "optimizer", "parameters"),
    # ZeRO++'s hpZ, zero_optimization.zero_hpz_partition_size: read by ZeRO-3 only (0.19.8 runtime/zero/stage3.py)
    hpz=(3,),
    offload_rule=rules.offload_rule,
    grad_accumulator=grad_accumulator,
    pipeline_buffers="deepspeed",  # PipelineEngine: pipe_buffers['outputs'] of the in-flight micro-batches (runtime/pipe/engine.py)
    zero_sync=zero_sync,
    # bf16.enabled casts the module's parameters to bf16 (0.19.8 runtime/engine.py:2080-2088,
    # _configure_distributed_model); the torch_autocast section is off by default (runtime/constants.py:189)
    autocast_zero=(),
)
"""DeepSpeed's entry in :data:`exporters.targets.TARGETS`."""

__getattr__ = lazy_attributes(globals(), "exporters.deepspeed.export", "exporters.deepspeed.validate")
