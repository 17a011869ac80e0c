"""From a search result to launch plans: which targets can run a point, and writing one out.

Wiring only: the targets themselves (exporter, families, settings rules) are the registry
:data:`exporters.targets.TARGETS`. A framework exporter either emits an exact equivalent of the
chosen strategy or refuses; on a refusal the nearest plan the target *can* run is the exact fastest
over its families on the cost tables the plan already built (:func:`planner.plan.fastest_runnable`),
named with its cost.

Pipeline points become exporter inputs with a :class:`~exporters.generic.PipelineSpec`
(:func:`planner.pipeline.pipeline_plan_input`; the launchable table's rows through
:func:`planner.launchable.export_row`, which ``planner plan`` also uses for the research search's
rows: :func:`planner.research.research_frontier`). :func:`export_point` is the Python API's export
of a :class:`~planner.plan.PlanResult` point. Saved plans of either kind are re-exported by
:func:`export_saved_plan`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from exporters import PlanInput, export
from exporters.generic import PlanDocument, read_plan
from exporters.targets import runnable_targets_of, target_names
from exporters.targets import target as find_target
from objectives.tables import CostModel, launcher_options
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError, UnsupportedExport
from planner.core.graph import OpGraph
from planner.core.units import format_bytes, format_seconds
from planner.pipeline import stage_cluster
from planner.plan import PlanRequest, PlanResult, build_model, fastest_runnable, load_graph, load_plan
from planner.plan import target_filter as families_of

__all__ = [
    "plan_input",
    "export_point",
    "point_targets",
    "target_filter",
    "nearest_summary",
    "saved_plan_input",
    "export_saved_plan",
]


def plan_input(result: PlanResult, index: int) -> PlanInput:
    """The exporters' input for point ``index`` of a :class:`~planner.plan.PlanResult`."""
    return PlanInput(
        graph=result.graph,
        cluster=result.request.cluster,
        settings=getattr(result.points[index], "settings", None) or result.request.settings,  # MoE: the point's ep
        spaces=result.spaces,
        strategy=result.points[index].strategy,
        cost_model=result.request.cost_model,
    )


def point_targets(result: PlanResult, index: int) -> tuple[str, ...]:
    """Targets that can run point ``index`` exactly (``generic`` always): the point's ``targets``
    when the plan filled them, else membership in each target's families (no export attempt)."""
    point = result.points[index]
    if point.targets:
        return tuple(point.targets)
    settings = getattr(point, "settings", None) or result.request.settings
    return runnable_targets_of(result.graph, result.spaces, result.request.cluster, settings, [point.strategy.choice])[0]


def target_filter(target: str):
    """A ``plan(..., target_filter=...)`` callable restricting search to what ``target`` runs
    (:func:`planner.plan.target_filter`).

    Raises
    ------
    InputError
        For an unknown target or one that runs every strategy (``generic``).
    """
    found = families_of(target)
    if found is None:
        raise InputError(f"--target {target} runs every strategy; restrict with {target_names(frameworks_only=True)}")
    return found


def export_point(result: PlanResult, index: int, target: str) -> dict[str, Any]:
    """Export point ``index`` for ``target`` through :func:`exporters.export`, the door every route
    shares (its settings checks, then the exporter once, then a refusal of the model ending with the
    launchers that run the plan: :mod:`exporters.elsewhere`); on refusal, name the nearest plan the
    target can run, found on the result's own cost tables.

    Raises
    ------
    InputError
        For an unknown target (the message names ``--export`` and lists the formats).
    UnsupportedExport
        With the reason and the nearest expressible plan's summary and cost.
    """
    find_target(target, flag="--export")  # the unknown-name error of the CLI's flag
    try:
        return export(target, plan_input(result, index))
    except UnsupportedExport as refusal:
        if refusal.nearest_summary:
            raise
        nearest = _nearest_line(result.graph, result.request, result.cost, target)
        raise UnsupportedExport(refusal.reason, nearest_summary=nearest) from None


def _nearest_line(graph: OpGraph, request: PlanRequest, model: CostModel | None, target: str) -> str:
    """The fastest plan ``target`` runs (within the memory limit if any fits), in one line, from
    ``model``'s tables (:func:`planner.plan.fastest_runnable`); ``""`` when there is no model."""
    if model is None:
        return ""
    try:
        found = fastest_runnable(graph, request, model, target)
    except Exception:  # noqa: BLE001 - the refusal itself must still reach the user
        return ""
    if found is None:
        return ""  # the refusal's reason says what the target needs (e.g. a transformer)
    summary, strategy = found
    return (
        f"{summary}, {format_seconds(strategy.time_s)}/step, "
        f"{format_bytes(strategy.memory_bytes)}/device (plan with --target {target})"
    )


