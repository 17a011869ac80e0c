r"""Pareto utilities for (time, memory) points: filter, dominance, hypervolume, memory limits.

Both objectives are minimised. Point :math:`a` *dominates* :math:`b` when it is no worse in both and
better in one. The filter sorts by time (then memory, then input position) and keeps a point when
its memory is below the running minimum of the points before it: one pass, no Python loop; of
points with equal (time, memory), the first in input order is kept.

**Tied times** (``time_tie`` :math:`\tau`, the frontiers users see: :data:`TIME_TIE`). Times within
:math:`\tau` of each other are equal for dominance: :math:`a` dominates :math:`b` when
:math:`T_a \le (1 + \tau) T_b`, :math:`M_a \le M_b` and :math:`M_a < M_b` or :math:`T_a < T_b`, so of
two plans as fast the one holding more memory leaves the frontier. Searches keep exact filters; the
tie is one last pass, over the exact frontier (below).

**Tie groups** (``tie_groups``): the exact frontier first, then the tie among its points of one group
(across groups the exact rule only). Taken on the exact frontier, the rows depend on that frontier alone:
the union of several searches' exact frontiers gives the rows the frontier of all their points gives
(a search that tied its own result first could drop a point that exactly dominates another search's
row, since the tied relation is not transitive). The frontiers users see group rows by devices and model-parallel ways
(:func:`planner.search.pipeline.tie_group`, as :func:`planner.pick.tie_key` orders them), because among rows as fast the pick prefers fewer
devices, then fewer model-parallel ways, before less memory (``planner.pick``): a one-device plan 2e-7
slower than a leaner tp=4 plan on four devices is the pick, so the tie must not drop it (h28r's case).
Within a group the tie removes float-noise twins (ZeRO-1 and ZeRO-2 points 7e-18 s apart).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.core.units import format_bytes
from planner.search.results import FrontierPoint, FrontierResult, MemoryFit

__all__ = [
    "TIME_TIE",
    "pareto_mask",
    "dominates",
    "dominated_by",
    "hypervolume",
    "fastest_within",
]


TIME_TIE = 1e-6
r"""Relative step-time tolerance within which the frontiers users see hold two times equal for dominance
(module docstring), between points of one tie group: the launchable table's rows (``planner.launchable``)
and ``planner estimate``'s "dominated by" (``planner.estimate``). Not the searches' own results
(:func:`planner.search.pipeline.search_pipeline` returns its exact frontier, which the table ties once), nor
the per-op research search's (``planner.plan``): its pick is the proven optimum of the constrained problem,
and a tied leaner plan it did not list would need another search.

