r"""Pipeline schedules: step time with the bubble and stage-to-stage transfers, in-flight activations.

A model cut into :math:`S` stages (one per group of devices) runs :math:`m` micro-batches per
training step. Stage :math:`s` spends :math:`f_s` seconds on the forward and :math:`b_s` on the
backward of one micro-batch (:math:`t_s = f_s + b_s`); crossing the boundary between stages
:math:`s` and :math:`s+1` costs :math:`c_s` seconds per micro-batch and direction (activation
forward, its gradient backward; :func:`p2p_time_s`, on the link the boundary crosses:
:func:`boundary_crosses_node`).

Schedules (:data:`Schedule`), each defined by the order in which a stage runs its work
(:func:`stage_orders`):

* ``gpipe`` (Huang et al., 2019): all forwards, then all backwards (in reverse micro-batch order);
  every stage keeps the activations of all :math:`m` micro-batches.
* ``1f1b`` (PipeDream-flush, Narayanan et al., 2021; Megatron-LM's default): stage :math:`s` runs
  :math:`w_s = \min(S - s - 1, m)` warm-up forwards, then alternates one forward and one backward,
  then drains the remaining backwards; it keeps at most :math:`\min(S - s, m)` micro-batches.
* ``interleaved`` (Megatron-LM's interleaved 1F1B, Narayanan et al., SC'21): each device holds
  :math:`v` model chunks (virtual stages :math:`c S + s`); warm-up
  :math:`\min(2(S - s - 1) + (v - 1) S, m v)` chunk forwards; needs :math:`m` divisible by :math:`S`.
* ``zb-h1`` (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 2.1): 1F1B with the
  backward split into B (the activations' gradient) and W (the weights' gradient), the W passes
  delayed into the tail bubble; with :math:`v > 1` chunks the interleaved form (torch's
  ``ScheduleInterleavedZeroBubble``, "the ZB1P schedule in the paper"). Activations as 1F1B's.
* ``zbv`` (Qi et al., ZB-V; torch's ``ScheduleZBVZeroBubble``): two chunks per device in a V
  (device :math:`s` holds virtual stages :math:`s` and :math:`2S - 1 - s`), B and W split;
  activations as 1F1B's peak, :math:`S` micro-batches on every device.

Closed forms (:func:`pipeline_time_s`, :func:`bubble_fraction`, :func:`in_flight_micro_batches`):

.. math::

    T_{gpipe} = \sum_s t_s + 2\sum_s c_s + (m-1)(\max_s f_s + \max_s b_s), \qquad
    T_{1f1b} = \sum_s t_s + 2\sum_s c_s + (m-1)\max_s (t_s + 2\bar c)

.. math::

    T_{interleaved} = \Bigl(m + \frac{S-1}{v}\Bigr)(\max_s f_s + \max_s b_s) + 2v\sum_s c_s
        + 2v(m-1)\bar c

with :math:`\bar c = \max_s c_s`. With Megatron-Core's ``overlap_p2p_comm`` (``p2p_overlapped``; Megatron-Core
0.16.1 ``pipeline_parallel/schedules.py``, ``forward_backward_pipelining_with_interleaving``: in the steady state a
chunk's forward posts its send and the next receive without waiting, ``pp_post_forward``, and the wait comes before
the chunk that needs the tensor, ``pp_pre_forward``, after one backward chunk; the backward's likewise behind one
forward chunk) the steady-state term is what each transfer takes beyond the pass it hides under,
:math:`v(m-1)\bigl[(\bar c - \bar b / v)^+ + (\bar c - \bar f / v)^+\bigr]` with :math:`\bar f = \max_s f_s`,
:math:`\bar b = \max_s b_s`; the warm-up and flush transfers stay waited (``overlap_p2p_comm_warmup_flush`` is off
by default), so :math:`2v\sum_s c_s` stays. For equal stages and free transfers they give
:math:`(m + S - 1)\,t` (interleaved: :math:`(m + (S-1)/v)\,t`), an idle fraction of

.. math::

    \frac{S - 1}{m + S - 1} \quad (\text{interleaved: } \frac{S - 1}{v m + S - 1}).

Zero-bubble schedules take the weight-gradient share :math:`w_s` of each backward (``weight_s``;
default :math:`b_s / 2`: a linear layer's backward is two GEMMs of equal FLOPs,
:math:`dX = dY W^T` and :math:`dW = X^T dY`, the paper's :math:`T_B \approx T_W`). Qi et al.'s
table 2 gives, for equal stages and free transfers, the bubbles

.. math::

    \text{1F1B: } (S-1)(T_F + T_B + T_W), \qquad \text{ZB-H1: } (S-1)(T_F + T_B - T_W),

with :math:`T_B = b - w` and :math:`T_W = w`: ZB-H1 saves :math:`2(S-1)T_W` of 1F1B's bubble, a
third of it left at :math:`T_F = T_B = T_W`. So, with :math:`\underline{w} = \min_s w_s` (a
stage's tail is filled only by its own W passes),

.. math::

    T_{zb\text{-}h1} = T_{1f1b} - 2(S-1)\underline{w}, \qquad
    T_{zb\text{-}h1, v} = T_{interleaved} - 2(S-1)\underline{w}/v .

ZB-V's bubble is zero at :math:`T_F = T_B = T_W` (the paper, and torch's schedule: "only if time
forward == time backward input == time backward weights"); for other times it is priced as ZB-H2's
:math:`(S-1)(T_F + T_B - 2T_W)` (Qi et al. table 2) on a chunk's half passes, clipped at zero:

.. math::

    T_{zbv} = m(\max_s f_s + \max_s b_s) + \tfrac{S-1}{2}\max\bigl(0,
        \max_s f_s + \max_s b_s - 3\underline{w}\bigr) + 4\sum_s c_s + 4(m-1)\bar c,

which at :math:`w = 0` (no split) is interleaved 1F1B's at :math:`v = 2` (the transfers are its
too: each micro-batch crosses every boundary twice each way). The forms hold once the micro-batches
fill the warm-up: ZB-H1 from :math:`m \ge S` (the paper's figure 3), ZB-V from :math:`m \ge 2S - 1`
(torch's ``ScheduleZBVZeroBubble`` lays its timetable out for :math:`\max(2S - 1, m)`); with fewer,
one micro-batch's chain of passes is the step and no W pass has a bubble to fill, so they are priced
without the W credit (ZB-H1 as 1F1B / interleaved, ZB-V as interleaved at :math:`v = 2`). With free transfers and equal stages
at :math:`T_F = T_B = T_W` the idle fractions are :math:`(S-1)/(3vm + S - 1)` (ZB-H1) and 0
(ZB-V). The zero-bubble schedules are not simulated (:func:`stage_orders` has no B/W split).

The schedules are also simulated event by event (:func:`simulate`: each stage runs its order,
an item starts when its stage is free and its inputs have arrived, transfers are delays). The
simulation is the reference the closed forms are tested against: GPipe's is exact (a flow shop of
identical jobs, forward then backward); 1F1B's and the interleaved one equal the simulation for
equal stages without transfer time and bound it from above otherwise: a transfer on the critical
path of the steady state costs at most :math:`2\bar c` per micro-batch and chunk (one activation, one
gradient), which the :math:`\bar c` terms charge. Interleaving with unequal stages can stall on the
slowest forward *and* the slowest backward, hence :math:`\max f + \max b` (a sum over stages of
maxima, as GPipe's). A stage of :math:`n` layers that :math:`v` does not divide is cut into chunks as even
as whole layers allow (:func:`planner.core.chunks.chunk_layers`), each taking its layers' share of the
stage's passes; Megatron's order then stalls on the unequal chunks (the simulation's steady state runs
slower than the slowest stage), so the looped forms count every chunk as the stage's largest: its passes
and in-flight activations times :math:`v \lceil n/v \rceil / n` (:func:`planner.core.chunks.chunk_pad`),
a bound of the simulation (the makespan only grows with the passes).

References
----------
Y. Huang et al., "GPipe", NeurIPS 2019. D. Narayanan et al., "Memory-Efficient Pipeline-Parallel
DNN Training", ICML 2021. D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC 2021 (Sec. 2.2: bubble :math:`(p-1)/m`, interleaved
:math:`(p-1)/(vm)` of the ideal time; in-flight micro-batches). P. Qi, X. Wan, G. Huang, M. Lin,
"Zero Bubble Pipeline Parallelism", ICLR 2024 (Sec. 2, table 2: ZB-H1's bubble and memory; ZB-V).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from objectives.collectives import point_to_point_time_s
from planner.core.chunks import chunk_layers, chunk_pad
from planner.core.cluster import Cluster
from planner.core.errors import InputError

__all__ = [
    "Schedule",
    "SCHEDULES",
    "ZERO_BUBBLE",
    "WEIGHT_SHARE",
    "looped",
    "chunk_layers",
    "chunk_pad",
    "WorkItem",
    "Timeline",
    "check_schedule",
    "bubble_fraction",
    "in_flight_micro_batches",
    "pipeline_time_s",
    "pipeline_time_lower_bound_s",
    "steady_transfers_s",
    "stage_orders",
    "simulate",
    "boundary_crosses_node",
    "p2p_time_s",
]

Schedule = Literal["gpipe", "1f1b", "interleaved", "zb-h1", "zbv"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv")
ZERO_BUBBLE: tuple[str, ...] = ("zb-h1", "zbv")
"""The schedules that split the backward into B and W passes (Qi et al. 2024)."""
WEIGHT_SHARE = 0.5
"""The weights' gradient's share of a backward pass when the caller gives none: a linear layer's
backward is two GEMMs of equal FLOPs (``dX = dY W^T``, ``dW = X^T dY``); Qi et al. 2024's table 1
counts a transformer layer's W as its linear layers' weight GEMMs and B as their input GEMMs plus the
attention core's backward: half the backward when the sequence is short against the hidden size."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkItem:
    """One forward or backward pass of one micro-batch through one (virtual) stage."""

    kind: Literal["F", "B"]
    virtual_stage: int
    """``chunk * stages + stage`` (equal to the stage without interleaving)."""
    micro_batch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """A simulated training step (:func:`simulate`)."""

    makespan_s: float
    """From the first forward to the last backward (seconds)."""
    busy_s: np.ndarray
    """``(S,)`` seconds each stage computes."""
    peak_in_flight: np.ndarray
    """``(S,)`` most micro-batches whose activations a stage holds at once (forward started,
    backward not finished), in whole-stage micro-batches (a chunk counts ``1/v``)."""
    start_s: dict
    """``{WorkItem: start time}``."""
    finish_s: dict
    """``{WorkItem: finish time}``."""

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the stages' time: ``1 - sum(busy) / (S * makespan)``."""
        stages = self.busy_s.size
        return 1.0 - float(self.busy_s.sum()) / (stages * self.makespan_s) if self.makespan_s > 0 else 0.0


