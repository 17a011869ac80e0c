r"""Traced per-expert loops: what a TorchScript trace of an MoE layer's Python loop over its experts leaves in the file.

transformers' eager MoE layers (DBRX's ``DbrxExperts``, Switch Transformers' ``SwitchTransformersSparseMLP``) loop
over the experts the batch reached, ``for expert_idx in expert_mask.nonzero()``-style: per iteration a ``NonZero``
picks the expert's tokens, a ``Gather`` takes their rows, the expert's MLP runs on them, and a scatter adds the
result back. torch's dynamo exporter refuses the loop (``torch.export`` cannot trace a data-dependent iteration
count); TorchScript unrolls the iterations its example took, each with a row count the file does not hold
(``NonZero``'s length depends on the values), so the expert matmuls' shapes are unknown: left so, they would be
opaque and unpriced. The rows :func:`traced_loops` returns give each iteration's ``NonZero`` the rows balanced
routing sets (the expert's slice of the routing mask, :math:`1 / E` of it: :math:`T k / E` token choices, the
expected load the planner's dropless MoE pricing assumes too) and the importer resolves the shapes again with those declared
(:func:`with_rows`), so the iterations' matmuls are priced as dense matmuls of that many rows. The loop is not
read as an MoE layer (:mod:`importers.moe`): no expert parallelism is offered for it.

:func:`weight_slices` finds the iterations' weight picks where the experts share one ``[E, a, b]`` tensor (DBRX:
``w1[expert_idx]``): an ``embedding`` op that takes one whole matrix of a parameter of rank 3 or more by a scalar
index, which is no table of token or position vectors (a launcher that reads it as one names a bogus
``E``-row table).

:func:`expert_loop_note` makes the parameter count's warning exact. An *iteration* is a ``NonZero`` whose indices
select rows of a float activation (a ``Gather`` of the hidden states within :data:`_INDEX_HOPS` ops, not through
another ``NonZero``: ``expert_mask[e].nonzero()``'s token picks, not ``expert_hit``'s expert list); its *weights*
are what the matmuls after that ``Gather`` read, with their biases, before the ``Scatter*`` that adds the result back (within
:data:`_EXPERT_HOPS` ops): initializers of their own (Switch: one ``Linear`` per expert) or whole matrices taken
from a shared ``[E, a, b]`` initializer (DBRX). A *loop* is the iterations whose nearest ``OneHot`` upstream is
the same (the layer's ``expert_mask``), and its experts :math:`E` are the last axis of the scores the ``TopK`` or
``ArgMax`` feeding that ``OneHot`` chooses from (the router's width; DBRX's ``OneHot`` is ``E + 1`` deep). A loop
with :math:`k < E` iterations over weights of their own lacks :math:`E - k` experts the example never routed to,
each as large as a traced one (every expert of a layer is one module class of one config); a loop over a shared
tensor holds every expert's weights (the tensor is whole), whatever the trace took.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx

from importers.onnx_facts import facts_of_model
from planner.core.graph import OpGraph

__all__ = ["ExpertLoop", "expert_loop_note", "expert_loops", "table_lookups", "traced_loops", "weight_slices", "with_rows"]

_INDEX_HOPS = 6
"""Ops from a ``NonZero`` to the ``Gather`` its indices select tokens with (TorchScript: ``Transpose``, ``Split``,
``Squeeze``, then the ``Gather``: 4 in DBRX's and Switch's traces)."""
_EXPERT_HOPS = 16
"""Ops from the token ``Gather`` to the expert's last matmul (Switch: ``Reshape``, ``MatMul``, ``Relu``, ``MatMul``;
DBRX's gated MLP: 6)."""
_ROUTER_HOPS = 40
"""Ops walked back from a ``NonZero`` to its layer's ``OneHot`` (DBRX's iterations: 6, through the expert list)."""
_VIEWS = frozenset({"Transpose", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Identity"})
_FLOATS = frozenset({"float32", "float16", "bfloat16", "float64", "float"})
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE})


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertLoop:
    """One traced per-expert loop (module docstring)."""

    where: str
    """The ``OneHot`` node of the layer's expert mask."""
    experts: int
    """:math:`E`, the router's width."""
    traced: int
    """Iterations in the file (experts the example reached)."""
    expert_parameters: int
    """Elements of one traced expert's own weights (0: the experts share whole ``[E, a, b]`` tensors)."""
    shared: bool
    """The iterations take their weights from shared ``[E, a, b]`` initializers (every expert in the file)."""

    @property
    def missing_parameters(self) -> int:
        """Parameters of the experts the trace lacks: :math:`(E - k)` times one expert's, 0 for shared weights."""
        return 0 if self.shared else max(self.experts - self.traced, 0) * self.expert_parameters


