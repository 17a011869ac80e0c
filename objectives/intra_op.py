r"""Communication inside one op, and gradient synchronisation of its parameters, per configuration.

The rules follow from the iteration-space view alone (no per-op-type code), so they hold for any
ONNX op the importer describes. For a set :math:`S` of the op's dims, the devices that differ only
in their coordinates along :math:`S` form a group of shape
:math:`(\prod_{d\in S} a_d, \prod_{d\in S} e_d)` (intra-node, inter-node parts of the factors);
:mod:`objectives.collectives` prices the collective on it.

Terms (:func:`intra_op_terms`), each a :class:`CommTerm`:

* ``partial_sum`` (forward): an output :math:`Y` is summed over every dim that does not index it
  (and every ``reduction`` dim: MatMul's k, a Conv's input channels, a vocab-parallel embedding's
  rows). Splitting those leaves partial sums: one all-reduce of the :math:`Y` shard over them.
* ``input_grad`` (backward): the gradient of an activation input :math:`X` sums over every dim that
  does not index :math:`X` (MatMul's n for :math:`X[m,k]`; the broadcast dims of a broadcast
  operand). Splitting those leaves partial input gradients: one all-reduce of the :math:`X` shard.
* ``norm_stats``: splitting a ``normalized`` dim (Softmax's axis, LayerNorm's hidden) needs the
  per-row statistics summed across the split: :data:`STATS_WORDS` fp32 words per row, once in
  forward and once in backward. A softmax cross-entropy loss
  (:data:`objectives._common.CROSS_ENTROPY_LOSSES`) split over its classes is Megatron's
  vocab-parallel cross entropy instead (:func:`_cross_entropy_terms`):
  :data:`CROSS_ENTROPY_ALL_REDUCES` all-reduces of one fp32 word per token, in forward only.
  A normalized dim is never a partial-sum dim: once its statistics are summed every device holds
  whole rows, so an output it does not index (a loss scalar, a norm's mean) is complete.
* ``halo`` (forward, and the halo's gradient in backward): splitting a ``spatial`` dim of a window
  op needs, per split boundary, ``halo + 1 - stride`` extra input rows from the neighbour
  (``IterDim.halo = (kernel - 1) * dilation``); the volume is the shard extended by that along each
  split spatial axis minus the shard, sent point-to-point to ``2 x (split spatial dims)``
  neighbours.

Gradient synchronisation (:func:`grad_sync_terms`), once per step, for each parameter the op
accounts for (tied weights once): the gradient shard is summed over its replication group (the dims
not indexing the parameter, :func:`objectives.replication.replication_degree`): an all-reduce; with
ZeRO 1/2 a reduce-scatter of gradients plus an all-gather of updated parameters; with ZeRO 3 a
reduce-scatter plus two all-gathers of parameters (before forward and before backward). Under
DeepSpeed's ZeRO-3 (``settings.zero3_gather`` set) an op that is recomputed gathers three times: it
releases a sub-module's parameters after each forward, so the forward re-run in backward gathers them
again before the backward gathers them once more (DeepSpeed's pre-forward and pre-backward hooks;
Rajbhandari et al., SC 2020, section 5). The FSDP launchers (``zero3_gather`` unset) gather twice
recomputed or not: the checkpointed block runs inside its wrapped unit, whose pre-backward hook
gathers the parameters once for the recomputed forward and the backward (torch 2.13 FSDP1
``_runtime_utils._pre_backward_hook`` unshards, and ``_pre_forward`` skips its logic "for
``fully_shard`` + ``checkpoint``" in ``BACKWARD_PRE``; FSDP2 ``FSDPState._pre_forward``: "When composing
with module-hook-based activation checkpointing, the pre-backward hook is responsible for the
unshard"; Megatron-FSDP in megatron-core 0.16.1, ``megatron_fsdp.py``: "When recomputing a whole
Transformer layer, gather parameters once for both the recomputation and backward computation").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Collection, Literal, Mapping

import numpy as np

from objectives._common import (
    CROSS_ENTROPY_LOSSES,
    access_dims,
    dim_mask,
    element_bytes,
    group_shape,
    is_float,
    shard_elements,
)
from objectives.collectives import Collective, collective_time_s, point_to_point_time_s
from objectives.memory import state_bytes_per_parameter
from objectives.precision import gathered_bytes
from objectives.replication import context_degree, hsdp_groups
from planner.core.cluster import Cluster
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, Tensor
from planner.core.settings import ZERO_SYNC_STAGES, TrainingSettings, ZeroSync

__all__ = [
    "CommKind",
    "Level",
    "STATS_WORDS",
    "STATS_WORD_BYTES",
    "CROSS_ENTROPY_ALL_REDUCES",
    "CommTerm",
    "intra_op_terms",
    "grad_sync_terms",
    "hpz_group",
    "term_time_s",
    "price_terms",
    "GRAD_BUCKET_BYTES",
    "DISTRIBUTED_OPTIMIZER_BUCKET_PARAMS",
    "DISTRIBUTED_OPTIMIZER_BUCKET_PARAMS_PER_RANK",
    "grad_bucket_bytes",
    "launcher_grad_sync_s",
    "bucketed_grad_sync_s",
    "hidden_under_backward",
    "zero_sync_split",
    "overlapped_zero_sync_s",
    "reductions_overlap_backward",
    "OVERLAP_CONTENTION",
    "exposed_under",
]

CommKind = Literal["partial_sum", "input_grad", "norm_stats", "halo", "grad_sync"]
Level = Literal["intra", "inter"]

STATS_WORDS = 2
"""Statistics per row a split normalisation all-reduces (max and sum for Softmax; mean and mean of
squares for LayerNorm), in each of forward and backward."""
STATS_WORD_BYTES = 4
"""Statistics are kept in fp32."""

CROSS_ENTROPY_ALL_REDUCES = 3
r"""All-reduces of one fp32 word per token a class-split softmax cross entropy issues, as Megatron's
``_VocabParallelCrossEntropy.forward`` (``megatron/core/tensor_parallel/cross_entropy.py``) does
over the tensor-parallel group: the logit max (``ReduceOp.MAX``), the target logit (each rank
contributes it where the target falls in its vocabulary slice, 0 elsewhere: ``SUM``) and the sum
of :math:`\exp(x - \max)` (``SUM``). Its backward is local (``softmax - one_hot`` from the saved
``exp_logits`` and the target mask): no collective. Per device and step:
:math:`3 \times T \times 4` bytes in 3 all-reduces over the class split's group, with :math:`T`
the device's tokens (the scores' shard without its class axis)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommTerm:
    """One collective an op issues per step, for every configuration."""

    kind: CommKind
    collective: Collective
    tensor: str
    """The tensor communicated (its shard, or its statistics)."""
    num_bytes: np.ndarray
    """``(K,)`` buffer bytes per device (all-reduce: the buffer; all-gather: the gathered result;
    p2p: bytes received)."""
    intra_size: np.ndarray
    """``(K,)`` devices of the group inside one node."""
    inter_size: np.ndarray
    """``(K,)`` nodes the group spans (> 1: the term crosses nodes)."""
    count: float = 1.0
    """How many times per step it runs (forward + backward halos: 2)."""
    messages: np.ndarray | None = None
    """``(K,)`` messages per p2p exchange (neighbours); ``None`` for collectives."""
    phase: Literal["forward", "backward"] | None = None
    """A ZeRO-3 all-gather of one pass only: ``forward`` the forward's, ``backward`` the re-run forward's and the
    backward's (ZeRO++'s hpZ gathers them over another group, ``TrainingSettings.hpz_partition``); ``None``: all."""


