r"""Tensor-parallel communication overlapped with the linear layers' GEMMs (``--fix tp_overlap=on``).

Megatron-LM's ``--tp-comm-overlap`` (``TransformerConfig.tp_comm_overlap``, megatron-core 0.16.1
``model_parallel_config.py``) hands the sequence-parallel all-gather and reduce-scatter around each
column- and row-parallel linear layer to Transformer Engine's userbuffers
(``transformer_engine.pytorch.module.base.initialize_ub``), which hide them under the GEMMs, as NeMo's
performance guide turns it on for its large-model recipes (NeMo docs, "Communication Overlap":
``tp_comm_overlap``). It runs only with sequence parallelism and ``tp > 1`` (Megatron-LM's
``validate_args``: "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism
is enabled"). Two methods, by pass (megatron-core 0.16.1 defaults):

* **Forward: chunked pipeline** (``tp_comm_overlap_ag`` / ``tp_comm_overlap_rs``, on): the all-gather
  before a column-parallel GEMM and the reduce-scatter after a row-parallel one are split into
  :math:`n` chunks, one per tensor-parallel rank (the ring exchange of Wang et al., "Overlap
  Communication with Dependent Computation via Decomposition in Large Deep Learning Models", ASPLOS
  2023, which Transformer Engine's ``ring_exchange`` method implements), and chunk :math:`k`'s exchange
  runs beside the GEMM of chunk :math:`k - 1`. The first chunk's exchange has no GEMM to hide under;
  the other :math:`(n-1)/n` of the communication runs beside the GEMM (:func:`chunked_exposed_s`):

  .. math::

      t_{exposed} = \frac{t_{comm}}{n} + \max\left(0, \tfrac{n-1}{n} t_{comm} - t_{gemm}\right)
                    + \kappa \min\left(\tfrac{n-1}{n} t_{comm}, t_{gemm}\right)

  with :math:`\kappa` = :data:`objectives.intra_op.OVERLAP_CONTENTION`, the contention charge every
  other overlap pays (:func:`objectives.intra_op.exposed_under`).
* **Backward: bulk overlap** (``tp_comm_bulk_wgrad`` / ``tp_comm_bulk_dgrad``, on): the all-gather of
  the saved sequence-parallel input runs beside the data-gradient GEMM and the reduce-scatter of the
  input gradient beside the weight-gradient GEMM, each a whole collective beside one of the two
  backward GEMMs: half the op's backward (:func:`bulk_exposed_s`; the two GEMMs have the same FLOPs).

What is overlapped in the cost tables (:mod:`objectives.tables`), only with the setting on and under an
execution model: a linear layer's (a ``MatMul``/``Gemm`` reading a parameter, :func:`is_tp_gemm`)
tensor-parallel terms (``partial_sum`` in forward, ``input_grad`` in backward) and the redistribution
edges into it (the sequence-parallel all-gather: under its forward) or out of it (the all-gather of
the output's gradient: under its backward). With sequence parallelism those edges hold only what the
reduce-scatter and all-gather cost beyond the op's all-reduce (:mod:`objectives.sequence_split`), so
what the chunked pipeline hides is the op's all-reduce, standing for the reduce-scatter and all-gather
Megatron-LM runs; the edges overlapped are the same. Without the setting every figure is today's, to
the bit.

**torchtitan's async TP** (``TrainingSettings.tp_overlap_method == "micro-pipeline"``;
``--compile.enable_async_tensor_parallel``, torchtitan 0.3.0 ``distributed/compile.py``) sets inductor's
``_micro_pipeline_tp``, whose ``micro_pipeline_tp_pass`` (torch 2.13 ``_inductor/fx_passes/micro_pipeline_tp.py``)
rewrites, in each compiled transformer block's forward and backward graphs, an all-gather whose result is the
left operand of ``mm`` / ``_scaled_mm`` into ``symm_mem.fused_all_gather_matmul``, and a reduce-scatter whose
input is an ``mm``'s output into ``symm_mem.fused_matmul_reduce_scatter``. Both split the GEMM into ``n = tp``
row chunks (``torch/distributed/_symmetric_memory/__init__.py``): the all-gather's first chunk is the rank's own
shard (``_pipelined_multi_all_gather_and_consume``: ``shard_consumer(shard, rank)`` before any copy), each of
the ``n - 1`` remote shards is copied beside the GEMM of the chunk before it; the reduce-scatter computes the
``n - 1`` remote chunks first, each copied out beside the next chunk's GEMM, its own chunk last
(``_pipelined_produce_and_all2all``). So no chunk is exposed up front, and ``(n - 1) / n`` of the GEMM is the
window (:func:`micro_pipelined_exposed_s`):

.. math::

    t_{exposed} = \max\left(0, t_{comm} - \tfrac{n-1}{n} t_{gemm}\right)
                  + \kappa \min\left(t_{comm}, \tfrac{n-1}{n} t_{gemm}\right)

What the pass matches, per linear layer (:func:`micro_pipelined_collectives`): the forward all-gather into the
GEMM and the reduce-scatter after it, under its forward; in backward, the all-gather of the output's gradient
under the data-gradient GEMM (``dY @ W``: half the backward; the weight gradient reads the gathered ``dY``
transposed, which the pass does not match) and the input gradient's reduce-scatter under the data-gradient GEMM,
only where no other op reads the layer's input (Q/K/V or a gated MLP's two projections sum their input gradients
first, and an ``add`` is no ``mm`` producer: ``_find_producer_matmul``). Not matched, so exposed as before: layers
outside the repeated blocks (torchtitan compiles each ``TransformerBlock``, ``apply_compile``; the LM head is
not), and under FP8 the all-gathers (torchao's ``Float8Linear`` casts the gathered input and gradient to FP8
before ``_scaled_mm``, so the gather's user is no matmul; the reduce-scatters after a ``_scaled_mm`` are matched).

Where the collectives are priced: a sequence-parallel layer's reduce-scatter and all-gather are its all-reduce, the
edges holding only NCCL's extra call (:mod:`objectives.sequence_split`): ``partial_sum`` on a row-parallel layer
stands for its reduce-scatter after the GEMM in forward and the all-gather of its output's gradient in backward,
``input_grad`` on a column-parallel layer for the all-gather into it in forward and its input gradient's
reduce-scatter in backward. A ring all-reduce is one reduce-scatter and one all-gather, so each half is priced
beside its own pass's GEMM, micro-pipelined where the pass fuses it (the forward; the data-gradient GEMM, half the
backward), exposed where not. Not priced: the local sum of the ``n`` partial chunks after the reduce-scatter's
copies (``reduce_fn``, one memory-bound pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from objectives.intra_op import OVERLAP_CONTENTION, CommKind, CommTerm, Level
from planner.core.graph import Op, OpGraph, Tensor
from planner.core.memo import IdentityMemo
from planner.core.settings import TpOverlapMethod

__all__ = ["TP_GEMM_TYPES", "is_tp_gemm", "chunked_exposed_s", "bulk_exposed_s", "micro_pipelined_exposed_s",
           "LayerOverlap", "EVERY_COLLECTIVE", "micro_pipelined_collectives", "overlapped_terms", "overlapped_edge"]

TP_GEMM_TYPES = frozenset({"MatMul", "Gemm"})
"""ONNX ops that Transformer Engine's ``Linear`` / ``LayerNormLinear`` run as GEMMs with userbuffers."""


