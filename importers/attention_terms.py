r"""Attention whose scores have more than one product: :math:`Q K^T` plus position terms gathered in.

:mod:`importers.transformer` reads an attention from the softmax outwards: the matmuls of two
activations that reach the softmax through non-matmul ops are its scores. Disentangled attention
(He et al. 2021, "DeBERTa", arXiv:2006.03654, eq. 2-4; transformers 5.24
``models/deberta_v2/modeling_deberta_v2.py``, ``DisentangledSelfAttention``) adds two more products to
the content scores before the (masked) softmax:

.. math::

    A_{ij} = \frac{Q_i K_j^T + Q_i {K^r_{\delta(i,j)}}^T + K_j {Q^r_{\delta(j,i)}}^T}{\sqrt{3 d}}

where :math:`K^r = P W_k` and :math:`Q^r = P W_q` project the :math:`2k` relative-position embeddings
:math:`P` (shared with the content projections under ``share_att_key``) and :math:`\delta` buckets
:math:`i - j`. Each term is a product of the query or the key with a position operand over all
:math:`2k` relative positions, ``[b h, s, 2k]``, whose entries are then picked per key by a
``GatherElements`` of the relative position: so three matmuls of activations reach the softmax, and
the plain reading finds no single score.

:func:`score_terms` tells them apart from the graph alone, by what the exporter cannot hide:

* the **score** is the one product that reaches the softmax without an index gather (walking back from
  the softmax through scales, masks, casts and adds, stopping at gathers);
* every other product is a **position term** when it reads the score's query or key (the same
  producing op) and reaches the softmax through a gather; its other operand, walked back to the first
  matmul (the **position projection**: a parameter matmul in a TorchScript export, a matmul of the
  normalised table and an exporter-made copy of the weight in a dynamo one), is position data;
* where the gathers do not tell (Transformer-XL's relative shift, as XLNet and Funnel write it, is a
  reshape and a slice of the ``[.., 2k]`` term, no index gather), the score is the one product both of
  whose operands read the model's inputs: the position operand is computed from parameters and
  constants alone (a sinusoid table or a learned one, projected), which no token changes;
* anything else (two products that read the inputs, a term that reads neither Q nor K) is not read as
  attention, as before.

The terms are that attention's own work: they stay ops of the graph, priced as what they are (two
batched products of :math:`2 b h s (2k) d` FLOPs each and the gathers), and split with the heads under
tensor parallelism (:mod:`exporters._tp` reads them as score products). A fused kernel cannot take them:
FlashAttention and Megatron-Core's attention add no per-head score term computed from the inputs
(:mod:`objectives.attention` does not price such an attention as fused), and the launchers' model
classes have none (``exporters.megatron.families``, ``exporters.torchtitan.families``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from planner.core.graph import OpGraph

__all__ = ["ScoreTerms", "score_terms"]

Verdict = Callable[[int], "str | None"]
"""A walk's verdict on an op: ``"record"`` (collect, stop), ``"stop"``, or ``None`` (pass through)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreTerms:
    """The products of one softmax's scores (op indices into ``OpGraph.ops``)."""

    score: int
    """:math:`Q K^T`: the product that reaches the softmax without an index gather."""
    products: tuple[int, ...] = ()
    """Position terms: the query or key times position data, gathered by relative position into the scores."""
    projections: tuple[int, ...] = ()
    """The matmuls that project the position data those terms read."""
    glue: frozenset[int] = frozenset()
    """Ops between the projections and the terms (the repeat of the position data over the batch)."""


def score_terms(
    graph: OpGraph,
    *,
    softmax: int,
    products: Iterable[int],
    back: Callable[[int], Iterable[int]],
    walk_back: Callable[[Iterable[int], Verdict], tuple[set[int], set[int]]],
    barrier: Callable[[int], bool],
    reads_inputs: Callable[[int], bool] | None = None,
) -> ScoreTerms | None:
    """The score and the position terms among the ``products`` that reach softmax ``softmax`` (module
    docstring); ``None`` when they do not read as one attention.

    Parameters
    ----------
    graph:
        The op graph.
    softmax:
        The softmax's op index.
    products:
        The matmuls of two activations reached walking back from the softmax through non-matmul ops.
    back:
        An op's producers (op indices).
    walk_back:
        ``walk_back(starts, verdict) -> (recorded, passed)``: a breadth-first walk towards the inputs.
    barrier:
        Whether an op ends a region (a matmul, norm, softmax, embedding...).
    reads_inputs:
        Whether an op depends on the model's inputs (``None``: the gathers alone decide).

    Examples
    --------
    >>> terms = score_terms(None, softmax=9, products={4}, back=None, walk_back=None, barrier=None)
    >>> terms.score, terms.products
    (4, ())
    """
    found = set(products)
    if len(found) == 1:
        return ScoreTerms(score=found.pop())
    ops = graph.ops

    def direct(i: int) -> str | None:
        if i in found:
            return "record"
        return "stop" if barrier(i) or ops[i].kind == "gather" else None

    scores, _ = walk_back(back(softmax), direct)
    if len(scores) != 1 and reads_inputs is not None:  # no gather tells: the one product of input-fed operands
        scores = {i for i in found if all(reads_inputs(p) for p in back(i))}
    if len(scores) != 1:
        return None
    score = scores.pop()
    query_key = set(back(score))
    terms = sorted(found - {score})
    position: set[int] = set()
    for term in terms:
        operands = set(back(term))
        if not operands & query_key:
            return None
        position |= operands - query_key
    projections, glue = walk_back(position, lambda i: "record" if ops[i].kind == "matmul" else ("stop" if barrier(i) else None))
    return ScoreTerms(score=score, products=tuple(terms), projections=tuple(sorted(projections)), glue=frozenset(glue))
