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
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from objectives.intra_op import OVERLAP_CONTENTION, CommKind, CommTerm, Level
from planner.core.graph import Op, Tensor

__all__ = ["TP_GEMM_TYPES", "is_tp_gemm", "chunked_exposed_s", "bulk_exposed_s", "overlapped_terms",
           "overlapped_edge"]

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


def overlapped_terms(
    comm: Mapping[tuple[CommKind, Level], np.ndarray], terms: list[CommTerm], *,
    forward_s: np.ndarray, backward_s: np.ndarray,
) -> dict[tuple[CommKind, Level], np.ndarray]:
    """A linear layer's intra-op communication ``comm`` (``{(kind, level): (K,) seconds}``, as the tables
    price it from ``terms``: :func:`objectives.intra_op.price_terms` plus each call's setup) overlapped:
    ``partial_sum`` chunked over its group (the largest of the kind's ``terms``) under ``forward_s``,
    ``input_grad`` in bulk under ``backward_s``; other kinds as they are."""
    out = dict(comm)
    for (kind, level), seconds in comm.items():
        if kind == "partial_sum":
            chunks = np.max([t.intra_size * t.inter_size for t in terms if t.kind == kind], axis=0)
            out[(kind, level)] = chunked_exposed_s(seconds, forward_s, chunks)
        elif kind == "input_grad":
            out[(kind, level)] = bulk_exposed_s(seconds, backward_s)
    return out


def overlapped_edge(
    time_s: np.ndarray, *, consumer: tuple[np.ndarray, np.ndarray] | None,
    producer_backward_s: np.ndarray | None,
) -> np.ndarray:
    """A redistribution table ``(K_u, K_v)`` next to a linear layer, overlapped: into one (``consumer``:
    its ``(K_v,)`` forward seconds and tensor-parallel degree) chunked under its forward GEMM (the
    sequence-parallel all-gather); else out of one (``producer_backward_s``: ``(K_u,)``) in bulk under
    its backward (the all-gather of the output's gradient); else unchanged."""
    if consumer is not None:
        forward_s, chunks = consumer
        return chunked_exposed_s(time_s, forward_s[None, :], chunks[None, :])
    if producer_backward_s is not None:
        return bulk_exposed_s(time_s, producer_backward_s[:, None])
    return time_s
