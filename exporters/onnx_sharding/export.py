"""The plan written back into the model: ``--export onnx``.

:func:`export_onnx_sharding` turns a picked plan into the annotations of the user's model (a JSON
document: per ONNX node its ``NodeDeviceConfigurationProto`` and pipeline stage, plus the plan's
context), after checking that they read back as the same plan (:mod:`exporters.onnx_sharding.validate`).
:func:`onnx_model_bytes` writes them into a copy of the model: on IR 11 and later as the IR's own
fields (``ModelProto.configuration``, ``NodeProto.device_configurations`` with ``sharding_spec`` and
``pipeline_stage``), on older IRs as ``metadata_props`` (``ai.onnx.hint.*``, the same content as
JSON). The copy keeps the model's IR version; a graph-only model stays graph-only (weights are never
loaded; an external-data reference is pointed at the original data file when that file exists). The
format is described in ``docs/onnx-sharding.md``; :mod:`exporters.onnx_sharding.rules` holds its rules.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporters.onnx_sharding.rules import (
    CONFIGURATION,
    FORMAT,
    MIN_IR_VERSION,
    MODEL_CONFIG_KEY,
    NODE_CONFIG_KEY,
    OWN_KEYS,
    PLAN_KEY,
    STAGE_KEY,
    VERSION,
    device_grid,
    op_stages,
    op_tensors,
    shard_groups,
)
from planner.core.errors import InputError, UnsupportedExport

if TYPE_CHECKING:
    import onnx

    from exporters.generic import PlanInput

__all__ = ["export_onnx_sharding", "onnx_model_bytes", "annotate", "load_source", "node_annotations", "plan_context"]

_MAX_MODEL_BYTES = 2 << 30
"""Largest model file read (a protobuf cannot be larger)."""


def load_source(path: str | Path, sha256: str = "") -> onnx.ModelProto:
    """The model at ``path``, without its external data; with ``sha256``, it must be that file."""
    import onnx

    path = Path(path)
    if not str(path) or not path.is_file():
        raise InputError(f"the plan's model '{path}' is not found; `--export onnx` writes a copy of it, so keep it in place")
    if path.stat().st_size > _MAX_MODEL_BYTES:
        raise InputError(f"model {path} is over 2 GiB, larger than an ONNX protobuf can be; pass the graph-only file")
    data = path.read_bytes()
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise InputError(f"model {path} changed since it was planned (sha256 differs); plan it again")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - a DecodeError whatever the protobuf backend
        raise InputError(f"model {path} is not an ONNX file ({exc.__class__.__name__}); pass the planned model") from None
    return model


def _spec(tensor, grid, dim_names, factors, sizes, devices: int) -> "onnx.ShardingSpecProto":
    import onnx

    spec = onnx.ShardingSpecProto(tensor_name=tensor.tensor)
    for axis, dims in enumerate(tensor.axes):
        sharded = spec.sharded_dim.add(axis=axis)
        if dims:
            for d in dims:
                sharded.simple_sharding.add(dim_value=int(sizes[d]), num_shards=int(factors[d]))
        elif tensor.shape:
            sharded.simple_sharding.add(dim_value=int(tensor.shape[axis]), num_shards=1)
        else:
            sharded.simple_sharding.add(dim_param="?", num_shards=1)
    for number, group in enumerate(shard_groups(grid, dim_names, tensor.dims)):
        if len(group) == 1:
            spec.device.append(group[0])
        else:
            key = devices + number
            spec.device.append(key)
            spec.index_to_device_group_map.add(key=key, value=group)
    return spec


def _op_specs(plan_input: PlanInput, index: int, nodes: dict, stage: int | None) -> dict[str, list]:
    """Node name -> the sharding specs of op ``index`` written on it."""
    graph, space, row = plan_input.graph, plan_input.spaces[index], plan_input.strategy.choice[index]
    op = graph.ops[index]
    pipeline, cluster = plan_input.pipeline, plan_input.cluster
    per_stage = cluster.devices if pipeline is None else pipeline.devices_per_stage
    dim_names = list(space.dim_names) + ["<copies>"]
    factors = dict(zip(space.dim_names, space.factors[row].tolist()))
    grid = device_grid(space.factors[row], space.inter_factors[row], int(space.replica_counts[row]),
                       int(space.inter_replica_counts[row]), base=(stage or 0) * per_stage,
                       per_node=min(per_stage, cluster.devices_per_node))  # fmt: skip
    sizes = {d.name: d.size for d in op.dims}
    found: dict[str, list] = {}
    for tensor in op_tensors(op, nodes, graph):
        found.setdefault(tensor.node, []).append(_spec(tensor, grid, dim_names, factors, sizes, cluster.devices))
    return found


def _named_nodes(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    nodes: dict[str, onnx.NodeProto] = {}
    for node in model.graph.node:
        if not node.name or node.name in nodes:
            raise UnsupportedExport(
                f"the model has {'an unnamed node' if not node.name else f'two nodes named {node.name}'}; the ONNX "
                "sharding names each node's plan by the node's name: give every node a unique name and plan it again"
            )
        nodes[node.name] = node
    return nodes


def _spread_stages(model: onnx.ModelProto, stages: dict[str, int]) -> None:
    """Nodes of no op (folded views, constants) take the earliest stage of their consumers, else their producers'."""
    consumers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node.name)
    for node in reversed(model.graph.node):
        if node.name not in stages:
            known = [stages[c] for o in node.output for c in consumers.get(o, ()) if c in stages]
            if known:
                stages[node.name] = min(known)
    producer = {o: node.name for node in model.graph.node for o in node.output}
    for node in model.graph.node:
        if node.name not in stages:
            known = [stages[producer[i]] for i in node.input if producer.get(i) in stages]
            stages[node.name] = max(known) if known else 0


