r"""Work that only the step's first micro-batch's forward does, priced inside that forward under the stage's host
floor: ZeRO++'s hpZ (``TrainingSettings.hpz_partition``), whose first forward gathers the parameters over every
data-parallel rank and every later gather over the hpZ group (:func:`objectives.deepspeed_zero3.deepspeed_zero3_sync_s`
prices the excess of that one forward; ``objectives.pipeline_arrays`` keeps it per op as ``first_forward_s``).

DeepSpeed runs the gathers in the forward of the step's first micro-batch (``partitioned_param_coordinator.py``
``fetch_sub_module``: a parameter without a secondary tensor is gathered over every rank; ``stage3.py``
``_post_step`` drops the secondary tensors after each optimizer step). A stage whose forward is bound by the host
(``objectives.fixed_costs.host_floor_s``: the GPU waits for the launches) hides GPU work under the wait, plain
ZeRO-3's gathers over every rank included (``objectives.pipeline_price.price_plan`` floors each micro-batch's
forward). So the first micro-batch's forward takes :math:`\max(F + X, \phi)` where the others take
:math:`\max(F, \phi)` (:math:`F` the stage's forward work per micro-batch, :math:`X` the first forward's extra,
:math:`\phi` the floor), and the stage ends later by their difference, :func:`first_forward_extra_s`.

Schedule assumption: the price adds that delay to the stage's per-step tail (``pipeline_step_s``'s :math:`g_s`),
after its last backward. One stage (every DeepSpeed ZeRO-3 row: its ``PipelineEngine`` runs ZeRO 0-1) runs its
micro-batches one after the other, so the step is later by exactly the delay, as if the first forward had taken
it. In a pipeline each stage would be late by its own delay; the warm-up carries micro-batch 1 through every
stage, which may add the stages' delays together: not priced (no launcher runs hpZ in a pipeline). The search
charges it per segment alike (``planner.search.stage_costs._segment_costs``: the step of a segment of layers), so
every cut's step time is the price's.
"""

from __future__ import annotations

import numpy as np

__all__ = ["first_forward_extra_s"]


def first_forward_extra_s(forward_s: np.ndarray, extra_s: np.ndarray, floor_s: np.ndarray | None) -> np.ndarray:
    r"""Seconds a stage ends later when its step's first micro-batch's forward does ``extra_s`` more work than the
    others: :math:`\max(F + X, \phi) - \max(F, \phi)` with ``forward_s`` :math:`F` (the stage's forward work per
    micro-batch, before the floor), ``extra_s`` :math:`X` and ``floor_s`` :math:`\phi` (the host's least forward
    seconds per micro-batch; ``None``: no floor, the plain roofline, so all of :math:`X`). Arrays broadcast.

    Examples
    --------
    A stage of 3 ms forward work under a 5 ms host floor: 1.5 ms more fits in the wait, 4 ms exceeds it by 2 ms;
    without a floor all of it shows.

    >>> first_forward_extra_s(np.array([3e-3, 3e-3]), np.array([1.5e-3, 4e-3]), np.array([5e-3, 5e-3])) * 1e3
    array([0., 2.])
    >>> float(first_forward_extra_s(np.array(3e-3), np.array(4e-3), None) * 1e3)
    4.0
    """
    if floor_s is None:
        return np.asarray(extra_s, dtype=np.float64)
    return np.maximum(forward_s + extra_s, floor_s) - np.maximum(forward_s, floor_s)