def weight_slices(graph: OpGraph) -> list[int]:
    """The ``embedding`` ops that take one whole matrix of a parameter of rank 3 or more by a scalar index (their
    output has one axis fewer than the parameter): an expert's weights ``w[e]`` in a traced per-expert loop
    (module docstring), graph order."""
    found = []
    for i, op in enumerate(graph.ops):
        if op.kind != "embedding" or not op.outputs:
            continue
        tables = [graph.tensors[a.tensor].shape for a in op.inputs
                  if a.tensor in graph.tensors and graph.tensors[a.tensor].role == "parameter"]
        result = graph.tensors.get(op.outputs[0].tensor)
        if tables and result is not None and len(tables[0]) >= 3 and len(result.shape) == len(tables[0]) - 1:
            found.append(i)
    return found


def table_lookups(graph: OpGraph, mlps: list, irregular: list[str]) -> list[int]:
    """The ``embedding`` ops that look tables up, graph order: every one but :func:`weight_slices` and the lookups of
    per-expert tables by the router's choice (:func:`_expert_indexed`). Where the graph
    has weight slices and no MLP block was read (``mlps``), appends to ``irregular`` the clause that says why
    (the experts run as a traced loop), before the count of MLP blocks that follows from it."""
    slices = weight_slices(graph)
    if slices and not mlps:
        irregular.append(f"its experts run as a traced per-expert loop (one whole expert matrix of an [E, a, b] weight "
                         f"gathered per iteration, e.g. {graph.ops[slices[0]].name}), read as no MLP block")
    chosen = _expert_indexed(graph)
    return [i for i, op in enumerate(graph.ops) if op.kind == "embedding" and i not in slices and i not in chosen]


def _expert_indexed(graph: OpGraph) -> set[int]:
    """The ``embedding`` ops whose indices are a ``TopK``'s output (through data movement): a per-token lookup
    of a per-expert table by the router's choice (GPT-OSS's ``gate_up_proj_bias[router_indices]``, both torch
    exporters), no token or position table (issue 25: the TorchScript file's read as a 4-row position table)."""
    producer = {access.tensor: op for op in graph.ops for access in op.outputs}
    found = set()
    for i, op in enumerate(graph.ops):
        if op.kind != "embedding" or len(op.inputs) < 2:
            continue
        writer = producer.get(op.inputs[1].tensor)
        for _ in range(3):  # a reshape or cast of the indices between them
            if writer is None or writer.kind != "data_movement" or not writer.inputs:
                break
            writer = producer.get(writer.inputs[0].tensor)
        if writer is not None and "TopK" in writer.node_types:
            found.add(i)
    return found


