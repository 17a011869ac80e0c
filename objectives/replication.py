r"""Replication degree of a tensor shard, and the devices a ZeRO stage shards its states over.

Replication degree (:func:`replication_degree`). Of the :math:`P = \prod_d f_d` devices an op runs on,
a parameter is split over the dims that index it, so :math:`R = P / \prod_{d \in param} f_d =
\prod_{d \notin param} f_d` devices hold identical copies of each shard: the data-parallel-like
group its gradient is synchronised over. Idle devices (those beyond :math:`P`) hold nothing of this
op. ZeRO stage 1 divides the optimizer state by the data-parallel part of :math:`R`
(:func:`zero_shard_degree`: the factors of the op's batch dims, and of a linear layer's or an
embedding's sequence split, context parallelism's; all of :math:`R` for an op without batch dims),
stage 2 also the gradients, stage 3 also the parameters, as DeepSpeed, Megatron's distributed
optimizer and FSDP2 shard over the data-parallel (with context-parallel) group only (checked
against FSDP2 in docs/VALIDATION.md).

Context parallelism's ranks shard the states as data-parallel ranks do (read in the integration
environment's packages). torchtitan 0.3.0 builds its ``fsdp`` mesh dim as ``dp_shard * cp``
(``torchtitan/distributed/parallel_dims.py`` l. 222, "fsdp: For FSDP dimension. This includes
``dp_shard`` and ``cp``", and l. 278, ``fsdp = self.dp_shard * self.cp``) and ``fully_shard``s every
block over it (``torchtitan/models/llama3/parallelize.py`` l. 74-80: ``names = ["dp_replicate",
"fsdp"] ...``, ``dp_mesh = parallel_dims.get_mesh(names)``, ``apply_fsdp_to_decoder(model, dp_mesh,
...)``). Megatron-Core 0.16.1's distributed optimizer runs on ``dp_cp_group``
(``megatron/core/optimizer/__init__.py`` l. 549 and 589, ``data_parallel_group=dp_cp_group``), which
is ``parallel_state.get_data_parallel_group(with_context_parallel=True)``
(``megatron/core/process_groups_config.py`` l. 289), and its DDP averages gradients over it
(``megatron/core/distributed/distributed_data_parallel.py`` l. 285, ``data_parallel_world_size =
self.dp_cp_group.size()``). DeepSpeed 0.19.8 (Ulysses) hands every ZeRO optimizer
``dp_process_group=self.seq_data_parallel_group`` (``deepspeed/runtime/engine.py`` l. 2626, 2683,
2768; ``deepspeed/utils/groups.py`` l. 913: "the process group for zero sharding and gradient
allreduce must be across both dimensions of data and sequence parallelism"). A configuration does
not say which part of an op's sequence split is context parallelism's and which sequence
parallelism's (Megatron-LM's ``--sequence-parallel`` splits the norms, dropouts and residual adds on
the tensor-parallel ranks, whose copies of a norm's weight keep whole states). The split is read off
the op's kind (:data:`CONTEXT_SHARDED_KINDS`): every launcher gathers a linear layer's input
sequence over the tensor-parallel ranks before the layer (Korthikanti et al., MLSys 2023, section
4.2.2: sequence parallelism splits only the regions between the tensor-parallel blocks), and a
vocabulary-parallel embedding splits its vocabulary, not its tokens, over them; so their sequence
split is context parallelism's. A norm's split is left out: under context parallelism its weight's
states are priced over ``dp`` alone, ``cp`` times its share (2 x hidden parameters per transformer
layer, well under 0.1% of a model's). A linear layer that a launcher runs on the sequence-parallel
tokens (Megatron-LM's MoE router under ``--sequence-parallel``: hidden x experts parameters) would
be priced sharded over those tensor-parallel ranks too.

The gradient's synchronisation group (:func:`objectives.intra_op.grad_sync_terms`) is the whole of
:math:`R` and so already spans the ``dp x cp`` ranks.
"""

from __future__ import annotations

import numpy as np

from objectives._common import access_dims, dim_mask
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, TensorAccess

__all__ = [
    "CONTEXT_SHARDED_KINDS", "replication_degree", "zero_shard_degree", "zero_states_degree", "context_degree",
    "hsdp_shard_degree", "hsdp_groups", "hpz_secondary_elements",
]

CONTEXT_SHARDED_KINDS = frozenset({"matmul", "embedding"})
"""Op kinds whose non-batch ``parallel`` split that does not index a parameter is context parallelism's
(every launcher gathers a linear layer's input sequence, and a vocabulary-parallel embedding splits
the vocabulary, over the tensor-parallel ranks; module docstring): ZeRO shards the parameter's states
over it too. A norm's sequence split may be sequence parallelism's tensor-parallel ranks and is not."""


