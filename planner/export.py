"""From a search result to launch plans: which targets can run a point, and writing one out.

Wiring only: the targets themselves (exporter, families, settings rules) are the registry
:data:`exporters.targets.TARGETS`. A framework exporter either emits an exact equivalent of the
chosen strategy or refuses; on a refusal the nearest plan the target *can* run is the exact fastest
over its families on the cost tables the plan already built (:func:`planner.plan.fastest_runnable`),
named with its cost.

Pipeline points (:class:`planner.pipeline.PipelineResult`) become exporter inputs with a
:class:`~exporters.generic.PipelineSpec` (:func:`pipeline_plan_input`); their nearest runnable plan
is the fastest frontier point the target runs. Saved plans of either kind are re-exported by
:func:`export_saved_plan`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from exporters.targets import FRAMEWORK_TARGETS, Family
from planner.core.errors import InputError, UnsupportedExport
from planner.core.units import format_bytes, format_seconds

__all__ = [
    "plan_input",
    "export_point",
    "point_targets",
    "target_filter",
    "nearest_summary",
    "pipeline_plan_input",
    "point_plan_input",
    "pipeline_targets",
    "PIPELINE_TARGETS",
    "TargetFamily",
    "pipeline_target_families",
    "pipeline_target_allows",
    "keep_runnable",
    "export_pipeline_point",
    "saved_plan_input",
    "export_saved_plan",
]


def plan_input(result: Any, index: int):
    """The exporters' input for point ``index`` of a :class:`~planner.plan.PlanResult`."""
    from exporters import PlanInput

    return PlanInput(
        graph=result.graph,
        cluster=result.request.cluster,
        settings=getattr(result.points[index], "settings", None) or result.request.settings,  # MoE: the point's ep
        spaces=result.spaces,
        strategy=result.points[index].strategy,
        cost_model=result.request.cost_model,
    )


def point_targets(result: Any, index: int) -> tuple[str, ...]:
    """Targets that can run point ``index`` exactly (``generic`` always): the point's ``targets``
    when the plan filled them, else membership in each target's families (no export attempt)."""
    from exporters.targets import runnable_targets_of

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
    from exporters.targets import target_names
    from planner.plan import target_filter as families_of

    found = families_of(target)
    if found is None:
        raise InputError(f"--target {target} runs every strategy; restrict with {target_names(frameworks_only=True)}")
    return found


def export_point(result: Any, index: int, target: str) -> dict[str, Any]:
    """Export point ``index`` for ``target`` (its exporter runs once); on refusal, name the nearest
    plan the target can run, found on the result's own cost tables.

    Raises
    ------
    UnsupportedExport
        With the reason and the nearest expressible plan's summary and cost.
    """
    from exporters.targets import target as find_target

    try:
        return find_target(target, flag="--export").export(plan_input(result, index))
    except UnsupportedExport as refusal:
        if refusal.nearest_summary:
            raise
        nearest = _nearest_line(result.graph, result.request, result.cost, target)
        raise UnsupportedExport(refusal.reason, nearest_summary=nearest) from None


def _nearest_line(graph: Any, request: Any, model: Any, target: str) -> str:
    """The fastest plan ``target`` runs (within the memory limit if any fits), in one line, from
    ``model``'s tables (:func:`planner.plan.fastest_runnable`); ``""`` when there is no model."""
    from planner.plan import fastest_runnable

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


def nearest_summary(graph: Any, request: Any, target: str) -> str:
    """The fastest plan ``target`` can run (within the memory limit if any fits), in one line; the
    cost model is built here (a plan result already has one: :func:`export_point` reuses it)."""
    from planner.plan import build_model

    try:
        model = build_model(graph, request)
    except Exception:  # noqa: BLE001 - the refusal itself must still reach the user
        return ""
    return _nearest_line(graph, request, model, target)


# --------------------------------------------------------------------------------------------
# pipeline points


def _pipeline_spec(point: Any):
    from exporters import PipelineSpec, StageSpec

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


def pipeline_plan_input(result: Any, index: int):
    """The exporters' input for point ``index`` of a :class:`~planner.pipeline.PipelineResult`.

    The graph is the model at the point's micro-batch (``micro_batch_samples``), the spaces and
    choice one stage's (``devices_per_stage`` devices), the cluster the whole one; the strategy's
    time and memory are the pipeline's step time and its fullest stage's memory.
    """
    if result.cache is None:
        raise InputError("this pipeline result keeps no cost cache; run pipeline_search again to export its points")
    return point_plan_input(result.points[index], result.cache)


