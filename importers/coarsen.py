r"""Coarsening: a shaped ONNX graph -> an :class:`~planner.core.graph.OpGraph` of meaningful ops.

Stages, in order (each a function below):

1. **Classify values** (``_classify``, ``_finish_status``): every value is ``const`` (depends only
   on constants, non-trainable initializers and ``Shape`` outputs: the shape-computation subgraphs,
   dropped), ``param`` (a trainable initializer, or a layout view or part of one) or ``act``
   (computed at run time from the graph inputs or parameters).
2. **Parameters** (``_find_parameters``): a float initializer is trainable when its use says so (a
   MatMul/Gemm/Conv weight, an embedding table, a norm scale or bias, a per-channel bias added to an
   activation, an RNN weight), looking through Transpose/Cast/Identity/Reshape/Expand and through
   Slice/Split/Concat of it; buffers the exporter named like buffers (``inv_freq``, ``*_cached``,
   ``running_mean``, masks, position ids) and scalars are not. Tied weights are one initializer used
   by two ops, an ``Identity`` of it, or the TorchScript exporter's transposed copy of a tied
   embedding table (``_find_tied_copies``); aliases go to ``parameter_aliases``. (A BatchNormalization
   the exporter folded into a Conv is an op again before this stage: :mod:`importers.batchnorm`.) What the
   file says beyond a weight's use (torch.export's recorded buffers and parameters, position
   tables, attention biases, folded constants) is settled by :mod:`importers.param_evidence`.
3. **Fold views** (``_fold_views_and_rules``): Reshape/Transpose/Squeeze/Unsqueeze/Flatten/Identity/
   Cast/Expand of an activation or parameter become :class:`~importers.op_rules.views.ViewMap` s;
   ops read the original tensor through them. A view that cannot be folded exactly stays a
   ``data_movement`` op (a Reshape that changes the element count, as when an exporter baked a
   sequence length, is reported). Slices, splits and reordering concats of a weight (fused q/k/v,
   LSTM gates) are *parts* of it (``_fold_weight_part``): the ops using them read the weight.
4. **Rules**: each remaining node gets its iteration space from :mod:`importers.op_rules`.
5. **Decomposed norms** (``_find_norm_regions``): a reduction whose statistics flow back,
   elementwise, into the tensor it reduced (LayerNorm, RMSNorm, L2 norm as Pow/ReduceMean/Add/Sqrt/
   Div/Mul chains; softmax as ReduceMax/Sub/Exp/ReduceSum/Div) becomes one ``norm`` (``softmax``)
   op over its input's axes, 5 FLOPs per element, reported and profiled as ``LayerNormalization``
   (``Softmax``).
6. **Fuse pointwise chains** (``_group``): an elementwise node whose full-size activation inputs all
   come from one op, and whose other activation inputs are smaller (broadcast masks, gates), joins
   that op (bias Add, GELU chains, scale Mul + mask Add after a MatMul, IsNaN/Where after a
   Softmax). One that cannot (its input is a view, like the query scaling after a head split) but
   has a single input and a single consumer joins its consumer instead (a prologue). Elementwise ops
   joining two full-size activations (residual Adds) stay ops.
7. **Build ops** (``_build_op``): accesses through views onto the original tensors; an op dim that
   indexes a view axis made of several original axes is split into sub-dims (a Gemm's ``m`` over a
   ``[batch*seq, hidden]`` reshape becomes ``m_0`` (batch) x ``m_1`` (seq)); batch dims are marked by
   following the graph inputs' batch axes (``_mark_batch``); edges join producers to consumers; ops
   whose node carries no module path take their neighbours' common one (``_infer_module_paths``).

Operand order of an op: the main node's non-constant inputs in node order, then the inputs of the
nodes fused into it. ``Op.node`` describes the main node alone (with ``input_axes``, the dims
indexing its inputs as it sees them, before views are folded).

Everything is linear in the number of nodes (dictionary lookups, one topological pass each).
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from importers.op_rules import VIEW_OPS, NodeContext, RuleResult, ViewMap, apply_rule, axes_of
from importers.op_rules.norm import FLOPS_PER_ELEMENT
from importers.op_rules.reduce import REDUCE_OPS, reduced_axes
from importers.op_rules.views import view_output, view_rule
from importers.param_evidence import weigh_parameter_evidence
from importers.shapes import ShapedModel
from planner.core.graph import Edge, IterDim, NodeSpec, Op, OpGraph, Tensor, TensorAccess

__all__ = ["build_op_graph", "module_path_of", "is_parameter_name"]

Axes = tuple[tuple[str, ...], ...]

_FLOAT_DTYPES = frozenset({"float16", "float32", "float64", "bfloat16"})
_DEFAULT_DOMAINS = ("", "ai.onnx")

# Where an initializer is read as a weight. "strong": only a trainable weight sits there;
# "weak": a bias or scale added to / multiplied with an activation (constants sit there too).
_STRONG_WEIGHT_POSITIONS: dict[str, tuple[int, ...] | None] = {
    "MatMul": (0, 1),
    "Gemm": (0, 1, 2),
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gather": (0,),
    "LayerNormalization": (1, 2),
    "RMSNormalization": (1,),
    "SimplifiedLayerNormalization": (1,),
    "SkipLayerNormalization": (2, 3, 4),
    "SkipSimplifiedLayerNormalization": (2, 3),
    "BatchNormalization": (1, 2),
    "GroupNormalization": (1, 2),
    "InstanceNormalization": (1, 2),
    "Einsum": None,
    "LSTM": (1, 2, 3),
    "GRU": (1, 2, 3),
    "RNN": (1, 2, 3),
    "PRelu": (1,),
    "GatherND": (0,),
    "GatherElements": (0,),
}
_WEAK_WEIGHT_POSITIONS: dict[str, tuple[int, ...] | None] = {
    "Add": (0, 1),
    "Sub": (0, 1),
    "Mul": (0, 1),
    "Concat": None,
    "Where": (1, 2),
}
# Layout ops through which an initializer stays "the same weight" (no cost: a layout choice).
_PARAM_LAYOUT_OPS = frozenset({"Transpose", "Cast", "CastLike", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand"})
# Ops that take parts of a weight (a fused q/k/v projection sliced per head group, LSTM gates):
# followed when deciding whether an initializer is trainable.
_PARAM_PART_OPS = frozenset({"Slice", "Split", "Concat"})

_BUFFER_NAME = re.compile(
    r"(inv_freq|_cached|(^|[._])(cos|sin)([._]|$)|rotary|(^|[._])(causal_)?mask|position_ids|token_type_ids"
    r"|running_mean|running_var|num_batches_tracked|masked_bias|(^|[._])freqs|(^|[._])buffer)",
    re.IGNORECASE,
)
_ANONYMOUS_NAME = re.compile(
    r"^(val_\d+|_val_|onnx::|_tensor_constant|_frozen_param|const_|Constant|/|_v_\d+|scalar_tensor|arg\d|tensor_\d)"
)

_NORM_REDUCES = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "ReduceSumSquare"})
_SHAPE_OPS = frozenset({"Shape", "Size"})


def is_parameter_name(name: str) -> bool:
    """Whether an initializer's name reads like a trainable parameter (not a buffer, not anonymous).

    Examples
    --------
    >>> is_parameter_name("transformer.h.0.attn.c_attn.weight"), is_parameter_name("val_12")
    (True, False)
    >>> is_parameter_name("model.rotary_emb.inv_freq"), is_parameter_name("onnx::MatMul_1234")
    (False, False)
    """
    return not _BUFFER_NAME.search(name) and not _ANONYMOUS_NAME.match(name)


def _is_buffer_name(name: str) -> bool:
    return bool(_BUFFER_NAME.search(name))


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


# --------------------------------------------------------------------------------------------
# 1-2. Value classes and parameters
# --------------------------------------------------------------------------------------------


def _classify(m: _Model) -> None:
    """Runtime dependence (``act``) of every value; initializers are decided by ``_find_parameters``."""
    status = m.status
    for name in m.inputs:
        status[name] = "act"
    for index, node in enumerate(m.nodes):
        outputs = [o for o in node.output if o]
        if node.op_type in _SHAPE_OPS or node.op_type == "Constant":
            kind = "const"
        elif outputs and all(o in m.constants for o in outputs):
            kind = "const"
        elif any(status.get(i) == "act" for i in node.input if i):
            kind = "act"
        else:
            kind = "const"
        for o in outputs:
            status[o] = kind


def _weight_uses(m: _Model, name: str) -> list[tuple[int, int]]:
    """(node, input position) where an initializer is read, looking through layout ops of it."""
    uses: list[tuple[int, int]] = []
    stack = [name]
    seen = {name}
    while stack:
        value = stack.pop()
        for index, position in m.consumers.get(value, ()):
            node = m.nodes[index]
            part = node.op_type in _PARAM_PART_OPS
            if part:
                uses.append((index, position))  # a Concat with an activation is itself a use
            if (node.op_type in _PARAM_LAYOUT_OPS and position == 0) or part:
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        stack.append(out)
            else:
                uses.append((index, position))
    return uses


def _role(table: dict[str, tuple[int, ...] | None], node: onnx.NodeProto, position: int) -> bool:
    if node.domain not in _DEFAULT_DOMAINS and node.domain != "com.microsoft":
        return False
    if node.op_type not in table:
        return False
    positions = table[node.op_type]
    return positions is None or position in positions


def _find_parameters(m: _Model) -> None:
    """Decide which float initializers are trainable parameters (see module docstring)."""
    for name, tensor in m.initializers.items():
        dtype = _np_dtype(tensor.data_type)
        if dtype not in _FLOAT_DTYPES or _is_buffer_name(name):
            continue
        numel = _tensor_numel(tensor)
        named = is_parameter_name(name)
        if numel <= 1 and not _scalar_slope(m, name) and (not named or name in m.constants):
            continue  # a scalar constant (scale, epsilon, fill value)
        trainable = False
        for index, position in _weight_uses(m, name):
            node = m.nodes[index]
            runtime = any(m.status.get(i) == "act" for p, i in enumerate(node.input) if i and p != position)
            if _role(_STRONG_WEIGHT_POSITIONS, node, position):
                if runtime or named:
                    trainable = True
                    break
            elif _role(_WEAK_WEIGHT_POSITIONS, node, position) and runtime:
                shape = [int(d) for d in tensor.dims]
                # A named weight is trainable; an anonymous one only when it is a per-channel vector
                # (a bias or scale): constants with a runtime role (masks) span several axes.
                if named or sum(1 for d in shape if d > 1) == 1:
                    trainable = True
                    break
        if trainable:
            m.parameters.add(name)
    # What the file says beyond a weight's use: the exporter's record, position tables, buffers.
    evidence = weigh_parameter_evidence(
        graph=m.graph, initializers=m.initializers, parameters=frozenset(m.parameters), nodes=m.nodes,
        consumers=m.consumers, status=m.status, shapes=m.shapes, is_named=is_parameter_name,
    )
    m.parameters = (m.parameters | evidence.added) - evidence.dropped
    m.warnings.extend(evidence.warnings)
    _find_tied_copies(m)


def _scalar_slope(m: _Model, name: str) -> bool:
    """A one-element initializer that is a PRelu slope: ``nn.PReLU()`` learns one shared slope."""
    return any(m.nodes[i].op_type == "PRelu" and p == 1 for i, p in _weight_uses(m, name))


_TORCHSCRIPT_FOLDED = re.compile(r"^onnx::")


def _find_tied_copies(m: _Model) -> None:
    """TorchScript's constant-folded transposed copy of a tied embedding table (an LM head).

    The TorchScript exporter folds ``Transpose(weight)`` into a new initializer (``onnx::MatMul_N``)
    even when the weight is also read elsewhere, so a tied output projection (BERT's and GPT-2's LM
    head share the word embeddings) appears twice. The copy is taken for the table when it is the
    table transposed, the table is the only named Gather table of that shape, and the copy's MatMul
    produces a graph output (the logits), and the file holds both weights and they are equal
    (transposed). Without values (a graph-only file) the copy is counted, with a warning that it may be
    tied: an untied LM head of that shape looks the same, and a parameter is never dropped on a guess.
    The dynamo exporter keeps a shared weight shared; its
    anonymous ``val_N`` copies are untied weights and are left alone.
    """
    tables: dict[tuple[int, ...], list[str]] = {}
    for name in m.parameters:
        shape = tuple(int(d) for d in m.initializers[name].dims)
        if len(shape) == 2 and is_parameter_name(name):
            if any(m.nodes[i].op_type == "Gather" and p == 0 for i, p in _weight_uses(m, name)):
                tables.setdefault(shape, []).append(name)
    for name in sorted(m.parameters):
        if not _TORCHSCRIPT_FOLDED.match(name):
            continue
        shape = tuple(int(d) for d in m.initializers[name].dims)
        candidates = tables.get(tuple(reversed(shape)), []) if len(shape) == 2 and shape[0] != shape[1] else []
        uses = _weight_uses(m, name)
        if len(candidates) != 1 or not uses or not all(m.nodes[i].op_type in ("MatMul", "Gemm") for i, _ in uses):
            continue
        if all(_reaches_output(m, m.nodes[i].output[0]) for i, _ in uses):
            copy, table = _inline_values(m.initializers[name]), _inline_values(m.initializers[candidates[0]])
            if copy is None or table is None:
                # No values to compare (a graph-only file): an untied head of that shape (an LSTM
                # LM's decoder) looks the same, so count it and say it may be the tied copy.
                m.warnings.append(
                    f"'{name}' {list(shape)} may be a transposed copy of the tied embedding "
                    f"'{candidates[0]}' (the TorchScript exporter duplicates tied weights), but the "
                    f"file has no values to prove it; it is counted ({math.prod(shape):,} parameters): "
                    "if the model ties them, the true count is that much lower (export with the "
                    "weights, or with dynamo, to decide)"
                )
                continue
            if not np.array_equal(copy, table.T):
                continue  # the weights are in the file and differ: an untied output projection
            m.aliases[name] = candidates[0]
            m.parameters.discard(name)
            m.warnings.append(
                f"'{name}' {list(shape)} is taken as the transposed copy of the tied embedding "
                f"'{candidates[0]}' (the TorchScript exporter duplicates tied weights); it is counted once"
            )


def _inline_values(tensor: onnx.TensorProto) -> np.ndarray | None:
    """An initializer's values when the file holds them inline (``None``: external or stripped)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    try:
        values = numpy_helper.to_array(tensor)
    except (ValueError, TypeError):
        return None
    return values if values.size == math.prod(tensor.dims) and values.size > 0 else None