def check_schedule(schedule: str, *, stages: int, micro_batches: int, chunks: int = 1) -> None:
    """Raise :class:`InputError` when the schedule cannot run these sizes.

    Examples
    --------
    >>> check_schedule("interleaved", stages=4, micro_batches=8, chunks=2)
    >>> check_schedule("interleaved", stages=4, micro_batches=6, chunks=2)
    Traceback (most recent call last):
    ...
    planner.core.errors.InputError: the interleaved schedule needs the micro-batch count (6) to be a multiple of the pipeline size (4); change --micro-batch or --global-batch
    """
    if schedule not in SCHEDULES:
        raise InputError(f"unknown pipeline schedule '{schedule}'; use one of {', '.join(SCHEDULES)}")
    if stages < 1 or micro_batches < 1 or chunks < 1:
        raise InputError(
            f"pipeline sizes must be positive (stages={stages}, micro-batches={micro_batches}, chunks={chunks})"
        )
    if schedule == "zbv" and chunks != 2:
        raise InputError(f"the zbv schedule runs exactly two model chunks per device (got --chunks {chunks}); use --chunks 2")
    if schedule not in ("interleaved", "zb-h1", "zbv") and chunks != 1:
        raise InputError(f"only the interleaved, zb-h1 and zbv schedules have model chunks (got {chunks} with {schedule})")
    if (schedule == "interleaved" or (schedule == "zb-h1" and chunks > 1)) and stages > 1 and micro_batches % stages:
        raise InputError(
            f"the {schedule} schedule needs the micro-batch count ({micro_batches}) to be a "
            f"multiple of the pipeline size ({stages}); change --micro-batch or --global-batch"
        )


