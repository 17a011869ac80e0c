r"""What a routed-experts layer's router does to its scores, read from the graph (issue 25: a launcher
that builds the router from flags must be told each of these, or refuse).

:mod:`importers.moe` finds the layers: the router linear, its score function (softmax or sigmoid),
the expert choice (the last TopK) and, for a group-limited router, the groups and the groups kept.
Beyond those, the weights a token's experts are mixed with depend on four more things, which
:func:`router_reading` reads per layer (:class:`RouterReading`):

* **the group score**: DeepSeek-V3's ``DeepseekV3MoE.route_tokens_to_experts`` (transformers) scores
  a group by the sum of its top-2 expert scores, a TopK whose ``k`` is the last dim of its output
  ``[T, groups, k]`` (:attr:`RouterReading.group_score_k`), summed by a ``ReduceSum``;
* **an expert bias**: an ``Add`` of a per-expert vector (``e_score_correction_bias``) to the scores
  before the expert choice, between the router linear and the first TopK, while the weights are
  gathered from the scores without it (``router_logits.gather(1, topk_indices)``: a gather reading
  the router's own output and the choice's indices; :attr:`RouterReading.weights_unbiased`);
* **the normalisation**: a ``Div`` of the chosen weights by their sum (``norm_topk_prob``), read by
  :func:`importers.transformer.moe_summary` (``renormalized``);
* **the scaling**: the product of the scalar constants the chosen weights are multiplied by
  (``routed_scaling_factor``, 2.5 in DeepSeek-V3's config), read from the ONNX nodes the coarse
  ops after the choice were made of (:attr:`planner.core.graph.Op.onnx_nodes`): the coarse graph
  drops constants, the file keeps small ones. A factor whose constant a graph-only file stripped
  (an external one-element initializer, its data gone) is not read: :attr:`RouterReading.scaling` is
  ``None``, and an exporter that must write it refuses.

A SparseMixer router (Phi-3.5-MoE, :mod:`importers.moe`) is read as its score function, experts and ``k``
alone: its weights are no top-k of scores, so no group, bias, normalisation or scaling applies.

Everything here is a pure function of the graph and the file it names (:attr:`OpGraph.source_path`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from importers.moe import MoeLayer, ScoreFunction, choice_outputs
from importers.onnx_facts import OnnxFacts, file_facts, per_reading
from planner.core.graph import OpGraph
from planner.core.memo import IdentityMemo

__all__ = ["RouterReading", "router_reading"]

_ELEMENTWISE_KINDS = frozenset({"elementwise", "norm"})
"""Coarse op kinds that carry the chosen weights' divide and scale (the importer folds
``ReduceSum -> Add(eps) -> Div -> Mul`` into one ``norm`` op: a divide by a sum reads as one)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterReading:
    """One MoE layer's router, as a launcher configures it (module docstring)."""

    score_function: ScoreFunction
    num_experts: int
    top_k: int
    groups: int = 1
    """Expert groups (1: plain top-k)."""
    topk_groups: int = 1
    """Groups kept per token."""
    group_score_k: int | None = None
    """Experts whose scores are summed into a group's score (DeepSeek-V3: 2); ``None`` for plain
    top-k or where the graph does not show it (a shape lost in a graph-only file)."""
    group_score_sum: bool = True
    """The group score is a sum of those top scores (a ``ReduceSum`` reads them)."""
    expert_bias: bool = False
    """A per-expert vector is added to the scores before the expert choice."""
    weights_unbiased: bool = True
    """The chosen weights are the scores without that bias: gathered from the router's output by the
    choice's indices, or no bias at all."""
    scaling: float | None = 1.0
    """The product of the scalar factors on the chosen weights (1.0: none); ``None``: a factor is
    there whose constant the file does not hold."""


def _consumers(graph: OpGraph) -> dict[str, list[int]]:
    """Tensor name -> the ops reading it; kept per graph (every MoE layer of a graph asks)."""

    def build() -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for index, op in enumerate(graph.ops):
            for access in op.inputs:
                found.setdefault(access.tensor, []).append(index)
        return found

    return _READERS.get((graph,), build)


_READERS: IdentityMemo[dict[str, list[int]]] = IdentityMemo(size=8)


def _group_score(graph: OpGraph, layer: MoeLayer, readers: dict[str, list[int]]) -> tuple[int | None, bool]:
    """``(k, summed)`` of the within-group TopK: the group TopK whose output is ``[..., groups, k]``."""
    for index in layer.group_topks:
        op = graph.ops[index]
        values = graph.tensors.get(op.outputs[0].tensor) if op.outputs else None
        if values is not None and len(values.shape) >= 3 and values.shape[-2] == layer.groups:
            summed = any("ReduceSum" in (graph.ops[r].op_type, *graph.ops[r].node_types)
                         for r in readers.get(op.outputs[0].tensor, ()))
            return int(values.shape[-1]), summed
    return None, True


