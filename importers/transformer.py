r"""Recognise a transformer in an op graph, from its structure (model understanding, beside
:mod:`importers.blocks` and :mod:`importers.moe`).

Megatron-LM and DeepSpeed AutoTP describe a strategy in a transformer's own vocabulary (layers,
hidden size, heads, query groups, column- and row-parallel linears), so the exporters and
``planner estimate`` have to find those in a graph of anonymous coarse ops; they read this module. Nothing here relies on op or module names; the module
path is only carried along for the patterns DeepSpeed needs.

Dimension classes (:func:`dim_classes`)
    A tensor axis is indexed by op dims on both ends of every edge (the producer's output access and
    each consumer's input access). Op dims that index the same axis of the same tensor are one
    *dimension class*: splitting one by ``f`` lays the tensor out like splitting the other by ``f``.
    Where one access maps an axis to several dims (a folded ``768 -> 12 x 64`` reshape) and another
    to one, only the outer dims are joined (a contiguous split of 768 by ``f`` is a split of its
    12 heads by ``f``). Classes are computed with a union-find over ``(op, dim)`` pairs.

Attention (:func:`analyze_transformer`)
    Every softmax whose input comes, through non-matmul ops, from one matmul of two activations
    (the *score*, :math:`QK^T`) and whose output goes to one such matmul (the *value*, :math:`PV`)
    is an attention; where several reach it, the one that does without an index gather is the score
    and the others are position terms gathered into it (DeBERTa's disentangled attention,
    :mod:`importers.attention_terms`). Its projections are the parameter matmuls reached by walking back from
    :math:`Q`, :math:`K` and :math:`V` (and forward from the value matmul, the output projection);
    walks stop at matmuls, norms, softmaxes and embeddings. Heads are the dims the score shares
    with both operands and its output that are not batch dims; the head size is its reduction.
    Query groups come from the K projection's width: ``width / head_dim`` (separate projections)
    or ``(width / head_dim - heads) / 2`` (one fused QKV projection).

MLP
    A parameter matmul whose input comes, through non-matmul ops, only from other parameter matmuls
    outside attention is an ``fc2``; those matmuls are its ``fc1`` (two of them, or one twice as
    wide as ``fc2``'s input: a gated MLP). The FFN size is ``fc2``'s reduction size.

Features and shared experts
    :class:`LayerFeatures` (:mod:`importers.layer_features`), from the ops' ONNX node types
    (:attr:`Op.node_types`) and edges: the MLP activation, a ``Tanh`` between the attention scores
    and the softmax or on the LM head's logits (soft-capping), a norm on a sub-layer's output that
    feeds no matmul (a sandwich norm), post-LN residuals, and the attention mask the importer read
    (causal or bidirectional). An MLP beside routed experts whose first linears read the router's
    input is a shared expert.

Embeddings and head
    Embedding ops (``kind == "embedding"``): the token embedding is the one whose table the LM head
    shares, else the one with the most rows; the others are position embeddings (token types among
    them; the learned absolute position tables are read from their indices,
    :mod:`importers.position_table`). The LM head is
    the last remaining parameter matmul whose output width is the vocabulary size.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping

from importers.layer_features import (
    LayerFeatures, MlpActivation, alibi_of, attention_mask_of, attention_scale_of, inputs_unnormalised, stream_scales,
    mlp_activation as _mlp_activation, mlp_activation_of as _mlp_activation_of, parallel_sublayers, residual_after_norm, sandwich_norm, stack_qk_norm, zero_centred_norms,
)
from importers.attention_streams import kv_reduction
from importers.attention_terms import score_terms
from importers.analysis_memo import alike_of, kept_per_graph
from importers.mla import LatentAttention, latent_attention
from importers.position_table import (  # re-exported: launchers read them here
    PositionTable, position_tables, refuse_past_table, shortfall, too_short,
)
from importers.expert_loop import table_lookups
from importers.moe import find_moe_layers
from importers.moe_summary import MoeSummary, feeds_topk, moe_summary  # re-exported: launchers read both here
from importers.mamba_mixer import mamba_mixers
from importers.conv_mixer import without_conv_mixers
from importers.graph_walk import walk as _walk  # the tests' attention-term walks read it here too
from importers.param_role import is_parameter  # re-exported: the structure readers import it here
from importers.qk_norm import QkNorm, qk_norm_kind, qk_walk_verdict
from planner.core.errors import UnsupportedExport
from planner.core.graph import Op, OpGraph, TensorAccess

__all__ = [
    "Role",
    "DimClasses",
    "AttentionBlock",
    "MlpBlock",
    "TransformerModel",
    "dim_classes",
    "analyze_transformer",
    "weight_access",
    "output_side_dims",
    "reduction_side_dims",
    "head_dims",
    "batch_dims",
    "is_parameter",
    "embedding_rows_dim", "embedding_rows",
    "exclusive_output_dims",
    "MoeSummary",
    "moe_summary",
    "LayerFeatures",
    "MlpActivation",
    "LatentAttention",
    "PositionTable",
    "position_tables",
    "refuse_past_table",
    "shortfall",
    "too_short",
]

Role = Literal[
    "qkv",
    "latent-proj",
    "attention-score",
    "softmax",
    "attention-value",
    "attention-glue",
    "out-proj",
    "fc1",
    "fc2",
    "mlp-glue",
    "norm",
    "embedding",
    "position-embedding",
    "lm-head",
    "head-glue",
    "linear",
    "residual",
    "other",
]
"""What an op does in a transformer (``other``: touches no hidden-size tensor and no TP region;
``latent-proj``: a multi-latent attention's down-projection, :mod:`importers.mla`)."""

# Walks through the graph stop at ops of these kinds: they start or end a region of interest.
_BARRIER_KINDS = frozenset({"matmul", "norm", "softmax", "embedding", "conv", "rnn", "pool"})


# ----------------------------------------------------------------------------------------------
# Small structural helpers




def _dims_of(access: TensorAccess) -> set[str]:
    return {dim for axis in access.axes for dim in axis}


def _output_dims(op: Op) -> set[str]:
    dims: set[str] = set()
    for access in op.outputs:
        dims |= _dims_of(access)
    return dims


def weight_access(graph: OpGraph, op: Op) -> TensorAccess | None:
    """The weight operand of a matmul: a parameter indexed by a reduction dim and an output dim.

    ``None`` for a matmul of activations (attention) or any other op. Two activations that share a
    reduction dim are the product's operands, so a parameter beside them was fused in around it: a
    per-head bias added to the query before the scores (Transformer-XL's ``q + r_w_bias``, Funnel's
    ``einsum("bind,bjnd->bnij", q + r_w_bias, k)``) is no weight.
    """
    if op.kind != "matmul":
        return None
    reductions = {d.name for d in op.dims if d.kind == "reduction"}
    if sum(1 for a in _activation_inputs(graph, op) if _dims_of(a) & reductions) >= 2:
        return None
    outputs = _output_dims(op)
    best: TensorAccess | None = None
    for access in op.inputs:
        if not is_parameter(graph, access.tensor):
            continue
        dims = _dims_of(access)
        if dims & reductions and dims & outputs:
            if best is None or len(dims) > len(_dims_of(best)):
                best = access
    return best


def _activation_inputs(graph: OpGraph, op: Op) -> list[TensorAccess]:
    return [a for a in op.inputs if not is_parameter(graph, a.tensor)]


def output_side_dims(graph: OpGraph, op: Op) -> tuple[str, ...]:
    """Dims of a matmul's weight that also index its output (outer to inner, in weight axis order):
    the dims a column-parallel linear splits."""
    weight = weight_access(graph, op)
    if weight is None:
        return ()
    outputs = _output_dims(op)
    return tuple(d for axis in weight.axes for d in axis if d in outputs)


def reduction_side_dims(graph: OpGraph, op: Op) -> tuple[str, ...]:
    """Reduction dims of a matmul's weight (outer to inner): the dims a row-parallel linear splits."""
    weight = weight_access(graph, op)
    if weight is None:
        return ()
    reductions = {d.name for d in op.dims if d.kind == "reduction"}
    return tuple(d for axis in weight.axes for d in axis if d in reductions)


def batch_dims(op: Op) -> tuple[str, ...]:
    """The op's batch dims (``IterDim.is_batch``)."""
    return tuple(d.name for d in op.dims if d.is_batch)


def head_dims(graph: OpGraph, op: Op) -> tuple[str, ...]:
    """For a matmul of two activations: the attention heads, outer to inner.

    A head dim indexes both operands and the output and is not a batch dim; dims sharing an output
    axis with one are heads too (grouped-query attention reads K/V by group, ``(groups, rep)``).
    """
    acts = _activation_inputs(graph, op)
    if op.kind != "matmul" or len(acts) < 2 or not op.outputs:
        return ()
    shared = _dims_of(acts[0]) & _dims_of(acts[1])
    batch = set(batch_dims(op))
    result: list[str] = []
    for axis in op.outputs[0].axes:
        if any(dim in shared and dim not in batch for dim in axis):
            result.extend(dim for dim in axis if dim not in result and dim not in batch)
    return tuple(result)


def _size(op: Op, dims: Iterable[str]) -> int:
    total = 1
    for name in dims:
        total *= op.dim(name).size
    return total


def _reduction_size(op: Op) -> int:
    return _size(op, (d.name for d in op.dims if d.kind == "reduction"))


def exclusive_output_dims(graph: OpGraph, op: Op, which: int) -> tuple[str, ...]:
    """Output dims of a matmul of activations that only operand ``which`` has, heads excluded
    (``m`` for operand 0, ``n`` for operand 1)."""
    acts = _activation_inputs(graph, op)
    mine = _dims_of(acts[which])
    other = _dims_of(acts[1 - which])
    out = _output_dims(op)
    heads = set(head_dims(graph, op))
    return tuple(
        d.name for d in op.dims if d.name in mine and d.name not in other and d.name in out and d.name not in heads
    )


def _count_parameters(graph: OpGraph, op: Op) -> int:
    return sum(1 for a in op.inputs if is_parameter(graph, a.tensor))


def _canonical(graph: OpGraph, tensor: str) -> str:
    return graph.parameter_aliases.get(tensor, tensor)


# ----------------------------------------------------------------------------------------------
# Dimension classes


@dataclass(frozen=True, slots=True, kw_only=True)
class DimClasses:
    """Equivalence classes of op dims that index the same tensor axis (see module docstring)."""

    of: tuple[Mapping[str, int], ...]
    """Per op, dim name -> class id."""
    members: tuple[tuple[tuple[int, str], ...], ...]
    """Per class id, its ``(op index, dim name)`` members in op order."""

    def cls(self, op: int, dim: str) -> int:
        """Class id of dim ``dim`` of op ``op``."""
        return self.of[op][dim]

    @property
    def count(self) -> int:
        return len(self.members)


def _accesses_by_tensor(graph: OpGraph) -> dict[str, list[tuple[int, TensorAccess]]]:
    by_tensor: dict[str, list[tuple[int, TensorAccess]]] = {}
    for index, op in enumerate(graph.ops):
        for access in (*op.inputs, *op.outputs):
            name = graph.parameter_aliases.get(access.tensor, access.tensor)
            by_tensor.setdefault(name, []).append((index, access))
    return by_tensor


def dim_classes(graph: OpGraph) -> DimClasses:
    """Union-find of ``(op, dim)`` over shared tensor axes (see module docstring).

    Examples
    --------
    >>> from planner.core.graph import IterDim, Op, OpGraph, Tensor, TensorAccess
    >>> t = {n: Tensor(name=n, shape=(4, 8), dtype="float32", role="activation") for n in "xy"}
    >>> a = Op(name="a", kind="elementwise", op_type="Relu", flops=0.0,
    ...        dims=(IterDim(name="d0", size=4), IterDim(name="d1", size=8)),
    ...        inputs=(TensorAccess(tensor="x", axes=(("d0",), ("d1",))),),
    ...        outputs=(TensorAccess(tensor="y", axes=(("d0",), ("d1",))),))
    >>> b = Op(name="b", kind="elementwise", op_type="Relu", flops=0.0,
    ...        dims=(IterDim(name="e0", size=4), IterDim(name="e1", size=8)),
    ...        inputs=(TensorAccess(tensor="y", axes=(("e0",), ("e1",))),), outputs=())
    >>> c = dim_classes(OpGraph(name="g", ops=(a, b), tensors=t, edges=()))
    >>> c.cls(0, "d1") == c.cls(1, "e1"), c.cls(0, "d0") == c.cls(1, "e1")
    (True, False)
    """
    offsets = []
    total = 0
    for op in graph.ops:
        offsets.append(total)
        total += len(op.dims)
    position = [{d.name: offsets[i] + j for j, d in enumerate(op.dims)} for i, op in enumerate(graph.ops)]
    parent = list(range(total))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(x: int, y: int) -> None:
        rx, ry = find(x), find(y)
        if rx != ry:
            parent[max(rx, ry)] = min(rx, ry)

    for accesses in _accesses_by_tensor(graph).values():
        if len(accesses) < 2:
            continue
        rank = min(len(a.axes) for _, a in accesses)
        for axis in range(rank):
            entries = [(i, a.axes[axis]) for i, a in accesses if a.axes[axis]]
            if len(entries) < 2:
                continue
            first_op, first_dims = entries[0]
            anchor = position[first_op].get(first_dims[0])
            for op_index, dims in entries[1:]:
                here = position[op_index].get(dims[0])
                if anchor is not None and here is not None:
                    union(anchor, here)
                # Same split structure on both ends: inner dims correspond one to one.
                if len(dims) == len(first_dims):
                    for a_dim, b_dim in zip(first_dims[1:], dims[1:]):
                        x = position[first_op].get(a_dim)
                        y = position[op_index].get(b_dim)
                        if x is not None and y is not None:
                            union(x, y)
    roots: dict[int, int] = {}
    of: list[dict[str, int]] = []
    members: list[list[tuple[int, str]]] = []
    for index, op in enumerate(graph.ops):
        mapping = {}
        for dim in op.dims:
            root = find(position[index][dim.name])
            if root not in roots:
                roots[root] = len(members)
                members.append([])
            cid = roots[root]
            mapping[dim.name] = cid
            members[cid].append((index, dim.name))
        of.append(mapping)
    return DimClasses(of=tuple(of), members=tuple(tuple(m) for m in members))


def _class_of_dims(classes: DimClasses, op: int, dims: tuple[str, ...]) -> int | None:
    return classes.of[op][dims[0]] if dims else None


# ----------------------------------------------------------------------------------------------
# Walking the graph


@dataclass(frozen=True, slots=True)
class _Adjacency:
    producers: tuple[dict[str, tuple[int, ...]], ...]
    """Per op, input tensor name -> producing ops."""
    consumers: tuple[tuple[int, ...], ...]
    """Per op, consuming ops."""


def _adjacency(graph: OpGraph) -> _Adjacency:
    producers: list[dict[str, list[int]]] = [{} for _ in graph.ops]
    consumers: list[set[int]] = [set() for _ in graph.ops]
    for edge in graph.edges:
        producers[edge.consumer].setdefault(edge.tensor, []).append(edge.producer)
        consumers[edge.producer].add(edge.consumer)
    return _Adjacency(
        producers=tuple({k: tuple(sorted(set(v))) for k, v in p.items()} for p in producers),
        consumers=tuple(tuple(sorted(c)) for c in consumers),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Walker:
    """The graph's adjacency and its matmul kinds, for the walks of the recognisers."""

    graph: OpGraph
    adj: _Adjacency
    param_mm: tuple[bool, ...]
    """Per op: a matmul with a weight (:func:`weight_access`)."""
    act_mm: tuple[bool, ...]
    """Per op: a matmul of two activations (attention's score or value)."""
    input_fed: frozenset[int]
    """The ops that depend on a graph input; the others compute from parameters and constants alone."""

    @classmethod
    def of(cls, graph: OpGraph) -> "_Walker":
        ops = graph.ops
        param_mm = tuple(weight_access(graph, op) is not None for op in ops)
        act_mm = tuple(
            op.kind == "matmul" and not param_mm[i] and len(_activation_inputs(graph, op)) >= 2 for i, op in enumerate(ops)
        )
        adj = _adjacency(graph)
        reading = [i for i, op in enumerate(ops) if any(getattr(graph.tensors.get(a.tensor), "role", "") == "input" for a in op.inputs)]
        _, fed = _walk(reading, lambda i: adj.consumers[i], lambda i: None)
        return cls(graph=graph, adj=adj, param_mm=param_mm, act_mm=act_mm, input_fed=frozenset(fed))

    def back(self, i: int) -> Iterable[int]:
        return (p for ps in self.adj.producers[i].values() for p in ps)

    def fwd(self, i: int) -> Iterable[int]:
        return self.adj.consumers[i]

    def producers_of(self, i: int, tensor: str) -> tuple[int, ...]:
        return self.adj.producers[i].get(tensor, ())

    def _barrier(self, i: int) -> bool:
        return self.graph.ops[i].kind in _BARRIER_KINDS

    def act_matmul_stop(self, i: int) -> str | None:
        """Walk verdict: record a matmul of activations, stop at other barriers."""
        if self.act_mm[i]:
            return "record"
        return "stop" if self._barrier(i) else None

    def param_matmul_stop(self, i: int) -> str | None:
        """Walk verdict: record a parameter matmul, stop at other barriers."""
        if self.param_mm[i]:
            return "record"
        return "stop" if self._barrier(i) else None


# ----------------------------------------------------------------------------------------------
# The recognised structure


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionBlock:
    """One attention: its matmuls, projections and sizes."""

    score: int
    """Op index of :math:`QK^T`."""
    softmax: int
    value: int
    """Op index of :math:`PV`."""
    q_proj: tuple[int, ...]
    k_proj: tuple[int, ...]
    v_proj: tuple[int, ...]
    out_proj: tuple[int, ...]
    heads: int
    head_dim: int
    query_groups: int
    seq_length: int
    """Query length (the score's row count)."""
    hidden_size: int
    """Input width of the Q projection."""
    glue: frozenset[int]
    """Non-matmul ops between the projections and the output projection, and the products of the query or key
    with a learned per-head table added into the scores (Funnel's token-type term, ``q`` times ``seg_embed``)."""
    mla: LatentAttention | None = None
    """Multi-latent attention's projections and sizes (:mod:`importers.mla`); ``None``: Q, K, V projected directly."""
    qk_norm: QkNorm = "none"
    """How Q and K are normalised before the scores (:mod:`importers.qk_norm`; a norm among :attr:`glue`)."""
    position_scores: tuple[int, ...] = ()
    """Products of Q or K with position data gathered into the scores by relative position (DeBERTa's
    c2p and p2c, :mod:`importers.attention_terms`); ``()``: the scores are :math:`QK^T` alone."""
    position_proj: tuple[int, ...] = ()
    """The matmuls projecting the position data :attr:`position_scores` read."""
    kv_reduction: int | None = None
    """The strided conv through which K and V read the query's own input (SegFormer's spatial reduction,
    :mod:`importers.attention_streams`); ``None``: they read it directly, or another stream (cross-attention)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MlpBlock:
    """One MLP: its first linear(s) and its second linear."""

    fc1: tuple[int, ...]
    fc2: int
    ffn_hidden_size: int
    gated: bool
    glue: frozenset[int]


@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerModel:
    """A transformer found in an op graph, in framework terms."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int | None
    position_table_rows: int | None
    """Rows of the largest embedding table beside the token embedding (``None``: none), whatever its
    indices: a token-type table or, in an encoder-decoder, the decoder's word lookup can be it. The
    learned absolute position tables, read from their indices, are :attr:`position_tables`."""
    attention: tuple[AttentionBlock, ...]
    mlps: tuple[MlpBlock, ...]
    token_embedding: int | None
    position_embeddings: tuple[int, ...]
    lm_head: int | None
    tied_embeddings: bool
    gated_mlp: bool
    normalization: Literal["LayerNorm", "RMSNorm"]
    linear_bias: bool
    """Whether the attention output projection and the MLP's linear layers have biases."""
    qkv_bias: bool
    """Whether the query, key and value projections have biases."""
    roles: tuple[Role, ...]
    """Per op."""
    classes: DimClasses
    hidden_class: int | None
    seq_class: int | None
    heads_class: int | None
    head_dim_class: int | None
    ffn_class: int | None
    vocab_class: int | None
    irregular: tuple[str, ...]
    """Why the graph is not one uniform stack of identical layers (empty when it is)."""
    features: LayerFeatures = LayerFeatures()
    shared_experts: tuple[MlpBlock, ...] = ()
    """MLPs beside routed experts, reading the router's input (Qwen2-MoE's and DeepSeek's shared
    experts); also in :attr:`mlps`, one per MoE layer."""
    shared_expert_gate: bool = False
    """The shared experts' output is scaled by ``sigmoid(x w)``, ``w`` one ``hidden``-wide row (Qwen2-MoE)."""
    position_tables: tuple[PositionTable, ...] = ()
    """The learned absolute position tables and the tokens each lookup reads
    (:func:`importers.position_table.position_tables`)."""


# ----------------------------------------------------------------------------------------------
# Recognition: the entry point and its steps


def _analyzed_or_refused(graph: OpGraph) -> "TransformerModel | UnsupportedExport":
    like = alike_of(graph)
    if like is not None:  # the graph it was moved from to another batch: the same structure (analysis_memo)
        return kept_per_graph(_ANALYSES, like, _analyzed_or_refused)
    try:
        return _analyze(graph)
    except UnsupportedExport as exc:
        return exc


_ANALYSES: "OrderedDict[int, tuple[OpGraph, TransformerModel | UnsupportedExport]]" = OrderedDict()


def analyze_transformer(graph: OpGraph) -> TransformerModel:
    """Find the transformer structure of ``graph`` (see the module docstring).

    The result of the last few graphs is kept (keyed by identity: graphs are frozen), since every
    exporter and every table row asks again.

    Parameters
    ----------
    graph:
        The op graph (any model).

    Returns
    -------
    TransformerModel
        Layers, sizes, per-op roles and the dimension classes.

    Raises
    ------
    UnsupportedExport
        When the graph has no attention (a CNN, an MLP, an RNN): Megatron-LM and DeepSpeed's tensor
        parallelism cannot run it.
    """
    result = kept_per_graph(_ANALYSES, graph, _analyzed_or_refused)
    if isinstance(result, UnsupportedExport):
        raise UnsupportedExport(result.reason)
    return result


def _analyze(graph: OpGraph) -> TransformerModel:
    """The recognition, by what it finds: attention blocks (and their heads), MLP blocks, the
    embeddings and LM head, the dimension classes of those sizes, the op roles, and the flags a
    launcher sets (norm kind, biases); the layer count is the number of attention blocks."""
    ops = graph.ops
    walker = _Walker.of(graph)
    irregular: list[str] = []
    attention = _find_attention(walker, irregular)
    if not attention:  # the walker's reasons, when a softmax was found but not read as attention
        # a map several value matmuls read (DiffLlama's differential attention: two SDPA calls whose scores merged)
        maps = [(op, sorted(_walk(walker.fwd(s), walker.fwd, walker.act_matmul_stop)[0])) for s, op in enumerate(ops)
                if op.kind == "softmax"]
        irregular += [f"softmax {op.name}: {len(v)} value matmuls ({', '.join(ops[i].name for i in v[:2])}) read its "
                      "probabilities, where one attention map has one" for op, v in maps if len(v) > 1][:1]
        why = f" that the reader follows ({'; '.join(irregular)})" if irregular else ""
        raise UnsupportedExport(
            f"model '{graph.name}' has no attention (matmul -> softmax -> matmul){why}, so it is not a "
            "transformer: Megatron-LM and DeepSpeed tensor parallelism cannot run it; export it as "
            "the generic plan or with --target deepspeed at tp=1 (ZeRO data parallelism)"
        )
    classes = dim_classes(graph)
    attention = [_with_query_heads(graph, classes, a) for a in attention]  # MQA: the heads are query-only dims
    hidden = attention[0].hidden_size
    attention_ops = {i for a in attention for group in (a.q_proj, a.k_proj, a.v_proj, a.out_proj, a.position_proj, a.glue) for i in group}
    candidates = [i for i in range(len(ops)) if walker.param_mm[i] and i not in attention_ops]
    mlps = _find_mlps(walker, candidates, hidden, irregular)
    mlp_ops = {j for m in mlps for j in (*m.fc1, m.fc2)}
    shared, shared_gate = _shared_experts(graph, mlps)
    layer_mlps = without_conv_mixers(walker, [m for m in mlps if m not in shared], irregular)  # one per layer
    embeddings = table_lookups(graph, layer_mlps, irregular)  # not a traced expert loop's w[e] (said in irregular)
    remaining = [i for i in candidates if i not in mlp_ops]
    token, vocab, tied, lm_head = _embeddings_and_head(graph, embeddings, remaining)
    # + the tables read from their indices: dynamo's ``table[position_ids]`` is a GatherND (kind gather)
    positions = tuple(sorted(({*embeddings} | {t.op for t in position_tables(graph)}) - {token}))
    position_rows = max((embedding_rows(graph, ops[i]) for i in positions), default=None)
    extra_linears = tuple(i for i in remaining if i != lm_head)

    sizes = _size_classes(graph, classes, attention[0], layer_mlps, token, lm_head)
    roles = _assign_roles(
        graph,
        attention=attention,
        mlps=mlps,
        token=token,
        positions=positions,
        lm_head=lm_head,
        extra_linears=extra_linears,
        classes=classes,
        hidden_class=sizes.hidden,
        vocab_class=sizes.vocab,
    )

    _check_uniform(attention, layer_mlps, irregular, ops, shared=shared)
    # an MoE router (a linear whose scores feed a TopK) is part of Megatron's MoE layer: replicated
    # over tp like any extra linear, and no irregularity (exporters add the MoE flags)
    unexplained = [i for i in extra_linears if not feeds_topk(graph, i)]
    if unexplained:
        irregular.append(
            f"{len(unexplained)} linear layer(s) outside attention, MLP and LM head, e.g. {ops[unexplained[0]].name}"
        )
    if mixed := [i for i in unexplained if _conv_inside_mlp(walker, i)]:
        irregular.append(f"a conv inside the MLP (after the linear {ops[mixed[0]].name})")
    linear_bias, qkv_bias = _biases(graph, attention, mlp_ops)
    features = _layer_features(walker, attention, mlps, lm_head, roles, irregular)
    if mixers := mamba_mixers(graph):  # said first: the clauses above follow from them
        irregular.insert(0, f"{len(mixers)} Mamba mixer(s) beside its attention, e.g. {ops[mixers[0]].name}")
    first = attention[0]
    return TransformerModel(
        num_layers=len(attention),
        hidden_size=first.hidden_size,
        num_attention_heads=first.heads,
        num_query_groups=first.query_groups,
        head_dim=first.head_dim,
        ffn_hidden_size=layer_mlps[0].ffn_hidden_size if layer_mlps else 0,
        seq_length=first.seq_length,
        vocab_size=vocab,
        position_table_rows=position_rows,
        attention=tuple(attention),
        mlps=tuple(mlps),
        token_embedding=token,
        position_embeddings=positions,
        lm_head=lm_head,
        tied_embeddings=tied,
        gated_mlp=bool(mlps) and all(m.gated for m in mlps),
        normalization=_normalization(graph),
        linear_bias=linear_bias,
        qkv_bias=qkv_bias,
        roles=roles,
        classes=classes,
        hidden_class=sizes.hidden,
        seq_class=sizes.seq,
        heads_class=sizes.heads,
        head_dim_class=sizes.head_dim,
        ffn_class=sizes.ffn,
        vocab_class=sizes.vocab,
        irregular=tuple(irregular),
        features=features,
        shared_experts=tuple(shared),
        shared_expert_gate=shared_gate,
        position_tables=position_tables(graph),
    )


# ----------------------------------------------------------------------------------------------
# Attention blocks, their heads and query groups


def _find_attention(walker: _Walker, irregular: list[str]) -> list[AttentionBlock]:
    """Every softmax between two matmuls of activations, as an attention block (in op order); a
    softmax whose matmuls do not look like attention, or that has no projections, is noted in
    ``irregular``."""
    attention: list[AttentionBlock] = []
    for s, op in enumerate(walker.graph.ops):
        if op.kind != "softmax":
            continue
        found = _attention_at(walker, s, irregular)
        if found is not None:
            attention.append(found)
    return attention


def _attention_at(walker: _Walker, s: int, irregular: list[str]) -> AttentionBlock | None:
    """The attention around softmax ``s``: its score and value matmuls, its projections (walking
    back from Q, K and V and forward from the value), its heads and query groups."""
    graph, ops = walker.graph, walker.graph.ops
    back, fwd, producers_of, stop = walker.back, walker.fwd, walker.producers_of, walker.param_matmul_stop
    scores, glue_in = _walk(back(s), back, walker.act_matmul_stop)
    values, glue_out = _walk(fwd(s), fwd, walker.act_matmul_stop)
    terms = score_terms(graph, softmax=s, products=scores, back=back, barrier=walker._barrier,  # Q K^T and position terms
                        reads_inputs=walker.input_fed.__contains__,
                        walk_back=lambda starts, verdict: _walk(starts, back, verdict))
    if terms is None or len(values) != 1:
        return None
    score, value = terms.score, values.pop()
    tables, _ = _walk(back(s), back, walker.param_matmul_stop)  # Q or K against a learned per-head table (Funnel's
    tables = {i for i in tables if set(back(i)) & set(back(score))}  # token-type term): the attention's own glue
    score_acts = _activation_inputs(graph, ops[score])
    value_acts = _activation_inputs(graph, ops[value])
    region = glue_in | glue_out | {s}
    probs_side = [k for k, a in enumerate(value_acts[:2]) if set(producers_of(value, a.tensor)) & (region | {s})]
    if len(score_acts) < 2 or len(value_acts) < 2 or len(probs_side) != 1:
        irregular.append(f"softmax {ops[s].name}: its matmuls do not look like attention")
        return None
    v_access = value_acts[1 - probs_side[0]]
    qk_stop = qk_walk_verdict(graph, lambda i: walker.param_mm[i], back, stop)  # through QK-norms (importers.qk_norm)
    q_proj, q_glue = _walk(producers_of(score, score_acts[0].tensor), back, qk_stop)
    k_proj, k_glue = _walk(producers_of(score, score_acts[1].tensor), back, qk_stop)
    v_proj, v_glue = _walk(producers_of(value, v_access.tensor), back, stop)
    out_proj, o_glue = _walk(fwd(value), fwd, stop)
    if not (q_proj and k_proj and v_proj and out_proj):
        irregular.append(f"attention at {ops[score].name} has no Q/K/V or output projection")
        return None
    heads_dims = head_dims(graph, ops[score])
    head_dim = _reduction_size(ops[score])
    m_dims = exclusive_output_dims(graph, ops[score], 0)
    seq_length = _size(ops[score], m_dims)
    q_op = ops[min(q_proj)]
    hidden = _reduction_size(q_op)
    heads = _size(ops[score], heads_dims) if heads_dims else max(1, hidden // max(head_dim, 1))
    mla = latent_attention(  # importers.mla: keys and values from a latent, so no query groups
        graph, q_proj=q_proj, k_proj=k_proj, v_proj=v_proj, out_proj=out_proj, heads=heads, head_dim=head_dim,
        width=lambda i: _size(ops[i], output_side_dims(graph, ops[i])), reduction=lambda i: _reduction_size(ops[i]),
        param_matmul=lambda i: walker.param_mm[i])
    if mla is not None:  # the query's down-projection is the first of its projections, reading the hidden state
        q_proj, hidden = q_proj | ({mla.q_down} if mla.q_down is not None else set()), mla.hidden_size
    groups = heads if mla is not None else _query_groups(graph, q_proj, k_proj, v_proj, heads=heads, head_dim=head_dim)
    if groups is None:
        irregular.append(f"attention at {ops[score].name}: K/V projection widths do not give a whole number of query groups")
        groups = heads
    return AttentionBlock(
        score=score,
        softmax=s,
        value=value,
        q_proj=tuple(sorted(q_proj)),
        k_proj=tuple(sorted(k_proj)),
        v_proj=tuple(sorted(v_proj)),
        out_proj=tuple(sorted(out_proj)),
        heads=heads,
        head_dim=head_dim,
        query_groups=groups,
        seq_length=seq_length,
        hidden_size=hidden,
        glue=frozenset(region | q_glue | k_glue | v_glue | o_glue | terms.glue | tables),
        position_scores=terms.products,
        position_proj=terms.projections,
        mla=mla,
        qk_norm=qk_norm_kind(graph, (q_glue, k_glue), head_dim),
        kv_reduction=kv_reduction(graph, min(q_proj), min(k_proj), back, lambda i: walker.param_mm[i] or ops[i].kind == "softmax"),
    )


def query_dims(graph: OpGraph, classes: DimClasses, block: AttentionBlock) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The score matmul's query-side (``m``) dims as ``(sequence, heads)``. With one KV head (MQA) the key has
    no head axis, so the query's heads are ``m`` dims too (an axis of their own, or folded into the rows): a
    head dim is one whose class holds a dim the output projection sums over (heads x head size), a sequence
    dim's class holds its rows. Heads the key shares (:func:`head_dims`) are not ``m`` dims."""
    score = graph.ops[block.score]
    m_dims, shared = exclusive_output_dims(graph, score, 0), head_dims(graph, score)
    summed = {classes.of[o][d.name] for o in block.out_proj for d in graph.ops[o].dims if d.kind == "reduction"}
    heads = () if shared else tuple(d for d in m_dims if classes.of[block.score][d] in summed)
    sequence = tuple(d for d in m_dims if d not in heads)
    return (sequence, shared or heads) if sequence else (m_dims, shared)


def _with_query_heads(graph: OpGraph, classes: DimClasses, block: AttentionBlock) -> AttentionBlock:
    """``block`` with its sequence length read without the query-only heads (:func:`query_dims`)."""
    sequence, _ = query_dims(graph, classes, block)
    seq_length = _size(graph.ops[block.score], sequence)
    return block if seq_length == block.seq_length else dataclasses.replace(block, seq_length=seq_length)


def _query_groups(
    graph: OpGraph,
    q_proj: set[int],
    k_proj: set[int],
    v_proj: set[int],
    *,
    heads: int,
    head_dim: int,
) -> int | None:
    """Query groups (KV heads) from the projection widths; ``None`` when they do not add up."""
    ops = graph.ops

    def width(group: set[int]) -> int:
        return sum(_size(ops[i], output_side_dims(graph, ops[i])) for i in group)

    if head_dim <= 0:
        return None
    if k_proj & q_proj:  # one fused QKV projection: (heads + 2 * groups) * head_dim columns
        total = width(q_proj | k_proj | v_proj)
        extra = total // head_dim - heads
        if total % head_dim or extra <= 0 or extra % 2:
            return None
        return extra // 2
    kv_width = width(k_proj)
    if k_proj == v_proj:  # fused KV projection
        kv_width //= 2
    if kv_width % head_dim:
        return None
    return kv_width // head_dim


# ----------------------------------------------------------------------------------------------
# MLP blocks


def _find_mlps(walker: _Walker, candidates: list[int], hidden: int, irregular: list[str]) -> list[MlpBlock]:
    """Every ``fc2`` among the ``candidates`` (parameter matmuls outside attention) with its ``fc1``
    (see the module docstring); chained or shared linears are noted in ``irregular``."""
    graph, ops = walker.graph, walker.graph.ops
    candidate_set = set(candidates)
    mlps: list[MlpBlock] = []
    fc1_owner: dict[int, int] = {}
    for i in candidates:
        acts = _activation_inputs(graph, ops[i])
        starts = [p for a in acts for p in walker.producers_of(i, a.tensor)]
        reached, glue = _walk(starts, walker.back, walker.param_matmul_stop)
        # a router reached through the indices of a per-expert bias lookup (GPT-OSS's dynamo file: bias[topk
        # indices] is a GatherND the walk follows back to the router's scores) is no fc1 of the experts
        routers = {j for j in reached if feeds_topk(graph, j)}
        reached = reached - routers if reached - routers else reached
        # An MLP maps the residual stream to itself: fc1 reads and fc2 writes hidden-size vectors.
        widths_ok = _size(ops[i], output_side_dims(graph, ops[i])) == hidden and all(
            _size(ops[j], reduction_side_dims(graph, ops[j])) == hidden for j in reached
        )
        if reached and reached <= candidate_set and widths_ok:
            ffn = _size(ops[i], reduction_side_dims(graph, ops[i]))
            width = sum(_size(ops[j], output_side_dims(graph, ops[j])) for j in reached)
            mlps.append(
                MlpBlock(fc1=tuple(sorted(reached)), fc2=i, ffn_hidden_size=ffn, gated=width == 2 * ffn, glue=frozenset(glue))
            )
            for j in reached:
                fc1_owner.setdefault(j, i)
    fc2s = {m.fc2 for m in mlps}
    chained = [m for m in mlps if set(m.fc1) & fc2s]
    if chained:
        irregular.append(f"linear layers chained inside the MLP at {ops[chained[0].fc2].name}")
    shared_fc1 = [j for j in fc1_owner if sum(j in m.fc1 for m in mlps) > 1]
    if shared_fc1:
        irregular.append(f"linear {ops[shared_fc1[0]].name} feeds several MLP outputs")
    return mlps


# ----------------------------------------------------------------------------------------------
# Embeddings and the LM head


def embedding_rows_dim(graph: OpGraph, op: Op) -> str | None:
    """The dim indexing an embedding table's rows (the vocabulary): the table's first axis."""
    for access in op.inputs:
        if is_parameter(graph, access.tensor) and access.axes and access.axes[0]:
            return access.axes[0][0]
    return None


def embedding_rows(graph: OpGraph, op: Op) -> int:
    """Rows of the parameter table an embedding op (or a position ``GatherND``) looks up, 0 without one."""
    shape = next((graph.tensors[a.tensor].shape for a in op.inputs if is_parameter(graph, a.tensor)), ())
    return int(shape[0]) if shape else 0


def _embedding_table(graph: OpGraph, op: Op) -> str | None:
    for access in op.inputs:
        if is_parameter(graph, access.tensor):
            return access.tensor
    return None


def _embeddings_and_head(
    graph: OpGraph, embeddings: list[int], remaining: list[int]
) -> tuple[int | None, int | None, bool, int | None]:
    """``(token embedding, vocab size, tied, lm head)``."""
    ops = graph.ops
    weights = {}
    for i in remaining:
        access = weight_access(graph, ops[i])
        if access is not None:
            weights[i] = _canonical(graph, access.tensor)
    token = None
    tied = False
    lm_head = None
    for e in embeddings:
        table = _embedding_table(graph, ops[e])
        if table is None:
            continue
        sharing = [i for i, w in weights.items() if w == _canonical(graph, table)]
        if sharing:
            token, lm_head, tied = e, max(sharing), True
            break
    if token is None and embeddings:
        token = max(embeddings, key=lambda e: (embedding_rows(graph, ops[e]), -e))
    vocab = embedding_rows(graph, ops[token]) if token is not None else None
    if lm_head is None and vocab is not None:
        wide = [i for i in remaining if _size(ops[i], output_side_dims(graph, ops[i])) == vocab]
        lm_head = max(wide) if wide else None
    return token, vocab, tied, lm_head


# ----------------------------------------------------------------------------------------------
# Sizes, layer uniformity and launcher flags


@dataclass(frozen=True, slots=True, kw_only=True)
class _SizeClasses:
    """The dimension classes (:class:`DimClasses` ids) of the model's sizes (``None``: not found)."""

    hidden: int | None
    seq: int | None
    heads: int | None
    head_dim: int | None
    ffn: int | None
    vocab: int | None


def _size_classes(
    graph: OpGraph,
    classes: DimClasses,
    first: AttentionBlock,
    mlps: list[MlpBlock],
    token: int | None,
    lm_head: int | None,
) -> _SizeClasses:
    """The classes of the hidden size, sequence, heads and head size (from the first attention),
    the FFN size (the first MLP) and the vocabulary (the token embedding's rows, else the LM head's
    output)."""
    ops = graph.ops
    q_op = min(first.q_proj)
    score = ops[first.score]
    vocab = None
    if token is not None:
        rows = embedding_rows_dim(graph, ops[token])
        vocab = classes.of[token][rows] if rows is not None else None
    elif lm_head is not None:
        vocab = _class_of_dims(classes, lm_head, output_side_dims(graph, ops[lm_head]))
    sequence, heads = query_dims(graph, classes, first)
    return _SizeClasses(
        hidden=_class_of_dims(classes, q_op, reduction_side_dims(graph, ops[q_op])),
        seq=_class_of_dims(classes, first.score, sequence),
        heads=_class_of_dims(classes, first.score, heads),
        head_dim=_class_of_dims(classes, first.score, tuple(d.name for d in score.dims if d.kind == "reduction")),
        ffn=_class_of_dims(classes, mlps[0].fc2, reduction_side_dims(graph, ops[mlps[0].fc2])) if mlps else None,
        vocab=vocab,
    )


def _conv_inside_mlp(walker: _Walker, linear: int) -> bool:
    """Whether ``linear`` feeds a conv whose output, after one elementwise op (the activation), is another
    linear's input: SegFormer's Mix-FFN (fc1, a depthwise conv, GELU, fc2). Wav2Vec2's projection before its
    positional conv is not one: the conv's output is added to the stream."""
    ops, fwd = walker.graph.ops, walker.fwd
    return any(ops[c].kind == "conv" and ops[a].kind == "elementwise" and any(walker.param_mm[m] for m in fwd(a))
               for c in fwd(linear) for a in fwd(c))


def _check_uniform(
    attention: list[AttentionBlock],
    mlps: list[MlpBlock],
    irregular: list[str],
    ops: tuple[Op, ...],
    *,
    shared: list[MlpBlock] = (),  # type: ignore[assignment]
) -> None:
    first = attention[0]
    if reduced := [b for b in attention if b.kv_reduction is not None]:
        irregular.append(f"spatial-reduction attention at {ops[reduced[0].score].name} (K/V from a strided conv, "
                         f"{ops[reduced[0].kv_reduction].name}, of its own input)")
    fields = ("heads", "head_dim", "query_groups", "hidden_size", "seq_length")
    labels = {"head_dim": "head size", "query_groups": "query groups", "hidden_size": "hidden size",
              "seq_length": "sequence length"}  # fmt: skip
    for block in attention[1:]:
        differ = [f for f in fields if getattr(block, f) != getattr(first, f)]
        if differ:
            what = ", ".join(f"{labels.get(f, f)} {getattr(block, f)} vs {getattr(first, f)}" for f in differ)
            irregular.append(f"attention at {ops[block.score].name} differs from the first one ({what})")
            break
    if len(mlps) != len(attention):
        irregular.append(f"{len(attention)} attention blocks but {len(mlps)} MLP blocks")
    elif mlps and len({(m.ffn_hidden_size, m.gated, len(m.fc1)) for m in mlps}) > 1:
        irregular.append("the MLP blocks differ in size")
    if shared and len(shared) != len(attention):
        irregular.append(f"{len(attention)} layers but {len(shared)} with shared experts")
    elif len({(m.ffn_hidden_size, m.gated) for m in shared}) > 1:
        irregular.append("the shared experts differ in size")


def _normalization(graph: OpGraph) -> Literal["LayerNorm", "RMSNorm"]:
    """RMSNorm when every norm with parameters (not an MoE router's divide by a sum) has one (a scale, no bias) and
    does not centre its input (no ``LayerNormalization`` node, no mean subtracted), else LayerNorm (Cohere's too)."""
    rms = [_count_parameters(graph, op) == 1 and not {"LayerNormalization", "Sub"} & set(op.node_types)
           for op in graph.ops if op.kind == "norm" and _count_parameters(graph, op)]
    return "RMSNorm" if rms and all(rms) else "LayerNorm"


def _biases(graph: OpGraph, attention: list[AttentionBlock], mlp_ops: set[int]) -> tuple[bool, bool]:
    """``(linear bias, qkv bias)``: Megatron-LM has one switch for every linear layer's bias and one
    for the QKV projections alone (Qwen2's pattern: ``--disable-bias-linear --add-qkv-bias``)."""
    ops = graph.ops
    attention_ops = {i for a in attention for group in (a.q_proj, a.k_proj, a.v_proj, a.out_proj) for i in group}
    qkv_ops = {i for a in attention for group in (a.q_proj, a.k_proj, a.v_proj) for i in group}
    linear_bias = any(_count_parameters(graph, ops[i]) > 1 for i in (*(attention_ops - qkv_ops), *mlp_ops))
    qkv_bias = any(_count_parameters(graph, ops[i]) > 1 for i in qkv_ops)
    return linear_bias, qkv_bias


# ----------------------------------------------------------------------------------------------
# Shared experts and layer features


def _shared_experts(graph: OpGraph, mlps: list[MlpBlock]) -> tuple[list[MlpBlock], bool]:
    """The MLPs beside routed experts (not expert compute, their ``fc1`` reading the router's input),
    and whether a sigmoid gate scales them: a matmul from the same input to one column with a
    ``Sigmoid`` (Qwen2-MoE's ``shared_expert_gate``)."""
    layers = find_moe_layers(graph)
    if not layers:
        return [], False
    ops = graph.ops
    experts = {i for layer in layers for i in layer.expert_ops}
    router_inputs = {a.tensor for layer in layers for a in _activation_inputs(graph, ops[layer.router_op])}
    shared = [
        m for m in mlps
        if m.fc2 not in experts and all(a.tensor in router_inputs for j in m.fc1 for a in _activation_inputs(graph, ops[j]))
    ]
    gated = bool(shared) and any(
        op.kind == "matmul" and "Sigmoid" in op.node_types and any(a.tensor in router_inputs for a in op.inputs)
        and any(graph.tensors[o.tensor].shape[-1:] == (1,) for o in op.outputs if o.tensor in graph.tensors)
        for op in ops
    )
    return shared, gated


def _layer_features(
    walker: _Walker,
    attention: list[AttentionBlock],
    mlps: list[MlpBlock],
    lm_head: int | None,
    roles: tuple[Role, ...],
    irregular: list[str],
) -> LayerFeatures:
    """The :class:`LayerFeatures` of the layers; MLPs with different activations are noted in ``irregular``."""
    ops = walker.graph.ops
    found: list[MlpActivation | None] = []
    for m in mlps:  # a Gelu node's form (its approximate attribute) read from the file: importers.gelu_form
        found.append(_mlp_activation_of(walker.graph, (*m.fc1, *sorted(m.glue)))
                     or _mlp_activation_of(walker.graph, (m.fc2,)))
    kinds = {a for a in found if a is not None}
    if len(kinds) > 1:
        irregular.append(f"the MLP blocks use different activations ({', '.join(sorted(kinds))})")
    scores = {i for a in attention for i in (a.score, a.softmax, *a.glue)}
    head = set() if lm_head is None else {lm_head, *(i for i in range(lm_head, len(ops)) if roles[i] == "head-glue")}
    post_attention = sandwich_norm(walker.graph, walker.fwd, (i for a in attention for i in a.out_proj))
    post_mlp = sandwich_norm(walker.graph, walker.fwd, (m.fc2 for m in mlps))
    post_norms, inputs = post_attention or post_mlp, _sub_layer_inputs(walker, attention, mlps)
    return LayerFeatures(
        mlp_activation=found[0] if len(kinds) == 1 and None not in found else None,
        attention_softcap=any("Tanh" in ops[i].node_types for i in scores),
        logit_softcap=any("Tanh" in ops[i].node_types for i in head),
        post_attention_norm=post_attention,
        post_mlp_norm=post_mlp,
        attention_mask=attention_mask_of(walker.graph, (a.softmax for a in attention)),
        post_layernorm=residual_after_norm(walker.graph, walker.fwd, inputs),
        alibi=alibi_of(walker.graph, (a.softmax for a in attention)),
        attention_scale=attention_scale_of(walker.graph, (a.softmax for a in attention)),
        parallel_residual=parallel_sublayers(walker.fwd, _attention_then_mlp(attention, mlps)),
        qk_norm=stack_qk_norm(a.qk_norm for a in attention),
        reordered_norm=post_norms and inputs_unnormalised(walker.graph, (w for _, w, _ in inputs)),
        stream_scales=stream_scales(walker.graph, (i for a in attention for i in a.out_proj), head),
        zero_centred_norms=zero_centred_norms(walker.graph))


def _attention_then_mlp(attention: list[AttentionBlock], mlps: list[MlpBlock]) -> list[tuple[tuple[int, ...], int]]:
    """Per attention block, its output projections and the first linear of the next MLP block."""
    firsts = sorted(min(m.fc1) for m in mlps if m.fc1)
    pairs = []
    for block in attention:
        after = [i for i in firsts if i > max(block.out_proj)]
        if block.out_proj and after:
            pairs.append((block.out_proj, after[0]))
    return pairs


def _sub_layer_inputs(
    walker: _Walker, attention: list[AttentionBlock], mlps: list[MlpBlock]
) -> list[tuple[str, int | None, tuple[int, ...]]]:
    """Per attention and MLP: its input tensor (the first Q projection's / ``fc1``'s activation), the
    op that writes it, and its last linears (:func:`importers.layer_features.residual_after_norm`)."""
    found = []
    for first, lasts in [(min(a.q_proj), a.out_proj) for a in attention] + [(min(m.fc1), (m.fc2,)) for m in mlps]:
        acts = _activation_inputs(walker.graph, walker.graph.ops[first])
        tensor = acts[0].tensor if acts else ""
        writers = walker.producers_of(first, tensor)
        found.append((tensor, writers[0] if len(writers) == 1 else None, tuple(lasts)))
    return found


# ----------------------------------------------------------------------------------------------
# Roles


def _assign_roles(
    graph: OpGraph,
    *,
    attention: list[AttentionBlock],
    mlps: list[MlpBlock],
    token: int | None,
    positions: tuple[int, ...],
    lm_head: int | None,
    extra_linears: tuple[int, ...],
    classes: DimClasses,
    hidden_class: int | None,
    vocab_class: int | None,
) -> tuple[Role, ...]:
    ops = graph.ops
    roles: list[Role] = ["other"] * len(ops)
    for i, op in enumerate(ops):
        if op.kind == "norm":
            roles[i] = "norm"
        elif hidden_class is not None and hidden_class in classes.of[i].values():
            roles[i] = "residual"
    for block in mlps:
        for i in block.glue:
            roles[i] = "mlp-glue"
        for i in block.fc1:
            roles[i] = "fc1"
        roles[block.fc2] = "fc2"
    for block in attention:
        for i in block.glue:
            if ops[i].kind != "norm" or block.qk_norm == "per-head":  # a per-head QK-norm splits with the heads
                roles[i] = "attention-glue"
        for group in (block.q_proj, block.k_proj, block.v_proj):
            for i in group:
                roles[i] = "qkv"
        latent = (block.mla.q_down, block.mla.kv_down) if block.mla is not None else ()
        for i in (i for i in latent if i is not None):  # replicated over tp (exporters.megatron.mla)
            roles[i] = "latent-proj"
        for i in block.position_proj:  # the position table projected by Q's or K's weight: split as they are
            roles[i] = "qkv" if weight_access(graph, ops[i]) is not None else "attention-glue"
        for i in (block.score, *block.position_scores):
            roles[i] = "attention-score"
        roles[block.softmax] = "softmax"
        roles[block.value] = "attention-value"
        for i in block.out_proj:
            roles[i] = "out-proj"
    for i in extra_linears:
        roles[i] = "linear"
    if token is not None:
        roles[token] = "embedding"
    for i in positions:
        roles[i] = "position-embedding"
    if lm_head is not None:
        roles[lm_head] = "lm-head"
        if vocab_class is not None:
            for i, op in enumerate(ops):
                if i > lm_head and roles[i] in ("other", "residual") and vocab_class in classes.of[i].values():
                    roles[i] = "head-glue"
    return tuple(roles)
