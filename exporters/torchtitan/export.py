r"""torchtitan exporter: the ``torchrun -m torchtitan.train`` command of a strategy, its dotted
overrides and the config registry module that builds the planned model.

torchtitan 0.3 (the release on the package index) takes a Python config registry plus overrides:
``--module M --config F`` calls ``M.config_registry.F()`` (or ``M.F()`` for a fully qualified
module) for a ``Trainer.Config``, and ``tyro`` applies ``--section.field value`` overrides to it
(``torchtitan.config.manager.ConfigManager.parse_args``). The model's sizes are no override in 0.3
(``Trainer.Config.model_spec`` is suppressed on the command line), so the export writes a small
registry module, ``planner_torchtitan.py`` (:mod:`exporters.torchtitan.config_module`): the
family's preset trainer settings (``llama3_8b``, ``qwen3_0_6b``, ``deepseek_v3_debugmodel``) with a
model config of the planned sizes, rotary base and norm epsilon, built by torchtitan's own layer
helpers. ``PYTHONPATH=.`` in the command finds it.

What is expressible
    torchtitan's ``llama3``, ``qwen3`` and ``deepseek_v3`` families (:mod:`exporters.torchtitan.families`): a uniform
    stack of pre-norm decoder layers with RMSNorm, rotary positions, grouped-query attention
    (``n_kv_heads`` dividing ``n_heads``) and a SwiGLU MLP, no biases, an LM head (tied or not);
    qwen3 when the queries and keys are normalised per head (its ``head_dim`` free), llama3 when not
    (``head_dim = dim / n_heads``); and ``deepseek_v3`` with every layer dense for multi-latent
    attention (its latent projections and norms replicated over tp, as Megatron-LM's MLA; its
    ``sharding.py``). Their tensor-parallel plans
    (``torchtitan/models/{llama3,qwen3}/sharding.py`` and ``models/common/decoder_sharding.py``) are
    Megatron's pattern: Q/K/V and ``w1``/``w3`` colwise, ``wo``/``w2`` rowwise (qwen3's ``q_norm`` /
    ``k_norm`` sharded on the head dim with them), a vocabulary-parallel
    embedding (weight ``S(0)``) and LM head whose logits stay sharded on the vocabulary for the loss,
    norms replicated or, with ``enable_sequence_parallel`` (the default), sequence-sharded with the
    residual stream. So the masks are Megatron's (:mod:`exporters._tp`, ``target="megatron"``),
    narrowed by torchtitan's own checks (``Decoder.Config.update_from_config``: ``tp`` divides
    ``n_heads`` and ``n_kv_heads``).

    Data parallelism is FSDP2 (``fully_shard`` per block and at the root): ZeRO-3 is
    ``data_parallel_shard_degree = dp``, ZeRO-0 is ``data_parallel_replicate_degree = dp`` with
    ``data_parallel_shard_degree = 1`` (DDP-like replication), HSDP (``TrainingSettings.dp_shard``,
    ``--fix hsdp=N``) is ``data_parallel_replicate_degree = dp / N`` x ``data_parallel_shard_degree = N``
    (:func:`data_parallel_split`). Pipelines are
    ``torch.distributed.pipelining`` schedules (``GPipe``, ``1F1B``, ``Interleaved1F1B``) on the
    planned stage cut (``module_fqns_per_model_part``: virtual stage ``v`` of rank ``s`` is part
    ``v * pp + s``, torchtitan's loop style). Full recomputation is ``activation-checkpoint:full``;
    the fused execution model is ``--compile.enable`` (per-block ``torch.compile``; attention is
    FlexAttention, flash-style, the only attention 0.3 offers language models besides varlen). A plan priced
    with async TP (``--fix tp_overlap=on --target torchtitan``: ``objectives.tp_overlap``'s micro-pipeline)
    adds ``--compile.enable_async_tensor_parallel`` (:func:`torchtitan_async_tp_args`).

Recomputation: ``full`` is ``activation-checkpoint:full``; ``op`` (the planner's name for
torchtitan's op-level policy, ``SelectiveAC``: every other matmul's output and the attention kernel's
saved, the rest of each block recomputed) is ``activation-checkpoint:selective``.

Refused (one line each)
    ZeRO-1/2 (FSDP2 shards parameters, gradients and optimizer state together), Megatron's selective
    recomputation (the attention core alone: torchtitan's ``SelectiveAC`` is the ``op`` mode), SGD (the
    presets train with AdamW), expert parallelism but at ``tp = 1`` under plain FSDP2 with even expert shards
    (:mod:`exporters.torchtitan.experts`: torchtitan's ``ep`` borrows tp ranks first), a capacity factor (its
    dispatcher is dropless), models no family builds
    (learned positions, LayerNorm, GELU, biases, soft-capping, sandwich norms, a scaled or partial RoPE,
    norms with different epsilons or not the family's count;
    :func:`~exporters.torchtitan.families.family_refusals`), tied embeddings with ``pp > 1`` (torchtitan
    raises ``NotImplementedError``), a virtual stage with no module, and whatever
    :func:`exporters.torchtitan.validate.validate_torchtitan` finds (batch, schedule, world size).

FP8 (``--dtype fp8``, priced with rowwise scaling): torchtitan 0.3 takes float8 as a model converter in
the config registry (``llama3_debugmodel_float8``, ``llama3_405b``), not as an override, so the written
module applies ``Float8LinearConverter(recipe_name="rowwise", filter_fqns=["lm_head"])`` to the model
config. Context parallelism (``cp > 1``, ZeRO-3 only: FSDP2 shards over ``dp_shard x cp``) is
``context_parallel_degree`` with the PTRR load balancer FlexAttention takes; its K/V are all-gathered
(``flex_cp_allgather``), priced as Megatron-LM's ``all_gather`` context parallelism. Expert parallelism
(``ep > 1`` on a qwen3 MoE at ``tp = 1``, ZeRO-3, no HSDP, ``ep`` dividing ``dp x cp``) is
``expert_parallel_degree`` (0.3 has no expert tensor-parallel degree), with
``training.disable_cuda_graphs`` for the standard all-to-all dispatcher (:mod:`exporters.torchtitan.experts`).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from exporters._common import (
    context_parallel_degree,
    describe_config,
    folded_norm_note,
    head_copy_note,
    launcher_degrees,
    samples_per_rank,
    torchrun_nodes,
)
from exporters._tp import MaskResult, TpLayout, layout_masks, tp_layout
from exporters.generic import PipelineSpec, PlanInput
from exporters.torchtitan.config_module import (
    CONFIG_FUNCTION,
    CONFIG_MODULE,
    TORCHTITAN_VERSION,
    torchtitan_config_module,
)
from exporters.torchtitan.experts import expert_parallel_refusal
from exporters.torchtitan.families import TorchtitanArch, llama_refusals, torchtitan_arch
from exporters.torchtitan.validate import TorchtitanModel, validate_torchtitan
from importers.transformer import TransformerModel
from planner.core.chunks import chunk_layers
from planner.core.configs import ConfigSpace
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph
from planner.core.memo import IdentityMemo
from planner.core.settings import TrainingSettings

__all__ = [
    "TORCHTITAN_VERSION",
    "CONFIG_MODULE",
    "CONFIG_FUNCTION",
    "SCHEDULES",
    "llama_refusals",
    "torchtitan_masks",
    "data_parallel_split",
    "torchtitan_overrides",
    "torchtitan_async_tp_args",
    "torchtitan_cuda_graph_args",
    "torchtitan_config_module",
    "export_torchtitan",
]

SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb-h1": "InterleavedZeroBubble",
             "zbv": "ZBVZeroBubble"}
"""The planner's schedule -> ``parallelism.pipeline_parallel_schedule`` (``torch.distributed.pipelining``)."""