def _bias(graph: OpGraph, layer: MoeLayer) -> bool:
    """Whether an ``Add`` between the router linear and the first TopK adds a per-expert vector to the scores (a
    constant or 1-D parameter that no op of the graph computes: the expert bias). The importer may fold the ``Add``
    into the TopK itself (ERNIE-4.5-MoE's ``topk(softmax(logits) + e_score_correction_bias)``, dynamo export: one op
    of node types ``Add`` and ``TopK`` reading the softmax alone). An ``Add`` of one-element constants only
    (:func:`_adds_scalars`: a folded ``x + c``, a temperature offset) shifts every score alike, which changes no
    top-k: no bias."""
    first = min((*layer.group_topks, layer.topk_op))
    for index in range(layer.router_op + 1, first + 1):
        op = graph.ops[index]
        if "Add" not in (op.op_type, *op.node_types) or (op.kind != "elementwise" and index != first):
            continue
        computed = [a for a in op.inputs if a.tensor in graph.tensors and graph.tensors[a.tensor].producer]
        if (len(computed) < len(op.inputs) or len(op.inputs) == 1) and not _adds_scalars(graph, op):
            return True
    return False


def _adds_scalars(graph: OpGraph, op) -> bool:
    """Whether every ``Add`` node ``op`` was made of adds constants of one element only: read from the file's nodes
    (the coarse graph drops small constants and folds the add into its neighbours), else from the op's inputs that
    no op computes (their shapes). ``False`` where neither shows it (a constant the add reads through other nodes):
    read as a bias, as before."""
    sizes = _file_constant_sizes(graph, op)
    if sizes is None:
        sizes = [graph.tensors[a.tensor].num_elements for a in op.inputs
                 if a.tensor in graph.tensors and not graph.tensors[a.tensor].producer]
    return bool(sizes) and all(size == 1 for size in sizes)


def _file_constant_sizes(graph: OpGraph, op) -> list[int] | None:
    """The element counts of the constant operands (initializers, ``Constant`` outputs) of the ``Add`` nodes ``op``
    was made of, from the file; ``None`` without the file, or where an ``Add`` has no constant operand."""
    if not graph.source_path or not Path(graph.source_path).is_file():
        return None
    facts = file_facts(graph.source_path, graph.source_sha256)
    by_name = _nodes_by_name(facts)
    adds = [by_name[n] for n in op.onnx_nodes if n in by_name and by_name[n].op_type == "Add"]
    sizes: list[int] = []
    for node in adds:
        found = [size for name in node.input if (size := _constant_size(facts, name)) is not None]
        if not found:
            return None
        sizes += found
    return sizes or None


def _nodes_by_name(facts: OnnxFacts) -> dict:
    """Node name -> node of the file, kept per reading (every MoE layer's router asks)."""
    return _NODES.get((facts,), lambda: {node.name: node for node in facts.nodes if node.name})


_NODES: IdentityMemo[dict] = IdentityMemo(size=4)


def _constant_size(facts: OnnxFacts, name: str) -> int | None:
    """Elements of the value ``name`` where it is an initializer or a ``Constant`` node's output, else ``None``."""
    if name in facts.initializer_sizes:
        return facts.initializer_sizes[name]
    node = facts.producer.get(name)
    if node is None or node.op_type != "Constant":
        return None
    for attribute in node.attribute:
        if attribute.name == "value":
            return math.prod(attribute.t.dims)
        if attribute.name in ("value_float", "value_int"):
            return 1
        if attribute.name in ("value_floats", "value_ints"):
            return len(attribute.floats or attribute.ints)
    return None


_SCORE_TYPES = frozenset({"Softmax", "LogSoftmax", "Sigmoid", "Cast", "Identity"})
"""ONNX node types of an op that makes the router's scores from its logits, adding nothing (no bias)."""


