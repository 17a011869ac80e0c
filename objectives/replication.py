r"""Replication degree of a tensor shard, and the devices a ZeRO stage shards its states over.

Replication degree (:func:`replication_degree`). Of the :math:`P = \prod_d f_d` devices an op runs on,
a parameter is split over the dims that index it, so :math:`R = P / \prod_{d \in param} f_d =
\prod_{d \notin param} f_d` devices hold identical copies of each shard: the data-parallel-like
group its gradient is synchronised over. Idle devices (those beyond :math:`P`) hold nothing of this
op. ZeRO stage 1 divides the optimizer state by the data-parallel part of :math:`R`
(:func:`zero_shard_degree`: the factors of the op's batch dims; all of :math:`R` for an op without
batch dims), stage 2 also the gradients, stage 3 also the parameters, as DeepSpeed, Megatron's
distributed optimizer and FSDP2 shard over the data-parallel group only (checked against FSDP2 in
docs/VALIDATION.md).
"""

from __future__ import annotations

import numpy as np

from objectives._common import access_dims, dim_mask
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, TensorAccess

__all__ = ["replication_degree", "zero_shard_degree"]


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
    only: the replicas made by splitting the op's *batch* dims. Replicas along other dims (a
    sequence-parallel norm's weight copied over the tensor-parallel group) keep whole states. An op
    without batch dims has no data-parallel group of its own; its states are sharded over all its
    replicas.
    """
    others = ~dim_mask(op, access_dims(access))
    batch = np.array([d.is_batch for d in op.dims], dtype=bool)
    if not batch.any():
        return replication_degree(op, space, access)
    group = others & batch
    if not group.any():
        return np.ones(space.size, dtype=np.int64)
    return np.prod(space.factors[:, group], axis=1, dtype=np.int64)
