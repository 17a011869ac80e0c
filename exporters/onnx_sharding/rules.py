"""The rules of the ONNX sharding format, shared by its writer and its reader: the field and key
names, which tensors of which node carry an op's sharding, and which devices hold each shard.

The format runs every strategy (any per-op split is written), so it has no families and no settings
rules: the registry entry (:data:`exporters.onnx_sharding.TARGET`) is an export format only, never a
``--target``.

Which tensors (:func:`op_tensors`). A coarse op is one main ONNX node plus the views and
elementwise nodes folded into it. Its sharding is written on the main node, for the main node's own
inputs and outputs, with the op dims that index each of their axes (the importer's
:attr:`~planner.core.graph.NodeSpec.input_axes` / ``output_axes``). Where the importer describes a
region rather than one node (a decomposed LayerNorm or Softmax), the op's operands
(:attr:`~planner.core.graph.Op.inputs` / ``outputs``) are written instead, each on the op's node that
reads or writes it. Either way a ``ShardingSpecProto`` names a tensor of the node that carries it, as
the IR requires.

Which devices (:func:`device_grid`). An op's configuration splits dim ``d`` ``f_d`` ways, ``e_d`` of
them across nodes (``a_d = f_d / e_d`` inside one), and runs ``r`` redundant copies (``re`` across
nodes). Its devices are those of its pipeline stage, ``[stage * D, (stage + 1) * D)`` with ``D`` the
devices of a stage (the cluster's without a pipeline), filled node by node: device
``base + node * g + local``, ``g = min(D, devices_per_node)``, where ``node`` is the row-major index of
the inter-node coordinates ``(e_1, ..., e_n, re)`` and ``local`` that of the intra-node ones
``(a_1, ..., a_n, ra)`` (copies innermost, as :mod:`planner.core.configs` places them). Coordinate
``c_d`` of dim ``d`` is ``inter_d * a_d + intra_d``. A tensor's shards are listed row-major over the
op dims that index it (axis by axis, outer dims first); a shard held by several devices (the dims
that do not index the tensor, and the copies) is a device group of ``index_to_device_group_map``,
numbered from the cluster's device count up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    import onnx

    from exporters.generic import PlanInput

    from planner.core.graph import Op, OpGraph

__all__ = [
    "FORMAT",
    "VERSION",
    "CONFIGURATION",
    "MIN_IR_VERSION",
    "PLAN_KEY",
    "STAGE_KEY",
    "NODE_CONFIG_KEY",
    "MODEL_CONFIG_KEY",
    "OWN_KEYS",
    "OpTensor",
    "op_stages",
    "op_tensors",
    "device_grid",
    "shard_groups",
]

FORMAT = "planner-onnx-sharding"
VERSION = 1

CONFIGURATION = "planner"
"""``DeviceConfigurationProto.name`` of the plan, and ``configuration_id`` of every node's entry."""

MIN_IR_VERSION = 11
"""The first ONNX IR with the multi-device protos (``DeviceConfigurationProto``,
``NodeDeviceConfigurationProto``, ``ShardingSpecProto``; IR 11, 2025-05-12). Older models get the
same content as metadata (the ``ai.onnx.hint.*`` keys below)."""

PLAN_KEY = "planner.plan"
"""Model ``metadata_props``: the format, version, mode and the plan's context as JSON (the generic
plan without its per-op splits and stage lists, which the sharding fields hold)."""

STAGE_KEY = "ai.onnx.hint.pipeline_stage"
"""Node ``metadata_props`` (IR < 11): the node's pipeline stage, a decimal integer."""

NODE_CONFIG_KEY = "ai.onnx.hint.device_configurations"
"""Node ``metadata_props`` (IR < 11): a JSON list of ``NodeDeviceConfigurationProto`` in the protobuf
JSON mapping with the proto's own field names (``configuration_id``, ``sharding_spec``, ...); the
stage is under :data:`STAGE_KEY` instead of ``pipeline_stage``."""

MODEL_CONFIG_KEY = "ai.onnx.hint.device_configuration"
"""Model ``metadata_props`` (IR < 11): one ``DeviceConfigurationProto`` as JSON (``name``, ``num_devices``)."""

OWN_KEYS = frozenset({PLAN_KEY, STAGE_KEY, NODE_CONFIG_KEY, MODEL_CONFIG_KEY})
"""Keys a re-export replaces (an annotated model planned again)."""


