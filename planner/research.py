"""The per-op research search's answer as the launchable table's result type.

``planner plan --target generic --method/--epsilon/--seed/--plot/--max-memory`` runs PaSE's DP, the
time/memory frontier, NSGA-II or the exhaustive oracle (:func:`planner.plan.plan`) on one step of
the model's whole batch. Its :class:`~planner.plan.PlanResult` becomes a
:class:`~planner.launchable.LaunchFrontier` here, so one renderer (``planner.render.launch_table`` /
``launch_json``) and one export path (:func:`planner.launchable.export_row`) serve both searches:

* each frontier point is a :class:`~planner.launchable.Row`: ``pp = 1``, one micro-batch of the whole
  batch, the request's ZeRO stage and recomputation, launchers ``("generic",)``, degrees named as the
  launchable rows name a per-op plan (the ops of the most FLOPs: a sequence split is ``cp``), the
  execution model of the request's settings. Its time and memory are the research search's own
  (:attr:`Row.plan_input` keeps its per-op exporter input, so a saved row re-prices through
  :func:`planner.plan.load_plan` to the same seconds and bytes);
* the data-parallel baseline is the frontier's baseline row; the other baselines (best uniform
  ``dp x tp``, the "one weird trick"), the method and its bound, the search statistics and
  ``--cost measured``'s profiled device are notes, and the same as data in ``extras``.
"""

from __future__ import annotations

from typing import Any

from exporters import PlanInput
from planner.core.degrees import Degrees
from planner.core.settings import TrainingSettings
from planner.core.strategy import Strategy
from planner.core.units import format_bytes, format_seconds
from planner.families import dominant_degrees
from planner.launchable import LaunchFrontier, Row, _described
from planner.pipeline import PipelineCostCache, PipelinePoint, PipelineTime
from planner.plan import PlanPoint, PlanResult

__all__ = ["research_frontier", "research_notes"]


def research_frontier(result: PlanResult, *, timed_on: str | None = None) -> LaunchFrontier:
    """``result``'s points as rows of the launchable table, fastest first, with its pick.

    ``timed_on`` (``--cost measured``): the profiled device and provider that priced the ops.
    """
    request = result.request
    rows = _described([_row(result, point) for point in result.points])
    dp = next((b.point for b in result.baselines if b.name == "data_parallel" and b.point is not None), None)
    return LaunchFrontier(
        cluster=request.cluster, rows=tuple(rows), chosen=result.chosen, memory_limit_bytes=result.memory_limit_bytes,
        global_batch=result.samples_per_step, launchers=("generic",), baseline=None if dp is None else _row(result, dp),
        message=result.message, notes=research_notes(result, timed_on=timed_on), search_time_s=result.search_time_s,
        combinations=1, intra_op_searches=1, extras=_extras(result, timed_on),
    )  # fmt: skip


