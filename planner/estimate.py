r"""What-if: price one Megatron-style configuration with the search's cost model, and rank it.

A Megatron-LM (or DeepSpeed) user already has a configuration: ``tp`` x ``cp`` x ``pp`` x ``dp``
devices, a micro-batch per data-parallel rank, a global batch, a ZeRO stage (Megatron's distributed
optimizer is ZeRO-1), activation recomputation, sequence and context parallelism. :func:`estimate`
prices exactly that:

* per op, the configuration of Megatron's pattern at ``dp x cp x tp`` on one stage's devices
  (:func:`exporters.megatron.megatron_masks`, the masks the search's Megatron families use;
  column-/row-parallel linears, vocabulary-parallel embedding and head, norms replicated or split
  along the sequence with ``sequence_parallel``; with ``cp > 1`` every op's sequence split ``cp``
  ways more, attention's query sequence only, so keys and values are all-gathered over the ``cp``
  ranks; with ``dp``, ``cp`` and ``tp`` all above 1 an op splits three dims, priced in configuration
  spaces that hold three, :func:`_holding_split_dims`, where the search's hold two and, for a long sequence
  under a launcher that runs ``cp``, only the configurations of three this layout places as the launchers do,
  ``planner.core.configs.ConfigOptions.context_dims``); a model
  Megatron-LM does not recognise as a GPT gets the uniform ``dp x tp`` family
  (:func:`planner.families.uniform_masks`) instead, and a note says so (it has no ``cp``);
* layers split evenly over the ``pp`` stages (Megatron's default), or as ``stage_layers`` says
  (``--decoder-first/last-pipeline-num-layers``), embeddings on the first stage, the head on the last;
* the pipeline priced by :func:`planner.pipeline.evaluate_pipeline` (the same function every point
  of :func:`planner.pipeline.pipeline_search` goes through), so a configuration and the frontier
  compare on one scale.

It returns the step time, memory per device with its breakdown (the stage that needs most), and,
given a search result, where the configuration ranks; or, for a configuration that cannot run,
why (:attr:`Estimate.reason`, ending with the fix).

:func:`megatron_grid` prices every Megatron configuration of a cluster (the exhaustive grid a user
would sweep by hand) and returns the fastest that fits: the benchmark's reference.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from objectives.pipeline_price import zero_sync_rule
from planner.core.cluster import Cluster
from planner.core.configs import divisors
from planner.core.errors import InputError, PlannerError
from planner.core.graph import OpGraph
from planner.core.settings import CostModelName, TrainingSettings
from planner.core.strategy import MemoryBreakdown
from planner.coupling import require_samples
from planner.pipeline import (
    GraphAtBatch,
    PipelineCostCache,
    PipelinePoint,
    PipelineOptions,
    PipelineResult,
    _choose_intra_op,
    _Restricted,
    evaluate_pipeline,
    graph_loader,
    pipeline_search,
)

__all__ = ["MegatronConfig", "Estimate", "GridResult", "estimate", "estimate_file", "megatron_grid"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronConfig:
    """A Megatron-style configuration (the flags of ``planner estimate``)."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    """Samples per data-parallel rank per micro-batch (``--micro-batch-size``)."""
    cp: int = 1
    """Context-parallel degree (``--context-parallel-size``): the ``cp`` ranks of a data-parallel rank
    share its samples, each holding ``seq / cp`` tokens of each."""
    global_batch: int
    zero: int = 0
    """0, 1 (Megatron: ``--use-distributed-optimizer``), 2 or 3."""
    recompute: Literal["none", "selective", "full"] = "none"
    sequence_parallel: bool = False
    schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    chunks: int = 1
    stage_layers: tuple[int, ...] | None = None
    """Layers per stage; ``None``: an even split."""

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step (gradient accumulation steps)."""
        return self.global_batch // (self.micro_batch * self.dp)

    def describe(self) -> str:
        """E.g. ``"dp=2 x tp=4 x pp=2, mb=1, gb=512, zero=1, recompute=selective, sp"`` (``x cp=2``
        after ``dp`` when ``cp > 1``)."""
        cp = f" x cp={self.cp}" if self.cp > 1 else ""
        text = f"dp={self.dp}{cp} x tp={self.tp} x pp={self.pp}, mb={self.micro_batch}, gb={self.global_batch}"
        text += f", zero={self.zero}, recompute={self.recompute}"
        if self.sequence_parallel:
            text += ", sp"
        if self.schedule != "1f1b":
            text += f", {self.schedule}" + (f" x{self.chunks}" if self.chunks > 1 else "")
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """One configuration priced, or why it cannot run."""

    config: MegatronConfig
    valid: bool
    reason: str = ""
    """Why the configuration cannot run, ending with the fix (empty when valid)."""
    point: PipelinePoint | None = None
    """The priced plan (stages, per-op splits, time and memory breakdowns)."""
    fits: bool = False
    memory_limit_bytes: float = 0.0
    rank: int | None = None
    """1 + the frontier points that fit and are strictly faster (``None`` without a frontier or when
    the configuration does not fit)."""
    frontier_points: int = 0
    fitting_points: int = 0
    """Frontier points that fit (the plans :attr:`rank` counts)."""
    best_time_s: float | None = None
    """The frontier's fastest plan that fits."""
    dominated_by: int | None = None
    """Index of a frontier point at least as fast with no more memory (one strictly better)."""
    notes: tuple[str, ...] = ()
    estimate_time_s: float = 0.0

    @property
    def time_s(self) -> float:
        """Seconds per step (``inf`` when invalid)."""
        return self.point.time_s if self.point is not None else float("inf")

    @property
    def memory_bytes(self) -> float:
        """Peak memory per device (``inf`` when invalid)."""
        return self.point.memory_bytes if self.point is not None else float("inf")

    @property
    def memory(self) -> MemoryBreakdown | None:
        return None if self.point is None else self.point.memory

    @property
    def samples_per_s(self) -> float:
        return self.point.samples_per_s if self.point is not None else 0.0

    @property
    def slowdown_vs_best(self) -> float | None:
        """Step time / the frontier's fastest fitting step time."""
        if self.point is None or not self.best_time_s:
            return None
        return self.point.time_s / self.best_time_s


