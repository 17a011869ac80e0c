"""What torchtitan runs, without exporting: its families, settings rules and stage rule.

The families are one per ``dp x cp x tp`` (with sequence parallelism on and off for ``tp > 1``) whose
masks :func:`~exporters.torchtitan.export.torchtitan_masks` gives, on every stage of a pipeline too;
the settings rules are the exporter's refusals that ignore the per-op splits (FSDP2's ZeRO-0 or 3,
no selective recomputation, expert parallelism only where torchtitan's is the planner's, a dropless
MoE, whole nodes, the batch split); the stage rule is what a ``pp > 1`` plan's stage cut and
micro-batches must satisfy (:mod:`exporters.torchtitan.validate`).
:data:`exporters.torchtitan.TARGET` names them; ``tests/exporters/test_targets.py`` holds them equal
to the exporter's answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from exporters._target import Family, dp_cp_tp_families, on_whole_nodes, pipeline_launches

if TYPE_CHECKING:
    from exporters.generic import PlanInput
    from planner.core.cluster import Cluster
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph
    from planner.core.settings import TrainingSettings

__all__ = ["families", "settings_allows", "allows", "pipeline_allows", "stage_rule", "offload_rule", "CONTEXT_ZERO"]

CONTEXT_ZERO = (3,)
"""The ZeRO stages torchtitan runs with ``cp > 1``: FSDP2 shards the parameters over ``dp_shard x cp``
(the exporter refuses ZeRO-0 there), so ZeRO-3 (``Target.context_zero``)."""


def families(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, devices_per_node: int | None, pp: int,
    degrees: tuple[int, int] | None = None,
) -> list[Family]:
    """One family per ``dp x cp x tp`` (``sp``: with sequence parallelism) on a stage of ``devices``
    (:func:`~exporters._target.dp_cp_tp_families` over :func:`~exporters.torchtitan.export.torchtitan_masks`)."""
    from exporters.torchtitan.export import torchtitan_masks

    return dp_cp_tp_families(graph, spaces, torchtitan_masks, devices=devices, devices_per_node=devices_per_node, pp=pp,
                             degrees=degrees)


def _settings_run(zero_stage: int, recompute: str) -> bool:
    """FSDP2 shards all or nothing (ZeRO 0 or 3); its selective AC is the ``op`` mode, not Megatron's
    attention core (``TARGET.recompute``)."""
    return zero_stage in (0, 3) and recompute != "selective"


def settings_allows(family: Family, settings: TrainingSettings, graph: OpGraph) -> bool:
    """ZeRO 0 or 3 (3 with ``cp > 1``: FSDP2 shards over ``dp_shard x cp``), no selective recomputation,
    Adam, ``ep = 1`` or torchtitan's ``ep`` at this family's degrees (``tp = 1``, ZeRO-3, no HSDP, ``ep``
    dividing ``dp x cp``, even expert shards: :mod:`exporters.torchtitan.experts`), capacity factor 1 for a routed
    model (its dispatcher is dropless): what :func:`allows` asks besides the nodes and the batch, which the
    searches ask before pricing (``Target.settings_allows``)."""
    from importers.transformer import moe_summary

    return (
        _settings_run(settings.zero_stage, settings.recompute)
        and (family.cp == 1 or settings.zero_stage in CONTEXT_ZERO)
        and settings.optimizer == "adam"
        and _experts_run(family, settings, graph)
        and (settings.capacity_factor == 1.0 or moe_summary(graph) is None)
    )


allows = on_whole_nodes(settings_allows)
"""``Target.allows``: :func:`settings_allows`, on whole nodes with ``dp`` dividing the batch."""


def _experts_run(family: Family, settings: TrainingSettings, graph: OpGraph) -> bool:
    """The planner's ``ep`` is torchtitan's ``expert_parallel_degree`` at this family's degrees
    (:func:`exporters.torchtitan.experts.expert_parallel_refusal`); always at ``ep = 1``."""
    if settings.expert_parallel <= 1:
        return True
    from exporters.torchtitan.experts import expert_parallel_refusal
    from exporters.torchtitan.moe import routed_ffn
    from importers.transformer import analyze_transformer, moe_summary

    model = analyze_transformer(graph)
    return expert_parallel_refusal(settings, moe_summary(graph), model, dp=family.dp or 1, cp=family.cp,
                                   tp=family.tp or 1, expert_ffn=routed_ffn(graph, model)) is None


def pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    """Every schedule (GPipe, 1F1B, Interleaved1F1B; the zero-bubble InterleavedZeroBubble and
    ZBVZeroBubble under ``--engine eager`` only, refused by :func:`stage_rule` through the exporter)
    under FSDP2's ZeRO 0 or 3."""
    return _settings_run(zero_stage, recompute)


def offload_rule(offload: str, *, zero_stage: int, pp: int, recompute: str) -> bool:
    """``training.enable_cpu_offload``: FSDP2's ``CPUOffloadPolicy`` on every ``fully_shard`` (torchtitan 0.3.0
    ``distributed/fsdp.py``), so ZeRO-3 only; ``pp = 1``, as priced: with a pipeline torchtitan keeps the
    gathered weights from forward to backward (``get_fsdp_reshard_after_forward_policy``: "default" is
    ``not pp_enabled``), one H2D per micro-batch where :mod:`objectives.offload` prices two."""
    return offload == "parameters" and zero_stage == 3 and pp == 1


def stage_rule(family: Family, plan_input: PlanInput) -> bool:
    """The exporter's pipeline refusals that depend on the stage cut and the micro-batches: the
    settings no family rule sees (Adam, the expert-parallel rule), an untied model with the pipeline's layers,
    whole model chunks with a module in each, and torchtitan's own batch and schedule rules."""
    from exporters.torchtitan.export import _launch_or_none

    settings = plan_input.settings
    return (
        settings.optimizer == "adam"
        and _experts_run(family, settings, plan_input.graph)
        and pipeline_launches(family, plan_input)
        and _launch_or_none(plan_input, family) is not None
    )
