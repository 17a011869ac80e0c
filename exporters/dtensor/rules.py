"""What the PyTorch DTensor plan runs, without exporting: its families and settings rules.

The families are the ``(dp, tp)`` meshes of :func:`~exporters.dtensor.export.dtensor_families` (with
sequence parallelism and vocabulary-parallel embedding and head where the model allows them, and
embedding tables sharded row- or column-wise over ``dp`` in a model that is not a transformer), whose
masks :func:`~exporters.dtensor.export.dtensor_masks` gives; the settings rules are FSDP2's (ZeRO-3
or nothing), no selective recomputation, no expert axis, whole nodes and the batch split. A 2-D
mesh has no pipeline stages, so there is no stage rule. :data:`exporters.dtensor.TARGET` names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from exporters._target import Family, on_whole_nodes

if TYPE_CHECKING:
    from planner.core.cluster import Cluster
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph
    from planner.core.settings import TrainingSettings

__all__ = ["families", "settings_allows", "allows", "pipeline_allows", "offload_rule", "per_head_weights_tp"]


def families(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, devices_per_node: int | None, pp: int,
    degrees: tuple[int, int] | None = None,
) -> list[Family]:
    """One family per mesh of :func:`~exporters.dtensor.export.dtensor_families` on ``devices``
    (none when ``pp > 1``, nor when the sequence runs past a learned position table,
    :mod:`importers.position_table`: the plan trains the user's model, whose lookup would read past it)."""
    if pp > 1:
        return []  # a 2-D (dp, tp) mesh: no pipeline stages
    from exporters.dtensor.export import dtensor_families, dtensor_masks
    from importers.transformer import position_tables, too_short

    if too_short(position_tables(graph)) is not None:
        return []  # the user's model cannot look up positions past its table (the export says why)

    found = []
    for family in dtensor_families(graph, devices=devices):
        if degrees is not None and (family.dp, family.tp) != degrees:
            continue
        if family.tp > 1 and per_head_weights_tp(graph) is not None:
            continue  # the model's own per-head norms would meet the wrong heads (per_head_weights_tp)
        masks = dtensor_masks(
            graph,
            spaces,
            dp=family.dp,
            tp=family.tp,
            sequence_parallel=family.sequence_parallel,
            vocab_parallel_embedding=family.vocab_parallel_embedding,
            vocab_parallel_head=family.vocab_parallel_head,
            devices_per_node=devices_per_node,
            tables=family.tables,
        )
        if masks is not None:
            found.append(Family(label=family.label, tp=family.tp, dp=family.dp, masks=tuple(masks)))
    return found


def per_head_weights_tp(graph: OpGraph) -> str | None:
    """Why a DTensor plan cannot run ``graph``'s QK-norm at tp > 1, or ``None``: one ``LayerNorm(head_dim)`` per
    head, each with its own weights (:mod:`importers.qk_norm` ``per-head-weights``, StableLM's
    ``StableLmLayerNormPerHead``). The plan runs the model's own modules with the Q / K projections ``colwise``
    and the norms replicated, so a rank's local heads ``r H/tp ..`` meet the module's ``H`` norms zipped in order
    (transformers' ``StableLmLayerNormPerHead.forward``): the first ``H/tp`` heads' weights on every rank."""
    from exporters._common import reads_per_head_weights
    from exporters.dtensor.export import PER_HEAD_WEIGHTS_TP

    return PER_HEAD_WEIGHTS_TP if reads_per_head_weights(graph) else None


def settings_allows(family: Family, settings: TrainingSettings, graph: OpGraph) -> bool:
    """FSDP2 shards everything at once (ZeRO-3) or nothing; torchtitan's selective AC differs from
    ours; the mesh has no expert axis; tables sharded over ``dp`` (:mod:`exporters.dtensor.tables`) with
    ZeRO-0 only: what :func:`allows` asks besides the nodes and the batch (``Target.settings_allows``)."""
    from exporters.dtensor.tables import is_table_family, refuses_settings

    return (
        settings.zero_stage in (0, 3)
        and not (is_table_family(family.label) and refuses_settings(settings.zero_stage))
        and settings.recompute != "selective"
        # TARGET.expert_parallel (False) says it too, but only Target.runs_settings reads that; --target's
        # filter (planner.plan_targets.target_filter) and fastest_runnable read this rule alone
        # (tests/exporters/test_mesh_tf_position_table.py)
        and settings.expert_parallel <= 1
    )


allows = on_whole_nodes(settings_allows)
"""``Target.allows``: :func:`settings_allows`, on whole nodes with ``dp`` dividing the batch."""


def offload_rule(offload: str, *, zero_stage: int, pp: int, recompute: str) -> bool:
    """Parameter offload rides on ``fully_shard`` (``offload_policy=CPUOffloadPolicy()``, torch 2.13
    ``_fsdp_api.py``): ZeRO-3, the only stage the plan runs with FSDP2; the plan has no pipeline."""
    return offload == "parameters" and zero_stage == 3 and pp == 1


def pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    """No pipeline stages; FSDP2's ZeRO 0 or 3; no selective recomputation."""
    return pp == 1 and zero_stage in (0, 3) and recompute != "selective"