def looped(schedule: str, chunks: int) -> bool:
    """Whether each device holds more than one model chunk (an interleaved or V-shaped schedule).

    >>> looped("interleaved", 2), looped("zb-h1", 1), looped("zbv", 2)
    (True, False, True)
    """
    return chunks > 1 and schedule in ("interleaved", "zb-h1", "zbv")


def bubble_fraction(schedule: str, *, stages: int, micro_batches: int, chunks: int = 1) -> float:
    r"""Idle fraction of a pipeline of equal stages with free transfers (zero-bubble schedules: at
    Qi et al.'s :math:`T_F = T_B = T_W`).

    .. math:: \frac{S-1}{m+S-1} \quad (\text{interleaved: } \frac{S-1}{vm+S-1},\
        \text{zb-h1: } \frac{S-1}{3vm+S-1},\ \text{zbv: } 0)

    (ZB-H1 below :math:`m = S` and ZB-V below :math:`m = 2S - 1` micro-batches: their forms without
    the W credit, :func:`pipeline_time_s`.)

    Examples
    --------
    >>> bubble_fraction("1f1b", stages=4, micro_batches=8)
    0.2727272727272727
    >>> bubble_fraction("interleaved", stages=4, micro_batches=8, chunks=2)
    0.15789473684210525
    >>> bubble_fraction("zb-h1", stages=4, micro_batches=8)
    0.1111111111111111
    """
    check_schedule(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks)
    if schedule == "zbv" and micro_batches >= 2 * stages - 1:
        return 0.0
    v = chunks if looped(schedule, chunks) else 1
    # ZB-H1's bubble (S-1)(T_F + T_B - T_W) is (S-1) T at T_F = T_B = T_W = T, the step's work 3 v m T
    # per chunk pass (Qi et al. 2024, table 2); fewer micro-batches than stages: 1F1B's (pipeline_time_s)
    passes = 3 if schedule == "zb-h1" and micro_batches >= stages else 1
    return (stages - 1) / (passes * v * micro_batches + stages - 1)