def _invalid(config: MegatronConfig, reason: str, started: float, notes: Sequence[str] = ()) -> Estimate:
    return Estimate(
        config=config, valid=False, reason=reason, notes=tuple(notes), estimate_time_s=time.perf_counter() - started
    )


def _as_cache(
    graph: OpGraph | GraphAtBatch | PipelineCostCache,
    *,
    cluster: Cluster,
    settings: TrainingSettings | None,
    batch: int,
    cost_model: str,
) -> PipelineCostCache:
    from importers.moe import find_moe_layers

    if isinstance(graph, PipelineCostCache):
        return graph
    if isinstance(graph, OpGraph):
        from planner.plan import samples_per_step

        bound = samples_per_step(graph)
        if bound != batch:
            raise InputError(
                f"the graph is bound at batch {bound} but this configuration needs micro_batch x dp = {batch} samples "
                "per micro-batch; pass a graph_at_batch function (planner.pipeline.graph_loader(path, dims))"
            )
        fixed = graph

        def graph_at_batch(samples: int) -> OpGraph:
            return fixed

        return PipelineCostCache(graph_at_batch, cluster=cluster, settings=settings, cost_model=cost_model,  # type: ignore[arg-type]
                                 moe_layers=find_moe_layers)
    # MoE layers priced as the search prices them (objectives.moe: routed tokens, ep from the settings)
    return PipelineCostCache(graph, cluster=cluster, settings=settings, cost_model=cost_model,  # type: ignore[arg-type]
                             moe_layers=find_moe_layers)


def _megatron_reason(graph: OpGraph, tp: int, *, sequence_parallel: bool = False) -> str | None:
    """Why Megatron's pattern has no configuration at ``tp`` (``sequence_parallel``: ``--sequence-parallel``);
    ``None`` when it is not a Megatron GPT."""
    from exporters.megatron.moe import MOE_TP_NEEDS_SP
    from importers.transformer import analyze_transformer, moe_summary

    try:
        model = analyze_transformer(graph)
    except PlannerError:
        return None
    if model.irregular or model.lm_head is None:
        return None
    if model.num_attention_heads % tp:
        return f"{model.num_attention_heads} attention heads are not divisible by tp={tp}; choose a --tp that divides them"
    if model.num_query_groups % tp and tp % model.num_query_groups:
        return f"{model.num_query_groups} query groups do not fit tp={tp}; choose a --tp that divides them"
    if model.ffn_hidden_size % tp:
        return f"the FFN size {model.ffn_hidden_size} is not divisible by tp={tp}; choose another --tp"
    if tp > 1 and not sequence_parallel and moe_summary(graph) is not None:  # as the export refuses it
        return f"{MOE_TP_NEEDS_SP}; pass --sequence-parallel or --tp 1"
    return "Megatron-LM's layout has no configuration at dp x tp on this model; try another --tp"


