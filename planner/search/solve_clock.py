r"""The running pipeline search's deadline, for the per-stage intra-op DPs it runs (``--time-limit``).

A pipeline search (:func:`planner.search.pipeline.search_pipeline`) checks its deadline between
(pipeline size, micro-batch) slots and between (recompute, ZeRO group) combinations, but one
combination runs an exact DP per stage (``planner.search.pipeline._solve``), and before this module
that DP was bounded only by its own cap (``_MAX_SOLVE_S``, 30 s of predicted CPU): the launchable
table's headroom search on Mamba-2 (``tests/zoo/mamba2_dynamo_bare.onnx``, 32 devices, global batch
256) started with 0.3 s of its share left and ran one DP of 41 eliminations for 14.7 s (steps of 9.6,
5.3, 2.6 and 2.2 s; predicted 25.7 s), and under a load of 22 with ``nice -n 10`` the plan took
175.6 s against ``--time-limit 60`` (issue 22 / 25).

So the search runs under :func:`run_until` its deadline, and each DP asks this module:

* before it starts, :func:`in_time`: its predicted seconds (:func:`planner.search.budget.estimate_plan`,
  CPU seconds on one core) times the wall seconds per CPU second of the process (:meth:`SolveClock.wall_per_cpu`:
  on a loaded machine a CPU second takes longer; read since the search started, or since the plan's
  searches started, :func:`measured_from`, so that a search's first DP knows the load too) must fit in
  what is left; otherwise the short seeded heuristic answers, as for a DP over its cap;
* between its elimination steps, :func:`check`: past the deadline it stops
  (:class:`SolvePastDeadline`) and the heuristic answers (:func:`heuristic_seconds` for it: what is
  left less pymoo's import before its first call, at most its usual two seconds; under half a
  second, the fastest of its seeds alone).

Without a deadline (no ``--time-limit`` reached the search, or a generous one) nothing changes: the
DPs run as before, so the answer under ``--time-limit 36000`` is the same.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["LoadWindow", "SolveClock", "SolvePastDeadline", "check", "heuristic_seconds", "in_time", "measured_from",
           "run_until"]

_Result = TypeVar("_Result")

_MIN_CPU_S = 0.25
"""CPU seconds the process must have taken in the window before its wall/CPU ratio is read (below: 1)."""
_MAX_WALL_PER_CPU = 50.0
"""The ratio's ceiling: a process waiting on something else than the CPU (a file, a swap) is not measured."""
_LEAST_HEURISTIC_S = 0.5
"""The least seconds of NSGA-II worth running; with less left the fastest of its seeds (the replicated
plans and each op's fastest row) answers at once."""
_NSGA2_FIRST_CALL_CPU_S = 0.8
"""[Measured] CPU seconds of the process's first NSGA-II call before its clock starts: importing pymoo
(0.80 s of CPU, 3.0 s of wall at a load of 13; later calls 0.01 s). It took 2.6 s of wall when the
headroom search on Mamba-2 had 0.2 s of its share left, so it is taken off what is left."""