def point_plan_input(point: Any, cache: Any):
    """The exporters' input for one :class:`~planner.pipeline.PipelinePoint` priced with ``cache``
    (a :class:`~planner.pipeline.PipelineCostCache`: the cluster, precision and cost model), e.g.
    ``planner.estimate.estimate(...).point``; see :func:`pipeline_plan_input`."""
    from exporters import PlanInput
    from planner.core.strategy import Strategy

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
        settings=dataclasses.replace(cache.settings, zero_stage=point.zero_stage, recompute=point.recompute),
        spaces=tuple(point.spaces),
        strategy=strategy,
        micro_batch=point.micro_batch_samples,
        global_batch=point.global_batch,
        cost_model=cache.cost_model,
        pipeline=_pipeline_spec(point),
    )


def pipeline_targets(result: Any) -> tuple[tuple[str, ...], ...]:
    """Per point of a pipeline result, the targets that can run it exactly (``generic`` always)."""
    from exporters import runnable_targets

    return tuple(runnable_targets(pipeline_plan_input(result, i)) for i in range(len(result.points)))


PIPELINE_TARGETS = FRAMEWORK_TARGETS
"""Targets :func:`pipeline_target_families` restricts a pipeline search to (``generic`` runs every
plan): the framework targets of :data:`exporters.targets.TARGETS`."""


TargetFamily = Family
"""One family of per-op configurations a launch target runs on one pipeline stage
(:class:`exporters.targets.Family`: ``label``, ``tp``, ``masks``, ``dp``)."""


def pipeline_target_families(
    target: str, graph: Any, spaces: Sequence[Any], *, devices: int, devices_per_node: int, pp: int
) -> list[TargetFamily]:
    """The configuration families ``target`` can run on each stage of a ``pp``-stage pipeline
    (:meth:`exporters.targets.Target.pipeline_families`).

    Parameters
    ----------
    target:
        A framework target (``megatron``, ``deepspeed``, ``meshtf``, ``dtensor``).
    graph, spaces:
        The model at one micro-batch and each op's configurations on one stage.
    devices, devices_per_node:
        One stage's devices and the devices per node of its sub-cluster
        (:func:`planner.pipeline.stage_cluster`).
    pp:
        Pipeline stages. With ``pp > 1`` Megatron-LM and DeepSpeed give every stage all its
        devices (``dp x tp`` equal to ``devices``), DeepSpeed pipelines only ``tp = 1``, and Mesh-TF
        and the DTensor plan run no pipeline (no family); with ``pp = 1`` the families are those of
        :func:`exporters.target_masks` (which may leave devices idle, as the plain search does).

    Returns
    -------
    list of TargetFamily
        Empty when the target runs nothing here.

    Raises
    ------
    InputError
        For an unknown target.
    """
    from exporters.targets import TARGETS, target_names

    found = TARGETS.get(target)
    if found is None or not found.restricts:
        raise InputError(f"unknown --target '{target}'; use {target_names()}")
    return found.pipeline_families(graph, spaces, devices=devices, devices_per_node=devices_per_node, pp=pp)


def pipeline_target_allows(
    target: str, *, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None
) -> bool:
    """Whether ``target``'s exporter accepts these pipeline settings (its refusals that do not
    depend on the per-op splits; :func:`keep_runnable` still checks each point), as its
    :meth:`~exporters.targets.Target.allows_pipeline` says.

    Examples
    --------
    >>> pipeline_target_allows("megatron", pp=2, zero_stage=2, recompute="none", schedule="1f1b", tp=2)
    False
    >>> pipeline_target_allows("megatron", pp=1, zero_stage=3, recompute="full", schedule="gpipe", tp=2)
    True
    >>> pipeline_target_allows("deepspeed", pp=1, zero_stage=3, recompute="none", schedule="1f1b", tp=2)
    False
    """
    from exporters.targets import TARGETS

    found = TARGETS.get(target)
    if found is None:
        return True
    return found.allows_pipeline(pp=pp, zero_stage=zero_stage, recompute=recompute, schedule=schedule, tp=tp)