def _pattern_masks(
    graph: OpGraph, spaces, *, dp: int, tp: int, sequence_parallel: bool, per_node: int, cp: int = 1
) -> tuple[list[np.ndarray] | None, str, tuple[str, ...]]:
    """Per op, the configurations of Megatron's pattern (or the uniform family); or why there are none."""
    from importers.transformer import analyze_transformer
    from exporters.megatron import megatron_masks
    from planner.families import uniform_masks

    notes: tuple[str, ...] = ()
    is_gpt = False
    try:
        model = analyze_transformer(graph)
        is_gpt = not model.irregular and model.lm_head is not None
    except PlannerError:
        is_gpt = False
    if is_gpt:
        masks = megatron_masks(
            graph, spaces, dp=dp, tp=tp, sequence_parallel=sequence_parallel, devices_per_node=per_node, cp=cp
        )
        if masks is None:
            if cp > 1 and model.seq_length % (2 * cp):
                # Megatron-LM balances causal attention over 2 x cp chunks (get_batch_on_this_cp_rank)
                return None, (f"the sequence of {model.seq_length} tokens does not cut into 2 x cp = {2 * cp} "
                              "chunks; choose a --cp that divides seq / 2"), notes
            if cp > 1:
                return None, (f"Megatron-LM's layout has no configuration at dp={dp} x cp={cp} x tp={tp} on this "
                              "model; try another --cp or --tp"), notes
            why = _megatron_reason(graph, tp, sequence_parallel=sequence_parallel)
            return None, why or "Megatron-LM's layout does not fit these degrees", notes
    elif cp > 1:
        return None, ("context parallelism is Megatron-LM's layout and this model is not a Megatron-LM GPT; "
                      "drop --cp"), notes
    else:
        masks = uniform_masks(graph, spaces, dp=dp, tp=tp)
        notes = ("not a Megatron-LM GPT model: priced as the uniform dp x tp family (every op's batch split dp "
                 "ways, its other dims tp ways or not at all)",)
        if sequence_parallel:
            notes += ("sequence parallelism is a Megatron-LM layout and was not applied",)
        if masks is None:
            return None, f"some op's batch cannot be split dp={dp} ways; choose a smaller --dp or a larger --micro-batch", notes
    if any(not m.any() for m in masks):
        empty = next(i for i, m in enumerate(masks) if not m.any())
        return None, (
            f"op {graph.ops[empty].name} has no configuration of this layout on {dp * cp * tp} devices; "
            "choose other --tp/--dp"
        ), notes
    return masks, "", notes


def _checked_config(
    cluster: Cluster, *, tp: int, pp: int, dp: int | None, micro_batch: int, global_batch: int, zero: int,
    recompute: str, sequence_parallel: bool, schedule: str, chunks: int, stage_layers: Sequence[int] | None,
    cp: int = 1,
) -> tuple[MegatronConfig, str]:
    """The configuration :func:`estimate` prices (``dp`` defaulting to ``devices / (tp * cp * pp)``),
    and why it cannot run on ``cluster`` (``""`` when it can).

    Raises
    ------
    InputError
        A degree or batch below 1, or an unknown ZeRO stage or recompute mode.
    """
    devices = cluster.devices
    if tp < 1 or pp < 1 or cp < 1 or micro_batch < 1 or global_batch < 1:
        raise InputError("--tp, --cp, --pp, --micro-batch and --global-batch must be at least 1")
    if dp is None and devices % (tp * cp * pp):
        config = MegatronConfig(tp=tp, pp=pp, dp=1, cp=cp, micro_batch=micro_batch, global_batch=global_batch,
                                zero=zero, recompute=recompute, sequence_parallel=sequence_parallel)
        degrees = f"tp={tp}" + (f" x cp={cp}" if cp > 1 else "") + f" x pp={pp}"
        return config, f"{degrees} does not divide {devices} devices; choose degrees whose product divides --devices"
    config = MegatronConfig(
        tp=tp, pp=pp, cp=cp, dp=dp if dp is not None else devices // (tp * cp * pp), micro_batch=micro_batch,
        global_batch=global_batch, zero=zero, recompute=recompute, sequence_parallel=sequence_parallel,
        schedule=schedule, chunks=chunks,
        stage_layers=tuple(int(x) for x in stage_layers) if stage_layers is not None else None,
    )
    TrainingSettings(zero_stage=zero, recompute=recompute)  # validates both, with the fix
    return config, _degree_problem(config, devices=devices, per_node=cluster.devices_per_node)