@dataclass(frozen=True, slots=True)
class _Nodes:
    """The file's nodes as the walks read them."""

    producer: Mapping[str, onnx.NodeProto]
    readers: Mapping[str, list]
    sizes: Mapping[str, int]
    """Initializer name -> elements."""
    floats: frozenset[str]
    """The floating-point initializers (weights; not the integer shapes and axes a ``_consts`` file keeps inline)."""
    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, str]

    @classmethod
    def of(cls, model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str]) -> "_Nodes":
        facts = facts_of_model(model)
        floats = frozenset(t.name for t in facts.initializers if t.data_type in _FLOAT_TYPES)
        return cls(facts.producer, facts.readers, facts.initializer_sizes, floats, shapes, dtypes)

    def initializer_of(self, name: str) -> str | None:
        """The initializer ``name`` is, or is a view of."""
        while name not in self.sizes:
            node = self.producer.get(name)
            if node is None or node.op_type not in _VIEWS or not node.input:
                return None
            name = node.input[0]
        return name

    def forward(self, start: list[str], hops: int, stop: frozenset[str]) -> list:
        """The nodes reading ``start`` values, breadth first within ``hops``, not past ``stop`` op types."""
        seen, frontier, out = set(), list(start), []
        for _ in range(hops):
            following = []
            for name in frontier:
                for node in self.readers.get(name, ()):
                    if id(node) not in seen:
                        seen.add(id(node))
                        out.append(node)
                        following += [] if node.op_type in stop else list(node.output)
            frontier = following
        return out


def _token_gathers(nodes: _Nodes, nonzero: onnx.NodeProto) -> list:
    """The gathers whose indices come from ``nonzero`` and whose data is a float activation (token rows)."""
    return [n for n in nodes.forward(list(nonzero.output), _INDEX_HOPS, frozenset({"NonZero"}))
            if n.op_type in ("Gather", "GatherND") and n.input[0] not in nodes.sizes
            and nodes.dtypes.get(n.input[0], "") in _FLOATS]


def _iteration_weights(nodes: _Nodes, gathers: list) -> tuple[set[str], set[str]]:
    """``(own, shared)`` initializers the matmuls after the token ``gathers`` read: their own weights and biases (a
    ``Gemm``'s, or a float initializer of more than one element an ``Add`` reads), and the ``[E, a, b]`` tensors
    they take one matrix of (a ``Gather`` of an initializer by an index)."""
    own, shared = set(), set()
    after = nodes.forward([o for g in gathers for o in g.output], _EXPERT_HOPS,
                          frozenset({"NonZero", "ScatterElements", "ScatterND", "Scatter"}))
    for node in after:
        if node.op_type == "Add":
            own.update(w for name in node.input if (w := nodes.initializer_of(name)) in nodes.floats and nodes.sizes[w] > 1)
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        for name in node.input[:3]:
            source = nodes.producer.get(name)
            if (weight := nodes.initializer_of(name)) is not None:
                own.add(weight)
            elif source is not None and source.op_type == "Gather" and (table := nodes.initializer_of(source.input[0])):
                shared.add(table)
    return own, shared


def _layer_of(nodes: _Nodes, nonzero: onnx.NodeProto) -> tuple[str, int] | None:
    """``(OneHot node name, E)`` of the loop ``nonzero`` iterates in: the nearest ``OneHot`` upstream, ``E`` the
    last axis of the scores its ``TopK``/``ArgMax`` indices chose from; ``None`` if not found."""
    frontier, seen = list(nonzero.input), set()
    for _ in range(_ROUTER_HOPS):
        following = []
        for name in frontier:
            node = nodes.producer.get(name)
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "OneHot":
                choice = nodes.producer.get(node.input[0])
                scores = nodes.shapes.get(choice.input[0]) if choice is not None and choice.op_type in ("TopK", "ArgMax") else None
                return (node.name, int(scores[-1])) if scores else None
            following += list(node.input)
        frontier = following
    return None


def _iterations(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]],
                dtypes: Mapping[str, str]) -> tuple[_Nodes | None, list[tuple[onnx.NodeProto, list, tuple[str, int]]]]:
    """The file's nodes as the walks read them, and ``(NonZero, its token gathers, (OneHot name, E))`` of each
    iteration of a traced per-expert loop whose layer is read, graph order (``None, []`` without a ``NonZero``)."""
    if not any(node.op_type == "NonZero" for node in model.graph.node):
        return None, []
    nodes = _Nodes.of(model, shapes, dtypes)
    found = []
    for node in model.graph.node:
        if node.op_type == "NonZero" and (gathers := _token_gathers(nodes, node)):
            if (layer := _layer_of(nodes, node)) is not None:
                found.append((node, gathers, layer))
    return nodes, found


