"""What a launcher's linear layers keep less than the tables charge, per plan: the sequence-parallel
input shard (:func:`sequence_shard_credit`; ``TrainingSettings.sequence_shard_saved``, Megatron-Core and
Transformer Engine), as ``(producer, consumer, bytes)`` pairs (:func:`sequence_shard_pairs`) so that a
stage's price (``objectives.pipeline_price.price_plan``) and the stage cut's per-segment memory
(``objectives.pipeline_price.segment_activation_bytes``) count the same bytes, and its per-op ceiling
(:func:`sequence_shard_ceiling`) for the search's lower bounds, which must stay below every price.

The rule is a launcher's, not an execution model's: DeepSpeed runs the fused kernels Megatron-LM runs
and keeps the gathered tensor, so the pipeline search hands it per search
(``planner.search.pipeline.TargetRules.sequence_shard_saved``), as it hands ZeRO-3's gather bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from objectives._common import element_bytes, is_float, shard_elements
from objectives.graph_memo import graph_memo
from planner.core.configs import ConfigSpace
from planner.core.graph import OpGraph, TensorAccess
from planner.core.settings import TrainingSettings

__all__ = ["KEEPS_LINEAR_INPUTS", "sequence_shard_ceiling", "sequence_shard_credit", "sequence_shard_pairs"]

KEEPS_LINEAR_INPUTS = ("none", "selective")
"""The recomputation modes under which a linear layer keeps its own input for backward (``full``,
``mlp`` and ``op`` re-run the linears from the layer's checkpoint: Megatron-Core's
``CheckpointFunction``, torchtitan's op-level policy), so the shard rule can apply."""


@dataclass(frozen=True, slots=True)
class _Reading:
    """One activation that linear layers read: its producer's output and its readers, in op order."""

    producer: int
    made: TensorAccess
    shape: tuple[int, ...]
    element_bytes: float
    """Bytes per element at the training precision (``objectives._common.element_bytes``)."""
    readers: tuple[tuple[int, TensorAccess], ...]


def _readings(graph: OpGraph, settings: TrainingSettings) -> tuple[_Reading, ...]:
    """The float activations read by linear layers (a matmul with a parameter input), each with the
    op that makes it; graph inputs and parameters are left out (nothing is gathered from a shard).
    Memoised on the graph per training precision (the one setting read): a search builds hundreds
    of stage models of a few graphs."""
    memo, key = graph_memo(graph), ("sequence shard readings", settings.precision)
    if key not in memo:
        memo[key] = _find_readings(graph, settings)
    return memo[key]


def _find_readings(graph: OpGraph, settings: TrainingSettings) -> tuple[_Reading, ...]:
    tensors = graph.tensors
    index = {op.name: i for i, op in enumerate(graph.ops)}
    readers: dict[str, list[tuple[int, TensorAccess]]] = {}
    for v, op in enumerate(graph.ops):
        if op.kind != "matmul" or not any(
                getattr(tensors.get(a.tensor), "role", None) == "parameter" for a in op.inputs):
            continue
        for access in op.inputs:
            tensor = tensors.get(access.tensor)
            if tensor is None or tensor.role == "parameter" or not is_float(tensor):
                continue
            if not any(r == v for r, _ in readers.get(access.tensor, ())):
                readers.setdefault(access.tensor, []).append((v, access))
    found = []
    for name, read in readers.items():
        tensor = tensors[name]
        u = index.get(tensor.producer, -1) if tensor.producer is not None else -1
        made = next((a for a in graph.ops[u].outputs if a.tensor == name), None) if u >= 0 else None
        if made is not None:
            found.append(_Reading(producer=u, made=made, shape=tuple(tensor.shape),
                                  element_bytes=float(element_bytes(tensor, settings)), readers=tuple(read)))
    return tuple(found)


def _tables(graph: OpGraph, spaces: Sequence[ConfigSpace], settings: TrainingSettings,
            memo: dict | None) -> list[tuple[int, np.ndarray, tuple[tuple[int, np.ndarray], ...]]]:
    """Per reading: ``(producer, held elements per producer configuration, ((reader, gathered
    elements per reader configuration), ...))``, kept in ``memo`` (a stage model's shared dict: the
    same spaces at every ZeRO stage and recomputation) under the training precision."""
    key = ("sequence shard tables", settings.precision)
    if memo is not None and key in memo and _same(memo[key][0], spaces):
        return memo[key][1]
    # the ops of one class (a layer's q, k, v, ...) share one space object and read alike: one table
    # per (space, axes, shape, bytes), shared by every layer (the spaces live through this call)
    by_class: dict[tuple, np.ndarray] = {}

    def table(op: int, access: TensorAccess, reading: _Reading) -> np.ndarray:
        key = (id(spaces[op]), access.axes, reading.shape, reading.element_bytes)
        if key not in by_class:
            by_class[key] = shard_elements(spaces[op], graph.ops[op], access, reading.shape) * reading.element_bytes
        return by_class[key]

    out = []
    for reading in _readings(graph, settings):
        gathered = tuple((v, table(v, access, reading)) for v, access in reading.readers)
        out.append((reading.producer, table(reading.producer, reading.made, reading), gathered))
    if memo is not None:
        memo[key] = (tuple(spaces), out)
    return out


def _same(kept: Sequence[ConfigSpace], spaces: Sequence[ConfigSpace]) -> bool:
    """Whether two models' spaces are the same objects (a stage model's ZeRO stages and recomputations
    share them, each model with its own tuple)."""
    return len(kept) == len(spaces) and all(a is b for a, b in zip(kept, spaces))


def sequence_shard_pairs(graph: OpGraph, spaces: Sequence[ConfigSpace], picks: np.ndarray,
                         settings: TrainingSettings, memo: dict | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(producer, reader, bytes)`` int64, int64, float64 arrays: per activation a linear layer reads
    gathered while its producer holds a smaller shard under ``picks``, the first such reader (in op
    order) and the bytes per micro-batch it keeps less, (gathered - shard) elements at the training
    precision, once per tensor (q, k and v read one input, as they share its charge). The credit
    holds where producer and reader run on one stage (a stage's input arrives whole by the
    pipeline's send): :func:`sequence_shard_credit`. Ops come in topological order and a stage runs
    consecutive layers, so the first reader is on the producer's stage whenever any reader is."""
    us, vs, credits = [], [], []
    for u, held, gathered in _tables(graph, spaces, settings, memo):
        shard = float(held[picks[u]])
        for v, table in gathered:
            whole = float(table[picks[v]])
            if shard < whole:
                us.append(u)
                vs.append(v)
                credits.append(whole - shard)
                break
    return np.asarray(us, dtype=np.int64), np.asarray(vs, dtype=np.int64), np.asarray(credits, dtype=np.float64)


def sequence_shard_credit(
    graph: OpGraph, spaces: Sequence[ConfigSpace], picks: np.ndarray, stage: np.ndarray, pp: int,
    settings: TrainingSettings, memo: dict | None = None,
) -> np.ndarray:
    """``(pp,)`` bytes per micro-batch a stage's activations hold less where a linear layer keeps its
    producer's shard of an all-gathered input (``settings.sequence_shard_saved``) instead of the
    gathered tensor its configuration reads, the tables' charge (:func:`sequence_shard_pairs`).

    Megatron-Core's ``LinearWithGradAccumulationAndAsyncCommunication.forward`` calls
    ``ctx.save_for_backward(input, weight)`` on the local input before ``dist_all_gather_func`` fills
    ``total_input`` (a buffer of ``get_global_memory_buffer()``, reused by every layer), and its backward
    gathers ``input`` again before the weight gradient (megatron-core 0.16.1,
    ``tensor_parallel/layers.py``); Transformer Engine's ``_Linear`` saves ``inputmat`` before
    ``gather_along_first_dim`` under ``parallel_mode == "column" and sequence_parallel`` and gathers it
    in backward (``transformer_engine/pytorch/module/linear.py``). Korthikanti et al. (MLSys 2023),
    section 4.2.2: "we store only the tensor-parallel-partitioned Y^s_i" for the backward pass.
    Only a linear layer that keeps its input qualifies: not under ``full``, ``mlp`` or ``op``
    recomputation (:data:`KEEPS_LINEAR_INPUTS`), and only a producer on the same stage.

    >>> empty = OpGraph(name="empty", ops=(), tensors={}, edges=())
    >>> sequence_shard_credit(empty, [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 2,
    ...                       TrainingSettings(sequence_shard_saved=True)).tolist()
    [0.0, 0.0]
    """
    credit = np.zeros(pp)
    if not settings.sequence_shard_saved or settings.recompute not in KEEPS_LINEAR_INPUTS:
        return credit
    u, v, nbytes = sequence_shard_pairs(graph, spaces, picks, settings, memo)
    same = stage[u] == stage[v]
    return credit + np.bincount(stage[v][same], weights=nbytes[same], minlength=pp)


def sequence_shard_ceiling(graph: OpGraph, spaces: Sequence[ConfigSpace], settings: TrainingSettings,
                           memo: dict | None = None) -> dict[int, np.ndarray]:
    """``{reader op: (K,) bytes per micro-batch}``: per configuration of each linear layer that reads a
    gathered activation, the most a plan's shard credit can give it, (its gathered bytes - the
    producer's smallest shard), never below zero, for lower bounds that must stay below every price
    (``planner.search.pipeline_bounds``). A tensor's credit is one reader's (gathered - shard) at the
    plan's configurations, at most that reader's ceiling there, and the other readers' ceilings are
    >= 0: so each op's least activations less its ceiling, summed, bound the credited sum from below.
    q, k and v read one input: each holds the ceiling, a looser bound than once per tensor."""
    ceiling_key = ("sequence shard ceiling", settings.precision)
    if memo is not None and ceiling_key in memo and _same(memo[ceiling_key][0], spaces):
        return memo[ceiling_key][1]
    ceiling: dict[int, np.ndarray] = {}
    # the tables repeat per layer as shared objects (:func:`_tables`): each (table, smallest) once
    excess: dict[tuple[int, float], np.ndarray] = {}
    for _, held, gathered in _tables(graph, spaces, settings, memo):
        smallest = float(held.min())
        for v, table in gathered:
            key = (id(table), smallest)
            if key not in excess:
                excess[key] = np.maximum(table - smallest, 0.0)
            most = excess[key]
            if most.any():
                ceiling[v] = ceiling[v] + most if v in ceiling else most
    if memo is not None:  # a stage model's ZeRO stages and recomputations ask again with its spaces
        memo[ceiling_key] = (tuple(spaces), ceiling)
    return ceiling