def _row(result: PlanResult, point: PlanPoint) -> Row:
    """One research point as a row: ``pp = 1``, the whole batch in one micro-batch."""
    request = result.request
    settings: TrainingSettings = point.settings or request.settings  # an MoE point: its own ep
    strategy = point.strategy
    dominant = dominant_degrees(result.graph, result.spaces, strategy.choice)
    (dp, tp, cp, hw), layouts = (dominant[0], dominant[2]) if dominant is not None else ((1, 1, 1, 1), 1)
    samples = result.samples_per_step
    grad_sync_s = strategy.time.grad_sync_s if strategy.time is not None else 0.0
    pipeline_point = PipelinePoint(
        time_s=strategy.time_s, memory_bytes=strategy.memory_bytes, pp=1, dp=dp, tp=tp * cp * hw,
        devices_per_stage=request.cluster.devices, micro_batch=max(1, samples // dp), micro_batch_samples=samples,
        micro_batches=1, global_batch=samples, zero_stage=settings.zero_stage, recompute=settings.recompute,
        schedule="1f1b", chunks=1, stages=(),  # one step, no stage cut: no pipeline schedule runs
        time=PipelineTime(step_s=strategy.time_s, pipeline_s=strategy.time_s - grad_sync_s, bubble_s=0.0, p2p_s=0.0,
                          grad_sync_s=grad_sync_s, bubble_fraction=0.0),
        memory=strategy.memory, fits=point.fits, summary=point.summary, choice=tuple(strategy.choice),
        uniform=layouts == 1, graph=result.graph, spaces=result.spaces,
    )  # fmt: skip
    # the cache prices nothing here (the point is priced): it carries the cluster, settings and cost model
    cache = PipelineCostCache(lambda _samples: result.graph, cluster=request.cluster, settings=settings,
                              cost_model=request.cost_model)  # fmt: skip
    exported = PlanInput(graph=result.graph, cluster=request.cluster, settings=settings, spaces=result.spaces,
                         strategy=strategy, cost_model=request.cost_model)  # fmt: skip
    return Row(point=pipeline_point, cache=cache, degrees=Degrees(dp=dp, tp=tp, cp=cp, pp=1, ep=settings.expert_parallel),
               targets=("generic",), plan_input=exported)  # fmt: skip


def _approximation(result: PlanResult) -> str:
    """How exact the frontier is, in words."""
    if result.exact:
        return "exact"
    if result.request.method == "nsga2":
        return f"NSGA-II approximation, seed {result.request.seed}"
    if "weighted hull" in result.order_name:
        return "convex hull by weighted exact DPs, filled between its vertices: the full frontier was too large"
    return f"memory bucketed at epsilon={result.epsilon:g}"


def _time_text(result: PlanResult, strategy: Strategy) -> str:
    """Step time, or PaSE's FLOP-equivalents under ``--cost pase`` (its tables' unit)."""
    return f"{strategy.time_s:.4g} FLOP-eq" if result.request.cost_model == "pase" else format_seconds(strategy.time_s)


def research_notes(result: PlanResult, *, timed_on: str | None = None) -> tuple[str, ...]:
    """The lines under the research table that the launchable one lacks: where the ops were timed,
    the other baselines, the method and its approximation, the search's statistics, what the
    cost model could not price."""
    graph = result.graph
    notes = [] if timed_on is None else [f"compute timed on {timed_on}"]
    for baseline in result.baselines:
        if baseline.name == "data_parallel" or baseline.point is None:
            continue  # data parallelism is the table's own baseline line
        strategy = baseline.point.strategy
        notes.append(f"baseline {baseline.name.replace('_', ' ')} ({baseline.label}): {_time_text(result, strategy)}, "
                     f"{format_bytes(strategy.memory_bytes)}/device" + ("" if baseline.point.fits else " (over the limit)"))
    notes.append(
        f"research search: {result.request.method} ({_approximation(result)}), {format_seconds(result.search_time_s)} "
        f"search, {format_seconds(result.import_time_s)} import, {format_seconds(result.cost_time_s)} costing; graph "
        f"{len(graph.ops)} ops from {graph.raw_node_count} ONNX nodes; largest table {result.max_table_cells:,} cells "
        f"({result.order_name} order)"
    )  # fmt: skip
    if result.roofline_fallbacks:
        notes.append(f"{result.roofline_fallbacks} op shards unprofiled: priced by roofline")
    if graph.opaque_ops:
        names = ", ".join(sorted({op.op_type for op in graph.opaque_ops}))
        notes.append(f"{len(graph.opaque_ops)} opaque ops kept replicated ({names})")
    return (*notes, *getattr(result.cost, "notes", ()))


def _extras(result: PlanResult, timed_on: str | None) -> dict[str, Any]:
    """The research search's own data (``LaunchFrontier.extras``, JSON ``"extras"``)."""
    request, graph = result.request, result.graph
    return {
        "method": request.method, "cost_model": request.cost_model, "compute_timed_on": timed_on,
        "epsilon": result.epsilon, "exact": result.exact, "memory_bound_factor": result.memory_bound_factor,
        "pick_proven": result.pick_proven, "min_memory_bytes": result.min_memory_bytes,
        "baselines": {
            b.name: None if b.point is None else {
                "label": b.label, "step_time_s": b.point.strategy.time_s,
                "memory_per_device_bytes": b.point.strategy.memory_bytes, "fits": b.point.fits,
            }
            for b in result.baselines
        },
        "import_time_s": result.import_time_s, "cost_time_s": result.cost_time_s,
        "max_table_cells": result.max_table_cells, "order": result.order_name, "ops": len(graph.ops),
        "onnx_nodes": graph.raw_node_count, "roofline_fallbacks": result.roofline_fallbacks,
        "opaque_ops": [op.name for op in graph.opaque_ops],
    }  # fmt: skip
