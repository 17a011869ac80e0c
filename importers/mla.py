r"""Multi-latent attention (MLA: DeepSeek-V2, Liu et al. 2024, arXiv:2405.04434 section 2.1; DeepSeek-V3),
recognised from an attention's projections (model understanding, beside :mod:`importers.transformer`,
which calls :func:`latent_attention` on every attention it finds).

MLA compresses keys and values into a small latent and keeps the rotary part of the key apart:

* the **query** is either one full-rank projection ``hidden -> heads x (d_nope + d_rope)`` (DeepSeek-V2-Lite's
  ``q_proj``) or low-rank, ``q_a_proj`` (``hidden -> q_lora_rank``), a norm, ``q_b_proj``
  (``q_lora_rank -> heads x (d_nope + d_rope)``);
* the **keys and values** come from one down-projection ``kv_a_proj_with_mqa``
  (``hidden -> kv_lora_rank + d_rope``): its first ``kv_lora_rank`` channels go through a norm and
  ``kv_b_proj`` (``kv_lora_rank -> heads x (d_nope + d_v)``), which gives every head its un-rotated
  key part and its value; its last ``d_rope`` channels are rotated and shared by every head as the
  key's rotary part (the "decoupled RoPE" of the paper's eq. 14-19);
* the output projection reads ``heads x d_v``.

How the graph shows it (nothing here reads op or module names). The walks of
:mod:`importers.transformer` give, per attention, the parameter matmuls behind :math:`Q`, :math:`K`
and :math:`V`; MLA's are

* ``K``: two matmuls, ``kv_b`` (also behind ``V``, and the only one behind it) and ``kv_a`` (behind
  ``K`` only: the shared rotary key, which no up-projection touches);
* ``kv_b``'s input comes from ``kv_a`` through a norm and nothing but non-matmul ops;
* ``Q``: one matmul (``q_b`` or the full-rank ``q_proj``), neither of K's; when its input comes
  through a norm from exactly one other parameter matmul, that is ``q_a`` (a low-rank query).

The sizes are read off the weights (their output and reduction widths): ``kv_lora_rank`` is
``kv_b``'s input, ``d_rope`` = ``kv_a``'s output - ``kv_lora_rank``, ``d_nope`` = the score's head
size (:math:`d_{nope} + d_{rope}`, the reduction of :math:`QK^T`) - ``d_rope``, ``d_v`` =
``kv_b``'s output / heads - ``d_nope``; the query's ``heads x (d_nope + d_rope)`` and the output
projection's ``heads x d_v`` must agree, or the attention is not taken for MLA.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from planner.core.graph import OpGraph

__all__ = ["LatentAttention", "latent_attention"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LatentAttention:
    """One multi-latent attention's projections (op indices) and sizes (channels), in DeepSeek's names;
    Megatron-Core's ``MLATransformerConfig`` fields in brackets."""

    q_down: int | None
    """``q_a_proj`` (``None``: a full-rank query, ``q_up`` reads the hidden state)."""
    q_up: int
    """``q_b_proj``, or the full-rank ``q_proj``."""
    kv_down: int
    """``kv_a_proj_with_mqa``."""
    kv_up: int
    """``kv_b_proj``."""
    hidden_size: int
    """The input width of the query's first projection (the model's hidden size)."""
    heads: int
    q_lora_rank: int | None
    """The query latent (``q_lora_rank``); ``None`` with a full-rank query."""
    kv_lora_rank: int
    """The key/value latent (``kv_lora_rank``)."""
    qk_nope_head_dim: int
    """Per head, the query/key channels without rotary (``qk_head_dim``)."""
    qk_rope_head_dim: int
    """Per head, the rotated query/key channels, the key's shared by all heads (``qk_pos_emb_head_dim``)."""
    v_head_dim: int
    """Per head, the value channels (``v_head_dim``)."""