def _reaches_output(m: _Model, value: str, hops: int = 4) -> bool:
    """Whether ``value`` is a graph output or flows to one through a few single-use nodes."""
    for _ in range(hops + 1):
        if value in m.outputs:
            return True
        users = m.consumers.get(value, [])
        if len(users) != 1:
            return False
        value = m.nodes[users[0][0]].output[0] if m.nodes[users[0][0]].output else ""
    return False


def _finish_status(m: _Model) -> None:
    """Final class of every value: initializers resolved, nodes reading parameters computed."""
    status = m.status
    for name in m.initializers:
        status[name] = "param" if name in m.parameters or name in m.aliases else "const"
    for name in m.inputs:
        status[name] = "act"
    for node in m.nodes:
        outputs = [o for o in node.output if o]
        if node.op_type in _SHAPE_OPS or node.op_type == "Constant" or (outputs and all(o in m.constants for o in outputs)):
            kind = "const"
        elif any(status.get(i) in ("act", "param") for i in node.input if i):
            kind = "act"
        else:
            kind = "const"
        for o in outputs:
            status[o] = kind


# --------------------------------------------------------------------------------------------
# 3-4. Views and rules
# --------------------------------------------------------------------------------------------


def _context(m: _Model, index: int) -> NodeContext:
    node = m.nodes[index]
    attrs = {}
    for attribute in node.attribute:
        try:
            value = helper.get_attribute_value(attribute)
        except Exception:
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        attrs[attribute.name] = value
    constants = {}
    parameters = set()
    for position, name in enumerate(node.input):
        if not name:
            continue
        if m.status.get(name) == "const":
            value = m.constant(name)
            if value is not None:
                constants[position] = value
        elif m.status.get(name) == "param":
            parameters.add(position)
    return NodeContext(
        name=m.names[index],
        op_type=node.op_type,
        domain=node.domain,
        attrs=attrs,
        input_shapes=tuple(m.shape(name) for name in node.input),
        input_dtypes=tuple(m.dtype(name) if name else None for name in node.input),
        output_shapes=tuple(m.shape(name) for name in node.output),
        output_dtypes=tuple(m.dtype(name) if name else None for name in node.output),
        constants=constants,
        parameters=frozenset(parameters),
        opset=m.opset or 18,
    )