def estimate(
    graph: OpGraph | GraphAtBatch | PipelineCostCache,
    *,
    cluster: Cluster,
    tp: int,
    pp: int,
    dp: int | None = None,
    micro_batch: int,
    global_batch: int,
    zero: int = 0,
    recompute: Literal["none", "selective", "full"] = "none",
    sequence_parallel: bool = False,
    schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b",
    chunks: int = 1,
    stage_layers: Sequence[int] | None = None,
    settings: TrainingSettings | None = None,
    memory_limit_bytes: float | None = None,
    frontier: PipelineResult | None = None,
    cost_model: CostModelName = "roofline",
    cp: int = 1,
    sequence_shard_saved: bool | None = None, fused_swiglu: bool | None = None,
    grad_accumulator: Callable[..., float] | float | None = None, megatron_rules: bool = False, zero_sync: Any = None,
    target: str | None = None, cuda_graphs: bool | None = None,
) -> Estimate:
    r"""Price one Megatron-style configuration (module docstring) and rank it against a frontier: an
    :class:`Estimate`, ``valid=False`` with ``reason`` when the configuration cannot run.

    Parameters
    ----------
    graph:
        The model: a ``samples -> OpGraph`` function (:func:`planner.pipeline.graph_loader`), a
        :class:`~planner.pipeline.PipelineCostCache` (shares cost models with a search, unless the layout splits
        more dims per op than it holds: :func:`_holding_split_dims`), or an op graph bound at ``micro_batch * dp`` samples.
    cluster:
        All devices; ``tp * cp * pp * dp`` must equal their count.
    tp, pp, dp:
        Tensor, pipeline and data parallel degrees (``dp``: default ``devices / (tp * cp * pp)``).
    micro_batch, global_batch:
        Samples per data-parallel rank per micro-batch; samples per step (a multiple of ``micro_batch * dp``).
    zero, recompute:
        ZeRO stage (1 = Megatron's distributed optimizer); ``none``, ``selective`` (attention core) or ``full``.
    sequence_parallel:
        Megatron's ``--sequence-parallel`` (needs ``tp > 1``).
    schedule, chunks, stage_layers:
        Pipeline schedule (``interleaved`` with ``chunks`` model chunks per device); layers per stage (default: even).
    settings:
        Precision and optimizer (ZeRO and recompute are taken from the arguments).
    memory_limit_bytes:
        Per device; default the device's memory.
    frontier:
        A :func:`~planner.pipeline.pipeline_search` result to rank against.
    cost_model:
        As for :func:`planner.plan.build_model`.
    cp:
        Context-parallel degree (Megatron-LM's ``--context-parallel-size``, rank order tp-cp-dp-pp):
        each of a data-parallel rank's ``cp`` ranks holds ``seq / cp`` tokens of its micro-batch and
        whole weights, and all-gathers the keys and values of the others for attention.
    sequence_shard_saved, fused_swiglu, grad_accumulator, zero_sync:
        Launcher rules (``Target.sequence_shard_saved``, ``Target.fused_swiglu``: Megatron-Core's; ``Target.grad_accumulator``,
        ``Target.zero_sync``: DeepSpeed's ``BF16_Optimizer`` bytes and ZeRO-1/2 synchronisation) priced as its search prices
        them; ``None``: ``settings``' (the cache's), or with ``megatron_rules`` Megatron-Core's on Megatron-LM's GPT layout.
    target, cuda_graphs:
        The launcher whose row it is, priced as its search prices it (:func:`_priced_cache`); ``cuda_graphs``: pinned.

    Examples
    --------
    >>> from objectives.cluster import make_cluster
    >>> from planner.pipeline import graph_loader
    >>> at = graph_loader("tests/data/gpt2_tiny.onnx", {"seq": 128})
    >>> e = estimate(at, cluster=make_cluster("a100-80gb", devices=8), tp=2, pp=2, micro_batch=1, global_batch=8)
    >>> e.valid, e.config.dp, e.point.layers_per_stage
    (True, 2, (1, 1))
    """
    started = time.perf_counter()
    config, problem = _checked_config(cluster, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=global_batch,
                                      zero=zero, recompute=recompute, sequence_parallel=sequence_parallel,
                                      schedule=schedule, chunks=chunks, stage_layers=stage_layers, cp=cp)
    if problem := problem or _overlap_problem(settings, tp=tp, sequence_parallel=sequence_parallel):
        return _invalid(config, problem, started)
    cache, problem = _priced_cache(_as_cache(graph, cluster=cluster, settings=settings, batch=(batch := micro_batch * config.dp),
                                             cost_model=cost_model), target, pp=pp, cuda_graphs=cuda_graphs, recompute=recompute, batch=batch,
                                 zero=zero, chunks=chunks)
    cache = _holding_split_dims(cache, config)
    bounds = problem or _stage_bounds(config, layers=cache.structure(batch).num_layers)
    if isinstance(bounds, str):
        return _invalid(config, bounds, started)
    picks, reason, notes = _layout_choice(cache, config, per_node=cluster.devices_per_node, zero_sync=zero_sync)
    if picks is None:
        return _invalid(config, reason, started, notes)
    # planner estimate: priced as Megatron-LM's search prices the same row
    sequence_shard_saved, fused_swiglu = _memory_rules(notes, sequence_shard_saved, fused_swiglu) if megatron_rules else (
        sequence_shard_saved, fused_swiglu)
    limit = float(memory_limit_bytes) if memory_limit_bytes is not None else float(cluster.device.memory_bytes)
    point = evaluate_pipeline(  # the choice is fixed: each edge priced at it alone, no table (chosen_edges)
        cache, pp=pp, batch=batch, zero_stage=zero, recompute=recompute, choice=picks, bounds=bounds,
        global_batch=global_batch, schedule=schedule, chunks=chunks, memory_limit_bytes=limit, chosen_edges=True,
        sequence_shard_saved=sequence_shard_saved, fused_swiglu=fused_swiglu, grad_accumulator=grad_accumulator, zero_sync=zero_sync,
    )
    return Estimate(config=config, valid=True, point=point, fits=point.fits, memory_limit_bytes=limit,
                    **_ranked(point, frontier), notes=notes, estimate_time_s=time.perf_counter() - started)


