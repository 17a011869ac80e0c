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

The public names of both floors are re-exported here, where callers import them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Literal, Mapping

from importers import batch_dim_name
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
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import TrainingSettings
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
    "GraphAtBatch",
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
]

# Re-exported for the callers that import them from here (planner.estimate, the tests).
_REEXPORTED = (_choose_intra_op, _Frontier, _lower_bounds, _Restricted, _TargetFamilies, _TargetFamily, price_plan,
               restricted)


def graph_loader(
    path: str | Path, dims: Mapping[str, int] | None = None, *, batch_dim: str | None = None
) -> GraphAtBatch:
    """A :data:`GraphAtBatch` that imports ``path`` with ``dims`` and ``batch_dim`` set per call.

    ``batch_dim``: the symbolic dim that sets the batch; ``None``: the model's own
    (:func:`importers.batch_dim_name`: ``batch``, ``N``, ``batch_size``..., a value in ``dims`` for
    it is replaced per call). Each batch is imported once (cached). Graphs at different batches may
    differ in their ops (an importer drops a batch dim of size 1); each batch gets its own cost
    models, and :meth:`PipelineCostCache.structure` checks that the layers stay the same.

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
    cache: dict[int, OpGraph] = {}
    fixed = {k: v for k, v in (dims or {}).items() if k != batch_dim}

    def at(samples: int) -> OpGraph:
        if samples not in cache:
            cache[samples] = load_graph(path, {**fixed, batch_dim: int(samples)})
        return cache[samples]

    return at


def target_rules(target: str | None) -> TargetRules | None:
    """The search's rules for a launch target (``None`` or ``generic``: none): the families and
    pipeline settings of its :data:`exporters.targets.TARGETS` entry.

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
    return TargetRules(name=target, families=found.pipeline_families, allows=found.allows_pipeline)


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
        settings the target's exporter refuses (e.g. ZeRO-2/3 with ``pp > 1``) are not searched.

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
        cache = PipelineCostCache(
            graph_at_batch, cluster=cluster, settings=settings, cost_model=cost_model, measured=measured
        )
    return search_pipeline(cache, options=options, memory_limit_bytes=memory_limit_bytes, progress=progress, rules=rules)
