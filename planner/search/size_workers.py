"""The pipeline sizes of one search run in worker processes (``planner plan --jobs N``; issue 22).

A pipeline search (:func:`planner.search.pipeline.search_pipeline`) walks its pipeline sizes one after
the other; each size's (micro-batch, recompute, ZeRO) combinations are priced on cost models of that
size's stages, and what the sizes share is a running frontier that only prunes (a combination whose
bounds a point already found dominates is not searched: the frontier is the same without it,
``PipelineOptions.prune``) and memos of the cost cache (a size's stage models are its own: its
devices per stage). So each size can run in a process of its own:

* ``jobs - 1`` workers are forked (``multiprocessing``'s ``fork`` start method) once the search is set
  up: the model, its cost cache and the search's seeds are shared copy-on-write; they take whole sizes
  from the back of the list, the parent runs sizes itself from the front (the serial walk, on the
  search's own frontier and cache: the memos of those sizes stay for the cache's later searches, a
  launcher's after another's and the headroom search), until it meets a size a worker has taken;
* a worker searches its size with a frontier of its own (the search's seeds only) and sends back the
  points of that frontier, built (``PipelinePoint``: the graph each one names goes as its batch and
  is the parent's cache's graph of that batch again) and its counts;
* the parent then adds the workers' points to the search's frontier in the sizes' order, each size's
  in the order its worker found them: the frontier keeps the first of equal points (``_Frontier.add``),
  so it ends with the same set, in the same order, as the serial walk; the points the serial walk never
  priced (pruned by another size's points: every prune is of combinations a point provably dominates)
  are dominated and leave it again;
* a worker's error is raised in the parent when its size's turn comes, as the serial walk raises it.

What differs from the serial walk: the work counts (combinations, intra-op searches, pruned) count the
combinations each worker searched without the other sizes' points to prune by (more), and the memos
a worker builds stay in it (the cache's later searches build theirs again). Under ``--time-limit``,
past the deadline a worker starts no size once any worker found a point, and the sizes after the
first one cut are dropped with it (the note names them), as the serial walk does; which sizes are cut
depends on the clock, as it does serially.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import multiprocessing
import os
import pickle
from typing import Any, Callable, Sequence

JOBS_CAP = 8
"""The most worker processes ``planner plan`` uses by default (more pipeline sizes than this are rare)."""


def default_jobs() -> int:
    """Worker processes ``planner plan`` uses by default: the CPUs this process may run on
    (``os.sched_getaffinity``), at most :data:`JOBS_CAP`; 1 where processes cannot be forked.

    >>> 1 <= default_jobs() <= JOBS_CAP
    True
    """
    if not forks():
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, JOBS_CAP))


def forks() -> bool:
    """Whether this platform forks worker processes (Linux, macOS: ``fork``; not Windows)."""
    return "fork" in multiprocessing.get_all_start_methods()


@dataclasses.dataclass(frozen=True, slots=True)
class _Found:
    """A point a worker found, as the running frontier reads a priced plan (``time_s``,
    ``memory_bytes``, ``fits``, ``point()``)."""

    time_s: float
    memory_bytes: float
    fits: bool
    built: Any

    def point(self) -> Any:
        return self.built


@dataclasses.dataclass(frozen=True, slots=True)
class _SizeOutcome:
    """What a worker sends back for one pipeline size."""

    stopped: int | None
    """The size, when the time limit cut it (or it did not start); ``None``: searched."""
    found: tuple[tuple[float, float, bool, Any], ...]
    """``(seconds, bytes, fits, PipelinePoint)`` of its frontier, in the order found."""
    combos: int
    searches: int
    skipped: int
    pruned: int
    priced: int
    degraded: int
    """Intra-op searches the heuristic answered (``pricing.plans``'s count, this size's)."""
    builds: int


_FORKED: Any = None
"""``(search, deadline_s, found_flag)`` of the search whose sizes the workers run: set in the parent
just before they fork, read by them (never sent)."""


def run_sizes(search: Any, sizes: Sequence[int], report: Callable[[str, float], None], deadline_s: float | None,
              jobs: int, degraded_key: Any) -> int | None:
    """``search.run(sizes, report, deadline_s)`` with the sizes run in ``jobs`` worker processes
    (module docstring): the first size not (fully) searched at the deadline, or ``None``. The
    search (``planner.search.pipeline._Search``) ends with the frontier and counts the serial run
    leaves; ``degraded_key``: the key of ``search.pricing.plans`` that counts heuristic answers."""
    runnable = [pp for pp in sizes if search.runs_any(pp)]
    if jobs <= 1 or len(runnable) < 2 or not forks():
        return search.run(sizes, report, deadline_s)
    global _FORKED
    context = multiprocessing.get_context("fork")
    found_flag = context.Value("b", 0, lock=False)  # a point was found: past the deadline no size starts
    _FORKED = (search, deadline_s, found_flag)
    search.deadline_s = deadline_s
    try:
        workers = min(jobs - 1, len(runnable) - 1)
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pp: pool.submit(_search_size, pp) for pp in reversed(runnable)}  # the workers: from the back
            return _gather(search, runnable, [futures[pp] for pp in runnable], report, len(sizes), degraded_key)
    finally:
        _FORKED = None


def _gather(search: Any, runnable: Sequence[int], futures: Sequence[concurrent.futures.Future], report: Callable,
            count: int, degraded_key: Any) -> int | None:
    """Each size in the sizes' order: run here when no worker has taken it, else its worker's outcome
    merged into ``search`` (its error raised at its turn); from the first size cut, the rest are dropped
    (cancelled where not started)."""
    _, deadline_s, found_flag = _FORKED
    for index, (pp, future) in enumerate(zip(runnable, futures)):
        report("pipeline search", index / count)
        try:
            if future.cancel():  # no worker took it: the serial walk's step, on the search's own frontier
                stopped = search.run([pp], lambda stage, fraction: None, deadline_s)
                found_flag.value = found_flag.value or bool(search.frontier.entries)
            else:
                outcome = _loads(search.pricing, future.result())
                _merge(search, outcome, degraded_key)
                stopped = outcome.stopped
        except BaseException:
            for later in futures[index + 1:]:
                later.cancel()
            raise
        if stopped is not None:
            for later in futures[index + 1:]:
                later.cancel()
            return pp
    return None


def _merge(search: Any, outcome: _SizeOutcome, degraded_key: Any) -> None:
    """Add a size's points to the search's frontier (in the order found) and its counts to the search's."""
    for time_s, memory_bytes, fits, point in outcome.found:
        search.frontier.add(_Found(time_s, memory_bytes, fits, point))
    search.frontier.priced += outcome.priced - len(outcome.found)  # add() counted each once
    search.combos += outcome.combos
    search.searches += outcome.searches
    search.skipped += outcome.skipped
    search.pruned += outcome.pruned
    if outcome.degraded:
        search.pricing.plans[degraded_key] = search.pricing.plans.get(degraded_key, 0) + outcome.degraded
    if hasattr(search.pricing, "builds"):
        search.pricing.builds += outcome.builds


