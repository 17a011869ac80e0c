r"""Pipeline plans, wired: the model at any batch, its pricing, the search, and the target's rules.

``plan --global-batch`` searches pipeline stages x per-op splits x micro-batches with ZeRO and
recomputation. The work is split by floor, as pymoo splits Problem / Algorithm / ``minimize``:

* the pricing lives in :mod:`objectives.pipeline_cost` (:class:`PipelineCostCache`: per-stage cost
  models and their forward / backward / per-step arrays at each ZeRO stage; :func:`evaluate_pipeline`
  prices one plan);
* the search lives in :mod:`planner.search.pipeline` (:func:`~planner.search.pipeline.search_pipeline`:
  the intra-op DP per stage, the stage cut, pruning by lower bounds, the memory-weighted search),
  which takes the pricing as an argument and never imports objectives or exporters;
* this module joins them: :func:`graph_loader` imports the model at any batch, and
  :func:`pipeline_search` builds the pricing, turns a launch target into the search's
  :class:`~planner.search.pipeline.TargetRules` (from :data:`exporters.targets.TARGETS`) and runs the search.

A point becomes exporter input with :func:`pipeline_plan_input`; :func:`pipeline_targets` lists
the targets that run each point by mask membership and each target's stage rules
(:func:`exporters.targets.runnable_plan_targets`; no exporter runs). ``planner plan`` itself is
:func:`planner.launchable.plan_launchable_file`, which runs this search once per launcher.

The public names of both floors are re-exported here, where callers import them.
"""

from __future__ import annotations

import contextlib
import re

import dataclasses
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from importers import batch_dim_name
from exporters._common import graph_batch_size
from exporters.generic import PipelineSpec, PlanInput, StageSpec
from exporters.targets import runnable_plan_targets
from exporters.targets import target as find_target
from objectives.pipeline_cost import (
    GraphAtBatch,
    LayerStructure,
    PipelineCostCache,
    PipelinePoint,
    PipelineTime,
    StagePlan,
    evaluate_pipeline,
    layer_structure,
    price_plan,
    stage_cluster,
)
from planner.core.cluster import Cluster
from planner.core.configs import divisors
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import ZERO_SYNC_STAGES, TrainingSettings
from planner.core.strategy import Strategy
from planner.plan import load_graph
from planner.search.pipeline import (
    PipelineOptions,
    PipelineResult,
    TargetRules,
    _choose_intra_op,
    _Frontier,
    _lower_bounds,
    _Restricted,
    _TargetFamilies,
    _TargetFamily,
    restricted,
    search_pipeline,
)

__all__ = [
    "FixedBatchLoader",
    "WholeGraphLoader",
    "GraphAtBatch",
    "GraphLoader",
    "graph_loader",
    "LayerStructure",
    "layer_structure",
    "stage_cluster",
    "PipelineCostCache",
    "PipelineOptions",
    "StagePlan",
    "PipelineTime",
    "PipelinePoint",
    "PipelineResult",
    "evaluate_pipeline",
    "pipeline_search",
    "target_rules",
    "pipeline_plan_input",
    "point_plan_input",
    "pipeline_targets",
]

# Re-exported for the callers that import them from here (planner.estimate, the tests).
_REEXPORTED = (_choose_intra_op, _Frontier, _lower_bounds, _Restricted, _TargetFamilies, _TargetFamily, price_plan,
               restricted)


