"""Exporters: a chosen strategy -> a launch plan for a training framework, or a refusal with the reason.

:data:`~exporters.targets.TARGETS` is the one registry of launch targets: each names its exporter
(``PlanInput -> dict``, JSON-ready), the configuration families it runs and the settings it accepts:

* ``generic``: the versioned plan JSON with every op's split (:mod:`exporters.generic`);
* ``megatron``: Megatron-LM torchrun arguments (:mod:`exporters.megatron`);
* ``deepspeed``: ds_config.json and the deepspeed launch line (:mod:`exporters.deepspeed`);
* ``meshtf``: Mesh-TensorFlow mesh shape and layout rules (:mod:`exporters.mesh_tf`);
* ``dtensor``: a PyTorch DTensor plan run by ``python -m planner.run`` (:mod:`exporters.dtensor`).
* ``torchtitan``: torchtitan 0.3's ``torchrun -m torchtitan.train`` launch (:mod:`exporters.torchtitan`).

A framework exporter either emits an exact equivalent of the strategy or raises
:class:`~planner.core.errors.UnsupportedExport`; ``*_masks`` functions give each target's
expressible configurations so the caller can search for the nearest expressible plan.
Exporters read core types only (:class:`~exporters.generic.PlanInput`), never the ONNX file.

A pipeline plan carries a :class:`~exporters.generic.PipelineSpec` (stages, schedule,
micro-batching); Megatron-LM, DeepSpeed and torchtitan express pipelines (within their rules),
Mesh-TF and the DTensor plan refuse ``pp > 1``.
"""

from __future__ import annotations

from importlib import import_module
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from exporters.targets import (
    EXPORT_FORMATS, FRAMEWORK_TARGETS, TARGETS, Family, Target, runnable_plan_targets, runnable_targets_of, target, target_names,
)
from exporters._target import plan_data_parallel
from exporters.elsewhere import redirected
from planner.core.errors import InputError, UnsupportedExport

if TYPE_CHECKING:
    import numpy as np

    from exporters.generic import PlanInput
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph
    from planner.core.strategy import Strategy

__all__ = [
    "TARGETS",
    "FRAMEWORK_TARGETS",
    "Target",
    "Family",
    "target",
    "target_names",
    "runnable_targets_of",
    "EXPORTERS",
    "PlanInput",
    "PipelineSpec",
    "StageSpec",
    "PlanDocument",
    "export",
    "listed_elsewhere",
    "one_device_plan",
    "runnable_targets",
    "target_masks",
    "write_plan",
    "save_plan",
    "read_plan",
    "megatron_masks",
    "deepspeed_masks",
    "mesh_tf_masks",
]