@dataclass(frozen=True, slots=True)
class OpTensor:
    """One tensor whose sharding is written for an op: on which node, and which op dims index each axis."""

    node: str
    tensor: str
    axes: tuple[tuple[str, ...], ...]
    """Per tensor axis, the op dims that index it, outer to inner (``()``: never split)."""
    shape: tuple[int, ...]
    """The tensor's shape at the plan's dims (``()`` when unknown or a scalar)."""

    @property
    def dims(self) -> tuple[str, ...]:
        """The op dims that index the tensor, in shard order (axis by axis, outer first)."""
        return tuple(dict.fromkeys(d for axis in self.axes for d in axis))


def _node_aligned(op: Op, node: onnx.NodeProto) -> list[OpTensor] | None:
    """The main node's own inputs and outputs with their axes (``None``: the importer described a
    region, not this node)."""
    spec = op.node
    if spec is None or spec.op_type != node.op_type:
        return None
    if len(spec.input_axes) != len(node.input) or len(spec.output_axes) != len(node.output):
        return None
    found = []
    names = (*node.input, *node.output)
    axes_list = (*spec.input_axes, *spec.output_axes)
    shapes = (*spec.input_shapes, *spec.output_shapes)
    for position, (name, axes) in enumerate(zip(names, axes_list)):
        if name and axes is not None and all(t.tensor != name for t in found):
            shape = tuple(shapes[position]) if position < len(shapes) else ()
            found.append(OpTensor(node=node.name, tensor=name, axes=tuple(axes), shape=shape if len(shape) == len(axes) else ()))
    return found


def op_tensors(op: Op, nodes: dict[str, onnx.NodeProto], graph: OpGraph) -> list[OpTensor]:
    """The tensors whose sharding is written for ``op`` (module docstring), in a fixed order."""
    main = nodes.get(op.onnx_nodes[0] if op.onnx_nodes else op.name)
    if main is None:
        return []
    aligned = _node_aligned(op, main)
    if aligned is not None:
        return aligned
    found: list[OpTensor] = []
    members = [nodes[name] for name in op.onnx_nodes if name in nodes]
    for access in (*op.inputs, *op.outputs):
        holder = next((n for n in members if access.tensor in n.input or access.tensor in n.output), None)
        if holder is None or any(t.tensor == access.tensor and t.node == holder.name for t in found):
            continue
        tensor = graph.tensors.get(access.tensor)
        shape = tuple(tensor.shape) if tensor is not None and len(tensor.shape) == len(access.axes) else ()
        found.append(OpTensor(node=holder.name, tensor=access.tensor, axes=tuple(access.axes), shape=shape))
    return found


def op_stages(plan_input: PlanInput) -> list[int | None]:
    """Per op, its pipeline stage (``None`` for every op of a plan without a pipeline section)."""
    stages: list[int | None] = [None] * len(plan_input.graph.ops)
    if plan_input.pipeline is not None:
        for stage in plan_input.pipeline.stages:
            for op in stage.ops:
                stages[op] = stage.index
    return stages


def device_grid(
    factors: Sequence[int], inter: Sequence[int], replicas: int, inter_replicas: int, *, base: int, per_node: int
) -> np.ndarray:
    """Device ids of an op's shards and copies: shape ``(*factors, replicas)`` (module docstring)."""
    factors = [int(f) for f in factors] + [int(replicas)]
    inter = [int(e) for e in inter] + [int(inter_replicas)]
    intra = [f // e for f, e in zip(factors, inter)]
    if math.prod(intra) > per_node:
        raise ValueError(f"{math.prod(intra)} devices of one node do not fit its {per_node}")
    grid = np.zeros(factors, dtype=np.int64)
    coords = np.indices(factors, dtype=np.int64)
    node = np.zeros(factors, dtype=np.int64)
    local = np.zeros(factors, dtype=np.int64)
    for axis, (e, a) in enumerate(zip(inter, intra)):
        node = node * e + coords[axis] // a
        local = local * a + coords[axis] % a
    grid += base + node * per_node + local
    return grid


def shard_groups(grid: np.ndarray, dim_names: Sequence[str], tensor_dims: Sequence[str]) -> list[list[int]]:
    """Per shard of a tensor indexed by ``tensor_dims`` (row-major), the sorted devices holding it."""
    order = [dim_names.index(d) for d in tensor_dims]
    rest = [axis for axis in range(grid.ndim) if axis not in order]
    moved = np.transpose(grid, order + rest)
    shards = math.prod(grid.shape[axis] for axis in order)
    return [sorted(int(v) for v in row) for row in moved.reshape(shards, -1)]