def _source_view(m: _Model, name: str) -> ViewMap | None:
    if name in m.views:
        return m.views[name]
    shape = m.shape(name)
    if shape is None:
        return None
    return ViewMap.identity(name, shape)


def _fold_views_and_rules(m: _Model) -> None:
    """Fold view nodes into ViewMaps; give every other runtime node its rule (stages 3-4)."""
    for index, node in enumerate(m.nodes):
        outputs = [o for o in node.output if o]
        if not outputs or m.status.get(outputs[0]) != "act":
            continue
        data = node.input[0] if node.input else ""
        if (
            node.op_type in VIEW_OPS
            and node.domain in _DEFAULT_DOMAINS
            and data
            and m.status.get(data) in ("act", "param")
            and all(m.status.get(i) == "const" for i in node.input[1:] if i)
        ):
            source = _source_view(m, data)
            ctx = _context(m, index)
            folded = view_output(source, ctx) if source is not None else None
            if folded is not None:
                m.views[outputs[0]] = folded
                m.view_nodes.add(index)
                # A view of a parameter is the parameter (layout only).
                m.status[outputs[0]] = m.status[data]
                continue
            in_shape, out_shape = m.shape(data), m.shape(outputs[0])
            if node.op_type == "Reshape" and in_shape is not None and out_shape is not None and math.prod(in_shape) != math.prod(out_shape):
                m.baked.append(f"{m.names[index]} ({list(in_shape)} -> {list(out_shape)})")
            m.rules[index] = replace(view_rule(ctx), view=False)
            m.compute.append(index)
            continue
        if node.domain in _DEFAULT_DOMAINS and _fold_weight_part(m, index):
            continue
        ctx = _context(m, index)
        result = apply_rule(ctx)
        if result.view:
            result = replace(result, view=False)
        m.rules[index] = result
        m.compute.append(index)
        if result.warning:
            key = node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}:{node.op_type}"
            m.opaque.setdefault(key, []).append(m.names[index])


def _weight_root(m: _Model, name: str) -> tuple[str, tuple[int | None, ...]] | None:
    """The parameter a weight value reads and, per axis of the value, the parameter's axis."""
    if name in m.part_views:
        return m.part_views[name]
    if name in m.parameters or name in m.aliases:
        shape = m.shape(name) or ()
        return name, tuple(range(len(shape)))
    view = m.views.get(name)
    if view is None or m.status.get(view.origin) != "param":
        return None
    base = _weight_root(m, view.origin)
    if base is None:
        return None
    root, amap = base
    axis_map: list[int | None] = []
    for j in range(len(view.axes)):
        pieces = view.pieces(j)
        if len(pieces) > 1:
            return None  # a reshape merging weight axes: not a part view
        axis_map.append(amap[pieces[0].origin_axis] if pieces and pieces[0].origin_axis is not None else None)
    return root, tuple(axis_map)


def _fold_weight_part(m: _Model, index: int) -> bool:
    """Slice/Split/Concat/Gather-by-constant of a weight read as the weight (``part_views``).

    A fused q/k/v projection sliced per head group, or LSTM gates reordered by Slice and Concat,
    are parts of one parameter: the ops that read a part read the parameter, each part axis
    indexing the parameter axis it was cut from (a split of a part is a blocked split of the
    whole, as Megatron shards fused q/k/v). Returns False when the node is not such a part.
    """
    node = m.nodes[index]
    op = node.op_type
    if op not in ("Slice", "Split", "Concat", "Gather") or not node.input:
        return False
    outputs = [o for o in node.output if o]
    data_positions = range(len(node.input)) if op == "Concat" else [0]
    roots = []
    for position in data_positions:
        name = node.input[position]
        if not name:
            continue
        status = m.status.get(name)
        if status == "const":
            continue
        if status != "param":
            return False
        root = _weight_root(m, name)
        if root is None:
            return False
        roots.append(root)
    others = [n for p, n in enumerate(node.input) if n and p not in data_positions]
    if not roots or len({r for r in roots}) != 1 or any(m.status.get(n) != "const" for n in others):
        return False
    root, amap = roots[0]
    if op == "Gather":
        indices = m.constant(node.input[1]) if len(node.input) > 1 else None
        if indices is None or indices.ndim != 0:
            return False
        rank = len(m.shape(node.input[0]) or ())
        axis = _attr_int(node, "axis", 0)
        axis = axis + rank if axis < 0 else axis
        amap = amap[:axis] + amap[axis + 1 :]
    for out in outputs:
        if len(m.shape(out) or ()) != len(amap):
            return False
    for out in outputs:
        m.part_views[out] = (root, amap)
        m.status[out] = "param"
    m.view_nodes.add(index)
    return True


def _attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(helper.get_attribute_value(attribute))
    return default


def _origin(m: _Model, name: str) -> str:
    """The stored tensor a value reads (itself unless it is a folded view)."""
    view = m.views.get(name)
    return view.origin if view is not None else name


def _transparent(m: _Model, name: str) -> str:
    """Look through identity views (Cast, Identity, trivial reshapes) to the value they copy."""
    view = m.views.get(name)
    if view is not None and view.is_identity and m.shape(view.origin) == m.shape(name):
        return view.origin
    return name


def _users(m: _Model, name: str) -> list[int]:
    """Nodes reading a value, looking through identity views of it (any depth, no recursion)."""
    result: list[int] = []
    stack: list[tuple[str, int]] = [(name, 0)]  # (value, next consumer position)
    while stack:
        value, start = stack.pop()
        consumers = m.consumers.get(value, ())
        for position in range(start, len(consumers)):
            index = consumers[position][0]
            if index in m.view_nodes:
                out = m.nodes[index].output[0]
                if _transparent(m, out) == value:
                    # Visit the view's readers before this value's later consumers (recursion's order).
                    stack.append((value, position + 1))
                    stack.append((out, 0))
                    break
            result.append(index)
    return result


