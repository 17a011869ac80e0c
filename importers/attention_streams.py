r"""Where an attention's keys and values come from: the query's own stream, the same stream shortened by a
strided convolution (spatial-reduction attention), or another stream (cross-attention).

SegFormer's efficient self-attention (transformers' ``SegformerEfficientSelfAttention``, ``sr_ratio > 1``)
projects its queries from the hidden states and its keys and values from ``LayerNorm(Conv2d(hidden, hidden,
kernel_size=sr_ratio, stride=sr_ratio)(hidden))``: the same stream, ``sr_ratio ** 2`` times shorter (PVT's
spatial-reduction attention). The K projection then reads another tensor than the Q projection, as a
decoder's cross-attention does, but that tensor is computed from the query's input: walking back from the K
projection reaches the op that writes the Q projection's input, through a convolution. An encoder output
is not computed from the decoder's hidden states, so a cross-attention's walk never reaches it.
"""

from __future__ import annotations

from typing import Callable, Iterable

from planner.core.graph import OpGraph

__all__ = ["kv_reduction"]

_DEPTH = 8
"""Ops walked back from the K projection: SegFormer's path is a norm, the conv, and the writer (3)."""


def kv_reduction(graph: OpGraph, q_proj: int, k_proj: int, back: Callable[[int], Iterable[int]],
                 stop: Callable[[int], bool]) -> int | None:
    """The convolution through which the K projection ``k_proj`` reads the Q projection ``q_proj``'s input
    stream (spatial-reduction attention), or ``None``: both read one tensor, or K reads another stream
    (cross-attention), or no convolution lies between. ``back`` gives an op's producers; the walk does not
    pass ops where ``stop`` holds (parameter matmuls, softmaxes: another sub-layer).

    >>> from types import SimpleNamespace as N
    >>> def op(kind, reads, writes):
    ...     return N(kind=kind, inputs=(N(tensor=reads),), outputs=(N(tensor=writes),))
    >>> ops = (op("norm", "x", "h"), op("matmul", "h", "q"), op("conv", "h", "r"), op("norm", "r", "rn"),
    ...        op("matmul", "rn", "k"), op("matmul", "h", "k2"))
    >>> producers = {1: [0], 2: [0], 3: [2], 4: [3], 5: [0]}
    >>> g = N(ops=ops)
    >>> kv_reduction(g, 1, 4, lambda i: producers.get(i, []), lambda i: False), kv_reduction(g, 1, 5, lambda i: producers.get(i, []), lambda i: False)
    (2, None)
    """
    ops = graph.ops
    source = ops[q_proj].inputs[0].tensor
    if ops[k_proj].inputs[0].tensor == source:
        return None
    frontier: list[tuple[int, int | None]] = [(p, None) for p in back(k_proj)]
    seen: set[int] = set()
    for _ in range(_DEPTH):
        following: list[tuple[int, int | None]] = []
        for index, conv in frontier:
            if index in seen or stop(index):
                continue
            seen.add(index)
            conv = index if conv is None and ops[index].kind == "conv" else conv
            if any(out.tensor == source for out in ops[index].outputs):
                return conv
            following += [(p, conv) for p in back(index)]
        frontier = following
    return None