def _partial_sum_terms(op: Op, space: ConfigSpace, tensors: Mapping[str, Tensor], settings: TrainingSettings) -> list[CommTerm]:
    terms = []
    reduction = np.array([d.kind == "reduction" for d in op.dims], dtype=bool)
    normalized = np.array([d.kind == "normalized" for d in op.dims], dtype=bool)
    for access in op.outputs:
        tensor = tensors.get(access.tensor)
        if tensor is None or not is_float(tensor):
            continue
        # a normalized dim's split is made whole by its statistics' all-reduce (module docstring)
        mask = (reduction | ~dim_mask(op, access_dims(access))) & ~normalized
        intra, inter = group_shape(space, mask)
        if np.all(intra * inter == 1):
            continue
        nbytes = shard_elements(space, op, access, tensor.shape) * element_bytes(tensor, settings)
        terms.append(
            CommTerm(kind="partial_sum", collective="all_reduce", tensor=access.tensor, num_bytes=nbytes,
                     intra_size=intra, inter_size=inter)
        )
    return terms


def _input_grad_terms(op: Op, space: ConfigSpace, tensors: Mapping[str, Tensor], settings: TrainingSettings) -> list[CommTerm]:
    terms = []
    for access in op.inputs:
        tensor = tensors.get(access.tensor)
        if tensor is None or tensor.role != "activation" or not is_float(tensor):
            continue
        mask = ~dim_mask(op, access_dims(access))
        intra, inter = group_shape(space, mask)
        if np.all(intra * inter == 1):
            continue
        nbytes = shard_elements(space, op, access, tensor.shape) * element_bytes(tensor, settings)
        terms.append(
            CommTerm(kind="input_grad", collective="all_reduce", tensor=access.tensor, num_bytes=nbytes,
                     intra_size=intra, inter_size=inter)
        )
    return terms