class GraphLoader:
    """``samples -> OpGraph`` (a :data:`GraphAtBatch`): the model at each batch once, and the
    importer's warnings of every graph loaded (:attr:`warnings`).

    With ``rebatch`` (the default), the second batch size above 1 is imported and compared with the
    first moved to it (:func:`importers.rebatch.scales_linearly`); when they agree, every further
    size is moved (:func:`importers.rebatch.rebatch`) instead of imported, which is a second per size
    less on a GPT-3-sized graph. Otherwise, and for batch 1, each size is imported. Callers that
    profile op shards (``--cost measured``) pass ``rebatch=False``: a moved graph keeps the first
    size's ONNX node shapes."""

    def __init__(self, path: str | Path, fixed_dims: Mapping[str, int], batch_dim: str, *, rebatch: bool = True) -> None:
        self.path = Path(path)
        self.batch_dim = batch_dim
        self.rebatch = rebatch
        self._fixed = dict(fixed_dims)
        self._graphs: dict[int, OpGraph] = {}
        self._linear: bool | None = None
        """Whether the model was checked to scale linearly with the batch (``None``: not yet)."""
        self.phases: Any = None
        """A :class:`~planner.search.budget.PlanDeadline` each import is timed on as ``"import"`` (``None``: untimed)."""

    def __call__(self, samples: int) -> OpGraph:
        if samples not in self._graphs:
            timed = self.phases.phase("import", cuttable=False) if self.phases is not None else contextlib.nullcontext()
            with timed:
                self._graphs[samples] = self._load(int(samples))
        return self._graphs[samples]

    def _load(self, samples: int) -> OpGraph:
        from importers.rebatch import rebatch, scales_linearly
        from importers.analysis_memo import analyzed_alike

        base = next((g for b, g in self._graphs.items() if b > 1), None) if self.rebatch and samples > 1 else None
        if base is not None and self._linear:
            moved = rebatch(base, batch_dim=self.batch_dim, batch=samples)
            if moved is not None:
                analyzed_alike(moved, base)  # its transformer structure is base's: not found again per micro-batch
                return moved
        graph = load_graph(self.path, {**self._fixed, self.batch_dim: samples})
        if base is not None and self._linear is None:
            self._linear = scales_linearly(base, graph, batch_dim=self.batch_dim)
            if self._linear:  # equal to base moved here: its structure is base's too
                analyzed_alike(graph, base)
        return graph

    @property
    def loaded(self) -> tuple[OpGraph, ...]:
        """The graphs imported so far, in the order they were first asked for."""
        return tuple(self._graphs.values())

    @property
    def warnings(self) -> tuple[str, ...]:
        """Every loaded graph's warnings, each once, in the order they were first seen: a warning that
        another batch's graph gave with other counts only ("shapes of 43 values" at one batch, "of 129" at
        another) is said once, as the first graph loaded (the model's batch) gave it."""
        first: dict[str, str] = {}
        for warning in (w for graph in self._graphs.values() for w in graph.warnings):
            first.setdefault(re.sub(r"(?<![\w.'])\d[\d,.]*(?![\w'])", "#", warning), warning)  # counts, not names
        return tuple(first.values())


class FixedBatchLoader(GraphLoader):
    """The :class:`GraphLoader` of a model whose batch is a number in the file (``batch_dim`` ``None``):
    its one graph, at the file's :attr:`samples`, and an :class:`InputError` for any other batch. The
    launchable search then plans one pass of the file's batch per step (every dp split of it, no
    micro-batches: :attr:`PipelineOptions.max_micro_batches` 1)."""

    def __init__(self, path: str | Path, fixed_dims: Mapping[str, int]) -> None:
        super().__init__(path, fixed_dims, "", rebatch=False)
        graph = load_graph(self.path, self._fixed)
        self.samples = graph_batch_size(graph)
        """Samples in the file's batch (:func:`exporters._common.graph_batch_size`)."""
        self._graphs[self.samples] = graph

    @property
    def warnings(self) -> tuple[str, ...]:
        """That the batch is the file's (the launchable table still answers, one pass per step), then
        the graph's warnings."""
        fixed = (f"{self.path.name} has its batch written as a number, so micro-batches and pipelines cannot vary it "
                 "(re-export it with a named dynamic batch axis for them); planning the file's batch as one pass "
                 "per step")
        return (fixed, *super().warnings)

    def _load(self, samples: int) -> OpGraph:
        raise InputError(
            f"{self.path.name} has its batch written as a number ({self.samples}), so it plans only that batch "
            f"(asked: {samples}); re-export it with a named dynamic batch axis (e.g. "
            "dynamic_axes={'input_ids': {0: 'batch'}}) to vary the batch, micro-batches and pipelines"
        )