def in_flight_micro_batches(
    schedule: str, *, stages: int, micro_batches: int, chunks: int = 1,
    stage_layers: np.ndarray | Sequence[float] | None = None,
) -> np.ndarray:
    r"""``(S,)`` micro-batches of activations each stage keeps at its peak, by the schedule's definition.

    GPipe: :math:`m`. 1F1B: :math:`\min(S - s, m)`. Interleaved: the warm-up chunk forwards plus
    one, :math:`\min(2(S-s-1) + (v-1)S + 1, mv)`, each holding :math:`1/v` of the stage's
    activations. ZB-H1: as 1F1B (interleaved with chunks): Qi et al. keep its peak, the W passes
    holding less than the B passes they follow. ZB-V: :math:`\min(S, m)` on every device (1F1B's
    peak; the V gives a device a long-lived and a short-lived chunk, whose lifespans add to the first
    stage's). ``stage_layers`` (looped schedules; ``(S,)`` or ``(S, ...)``, the result broadcast to its
    shape): each in-flight chunk counted as the stage's largest (:func:`chunk_pad`), a bound of the
    simulated peak of unequal chunks (:func:`simulate`).

    Examples
    --------
    >>> in_flight_micro_batches("1f1b", stages=4, micro_batches=8).tolist()
    [4.0, 3.0, 2.0, 1.0]
    >>> in_flight_micro_batches("gpipe", stages=2, micro_batches=3).tolist()
    [3.0, 3.0]
    >>> in_flight_micro_batches("interleaved", stages=2, micro_batches=4, chunks=2).tolist()
    [2.5, 1.5]
    >>> in_flight_micro_batches("zbv", stages=4, micro_batches=8, chunks=2).tolist()
    [4.0, 4.0, 4.0, 4.0]
    >>> in_flight_micro_batches("interleaved", stages=2, micro_batches=4, chunks=2, stage_layers=[4, 3]).tolist()
    [2.5, 2.0]
    """
    held = _in_flight(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks)
    if stage_layers is None or not looped(schedule, chunks):
        return held
    n = np.asarray(stage_layers, dtype=np.float64)
    return held.reshape(stages, *([1] * (n.ndim - 1))) * chunk_pad(n, chunks)


def _in_flight(schedule: str, *, stages: int, micro_batches: int, chunks: int) -> np.ndarray:
    """:func:`in_flight_micro_batches` of equal chunks."""
    check_schedule(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks)
    s = np.arange(stages, dtype=np.float64)
    m = float(micro_batches)
    if schedule == "gpipe":
        return np.full(stages, m)
    if schedule == "zbv":
        return np.full(stages, min(float(stages), m))
    if schedule == "1f1b":
        return np.minimum(stages - s, m)
    v = float(chunks)
    if chunks == 1:
        return np.minimum(stages - s, m)
    return np.minimum(2.0 * (stages - s - 1) + (v - 1.0) * stages + 1.0, m * v) / v