def _degree_problem(model: TransformerModel, tp: int) -> str | None:
    """torchtitan's own checks on ``tp`` (``Decoder.Config.update_from_config``) and the MLP's split."""
    for what, size in (("attention heads", model.num_attention_heads), ("KV heads", model.num_query_groups),
                       ("FFN size", model.ffn_hidden_size)):
        if size % tp:
            return f"{what} ({size}) are not divisible by tp={tp}"
    return None


def _masks(graph: OpGraph, spaces: Sequence[ConfigSpace], layout: TpLayout, *, dp: int, tp: int,
           sequence_parallel: bool, devices_per_node: int | None, cp: int = 1) -> MaskResult:
    problem = _degree_problem(layout.model, tp)
    if problem:
        return MaskResult(masks=None, reason=problem)
    if cp > 1 and layout.model.seq_length % (2 * cp):
        # the load balancer cuts the sequence into 2 x cp chunks (rank r: chunks r and 2 cp - 1 - r)
        return MaskResult(masks=None, reason=f"sequence length {layout.model.seq_length} is not divisible by 2 x cp = {2 * cp}")
    return layout_masks(graph, spaces, layout, dp=dp, tp=tp, sequence_parallel=sequence_parallel,
                        devices_per_node=devices_per_node or dp * cp * tp, cp=cp)