def keep_runnable(result: Any, target: str, targets: Sequence[tuple[str, ...]]) -> tuple[Any, tuple[tuple[str, ...], ...]]:
    """The points of a pipeline result that ``target`` can run (a filter after the search).

    Returns the result with only those points (the pick re-chosen: the fastest that fits) and their
    targets. After ``pipeline_search(..., target=target)`` it is a safety check (rules that depend on
    the stage cut, such as interleaved chunks dividing a stage's layers); after an unrestricted
    search a target may run a plan slower than every frontier point that no frontier point shows.
    """
    keep = [i for i, names in enumerate(targets) if target in names]
    points = tuple(result.points[i] for i in keep)
    chosen = next((j for j, p in enumerate(points) if p.fits), None)
    message = result.message
    if not points and getattr(result, "target", None) == target:
        message = (
            f"{target} runs no plan of this model on these devices (its layouts, ZeRO stages and schedules were "
            "searched); plan without --target, or change --global-batch, --pp or --schedule"
        )
    elif not points:
        message = (
            f"no frontier plan can be run by {target} (the pipeline search is not restricted to its layouts); price "
            f"a {target} configuration with `planner estimate` (--tp, --pp, --stage-layers) or plan without --target"
        )
    elif chosen is None:
        smallest = min(p.memory_bytes for p in points)
        message = (
            f"no plan {target} can run fits in {format_bytes(result.memory_limit_bytes)} per device; the smallest "
            f"needs {format_bytes(smallest)}; try more devices or a smaller --global-batch"
        )
    notes = (*result.notes, f"--target {target}: {len(points)} of {len(result.points)} frontier points kept")
    filtered = dataclasses.replace(result, points=points, chosen=chosen, message=message, notes=notes)
    return filtered, tuple(targets[i] for i in keep)


def _pipeline_row(point: Any, index: int) -> str:
    return (
        f"row {index + 1}: {point.summary}, {format_seconds(point.time_s)}/step, "
        f"{format_bytes(point.memory_bytes)}/device (--pick {index + 1})"
    )


def export_pipeline_point(
    result: Any, index: int, target: str, targets: Sequence[tuple[str, ...]] | None = None
) -> dict[str, Any]:
    """Export pipeline point ``index`` for ``target``; on refusal, name the fastest frontier point
    the target can run (within the memory limit if one fits).

    Raises
    ------
    UnsupportedExport
        With the reason and the nearest runnable point.
    """
    from exporters import export

    try:
        return export(target, pipeline_plan_input(result, index))
    except UnsupportedExport as refusal:
        if refusal.nearest_summary:
            raise
        targets = targets if targets is not None else pipeline_targets(result)
        runnable = [i for i, names in enumerate(targets) if target in names and i != index]
        best = next((i for i in runnable if result.points[i].fits), runnable[0] if runnable else None)
        nearest = (
            _pipeline_row(result.points[best], best) if best is not None
            else f"no frontier point; {target} runs none of them"
        )
        raise UnsupportedExport(refusal.reason, nearest_summary=nearest) from None


# --------------------------------------------------------------------------------------------
# saved plans


def _model_path(data: Any, model: str | Path | None) -> Path:
    path = Path(model) if model is not None else Path(data["model"].get("source_path") or "")
    if not str(path) or not path.is_file():
        raise InputError(
            f"the plan's model '{path}' is not found; pass --model MODEL.onnx (the file the plan was made for)"
        )
    return path


def _saved_pipeline_input(document: Any, model: str | Path | None):
    """A saved pipeline plan as exporter input: its ops' splits looked up among one stage's configurations."""
    from exporters import PlanInput
    from objectives.tables import launcher_options
    from planner.core.configs import ConfigOptions, enumerate_configs
    from planner.pipeline import stage_cluster
    from planner.plan import load_graph

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
    from exporters import PlanInput
    from exporters.generic import read_plan
    from planner.plan import load_plan

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
    from exporters import export

    source = saved_plan_input(path, model=model)
    try:
        return export(target, source)
    except UnsupportedExport as refusal:
        if refusal.nearest_summary or source.pipeline is not None:
            raise
        from planner.plan import PlanRequest

        request = PlanRequest(cluster=source.cluster, settings=source.settings, cost_model=source.cost_model)  # type: ignore[arg-type]
        raise UnsupportedExport(refusal.reason, nearest_summary=nearest_summary(source.graph, request, target)) from None
