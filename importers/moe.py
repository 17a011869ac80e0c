r"""Routed-experts (Mixture-of-Experts) layers in a coarse op graph.

A routed-experts layer is ``router linear -> softmax/sigmoid -> TopK -> experts -> weighted
combine``. Exporters write the experts in one of three styles, all recognised here:

* ``gather``: a per-token gather of whole expert weight matrices (transformers' ``batched_mm``
  experts: ``GatherND``/``Gather`` of a parameter ``[E, a, b]`` by the TopK indices, then a batched
  matmul per routed token). The gathered ``[T k, a, b]`` tensor is an indexing artefact: no
  framework materialises it.
* ``routed``: the same layer after :func:`objectives.moe.routed_graph` dropped those gathers: the
  expert matmuls read the ``[E, a, b]`` parameters directly, over ``T k`` routed tokens.
* ``batched``: batched matmuls over an expert dim (a parameter ``[E, a, b]`` whose axis 0 is an
  iteration dim of size ``E``), every token through every expert (a dense export).
* ``linears``: per-expert linears: ``E`` (or a multiple of ``E``) matmuls with equal-shaped 2-D
  weights between the TopK and the layer's end, each over every token.

The layer's span is the ops after its TopK up to the next normalisation op (the next layer's input
norm) or the next TopK: the expert ops are found only there, so attention projections of the next
layer are never taken for experts.

Everything here is a pure function of the :class:`~planner.core.graph.OpGraph`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from planner.core.graph import Op, OpGraph

__all__ = ["MoeStyle", "MoeLayer", "find_moe_layers", "expert_parameters"]

MoeStyle = Literal["gather", "routed", "batched", "linears"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayer:
    """One routed-experts layer of a graph."""

    topk_op: int
    """Index of the TopK op (the routing decision)."""
    router_op: int
    """Index of the router linear (the matmul with a parameter feeding the TopK's scores)."""
    num_experts: int
    """E: experts of the layer."""
    top_k: int
    """Experts each token is routed to."""
    tokens: int
    """T: tokens entering the layer per step (the TopK's rows)."""
    hidden: int
    """Model width (elements): the router's input features."""
    ffn: int
    """Expert hidden width (elements): the smallest non-hidden dim of the expert weights (a fused
    gate+up weight is ``2 ffn`` wide)."""
    style: MoeStyle
    expert_ops: tuple[int, ...]
    """Ops that are expert compute (matmuls, the activations between them, the weighted combine),
    graph order; the weight gathers of the ``gather`` style included."""
    weight_gathers: tuple[int, ...] = ()
    """``gather`` style: the ops that gather whole expert weights per token."""
    expert_matmuls: tuple[int, ...] = ()
    """The matmuls that read expert weights (directly or gathered)."""
    expert_parameters: tuple[str, ...] = ()
    """Names of the experts' parameters."""

    @property
    def routed_tokens(self) -> int:
        """Token-expert pairs computed with dropless routing: ``T k``."""
        return self.tokens * self.top_k


def _producers(graph: OpGraph) -> dict[str, int]:
    return {out.tensor: i for i, op in enumerate(graph.ops) for out in op.outputs}


def _consumers(graph: OpGraph) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for edge in graph.edges:
        found.setdefault(edge.producer, []).append(edge.consumer)
    return found


def _is_parameter(graph: OpGraph, name: str) -> bool:
    tensor = graph.tensors.get(name)
    return tensor is not None and tensor.role == "parameter"


def _parameters(graph: OpGraph, op: Op) -> list[str]:
    return [a.tensor for a in op.inputs if _is_parameter(graph, a.tensor)]


def _router(graph: OpGraph, topk: int, producers: dict[str, int]) -> int | None:
    """Walk back from the TopK's scores through parameter-free ops to the router linear."""
    frontier, seen = [topk], set()
    for _ in range(6):
        nxt = []
        for index in frontier:
            for access in graph.ops[index].inputs:
                source = producers.get(access.tensor)
                if source is None or source in seen:
                    continue
                seen.add(source)
                op = graph.ops[source]
                if op.kind == "matmul" and _parameters(graph, op):
                    return source
                if not _parameters(graph, op):
                    nxt.append(source)
        frontier = nxt
    return None


def _span(graph: OpGraph, topk: int) -> range:
    """Ops after the TopK up to the next norm or TopK (exclusive)."""
    end = len(graph.ops)
    for index in range(topk + 1, len(graph.ops)):
        op = graph.ops[index]
        if op.kind == "norm" or op.op_type == "TopK":
            end = index
            break
    return range(topk + 1, end)


def _reaches(graph: OpGraph, start: int, target: str, producers: dict[str, int], depth: int = 4) -> bool:
    """Whether op ``start`` reads ``target`` within ``depth`` producer hops."""
    frontier = [start]
    for _ in range(depth):
        nxt = []
        for index in frontier:
            for access in graph.ops[index].inputs:
                if access.tensor == target:
                    return True
                source = producers.get(access.tensor)
                if source is not None:
                    nxt.append(source)
        frontier = nxt
    return False


def _closure(graph: OpGraph, seeds: list[int], span: range, consumers: dict[int, list[int]]) -> list[int]:
    """Seeds and the span's ops reachable from them, stopping after the first reduce (the combine)."""
    found, stack = set(seeds), list(seeds)
    while stack:
        index = stack.pop()
        if graph.ops[index].kind == "reduce" and index not in seeds:
            continue  # the weighted combine ends the experts
        for nxt in consumers.get(index, ()):
            if nxt in span and nxt not in found:
                found.add(nxt)
                stack.append(nxt)
    return sorted(found)


def _expert_axis_indexed(op: Op, name: str, experts: int) -> bool:
    """Whether the parameter ``name`` [E, ...] has its expert axis indexed by an iteration dim of size E."""
    for access in op.inputs:
        if access.tensor == name and access.axes and access.axes[0]:
            sizes = 1
            for dim in access.axes[0]:
                sizes *= op.dim(dim).size
            return sizes == experts
    return False


def find_moe_layers(graph: OpGraph) -> tuple[MoeLayer, ...]:
    """The routed-experts layers of ``graph``, in graph order (empty for a dense model).

    Parameters
    ----------
    graph:
        A coarse op graph (raw import, or after :func:`objectives.moe.routed_graph`).

    Returns
    -------
    tuple of MoeLayer
        One per TopK whose scores come from a router linear and whose span holds expert ops.

    Examples
    --------
    >>> from planner.core.graph import OpGraph
    >>> find_moe_layers(OpGraph(name="empty", ops=(), tensors={}, edges=()))
    ()
    """
    producers, consumers = _producers(graph), _consumers(graph)
    layers: list[MoeLayer] = []
    for topk, op in enumerate(graph.ops):
        if op.op_type != "TopK" or not op.outputs:
            continue
        scores = graph.tensors.get(op.inputs[0].tensor) if op.inputs else None
        chosen = graph.tensors.get(op.outputs[-1].tensor)  # values and indices share their shape
        if scores is None or chosen is None or not scores.shape or not chosen.shape:
            continue
        experts, top_k = int(scores.shape[-1]), int(chosen.shape[-1])
        tokens = scores.num_elements // max(1, experts)
        router = _router(graph, topk, producers)
        if router is None or experts < 2 or not 1 <= top_k <= experts:
            continue
        router_weight = graph.tensors[_parameters(graph, graph.ops[router])[0]]
        hidden = router_weight.num_elements // experts
        span = _span(graph, topk)
        indices = op.outputs[-1].tensor
        gathers, matmuls, params = [], [], []
        style: MoeStyle | None = None
        for index in span:
            other = graph.ops[index]
            three_d = [p for p in _parameters(graph, other) if len(graph.tensors[p].shape) == 3
                       and graph.tensors[p].shape[0] == experts]
            if not three_d:
                continue
            if other.kind in ("gather", "embedding") and _reaches(graph, index, indices, producers):
                gathers.append(index)
                params.extend(three_d)
            elif other.kind == "matmul" or other.op_type == "MatMul":
                matmuls.append(index)
                params.extend(three_d)
                style = "batched" if all(_expert_axis_indexed(other, p, experts) for p in three_d) else "routed"
        if gathers:
            style = "gather"
            matmuls = sorted({c for g in gathers for c in consumers.get(g, ()) if c in span})
            seeds = gathers + matmuls
        elif matmuls:
            seeds = matmuls
        else:
            # per-expert linears: 2-D weights whose shape occurs a multiple of E times in the span
            shapes: Counter[tuple[int, ...]] = Counter()
            readers: dict[tuple[int, ...], list[tuple[int, str]]] = {}
            for index in span:
                other = graph.ops[index]
                if other.kind != "matmul":
                    continue
                for p in _parameters(graph, other):
                    shape = graph.tensors[p].shape
                    if len(shape) == 2 and hidden in shape:
                        shapes[shape] += 1
                        readers.setdefault(shape, []).append((index, p))
            expert_shapes = [s for s, n in shapes.items() if n >= experts and n % experts == 0]
            if not expert_shapes:
                continue
            style = "linears"
            pairs = [pair for s in expert_shapes for pair in readers[s]]
            matmuls = sorted({i for i, _ in pairs})
            params = [p for _, p in pairs]
            seeds = matmuls
        expert_ops = _closure(graph, seeds, span, consumers)
        widths = [d for p in params for d in graph.tensors[p].shape[-2:] if d != hidden]
        layers.append(
            MoeLayer(
                topk_op=topk,
                router_op=router,
                num_experts=experts,
                top_k=top_k,
                tokens=tokens,
                hidden=hidden,
                ffn=min(widths) if widths else hidden,
                style=style,  # type: ignore[arg-type]
                expert_ops=tuple(expert_ops),
                weight_gathers=tuple(gathers),
                expert_matmuls=tuple(matmuls),
                expert_parameters=tuple(dict.fromkeys(params)),
            )
        )
    return tuple(layers)


def expert_parameters(layers: tuple[MoeLayer, ...]) -> frozenset[str]:
    """Every expert parameter name of ``layers``."""
    return frozenset(p for layer in layers for p in layer.expert_parameters)