def pipeline_time_s(
    schedule: str,
    *,
    forward_s: np.ndarray | Sequence[float],
    backward_s: np.ndarray | Sequence[float],
    p2p_s: np.ndarray | Sequence[float] | float = 0.0,
    micro_batches: int,
    chunks: int = 1,
    weight_s: np.ndarray | Sequence[float] | None = None,
    stage_layers: np.ndarray | Sequence[float] | None = None,
    p2p_overlapped: bool = False,
) -> np.ndarray:
    """Closed-form step time of the pipeline (module docstring), without gradient synchronisation.

    Parameters
    ----------
    schedule:
        ``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1`` or ``zbv``.
    forward_s, backward_s:
        ``(..., S)`` seconds per micro-batch of each stage (recomputation in the backward).
    p2p_s:
        ``(..., S-1)`` seconds per transfer across each boundary (one direction), or a scalar.
    micro_batches:
        Micro-batches per step :math:`m`.
    chunks:
        Model chunks per device :math:`v` (interleaved, zb-h1; zbv: 2).
    weight_s:
        Zero-bubble schedules: ``(..., S)`` seconds of each backward that compute the weights'
        gradient (the W pass); default :data:`WEIGHT_SHARE` of ``backward_s``.
    stage_layers:
        Looped schedules: ``(..., S)`` layers of each stage, cut into chunks by :func:`chunk_layers`
        (default: ``chunks`` equal chunks). Where ``chunks`` does not divide a stage's layers its
        passes count :func:`chunk_pad` times (every chunk as its largest: the simulation's order
        stalls on the unequal chunks, module docstring), and the zero-bubble W credit is its
        smallest chunk's.
    p2p_overlapped:
        Interleaved: the steady state's transfers asynchronous (:func:`steady_transfers_s`); others ignore it.

    Returns
    -------
    numpy.ndarray
        Seconds, shape ``(...)`` (a 0-d array for one pipeline).

    Examples
    --------
    >>> float(pipeline_time_s("1f1b", forward_s=[1.0] * 4, backward_s=[2.0] * 4, micro_batches=8))
    33.0
    >>> float(pipeline_time_s("interleaved", forward_s=[1.0] * 4, backward_s=[2.0] * 4,
    ...                       micro_batches=8, chunks=2))
    28.5
    >>> float(pipeline_time_s("zb-h1", forward_s=[1.0] * 4, backward_s=[2.0] * 4, micro_batches=8))
    27.0
    >>> float(pipeline_time_s("zbv", forward_s=[1.0] * 4, backward_s=[2.0] * 4, micro_batches=8, chunks=2))
    24.0

    Four stages of 8, 8, 7 and 7 layers (30 layers) in two chunks each, 0.25 s forward and 0.5 s
    backward a layer: the 7-layer stages' chunks of 4 and 3 layers are priced as two of 4, as the
    8-layer stages' are: :math:`(8 + 3/2)(2 + 4)`.

    >>> float(pipeline_time_s("interleaved", forward_s=[2.0, 2.0, 1.75, 1.75], backward_s=[4.0, 4.0, 3.5, 3.5],
    ...                       micro_batches=8, chunks=2, stage_layers=[8, 8, 7, 7]))
    57.0
    """
    check_schedule(schedule, stages=np.shape(forward_s)[-1], micro_batches=micro_batches, chunks=chunks)
    f = np.asarray(forward_s, dtype=np.float64)
    b = np.asarray(backward_s, dtype=np.float64)
    t = f + b
    stages = t.shape[-1]
    c = np.asarray(p2p_s, dtype=np.float64)
    if c.ndim == 0:
        c = np.broadcast_to(c, (*t.shape[:-1], max(stages - 1, 0)))
    c_sum = c.sum(axis=-1) if c.shape[-1] else np.zeros(t.shape[:-1])
    c_max = c.max(axis=-1) if c.shape[-1] else np.zeros(t.shape[:-1])
    m = micro_batches
    if schedule == "gpipe":
        return t.sum(axis=-1) + 2.0 * c_sum + (m - 1) * (f.max(axis=-1) + b.max(axis=-1))
    w = b * WEIGHT_SHARE if weight_s is None else np.asarray(weight_s, dtype=np.float64)
    v = chunks if looped(schedule, chunks) else 1
    if v > 1 and stage_layers is not None:  # unequal chunks: each as the stage's largest, its W the smallest's
        n = np.asarray(stage_layers, dtype=np.float64)
        pad = chunk_pad(n, v)
        f, b, w = f * pad, b * pad, w * np.where(n > 0, v * np.floor(n / v) / np.maximum(n, 1.0), 1.0)
    slowest = f.max(axis=-1) + b.max(axis=-1)
    least_w = w.min(axis=-1)  # a stage's tail bubble is filled by its own W passes only
    if schedule == "zbv" and m >= 2 * stages - 1:  # two chunks in a V: transfers as interleaved 1F1B's at v = 2
        bubble = 0.5 * (stages - 1) * np.maximum(slowest - 3.0 * least_w, 0.0)
        return m * slowest + bubble + 4.0 * c_sum + 4.0 * (m - 1) * c_max
    if v > 1:
        steady = steady_transfers_s(c_max, f.max(axis=-1), b.max(axis=-1), chunks=v, micro_batches=m,
                                    overlapped=p2p_overlapped)
        time = (m + (stages - 1) / v) * slowest + 2.0 * v * c_sum + steady
    else:
        time = t.sum(axis=-1) + 2.0 * c_sum + (m - 1) * (t.max(axis=-1) + 2.0 * c_max)
    # ZB-H1 (Qi et al. 2024, table 2): (S-1)(T_F + T_B - T_W) against 1F1B's (S-1)(T_F + T_B + T_W)
    return time - 2.0 * (stages - 1) * least_w / v if schedule == "zb-h1" and m >= stages else time


