r"""Sequence parallelism's collectives: a partial sum reduce-scattered, not all-reduced then re-laid.

An op's partial sums are all-reduced inside the op (:mod:`objectives.intra_op`, ``partial_sum``) and
its consumer's input gradients inside the consumer (``input_grad``); the edge between them then moves
what the tile rule says (:mod:`objectives.redistribution`). Where the consumer of an all-reduced
output holds only a ``1/g`` share of it, ``g`` the all-reduce's group (Megatron's sequence parallelism:
a row-parallel linear layer feeding a sequence-split dropout, residual add or norm), that prices the
boundary as an all-reduce in forward plus an all-gather of the output's gradient in backward. Megatron-LM
runs one reduce-scatter in forward instead (``reduce_scatter_to_sequence_parallel_region``) and its
mirror, one all-gather, in backward; and before a column-parallel layer one all-gather in forward and
one reduce-scatter of the input gradient in backward (``gather_from_sequence_parallel_region``), where
the tables priced the all-gather plus an all-reduce (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", MLSys 2023, section 4.2.2: a sequence-parallel layer
communicates exactly what a tensor-parallel one does, a ring all-reduce being a reduce-scatter followed
by an all-gather).

So for such a pair of configurations (:func:`objectives.redistribution.scatter_ratios`: the consumer's
tile inside the producer's, on the same devices, ``g`` times smaller) the edge's table becomes

.. math::

    t_{uv} = \max\left(0,\; T_{RS}(B, g) + T_{AG}(B, g) - T_{AR}(B, g)\right)

with :math:`B` the producer's shard of the tensor (bytes) and every collective priced as the op's own
all-reduce is (:func:`objectives.intra_op.term_time_s` on the all-reduce's group, NCCL's model inside a
node under an execution model, plus each call's setup), so the op keeps its all-reduce and the edge
carries the difference: zero in the alpha-beta ring model (:mod:`objectives.collectives`), NCCL's extra
call overhead under it. Backward, the mirror for the consumer's input-gradient all-reduce. The clamp
at zero keeps every edge non-negative (the search's bounds and min-sum diffusion need that) and never
prices a boundary below the op's all-reduce, which is itself a way to run it; a tensor read by two
sequence-split consumers (the embedding's output: the first norm and the residual) then costs one
all-reduce, as one reduce-scatter plus one all-gather of the summed gradients does.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from objectives.fixed_costs import collective_setup_s
from objectives.intra_op import CommTerm, intra_op_terms, term_time_s
from objectives.redistribution import ScatterRatios, edge_scatter_ratios
from planner.core.cluster import Cluster
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, Tensor, TensorAccess
from planner.core.settings import TrainingSettings

__all__ = ["collective_s", "scattered_boundary_s", "sequence_split_table"]


def collective_s(term: CommTerm, collective: str, *, cluster: Cluster, nccl: bool,
                 cuda_graphs: bool = False) -> np.ndarray:
    """``(K,)`` seconds of ``term``'s buffer run as ``collective`` on ``term``'s group, as the tables price
    an op's collective: :func:`~objectives.intra_op.term_time_s` plus, under an execution model
    (``nccl``), each call's fixed setup (``Device.collective_overhead_s``, as
    ``objectives.tables._roofline_detail`` adds it; none inside a captured CUDA graph, ``cuda_graphs``:
    :func:`objectives.fixed_costs.collective_setup_s`)."""
    seconds = term_time_s(dataclasses.replace(term, collective=collective), cluster=cluster, nccl=nccl)
    if nccl:
        seconds = seconds + collective_setup_s(cluster.device, cuda_graphs=cuda_graphs) * (seconds > 0.0)
    return seconds


def scattered_boundary_s(term: CommTerm, *, cluster: Cluster, nccl: bool, cuda_graphs: bool = False) -> np.ndarray:
    r"""``(K,)`` seconds one reduce-scatter and one all-gather of ``term``'s buffer cost beyond its
    all-reduce, floored at 0: :math:`\max(0, T_{RS} + T_{AG} - T_{AR})` (module docstring). Each call's
    setup is the tables' (:func:`collective_s`): under NCCL the two calls pay one setup more than the
    all-reduce, except inside a captured CUDA graph (``cuda_graphs``), where no call pays one and the
    boundary keeps only NCCL's second kernel latency.

    Examples
    --------
    >>> from planner.core.cluster import Link
    >>> from objectives.cluster import make_cluster
    >>> cluster = make_cluster("a100-80gb", devices=8)
    >>> term = CommTerm(kind="partial_sum", collective="all_reduce", tensor="y", num_bytes=np.array([12e6]),
    ...                 intra_size=np.array([4]), inter_size=np.array([1]))
    >>> float(scattered_boundary_s(term, cluster=cluster, nccl=False)[0])  # ring: RS + AG = AR
    0.0
    """
    parts = (collective_s(term, name, cluster=cluster, nccl=nccl, cuda_graphs=cuda_graphs)
             for name in ("reduce_scatter", "all_gather"))
    extra = sum(parts) - collective_s(term, "all_reduce", cluster=cluster, nccl=nccl, cuda_graphs=cuda_graphs)
    # the ring formulas' RS + AG equals AR up to float rounding: 0, not 1e-20
    return np.where(extra > 1e-12, extra, 0.0)


def _term_of(op: Op, space: ConfigSpace, kind: str, tensor: str, tensors, settings) -> CommTerm | None:
    terms = [t for t in intra_op_terms(op, space, tensors=tensors, settings=settings)
             if t.kind == kind and t.tensor == tensor]
    return terms[0] if len(terms) == 1 else None


def sequence_split_table(
    time_s: np.ndarray,
    shape: tuple[int, ...],
    *,
    tensor: Tensor,
    producer: Op,
    producer_space: ConfigSpace,
    producer_access: TensorAccess,
    consumer: Op,
    consumer_space: ConfigSpace,
    consumer_access: TensorAccess,
    cluster: Cluster,
    tensors: Mapping[str, Tensor],
    settings: TrainingSettings,
    nccl: bool,
    free_axes: frozenset[int] = frozenset(),
    rows: np.ndarray | None = None,
    cols: np.ndarray | None = None,
    captured: tuple[bool, bool] | None = None,
) -> np.ndarray:
    """One tensor's ``(K_u, K_v)`` redistribution table ``time_s`` with its sequence-parallel pairs priced
    as reduce-scatter plus all-gather (module docstring): ``time_s`` itself, its pairs' cells overwritten.
    ``rows``, ``cols``: the producer's and consumer's configurations ``time_s`` holds (``None``: all;
    :func:`objectives.redistribution.redistribution_time_s`'s), the result those entries of the whole table.
    ``captured``: whether the producer's forward and the consumer's backward collective run inside a captured CUDA
    graph (``objectives.graph_facts.captured_ops``; ``None``: both as ``settings.cuda_graphs``).

    The pairs are found in row chunks, on the rows and columns whose all-reduce group has more than one
    device only: a whole-table comparison and ``np.where`` per direction were fresh pages every edge of a
    3,072-device stage model (issue 22, ninth round)."""
    produced = _term_of(producer, producer_space, "partial_sum", tensor.name, tensors, settings)
    consumed = _term_of(consumer, consumer_space, "input_grad", tensor.name, tensors, settings)
    if produced is None and consumed is None:
        return time_s
    ratios = edge_scatter_ratios(
        shape, producer=producer, producer_space=producer_space, producer_access=producer_access,
        consumer=consumer, consumer_space=consumer_space, consumer_access=consumer_access, cluster=cluster,
        free_axes=free_axes, rows=rows, cols=cols,
    )
    at_u = slice(None) if rows is None else np.asarray(rows, dtype=np.int64)  # time_s's configurations
    at_v = slice(None) if cols is None else np.asarray(cols, dtype=np.int64)
    every_u, every_v = np.arange(time_s.shape[0]), np.arange(time_s.shape[1])
    # inside a captured graph no call pays its setup (collective_s): forward the producer's side, backward the consumer's
    forward_graphs, backward_graphs = captured if captured is not None else (settings.cuda_graphs, settings.cuda_graphs)
    if produced is not None:  # forward: the rows (producer configurations) of a group > 1, every column
        group = (produced.intra_size * produced.inter_size).astype(np.float64)[at_u]
        _overwrite(time_s, ratios, "forward", np.flatnonzero(group > 1.0), every_v, group,
                   lambda: scattered_boundary_s(produced, cluster=cluster, nccl=nccl, cuda_graphs=forward_graphs)[at_u])
    if consumed is not None:  # backward, after the forward as before: every row, the columns of a group > 1
        group = (consumed.intra_size * consumed.inter_size).astype(np.float64)[at_v]
        _overwrite(time_s, ratios, "backward", every_u, np.flatnonzero(group > 1.0), group,
                   lambda: scattered_boundary_s(consumed, cluster=cluster, nccl=nccl, cuda_graphs=backward_graphs)[at_v])
    return time_s


_CHUNK_ROWS = 128
"""Rows of a table compared at once (as :mod:`objectives.redistribution` assembles its tables)."""


def _overwrite(out: np.ndarray, ratios: ScatterRatios, direction: str, rows: np.ndarray, cols: np.ndarray,
               group: np.ndarray, seconds_of) -> None:
    """Set ``out[r, c]`` (``r`` in ``rows``, ``c`` in ``cols``: positions in ``out`` and in ``ratios``) to the
    scattered boundary's seconds where ``direction``'s ratio equals the all-reduce's ``group`` (the producer's
    per row of ``out`` forward, the consumer's per column backward): ``seconds_of()``, per row or column of
    ``out`` likewise, asked once a pair is found."""
    if rows.size == 0 or cols.size == 0:
        return
    forward = direction == "forward"
    seconds = None
    block_of = ratios.columns(direction, cols)  # ratios.block(direction, rows, cols), the columns expanded once
    for start in range(0, rows.size, _CHUNK_ROWS):
        block = rows[start:start + _CHUNK_ROWS]
        pairs = block_of(block) == (group[block, None] if forward else group[None, cols])
        if not pairs.any():
            continue
        seconds = seconds_of() if seconds is None else seconds
        cells = (block, slice(None)) if cols.size == out.shape[1] else np.ix_(block, cols)
        chunk = out[cells]
        np.copyto(chunk, seconds[block, None] if forward else seconds[None, cols], where=pairs)
        out[cells] = chunk