class WholeGraphLoader(FixedBatchLoader):
    """The :class:`GraphLoader` of a model whose batch dim is not a sample dim (a graph neural network's
    nodes, :class:`planner.coupling.NotSamples`): the whole graph at the user's dims is *one* sample, so
    a step is one pass of it, data parallelism has nothing to split (``dp`` 1) and the per-op search
    splits the node dim inside each op as it splits a sequence."""

    def __init__(self, path: str | Path, fixed_dims: Mapping[str, int], reason: str) -> None:
        GraphLoader.__init__(self, path, fixed_dims, "", rebatch=False)
        self.samples = 1
        self._graphs[1] = load_graph(self.path, self._fixed)
        self._reason = reason

    @property
    def warnings(self) -> tuple[str, ...]:
        whole = f"{self._reason}; planning the whole graph as one sample per step (data parallelism 1, no micro-batches)"
        return (whole, *super(FixedBatchLoader, self).warnings)  # the graphs' own, not the fixed batch's

    def _load(self, samples: int) -> OpGraph:
        raise InputError(f"{self.path.name} is planned as one whole graph per step (asked: {samples} samples); "
                         "leave out --global-batch, --micro-batch and --fix mb/dp")


def graph_loader(
    path: str | Path, dims: Mapping[str, int] | None = None, *, batch_dim: str | None = None, rebatch: bool = True
) -> GraphLoader:
    """A :class:`GraphLoader` that imports ``path`` with ``dims`` and ``batch_dim`` set per call.

    ``batch_dim``: the symbolic dim that sets the batch; ``None``: the model's own
    (:func:`importers.batch_dim_name`: ``batch``, ``N``, ``batch_size``..., a value in ``dims`` for
    it is replaced per call). Each batch is imported once (cached). Graphs at different batches may
    differ in their ops (an importer drops a batch dim of size 1); each batch gets its own cost
    models, and :meth:`PipelineCostCache.structure` checks that the layers stay the same.
    ``rebatch``: see :class:`GraphLoader` (``False`` under ``--cost measured``).

    Raises
    ------
    InputError
        The model's batch is a number in the file (no dim to vary the micro-batch with).
    """
    if batch_dim is None:
        found = batch_dim_name(path)
        if found is None:
            raise InputError(
                f"{Path(path).name} has no named batch dim (axis 0 of its inputs is a number or unnamed), so "
                "pipeline plans and estimates cannot vary its micro-batch; re-export it with a named dynamic batch "
                "axis (e.g. dynamic_axes={'input_ids': {0: 'batch'}}); `planner plan` without --global-batch "
                "plans it at the file's batch"
            )
        batch_dim = found
    return GraphLoader(path, {k: v for k, v in (dims or {}).items() if k != batch_dim}, batch_dim, rebatch=rebatch)


def target_rules(target: str | None) -> TargetRules | None:
    """The search's rules for a launch target (``None`` or ``generic``: none): the families,
    pipeline settings, ZeRO-3 gather bounds and memory rules of its :data:`exporters.targets.TARGETS` entry.

    Raises
    ------
    InputError
        An unknown target.
    """
    if target is None or target == "generic":
        return None
    found = find_target(target)
    if not found.restricts:
        return None
    return TargetRules(name=target, families=found.pipeline_families, allows=found.allows_pipeline,
                       settings_allows=found.runs_family,
                       zero3_gather=found.zero3_gather, sequence_shard_saved=found.sequence_shard_saved,
                       fused_swiglu=found.fused_swiglu, grad_accumulator=found.grad_accumulator, zero_sync=found.zero_sync,
                       pipeline_buffers=found.pipeline_buffers)


