r"""Megatron-style tensor parallelism as per-op configuration masks (shared by Megatron and DeepSpeed).

A framework that runs ``dp x tp`` (Megatron-LM, DeepSpeed AutoTP) fixes, for every op, which dims
the ``tp`` ranks split; the planner's per-op configurations express the same thing. This module
turns the roles of :func:`importers.transformer.analyze_transformer` into one :class:`OpRule` per op,
and the rules into boolean masks over each op's configurations:

* every op splits its batch dims ``dp`` ways in total (ops without batch dims: not at all);
* column-parallel linears (QKV, FC1, DeBERTa's own position projections, and for Megatron the LM
  head) split their weight's output dims ``tp`` ways, row-parallel ones (output projection, FC2)
  their weight's reduction dims;
  attention matmuls split their heads; Megatron's vocabulary-parallel embedding splits the table
  rows; splits over several dims are contiguous, outer dim first;
* ops between a column- and a row-parallel linear (softmax, rotary, activation, GQA expansion)
  split the one dim whose dimension class a split anchor dim belongs to, ``tp`` ways, or
  ``size`` ways when the dim is smaller and divides ``tp`` (K/V heads shared by several ranks);
* norms and residual ops are replicated over ``tp``, or with sequence parallelism split their
  sequence dim ``tp`` ways;
* where a split cannot be written as a configuration (a vocabulary of 50257 rows does not divide
  by 2: Megatron pads it), the op is expected replicated over ``tp`` and the exporter says so;
* context parallelism (``cp``, Megatron's ``--context-parallel-size``) splits every op's sequence
  dim (:attr:`OpRule.context`) ``cp`` ways more, on top of the ``tp`` pattern: ranks of one ``cp``
  group hold whole weights, as data-parallel replicas do. Attention splits its *query* sequence
  only; its key/value sequence stays whole, so the configuration space itself says that keys and
  values are gathered from the ``cp`` ranks (the edge into attention, :mod:`objectives.redistribution`)
  and their gradients summed back (:mod:`objectives.intra_op`'s ``input_grad``).

DeepSpeed-Ulysses (``ulysses``) runs context parallelism the other way: every op splits its sequence
``cp`` ways as above except the attention core (scores, softmax, values), which an all-to-all over the
``cp`` ranks hands whole sequences of ``heads / (tp x cp)`` heads (Jacobs et al. 2023, "DeepSpeed
Ulysses", arXiv:2309.14509, section 3; DeepSpeed's ``UlyssesSPAttentionHF``); the all-to-all is the
edge between a sequence-split and a heads-split configuration, priced by :mod:`objectives.redistribution`.

When the configuration uses all ``dp x cp x tp`` devices on several nodes, the node placement must
match the frameworks' rank order (tensor parallel ranks innermost, then context parallel, Megatron-Core's
``tp-cp-ep-dp-pp``): the ``tp`` split crosses ``max(1, tp / devices_per_node)`` nodes, the sequence
split of ``cp`` the nodes ``tp x cp`` crosses beyond those, and the batch split the rest.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np

from importers.transformer import (
    TransformerModel,
    analyze_transformer,
    embedding_rows_dim,
    head_dims,
    is_parameter,
    output_side_dims,
    reduction_side_dims,
    weight_access,
)
from importers.moe import find_moe_layers, layer_end
from planner.core.configs import ConfigSpace, pads_to_split
from planner.core.errors import UnsupportedExport
from planner.core.graph import Op, OpGraph
from planner.core.memo import IdentityMemo

__all__ = ["OpRule", "TpLayout", "tp_layout", "context_dims", "layout_masks", "MaskResult", "pure_data_parallel_masks", "einsum_projection",
           "linear_only_tp", "moe_spans", "AUTOTP_LINEARS", "DTENSOR_LINEARS"]

Target = Literal["megatron", "deepspeed"]

_GLUE_ROLES = frozenset({"attention-glue", "mlp-glue", "softmax", "other"})


@dataclass(frozen=True, slots=True, kw_only=True)
class OpRule:
    """How one op is laid out under the framework's tensor parallelism."""

    split: tuple[str, ...] = ()
    """Dims split ``tp`` ways, contiguously, outer first; ``()``: replicated over ``tp``."""
    capped: bool = False
    """One glue dim, split ``min(tp, size)`` ways when ``size`` divides ``tp``."""
    sequence: str | None = None
    """The sequence dim that sequence parallelism splits ``tp`` ways."""
    sequence_required: bool = False
    """Under sequence parallelism the op must be sequence-split (norms, residual ops)."""
    fallback_replicated: bool = False
    """When the split is not a configuration (a dim not divisible by ``tp``), replicated is expected."""
    required: bool = False
    """The framework always splits this op (a linear of the layer, attention): with no dim to split
    (heads merged into the batch dim by the export) the pattern cannot be written."""
    context: str | None = None
    """The sequence dim context parallelism splits ``cp`` ways (attention: the query sequence; ``None``:
    the op has no sequence dim and is replicated over ``cp``)."""
    tokens: bool = False
    """The op's batch dims hold the sequence too (a hybrid MoE layer's routing and combine over its flattened
    ``batch x seq`` tokens, :mod:`exporters.megatron.mamba_tp`): under sequence parallelism Megatron runs it on
    each tp rank's sequence shard, so its batch dims split ``dp x tp`` ways in total; otherwise ``dp`` ways."""
    role: str = "other"