def _search_size(pp: int) -> bytes:
    """In a worker: search pipeline size ``pp`` with a frontier of its own (the search's seeds), and
    return its outcome pickled (:func:`_dumps`)."""
    from planner.search.running_frontier import _Frontier

    search, deadline_s, found_flag = _FORKED
    pricing = search.pricing
    degraded_key = ("degraded",)
    degraded, builds = pricing.plans.get(degraded_key, 0), getattr(pricing, "builds", 0)
    own = dataclasses.replace(search, frontier=_Frontier(search.frontier.seeds), combos=0, searches=0, skipped=0,
                              pruned=0, elsewhere=lambda: bool(found_flag.value))
    if own._late(deadline_s):
        stopped = pp  # past the deadline with a point found elsewhere: as the serial walk, it does not start
    else:
        stopped = own.run([pp], lambda stage, fraction: None, deadline_s)
    found = tuple((e.time_s, e.memory_bytes, bool(e.fits), e.point()) for e in own.frontier.entries)
    if found:
        found_flag.value = 1
    outcome = _SizeOutcome(stopped=stopped, found=found, combos=own.combos, searches=own.searches,
                           skipped=own.skipped, pruned=own.pruned, priced=own.frontier.priced,
                           degraded=pricing.plans.get(degraded_key, 0) - degraded,
                           builds=getattr(pricing, "builds", 0) - builds)
    return _dumps(pricing, outcome, [point for *_, point in found])


def _dumps(pricing: Any, outcome: _SizeOutcome, points: Sequence[Any]) -> bytes:
    """``outcome`` pickled, each point's graph (the cache's graph of its batch) and the cache itself
    named, not copied: the parent reads them back as its own (:func:`_loads`)."""
    graphs = {id(pricing.graph(p.micro_batch_samples)): p.micro_batch_samples for p in points if p.graph is not None}
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)

    def persistent_id(obj: Any) -> tuple | None:
        if obj is pricing:
            return ("pricing",)
        batch = graphs.get(id(obj))
        return None if batch is None else ("graph", batch)

    pickler.persistent_id = persistent_id  # type: ignore[method-assign]
    pickler.dump(outcome)
    return buffer.getvalue()


def _loads(pricing: Any, data: bytes) -> _SizeOutcome:
    """A worker's outcome, its named graphs and cache read as the parent's own."""
    unpickler = pickle.Unpickler(io.BytesIO(data))

    def persistent_load(name: tuple) -> Any:
        return pricing if name[0] == "pricing" else pricing.graph(name[1])

    unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
    return unpickler.load()