def torchtitan_masks(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    *,
    dp: int,
    tp: int,
    sequence_parallel: bool = False,
    devices_per_node: int | None = None,
    cp: int = 1,
) -> list[np.ndarray] | None:
    """Per op, which configurations torchtitan's plan of the model's family (llama3, qwen3, deepseek_v3)
    runs at ``dp x cp x tp``.

    Parameters
    ----------
    graph, spaces:
        The op graph and each op's configurations.
    dp, tp:
        Data-parallel (``dp_replicate x dp_shard``) and tensor-parallel degrees.
    sequence_parallel:
        ``parallelism.enable_sequence_parallel``: norms and residual ops split along the sequence.
    devices_per_node:
        When given, ``tp`` ranks innermost on a node, then ``cp`` (torchtitan's mesh order:
        ``pp, dp_replicate, dp_shard, cp, tp``).
    cp:
        ``parallelism.context_parallel_degree``: every op's sequence split ``cp`` ways more, attention's
        query sequence only (its K/V gathered: FlexAttention's ``flex_cp_allgather``), as Megatron-LM's
        ``all_gather`` context parallelism (:mod:`exporters._tp`).

    Returns
    -------
    list of numpy.ndarray or None
        One boolean array per op; ``None`` when the family does not build the model or the degrees
        break its rules.
    """
    layout = _LAYOUTS.get((graph,), lambda: _layout(graph))  # one per graph: every family of a stage asks
    if layout is None:
        return None
    return _masks(graph, spaces, layout, dp=dp, tp=tp, sequence_parallel=sequence_parallel,
                  devices_per_node=devices_per_node, cp=cp).masks


_LAYOUTS: IdentityMemo = IdentityMemo(size=64)
"""The layouts of the graphs of a search's micro-batch sizes (:func:`torchtitan_masks`; ``None``: refused):
reading the family (:func:`torchtitan_arch`) took a fifth of a 64-device long-context search, once per family."""


def _layout(graph: OpGraph):
    try:
        return tp_layout(graph, torchtitan_arch(graph).model, target="megatron")
    except UnsupportedExport:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Launch:
    """The shape of a torchtitan run, read from a strategy and checked (:func:`_launch`)."""

    arch: TorchtitanArch
    """The family and the model it builds."""
    dp: int
    tp: int
    pp: int
    sequence_parallel: bool
    pipeline: PipelineSpec | None
    world: int
    """Processes: ``dp x cp x tp x pp``."""
    nnodes: int
    per_node: int
    local_batch: int
    """Samples per data-parallel rank per gradient-accumulation step (``training.local_batch_size``)."""
    fallbacks: tuple[str, ...]
    """Roles the planner kept replicated over ``tp`` (their split does not divide evenly)."""
    cp: int = 1
    """``parallelism.context_parallel_degree``."""

    @property
    def model(self) -> TransformerModel:
        """The planned model's sizes."""
        return self.arch.model


def _family(plan_input: PlanInput, layout: TpLayout, dp: int, tp: int, cp: int = 1, *,
            name: str = "llama3") -> tuple[bool, MaskResult]:
    """Which of the two families (sequence parallelism off, on) holds the choice, or the refusal."""
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    per_node = plan_input.cluster.devices_per_node
    tried: list[tuple[bool, MaskResult]] = []
    for sp in (False, True) if tp > 1 else (False,):
        result = _masks(graph, spaces, layout, dp=dp, tp=tp, sequence_parallel=sp, devices_per_node=per_node, cp=cp)
        if result.masks is None:
            raise UnsupportedExport(f"torchtitan cannot run {_shown(dp, cp, tp)} on this model: {result.reason}")
        if all(mask[row] for mask, row in zip(result.masks, choice)):
            return sp, result
        tried.append((sp, result))
    sp, result = tried[0]
    assert result.masks is not None
    index = next(i for i, (mask, row) in enumerate(zip(result.masks, choice)) if not mask[row])
    op, space = graph.ops[index], spaces[index]
    expected = describe_config(op, space, int(np.flatnonzero(result.masks[index])[0]))
    raise UnsupportedExport(
        f"op {op.name} ({layout.rules[index].role}) is split {describe_config(op, space, choice[index])}; "
        f"torchtitan's {name} plan at {_shown(dp, cp, tp)} splits it {expected}"
    )


def _shown(dp: int, cp: int, tp: int) -> str:
    return f"dp={dp}" + (f" x cp={cp}" if cp > 1 else "") + f" x tp={tp}"


