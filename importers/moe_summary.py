r"""The routed-experts layers of a graph as a launcher configures them: how many, how many experts,
top-k, the router's score function and whether the top-k weights are renormalised
(:func:`moe_summary`; :mod:`importers.moe` finds the layers in full), and whether a linear's scores
feed a TopK or a SparseMixer's first ``ArgMax`` (a router, :func:`feeds_topk`, which :mod:`importers.transformer`
does not count as an extra linear). Nothing here relies on op or module names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping

from importers.moe import choice_outputs, find_moe_layers
from planner.core.graph import Op, OpGraph
from planner.core.memo import IdentityMemo

__all__ = ["MoeSummary", "feeds_topk", "moe_summary"]



def feeds_topk(graph: OpGraph, index: int, hops: int = 3) -> bool:
    """Whether op ``index``'s output reaches a TopK within ``hops`` ops (an MoE router's scores), or op ``index``
    is the router linear of a SparseMixer layer (:attr:`importers.moe.MoeLayer.argmax_rounds`: no TopK)."""
    frontier, argmax = {index}, False
    for _ in range(hops):
        frontier = {e.consumer for e in graph.edges if e.producer in frontier}
        if any(graph.ops[i].op_type == "TopK" for i in frontier):
            return True
        argmax = argmax or any(graph.ops[i].op_type == "ArgMax" for i in frontier)
    return argmax and index in _sparsemixer_routers(graph)


def _sparsemixer_routers(graph: OpGraph) -> frozenset[int]:
    """The router linears of the graph's SparseMixer layers, kept per graph (each extra linear asks)."""
    return _ROUTERS.get((graph,), lambda: frozenset(layer.router_op for layer in find_moe_layers(graph)
                                                     if layer.sparsemixer))


_ROUTERS: IdentityMemo[frozenset[int]] = IdentityMemo(size=8)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeSummary:
    """The routed-experts layers of a graph, as launchers configure them."""

    layers: int
    """MoE layers (TopK routing decisions, or SparseMixer choices)."""
    num_experts: int
    """Experts per layer (the TopK's score width)."""
    top_k: int
    """Experts per token."""
    score_function: Literal["softmax", "sigmoid", "sparsemixer", "unknown"] = "softmax"
    """What makes the router's scores before the TopK; ``sparsemixer``: Phi-3.5-MoE's router, whose weights are
    no top-k of one score function (:mod:`importers.moe`), which no launcher's router builds."""
    renormalized: bool = True
    """Whether the top-k probabilities are divided by their sum (Mixtral; Qwen2-MoE's
    ``norm_topk_prob=False`` does not: the softmax over all experts is kept as is). A top-k-first router
    (Granite-MoE: a softmax over the k chosen logits, :attr:`importers.moe.MoeLayer.topk_first`) is
    renormalised: the same weights. A SparseMixer router is not (each round's weight is a softmax over
    the logits near that round's maximum)."""


def _router_kind(graph: OpGraph, topk: Op, readers: Mapping[str, list[Op]]) -> tuple[str, bool]:
    """``(score function, renormalized)`` of one TopK: the op making its scores, and whether a reader
    of its values, or of the scores gathered by its indices (DeepSeek-V3's ``scores.gather(1,
    topk_indices)``), divides them (by their sum)."""
    source = next((op for op in graph.ops for o in op.outputs if o.tensor == topk.inputs[0].tensor), None)
    kinds = () if source is None else (source.op_type, *source.node_types)
    score = "softmax" if "Softmax" in kinds[-1:] or (source is not None and source.kind == "softmax") else (
        "sigmoid" if "Sigmoid" in kinds else "unknown")
    weights, indices = choice_outputs(graph, topk)
    values = list(readers.get(weights, []))
    values += [reader for op in readers.get(indices, []) if op.kind == "gather"
               and not any(graph.tensors[a.tensor].role == "parameter" for a in op.inputs if a.tensor in graph.tensors)
               for o in op.outputs for reader in readers.get(o.tensor, [])]
    divided = any(t in ("Div", "Reciprocal") for op in values for t in (op.op_type, *op.node_types))
    return score, divided


_SUMMARIES: IdentityMemo["MoeSummary | None"] = IdentityMemo(size=16)
"""The last graphs' summaries (a pipeline search asks for every micro-batch size's graph)."""


def moe_summary(graph: OpGraph) -> MoeSummary | None:
    """The graph's MoE routing (``importers.moe`` finds the layers in full; a launcher needs only the
    expert count and top-k of its TopK ops, its score function and whether the top-k probabilities
    are renormalised), or ``None`` for a dense model or mixed routings. Kept for the last graphs
    (by identity, as :func:`analyze_transformer`): every launcher's families ask on every stage."""
    return _SUMMARIES.get((graph,), lambda: _moe_summary(graph))


def _moe_summary(graph: OpGraph) -> MoeSummary | None:
    readers: dict[str, list[Op]] = {}
    for op in graph.ops:
        for access in op.inputs:
            readers.setdefault(access.tensor, []).append(op)
    found = set()
    layers = 0
    # the routing decisions: each MoE layer's expert choice (a group-limited router's earlier TopKs
    # are part of it: DeepSeek-V3 is one routing of E experts, not three); every TopK where no
    # layer's experts are found
    moe_layers = find_moe_layers(graph)
    chosen_by = {layer.topk_op: layer for layer in moe_layers}
    for index, op in enumerate(graph.ops):
        if op.op_type != "TopK" or not op.outputs or not op.inputs or (moe_layers and index not in chosen_by):
            continue
        scores, chosen = graph.tensors.get(op.inputs[0].tensor), graph.tensors.get(op.outputs[-1].tensor)
        if scores is None or chosen is None or not scores.shape or not chosen.shape:
            continue
        score, renormalized = _router_kind(graph, op, readers)
        if index in chosen_by and chosen_by[index].score_function != "unknown":
            score = chosen_by[index].score_function  # read along the router walk (a bias or a mask between)
        if index in chosen_by and chosen_by[index].topk_first:
            # a softmax over the k chosen logits is the softmax over every expert, its top-k renormalised
            renormalized = True
        found.add((int(scores.shape[-1]), int(chosen.shape[-1]), score, renormalized))
        layers += 1
    for layer in (layer for layer in moe_layers if layer.sparsemixer):  # no TopK: the layer says it all
        found.add((layer.num_experts, layer.top_k, "sparsemixer", False))
        layers += 1
    if len(found) != 1:
        return None
    (experts, top_k, score, renormalized), = found
    return MoeSummary(layers=layers, num_experts=experts, top_k=top_k, score_function=score, renormalized=renormalized)