def pipeline_search(
    graph_at_batch: GraphAtBatch | PipelineCostCache,
    *,
    cluster: Cluster,
    options: PipelineOptions,
    settings: TrainingSettings | None = None,
    memory_limit_bytes: float | None = None,
    cost_model: Literal["roofline", "measured", "pase"] = "roofline",
    measured=None,
    progress: Callable[[str, float], None] | None = None,
    target: str | None = None,
) -> PipelineResult:
    r"""The frontier over pipeline size, per-op splits, micro-batch, ZeRO stage and recomputation
    (:func:`planner.search.pipeline.search_pipeline` on a :class:`PipelineCostCache`).

    Parameters
    ----------
    graph_at_batch:
        ``samples -> OpGraph`` (e.g. :func:`graph_loader`), or a :class:`PipelineCostCache` to share
        cost models with other calls (its own settings and cost model then apply).
    cluster:
        All devices.
    options:
        The search space (global batch, micro-batch, pipeline sizes, ZeRO stages, recomputation,
        schedule).
    settings:
        Precision and optimizer (its ZeRO stage and recomputation are replaced by the searched ones).
    memory_limit_bytes:
        Per device; default the device's memory.
    cost_model, measured:
        As for :func:`planner.plan.build_model`.
    progress:
        ``(stage, fraction)`` callback.
    target:
        Search only plans this launch target runs (``megatron``, ``deepspeed``, ``meshtf``,
        ``dtensor``; ``None`` or ``generic``: every plan), by its :func:`target_rules`: each stage's
        intra-op search then runs once per family of the target on the stage's devices (e.g. one per
        ``dp x tp``, sequence parallelism on or off) and every family's optimum is priced; pipeline
        settings the target's exporter refuses (e.g. ZeRO-2/3 with ``pp > 1``) are not searched. A target
        that replays one-stage plans as a CUDA graph (torchtitan, :meth:`exporters.targets.Target.priced_settings`)
        prices ``pp = 1`` with graphs under an execution model, as its launchable search does; its ``pp = 1`` and
        ``pp > 1`` plans are then searched apart (an :class:`InputError` for options holding both).

    Returns
    -------
    PipelineResult
        Pareto points (fastest first) and the fastest that fits.

    Raises
    ------
    InputError
        No pipeline size is possible (e.g. a ``pp`` that does not divide the devices), or an unknown target.
    """
    rules = target_rules(target)
    if isinstance(graph_at_batch, PipelineCostCache):
        cache = graph_at_batch
    else:
        cache = PipelineCostCache(graph_at_batch, cluster=cluster, cost_model=cost_model, measured=measured,
                                  settings=_replayed_settings(target, settings, options, cluster))
    return search_pipeline(cache, options=options, memory_limit_bytes=memory_limit_bytes, progress=progress, rules=rules)


def _replayed_settings(target: str | None, settings: TrainingSettings | None, options: PipelineOptions,
                       cluster: Cluster) -> TrainingSettings | None:
    """``settings`` with ``target``'s CUDA-graph replay of the plans ``options`` holds (its priced settings' graphs,
    :meth:`exporters.targets.Target.priced_settings`; its ZeRO synchronisation stays with the search's rules), its
    interleaved transfers (:meth:`exporters.targets.Target.priced_p2p_overlap`) and its
    eager autocast at their ZeRO stages (:meth:`exporters.targets.Target.priced_autocast`; stages it runs both ways
    are searched apart, as :func:`planner.launcher_options.launcher_autocast` parts them)."""
    if target is None or target == "generic":
        return settings
    sizes = tuple(options.pipeline_sizes or divisors(cluster.devices))
    found = find_target(target)
    if settings is None:  # the defaults, with its interleaved transfers where it resolves them
        p2p = found.priced_p2p_overlap(TrainingSettings(), pp=max(sizes), chunks=options.chunks)
        return None if p2p is None else TrainingSettings(p2p_overlap=p2p)
    casts = {found.priced_autocast(settings, zero) for zero in options.zero_stages}
    if len(casts) > 1:
        raise InputError(f"{target} runs eager bf16 under torch.autocast at ZeRO {', '.join(map(str, found.autocast_zero))} "
                         f"only: search those stages apart from the others, PipelineOptions(zero_stages=...)")
    if casts and (autocast := casts.pop()) != settings.autocast:
        settings = dataclasses.replace(settings, autocast=autocast)
    # its interleaved transfers as it runs them (Megatron-LM: overlapped with model chunks)
    p2p = found.priced_p2p_overlap(settings, pp=max(sizes), chunks=options.chunks)
    settings = settings if p2p == settings.p2p_overlap else dataclasses.replace(settings, p2p_overlap=p2p)
    if not found.replays_graphs(settings, pp=1):
        return settings
    if 1 in sizes and max(sizes) > 1:
        raise InputError(f"{target} replays pp=1 plans as one CUDA graph and pipelines without: search them apart, "
                         f"PipelineOptions(pipeline_sizes=(1,)) and the sizes above 1")
    graphs = found.priced_settings(settings, pp=max(sizes)).cuda_graphs
    return settings if graphs == settings.cuda_graphs else dataclasses.replace(settings, cuda_graphs=graphs)


# --------------------------------------------------------------------------------------------
# pipeline points as exporter inputs, and the targets that run them