def _cross_entropy_terms(op: Op, space: ConfigSpace) -> list[CommTerm]:
    """A softmax cross entropy split over its classes (:data:`CROSS_ENTROPY_ALL_REDUCES`)."""
    classes = np.array([d.kind == "normalized" for d in op.dims], dtype=bool)
    intra, inter = group_shape(space, classes)
    if not classes.any() or np.all(intra * inter == 1) or not op.inputs:
        return []
    scores = dim_mask(op, access_dims(op.inputs[0]))
    sizes = np.array(op.dim_sizes, dtype=np.float64)
    token_dims = scores & ~classes
    tokens = np.prod(np.ceil(sizes[token_dims][None, :] / space.factors[:, token_dims]), axis=1)
    return [
        CommTerm(kind="norm_stats", collective="all_reduce", tensor=op.inputs[0].tensor,
                 num_bytes=tokens * STATS_WORD_BYTES, intra_size=intra, inter_size=inter,
                 count=float(CROSS_ENTROPY_ALL_REDUCES))
    ]


def _norm_stats_terms(op: Op, space: ConfigSpace) -> list[CommTerm]:
    if op.op_type in CROSS_ENTROPY_LOSSES:
        return _cross_entropy_terms(op, space)
    normalized = np.array([d.kind == "normalized" for d in op.dims], dtype=bool)
    if not normalized.any():
        return []
    intra, inter = group_shape(space, normalized)
    if np.all(intra * inter == 1):
        return []
    first_output = op.outputs[0] if op.outputs else None
    indexed = dim_mask(op, access_dims(first_output)) if first_output else np.ones(len(op.dims), dtype=bool)
    row_dims = indexed & ~normalized & np.array([d.kind != "reduction" for d in op.dims], dtype=bool)
    sizes = np.array(op.dim_sizes, dtype=np.float64)
    rows = np.prod(sizes[row_dims][None, :] / space.factors[:, row_dims], axis=1)
    nbytes = rows * STATS_WORDS * STATS_WORD_BYTES
    name = first_output.tensor if first_output else op.name
    return [
        CommTerm(kind="norm_stats", collective="all_reduce", tensor=name, num_bytes=nbytes,
                 intra_size=intra, inter_size=inter, count=2.0)
    ]