def traced_loops(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]],
                 dtypes: Mapping[str, str]) -> tuple[list[ExpertLoop], dict[str, tuple[int, int]]]:
    r"""``(loops, rows)`` of a loaded, shape-resolved model, from one walk of its iterations: :func:`expert_loops`,
    and ``{NonZero output: (rank, rows)}`` for each iteration whose layer's :math:`E` is read: under balanced routing
    an expert's slice of the routing mask has :math:`1 / E` of its entries set (DBRX's ``[k, T]`` slice: :math:`T k
    / E` token-slot pairs; Switch's top-1 ``[b, s]``: :math:`T / E` tokens), so its ``NonZero`` lists
    :math:`\lceil n / E \rceil` of the slice's :math:`n` entries."""
    nodes, iterations = _iterations(model, shapes, dtypes)
    layers: dict[tuple[str, int], list] = {}
    rows = {}
    for nonzero, gathers, layer in iterations:
        layers.setdefault(layer, []).append(_iteration_weights(nodes, gathers))
        if mask := shapes.get(nonzero.input[0]):
            rows[nonzero.output[0]] = (len(mask), -(-int(np.prod(mask, dtype=np.int64)) // layer[1]))
    loops = []
    for (where, experts), weights in layers.items():
        shared = any(s for _, s in weights)
        sizes = {sum(nodes.sizes[w] for w in own) for own, _ in weights}
        loops.append(ExpertLoop(where=where, experts=experts, traced=len(weights), shared=shared,
                                expert_parameters=sizes.pop() if len(sizes) == 1 else 0))
    return loops, rows


def expert_loops(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str]) -> list[ExpertLoop]:
    """The traced per-expert loops of a loaded, shape-resolved model (module docstring), in graph order."""
    return traced_loops(model, shapes, dtypes)[0]


def expert_loop_note(loops: list[ExpertLoop]) -> str | None:
    """The importer's one-line warning for traced per-expert loops (:func:`expert_loops`): how many, that their
    experts are priced at balanced routing's rows (:func:`traced_loops`) without expert parallelism, and the parameters
    the trace lacks, exactly; ``None`` without loops."""
    if not loops:
        return None
    iterations = sum(loop.traced for loop in loops)
    short = [loop for loop in loops if loop.missing_parameters]
    text = (f"{len(loops)} traced per-expert MoE loop(s) (TorchScript's unrolled `for expert in expert_mask.nonzero()`, "
            f"{iterations} expert iteration(s)): each expert runs on a token count the file does not hold, priced at "
            "balanced routing's (1/E of its routing-mask slice: T k / E token choices) as dense matmuls, with no "
            "expert parallelism offered (export the model with a batched expert implementation, or with dynamo, "
            "where the model has one)")
    if any(loop.expert_parameters == 0 and not loop.shared for loop in loops):
        return text + "; experts of unequal size: the parameters of experts the trace lacks are not known"
    if not short:
        return text + "; every expert's weights are in the file (the parameter count is exact)"
    missing = sum(loop.missing_parameters for loop in short)
    where = ", ".join(f"{loop.experts - loop.traced} of {loop.experts} at {loop.where}" for loop in short[:3])
    return (text + f"; the trace lacks {sum(loop.experts - loop.traced for loop in short)} expert(s) no example "
            f"token reached ({where}), each as large as its traced siblings: the parameter count is {missing:,} "
            "short of the model's, and their share of the tokens is not priced")


def with_rows(model: onnx.ModelProto, rows: Mapping[str, tuple[int, int]]) -> onnx.ModelProto:
    """A copy of ``model`` declaring each ``NonZero`` output that :func:`traced_loops`' ``rows`` name ``[rank, rows]``
    (INT64), for shape inference to carry into the iteration's expert matmuls."""
    from onnx import TensorProto, helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.graph.value_info.extend(helper.make_tensor_value_info(name, TensorProto.INT64, list(shape))
                                 for name, shape in rows.items())
    return copy
