"""FSDP2's ``reshard_after_forward`` policy (``TrainingSettings.reshard_after_forward``, ``--fix reshard=...``):
which ``fully_shard`` units keep their gathered parameters from forward to backward, and the unsharded peak of a
pipeline stage's units when none does. The peak itself is :func:`objectives.memory.fsdp_unsharded_peak`'s; the
gathers the policy saves are counted by :func:`objectives.intra_op.grad_sync_terms` (one per micro-batch under
``never``)."""

from __future__ import annotations

import numpy as np

from objectives.memory import REDUCE_BYTES, StateBytes

__all__ = ["kept_units", "fsdp_resharded_ranges"]


def kept_units(policy: str, slots: int, pp: int) -> np.ndarray:
    """``(slots,)`` whether each FSDP2 unit (the ops before the blocks, each block, the ops after them) keeps its
    gathered parameters from forward to backward under torchtitan 0.3.0's ``fsdp_reshard_after_forward``
    ``policy`` (``distributed/fsdp.py``: ``get_fsdp_reshard_after_forward_policy`` gives the blocks and the
    embedding ``not pp_enabled`` under ``default``, and ``[norm, lm_head]`` is resharded only under ``always``).

    >>> [kept_units(p, 4, 1).tolist() for p in ("default", "always", "never")]
    [[False, False, False, True], [False, False, False, False], [True, True, True, True]]
    >>> kept_units("default", 3, 2).tolist()
    [True, True, True]
    """
    kept = np.zeros(slots, dtype=bool)
    if policy == "never" or (policy == "default" and pp > 1):
        kept[:] = True
    elif policy == "default":
        kept[-1] = True
    return kept


def fsdp_resharded_ranges(units, *, per: StateBytes, elements=None) -> np.ndarray:
    r"""``(n, n)``: ``[lo, hi]`` the peak :func:`fsdp_unsharded_peak` gives (parameters + gradient buffers) for
    the contiguous units ``lo..hi`` when no unit is kept and none accumulates (a pipeline stage under
    ``reshard_after_forward="always"`` with one micro-batch); 0 where ``hi < lo``. ``elements``: as
    :func:`fsdp_unsharded_peak`'s. Unit ``i`` running holds itself, the prefetched ``i - 1`` (inside the range)
    and its gradient buffers, so the peak is ``max(u_lo + g_lo, max_{lo < i <= hi} u_i + u_{i-1} + g_i)``.

    >>> per = StateBytes(param=2.0, grad=2.0, optimizer=12.0)
    >>> r = fsdp_resharded_ranges([10.0, 20.0, 30.0], per=per)
    >>> float(r[0, 2]), float(r[2, 2]), float(r[1, 0])  # 30 + 20 + 15 x 6; 30 + 90; empty
    (140.0, 120.0, 0.0)
    """
    u = np.asarray(units, dtype=np.float64)
    n = u.size
    if n == 0 or per.gathered <= 0.0:
        return np.zeros((n, n))
    e = u / per.gathered if elements is None else np.asarray(elements, dtype=np.float64)
    alone = u + e * (per.grad + REDUCE_BYTES)  # the range's first unit: nothing of the range before it
    paired = alone + np.concatenate(([0.0], u[:-1]))
    lo, hi = np.arange(n)[:, None], np.arange(n)[None, :]
    later = np.maximum.accumulate(np.where(hi > lo, paired[None, :], -np.inf), axis=1)
    return np.where(hi >= lo, np.maximum(alone[:, None], later), 0.0)