def _weight_ops(graph: OpGraph, layer: MoeLayer, readers: dict[str, list[int]]) -> tuple[list[int], bool]:
    """``(ops, unbiased)``: the ops right after the choice that carry its weights (a gather of the
    router's scores by the chosen indices, then the divide and scale ops), and whether the weights
    are the router's own output or its score function's (not the biased scores the choice read)."""
    choice, router = graph.ops[layer.topk_op], graph.ops[layer.router_op]
    scores = {o.tensor for o in router.outputs}
    # the score function as an op of its own (Qwen2-MoE's ``probs.gather``, ERNIE's ``routing_weights``): unbiased
    for index in range(layer.router_op + 1, min((*layer.group_topks, layer.topk_op))):
        op = graph.ops[index]
        if set(op.node_types or (op.op_type,)) <= _SCORE_TYPES and any(a.tensor in scores for a in op.inputs):
            scores |= {o.tensor for o in op.outputs}
    weights, indices = choice_outputs(graph, choice)
    gathers = [i for i in readers.get(indices, ()) if graph.ops[i].kind == "gather"
               and any(a.tensor in scores for a in graph.ops[i].inputs)]
    # a top-k-first router's weights are its softmax over the chosen logits (a scale would follow it)
    start = gathers[:1] or [layer.topk_op if layer.weights_softmax is None else layer.weights_softmax]
    selections = _index_masks(graph, layer, readers)
    found, frontier = list(start), list(start)
    for _ in range(3):  # the divide, the scale, a cast: the importer folds them into one or two ops
        # the choice's weights output (not its indices, which the importer may list first: choice_outputs)
        carried = [weights if i == layer.topk_op else graph.ops[i].outputs[0].tensor for i in frontier]
        frontier = [r for t in carried for r in readers.get(t, ())
                    if graph.ops[r].kind in _ELEMENTWISE_KINDS and r not in layer.expert_ops and r not in found
                    and not any(a.tensor in selections for a in graph.ops[r].inputs)]
        found += frontier
    return found, bool(gathers)


def _index_masks(graph: OpGraph, layer: MoeLayer, readers: dict[str, list[int]]) -> set[str]:
    """Tensors computed from the choice's indices alone within two ops (``index == i`` and its cast: the
    one-hot mask a per-expert combine multiplies the weights by, which selects, and scales nothing), the
    choice op's own outputs besides its values included (the importer may fold the comparisons into it)."""
    choice = graph.ops[layer.topk_op]
    found = {o.tensor for o in choice.outputs} - {choice_outputs(graph, choice)[0]}
    frontier = set(found)
    for _ in range(2):
        ops = {r for t in frontier for r in readers.get(t, ()) if graph.ops[r].kind == "elementwise"
               and set(graph.ops[r].node_types or (graph.ops[r].op_type,)) <= {"Equal", "Cast"}}
        frontier = {o.tensor for r in ops for o in graph.ops[r].outputs} - found
        found |= frontier
    return found


@per_reading
def _file_factors(facts: OnnxFacts) -> dict[str, tuple[float | None, ...]]:
    """``{Mul node name: its scalar operands' values}`` of the file (``None``: a one-element operand
    whose data is not in the file; a non-scalar operand is left out), read once per reading of the
    file (:func:`~importers.onnx_facts.per_reading`: a file rewritten in place is read again)."""
    scalars = facts.scalars
    return {node.name: tuple(scalars[i].value for i in node.input if i in scalars)
            for node in facts.nodes if node.op_type == "Mul"}


def _scaling(graph: OpGraph, ops: list[int]) -> float | None:
    """The product of the scalar factors the ONNX ``Mul`` nodes of ``ops`` multiply by (1.0: none);
    ``None`` when one is not in the file, or there is no file to read and the ops multiply."""
    if not any("Mul" in graph.ops[i].node_types for i in ops):
        return 1.0
    if not graph.source_path or not Path(graph.source_path).is_file():
        return None
    factors = _file_factors(graph.source_path, graph.source_sha256)
    scale = 1.0
    # node_types is not in onnx_nodes' order (a fused op lists its types sorted): the file says which node is a Mul
    for name in (n for i in ops for n in graph.ops[i].onnx_nodes if n in factors):
        values = factors[name]
        if not values or any(v is None for v in values):
            return None  # a product of two activations, or a stripped constant: not a readable factor
        scale *= float(np.prod(values))
    return scale


def router_reading(graph: OpGraph, layer: MoeLayer) -> RouterReading:
    """The router of ``layer`` (one of :func:`importers.moe.find_moe_layers`), module docstring.

    >>> RouterReading(score_function="sigmoid", num_experts=256, top_k=8, groups=8, topk_groups=4,
    ...               group_score_k=2, expert_bias=True, scaling=2.5).weights_unbiased  # DeepSeek-V3's sizes
    True
    """
    if layer.sparsemixer:  # no top-k of a score function: nothing more a launcher's router flags could say
        return RouterReading(score_function="sparsemixer", num_experts=layer.num_experts, top_k=layer.top_k)
    readers = _consumers(graph)
    k, summed = _group_score(graph, layer, readers) if layer.groups > 1 else (None, True)
    ops, gathered = _weight_ops(graph, layer, readers)
    bias = _bias(graph, layer)
    return RouterReading(
        score_function=layer.score_function, num_experts=layer.num_experts, top_k=layer.top_k, groups=layer.groups,
        topk_groups=layer.topk_groups, group_score_k=k, group_score_sum=summed, expert_bias=bias,
        weights_unbiased=gathered or not bias, scaling=_scaling(graph, ops),
    )