def is_tp_gemm(op: Op, tensors: Mapping[str, Tensor]) -> bool:
    """Whether ``op`` is a linear layer (a GEMM reading a parameter), whose tensor-parallel collectives
    Transformer Engine overlaps (module docstring)."""
    return op.op_type in TP_GEMM_TYPES and any(
        (tensor := tensors.get(access.tensor)) is not None and tensor.role == "parameter" for access in op.inputs
    )


def chunked_exposed_s(comm_s: np.ndarray, gemm_s: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    r"""Seconds of ``comm_s`` left on the critical path by the forward chunked pipeline (module
    docstring): the first of ``chunks`` chunks exposed, the rest beside ``gemm_s``, with contention.

    >>> round(float(chunked_exposed_s(np.array(8.0), np.array(10.0), np.array(4))), 12)  # 2 + 0 + k * 6
    3.090909090909
    >>> float(chunked_exposed_s(np.array(8.0), np.array(10.0), np.array(1)))  # one chunk: all exposed
    8.0
    """
    n = np.maximum(np.asarray(chunks, dtype=np.float64), 1.0)
    comm = np.asarray(comm_s, dtype=np.float64)
    rest = comm * (n - 1.0) / n
    return comm / n + np.maximum(0.0, rest - gemm_s) + OVERLAP_CONTENTION * np.minimum(rest, gemm_s)


def bulk_exposed_s(comm_s: np.ndarray, backward_s: np.ndarray) -> np.ndarray:
    r"""Seconds of a backward collective left exposed by bulk overlap beside one of the two backward
    GEMMs (``backward_s / 2``), with contention (module docstring).

    >>> round(float(bulk_exposed_s(np.array(3.0), np.array(4.0))), 12)  # 1 + k * 2
    1.363636363636
    """
    window = np.asarray(backward_s, dtype=np.float64) / 2.0
    comm = np.asarray(comm_s, dtype=np.float64)
    return np.maximum(0.0, comm - window) + OVERLAP_CONTENTION * np.minimum(comm, window)


def micro_pipelined_exposed_s(comm_s: np.ndarray, gemm_s: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    r"""Seconds of ``comm_s`` left on the critical path by torch's micro-pipelined all-gather-matmul or
    matmul-reduce-scatter (module docstring): ``chunks`` row chunks of ``gemm_s``, the ``chunks - 1`` copies
    beside ``(chunks - 1) / chunks`` of it (the rank's own chunk needs none), with contention
    (:func:`objectives.intra_op.exposed_under`'s rule).

    >>> round(float(micro_pipelined_exposed_s(np.array(8.0), np.array(10.0), np.array(4))), 12)  # 0.5 + k * 7.5
    1.863636363636
    >>> float(micro_pipelined_exposed_s(np.array(8.0), np.array(10.0), np.array(1)))  # one chunk: all exposed
    8.0
    """
    n = np.maximum(np.asarray(chunks, dtype=np.float64), 1.0)
    comm = np.asarray(comm_s, dtype=np.float64)
    window = np.asarray(gemm_s, dtype=np.float64) * (n - 1.0) / n
    return np.maximum(0.0, comm - window) + OVERLAP_CONTENTION * np.minimum(comm, window)


@dataclass(frozen=True, slots=True)
class LayerOverlap:
    """Which of a linear layer's tensor-parallel collectives its launcher runs under its GEMMs."""

    forward_gather: bool
    """The all-gather into the GEMM, under its forward (``input_grad``'s forward half; the edge from a sequence
    split)."""
    forward_scatter: bool
    """The reduce-scatter of its partial sums, under its forward (``partial_sum``'s forward half)."""
    backward_gather: bool
    """The all-gather of its output's gradient, under its data-gradient GEMM (``partial_sum``'s backward half;
    the edge out of the GEMM)."""
    backward_scatter: bool
    """The reduce-scatter of its input gradient, under its data-gradient GEMM (``input_grad``'s backward half)."""


EVERY_COLLECTIVE = LayerOverlap(True, True, True, True)
"""Transformer Engine's userbuffers: every linear layer's four collectives (module docstring)."""
_NONE = LayerOverlap(False, False, False, False)
_COLLECTIVES: IdentityMemo[dict[str, LayerOverlap]] = IdentityMemo(size=16)


def micro_pipelined_collectives(graph: OpGraph, *, fp8: bool) -> Mapping[str, LayerOverlap]:
    """Per op of ``graph`` (by name), the collectives inductor's ``micro_pipeline_tp`` pass fuses with its GEMMs (module
    docstring): none outside the repeated blocks (torchtitan compiles each block; a graph without blocks counts
    every op as compiled) or off a linear layer; the all-gathers unless ``fp8``; the input gradient's
    reduce-scatter where no other op reads the layer's activation input (kept per graph and ``fp8``)."""
    return _COLLECTIVES.get((graph, "fp8" if fp8 else "bf16"), lambda: _collectives(graph, fp8=fp8))


def _collectives(graph: OpGraph, *, fp8: bool) -> dict[str, LayerOverlap]:
    from objectives.parameters import ParameterView

    tensors = ParameterView(graph)
    in_blocks = {i for group in graph.blocks for instance in group.instances for i in instance}
    gemm = [is_tp_gemm(op, tensors) for op in graph.ops]
    readers: dict[str, int] = {}  # tensor -> ops reading it, whose input gradients autograd sums
    for op in graph.ops:
        for name in {access.tensor for access in op.inputs}:
            readers[name] = readers.get(name, 0) + 1
    out = {}
    for index, (op, linear) in enumerate(zip(graph.ops, gemm)):
        if not linear or (graph.blocks and index not in in_blocks):
            out[op.name] = _NONE
            continue
        activations = [a.tensor for a in op.inputs if (t := tensors.get(a.tensor)) is None or t.role != "parameter"]
        alone = all(readers.get(name, 0) == 1 for name in activations)
        out[op.name] = LayerOverlap(forward_gather=not fp8, forward_scatter=True, backward_gather=not fp8,
                                    backward_scatter=alone)
    return out


def overlapped_terms(
    comm: Mapping[tuple[CommKind, Level], np.ndarray], terms: list[CommTerm], *,
    forward_s: np.ndarray, backward_s: np.ndarray, method: TpOverlapMethod = "userbuffers",
    layer: LayerOverlap = EVERY_COLLECTIVE,
) -> dict[tuple[CommKind, Level], np.ndarray]:
    """A linear layer's intra-op communication ``comm`` (``{(kind, level): (K,) seconds}``, as the tables
    price it from ``terms``: :func:`objectives.intra_op.price_terms` plus each call's setup) overlapped, each
    kind's chunks its group (the largest of the kind's ``terms``). ``userbuffers``: ``partial_sum`` chunked under
    ``forward_s``, ``input_grad`` in bulk under ``backward_s``; ``micro-pipeline``: each all-reduce's forward half
    beside ``forward_s`` and backward half beside the data-gradient GEMM (half ``backward_s``), micro-pipelined
    where ``layer`` says the pass fuses it, else exposed (module docstring); other kinds as they are."""
    out = dict(comm)
    for (kind, level), seconds in comm.items():
        if kind not in ("partial_sum", "input_grad"):
            continue
        chunks = np.max([t.intra_size * t.inter_size for t in terms if t.kind == kind], axis=0)
        if method == "micro-pipeline":
            # partial_sum: reduce-scatter in forward, gradient all-gather in backward; input_grad: the mirror
            fused = ((layer.forward_scatter, layer.backward_gather) if kind == "partial_sum"
                     else (layer.forward_gather, layer.backward_scatter))
            half = np.asarray(seconds) / 2.0
            out[(kind, level)] = sum(
                (micro_pipelined_exposed_s(half, window, chunks) if on else half)
                for window, on in zip((forward_s, np.asarray(backward_s) / 2.0), fused))
        elif kind == "partial_sum":
            out[(kind, level)] = chunked_exposed_s(seconds, forward_s, chunks)
        else:
            out[(kind, level)] = bulk_exposed_s(seconds, backward_s)
    return out


def overlapped_edge(
    time_s: np.ndarray, *, consumer: tuple[np.ndarray, np.ndarray] | None,
    producer_backward_s: np.ndarray | None, method: TpOverlapMethod = "userbuffers",
    producer_chunks: np.ndarray | None = None,
) -> np.ndarray:
    """A redistribution table ``(K_u, K_v)`` next to a linear layer, overlapped: into one (``consumer``:
    its ``(K_v,)`` forward seconds and tensor-parallel degree) under its forward GEMM (the sequence-parallel
    all-gather); else out of one (``producer_backward_s``: ``(K_u,)``) under its backward (the all-gather of the
    output's gradient); else unchanged. ``userbuffers``: chunked, then in bulk beside half the backward;
    ``micro-pipeline``: micro-pipelined in both, beside the data-gradient GEMM (half the backward) over
    ``producer_chunks`` (``(K_u,)``) in backward. The caller passes only the sides its method fuses
    (:class:`LayerOverlap`)."""
    if consumer is not None:
        forward_s, chunks = consumer
        if method == "micro-pipeline":
            return micro_pipelined_exposed_s(time_s, forward_s[None, :], chunks[None, :])
        return chunked_exposed_s(time_s, forward_s[None, :], chunks[None, :])
    if producer_backward_s is not None:
        if method == "micro-pipeline":
            assert producer_chunks is not None, "micro-pipelined backward gathers need the producer's chunks"
            return micro_pipelined_exposed_s(time_s, producer_backward_s[:, None] / 2.0, producer_chunks[:, None])
        return bulk_exposed_s(time_s, producer_backward_s[:, None])
    return time_s
