"""Where else a plan a launcher refuses can be exported: the suffix of a refusal of the model itself.

A launcher that refuses a model for what it computes (Megatron-LM's and torchtitan's families: a
feature no flag builds, a router it cannot check; Megatron-LM and Mesh-TF: a sequence past a learned
position table, whose longer table would be another model) ends its one line with
:data:`ELSEWHERE`, "; export as the generic plan", true of every plan. :func:`exporters.export`, the
one door the CLI's ``planner plan --export``, ``planner export`` and the table's "not listed" lines
(:func:`planner.plan_targets.target_refusal`) go through, hands the refusal to :func:`redirected`,
which names instead the other launchers that run the plan at hand, read from the rules the table's
``launchers`` column reads (:func:`exporters.targets.runnable_plan_targets`; no exporter runs). So the
suggestion never names a launcher that refuses the same plan: a GPT-2 at ``seq=2048`` past its
1,024-row table is refused by DeepSpeed, DTensor and Mesh-TF as by Megatron-LM, and Megatron-LM's line
then ends "; export as the generic plan" where it used to send the user to DTensor.

The Python API's :func:`planner.export.export_point` goes through the same door, so a point refused
there reads as on the command line. A caller of an exporter itself (``export_megatron``) skips the
door's settings checks and keeps the plain suffix, which is still true.
"""

from __future__ import annotations

from typing import Callable, Sequence

from planner.core.errors import PlannerError, UnsupportedExport

__all__ = ["ELSEWHERE", "elsewhere", "redirected"]

ELSEWHERE = "; export as the generic plan"
"""The end of a launcher's refusal of the model itself, before :func:`redirected` names the others."""


def elsewhere(refusing: str, runs: Sequence[str]) -> str:
    """The suffix of ``refusing``'s refusal of a plan that the targets ``runs`` run (registry order,
    ``generic`` among them): the other launchers, then the generic plan; :data:`ELSEWHERE` when no
    other launcher runs it.

    Examples
    --------
    >>> elsewhere("megatron", ["generic"])
    '; export as the generic plan'
    >>> elsewhere("megatron", ["generic", "dtensor"])
    '; export with --target dtensor or as the generic plan'
    >>> elsewhere("torchtitan", ["generic", "megatron", "deepspeed", "dtensor"])
    '; export with --target megatron, deepspeed or dtensor, or as the generic plan'
    """
    names = [name for name in runs if name not in ("generic", refusing)]
    if not names:
        return ELSEWHERE
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1] + ","
    return f"; export with --target {listed} or as the generic plan"


def redirected(refusal: UnsupportedExport, refusing: str, runs: Callable[[], Sequence[str]]) -> UnsupportedExport:
    """``refusal`` with :data:`ELSEWHERE` replaced by :func:`elsewhere` of the targets ``runs()`` names
    (:func:`exporters.targets.runnable_plan_targets` of the plan, asked only here: handed in, as this
    module sits below the registry); the same refusal when its reason does not end with it (a refusal
    of the plan's splits or settings names its own fix)."""
    if not refusal.reason.endswith(ELSEWHERE):
        return refusal
    try:
        found = runs()
    except PlannerError:  # the rules cannot read the plan: name no launcher rather than a wrong one
        found = ()
    reason = refusal.reason[: -len(ELSEWHERE)] + elsewhere(refusing, found)
    return UnsupportedExport(reason, nearest=refusal.nearest, nearest_summary=refusal.nearest_summary)