def _priced_cache(cache: PipelineCostCache, target: str | None, *, pp: int, cuda_graphs: bool | None,
                  recompute: str = "none", batch: int | None = None, zero: int = 0,
                  chunks: int = 1) -> tuple[PipelineCostCache, str]:
    """``cache``, or a fresh one of its graphs under ``target``'s priced settings for ``pp`` stages of ``chunks`` model
    chunks (Megatron-LM's interleaved transfers overlapped) at ZeRO-``zero``
    (:meth:`exporters.targets.Target.priced_settings`: its ZeRO 0-2 synchronisation, CUDA-graph replay, torchtitan's
    at ``pp = 1``, and eager autocast at that stage, the DTensor plan's at ZeRO 0-2 only, so the estimate is the table
    row's seconds; ``cuda_graphs``: ``--fix cuda_graphs`` pinned, ``None``:
    as ``target`` runs it) where they differ; and why a pinned ``cuda_graphs`` cannot run (``""``: it can): a launcher
    that captures none (its ``Target.cuda_graph_scope`` unset: DeepSpeed, Mesh-TF, DTensor), a launcher that replays
    graphs no pipeline (torchtitan's ``_validate_cuda_graphs``), Megatron-LM's per-layer graphs no recomputation
    (``TransformerConfig.__post_init__``, :func:`exporters.megatron.export.megatron_cuda_graph_args`) and, the graph at
    ``batch`` samples given, no MoE layer or hybrid Mamba stack (:func:`_uncaptured_layers`)."""
    if target is None and cuda_graphs is None:
        return cache, ""
    from exporters.targets import target as find_target

    found = find_target(target) if target is not None else None
    if cuda_graphs and found is not None and found.families is not None and found.cuda_graph_scope is None:
        # as planner plan's --fix cuda_graphs=on: only torchtitan and Megatron-LM capture graphs (Target.cuda_graph_scope)
        return cache, (f"{found.name} captures no CUDA graph; use --target torchtitan or megatron, or --no-cuda-graphs")
    if cuda_graphs and pp > 1 and (found is None or found.cuda_graphs):
        return cache, (f"{found.name if found else 'a launcher'} replays no pipeline as a CUDA graph (pp={pp}); "
                       "use --pp 1 or --no-cuda-graphs")
    if cuda_graphs and recompute != "none" and found is not None and found.cuda_graph_scope == "layers":
        return cache, (f"{found.name} refuses recompute {recompute} with per-layer CUDA graphs; use --recompute none "
                       "or --no-cuda-graphs")
    if cuda_graphs and found is not None and found.cuda_graph_scope == "layers" and batch is not None:
        if problem := _uncaptured_layers(cache.graph(batch), found.name):
            return cache, problem
    settings = cache.settings
    priced = _launcher_settings(settings, found, pp=pp, cuda_graphs=cuda_graphs, zero=zero, chunks=chunks)
    if priced == settings:
        return cache, ""
    return PipelineCostCache(cache.graph_at_batch, cluster=cache.cluster, settings=priced, cost_model=cache.cost_model,  # type: ignore[arg-type]
                             measured=cache.measured, moe_layers=cache.moe_layers, context=cache.context), ""


def _holding_split_dims(cache: PipelineCostCache, config: MegatronConfig) -> PipelineCostCache:
    """``cache``, or a fresh one of its graphs and settings whose configuration spaces hold as many split dims per op
    as the layout splits: one per degree above 1 among ``dp``, ``cp`` and ``tp`` (a linear layer's batch, sequence
    and weight dims at ``dp x cp x tp``, the attention core's batch, query sequence and heads). The search's caches
    keep at most 2 (``PipelineCostCache.max_split_dims``: every ``dp x tp`` and ``dp x cp`` family; of 3, only those
    ``ConfigOptions.context_dims`` adds for a long sequence, tensor parallelism inside a node); a wider space
    changes which configurations exist, not what any of them costs, so the layout's configuration is priced as a
    search over the wider space prices it (tests/planner/test_estimate_cp_tp.py)."""
    needed = sum(degree > 1 for degree in (config.dp, config.cp, config.tp))
    if cache.max_split_dims is None or cache.max_split_dims >= needed:
        return cache
    return PipelineCostCache(cache.graph_at_batch, cluster=cache.cluster, settings=cache.settings,  # type: ignore[arg-type]
                             cost_model=cache.cost_model, measured=cache.measured, product_rule=cache.product_rule,
                             max_split_dims=needed, moe_layers=cache.moe_layers, context=cache.context)


def _launcher_settings(settings: TrainingSettings, found: Any, *, pp: int, cuda_graphs: bool | None,
                       zero: int | None = None, chunks: int = 1) -> TrainingSettings:
    """``settings`` as launcher ``found`` (an :class:`exporters.targets.Target`) prices a ``pp``-stage plan of ``chunks``
    model chunks per rank
    (``Target.priced_settings``), its eager autocast at ZeRO-``zero`` (``Target.priced_autocast``: the DTensor plan
    autocasts at ZeRO 0-2 only; ``None``: at the settings' own stage); without a launcher, with the pinned
    ``cuda_graphs`` only (``None``: unchanged)."""
    if found is not None:
        priced = found.priced_settings(settings, pp=pp, cuda_graphs=cuda_graphs, chunks=chunks)
        autocast = priced.autocast if zero is None else found.priced_autocast(settings, zero)
        return priced if autocast == priced.autocast else dataclasses.replace(priced, autocast=autocast)
    return settings if cuda_graphs is None else dataclasses.replace(settings, cuda_graphs=cuda_graphs)