def _check_settings(plan_input: PlanInput, model: TransformerModel, pipeline: PipelineSpec | None) -> None:
    settings = plan_input.settings
    if settings.zero_stage in (1, 2):
        raise UnsupportedExport(
            f"torchtitan shards data-parallel state with FSDP2, which shards parameters, gradients and optimizer "
            f"state together (ZeRO-3) or replicates them (ZeRO-0); ZeRO-{settings.zero_stage} has no setting; "
            "plan with --zero 0 or 3"
        )
    if settings.recompute == "selective":
        raise UnsupportedExport(
            "torchtitan's selective activation checkpointing saves matmul and attention outputs op by op (the "
            "planner's 'op' mode), not Megatron's recomputed attention core; plan with --recompute none, op or full"
        )
    if settings.optimizer != "adam":
        raise UnsupportedExport("torchtitan's presets train with AdamW; plan with --optimizer adam")
    if settings.fp8 not in (None, "rowwise"):
        raise UnsupportedExport(f"torchtitan 0.3's Float8LinearConverter scales rowwise (torchao), not {settings.fp8}; "
                                "plan again with --target torchtitan --dtype fp8")
    if pipeline is None:
        return
    if model.tied_embeddings:
        raise UnsupportedExport(
            "torchtitan does not pipeline a model with tied embedding and LM head weights (NotImplementedError in "
            "Decoder.Config.update_from_config); plan with --pp 1"
        )
    if pipeline.num_layers != model.num_layers:
        raise UnsupportedExport(
            f"the pipeline cuts {pipeline.num_layers} layers but the model has {model.num_layers}; plan the model again"
        )
    if pipeline.schedule in ("zb-h1", "zbv") and (settings.engine or "fused") == "fused":
        # torch 2.13's ScheduleInterleavedZeroBubble / ScheduleZBVZeroBubble: "we dont support input/weight
        # backward split with torch.compile", so the fused kernels priced would not run
        raise UnsupportedExport(
            f"torch.distributed.pipelining's zero-bubble schedules ({SCHEDULES[pipeline.schedule]}) split the backward "
            "into input and weight passes, which torch.compile'd blocks do not support; plan with --engine eager"
        )
    if pipeline.schedule == "zb-h1" and pipeline.chunks < 2:
        raise UnsupportedExport(
            "torch.distributed.pipelining runs ZB-H1 looped only (ScheduleInterleavedZeroBubble, two or more model "
            "chunks per rank); plan with --chunks 2"
        )


def _launch(plan_input: PlanInput) -> _Launch:
    """The degrees, processes and batch of ``plan_input``, or the first rule torchtitan breaks."""
    graph, pipeline = plan_input.graph, plan_input.pipeline
    arch = torchtitan_arch(graph)
    model = arch.model
    _check_settings(plan_input, model, pipeline if pipeline is not None and pipeline.pp > 1 else None)  # before the splits
    layout = tp_layout(graph, model, target="megatron")
    dp, model_split = launcher_degrees(graph, plan_input.spaces, plan_input.strategy.choice, model.roles)
    # the layers' linears split the sequence cp ways and their weights tp ways: their split is cp x tp
    cp = context_parallel_degree(graph, plan_input.spaces, plan_input.strategy.choice, layout.rules)
    cp = cp if model_split % cp == 0 else 1
    tp = model_split // cp
    sp, result = _family(plan_input, layout, dp, tp, cp, name=arch.family.name)
    fallbacks = tuple(sorted({layout.rules[i].role for i in result.replicated_fallbacks})) if tp > 1 else ()
    return _shape(plan_input, arch, dp=dp, tp=tp, sequence_parallel=sp, fallbacks=fallbacks, cp=cp)


