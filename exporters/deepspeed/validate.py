r"""DeepSpeed's own config checks in pure Python (``deepspeed==0.19.8``; reference
``/work/shared/reference/export_targets.md`` §2).

The rules: batch sizes positive integers with ``train_batch_size == micro * accumulation * world``
(the data parallel size, or the full world with AutoTP); ZeRO stage 0-3 and only known keys in the
strict sections; offload devices; not fp16 and bf16; AutoTP keys, ``autotp_size`` dividing the
world, ZeRO <= 2 with AutoTP, heads and KV heads divisible by it; ``layer_specs`` regexes, partition
types and sub-parameter shapes; ZeRO-2/3 not with pipeline parallelism; the ``pipeline`` section's
flags booleans and its checkpoint interval a non-negative integer.

:func:`deepspeed_violations` returns every violation as a one-line message and
:func:`validate_deepspeed` raises :class:`~planner.core.errors.UnsupportedExport` with all of them.
:mod:`exporters.validate` re-exports these names.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from planner.core.errors import UnsupportedExport

__all__ = ["deepspeed_violations", "validate_deepspeed"]

# Keys of DeepSpeed 0.19.8's strict (pydantic, extra="forbid") config sections, with aliases.
_ZERO_KEYS = frozenset({
    "stage", "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "stage3_allgather_sequential",
    "compute_grad_norm", "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
    "elastic_checkpoint", "enable_sanity_checks", "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module", "legacy_stage1",
    "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters", "stage3_max_live_parameters",
    "max_reuse_distance", "stage3_max_reuse_distance", "memory_efficient_linear", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "module_granularity_threshold", "stage3_module_granularity_threshold",
    "offload_optimizer", "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold",
    "stage3_param_persistence_threshold", "parameter_alignment", "pipeline_loading_checkpoint",
    "prefetch_bucket_size", "stage3_prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter",
    "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage3_gather_fp16_weights_on_model_save",
    "sub_group_size", "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
    "use_multi_rank_bucket_allreduce", "zenflow", "zero_hpz_partition_size", "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights", "zero_quantized_weights",
})
_OFFLOAD_OPTIMIZER_KEYS = frozenset({
    "buffer_count", "cpuadam_cores_perc", "device", "fast_init", "nvme_path", "pin_memory", "pipeline_read",
    "pipeline_write", "ratio", "super_offload",
})
_OFFLOAD_PARAM_KEYS = frozenset({"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"})
_BF16_KEYS = frozenset({"enabled", "bf16_master_weights_and_grads", "bf16_optimizer_states", "check_grad_overflow", "immediate_grad_update"})
_FP16_KEYS = frozenset({
    "enabled", "auto_cast", "consecutive_hysteresis", "fp16_master_weights_and_grads", "hysteresis",
    "initial_scale_power", "loss_scale", "loss_scale_window", "min_loss_scale",
})
_TP_KEYS = frozenset({
    "autotp_size", "dtype", "injection_policy_tuple", "keep_module_on_host", "partition_config", "preset_model",
    "replace_with_kernel_inject", "kernel_inject", "tensor_parallel", "tp", "tp_overlap_comm",
    "vocab_parallel_ce_backend", "vocab_parallel_lm_head",
})
_PARTITION_CONFIG_KEYS = frozenset({
    "layer_specs", "use_default_specs", "tp_size", "embedding_partition_dim", "lm_head_patterns", "strict_mode",
})
_LAYER_SPEC_KEYS = frozenset({"patterns", "partition_type", "shape", "partition_dim", "model_types", "gather_output", "grad_allreduce"})
_PRESETS = frozenset({"llama", "bloom", "chatglm", "mixtral", "deepseek_v2", "qwen2", "phi3"})
_OFFLOAD_DEVICES = frozenset({"none", "cpu", "nvme"})


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _enabled(section: Any) -> bool:
    return isinstance(section, Mapping) and bool(section.get("enabled", False))


def _layer_spec_violations(index: int, spec: Any) -> list[str]:
    where = f"tensor_parallel.partition_config.layer_specs[{index}]"
    if not isinstance(spec, Mapping):
        return [f"{where} must be an object"]
    out = [f"{where} has unknown key '{k}'" for k in spec if k not in _LAYER_SPEC_KEYS]
    patterns = spec.get("patterns")
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        out.append(f"{where}.patterns must be a non-empty list of regular expressions")
        patterns = []
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            out.append(f"{where}.patterns: '{pattern}' is not a regular expression ({exc})")
    kind = spec.get("partition_type", "column")
    if not isinstance(kind, str) or kind.lower() not in ("row", "column", "skip"):
        out.append(f"{where}.partition_type must be row, column or skip (got {kind!r})")
        kind = "column"
    dim = spec.get("partition_dim")
    if dim is None:
        dim = 0 if kind.lower() == "column" else 1
    elif not isinstance(dim, int) or isinstance(dim, bool):
        out.append(f"{where}.partition_dim must be an integer")
        return out
    shape = spec.get("shape")
    if shape is not None:
        # deepspeed.module_inject.autotp_config.TPLayerSpec._validate_shape_format
        if not isinstance(shape, list) or not shape:
            out.append(f"{where}.shape must be a list")
            return out
        if dim < 0 or dim >= len(shape):
            out.append(f"{where}.partition_dim {dim} is out of range for shape of length {len(shape)}")
        for position, entry in enumerate(shape):
            if isinstance(entry, list):
                if position != dim:
                    out.append(f"{where}.shape: a nested list is allowed only at partition_dim ({dim})")
                if not entry or not all(_positive_int(v) for v in entry):
                    out.append(f"{where}.shape: nested sub-parameter sizes must be positive integers")
            elif not isinstance(entry, int) or isinstance(entry, bool) or entry == 0 or entry < -1:
                out.append(f"{where}.shape entries must be positive integers or -1")
    elif dim not in (0, 1):
        out.append(f"{where}.partition_dim must be 0 or 1 for a 2-D weight")
    return out


def deepspeed_violations(
    config: Mapping[str, Any],
    *,
    world_size: int,
    pipeline_stages: int = 1,
    num_attention_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> list[str]:
    """Every DeepSpeed rule (reference §2) that ``config`` breaks at ``world_size`` processes.

    Parameters
    ----------
    config:
        The ds_config dict.
    world_size:
        All processes of the job. The batch rule uses ``world_size / (autotp_size * pipeline_stages)``
        data-parallel ranks, except that config-only AutoTP checks against the full world size
        (measured, reference §2.1).
    pipeline_stages:
        Pipeline stages of the ``PipelineModule`` (1: no pipeline).
    num_attention_heads, num_kv_heads:
        Model sizes, for AutoTP's head divisibility (``None``: not checked).
    """
    out: list[str] = []
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, Mapping):
        out.append("zero_optimization must be an object")
        zero = {}
    stage = zero.get("stage", 0)
    if isinstance(stage, str) and stage.isdigit():
        stage = int(stage)  # DeepSpeed coerces "2" to 2
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        out.append(f"zero_optimization.stage must be 0, 1, 2 or 3 (got {stage!r})")
        stage = 0
    out += [f"zero_optimization has unknown key '{k}'" for k in zero if k not in _ZERO_KEYS]
    for section, keys in (("offload_optimizer", _OFFLOAD_OPTIMIZER_KEYS), ("offload_param", _OFFLOAD_PARAM_KEYS)):
        offload = zero.get(section)
        if offload is None:
            continue
        if not isinstance(offload, Mapping):
            out.append(f"zero_optimization.{section} must be an object")
            continue
        out += [f"zero_optimization.{section} has unknown key '{k}'" for k in offload if k not in keys]
        device = offload.get("device", "none")
        if device not in _OFFLOAD_DEVICES:
            out.append(f"zero_optimization.{section}.device must be none, cpu or nvme (got {device!r})")
        elif device != "none":
            if section == "offload_param" and stage != 3:
                out.append("zero_optimization.offload_param needs ZeRO stage 3")
            if section == "offload_optimizer" and stage == 0:
                out.append("zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3")
    for name, keys in (("bf16", _BF16_KEYS), ("fp16", _FP16_KEYS)):
        section = config.get(name)
        if section is not None:
            if not isinstance(section, Mapping):
                out.append(f"{name} must be an object")
            else:
                out += [f"{name} has unknown key '{k}'" for k in section if k not in keys]
    if _enabled(config.get("bf16")) and _enabled(config.get("fp16")):
        out.append("bf16 and fp16 cannot both be enabled")
    data_types = config.get("data_types")
    accumulate = data_types.get("grad_accum_dtype") if isinstance(data_types, Mapping) else None
    if accumulate == "fp32" and _enabled(config.get("bf16")) and stage == 0:
        # engine.py _do_optimizer_sanity_check: without ZeRO, model and accumulation dtypes must agree
        out.append("data_types.grad_accum_dtype fp32 with bf16 needs ZeRO stage 1-3 (DeepSpeed: 'unsupported mix')")
    tp = 1
    tp_section = config.get("tensor_parallel")
    if tp_section is not None:
        tp, tp_out = _tensor_parallel_violations(tp_section, world_size, stage, num_attention_heads, num_kv_heads)
        out += tp_out
    if pipeline_stages > 1 and stage >= 2:
        out.append("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism; use ZeRO stage 0 or 1")
    pipe = config.get("pipeline")
    if pipe is not None:
        if not isinstance(pipe, Mapping):
            out.append("pipeline must be an object")
        else:
            # PipelineEngine asserts the two flags are booleans and compares the interval with 0.
            for key in ("pipe_partitioned", "grad_partitioned"):
                if key in pipe and not isinstance(pipe[key], bool):
                    out.append(f"pipeline.{key} must be true or false (got {pipe[key]!r})")
            interval = pipe.get("activation_checkpoint_interval", 0)
            if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
                out.append(f"pipeline.activation_checkpoint_interval must be a non-negative integer (got {interval!r})")
    if pipeline_stages < 1 or world_size < 1:
        out.append("world size and pipeline stages must be at least 1")
        return out
    sp, sp_out = _sequence_parallel_violations(config, world_size, tp, pipeline_stages, num_attention_heads, num_kv_heads)
    out += sp_out
    data_parallel = world_size // (tp * pipeline_stages) if tp > 1 or pipeline_stages > 1 else world_size
    # Config-only AutoTP validates the batch against the whole world (reference §2.1, measured);
    # under Ulysses DeepSpeedConfig divides the world by the sequence-parallel size (its mpu has no
    # get_data_parallel_world_size: deepspeed/runtime/config.py, DeepSpeedConfig.__init__)
    batch_world = world_size if tp > 1 and pipeline_stages == 1 else data_parallel // sp
    out += _batch_violations(config, batch_world)
    return out


def _sequence_parallel_violations(
    config: Mapping[str, Any], world_size: int, tp: int, pipeline_stages: int, heads: int | None, kv_heads: int | None,
) -> tuple[int, list[str]]:
    """``(sequence-parallel size, violations)`` of DeepSpeed-Ulysses' ``sequence_parallel_size``: a
    positive integer dividing the world, the heads (``UlyssesSPAttentionHF``), and the KV heads or
    divided by them; not combined with AutoTP or a pipeline in our exports."""
    sp = config.get("sequence_parallel_size", 1)
    if not _positive_int(sp):
        return 1, [f"sequence_parallel_size must be a positive integer (got {sp!r})"]
    out: list[str] = []
    if sp == 1:
        return 1, out
    if world_size % sp:
        out.append(f"sequence_parallel_size {sp} must divide the world size {world_size}")
    if heads is not None and heads % sp:
        out.append(f"Attention head count {heads} is not divisible by SP size {sp}")
    if kv_heads is not None and kv_heads % sp and sp % kv_heads:
        out.append(f"KV attention head count {kv_heads} is not divisible by SP size {sp} or vice versa")
    if tp > 1 or pipeline_stages > 1:
        out.append("sequence_parallel_size (Ulysses) is exported without AutoTP or a pipeline")
    return sp, out


def _tensor_parallel_violations(
    section: Any, world_size: int, stage: int, heads: int | None, kv_heads: int | None
) -> tuple[int, list[str]]:
    out: list[str] = []
    if not isinstance(section, Mapping):
        return 1, ["tensor_parallel must be an object"]
    out += [f"tensor_parallel has unknown key '{k}'" for k in section if k not in _TP_KEYS]
    size = section.get("autotp_size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        out.append(f"tensor_parallel.autotp_size must be a non-negative integer (got {size!r})")
        size = 0
    tp = max(size, 1)
    if tp > 1:
        if world_size % tp:
            out.append(f"world size ({world_size}) is not divisible by tensor_parallel.autotp_size ({tp})")
        if stage == 3:
            out.append("AutoTP works with ZeRO stages 0, 1 and 2 only; use zero_optimization.stage <= 2")
        if heads is not None and heads % tp:
            out.append(f"AutoTP size ({tp}) must divide the attention heads ({heads})")
        if kv_heads is not None and kv_heads % tp:
            out.append(f"AutoTP size ({tp}) must divide the key/value heads ({kv_heads})")
    preset = section.get("preset_model")
    if preset is not None and preset not in _PRESETS:
        out.append(f"tensor_parallel.preset_model must be one of {', '.join(sorted(_PRESETS))} (got {preset!r})")
    partition = section.get("partition_config")
    if partition is not None:
        if not isinstance(partition, Mapping):
            out.append("tensor_parallel.partition_config must be an object")
        else:
            out += [f"tensor_parallel.partition_config has unknown key '{k}'" for k in partition if k not in _PARTITION_CONFIG_KEYS]
            specs = partition.get("layer_specs", [])
            if not isinstance(specs, list):
                out.append("tensor_parallel.partition_config.layer_specs must be a list")
            else:
                for index, spec in enumerate(specs):
                    out += _layer_spec_violations(index, spec)
    return tp, out


def _batch_violations(config: Mapping[str, Any], world: int) -> list[str]:
    out: list[str] = []
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    values = {n: config.get(n) for n in names}
    for name, value in values.items():
        if value is not None and not _positive_int(value):
            out.append(f"{name} must be a positive integer (got {value!r})")
    if out:
        return out
    tbs, mbs, gas = values["train_batch_size"], values["train_micro_batch_size_per_gpu"], values["gradient_accumulation_steps"]
    given = sum(v is not None for v in (tbs, mbs, gas))
    if tbs is None and mbs is None:
        return ["set train_batch_size or train_micro_batch_size_per_gpu"]
    # DeepSpeedConfig._set_batch_related_parameters infers a missing value by floor division.
    if given == 2:
        if tbs is None:
            tbs = mbs * gas * world
        elif mbs is None:
            mbs = tbs // (gas * world)
        else:
            gas = tbs // (mbs * world)
    elif given == 1:
        gas = 1
        if tbs is None:
            tbs = mbs * world
        else:
            mbs = tbs // world
    if mbs is not None and mbs < 1:
        out.append(f"train_micro_batch_size_per_gpu would be {mbs}; train_batch_size is too small for {world} ranks")
    elif gas is not None and gas < 1:
        out.append(f"gradient_accumulation_steps would be {gas}; it has to be greater than 0")
    elif tbs != mbs * gas * world:
        out.append(
            f"train_batch_size ({tbs}) != train_micro_batch_size_per_gpu ({mbs}) * "
            f"gradient_accumulation_steps ({gas}) * world size ({world})"
        )
    return out


def validate_deepspeed(
    config: Mapping[str, Any],
    *,
    world_size: int,
    pipeline_stages: int = 1,
    num_attention_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> None:
    """Check a ds_config; raises :class:`UnsupportedExport` with every violated rule.

    Examples
    --------
    >>> validate_deepspeed({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
    ...                     "gradient_accumulation_steps": 1}, world_size=4)
    """
    problems = deepspeed_violations(
        config,
        world_size=world_size,
        pipeline_stages=pipeline_stages,
        num_attention_heads=num_attention_heads,
        num_kv_heads=num_kv_heads,
    )
    if problems:
        raise UnsupportedExport("DeepSpeed would reject this config: " + "; ".join(problems))