def nearest_summary(graph: OpGraph, request: PlanRequest, target: str) -> str:
    """The fastest plan ``target`` can run (within the memory limit if any fits), in one line; the
    cost model is built here (a plan result already has one: :func:`export_point` reuses it)."""
    try:
        model = build_model(graph, request)
    except Exception:  # noqa: BLE001 - the refusal itself must still reach the user
        return ""
    return _nearest_line(graph, request, model, target)


# --------------------------------------------------------------------------------------------
# pipeline points


# --------------------------------------------------------------------------------------------
# saved plans


def _model_path(data: Any, model: str | Path | None) -> Path:
    path = Path(model) if model is not None else Path(data["model"].get("source_path") or "")
    if not str(path) or not path.is_file():
        raise InputError(
            f"the plan's model '{path}' is not found; pass --model MODEL.onnx (the file the plan was made for)"
        )
    return path


def _saved_pipeline_input(document: PlanDocument, model: str | Path | None) -> PlanInput:
    """A saved pipeline plan as exporter input: its ops' splits looked up among one stage's configurations."""

    data = document.data
    graph = load_graph(_model_path(data, model), data["model"]["dims"])
    document.check_graph(graph)
    cluster = document.cluster()
    pipeline = document.pipeline
    stage = stage_cluster(cluster, pipeline.devices_per_stage)
    options = ConfigOptions(devices=pipeline.devices_per_stage, devices_per_node=stage.devices_per_node)
    if data.get("cost_model", "roofline") != "pase":
        options = launcher_options(options)
    memo: dict[tuple, Any] = {}
    spaces, choice = [], []
    for op, saved in zip(graph.ops, document.ops):
        key = (tuple((d.name, d.size, d.splittable, d.is_batch) for d in op.dims), op.kind)
        if key not in memo:
            memo[key] = enumerate_configs(op, options)
        space = memo[key]
        try:
            choice.append(saved.row_in(space))
        except KeyError:
            raise InputError(
                f"op {op.name}: split {dict(saved.splits)} is not a configuration of a {pipeline.devices_per_stage}-device "
                "stage; plan the model again"
            ) from None
        spaces.append(space)
    batch = data["batch"]
    return PlanInput(
        graph=graph,
        cluster=cluster,
        settings=document.settings(),
        spaces=tuple(spaces),
        strategy=dataclasses.replace(document.strategy(), choice=tuple(choice)),
        micro_batch=batch["micro_batch"],
        global_batch=batch["global_batch"],
        cost_model=data.get("cost_model", "roofline"),
        pipeline=pipeline,
    )


def saved_plan_input(path: str | Path, *, model: str | Path | None = None):
    """The exporters' input for a plan saved with ``--export generic`` (pipeline plans included).

    Raises
    ------
    InputError
        Unreadable, old or malformed plans; a missing or different model; a split the cluster lacks.
    """
    document = read_plan(path)
    if document.pipeline is not None:
        return _saved_pipeline_input(document, model)
    loaded = load_plan(path, model=model)
    batch = loaded.document.data.get("batch", {})
    return PlanInput(
        graph=loaded.graph,
        cluster=loaded.request.cluster,
        settings=loaded.request.settings,
        spaces=tuple(loaded.cost.tables.configs),
        strategy=loaded.cost.strategy(loaded.choice),
        micro_batch=batch.get("micro_batch"),
        global_batch=batch.get("global_batch"),
        cost_model=loaded.request.cost_model,
    )


def export_saved_plan(path: str | Path, target: str, *, model: str | Path | None = None) -> dict[str, Any]:
    """Re-export a saved plan for ``target``.

    Raises
    ------
    UnsupportedExport
        With the reason and, for plans without a pipeline, the nearest plan ``target`` can run.
    """
    source = saved_plan_input(path, model=model)
    try:
        return export(target, source)
    except UnsupportedExport as refusal:
        if refusal.nearest_summary or source.pipeline is not None:
            raise
        request = PlanRequest(cluster=source.cluster, settings=source.settings, cost_model=source.cost_model)  # type: ignore[arg-type]
        raise UnsupportedExport(refusal.reason, nearest_summary=nearest_summary(source.graph, request, target)) from None