# --------------------------------------------------------------------------------------------
# 5. Decomposed normalisations
# --------------------------------------------------------------------------------------------


def _act_inputs(m: _Model, index: int) -> list[str]:
    return [name for name in m.nodes[index].input if name and m.status.get(name) == "act"]


def _find_norm_regions(m: _Model) -> dict[int, tuple[list[int], str, str]]:
    """Regions of pointwise + reduce nodes that normalise one tensor: first node -> (nodes, seed, y)."""
    regions: dict[int, tuple[list[int], str, str]] = {}
    claimed: set[int] = set()
    compute = set(m.compute)
    for index in m.compute:
        node = m.nodes[index]
        if index in claimed or node.op_type not in _NORM_REDUCES or node.domain not in _DEFAULT_DOMAINS:
            continue
        if not node.input or m.status.get(node.input[0]) != "act":
            continue
        seed = _norm_seed(m, node.input[0], compute)
        found = _grow_region(m, seed, compute, claimed)
        if found is not None:
            nodes, y = found
            claimed.update(nodes)
            regions[min(i for i in nodes if i in compute)] = (nodes, seed, y)
    return regions


def _norm_seed(m: _Model, value: str, compute: set[int]) -> str:
    """Walk back from a reduction's input through single-use pointwise ops and views."""
    for _ in range(8):
        if len(m.consumers.get(value, ())) != 1 or value in m.outputs:
            return value
        source = m.producer.get(value)
        if source is None:
            return value
        index = source[0]
        if index in m.view_nodes:
            if not m.views[value].is_identity:
                return value
            value = m.nodes[index].input[0]
            continue
        rule = m.rules.get(index)
        acts = _act_inputs(m, index)
        if index in compute and rule is not None and rule.pointwise and len(acts) == 1 and m.shape(acts[0]) == m.shape(value):
            value = acts[0]
            continue
        return value
    return value


def _grow_region(m: _Model, seed: str, compute: set[int], claimed: set[int]) -> tuple[list[int], str] | None:
    seed_shape = m.shape(seed)
    if not seed_shape:
        return None
    rank = len(seed_shape)
    values = {seed}
    members: list[int] = []
    pending = [i for i, _ in m.consumers.get(seed, ())]
    visited: set[int] = set()
    while pending and len(members) < 48:
        index = min(pending)
        pending = [i for i in pending if i != index]
        if index in visited or index in claimed:
            continue
        node = m.nodes[index]
        inputs_act = [n for n in node.input if n and m.status.get(n) == "act"]
        if not inputs_act or not all(n in values for n in inputs_act):
            continue
        out = node.output[0] if node.output else ""
        out_shape = m.shape(out)
        ok = False
        if index in m.view_nodes:
            ok = m.views[out].is_identity and out_shape == m.shape(node.input[0])
        elif index in compute:
            rule = m.rules[index]
            if rule.pointwise and out_shape is not None and len(out_shape) == rank:
                ok = all(a == b or a == 1 for a, b in zip(out_shape, seed_shape))
            elif node.op_type in _NORM_REDUCES and node.domain in _DEFAULT_DOMAINS:
                ok = out_shape is not None and len(out_shape) == rank  # keepdims
        if not ok:
            continue
        visited.add(index)
        members.append(index)
        for o in node.output:
            if o:
                values.add(o)
                pending.extend(i for i, _ in m.consumers.get(o, ()))
    if not any(m.nodes[i].op_type in _NORM_REDUCES for i in members):
        return None
    members.sort()
    candidates = [
        m.nodes[i].output[0] for i in reversed(members) if i not in m.view_nodes and m.shape(m.nodes[i].output[0]) == seed_shape
    ]
    for y in candidates[:3]:
        kept = _ancestors_within(m, y, set(members))
        if len(kept) < 3 or not any(m.nodes[i].op_type in _NORM_REDUCES for i in kept):
            continue
        inside = set(kept)
        escapes = False
        for i in kept:
            for o in m.nodes[i].output:
                if not o or o == y:
                    continue
                if o in m.outputs or any(c not in inside for c, _ in m.consumers.get(o, ())):
                    escapes = True
        if not escapes:
            return sorted(kept), y
    return None


def _ancestors_within(m: _Model, value: str, members: set[int]) -> list[int]:
    result: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        source = m.producer.get(v)
        if source is None or source[0] not in members or source[0] in result:
            continue
        result.add(source[0])
        stack.extend(n for n in m.nodes[source[0]].input if n and m.status.get(n) == "act")
    return sorted(result)


# --------------------------------------------------------------------------------------------
# 6. Groups (coarse ops)
# --------------------------------------------------------------------------------------------


def _broadcast_into(shape: tuple[int, ...], out_shape: tuple[int, ...], out_axes: Axes) -> Axes:
    """Axes of an operand broadcast against an output whose axes are ``out_axes``."""
    offset = len(out_shape) - len(shape)
    axes = []
    for i, size in enumerate(shape):
        j = i + offset
        if 0 <= j < min(len(out_shape), len(out_axes)) and size == out_shape[j] and size > 1:
            axes.append(out_axes[j])
        else:
            axes.append(())
    return tuple(axes)


def _region_group(m: _Model, nodes: list[int], seed: str, y: str) -> _Group:
    seed_shape = m.shape(seed) or ()
    normalized: set[int] = set()
    has_exp = False
    for index in nodes:
        node = m.nodes[index]
        has_exp |= node.op_type == "Exp"
        if node.op_type in _NORM_REDUCES:
            ctx = _context(m, index)
            normalized |= reduced_axes(ctx)
    kind = "softmax" if has_exp else "norm"
    from importers.op_rules._base import DimBuilder  # local: only regions build dims here

    dims = DimBuilder()
    names = tuple(
        dims.add(f"d{i}", size, kind="normalized" if i in normalized else "parallel") for i, size in enumerate(seed_shape)
    )
    seed_axes = axes_of(*names)
    value_axes: dict[str, Axes] = {seed: seed_axes}
    extra: list[tuple[str, Axes]] = []
    for index in nodes:
        node = m.nodes[index]
        for o in node.output:
            if o:
                value_axes[o] = _broadcast_into(m.shape(o) or (), seed_shape, seed_axes)
        out_shape = m.shape(node.output[0]) or ()
        out_axes = value_axes.get(node.output[0], ())
        for name in node.input:
            if name and m.status.get(name) == "param":
                extra.append((name, _broadcast_into(m.shape(name) or (), out_shape, out_axes)))
    first = min(normalized) if normalized else len(seed_shape) - 1
    norm_shape = tuple(seed_shape[first:])
    scale = next((shape for name, _ in extra if (shape := m.shape(name)) is not None), norm_shape)
    spec_type = "Softmax" if kind == "softmax" else "LayerNormalization"
    attrs = (helper.make_attribute("axis", first - len(seed_shape)),)
    spec = NodeSpec(
        op_type=spec_type,
        attributes=tuple(a.SerializeToString() for a in attrs),
        input_shapes=(seed_shape,) if kind == "softmax" else (seed_shape, tuple(scale)),
        input_dtypes=(m.dtype(seed),) if kind == "softmax" else (m.dtype(seed), m.dtype(seed)),
        output_shapes=(seed_shape,),
        output_dtypes=(m.dtype(y),),
        opset=max(m.opset, 17),
        input_axes=(seed_axes,) if kind == "softmax" else (seed_axes, _broadcast_into(tuple(scale), seed_shape, seed_axes)),
        output_axes=(seed_axes,),
    )
    result = RuleResult(
        kind=kind,  # type: ignore[arg-type]
        dims=dims.build(),
        inputs=(),
        outputs=(),
        flops=float(FLOPS_PER_ELEMENT * math.prod(seed_shape)),
    )
    return _Group(
        main=min(i for i in nodes if i not in m.view_nodes),
        result=result,
        members=list(nodes),
        value_axes=value_axes,
        extra_inputs=[(seed, seed_axes)] + extra,
        flops=result.flops,
        kind=kind,
        spec_override=spec,
        seed=seed,
    )