def _uncaptured_layers(graph: OpGraph, launcher: str) -> str:
    """Why ``launcher``'s per-layer CUDA graphs (Megatron-LM's) cannot capture ``graph``'s layers as its export writes
    them (``""``: they can), the refusals of :func:`exporters.megatron.export.megatron_cuda_graph_args` that read the
    model: an MoE layer (captured only with drop-and-pad experts, which the export does not write) and a hybrid Mamba
    stack (not priced), so an estimate prices no row that ``planner plan --fix cuda_graphs=on`` cannot export."""
    from exporters.megatron.mamba import hybrid_stack
    from importers.moe_summary import moe_summary

    if moe_summary(graph):
        return f"{launcher} captures an MoE layer as a CUDA graph only with drop-and-pad experts; use --no-cuda-graphs"
    if hybrid_stack(graph) is not None:
        return f"{launcher}'s per-layer CUDA graphs are not priced for a hybrid Mamba stack; use --no-cuda-graphs"
    return ""


def _memory_rules(notes: tuple[str, ...], sequence_shard_saved: bool | None,
                  fused_swiglu: bool | None) -> tuple[bool | None, bool | None]:
    """The caller's memory rules; where it gives none and the layout priced is Megatron-LM's own (no note from
    :func:`_pattern_masks`), Megatron-Core's (``Target.sequence_shard_saved``, ``Target.fused_swiglu``), as its
    launcher's search prices its rows."""
    from exporters.targets import TARGETS

    if notes:
        return sequence_shard_saved, fused_swiglu
    megatron = TARGETS["megatron"]
    return (megatron.sequence_shard_saved if sequence_shard_saved is None else sequence_shard_saved,
            megatron.fused_swiglu if fused_swiglu is None else fused_swiglu)


def _overlap_problem(settings: TrainingSettings | None, *, tp: int, sequence_parallel: bool) -> str:
    """Why ``settings``' tensor-parallel communication overlap cannot run here (``""``: it can):
    Megatron-LM's validate_args, "Tensor parallel communication/GEMM overlap can happen only when
    sequence parallelism is enabled" (:mod:`objectives.tp_overlap`)."""
    if settings is not None and settings.tp_comm_overlap and tp > 1 and not sequence_parallel:
        return "tensor-parallel communication overlap needs sequence parallelism; add --sequence-parallel"
    return ""


def estimate_file(
    path: str | Path,
    dims: Mapping[str, int],
    *,
    cluster: Cluster,
    global_batch: int,
    settings: TrainingSettings | None = None,
    memory_limit_bytes: float | None = None,
    rank: bool = False,
    progress: Callable[[str, float], None] | None = None,
    **configuration: Any,
) -> tuple[tuple[str, ...], Estimate]:
    """``planner estimate``: import ``path`` (at each batch it needs) and :func:`estimate` one
    configuration; with ``rank``, first run :func:`~planner.pipeline.pipeline_search` at
    ``global_batch`` and rank the configuration against its frontier (sharing its cost models).

    Parameters
    ----------
    path, dims:
        The ONNX model and its symbolic dims (the batch dim is set per micro-batch).
    cluster, global_batch, settings, memory_limit_bytes:
        As for :func:`estimate` (samples per step; bytes per device).
    rank:
        Also search the frontier and say where the configuration ranks.
    progress:
        ``(stage, fraction)`` callback.
    configuration:
        The configuration, keywords of :func:`estimate`: ``tp``, ``pp``, ``dp``, ``micro_batch``,
        ``zero``, ``recompute``, ``sequence_parallel``, ``schedule``, ``chunks``, ``stage_layers``,
        ``cost_model`` (an unknown keyword is a ``TypeError``, as for :func:`estimate`).

    Returns
    -------
    (tuple of str, Estimate)
        The importer's warnings (each once) and the estimate.
    """
    report = progress or (lambda stage, fraction: None)
    loader = graph_loader(path, dims)
    require_samples(loader(global_batch), loader.batch_dim)  # a GNN's nodes are not samples to micro-batch
    frontier = None
    source: GraphAtBatch | PipelineCostCache = loader
    target = configuration.get("target")
    if rank:
        # ranked among the plans priced as the row is: a graph-replayed row (torchtitan at pp = 1) among the pp = 1 plans
        # priced with graphs (Target.priced_settings; the others without)
        priced = _rank_settings(settings, target, pp=configuration.get("pp", 1), cuda_graphs=configuration.get("cuda_graphs"),
                                zero=configuration.get("zero", 0))
        options = PipelineOptions(global_batch=global_batch, pipeline_sizes=(1,) if priced.cuda_graphs else None)
        frontier = pipeline_search(loader, cluster=cluster, options=options, settings=priced,
                                   memory_limit_bytes=memory_limit_bytes, progress=report)
        source = frontier.cache if frontier.cache is not None else loader
    report("pricing the configuration", 0.0)
    result = estimate(
        source, cluster=cluster, global_batch=global_batch, settings=settings, memory_limit_bytes=memory_limit_bytes,
        frontier=frontier, **{"megatron_rules": target in (None, "megatron"), **configuration},
    )
    return loader.warnings, result


