r"""The state the coarsening stages share (:class:`_Model`: nodes, shapes, value classes, views,
rules, groups) and the coarse op under construction (:class:`_Group`).

Built once per import by :func:`importers.coarsen.build_op_graph` from a shaped model
(:class:`~importers.shapes.ShapedModel`); nodes are kept in topological order (:func:`_topological`)
with unique names (:func:`_unique_names`). Module paths of nodes (:func:`module_path_of`) come from
exporter metadata or TorchScript-style node names.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from importers.op_rules import RuleResult, ViewMap
from importers.shapes import ShapedModel
from planner.core.graph import NodeSpec

__all__ = ["module_path_of", "Axes"]

Axes = tuple[tuple[str, ...], ...]

_FLOAT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16"})
_DEFAULT_DOMAINS = ("", "ai.onnx")


def module_path_of(node: onnx.NodeProto) -> str | None:
    """Module path of a node from exporter metadata or a TorchScript-style node name.

    Examples
    --------
    >>> n = helper.make_node("MatMul", ["a", "b"], ["c"], name="/transformer/h.0/attn/MatMul")
    >>> module_path_of(n)
    'transformer.h.0.attn'
    >>> n = helper.make_node("MatMul", ["a", "b"], ["c"], name="node_MatMul_3")
    >>> helper.set_metadata_props(n, {"pkg.torch.onnx.name_scopes":
    ...     "['', 'transformer', 'transformer.h.0', 'transformer.h.0.attn', 'matmul_3']"})
    >>> module_path_of(n)
    'transformer.h.0.attn'
    """
    props = {p.key: p.value for p in node.metadata_props}
    scopes = props.get("pkg.torch.onnx.name_scopes")
    if scopes:
        path = _path_from_scopes(scopes)
        if path is not None:
            return path or None
    namespace = props.get("namespace")
    if namespace:
        # "GPT2LMHeadModel: ...Model/transformer: ...GPT2Model/transformer.h.0: ...Block/..."
        last = namespace.split("/")[-1]
        name = last.split(":")[0].strip()
        if name and " " not in name:
            return name
    if node.name.startswith("/"):
        parts = [p for p in node.name.split("/") if p]
        if len(parts) > 1:
            return ".".join(parts[:-1])
    return None


def _path_from_scopes(text: str) -> str | None:
    """Module path from torch's ``name_scopes``: ``['', 'transformer', 'transformer.h.0', 'view_1']``.

    The last entry is the node's own (FX) name; the entries before it are the enclosing modules,
    each written as its full path (older exporters: its local name, joined here with dots).
    """
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        scopes = [s.strip(" '\"") for s in text.strip("[]").split(",")]
    if not isinstance(scopes, (list, tuple)) or not scopes:
        return None
    modules = [str(s) for s in scopes[:-1] if str(s) and not str(s).startswith("_empty_nn_module_stack")]
    if not modules:
        return ""
    if all(modules[i + 1].startswith(modules[i] + ".") for i in range(len(modules) - 1)):
        return modules[-1]
    return ".".join(modules)


# --------------------------------------------------------------------------------------------
# Internal model
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Group:
    """A coarse op under construction: a main node plus the nodes fused into it."""

    main: int
    result: RuleResult
    members: list[int]
    value_axes: dict[str, Axes]
    extra_inputs: list[tuple[str, Axes]] = field(default_factory=list)
    flops: float = 0.0
    fused_pointwise: int = 0
    kind: str = ""
    spec_override: NodeSpec | None = None
    seed: str | None = None


class _Model:
    """Everything the stages share: nodes, shapes, value classes, views, rules, groups."""

    def __init__(self, shaped: ShapedModel) -> None:
        self.shaped = shaped
        graph = shaped.model.graph
        self.graph = graph
        self.opset = 0
        for entry in shaped.model.opset_import:
            if entry.domain in _DEFAULT_DOMAINS:
                self.opset = int(entry.version)
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        for sparse in graph.sparse_initializer:
            self.initializers.setdefault(sparse.values.name, sparse.values)
        self.inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.outputs = {o.name for o in graph.output}
        self.nodes: list[onnx.NodeProto] = _topological(graph)
        self.names = _unique_names(self.nodes)
        self.shapes: Mapping[str, tuple[int, ...]] = shaped.shapes
        self.dtypes: Mapping[str, str] = shaped.dtypes
        self.constants: dict[str, np.ndarray] = dict(shaped.constants)
        self.consumers: dict[str, list[tuple[int, int]]] = {}
        self.producer: dict[str, tuple[int, int]] = {}
        for index, node in enumerate(self.nodes):
            for position, name in enumerate(node.input):
                if name:
                    self.consumers.setdefault(name, []).append((index, position))
            for position, name in enumerate(node.output):
                if name:
                    self.producer[name] = (index, position)
        self.status: dict[str, str] = {}
        self.parameters: set[str] = set()
        self.aliases: dict[str, str] = {}
        """Duplicated copy of a tied weight -> the canonical parameter."""
        self.shared_copies: dict[str, str] = {}
        """A copy of a parameter with the same axes (one module called twice) -> the parameter; ops
        read the parameter in its place (:mod:`importers.build_ops`)."""
        self.part_views: dict[str, tuple[str, tuple[int | None, ...]]] = {}
        """A part of a parameter (slice, split, gather, reordering concat) -> (parameter, parameter
        axis of each of its axes)."""
        self.views: dict[str, ViewMap] = {}
        self.view_nodes: set[int] = set()
        self.compute: list[int] = []
        self.rules: dict[int, RuleResult] = {}
        self.warnings: list[str] = list(shaped.warnings)
        self.opaque: dict[str, list[str]] = {}
        self.baked: list[str] = []
        """Reshapes whose element counts disagree (lengths baked in by the exporter)."""
        self._shape_cache: dict[str, tuple[int, ...]] = {}

    def shape(self, name: str) -> tuple[int, ...] | None:
        if not name:
            return None
        cached = self._shape_cache.get(name)
        if cached is not None:  # every stage asks again; converting each time was a tenth of an import
            return cached
        shape = self.shapes.get(name)
        if shape is None and name in self.initializers:
            shape = tuple(int(d) for d in self.initializers[name].dims)
        if shape is None and name in self.constants:
            shape = tuple(self.constants[name].shape)
        if shape is None:
            return None  # not cached: a constant folded later may still give it a shape
        result = self._shape_cache[name] = tuple(int(d) for d in shape)
        return result

    def dtype(self, name: str) -> str:
        dtype = self.dtypes.get(name)
        if dtype is None and name in self.initializers:
            dtype = _np_dtype(self.initializers[name].data_type)
        return dtype or "float32"

    def constant(self, name: str) -> np.ndarray | None:
        """Value of a constant known at import time (small inline initializers included)."""
        if name in self.constants:
            return self.constants[name]
        tensor = self.initializers.get(name)
        if tensor is not None and not _is_external(tensor) and _tensor_numel(tensor) <= 4096:
            try:
                value = numpy_helper.to_array(tensor)
            except Exception:
                return None
            self.constants[name] = value
            return value
        return None


def _np_dtype(elem_type: int) -> str | None:
    try:
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    except Exception:
        try:
            return helper.tensor_dtype_to_np_dtype(elem_type).name  # type: ignore[union-attr]
        except Exception:
            return None


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _tensor_numel(tensor: onnx.TensorProto) -> int:
    return math.prod(int(d) for d in tensor.dims)


def _topological(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes in topological order (the file's order when it already is one, as ONNX requires)."""
    nodes = list(graph.node)
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    produced: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            produced[name] = index
    in_order = True
    seen = set(known)
    for node in nodes:
        if any(name not in seen and name in produced for name in node.input):
            in_order = False
            break
        seen.update(node.output)
    if in_order:
        return nodes
    indegree = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        for name in set(node.input):
            source = produced.get(name)
            if source is not None and source != index:
                indegree[index] += 1
                users.setdefault(source, []).append(index)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    order: list[int] = []
    while ready:
        ready.sort(reverse=True)
        index = ready.pop()
        order.append(index)
        for user in users.get(index, ()):
            indegree[user] -= 1
            if indegree[user] == 0:
                ready.append(user)
    order += [i for i in range(len(nodes)) if i not in set(order)]  # cycles: keep file order
    return [nodes[i] for i in order]


def _unique_names(nodes: Sequence[onnx.NodeProto]) -> list[str]:
    names: list[str] = []
    used: set[str] = set()
    for index, node in enumerate(nodes):
        base = node.name or f"{node.op_type}_{index}"
        name = base
        counter = 1
        while name in used:
            name = f"{base}_{counter}"
            counter += 1
        used.add(name)
        names.append(name)
    return names