class _Grouping:
    """The state of stages 5-6 while the groups are formed (:func:`_group`): the groups so far,
    which group holds each node and produces each value, the deferred prologues."""

    __slots__ = ("m", "groups", "deps", "value_group", "node_group", "deferred", "chain_memo")

    def __init__(self, m: _Model) -> None:
        self.m = m
        self.groups: list[_Group] = []
        self.deps: list[set[int]] = []
        """Per group, the groups it reads from."""
        self.value_group: dict[str, int] = {}
        self.node_group: dict[int, int] = {}
        self.deferred: dict[str, int] = {}
        """Output value -> pointwise node waiting to be fused forward into its consumer."""
        self.chain_memo: dict[str, tuple[str, ...]] = {}

    def source_group(self, name: str) -> int | None:
        return self.value_group.get(_origin(self.m, name))

    def claim(self, gid: int, index: int) -> None:
        self.node_group[index] = gid
        self.groups[gid].members.append(index)
        if index in self.m.view_nodes:
            return
        for o in self.m.nodes[index].output:
            if o:
                self.value_group[o] = gid

    def read(self, gid: int, name: str, axes: Axes) -> None:
        """The group reads ``name`` with ``axes``: absorb a deferred prologue, else an extra input.

        A prologue's own inputs are read the same way, depth first in input order, with an explicit
        stack: a chain of 100,000 single-use pointwise nodes is one prologue chain, deeper than
        Python's recursion limit.
        """
        m, group, deferred = self.m, self.groups[gid], self.deferred
        stack: list[tuple[str, Axes]] = [(name, axes)]
        while stack:
            value, value_axes = stack.pop()
            if value not in deferred:
                group.extra_inputs.append((value, value_axes))
                other = self.source_group(value)
                if other is not None and other != gid:
                    self.deps[gid].add(other)
                continue
            index = deferred.pop(value)
            node = m.nodes[index]
            out_shape = m.shape(value) or ()
            group.value_axes[value] = value_axes
            self.claim(gid, index)
            group.flops += m.rules[index].flops
            group.fused_pointwise += 1
            reads = [
                (input_name, _broadcast_into(m.shape(input_name) or (), out_shape, value_axes))
                for input_name in node.input
                if input_name and m.status.get(input_name) in ("act", "param")
            ]
            stack.extend(reversed(reads))  # popped in input order, as recursion would visit them

    def new_group(self, index: int, result: RuleResult) -> int:
        """A group of its own for node ``index`` (absorbing the prologues it reads)."""
        m = self.m
        node = m.nodes[index]
        value_axes: dict[str, Axes] = {}
        for position, axes in result.outputs:
            if position < len(node.output) and node.output[position]:
                value_axes[node.output[position]] = axes
        gid = len(self.groups)
        self.groups.append(
            _Group(main=index, result=result, members=[], value_axes=value_axes, flops=result.flops, kind=result.kind)
        )
        self.deps.append(set())
        self.claim(gid, index)
        for position, axes in result.inputs:
            name = node.input[position] if position < len(node.input) else ""
            if name in self.deferred:
                self.read(gid, name, axes)  # only a deferred value, which read absorbs
            elif name and m.status.get(name) == "act":
                other = self.source_group(name)
                if other is not None and other != gid:
                    self.deps[gid].add(other)
        return gid

    def add_region(self, nodes: list[int], seed: str, y: str) -> None:
        """A norm region: one group of all its nodes, reading its seed."""
        group = _region_group(self.m, nodes, seed, y)
        members, group.members = group.members, []
        gid = len(self.groups)
        self.groups.append(group)
        self.deps.append(set())
        for member in members:
            self.claim(gid, member)
        seed_group = self.source_group(seed)
        if seed in self.deferred:  # cannot happen (the seed walk passes single-use pointwise ops)
            seed_group = None
        if seed_group is not None:
            self.deps[gid].add(seed_group)

    def fusion_target(self, index: int) -> tuple[int, str] | None:
        return _fusion_target(
            self.m, index, self.groups, self.value_group, self.deps, self.deferred, self.chain_memo, self.node_group
        )

    def fuse(self, index: int, gid: int, source: str) -> None:
        """Fuse pointwise node ``index`` backward into group ``gid``, extending its value ``source``."""
        m = self.m
        group = self.groups[gid]
        node = m.nodes[index]
        source_axes = group.value_axes[source]
        out_shape = m.shape(node.output[0]) or ()
        for o in node.output:
            if o:
                group.value_axes[o] = _broadcast_into(m.shape(o) or (), out_shape, source_axes)
        self.claim(gid, index)
        group.flops += m.rules[index].flops
        group.fused_pointwise += 1
        for name in node.input:
            if not name or m.status.get(name) == "const":
                continue
            origin = _transparent(m, name)
            if self.value_group.get(origin) == gid and origin in group.value_axes:
                continue
            self.read(gid, name, _broadcast_into(m.shape(name) or (), out_shape, source_axes))

    def flush_deferred(self) -> None:
        """Prologues whose consumer did not take them: ops of their own."""
        while self.deferred:
            value, index = min(self.deferred.items(), key=lambda item: item[1])
            del self.deferred[value]
            self.new_group(index, self.m.rules[index])

    def settle_deps(self) -> None:
        """Dependencies from the final membership (prologues may have been placed after their readers)."""
        m = self.m
        for gid, group in enumerate(self.groups):
            reads = [n for n, _ in group.extra_inputs]
            main = m.nodes[group.main]
            if group.spec_override is None:
                reads += [main.input[p] for p, _ in group.result.inputs if p < len(main.input)]
            self.deps[gid] = {
                g for g in (self.source_group(n) for n in reads if n and m.status.get(n) == "act") if g is not None and g != gid
            }


def _group(m: _Model) -> list[_Group]:
    """Stages 5-6: norm regions and pointwise fusion; groups returned in topological order.

    Elementwise nodes fuse *backward* into the op producing their full-size input. One that cannot
    (its input is a view, e.g. the query scaling after a head split) but has a single activation
    input and a single consumer is *deferred* and fused *forward* into its consumer as a prologue.
    """
    regions = _find_norm_regions(m)
    in_region = {i for nodes, _, _ in regions.values() for i in nodes}
    compute = set(m.compute)
    state = _Grouping(m)
    for index in m.compute:
        if index in state.node_group:
            continue
        if index in regions:
            state.add_region(*regions[index])
            continue
        if index in in_region:
            continue
        result = m.rules[index]
        target = state.fusion_target(index) if result.pointwise else None
        if target is not None:
            state.fuse(index, *target)
        elif result.pointwise and _prologue_candidate(m, index, compute):
            state.deferred[m.nodes[index].output[0]] = index
        else:
            state.new_group(index, result)
    state.flush_deferred()
    state.settle_deps()
    return [state.groups[g] for g in _topological_groups(state.groups, state.deps)]