def node_annotations(plan_input: PlanInput, model: onnx.ModelProto) -> dict[str, dict[str, Any]]:
    """Node name -> ``{"sharding_spec": [...], "pipeline_stage": s}`` (specs as protobuf JSON)."""
    from google.protobuf.json_format import MessageToDict

    nodes = _named_nodes(model)
    stages = op_stages(plan_input)
    specs: dict[str, list] = {}
    node_stage: dict[str, int] = {}
    for index, op in enumerate(plan_input.graph.ops):
        missing = [name for name in op.onnx_nodes if name not in nodes]
        if missing:
            raise UnsupportedExport(f"op {op.name}: node {missing[0]} is not in the model file; plan the file being exported")
        for name, found in _op_specs(plan_input, index, nodes, stages[index]).items():
            specs.setdefault(name, []).extend(found)
        if stages[index] is not None:
            node_stage.update((name, stages[index]) for name in op.onnx_nodes)
    if plan_input.pipeline is not None:
        _spread_stages(model, node_stage)
    annotations = {}
    for node in model.graph.node:
        if node.name in specs or node.name in node_stage:
            entry: dict[str, Any] = {"sharding_spec": [MessageToDict(s, preserving_proto_field_name=True) for s in specs.get(node.name, ())]}
            if node.name in node_stage:
                entry["pipeline_stage"] = node_stage[node.name]
            annotations[node.name] = entry
    return annotations


def plan_context(plan_input: PlanInput) -> dict[str, Any]:
    """The generic plan without its per-op splits and stage lists (the sharding fields hold those):
    ops keep their name and configuration row only."""
    from exporters.generic import write_plan

    document = write_plan(plan_input)
    document["ops"] = [[op["name"], op["config"]] for op in document["ops"]]
    if document.get("pipeline") is not None:
        for stage in document["pipeline"]["stages"]:
            del stage["ops"]
    return document


def export_onnx_sharding(plan_input: PlanInput) -> dict[str, Any]:
    """The ONNX sharding of one plan: a JSON document that :func:`onnx_model_bytes` writes into a copy
    of the model, checked to read back as the same per-op splits, copies and stages.

    Raises
    ------
    UnsupportedExport
        Unnamed or duplicate node names, or a split the model's tensors cannot show.
    InputError
        The model file is missing or changed since it was planned.
    """
    from exporters.onnx_sharding.validate import check_round_trip

    graph = plan_input.graph
    model = load_source(graph.source_path, graph.source_sha256)
    document = {
        "format": FORMAT,
        "version": VERSION,
        "source": {"path": graph.source_path, "sha256": graph.source_sha256},
        "ir_version": int(model.ir_version),
        "mode": "device_configurations" if model.ir_version >= MIN_IR_VERSION else "metadata_props",
        "configuration": {"name": CONFIGURATION, "num_devices": int(plan_input.cluster.devices)},
        "plan": plan_context(plan_input),
        "nodes": node_annotations(plan_input, model),
    }
    check_round_trip(annotate(model, document), plan_input)
    return document


