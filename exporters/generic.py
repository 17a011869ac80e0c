"""The generic plan JSON: how every operator is split, with the model, cluster, settings and costs.

The document is versioned (``"format": "planner-plan", "version": 1, "minor_version": 1``) and
checked against the JSON Schema shipped next to this module (``plan.schema.json``) both when written
and when read, so a file that loads is a file every later stage can trust. Per op it records the
configuration index (the row of the op's :class:`~planner.core.configs.ConfigSpace`) and, readable
without the planner, every iteration dim with its size, split factor and the part of that factor
that crosses nodes.

Minor version 1 adds the optional ``pipeline`` section (:class:`PipelineSpec`): pipeline stages,
schedule, micro-batching and, per stage, its layers, ops, time and memory. A pipeline plan's op
configurations are those of one stage (every stage runs the same per-op splits on its own
``devices_per_stage`` devices). Plans of minor version 0 (no ``minor_version``, no ``pipeline``)
still read.

:class:`PlanInput` is what every exporter reads: core types only (never the ONNX file).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
from dataclasses import asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any, Literal, Mapping

import jsonschema
import numpy as np

from exporters._common import strategy_degrees
from exporters._common import graph_batch_size
from exporters.coupling import contrastive_note
from planner.core.cluster import Cluster, Device, Link
from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import ZERO_SYNC_STAGES, TrainingSettings, Zero3Gather, ZeroSync
from planner.core.strategy import MemoryBreakdown, Strategy, TimeBreakdown

__all__ = [
    "FORMAT",
    "VERSION",
    "MINOR_VERSION",
    "StageSpec",
    "PipelineSpec",
    "PlanInput",
    "PlanOp",
    "PlanDocument",
    "plan_schema",
    "write_plan",
    "save_plan",
    "read_plan",
    "plan_from_dict",
]

FORMAT = "planner-plan"
VERSION = 1
MINOR_VERSION = 3
"""Additions readers of ``VERSION`` 1 may skip: 1 = the ``pipeline`` section, 2 = each op's ``replicas``
(redundant copies of a replicated op; absent = none), 3 = a memory breakdown's ``graph_buffers_bytes`` (per-layer
CUDA graphs' static buffers, ``objectives.cuda_graph_memory``; absent = none); a memory breakdown's
``nccl_bytes`` (NCCL's buffers, ``objectives.nccl_memory``; absent = none) and the cluster's
``nccl_buffsize_bytes`` (``NCCL_BUFFSIZE``; absent = NCCL's 4 MiB) came with 3 too, and older readers that skip them
read the total as the parts' sum less them."""
_SCHEMA_PATH = Path(__file__).with_name("plan.schema.json")


@cache
def _planner_version() -> str:
    """The installed package's version, read once per process (the metadata lookup costs ~1 ms and a plan
    builds one PlanInput per row)."""
    try:
        return importlib.metadata.version("planner")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class StageSpec:
    """One pipeline stage: its layers and ops, and what it costs per device."""

    index: int
    layers: tuple[int, int]
    """``[first, end)`` indices of the repeated blocks (layers) it runs; the first stage also runs
    the ops before the layers (embeddings), the last those after them (final norm, LM head)."""
    ops: tuple[int, ...]
    """Indices of its ops in the graph."""
    forward_s: float = 0.0
    """Seconds per micro-batch, forward."""
    backward_s: float = 0.0
    """Seconds per micro-batch, backward (with recomputation)."""
    grad_sync_s: float = 0.0
    """Seconds per step of gradient synchronisation after its last backward."""
    in_flight: float = 0.0
    """Micro-batches of activations the schedule keeps at its peak."""
    memory: MemoryBreakdown | None = None
    """Per device of this stage (bytes)."""

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSpec:
    """How a plan is pipelined: stages, schedule and micro-batching (the ``pipeline`` section).

    The op configurations of a pipeline plan are one stage's: every stage splits its ops the same
    way on its own ``devices_per_stage`` consecutive ranks.
    """

    pp: int
    """Pipeline stages."""
    devices_per_stage: int
    schedule: Literal["gpipe", "1f1b", "interleaved", "zb-h1", "zbv"] = "1f1b"
    chunks: int = 1
    """Model chunks (virtual stages) per device; more than 1 only with ``interleaved``, ``zb-h1``, ``zbv`` (2)."""
    micro_batch: int
    """Samples per data-parallel rank per micro-batch (Megatron's ``--micro-batch-size``)."""
    micro_batches: int
    """Micro-batches per step (gradient accumulation steps)."""
    global_batch: int
    """Samples per step."""
    zero_stage: int = 0
    recompute: Literal["none", "selective", "mlp", "full", "op"] = "none"
    stages: tuple[StageSpec, ...]
    pipeline_s: float = 0.0
    """The schedule's makespan (seconds, bubble included)."""
    bubble_s: float = 0.0
    p2p_s: float = 0.0
    """Stage-to-stage transfer seconds per micro-batch and direction, summed over boundaries."""
    bubble_fraction: float = 0.0

    def __post_init__(self) -> None:
        for name in ("pp", "devices_per_stage", "chunks", "micro_batch", "micro_batches", "global_batch"):
            if getattr(self, name) < 1:
                raise InputError(f"pipeline {name.replace('_', ' ')} must be at least 1 (got {getattr(self, name)})")
        if self.schedule not in ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv"):
            raise InputError(f"unknown pipeline schedule '{self.schedule}'; use gpipe, 1f1b, interleaved, zb-h1 or zbv")
        if self.chunks > 1 and self.schedule not in ("interleaved", "zb-h1", "zbv"):
            raise InputError(f"{self.chunks} model chunks per device need the interleaved, zb-h1 or zbv schedule")
        if self.zero_stage not in (0, 1, 2, 3) or self.recompute not in ("none", "selective", "mlp", "full", "op"):
            raise InputError(
                f"pipeline ZeRO stage {self.zero_stage} / recompute '{self.recompute}' is invalid; use 0-3 and none, "
                "selective, mlp, full or op"
            )
        if len(self.stages) != self.pp:
            raise InputError(f"a {self.pp}-stage pipeline needs {self.pp} stages, got {len(self.stages)}")
        start = 0
        for position, stage in enumerate(self.stages):
            first, end = stage.layers
            if stage.index != position or first != start or end < first:
                raise InputError(
                    f"pipeline stage {position} runs layers [{first}, {end}); stages must cover the layers in order "
                    f"without gaps (expected it to start at layer {start})"
                )
            start = end

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Layers of each stage, first to last."""
        return tuple(stage.num_layers for stage in self.stages)

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layers[1] if self.stages else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanInput:
    """One chosen strategy with everything an exporter needs (core types only)."""

    graph: OpGraph
    cluster: Cluster
    settings: TrainingSettings
    spaces: tuple[ConfigSpace, ...]
    """Per op, its configurations (``strategy.choice`` indexes their rows)."""
    strategy: Strategy
    micro_batch: int | None = None
    """Samples in one forward/backward pass over all data-parallel replicas; ``None``: the graph's
    batch size, the batch the strategy was priced at."""
    global_batch: int | None = None
    """Samples per optimizer step, a multiple of ``micro_batch``; ``None``: ``micro_batch`` (no
    gradient accumulation)."""
    cost_model: str = "roofline"
    planner_version: str = field(default_factory=_planner_version)
    pipeline: PipelineSpec | None = None
    """Pipeline stages and schedule (``None``: one stage, no pipeline); ``spaces`` and ``strategy``
    are then one stage's, on ``pipeline.devices_per_stage`` devices."""

    def __post_init__(self) -> None:
        n = len(self.graph.ops)
        if len(self.spaces) != n or len(self.strategy.choice) != n:
            raise InputError(
                f"plan input has {n} ops but {len(self.spaces)} configuration spaces and "
                f"{len(self.strategy.choice)} choices; pass the spaces and strategy of this graph"
            )
        for op, space, row in zip(self.graph.ops, self.spaces, self.strategy.choice):
            if not 0 <= row < space.size:
                raise InputError(f"op {op.name}: configuration {row} is outside its {space.size} configurations")
        for name in ("micro_batch", "global_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"{name.replace('_', '-')} must be at least 1 (got {value})")
        if self.global_batch is not None and self.global_batch % self.samples_per_pass:
            raise InputError(
                f"global batch {self.global_batch} is not a multiple of the micro batch {self.samples_per_pass}; "
                "pass a multiple"
            )
        pipe = self.pipeline
        if pipe is not None:
            if (pipe.zero_stage, pipe.recompute) != (self.settings.zero_stage, self.settings.recompute):
                raise InputError(
                    f"the pipeline says ZeRO-{pipe.zero_stage} / recompute {pipe.recompute} but the settings say "
                    f"ZeRO-{self.settings.zero_stage} / recompute {self.settings.recompute}; pass one set of settings"
                )
            if (pipe.global_batch, pipe.micro_batches) != (self.samples_per_step, self.grad_accum):
                raise InputError(
                    f"the pipeline runs {pipe.micro_batches} micro-batches of a {pipe.global_batch}-sample step but the "
                    f"batch is {self.grad_accum} passes of {self.samples_per_pass} samples; pass the point's batch sizes"
                )
            if pipe.pp * pipe.devices_per_stage > self.cluster.devices:
                raise InputError(
                    f"{pipe.pp} stages of {pipe.devices_per_stage} devices do not fit {self.cluster.devices} devices; "
                    "pass the cluster the pipeline was planned on"
                )
            owner = {}
            for stage in pipe.stages:
                for op in stage.ops:
                    if not 0 <= op < n or op in owner:
                        raise InputError(
                            f"pipeline stage {stage.index} lists op {op}, which is outside the graph or in stage "
                            f"{owner.get(op)} too; pass the stages of this graph"
                        )
                    owner[op] = stage.index

    @property
    def samples_per_pass(self) -> int:
        """The micro batch over all replicas (samples per forward/backward pass)."""
        return self.micro_batch if self.micro_batch is not None else graph_batch_size(self.graph)

    @property
    def samples_per_step(self) -> int:
        """The global batch (samples per optimizer step)."""
        return self.global_batch if self.global_batch is not None else self.samples_per_pass

    @property
    def grad_accum(self) -> int:
        """Forward/backward passes per optimizer step."""
        return self.samples_per_step // self.samples_per_pass


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOp:
    """One op of a read-back plan."""

    index: int
    name: str
    kind: str
    op_type: str
    module_path: str | None
    onnx_nodes: tuple[str, ...]
    config: int
    """Row of the op's configuration space."""
    dims: Mapping[str, int]
    """Dim name -> size (elements)."""
    splits: Mapping[str, int]
    """Split dims -> factor (factors > 1 only)."""
    inter_splits: Mapping[str, int]
    """Split dims -> the part of the factor across nodes (> 1 only)."""
    replicas: int | None = 1
    """Redundant copies of the op's shard computation (:attr:`ConfigSpace.replicas`); ``None``: not
    recorded (a plan of minor version 0 or 1, written before copies were)."""
    inter_replicas: int = 1
    """The part of ``replicas`` across nodes."""

    def row_in(self, space: ConfigSpace) -> int:
        """This op's configuration row in ``space`` (``KeyError`` when it has none): the one row with
        its split factors, their inter-node parts and its copies.

        A plan that did not record copies (``replicas is None``) matches any number of them: its
        ``config`` row where that is one of the matches, else the first.
        """
        match = _matches(space, space.factors, self.splits) & _matches(space, space.inter_factors, self.inter_splits)
        if self.replicas is not None:
            match &= (space.replica_counts == self.replicas) & (space.inter_replica_counts == self.inter_replicas)
        rows = np.flatnonzero(match)
        if rows.size == 0:
            raise KeyError(f"op {self.name}: configuration {dict(self.splits)} is not in the space")
        return self.config if self.replicas is None and self.config in rows else int(rows[0])


def _matches(space: ConfigSpace, table: np.ndarray, parts: Mapping[str, int]) -> np.ndarray:
    """``(K,)``: the rows of ``space`` whose ``table`` (factors or inter-node parts) is ``parts``
    (missing dims: 1); none when ``parts`` names a dim the space lacks."""
    if any(name not in space.dim_names for name in parts):
        return np.zeros(space.size, dtype=bool)
    want = np.array([int(parts.get(n, 1)) for n in space.dim_names], dtype=np.int64)
    return np.all(table == want, axis=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanDocument:
    """A generic plan read back from JSON (see :func:`read_plan`)."""

    data: Mapping[str, Any]
    """The whole validated document."""
    ops: tuple[PlanOp, ...]

    @property
    def version(self) -> int:
        return int(self.data["version"])

    @property
    def model_name(self) -> str:
        return str(self.data["model"]["name"])

    @property
    def model_sha256(self) -> str:
        return str(self.data["model"]["sha256"])

    @property
    def time_s(self) -> float:
        """Time per training step (seconds)."""
        return float(self.data["objectives"]["time_s"])

    @property
    def memory_bytes(self) -> float:
        """Memory per device (bytes)."""
        return float(self.data["objectives"]["memory_bytes"])

    @property
    def choice(self) -> tuple[int, ...]:
        """Configuration index per op."""
        return tuple(op.config for op in self.ops)

    @property
    def minor_version(self) -> int:
        return int(self.data.get("minor_version", 0))

    @property
    def pipeline(self) -> PipelineSpec | None:
        """The plan's pipeline (``None``: not a pipeline plan, or a minor-version-0 plan)."""
        section = self.data.get("pipeline")
        if section is None:
            return None
        stages = tuple(
            StageSpec(
                index=stage["index"],
                layers=(stage["layers"][0], stage["layers"][1]),
                ops=tuple(stage["ops"]),
                forward_s=stage["forward_s"],
                backward_s=stage["backward_s"],
                grad_sync_s=stage["grad_sync_s"],
                in_flight=stage["in_flight"],
                memory=MemoryBreakdown(**stage["memory"]) if stage["memory"] is not None else None,
            )
            for stage in section["stages"]
        )
        scalars = {k: v for k, v in section.items() if k not in ("stages", "num_layers", "layers_per_stage")}
        return PipelineSpec(**scalars, stages=stages)

    def cluster(self) -> Cluster:
        """The plan's cluster as a core :class:`~planner.core.cluster.Cluster`."""
        spec = self.data["cluster"]
        device = spec["device"]
        return Cluster(
            device=Device(
                name=device["name"],
                peak_flops=dict(device["peak_flops"]),
                memory_bytes=int(device["memory_bytes"]),
                memory_bandwidth_bytes_per_s=float(device["memory_bandwidth_bytes_per_s"]),
                **{k: float(device[k]) for k in _DEVICE_DEFAULTS if k in device},
            ),
            nodes=int(spec["nodes"]),
            devices_per_node=int(spec["devices_per_node"]),
            intra_link=Link(**spec["intra_link"]),
            inter_link=Link(**spec["inter_link"]),
            **({"nccl_buffsize_bytes": int(spec["nccl_buffsize_bytes"])} if "nccl_buffsize_bytes" in spec else {}),
        )

    def settings(self) -> TrainingSettings:
        """The plan's training settings."""
        training = self.data["training"]
        return TrainingSettings(
            precision=training["precision"],
            optimizer=training["optimizer"],
            zero_stage=int(training["zero_stage"]),
            recompute=training["recompute"],
            engine=training.get("engine"),
            attention=training.get("attention"),
            dropout=bool(training.get("dropout", False)),
            overlap=bool(training.get("overlap", True)),
            tp_comm_overlap=bool(training.get("tp_comm_overlap", False)),
            tp_overlap_method=training.get("tp_overlap_method", "userbuffers"),
            cuda_graphs=bool(training.get("cuda_graphs", False)),
            p2p_overlap=training.get("p2p_overlap"),
            cuda_graph_scope=training.get("cuda_graph_scope", "step"),
            expert_parallel=int(training.get("expert_parallel", 1)),
            capacity_factor=float(training.get("capacity_factor", 1.0)),
            fp8=training.get("fp8"),
            fp8_param_gather=bool(training.get("fp8_param_gather", False)),
            offload=training.get("offload", "none"),
            dp_shard=training.get("hsdp_shard"),
            hpz_partition=training.get("hpz_partition"),
            reshard_after_forward=training.get("reshard_after_forward", "default"),
            zero3_gather=Zero3Gather(**training["zero3_gather"]) if "zero3_gather" in training else None,
            sequence_shard_saved=bool(training.get("sequence_shard_saved", False)),
            fused_swiglu=bool(training.get("fused_swiglu", False)),
            autocast=bool(training.get("autocast", True)),
            grad_accumulator_bytes=float(training.get("grad_accumulator_bytes", 0.0)),
            zero_sync=ZeroSync(**training["zero_sync"]) if "zero_sync" in training else None,
        )

    def strategy(self) -> Strategy:
        """The plan as a core :class:`~planner.core.strategy.Strategy`."""
        objectives = self.data["objectives"]
        time = objectives["time"]
        memory = objectives["memory"]
        return Strategy(
            choice=self.choice,
            time_s=self.time_s,
            memory_bytes=self.memory_bytes,
            splits={op.name: dict(op.splits) for op in self.ops if op.splits},
            inter_splits={op.name: dict(op.inter_splits) for op in self.ops if op.inter_splits},
            replicas=None
            if any(op.replicas is None for op in self.ops)
            else {op.name: op.replicas for op in self.ops if op.replicas > 1},
            time=TimeBreakdown(**time) if time is not None else None,
            memory=MemoryBreakdown(**memory) if memory is not None else None,
        )

    def check_graph(self, graph: OpGraph) -> None:
        """Raise :class:`InputError` unless ``graph`` is the model this plan was made for."""
        if self.model_sha256 and graph.source_sha256 and self.model_sha256 != graph.source_sha256:
            raise InputError(
                f"the plan was made for a different file (sha256 {self.model_sha256[:12]}..., this model "
                f"{graph.source_sha256[:12]}...); plan this model again"
            )
        names = tuple(op.name for op in graph.ops)
        if names != tuple(op.name for op in self.ops):
            raise InputError(
                f"the plan's {len(self.ops)} ops do not match the model's {len(names)} ops; import the model "
                "with the same --dim values (and planner version) and plan it again"
            )


@cache
def plan_schema() -> dict[str, Any]:
    """The JSON Schema of the generic plan (``exporters/plan.schema.json``)."""
    return json.loads(_SCHEMA_PATH.read_text())


def _link(link: Link) -> dict[str, Any]:
    return {
        "name": link.name,
        "bandwidth_bytes_per_s": float(link.bandwidth_bytes_per_s),
        "latency_s": float(link.latency_s),
        "collective_efficiency": float(link.collective_efficiency),
    }


def _breakdown(value: TimeBreakdown | MemoryBreakdown | None, keys: tuple[str, ...]) -> dict[str, float] | None:
    if value is None:
        return None
    return {key: float(getattr(value, key)) for key in keys}


_MEMORY_KEYS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes")


def _memory_breakdown(memory: MemoryBreakdown | None) -> dict[str, float] | None:
    """A memory breakdown in bytes whose parts add up to its total: the graph buffers only where a plan holds them,
    so files of plans without per-layer CUDA graphs read as before."""
    parts = _breakdown(memory, _MEMORY_KEYS)
    if parts is not None and memory is not None and memory.graph_buffers_bytes:
        parts["graph_buffers_bytes"] = float(memory.graph_buffers_bytes)
    if parts is not None and memory is not None and memory.nccl_bytes:  # objectives.nccl_memory, where a plan holds them
        parts["nccl_bytes"] = float(memory.nccl_bytes)
    return parts


def _pipeline_section(pipeline: PipelineSpec | None) -> dict[str, Any] | None:
    if pipeline is None:
        return None
    return {
        "pp": pipeline.pp,
        "devices_per_stage": pipeline.devices_per_stage,
        "schedule": pipeline.schedule,
        "chunks": pipeline.chunks,
        "micro_batch": pipeline.micro_batch,
        "micro_batches": pipeline.micro_batches,
        "global_batch": pipeline.global_batch,
        "zero_stage": pipeline.zero_stage,
        "recompute": pipeline.recompute,
        # a model without repeated blocks has no layers to count: absent, not "[0]" (issue 25, task H2)
        **({"num_layers": pipeline.num_layers, "layers_per_stage": list(pipeline.layers_per_stage)}
           if pipeline.num_layers else {}),
        "pipeline_s": float(pipeline.pipeline_s),
        "bubble_s": float(pipeline.bubble_s),
        "p2p_s": float(pipeline.p2p_s),
        "bubble_fraction": float(pipeline.bubble_fraction),
        "stages": [
            {
                "index": stage.index,
                "layers": [int(stage.layers[0]), int(stage.layers[1])],
                "ops": [int(i) for i in stage.ops],
                "forward_s": float(stage.forward_s),
                "backward_s": float(stage.backward_s),
                "grad_sync_s": float(stage.grad_sync_s),
                "in_flight": float(stage.in_flight),
                "memory_bytes": float(stage.memory.total_bytes) if stage.memory is not None else None,
                "memory": _memory_breakdown(stage.memory),
            }
            for stage in pipeline.stages
        ],
    }


def _ops_section(plan_input: PlanInput) -> list[dict[str, Any]]:
    """One entry per op: its configuration row, copies, and each dim's split factor (within and across nodes)."""
    ops = []
    for index, (op, space, row) in enumerate(zip(plan_input.graph.ops, plan_input.spaces, plan_input.strategy.choice)):
        factors = dict(zip(space.dim_names, space.factors[row].tolist()))
        inter = dict(zip(space.dim_names, space.inter_factors[row].tolist()))
        copies = {"count": int(space.replica_counts[row]), "inter": int(space.inter_replica_counts[row])}
        ops.append(
            {
                "index": index,
                "name": op.name,
                "kind": op.kind,
                "op_type": op.op_type,
                "module_path": op.module_path,
                "onnx_nodes": list(op.onnx_nodes),
                "config": int(row),
                **({"replicas": copies} if copies["count"] > 1 else {}),
                "dims": [
                    {"name": d.name, "size": int(d.size), "factor": int(factors.get(d.name, 1)), "inter": int(inter.get(d.name, 1))}
                    for d in op.dims
                ],
            }
        )
    return ops


_DEVICE_DEFAULTS = {f.name: f.default for f in fields(Device)
                    if f.name not in ("name", "peak_flops", "memory_bytes", "memory_bandwidth_bytes_per_s", "source")}
"""Every other priced :class:`~planner.core.cluster.Device` field with its default: a plan records those
that differ from it (a preset's fitted host costs and ``matmul_efficiency``, a cluster file's kernel and
collective overheads), so that ``planner explain`` prices the plan on the device it was priced on."""


def _cluster_section(cluster: Cluster) -> dict[str, Any]:
    """The devices, their preset's figures and both links."""
    return {
        "devices": cluster.devices,
        "nodes": cluster.nodes,
        "devices_per_node": cluster.devices_per_node,
        "device": {
            "name": cluster.device.name,
            "memory_bytes": int(cluster.device.memory_bytes),
            "memory_bandwidth_bytes_per_s": float(cluster.device.memory_bandwidth_bytes_per_s),
            "peak_flops": {k: float(v) for k, v in cluster.device.peak_flops.items()},
            # fixed costs and fitted efficiencies that are not the defaults (h100-sxm's matmul_efficiency
            # 0.616, a100-80gb's host costs), so that `planner explain` prices the plan again as it was priced
            **{k: float(getattr(cluster.device, k)) for k, default in _DEVICE_DEFAULTS.items()
               if getattr(cluster.device, k) != default},
        },
        "intra_link": _link(cluster.intra_link),
        "inter_link": _link(cluster.inter_link),
        # NCCL_BUFFSIZE where it is not NCCL's default (objectives.nccl_memory), so the plan prices again alike
        **({"nccl_buffsize_bytes": int(cluster.nccl_buffsize_bytes)}
           if cluster.nccl_buffsize_bytes != Cluster.__dataclass_fields__["nccl_buffsize_bytes"].default else {}),
    }


def _training_section(settings: TrainingSettings) -> dict[str, Any]:
    """Precision, optimizer, ZeRO stage and recomputation, plus the optional keys a plan was priced with."""
    return {
        "precision": settings.precision,
        "optimizer": settings.optimizer,
        "zero_stage": settings.zero_stage,
        "recompute": settings.recompute,
        # the execution model it was priced under (objectives.execution), when there is one
        **({"engine": settings.engine, "attention": settings.attention}
           if settings.engine is not None or settings.attention is not None else {}),
        # priced with dropout masks, or without communication overlap (absent: no dropout, overlapped)
        **({"dropout": True} if settings.dropout else {}),
        **({"overlap": False} if not settings.overlap else {}),
        # tensor-parallel communication under the GEMMs (objectives.tp_overlap); absent: not overlapped
        **({"tp_comm_overlap": True} if settings.tp_comm_overlap else {}),
        # how (objectives.tp_overlap): torchtitan's micro-pipelined async TP; absent: Megatron-LM's userbuffers
        **({"tp_overlap_method": settings.tp_overlap_method}
           if settings.tp_comm_overlap and settings.tp_overlap_method != "userbuffers" else {}),
        # the interleaved schedule's transfers overlapped (true) or waited (false) as resolved for the launcher
        # (Target.priced_p2p_overlap: Megatron-LM's default with model chunks); absent: unresolved, priced waited
        **({"p2p_overlap": settings.p2p_overlap} if settings.p2p_overlap is not None else {}),
        # each micro-batch's forward and backward replayed as one CUDA graph (torchtitan at pp = 1); absent: not
        **({"cuda_graphs": True} if settings.cuda_graphs else {}),
        **({"cuda_graph_scope": "layers"} if settings.cuda_graphs and settings.cuda_graph_scope == "layers" else {}),
        # FP8 linear layers and their scaling recipe (objectives.precision); absent: none
        **({"fp8": settings.fp8} if settings.fp8 is not None else {}),
        # FP8 weights all-gathered in FP8 under ZeRO (Megatron-LM's --fp8-param-gather); absent: in bf16
        **({"fp8_param_gather": True} if settings.gathers_fp8 else {}),
        # CPU offload (objectives.offload); absent: none
        **({"offload": settings.offload} if settings.offload != "none" else {}),
        # HSDP's shard group (TrainingSettings.dp_shard); absent: ZeRO over every data-parallel rank
        **({"hsdp_shard": settings.dp_shard} if settings.dp_shard is not None else {}),
        # ZeRO++'s hpZ group (TrainingSettings.hpz_partition); absent: none
        **({"hpz_partition": settings.hpz_partition} if settings.hpz_partition is not None else {}),
        # FSDP2's reshard_after_forward policy at ZeRO-3 (torchtitan's names); absent: default
        **({"reshard_after_forward": settings.reshard_after_forward}
           if settings.reshard_after_forward != "default" and settings.zero_stage == 3 else {}),
        # ZeRO-3 gathered per sub-module under these bounds (DeepSpeed's); absent: per block (FSDP2)
        **({"zero3_gather": asdict(settings.zero3_gather)}
           if settings.zero3_gather is not None and settings.zero_stage == 3 else {}),
        # linear layers keep their sequence-parallel input shard (Megatron-Core's); absent: the gathered input
        **({"sequence_shard_saved": True} if settings.sequence_shard_saved else {}),
        # gated MLPs keep fc1's output only (Megatron-Core's fused SwiGLU); absent: the SiLU's output too
        **({"fused_swiglu": True} if settings.fused_swiglu else {}),
        # eager bf16 modules under an FSDP2 MixedPrecisionPolicy, no torch.autocast (Target.autocast_zero); absent: autocast
        **({"autocast": False} if not settings.autocast else {}),
        # a launcher's bf16 optimizer keeps a gradient accumulator (DeepSpeed's BF16_Optimizer); absent: none
        **({"grad_accumulator_bytes": settings.grad_accumulator_bytes} if settings.grad_accumulator_bytes else {}),
        # ZeRO 0-2 synchronised as a launcher other than Megatron-LM runs it (DeepSpeed's); absent: Megatron-LM's
        **({"zero_sync": asdict(settings.zero_sync)} if settings.zero_sync is not None and settings.zero_stage in ZERO_SYNC_STAGES else {}),
        # MoE only (objectives.moe): the expert-parallel degree and capacity factor it was priced with
        **({"expert_parallel": settings.expert_parallel, "capacity_factor": settings.capacity_factor}
           if settings.expert_parallel > 1 or settings.capacity_factor != 1.0 else {}),
    }


def write_plan(plan_input: PlanInput) -> dict[str, Any]:
    """The generic plan document of one strategy, validated against the schema.

    Parameters
    ----------
    plan_input:
        The strategy and its context.

    Returns
    -------
    dict
        A JSON-ready document (``json.dump`` it, or use :func:`save_plan`).
    """
    graph, strategy = plan_input.graph, plan_input.strategy
    degrees = strategy_degrees(graph, plan_input.spaces, strategy.choice)
    document = {
        "format": FORMAT,
        "version": VERSION,
        "minor_version": MINOR_VERSION,
        "planner_version": plan_input.planner_version,
        "cost_model": plan_input.cost_model,
        "model": {
            "name": graph.name,
            "sha256": graph.source_sha256,
            "source_path": graph.source_path,
            "dims": {k: int(v) for k, v in graph.dim_bindings.items()},
            "parameter_count": int(graph.parameter_count),
            "num_ops": len(graph.ops),
        },
        "cluster": _cluster_section(plan_input.cluster),
        "training": _training_section(plan_input.settings),
        "batch": {
            "micro_batch": plan_input.samples_per_pass,
            "global_batch": plan_input.samples_per_step,
            "grad_accum": plan_input.grad_accum,
            **({"coupling": coupled} if (coupled := contrastive_note(plan_input)) else {}),
        },
        "objectives": {
            "time_s": float(strategy.time_s),
            "memory_bytes": float(strategy.memory_bytes),
            "time": _breakdown(strategy.time, ("compute_s", "intra_op_comm_s", "redistribution_s", "grad_sync_s")),
            "memory": _memory_breakdown(strategy.memory),
        },
        "mesh": {
            "devices_used": degrees.devices_used,
            "dp": degrees.dp,
            "tp": degrees.tp,
            "cp": degrees.cp,  # the sequence split, never counted in tp (absent in files before it: 1)
            "pp": plan_input.pipeline.pp if plan_input.pipeline is not None else 1,
            "uniform_share": min(1.0, max(0.0, degrees.share)),
            "layouts": degrees.layouts,
            "summary": degrees.summary,
        },
        "ops": _ops_section(plan_input),
        "pipeline": _pipeline_section(plan_input.pipeline),
    }
    _validate(document, where="the plan being written")
    return document


def _validate(document: Any, *, where: str) -> None:
    validator = jsonschema.Draft202012Validator(plan_schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise InputError(
            f"{where} is not a valid planner plan at {path}: {error.message}; "
            "re-export it with `planner plan ... --export generic`"
        )


def save_plan(plan_input: PlanInput, path: str | Path) -> dict[str, Any]:
    """Write the generic plan of ``plan_input`` to ``path`` (UTF-8 JSON); returns the document."""
    document = write_plan(plan_input)
    Path(path).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return document


def plan_from_dict(data: Any, *, where: str = "the plan") -> PlanDocument:
    """Validate a parsed plan document and wrap it (see :func:`read_plan`)."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise InputError(f"{where} is not a planner plan (no \"format\": \"{FORMAT}\"); pass a file written by --export generic")
    version = data.get("version")
    if version != VERSION:
        raise InputError(
            f"{where} has plan version {version!r}, this planner reads version {VERSION}; "
            "re-export the plan with this planner (`planner plan ... --export generic`)"
        )
    minor = data.get("minor_version", 0)
    if isinstance(minor, int) and minor > MINOR_VERSION:
        raise InputError(
            f"{where} has plan version {VERSION}.{minor}, newer than this planner's {VERSION}.{MINOR_VERSION}; "
            "upgrade the planner or re-export the plan with this one"
        )
    _validate(data, where=where)
    ops = []
    for entry in data["ops"]:
        dims = entry["dims"]
        ops.append(
            PlanOp(
                index=entry["index"],
                name=entry["name"],
                kind=entry["kind"],
                op_type=entry["op_type"],
                module_path=entry["module_path"],
                onnx_nodes=tuple(entry["onnx_nodes"]),
                config=entry["config"],
                dims={d["name"]: d["size"] for d in dims},
                splits={d["name"]: d["factor"] for d in dims if d["factor"] > 1},
                inter_splits={d["name"]: d["inter"] for d in dims if d["inter"] > 1},
                # before minor version 2 copies were not recorded: an absent entry then says nothing
                replicas=int(entry.get("replicas", {}).get("count", 1)) if "replicas" in entry or (isinstance(minor, int) and minor >= 2) else None,
                inter_replicas=int(entry.get("replicas", {}).get("inter", 1)),
            )
        )
    return PlanDocument(data=data, ops=tuple(ops))


_MAX_PLAN_BYTES = 256 << 20
"""Largest plan file read (bytes): a plan of 100,000 ops is a few tens of MiB."""


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a plan can hold")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


def read_plan(path: str | Path) -> PlanDocument:
    """Read and validate a generic plan file.

    Raises
    ------
    InputError
        When the file is missing, not JSON, of another format or version, or breaks the schema;
        the message says how to get a valid one.
    """
    path = Path(path)
    if path.exists() and not path.is_file():  # a FIFO would block, /dev/zero never end
        raise InputError(f"plan file {path} is not a regular file; pass the plan's JSON file")
    if path.is_file() and path.stat().st_size > _MAX_PLAN_BYTES:
        raise InputError(f"plan file {path} is over {_MAX_PLAN_BYTES >> 20} MiB, too large for a plan; pass the plan's JSON file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"plan file {path} not found; write one with `planner plan ... --export generic`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read plan file {path} ({exc.__class__.__name__}); check the path and permissions") from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"plan file {path} is not JSON (line {exc.lineno}: {exc.msg}); re-export it with --export generic"
        ) from None
    except (ValueError, RecursionError) as exc:  # NaN/Infinity, a 5000-digit integer, 200k nested '['
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise InputError(f"plan file {path} is not a plan ({reason}); re-export it with --export generic") from None
    return plan_from_dict(data, where=f"plan file {path}")