def latent_attention(
    graph: OpGraph,
    *,
    q_proj: Iterable[int],
    k_proj: Iterable[int],
    v_proj: Iterable[int],
    out_proj: Iterable[int],
    heads: int,
    head_dim: int,
    width: Callable[[int], int],
    reduction: Callable[[int], int],
    param_matmul: Callable[[int], bool],
) -> LatentAttention | None:
    """The attention's MLA structure (module docstring), or ``None`` when it is not MLA.

    ``q_proj`` ... ``out_proj``: the parameter matmuls :mod:`importers.transformer` found behind Q,
    K, V and after the value matmul; ``heads``: the score's heads; ``head_dim``: the score's
    reduction (channels per head of :math:`Q` and :math:`K`). ``width(i)`` / ``reduction(i)``: a
    parameter matmul's output and input widths in channels (its weight's two sides);
    ``param_matmul(i)``: op ``i`` is a matmul with a weight.
    """
    qs, ks, vs, outs = set(q_proj), set(k_proj), set(v_proj), set(out_proj)
    if len(qs) != 1 or len(ks) != 2 or len(vs) != 1 or not vs < ks or qs & ks or len(outs) != 1 or heads < 1:
        return None
    (q_up,), (kv_up,), (o_proj,) = qs, vs, outs
    (kv_down,) = ks - vs
    producers: dict[int, list[int]] = {}
    for edge in graph.edges:
        producers.setdefault(edge.consumer, []).append(edge.producer)
    if _latent_source(graph, producers, kv_up, param_matmul) != kv_down:
        return None
    kv_rank = reduction(kv_up)
    rope = width(kv_down) - kv_rank
    nope = head_dim - rope
    per_head, left = divmod(width(kv_up), heads)
    v_dim = per_head - nope
    if min(rope, nope, v_dim) < 1 or left or width(q_up) != heads * head_dim or reduction(o_proj) != heads * v_dim:
        return None
    q_down = _latent_source(graph, producers, q_up, param_matmul)
    hidden = reduction(q_down if q_down is not None else q_up)
    if reduction(kv_down) != hidden or (q_down is not None and width(q_down) != reduction(q_up)):
        return None
    return LatentAttention(
        q_down=q_down, q_up=q_up, kv_down=kv_down, kv_up=kv_up, hidden_size=hidden, heads=heads,
        q_lora_rank=width(q_down) if q_down is not None else None, kv_lora_rank=kv_rank,
        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v_dim,
    )


def _latent_source(
    graph: OpGraph, producers: dict[int, list[int]], start: int, param_matmul: Callable[[int], bool]
) -> int | None:
    """The down-projection whose normalised output op ``start`` reads: walking back from ``start``
    through non-matmul ops reaches one norm and nothing else, and walking back from that norm one
    parameter matmul and nothing else (a latent is projected, normalised and sliced or reshaped).
    ``None`` otherwise: a full-rank query reads the residual stream's norm, which several matmuls
    (the previous layer's) or the embedding write."""
    norms, matmuls = _reached(graph, producers, start, param_matmul)
    if len(norms) != 1 or matmuls:
        return None
    norms, stops = _reached(graph, producers, norms.pop(), param_matmul)
    source = stops.pop() if len(stops) == 1 and not norms else None
    return source if source is not None and param_matmul(source) else None


def _reached(
    graph: OpGraph, producers: dict[int, list[int]], start: int, param_matmul: Callable[[int], bool]
) -> tuple[set[int], set[int]]:
    """``(norms, other stops)`` reached walking back from op ``start``'s inputs through the ops that
    are not norms, matmuls, softmaxes or embeddings (those end the walk: a parameter matmul is
    recorded, and so is any other stop, so that a caller sees it was not one clean latent)."""
    norms: set[int] = set()
    stops: set[int] = set()
    seen = {start}
    queue = deque(producers.get(start, ()))
    while queue:
        i = queue.popleft()
        if i in seen:
            continue
        seen.add(i)
        kind = graph.ops[i].kind
        if kind == "norm":
            norms.add(i)
        elif param_matmul(i) or kind in ("matmul", "softmax", "embedding"):
            stops.add(i)
        else:
            queue.extend(producers.get(i, ()))
    return norms, stops
