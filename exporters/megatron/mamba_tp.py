r"""Megatron-Core's tensor parallelism on a Mamba-2 / hybrid stack, as per-op rules (issue 25).

megatron-core 0.16.1 splits every layer kind of ``MambaModel`` over the ``tp`` ranks
(``ssm/mamba_mixer.py``, ``MambaMixer.__init__``; ``transformer/attention.py``; ``transformer/mlp.py``):

* the mixer's ``in_proj`` is a ``ColumnParallelLinear`` over ``2 d_inner + 2 G N + H`` outputs
  (each rank its ``z, x, B, C, dt`` of ``H / tp`` heads and ``G / tp`` groups), the depthwise
  ``conv1d`` holds ``d_inner / tp + 2 (G / tp) N`` channels per rank, ``dt_bias``, ``A_log``, ``D``
  and the gated norm (``group_size = d_inner / G``) are per rank, the scan runs the rank's heads,
  ``out_proj`` is a ``RowParallelLinear`` (``input_is_parallel=True``): one all-reduce per layer, or
  a reduce-scatter under sequence parallelism;
* attention and MLP layers are GPT's (Q/K/V and ``fc1`` column-parallel, the output projection and
  ``fc2`` row-parallel, heads split); the embedding is vocabulary-parallel and the LM head column-parallel.

So ``tp`` must divide the Mamba heads and groups (``MambaMixer`` asserts ``nheads % tp_size == 0``
and ``ngroups % tp_size == 0``), the attention heads and query groups, and the MLP width
(:func:`tp_refusal`).

The rules (:func:`hybrid_rules`) say it per op, in :mod:`exporters._tp`'s terms, from the graph's
dimension classes (:func:`importers.transformer.dim_classes`) rather than from layer roles: a linear
reading the residual stream's hidden dim is column-parallel (its weight's output dims split), any other
linear row-parallel (its weight's reduction dims); the depthwise conv splits its channels; every other op
splits its first dim in a class an anchor splits (the heads, the groups, ``d_inner``, the vocabulary),
``min(tp, size)`` ways, as the GPT layout's glue does; norms and ops on the residual stream are replicated
over ``tp``, or split along the sequence under sequence parallelism.

MoE layers (``E``, :mod:`exporters.megatron.mamba_moe`, under ``--sequence-parallel`` only): the router linear
(``TopKRouter``) is no anchor: its weight is whole on every rank and it reads the rank's sequence shard, as a norm
does; the routing ops after it and the weighted combine, which read the tokens flattened into one batch dim (no
sequence dim, nothing tp splits), split those tokens ``dp x tp`` ways (:attr:`exporters._tp.OpRule.tokens`); the
experts' ``fc1`` / ``fc2`` are column / row parallel as any linear, over the gathered tokens.

One place the planner cannot say what Megatron does: the ``Split`` of ``in_proj``'s output into
``z, xBC, dt`` and of the conv's output into ``x, B, C``. Megatron's weights are laid out per rank
(each rank's shard is its own ``z, x, B, C, dt``), so the split is local; a configuration splits a dim
contiguously, so the slices of one contiguous shard are not each rank's slices, and the importer marks
that dim unsplittable. Those ops are priced replicated over ``tp`` (an all-gather of their input, the
full slices on every rank): more time and memory than Megatron spends, never less, and the export says
so (:attr:`exporters._tp.MaskResult.replicated_fallbacks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporters._tp import OpRule, interned_rules, moe_spans
from importers.hybrid import HybridStack
from importers.transformer import (
    DimClasses,
    dim_classes,
    embedding_rows_dim,
    output_side_dims,
    reduction_side_dims,
    weight_access,
)
from planner.core.memo import IdentityMemo

if TYPE_CHECKING:
    from planner.core.graph import Op, OpGraph

__all__ = ["hybrid_rules", "tp_refusal"]


def tp_refusal(stack: HybridStack, tp: int) -> str | None:
    """Why megatron-core 0.16.1 cannot split ``stack`` ``tp`` ways, or ``None`` (module docstring).

    >>> from importers.hybrid import MambaSizes
    >>> stack = HybridStack(pattern="M", hidden_size=64, vocab_size=96, seq_length=16,
    ...                     mamba=MambaSizes(num_heads=8, head_dim=16, num_groups=2, state_dim=16, conv_kernel=4))
    >>> tp_refusal(stack, 2) is None, tp_refusal(stack, 4)
    (True, 'MambaMixer needs --mamba-num-groups (2) divisible by tp=4 (ngroups % tp_size == 0)')
    """
    mamba = stack.mamba
    checks = []
    if mamba is not None:
        checks += [("--mamba-num-heads", mamba.num_heads, "MambaMixer", "nheads % tp_size == 0"),
                   ("--mamba-num-groups", mamba.num_groups, "MambaMixer", "ngroups % tp_size == 0")]
    if stack.num_attention_heads:
        # Attention.__init__: divide(num_attention_heads, tp); fewer query groups than tp are copied
        # (num_query_groups_per_partition = 1), which the layout does not price (it splits K and V tp ways)
        checks += [("--num-attention-heads", stack.num_attention_heads, "Attention", "divide(heads, tp)"),
                   ("--num-query-groups", stack.num_query_groups, "the hybrid export",
                    "fewer groups than tp are copied per rank, which is not priced")]
    if stack.ffn_hidden_size and "-" in stack.pattern:
        checks.append(("--ffn-hidden-size", stack.ffn_hidden_size, "MLP's ColumnParallelLinear", "divide(fc1, tp)"))
    for flag, value, module, rule in checks:
        if value % tp:
            return f"{module} needs {flag} ({value}) divisible by tp={tp} ({rule})"
    return None


_RULES: IdentityMemo[tuple[OpRule, ...]] = IdentityMemo(size=16)


def hybrid_rules(graph: OpGraph) -> tuple[OpRule, ...]:
    """One :class:`~exporters._tp.OpRule` per op of a hybrid stack's graph (module docstring); kept
    for the last graphs (by identity), since every ``dp x tp`` family of a stage asks again."""
    return _RULES.get(("rules", graph), lambda: _hybrid_rules(graph))


def _hybrid_rules(graph: OpGraph) -> tuple[OpRule, ...]:
    ops = graph.ops
    classes = dim_classes(graph)
    token = next(i for i, op in enumerate(ops) if op.kind == "embedding")
    stream = ops[token].outputs[0].axes  # [batch, seq, hidden]: the residual stream's classes
    hidden, seq = classes.of[token][stream[2][0]], classes.of[token][stream[1][0]]
    anchors: dict[int, tuple[tuple[str, ...], str]] = {}
    for i, op in enumerate(ops):
        if op.kind == "embedding" and i == token:
            rows = embedding_rows_dim(graph, op)
            anchors[i] = ((rows,) if rows else (), "embedding")
        elif weight_access(graph, op) is not None:
            reads_stream = any(classes.of[i][d] == hidden for d in reduction_side_dims(graph, op))
            anchors[i] = ((output_side_dims(graph, op), "column") if reads_stream
                          else (reduction_side_dims(graph, op), "row"))
        elif op.kind == "conv":
            anchors[i] = (_conv_channels(graph, op), "conv")
    routers, routing = moe_spans(graph)
    for i in routers:
        anchors.pop(i, None)  # TopKRouter's weight is whole on every tp rank
    tp_classes = {classes.of[i][dims[0]] for i, (dims, _) in anchors.items() if dims}
    lm_head = max(i for i, (_, role) in anchors.items() if role == "column")
    rules = []
    for i, op in enumerate(ops):
        sequence = _dim_of_class(classes, i, op, seq)
        glue = None if i in anchors else _first_in_classes(classes, i, op, tp_classes)
        if i in routers:
            rules.append(OpRule(sequence=sequence, sequence_required=True, role="router"))
        elif i in anchors:
            dims, role = anchors[i]
            vocab = i in (token, lm_head)  # a vocabulary tp does not divide is padded (Megatron-LM)
            rules.append(OpRule(split=dims, fallback_replicated=vocab, required=not vocab, role=role))
        elif i in routing and sequence is None and (glue is None or _has_class(classes, i, op, hidden)):
            rules.append(OpRule(tokens=True, role="moe-tokens"))
        elif _has_class(classes, i, op, hidden):
            rules.append(OpRule(sequence=sequence, sequence_required=True, role="norm" if op.kind == "norm" else "residual"))
        else:
            rules.append(OpRule(split=(glue,) if glue else (), capped=True, fallback_replicated=True, role="glue"))
    return interned_rules(rules)


def _conv_channels(graph: OpGraph, op: Op) -> tuple[str, ...]:
    """The depthwise conv's channel dim: its ``[C, 1, K]`` weight's first axis."""
    for access in op.inputs:
        if graph.tensors[access.tensor].role == "parameter" and len(access.axes) == 3 and access.axes[0]:
            return access.axes[0][:1]
    return ()


def _has_class(classes: DimClasses, index: int, op: Op, cls: int) -> bool:
    return any(classes.of[index][d.name] == cls for d in op.dims)


def _dim_of_class(classes: DimClasses, index: int, op: Op, cls: int) -> str | None:
    return next((d.name for d in op.dims if not d.is_batch and classes.of[index][d.name] == cls), None)


def _first_in_classes(classes: DimClasses, index: int, op: Op, wanted: set[int]) -> str | None:
    """The op's first dim (output axes, then inputs', then the rest) whose class an anchor splits."""
    order: list[str] = []
    for access in (*op.outputs, *op.inputs):
        for axis in access.axes:
            order += [d for d in axis if d not in order]
    order += [d.name for d in op.dims if d.name not in order]
    return next((d for d in order if classes.of[index].get(d) in wanted), None)