def _clear(model: onnx.ModelProto) -> None:
    """Remove the annotations of an earlier export (an annotated model planned again)."""
    for holder in (model, *model.graph.node):
        kept = [entry for entry in holder.metadata_props if entry.key not in OWN_KEYS]
        del holder.metadata_props[:]
        holder.metadata_props.extend(kept)
    kept_configs = [c for c in model.configuration if c.name != CONFIGURATION]
    del model.configuration[:]
    model.configuration.extend(kept_configs)
    for node in model.graph.node:
        kept_nodes = [c for c in node.device_configurations if c.configuration_id != CONFIGURATION]
        del node.device_configurations[:]
        node.device_configurations.extend(kept_nodes)


def annotate(model: onnx.ModelProto, document: dict[str, Any]) -> onnx.ModelProto:
    """A copy of ``model`` with the document's annotations (the IR's fields or metadata, by its IR)."""
    import onnx
    from google.protobuf.json_format import ParseDict

    out = onnx.ModelProto()
    out.CopyFrom(model)
    _clear(out)
    native = out.ir_version >= MIN_IR_VERSION
    config = document["configuration"]
    if native:
        out.configuration.add(name=config["name"], num_devices=config["num_devices"])
    else:
        out.metadata_props.add(key=MODEL_CONFIG_KEY, value=json.dumps(config))
    context = {"format": FORMAT, "version": VERSION, "mode": "device_configurations" if native else "metadata_props",
               "plan": document["plan"]}  # fmt: skip
    out.metadata_props.add(key=PLAN_KEY, value=json.dumps(context, separators=(",", ":")))
    for node in out.graph.node:
        entry = document["nodes"].get(node.name)
        if entry is None:
            continue
        proto = ParseDict({"configuration_id": CONFIGURATION, "sharding_spec": entry["sharding_spec"]},
                          onnx.NodeDeviceConfigurationProto())  # fmt: skip
        stage = entry.get("pipeline_stage")
        if native:
            if stage is not None:
                proto.pipeline_stage = int(stage)
            node.device_configurations.append(proto)
            continue
        if stage is not None:
            node.metadata_props.add(key=STAGE_KEY, value=str(int(stage)))
        hint = [{"configuration_id": CONFIGURATION, "sharding_spec": entry["sharding_spec"]}]
        node.metadata_props.add(key=NODE_CONFIG_KEY, value=json.dumps(hint, separators=(",", ":")))
    return out


def _repoint_external_data(model: onnx.ModelProto, source: Path, output: Path) -> None:
    """Point external-data references at the source's data files when they exist (weights are never copied)."""
    for tensor in model.graph.initializer:
        if tensor.data_location != 1:  # TensorProto.EXTERNAL
            continue
        for entry in tensor.external_data:
            if entry.key == "location":
                data = source.parent / entry.value
                if data.is_file():
                    entry.value = os.path.relpath(data.resolve(), output.resolve().parent)


def onnx_model_bytes(document: dict[str, Any], output: str | Path) -> bytes:
    """The annotated copy of the document's model, to be written to ``output`` (checked by the ONNX
    checker; never the model itself).

    Raises
    ------
    InputError
        ``output`` is the model, or the model is missing or changed since it was planned.
    """
    from exporters.onnx_sharding.validate import check_annotated

    source = Path(document["source"]["path"])
    output = Path(output)
    if output.exists() and source.exists() and os.path.samefile(output, source):
        raise InputError(f"-o {output} is the planned model itself; --export onnx writes a copy: name another file")
    model = annotate(load_source(source, document["source"]["sha256"]), document)
    _repoint_external_data(model, source, output)
    check_annotated(model)
    return model.SerializeToString()
