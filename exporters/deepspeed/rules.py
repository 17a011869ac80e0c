"""What DeepSpeed runs, without exporting: its families, settings rules and stage rule.

The families are one per ``dp x tp`` (ZeRO data parallelism, AutoTP for ``tp > 1``; pipelines with
``tp = 1`` only) and, on long sequences, one per ``dp x cp`` (DeepSpeed-Ulysses,
:mod:`exporters.deepspeed.ulysses`) whose masks :func:`~exporters.deepspeed.export.deepspeed_masks` gives; the settings
rules are the exporter's refusals that ignore the per-op splits (AutoTP runs ZeRO 0-2; whole nodes,
the batch split, experts; ``PipelineEngine`` runs ZeRO 0-1 and 1F1B); the stage rule is what a
``pp > 1`` plan's stage cut must satisfy. :data:`exporters.deepspeed.TARGET` names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from exporters._target import Family, divisors, experts_fit, on_whole_nodes, pipeline_launches, worlds

if TYPE_CHECKING:
    from exporters.generic import PlanInput
    from planner.core.cluster import Cluster
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph
    from planner.core.settings import TrainingSettings

__all__ = ["families", "settings_allows", "allows", "pipeline_allows", "stage_rule", "offload_rule", "per_head_weights_tp"]


def families(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, devices_per_node: int | None, pp: int,
    degrees: tuple[int, int] | None = None,
) -> list[Family]:
    """One family per ``dp x tp`` on a stage of ``devices`` (``tp = 1`` when ``pp > 1``); none when the
    sequence runs past a learned position table (:mod:`importers.position_table`: DeepSpeed trains the
    user's model, whose lookup would read past it), nor with ``pp > 1`` when the repeated blocks are not
    one chain (:func:`exporters.block_chain.chain_break`: an encoder-decoder, two towers)."""
    from exporters.block_chain import chain_break
    from exporters.deepspeed.export import deepspeed_masks
    from importers.transformer import position_tables, too_short

    if too_short(position_tables(graph)) is not None:
        return []  # the user's model cannot look up positions past its table (the export says why)
    if pp > 1 and chain_break(graph) is not None:
        return []  # PipelineModule runs its layers as one chain, and these are not one (the export says why)
    found = []
    for world in worlds(devices, pp):
        for tp in divisors(world):
            if pp > 1 and tp > 1:
                continue  # our DeepSpeed export pipelines with tp=1 only (AutoTP is not a PipelineModule)
            dp = world // tp
            if degrees is not None and (dp, tp) != degrees:
                continue
            if tp > 1 and per_head_weights_tp(graph) is not None:
                continue  # AutoTP would pair the per-head norms with the wrong heads (per_head_weights_tp)
            masks = deepspeed_masks(graph, spaces, dp=dp, tp=tp, devices_per_node=devices_per_node)
            if masks is not None:
                found.append(Family(label=f"dp={dp} x tp={tp}", tp=tp, dp=dp, masks=tuple(masks)))
            if pp == 1 and tp > 1:
                found += _ulysses_families(graph, spaces, dp=dp, ranks=tp, devices_per_node=devices_per_node)
    return found


def per_head_weights_tp(graph: OpGraph) -> str | None:
    """Why AutoTP cannot run ``graph``'s QK-norm at tp > 1, or ``None``: one ``LayerNorm(head_dim)`` per head, each
    with its own weights (:mod:`importers.qk_norm` ``per-head-weights``, StableLM's ``StableLmLayerNormPerHead``).
    deepspeed 0.19.8's AutoTP splits ``q_proj`` / ``k_proj`` by columns and keeps norms whole
    (``module_inject/auto_tp.py``: only sharded modules' head counts are divided, ``update_mp_params``), so a
    rank holds heads ``r H/tp ..`` while the module zips its ``H`` norms with the local heads in order
    (transformers' ``StableLmLayerNormPerHead.forward``): every rank normalises its heads with the first
    ``H/tp`` heads' weights, a different model on each rank but the first."""
    from exporters._common import reads_per_head_weights
    from exporters.deepspeed.export import PER_HEAD_WEIGHTS_TP

    return PER_HEAD_WEIGHTS_TP if reads_per_head_weights(graph) else None


def _ulysses_families(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, dp: int, ranks: int, devices_per_node: int | None,
) -> list[Family]:
    """The DeepSpeed-Ulysses family at ``dp x cp`` with ``cp = ranks`` where the model runs it
    (:func:`exporters.deepspeed.ulysses.ulysses_degrees`); none for a model that is not a transformer."""
    from exporters.deepspeed.ulysses import ulysses_degrees, ulysses_masks
    from importers.transformer import analyze_transformer
    from planner.core.errors import UnsupportedExport

    try:
        degrees = ulysses_degrees(analyze_transformer(graph), ranks)
        results = [(cp, ulysses_masks(graph, spaces, dp=dp, cp=cp, devices_per_node=devices_per_node)) for cp in degrees]
    except UnsupportedExport:
        return []
    return [Family(label=f"dp={dp} x cp={cp} ulysses", tp=1, dp=dp, cp=cp, masks=tuple(result.masks))
            for cp, result in results if result.masks is not None]


def settings_allows(family: Family, settings: TrainingSettings, graph: OpGraph) -> bool:
    """AutoTP runs ZeRO 0-2; experts fitting ``ep``; ``ep > 1`` only where AutoEP finds the MoE blocks and runs
    their router (:func:`exporters.deepspeed.autoep.expert_parallel_problem`; ``ep = 1`` trains the model as
    exported): what :func:`allows` asks besides the nodes and the batch (``Target.settings_allows``)."""
    if (family.tp or 1) > 1 and settings.zero_stage == 3:
        return False  # AutoTP runs ZeRO 0-2
    return experts_fit(family, settings, graph) and _expert_parallel_runs(settings, graph)


allows = on_whole_nodes(settings_allows)
"""``Target.allows``: :func:`settings_allows`, on whole nodes with ``dp`` dividing the batch."""


def _expert_parallel_runs(settings: TrainingSettings, graph: OpGraph) -> bool:
    """``ep = 1``, or AutoEP shards the model's experts with its own router (the export says why not)."""
    from exporters.deepspeed.autoep import expert_parallel_problem

    return settings.expert_parallel <= 1 or expert_parallel_problem(graph) is None


def pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    """AutoTP runs ZeRO 0-2; ``PipelineEngine`` asserts ZeRO < 2 and runs ``TrainSchedule`` (1F1B)
    only, with ``tp = 1`` in our export."""
    if tp is not None and tp > 1 and zero_stage == 3:
        return False  # AutoTP runs ZeRO 0-2
    return pp == 1 or (zero_stage <= 1 and schedule == "1f1b" and (tp or 1) == 1)


def offload_rule(offload: str, *, zero_stage: int, pp: int, recompute: str) -> bool:
    """ZeRO-Offload: ``offload_optimizer`` needs ZeRO 1-3 (DeepSpeed's ``DeepSpeedZeroOffloadOptimizerConfig``
    is read by the ZeRO optimizers only); run without a ``PipelineEngine`` (ZeRO-Offload is documented
    for data-parallel training). Parameter offload: ``offload_param`` is "valid only with stage 3"
    (deepspeed 0.19.8 ``runtime/zero/offload_config.py``), exported with ``offload_optimizer``."""
    if offload == "parameters":
        return zero_stage == 3 and pp == 1
    return offload == "optimizer" and zero_stage >= 1 and pp == 1


def stage_rule(family: Family, plan_input: PlanInput) -> bool:
    """DeepSpeed's ``PipelineModule`` cuts the model's repeated blocks."""
    return (bool(plan_input.graph.blocks) and pipeline_launches(family, plan_input)
            and _expert_parallel_runs(plan_input.settings, plan_input.graph))