class SolvePastDeadline(Exception):
    """A DP stopped between elimination steps: its search's deadline passed (:func:`check`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadWindow:
    """Where the wall/CPU ratio is read from: the wall and CPU clocks at its start."""

    wall_started_s: float
    """``time.perf_counter()`` at the start."""
    cpu_started_s: float
    """``time.process_time()`` at the start."""

    @staticmethod
    def now() -> "LoadWindow":
        """A window starting now."""
        return LoadWindow(wall_started_s=time.perf_counter(), cpu_started_s=time.process_time())


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveClock:
    """The deadline of the running search and when it started, in wall and CPU seconds.

    Examples
    --------
    >>> clock = SolveClock(deadline_s=10.0, wall_started_s=0.0, cpu_started_s=0.0)
    >>> clock.wall_per_cpu(wall_s=6.0, cpu_s=1.0)  # a sixth of a core: a CPU second is six wall seconds
    6.0
    >>> clock.wall_per_cpu(wall_s=0.2, cpu_s=0.1)  # too little CPU yet to tell
    1.0
    """

    deadline_s: float
    """``time.perf_counter()`` value by which the search should stop."""
    wall_started_s: float
    """``time.perf_counter()`` when the load's window started (the search's, or its plan's searches')."""
    cpu_started_s: float
    """``time.process_time()`` then."""

    def wall_per_cpu(self, *, wall_s: float | None = None, cpu_s: float | None = None) -> float:
        """Wall seconds per CPU second of the process since the window started (at least 1; ``wall_s``,
        ``cpu_s``: those clocks now, read when ``None``). Several threads may take more CPU than wall: 1."""
        wall = (time.perf_counter() if wall_s is None else wall_s) - self.wall_started_s
        cpu = (time.process_time() if cpu_s is None else cpu_s) - self.cpu_started_s
        if cpu < _MIN_CPU_S:
            return 1.0
        return min(_MAX_WALL_PER_CPU, max(1.0, wall / cpu))


_RUNNING: ContextVar[SolveClock | None] = ContextVar("planner.search.solve_clock", default=None)
_WINDOW: ContextVar[LoadWindow | None] = ContextVar("planner.search.solve_clock.window", default=None)


@contextmanager
def measured_from(window: LoadWindow) -> Iterator[None]:
    """The searches run inside read the load from ``window``'s start (a plan's searches': the launchable
    table's, ``planner.launchable._Searches``), not each from its own start.

    Examples
    --------
    >>> busy = LoadWindow(wall_started_s=time.perf_counter() - 60.0, cpu_started_s=time.process_time() - 1.0)
    >>> with measured_from(busy):  # 60 wall seconds per CPU second so far: 1 s of DP would take 50 (the ceiling)
    ...     run_until(time.perf_counter() + 10.0, in_time, 1.0)
    False
    >>> run_until(time.perf_counter() + 10.0, in_time, 1.0)  # a search's own window: no CPU yet, no load read
    True
    """
    token = _WINDOW.set(window)
    try:
        yield
    finally:
        _WINDOW.reset(token)


def run_until(deadline_s: float | None, run: Callable[..., _Result], *args: object) -> _Result:
    """``run(*args)`` with its DPs bounded by ``deadline_s`` (a ``time.perf_counter()`` value; ``None``:
    unbounded, as before). The previous deadline is back afterwards (a search inside a search)."""
    window = _WINDOW.get() or LoadWindow.now()
    clock = None if deadline_s is None else SolveClock(
        deadline_s=deadline_s, wall_started_s=window.wall_started_s, cpu_started_s=window.cpu_started_s)
    token = _RUNNING.set(clock)
    try:
        return run(*args)
    finally:
        _RUNNING.reset(token)


def in_time(predicted_cpu_s: float) -> bool:
    """Whether a DP predicted at ``predicted_cpu_s`` (CPU seconds on one core) ends before the running
    search's deadline at the wall/CPU ratio seen so far; always ``True`` outside a bounded search.

    Examples
    --------
    >>> in_time(1e9)  # no search is running: no deadline
    True
    >>> run_until(time.perf_counter() + 60.0, in_time, 1.0), run_until(time.perf_counter() + 0.5, in_time, 1.0)
    (True, False)
    """
    clock = _RUNNING.get()
    if clock is None:
        return True
    return time.perf_counter() + predicted_cpu_s * clock.wall_per_cpu() <= clock.deadline_s


def check() -> None:
    """Raise :class:`SolvePastDeadline` when the running search's deadline has passed (between a DP's
    elimination steps); nothing outside a bounded search.

    Examples
    --------
    >>> check()
    >>> run_until(time.perf_counter() - 1.0, check)
    Traceback (most recent call last):
    ...
    planner.search.solve_clock.SolvePastDeadline: the search's deadline passed during a DP
    """
    clock = _RUNNING.get()
    if clock is not None and time.perf_counter() > clock.deadline_s:
        raise SolvePastDeadline("the search's deadline passed during a DP")


def heuristic_seconds(usual_s: float) -> float:
    """Seconds for the heuristic that answers a DP not run (:func:`planner.search.degrade.quick_fastest`):
    ``usual_s`` outside a bounded search, else what is left of its deadline (less pymoo's import at the
    load seen, before the first call), at most ``usual_s``, and 0 (its seeds alone, no NSGA-II) when
    that is under half a second.

    Examples
    --------
    >>> heuristic_seconds(2.0)
    2.0
    >>> run_until(time.perf_counter() + 3600.0, heuristic_seconds, 2.0)
    2.0
    >>> run_until(time.perf_counter() + 0.1, heuristic_seconds, 2.0)  # under half a second: the seeds alone
    0.0
    >>> run_until(time.perf_counter() - 1.0, heuristic_seconds, 2.0)
    0.0
    """
    clock = _RUNNING.get()
    if clock is None:
        return usual_s
    setup_s = 0.0 if "pymoo" in sys.modules else _NSGA2_FIRST_CALL_CPU_S * clock.wall_per_cpu()
    left_s = min(usual_s, clock.deadline_s - time.perf_counter() - setup_s)
    return left_s if left_s >= _LEAST_HEURISTIC_S else 0.0