def replication_degree(op: Op, space: ConfigSpace, access: TensorAccess) -> np.ndarray:
    """``(K,)`` int64: devices holding identical copies of each shard of the accessed tensor.

    The product of the factors of the op dims that do not index the tensor.
    """
    others = ~dim_mask(op, access_dims(access))
    if not others.any():
        return np.ones(space.size, dtype=np.int64)
    return np.prod(space.factors[:, others], axis=1, dtype=np.int64)


def zero_shard_degree(op: Op, space: ConfigSpace, access: TensorAccess) -> np.ndarray:
    """``(K,)`` int64: devices a ZeRO stage shards the accessed tensor's states over.

    ZeRO (DeepSpeed), Megatron's distributed optimizer and FSDP2 shard over the data-parallel group
    with the context-parallel ranks (module docstring): the replicas made by splitting the op's
    *batch* dims and, for a linear layer or an embedding (:data:`CONTEXT_SHARDED_KINDS`), its other
    ``parallel`` dims that do not index the parameter (the sequence, split ``cp`` ways). Replicas
    along other dims (a sequence-parallel norm's weight copied over the tensor-parallel group) keep
    whole states. An op without batch dims has no data-parallel group of its own; its states are
    sharded over all its replicas. Examples: :func:`context_degree`.
    """
    batch = np.array([d.is_batch for d in op.dims], dtype=bool)
    if not batch.any():
        return replication_degree(op, space, access)
    group = ~dim_mask(op, access_dims(access)) & batch
    if not group.any():
        return context_degree(op, space, access)
    return np.prod(space.factors[:, group], axis=1, dtype=np.int64) * context_degree(op, space, access)


