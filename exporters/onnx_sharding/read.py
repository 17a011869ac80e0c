"""The reading side of ``--export onnx``: a model's sharding fields read back as the plan's per-op
splits, inter-node parts, copies and pipeline stages (:func:`read_onnx_sharding`), and as a generic
plan document (:func:`plan_document`) that ``planner explain``, ``compare`` and ``export`` read.

The splits come from the sharding fields alone: each ``SimpleShardedDimProto.num_shards`` is the
split factor of the op dim that indexes that axis (the rules of :mod:`exporters.onnx_sharding.rules`
say which); copies and inter-node parts from the devices (``ShardingSpecProto.device`` and its
groups); stages from ``NodeDeviceConfigurationProto.pipeline_stage`` (IR 11 and later) or the
``ai.onnx.hint.pipeline_stage`` key (older IRs). Only the configuration rows, costs and context come
from the model's ``planner.plan`` metadata.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from exporters.onnx_sharding.rules import (
    CONFIGURATION,
    FORMAT,
    NODE_CONFIG_KEY,
    PLAN_KEY,
    STAGE_KEY,
    VERSION,
    OpTensor,
    op_tensors,
)
from planner.core.errors import InputError

if TYPE_CHECKING:
    import onnx

    from planner.core.graph import Op, OpGraph

__all__ = ["OpSharding", "read_context", "node_configurations", "read_onnx_sharding", "plan_document"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSharding:
    """One op's plan as the model's sharding fields say it."""

    name: str
    factors: Mapping[str, int]
    """Every dim of the op -> its split factor (1: not split)."""
    inter: Mapping[str, int]
    """Every dim -> the part of its factor across nodes (all 1 without the plan's context)."""
    replicas: int = 1
    inter_replicas: int = 1
    stage: int | None = None
    """Its pipeline stage (``None``: none written)."""


def read_context(model: onnx.ModelProto) -> dict[str, Any] | None:
    """The ``planner.plan`` metadata (format, version, mode, plan context); ``None`` when absent."""
    entry = next((e.value for e in model.metadata_props if e.key == PLAN_KEY), None)
    if entry is None:
        return None
    try:
        context = json.loads(entry)
    except json.JSONDecodeError:
        raise InputError(f"the model's {PLAN_KEY} metadata is not JSON; export the plan again") from None
    if not isinstance(context, dict) or context.get("format") != FORMAT or context.get("version") != VERSION:
        raise InputError(f"the model's {PLAN_KEY} metadata is not a {FORMAT} version {VERSION}; export the plan again")
    return context


def node_configurations(model: onnx.ModelProto) -> dict[str, tuple["onnx.NodeDeviceConfigurationProto", int | None]]:
    """Node name -> (its ``planner`` device configuration, its pipeline stage), from the IR's fields
    or, where a node has none, from its ``ai.onnx.hint.*`` metadata."""
    import onnx
    from google.protobuf.json_format import ParseDict, ParseError

    found = {}
    for node in model.graph.node:
        config = next((c for c in node.device_configurations if c.configuration_id == CONFIGURATION), None)
        stage = config.pipeline_stage if config is not None and config.HasField("pipeline_stage") else None
        meta = {e.key: e.value for e in node.metadata_props}
        if config is None and NODE_CONFIG_KEY in meta:
            try:
                entries = json.loads(meta[NODE_CONFIG_KEY])
                entry = next(e for e in entries if e.get("configuration_id") == CONFIGURATION)
                config = ParseDict(entry, onnx.NodeDeviceConfigurationProto())
            except (json.JSONDecodeError, StopIteration, AttributeError, TypeError, ParseError):
                raise InputError(f"node {node.name}: its {NODE_CONFIG_KEY} metadata is not a planner configuration") from None
        if stage is None and STAGE_KEY in meta:
            try:
                stage = int(meta[STAGE_KEY])
            except ValueError:
                raise InputError(f"node {node.name}: {STAGE_KEY} '{meta[STAGE_KEY]}' is not an integer") from None
        if config is not None or stage is not None:
            found[node.name] = (config, stage)
    return found


def _shards(spec: "onnx.ShardingSpecProto") -> list[list[int]]:
    """Per shard of ``spec``, its devices (a group expanded)."""
    groups = {entry.key: list(entry.value) for entry in spec.index_to_device_group_map}
    return [groups.get(device, [device]) for device in spec.device]


def _read_factors(op: Op, tensor: OpTensor, spec: "onnx.ShardingSpecProto", factors: dict[str, int]) -> None:
    """Each dim's factor from ``spec``'s sharded dims, checked against what other tensors said."""
    rank = len(tensor.axes)
    by_axis = {(d.axis + rank) % rank if rank else d.axis: d for d in spec.sharded_dim}
    for axis, dims in enumerate(tensor.axes):
        sharded = by_axis.get(axis)
        if not dims or sharded is None:
            continue
        if len(sharded.simple_sharding) != len(dims):
            raise InputError(f"op {op.name}: tensor {tensor.tensor} axis {axis} has {len(sharded.simple_sharding)} "
                             f"sharded parts, the op indexes it with {len(dims)} dims ({', '.join(dims)})")  # fmt: skip
        for name, part in zip(dims, sharded.simple_sharding):
            shards = int(part.num_shards) if part.HasField("num_shards") else 1
            if part.HasField("dim_value") and part.dim_value != op.dim(name).size:
                raise InputError(f"op {op.name}: tensor {tensor.tensor} axis {axis} says dim {name} has {part.dim_value} "
                                 f"elements, the model {op.dim(name).size}; import it with the plan's --dim values")  # fmt: skip
            if factors.setdefault(name, shards) != shards:
                raise InputError(f"op {op.name}: its tensors split dim {name} {factors[name]} and {shards} ways")


def _inter_parts(found: list, factors: dict[str, int], base: int, per_node: int) -> dict[str, int]:
    """Each split dim's inter-node part: the nodes its shards span with every other coordinate 0."""
    inter = {}
    for name, factor in factors.items():
        if factor == 1:
            continue
        tensor, spec = next((t, s) for t, s in found if name in t.dims)
        shape = [factors.get(d, 1) for d in tensor.dims]
        shards = _shards(spec)
        position = tensor.dims.index(name)
        nodes = set()
        for coordinate in range(factor):
            index = [0] * len(shape)
            index[position] = coordinate
            group = shards[int(np.ravel_multi_index(index, shape))]
            nodes.add((min(group) - base) // per_node)
        inter[name] = len(nodes)
    return inter


def _op_sharding(op: Op, tensors: list[OpTensor], configs: Mapping, layout: tuple[int, int] | None) -> OpSharding:
    """One op's :class:`OpSharding` from its nodes' configurations (``layout``: devices per stage and per node)."""
    found = []
    for tensor in tensors:
        config = configs.get(tensor.node, (None, None))[0]
        spec = None if config is None else next((s for s in config.sharding_spec if s.tensor_name == tensor.tensor), None)
        if spec is not None:
            found.append((tensor, spec))
    factors: dict[str, int] = {}
    for tensor, spec in found:
        _read_factors(op, tensor, spec, factors)
    factors = {d.name: factors.get(d.name, 1) for d in op.dims}
    stages = [configs[n][1] for n in op.onnx_nodes if n in configs and configs[n][1] is not None]
    stage = stages[0] if stages else None
    devices = {d for _, spec in found for shard in _shards(spec) for d in shard}
    used = math.prod(factors.values())
    replicas = max(1, len(devices) // used) if devices else 1
    if layout is None or not devices:
        return OpSharding(name=op.name, factors=factors, inter={n: 1 for n in factors}, replicas=replicas, stage=stage)
    per_stage, per_node = layout
    base, per_node = (stage or 0) * per_stage, min(per_stage, per_node)
    inter = _inter_parts(found, factors, base, per_node)
    spanned = len({(d - base) // per_node for d in devices})
    inter = {n: inter.get(n, 1) for n in factors}
    return OpSharding(name=op.name, factors=factors, inter=inter, replicas=replicas,
                      inter_replicas=max(1, spanned // math.prod(inter.values())), stage=stage)  # fmt: skip


def read_onnx_sharding(model: onnx.ModelProto, graph: OpGraph) -> tuple[OpSharding, ...]:
    """Per op of ``graph`` (the model imported at the plan's dims), its plan as the model's sharding
    fields say it: split factors, inter-node parts, copies, pipeline stage.

    Raises
    ------
    InputError
        Tensors of one op that disagree on a dim's split, or sizes that are not the model's.
    """
    configs = node_configurations(model)
    nodes = {node.name: node for node in model.graph.node}
    context = read_context(model)
    layout = None
    if context is not None:
        plan = context["plan"]
        pipeline = plan.get("pipeline")
        devices = int(plan["cluster"]["devices"])
        layout = (devices if pipeline is None else int(pipeline["devices_per_stage"]), int(plan["cluster"]["devices_per_node"]))
    return tuple(_op_sharding(op, op_tensors(op, nodes, graph), configs, layout) for op in graph.ops)


def _op_entry(index: int, op: Op, read: OpSharding, config: int) -> dict[str, Any]:
    """One op of the generic plan document (``exporters/plan.schema.json``)."""
    entry = {
        "index": index, "name": op.name, "kind": op.kind, "op_type": op.op_type, "module_path": op.module_path,
        "onnx_nodes": list(op.onnx_nodes), "config": int(config),
        "dims": [{"name": d.name, "size": int(d.size), "factor": int(read.factors[d.name]), "inter": int(read.inter[d.name])}
                 for d in op.dims],
    }  # fmt: skip
    if read.replicas > 1:
        entry["replicas"] = {"count": int(read.replicas), "inter": int(read.inter_replicas)}
    return entry


def plan_document(model: onnx.ModelProto, graph: OpGraph) -> dict[str, Any]:
    """The generic plan (``--export generic``'s document) of an annotated model: its context from the
    ``planner.plan`` metadata, its per-op splits and stages from the sharding fields, and the model
    itself (``graph``: the annotated file imported at the plan's dims) as the plan's model.

    Raises
    ------
    InputError
        No plan in the model, a model whose ops are not the plan's, an op without a stage in a
        pipeline plan.
    """
    context = read_context(model)
    if context is None:
        raise InputError(f"the model has no {PLAN_KEY} metadata; write one with `planner plan ... --export onnx -o FILE.onnx`")
    document = json.loads(json.dumps(context["plan"]))
    rows = document["ops"]
    if [name for name, _ in rows] != [op.name for op in graph.ops]:
        raise InputError(f"the model's {len(graph.ops)} ops are not the plan's {len(rows)}; import it with the plan's "
                         "--dim values and planner version")  # fmt: skip
    read = read_onnx_sharding(model, graph)
    document["ops"] = [_op_entry(i, op, r, row[1]) for i, (op, r, row) in enumerate(zip(graph.ops, read, rows))]
    document["model"].update(sha256=graph.source_sha256, source_path=graph.source_path, num_ops=len(graph.ops))
    pipeline = document.get("pipeline")
    if pipeline is not None:
        for stage in pipeline["stages"]:
            stage["ops"] = [i for i, r in enumerate(read) if r.stage == stage["index"]]
        lost = [r.name for r in read if r.stage is None or not 0 <= r.stage < len(pipeline["stages"])]
        if lost:
            raise InputError(f"op {lost[0]} has no pipeline stage of the plan's {len(pipeline['stages'])}; export the plan again")
    return document