@dataclass(frozen=True, slots=True, kw_only=True)
class TpLayout:
    """The per-op rules of one framework for one model."""

    target: Target
    model: TransformerModel
    rules: tuple[OpRule, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MaskResult:
    """Masks over each op's configurations, or why there are none."""

    masks: list[np.ndarray] | None
    reason: str = ""
    """Why the pattern cannot be written at these degrees (``masks is None``)."""
    replicated_fallbacks: tuple[int, ...] = field(default_factory=tuple)
    """Ops expected replicated over tp because their split is not a configuration."""


def _first_in_classes(op: Op, index: int, model: TransformerModel, classes: set[int]) -> str | None:
    """The op's first dim (output order, then the rest) whose class is in ``classes``."""
    order: list[str] = []
    for access in (*op.outputs, *op.inputs):
        for axis in access.axes:
            for dim in axis:
                if dim not in order:
                    order.append(dim)
    order += [d.name for d in op.dims if d.name not in order]
    for dim in order:
        if model.classes.of[index].get(dim) in classes:
            return dim
    return None


def _context_dim(op: Op, index: int, model: TransformerModel) -> str | None:
    """The sequence dim context parallelism splits: the first non-batch ``parallel`` dim of the
    sequence class. Attention's score product iterates (query, key) and the export orders its dims
    as the scores' axes, so the first is the query; the value product's key sequence is a
    reduction dim and the softmax's a normalized one, so neither is chosen."""
    if model.seq_class is None:
        return None
    for dim in op.dims:
        if not dim.is_batch and dim.kind == "parallel" and model.classes.of[index][dim.name] == model.seq_class:
            return dim.name
    return None


def context_dims(graph: OpGraph) -> tuple[str | None, ...]:
    """Per op of ``graph``, the sequence dim context parallelism splits (:func:`_context_dim`, as
    :attr:`OpRule.context`); ``()`` for a model that is not a transformer or has no sequence. The
    search lets these cross nodes (``objectives.pipeline_cost.ContextSplit``)."""
    try:
        model = analyze_transformer(graph)
    except UnsupportedExport:
        return ()
    if model.seq_class is None:
        return ()
    return tuple(_context_dim(op, i, model) for i, op in enumerate(graph.ops))


def _seq_dim(op: Op, index: int, model: TransformerModel) -> str | None:
    if model.seq_class is None:
        return None
    for dim in op.dims:
        if not dim.is_batch and model.classes.of[index][dim.name] == model.seq_class:
            return dim.name
    return None


_LAYOUTS: IdentityMemo[TpLayout] = IdentityMemo(size=64)
"""The layouts of the graphs of a search's micro-batch sizes (a dozen or two), for every target."""


def tp_layout(graph: OpGraph, model: TransformerModel, *, target: Target, moe_tokens: bool = False) -> TpLayout:
    """Per-op tensor-parallel rules of ``target`` (see the module docstring).

    DeepSpeed AutoTP shards only linear layers: its embeddings and LM head stay replicated and it
    has no Megatron-style sequence parallelism. The layouts of the last few graphs are kept (keyed
    by identity: graphs are frozen), since every (dp, tp) family of a pipeline stage asks again.
    ``moe_tokens``: Megatron-Core's MoE layer rules (:func:`_moe_token_ops`), for Megatron-LM's own export;
    off for torchtitan and DTensor, which borrow Megatron's layout but route their own way (with them
    torchtitan's expert-parallel rows of Qwen3-MoE had no masks: 4008a67).
    """
    return _LAYOUTS.get((target, graph, model, moe_tokens),
                        lambda: _tp_layout(graph, model, target=target, moe_tokens=moe_tokens))


def _tp_layout(graph: OpGraph, model: TransformerModel, *, target: Target, moe_tokens: bool = False) -> TpLayout:
    ops = graph.ops
    anchors: dict[int, tuple[str, ...]] = {}
    vocab_parallel = target == "megatron"
    positions = {i for block in model.attention for i in block.position_proj}
    for i, (op, role) in enumerate(zip(ops, model.roles)):
        if role in ("qkv", "fc1") or (role == "lm-head" and vocab_parallel):
            anchors[i] = output_side_dims(graph, op)
        elif i in positions:
            anchors[i] = _position_projection_dims(graph, op)
        elif role in ("out-proj", "fc2"):
            anchors[i] = reduction_side_dims(graph, op)
        elif role in ("attention-score", "attention-value"):
            anchors[i] = head_dims(graph, op)
        elif role == "embedding" and vocab_parallel:
            rows = embedding_rows_dim(graph, op)
            anchors[i] = (rows,) if rows is not None else ()
    tp_classes = {model.classes.of[i][dims[0]] for i, dims in anchors.items() if dims}
    routers, tokens = _moe_token_ops(graph, model, tp_classes) if vocab_parallel and moe_tokens else (frozenset(), frozenset())
    rules = []
    for i, (op, role) in enumerate(zip(ops, model.roles)):
        if i in routers:  # TopKRouter: its weight whole on every tp rank, on the rank's sequence shard
            rules.append(OpRule(sequence=_seq_dim(op, i, model), sequence_required=True, role="router"))
        elif i in tokens:
            rules.append(OpRule(tokens=True, role="moe-tokens"))
        elif i in anchors:
            fallback = role in ("embedding", "lm-head")
            rules.append(OpRule(split=anchors[i], fallback_replicated=fallback, required=not fallback, role=role))
        elif role in ("norm", "residual", "latent-proj"):
            # MLA's down-projections (importers.mla) are Megatron's ``TELinear(parallel_mode="duplicated")``:
            # replicated over tp, on the sequence shard under sequence parallelism, as a norm (exporters.megatron.mla)
            rules.append(
                OpRule(sequence=_seq_dim(op, i, model) if vocab_parallel else None, sequence_required=True, role=role)
            )
        elif role == "position-embedding":
            rules.append(OpRule(sequence=_seq_dim(op, i, model) if vocab_parallel else None, role=role))
        elif role in _GLUE_ROLES or (role == "head-glue" and vocab_parallel):
            dim = _first_in_classes(op, i, model, tp_classes)
            rules.append(
                OpRule(split=(dim,) if dim else (), capped=True, fallback_replicated=True, role=role)
            )
        else:  # embeddings and head under DeepSpeed, extra linears: replicated over tp
            rules.append(OpRule(role=role))
    rules = [dataclasses.replace(rule, context=_context_dim(op, i, model)) for i, (op, rule) in enumerate(zip(ops, rules))]
    return TpLayout(target=target, model=model, rules=interned_rules(rules))


def moe_spans(graph: OpGraph) -> tuple[frozenset[int], frozenset[int]]:
    """``(router linears, ops of each MoE layer after its router up to the layer's end)``: the layer ends at its
    weighted combine, or at the sum of routed and shared experts (:func:`importers.moe.layer_end`). Megatron-Core's
    token rules (:attr:`OpRule.tokens`) are looked for there only, in the GPT family (:func:`_moe_token_ops`) and the
    hybrid stack (:mod:`exporters.megatron.mamba_tp`): an op after the layer (the residual add, the next layer's norm
    and attention, the labels of a loss) is ruled as any op of the model."""
    layers = find_moe_layers(graph)
    span = {i for layer in layers for i in range(layer.router_op + 1, layer_end(graph, layer) + 1)}
    return frozenset(layer.router_op for layer in layers), frozenset(span)


def _moe_token_ops(graph: OpGraph, model: TransformerModel, tp_classes: set[int]) -> tuple[frozenset[int], frozenset[int]]:
    """``(router linears, ops on flattened tokens)`` of Megatron's MoE layers: the routing ops after each router, the
    weighted combine and the sum with the shared experts read the tokens merged into one batch dim (no sequence dim)
    and hold nothing tp splits (a residual op: the stream's width); under sequence parallelism megatron-core runs them
    on each tp rank's sequence shard (:attr:`OpRule.tokens`). Looked for in each layer's span (:func:`moe_spans`)."""
    routers, span = moe_spans(graph)
    classes = model.classes.of
    tokens = frozenset(
        i for i in span
        if _seq_dim(graph.ops[i], i, model) is None and any(d.is_batch for d in graph.ops[i].dims)
        and (model.roles[i] == "residual" or not any(classes[i][d.name] in tp_classes for d in graph.ops[i].dims)))
    return routers, tokens


AUTOTP_LINEARS = "DeepSpeed AutoTP training partitions torch.nn.Linear layers only"
DTENSOR_LINEARS = "ColwiseParallel and RowwiseParallel shard torch.nn.Linear modules only"
"""What each launcher's tensor parallelism shards, said after :func:`einsum_projection`'s clause."""


def linear_only_tp(graph: OpGraph, shards: str) -> str | None:
    """``"<einsum_projection's clause>; <shards>"`` for a transformer with a projection no ``nn.Linear`` (``None``:
    not a transformer, or every projection is one): the reason a launcher that shards linears runs no tp > 1."""
    try:
        found = einsum_projection(graph, analyze_transformer(graph))
    except UnsupportedExport:
        return None
    return f"{found}; {shards}" if found else None


_EINSUM_PROJECTIONS: IdentityMemo[str | None] = IdentityMemo(size=32)
""":func:`einsum_projection` per (graph, model): DTensor's and DeepSpeed's masks ask it for every tp > 1 family of
every stage, and each answer walks every projection (GPT-3 175B on 1,024 devices: 1,600 asks, 7% of the run's CPU)."""


def einsum_projection(graph: OpGraph, model: TransformerModel) -> str | None:
    """The first attention or MLP projection that is no ``torch.nn.Linear`` (``None``: every one is), said as a clause:
    an ``Einsum`` of the activations and a weight, or a weight of other than two axes (XLNet's ``[d, n, d_head]``
    ``q``, ``k``, ``v``, ``o`` and ``r``, Funnel's ``r_kernel``, multiplied with ``torch.einsum``). DeepSpeed AutoTP and
    DTensor's ``ColwiseParallel`` / ``RowwiseParallel`` shard ``nn.Linear`` modules only (``nn.Embedding`` too)."""
    return _EINSUM_PROJECTIONS.get((graph, model), lambda: _einsum_projection(graph, model))


def _einsum_projection(graph: OpGraph, model: TransformerModel) -> str | None:
    """:func:`einsum_projection`, found again."""
    for index, role in enumerate(model.roles):
        op = graph.ops[index]
        access = weight_access(graph, op) if role in ("qkv", "out-proj", "fc1", "fc2") else None
        if access is not None and (op.op_type == "Einsum" or len(access.axes) != 2):
            return f"projection {op.name} multiplies its weight {access.tensor} with torch.einsum, not as a torch.nn.Linear layer"
    return None


def _position_projection_dims(graph: OpGraph, op: Op) -> tuple[str, ...]:
    """The dims a column-parallel position projection splits (DeBERTa's ``pos_key_proj`` and
    ``pos_query_proj`` under ``share_att_key=False``,
    :attr:`importers.transformer.AttentionBlock.position_proj`): its weight's output-side dims, or,
    where the importer reads no weight on the op (the projection of the relative-position table
    depends on no input, so graph-only files keep its weight as a constant), the output dims no
    activation input indexes (``[2k, hidden] x [hidden, heads x head_dim]``: the ``heads x head_dim``
    dim). Its heads are the attention's heads, so it splits as the query and key projections do.
    """
    dims = output_side_dims(graph, op)
    if dims:
        return dims
    read = {d for access in op.inputs if not is_parameter(graph, access.tensor) for axis in access.axes for d in axis}
    return tuple(d for access in op.outputs[:1] for axis in access.axes for d in axis if d not in read)


def interned_rules(rules: Sequence[OpRule]) -> tuple[OpRule, ...]:
    """``rules`` with equal rules as one object: :func:`layout_masks` groups ops by their rule's
    identity, which is cheap, so equal rules must be the same object to share a mask."""
    seen: dict[OpRule, OpRule] = {}
    return tuple(seen.setdefault(rule, rule) for rule in rules)


def _spread(op: Op, rule: OpRule, tp: int) -> dict[str, int] | None:
    """Factors of the rule's split dims at ``tp`` (``None``: not a configuration)."""
    if tp == 1:
        return {}
    if not rule.split:
        return None if rule.required else {}
    if rule.capped:
        dim = op.dim(rule.split[0])
        if not dim.splittable:
            return None
        if dim.size % tp == 0:
            return {dim.name: tp}
        if tp % dim.size == 0:
            return {dim.name: dim.size}
        return None
    remaining = tp
    result: dict[str, int] = {}
    for name in rule.split:
        if remaining == 1:
            break
        dim = op.dim(name)
        if not dim.splittable or dim.is_batch:
            return None
        if dim.size % remaining == 0 or (rule.fallback_replicated and pads_to_split(dim.size, remaining)):
            result[name] = remaining  # a vocabulary tp does not divide is padded (Megatron-LM)
            remaining = 1
        elif remaining % dim.size == 0:
            result[name] = dim.size
            remaining //= dim.size
        else:
            return None
    return result if remaining == 1 else None


def _node_split(dp: int, tp: int, devices_per_node: int, cp: int = 1) -> tuple[int, int, int] | None:
    """``(nodes crossed by the batch split, by the tp split, by the cp split)`` for ``dp x cp x tp``
    in rank order (tp innermost, then cp)."""
    world = dp * cp * tp
    if world <= devices_per_node:
        return 1, 1, 1
    inner = []
    for group in (tp, tp * cp):
        if group > devices_per_node:
            if group % devices_per_node:
                return None
            inner.append(group // devices_per_node)
        else:
            if devices_per_node % group:
                return None
            inner.append(1)
    tp_nodes, model_nodes = inner
    return world // devices_per_node // model_nodes, tp_nodes, model_nodes // tp_nodes


def _describe(factors: dict[str, int]) -> str:
    return " x ".join(f"{k}={v}" for k, v in factors.items() if v > 1) or "replicated"


@dataclass(frozen=True, slots=True, eq=False)
class _SpaceColumns:
    """What :func:`_rows_matching` reads of an op's space, derived once per (tables, dims): every family of
    every stage asks it again with other degrees (a 1T plan: ~29,000 asks, a few hundred distinct spaces)."""

    space: ConfigSpace
    """Held, so the tables' ids in the memo key stay theirs."""
    is_batch: np.ndarray
    """``(n_dims,)`` the op's batch dims."""
    nonbatch: np.ndarray
    """Positions of the non-batch dims among the space's."""
    nonbatch_factors: np.ndarray
    """``(K, non-batch dims)`` their split factors."""
    batch: np.ndarray
    """``(K,)`` product of the batch dims' factors."""
    batch_nodes: np.ndarray
    """``(K,)`` product of the batch dims' inter-node factors."""
    devices_held: np.ndarray
    replica_counts: np.ndarray
    inter_replica_counts: np.ndarray


_SPACE_COLUMNS: "OrderedDict[tuple, _SpaceColumns]" = OrderedDict()
_SPACE_COLUMNS_SIZE = 4096


def _space_columns(op: Op, space: ConfigSpace) -> _SpaceColumns:
    """:class:`_SpaceColumns` of ``op``'s ``space``, kept by the tables' identity and the op's dims."""
    key = (space.table_key, op.dims)
    hit = _SPACE_COLUMNS.get(key)
    if hit is not None:
        _SPACE_COLUMNS.move_to_end(key)
        return hit
    is_batch = np.array([d.is_batch for d in op.dims], dtype=bool)
    nonbatch = np.flatnonzero(~is_batch)
    factors, inter = space.factors, space.inter_factors
    found = _SpaceColumns(
        space=space, is_batch=is_batch, nonbatch=nonbatch, nonbatch_factors=np.ascontiguousarray(factors[:, nonbatch]),
        batch=np.prod(np.where(is_batch, factors, 1), axis=1), batch_nodes=np.prod(np.where(is_batch, inter, 1), axis=1),
        devices_held=space.devices_held, replica_counts=space.replica_counts,
        inter_replica_counts=space.inter_replica_counts,
    )
    _SPACE_COLUMNS[key] = found
    if len(_SPACE_COLUMNS) > _SPACE_COLUMNS_SIZE:
        _SPACE_COLUMNS.popitem(last=False)
    return found


def _rows_matching(
    op: Op,
    space: ConfigSpace,
    *,
    want_batch: int,
    other: dict[str, int],
    nodes: tuple[int, int, int] | None,
    world: int,
    context: str | None = None,
) -> np.ndarray:
    names = space.dim_names
    if space.factors.shape[1] == 0:
        return np.full(space.size, want_batch == 1 and not other, dtype=bool)
    columns = _space_columns(op, space)
    is_batch = columns.is_batch
    want = np.array([other.get(names[i], 1) for i in columns.nonbatch], dtype=np.int64)
    mask = np.all(columns.nonbatch_factors == want, axis=1) & (columns.batch == want_batch)
    used = want_batch * int(np.prod(list(other.values()) or [1]))
    # the framework runs the op on every one of its dp x tp ranks: where the split uses fewer, the
    # remaining tp ranks hold redundant copies (norms, residual adds, glue smaller than tp); where the
    # space's copies fill more devices than this family's world, the op runs idle as it would alone
    on_world = columns.devices_held == world
    filled = mask & on_world
    idle = mask & (columns.replica_counts == 1)
    if filled.any():
        mask = filled
    elif idle.any():
        mask = idle
    if nodes is not None and (nodes[0] > 1 or nodes[1] > 1 or nodes[2] > 1) and (want_batch > 1 or used == world):
        # (an op without a batch split, copied to every rank, may sit anywhere)
        split = [i for i, n in enumerate(names) if other.get(n, 1) > 1 and n != context]
        inter = space.inter_factors
        batch_nodes = columns.batch_nodes
        tp_nodes = np.prod(inter[:, split], axis=1) * columns.inter_replica_counts
        placed = (batch_nodes == nodes[0]) & (tp_nodes == nodes[1])
        if context is not None and other.get(context, 1) > 1:
            # the sequence and the tp split share the cp x tp ranks' nodes (a norm split tp x cp ways
            # along the sequence under sequence parallelism takes them all); which of the two crosses
            # them is left to the search, whose prices prefer Megatron's order (tp inside a node)
            seq_nodes = inter[:, names.index(context)]
            placed = (batch_nodes == nodes[0]) & (tp_nodes * seq_nodes == nodes[1] * nodes[2])
        mask &= ~on_world | placed
    elif nodes is not None and (nodes[1] > 1 or nodes[0] > 1) and not is_batch.any() and used > 1:
        # an op without a batch dim split over model-parallel ranks (a position table's lookup under
        # sequence parallelism) runs once per data-parallel rank: its split stays within the
        # model-parallel ranks' nodes, its copies (the dp ranks) take the others
        split = [i for i, n in enumerate(names) if other.get(n, 1) > 1]
        split_nodes = np.prod(space.inter_factors[:, split], axis=1)
        mask &= ~on_world | (split_nodes <= nodes[1] * nodes[2])
    return mask


def layout_masks(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    layout: TpLayout,
    *,
    dp: int,
    tp: int,
    sequence_parallel: bool,
    devices_per_node: int,
    cp: int = 1,
    ulysses: bool = False,
) -> MaskResult:
    """Boolean masks of the configurations that follow ``layout`` at ``dp x cp x tp``.

    ``ulysses``: context parallelism as DeepSpeed-Ulysses runs it (module docstring): the attention
    core splits its heads ``tp x cp`` ways over the whole sequence, every other op its sequence.
    Returns a :class:`MaskResult` whose ``masks`` is ``None`` (with the reason) when some op has no
    such configuration.
    """
    if dp < 1 or tp < 1 or cp < 1:
        return MaskResult(masks=None, reason=f"degrees must be positive (dp={dp}, cp={cp}, tp={tp})")
    if sequence_parallel and tp == 1:
        return MaskResult(masks=None, reason="sequence parallelism needs tp > 1")
    world = dp * cp * tp
    nodes = _node_split(dp, tp, devices_per_node, cp)
    # The layers repeat: ops of one shape and rule share one answer. Groups are numbered in the
    # order of their first op, so the first group that fails names the first op that fails.
    firsts, group_of = _op_groups(graph, spaces, layout.rules)
    answers = []
    for index in firsts:
        mask, reason, fallback = _layout_mask_of(
            graph.ops[index], spaces[index], layout.rules[index], tp=tp, sequence_parallel=sequence_parallel,
            nodes=nodes, world=world, cp=cp, ulysses=ulysses,
        )
        if mask is None:
            return MaskResult(masks=None, reason=reason)
        answers.append((mask, fallback))
    fell_back = np.array([fallback for _, fallback in answers], dtype=bool)
    return MaskResult(
        masks=[answers[group][0] for group in group_of],
        replicated_fallbacks=tuple(int(i) for i in np.flatnonzero(fell_back[np.asarray(group_of, dtype=np.int64)])),
    )


_GROUPS_SIZE = 64
_GROUPS: IdentityMemo = IdentityMemo(size=_GROUPS_SIZE)


def _remembered(key_objects: tuple, build):
    """``build()``, kept for the most recently used ``key_objects`` (a tag and immutable objects)."""
    return _GROUPS.get(key_objects, build)


def _numbered(keys) -> tuple[list[int], list[int]]:
    """``(first index of each distinct key, group of each key)``, groups numbered by first index."""
    found: dict = {}
    firsts: list[int] = []
    group_of: list[int] = []
    for index, key in enumerate(keys):
        if key not in found:
            found[key] = len(firsts)
            firsts.append(index)
        group_of.append(found[key])
    return firsts, group_of


def _op_groups(
    graph: OpGraph, spaces: Sequence[ConfigSpace], rules: tuple[OpRule, ...] | None,
) -> tuple[list[int], list[int]]:
    """``(first op of each group, group of each op)``: ops with equal dims and shared tables and
    (``rules`` given) the same rule object (:func:`interned_rules`). Kept for the last few graphs,
    spaces and rules, since every family of a stage asks again (a family with its own rules reuses
    the shapes' grouping)."""
    shapes = _remembered(("shapes", graph, spaces), lambda: _shapes(graph, spaces))
    # keyed by the shapes object, which equal tables share (:func:`_shapes`): a stage model built
    # again (its pair released, or another launcher's cache) reuses the grouping
    if rules is None:
        return _remembered(("groups", shapes), lambda: _numbered(shapes))
    return _remembered(("groups", shapes, rules), lambda: _numbered(zip(shapes, map(id, rules))))


_SHAPES: "OrderedDict[tuple, tuple[OpGraph, Sequence[ConfigSpace], list[int]]]" = OrderedDict()


def _shapes(graph: OpGraph, spaces: Sequence[ConfigSpace]) -> list[int]:
    """The group of each op by its dims and tables, one list per graph and tables' content: every
    build of a stage model shares the tables of equal ops (:func:`planner.core.configs.enumerate_configs`),
    so the builds of one (stage size, batch) have equal :attr:`ConfigSpace.table_key` tuples (the
    entry holds the spaces, which keeps those ids theirs). The op's dims need no key: the graph fixes them."""
    key = (id(graph), tuple(s.table_key for s in spaces))
    hit = _SHAPES.get(key)
    if hit is not None and hit[0] is graph:
        _SHAPES.move_to_end(key)
        return hit[2]
    shapes = _numbered((s.table_key, op.dims) for op, s in zip(graph.ops, spaces))[1]
    _SHAPES[key] = (graph, spaces, shapes)
    while len(_SHAPES) > _GROUPS_SIZE:
        _SHAPES.popitem(last=False)
    return shapes


_LAYOUT_MASKS: "OrderedDict[tuple, tuple[ConfigSpace, np.ndarray, bool]]" = OrderedDict()
_LAYOUT_MASKS_SIZE = 8192
"""Masks by content (issue 22, seventh speed round): every launcher and every search that builds a
stage's cost model again asks for the same op masks; a 1T model's masks are a few thousand distinct
(table, dims, rule, degrees) keys of a few KB each."""


def _layout_mask_of(
    op: Op, space: ConfigSpace, rule: OpRule, *, tp: int, sequence_parallel: bool, nodes: tuple[int, int, int] | None,
    world: int, cp: int = 1, ulysses: bool = False,
) -> tuple[np.ndarray | None, str, bool]:
    """:func:`_op_layout_mask`, remembered by content: the space's tables (:attr:`ConfigSpace.table_key`,
    whose arrays :func:`planner.core.configs.enumerate_configs` shares between equal ops of every
    model it builds; the entry holds the space, so the ids stay its own), the op's dims, the rule (a
    frozen dataclass, compared by value) and the degrees. The mask reads nothing else of the op (its
    name only goes into a refusal, which is not kept: it is computed again with the op's own name)."""
    key = (space.table_key, op.dims, rule, tp, sequence_parallel, nodes, world, cp, ulysses)
    hit = _LAYOUT_MASKS.get(key)
    if hit is not None:
        _LAYOUT_MASKS.move_to_end(key)
        return hit[1], "", hit[2]
    mask, reason, fallback = _op_layout_mask(
        op, space, rule, tp=tp, sequence_parallel=sequence_parallel, nodes=nodes, world=world, cp=cp, ulysses=ulysses,
    )
    if mask is not None:
        _LAYOUT_MASKS[key] = (space, mask, fallback)
        if len(_LAYOUT_MASKS) > _LAYOUT_MASKS_SIZE:
            _LAYOUT_MASKS.popitem(last=False)
    return mask, reason, fallback


def _op_layout_mask(
    op: Op, space: ConfigSpace, rule: OpRule, *, tp: int, sequence_parallel: bool, nodes: tuple[int, int, int] | None,
    world: int, cp: int = 1, ulysses: bool = False,
) -> tuple[np.ndarray | None, str, bool]:
    """``(mask, reason, replicated fallback)`` of one op in :func:`layout_masks`: its mask (read-only,
    ``None`` with the reason when it has no such configuration), and whether it fell back to replicated."""
    want_batch = world // (tp * cp) if any(d.is_batch for d in op.dims) else 1
    if rule.tokens and sequence_parallel and cp == 1:  # (the hybrid export runs cp = 1 only)
        return _token_shard_mask(op, space, rule, tp=tp, nodes=nodes, world=world, want_batch=want_batch)
    if ulysses and cp > 1 and rule.role in _ULYSSES_CORE:
        return _ulysses_core_mask(op, space, rule, tp=tp, cp=cp, want_batch=want_batch, nodes=nodes, world=world)
    spread = _spread(op, rule, tp)
    fallback = False
    if spread is None:
        if not rule.fallback_replicated:
            what = "/".join(rule.split) or "any dim (its heads are not a dim of their own)"
            return None, f"op {op.name} ({rule.role}) cannot split {what} {tp} ways", False
        fallback, spread = True, {}
    candidates = [spread]
    if sequence_parallel and rule.sequence is not None:
        seq = op.dim(rule.sequence)
        if seq.splittable and seq.size % tp == 0:
            candidates = [{rule.sequence: tp}] if rule.sequence_required else [spread, {rule.sequence: tp}]
        elif rule.sequence_required:
            return None, f"op {op.name} ({rule.role}) cannot split its sequence dim {seq.name} {tp} ways", False
    elif sequence_parallel and rule.sequence_required:
        return None, f"op {op.name} ({rule.role}) has no sequence dim to split", False
    context = rule.context if cp > 1 else None
    if context is not None:
        seq = op.dim(context)
        if not seq.splittable or any(seq.size % (c.get(context, 1) * cp) for c in candidates):
            return None, f"op {op.name} ({rule.role}) cannot split its sequence dim {seq.name} {cp} ways more for cp", False
        candidates = [{**c, context: c.get(context, 1) * cp} for c in candidates]
    base = {context: cp} if context is not None else {}
    mask = np.zeros(space.size, dtype=bool)
    for other in candidates:
        mask |= _rows_matching(op, space, want_batch=want_batch, other=other, nodes=nodes, world=world, context=context)
    if not mask.any() and rule.fallback_replicated and spread:
        # a padded split the space does not enumerate (PaSE's rule): replicated over tp, as before
        mask = _rows_matching(op, space, want_batch=want_batch, other=base, nodes=nodes, world=world, context=context)
    if ulysses and cp > 1 and rule.role == "attention-glue":
        # glue beside the core (rotary, the scale, the mask's add) runs on either side of Ulysses'
        # all-to-all: split along the sequence as above, or along the heads as the core is
        heads = _ulysses_core_mask(op, space, rule, tp=tp, cp=cp, want_batch=want_batch, nodes=nodes, world=world)[0]
        if heads is not None:
            mask = mask | heads
    if not mask.any():
        return None, (
            f"op {op.name} ({rule.role}) has no configuration splitting its batch dims {want_batch} "
            f"ways and {_describe(candidates[0])} on the {'tp-innermost ' if nodes else ''}rank order"
        ), fallback
    mask.flags.writeable = False  # shared by every op of this shape
    return mask, "", fallback


def _token_shard_mask(
    op: Op, space: ConfigSpace, rule: OpRule, *, tp: int, nodes: tuple[int, int, int] | None, world: int, want_batch: int,
) -> tuple[np.ndarray | None, str, bool]:
    """:func:`_op_layout_mask` of a :attr:`OpRule.tokens` op under sequence parallelism: its batch dims (the
    flattened tokens) split ``dp x tp`` ways, nothing else split; the tp ranks' share of that split crosses the
    nodes the tp split crosses (``nodes[1]``), as a batch split."""
    if not any(d.is_batch for d in op.dims):
        return None, f"op {op.name} ({rule.role}) has no token dim to split along the sequence", False
    token_nodes = None if nodes is None else (nodes[0] * nodes[1], 1, nodes[2])
    mask = _rows_matching(op, space, want_batch=want_batch * tp, other={}, nodes=token_nodes, world=world)
    if not mask.any():
        return None, (f"op {op.name} ({rule.role}) has no configuration splitting its tokens {want_batch * tp} ways "
                      "(each tp rank's sequence shard)"), False
    mask.flags.writeable = False
    return mask, "", False


_ULYSSES_CORE = frozenset({"attention-score", "softmax", "attention-value"})
"""Roles DeepSpeed-Ulysses runs between its all-to-alls: the attention core, on whole sequences."""


def _ulysses_core_mask(
    op: Op, space: ConfigSpace, rule: OpRule, *, tp: int, cp: int, want_batch: int,
    nodes: tuple[int, int, int] | None, world: int,
) -> tuple[np.ndarray | None, str, bool]:
    """:func:`_op_layout_mask` of an attention-core op under DeepSpeed-Ulysses: its heads split
    ``tp x cp`` ways (the cp ranks' all-to-all trades the sequence split for a heads split), its
    sequence whole; on several nodes the heads split crosses the nodes ``tp x cp`` crosses."""
    spread = _spread(op, rule, tp * cp)
    if not spread:
        what = "/".join(rule.split) or "its heads (not a dim of their own)"
        return None, f"op {op.name} ({rule.role}) cannot split {what} {tp * cp} ways (Ulysses: heads over tp x cp)", False
    model_nodes = None if nodes is None else (nodes[0], nodes[1] * nodes[2], 1)
    mask = _rows_matching(op, space, want_batch=want_batch, other=spread, nodes=model_nodes, world=world)
    if not mask.any():
        return None, (
            f"op {op.name} ({rule.role}) has no configuration splitting its batch dims {want_batch} ways and "
            f"{_describe(spread)}"
        ), False
    mask.flags.writeable = False
    return mask, "", False


def pure_data_parallel_masks(graph: OpGraph, spaces: Sequence[ConfigSpace], *, dp: int) -> MaskResult:
    """Every op splits only its batch dims, ``dp`` ways in total (any model)."""
    firsts, group_of = _op_groups(graph, spaces, None)  # ops of one shape share their tables, so their mask
    group_masks = []
    for index in firsts:
        op, space = graph.ops[index], spaces[index]
        mask = _rows_matching(op, space, want_batch=dp if any(d.is_batch for d in op.dims) else 1, other={}, nodes=None, world=dp)
        if not mask.any():
            return MaskResult(masks=None, reason=f"op {op.name} cannot split its batch dims {dp} ways")
        mask.flags.writeable = False
        group_masks.append(mask)
    return MaskResult(masks=[group_masks[group] for group in group_of])
