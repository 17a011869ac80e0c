"""A saved launchable plan (``planner plan ... --export generic`` of a table row) priced again from its
file and its model, for ``explain`` and ``compare`` (:func:`load_saved`; a per-op plan is
:mod:`planner.saved_plan`'s), and the labels of the execution model a row is priced under.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from objectives.execution import ExecutionModel
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, PipelinePoint, graph_loader

__all__ = ["Repriced", "execution_label", "priced_label", "reprice_saved", "load_saved", "load_saved_pair"]


def execution_label(execution: ExecutionModel | None) -> str:
    """``"fused+flash"``, ``"eager+flash"``...; ``"roofline"`` for the plain roofline (``None``).

    >>> execution_label(ExecutionModel(engine="eager", attention="flash"))
    'eager+flash'
    """
    return "roofline" if execution is None else f"{execution.engine}+{execution.attention}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Repriced:
    """A saved launchable plan priced again from its file and its model."""

    saved_time_s: float
    saved_memory_bytes: float
    point: PipelinePoint
    """The plan as priced now (stages, time and memory breakdowns)."""
    priced_as: str = ""
    """Its execution model, e.g. ``"fused+flash"``."""
    stage_ops: tuple = ()  # each stage op by op, with the terms that sum to its seconds (objectives.stage_ops.StageOps)
    host_floors: tuple = ()
    """Each stage's ``(forward, backward)`` host floor, seconds per micro-batch (:func:`planner.host_bound.stage_floors`;
    empty where none applies)."""
    host_bound: bool = False
    """Its step is set by the host floor (:func:`planner.host_bound.host_bound`)."""
    device: Any = None
    """The device it was priced on (``cluster.device``): the host constants the footnote on a host-bound plan names
    (:func:`planner.host_bound.host_note`); ``None``: not known."""
    hybrid: str = ""
    """Its hybrid data-parallel group, as the table's ZeRO column names it (``"hsdp 8"``: HSDP's shard group;
    ``"hpz 8"``: ZeRO++'s hpZ group, DeepSpeed); ``""``: none."""


def priced_label(execution: ExecutionModel | None, settings: TrainingSettings) -> str:
    """:func:`execution_label`, with ``+no-overlap`` where communication was priced un-overlapped and
    ``+tp-overlap`` where tensor-parallel communication was priced under the GEMMs (``--fix tp_overlap=on``) and
    ``+reshard-never`` / ``+reshard-always`` where FSDP2's policy was pinned (``--fix reshard=...``, ZeRO-3) and
    ``+cuda-graphs`` where each micro-batch was priced as one CUDA graph's replay (torchtitan at ``pp = 1``), ``+layer-graphs``
    where each transformer layer was (Megatron-LM's ``--cuda-graph-impl transformer_engine``)."""
    label = execution_label(execution)
    label = label + "+no-overlap" if execution is not None and not settings.overlap else label
    label = label + "+tp-overlap" if execution is not None and settings.tp_comm_overlap else label
    graphs = "+layer-graphs" if settings.cuda_graph_scope == "layers" else "+cuda-graphs"  # Megatron-LM's per layer
    label = label + graphs if execution is not None and settings.cuda_graphs else label
    if settings.zero_stage == 3 and settings.reshard_after_forward != "default":
        label = f"{label}+reshard-{settings.reshard_after_forward}"
    return label + "+fp8" if settings.fp8 is not None else label


