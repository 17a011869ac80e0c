r"""Losses: SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (issue 25).

Both read ``scores[N, C, D1..Dk]`` (logits, or log-probabilities for the NLL loss), the integer
``labels[N, D1..Dk]`` and an optional per-class ``weights[C]``; ``reduction`` (default ``mean``)
sums or averages the per-token losses to a scalar, ``none`` keeps them as ``[N, D1..Dk]``.
SoftmaxCrossEntropyLoss may write a second output, ``log_prob`` (the scores' shape).

Dims: ``n`` (the samples, or the flattened ``batch x seq`` tokens of a language model's loss) and
``d1..dk`` are parallel; the class (vocabulary) axis ``c``:

* SoftmaxCrossEntropyLoss: ``c`` is ``normalized``, kind ``softmax``. Splitting ``c`` is Megatron's
  vocab-parallel cross entropy (``megatron/core/tensor_parallel/cross_entropy.py``): each rank
  holds a slice of the vocabulary and all-reduces three per-token fp32 scalars (the logit max, the
  target logit, the sum of exponentials); backward needs none. ``objectives.intra_op`` prices it.
* NegativeLogLikelihoodLoss: ``c`` is a ``reduction`` (the loss picks ``-scores[t, label_t]``, a
  sum over classes of a one-hot product), kind ``reduce``: a class split leaves partial per-token
  picks (or a partial scalar), one all-reduce of the output.

Splitting ``n`` or ``d`` under a ``mean``/``sum`` reduction leaves a partial scalar: one all-reduce
of 4 bytes (the generic partial-sum rule); under ``none`` the output is split as the tokens are.

FLOPs: SoftmaxCrossEntropyLoss :data:`FLOPS_PER_ELEMENT` per score element (max, subtract, exp,
sum, log) plus :data:`FLOPS_PER_TOKEN` per token (pick the target, weight, reduce); NLL
:data:`FLOPS_PER_TOKEN` per token. Backward: 1x (``softmax - one_hot`` scaled by the upstream
gradient, one elementwise pass).
"""

from __future__ import annotations

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of, numel
from importers.op_rules.norm import FLOPS_PER_ELEMENT

__all__ = ["LOSS_OPS", "FLOPS_PER_TOKEN", "softmax_cross_entropy_rule", "nll_loss_rule", "reduction_of"]

LOSS_OPS: tuple[str, ...] = ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")

FLOPS_PER_TOKEN = 2
"""Forward FLOPs per token besides the per-class work: pick the target's score, weight and sum it."""


def reduction_of(ctx: NodeContext) -> str:
    """The ``reduction`` attribute as a string (``mean`` when absent).

    Examples
    --------
    >>> reduction_of(NodeContext(name="l", op_type="SoftmaxCrossEntropyLoss", attrs={"reduction": b"none"}))
    'none'
    """
    value = ctx.attr("reduction", "mean")
    if isinstance(value, bytes):
        value = value.decode()
    return str(value)


def _loss(ctx: NodeContext, *, class_kind: str) -> tuple[DimBuilder, str | None, str | None, tuple[str | None, ...]]:
    scores = ctx.shape(0) or ()
    dims = DimBuilder()
    n = dims.add("n", scores[0]) if len(scores) > 0 else None
    c = dims.add("c", scores[1], kind=class_kind) if len(scores) > 1 else None  # type: ignore[arg-type]
    extra = tuple(dims.add(f"d{i + 1}", size) for i, size in enumerate(scores[2:]))
    return dims, n, c, extra


def _operands(ctx: NodeContext, n, c, extra) -> tuple[tuple, tuple]:
    """Input and output access maps shared by both losses."""
    scores_axes = axes_of(n, c, *extra)
    token_axes = axes_of(n, *extra)
    inputs = [(0, scores_axes)]
    labels = ctx.shape(1)
    if labels is not None:
        inputs.append((1, token_axes if len(labels) == len(token_axes) else axes_of(*([None] * len(labels)))))
    weights = ctx.shape(2)
    if weights is not None:
        inputs.append((2, axes_of(c) if len(weights) == 1 else axes_of(*([None] * len(weights)))))
    outputs = []
    for position, shape in enumerate(ctx.output_shapes):
        if shape is None:
            continue
        if position == 1 and len(shape) == len(scores_axes):
            outputs.append((1, scores_axes))  # log_prob
        elif position == 0 and reduction_of(ctx) == "none" and len(shape) == len(token_axes):
            outputs.append((0, token_axes))
        else:
            outputs.append((position, axes_of(*([None] * len(shape)))))  # the scalar loss
    return tuple(inputs), tuple(outputs)


def softmax_cross_entropy_rule(ctx: NodeContext) -> RuleResult:
    """SoftmaxCrossEntropyLoss: ``n``, ``d..`` parallel, the classes ``c`` normalised (module docstring).

    Examples
    --------
    >>> ctx = NodeContext(name="loss", op_type="SoftmaxCrossEntropyLoss", input_shapes=((1024, 32000), (1024,)),
    ...                   output_shapes=((),))
    >>> r = softmax_cross_entropy_rule(ctx)
    >>> r.kind, [(d.name, d.kind) for d in r.dims], r.inputs, r.outputs
    ('softmax', [('n', 'parallel'), ('c', 'normalized')], ((0, (('n',), ('c',))), (1, (('n',),))), ((0, ()),))
    >>> r.flops == 5 * 1024 * 32000 + 2 * 1024
    True
    """
    dims, n, c, extra = _loss(ctx, class_kind="normalized")
    inputs, outputs = _operands(ctx, n, c, extra)
    scores, tokens = _scores_and_tokens(ctx)
    return RuleResult(
        kind="softmax",
        dims=dims.build(),
        inputs=inputs,
        outputs=outputs,
        flops=float(FLOPS_PER_ELEMENT * numel(scores) + FLOPS_PER_TOKEN * tokens),
    )


def _scores_and_tokens(ctx: NodeContext) -> tuple[tuple[int, ...], int]:
    """The scores' shape and the tokens it scores (its elements over the classes, axis 1)."""
    scores = tuple(ctx.shape(0) or ())
    return scores, numel(scores) // max(scores[1], 1) if len(scores) > 1 else numel(scores)


def nll_loss_rule(ctx: NodeContext) -> RuleResult:
    """NegativeLogLikelihoodLoss: ``n``, ``d..`` parallel, the classes ``c`` a reduction.

    Examples
    --------
    >>> ctx = NodeContext(name="nll", op_type="NegativeLogLikelihoodLoss", attrs={"reduction": b"none"},
    ...                   input_shapes=((8, 1000, 16), (8, 16)), output_shapes=((8, 16),))
    >>> r = nll_loss_rule(ctx)
    >>> r.kind, [(d.name, d.kind) for d in r.dims], r.outputs
    ('reduce', [('n', 'parallel'), ('c', 'reduction'), ('d1', 'parallel')], ((0, (('n',), ('d1',))),))
    """
    dims, n, c, extra = _loss(ctx, class_kind="reduction")
    inputs, outputs = _operands(ctx, n, c, extra)
    scores, tokens = _scores_and_tokens(ctx)
    return RuleResult(
        kind="reduce",
        dims=dims.build(),
        inputs=inputs,
        outputs=outputs,
        flops=float(FLOPS_PER_TOKEN * tokens),
    )