def _rank_settings(settings: TrainingSettings | None, target: str | None, *, pp: int,
                   cuda_graphs: bool | None, zero: int = 0) -> TrainingSettings:
    """The settings ``planner estimate``'s ranking search prices with: the estimate's own (``target``'s priced settings
    at ``pp`` stages and ZeRO-``zero``, :func:`_priced_cache`), without a pipeline that no graph captures."""
    from exporters.targets import target as find_target

    priced = _launcher_settings(settings or TrainingSettings(), find_target(target) if target is not None else None,
                                pp=pp, cuda_graphs=cuda_graphs, zero=zero)
    return priced if pp == 1 or not priced.cuda_graphs else dataclasses.replace(priced, cuda_graphs=False)


def _layout_choice(cache: PipelineCostCache, config: MegatronConfig, *, per_node: int, zero_sync: Any = None):
    """One stage's per-op choice under Megatron's layout at ``dp x cp x tp``: the layout's only
    configuration of every op, or the best of the layout's choices (:func:`_choose_intra_op`).

    Returns ``(choice or None, reason when None, notes)``.
    """
    dp, tp, pp, cp = config.dp, config.tp, config.pp, config.cp
    batch = config.micro_batch * dp
    stage_devices = tp * cp * dp
    model = cache.model(stage_devices, batch, 0, config.recompute, edges=False)  # the spaces: no edge table needed
    masks, reason, notes = _pattern_masks(
        model.graph, model.tables.configs, dp=dp, tp=tp, sequence_parallel=config.sequence_parallel, per_node=per_node,
        cp=cp,
    )
    if masks is None:
        return None, reason, notes
    if all(int(m.sum()) == 1 for m in masks):
        picks = np.array([int(np.flatnonzero(m)[0]) for m in masks], dtype=np.int64)  # the layout fixes every op
    else:
        arrays = cache.arrays(stage_devices, batch, config.zero, config.recompute,
                              zero_sync=zero_sync_rule(cache, config.zero, zero_sync))
        micro_batches = config.global_batch // batch
        picks = _choose_intra_op(
            cache, _Restricted.build(arrays, masks), slots=float(micro_batches + pp - 1), in_flight=1.0
        )
    if picks is None:
        return None, "every configuration of this layout has an infinite cost; choose other degrees", notes
    return picks, "", notes


def _degree_problem(config: MegatronConfig, *, devices: int, per_node: int) -> str:
    """Why the degrees cannot run on the cluster, before anything is priced (``""``: they can)."""
    tp, pp, dp, cp = config.tp, config.pp, config.dp, config.cp
    if dp < 1 or config.devices != devices:
        degrees = f"tp={tp}" + (f" x cp={cp}" if cp > 1 else "") + f" x pp={pp} x dp={dp}"
        return (f"{degrees} = {config.devices} but the cluster has {devices} devices; "
                "make the product equal --devices")  # fmt: skip
    if config.sequence_parallel and tp == 1:
        return "sequence parallelism needs tp > 1; drop --sequence-parallel or raise --tp"
    batch = config.micro_batch * dp
    if config.global_batch % batch:
        return (f"--global-batch {config.global_batch} is not a multiple of micro-batch x dp = {batch}; "
                "change --global-batch or --micro-batch")  # fmt: skip
    micro_batches = config.global_batch // batch
    stage_devices = tp * cp * dp
    if not (stage_devices % per_node == 0 or per_node % stage_devices == 0):
        return (f"a stage of tp x cp x dp = {stage_devices} devices straddles nodes of {per_node}; "
                "choose degrees so that tp x cp x dp divides or is a multiple of --devices-per-node")  # fmt: skip
    if config.schedule == "interleaved" and pp > 1 and micro_batches % pp:
        return (f"the interleaved schedule needs the micro-batch count ({micro_batches}) to be a "
                f"multiple of pp={pp}; change --global-batch or --micro-batch")  # fmt: skip
    return ""


