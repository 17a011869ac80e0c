r"""QK-norm: a norm on the queries and keys between their projections and the attention scores.

Qwen3 and Gemma-3 normalise every head of the queries and of the keys (an RMSNorm over the
``head_dim`` channels, one weight of ``head_dim`` values shared by the heads: Hugging Face's
``Qwen3Attention.q_norm = Qwen3RMSNorm(head_dim)``); OLMo-2 normalises the whole projection
(``Olmo2Attention.q_norm = Olmo2RMSNorm(num_heads * head_dim)``, before the reshape to heads).
Both sit on the path from the Q / K projection to the score product, before or after rotary, so
:mod:`importers.transformer`'s walk back from :math:`QK^T` to the projections, which stops at norms
(they start a sub-layer), passes a norm that reads a projection's output (:func:`qk_walk_verdict`)
and records it (:func:`qk_norm_kind`). The norm may read the projection through views: StableLM's
``StableLmLayerNormPerHead`` splits the heads and runs one ``LayerNorm(head_dim)`` per head, each with its
own weights (a ``Split``, then one norm per head, then a ``Concat``); Persimmon selects the queries and keys
of its fused QKV projection (a ``Gather`` on the view) and runs one ``LayerNorm(head_dim)`` with a bias.

Megatron-Core's q_layernorm is one norm of ``hidden_size_per_attention_head`` shared by the heads, of the
model's ``--normalization`` (megatron-core 0.16.1 ``models/gpt/gpt_layer_specs.py``: ``q_layernorm=qk_norm``,
``backend.layer_norm(for_qk=True)``; ``transformer/torch_norm.py``: ``torch.nn.LayerNorm``, with its bias, under
``LayerNorm``): Persimmon's norm is that (``per-head``), StableLM's per-head weights are not
(``per-head-weights``).

Under tensor parallelism a per-head QK-norm splits with the heads and its weight is replicated
(Megatron-Core builds ``q_layernorm`` with ``hidden_size=hidden_size_per_attention_head``,
megatron/core/transformer/attention.py, core_v0.16.1): :mod:`importers.transformer` gives it the
``attention-glue`` role, so :mod:`exporters._tp` splits it along the heads as rotary's glue. A norm
over the whole projection needs every head's channels: it keeps the ``norm`` role, replicated over
tp as the sub-layers' norms are, so the plan prices gathering the projection's heads before it
(transformers' ``Olmo2Config.base_model_tp_plan`` gathers its Q, K and V projections' outputs,
``colwise_gather_output``, "due to the added norm on q and k").
"""

from __future__ import annotations

from typing import Callable, Iterable, Literal

from planner.core.graph import OpGraph

__all__ = ["QkNorm", "qk_walk_verdict", "qk_norm_kind"]

QkNorm = Literal["none", "per-head", "per-head-weights", "whole-projection"]
"""How the queries and keys are normalised before the scores: not at all, per head over ``head_dim``
channels with one weight shared by the heads (Qwen3, Gemma-3, Persimmon: Megatron-LM's ``--qk-layernorm``),
per head with each head's own weights (StableLM's ``StableLmLayerNormPerHead``: one norm op per head), or over
the whole projection (OLMo-2)."""

_VIEWS = frozenset({"slice", "concat", "data_movement"})
"""Op kinds that only move a projection's values (split heads, select Q / K of a fused QKV, reshape)."""


def _reads_projection(graph: OpGraph, norm: int, param_matmul: Callable[[int], bool],
                      producers: Callable[[int], Iterable[int]], *, depth: int = 4) -> bool:
    """Whether every path back from op ``norm``, through at most ``depth`` views (:data:`_VIEWS`), ends at
    a parameter matmul (a projection): a sub-layer's input norm reads an add or an embedding instead."""
    frontier = list(producers(norm))
    for _ in range(depth + 1):
        if not frontier:
            return False
        rest = [w for w in frontier if not param_matmul(w)]
        if not rest:
            return True
        if any(graph.ops[w].kind not in _VIEWS for w in rest):
            return False
        frontier = [p for w in rest for p in producers(w)]
    return False


def qk_walk_verdict(
    graph: OpGraph,
    param_matmul: Callable[[int], bool],
    producers: Callable[[int], Iterable[int]],
    barrier_verdict: Callable[[int], str | None],
) -> Callable[[int], str | None]:
    """The walk verdict from the score product back to the Q / K projections: ``barrier_verdict``
    (record a parameter matmul, stop at other barriers), except that a norm that reads only parameter
    matmuls (projections), directly or through views (:func:`_reads_projection`), is passed (``None``): a
    QK-norm. A sub-layer's input norm reads the residual stream (an add or an embedding), so the walk still
    stops there.
    """
    ops = graph.ops

    def verdict(i: int) -> str | None:
        if ops[i].kind == "norm" and _reads_projection(graph, i, param_matmul, producers):
            return None
        return barrier_verdict(i)

    return verdict


def normalized_size(graph: OpGraph, index: int) -> int:
    """The number of elements op ``index`` (a norm) normalises over: the product of its ``normalized`` dims."""
    size = 1
    for dim in graph.ops[index].dims:
        if dim.kind == "normalized":
            size *= dim.size
    return size


def qk_norm_kind(graph: OpGraph, sides: Iterable[Iterable[int]], head_dim: int) -> QkNorm:
    """How the norms among an attention's query and key glue ops (``sides``: the query's, the key's; the
    norms :func:`qk_walk_verdict` passed) normalise: ``per-head`` when each covers ``head_dim`` channels
    and a side has one (shared by its heads), ``per-head-weights`` when a side has several (one per head,
    each with its weights: StableLM), ``whole-projection`` when one covers more (OLMo-2's
    ``num_heads * head_dim``), ``none`` without a norm.

    >>> from types import SimpleNamespace as N
    >>> from planner.core.graph import IterDim, Op
    >>> def norm(*sizes):
    ...     dims = tuple(IterDim(name=f"d{k}", size=s, kind="normalized" if k == len(sizes) - 1 else "parallel")
    ...                  for k, s in enumerate(sizes))
    ...     return Op(name="n", kind="norm", op_type="LayerNormalization", inputs=(), outputs=(), flops=1.0, dims=dims)
    >>> g = N(ops=(norm(2, 32, 8, 16), norm(2, 32, 128), norm(2, 32, 1, 16), norm(2, 32, 1, 16)))
    >>> qk_norm_kind(g, [[0], [0]], 16), qk_norm_kind(g, [[1], []], 16), qk_norm_kind(g, [[], []], 16)
    ('per-head', 'whole-projection', 'none')
    >>> qk_norm_kind(g, [[2, 3], []], 16)  # StableLM: a norm per head
    'per-head-weights'
    """
    norms = [[i for i in side if graph.ops[i].kind == "norm"] for side in sides]
    sizes = {normalized_size(graph, i) for side in norms for i in side}
    if not sizes:
        return "none"
    if sizes != {head_dim}:
        return "whole-projection"
    return "per-head-weights" if any(len(side) > 1 for side in norms) else "per-head"