def steady_transfers_s(c_max: np.ndarray, f_max: np.ndarray, b_max: np.ndarray, *, chunks: int, micro_batches: int,
                       overlapped: bool) -> np.ndarray:
    r"""Seconds the interleaved schedule's steady state spends on transfers (module docstring): waited, each
    chunk's two, :math:`2v(m-1)\bar c`; overlapped (Megatron-Core's ``overlap_p2p_comm``,
    ``TrainingSettings.p2p_overlap``), what each takes beyond the other direction's chunk pass it hides under,
    :math:`v(m-1)[(\bar c - \bar f/v)^+ + (\bar c - \bar b/v)^+]`.

    Transfers of 0.25 s beside chunks of 0.5 s forward and 1 s backward (v = 2, m = 8): waited
    2 x 2 x 7 x 0.25 = 7 s, overlapped none; of 0.75 s, the forward chunk leaves 0.25 s each: 2 x 7 x 0.25:

    >>> [float(steady_transfers_s(np.array(c), np.array(1.0), np.array(2.0), chunks=2, micro_batches=8,
    ...                           overlapped=hide)) for c in (0.25, 0.75) for hide in (False, True)]
    [7.0, 0.0, 21.0, 3.5]
    """
    v, m = chunks, micro_batches
    if not overlapped:
        return 2.0 * v * (m - 1) * c_max
    return v * (m - 1) * (np.maximum(c_max - f_max / v, 0.0) + np.maximum(c_max - b_max / v, 0.0))


def pipeline_time_lower_bound_s(
    schedule: str,
    *,
    work_s: float,
    bottleneck_s: float | None = None,
    p2p_s: np.ndarray | Sequence[float] | float = 0.0,
    stages: int,
    micro_batches: int,
    chunks: int = 1,
    p2p_overlapped: bool = False,
) -> float:
    r"""A lower bound of :func:`pipeline_time_s` over all stages with at least this much work.

    For any stages whose per-micro-batch times :math:`t_s = f_s + b_s` sum to at least :math:`W`
    (``work_s``), whose slowest stage takes at least :math:`B` (``bottleneck_s``, default
    :math:`W/S`; :math:`W/S \le B \le W`) and whose transfers take at least
    :math:`\underline{c}_s` (``p2p_s``; with ``p2p_overlapped`` and model chunks none, as transfers hidden under the
    passes may cost nothing), each closed form is at least its value for the stages
    :math:`f = (B, r, \dots, r)`, :math:`r = (W - B)/(S - 1)`, :math:`b = 0` with transfers
    :math:`\underline{c}`: these sum to :math:`W` with the slowest at :math:`B`, and the closed forms
    depend on the stages only through :math:`\sum_s t_s`, :math:`\max_s t_s` or
    :math:`\max_s f_s + \max_s b_s \ge \max_s t_s`, and on :math:`c` monotonically. The pipeline
    search uses it to skip combinations that cannot beat the plans it has already found.

    Examples
    --------
    >>> pipeline_time_lower_bound_s("1f1b", work_s=12.0, stages=4, micro_batches=8)
    33.0
    >>> pipeline_time_lower_bound_s("1f1b", work_s=12.0, bottleneck_s=4.0, stages=4, micro_batches=8)
    40.0
    >>> float(pipeline_time_s("1f1b", forward_s=[1.0, 2.0, 1.0, 0.5], backward_s=[2.0, 2.0, 3.0, 0.5],
    ...                       micro_batches=8))
    40.0

    A zero-bubble schedule's closed form falls below 1F1B's by its W passes, which the stages above
    do not have: its bound is the slowest stage's work, :math:`m B` (each closed form is at least
    :math:`m \max_s t_s` with :math:`w_s \le b_s / 2`).

    >>> pipeline_time_lower_bound_s("zb-h1", work_s=12.0, bottleneck_s=4.0, stages=4, micro_batches=8)
    32.0
    """
    if stages < 1:
        raise InputError(f"a pipeline needs at least one stage (got {stages})")
    work = float(work_s)
    slowest = work / stages if bottleneck_s is None else min(max(float(bottleneck_s), work / stages), work)
    if schedule in ZERO_BUBBLE:
        return micro_batches * slowest
    times = np.full(stages, (work - slowest) / (stages - 1) if stages > 1 else slowest)
    times[0] = slowest
    return float(
        pipeline_time_s(
            schedule, forward_s=times, backward_s=np.zeros(stages),
            p2p_s=0.0 if p2p_overlapped and looped(schedule, chunks) else p2p_s,  # without chunks none is overlapped
            micro_batches=micro_batches, chunks=chunks,
        )
    )


