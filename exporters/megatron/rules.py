"""What Megatron-LM runs, without exporting: its families, settings rules and stage rule.

The families are one per ``dp x cp x tp`` (with and without sequence parallelism) whose masks
:func:`~exporters.megatron.export.megatron_masks` gives (context parallelism ``cp > 1`` only where
each rank keeps at least :data:`CP_MIN_TOKENS` of the sequence); the settings rules are the exporter's
refusals that ignore the per-op splits (whole nodes, the batch split, experts; ZeRO-2/3 and GPipe
with pipelines); the stage rule is what a ``pp > 1`` plan's stage cut and micro-batch must satisfy.
:data:`exporters.megatron.TARGET` names them; ``tests/exporters/test_targets.py`` holds them equal
to the exporter's answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from exporters._target import (
    CP_MIN_TOKENS,
    Family,
    context_degrees,
    dp_cp_tp_families,
    experts_fit,
    on_whole_nodes,
    pipeline_launches,
)

if TYPE_CHECKING:
    from exporters.generic import PlanInput
    from planner.core.cluster import Cluster
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph
    from planner.core.settings import TrainingSettings

__all__ = ["families", "settings_allows", "allows", "pipeline_allows", "stage_rule", "offload_rule", "CP_MIN_TOKENS", "context_degrees"]

def families(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, devices_per_node: int | None, pp: int,
    degrees: tuple[int, int] | None = None,
) -> list[Family]:
    """One family per ``dp x cp x tp`` (``sp``: with sequence parallelism) on a stage of ``devices``
    (:func:`~exporters._target.dp_cp_tp_families` over :func:`~exporters.megatron.export.megatron_masks`)."""
    from exporters.megatron.export import megatron_masks
    from exporters.megatron.mamba import hybrid_families, hybrid_stack

    if hybrid_stack(graph) is not None:  # pretrain_mamba.py: dp x tp, no cp (exporters.megatron.mamba)
        return hybrid_families(graph, spaces, devices=devices, pp=pp, degrees=degrees, devices_per_node=devices_per_node)
    return dp_cp_tp_families(graph, spaces, megatron_masks, devices=devices, devices_per_node=devices_per_node, pp=pp,
                             degrees=degrees)


def settings_allows(family: Family, settings: TrainingSettings, graph: OpGraph) -> bool:
    """Experts fitting ``ep`` (any ZeRO stage: ZeRO-1 is the distributed optimizer, ZeRO-2/3 Megatron-FSDP); a
    Mamba/hybrid stack without full recomputation or activation offload
    (:func:`exporters.megatron.mamba.settings_refusal`): what :func:`allows` asks besides the nodes and the batch,
    on every stage of a pipeline too (``Target.settings_allows``)."""
    from exporters.megatron.mamba import hybrid_stack, settings_refusal

    hybrid_runs = hybrid_stack(graph) is None or settings_refusal(settings.recompute, settings.offload) is None
    return hybrid_runs and experts_fit(family, settings, graph)


allows = on_whole_nodes(settings_allows)
"""``Target.allows``: :func:`settings_allows`, on whole nodes with ``dp`` dividing the batch."""


def pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    """Megatron-FSDP (ZeRO-2/3) is not documented with pipelines; 1F1B and interleaved 1F1B only (no
    GPipe, no zero-bubble schedule in megatron-core 0.16.1)."""
    return pp == 1 or (zero_stage <= 1 and schedule in ("1f1b", "interleaved"))


def offload_rule(offload: str, *, zero_stage: int, pp: int, recompute: str) -> bool:
    """``optimizer``: the CPU optimizer (``HybridDeviceOptimizer``) on the distributed optimizer, ZeRO-1,
    as Megatron-LM documents it; ``activations``: megatron-core 0.16.1's ``TransformerConfig`` refuses
    CPU offloading with ``pp > 1`` and with activation recomputation."""
    if offload == "optimizer":
        return zero_stage == 1
    return offload == "activations" and pp == 1 and recompute == "none"


def stage_rule(family: Family, plan_input: PlanInput) -> bool:
    """Megatron-LM's model has the pipeline's layers (in ``chunks`` model chunks a rank, equal or not:
    ``--pipeline-model-parallel-layout`` writes any split); the micro-batch per rank is the pipeline's
    (``--micro-batch-size``); the global batch is whole micro-batches, and the interleaved schedule runs
    them in groups of ``pp`` (Megatron's ``forward_backward_pipelining_with_interleaving``: at least
    ``pp``, a multiple of it)."""
    from exporters.megatron.mamba import hybrid_stack
    from importers.transformer import analyze_transformer

    if hybrid_stack(plan_input.graph) is not None:  # MambaStack's own placement (exporters.megatron.mamba)
        from exporters.megatron.mamba import hybrid_stage_rule

        return hybrid_stage_rule(family, plan_input)
    from exporters.megatron.t5 import t5_stack

    if t5_stack(plan_input.graph, analyze_transformer(plan_input.graph)) is not None:
        return False  # pretrain_t5.py refuses pp > 1 (exporters.megatron.t5.t5_plan_refusal)
    pipeline = plan_input.pipeline
    assert pipeline is not None
    dp = family.dp or 1
    per_pass, per_step = plan_input.samples_per_pass, plan_input.samples_per_step
    micro_batches = per_step // per_pass
    interleaving = pipeline.chunks == 1 or (micro_batches >= pipeline.pp and micro_batches % pipeline.pp == 0)
    # validate_args: virtual stages with --no-overlap-p2p-communication need pp > 2 (batched sends to one peer)
    interleaving = interleaving and (pipeline.chunks == 1 or pipeline.pp > 2 or bool(plan_input.settings.p2p_overlap))
    return (
        pipeline_launches(family, plan_input)
        and per_pass // dp == pipeline.micro_batch
        and per_step % per_pass == 0
        and interleaving
        and pipeline.num_layers == analyze_transformer(plan_input.graph).num_layers
    )
