r"""Whether a graph's repeated blocks run as one chain, as a launcher that pipelines a list of layers
runs them: each layer takes what the one before it returned (DeepSpeed 0.19.8's ``PipelineModule``,
``runtime/pipe/module.py``, ``forward``: ``inputs = layer(inputs)`` over the stage's layers).

The layers are the graph's repeated blocks (every :class:`~planner.core.graph.BlockGroup`'s instances)
in graph order; an op between two blocks belongs to the earlier one and the ops after the last block
form the head (the stage cut the search prices, ``objectives.pipeline_stages.layer_structure``). The
blocks are **one chain** when every tensor an op of layer :math:`k` reads is written by layer
:math:`k`, by layer :math:`k - 1`, or by the ops before the first block (the embeddings: positions and
masks that each stage hands on with its output, as Megatron-DeepSpeed's ``GPTModelPipe`` hands on
its attention mask), and the head reads only the last layer and those. Then the previous layer's
output is all a layer needs.

An encoder-decoder is not one chain: each decoder layer's cross-attention reads the encoder's output,
written layers before it. Neither are two towers side by side (CLIP): the head's similarity reads
both towers' last layers. :func:`chain_break` names the first tensor that skips a layer.
"""

from __future__ import annotations

import numpy as np

from planner.core.graph import OpGraph

__all__ = ["chain_break", "stacks"]


def stacks(graph: OpGraph) -> str:
    """The graph's repeated blocks in words, one group each: ``"model.encoder.layers (2 blocks), ..."``."""
    counts = [(group.name or "blocks", len(group.instances)) for group in graph.blocks]
    return ", ".join(f"{name} ({n} block{'s' * (n != 1)})" for name, n in counts)


def chain_break(graph: OpGraph) -> str | None:
    """``None`` when the blocks of ``graph`` are one chain (module docstring), else why not, in words.

    A graph without repeated blocks is no chain of them: the reason says so.
    """
    instances = sorted((inst for group in graph.blocks for inst in group.instances if inst), key=min)
    if not instances:
        return "the graph has no repeated blocks"
    owner = {op: (group.name or "blocks", i) for group in graph.blocks for i, inst in enumerate(group.instances)
             for op in inst}
    starts = np.array([min(inst) for inst in instances], dtype=np.int64)
    layers = len(instances)
    position = np.searchsorted(starts, np.arange(len(graph.ops)), side="right") - 1
    position[np.arange(len(graph.ops)) > max(instances[-1])] = layers  # the head

    def where(op: int) -> str:
        pos = int(position[op])
        if op in owner:
            return f"layer {pos} of {layers}, in {owner[op][0]}.{owner[op][1]}"
        return "the head" if pos == layers else f"layer {pos} of {layers}, after its block"

    for edge in graph.edges:
        reader, writer = int(position[edge.consumer]), int(position[edge.producer])
        if writer in (-1, reader, reader - 1):
            continue
        name = f" ({owner[edge.producer][0]}.{owner[edge.producer][1]})" if edge.producer in owner else ""
        what = "it skips a layer" if reader - writer == 2 else f"it skips {reader - writer - 1} layers"
        return (f"op {graph.ops[edge.consumer].name} ({where(edge.consumer)}) reads {edge.tensor}, written by "
                f"layer {writer}{name}: {what}")
    return None