def stage_orders(schedule: str, *, stages: int, micro_batches: int, chunks: int = 1) -> list[list[WorkItem]]:
    """The order in which each stage runs its forward and backward work items.

    Examples
    --------
    >>> [f"{w.kind}{w.micro_batch}" for w in stage_orders("1f1b", stages=2, micro_batches=3)[0]]
    ['F0', 'F1', 'B0', 'F2', 'B1', 'B2']
    """
    check_schedule(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks)
    if schedule in ZERO_BUBBLE:
        raise InputError(f"the {schedule} schedule is priced by its closed form only (its B/W split is not simulated)")
    m = micro_batches
    orders: list[list[WorkItem]] = []
    for s in range(stages):
        if schedule == "gpipe":
            order = [WorkItem(kind="F", virtual_stage=s, micro_batch=i) for i in range(m)]
            order += [WorkItem(kind="B", virtual_stage=s, micro_batch=i) for i in reversed(range(m))]
        elif schedule == "1f1b" or chunks == 1:
            warm = min(stages - s - 1, m)
            order = [WorkItem(kind="F", virtual_stage=s, micro_batch=i) for i in range(warm)]
            for i in range(m - warm):
                order.append(WorkItem(kind="F", virtual_stage=s, micro_batch=warm + i))
                order.append(WorkItem(kind="B", virtual_stage=s, micro_batch=i))
            order += [WorkItem(kind="B", virtual_stage=s, micro_batch=i) for i in range(m - warm, m)]
        else:
            order = _interleaved_order(s, stages, m, chunks)
        orders.append(order)
    return orders


