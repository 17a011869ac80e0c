"""Launch targets in the per-op plan (``--target``): the families of strategies a target runs
(:func:`target_filter`), what a target needs that a model lacks (:func:`target_refusal`), the
nearest plan it runs (:func:`fastest_runnable`) and the ``targets`` column of a result's rows
(:func:`_with_targets`), all read from :data:`exporters.targets.TARGETS`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from planner import families
from planner.core.cluster import Cluster
from planner.core.configs import ConfigSpace
from planner.core.errors import PlannerError, UnsupportedExport
from planner.core.graph import OpGraph
from planner.core.memo import IdentityMemo
from planner.core.settings import TrainingSettings
from planner.core.strategy import Strategy
from planner.plan_types import PlanRequest, PlanResult

__all__ = ["TargetFilter", "target_filter", "target_priced", "target_refusal", "refuse_export", "fastest_runnable"]


TargetFilter = Callable[[OpGraph, Sequence[ConfigSpace], Cluster, TrainingSettings], list[list[np.ndarray]]]
"""``filter(graph, spaces, cluster, settings)``: per family of strategies a launch target runs under
``settings``, one boolean mask per op (see :func:`planner.plan.plan`)."""


def target_filter(target: str) -> TargetFilter | None:
    """The ``plan(..., target_filter=...)`` of a ``--target``: its families in
    :data:`exporters.targets.TARGETS` that its settings rules allow under the request's settings
    (ZeRO stage, recomputation, expert parallelism, whole nodes); ``None`` for ``generic``, which
    runs every strategy.

    Raises
    ------
    InputError
        For an unknown target (the message lists the registry's names).
    """
    from exporters.targets import target as find_target

    found = find_target(target)
    if not found.restricts:
        return None

    def families(
        graph: OpGraph, spaces: Sequence[ConfigSpace], cluster: Cluster, settings: TrainingSettings
    ) -> list[list[np.ndarray]]:
        return [
            list(family.masks)
            for family in found.families(graph, spaces, devices=cluster.devices, devices_per_node=cluster.devices_per_node, pp=1)
            if found.allows is None or found.allows(family, settings, cluster, graph)
        ]

    families.target = target  # type: ignore[attr-defined]  # plan() names it when nothing runs
    return families


def target_priced(request: PlanRequest, restrict_to: TargetFilter | None) -> PlanRequest:
    """``request`` with the time rule of the target ``restrict_to`` names (:func:`target_filter`) at its ZeRO stage:
    its ZeRO 0-2 synchronisation (``Target.zero_sync``: DeepSpeed's all-reduce after the backward at ZeRO-0, gather
    after the step at ZeRO-1/2), so its plans are priced as
    it runs them and listed as its own (``Target.unpriced_sync``); the request itself without one."""
    from exporters.targets import target as find_target

    name = getattr(restrict_to, "target", None)
    if name is None:
        return request
    priced = find_target(name).priced_settings(request.settings)
    return request if priced is request.settings else dataclasses.replace(request, settings=priced)


def target_refusal(graph: OpGraph, cluster: Cluster, settings: TrainingSettings, target: str) -> str | None:
    """What ``target`` needs that the model lacks: its exporter's refusal of the replicated strategy
    (e.g. Megatron-LM on a model that is not a GPT), without its final period; ``None`` when the
    exporter accepts that strategy (the target runs the model, only not on every layout) or fails
    for another reason (nothing better to say than the caller's own message).

    The strategy uses one device without expert parallelism, so the refusal is about the model,
    not about ``settings.expert_parallel`` or the cluster's size. The answer is kept per (graph, cluster,
    settings) objects: ``--export``'s refusal before the search (:func:`refuse_export`) and the search's own
    probe of the same launcher run its exporter once."""
    if target not in _REFUSALS:
        _REFUSALS[target] = IdentityMemo(size=8)
    return _REFUSALS[target].get((graph, cluster, settings), lambda: _exporter_refusal(graph, cluster, settings, target))


_REFUSALS: dict[str, IdentityMemo[str | None]] = {}
""":func:`target_refusal`'s answers, per launcher."""


def _exporter_refusal(graph: OpGraph, cluster: Cluster, settings: TrainingSettings, target: str) -> str | None:
    """:func:`target_refusal`, computed: the exporter run on the replicated one-device plan."""
    from exporters import PlanInput, export, one_device_plan

    spaces, replicated = one_device_plan(graph)
    try:
        plain = dataclasses.replace(settings, expert_parallel=1)
        export(target, PlanInput(graph=graph, cluster=cluster, settings=plain, spaces=spaces, strategy=replicated))
    except UnsupportedExport as refusal:
        return refusal.reason.rstrip(". ")
    except PlannerError:
        return None
    return None


def refuse_export(graph: OpGraph, cluster: Cluster, settings: TrainingSettings, export: str | None,
                  searched: Sequence[str] | None) -> None:
    """Refuse ``--export LAUNCHER`` before the search when that launcher trains no plan of ``graph``
    (:func:`target_refusal`: torchtitan or Megatron-LM on a model none of their model families
    builds, a ResNet), whatever row would be picked, rather than after the search. Nothing
    for the generic plan, nor for a launcher ``--target`` named (``searched``, ``None``: every one),
    whose refusal :func:`planner.launch_messages.fit_message` says, without searching either.

    Raises
    ------
    UnsupportedExport
        ``--export X can export no plan of MODEL: <X's reason and fix>``.
    """
    from exporters.targets import target as find_target

    if export is None or not find_target(export, flag="--export").restricts or export in (searched or ()):
        return
    reason = target_refusal(graph, cluster, settings, export)
    if reason is not None:
        raise UnsupportedExport(f"--export {export} can export no plan of {graph.name}: {reason}")


def _no_target_strategy(graph: OpGraph, request: PlanRequest, target_filter) -> str:
    """Why ``--target X`` runs no strategy of ``graph``: :func:`target_refusal`, else that no
    family of X has a configuration for every op on these devices."""
    target = getattr(target_filter, "target", None) or "the target"
    devices = request.cluster.devices
    reason = None if target == "the target" else target_refusal(graph, request.cluster, request.settings, target)
    reason = reason or f"no {target} layout has a configuration for every op of the model on {devices} devices"
    return (
        f"--target {target} can run no strategy of {graph.name} on {devices} devices: {reason}; "
        "plan with --target generic (every strategy, exported as the generic plan) or another target"
    )


def fastest_runnable(graph: OpGraph, request: PlanRequest, model, target: str) -> tuple[str, Strategy] | None:
    """The nearest plan ``target`` runs: its fastest strategy within the request's memory limit,
    else its fastest at all, as ``(summary, strategy)``; ``None`` when it runs none.

    Computed on the cost tables already built (``model``, an ``objectives.tables.CostModel`` of
    ``graph`` under ``request``): per family of the target allowed by the request's settings, the
    exact fastest within the limit on the tables restricted to its masks
    (:func:`planner.search.constrained.fastest_within_exact`), the best of the families kept. No
    cost model is rebuilt and nothing is searched unrestricted.
    """
    from exporters.targets import target as find_target
    from planner.search.constrained import fastest_within_exact
    from planner.search.elimination import solve_min
    from planner.search.restrict import restrict

    found = find_target(target)
    if not found.restricts:
        return None
    tables = model.tables
    limit = request.memory_limit_bytes or float(request.cluster.device.memory_bytes)
    cluster = request.cluster
    usable = [
        family.masks
        for family in found.families(graph, tables.configs, devices=cluster.devices, devices_per_node=cluster.devices_per_node, pp=1)
        if all(m.any() for m in family.masks) and (found.allows is None or found.allows(family, request.settings, cluster, graph))
    ]
    restricted = [restrict(tables, masks) for masks in usable]

    def best_of(choices) -> np.ndarray | None:
        keyed = [(tables.evaluate(c), i, c) for i, c in enumerate(choices) if c is not None]
        return min(keyed, key=lambda k: (k[0], k[1]))[2] if keyed else None

    fastest = [solve_min(r.tables, objective="time") for r in restricted]  # a cheap DP per family
    fitting = []
    for r, best in zip(restricted, fastest):
        if not np.isfinite(best.value):
            fitting.append(None)
        elif r.tables.evaluate(best.choice)[1] <= limit:
            fitting.append(r.to_original(best.choice))  # its fastest fits: the fastest within the limit
        else:  # proven against the family's unconstrained minimum as a lower bound
            pick = fastest_within_exact(r.tables, limit, time_lower_bound_s=best.value)
            fitting.append(None if pick.point is None else r.to_original(pick.point.choice))
    choice = best_of(fitting)
    if choice is None:  # nothing it runs fits: its fastest plan, over the limit
        choice = best_of([r.to_original(f.choice) if np.isfinite(f.value) else None for r, f in zip(restricted, fastest)])
    if choice is None:
        return None
    return families.describe_choice(graph, tables.configs, choice), model.strategy(choice)


def _with_targets(result: PlanResult) -> PlanResult:
    """``result`` with each point's ``targets``: membership in every target's families (or rule),
    built once for the result's configuration spaces (:func:`exporters.targets.runnable_targets_of`),
    never an export attempt."""
    from exporters.targets import runnable_targets_of

    column = runnable_targets_of(
        result.graph, result.spaces, result.request.cluster, result.request.settings,
        [p.strategy.choice for p in result.points],
    )  # fmt: skip
    points = tuple(dataclasses.replace(p, targets=names) for p, names in zip(result.points, column))
    return dataclasses.replace(result, points=points)


def _runnable_by(result: PlanResult, target: str | None) -> PlanResult:
    """``result`` with only the points ``target`` exports (its families say nothing about ep: a
    launcher without expert parallelism refuses every ``ep > 1`` point)."""
    if target is None:
        return result
    if any(not p.targets for p in result.points):
        result = _with_targets(result)
    keep = [p for p in result.points if target in p.targets]
    return dataclasses.replace(result, points=tuple(keep), chosen=None)