def _shape(plan_input: PlanInput, arch: TorchtitanArch, *, dp: int, tp: int, sequence_parallel: bool,
           fallbacks: tuple[str, ...] = (), cp: int = 1) -> _Launch:
    """The launch of a plan whose splits are torchtitan's at ``dp x cp x tp``: the settings, the stages,
    whole nodes, the batch split and torchtitan's own rules on the overrides, checked."""
    cluster, model = plan_input.cluster, arch.model
    if arch.moe is not None and plan_input.settings.capacity_factor != 1.0:
        raise UnsupportedExport(f"torchtitan's standard token dispatcher drops no token, not capacity factor "
                                f"{plan_input.settings.capacity_factor:g}; plan with --capacity-factor 1")
    pipeline = plan_input.pipeline if plan_input.pipeline is not None and plan_input.pipeline.pp > 1 else None
    _check_settings(plan_input, model, pipeline)
    # the degrees torchtitan's expert parallelism borrows (exporters.torchtitan.experts)
    experts = expert_parallel_refusal(plan_input.settings, arch.moe, model, dp=dp, cp=cp, tp=tp,
                                      expert_ffn=arch.routing.expert_ffn if arch.routing is not None else None)
    if experts:
        raise UnsupportedExport(experts)
    if cp > 1 and plan_input.settings.zero_stage == 0:
        raise UnsupportedExport(
            f"torchtitan shards parameters over the cp ranks too (FSDP2 over dp_shard x cp), so cp={cp} has no "
            "replicated (ZeRO-0) setting; plan with --zero 3"
        )
    pp = 1 if pipeline is None else pipeline.pp
    if pipeline is not None and dp * cp * tp != pipeline.devices_per_stage:
        raise UnsupportedExport(
            f"the plan runs {_shown(dp, cp, tp)} on stages of {pipeline.devices_per_stage} devices, leaving some idle; "
            "torchtitan's mesh gives every stage dp x cp x tp ranks"
        )
    world = dp * cp * tp * pp
    nnodes, per_node = torchrun_nodes(world, cluster.devices_per_node)
    per_rank = samples_per_rank(plan_input, dp, pipeline)
    # With a pipeline the whole step is one local batch cut into micro-batches; without, each pass
    # is one local batch and the passes are gradient-accumulation steps.
    local = per_rank * (plan_input.samples_per_step // plan_input.samples_per_pass if pipeline is not None else 1)
    launch = _Launch(arch=arch, dp=dp, tp=tp, pp=pp, sequence_parallel=sequence_parallel, pipeline=pipeline,
                     world=world, nnodes=nnodes, per_node=per_node, local_batch=local, fallbacks=fallbacks, cp=cp)
    validate_torchtitan(torchtitan_overrides(launch, plan_input), world_size=world, model=TorchtitanModel(
        num_layers=model.num_layers, num_attention_heads=model.num_attention_heads,
        num_kv_heads=model.num_query_groups, tied_embeddings=model.tied_embeddings, moe=arch.moe is not None))
    return launch


def _launch_or_none(plan_input: PlanInput, family: Any) -> _Launch | None:
    """:func:`_shape` for a plan of ``family`` (its splits already in the family's masks), ``None``
    where the exporter refuses it: the stage rule's answer, with no export."""
    try:
        return _shape(plan_input, torchtitan_arch(plan_input.graph), dp=family.dp or 1, tp=family.tp or 1,
                      sequence_parallel=family.label.endswith(" sp"), cp=family.cp)
    except UnsupportedExport:
        return None


def _model_parts(pipeline: PipelineSpec) -> list[list[str]]:
    """``module_fqns_per_model_part``: the stage cut as module names, ``pp x chunks`` parts in model
    order (part ``v * pp + s`` is virtual stage ``v`` of rank ``s``; under ``zbv`` torchtitan places
    the parts in a V, part ``k`` on rank ``k`` for ``k < pp`` and on rank ``2 pp - 1 - k`` after:
    ``stage_ids_this_rank(..., style="v")``). A rank's chunks hold the layers the plan was priced with
    (``planner.core.chunks.chunk_layers``: equal where ``chunks`` divides them, else as even as whole
    layers allow); torchtitan builds each part from its names, whatever their count."""
    counts = [int(n) for n in pipeline.layers_per_stage]
    pp, chunks = len(counts), pipeline.chunks
    split = [chunk_layers(layers, chunks, first_stage=s == 0) for s, layers in enumerate(counts)]
    parts, first = [], 0
    for index in range(pp * chunks):
        rank = index % pp if pipeline.schedule != "zbv" or index < pp else 2 * pp - 1 - index
        size = split[rank][index // pp]
        parts.append([f"layers.{i}" for i in range(first, first + size)])
        first += size
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    empty = [i for i, part in enumerate(parts) if not part]
    if empty:
        raise UnsupportedExport(
            f"virtual pipeline stage {empty[0]} holds no module and torchtitan builds a stage from its modules; "
            "plan with fewer stages or chunks"
        )
    return parts


def data_parallel_split(dp: int, settings: TrainingSettings) -> tuple[int, int]:
    """``(data_parallel_replicate_degree, data_parallel_shard_degree)`` of ``dp`` data-parallel ranks:
    DDP (all replicate) at ZeRO-0, FSDP2 (all shard) at ZeRO-3, HSDP (``settings.dp_shard``: the
    shard group, ``gcd(dp, dp_shard)`` ranks; the rest replicate) as torchtitan builds it
    (``ParallelDims``: ``fully_shard`` on the ``("dp_replicate", "dp_shard")`` mesh when both exceed 1).

    >>> from planner.core.settings import TrainingSettings
    >>> [data_parallel_split(16, TrainingSettings(zero_stage=z, dp_shard=s)) for z, s in ((0, None), (3, None), (3, 8))]
    [(16, 1), (1, 16), (2, 8)]
    """
    if settings.zero_stage == 0:
        return dp, 1
    shard = dp if settings.dp_shard is None else math.gcd(dp, settings.dp_shard)
    return dp // shard, shard


def torchtitan_overrides(launch: _Launch, plan_input: PlanInput) -> list[str]:
    """The dotted overrides of ``launch`` (``ParallelismConfig``, ``TrainingConfig``, ``CompileConfig``
    field names), ending with the activation-checkpoint subcommand, which tyro reads last."""
    settings, pipeline = plan_input.settings, launch.pipeline
    replicate, shard = data_parallel_split(launch.dp, settings)
    args = [
        "--parallelism.data_parallel_replicate_degree", str(replicate),
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--parallelism.tensor_parallel_degree", str(launch.tp),
        "--parallelism.enable_sequence_parallel" if launch.sequence_parallel
        else "--parallelism.no_enable_sequence_parallel",
        "--parallelism.pipeline_parallel_degree", str(launch.pp),
        "--parallelism.context_parallel_degree", str(launch.cp),
    ]
    ep = settings.expert_parallel
    if launch.arch.moe is not None:
        # explicit for every MoE model, so no preset's degree leaks in (qwen3_30b_a3b and the deepseek_v3
        # presets set their own); the planner's ep is torchtitan's where expert_parallel_refusal allows it
        args += ["--parallelism.expert_parallel_degree", str(ep)]
    if settings.zero_stage == 3 and settings.reshard_after_forward != "default":
        # FSDP2's reshard_after_forward as priced (objectives.memory.fsdp_unsharded_peak's kept units, the gathers
        # objectives.intra_op counts); "default" is torchtitan's own, left unwritten
        args += ["--parallelism.fsdp_reshard_after_forward", settings.reshard_after_forward]
    if launch.cp > 1:
        # FlexAttention (the config module's attention) is balanced by the PTRR balancer; the default
        # head-tail one is SDPA's (ParallelismConfig.context_parallel_load_balancer)
        args += ["--parallelism.context_parallel_load_balancer", "ptrr"]
    if pipeline is not None:
        args += ["--parallelism.pipeline_parallel_schedule", SCHEDULES[pipeline.schedule],
                 "--parallelism.pipeline_parallel_microbatch_size", str(pipeline.micro_batch),
                 "--parallelism.module_fqns_per_model_part", *(",".join(p) for p in _model_parts(pipeline))]
    args += torchtitan_cuda_graph_args(settings, pipelined=pipeline is not None,
                                       experts_split=launch.arch.moe is not None and ep > 1)
    args += [
        "--training.local_batch_size", str(launch.local_batch),
        "--training.global_batch_size", str(plan_input.samples_per_step),
        "--training.seq_len", str(launch.model.seq_length),
        "--training.mixed_precision_param", "bfloat16" if settings.precision == "bf16-mixed" else "float32",
    ]
    if settings.offload == "parameters":  # FSDP2's CPUOffloadPolicy, as priced (objectives.offload)
        args.append("--training.enable_cpu_offload")
    if (settings.engine or "fused") == "fused":
        args.append("--compile.enable")  # the fused kernels priced are torch.compile's
    args += torchtitan_async_tp_args(settings, tp=launch.tp, sequence_parallel=launch.sequence_parallel)
    # torchtitan's SelectiveAC is the op-level policy the planner calls 'op'
    args.append({"full": "activation-checkpoint:full", "op": "activation-checkpoint:selective"}.get(
        settings.recompute, "activation-checkpoint:none"))
    return args


def torchtitan_async_tp_args(settings: TrainingSettings, *, tp: int, sequence_parallel: bool) -> list[str]:
    """``--compile.enable_async_tensor_parallel`` for a plan priced with torch's micro-pipelined TP
    (``TrainingSettings.tp_overlap_method``, :mod:`objectives.tp_overlap`) at ``tp > 1``; nothing without the
    knob or at ``tp = 1`` (no tensor-parallel mesh: torchtitan's ``_maybe_enable_async_tp`` does nothing).

    >>> from planner.core.settings import TrainingSettings
    >>> on = TrainingSettings(tp_comm_overlap=True, tp_overlap_method="micro-pipeline")
    >>> torchtitan_async_tp_args(on, tp=8, sequence_parallel=True), torchtitan_async_tp_args(on, tp=1, sequence_parallel=False)
    (['--compile.enable_async_tensor_parallel'], [])

    Raises
    ------
    UnsupportedExport
        A plan priced with Megatron-LM's userbuffers, without sequence parallelism, or not compiled
        (``CompileConfig.__post_init__``: "Async TP requires 'model' in --compile.components and --compile.enable").
    """
    if not settings.tp_comm_overlap or tp == 1:
        return []
    if settings.tp_overlap_method != "micro-pipeline":
        raise UnsupportedExport("the plan was priced with Megatron-LM's --tp-comm-overlap (Transformer Engine "
                                "userbuffers), which torchtitan does not run; plan with --target torchtitan")
    if (settings.engine or "fused") != "fused":
        raise UnsupportedExport("torchtitan's async TP runs inside torch.compile'd blocks (--compile.enable), and the "
                                "plan is priced eager; drop --engine eager or --fix tp_overlap=on")
    if not sequence_parallel:
        raise UnsupportedExport("torchtitan's async TP fuses the sequence-parallel all-gathers and reduce-scatters "
                                "with the GEMMs, and the plan has no sequence parallelism; plan a sequence-parallel row")
    return ["--compile.enable_async_tensor_parallel"]


def torchtitan_cuda_graph_args(settings: TrainingSettings, *, pipelined: bool, experts_split: bool) -> list[str]:
    """``--training.disable_cuda_graphs`` exactly when the plan was priced launched kernel by kernel
    (``TrainingSettings.cuda_graphs`` off); nothing for a plan priced as torchtitan's default CUDA-graph replay of
    each micro-batch's forward and backward (``trainer.py``: ``wrap_with_cuda_graph(self.fwd_bwd_fn)``).

    >>> from planner.core.settings import TrainingSettings
    >>> on, off = TrainingSettings(cuda_graphs=True), TrainingSettings()
    >>> torchtitan_cuda_graph_args(on, pipelined=False, experts_split=False), torchtitan_cuda_graph_args(off, pipelined=True, experts_split=False)
    ([], ['--training.disable_cuda_graphs'])

    Raises
    ------
    UnsupportedExport
        A plan priced with CUDA graphs that torchtitan 0.3.0 refuses to capture (``Trainer.Config._validate_cuda_graphs``,
        trainer.py l. 179-210): a pipeline, or experts split over ranks with the all-to-all dispatcher, which syncs
        with the host.
    """
    if not settings.cuda_graphs:
        return ["--training.disable_cuda_graphs"]
    if settings.cuda_graph_scope != "step":
        raise UnsupportedExport("the plan was priced with Megatron-LM's per-layer CUDA graphs, which torchtitan does not "
                                "capture (it replays each whole micro-batch); plan with --target torchtitan")
    if pipelined:
        raise UnsupportedExport("the plan was priced with CUDA graphs, which torchtitan 0.3 does not capture under "
                                "pipeline parallelism; plan with --fix cuda_graphs=off or pp=1")
    if experts_split:
        raise UnsupportedExport("the plan was priced with CUDA graphs, which torchtitan 0.3 does not capture with its "
                                "all-to-all expert dispatcher (it syncs with the host); plan with --fix cuda_graphs=off")
    return []


def _command(launch: _Launch, overrides: list[str]) -> str:
    launcher = ["torchrun", "--nproc-per-node", str(launch.per_node)]
    if launch.nnodes > 1:
        launcher += ["--nnodes", str(launch.nnodes), "--node-rank", "$NODE_RANK", "--master-addr", "$MASTER_ADDR",
                     "--master-port", "29500"]
    parts = [*launcher, "-m", "torchtitan.train", "--module", CONFIG_MODULE, "--config", CONFIG_FUNCTION, *overrides]
    # $NODE_RANK and $MASTER_ADDR are for the shell to expand, so they stay unquoted
    return "PYTHONPATH=. " + " ".join(p if p.startswith("$") else shlex.quote(p) for p in parts)


def export_torchtitan(plan_input: PlanInput) -> dict[str, Any]:
    """The torchtitan launch plan of a strategy, or :class:`UnsupportedExport` with the reason.

    Returns
    -------
    dict
        ``target``, ``torchtitan_version``, ``world_size``, ``nnodes``, ``nproc_per_node``, ``degrees``,
        ``pipeline``, ``module`` / ``config`` (``--module`` / ``--config``), ``config_file`` (``path``
        and ``text`` of the registry module to write beside the launch), ``overrides`` (list),
        ``command`` (one shell line), ``model`` sizes, ``batch``, ``notes``.
    """
    launch = _launch(plan_input)
    model, pipeline = launch.model, launch.pipeline
    overrides = torchtitan_overrides(launch, plan_input)
    replicate, shard = data_parallel_split(launch.dp, plan_input.settings)
    return {
        "target": "torchtitan",
        "torchtitan_version": TORCHTITAN_VERSION,
        "world_size": launch.world,
        "nnodes": launch.nnodes,
        "nproc_per_node": launch.per_node,
        "degrees": {"dp": launch.dp, "dp_replicate": replicate, "dp_shard": shard, "tp": launch.tp, "pp": launch.pp,
                    "cp": launch.cp, "ep": plan_input.settings.expert_parallel if launch.arch.moe is not None else 1,
                    "sequence_parallel": launch.sequence_parallel},
        "pipeline": None if pipeline is None else {
            "pp": launch.pp, "schedule": SCHEDULES[pipeline.schedule], "virtual_stages": pipeline.chunks,
            "layers_per_stage": list(pipeline.layers_per_stage), "ranks_per_stage": launch.dp * launch.cp * launch.tp,
        },
        "module": CONFIG_MODULE,
        "config": CONFIG_FUNCTION,
        "config_file": {"path": f"{CONFIG_MODULE}.py",
                        "text": torchtitan_config_module(launch.arch, fp8=plan_input.settings.fp8)},
        "overrides": overrides,
        "command": _command(launch, overrides),
        "model": {"family": launch.arch.family.name, "num_layers": model.num_layers, "hidden_size": model.hidden_size,
                  "ffn_hidden_size": model.ffn_hidden_size, "num_attention_heads": model.num_attention_heads,
                  "num_kv_heads": model.num_query_groups, "head_dim": model.head_dim, "seq_length": model.seq_length,
                  "vocab_size": model.vocab_size, "tied_embeddings": model.tied_embeddings,
                  "qk_norm": model.features.qk_norm == "per-head", "rope_theta": launch.arch.theta,
                  "norm_eps": launch.arch.eps,
                  "experts": None if launch.arch.moe is None else {
                      "num_experts": launch.arch.moe.num_experts, "top_k": launch.arch.moe.top_k,
                      "renormalized": launch.arch.moe.renormalized, **_routing(launch.arch)}},
        "batch": {"local_batch_size": launch.local_batch, "global_batch_size": plan_input.samples_per_step,
                  "micro_batch_size": plan_input.samples_per_pass // launch.dp,
                  "num_microbatches": plan_input.samples_per_step // plan_input.samples_per_pass},
        "time_s": float(plan_input.strategy.time_s),
        "memory_bytes": float(plan_input.strategy.memory_bytes),
        "notes": _notes(launch) + ([_FP8_NOTE] if plan_input.settings.fp8 else []) + folded_norm_note(
            plan_input.graph, "if it does, torchtitan's RMSNorm, which scales by the weight, trains another "
            "parametrisation (the same function at the start; weight decay pulls the scale to 0, not 1)")
        + head_copy_note(plan_input.graph, model, f"set enable_weight_tying=True in {CONFIG_MODULE}.py"),
    }


def _routing(arch: TorchtitanArch) -> dict:
    """The JSON's deepseek_v3 MoE fields (:class:`exporters.torchtitan.moe.DeepSeekRouting`), ``{}`` otherwise."""
    routing = arch.routing
    if routing is None:
        return {}
    router = routing.router
    return {"n_dense_layers": routing.n_dense_layers, "expert_ffn_hidden_size": routing.expert_ffn,
            "num_shared_experts": routing.num_shared_experts, "score_function": router.score_function,
            "num_expert_groups": router.groups, "num_limited_groups": router.topk_groups,
            "route_scale": router.scaling, "load_balance_coeff": routing.load_balance_coeff}


_FP8_NOTE = ("FP8 linear layers through torchao float8 (rowwise): pip install torchao (0.18.0 is the version checked "
             "with torchtitan 0.3.0's converter); the config module converts the model with Float8LinearConverter, "
             "which needs an SM89+ GPU (H100, H200, B200)")


def _notes(launch: _Launch) -> list[str]:
    arch = launch.arch
    notes = [
        f"write config_file.text to {CONFIG_MODULE}.py in the launch directory (jq -r .config_file.text plan.json > "
        f"{CONFIG_MODULE}.py); it keeps {arch.family.preset}'s data and tokenizer settings: point --hf_assets_path at a "
        f"tokenizer of {launch.model.vocab_size} tokens and --dataloader.dataset at your data",
    ]
    if not arch.theta_read:
        notes.append(f"the rotary base is not in the model file (its frequencies were stripped); the module uses "
                     f"{arch.family.name}'s theta={arch.theta:g} (edit it to match)")
    if not arch.eps_read:
        notes.append(f"the norms' epsilon is not in the model file; the module uses {arch.family.name}'s "
                     f"eps={arch.eps:g} (edit it to match)")
    if arch.window is not None:
        notes.append(f"the model attends within a sliding window of {arch.window} tokens, no narrower than the "
                     f"{launch.model.seq_length}-token sequence, so torchtitan's causal attention is the same mask; "
                     "a longer --training.seq_len would train another model")
    if launch.cp > 1:
        notes.append(f"context parallelism cp={launch.cp}: FlexAttention gathers K/V over the cp ranks (flex_cp_allgather), "
                     "priced as Megatron-LM's all_gather context parallelism; FSDP2 shards over dp_shard x cp")
    if arch.routing is not None and arch.routing.load_balance_coeff is not None:
        notes.append(f"the router adds a per-expert bias to its scores before the expert choice (DeepSeek-V3's "
                     f"e_score_correction_bias): MoE.load_balance_coeff={arch.routing.load_balance_coeff:g}, which "
                     "torchtitan updates after each step (DeepSeek-V3's gamma); the graph shows the bias, not its rule")
    if launch.fallbacks:
        notes.append(
            f"the planner kept {', '.join(launch.fallbacks)} ops replicated over tp because their split does not divide "
            "evenly; torchtitan shards them unevenly, so it runs at least as fast as priced"
        )
    return notes