def _interleaved_order(s: int, stages: int, m: int, v: int) -> list[WorkItem]:
    """Megatron-LM's interleaved 1F1B for device ``s`` (``forward_backward_pipelining_with_interleaving``)."""
    total = m * v

    def item(kind: Literal["F", "B"], k: int) -> WorkItem:
        chunk = (k // stages) % v
        if kind == "B":
            chunk = v - 1 - chunk
        micro_batch = (k // (stages * v)) * stages + k % stages
        return WorkItem(kind=kind, virtual_stage=chunk * stages + s, micro_batch=micro_batch)

    warm = min(2 * (stages - s - 1) + (v - 1) * stages, total)
    order = [item("F", k) for k in range(warm)]
    for k in range(total - warm):
        order.append(item("F", warm + k))
        order.append(item("B", k))
    order += [item("B", k) for k in range(total - warm, total)]
    return order


def simulate(
    schedule: str,
    *,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    p2p_s: Sequence[float] | float = 0.0,
    micro_batches: int,
    chunks: int = 1,
    wrap_p2p_s: float | None = None,
    stage_layers: Sequence[int] | None = None,
) -> Timeline:
    """Run the schedule event by event (the reference for the closed forms; pure Python, for tests).

    Parameters
    ----------
    forward_s, backward_s:
        ``(S,)`` seconds per micro-batch of each stage; a chunk of an interleaved stage takes ``1/v``.
    p2p_s:
        ``(S-1,)`` transfer seconds across each boundary, or a scalar.
    wrap_p2p_s:
        Interleaved only: the transfer from the last device to the first (next chunk); default the
        largest of ``p2p_s``.
    stage_layers:
        Interleaved only: ``(S,)`` layers of each stage, cut into chunks by :func:`chunk_layers`; a
        chunk takes (and holds) its layers' share of the stage's passes (default: ``1/v`` each).

    Returns
    -------
    Timeline

    Examples
    --------
    >>> simulate("gpipe", forward_s=[1.0, 1.0], backward_s=[2.0, 2.0], micro_batches=4).makespan_s
    15.0
    """
    check_schedule(schedule, stages=len(forward_s), micro_batches=micro_batches, chunks=chunks)
    stages = len(forward_s)
    v = chunks if looped(schedule, chunks) else 1
    c = np.broadcast_to(np.asarray(p2p_s, dtype=np.float64), (max(stages - 1, 0),))
    wrap = float(c.max()) if wrap_p2p_s is None and c.size else float(wrap_p2p_s or 0.0)
    last_virtual = stages * v - 1
    share = np.full((stages, v), 1.0 / v)  # (stage, chunk): the chunk's share of the stage's passes
    if stage_layers is not None and v > 1:
        share = np.array([np.array(chunk_layers(int(n), v, first_stage=s == 0)) / max(int(n), 1)
                          for s, n in enumerate(stage_layers)])

    def seconds(total: float, s: int, j: int) -> float:
        """A chunk's pass on stage ``s`` (virtual stage ``j``): its share of the stage's."""
        return float(total) / v if stage_layers is None else float(total) * float(share[s, j // stages])

    def hop(j: int) -> float:
        """Transfer time from virtual stage ``j`` to ``j + 1``."""
        s = j % stages
        return float(c[s]) if s < stages - 1 else wrap

    orders = stage_orders(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks)
    start: dict[WorkItem, float] = {}
    finish: dict[WorkItem, float] = {}
    free = [0.0] * stages
    position = [0] * stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(stages):
            order = orders[s]
            while position[s] < len(order):
                item = order[position[s]]
                j, i = item.virtual_stage, item.micro_batch
                if item.kind == "F":
                    deps = [] if j == 0 else [(WorkItem(kind="F", virtual_stage=j - 1, micro_batch=i), hop(j - 1))]
                    duration = seconds(forward_s[s], s, j)
                else:
                    deps = [(WorkItem(kind="F", virtual_stage=j, micro_batch=i), 0.0)]
                    if j < last_virtual:
                        deps.append((WorkItem(kind="B", virtual_stage=j + 1, micro_batch=i), hop(j)))
                    duration = seconds(backward_s[s], s, j)
                if any(dep not in finish for dep, _ in deps):
                    break
                begin = max([free[s]] + [finish[dep] + delay for dep, delay in deps])
                start[item] = begin
                finish[item] = begin + duration
                free[s] = begin + duration
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"internal error: the {schedule} schedule deadlocked")
    busy = np.array([(float(forward_s[s]) + float(backward_s[s])) * micro_batches for s in range(stages)])
    peaks = np.zeros(stages)
    for s, order in enumerate(orders):
        held = peak = 0.0
        for item in order:  # whole items (divided by v after), or the chunks' shares of unequal ones
            size = 1.0 if stage_layers is None else float(share[s, item.virtual_stage // stages])
            held += size if item.kind == "F" else 0.0
            peak = max(peak, held)
            held -= size if item.kind == "B" else 0.0
        peaks[s] = peak / v if stage_layers is None else peak
    return Timeline(makespan_s=max(free), busy_s=busy, peak_in_flight=peaks, start_s=start, finish_s=finish)


def boundary_crosses_node(*, stages: int, devices_per_stage: int, devices_per_node: int) -> np.ndarray:
    """``(S-1,)`` bool: whether the transfer from stage ``s`` to ``s+1`` crosses a node.

    Stages take consecutive device ranks (Megatron's order: pipeline outermost), so rank ``r`` of
    stage ``s`` sends to rank ``r + devices_per_stage``; they are on different nodes unless the
    stage is smaller than a node and the boundary falls inside one.

    Examples
    --------
    >>> boundary_crosses_node(stages=4, devices_per_stage=4, devices_per_node=8).tolist()
    [False, True, False]
    """
    bounds = np.arange(1, stages) * devices_per_stage
    if devices_per_stage >= devices_per_node:
        return np.ones(stages - 1, dtype=bool)
    return bounds % devices_per_node == 0


def p2p_time_s(num_bytes: float, *, crosses_node: np.ndarray, cluster: Cluster) -> np.ndarray:
    """Seconds to send ``num_bytes`` per device across each boundary, on the link it crosses.

    Examples
    --------
    >>> from planner.core.cluster import Device, Link
    >>> dev = Device(name="d", peak_flops={"bf16": 1e12}, memory_bytes=10**9, memory_bandwidth_bytes_per_s=1e11)
    >>> c = Cluster(device=dev, nodes=2, devices_per_node=1,
    ...             intra_link=Link(name="nv", bandwidth_bytes_per_s=1e9, latency_s=0.0),
    ...             inter_link=Link(name="ib", bandwidth_bytes_per_s=1e8, latency_s=0.0))
    >>> p2p_time_s(1e6, crosses_node=np.array([False, True]), cluster=c).tolist()
    [0.001, 0.01]
    """
    return point_to_point_time_s(
        np.full(crosses_node.shape, float(num_bytes)),
        crosses_node=crosses_node,
        intra_link=cluster.intra_link,
        inter_link=cluster.inter_link,
    )
