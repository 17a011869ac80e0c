"""From a search result to launch plans: which targets can run a point, and writing one out.

A framework exporter either emits an exact equivalent of the chosen strategy or refuses; on a
refusal this module searches the target's expressible families (exact search over restricted tables,
same cost model) and names the nearest plan the target *can* run, with its cost.
"""

from __future__ import annotations

from typing import Any

from planner.core.errors import UnsupportedExport
from planner.core.units import format_bytes, format_seconds

__all__ = ["plan_input", "export_point", "point_targets", "target_filter", "nearest_summary"]


def plan_input(result: Any, index: int):
    """The exporters' input for point ``index`` of a :class:`~planner.plan.PlanResult`."""
    from exporters import PlanInput

    return PlanInput(
        graph=result.graph,
        cluster=result.request.cluster,
        settings=result.request.settings,
        spaces=result.spaces,
        strategy=result.points[index].strategy,
        cost_model=result.request.cost_model,
    )


def point_targets(result: Any, index: int) -> tuple[str, ...]:
    """Targets that can run point ``index`` exactly (``generic`` always)."""
    from exporters import runnable_targets

    return runnable_targets(plan_input(result, index))


def target_filter(target: str):
    """A ``plan(..., target_filter=...)`` callable restricting search to what ``target`` runs."""
    from exporters import target_masks

    def families(graph, spaces, cluster):
        found = target_masks(
            target, graph, spaces, devices=cluster.devices, devices_per_node=cluster.devices_per_node
        )
        return [masks for _label, masks in found]

    return families


def export_point(result: Any, index: int, target: str) -> dict[str, Any]:
    """Export point ``index`` for ``target``; on refusal, name the nearest plan the target can run.

    Raises
    ------
    UnsupportedExport
        With the reason and the nearest expressible plan's summary and cost.
    """
    from exporters import export

    try:
        return export(target, plan_input(result, index))
    except UnsupportedExport as refusal:
        if refusal.nearest_summary:
            raise
        raise UnsupportedExport(
            refusal.reason, nearest_summary=nearest_summary(result.graph, result.request, target)
        ) from None


def nearest_summary(graph: Any, request: Any, target: str) -> str:
    """The fastest plan ``target`` can run (within the memory limit if any fits), in one line."""
    from planner.plan import plan

    try:
        restricted = plan(graph, request, target_filter=target_filter(target), with_targets=False)
    except Exception:  # noqa: BLE001 - the refusal itself must still reach the user
        return ""
    best = restricted.best or (restricted.points[0] if restricted.points else None)
    if best is None:
        return f"{target} can run no strategy of this model"
    return (
        f"{best.summary}, {format_seconds(best.strategy.time_s)}/step, "
        f"{format_bytes(best.strategy.memory_bytes)}/device (plan with --target {target})"
    )