def zero_states_degree(op: Op, space: ConfigSpace, access: TensorAccess, dp_shard: int | None) -> np.ndarray:
    """``(K,)`` int64: devices one copy of the accessed tensor's ZeRO states spans, hybrid sharding
    (``TrainingSettings.dp_shard``) included: :func:`zero_shard_degree`, whose data-parallel part
    (the batch split) shards over ``gcd(batch split, dp_shard)`` ranks under HSDP
    (:func:`hsdp_shard_degree`) while its context-parallel part stays whole. torchtitan 0.3.0 builds
    ``fsdp = dp_shard * cp`` beside ``dp_replicate`` (``torchtitan/distributed/parallel_dims.py``
    l. 278), and Megatron-Core 0.16.1 shards its distributed optimizer over ``dp * cp /
    num_distributed_optimizer_instances`` ranks (``megatron/core/parallel_state.py`` l. 838-840,
    ``intra_partial_data_parallel_size``; the exporter writes ``dp / gcd(dp, dp_shard)`` instances).
    An op without batch dims shards over ``gcd(all its replicas, dp_shard)``, as before. Examples:
    :func:`context_degree`.
    """
    degree = zero_shard_degree(op, space, access)
    if dp_shard is None:
        return degree
    context = context_degree(op, space, access)
    return hsdp_shard_degree(degree // context, dp_shard) * context


def context_degree(op: Op, space: ConfigSpace, access: TensorAccess) -> np.ndarray:
    """``(K,)`` int64: the context-parallel part of :func:`zero_shard_degree`: the split of a linear
    layer's or an embedding's (:data:`CONTEXT_SHARDED_KINDS`) non-batch ``parallel`` dims that do not
    index the accessed tensor, 1 for every other op (and for an op without batch dims, whose whole
    degree is its replicas').

    A linear layer at dp = 2 x cp = 4 on 8 devices: its weight's ZeRO states span 2 x 4 ranks, and
    under HSDP over ``dp_shard`` 1 the 4 context-parallel ones still:

    >>> from planner.core.configs import ConfigOptions, enumerate_configs
    >>> from planner.core.graph import IterDim
    >>> dims = (IterDim(name="b", size=4, is_batch=True), IterDim(name="m", size=64), IterDim(name="n", size=8))
    >>> w = TensorAccess(tensor="w", axes=(("n",),))
    >>> op = Op(name="fc", kind="matmul", op_type="MatMul", dims=dims, inputs=(w,), outputs=(), flops=0.0)
    >>> space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    >>> row = space.index_of({"b": 2, "m": 4})
    >>> [int(context_degree(op, space, w)[row]), int(zero_shard_degree(op, space, w)[row]),
    ...  int(zero_states_degree(op, space, w, 1)[row])]
    [4, 8, 4]
    """
    if op.kind not in CONTEXT_SHARDED_KINDS or not any(d.is_batch for d in op.dims):
        return np.ones(space.size, dtype=np.int64)
    seq = np.array([not d.is_batch and d.kind == "parallel" for d in op.dims], dtype=bool)
    seq &= ~dim_mask(op, access_dims(access))
    if not seq.any():
        return np.ones(space.size, dtype=np.int64)
    return np.prod(space.factors[:, seq], axis=1, dtype=np.int64)


def hsdp_shard_degree(replicas: np.ndarray, dp_shard: int | None) -> np.ndarray:
    """``(K,)`` int64: of ``replicas`` devices holding a shard's ZeRO states, those one copy of the
    sharded states spans under hybrid sharding (``TrainingSettings.dp_shard``): ``gcd(replicas,
    dp_shard)``, the rest of the replicas holding copies (FSDP2's HSDP shards over the inner
    ``dp_shard`` mesh dim and replicates over the outer one, ``torch.distributed.fsdp.fully_shard``
    on a 2-D mesh). ``None``: all of ``replicas`` (plain ZeRO / FSDP).

    >>> hsdp_shard_degree(np.array([1, 4, 8, 16, 32]), 8).tolist()
    [1, 4, 8, 8, 8]
    """
    replicas = np.asarray(replicas, dtype=np.int64)
    return replicas if dp_shard is None else np.gcd(replicas, np.int64(dp_shard))


def hsdp_groups(
    intra: np.ndarray, inter: np.ndarray, dp_shard: int | None, context: np.ndarray | None = None
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A gradient-synchronisation group of ``(intra, inter)`` devices (each ``(K,)``: per node, nodes)
    split into its HSDP ``(shard, replicate)`` groups, each ``(intra, inter)``.

    The shard group (:func:`hsdp_shard_degree` of the group's size) is the innermost mesh dim, so it
    takes a node's devices first (torchtitan builds its mesh ``dp_replicate`` outer, ``dp_shard``
    inner, and ranks fill a node before the next): ``gcd(intra, shard)`` devices per node over
    ``shard / that`` nodes; the replicas are the rest of each level. ``None``: the whole group shards,
    no replica. ``context`` (``(K,)``, :func:`context_degree`): the group's context-parallel ranks,
    which all join the shard group (:func:`zero_states_degree`): the shard group is
    ``gcd(group / context, dp_shard) x context``.

    >>> (s_in, s_out), (r_in, r_out) = hsdp_groups(np.array([8, 8, 4]), np.array([2, 1, 4]), 8)
    >>> s_in.tolist(), s_out.tolist(), r_in.tolist(), r_out.tolist()
    ([8, 8, 4], [1, 1, 2], [1, 1, 1], [2, 1, 2])
    """
    intra, inter = np.asarray(intra, dtype=np.int64), np.asarray(inter, dtype=np.int64)
    if dp_shard is None:
        return (intra, inter), (np.ones_like(intra), np.ones_like(inter))
    context = np.ones_like(intra) if context is None else np.asarray(context, dtype=np.int64)
    shard = hsdp_shard_degree(intra * inter // context, dp_shard) * context
    shard_intra = np.gcd(intra, shard)
    shard_inter = shard // shard_intra
    return (shard_intra, shard_inter), (intra // shard_intra, inter // shard_inter)


def hpz_secondary_elements(whole: np.ndarray, sharded: np.ndarray, hpz: int) -> np.ndarray:
    """``(K,)`` elements per device of ZeRO++'s secondary parameter copy (hpZ, ``TrainingSettings.hpz_partition``):
    the parameters a rank holds before ZeRO (``whole``, ``(K,)``) over ``gcd(replicas, hpz)``, ``replicas`` being
    ZeRO-3's partition degree (``whole / sharded``). DeepSpeed 0.19.8 ``runtime/zero/partition_parameters.py``
    ``_partition_param_sec``: ``secondary_partition_size = tensor_size // num_ranks_in_param_group``, the group
    ``min(hpz, world)`` consecutive ranks (``utils/groups.py``). A shard ZeRO does not divide (one replica) is
    never partitioned, so it has none. Examples: 1.6e6 elements over 16 ranks with hpZ 8: 1e5 sharded, 2e5 in the
    secondary copy; over 4 ranks it is as large as the primary (4 ranks, hpZ 8); on one rank, none.

    >>> hpz_secondary_elements(np.array([1.6e6, 1.6e6, 1.6e6]), np.array([1e5, 4e5, 1.6e6]), 8).tolist()
    [200000.0, 400000.0, 0.0]
    """
    whole = np.asarray(whole, dtype=np.float64)
    replicas = np.rint(np.divide(whole, sharded, out=np.ones_like(whole), where=np.asarray(sharded) > 0))
    groups = np.gcd(np.maximum(replicas, 1).astype(np.int64), np.int64(hpz))
    return np.where(replicas > 1, whole / groups, 0.0)