def _stage_bounds(config: MegatronConfig, *, layers: int) -> tuple[int, ...] | str:
    """The layer index each stage starts at, and the count (``--stage-layers`` or even stages), or
    why the layers cannot be cut so."""
    pp, chunks = config.pp, config.chunks
    if pp > 1 and pp * chunks > layers:
        return (f"pp={pp}" + (f" x {chunks} chunks" if chunks > 1 else "") +
                f" needs at least that many layers and the model has {layers}; use a smaller --pp")  # fmt: skip
    if config.stage_layers is not None:
        if len(config.stage_layers) != pp or sum(config.stage_layers) != layers or min(config.stage_layers) < 1:
            return (f"stage_layers {list(config.stage_layers)} must give each of the {pp} stages at "
                    f"least one layer and {layers} in all")  # fmt: skip
        bounds = tuple(int(x) for x in np.concatenate(([0], np.cumsum(config.stage_layers))))
    elif pp > 1:
        if layers % pp:
            return (f"{layers} layers do not split evenly into pp={pp} stages; choose a --pp that "
                    "divides the layer count or give the layers per stage with --stage-layers (Megatron-LM: "
                    "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers)")  # fmt: skip
        bounds = tuple(range(0, layers + 1, layers // pp))
    else:
        bounds = (0, layers)
    # a stage's layers that its chunks do not divide are cut as evenly as whole layers allow and priced as if
    # every chunk were the largest (objectives.schedules.chunk_layers, chunk_pad), as Megatron-LM's layout runs them
    return bounds


def _ranked(point, frontier: PipelineResult | None) -> dict:
    """The :class:`Estimate` fields that place ``point`` against ``frontier``: its rank among the
    fitting points (``None`` when it does not fit), the counts, the fastest fitting time, and the
    first frontier point that dominates it (times within :data:`planner.search.pareto.TIME_TIE` equal between
    points on as many devices and model-parallel ways, as the frontier's own points are filtered: one as
    fast and leaner dominates it)."""
    from planner.search.pareto import TIME_TIE, dominates
    from planner.search.pipeline import tie_group

    rank = dominated = best_time = None
    points = fitting_count = 0
    if frontier is not None:
        points = len(frontier.points)
        fitting = [p for p in frontier.points if p.fits]
        fitting_count = len(fitting)
        best_time = min((p.time_s for p in fitting), default=None)
        if point.fits:
            rank = 1 + sum(1 for p in fitting if p.time_s < point.time_s)
        dominated = next((i for i, p in enumerate(frontier.points)
                          if dominates((p.time_s, p.memory_bytes), (point.time_s, point.memory_bytes),
                                       time_tie=TIME_TIE if tie_group(p) == tie_group(point) else 0.0)),
                         None)  # fmt: skip
    return {"rank": rank, "frontier_points": points, "fitting_points": fitting_count, "best_time_s": best_time,
            "dominated_by": dominated}


@dataclass(frozen=True, slots=True, kw_only=True)
class GridResult:
    """Every Megatron configuration of a cluster, priced."""

    estimates: tuple[Estimate, ...]
    """Valid ones only, in enumeration order."""
    invalid: int
    """Configurations that cannot run (heads not divisible by tp, batch not divisible...)."""
    best: Estimate | None
    """The fastest that fits."""
    time_s: float
    cost_builds: int = 0


def megatron_grid(
    graph_at_batch: GraphAtBatch,
    *,
    cluster: Cluster,
    global_batch: int,
    micro_batches: Sequence[int] | None = None,
    recompute: Sequence[str] = ("none", "selective", "full"),
    zero: Sequence[int] = (0, 1),
    sequence_parallel: Sequence[bool] = (False,),
    max_tp: int | None = None,
    settings: TrainingSettings | None = None,
    memory_limit_bytes: float | None = None,
    share_cost_models: bool = True,
) -> GridResult:
    """Price every Megatron configuration (dp, tp, pp, micro-batch, recompute, distributed optimizer).

    Parameters
    ----------
    graph_at_batch:
        ``samples -> OpGraph`` (cache its imports: both this grid and the search call it).
    micro_batches:
        Micro-batch sizes per data-parallel rank; default every divisor of ``global_batch / dp``.
    zero:
        ``(0, 1)``: without and with Megatron's distributed optimizer.
    max_tp:
        Largest tensor-parallel degree (default the devices per node: Megatron keeps ``tp`` in a node).
    share_cost_models:
        One cost-model cache for the whole grid; ``False`` prices every configuration from scratch,
        as separate ``planner estimate`` runs would.

    Returns
    -------
    GridResult
    """
    started = time.perf_counter()
    devices = cluster.devices
    max_tp = max_tp or cluster.devices_per_node
    shared = PipelineCostCache(graph_at_batch, cluster=cluster, settings=settings) if share_cost_models else None
    layers = (shared or PipelineCostCache(graph_at_batch, cluster=cluster, settings=settings)).structure(
        global_batch
    ).num_layers
    estimates: list[Estimate] = []
    invalid = 0
    builds = 0
    for pp in divisors(devices):
        if pp > 1 and (pp > layers or layers % pp):
            continue
        for tp in divisors(devices // pp):
            if tp > max_tp:
                continue
            dp = devices // (pp * tp)
            sizes = micro_batches or divisors(global_batch // dp) if global_batch % dp == 0 else []
            for mb in sizes:
                if global_batch % (mb * dp):
                    continue
                for r in recompute:
                    for z in zero:
                        for sp in sequence_parallel:
                            if sp and tp == 1:
                                continue
                            cache = shared or PipelineCostCache(graph_at_batch, cluster=cluster, settings=settings)
                            result = estimate(
                                cache, cluster=cluster, tp=tp, pp=pp, dp=dp, micro_batch=mb,
                                global_batch=global_batch, zero=z, recompute=r,  # type: ignore[arg-type]
                                sequence_parallel=sp, settings=settings, memory_limit_bytes=memory_limit_bytes,
                            )
                            if shared is None:
                                builds += cache.builds
                            if result.valid:
                                estimates.append(result)
                            else:
                                invalid += 1
    fitting = [e for e in estimates if e.fits]
    best = min(fitting, key=lambda e: e.time_s) if fitting else None
    return GridResult(
        estimates=tuple(estimates),
        invalid=invalid,
        best=best,
        time_s=time.perf_counter() - started,
        cost_builds=shared.builds if shared is not None else builds,
    )