def _prologue_candidate(m: _Model, index: int, compute: set[int]) -> bool:
    """A pointwise node with one activation input and one consumer, which is an op (not a view)."""
    node = m.nodes[index]
    acts = _act_inputs(m, index)
    outputs = [o for o in node.output if o]
    if len(acts) != 1 or not outputs or m.shape(acts[0]) != m.shape(outputs[0]):
        return False
    used = [o for o in outputs if m.consumers.get(o) or o in m.outputs]
    if used != [outputs[0]] or outputs[0] in m.outputs:
        return False
    users = m.consumers.get(outputs[0], [])
    return len({i for i, _ in users}) == 1 and users[0][0] in compute


def _topological_groups(groups: list[_Group], deps: list[set[int]]) -> list[int]:
    """Group ids in dependency order, ties broken by the main node's position (file order)."""
    import heapq

    users: list[list[int]] = [[] for _ in groups]
    indegree = [0] * len(groups)
    for gid, sources in enumerate(deps):
        for source in sources:
            users[source].append(gid)
            indegree[gid] += 1
    ready = [(groups[g].main, g) for g in range(len(groups)) if indegree[g] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, gid = heapq.heappop(ready)
        order.append(gid)
        for user in users[gid]:
            indegree[user] -= 1
            if indegree[user] == 0:
                heapq.heappush(ready, (groups[user].main, user))
    if len(order) < len(groups):  # cannot happen (fusion refuses cycles); keep every op regardless
        placed = set(order)
        order += [g for g in range(len(groups)) if g not in placed]
    return order


def _depends_on(deps: list[set[int]], start: int, target: int) -> bool:
    stack, seen = [start], {start}
    while stack:
        gid = stack.pop()
        if gid == target:
            return True
        for source in deps[gid]:
            if source not in seen:
                seen.add(source)
                stack.append(source)
    return False


def _fusion_target(
    m: _Model,
    index: int,
    groups: list[_Group],
    value_group: dict[str, int],
    deps: list[set[int]],
    deferred: Mapping[str, int],
    chain_memo: dict[str, tuple[str, ...]],
    node_group: Mapping[int, int],
) -> tuple[int, str] | None:
    """The group an elementwise node fuses into, with the full-size input it extends."""
    node = m.nodes[index]
    out_shape = m.shape(node.output[0]) if node.output else None
    if out_shape is None:
        return None
    out_numel = math.prod(out_shape)
    gid: int | None = None
    source: str | None = None
    others: list[str] = []
    chains: list[str] = []
    for name in node.input:
        if not name or m.status.get(name) != "act":
            continue
        if name in deferred:
            chains.append(name)
            continue  # a prologue chain: absorbed along with this node
        origin = _transparent(m, name)
        g = value_group.get(origin) if origin not in m.views else None
        shape = m.shape(origin)
        if g is not None and shape == out_shape and origin in groups[g].value_axes:
            if gid is not None and gid != g:
                return None
            gid, source = g, source or origin
        elif shape is not None and math.prod(shape) < out_numel:
            others.append(name)  # a broadcast operand (mask, gate): read as an extra input
        else:
            return None  # a second full-size activation: a residual join stays its own op
    if gid is None or source is None:
        return None
    for name in chains:
        others.extend(_chain_sources(m, name, deferred, chain_memo))
    group = groups[gid]
    if group.kind == "opaque":
        return None
    for name in others:
        other = value_group.get(_origin(m, name))
        if other is not None and other != gid and _depends_on(deps, other, gid):
            return None  # fusing would make the op read its own descendant
    for name in node.input:
        origin = _transparent(m, name) if name else ""
        if not name or value_group.get(origin) != gid:
            continue
        for user in _users(m, origin):
            # node_group, not set(group.members): a set per call is quadratic in a long fused chain
            if user == index or node_group.get(user) == gid:
                continue
            rule = m.rules.get(user)
            if rule is None or not rule.pointwise:
                return None
    return gid, source


def _chain_sources(m: _Model, value: str, deferred: Mapping[str, int], memo: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Activation inputs read by the deferred prologue chain that ends at ``value``.

    ``memo`` keeps each deferred value's answer: a chain's sources never change while it is
    deferred (every member has one consumer, the next member), and without it asking at each link
    of an n-node chain walks it n times (a 20,000-node Relu chain took minutes).
    """
    path: list[str] = []
    stack = [value]
    found: list[str] = []
    while stack:
        current = stack.pop()
        if current in memo:
            found.extend(memo[current])
            continue
        path.append(current)
        for name in _act_inputs(m, deferred[current]):
            (stack if name in deferred else found).append(name)
    result = tuple(found)
    if len(path) == 1 or all(len(_act_inputs(m, deferred[v])) == 1 for v in path):
        # A linear chain (prologues have one activation input): every link has the same sources.
        for current in path:
            memo[current] = result
    return result


# --------------------------------------------------------------------------------------------
# 7. Ops
# --------------------------------------------------------------------------------------------


def _refinement(size: int, factorizations: list[list[int]]) -> list[int] | None:
    """Common refinement of ordered factorizations of ``size`` (outer to inner), or ``None``.

    >>> _refinement(4096, [[8, 512]]), _refinement(24, [[4, 6], [6, 4]])
    ([8, 512], None)
    """
    bounds: set[int] = set()
    for parts in factorizations:
        acc = 1
        for part in parts[:-1]:
            acc *= part
            bounds.add(acc)
    ordered = sorted(b for b in bounds if 1 < b < size)
    previous = 1
    sizes = []
    for bound in ordered + [size]:
        if bound % previous:
            return None
        sizes.append(bound // previous)
        previous = bound
    return sizes


def _expand_axes(axes: Axes, subdims: Mapping[str, list[str]]) -> Axes:
    return tuple(tuple(s for d in axis for s in subdims.get(d, [d])) for axis in axes)


def _resolve_access(
    m: _Model,
    value: str,
    axes: Axes,
    dim_size: Mapping[str, int],
    subdims: Mapping[str, list[str]],
    sub_sizes: Mapping[str, list[int]],
) -> tuple[str, Axes]:
    """Access of ``value`` (indexed by ``axes``) re-expressed on the tensor it reads."""
    view = m.views.get(value)
    if view is None:
        return _through_parts(m, value, _expand_axes(axes, subdims))
    origin_entries: list[list[tuple[int, tuple[str, ...]]]] = [[] for _ in view.origin_axes]
    for j, dims in enumerate(axes):
        if not dims or j >= len(view.axes):
            continue
        pieces = view.pieces(j)
        if not pieces:
            continue
        if len(dims) == 1 and len(pieces) > 1 and dims[0] in sub_sizes and math.prod(p.size for p in pieces) == dim_size[dims[0]]:
            subs = subdims[dims[0]]
            sizes = sub_sizes[dims[0]]
            k = 0
            for piece in pieces:
                covered: list[str] = []
                acc = 1
                while k < len(subs) and acc < piece.size:
                    covered.append(subs[k])
                    acc *= sizes[k]
                    k += 1
                if piece.origin_axis is not None and covered:
                    origin_entries[piece.origin_axis].append((piece.position, tuple(covered)))
            continue
        first = pieces[0]
        if first.origin_axis is not None:
            expanded = tuple(s for d in dims for s in subdims.get(d, [d]))
            origin_entries[first.origin_axis].append((first.position, expanded))
    origin_axes = tuple(tuple(d for _, ds in sorted(entries) for d in ds) for entries in origin_entries)
    return _through_parts(m, view.origin, origin_axes)


def _through_parts(m: _Model, name: str, axes: Axes) -> tuple[str, Axes]:
    """Access of a weight part re-expressed on the parameter it was cut from."""
    part = m.part_views.get(name)
    if part is None:
        return name, axes
    root, amap = part
    root_axes: list[tuple[str, ...]] = [()] * len(m.shape(root) or ())
    for j, dims in enumerate(axes):
        if j < len(amap) and amap[j] is not None and amap[j] < len(root_axes):
            root_axes[amap[j]] = root_axes[amap[j]] + dims
    return root, tuple(root_axes)


def _split_requests(m: _Model, accesses: list[tuple[str, Axes]], dim_size: Mapping[str, int]) -> dict[str, list[list[int]]]:
    requests: dict[str, list[list[int]]] = {}
    for value, axes in accesses:
        view = m.views.get(value)
        if view is None:
            continue
        for j, dims in enumerate(axes):
            if len(dims) != 1 or j >= len(view.axes):
                continue
            pieces = view.pieces(j)
            sizes = [p.size for p in pieces]
            if len(pieces) > 1 and math.prod(sizes) == dim_size.get(dims[0], -1):
                requests.setdefault(dims[0], []).append(sizes)
    return requests


def _node_spec(m: _Model, index: int, result: RuleResult, subdims: Mapping[str, list[str]]) -> NodeSpec:
    node = m.nodes[index]
    constant_inputs: dict[int, bytes] = {}
    input_axes: list[tuple[tuple[str, ...], ...] | None] = [None] * len(node.input)
    for position, name in enumerate(node.input):
        if name and m.status.get(name) == "const":
            value = m.constant(name)
            if value is not None:
                try:
                    constant_inputs[position] = numpy_helper.from_array(np.asarray(value), name).SerializeToString()
                except Exception:
                    pass
    for position, axes in result.inputs:
        if position < len(node.input) and m.status.get(node.input[position]) != "const":
            input_axes[position] = _expand_axes(axes, subdims)
    output_axes: list[tuple[tuple[str, ...], ...] | None] = [None] * len(node.output)
    for position, axes in result.outputs:
        if position < len(node.output):
            output_axes[position] = _expand_axes(axes, subdims)
    return NodeSpec(
        op_type=node.op_type,
        domain=node.domain,
        attributes=tuple(a.SerializeToString() for a in node.attribute),
        input_shapes=tuple(m.shape(n) or () for n in node.input),
        input_dtypes=tuple(m.dtype(n) if n else "" for n in node.input),
        output_shapes=tuple(m.shape(n) or () for n in node.output),
        output_dtypes=tuple(m.dtype(n) if n else "" for n in node.output),
        constant_inputs=constant_inputs,
        opset=m.opset or 18,
        input_axes=tuple(input_axes),
        output_axes=tuple(output_axes),
    )


def _external_outputs(m: _Model, group: _Group) -> list[str]:
    members = set(group.members)
    result = []
    for index in group.members:
        if index in m.view_nodes:
            continue
        for o in m.nodes[index].output:
            if not o or o not in group.value_axes:
                continue
            if o in m.outputs or any(c not in members for c, _ in m.consumers.get(o, ())):
                result.append(o)
    if not result:
        node = m.nodes[group.main]
        first = next((o for o in node.output if o and o in group.value_axes), None)
        if first is not None:
            result.append(first)
    return result


def _build_op(m: _Model, group: _Group) -> tuple[Op, list[tuple[str, tuple[int, ...]]], dict[str, Axes]]:
    """One coarse op (batch dims not yet marked); also its output tensors and their axes."""
    result = group.result
    main = m.nodes[group.main]
    raw_inputs: list[tuple[str, Axes]] = []
    internal = {o for i in group.members for o in m.nodes[i].output if o}
    if group.spec_override is None:
        for position, axes in result.inputs:
            name = main.input[position] if position < len(main.input) else ""
            if name and name not in internal and m.status.get(name) in ("act", "param"):
                raw_inputs.append((name, axes))
    raw_inputs.extend((n, a) for n, a in group.extra_inputs if n not in internal)
    outputs = _external_outputs(m, group)
    dim_size = {d.name: d.size for d in result.dims}
    # Sub-dims where a view axis spans several original axes (see _resolve_access).
    requests = _split_requests(m, raw_inputs, dim_size)
    subdims: dict[str, list[str]] = {}
    sub_sizes: dict[str, list[int]] = {}
    used = set(dim_size)
    for dim_name, factorizations in requests.items():
        sizes = _refinement(dim_size[dim_name], factorizations)
        if sizes is None or len(sizes) < 2:
            continue
        names = []
        for i in range(len(sizes)):
            candidate = f"{dim_name}_{i}"
            while candidate in used:
                candidate += "_"
            used.add(candidate)
            names.append(candidate)
        subdims[dim_name] = names
        sub_sizes[dim_name] = sizes
    dims: list[IterDim] = []
    for dim in result.dims:
        if dim.name in subdims:
            for i, (name, size) in enumerate(zip(subdims[dim.name], sub_sizes[dim.name])):
                inner = i == len(sub_sizes[dim.name]) - 1
                dims.append(replace(dim, name=name, size=size, halo=dim.halo if inner else 0, stride=dim.stride if inner else 1))
        else:
            dims.append(dim)
    inputs: list[TensorAccess] = []
    seen: set[tuple[str, Axes]] = set()
    for value, axes in raw_inputs:
        tensor, resolved = _resolve_access(m, value, axes, dim_size, subdims, sub_sizes)
        if tensor in m.aliases:
            # The copy is the canonical table transposed: read the table with the axes swapped.
            tensor, resolved = m.aliases[tensor], tuple(reversed(resolved))
        if (tensor, resolved) not in seen:
            seen.add((tensor, resolved))
            inputs.append(TensorAccess(tensor=tensor, axes=resolved))
    out_accesses = []
    out_axes: dict[str, Axes] = {}
    for name in outputs:
        axes = _expand_axes(group.value_axes[name], subdims)
        out_axes[name] = axes
        out_accesses.append(TensorAccess(tensor=name, axes=axes))
    spec = group.spec_override
    if spec is not None and subdims:
        spec = replace(
            spec,
            input_axes=tuple(_expand_axes(a, subdims) if a is not None else None for a in spec.input_axes),
            output_axes=tuple(_expand_axes(a, subdims) if a is not None else None for a in spec.output_axes),
        )
    if spec is None:
        spec = _node_spec(m, group.main, result, subdims)
    onnx_nodes = (m.names[group.main],) + tuple(m.names[i] for i in group.members if i != group.main)
    op = Op(
        name=m.names[group.main],
        kind=group.kind or result.kind,  # type: ignore[arg-type]
        op_type=spec.op_type if group.spec_override is not None else main.op_type,
        dims=tuple(dims),
        inputs=tuple(inputs),
        outputs=tuple(out_accesses),
        flops=float(group.flops),
        backward_flops_factor=result.backward_flops_factor,
        fused_pointwise=group.fused_pointwise,
        onnx_nodes=onnx_nodes,
        node_types=tuple(m.nodes[i].op_type for i in sorted({group.main, *group.members})),  # graph order
        module_path=module_path_of(main),
        node=spec,
        note=result.note,
    )
    return op, [(name, m.shape(name) or ()) for name in outputs], out_axes


def _input_batch_axes(m: _Model) -> dict[str, set[int]]:
    """Batch axes of the graph inputs: axes whose symbolic dim is named like a batch, else axis 0."""
    named: dict[str, set[int]] = {}
    declared = {i.name: i for i in m.graph.input}
    any_named = False
    for name in m.inputs:
        axes: set[int] = set()
        info = declared.get(name)
        if info is not None and info.type.HasField("tensor_type"):
            for axis, dim in enumerate(info.type.tensor_type.shape.dim):
                if dim.dim_param and re.search(r"batch", dim.dim_param, re.IGNORECASE) and "*" not in dim.dim_param:
                    axes.add(axis)
        any_named |= bool(axes)
        named[name] = axes
    result: dict[str, set[int]] = {}
    for name in m.inputs:
        shape = m.shape(name) or ()
        if any_named:
            result[name] = named[name]
        elif shape:
            result[name] = {0}
        else:
            result[name] = set()
    return result


def _mark_batch(ops: list[Op], batch_axes: dict[str, set[int]]) -> list[Op]:
    """Mark ``IterDim.is_batch`` by following batch axes from the graph inputs through accesses."""
    marked: list[Op] = []
    for op in ops:
        batch_dims: set[str] = set()
        for access in op.inputs:
            axes = batch_axes.get(access.tensor)
            if not axes:
                continue
            for axis in axes:
                if axis < len(access.axes) and access.axes[axis]:
                    batch_dims.add(access.axes[axis][0])
        if batch_dims:
            op = replace(op, dims=tuple(replace(d, is_batch=d.name in batch_dims) for d in op.dims))
        for access in op.outputs:
            axes = {i for i, dims in enumerate(access.axes) if dims and dims[0] in batch_dims}
            if axes:
                batch_axes[access.tensor] = axes
        marked.append(op)
    return marked


def _common_prefix(paths: list[str]) -> str | None:
    """Longest common dotted prefix: ``a.b.c`` and ``a.b.d`` -> ``a.b``."""
    split = [p.split(".") for p in paths]
    common: list[str] = []
    for parts in zip(*split):
        if any(part != parts[0] for part in parts):
            break
        common.append(parts[0])
    return ".".join(common) or None


def _infer_module_paths(ops: list[Op], edges: list[Edge]) -> list[Op]:
    """Ops without a module path (nodes an optimiser created) take their neighbours' common prefix."""
    neighbours: list[list[int]] = [[] for _ in ops]
    for edge in edges:
        neighbours[edge.consumer].append(edge.producer)
        neighbours[edge.producer].append(edge.consumer)
    result = list(ops)
    for index, op in enumerate(ops):
        if op.module_path is not None:
            continue
        paths = [ops[n].module_path for n in neighbours[index] if ops[n].module_path]
        if paths:
            result[index] = replace(op, module_path=_common_prefix(paths))  # type: ignore[arg-type]
    return result


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def build_op_graph(
    shaped: ShapedModel,
    *,
    name: str,
    source_sha256: str = "",
    source_path: str = "",
) -> OpGraph:
    """Coarsen a shaped ONNX model into an :class:`OpGraph` (blocks not yet found).

    Parameters
    ----------
    shaped:
        The model with concrete shapes (:func:`importers.shapes.resolve_shapes`).
    name:
        Model name (usually the file stem).
    source_sha256, source_path:
        Recorded in the graph for provenance.

    Returns
    -------
    OpGraph
        Ops in topological order, tensors (activations, inputs, parameters), edges; ``blocks`` empty.

    Examples
    --------
    >>> from onnx import TensorProto as T
    >>> g = helper.make_graph(
    ...     [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="act")],
    ...     "mlp", [helper.make_tensor_value_info("x", T.FLOAT, [8, 16])],
    ...     [helper.make_tensor_value_info("y", T.FLOAT, [8, 32])],
    ...     initializer=[helper.make_tensor("w", T.FLOAT, [16, 32], [0.0] * 512)])
    >>> shaped = ShapedModel(model=helper.make_model(g), shapes={"x": (8, 16), "w": (16, 32), "h": (8, 32), "y": (8, 32)},
    ...                      dtypes={"x": "float32", "w": "float32", "h": "float32", "y": "float32"})
    >>> graph = build_op_graph(shaped, name="mlp")
    >>> [(op.name, op.kind, op.fused_pointwise, op.flops) for op in graph.ops]
    [('mm', 'matmul', 1, 8448.0)]
    >>> graph.parameter_count
    512
    """
    m = _Model(shaped)
    _classify(m)
    _find_parameters(m)
    _finish_status(m)
    _fold_views_and_rules(m)
    ops, producers, tensors = _coarse_ops(m, _group(m))
    edges = _edges_and_sources(m, ops, producers, tensors)
    ops = _infer_module_paths(ops, edges)
    return OpGraph(
        name=name,
        ops=tuple(ops),
        tensors=tensors,
        edges=tuple(edges),
        dim_bindings=dict(shaped.dim_bindings),
        raw_node_count=len(m.nodes),
        opset=m.opset,
        source_sha256=source_sha256,
        source_path=source_path,
        warnings=_import_warnings(m),
        parameter_aliases=_parameter_aliases(m),
        raw_op_types=dict(Counter(n.op_type for n in m.nodes)),
    )


def _coarse_ops(m: _Model, groups: list[_Group]) -> tuple[list[Op], dict[str, tuple[int, int]], dict[str, Tensor]]:
    """Stage 7: one op per group (batch dims marked), the ``(op, output position)`` producing each
    activation, and the activation tensors."""
    ops: list[Op] = []
    producers: dict[str, tuple[int, int]] = {}
    tensors: dict[str, Tensor] = {}
    for group in groups:
        op, outs, _ = _build_op(m, group)
        for position, (tensor, shape) in enumerate(outs):
            producers[tensor] = (len(ops), position)
            tensors[tensor] = Tensor(name=tensor, shape=shape, dtype=m.dtype(tensor), role="activation", producer=op.name)
        ops.append(op)
    return _mark_batch(ops, _input_batch_axes(m)), producers, tensors


def _edges_and_sources(
    m: _Model, ops: list[Op], producers: Mapping[str, tuple[int, int]], tensors: dict[str, Tensor]
) -> list[Edge]:
    """The edges between ops; every tensor no op produces (parameter, graph input, constant) is
    added to ``tensors``."""
    edges: list[Edge] = []
    for consumer, op in enumerate(ops):
        for position, access in enumerate(op.inputs):
            tensor = access.tensor
            if tensor in producers:
                producer, out_position = producers[tensor]
                edges.append(
                    Edge(producer=producer, consumer=consumer, tensor=tensor, producer_output=out_position, consumer_input=position)
                )
                continue
            if tensor in tensors:
                continue
            status = m.status.get(tensor)
            role = "parameter" if status == "param" else "input" if tensor in m.inputs else "constant"
            shape = m.shape(tensor) or ()
            tensors[tensor] = Tensor(name=tensor, shape=shape, dtype=m.dtype(tensor), role=role)  # type: ignore[arg-type]
    return edges


def _import_warnings(m: _Model) -> tuple[str, ...]:
    """The stages' warnings, then baked sequence lengths and opaque op types."""
    warnings = list(m.warnings)
    if m.baked:
        listed = ", ".join(m.baked[:2]) + (f" and {len(m.baked) - 2} more" if len(m.baked) > 2 else "")
        warnings.append(
            f"{len(m.baked)} Reshape node(s) change the element count at these dims, e.g. {listed}: "
            "the exporter baked sequence lengths into the graph; import at the lengths it was exported with"
        )
    for op_type, nodes in sorted(m.opaque.items()):
        listed = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        warnings.append(
            f"{len(nodes)} node(s) of op type '{op_type}' ({listed}) are treated as opaque: replicated, never split"
        )
    return tuple(warnings)


def _parameter_aliases(m: _Model) -> dict[str, str]:
    """Tied copies of parameters, and Identity views of a parameter, -> the parameter."""
    aliases: dict[str, str] = dict(m.aliases)
    for value, view in m.views.items():
        if view.origin in m.parameters and m.producer.get(value) and m.nodes[m.producer[value][0]].op_type == "Identity":
            aliases[value] = view.origin
    return aliases