def _pipeline_spec(point: PipelinePoint) -> PipelineSpec:
    return PipelineSpec(
        pp=point.pp,
        devices_per_stage=point.devices_per_stage,
        schedule=point.schedule,
        chunks=point.chunks,
        micro_batch=point.micro_batch,
        micro_batches=point.micro_batches,
        global_batch=point.global_batch,
        zero_stage=point.zero_stage,
        recompute=point.recompute,
        stages=tuple(
            StageSpec(
                index=stage.index,
                layers=tuple(stage.layers),
                ops=tuple(stage.ops),
                forward_s=stage.forward_s,
                backward_s=stage.backward_s,
                grad_sync_s=stage.grad_sync_s,
                in_flight=stage.in_flight,
                memory=stage.memory,
            )
            for stage in point.stages
        ),
        pipeline_s=point.time.pipeline_s,
        bubble_s=point.time.bubble_s,
        p2p_s=point.time.p2p_s,
        bubble_fraction=point.time.bubble_fraction,
    )


def pipeline_plan_input(result: PipelineResult, index: int) -> PlanInput:
    """The exporters' input for point ``index`` of a :class:`PipelineResult`.

    The graph is the model at the point's micro-batch (``micro_batch_samples``), the spaces and
    choice one stage's (``devices_per_stage`` devices), the cluster the whole one; the strategy's
    time and memory are the pipeline's step time and its fullest stage's memory.
    """
    if result.cache is None:
        raise InputError("this pipeline result keeps no cost cache; run pipeline_search again to export its points")
    return point_plan_input(result.points[index], result.cache)


def point_plan_input(point: PipelinePoint, cache: PipelineCostCache) -> PlanInput:
    """The exporters' input for one :class:`PipelinePoint` priced with ``cache``
    (a :class:`PipelineCostCache`: the cluster, precision and cost model), e.g.
    ``planner.estimate.estimate(...).point``; see :func:`pipeline_plan_input`. Its settings carry the
    ZeRO-3 gather bounds the point was priced under (:attr:`PipelinePoint.zero3_gather`: a launcher's,
    given per search rather than by the cache's settings) and whether its activations hold the
    sequence-shard and fused-SwiGLU credits (:attr:`PipelinePoint.sequence_shard_saved`, ``fused_swiglu``) and the
    launcher's gradient accumulator (``grad_accumulator_bytes``) and ZeRO-1/2 synchronisation (``zero_sync``), so the
    plan prices and exports alike."""
    if point.graph is None or not point.spaces:
        raise InputError("this pipeline point keeps no graph; price it again to export it")
    splits, inter_splits = {}, {}
    for op, space, row in zip(point.graph.ops, point.spaces, point.choice):
        factors = space.describe(row)
        if factors:
            splits[op.name] = factors
        across = {n: int(f) for n, f in zip(space.dim_names, space.inter_factors[row]) if f > 1}
        if across:
            inter_splits[op.name] = across
    strategy = Strategy(
        choice=tuple(point.choice),
        time_s=point.time_s,
        memory_bytes=point.memory_bytes,
        splits=splits,
        inter_splits=inter_splits,
        memory=point.memory,
    )
    return PlanInput(
        graph=point.graph,
        cluster=cache.cluster,
        settings=dataclasses.replace(cache.settings, zero_stage=point.zero_stage, recompute=point.recompute,
                                     zero3_gather=point.zero3_gather or cache.settings.zero3_gather,
                                     sequence_shard_saved=point.sequence_shard_saved, fused_swiglu=point.fused_swiglu,
                                     grad_accumulator_bytes=point.grad_accumulator_bytes,
                                     zero_sync=point.zero_sync if point.zero_stage in ZERO_SYNC_STAGES else cache.settings.zero_sync),
        spaces=tuple(point.spaces),
        strategy=strategy,
        micro_batch=point.micro_batch_samples,
        global_batch=point.global_batch,
        cost_model=cache.cost_model,
        pipeline=_pipeline_spec(point),
    )


def pipeline_targets(result: PipelineResult) -> tuple[tuple[str, ...], ...]:
    """Per point of a pipeline result, the targets that can run it exactly (``generic`` always):
    the table's ``targets`` column, by mask membership and each target's pipeline rules
    (:func:`exporters.targets.runnable_plan_targets`), with no export attempted."""
    return tuple(runnable_plan_targets([pipeline_plan_input(result, i) for i in range(len(result.points))]))