def _halo_terms(op: Op, space: ConfigSpace, tensors: Mapping[str, Tensor], settings: TrainingSettings) -> list[CommTerm]:
    spatial = [
        (i, d) for i, d in enumerate(op.dims) if d.kind == "spatial" and d.halo + 1 - d.stride > 0
    ]
    if not spatial:
        return []
    terms = []
    position = {name: i for i, name in enumerate(space.dim_names)}
    for access in op.inputs:
        tensor = tensors.get(access.tensor)
        if tensor is None or tensor.role == "parameter":
            continue
        # Per-axis shard extents, then each axis indexed by a split spatial dim grows by its halo.
        extents = np.ones((space.size, len(access.axes)))
        for axis, dims in enumerate(access.axes):
            factor = np.ones(space.size, dtype=np.int64)
            for dim in dims:
                if dim in position:
                    factor *= space.factors[:, position[dim]]
            extents[:, axis] = -(-tensor.shape[axis] // factor)
        grown = extents.copy()
        touched = False
        split_count = np.zeros(space.size)
        crosses = np.zeros(space.size, dtype=bool)
        for column, dim in spatial:
            for axis, dims in enumerate(access.axes):
                if dim.name in dims:
                    is_split = space.factors[:, column] > 1
                    grown[:, axis] += np.where(is_split, dim.halo + 1 - dim.stride, 0)
                    split_count += is_split
                    crosses |= space.inter_factors[:, column] > 1
                    touched = True
        if not touched:
            continue
        volume = np.prod(grown, axis=1) - np.prod(extents, axis=1)
        nbytes = volume * element_bytes(tensor, settings)
        terms.append(
            CommTerm(kind="halo", collective="p2p", tensor=access.tensor, num_bytes=nbytes,
                     intra_size=np.ones(space.size, dtype=np.int64),
                     inter_size=np.where(crosses, 2, 1).astype(np.int64),
                     count=2.0, messages=2.0 * split_count)
        )
    return terms


def intra_op_terms(
    op: Op, space: ConfigSpace, *, tensors: Mapping[str, Tensor], settings: TrainingSettings
) -> list[CommTerm]:
    """Every collective ``op`` issues inside itself, per configuration (rules in the module docstring).

    Parameters
    ----------
    op, space:
        The op and its configurations.
    tensors:
        The graph's tensors (shapes, dtypes, roles).
    settings:
        Training precision (element sizes).

    Returns
    -------
    list[CommTerm]
        Terms with all-ones groups everywhere are left out.
    """
    return [
        *_partial_sum_terms(op, space, tensors, settings),
        *_input_grad_terms(op, space, tensors, settings),
        *_norm_stats_terms(op, space),
        *_halo_terms(op, space, tensors, settings),
    ]


def grad_sync_terms(
    op: Op,
    space: ConfigSpace,
    *,
    tensors: Mapping[str, Tensor],
    settings: TrainingSettings,
    owned_inputs: Collection[int] | None = None,
    recomputed: bool = False,
    graph_output: bool = False,
) -> list[CommTerm]:
    """Gradient synchronisation of the parameters ``op`` accounts for, per configuration.

    Parameters
    ----------
    owned_inputs:
        Positions in ``op.inputs`` of the parameters this op synchronises (a tied weight once, by one
        op). ``None``: every input whose tensor role is ``parameter``.
    recomputed:
        The op is recomputed in backward: under DeepSpeed's ZeRO-3 its parameters are gathered a third
        time; the FSDP launchers gather them once for the recomputed forward and the backward (module
        docstring).
    graph_output:
        The op writes a graph output (the LM head): never an FP8 linear, so gathered in bf16 under
        ``settings.gathers_fp8`` too (:func:`objectives.precision.gathered_bytes`).
    """
    per = state_bytes_per_parameter(settings)
    if owned_inputs is None:
        owned_inputs = [
            i for i, a in enumerate(op.inputs)
            if (t := tensors.get(a.tensor)) is not None and t.role == "parameter"
        ]
    terms = []
    for position in sorted(owned_inputs):
        access = op.inputs[position]
        tensor = tensors[access.tensor]
        intra, inter = group_shape(space, ~dim_mask(op, access_dims(access)))
        if np.all(intra * inter == 1):
            continue
        shard = shard_elements(space, op, access, tensor.shape)
        if settings.zero_stage == 0:
            terms.append(CommTerm(kind="grad_sync", collective="all_reduce", tensor=access.tensor,
                                  num_bytes=shard * per.grad, intra_size=intra, inter_size=inter))
        else:
            gathered = gathered_bytes(op, tensors, settings, tensor, bf16_bytes=per.gathered, graph_output=graph_output)
            terms += _zero_terms(access.tensor, shard, intra, inter, settings=settings, recomputed=recomputed,
                                 context=context_degree(op, space, access) if settings.dp_shard is not None else None,
                                 gathered=gathered)
    return terms


def _zero_terms(tensor: str, shard: np.ndarray, intra: np.ndarray, inter: np.ndarray, *,
                settings: TrainingSettings, recomputed: bool, context: np.ndarray | None = None,
                gathered: float | None = None) -> list[CommTerm]:
    """ZeRO-1+ synchronisation of one parameter shard (``shard``: ``(K,)`` elements) over its
    ``(intra, inter)`` group: a reduce-scatter of gradients and the parameter all-gathers over the
    shard group, and under HSDP (``settings.dp_shard``, :func:`objectives.replication.hsdp_groups`)
    an all-reduce of the reduced ``1/shard`` slice over the replicas (FSDP2's HSDP: reduce-scatter
    over ``dp_shard``, then all-reduce over ``dp_replicate``, ``torch.distributed.fsdp._fully_shard.
    _fsdp_collectives.foreach_reduce``; Megatron-LM's ``--num-distributed-optimizer-instances``).
    ``gathered``: bytes per element the all-gathers move (``None``: the parameter dtype's; 1 for an FP8
    weight gathered in FP8, :func:`objectives.precision.gathered_bytes`); the reduce-scatter keeps the
    gradient's. At ZeRO-1/2 a launcher that all-reduces its gradient buckets (``settings.zero_sync``,
    DeepSpeed: :class:`~planner.core.settings.ZeroSync`) all-reduces the shard instead of reduce-scattering it.
    ZeRO-3 gathers twice per micro-batch (three times recomputed under DeepSpeed's rule, ``settings.zero3_gather``;
    an FSDP unit's pre-backward gather serves its recomputed forward too: module docstring); FSDP2 with
    ``reshard_after_forward=False``
    on every unit (``settings.reshard_after_forward == "never"``) once: torch 2.13 ``fully_shard``'s docstring
    ("keeps the unsharded parameters in memory after forward and avoids the all-gather in backward"), and a
    recomputed forward finds them unsharded (``FSDPState._pre_forward`` under ``PRE_BACKWARD``)."""
    per = state_bytes_per_parameter(settings)
    gathered = per.gathered if gathered is None else gathered
    (s_intra, s_inter), (r_intra, r_inter) = hsdp_groups(intra, inter, settings.dp_shard, context)
    common = dict(kind="grad_sync", tensor=tensor, intra_size=s_intra, inter_size=s_inter)
    regathers = recomputed and settings.zero3_gather is not None  # DeepSpeed's recomputed forward gathers again
    gathers = (3.0 if regathers else 2.0) if settings.zero_stage >= 3 else 1.0
    if settings.zero_stage >= 3 and settings.zero3_gather is None and settings.reshard_after_forward == "never":
        gathers = 1.0  # FSDP2 keeps every unit whole from forward to backward: no gather in backward, none to recompute
    rule = settings.zero_sync if settings.zero_stage in (1, 2) else None
    reduction = rule.reduction if rule is not None else "reduce_scatter"
    terms = [CommTerm(collective=reduction, num_bytes=shard * per.grad, **common),
             *_gather_terms(shard * gathered, gathers, common, intra, inter, settings)]
    if np.any(r_intra * r_inter > 1):
        terms.append(CommTerm(kind="grad_sync", collective="all_reduce", tensor=tensor,
                              num_bytes=shard * per.grad / (s_intra * s_inter), intra_size=r_intra, inter_size=r_inter))
    return terms


def _gather_terms(num_bytes: np.ndarray, gathers: float, common: dict, intra: np.ndarray, inter: np.ndarray,
                  settings: TrainingSettings) -> list[CommTerm]:
    """ZeRO's parameter all-gathers of one shard: ``gathers`` over the shard group (``common``), or at ZeRO-3 under
    ZeRO++'s hpZ (``settings.hpz_partition``, :func:`hpz_group`) the forward's over every data-parallel rank and the
    re-run forward's and backward's over the secondary group (the first micro-batch's; ``objectives.deepspeed_zero3``
    prices the later micro-batches' forward on the secondary group too)."""
    if settings.hpz_partition is None or settings.zero_stage < 3 or gathers <= 1.0:
        return [CommTerm(collective="all_gather", num_bytes=num_bytes, count=gathers, **common)]
    h_intra, h_inter = hpz_group(intra, inter, settings.hpz_partition)
    backward = {**common, "intra_size": h_intra, "inter_size": h_inter}
    return [CommTerm(collective="all_gather", num_bytes=num_bytes, count=1.0, phase="forward", **common),
            CommTerm(collective="all_gather", num_bytes=num_bytes, count=gathers - 1.0, phase="backward", **backward)]


def hpz_group(intra: np.ndarray, inter: np.ndarray, hpz: int) -> tuple[np.ndarray, np.ndarray]:
    """``(intra, inter)``, each ``(K,)``: the shape of ZeRO++'s secondary partition group (hpZ) inside a
    data-parallel group of ``intra x inter`` ranks: ``gcd(intra x inter, hpz)`` consecutive ranks, a node's devices
    first (DeepSpeed 0.19.8 ``utils/groups.py`` ``_create_zero_param_parallel_group``: ranks
    ``[i hpz, (i + 1) hpz)``). Examples: 16 ranks on 2 nodes of 8 with hpZ 8: one node; 4 ranks with hpZ 8: all 4.

    >>> [a.tolist() for a in hpz_group(np.array([8, 4, 8]), np.array([2, 1, 4]), 8)]
    [[8, 4, 8], [1, 1, 1]]
    >>> [a.tolist() for a in hpz_group(np.array([8]), np.array([4]), 16)]
    [[8], [2]]
    """
    (s_intra, s_inter), _ = hsdp_groups(intra, inter, hpz)
    return s_intra, s_inter


def term_time_s(term: CommTerm, *, cluster: Cluster, nccl: bool = False) -> np.ndarray:
    """``(K,)`` seconds per step of one term (``count`` included).

    ``nccl``: a collective inside one node is priced by NCCL's own model
    (:func:`objectives.fixed_costs.nccl_collective_time_s`: algorithm, protocol and message size);
    across nodes, and without ``nccl``, by the alpha-beta model of :mod:`objectives.collectives`.
    """
    if term.collective == "p2p":
        seconds = point_to_point_time_s(
            term.num_bytes,
            crosses_node=term.inter_size > 1,
            intra_link=cluster.intra_link,
            inter_link=cluster.inter_link,
            messages=term.messages if term.messages is not None else 1.0,
        )
    else:
        seconds = collective_time_s(
            term.collective,
            term.num_bytes,
            intra_size=term.intra_size,
            inter_size=term.inter_size,
            intra_link=cluster.intra_link,
            inter_link=cluster.inter_link,
        )
        if nccl and term.collective in ("all_reduce", "all_gather", "reduce_scatter"):
            from objectives.fixed_costs import nccl_collective_time_s

            inside = nccl_collective_time_s(term.collective, term.num_bytes, term.intra_size, cluster.intra_link)
            seconds = np.where(np.asarray(term.inter_size) > 1, seconds, inside)
    return term.count * seconds


def price_terms(
    terms: list[CommTerm], *, cluster: Cluster, size: int, nccl: bool = False
) -> dict[tuple[CommKind, Level], np.ndarray]:
    """Sum the terms' times by ``(kind, level)``; a term is ``inter`` where its group spans nodes
    (``nccl``: :func:`term_time_s`'s NCCL model inside a node).

    Returns
    -------
    dict
        ``{(kind, level): (K,) seconds}``, only keys with a term.
    """
    out: dict[tuple[CommKind, Level], np.ndarray] = {}
    for term in terms:
        seconds = term_time_s(term, cluster=cluster, nccl=nccl)
        spans = term.inter_size > 1
        for level, part in (("intra", np.where(spans, 0.0, seconds)), ("inter", np.where(spans, seconds, 0.0))):
            if not part.any():
                continue
            key = (term.kind, level)
            out[key] = out.get(key, np.zeros(size)) + part
    return out


GRAD_BUCKET_BYTES = 25 * 2**20
"""Gradient bytes per all-reduce call of a launcher: PyTorch DDP's default ``bucket_cap_mb=25``
(``torch.nn.parallel.DistributedDataParallel``); Megatron-LM's contiguous gradient buffer is
all-reduced in buckets of the same order (``--ddp-bucket-size``, default max(40M, 1M x dp) elements)."""


def launcher_grad_sync_s(
    terms: list[CommTerm], *, cluster: Cluster, size: int, backward_s: np.ndarray
) -> dict[Level, np.ndarray]:
    r"""Exposed gradient synchronisation of one op as launchers run it: bucketed, overlapped.

    Launchers do not issue one collective per parameter tensor. They pack gradients into buckets
    (:data:`GRAD_BUCKET_BYTES`) and start a bucket's collective as soon as backward has produced it,
    while backward goes on with the layers before (PyTorch DDP; Megatron-LM ``--overlap-grad-reduce``;
    DeepSpeed ZeRO's ``overlap_comm``). So per op:

    * latency: a collective's fixed per-hop cost :math:`\alpha` is paid per bucket, i.e. a share
      :math:`\min(1, B / B_{bucket})` of it for an op whose gradient shard is :math:`B` bytes
      (:func:`bucketed_grad_sync_s`);
    * overlap: the op's synchronisation runs under the backward of the ops before it, which (in a
      stack of equal layers) is as long as its own backward, so only
      :math:`\max(0, t_{sync} - t_{bwd})` is exposed, plus the contention of the overlapped part,
      :math:`\kappa \min(t_{sync}, t_{bwd})` (:func:`exposed_under`). An op with a
      large gradient and little backward work (an embedding table) stays exposed, as DDP's last
      bucket does.

    Parameters
    ----------
    terms:
        The op's :func:`grad_sync_terms`.
    cluster:
        The two link levels.
    size:
        Configurations K.
    backward_s:
        ``(K,)`` backward compute seconds of the op (per micro-batch).

    Returns
    -------
    dict
        ``{level: (K,) exposed seconds}`` (levels with a term only), as ``price_terms`` keys them.
    """
    return hidden_under_backward(bucketed_grad_sync_s(terms, cluster=cluster, size=size), backward_s=backward_s)


DISTRIBUTED_OPTIMIZER_BUCKET_PARAMS = 40_000_000
"""Parameters per gradient bucket of a sharded optimizer at least: Megatron-Core's default
``bucket_size = max(40000000, 1000000 * dp_group.size())`` (``DistributedDataParallel.__init__``,
megatron-core 0.16.1: "larger DP sizes need larger buckets to ensure collectives do not become
latency-bound"); with :data:`DISTRIBUTED_OPTIMIZER_BUCKET_PARAMS_PER_RANK`."""
DISTRIBUTED_OPTIMIZER_BUCKET_PARAMS_PER_RANK = 1_000_000
"""Parameters per bucket per data-parallel rank (the other term of Megatron-Core's default)."""


def grad_bucket_bytes(terms: list[CommTerm], settings: TrainingSettings) -> np.ndarray | float:
    """Bytes of gradient per bucket a launcher reduces in one collective call, as the op's
    :func:`grad_sync_terms` at ``settings.zero_stage`` run: :data:`GRAD_BUCKET_BYTES` (PyTorch DDP's
    25 MiB) for ZeRO-0 and ZeRO-3 (whose gathers are per wrapped block); under a sharded optimizer
    (ZeRO-1/2) Megatron-Core's default, ``max(4e7, 1e6 x dp)`` parameters of
    gradient bytes, ``dp`` the reduce-scatter group times the replicas' (HSDP), per configuration; under a
    launcher's rule at ZeRO 0-2 (``settings.zero_sync``: DeepSpeed's ``reduce_bucket_size`` and its engine's
    ``MEMORY_OPT_ALLREDUCE_SIZE``, 5e8 elements) its ``bucket_elements`` of gradient bytes, in the gradient's dtype
    (DeepSpeed reduces in ``communication_data_type``, which defaults to it).

    >>> term = CommTerm(kind="grad_sync", collective="reduce_scatter", tensor="w", num_bytes=np.array([4e6]),
    ...                 intra_size=np.array([8]), inter_size=np.array([32]))
    >>> float(grad_bucket_bytes([term], TrainingSettings(zero_stage=1))[0]) / state_bytes_per_parameter(
    ...     TrainingSettings(zero_stage=1)).grad  # 256 ranks: 256M parameters per bucket
    256000000.0
    >>> grad_bucket_bytes([term], TrainingSettings(zero_stage=0)) == GRAD_BUCKET_BYTES
    True
    """
    if settings.zero_sync is not None and settings.zero_stage in ZERO_SYNC_STAGES:
        return settings.zero_sync.bucket_elements * state_bytes_per_parameter(settings).grad
    if settings.zero_stage not in (1, 2):
        return GRAD_BUCKET_BYTES
    shard = [np.asarray(t.intra_size * t.inter_size, dtype=np.float64) for t in terms if t.collective == "reduce_scatter"]
    if not shard:
        return GRAD_BUCKET_BYTES
    replicas = [np.asarray(t.intra_size * t.inter_size, dtype=np.float64) for t in terms if t.collective == "all_reduce"]
    ranks = np.maximum.reduce(shard) * (np.maximum.reduce(replicas) if replicas else 1.0)
    params = np.maximum(DISTRIBUTED_OPTIMIZER_BUCKET_PARAMS, DISTRIBUTED_OPTIMIZER_BUCKET_PARAMS_PER_RANK * ranks)
    return params * state_bytes_per_parameter(settings).grad


def bucketed_grad_sync_s(terms: list[CommTerm], *, cluster: Cluster, size: int,
                         bucket_bytes: np.ndarray | float = GRAD_BUCKET_BYTES,
                         only: Collection[str] | None = None) -> dict[Level, np.ndarray]:
    """``{level: (K,) seconds}`` of an op's gradient synchronisation with its latency paid per bucket
    (:func:`launcher_grad_sync_s`), before any overlap with backward; ``bucket_bytes``: gradient bytes
    per bucket (:func:`grad_bucket_bytes`, scalar or ``(K,)``); ``only``: the seconds of these collectives
    alone, each still paying the latency share of the op's whole gradient (:func:`zero_sync_split`)."""
    if not terms:
        return {}
    gradient_bytes = sum(
        (np.asarray(t.num_bytes, dtype=np.float64) for t in terms if t.collective in ("all_reduce", "reduce_scatter")),
        np.zeros(size),
    )
    if only is not None:
        terms = [t for t in terms if t.collective in only]
        if not terms:
            return {}
    full = price_terms(terms, cluster=cluster, size=size)
    bandwidth = price_terms(terms, cluster=cluster.without_latency(), size=size)
    share = np.minimum(1.0, gradient_bytes / bucket_bytes)
    levels: dict[Level, np.ndarray] = {}
    for key, seconds in full.items():
        moving = bandwidth.get(key, np.zeros(size))
        level = key[1]
        levels[level] = levels.get(level, np.zeros(size)) + moving + (seconds - moving) * share
    return levels


OVERLAP_CONTENTION = 24.0 / 132.0
"""Share of a collective's overlapped time that still lengthens the step: while a collective runs
beside compute, NCCL's kernels hold streaming multiprocessors the compute would use (an all-gather
launched 24 thread blocks, one per channel, on an H100's 132 SMs beside a GEMM that needed all of
them: NVIDIA developer forum, "Compute-communication overlap causes severe GEMM performance
degradation because of tail effect", 2025, thread 337991). A lower bound: that GEMM lost more to its
second wave. Overlap is priced :func:`exposed_under`, never as ``max()`` or a plain sum."""


def exposed_under(levels: Mapping[Level, np.ndarray], *, compute_s: np.ndarray) -> dict[Level, np.ndarray]:
    """``levels`` (``{level: (K,) seconds}`` of communication) scaled to what stays on the critical
    path when it runs beside ``compute_s`` (``(K,)`` seconds): the part that outlasts the compute,
    ``max(0, t_comm - t_compute)``, plus the contention slowdown of the part that overlaps,
    :data:`OVERLAP_CONTENTION` x ``min(t_comm, t_compute)``; split over the levels in proportion.

    >>> import numpy as np
    >>> exposed = exposed_under({"inter": np.array([1.0, 3.0])}, compute_s=np.array([2.0, 2.0]))
    >>> [round(float(x), 4) for x in exposed["inter"]]  # 0 + 0.1818 x 1; 1 + 0.1818 x 2
    [0.1818, 1.3636]
    """
    compute = np.asarray(compute_s, dtype=np.float64)
    whole = sum(levels.values(), np.zeros(compute.shape))
    exposed = np.maximum(whole - compute, 0.0) + OVERLAP_CONTENTION * np.minimum(whole, np.maximum(compute, 0.0))
    scale = np.divide(exposed, whole, out=np.zeros(compute.shape), where=whole > 0.0)
    return {level: seconds * scale for level, seconds in levels.items()}


def hidden_under_backward(levels: Mapping[Level, np.ndarray], *, backward_s: np.ndarray) -> dict[Level, np.ndarray]:
    """``levels`` as they stay exposed beside the op's ``backward_s`` (:func:`exposed_under`): a
    launcher's bucketed gradient reductions run while backward goes on."""
    return exposed_under(levels, compute_s=backward_s)


def reductions_overlap_backward(settings: TrainingSettings) -> bool:
    """Whether the launcher runs the gradient reductions of ``settings.zero_stage`` beside backward (under
    ``settings.overlap``): yes, as Megatron-LM and PyTorch DDP do, unless its rule at ZeRO 0-2 says they run after
    the backward (``settings.zero_sync``: DeepSpeed's ZeRO-0 engine all-reduce, its ``BF16_Optimizer``;
    :mod:`exporters.deepspeed.zero_sync`).

    >>> reductions_overlap_backward(TrainingSettings(zero_stage=0))
    True
    >>> after = ZeroSync(bucket_elements=500_000_000, reduction="all_reduce", reduction_overlaps_backward=False)
    >>> reductions_overlap_backward(TrainingSettings(zero_stage=0, zero_sync=after))
    False
    """
    rule = settings.zero_sync if settings.zero_stage in ZERO_SYNC_STAGES else None
    return rule is None or rule.reduction_overlaps_backward


PARAM_GATHER = frozenset({"all_gather"})
"""ZeRO-1/2's collectives after the optimizer step: the updated parameters all-gathered."""
GRAD_REDUCTIONS = frozenset({"reduce_scatter", "all_reduce"})
"""ZeRO-1/2's gradient reductions (the reduce-scatter, and HSDP's all-reduce over the replicas)."""


def zero_sync_split(
    terms: list[CommTerm], *, cluster: Cluster, size: int, bucket_bytes: np.ndarray | float,
) -> tuple[dict[Level, np.ndarray], dict[Level, np.ndarray]]:
    """``(reductions, gathers)``: ``{level: (K,) seconds}`` of a ZeRO-1/2 op's :data:`GRAD_REDUCTIONS` and
    :data:`PARAM_GATHER` apart, each bucketed as :func:`bucketed_grad_sync_s` buckets the whole, before any
    overlap (:func:`overlapped_zero_sync_s` places each in its window)."""
    bucketed = functools.partial(bucketed_grad_sync_s, terms, cluster=cluster, size=size, bucket_bytes=bucket_bytes)
    return bucketed(only=GRAD_REDUCTIONS), bucketed(only=PARAM_GATHER)


def overlapped_zero_sync_s(
    split: tuple[Mapping[Level, np.ndarray], Mapping[Level, np.ndarray]], *, forward_s: np.ndarray, backward_s: np.ndarray,
    rule: ZeroSync | None = None,
) -> tuple[dict[Level, np.ndarray], dict[Level, np.ndarray]]:
    """``(reductions, gathers)``: ``{level: (K,) exposed seconds}`` of a ZeRO-1/2 op's synchronisation
    (``split``: :func:`zero_sync_split`) as Megatron-LM overlaps it: the bucketed gradient reductions beside
    backward (``--overlap-grad-reduce``, :func:`hidden_under_backward`) and the updated parameters' all-gather
    beside the next step's forward (``--overlap-param-gather``: megatron-core's
    ``DistributedDataParallelConfig.overlap_param_gather``, "overlap param all-gather with forward compute";
    each bucket's gather is waited for by the forward pre-hook of its first module, so in a stack of equal
    layers the op's gather runs under the forward of the layers before it, its own forward standing for
    theirs), each window its own (:func:`exposed_under`).

    ``rule``: a launcher's (``TrainingSettings.zero_sync``; ``None``: Megatron-LM's, above). Where it says a
    collective does not overlap, it stays whole on the critical path: DeepSpeed 0.19.8 all-gathers the updated
    partitions in ``DeepSpeedZeroOptimizer.step`` / ``BF16_Optimizer.update_lp_params`` after the optimizer
    step (``runtime/utils.py``, ``all_gather_dp_groups``), and ``BF16_Optimizer`` (its bf16 ZeRO-1) reduces the
    gradients in ``DeepSpeedEngine.allreduce_gradients`` after the backward
    (:mod:`exporters.deepspeed.zero_sync`).
    """
    reductions, gathers = split
    hide_reductions = rule is None or rule.reduction_overlaps_backward
    hide_gathers = rule is None or rule.gather_overlaps_forward
    return (hidden_under_backward(reductions, backward_s=backward_s) if hide_reductions else dict(reductions),
            exposed_under(gathers, compute_s=forward_s) if hide_gathers else dict(gathers))
