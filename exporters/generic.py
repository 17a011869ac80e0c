"""The generic plan JSON: how every operator is split, with the model, cluster, settings and costs.

The document is versioned (``"format": "planner-plan", "version": 1``) and checked against the JSON
Schema shipped next to this module (``plan.schema.json``) both when written and when read, so a file
that loads is a file every later stage can trust. Per op it records the configuration index (the row
of the op's :class:`~planner.core.configs.ConfigSpace`) and, readable without the planner, every
iteration dim with its size, split factor and the part of that factor that crosses nodes.

:class:`PlanInput` is what every exporter reads: core types only (never the ONNX file).
"""

from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Mapping

import jsonschema

from exporters._common import strategy_degrees
from exporters._common import graph_batch_size
from planner.core.cluster import Cluster, Link
from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import TrainingSettings
from planner.core.strategy import MemoryBreakdown, Strategy, TimeBreakdown

__all__ = [
    "FORMAT",
    "VERSION",
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
_SCHEMA_PATH = Path(__file__).with_name("plan.schema.json")


def _planner_version() -> str:
    try:
        return importlib.metadata.version("planner")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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
    return {"name": link.name, "bandwidth_bytes_per_s": float(link.bandwidth_bytes_per_s), "latency_s": float(link.latency_s)}


def _breakdown(value: TimeBreakdown | MemoryBreakdown | None, keys: tuple[str, ...]) -> dict[str, float] | None:
    if value is None:
        return None
    return {key: float(getattr(value, key)) for key in keys}


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
    graph, cluster, settings, strategy = plan_input.graph, plan_input.cluster, plan_input.settings, plan_input.strategy
    degrees = strategy_degrees(graph, plan_input.spaces, strategy.choice)
    ops = []
    for index, (op, space, row) in enumerate(zip(graph.ops, plan_input.spaces, strategy.choice)):
        factors = dict(zip(space.dim_names, space.factors[row].tolist()))
        inter = dict(zip(space.dim_names, space.inter_factors[row].tolist()))
        ops.append(
            {
                "index": index,
                "name": op.name,
                "kind": op.kind,
                "op_type": op.op_type,
                "module_path": op.module_path,
                "onnx_nodes": list(op.onnx_nodes),
                "config": int(row),
                "dims": [
                    {"name": d.name, "size": int(d.size), "factor": int(factors.get(d.name, 1)), "inter": int(inter.get(d.name, 1))}
                    for d in op.dims
                ],
            }
        )
    document = {
        "format": FORMAT,
        "version": VERSION,
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
        "cluster": {
            "devices": cluster.devices,
            "nodes": cluster.nodes,
            "devices_per_node": cluster.devices_per_node,
            "device": {
                "name": cluster.device.name,
                "memory_bytes": int(cluster.device.memory_bytes),
                "memory_bandwidth_bytes_per_s": float(cluster.device.memory_bandwidth_bytes_per_s),
                "peak_flops": {k: float(v) for k, v in cluster.device.peak_flops.items()},
            },
            "intra_link": _link(cluster.intra_link),
            "inter_link": _link(cluster.inter_link),
        },
        "training": {
            "precision": settings.precision,
            "optimizer": settings.optimizer,
            "zero_stage": settings.zero_stage,
            "recompute": settings.recompute,
        },
        "batch": {
            "micro_batch": plan_input.samples_per_pass,
            "global_batch": plan_input.samples_per_step,
            "grad_accum": plan_input.grad_accum,
        },
        "objectives": {
            "time_s": float(strategy.time_s),
            "memory_bytes": float(strategy.memory_bytes),
            "time": _breakdown(strategy.time, ("compute_s", "intra_op_comm_s", "redistribution_s", "grad_sync_s")),
            "memory": _breakdown(
                strategy.memory, ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes")
            ),
        },
        "mesh": {
            "devices_used": degrees.devices_used,
            "dp": degrees.dp,
            "tp": degrees.tp,
            "pp": 1,
            "uniform_share": min(1.0, max(0.0, degrees.share)),
            "layouts": degrees.layouts,
            "summary": degrees.summary,
        },
        "ops": ops,
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
            )
        )
    return PlanDocument(data=data, ops=tuple(ops))


def read_plan(path: str | Path) -> PlanDocument:
    """Read and validate a generic plan file.

    Raises
    ------
    InputError
        When the file is missing, not JSON, of another format or version, or breaks the schema;
        the message says how to get a valid one.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"plan file {path} not found; write one with `planner plan ... --export generic`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read plan file {path} ({exc.__class__.__name__}); check the path and permissions") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"plan file {path} is not JSON (line {exc.lineno}: {exc.msg}); re-export it with --export generic"
        ) from None
    return plan_from_dict(data, where=f"plan file {path}")
