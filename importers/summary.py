"""A model summary for ``planner inspect``: sizes, FLOPs, blocks and unsupported ops of an OpGraph.

Definitions (all at the graph's bound dims):

* ``parameter_count``: trainable parameter elements, tied weights once (:attr:`OpGraph.parameter_count`).
* ``forward_flops``: sum of the coarse ops' forward FLOPs (a multiply-add is 2).
* ``training_flops``: forward + backward, each op's backward being ``backward_flops_factor`` times
  its forward (2 for matmul-like ops, 1 otherwise), so about 3x forward for a transformer.
* ``activation_bytes``: bytes of every op output tensor, each counted once: the forward pass's
  activations if nothing were freed (an upper bound on what training keeps for backward).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from planner.core.graph import OpGraph

__all__ = ["BlockSummary", "OpaqueSummary", "ModelSummary", "summarize"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockSummary:
    """One group of repeated blocks."""

    name: str
    count: int
    """Number of instances."""
    ops_per_block: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OpaqueSummary:
    """Ops of one type that the importer could not analyse (replicated only)."""

    op_type: str
    count: int
    nodes: tuple[str, ...]
    """Names of the coarse ops (their main ONNX node)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSummary:
    """What ``planner inspect`` shows about an imported model (see module docstring)."""

    name: str
    raw_node_count: int
    """ONNX nodes in the file."""
    coarse_op_count: int
    """Ops after coarsening (what the search sees)."""
    raw_op_types: Mapping[str, int] = field(default_factory=dict)
    """ONNX op type -> node count, most frequent first."""
    op_kinds: Mapping[str, int] = field(default_factory=dict)
    """Coarse op kind -> count."""
    parameter_count: int = 0
    parameter_bytes: int = 0
    forward_flops: float = 0.0
    training_flops: float = 0.0
    activation_bytes: int = 0
    dim_bindings: Mapping[str, int] = field(default_factory=dict)
    blocks: tuple[BlockSummary, ...] = ()
    opaque: tuple[OpaqueSummary, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the same keys as the fields.

        Examples
        --------
        >>> s = ModelSummary(name="m", raw_node_count=3, coarse_op_count=1,
        ...                  blocks=(BlockSummary(name="h", count=2, ops_per_block=5),))
        >>> s.to_json()["blocks"]
        [{'name': 'h', 'count': 2, 'ops_per_block': 5}]
        """
        return {
            "name": self.name,
            "raw_node_count": self.raw_node_count,
            "coarse_op_count": self.coarse_op_count,
            "raw_op_types": dict(self.raw_op_types),
            "op_kinds": dict(self.op_kinds),
            "parameter_count": self.parameter_count,
            "parameter_bytes": self.parameter_bytes,
            "forward_flops": self.forward_flops,
            "training_flops": self.training_flops,
            "activation_bytes": self.activation_bytes,
            "dim_bindings": dict(self.dim_bindings),
            "blocks": [
                {"name": b.name, "count": b.count, "ops_per_block": b.ops_per_block} for b in self.blocks
            ],
            "opaque": [{"op_type": o.op_type, "count": o.count, "nodes": list(o.nodes)} for o in self.opaque],
            "warnings": list(self.warnings),
        }


def summarize(graph: OpGraph) -> ModelSummary:
    """Summarise an imported model (see module docstring for the definitions).

    Parameters
    ----------
    graph:
        An op graph from :func:`importers.import_model`.

    Returns
    -------
    ModelSummary

    Examples
    --------
    >>> from planner.core.graph import IterDim, Op, OpGraph, Tensor, TensorAccess
    >>> op = Op(name="fc", kind="matmul", op_type="MatMul",
    ...         dims=(IterDim(name="m", size=8), IterDim(name="n", size=4), IterDim(name="k", size=2, kind="reduction")),
    ...         inputs=(TensorAccess(tensor="x", axes=(("m",), ("k",))), TensorAccess(tensor="w", axes=(("k",), ("n",)))),
    ...         outputs=(TensorAccess(tensor="y", axes=(("m",), ("n",))),), flops=128.0)
    >>> tensors = {"x": Tensor(name="x", shape=(8, 2), dtype="float32", role="input"),
    ...            "w": Tensor(name="w", shape=(2, 4), dtype="float32", role="parameter"),
    ...            "y": Tensor(name="y", shape=(8, 4), dtype="float32", role="activation", producer="fc")}
    >>> s = summarize(OpGraph(name="tiny", ops=(op,), tensors=tensors, edges=(), raw_node_count=1,
    ...                       raw_op_types={"MatMul": 1}))
    >>> s.parameter_count, s.forward_flops, s.training_flops, s.activation_bytes
    (8, 128.0, 384.0, 128)
    """
    opaque: dict[str, list[str]] = {}
    for op in graph.opaque_ops:
        opaque.setdefault(op.op_type, []).append(op.name)
    return ModelSummary(
        name=graph.name,
        raw_node_count=graph.raw_node_count,
        coarse_op_count=len(graph.ops),
        raw_op_types=dict(Counter(graph.raw_op_types).most_common()),
        op_kinds=dict(Counter(op.kind for op in graph.ops).most_common()),
        parameter_count=graph.parameter_count,
        parameter_bytes=sum(t.num_bytes for t in graph.parameters),
        forward_flops=graph.forward_flops(),
        training_flops=graph.training_flops(),
        activation_bytes=sum(t.num_bytes for t in graph.tensors.values() if t.role == "activation"),
        dim_bindings=dict(graph.dim_bindings),
        blocks=tuple(
            BlockSummary(name=b.name, count=len(b.instances), ops_per_block=len(b.instances[0]) if b.instances else 0)
            for b in graph.blocks
        ),
        opaque=tuple(
            OpaqueSummary(op_type=t, count=len(names), nodes=tuple(names)) for t, names in sorted(opaque.items())
        ),
        warnings=tuple(graph.warnings),
    )
