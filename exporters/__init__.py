"""Exporters: a chosen strategy -> a launch plan for a training framework, or a refusal with the reason.

``EXPORTERS`` maps a target name to a function ``PlanInput -> dict`` (JSON-ready):

* ``generic``: the versioned plan JSON with every op's split (:mod:`exporters.generic`);
* ``megatron``: Megatron-LM torchrun arguments (:mod:`exporters.megatron`);
* ``deepspeed``: ds_config.json and the deepspeed launch line (:mod:`exporters.deepspeed`);
* ``meshtf``: Mesh-TensorFlow mesh shape and layout rules (:mod:`exporters.mesh_tf`).

A framework exporter either emits an exact equivalent of the strategy or raises
:class:`~planner.core.errors.UnsupportedExport`; ``*_masks`` functions give each target's
expressible configurations so the caller can search for the nearest expressible plan.
Exporters read core types only (:class:`~exporters.generic.PlanInput`), never the ONNX file.

A pipeline plan carries a :class:`~exporters.generic.PipelineSpec` (stages, schedule,
micro-batching); Megatron-LM and DeepSpeed express pipelines (within their rules), Mesh-TF and the
DTensor plan refuse ``pp > 1``, and :func:`runnable_targets` answers for pipeline plans too.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from exporters.deepspeed import deepspeed_masks, export_deepspeed
from exporters.dtensor import dtensor_families, dtensor_masks, export_dtensor
from exporters.generic import PipelineSpec, PlanDocument, PlanInput, StageSpec, read_plan, save_plan, write_plan
from exporters.megatron import export_megatron, megatron_masks
from exporters.mesh_tf import default_layouts, export_mesh_tf, mesh_tf_masks
from planner.core.configs import ConfigSpace, divisors
from planner.core.errors import InputError, UnsupportedExport
from planner.core.graph import OpGraph

__all__ = [
    "EXPORTERS",
    "PlanInput",
    "PipelineSpec",
    "StageSpec",
    "PlanDocument",
    "export",
    "runnable_targets",
    "target_masks",
    "write_plan",
    "save_plan",
    "read_plan",
    "megatron_masks",
    "deepspeed_masks",
    "mesh_tf_masks",
]

EXPORTERS: dict[str, Callable[[PlanInput], dict[str, Any]]] = {
    "generic": write_plan,
    "megatron": export_megatron,
    "deepspeed": export_deepspeed,
    "meshtf": export_mesh_tf,
    "dtensor": export_dtensor,
}


def export(name: str, plan_input: PlanInput) -> dict[str, Any]:
    """Export ``plan_input`` for target ``name``.

    Raises
    ------
    InputError
        For an unknown target (the message lists the valid ones).
    UnsupportedExport
        When the target cannot run the strategy exactly.
    """
    exporter = EXPORTERS.get(name)
    if exporter is None:
        raise InputError(f"unknown export target '{name}'; use one of {', '.join(EXPORTERS)}")
    return exporter(plan_input)


def runnable_targets(plan_input: PlanInput) -> tuple[str, ...]:
    """The targets that can run the strategy exactly, for the table's column.

    ``generic`` is always listed (every strategy has a generic plan); it is not written here.
    """
    runnable = ["generic"]
    for name, exporter in EXPORTERS.items():
        if name == "generic":
            continue
        try:
            exporter(plan_input)
        except UnsupportedExport:
            continue
        runnable.append(name)
    return tuple(runnable)


def target_masks(
    name: str,
    graph: OpGraph,
    spaces: tuple[ConfigSpace, ...] | list[ConfigSpace],
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
    families: list[tuple[str, list[np.ndarray]]] = []
    if name in ("megatron", "deepspeed"):
        for world in divisors(devices):
            for tp in divisors(world):
                dp = world // tp
                if name == "megatron":
                    for sp in (False, True) if tp > 1 else (False,):
                        masks = megatron_masks(
                            graph, spaces, dp=dp, tp=tp, sequence_parallel=sp, devices_per_node=devices_per_node
                        )
                        if masks is not None:
                            families.append((f"dp={dp} x tp={tp}" + (" sp" if sp else ""), masks))
                else:
                    masks = deepspeed_masks(graph, spaces, dp=dp, tp=tp, devices_per_node=devices_per_node)
                    if masks is not None:
                        families.append((f"dp={dp} x tp={tp}", masks))
    elif name == "dtensor":
        for family in dtensor_families(graph, devices=devices):
            masks = dtensor_masks(
                graph,
                spaces,
                dp=family.dp,
                tp=family.tp,
                sequence_parallel=family.sequence_parallel,
                vocab_parallel_embedding=family.vocab_parallel_embedding,
                vocab_parallel_head=family.vocab_parallel_head,
                devices_per_node=devices_per_node,
            )
            if masks is not None:
                families.append((family.label, masks))
    elif name == "meshtf":
        for world in divisors(devices):
            for mesh, layout in default_layouts(graph, devices=world):
                masks = mesh_tf_masks(graph, spaces, mesh_shape=mesh, layout=layout)
                if masks is not None:
                    label = ";".join(f"{k}:{v}" for k, v in mesh.items()) + " " + ";".join(f"{k}:{v}" for k, v in layout.items())
                    families.append((label.strip(), masks))
    else:
        raise InputError(f"target '{name}' has no configuration families; use megatron, deepspeed, meshtf or dtensor")
    return families