# Loaded on first use (PEP 562): the CLI reads the registry for its --help, and importing every
# exporter (numpy, the transformer analysis) would double its start-up time.
_LAZY = {
    **dict.fromkeys(("PlanInput", "PipelineSpec", "StageSpec", "PlanDocument", "read_plan", "save_plan", "write_plan"), "exporters.generic"),
    "megatron_masks": "exporters.megatron",
    "deepspeed_masks": "exporters.deepspeed",
    "mesh_tf_masks": "exporters.mesh_tf",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'exporters' has no attribute '{name}'")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


EXPORTERS: Mapping[str, Callable[["PlanInput"], dict[str, Any]]] = MappingProxyType(
    {name: t.export for name, t in TARGETS.items()}
)
"""Target name -> exporter, read from :data:`~exporters.targets.TARGETS` (kept for callers of the
older name; the registry is the one place a target is defined)."""


def export(name: str, plan_input: "PlanInput") -> dict[str, Any]:
    """Export ``plan_input`` for target ``name``.

    Raises
    ------
    InputError
        For an unknown target (the message lists the valid ones).
    UnsupportedExport
        When the target cannot run the strategy exactly; a refusal of the model itself ends with the
        other launchers that run the plan (:mod:`exporters.elsewhere`).

    A launcher's document gets, among its ``notes``, what the plan does to a contrastive loss
    (:mod:`exporters.coupling`).
    """
    found = EXPORT_FORMATS.get(name)
    if found is None:
        raise InputError(f"unknown export target '{name}'; use one of {', '.join(EXPORT_FORMATS)}")
    if found.restricts:
        refusal = _settings_refusal(name, found, plan_input)
        if refusal:  # its advice (plan with --target name) holds only if the launcher trains the model at all
            unbuilt = _model_refusal(found, plan_input)
            if unbuilt is not None:
                raise redirected(unbuilt, name, lambda: runnable_plan_targets([plan_input])[0]) from None
            raise UnsupportedExport(refusal)
    try:
        document = found.export(plan_input)
    except UnsupportedExport as refusal:  # a refusal of the model names the launchers that run this plan
        raise redirected(refusal, name, lambda: runnable_plan_targets([plan_input])[0]) from None
    # after the exporter: a launcher that refuses the plan (Mesh-TF's "no ZeRO") names its own fix first
    unsynced = _sync_refusal(name, found, plan_input) if found.restricts else ""
    if unsynced:
        raise UnsupportedExport(unsynced)
    from exporters.coupling import contrastive_note  # here: it reads the transformer analysis (onnx), which --help needs not

    coupled = contrastive_note(plan_input)  # the generic plan writes it itself (batch.coupling)
    if coupled and isinstance(document.get("notes"), list):
        document["notes"].append(coupled)
    return document


def _sync_refusal(name: str, found: "Target", plan_input: "PlanInput") -> str:
    """Why launcher ``name`` does not synchronise ``plan_input``'s ZeRO 0-2 gradients as its time was priced (``""``: it
    does; ``Target.zero_sync``, the rule the table's ``launchers`` column reads too)."""
    settings = plan_input.settings
    if found.families is None or not found.unpriced_sync(settings, plan_data_parallel(plan_input)):
        return ""
    what, how = (("gradients", "gradient all-reduce") if settings.zero_stage == 0
                 else ("sharded optimizer", "gradient reduction and parameter gather"))
    return (f"{name} synchronises ZeRO-{settings.zero_stage}'s {what} otherwise than this plan's step time was "
            f"priced (it was priced for another launcher's {how}); plan with --target {name}")


def _settings_refusal(name: str, found: "Target", plan_input: "PlanInput") -> str:
    """Why launcher ``name`` does not run ``plan_input``'s settings as they were priced (``""``: it does):
    the settings rules the table's ``launchers`` column reads (:func:`exporters.targets.runnable_plan_targets`),
    so no route exports a plan the column does not list for this reason."""
    settings = plan_input.settings
    recompute = settings.recompute
    pp = plan_input.pipeline.pp if plan_input.pipeline is not None else 1
    if recompute not in found.recompute:
        words = {"selective": "Megatron-LM's recomputed attention core", "mlp": "Megatron-LM's recomputed MLP",
                 "op": "torchtitan's op-level policy"}
        return (f"{name} runs activation recomputation {', '.join(found.recompute)}, not '{recompute}' "
                f"({words.get(recompute, recompute)}); plan with --target {name}")
    if not found.runs_offload(settings.offload, zero_stage=settings.zero_stage, pp=pp, recompute=settings.recompute):
        runs = [mode for mode in found.offload if mode != "none"]
        return (f"{name} runs CPU offload {', '.join(runs) or 'of nothing'}, not '{settings.offload}' with ZeRO-"
                f"{settings.zero_stage}, pp={pp} and recompute {settings.recompute} (objectives.offload); plan with --target {name}")
    if settings.zero_stage == 3 and settings.reshard_after_forward != "default" and not found.fsdp_reshard:
        return (f"{name} sets no FSDP2 reshard_after_forward, and this plan was priced with '{settings.reshard_after_forward}' "
                "(the units it keeps, the gathers it saves); export with --format torchtitan or dtensor, or plan with "
                f"--target {name} and no --fix reshard")
    if settings.zero_stage == 3 and settings.hpz_partition is not None and not found.hpz:
        return (f"{name} keeps no ZeRO++ secondary parameter copy, and this plan was priced with DeepSpeed's hpZ over "
                f"{settings.hpz_partition} ranks (the gathers inside that group, the copy in memory); export with "
                f"--format deepspeed, or plan with --target {name}")
    if not found.runs_autocast(settings):  # eager bf16: autocast's casts and fp32 norms, or bf16 modules (Target.autocast_zero)
        runs = "under torch.autocast" if settings.autocast else "as bf16 modules under FSDP2's MixedPrecisionPolicy"
        return (f"{name} does not run this plan's eager bf16 at ZeRO-{settings.zero_stage} {runs}, as it was priced "
                f"(Target.autocast_zero); plan with --target {name}")
    unpriced = found.unpriced_accumulator(settings, pp)
    if unpriced:
        return (f"{name}'s bf16 optimizer keeps a {unpriced:g} B per parameter gradient accumulator at ZeRO-{settings.zero_stage}"
                f"{' with pipeline stages' if pp > 1 else ''} that this plan's memory does not hold (it was priced for "
                f"another launcher); plan with --target {name}")
    # the plan's memory credits saved tensors that Megatron-Core's kernels keep smaller (Target.sequence_shard_saved,
    # Target.fused_swiglu); another launcher's PyTorch autograd keeps them whole
    if settings.sequence_shard_saved and not found.sequence_shard_saved:
        kept = "the gathered sequence-parallel input of each linear layer for backward"
    elif settings.fused_swiglu and not found.fused_swiglu:
        kept = "the gated MLP's activation output beside fc1's for backward"
    else:
        return ""
    return (f"{name} keeps {kept}, which this plan's memory does not hold (it was priced for Megatron-LM's "
            f"kernels); plan with --target {name}")


def one_device_plan(graph: "OpGraph") -> tuple[tuple["ConfigSpace", ...], "Strategy"]:
    """Every op's configurations on one device and the strategy that replicates each: the plan whose refusal
    by an exporter is a refusal of the model itself, not of a layout (:func:`_model_refusal`,
    :func:`planner.plan_targets.target_refusal`)."""
    from planner.core.configs import ConfigOptions, enumerate_configs
    from planner.core.strategy import Strategy

    options = ConfigOptions(devices=1, devices_per_node=1)
    spaces = tuple(enumerate_configs(op, options) for op in graph.ops)
    return spaces, Strategy(choice=(0,) * len(graph.ops), time_s=0.0, memory_bytes=0.0)


def _model_refusal(found: "Target", plan_input: "PlanInput") -> UnsupportedExport | None:
    """The launcher's refusal of the model itself, or ``None`` when it trains it: its exporter's refusal of
    the model's replicated one-device plan with default settings, the check ``--target`` makes
    (:func:`planner.plan_targets.target_refusal`). A settings refusal advises planning with ``--target``,
    which such a model would refuse, so the model's reason is given instead."""
    import dataclasses

    from planner.core.errors import PlannerError
    from planner.core.settings import TrainingSettings

    spaces, replicated = one_device_plan(plan_input.graph)
    settings = TrainingSettings(precision=plan_input.settings.precision, optimizer=plan_input.settings.optimizer)
    try:
        found.export(dataclasses.replace(plan_input, spaces=spaces, strategy=replicated, settings=settings,
                                         micro_batch=None, global_batch=None, pipeline=None))
    except UnsupportedExport as refusal:
        return refusal
    except PlannerError:  # another failure of the one-device plan says nothing about the model
        return None
    return None


def listed_elsewhere(targets: Sequence[str], index: int, target: str) -> str:
    """The start of a refusal to export row ``index`` of the launchable table for ``target`` where the
    table's ``launchers`` column lists the row for others (``""`` where it lists ``target``): said
    first, since a reason about one op, or a suffix naming only this row's launchers, reads as the
    verdict on the model unless the row is seen to be another launcher's.

    Examples
    --------
    >>> listed_elsewhere(("meshtf",), 0, "megatron")
    'the table lists row 1 for meshtf, not megatron: '
    >>> listed_elsewhere(("deepspeed", "meshtf", "dtensor"), 3, "torchtitan")
    'the table lists row 4 for deepspeed, meshtf and dtensor, not torchtitan: '
    """
    if target in targets or not targets:
        return ""
    names = targets[0] if len(targets) == 1 else ", ".join(targets[:-1]) + " and " + targets[-1]
    return f"the table lists row {index + 1} for {names}, not {target}: "


def runnable_targets(plan_input: "PlanInput") -> tuple[str, ...]:
    """The targets whose exporter accepts the strategy: each framework exporter run once.

    The oracle the tests hold the tables' columns to (:func:`~exporters.targets.runnable_targets_of`
    and, pipeline points included, :func:`~exporters.targets.runnable_plan_targets`: both from
    masks and rules, with no export). ``generic`` is always listed (every strategy has a generic
    plan); it is not written here.
    """
    runnable = ["generic"]
    for name in FRAMEWORK_TARGETS:
        try:
            export(name, plan_input)
        except UnsupportedExport:
            continue
        runnable.append(name)
    return tuple(runnable)


def target_masks(
    name: str,
    graph: OpGraph,
    spaces: "tuple[ConfigSpace, ...] | list[ConfigSpace]",
    *,
    devices: int,
    devices_per_node: int | None = None,
) -> list[tuple[str, list[np.ndarray]]]:
    """Every configuration family a framework target can run on at most ``devices`` devices.

    Each entry is ``(label, masks)``: the label in the target's vocabulary (``"dp=4 x tp=2 sp"``,
    ``"b:4;m:2 batch:b;heads:m"``) and one boolean mask per op. Searching each family (the exact
    search restricted to the masks) and keeping the best gives the best plan the target can run,
    and the nearest expressible plan when a strategy is refused.

    Raises
    ------
    InputError
        For an unknown or non-framework target.
    """
    found = TARGETS.get(name)
    if found is None or not found.restricts:
        raise InputError(f"target '{name}' has no configuration families; use {target_names(frameworks_only=True)}")
    families = found.families(graph, spaces, devices=devices, devices_per_node=devices_per_node, pp=1)
    return [(family.label, list(family.masks)) for family in families]
