r"""Transformer Engine's per-layer CUDA graphs: the static buffers they hold beside the activations.

Megatron-LM's ``--cuda-graph-impl transformer_engine`` (``TrainingSettings.cuda_graph_scope = "layers"``) captures
every transformer layer's forward and backward with Transformer Engine's ``make_graphed_callables``
(megatron-core 0.16.1, ``megatron/core/transformer/cuda_graphs.py``, ``TECudaGraphHelper.create_cudagraphs``).
What it allocates, per device, that a launched run does not:

* **Static inputs, per captured (layer, micro-batch).** ``_get_sample_arguments`` builds each layer's inputs with
  ``TransformerLayer.get_layer_static_inputs``: the hidden states, ``torch.ones((seq / cp / (tp if sequence
  parallel), micro_batch, hidden), dtype=torch.bfloat16)`` (``megatron/core/transformer/module.py``), and, for a
  layer with self-attention under the whole-layer scope, an attention mask ``~tril(ones(seq / cp, seq)).bool()``
  tiled to ``(micro_batch, 1, seq / cp, seq)``, one byte per element (``transformer_layer.py``). Each forward
  replay copies its input into the static one (TE ``graph.py``, ``Graphed.forward``: ``static_input_surface[i]
  .copy_(inputs[i])``), which the layer saves for backward. A set is reused only once the backward of the
  micro-batch that held it has run (``consumed_sample_queue``; TE >= 2.7 ``_reuse_graph_input_output_buffers``),
  so a stage holds as many sets per layer as it has micro-batches in flight: one at ``pp = 1``, where Megatron
  captures one micro-batch (``_get_cuda_graph_input_data``), and the schedule's peak in flight at ``pp > 1``
  (:func:`objectives.schedules.in_flight_micro_batches`, which for the interleaved schedule counts chunks of
  ``1 / v`` of the stage's layers).
* **Static outputs in the graph pool.** All graphs share one private pool (``graph_pool_handle``); a forward
  graph's output stays allocated there until that layer's backward graph is captured, so the pool keeps every
  layer's output while the forwards run, beside the next layer's static input copy of it: one hidden-state
  tensor per set more than a launched run, whose layer output *is* the next layer's input (the saved tensors
  inside the graph are the launched run's, in the pool instead of the caching allocator).
* **One static gradient buffer.** ``static_grad_outputs = torch.empty_like(output)``, allocated once and reused by
  every backward graph under ``_reuse_graph_input_output_buffers`` (megatron-core passes it from TE 2.7).

So a stage of ``L_s`` captured layers with ``k_s`` micro-batches in flight holds, beyond its launched price,

.. math::

    G_s = k_s \sum_{l \in s} (2 H_l + M_l) - k_s \sum_{l \in s} H_l + \max_{l \in s} H_l
        = k_s \sum_{l \in s} (H_l + M_l) + \max_{l \in s} H_l

with :math:`H_l` the layer's bf16 hidden-state shard (its input tensor at its first reader's split: the
sequence over ``cp`` and, under sequence parallelism, the tensor-parallel ranks) and :math:`M_l = b \cdot
(s / cp) \cdot s` bytes its mask (``b`` the micro-batch per data-parallel rank, ``s`` the sequence, read off the
layer's first linear layer: its batch dims, and its sequence dims, split by context parallelism only; ``b = 1``
where no op has a batch dim, a graph bound at one sample per micro-batch).
Not priced: the rotary table (one per sequence length, shared: ``rotary_pos_emb_cache``), Transformer Engine's
FP8 weight copies (``fp8_weight_caching``), the pool's fragmentation, and a backward graph's transients, which
the pool keeps reserved through the launched head and loss of the next micro-batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from objectives._common import access_dims, dim_mask, shard_elements
from planner.core.configs import ConfigSpace
from planner.core.graph import OpGraph

__all__ = ["STATIC_HIDDEN_BYTES", "MASK_BYTES", "layer_static_bytes", "te_graph_buffer_bytes"]

STATIC_HIDDEN_BYTES = 2.0
"""Bytes per element of a static hidden-state buffer: ``dtype=torch.bfloat16`` in
``GraphableMegatronModule.get_layer_static_inputs`` (megatron-core 0.16.1), whatever the training precision."""

MASK_BYTES = 1.0
"""Bytes per element of the static attention mask (``torch.bool``, ``TransformerLayer.get_layer_static_inputs``)."""


def _layer_input_elements(graph: OpGraph, position: np.ndarray, layers: int, spaces: Sequence[ConfigSpace],
                          picks: np.ndarray) -> np.ndarray:
    """``(layers,)`` elements per device of the activations each layer reads from the position before it (each
    tensor at its first reader in the layer); the first layer's as the second's."""
    seen: list[dict[str, float]] = [{} for _ in range(layers)]
    for edge in graph.edges:
        layer = int(position[edge.consumer])
        if not 0 <= layer < layers or position[edge.producer] != layer - 1 or edge.tensor in seen[layer]:
            continue
        tensor = graph.tensors.get(edge.tensor)
        op = graph.ops[edge.consumer]
        access = next((a for a in op.inputs if a.tensor == edge.tensor), None)
        if tensor is not None and tensor.role == "activation" and access is not None:
            seen[layer][edge.tensor] = float(shard_elements(spaces[edge.consumer], op, access, tensor.shape)[
                int(picks[edge.consumer])])
    later = [sum(found.values()) for found in seen[1:]]
    # the first layer reads the embedding's output beside what every layer reads from before the stack (masks,
    # position tables): it is priced as the next layer is, or, alone, by its largest such input
    first = later[0] if later else max(seen[0].values(), default=0.0) if layers else 0.0
    return np.array([first] + later)


def _mask_elements(graph: OpGraph, ops: np.ndarray, spaces: Sequence[ConfigSpace], picks: np.ndarray, *,
                   one_sample: bool = False) -> float:
    """``b x (s / cp) x s`` of a layer, read off its first linear layer with batch dims (0 without one); with
    ``one_sample`` (the graph is bound at one sample per micro-batch, whose batch axis the exporter dropped, so no
    op has a batch dim), off its first linear layer, ``b = 1``."""
    for index in ops:
        op = graph.ops[index]
        weights = [a for a in op.inputs if graph.tensors[a.tensor].role == "parameter"]
        batch = np.array([d.is_batch for d in op.dims], dtype=bool)
        if op.kind != "matmul" or not weights or not (batch.any() or one_sample):
            continue
        factors = spaces[index].factors[int(picks[index])].astype(np.float64)
        sizes = np.array([d.size for d in op.dims], dtype=np.float64)
        seq = ~batch & np.array([d.kind == "parallel" for d in op.dims]) & ~dim_mask(op, access_dims(weights[0]))
        if not seq.any():
            return 0.0
        local_batch = float(np.prod(sizes[batch] / factors[batch]))
        full = float(np.prod(sizes[seq]))
        return local_batch * full / float(np.prod(factors[seq])) * full
    return 0.0


def layer_static_bytes(graph: OpGraph, position: np.ndarray, layers: int, spaces: Sequence[ConfigSpace],
                       picks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(hidden, mask)``, each ``(layers,)`` bytes per device: each layer's bf16 static hidden-state buffer
    :math:`H_l` and its static attention mask :math:`M_l` (module docstring), at the plan's configurations
    ``picks``; ``position`` is :attr:`objectives.pipeline_stages.LayerStructure.position`."""
    hidden = _layer_input_elements(graph, position, layers, spaces, picks) * STATIC_HIDDEN_BYTES
    one_sample = not any(d.is_batch for op in graph.ops for d in op.dims)
    mask = np.array([_mask_elements(graph, np.flatnonzero(position == layer), spaces, picks, one_sample=one_sample)
                     for layer in range(layers)]) * MASK_BYTES
    return hidden, mask


def te_graph_buffer_bytes(hidden: np.ndarray, mask: np.ndarray, bounds: Sequence[int], in_flight: np.ndarray) -> np.ndarray:
    """``(pp,)`` bytes per device of each stage's static graph buffers, :math:`G_s` of the module docstring:
    ``hidden`` and ``mask`` per layer (:func:`layer_static_bytes`), stage ``s`` holding layers
    ``bounds[s]:bounds[s + 1]`` with ``in_flight[s]`` micro-batches in flight.

    Examples
    --------
    Two stages of two layers, 1 MB hidden states and 2 MB masks, 2 and 1 micro-batches in flight:
    ``2 x 2 x (1 + 2) + 1`` and ``1 x 2 x 3 + 1`` MB:

    >>> te_graph_buffer_bytes(np.full(4, 1e6), np.full(4, 2e6), [0, 2, 4], np.array([2.0, 1.0])).tolist()
    [13000000.0, 7000000.0]
    """
    out = np.zeros(len(bounds) - 1)
    for s in range(len(out)):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        if hi > lo:
            out[s] = float(in_flight[s]) * float((hidden[lo:hi] + mask[lo:hi]).sum()) + float(hidden[lo:hi].max())
    return out
