"""A Mamba mixer found in an op graph: its depthwise causal conv (issue 25).

Both Mamba generations (Gu & Dao 2023, arXiv:2312.00752; Dao & Gu 2024, arXiv:2405.21060) run a depthwise
1-D conv over part of a wider ``in_proj`` and a SiLU before the scan; :func:`mamba_mixers` finds those convs.
:mod:`importers.hybrid` reads the stacks built of them and :mod:`importers.transformer` names them among the
reasons a graph is not a uniform transformer stack.
"""

from __future__ import annotations

from planner.core.graph import Op, OpGraph

from importers.param_role import is_parameter

__all__ = ["has_mamba_mixer", "mamba_mixers", "depthwise_weight", "linear_weight"]


def has_mamba_mixer(graph: OpGraph) -> bool:
    """Whether some op is a Mamba mixer's conv (:func:`mamba_mixers`)."""
    return bool(mamba_mixers(graph))


def mamba_mixers(graph: OpGraph) -> list[int]:
    """The ops that are a Mamba mixer's conv, in graph order: a depthwise ``Conv`` over a ``[C, 1, K]``
    weight that reads part of an ``in_proj`` (a matmul of a ``[hidden, P]`` parameter, ``P > C``: the gate
    and ``dt`` are split off before the conv; only non-matmul ops between) and whose output goes through a
    SiLU (a ``Sigmoid`` in the op that reads it, or in one reading that; the causal trim may come first).

    A conv over a raw signal (Wav2Vec2's first feature-extractor conv, also ``[C, 1, K]``) reads no
    ``in_proj``; a grouped positional conv of ``hidden`` channels reads a projection no wider than itself
    and is followed by GELU.
    """
    ops = graph.ops
    convs = [i for i, op in enumerate(ops) if op.kind == "conv" and depthwise_weight(graph, op) is not None]
    if not convs:
        return []
    writer = {access.tensor: i for i, op in enumerate(ops) for access in op.outputs}
    readers: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        for access in op.inputs:
            readers.setdefault(access.tensor, []).append(i)
    return [i for i in convs if _reads_wider_projection(graph, i, writer) and _silu_after(graph, i, readers)]


def _reads_wider_projection(graph: OpGraph, conv: int, writer: dict[str, int], hops: int = 4) -> bool:
    """Whether the conv's activation input is written, through at most ``hops`` non-matmul ops, by a matmul
    of a 2-D parameter wider than the conv's channels (:func:`has_mamba_mixer`)."""
    channels = depthwise_weight(graph, graph.ops[conv])[0]  # type: ignore[index]
    tensors = [a.tensor for a in graph.ops[conv].inputs if not is_parameter(graph, a.tensor)]
    for _ in range(hops):
        sources = [writer[t] for t in tensors if t in writer]
        if not sources:
            return False
        source = graph.ops[sources[0]]
        if source.kind == "matmul":
            weight = linear_weight(graph, source)
            return weight is not None and weight[1] > channels
        if source.kind == "conv":
            return False
        tensors = [a.tensor for a in source.inputs if not is_parameter(graph, a.tensor)]
    return False


def _silu_after(graph: OpGraph, conv: int, readers: dict[str, list[int]]) -> bool:
    """Whether an op reading the conv's output, or one reading that op's, holds a ``Sigmoid`` (the SiLU)."""
    near = [r for a in graph.ops[conv].outputs for r in readers.get(a.tensor, ())]
    near += [r for i in list(near) for a in graph.ops[i].outputs for r in readers.get(a.tensor, ())]
    return any("Sigmoid" in graph.ops[i].node_types for i in near)


def depthwise_weight(graph: OpGraph, op: Op) -> tuple[int, int] | None:
    """``(C, K)`` of a conv op's ``[C, 1, K]`` parameter, else ``None``."""
    for access in op.inputs:
        shape = graph.tensors[access.tensor].shape
        if is_parameter(graph, access.tensor) and len(shape) == 3 and shape[1] == 1:
            return int(shape[0]), int(shape[2])
    return None


def linear_weight(graph: OpGraph, op: Op) -> tuple[int, int] | None:
    """``(in, out)`` of a matmul op's 2-D parameter weight, else ``None``."""
    if op.kind != "matmul":
        return None
    for access in op.inputs:
        shape = graph.tensors[access.tensor].shape
        if is_parameter(graph, access.tensor) and len(shape) == 2:
            return int(shape[0]), int(shape[1])
    return None