def reprice_saved(path: str | Path, *, model: str | Path | None = None) -> Repriced:
    """Price a plan saved with ``--export generic`` from the launchable table again: the model
    imported at the plan's batch, its stage models built under the plan's settings (execution
    model, precision, ``ep``), each op's saved configuration (splits, inter-node parts, copies)
    looked up in them, and the pipeline priced (:func:`objectives.pipeline_cost.evaluate_pipeline`).
    The same tree gives the saved seconds and bytes back.

    Raises
    ------
    InputError
        Not a pipeline plan (a per-op plan: :func:`planner.plan.load_plan`), a missing or different
        model, a configuration the stage does not have.
    """
    from exporters.generic import read_plan
    from importers.moe import find_moe_layers
    from objectives.pipeline_cost import evaluate_pipeline
    from objectives.stage_ops import stage_ops
    from planner.host_bound import host_bound, stage_floors

    document = read_plan(path)
    spec = document.pipeline
    if spec is None:
        raise InputError(f"{path} is a per-op plan; `planner explain` prices it")
    data = document.data
    source = Path(model) if model is not None else Path(data["model"].get("source_path") or "")
    if not str(source) or not source.is_file():
        raise InputError(f"the plan's model '{source}' is not found; pass --model MODEL.onnx (the file it was made for)")
    settings = document.settings()
    loader = graph_loader(source, dict(data["model"]["dims"]))
    # a dp x cp x tp row splits 3 dims of an op: priced in spaces that hold them (a wider space prices no
    # configuration otherwise, planner.estimate._holding_split_dims)
    held = max([2, *(len(op.splits) for op in document.ops)])
    cache = PipelineCostCache(loader, cluster=document.cluster(), settings=settings, max_split_dims=held,
                              cost_model=data.get("cost_model", "roofline"), moe_layers=find_moe_layers)  # fmt: skip
    batch = int(data["batch"]["micro_batch"])
    document.check_graph(cache.graph(batch))
    spaces = cache.model(spec.devices_per_stage, batch, spec.zero_stage, spec.recompute).tables.configs
    try:
        choice = [saved.row_in(space) for saved, space in zip(document.ops, spaces)]
    except KeyError as missing:
        raise InputError(f"{missing.args[0]} of a {spec.devices_per_stage}-device stage; plan the model again") from None
    bounds = [stage.layers[0] for stage in spec.stages] + [spec.stages[-1].layers[1]]
    point = evaluate_pipeline(cache, pp=spec.pp, batch=batch, zero_stage=spec.zero_stage, recompute=spec.recompute,
                              choice=choice, bounds=bounds, global_batch=spec.global_batch, schedule=spec.schedule,
                              chunks=spec.chunks)  # fmt: skip
    execution = None if settings.engine is None else ExecutionModel(engine=settings.engine,
                                                                    attention=settings.attention or "flash",
                                                                    dropout=settings.dropout)
    floors = stage_floors(point, cache)
    return Repriced(saved_time_s=document.time_s, saved_memory_bytes=document.memory_bytes, point=point,
                    priced_as=priced_label(execution, settings), stage_ops=stage_ops(cache, point),
                    host_floors=() if floors is None else tuple(zip(floors[0].tolist(), floors[1].tolist())),
                    host_bound=host_bound(point, cache), device=cache.cluster.device,
                    hybrid=_hybrid_words(settings))  # fmt: skip


def _hybrid_words(settings: TrainingSettings) -> str:
    """``"hsdp N"`` / ``"hpz N"`` for a plan priced with HSDP's shard group or ZeRO++'s hpZ group at ZeRO-3, else ``""``.

    >>> _hybrid_words(TrainingSettings(zero_stage=3, hpz_partition=8)), _hybrid_words(TrainingSettings(dp_shard=4))
    ('hpz 8', 'hsdp 4')
    """
    if settings.hpz_partition is not None and settings.zero_stage >= 3:
        return f"hpz {settings.hpz_partition}"
    return f"hsdp {settings.dp_shard}" if settings.dp_shard is not None else ""


def load_saved_pair(first: str | Path, second: str | Path, *, model: str | Path | None = None) -> tuple:
    """Two saved plans of one model priced again for ``compare``: both launchable (:class:`Repriced`)
    or both per-op (:func:`planner.plan.load_plan_pair`).

    Raises
    ------
    InputError
        One of each kind (their costs are not comparable term by term).
    """
    from exporters.generic import read_plan
    from planner.plan import load_plan_pair

    kinds = [read_plan(path).pipeline is not None for path in (first, second)]
    if kinds[0] != kinds[1]:
        raise InputError("compare needs two plans of one kind: both from the launchable table or both from "
                         "--target generic; plan the other one again in the same way")  # fmt: skip
    if kinds[0]:
        return reprice_saved(first, model=model), reprice_saved(second, model=model)
    return load_plan_pair(first, second, model=model)


def load_saved(path: str | Path, *, model: str | Path | None = None):
    """A saved plan priced again for ``explain`` / ``compare``: a :class:`Repriced` for plans of the
    launchable table (they carry a pipeline section, ``pp = 1`` included), else
    :func:`planner.plan.load_plan`'s per-op :class:`~planner.plan.LoadedPlan`."""
    from exporters.generic import read_plan
    from planner.plan import load_plan

    if read_plan(path).pipeline is not None:
        return reprice_saved(path, model=model)
    return load_plan(path, model=model)
