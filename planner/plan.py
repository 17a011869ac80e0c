"""``plan()``: the one function that wires import, cost and search; the CLI and tests call it.

Data flows one way: the importer turns the ONNX file into an :class:`~planner.core.graph.OpGraph`;
``objectives`` prices every configuration of every op on the cluster (:class:`CostTables`);
``planner.search`` finds the exact optimum (``dp``), the time/memory frontier (``frontier``), an
independent approximate frontier (``nsga2``) or the brute-force oracle (``exhaustive``); the
baselines (pure data parallelism, the best uniform ``dp x tp``, and for CNNs the "one weird trick")
are exact searches over restricted tables, priced by the same cost model.

The parts it wires live beside it, each re-exported here: the request and result types
(:mod:`planner.plan_types`), the graph and its cost tables (:mod:`planner.pricing`), launch targets
(:mod:`planner.plan_targets`), a strategy priced from its public form (:mod:`planner.public_form`)
and saved plans (:mod:`planner.saved_plan`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from planner import families
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import CostModelName, TrainingSettings
from planner.core.strategy import public_form
from planner.core.tables import CostTables
from planner.plan_targets import (
    TargetFilter,
    _no_target_strategy,
    _runnable_by,
    _with_targets,
    fastest_runnable,
    target_priced,
    refuse_export,
    target_filter,
    target_refusal,
)
from planner.plan_types import Baseline, Method, PlanPoint, PlanRequest, PlanResult, ProgressFn
from planner.pricing import build_model, load_graph
from planner.public_form import evaluate, op_configurations
from planner.saved_plan import LoadedPlan, load_plan, load_plan_pair

__all__ = [
    "Method",
    "CostModelName",
    "PlanRequest",
    "PlanPoint",
    "Baseline",
    "PlanResult",
    "ProgressFn",
    "load_graph",
    "plan_file",
    "TargetFilter",
    "target_filter",
    "LoadedPlan",
    "load_plan",
    "load_plan_pair",
    "build_model",
    "plan",
    "fastest_runnable",
    "target_refusal",
    "refuse_export",
    "evaluate",
    "op_configurations",
]


def plan_file(
    path: str | Path,
    dims: Mapping[str, int],
    requests: Sequence[PlanRequest],
    *,
    target: str = "generic",
    progress: ProgressFn | None = None,
    with_targets: bool = True,
    export: str | None = None,
    deadline: Any = None,
) -> tuple[OpGraph, list[PlanResult]]:
    """``planner plan``: import ``path`` once, then :func:`plan` it for each request (one per
    ``--devices`` count), restricted to the strategies ``target`` runs (``with_targets``: each
    point's ``targets`` filled; ``planner plan`` lists its rows as the generic plan, and skips them).
    ``export`` (``--export``'s format): a launcher that trains no plan of the model is refused
    before the search (:func:`refuse_export`, raising :class:`UnsupportedExport`). ``deadline``: the
    first plan's ``--time-limit`` from the command's start (:class:`planner.search.budget.PlanDeadline`):
    that plan's search has what the import left of it (each further count of a sweep its whole limit).

    Returns
    -------
    (OpGraph, list of PlanResult)
        The imported graph (its ``warnings`` for the user) and one result per request, in order.
    """
    report = progress or (lambda stage, fraction: None)
    restrict_to = target_filter(target)
    report("importing model", 0.0)
    started = time.perf_counter()
    graph = load_graph(path, dims)
    import_time_s = time.perf_counter() - started
    if requests:
        refuse_export(graph, requests[0].cluster, requests[0].settings, export, (target,))
    results = []
    fastest: dict[int, tuple] = {}  # device count -> (spaces, choice): seeds a larger count's degraded search
    for index, request in enumerate(requests):
        count = request.cluster.devices
        report(f"planning on {count} devices", 0.0)
        if index == 0 and deadline is not None:  # the import spent the first plan's limit (at least 1 ms is left)
            request = dataclasses.replace(request, time_limit_s=max(1e-3, deadline.left_s()))
        result = plan(
            graph, request, progress=lambda stage, fraction, c=count: report(f"{stage} ({c} devices)", fraction),
            target_filter=restrict_to, import_time_s=import_time_s, smaller=fastest, with_targets=with_targets,
        )  # fmt: skip
        results.append(result)
        if result.points and result.points[0].settings is None:
            fastest.setdefault(count, (result.spaces, np.asarray(result.points[0].strategy.choice, dtype=np.int64)))
    return graph, results


def samples_per_step(graph: OpGraph) -> int:
    """Samples in one training step: the largest batch-dim size over the ops (1 if none)."""
    sizes = [d.size for op in graph.ops for d in op.dims if d.is_batch]
    return max(sizes) if sizes else 1


def _samples_from_inputs(graph: OpGraph) -> int | None:
    for tensor in graph.tensors.values():
        if tensor.role == "input" and tensor.shape:
            return int(tensor.shape[0])
    return None


# Above this largest DP table the set-valued elimination (which multiplies it by the memory levels)
# would take minutes: go straight to the weighted hull. GPT-2 (batch 32, seq 1024): 2.4e6 cells at
# p = 16 (frontier in ~3 s), 5.4e7 at p = 32 (one elimination alone takes ~9 s).
_FRONTIER_MAX_TABLE_CELLS = 10_000_000
# The set-valued elimination's cost also grows with the memory levels of the factors each op
# combines, which the table size does not show: above this work (pareto_frontier(max_work=...),
# about 5-10 s on one core) it stops and the weighted hull answers instead (a 2-layer Mistral at
# p = 8 would need minutes of set-valued elimination; its hull takes 0.6 s). GPT-2 at p = 16
# (batch 32, seq 1024) needs 9e9; BERT-base at p = 16 (batch 32, seq 512) 9e10, so it gets the hull.
_FRONTIER_MAX_WORK = 3e10


def _search(
    tables: CostTables,
    request: PlanRequest,
    report: ProgressFn | None = None,
    found: dict | None = None,
    *,
    budget=None,
    deadline_s: float | None = None,
    notes: list[str] | None = None,
    seeds: np.ndarray | None = None,
    op_names: Sequence[str] | None = None,
    more_seeds=None,
):
    """Run the requested method within the budget; returns (choices, epsilon, exact, max_table_cells, order_name).

    ``dp`` and ``frontier`` degrade before passing ``budget`` (a :class:`SearchBudget`; default: the
    request's) or ``deadline_s``: hull, restricted configurations, NSGA-II
    (:mod:`planner.search.degrade`); each step down adds a line to ``notes``. ``seeds`` (known
    choices, e.g. the baselines) survive every restriction and start NSGA-II. When the full problem
    does not fit, ops that feed every layer are fixed first (:func:`planner.search.shared.decouple`;
    ``op_names`` name them in the note, with the bound the fix keeps or "exact"). ``more_seeds``
    (``deadline -> choices``, :data:`planner.search.degrade.MoreSeeds`): computed only when the
    search degrades, e.g. :func:`_smaller_mesh_seeds`.
    ``found`` (when given) receives ``"frontier"`` (the :class:`FrontierResult`) or, for ``dp``,
    ``"fastest_s"`` (the exact minimum time): what the exact pick (:func:`_exact_pick`) starts from;
    only results proven on the full tables go there (a restricted search proves nothing about them)."""
    from planner.search.degrade import fastest_within, frontier_within

    on_fraction = (lambda fraction: report("search", fraction)) if report else None
    if budget is None:
        budget = _budget(request)
    deadline = budget.deadline_s if deadline_s is None else deadline_s
    notes = [] if notes is None else notes
    if request.method in ("dp", "frontier") and tables.blocks:
        decoupled = _decoupled(tables, request, budget, deadline, op_names)
        if decoupled is not None:
            fixed, note = decoupled
            notes.append(note)
            inner_seeds = None if seeds is None else np.array([fixed.to_fixed(c) for c in seeds], dtype=np.int64)
            inner_more = None if more_seeds is None else (
                lambda until: _fixed_rows(fixed, more_seeds(until))
            )  # fmt: skip
            inner, epsilon, exact, cells, order_name = _search(
                fixed.tables, request, report, None, budget=budget, deadline_s=deadline, notes=notes, seeds=inner_seeds,
                more_seeds=inner_more,
            )  # fmt: skip
            return [fixed.to_original(c) for c in inner], epsilon, exact and fixed.exact, cells, order_name
    if request.method == "dp":
        choice, exact, steps, cells, order_name = fastest_within(
            tables, budget, deadline_s=deadline, seed=request.seed, seeds=seeds, more_seeds=more_seeds
        )
        notes.extend(steps)
        from planner.search.constrained import min_memory

        # the least-memory row: its ties' DP only within the budget (predicted first)
        smallest = min_memory(tables, deadline_s=deadline, max_memory_bytes=budget.memory_left_bytes())
        choices = [choice]
        if smallest.choice is not None and not np.array_equal(smallest.choice, choice):
            choices.append(smallest.choice)
        if found is not None and exact:
            found["fastest_s"] = tables.evaluate(choice)[0]
        return choices, 0.0, exact, cells, order_name
    if request.method == "frontier":
        degraded = frontier_within(
            tables, budget, deadline_s=deadline, epsilon=request.epsilon, max_points=request.max_points,
            seed=request.seed, progress=on_fraction, frontier_max_table_cells=_FRONTIER_MAX_TABLE_CELLS,
            frontier_max_work=_FRONTIER_MAX_WORK, seeds=seeds, more_seeds=more_seeds,
        )  # fmt: skip
        notes.extend(degraded.notes)
        result = degraded.result
        if degraded.tier not in ("exact", "hull") and found is not None:
            found = None  # its points still reach the pick as candidates, with no claim about the full tables
    elif request.method == "nsga2":
        from planner.search.nsga2 import nsga2_frontier

        result = nsga2_frontier(tables, seed=request.seed, time_limit_s=max(1.0, deadline - time.perf_counter()))
    elif request.method == "exhaustive":
        from planner.search.exhaustive import exhaustive_frontier

        result = exhaustive_frontier(tables)
    else:
        raise AssertionError(f"method {request.method!r}: PlanRequest checks it")
    if found is not None:
        found["frontier"] = result
    choices = [p.choice for p in result.points]
    epsilon = 0.0 if result.epsilon != result.epsilon else result.epsilon  # nan -> 0 for display
    return choices, epsilon, result.exact, result.max_table_cells, result.order_name


_SMALLER_MESH_DIVISORS = (8, 2)
"""The smaller meshes a degraded search is seeded from when no smaller plan is known: ``N / 8``
(the issue-25 bound: no best plan at ``N`` slower than the best at ``N / 8``), then ``N / 2``."""


def _smaller_mesh_seeds(graph: OpGraph, request: PlanRequest, tables: CostTables, known: Mapping[int, tuple] | None = None):
    """:data:`planner.search.degrade.MoreSeeds` for a search on the request's mesh: the fastest plans
    on fewer devices (``known``: device count -> ``(spaces, choice)``, e.g. from the earlier counts of
    ``--devices 8,64``; else searched here on ``N / 8`` and ``N / 2`` devices within the deadline),
    each embedded with the same split factors (:func:`planner.search.nsga2_seeds.embed_choice`)."""

    def seeds(deadline_s: float) -> np.ndarray | None:
        from planner.search.nsga2_seeds import combine_seeds, embed_choice

        devices = request.cluster.devices
        smaller = [plan for count, plan in sorted((known or {}).items()) if count < devices]
        if not smaller:
            counts = dict.fromkeys(devices // d for d in _SMALLER_MESH_DIVISORS if devices // d >= 1 and devices // d < devices)
            for position, count in enumerate(counts):
                share = (deadline_s - time.perf_counter()) / (len(counts) - position)
                found = _smaller_plan(graph, request, count, time.perf_counter() + share)
                if found is not None:
                    smaller.append(found)
        return combine_seeds(tables.num_ops, *(embed_choice(spaces, choice, tables) for spaces, choice in smaller))

    return seeds


def _smaller_plan(graph: OpGraph, request: PlanRequest, devices: int, deadline_s: float) -> tuple | None:
    """``(spaces, choice)``: the fastest plan ``_search`` finds on ``devices`` (a sub-cluster of the
    request's, its own smaller meshes seeding it) by ``deadline_s``; ``None`` when that mesh is not
    a whole sub-cluster, the model cannot be priced on it, or no time is left."""
    from objectives.pipeline_stages import stage_cluster

    left = deadline_s - time.perf_counter()
    if left < 0.5:
        return None
    try:
        sub = dataclasses.replace(request, cluster=stage_cluster(request.cluster, devices), method="dp", time_limit_s=left)
        model = build_model(graph, sub)
    except InputError:
        return None
    tables = model.tables
    choices, *_ = _search(
        tables, sub, budget=_budget(sub), deadline_s=deadline_s, notes=[], more_seeds=_smaller_mesh_seeds(graph, sub, tables)
    )  # fmt: skip
    if not choices:
        return None
    fastest = min(choices, key=lambda c: tables.evaluate(c)[0])
    return tuple(tables.configs), np.asarray(fastest, dtype=np.int64)


def _fixed_rows(fixed, rows) -> np.ndarray | None:
    """``rows`` (original choices) in the indices of decoupled tables (``shared.Fixed``)."""
    return None if rows is None else np.array([fixed.to_fixed(c) for c in rows], dtype=np.int64)


def _decoupled(tables: CostTables, request: PlanRequest, budget, deadline: float, op_names: Sequence[str] | None):
    """``(Fixed, note)`` when ops shared by every layer are fixed (:mod:`planner.search.shared`), else ``None``."""
    from planner.core.units import format_bytes, format_seconds
    from planner.search.degrade import exact_fits
    from planner.search.shared import decouple

    frontier = request.method == "frontier"
    found = decouple(
        tables,
        fits=lambda _t, plan, estimate: exact_fits(
            plan, estimate, budget, deadline, frontier=frontier, max_table_cells=_FRONTIER_MAX_TABLE_CELLS
        ),
    )
    if found is None:
        return None
    fixed, shared = found
    named = ", ".join(
        f"{op_names[s.op] if op_names else f'op {s.op}'} (read by {s.instances} blocks of {s.group}) at "
        f"{tables.configs[s.op].describe(fixed.rows[s.op]) or 'replicated'}"
        for s in shared
    )
    if fixed.exact:
        bound = "exact: that configuration is no worse than any other in time, memory and every edge"
    else:
        bound = (
            f"every Pareto point of the full problem has one within +{format_seconds(fixed.time_gap_s)}/step and "
            f"+{format_bytes(fixed.memory_gap_bytes)}/device of it (a proven bound)"
        )
    return fixed, f"search: ops that feed every layer fixed so the layers eliminate block by block: {named}; {bound}"


# An inexact frontier (hull + fill, restricted, NSGA-II) is thinned to at most this many rows before
# each row is priced in full and checked against every export target (~0.2 s per row on a 266-op
# nn.Transformer): a 263-point hull took 50 s after its search.
_MAX_INEXACT_ROWS = 32


def _thin(tables: CostTables, choices: list, rows: int, notes: list[str], found: dict | None = None) -> list:
    """The Pareto set of ``choices`` thinned to at most ``rows`` (>= 2), keeping the fastest and
    the smallest, with the least memory factor found: each dropped point has a kept one no slower
    with at most that factor x its memory (:func:`_thinnest_cover`). The note quotes the factor, and
    ``found`` (when given) receives it as ``"thinned_factor"``: the result's memory bound is the
    search's times it (a Pareto point is covered by a search point, which a kept row covers)."""
    from planner.search.pareto import pareto_mask
    from planner.search.problem import evaluate_many

    picks = np.stack([np.asarray(c, dtype=np.int64) for c in choices])
    times, memories = evaluate_many(tables, picks)
    front = np.flatnonzero(pareto_mask(times, memories) & np.isfinite(times) & np.isfinite(memories))
    if front.size <= rows:
        return [picks[i] for i in front]
    front = front[np.lexsort((memories[front], times[front]))]  # fastest first, memory decreasing
    kept, factor = _thinnest_cover(memories[front], rows)
    if found is not None:
        found["thinned_factor"] = factor
    notes.append(
        f"search: {front.size} frontier points thinned to {kept.size} rows: each dropped one has a kept row "
        f"no slower with at most {factor:.4g}x its memory"
    )
    return [picks[i] for i in np.sort(front[kept])]


def _thinnest_cover(memories: np.ndarray, rows: int) -> tuple[np.ndarray, float]:
    """``(kept positions, factor)`` for Pareto points sorted fastest first (``memories``
    decreasing): at most ``rows`` (>= 2) positions, the first and the last among them, such that
    every point has a kept one at or before it with at most ``factor`` x its memory.

    For a given factor the greedy cover (keep a point only when the last kept one does not cover
    it) keeps the fewest points, as a point is best covered by itself, the latest and smallest
    candidate; the least factor whose cover fits in ``rows`` is found by bisection, and the factor
    returned is the one the kept points measure (``inf`` when a memory is not positive).
    """

    def cover(factor: float) -> list[int]:
        kept = [0]
        for i in range(1, memories.size):
            if memories[kept[-1]] > factor * memories[i]:
                kept.append(i)
        return kept if kept[-1] == memories.size - 1 else [*kept, memories.size - 1]

    if memories[-1] <= 0:
        kept = np.unique(np.linspace(0, memories.size - 1, rows).astype(np.int64))
        return kept, float("inf")
    low, high = 1.0, float(memories[0] / memories[-1])  # the two ends alone cover within high
    for _ in range(60):
        middle = (low * high) ** 0.5
        if len(cover(middle)) <= rows:
            high = middle
        else:
            low = middle
    kept = np.array(cover(high), dtype=np.int64)
    last_kept = kept[np.searchsorted(kept, np.arange(memories.size), side="right") - 1]
    return kept, max(1.0, float((memories[last_kept] / memories).max()))


def _budget(request: PlanRequest):
    """The request's :class:`~planner.search.budget.SearchBudget`, starting now."""
    from planner.search.budget import SearchBudget, default_max_memory_bytes

    return SearchBudget(
        time_limit_s=request.time_limit_s,
        max_memory_bytes=request.max_memory_bytes if request.max_memory_bytes is not None else default_max_memory_bytes(),
    )


# Share of the time limit the baselines may take before the search (each an exact DP over few
# configurations per op, but a 2-layer DeBERTa-v2 export at p = 64 needed 290 s for them).
_BASELINE_SHARE = 0.15


# Share of the time limit kept for what follows the search: the exact pick (half of it), pricing
# each row in full and checking it against every target (~0.2 s per row on a 266-op graph).
_AFTER_SEARCH_SHARE = 0.3


def _baseline_choice(
    tables: CostTables, masks: Sequence[np.ndarray] | None, *, budget=None, deadline_s: float | None = None
) -> np.ndarray | None:
    """The exact fastest choice within ``masks``; ``None`` when the masks allow nothing, nothing
    finite, or (with a ``budget``) its DP is predicted past ``deadline_s`` or the memory left."""
    from planner.search.blocks import plan_elimination
    from planner.search.budget import estimate_plan
    from planner.search.elimination import solve_min
    from planner.search.restrict import restrict

    if masks is None or any(not m.any() for m in masks):
        return None
    restricted = restrict(tables, masks)
    plan = plan_elimination(restricted.tables)
    if budget is not None:
        estimate = estimate_plan(restricted.tables, plan)
        late = deadline_s is not None and time.perf_counter() + estimate.time_s > deadline_s
        if late or estimate.memory_bytes > budget.memory_left_bytes():
            raise _BaselineTooCostly
    best = solve_min(restricted.tables, objective="time", plan=plan)
    if not np.isfinite(best.value):
        return None
    return restricted.to_original(best.choice)


class _BaselineTooCostly(Exception):
    """A baseline's exact DP would pass the time or memory left (it is skipped, with a note)."""


def _baselines(
    graph: OpGraph,
    tables: CostTables,
    devices: int,
    *,
    budget=None,
    deadline_s: float | None = None,
    notes: list[str] | None = None,
) -> list[tuple[str, str, np.ndarray | None]]:
    """Data parallelism, the best uniform dp x tp and (CNNs) the weird trick, each an exact DP over
    restricted tables; with a ``budget``, those predicted past ``deadline_s`` are skipped (noted)."""
    spaces = tables.configs
    skipped: list[str] = []

    def choice_of(label: str, masks) -> np.ndarray | None:
        try:
            return _baseline_choice(tables, masks, budget=budget, deadline_s=deadline_s)
        except _BaselineTooCostly:
            skipped.append(label)
            return None

    found: list[tuple[str, str, np.ndarray | None]] = []
    dp_choice = choice_of("data parallel", families.data_parallel_masks(graph, spaces))
    dp_label = "-" if dp_choice is None else families.describe_choice(graph, spaces, dp_choice)
    found.append(("data_parallel", dp_label, dp_choice))
    best: tuple[float, str, np.ndarray] | None = None
    for dp, tp in families.uniform_degrees(devices):
        choice = choice_of(f"dp={dp} x tp={tp}", families.uniform_masks(graph, spaces, dp=dp, tp=tp))
        if choice is None:
            continue
        time_s = tables.evaluate(choice)[0]
        if best is None or time_s < best[0]:
            # Label what the choice does (ops may keep their non-batch dims whole, even all of them).
            best = (time_s, families.describe_choice(graph, spaces, choice), choice)
    found.append(("best_uniform", best[1] if best else "-", best[2] if best else None))
    trick = families.weird_trick_masks(graph, spaces)
    if trick is not None:
        found.append(("weird_trick", "conv dp, fc mp", choice_of("weird trick", trick)))
    if skipped and notes is not None:
        notes.append(
            f"search: baselines not priced (their exact DP would pass the time or memory left): {', '.join(skipped)}"
        )
    return found


def _fit_message(request: PlanRequest, smallest_bytes: float, limit_bytes: float) -> str:
    from planner.core.units import format_bytes

    if not np.isfinite(smallest_bytes) or not np.isfinite(limit_bytes) or limit_bytes <= 0:
        # no finite strategy at all (every configuration of some op is infeasible): no ratio to quote
        return f"no strategy of finite memory was found per device (limit {format_bytes(limit_bytes)}); try --zero 3, --recompute full or more devices"
    hints = []
    if request.settings.zero_stage < 3:
        hints.append("--zero 3")
    if request.settings.recompute != "full":
        hints.append("--recompute full")
    ratio = smallest_bytes / limit_bytes
    hints.append(f"about {max(2, int(np.ceil(ratio)))}x more devices")
    hints.append(f"a limit of at least {format_bytes(smallest_bytes)}")
    return (
        f"no strategy fits in {format_bytes(limit_bytes)} per device; the smallest needs "
        f"{format_bytes(smallest_bytes)}; try " + ", ".join(hints)
    )


def plan(
    graph: OpGraph,
    request: PlanRequest,
    *,
    progress: ProgressFn | None = None,
    target_filter: TargetFilter | None = None,
    import_time_s: float = 0.0,
    with_targets: bool = True,
    smaller: Mapping[int, tuple] | None = None,
) -> PlanResult:
    """Find the strategies of ``graph`` on the request's cluster (see :func:`_plan_one`).

    ``smaller``: device count -> ``(spaces, choice)``, the fastest plans found on fewer devices
    (:func:`plan_file` passes its earlier counts'); a degraded search starts from them, embedded
    (else it searches ``N / 8`` and ``N / 2`` itself, :func:`_smaller_mesh_seeds`).

    A Mixture-of-Experts model (``importers.moe``) is searched once per expert-parallel degree
    ``ep`` (:func:`objectives.moe.expert_degrees`; a request whose settings pin
    ``expert_parallel > 1`` searches that degree alone), each on its own cost tables, sharing the
    time limit; the result is the Pareto union of those points, each carrying its settings
    (``PlanPoint.settings``) and ``x ep=N`` in its summary. A dense model is one search.
    """
    from importers.moe import find_moe_layers
    from objectives.moe import expert_degrees

    request = target_priced(request, target_filter)  # priced as the target runs ZeRO-1/2 (Target.zero_sync)
    layers = find_moe_layers(graph) if request.cost_model != "pase" else ()
    degrees = expert_degrees(layers, request.cluster.devices)
    if request.settings.expert_parallel > 1 or len(degrees) == 1:
        result = _plan_one(graph, request, progress=progress, target_filter=target_filter,
                           import_time_s=import_time_s, with_targets=with_targets, smaller=smaller)
        return _with_ep(result, request.settings) if request.settings.expert_parallel > 1 else result
    share_s = request.time_limit_s / len(degrees)
    results = []
    for ep in degrees:
        one = dataclasses.replace(request, settings=dataclasses.replace(request.settings, expert_parallel=ep),
                                  time_limit_s=share_s)
        try:
            found = _with_ep(_plan_one(graph, one, progress=progress, target_filter=target_filter,
                                       import_time_s=import_time_s, with_targets=with_targets), one.settings)
        except InputError:
            if ep == 1:
                raise
            continue
        if ep > 1 and target_filter is not None:
            found = _runnable_by(found, getattr(target_filter, "target", None))
        if found.points:
            results.append(found)
    return _merge_ep(results, request)


def _with_ep(result: PlanResult, settings: TrainingSettings) -> PlanResult:
    """Points tagged with ``settings`` and, for ``ep > 1``, ``x ep=N`` after their degrees."""
    ep = settings.expert_parallel

    def tag(summary: str) -> str:
        if ep <= 1:
            return summary
        head, sep, tail = summary.partition(" (")
        head = f"ep={ep}" if head == "replicated" else f"{head} x ep={ep}"
        return head + sep + tail

    points = tuple(dataclasses.replace(p, settings=settings, summary=tag(p.summary)) for p in result.points)
    return dataclasses.replace(result, points=points)


def _merge_ep(results: list[PlanResult], request: PlanRequest) -> PlanResult:
    """The Pareto union of per-``ep`` results (baselines, spaces and context from ``ep=1``)."""
    from planner.search.pareto import pareto_mask

    base = results[0]
    pool = [p for r in results for p in r.points]
    times = np.array([p.strategy.time_s for p in pool])
    memories = np.array([p.strategy.memory_bytes for p in pool])
    keep = pareto_mask(times, memories) if pool else np.zeros(0, bool)
    fits = [p for p in pool if p.fits]
    picked = min(fits, key=lambda p: (p.strategy.time_s, p.strategy.memory_bytes)) if fits else None
    points = sorted((p for p, k in zip(pool, keep) if k or p is picked),
                    key=lambda p: (p.strategy.time_s, p.strategy.memory_bytes))
    chosen = next((i for i, p in enumerate(points) if p is picked), None)
    least = min(r.min_memory_bytes for r in results)
    return dataclasses.replace(
        base,
        request=request,
        points=tuple(points),
        chosen=chosen,
        message="" if chosen is not None else _fit_message(request, least, base.memory_limit_bytes),
        cost_time_s=sum(r.cost_time_s for r in results),
        search_time_s=sum(r.search_time_s for r in results),
        exact=all(r.exact for r in results),
        max_table_cells=max(r.max_table_cells for r in results),
        memory_bound_factor=None if any(r.memory_bound_factor is None for r in results)
        else max(r.memory_bound_factor for r in results),
        pick_proven=all(r.pick_proven for r in results),
        min_memory_bytes=least,
    )


def _plan_one(
    graph: OpGraph,
    request: PlanRequest,
    *,
    progress: ProgressFn | None = None,
    target_filter: TargetFilter | None = None,
    import_time_s: float = 0.0,
    with_targets: bool = True,
    smaller: Mapping[int, tuple] | None = None,
) -> PlanResult:
    """Find the strategies of ``graph`` on the request's cluster, at the request's settings.

    Parameters
    ----------
    graph:
        The imported model (:func:`load_graph`).
    request:
        Cluster, training settings, method, cost model, memory limit.
    progress:
        Called with ``(stage, fraction)`` as work proceeds.
    target_filter:
        Restricts the search to strategies a launch target can run (:data:`TargetFilter`): given
        the graph, the configuration spaces, the cluster and the training settings, returns one
        list of per-op masks per family of expressible strategies (e.g. one per ``dp x tp``); the
        result is the Pareto union of the searches over each family.
    import_time_s:
        Reported with the result.
    with_targets:
        Check which export targets can run each point (the table's "targets" column).

    Returns
    -------
    PlanResult
        Points sorted by step time; ``chosen`` is the fastest within the memory limit or ``None``
        with ``message`` saying what would fit. Deterministic: same input, same output.
    """
    report = progress or (lambda stage, fraction: None)
    budget = _budget(request)  # the time limit covers the whole plan, cost tables included
    report("cost", 0.0)
    started = time.perf_counter()
    model = build_model(graph, request)
    cost_time_s = time.perf_counter() - started
    report("search", 0.0)
    started = time.perf_counter()
    searched = _searched(graph, request, model, target_filter, budget, report, smaller)
    model = searched.model
    search_time_s = time.perf_counter() - started
    report("search", 1.0)

    limit = request.memory_limit_bytes or float(request.cluster.device.memory_bytes)
    started = time.perf_counter()
    choices, picked, pick = _picked(model.tables, request, searched, limit, budget, search_time_s)
    search_time_s += time.perf_counter() - started
    if picked is not None and not pick.proven:
        model = dataclasses.replace(model, notes=model.notes + (
            "the row picked is the fastest found within the memory limit; that no strategy is faster was not proven "
            "within the time left (raise --time-limit to prove it)",
        ))  # fmt: skip
    points, chosen, baselines, samples = _rows(graph, model, choices, searched.baselines, picked, limit)
    result = PlanResult(
        graph=graph,
        request=request,
        spaces=tuple(model.tables.configs),
        points=points,
        chosen=chosen,
        memory_limit_bytes=limit,
        baselines=baselines,
        message="" if chosen is not None else _fit_message(request, pick.min_memory_bytes, limit),  # proven minimum
        import_time_s=import_time_s,
        cost_time_s=cost_time_s,
        search_time_s=search_time_s,
        epsilon=searched.epsilon,
        exact=searched.exact,
        max_table_cells=searched.cells,
        order_name=searched.order_name,
        roofline_fallbacks=model.fallback_configs,
        memory_bound_factor=_bound_factor(searched.found, searched.family_masks),
        pick_proven=pick.proven,
        pick_proof=pick.proof,
        min_memory_bytes=pick.min_memory_bytes,
        samples_per_step=samples,
        cost=model,
    )
    if not with_targets:
        return result
    report("checking export targets", 0.0)
    return _with_targets(result)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Searched:
    """What the search step of :func:`_plan_one` hands to the pick: the listed choices and how they
    were found."""

    model: object
    """The cost model, its notes extended with the search's."""
    choices: list
    epsilon: float
    exact: bool
    cells: int
    order_name: str
    baselines: list[tuple[str, str, np.ndarray | None]]
    family_masks: list[list[np.ndarray]] | None
    found: dict
    """``"frontier"`` / ``"fastest_s"`` proven on the full tables (see :func:`_search`)."""


def _searched(
    graph: OpGraph, request: PlanRequest, model, target_filter, budget, report: ProgressFn, smaller: Mapping[int, tuple] | None = None
) -> _Searched:
    """The baselines, then the search (the target's families, when restricted), within the budget
    less the share kept for the pick; inexact results thinned to :data:`_MAX_INEXACT_ROWS`."""
    tables = model.tables
    found: dict = {}
    family_masks = None if target_filter is None else target_filter(graph, tables.configs, request.cluster, request.settings)
    search_notes: list[str] = []
    deadline_s = budget.deadline_s - _AFTER_SEARCH_SHARE * request.time_limit_s
    # the baselines first (exact searches over few configurations each): a degraded search keeps
    # their configurations and lists them, so it never returns less than a framework's own layout
    baselines_found = _baselines(
        graph, tables, request.cluster.devices, budget=budget, notes=search_notes,
        deadline_s=min(deadline_s, time.perf_counter() + _BASELINE_SHARE * request.time_limit_s),
    )  # fmt: skip
    if family_masks is None:
        seeds = np.array([c for _n, _l, c in baselines_found if c is not None], dtype=np.int64).reshape(-1, len(graph.ops))
        choices, epsilon, exact, cells, order_name = _search(
            tables, request, report, found, budget=budget, deadline_s=deadline_s, notes=search_notes, seeds=seeds,
            op_names=[op.name for op in graph.ops], more_seeds=_smaller_mesh_seeds(graph, request, tables, smaller),
        )
        if not exact and request.method in ("dp", "frontier") and search_notes:
            choices = [*choices, *seeds]  # degraded: real strategies, possibly better than what it found
    else:
        choices, epsilon, exact, cells, order_name = _search_families(
            tables, request, family_masks, budget=budget, deadline_s=deadline_s, notes=search_notes
        )
        if not choices:
            raise InputError(_no_target_strategy(graph, request, target_filter))
    if not exact and len(choices) > _MAX_INEXACT_ROWS:
        choices = _thin(tables, choices, _MAX_INEXACT_ROWS, search_notes, found)
    if search_notes:
        model = dataclasses.replace(model, notes=model.notes + tuple(dict.fromkeys(search_notes)))
    return _Searched(
        model=model, choices=choices, epsilon=epsilon, exact=exact, cells=cells, order_name=order_name,
        baselines=baselines_found, family_masks=family_masks, found=found,
    )  # fmt: skip


def _picked(tables: CostTables, request: PlanRequest, searched: _Searched, limit: float, budget, search_time_s: float):
    """The exact pick within ``limit`` (:func:`_exact_pick`), its proof bounded by the time left:
    half the share kept after the search, and at most as long as the search took (10 s at least)."""
    from planner.search.degrade import FRONTIER_WORK_PER_S

    # the proof's work fits in the time left (--time-limit): past it the pick stays, unproven
    pick_deadline_s = budget.deadline_s - 0.5 * _AFTER_SEARCH_SHARE * request.time_limit_s
    # and at most as long as the search took (10 s at least): a proof that needs far more (a limit
    # in a non-convex stretch of a large frontier) is not worth multiplying the wait
    pick_deadline_s = min(pick_deadline_s, time.perf_counter() + max(_PICK_MIN_S, search_time_s))
    work_cap = FRONTIER_WORK_PER_S * max(0.0, pick_deadline_s - time.perf_counter())
    return _exact_pick(
        tables, searched.choices, limit, searched.found, searched.family_masks, work_cap=work_cap,
        deadline_s=pick_deadline_s, max_memory_bytes=budget.memory_left_bytes(),
    )  # fmt: skip


def _rows(graph: OpGraph, model, choices, baselines_found, picked, limit: float):
    """The table's rows (sorted by step time, then memory), the index of ``picked`` among them, the
    baselines as rows, and the samples per step the throughput is counted in."""
    tables = model.tables
    samples = _samples_from_inputs(graph) or samples_per_step(graph)
    dp_choice = baselines_found[0][2]
    dp_time_s = tables.evaluate(dp_choice)[0] if dp_choice is not None else float("nan")

    def point(choice: Sequence[int]) -> PlanPoint:
        # with its copies, so its public form names its rows (evaluate(graph, request, strategy))
        copies = public_form([op.name for op in graph.ops], tables.configs, choice).replicas
        strategy = dataclasses.replace(model.strategy(choice), replicas=copies)
        devices_used = max(
            (int(space.devices_held[row]) for space, row in zip(tables.configs, strategy.choice)), default=1
        )
        return PlanPoint(
            strategy=strategy,
            samples_per_s=samples / strategy.time_s if strategy.time_s > 0 else float("inf"),
            speedup_vs_dp=dp_time_s / strategy.time_s if strategy.time_s > 0 else float("nan"),
            devices_used=devices_used,
            fits=strategy.memory_bytes <= limit,
            summary=families.describe_choice(graph, tables.configs, strategy.choice),
        )

    points = sorted((point(c) for c in choices), key=lambda p: (p.strategy.time_s, p.strategy.memory_bytes))
    picked_key = None if picked is None else tuple(int(x) for x in picked)
    chosen = next((i for i, p in enumerate(points) if tuple(p.strategy.choice) == picked_key), None)
    baselines = tuple(
        Baseline(name=name, label=label, point=None if choice is None else point(choice))
        for name, label, choice in baselines_found
    )
    return tuple(points), chosen, baselines, samples


_PICK_MIN_S = 10.0


def _bound_factor(found: dict, family_masks) -> float | None:
    """The frontier's memory bound factor (``None``: no bound; 1.0 for the exact DP pair)."""
    frontier = found.get("frontier")
    if family_masks is not None:
        return None  # a union of restricted searches: each family's bound is its own
    if frontier is None:  # the exact DP pair, or a degraded search that claims nothing
        return 1.0 if "fastest_s" in found else None
    if frontier.memory_bound_factor is None:
        return None
    # rows thinned after the search (_thin) cover its points within their own factor: the two multiply
    return frontier.memory_bound_factor * found.get("thinned_factor", 1.0)


def _exact_pick(
    tables: CostTables,
    choices: list,
    limit: float,
    found: dict,
    family_masks,
    *,
    work_cap: float = _FRONTIER_MAX_WORK,
    deadline_s: float | None = None,
    max_memory_bytes: float | None = None,
):
    """The fastest choice within ``limit``, proven (:func:`planner.search.constrained.fastest_within_exact`),
    added to ``choices`` when the search did not list it (listed choices it dominates are dropped:
    the list stays a Pareto set). With target families, the best over the families' own problems.

    Returns ``(choices, picked choice or None, ConstrainedPick)``.
    """
    from planner.search.constrained import ConstrainedPick, fastest_within_exact
    from planner.search.restrict import restrict

    frontier = found.get("frontier")
    lower = found.get("fastest_s")
    hull = frontier is not None and frontier.method == "hull"
    if hull and frontier.points:
        lower = min(p.time_s for p in frontier.points)  # the hull's first vertex is the exact DP minimum
    listed = np.array(choices, dtype=np.int64).reshape(-1, tables.num_ops)
    if family_masks is None:
        pick = fastest_within_exact(
            tables, limit, frontier=frontier, candidates=listed, time_lower_bound_s=lower,
            max_work=min(work_cap, _FRONTIER_MAX_WORK / 10 if hull else _FRONTIER_MAX_WORK), deadline_s=deadline_s,
            max_memory_bytes=max_memory_bytes,
        )  # fmt: skip
        picked = None if pick.point is None else pick.point.choice
    else:
        families_used = [masks for masks in family_masks if all(m.any() for m in masks)]
        best, proven, least = None, True, float("inf")
        for masks in families_used:
            restricted = restrict(tables, masks)
            inside = np.all([m[listed[:, i]] for i, m in enumerate(masks)], axis=0) if len(listed) else []
            # original index -> restricted index: the rank of the row among the family's rows
            ranks = [np.cumsum(m) - 1 for m in masks]
            own = np.array([[ranks[i][c] for i, c in enumerate(row)] for row in listed[inside]], dtype=np.int64)
            one = fastest_within_exact(
                restricted.tables, limit, candidates=own, max_work=min(work_cap, _FRONTIER_MAX_WORK) / max(1, len(families_used)),
                deadline_s=deadline_s,
            )
            proven &= one.proven
            least = min(least, one.min_memory_bytes)
            if one.point is not None:
                candidate = restricted.to_original(one.point.choice)
                key = tables.evaluate(candidate)
                if best is None or key < best[0]:
                    best = (key, candidate)
        picked = None if best is None else best[1]
        pick = ConstrainedPick(
            memory_limit_bytes=limit,
            point=None,
            min_memory_bytes=least,
            proven=proven,
            proof=("pruned exact elimination" if best is not None else "no strategy fits") if proven else "not proven",
        )
    if picked is not None and not any(np.array_equal(picked, c) for c in listed):
        choices = [*choices, np.asarray(picked, dtype=np.int64)]
    if family_masks is None and len(choices) > 1:
        # one Pareto set, on the values the rows show (``dp`` lists its fastest and least-memory
        # optima, and the fastest may tie in time with more memory; a found pick may dominate rows)
        from planner.search.pareto import pareto_mask
        from planner.search.problem import evaluate_many

        times, memories = evaluate_many(tables, np.stack(choices))
        keep = pareto_mask(times, memories)
        choices = [c for c, k in zip(choices, keep) if k or (picked is not None and np.array_equal(c, picked))]
    return choices, picked, pick


def _search_families(
    tables: CostTables,
    request: PlanRequest,
    families_masks: list[list[np.ndarray]],
    *,
    budget=None,
    deadline_s: float | None = None,
    notes: list[str] | None = None,
):
    """Search each family of restricted tables and keep the Pareto union of their points.

    The families share the budget: each gets an equal share of the time left when it starts."""
    from planner.search.pareto import pareto_mask
    from planner.search.restrict import restrict

    budget = budget if budget is not None else _budget(request)
    deadline = budget.deadline_s if deadline_s is None else deadline_s
    usable = [masks for masks in families_masks if all(m.any() for m in masks)]
    choices: list[np.ndarray] = []
    exact, cells, epsilon, order_name = True, 0, 0.0, ""
    for position, masks in enumerate(usable):
        restricted = restrict(tables, masks)
        share = (deadline - time.perf_counter()) / (len(usable) - position)
        found, epsilon, family_exact, family_cells, order_name = _search(
            restricted.tables, request, budget=budget, deadline_s=time.perf_counter() + share, notes=notes
        )
        exact &= family_exact
        cells = max(cells, family_cells)
        choices.extend(restricted.to_original(c) for c in found)
    if not choices:
        return [], epsilon, exact, cells, order_name
    values = np.array([tables.evaluate(c) for c in choices])
    keep = pareto_mask(values[:, 0], values[:, 1]) if request.method != "dp" else np.ones(len(choices), bool)
    unique: dict[tuple[int, ...], np.ndarray] = {}
    for c, k in zip(choices, keep):
        if k:
            unique.setdefault(tuple(int(x) for x in c), c)
    return list(unique.values()), epsilon, exact, cells, order_name
