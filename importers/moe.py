r"""Routed-experts (Mixture-of-Experts) layers in a coarse op graph.

A routed-experts layer is ``router linear -> softmax/sigmoid -> TopK -> experts -> weighted
combine``. Three router forms are recognised:

* plain top-k (Mixtral, Qwen2-MoE): one TopK over the scores;
* top-k first (Granite-MoE's ``GraniteMoeTopKRouter``): the TopK over the raw logits,
  then a softmax over the ``k`` chosen logits (:attr:`MoeLayer.weights_softmax`). Softmax is monotonic
  and ``exp(l_i) / sum_chosen exp(l_j) = p_i / sum_chosen p_j``, so this is exactly a softmax over every
  expert, its top-k divided by their sum: read as a ``softmax`` router, renormalised
  (Megatron-Core's default order, ``moe_router_pre_softmax=False``);
* group-limited top-k with a bias correction (DeepSeek-V3's ``DeepseekV3TopkRouter``): sigmoid scores
  plus a per-expert bias (``e_score_correction_bias``, read only by the expert choice), the experts
  in ``n_group`` groups, each group scored by the sum of its top-2, the top ``topk_group`` groups
  kept (a second TopK, then a mask), then the top-k experts of the kept groups (a third TopK). The
  last TopK is the routing decision; the two before it, fed by the same router linear, are recorded
  as the layer's ``group_topks`` (``groups``, ``topk_groups``). The selected weights' normalisation
  (a divide by their sum, which the coarsening reads as a norm) and the routed scaling factor are
  router ops, not the end of the layer;
* SparseMixer (Phi-3.5-MoE's ``sparsemixer``, Liu et al. 2024, "GRIN: GRadient-INformed MoE",
  arXiv:2409.12136; transformers' ``PhimoeTopKRouter``): no TopK, ``k`` rounds of ``max`` instead. Round 1
  takes the ``ArgMax`` of the logits; each later round the ``ArgMax`` of the logits with the experts already
  chosen set to ``-inf`` (a ``ScatterElements`` of the previous round's scores by its indices); a ``Concat``
  joins the rounds' ``[T, 1]`` indices into the ``[T, k]`` choice, which that ``Concat`` stands for here
  (:attr:`MoeLayer.argmax_rounds`). Each round's weight is a softmax over the logits within a relative
  margin of that round's maximum (``2 router_jitter_noise``), gathered at the chosen expert: neither a
  softmax's nor a sigmoid's top-k, so the score function reads ``sparsemixer``, which no launcher's router
  flags express. The experts compute ``T k`` token rows exactly as a top-k router's.

Exporters write the experts in one of four styles, all recognised here:

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

The layer's span is the ops after its TopK up to the next normalisation of the model width (the
next layer's input norm; the router's normalisation of the top-k weights is ``k`` wide) or the next
TopK: the expert ops are found only there, so attention projections of the next layer are never
taken for experts. Shared experts (DeepSeek-V3's ``shared_experts``, Qwen2-MoE's ``shared_expert``)
are the span's other matmuls with 2-D weights that read the router's input, and what they feed: a
dense MLP beside the routed experts, priced as every token's work.

Everything here is a pure function of the :class:`~planner.core.graph.OpGraph`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from planner.core.graph import Op, OpGraph

__all__ = ["MoeStyle", "ScoreFunction", "MoeLayer", "find_moe_layers", "expert_parameters", "choice_outputs",
           "layer_end", "SPARSEMIXER_ROUTER"]

MoeStyle = Literal["gather", "routed", "batched", "linears"]
ScoreFunction = Literal["softmax", "sigmoid", "sparsemixer", "unknown"]

SPARSEMIXER_ROUTER = ("SparseMixer (Phi-3.5-MoE's: its top-k chosen by k rounds of argmax, each chosen expert's weight "
                      "a softmax over the logits within a relative margin of that round's maximum)")
"""A SparseMixer router in the words of a refusal (no launcher's router flags build one: module docstring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayer:
    """One routed-experts layer of a graph."""

    topk_op: int
    """Index of the TopK op (the routing decision: the expert choice); a SparseMixer router's: the ``Concat``
    of its rounds' indices (:attr:`argmax_rounds`)."""
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
    gate+up weight is ``2 ffn`` wide), the model width where a weight has no other dim."""
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
    score_function: ScoreFunction = "unknown"
    """What turns the router's logits into scores: a softmax (Mixtral) or a sigmoid (DeepSeek-V3); ``sparsemixer``
    for a SparseMixer router (module docstring)."""
    weights_softmax: int | None = None
    """Top-k-first routers (Granite-MoE): the softmax op over the chosen logits' ``k`` axis, which makes
    the weights (module docstring); ``None`` where the scores are made before the choice."""
    group_topks: tuple[int, ...] = ()
    """Group-limited routing: the TopK ops before :attr:`topk_op` fed by the same router linear
    (the top-2 within each group, then the top groups), graph order; empty for plain top-k."""
    groups: int = 1
    """Expert groups of a group-limited router (DeepSeek-V3's ``n_group``); 1 for plain top-k."""
    topk_groups: int = 1
    """Groups kept per token (``topk_group``); 1 for plain top-k."""
    shared_ops: tuple[int, ...] = ()
    """Shared experts: the dense MLP ops beside the routed experts (every token through them)."""
    shared_ffn: int = 0
    """Shared experts' hidden width (elements; DeepSeek-V3: ``n_shared_experts x moe_intermediate_size``);
    0 without shared experts."""
    argmax_rounds: tuple[int, ...] = ()
    """SparseMixer routers: the ``ArgMax`` op of each round, in order (``k`` of them); empty for a TopK router."""

    @property
    def sparsemixer(self) -> bool:
        """The router chooses by successive ``ArgMax`` rounds (SparseMixer), not by a TopK."""
        return bool(self.argmax_rounds)

    @property
    def topk_first(self) -> bool:
        """The router takes the top-k of its logits, then a softmax over the ``k`` chosen."""
        return self.weights_softmax is not None

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


_INDEX_DTYPES = frozenset({"int64", "int32"})
"""Element types of a TopK's indices output (ONNX: int64; int32 where a converter narrowed them)."""


def choice_outputs(graph: OpGraph, op: Op) -> tuple[str, str]:
    """``(weights, indices)``: the tensors of a TopK op carrying the chosen values (the routing weights)
    and the chosen indices. ONNX writes the values first, but the coarsening may fold a pointwise op
    on the values into the TopK (DeepSeek-V2's ``topk_weight * routed_scaling_factor`` under
    TorchScript: one op ``TopK+Mul``), whose outputs are then the indices, then the scaled weights.
    The indices are told by their integer element type; by position where the types are not known."""
    names = [o.tensor for o in op.outputs]
    dtypes = [graph.tensors[n].dtype if n in graph.tensors else "" for n in names]
    integer = [n for n, dtype in zip(names, dtypes) if dtype in _INDEX_DTYPES]
    floating = [n for n, dtype in zip(names, dtypes) if dtype.startswith(("float", "bfloat"))]
    if len(integer) == 1 and floating:
        return floating[0], integer[0]
    return names[0], names[-1]


def _passes_scores(graph: OpGraph, op: Op) -> bool:
    """Whether the router walk goes on through ``op``: no parameters, or only vectors (a per-expert
    score bias, where the exporter kept DeepSeek-V3's ``e_score_correction_bias`` as a parameter)."""
    return all(len(graph.tensors[p].shape) == 1 for p in _parameters(graph, op))


def _router(graph: OpGraph, topk: int, producers: dict[str, int]) -> tuple[int, list[int]] | None:
    """Walk back from the TopK's scores to the router linear (:func:`_passes_scores`). Returns the
    router op and the ops walked through (graph order), or None."""
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
                    return source, sorted(seen - {source})
                if _passes_scores(graph, op):
                    nxt.append(source)
        frontier = nxt
    return None


def _score_function(graph: OpGraph, router: int, walked: list[int]) -> ScoreFunction:
    """Softmax or sigmoid: the first such node on the router linear or the ops after it."""
    for index in [router, *walked]:
        op = graph.ops[index]
        for node_type in (op.op_type, *op.node_types):
            if node_type in ("Softmax", "LogSoftmax"):
                return "softmax"
            if node_type in ("Sigmoid", "HardSigmoid"):
                return "sigmoid"
    return "unknown"


_PASS_THROUGH = frozenset({"Cast", "Identity"})
"""ONNX node types that carry the chosen logits unchanged to the softmax (a dtype cast: ``.float()``)."""


def _softmax_after_choice(graph: OpGraph, topk: int, consumers: dict[int, list[int]]) -> int | None:
    """The softmax op that normalises the TopK's values (the chosen logits) over their last axis, the
    ``k`` chosen experts, through at most one cast; ``None`` where no such op reads them."""
    values = {choice_outputs(graph, graph.ops[topk])[0]}
    frontier = [topk]
    for _ in range(2):
        nxt = []
        for index in (c for i in frontier for c in consumers.get(i, ())):
            op = graph.ops[index]
            access = next((a for a in op.inputs if a.tensor in values), None)
            if access is None:
                continue
            if op.kind == "softmax" and "Softmax" in (op.op_type, *op.node_types) and access.axes:
                normalised = {d.name for d in op.dims if d.kind == "normalized"}
                if normalised and set(access.axes[-1]) <= normalised:
                    return index
            elif set(op.node_types or (op.op_type,)) <= _PASS_THROUGH and len(op.inputs) == 1:
                values |= {o.tensor for o in op.outputs}
                nxt.append(index)
        frontier = nxt
    return None


def _span(graph: OpGraph, topk: int, hidden: int) -> range:
    """Ops after the TopK up to the next norm of width ``hidden`` or the next TopK (exclusive)."""
    end = len(graph.ops)
    for index in range(topk + 1, len(graph.ops)):
        op = graph.ops[index]
        if op.op_type == "TopK":
            end = index
            break
        if op.kind == "norm":
            # the router's divide of the top-k weights by their sum reads as a norm k wide
            normed = graph.tensors.get(op.inputs[0].tensor) if op.inputs else None
            if normed is None or not normed.shape or normed.shape[-1] == hidden:
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


def _topk_sizes(graph: OpGraph, op: Op, reader: Op | None = None) -> tuple[int, int, int] | None:
    """``(score width, k, rows)`` of a TopK op, or None where its shapes are unknown; of a SparseMixer choice
    (``op`` its ``Concat``), with ``reader`` the first round's ``ArgMax``, which reads the scores."""
    reader = reader or op
    scores = graph.tensors.get(reader.inputs[0].tensor) if reader.inputs else None
    chosen = graph.tensors.get(op.outputs[-1].tensor) if op.outputs else None  # values and indices share their shape
    if scores is None or chosen is None or not scores.shape or not chosen.shape:
        return None
    width = int(scores.shape[-1])
    return width, int(chosen.shape[-1]), scores.num_elements // max(1, width)


def _is(op: Op, node_type: str) -> bool:
    """Whether ``op`` is, or folds in, an ONNX node of ``node_type``."""
    return node_type in (op.op_type, *op.node_types)


def _argmax_rounds(graph: OpGraph, concat: int, producers: dict[str, int]) -> tuple[int, ...]:
    """The ``ArgMax`` ops a SparseMixer choice's ``Concat`` joins, in round order (module docstring), or ``()``
    where op ``concat`` is not one: two or more ``[.., 1]`` indices along the last axis, each an ``ArgMax``'s,
    the first round's over some scores, each later round's over a ``ScatterElements`` that reads the previous
    round's scores and indices (the experts chosen so far set to ``-inf``), every round over as many scores."""
    op = graph.ops[concat]
    if op.op_type != "Concat" or len(op.inputs) < 2 or len(op.outputs) != 1:
        return ()
    rounds = [producers.get(a.tensor) for a in op.inputs]
    if any(r is None or not _is(graph.ops[r], "ArgMax") or not graph.ops[r].inputs for r in rounds):
        return ()
    shapes = [graph.tensors[t].shape if t in graph.tensors else () for t in
              (op.outputs[0].tensor, *(a.tensor for a in op.inputs), *(graph.ops[r].inputs[0].tensor for r in rounds))]
    joined, picked, scored = shapes[0], shapes[1: len(rounds) + 1], shapes[len(rounds) + 1:]
    if joined[-1:] != (len(rounds),) or any(s[-1:] != (1,) for s in picked) or len({s[-1:] for s in scored}) != 1:
        return ()
    for previous, current in zip(rounds, rounds[1:]):
        masked = producers.get(graph.ops[current].inputs[0].tensor)  # type: ignore[index]
        read = {a.tensor for a in graph.ops[masked].inputs} if masked is not None else set()
        earlier = graph.ops[previous]  # type: ignore[index]
        if masked is None or not _is(graph.ops[masked], "ScatterElements") \
                or not {earlier.inputs[0].tensor, earlier.outputs[0].tensor} <= read:
            return ()
    return tuple(rounds)  # type: ignore[arg-type]


def _choices(graph: OpGraph, producers: dict[str, int]) -> list[tuple[int, int, tuple[int, ...]]]:
    """``(choice, scores reader, argmax rounds)`` of each candidate expert choice, in graph order: a TopK (which
    reads the scores itself, no rounds) or a SparseMixer ``Concat`` (its first round's ``ArgMax`` reads them)."""
    found = []
    for index, op in enumerate(graph.ops):
        if op.op_type == "TopK" and op.outputs:
            found.append((index, index, ()))
        elif op.op_type == "Concat" and (rounds := _argmax_rounds(graph, index, producers)):
            found.append((index, rounds[0], rounds))
    return found


def _expert_ops_in(graph: OpGraph, span: range, indices: str, *, experts: int, hidden: int,
                   producers: dict[str, int], consumers: dict[int, list[int]]):
    """``(style, gathers, matmuls, params, seeds)`` of the experts in ``span``, or None without any.

    ``indices`` is the TopK's indices tensor: a gather of a ``[E, a, b]`` parameter that reads it is
    a per-token gather of whole expert weights."""
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
        matmuls = sorted({c for g in gathers for c in consumers.get(g, ()) if c in span})
        return "gather", gathers, matmuls, params, gathers + matmuls
    if matmuls:
        return style, gathers, matmuls, params, matmuls
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
        return None
    pairs = [pair for s in expert_shapes for pair in readers[s]]
    matmuls = sorted({i for i, _ in pairs})
    return "linears", [], matmuls, [p for _, p in pairs], matmuls


def _group_limits(graph: OpGraph, group_topks: list[int], experts: int) -> tuple[int, int]:
    """``(groups, groups kept)`` of a group-limited router: the TopK over fewer scores than experts
    that divide them (DeepSeek-V3's top ``topk_group`` of ``n_group`` group scores); ``(1, 1)``
    for plain top-k."""
    groups = 1
    for index in group_topks:
        op = graph.ops[index]
        sizes = _topk_sizes(graph, op)
        chosen = graph.tensors.get(op.outputs[-1].tensor) if op.outputs else None
        if sizes is not None and 1 < sizes[0] < experts and experts % sizes[0] == 0:
            return sizes[0], sizes[1]
        if chosen is not None and len(chosen.shape) >= 3 and experts % max(1, chosen.shape[-2]) == 0:
            groups = int(chosen.shape[-2])  # the top-2 within each group: [T, groups, 2]
    # the group choice itself: a TopK of ``groups`` scores, found by its output shape [T, kept]
    for index in group_topks:
        op = graph.ops[index]
        chosen = graph.tensors.get(op.outputs[-1].tensor) if op.outputs else None
        if groups > 1 and chosen is not None and len(chosen.shape) == 2 and chosen.shape[-1] < groups:
            return groups, int(chosen.shape[-1])
    return groups, 1


_PASS_THROUGH_INPUT = frozenset({"Cast", "Identity", "Reshape", "Flatten"})
"""ONNX node types of an op between the layer's input and the router linear that change no value (the router's
``.float()`` cast, ``view(-1, hidden)``): the shared experts may read the tensor before it."""


def _layer_inputs(graph: OpGraph, router: int, producers: dict[str, int]) -> set[str]:
    """The tensors the router linear reads besides its weight, and those they are a cast or view of (one hop)."""
    found = {a.tensor for a in graph.ops[router].inputs if not _is_parameter(graph, a.tensor)}
    for tensor in list(found):
        source = producers.get(tensor)
        if source is not None and set(graph.ops[source].node_types or (graph.ops[source].op_type,)) <= _PASS_THROUGH_INPUT:
            found |= {a.tensor for a in graph.ops[source].inputs if not _is_parameter(graph, a.tensor)}
    return found


def _attention_like(op: Op, graph: OpGraph) -> bool:
    """A softmax, or a product of two activations (no parameter): attention's, never a shared MLP's."""
    return op.kind == "softmax" or (op.kind == "matmul" and not _parameters(graph, op))


def _shared_experts(graph: OpGraph, router: int, span: range, expert_ops: list[int], *, hidden: int,
                    consumers: dict[int, list[int]], producers: dict[str, int]) -> tuple[tuple[int, ...], int]:
    r"""``(ops, hidden width)`` of the shared experts, ``((), 0)`` without any.

    Seeds: the linears with 2-D weights that read the router's input (or the tensor it is a cast or view of), other
    than the router and the experts, before or after the router: Qwen2-MoE, ERNIE-4.5-MoE and Qwen3-Next call
    ``shared_expert(x)`` before ``gate(x)`` (transformers 5.24), so their gate and up projections precede the router
    linear in every export; DeepSeek-V3 calls it after the experts. From the seeds, in graph order up to the span's
    end, every op whose computed inputs all come from ops already found (the seeds' input aside): the activation, the
    gate's product, the down projection, a sigmoid gate's scaling; the op that adds the routed experts' output reads
    a tensor no shared op made and ends the walk. No softmax nor a product of two activations (attention's) is
    walked through, and a seed is kept only if a linear it feeds is found (the down projection): q/k/v projections
    of a layer whose attention reads the same norm (parallel attention) are not shared experts."""
    inputs = _layer_inputs(graph, router, producers)
    experts = set(expert_ops)
    start = min((producers[t] for t in inputs if t in producers), default=-1) + 1
    region = range(start, span.stop)
    seeds = [i for i in region if i != router and i not in experts and graph.ops[i].kind == "matmul"
             and any(len(graph.tensors[p].shape) == 2 for p in _parameters(graph, graph.ops[i]))
             and any(a.tensor in inputs for a in graph.ops[i].inputs) and not _feeds_choice(graph, i, consumers)]
    found = _forward_closure(graph, seeds, region, inputs, experts)
    below = {s: _descendants(s, found, consumers) for s in seeds}
    kept = [s for s in seeds if any(graph.ops[d].kind == "matmul" and _parameters(graph, graph.ops[d]) for d in below[s])]
    mlp = {d for s in kept for d in below[s]}
    kept += [s for s in seeds if s not in kept and below[s] & mlp]  # a gate scaling the down projection's output
    found = _forward_closure(graph, kept, region, inputs, experts)
    # the hidden width is the down projection's other dim: a shared matmul not reading the layer's input
    downs = [p for i in sorted(found - set(kept)) if graph.ops[i].kind == "matmul"
             for p in _parameters(graph, graph.ops[i]) if len(graph.tensors[p].shape) == 2]
    widths = [d for p in downs for d in graph.tensors[p].shape if d != hidden] or [hidden] * bool(downs)
    return tuple(sorted(found)), (min(widths) if widths else 0)


def _feeds_choice(graph: OpGraph, index: int, consumers: dict[int, list[int]]) -> bool:
    """Whether op ``index`` reaches a TopK within three ops (a router linear, of this layer or a group score)."""
    frontier = {index}
    for _ in range(3):
        frontier = {c for i in frontier for c in consumers.get(i, ())}
        if any(graph.ops[i].op_type == "TopK" for i in frontier):
            return True
    return False


def _forward_closure(graph: OpGraph, seeds: list[int], region: range, inputs: set[str], experts: set[int]) -> set[int]:
    """The seeds and the ops of ``region`` after them whose inputs other than parameters all come from the found ops
    (or are the layer's ``inputs``), no expert op, no attention (:func:`_attention_like`). An input that no found op
    made ends the walk: the routed experts' output, or a tensor whose producer the import lost (a graph-only file's
    ``ReduceSum`` without its axes reads as a constant)."""
    found, made = set(seeds), {o.tensor for i in seeds for o in graph.ops[i].outputs}
    for index in region:
        op = graph.ops[index]
        if index in found or index in experts or _attention_like(op, graph):
            continue
        read = [a.tensor for a in op.inputs if a.tensor not in inputs and not _is_parameter(graph, a.tensor)]
        if read and all(t in made for t in read):
            found.add(index)
            made |= {o.tensor for o in op.outputs}
    return found


def _descendants(seed: int, found: set[int], consumers: dict[int, list[int]]) -> set[int]:
    """The ops of ``found`` reachable from ``seed`` through ops of ``found``."""
    reached, stack = set(), [seed]
    while stack:
        for nxt in consumers.get(stack.pop(), ()):
            if nxt in found and nxt not in reached:
                reached.add(nxt)
                stack.append(nxt)
    return reached


def find_moe_layers(graph: OpGraph) -> tuple[MoeLayer, ...]:
    """The routed-experts layers of ``graph``, in graph order (empty for a dense model).

    Parameters
    ----------
    graph:
        A coarse op graph (raw import, or after :func:`objectives.moe.routed_graph`).

    Returns
    -------
    tuple of MoeLayer
        One per router linear: its last TopK (the expert choice) when the TopK's span holds expert
        ops; the router's earlier TopKs are the layer's :attr:`MoeLayer.group_topks`.

    Examples
    --------
    >>> from planner.core.graph import OpGraph
    >>> find_moe_layers(OpGraph(name="empty", ops=(), tensors={}, edges=()))
    ()
    """
    producers, consumers = _producers(graph), _consumers(graph)
    by_router: dict[int, list[tuple[int, tuple[int, list[int]], tuple[int, ...]]]] = {}
    for topk, reader, rounds in _choices(graph, producers):
        if _topk_sizes(graph, graph.ops[topk], graph.ops[reader]) is not None:
            found = _router(graph, reader, producers)
            if found is not None:
                by_router.setdefault(found[0], []).append((topk, found, rounds))
    layers: list[MoeLayer] = []
    for router, topks in sorted(by_router.items(), key=lambda item: item[1][-1][0]):
        topk, (_, walked), rounds = topks[-1]
        # the router's earlier TopKs: every TopK between the router and the expert choice (one whose
        # scores lost their shape in a graph-only file is not linked to the router by the walk)
        group_topks = [i for i in range(router + 1, topk) if graph.ops[i].op_type == "TopK"]
        experts, top_k, tokens = _topk_sizes(graph, graph.ops[topk], graph.ops[rounds[0]] if rounds else None)  # type: ignore[misc]
        if experts < 2 or not 1 <= top_k <= experts:
            continue
        hidden = graph.tensors[_parameters(graph, graph.ops[router])[0]].num_elements // experts
        span = _span(graph, topk, hidden)
        found_experts = _expert_ops_in(graph, span, choice_outputs(graph, graph.ops[topk])[1], experts=experts,
                                       hidden=hidden, producers=producers, consumers=consumers)
        if found_experts is None:
            continue
        style, gathers, matmuls, params, seeds = found_experts
        expert_ops = _closure(graph, seeds, span, consumers)
        # per weight, its dims other than the model width (both, where the expert width is the model's)
        widths = [d for p in params for d in ([d for d in graph.tensors[p].shape[-2:] if d != hidden] or [hidden])]
        groups, topk_groups = _group_limits(graph, group_topks, experts)
        score = "sparsemixer" if rounds else _score_function(graph, router, walked)
        # no score function before the choice: a softmax over the chosen logits (top-k first) makes the weights
        after = _softmax_after_choice(graph, topk, consumers) if score == "unknown" and not group_topks else None
        shared_ops, shared_ffn = _shared_experts(graph, router, span, expert_ops, hidden=hidden, consumers=consumers,
                                                 producers=producers)
        layers.append(MoeLayer(
            topk_op=topk, router_op=router, num_experts=experts, top_k=top_k, tokens=tokens, hidden=hidden,
            ffn=min(widths) if widths else hidden, style=style, expert_ops=tuple(expert_ops),
            weight_gathers=tuple(gathers), expert_matmuls=tuple(matmuls), expert_parameters=tuple(dict.fromkeys(params)),
            score_function="softmax" if after is not None else score, weights_softmax=after,
            group_topks=tuple(group_topks), groups=groups, topk_groups=topk_groups,
            shared_ops=shared_ops, shared_ffn=shared_ffn, argmax_rounds=rounds,
        ))
    return tuple(layers)


def layer_end(graph: OpGraph, layer: MoeLayer) -> int:
    """The op that ends ``layer``'s output: the weighted combine (its last expert op), or, with shared experts, the first
    op after it that reads a shared op's output (the routed + shared sum: Qwen2-MoE adds the two on flattened tokens;
    DeepSeek-V3 runs its shared expert after the combine). What follows (the residual add, the next layer's norm and
    attention, the LM head and loss) is no part of the layer.

    >>> layer = MoeLayer(topk_op=1, router_op=0, num_experts=4, top_k=2, tokens=8, hidden=16, ffn=8, style="routed",
    ...                  expert_ops=(2, 3, 4))
    >>> layer_end(OpGraph(name="g", ops=(), tensors={}, edges=()), layer)
    4
    """
    combine = max(layer.expert_ops, default=layer.topk_op)
    shared = set(layer.shared_ops)
    made = {o.tensor for i in shared for o in graph.ops[i].outputs}
    if not made:  # no shared experts: nothing after the combine to look for
        return combine
    return next((i for i in range(combine + 1, len(graph.ops)) if i not in shared
                 and any(a.tensor in made for a in graph.ops[i].inputs)), combine)


def expert_parameters(layers: tuple[MoeLayer, ...]) -> frozenset[str]:
    """Every expert parameter name of ``layers``."""
    return frozenset(p for layer in layers for p in layer.expert_parameters)