Why :math:`10^{-6}`: far above summation error (a step sums :math:`n \lesssim 10^5` terms in float64,
:math:`n \epsilon \approx 10^{-11}` relative) and far below any cost term a plan can trade: one kernel
launch (``kernel_overhead_s``, 5 us) is :math:`10^{-4}` of a 50 ms step, and the table prints four
digits. GPT-2 on 16 A100s (the README's job) lists ``dp=16``, ``dp=8 x tp=2 sp`` and ``dp=4 x tp=4 sp``
at 37.851408, 37.851409 and 37.851411 ms (2026-12-02, h28e, before NCCL's buffers were priced): the host
floor sets every pass, and the times differ only in the optimizer step over each rank's shard (0.8 and
2.5 ns above ``dp=16``'s, :math:`2 \cdot 10^{-8}` and :math:`7 \cdot 10^{-8}` of the step). Their
model-parallel ways differ, so they are three tie groups and the pick's order, not the tie, chooses among
them; the tie removes twins within a group (a ZeRO-1 and a ZeRO-2 point 7e-18 s apart)."""


def pareto_mask(
    time_s: np.ndarray, memory_bytes: np.ndarray, *, time_tie: float = 0.0, tie_groups: np.ndarray | None = None
) -> np.ndarray:
    """Boolean mask of the non-dominated points (first of equal points only), times within
    ``time_tie`` (relative) of each other equal (module docstring; :func:`dominates`): between points of
    one ``tie_groups`` label only, when given (exact dominance across groups).

    Examples
    --------
    >>> pareto_mask(np.array([1.0, 2.0, 2.0, 3.0, 1.0]), np.array([5.0, 3.0, 4.0, 3.0, 5.0])).tolist()
    [True, True, False, False, False]
    >>> t, m = np.array([1.0, 1.0 + 2e-8, 1.0 + 4e-8, 1.1]), np.array([3.0, 2.0, 1.0, 0.5])
    >>> pareto_mask(t, m).tolist(), pareto_mask(t, m, time_tie=TIME_TIE).tolist()
    ([True, True, True, True], [False, False, True, True])
    >>> pareto_mask(t, m, time_tie=TIME_TIE, tie_groups=np.array([0, 1, 1, 1])).tolist()
    [True, False, True, True]
    """
    if tie_groups is not None and time_tie > 0.0:
        groups = np.asarray(tie_groups)
        kept = pareto_mask(time_s, memory_bytes)
        for label in np.unique(groups[kept]):  # the tie among the exact frontier's points of each group
            members = np.flatnonzero(kept & (groups == label))
            kept[members] = pareto_mask(np.asarray(time_s)[members], np.asarray(memory_bytes)[members],
                                        time_tie=time_tie)
        return kept
    t = np.asarray(time_s, dtype=np.float64)
    m = np.asarray(memory_bytes, dtype=np.float64)
    mask = np.zeros(t.shape, dtype=bool)
    if t.size == 0:
        return mask
    order = np.lexsort((np.arange(t.size), m, t))
    t_sorted, m_sorted = t[order], m[order]
    before = np.minimum.accumulate(m_sorted)
    previous = np.concatenate(([np.inf], before[:-1]))  # least memory of the points sorted before each
    kept = m_sorted < previous
    if time_tie > 0.0:
        # and of every point up to (1 + tie) x its time: one as fast with less memory dominates it
        reach = np.searchsorted(t_sorted, t_sorted * (1.0 + time_tie), side="right")
        kept &= ~(before[reach - 1] < m_sorted)
    mask[order[kept]] = True
    return mask


def dominates(a: tuple[float, float], b: tuple[float, float], *, time_tie: float = 0.0) -> bool:
    """True when point ``a`` = (time, memory) dominates ``b``: no slower (beyond ``time_tie``, relative),
    no larger, and smaller or faster.

    Examples
    --------
    >>> dominates((1.0, 2.0), (1.0, 3.0)), dominates((1.0, 2.0), (1.0, 2.0))
    (True, False)
    >>> dominates((1.0 + 1e-7, 2.0), (1.0, 3.0)), dominates((1.0 + 1e-7, 2.0), (1.0, 3.0), time_tie=TIME_TIE)
    (False, True)
    """
    return a[0] <= b[0] * (1.0 + time_tie) and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def dominated_by(
    time_s: np.ndarray, memory_bytes: np.ndarray, front_time_s: np.ndarray, front_memory_bytes: np.ndarray
) -> np.ndarray:
    """Mask of the points that some point of the front dominates (vectorised :func:`dominates`)."""
    t = np.asarray(time_s, dtype=np.float64)[:, None]
    m = np.asarray(memory_bytes, dtype=np.float64)[:, None]
    ft = np.asarray(front_time_s, dtype=np.float64)[None, :]
    fm = np.asarray(front_memory_bytes, dtype=np.float64)[None, :]
    if ft.size == 0:
        return np.zeros(t.shape[0], dtype=bool)
    return np.any((ft <= t) & (fm <= m) & ((ft < t) | (fm < m)), axis=1)


def hypervolume(time_s: np.ndarray, memory_bytes: np.ndarray, reference: tuple[float, float]) -> float:
    """Area dominated by the points and bounded by ``reference`` (seconds x bytes), by pymoo.

    Compare frontiers with one fixed reference point (worse than every point of all of them);
    larger is better.

    Examples
    --------
    >>> hypervolume(np.array([1.0, 2.0]), np.array([2.0, 1.0]), (3.0, 3.0))
    3.0
    """
    from pymoo.indicators.hv import HV  # imported lazily: pymoo's import takes ~0.5 s

    points = np.column_stack([np.asarray(time_s, float), np.asarray(memory_bytes, float)])
    if points.size == 0:
        return 0.0
    return float(HV(ref_point=np.asarray(reference, dtype=np.float64))(points))


def fastest_within(frontier: FrontierResult | Sequence[FrontierPoint], memory_limit_bytes: float) -> MemoryFit:
    """The fastest point whose memory per device fits the limit, or a clear "none fits".

    Parameters
    ----------
    frontier:
        A frontier result or its points.
    memory_limit_bytes:
        Memory available per device (bytes).

    Examples
    --------
    >>> pts = [FrontierPoint(time_s=1.0, memory_bytes=8e9, choice=np.zeros(1, np.int64)),
    ...        FrontierPoint(time_s=2.0, memory_bytes=3e9, choice=np.ones(1, np.int64))]
    >>> fastest_within(pts, 4e9).point.time_s
    2.0
    >>> fit = fastest_within(pts, 1e9)
    >>> fit.feasible, fit.smallest_memory_bytes
    (False, 3000000000.0)
    """
    points = frontier.points if isinstance(frontier, FrontierResult) else tuple(frontier)
    limit = float(memory_limit_bytes)
    if not points:
        return MemoryFit(
            feasible=False,
            point=None,
            memory_limit_bytes=limit,
            smallest_memory_bytes=float("inf"),
            message="no strategy has a finite cost; check the cost tables",
        )
    smallest = min(p.memory_bytes for p in points)
    fitting = [p for p in points if p.memory_bytes <= limit]
    if not fitting:
        return MemoryFit(
            feasible=False,
            point=None,
            memory_limit_bytes=limit,
            smallest_memory_bytes=smallest,
            message=(
                f"no strategy fits in {format_bytes(limit)} per device; the smallest needs "
                f"{format_bytes(smallest)}: add devices, raise the limit, or enable ZeRO/recomputation"
            ),
        )
    best = min(fitting, key=lambda p: (p.time_s, p.memory_bytes))
    return MemoryFit(
        feasible=True,
        point=best,
        memory_limit_bytes=limit,
        smallest_memory_bytes=smallest,
        message=f"fastest strategy within {format_bytes(limit)}: {best.time_s:.6g} s per step",
    )
