r"""The main answer of ``planner plan``: the frontier of plans a launcher runs, priced as it runs them.

One search space: per-op splits inside a stage (each launcher's ``dp x tp`` families), pipeline
stages and their cuts, micro-batch, ZeRO stage, recomputation and, for a Mixture-of-Experts model,
expert parallelism. The plain per-op plan is its ``pp = 1`` case; the model's batch is the global
batch (``--global-batch`` overrides it).

How a row is found and priced:

* For each registered launcher (:data:`exporters.targets.TARGETS`) that can run the model
  (:func:`planner.plan.target_refusal`), the pipeline search (:func:`planner.pipeline.pipeline_search`)
  runs restricted to its families and settings rules, on a cost model priced under the launcher's
  execution model (its :attr:`~exporters.targets.Target.execution`: fused kernels and flash attention
  for Megatron-LM and DeepSpeed, eager PyTorch with SDPA for DTensor plans, XLA-fused with explicit
  scores for Mesh-TF, explicit scores for an ALiBi model under every launcher,
  :func:`objectives.execution.model_attention`; ``--engine`` / ``--attention`` override all). Launchers that share an
  execution model share one :class:`~planner.pipeline.PipelineCostCache`, which keeps its stage
  models between their searches when the model's states fit a device. Each search is seeded with
  the points found before it (a combination they provably dominate is skipped: the union's
  frontier is unchanged) and gets an equal share of the time left; the order of launchers and of
  pipeline sizes only decides what a search stopped by the time limit has seen
  (:func:`_launchers`, :func:`planner.launcher_options.pipeline_order`).
* A row lists the launchers that run it *as priced*: those whose execution model is the row's and
  whose rules accept it (:func:`planner.pipeline.pipeline_targets`, the exporters' own rules; no
  exporter runs).
* The rows are the Pareto union of every launcher's points; ``*`` is the fastest within the limit, or a
  row within 0.01% of it on fewer devices, less model parallelism or less memory (:mod:`planner.pick`).
* Headroom: the same search with no launcher's restriction (the generic per-op plan, priced with the
  fused/flash model) says how much faster a plan no launcher runs would be.
* Baseline: pure data parallelism (``tp = pp = 1``, the whole per-rank batch in one micro-batch,
  ZeRO-0) priced by :func:`planner.estimate.estimate` under the pick's execution model, so ``vs DP``
  compares like with like. It is a row too, where the search space holds it, priced per launcher under its
  memory rules (:mod:`planner.baseline_rows`), and seeds the searches: a stopped search never picks slower.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from exporters import PlanInput, export, listed_elsewhere
from exporters.targets import target as find_target
from objectives.execution import ExecutionModel
from planner.core.cluster import Cluster
from planner.core.configs import divisors
from planner.core.degrees import Degrees, Pins
from planner.core.errors import InputError, UnsupportedExport
from planner.core.graph import OpGraph
from planner.core.units import format_bytes, format_seconds
from planner.coupling import coupled_options, coupling_note, require_samples
from planner.pipeline import (
    FixedBatchLoader,
    GraphLoader,
    PipelineCostCache,
    PipelineOptions,
    PipelinePoint,
    PipelineResult,
    WholeGraphLoader,
    graph_loader,
    pipeline_targets,
    point_plan_input,
    target_rules,
)
from planner.launch_listing import Listing, collapse_rows
from planner.launch_listing import described as _described  # planner.research lists its rows with it
from planner.launch_listing import differences as _differences  # noqa: F401  (tests compare two rows' words)
from planner.launch_listing import family_of as _family_of
from planner.launch_messages import SearchStop, fit_message, pinned_refusal, stop_note, tight_pick, tight_note
from planner.pick import PICK_TIE, row_label, tie_pick
from planner.launcher_options import (
    alibi_note, context_split,
    check_expert_pin,
    check_hsdp_pin,
    hsdp_rules,
    hybrid_groups,
    hsdp_sizes,
    launcher_execution,
    graph_split,
    launcher_autocasts,
    launcher_jobs,
    launcher_p2p_overlap,
    pinned_options,
    replays_cuda_graphs,
    pinned_rules,
    pipeline_order,
    precision_pairs,
    states_exceed_a_device,
)
from planner.baseline_rows import baseline_searched, data_parallel_point, data_parallel_points, launcher_pricing_rules
from planner.host_bound import host_bound as step_host_bound
from planner.plan import PlanRequest, refuse_export, target_refusal
from planner.pricing import measured_lookup
from planner.repriced import Repriced, execution_label, load_saved, load_saved_pair, priced_label, reprice_saved
from planner.search.budget import PlanDeadline
from planner.search.pareto import TIME_TIE, pareto_mask
from planner.search.pipeline import search_memory_rules, search_pipeline, tie_group
from planner.search.solve_clock import LoadWindow, measured_from

__all__ = [
    "Row",
    "Headroom",
    "LaunchFrontier",
    "collapse_rows",
    "execution_label",
    "launch_frontier",
    "plan_launchable_file",
    "row_plan_input",
    "export_row",
    "FixedBatch",
    "batch_is_fixed",
    "Repriced",
    "reprice_saved",
    "load_saved",
    "load_saved_pair",
]

ProgressFn = Callable[[str, float], None]

OFFLOADED = ("optimizer", "activations", "parameters")
"""The CPU offload modes searched when no plan fits without (``objectives.offload``)."""


class FixedBatch(InputError):
    """The model's batch is a number in the file: no micro-batch or pipeline can vary it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One plan of the launchable frontier."""

    point: PipelinePoint
    """The plan: stages, per-op splits, micro-batching, ZeRO, recomputation, time and memory."""
    cache: PipelineCostCache
    """The graphs and cost models it was priced with (its settings carry the execution model)."""
    degrees: Degrees
    """Its degrees, as the launchers read them."""
    targets: tuple[str, ...]
    """The launchers that run it exactly as priced (registry order)."""
    layout: str = ""
    """Its launch layout in the first launcher's words (``"dp=8 x tp=2 sp"``: sequence parallel)."""
    differs: str = ""
    """How it differs from the row above (``"ZeRO-1 -> 2"``, ``"sp"``, ``"3 ops placed otherwise"``)."""
    plan_input: PlanInput | None = None
    """The exporters' input where it is no pipeline plan (a point of the per-op research search,
    ``planner.research``: saved without a pipeline section, `explain` prices it per op); ``None``: ``point``'s."""

    @property
    def host_bound(self) -> bool:
        """Whether its step is set by the host floor, not its devices (:func:`planner.host_bound.host_bound`)."""
        return step_host_bound(self.point, self.cache)

    @property
    def execution(self) -> ExecutionModel | None:
        settings = self.cache.settings
        return None if settings.engine is None else ExecutionModel(engine=settings.engine, attention=settings.attention or "flash",
                                                                   dropout=settings.dropout)

    @property
    def priced_as(self) -> str:
        """The execution model it is priced under, e.g. ``"fused+flash"`` (``+no-overlap``: priced
        with ``--no-overlap``)."""
        return priced_label(self.execution, self.cache.settings)

    @property
    def time_s(self) -> float:
        return self.point.time_s

    @property
    def memory_bytes(self) -> float:
        return self.point.memory_bytes

    @property
    def fits(self) -> bool:
        return self.point.fits

    @property
    def summary(self) -> str:
        """E.g. ``"pp=2 x dp=4 x tp=2, mb=2 x 4, ZeRO-1, recompute selective"``; a per-op layout that splits
        an op wider than its degrees say names its layout and devices (``"m:8 vocab:m, 8 devices, mb=16 x 1,
        ZeRO-0"``: :func:`planner.pick.row_label`), as the pick's note does."""
        point = self.point
        text = f"{row_label(self)}, mb={point.micro_batch} x {point.micro_batches}, ZeRO-{point.zero_stage}"
        text = text if self.cache.settings.dp_shard is None else f"{text} (hsdp {self.cache.settings.dp_shard})"
        text = text if self.cache.settings.hpz_partition is None else f"{text} (hpz {self.cache.settings.hpz_partition})"
        reshard = self.cache.settings.reshard_after_forward  # FSDP2's policy, where pinned
        text = text if reshard == "default" or point.zero_stage != 3 else f"{text}, reshard {reshard}"
        text = text if point.recompute == "none" else f"{text}, recompute {point.recompute}"
        return text if self.offload == "none" else f"{text}, offload {self.offload}"

    @property
    def offload(self) -> str:
        """What it keeps in host memory (``TrainingSettings.offload``, :mod:`objectives.offload`)."""
        return self.cache.settings.offload


@dataclass(frozen=True, slots=True, kw_only=True)
class Headroom:
    """The fastest plan that fits when no launcher's rules restrict the search."""

    time_s: float
    memory_bytes: float
    summary: str
    execution: str
    cuda_graphs: bool = False
    """Priced with CUDA graphs (``TrainingSettings.cuda_graphs``), as the fastest row it is compared with was
    (:func:`_headroom`); ``graph_scope``: what they capture (``TrainingSettings.cuda_graph_scope``)."""
    graph_scope: str = "step"


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchFrontier:
    """The launchable frontier on one cluster."""

    cluster: Cluster
    rows: tuple[Row, ...]
    """Pareto-optimal in (time, memory) over every launcher's plans, fastest first."""
    chosen: int | None
    """The pick: the fastest row within the memory limit or one tied with it (:func:`planner.pick.tie_pick`; ``None``: none fits)."""
    fastest: int | None = None
    """The exact fastest row within the limit where it is not the pick (``None``: the pick is it)."""
    memory_limit_bytes: float
    global_batch: int
    launchers: tuple[str, ...]
    """The launchers searched (those that can run the model)."""
    refused: tuple[tuple[str, str], ...] = ()
    """``(launcher, reason)`` for each launcher that cannot run the model at all."""
    headroom: Headroom | None = None
    baseline: Row | None = None
    """Pure data parallelism under the pick's execution model (``None``: not priceable here)."""
    message: str = ""
    notes: tuple[str, ...] = ()
    collapse: float = 0.0
    """Rows within this relative tolerance of a listed row in both time and memory were merged into it."""
    collapsed: int = 0
    """How many rows that merged."""
    search_time_s: float = 0.0
    combinations: int = 0
    intra_op_searches: int = 0
    extras: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """What a search adds beyond the table, written to JSON as ``"extras"`` (the research search's
    method, epsilon, bound and baselines: ``planner.research``); empty for the launchable search."""
    listing: Listing | None = None
    """The uncollapsed Pareto rows the table is listed from: :func:`collapse_rows` lists them at another
    ``--collapse`` without a search (``None``: ``planner.research``'s frontier, or nothing searched)."""

    @property
    def best(self) -> Row | None:
        return None if self.chosen is None else self.rows[self.chosen]

    @property
    def fastest_row(self) -> Row | None:
        """The exact optimum: the fastest row within the limit (the pick, or the row it tied with)."""
        return self.best if self.fastest is None else self.rows[self.fastest]

    def speedup_vs_dp(self, row: Row) -> float | None:
        """The data-parallel baseline's step time over ``row``'s (``None`` without a baseline)."""
        if self.baseline is None or row.time_s <= 0:
            return None
        return self.baseline.time_s / row.time_s


# --------------------------------------------------------------------------------------------
# the search


@dataclass(slots=True, kw_only=True)
class _Searches:
    """The caches (one per execution model and ``ep``) and the counters of one cluster's searches."""

    loader: GraphLoader
    request: PlanRequest
    caches: dict[tuple, PipelineCostCache] = dataclasses.field(default_factory=dict)
    combinations: int = 0
    intra_op_searches: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    stops: list[SearchStop] = dataclasses.field(default_factory=list)
    """The searches the time limit stopped: one note for all (:func:`planner.launch_messages.stop_note`)."""
    stops_at: int | None = None
    """Where among ``notes`` the first stop happened (the stop note goes there)."""
    measured: Any = None
    """``--cost measured``: the profile's timing function, opened once for every cache."""
    deadline_s: float = float("inf")
    """``deadline.clock()`` value by which every search should end (``--time-limit``; the offload search's may be later)."""
    deadline: PlanDeadline | None = None
    """The plan's deadline: its clock, the phases' seconds and what the limit cut (``None``: ``time.perf_counter``, untimed)."""
    priced_sync: dict = dataclasses.field(default_factory=dict)  # every cache's (one cluster): PipelineCostCache(priced_sync=)
    load: LoadWindow = dataclasses.field(default_factory=LoadWindow.now)
    """Where the searches' DPs read the machine's load from (:func:`planner.search.solve_clock.measured_from`)."""
    context: Any = None  # every cache's sequence split across nodes: PipelineCostCache(context=), launcher_options.context_split
    keep_models: bool = True
    """Keep each cache's stage models between searches (faster); ``False`` for models whose states
    exceed a device, whose stage models over many pipeline sizes would pass the planner's memory
    (GPT-3 175B at 1,024 devices: 8.3 GB kept against 3.2 GB released)."""

    def share(self, options: PipelineOptions, weight: float, left_weight: float) -> PipelineOptions:
        """``options`` with this search's share of the time still left: ``weight`` of the
        ``left_weight`` of the searches still to run, itself included (time an earlier search saved
        goes to the rest)."""
        fraction = weight / left_weight if left_weight > 0 else 1.0
        return dataclasses.replace(options, time_limit_s=max(_LEAST_SHARE_S, (self.deadline_s - self.now()) * fraction))

    def now(self) -> float:
        """The deadline's clock now (seconds)."""
        return self.deadline.clock() if self.deadline is not None else time.perf_counter()

    def phase(self, name: str, *, cuttable: bool = True) -> contextlib.AbstractContextManager:
        """:meth:`PlanDeadline.phase` of the plan's deadline (nothing is timed without one)."""
        return self.deadline.phase(name, cuttable=cuttable) if self.deadline is not None else contextlib.nullcontext()

    def cache(self, execution: ExecutionModel | None, ep: int, precision: tuple[str, str | None] | None = None,
              offload: str = "none", dp_shard: int | None = None, cuda_graphs: bool | None = None,
              autocast: bool | None = None, p2p_overlap: bool | None = None, hpz: int | None = None) -> PipelineCostCache:
        """The cache of one execution model, ``ep``, ``precision`` (``(precision, fp8 recipe)``;
        ``None``: the request's), CPU offload mode, HSDP shard group, CUDA-graph replay (``None``: the
        request's; :func:`planner.launcher_options.launcher_cuda_graphs`) and eager autocast (``None``: the request's;
        :func:`planner.launcher_options.launcher_autocast`) and interleaved transfers (``None``: the request's;
        :func:`planner.launcher_options.launcher_p2p_overlap`) and ZeRO++'s hpZ group (``hpz``: DeepSpeed's analogue of
        the HSDP shard group, ``TrainingSettings.hpz_partition``), built on first use."""
        graphs = self.request.settings.cuda_graphs if cuda_graphs is None else cuda_graphs
        autocast = self.request.settings.autocast if autocast is None else autocast
        precision = precision or (self.request.settings.precision, self.request.settings.fp8)
        key = (execution, ep) if precision == (self.request.settings.precision, self.request.settings.fp8) else (
            execution, ep, precision)
        key = key if offload == "none" else (*key, "offload", offload)
        key = key if dp_shard is None else (*key, "hsdp", dp_shard)
        key = key if hpz is None else (*key, "hpz", hpz)
        key = key if graphs == self.request.settings.cuda_graphs else (*key, "cuda_graphs", graphs)
        key = key if autocast == self.request.settings.autocast else (*key, "autocast", autocast)
        p2p = self.request.settings.p2p_overlap if p2p_overlap is None else p2p_overlap
        key = key if p2p == self.request.settings.p2p_overlap else (*key, "p2p_overlap", p2p)
        if key not in self.caches:
            from exporters.targets import TARGETS  # the recipe's launcher gathers FP8 weights in FP8 (Target.fp8_param_gather)

            gathers = precision[1] is not None and any(t.fp8 == precision[1] and t.fp8_param_gather for t in TARGETS.values())
            settings = dataclasses.replace(
                self.request.settings, engine=execution and execution.engine,
                attention=execution and execution.attention, expert_parallel=ep,
                dropout=execution is not None and execution.dropout, precision=precision[0], fp8=precision[1],
                offload=offload, dp_shard=dp_shard, hpz_partition=hpz, fp8_param_gather=gathers, cuda_graphs=graphs, autocast=autocast,
                p2p_overlap=p2p,
            )  # fmt: skip
            from importers.moe import find_moe_layers

            self.caches[key] = PipelineCostCache(
                self.loader, cluster=self.request.cluster, settings=settings, cost_model=self.request.cost_model,
                measured=self.measured, moe_layers=find_moe_layers, priced_sync=self.priced_sync, context=self.context,
            )  # fmt: skip
            # launchers of one execution model search the same stage models: build each once
            self.caches[key].keep = self.keep_models
        return self.caches[key]

    def run(self, cache: PipelineCostCache, options: PipelineOptions, rules, report: ProgressFn,
            seeds: Sequence[tuple[float, float]] = (), *, informs: bool = False) -> PipelineResult:
        with self.phase("headroom search" if informs else "searches"), measured_from(self.load):
            result = search_pipeline(cache, options=options, memory_limit_bytes=self.request.memory_limit_bytes,
                                     progress=report, rules=rules, seeds=seeds, informs=informs)  # fmt: skip
        who = "the headroom search" if rules is None else rules.name
        if result.unsearched_sizes:
            if self.deadline is not None:
                self.deadline.mark_cut("the headroom search" if informs else "the searches (past it each stops once a plan is found)")
            self.stops_at = len(self.notes) if self.stops_at is None else self.stops_at
            self.stops.append(SearchStop(who, options.time_limit_s, result.unsearched_sizes))
        self.combinations += result.combinations
        self.intra_op_searches += result.intra_op_searches
        self.notes += [f"{who}: {note}" for note in result.notes if "heuristic" in note]
        return result

    def all_notes(self) -> tuple[str, ...]:
        """``notes`` with one line for the searches the time limit stopped, where the first stopped."""
        if not self.stops:
            return tuple(self.notes)
        return (*self.notes[:self.stops_at], stop_note(self.stops), *self.notes[self.stops_at:])


def _launcher_rows(result: PipelineResult, launcher: str, execution: ExecutionModel | None, ep: int,
                   same_execution: Sequence[str]) -> list[Row]:
    """The points of ``launcher``'s search that it runs, each with every launcher of the same
    execution model that runs it too."""
    if not result.points:
        return []
    targets = pipeline_targets(result)
    rows, memo = [], {}
    for point, names in zip(result.points, targets):
        runners = tuple(name for name in names if name in same_execution)
        if launcher not in runners:
            continue  # a rule that depends on the stage cut (interleaving) refused it
        # the point reads (dp, cp x tp) off its splits; the family that holds it says how many of the
        # non-batch ways split the sequence (context parallelism)
        family = _family_of(point, runners, result.cache.cluster.devices_per_node, memo)
        if family is None and launcher == "generic":
            degrees = _per_op_degrees(point, ep)
        else:
            cp = family.cp if family is not None else 1
            degrees = Degrees(dp=point.dp, tp=point.tp // cp, cp=cp, pp=point.pp, ep=ep)
        rows.append(Row(point=point, cache=result.cache, degrees=degrees, targets=runners))  # type: ignore[arg-type]
    return rows


def _per_op_degrees(point: PipelinePoint, ep: int) -> Degrees:
    """A per-op plan's degrees as the ops of the most FLOPs split (:func:`planner.families.dominant_degrees`):
    a sequence split is ``cp``, never ``tp``."""
    from planner.families import dominant_degrees

    dominant = dominant_degrees(point.graph, point.spaces, point.choice)
    dp, tp, cp, _ = dominant[0] if dominant is not None else (point.dp, point.tp, 1, 1)
    return Degrees(dp=dp, tp=tp, cp=cp, pp=point.pp, ep=ep)


def _row_key(row: Row) -> tuple:
    point = row.point
    return (row.priced_as, row.degrees, point.micro_batch, point.micro_batches, point.zero_stage, point.recompute,
            point.schedule, point.chunks, tuple(s.layers for s in point.stages), tuple(point.choice), row.offload,
            row.cache.settings.dp_shard, point.zero3_gather, point.sequence_shard_saved, point.fused_swiglu,
            point.grad_accumulator_bytes, point.zero_sync, row.cache.settings.cuda_graphs, row.cache.settings.autocast)  # two rows


def _pareto_rows(rows: Sequence[Row]) -> list[Row]:
    """The Pareto-optimal rows (the same plan found by several launchers: one row naming them all),
    fastest first, times within :data:`~planner.search.pareto.TIME_TIE` equal between rows on as many devices
    and model-parallel ways (a row as fast with more memory is dominated, whatever ``--collapse``; across
    those groups exactly, so the pick's own order among tied rows, :func:`planner.pick.tie_pick`, decides)."""
    merged: dict[tuple, Row] = {}
    for row in rows:
        key = _row_key(row)
        if key in merged:
            names = set(merged[key].targets) | set(row.targets)
            row = dataclasses.replace(merged[key], targets=tuple(n for n in _registry_order() if n in names))
        merged[key] = row
    pool = sorted(merged.values(), key=lambda r: (r.time_s, r.memory_bytes))
    if not pool:
        return []
    groups = np.unique([tie_group(r.point) for r in pool], axis=0, return_inverse=True)[1].reshape(-1)
    keep = pareto_mask(np.array([r.time_s for r in pool]), np.array([r.memory_bytes for r in pool]), time_tie=TIME_TIE,
                       tie_groups=groups)  # fmt: skip
    return [row for row, kept in zip(pool, keep) if kept]


def _expert_degrees(graph: OpGraph, request: PlanRequest, pins: Pins) -> list[int]:
    from importers.moe import find_moe_layers
    from objectives.moe import expert_degrees

    check_expert_pin(graph, pins)
    if pins.ep is not None:
        return [pins.ep]
    layers = find_moe_layers(graph) if request.cost_model != "pase" else ()
    return expert_degrees(layers, request.cluster.devices)


_SEARCH_FIRST = ("deepspeed", "dtensor", "meshtf")
"""Launchers searched before the others: their searches are cheap (DeepSpeed's families are one
plan each, DTensor's and Mesh-TF's have no pipelines) and their points seed, so prune, the later
ones; the frontier is the same in any order (seeds never drop a Pareto point). On GPT-2 at 16
devices this order takes 12.1 s of CPU against 14.6 s in registry order (profiled)."""


def _framework_targets() -> tuple[str, ...]:
    """The launchers of the registry as it is now (:data:`exporters.targets.TARGETS`, registry order):
    a launcher registered after import is searched and listed too."""
    from exporters.targets import TARGETS

    return tuple(name for name, entry in TARGETS.items() if entry.restricts)


def _registry_order() -> tuple[str, ...]:
    """Every launch target's name in registry order (``generic`` first)."""
    from exporters.targets import TARGETS

    return tuple(TARGETS)


def _launchers(graph: OpGraph, request: PlanRequest, launchers: Sequence[str] | None,
               attention: str | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """The launchers to search and ``(launcher, reason)`` for those that cannot run the model, or the attention
    kernel ``--attention`` names (``attention``; :attr:`exporters.targets.Target.attention_kernels`). Cheap
    searches first (:data:`_SEARCH_FIRST`), except for a model whose states do not fit one device
    (:func:`~planner.launcher_options.states_exceed_a_device`): there the time limit, not the
    pruning, decides what is seen, and the registry's order (Megatron-LM first, whose pipelines
    such models need) gets it first."""
    names = list(launchers) if launchers is not None else _framework_targets()
    if launchers is None and not states_exceed_a_device(graph, request):
        names = sorted(names, key=lambda n: _SEARCH_FIRST.index(n) if n in _SEARCH_FIRST else len(_SEARCH_FIRST))
    usable, refused = [], []
    for name in names:
        found = find_target(name)
        kernels = found.attention_kernels or ()
        reason = (target_refusal(graph, request.cluster, request.settings, name) if found.runs_attention(attention)
                  else f"it runs no {attention} attention (its kernels: {', '.join(kernels)}); plan with --attention "
                       f"{' / '.join(kernels)}")
        reshard = request.settings.reshard_after_forward  # a pinned FSDP2 policy: its launchers alone (Target.fsdp_reshard)
        if reason is None and reshard != "default" and found.restricts and not found.fsdp_reshard:
            reason = f"it sets no FSDP2 reshard_after_forward (--fix reshard={reshard}; torchtitan and dtensor do)"
        (refused.append((name, reason)) if reason is not None else usable.append(name))
    return usable, refused


def _headroom(searches: _Searches, execution: ExecutionModel | None, options: PipelineOptions,
              report: ProgressFn, fastest: Row | None, limit_bytes: float, pinned_graphs: str | None = None) -> Headroom | None:
    """The fastest plan that fits with no launcher's restriction, under ``execution``, when it is
    faster than the fastest row (``fastest``; ``None``: nothing launchable fits); ``None`` otherwise. Only
    such plans are searched for (:func:`_headroom_seeds`); none past the deadline (it only informs).
    Priced with the CUDA-graph replay of the row it is compared with: a row priced as one captured graph per
    micro-batch (torchtitan at ``pp = 1``) is compared with per-op plans so priced at ``pp = 1`` and without at
    ``pp > 1`` (:func:`~planner.launcher_options.graph_split`; ``--fix cuda_graphs``, ``pinned_graphs``: the
    request's setting throughout)."""
    if _past(searches, "the headroom search"):
        return None
    pick_s = fastest.time_s if fastest is not None else None
    seeds = _headroom_seeds(pick_s, limit_bytes)
    replayed = fastest is not None and fastest.cache.settings.cuda_graphs and pinned_graphs is None
    jobs = graph_split(options, searches.request.cluster.devices) if replayed else [(None, options)]
    weights = [_search_weight(None, job) for _, job in jobs]
    best, graphs = None, None
    for index, (replay, job) in enumerate(jobs):
        # Megatron-LM's execution (launch_frontier's ``fastest``): its interleaved transfers too, one cache with its search
        cache = searches.cache(execution, 1, cuda_graphs=replay,
                               p2p_overlap=launcher_p2p_overlap(job, "megatron", searches.request.settings))
        # it only informs: at its share of the time it stops, even with no plan of its own yet
        found = searches.run(cache, searches.share(job, weights[index], sum(weights[index:])), None, report, seeds,
                             informs=True).best
        if found is not None and (best is None or found.time_s < best.time_s):
            best, graphs = found, cache.settings
    if best is None or (pick_s is not None and best.time_s >= pick_s):
        return None
    from planner.families import named_point  # the point's own summary calls a sequence split tp
    return Headroom(time_s=best.time_s, memory_bytes=best.memory_bytes, execution=execution_label(execution),
                    summary=(named_point(best) or (0, 0, 0, best.summary))[3], cuda_graphs=graphs.cuda_graphs,
                    graph_scope=graphs.cuda_graph_scope)  # fmt: skip


def _headroom_seeds(pick_s: float | None, limit_bytes: float) -> list[tuple[float, float]]:
    """Seeds that prune the headroom search to what it reports, the fastest plan that fits if it beats
    the pick: ``(pick, 0 bytes)`` dominates every combination no faster than the pick, and
    ``(0 s, just over the limit)`` every one whose memory bound exceeds the limit."""
    over_limit = (0.0, float(np.nextafter(limit_bytes, math.inf)))
    return [over_limit] if pick_s is None else [(pick_s, 0.0), over_limit]


def _data_parallel_baseline(searches: _Searches, pick: Row | None, execution: ExecutionModel | None,
                            global_batch: int, pinned_graphs: str | None = None) -> Row | None:
    """Pure data parallelism on every device (ZeRO-0, one micro-batch per rank, no recomputation), priced as
    the pick's first launcher runs it (its execution model, memory rules and ZeRO-0 synchronisation: DeepSpeed
    all-reduces after the backward, :mod:`exporters.deepspeed.zero_sync`), so the line compares like with like;
    without a pick, under ``execution`` alone; replayed as a CUDA graph where that launcher replays one-stage plans
    (:func:`planner.launcher_options.replays_cuda_graphs`, ``pinned_graphs``: ``--fix cuda_graphs``). ``None`` when
    the global batch does not split over the devices."""
    found = next((r for name in pick.targets if (r := target_rules(name)) is not None), None) if pick is not None else None
    rules = (None, None, None, None) if found is None else launcher_pricing_rules(found)
    graphs = None if found is None else replays_cuda_graphs(found.name, execution=pick.execution, pinned=pinned_graphs)
    cast = None if found is None else launcher_autocasts(found.name, pick.execution, searches.request.settings, 0)
    cache = searches.cache(pick.execution if pick is not None else execution, 1, cuda_graphs=graphs, autocast=cast)
    devices = searches.request.cluster.devices
    with searches.phase("baselines", cuttable=False):
        point = data_parallel_point(cache, global_batch=global_batch, memory_limit_bytes=searches.request.memory_limit_bytes,
                                    memory_rules=rules)
    return None if point is None else Row(point=point, cache=cache, degrees=Degrees(dp=devices), targets=())


_HEADROOM_WEIGHT = 1.0
"""The headroom search's weight in the time shares (:func:`_search_weight`): it is pruned by the
pick and the limit, and it only informs."""


def _search_weight(rules, options: PipelineOptions) -> float:
    """A search's weight in the time shares: the pipeline sizes it searches (a launcher without
    pipelines searches one), so a search over many sizes gets the time they need."""
    sizes = options.pipeline_sizes or (1,)
    return float(sum(1 for pp in sizes if pp == 1 or rules is None
                     or rules.allows(pp=pp, zero_stage=0, recompute="none", schedule=options.schedule, tp=None)))


def _hybrid(row: Row) -> bool:
    """Whether an HSDP row differs from plain ZeRO: its data-parallel ranks are whole replicas of the
    shard group, more than one (at ``dp <= dp_shard`` it prices as plain ZeRO, listed once)."""
    shard, hpz = row.cache.settings.dp_shard, row.cache.settings.hpz_partition
    if hpz is not None:  # ZeRO++'s hpZ: a secondary copy over fewer ranks than ZeRO-3's partition
        return row.point.zero_stage >= 3 and row.degrees.dp > hpz and row.degrees.dp % hpz == 0
    return shard is None or (row.point.zero_stage >= 1 and row.degrees.dp > shard and row.degrees.dp % shard == 0)


def _search_launchers(searches: _Searches, usable: Sequence[str], degrees: Sequence[int], options: PipelineOptions,
                      pins: Pins, executions: Mapping[str, ExecutionModel | None], report: ProgressFn, *,
                      headroom: PipelineCostCache | None, precisions: Sequence[tuple[str, str | None]] = (),
                      offloads: Sequence[str] = ("none",), hsdp: Sequence[int | None] = (None,)) -> list[Row]:
    """Every launcher's search at every ``ep``, precision (``(precision, fp8 recipe)`` pairs: FP8 only
    for the launchers of that recipe; ``()``: the request's) and CPU offload mode (only for the launchers
    that run it, :func:`~planner.launcher_options.launcher_offload`), each seeded with the rows found before it, each with its
    weighted share of the time (:func:`_search_weight`; ``headroom``: one more search follows), each
    at every HSDP shard group ``hsdp`` its launcher runs (:func:`~planner.launcher_options.launcher_hsdp`), eager bf16 with or without autocast as it runs
    each ZeRO stage (every search: :func:`~planner.launcher_options.launcher_jobs`). ``headroom``: the
    cache of the headroom search that follows these (``None``: none follows)."""
    from exporters.targets import TARGETS

    precisions = precisions or ((searches.request.settings.precision, searches.request.settings.fp8),)
    devices = searches.request.cluster.devices
    # pure dp at each ZeRO stage searched, launched as priced: rows that seed the searches (planner.baseline_rows)
    listed = offloads == ("none",) and (searches.request.settings.precision, searches.request.settings.fp8) in precisions
    if listed:
        report("pricing pure data parallelism", 0.0)  # a large model's tables: seconds before any search
    with searches.phase("baselines", cuttable=False):  # the rows every search is seeded with: never cut
        found = [Row(point=b.point, cache=b.cache, degrees=Degrees(dp=devices), targets=b.runners)
                 for zero in (0, 1, 2, 3) if listed and baseline_searched(options, pins, devices, zero)
                 for b in data_parallel_points(usable, functools.partial(pinned_rules, pins=pins), lambda n: searches.cache(
                     executions[n], 1, cuda_graphs=replays_cuda_graphs(n, execution=executions[n], pinned=pins.cuda_graphs),
                     autocast=launcher_autocasts(n, executions[n], searches.request.settings, zero)),
                     executions, zero=zero, global_batch=options.global_batch,
                     memory_limit_bytes=searches.request.memory_limit_bytes)]  # fmt: skip
    jobs = launcher_jobs(usable, degrees, options, pins, executions, precisions=precisions, offloads=offloads, hsdp=hsdp,
                         devices=devices, autocast=searches.request.settings.autocast)
    weights = [_search_weight(rules, by_ep) for _, by_ep, _, rules, *_ in jobs]
    left_weight = sum(weights) + (_HEADROOM_WEIGHT if headroom is not None else 0.0)
    caches = [searches.cache(executions[name], ep, precision, offload, cuda_graphs=graphs, autocast=cast,
                             p2p_overlap=launcher_p2p_overlap(by_ep, name, searches.request.settings),  # Megatron-LM's
                             **hybrid_groups(name, shard))  # HSDP's shard group, or DeepSpeed's hpZ group
              for ep, by_ep, name, _, precision, offload, shard, graphs, cast in jobs]
    unstarted = 0
    for index, ((ep, by_ep, name, rules, precision, offload, shard, graphs, _), weight) in enumerate(zip(jobs, weights)):
        execution = executions[name]
        cache = caches[index]
        # a cache another search reads after this one: the search keeps its bounds for it, under that search's rules
        cache.searched_again = cache is headroom or any(other is cache for other in caches[index + 1:])
        later = [hsdp_rules(job[3], job[6]) for job, other in zip(jobs[index + 1:], caches[index + 1:]) if other is cache]
        cache.later_memory_rules = frozenset(tuple(search_memory_rules(r, cache).values()) for r in later + [None] * (cache is headroom))
        cache.later_zero_syncs = frozenset(getattr(r, "zero_sync", None) for r in later + [None] * (cache is headroom))
        cache.later_zero3_gathers = frozenset(getattr(r, "zero3_gather", None) for r in later + [None] * (cache is headroom))
        cache.later_rules = tuple(later + [None] * (cache is headroom))  # which of their keys a later search may read
        # a row is run as priced by the launchers of its execution model and FP8 recipe
        same = [other for other in usable if executions[other] == execution
                and (precision[1] is None or TARGETS[other].fp8 == precision[1])
                and TARGETS[other].captures(cache.settings)]
        if searches.now() > searches.deadline_s and any(row.fits for row in found):
            unstarted += 1  # past the limit with a plan that fits, it would stop at its first check
            left_weight -= weight
            continue
        try:
            # the plans found so far prune this search: only the union's frontier is wanted
            # (only rows the pins admit: one they do not may dominate every row they do and is never listed)
            seeds = [(row.time_s, row.memory_bytes) for row in found if pins.admits(row.degrees)]
            share = searches.share(by_ep, weight, left_weight)
            left_weight -= weight
            result = searches.run(cache, share, hsdp_rules(rules, shard),
                                  lambda stage, fraction, n=name: report(f"{stage} ({n})", fraction), seeds)  # fmt: skip
        except InputError:
            if len(usable) == 1 and len(degrees) == 1 and shard is None:
                raise
            continue
        found += [row for row in _launcher_rows(result, name, execution, ep, same) if _hybrid(row)]
    if unstarted:
        _past(searches, f"{unstarted} launcher search{'es' if unstarted > 1 else ''} before starting")
        searches.notes.append(f"{unstarted} of {len(jobs)} launcher searches did not start: past the time limit "
                              "with a plan that fits, each would stop at once (pass a larger --time-limit to search them)")
    return found


def launch_frontier(
    loader: GraphLoader,
    request: PlanRequest,
    *,
    options: PipelineOptions,
    pins: Pins = Pins(),
    launchers: Sequence[str] | None = None,
    engine: str | None = None,
    attention: str | None = None,
    headroom: bool = True,
    collapse: float = 0.01,
    progress: ProgressFn | None = None,
    precisions: Sequence[str] = (),
    deadline: PlanDeadline | None = None,
) -> LaunchFrontier:
    """The frontier of plans the launchers run, each priced under its launcher's execution model (module docstring).

    Parameters
    ----------
    loader:
        The model at any batch (:func:`planner.pipeline.graph_loader`).
    request:
        Cluster, training settings (precision, optimizer; ZeRO and recomputation are searched),
        cost model, memory limit (bytes per device) and time limit (seconds, shared by the searches).
    options:
        The search space: global batch (samples per step), micro-batch, pipeline sizes, schedule.
    pins:
        Degrees and knobs fixed by the user (``--fix``); the search fills in the rest.
    launchers:
        The launchers to search (``None``: every registered one that runs the model).
    engine, attention:
        Override every launcher's execution model (``--engine`` / ``--attention``).
    headroom:
        Also search without any launcher's restriction, to say how much faster a plan no launcher
        runs would be.
    collapse:
        Merge a row into a listed faster one within this relative tolerance in both time and memory
        (0: list every Pareto-optimal plan).
    precisions:
        Training precisions searched as a knob (``--dtype bf16-mixed,fp8``: ``fp32``, ``bf16-mixed``,
        ``fp8``), each row priced in one; FP8 rows for the launchers that train FP8, each with its
        recipe (:attr:`exporters.targets.Target.fp8`). ``()``: the request's precision only.
    deadline:
        The plan's ``--time-limit`` from its start (``None``: the request's from now); the searches share what is left.

    Raises :class:`InputError` on options no pipeline satisfies.
    """
    started = time.perf_counter()
    deadline = deadline if deadline is not None else PlanDeadline(limit_s=request.time_limit_s)
    report = progress or (lambda stage, fraction: None)
    if not (0 <= collapse < 1):
        raise InputError(f"--collapse must be at least 0 and below 1 (got {collapse}), e.g. --collapse 0.01")
    graph = loader(options.global_batch)
    usable, refused = _launchers(graph, request, launchers, attention)
    if not usable:  # every launcher asked for refuses the model: say why, without searching
        limit = float(request.memory_limit_bytes or request.cluster.device.memory_bytes)
        return LaunchFrontier(cluster=request.cluster, rows=(), chosen=None, memory_limit_bytes=limit,
                              global_batch=options.global_batch, launchers=(), refused=tuple(refused), collapse=collapse,
                              message=fit_message((), limit, (), refused, graph.name, launchers is not None))
    searches = _searches_of(loader, request, graph, options, usable, deadline)
    degrees = _expert_degrees(graph, request, pins)
    # every plan a launcher runs is in the space: a pipeline with fewer micro-batches than stages too
    # (PipelineOptions.fill_pipeline drops those; on small models they can be the fastest)
    narrowed = dataclasses.replace(pinned_options(options, pins), fill_pipeline=False)
    if narrowed.pipeline_sizes is None:
        narrowed = dataclasses.replace(narrowed, pipeline_sizes=pipeline_order(graph, request))
    executions = {name: launcher_execution(name, graph, engine, attention, request.cluster.device) for name in usable}
    unscheduled = _unscheduled_note(executions, narrowed.schedule)
    searches.notes += [note for note in (unscheduled, alibi_note(graph, attention)) if note]
    pairs = precision_pairs(precisions, request, usable, graph)
    check_hsdp_pin(pins, usable, graph, request)
    fastest = launcher_execution("megatron", graph, engine, attention, request.cluster.device)
    found = _search_launchers(searches, usable, degrees, narrowed, pins, executions, report,
                              headroom=searches.cache(fastest, 1, p2p_overlap=launcher_p2p_overlap(
                                  narrowed, "megatron", request.settings)) if headroom else None,
                              precisions=pairs, offloads=(pins.offload or "none",), hsdp=hsdp_sizes(request, pins))
    limit = float(request.memory_limit_bytes or request.cluster.device.memory_bytes)
    search_offload = functools.partial(_search_launchers, searches, usable, degrees, narrowed, pins, executions, report,
                                       headroom=None, precisions=pairs, offloads=OFFLOADED, hsdp=hsdp_sizes(request, pins))
    pareto, first_fit = _fitting(found, searches, request, pins, limit, search_offload)
    # the collapse is a pass over the finished Pareto rows (collapse_rows): no search below reads it
    chosen = tie_pick(pareto, first_fit)
    pick = pareto[chosen] if chosen is not None else None
    room = (_headroom(searches, fastest, narrowed, report, pareto[first_fit] if first_fit is not None else None, limit,
                      pins.cuda_graphs)
            if headroom and "generic" not in usable and pins.dp is None and pins.tp is None and pins.cp is None
            else None)  # fmt: skip
    listing = Listing(pareto=tuple(pareto), first_fit=first_fit, devices=request.cluster.devices,
                      batch_dim=loader.batch_dim if request.cost_model == "measured" else None)
    return collapse_rows(LaunchFrontier(
        cluster=request.cluster, rows=(), chosen=None,
        memory_limit_bytes=limit, global_batch=options.global_batch, launchers=tuple(n for n in _framework_targets() if n in usable) or tuple(usable),
        refused=tuple(refused), headroom=room, baseline=_data_parallel_baseline(searches, pick, pick.execution if pick is not None else fastest,
                                                                options.global_batch, pins.cuda_graphs),
        message="" if chosen is not None else (f"{unscheduled}; " if unscheduled and not pareto else "") + fit_message(
            pareto, limit, usable, refused, graph.name, launchers is not None,
            pinned="" if pareto else pinned_refusal(graph, request, narrowed, pins, usable)),
        notes=searches.all_notes(), search_time_s=time.perf_counter() - started, listing=listing,
        combinations=searches.combinations, intra_op_searches=searches.intra_op_searches,
    ), collapse)  # fmt: skip


def _searches_of(loader: GraphLoader, request: PlanRequest, graph: OpGraph, options: PipelineOptions,
                 usable: Sequence[str], deadline: PlanDeadline) -> _Searches:
    """The searches of one plan: the profile's timings (``--cost measured``), the notes on it and on a
    loss coupled across the batch, and the plan's ``deadline``."""
    measured, profile_notes = measured_lookup(graph, request)
    coupled = coupling_note(graph, options)  # which ops read across the batch, and what was done
    return _Searches(loader=loader, request=request, measured=measured, context=context_split(usable), deadline=deadline,
                     deadline_s=deadline.deadline_s, notes=list(profile_notes) + ([coupled] if coupled else []),
                     keep_models=not states_exceed_a_device(graph, request))  # fmt: skip


def _past(searches: _Searches, what: str) -> bool:
    """Whether the searches' deadline has passed; if so, the plan's deadline is told the limit cut ``what``."""
    if searches.now() <= searches.deadline_s:
        return False
    if searches.deadline is not None:
        searches.deadline.mark_cut(what)
    return True


def _unscheduled_note(executions: Mapping[str, ExecutionModel | None], schedule: str) -> str | None:
    """Why torchtitan's pipelines are not listed under a zero-bubble ``schedule`` when its blocks are
    compiled (``None``: they are, or it is not searched)."""
    compiled = "torchtitan" in executions and getattr(executions["torchtitan"], "engine", "fused") in (None, "fused")
    if schedule not in ("zb-h1", "zbv") or not compiled:
        return None
    return ("torchtitan's pipelines are not listed: its zero-bubble schedules split the backward into input and "
            "weight passes, which its torch.compile'd blocks do not run (add --engine eager)")


OFFLOAD_TIME_SHARE = 0.25
"""The least share of ``--time-limit`` for the offload search when nothing fit: a plan takes at most 1.25x its limit."""


def _fitting(found: list[Row], searches: _Searches, request: PlanRequest, pins: Pins, limit: float,
             search_offload: Callable[[], list[Row]]) -> tuple[list[Row], int | None]:
    """``(Pareto rows, index of the fastest that fits or None)`` of ``found``: when nothing fits on the
    device, not even tight, CPU offload is searched too (``search_offload``, in what is left of the time
    limit, at least :data:`OFFLOAD_TIME_SHARE` of it; objectives.offload) and its rows join the frontier;
    without a user's limit, a plan just over it is picked with a note (:func:`planner.launch_messages.tight_pick`)."""
    # the pins first: a row they do not admit (a Mesh-TF layout named dp=8 under --fix tp=2) must not dominate
    # the rows they do (NCCL's buffers of tp=2's second group left GPT-2 tiny's tp=2 rows all dominated)
    pareto = _pareto_rows([row for row in found if pins.admits(row.degrees)])
    first_fit = next((i for i, row in enumerate(pareto) if row.fits), None)
    if first_fit is None and pins.offload is None and (request.memory_limit_bytes is not None
                                                        or tight_pick(pareto, limit) is None):
        searches.deadline_s = max(searches.deadline_s, searches.now() + OFFLOAD_TIME_SHARE * request.time_limit_s)
        found = found + search_offload()
        pareto = _pareto_rows([row for row in found if pins.admits(row.degrees)])
        first_fit = next((i for i, row in enumerate(pareto) if row.fits), None)
    if first_fit is None and request.memory_limit_bytes is None:
        first_fit = tight_pick(pareto, limit)
        if first_fit is not None:
            searches.notes.append(tight_note(pareto[first_fit], limit))
    return pareto, first_fit


# --------------------------------------------------------------------------------------------
# ``planner plan`` in one call, and a row as a launch plan


def plan_launchable_file(
    path: str | Path,
    dims: Mapping[str, int],
    requests: Sequence[PlanRequest],
    *,
    global_batch: int | None = None,
    micro_batch: int | None = None,
    pipeline_sizes: tuple[int, ...] | None = None,
    schedule: str | None = None,
    chunks: int | None = None,
    pins: Pins = Pins(),
    launchers: Sequence[str] | None = None,
    engine: str | None = None,
    attention: str | None = None,
    collapse: float = 0.01,
    progress: ProgressFn | None = None,
    allow_batch_split: bool = False,
    precisions: Sequence[str] = (),
    whole_graph: str | None = None,
    export: str | None = None,
    deadline: PlanDeadline | None = None,
) -> tuple[tuple[str, ...], list[LaunchFrontier]]:
    """``planner plan``: :func:`launch_frontier` for each request (a ``--devices`` sweep), the model
    imported once per micro-batch size and shared.

    Parameters
    ----------
    path, dims:
        The ONNX model and its symbolic dims (``{"batch": 32, "seq": 1024}``).
    requests:
        One :class:`~planner.plan.PlanRequest` per cluster: cluster, precision and optimizer, cost
        model, memory limit (bytes per device), time limit (seconds).
    global_batch:
        Samples per step; ``None``: the model's batch dim as bound in ``dims``.
    micro_batch, pipeline_sizes, schedule, chunks:
        Narrow the pipeline space (:class:`~planner.pipeline.PipelineOptions`; ``None``: searched /
        ``1f1b`` / one chunk).
    pins, launchers, engine, attention, collapse, progress, precisions:
        As for :func:`launch_frontier`.
    allow_batch_split:
        Micro-batch a contrastive loss too (``--allow-batch-split``; :mod:`planner.coupling`).
    whole_graph:
        Plan the whole graph at ``dims`` as one sample per step (:class:`~planner.pipeline.WholeGraphLoader`),
        for a model whose batch dim is not a sample dim; the value is why (:attr:`NotSamples.reason`).
    deadline:
        The first plan's ``--time-limit`` (``None``: the first request's, from now): the import and
        every phase after it consume it, the searches share what is left; each further plan of a sweep
        has the same limit from its own start. A plan the limit cut, or that outlasted it, gets a note
        with each phase's seconds (:meth:`PlanDeadline.spent_note`).

    Returns
    -------
    (tuple of str, list of LaunchFrontier)
        The importer's warnings (each once) and one frontier per request, in order.

    Raises
    ------
    InputError
        A model without a named batch dim, no global batch, options no pipeline satisfies;
        :class:`~planner.coupling.NotSamples` when the batch dim is not a sample dim (a GNN's nodes);
        :class:`UnsupportedExport` before the search when ``export`` (``--export``) trains no plan of the model.
    """
    deadline = deadline if deadline is not None else PlanDeadline(limit_s=requests[0].time_limit_s)
    report = progress or (lambda stage, fraction: None)
    report("importing the model", 0.0)
    with deadline.phase("import", cuttable=False):
        loader, global_batch, most_micro_batches = _loader_of(path, dims, requests, global_batch, whole_graph)
    loader.phases = deadline  # the graphs imported later (other micro-batch sizes) count as import too
    options = PipelineOptions(global_batch=int(global_batch), micro_batch=micro_batch, pipeline_sizes=pipeline_sizes,
                              schedule=schedule or "1f1b", chunks=chunks or 1,  # type: ignore[arg-type]
                              max_micro_batches=most_micro_batches)
    graph = loader(int(global_batch))
    graph = graph if whole_graph is not None else require_samples(graph, loader.batch_dim)
    refuse_export(graph, requests[0].cluster, requests[0].settings, export, launchers)
    options = coupled_options(graph, options, allow_batch_split=allow_batch_split)
    frontiers = []
    for index, request in enumerate(requests):
        count = request.cluster.devices
        clock = deadline if index == 0 else deadline.restarted()  # --time-limit is per plan of a sweep
        loader.phases = clock
        # the searches on fewer devices that follow the first (_on_fewer_devices, _with_smaller_mesh)
        # take what it left of the one deadline, not a limit each
        search = functools.partial(
            launch_frontier, loader, options=options, pins=pins, launchers=launchers, engine=engine, attention=attention,
            collapse=collapse, progress=lambda stage, fraction, c=count: report(f"{stage}, {c} devices", fraction),
            precisions=precisions, deadline=clock,
        )  # fmt: skip
        frontier = search(request)
        if not frontier.rows and frontier.launchers and not pins.pinned:
            frontier = _on_fewer_devices(frontier, search, loader, request, options, precisions, clock)
        else:
            frontier = _with_smaller_mesh(frontier, search, loader, request, options, pins, precisions, clock)
        spent = clock.spent_note()
        frontiers.append(dataclasses.replace(frontier, notes=(*frontier.notes, spent)) if spent else frontier)
    return loader.warnings, frontiers


_LEAST_SHARE_S = 1e-3
"""The time limit a search gets once the plan's is spent: it stops after its first point (the
launchers' searches stop at their share only once they have one)."""


def _on_fewer_devices(frontier: LaunchFrontier, search: Callable[..., LaunchFrontier], loader: GraphLoader,
                      request: PlanRequest, options: PipelineOptions, precisions: Sequence[str],
                      deadline: PlanDeadline | None = None) -> LaunchFrontier:
    """When no launcher runs any plan on all ``N`` devices (a batch of 16 over 256 devices: data
    parallelism stops at 16 and tensor parallelism at the heads), the frontier of the largest mesh of
    fewer devices that one runs (whole nodes or a fraction of one, each dividing ``N``), shown as
    ``N``'s with a note: a launch uses that many. ``frontier`` itself (its message the refusal on ``N``)
    when no smaller mesh has a plan, or the options rule every one out (``InputError``)."""
    cluster = request.cluster
    for size in sorted(divisors(cluster.devices), reverse=True)[1:]:
        smaller = _on_mesh(request, size)
        try:
            found = search(smaller) if smaller is not None else None
        except InputError:  # the user's options rule this mesh out (a --pp its devices cannot hold): the next one
            continue
        if found is None or not found.rows:
            continue
        found = _with_smaller_mesh(found, search, loader, smaller, options, Pins(), precisions, deadline)
        note = (f"no launcher runs a plan on all {cluster.devices} devices ({frontier.message.split(';')[0]}); "
                f"the rows are plans on fewer ({size} at most), each launched on the devices its degrees multiply to")
        return dataclasses.replace(found, cluster=cluster, notes=(note, *found.notes),
                                   search_time_s=frontier.search_time_s + found.search_time_s)
    return frontier


SMALLER_MESH = 8
"""Issue 25, "no model's best plan at N devices is slower than its best at N / 8": a pipeline's stages
take all N devices (:func:`exporters._target.worlds`), so pipelines on N / 8 devices are searched
beside (:func:`_with_smaller_mesh`) unless a lower bound rules them out."""


def _with_smaller_mesh(frontier: LaunchFrontier, search: Callable[..., LaunchFrontier], loader: GraphLoader,
                       request: PlanRequest, options: PipelineOptions, pins: Pins,
                       precisions: Sequence[str], deadline: PlanDeadline | None = None) -> LaunchFrontier:
    """``frontier`` with the pipelined rows of ``search`` on ``N / SMALLER_MESH`` devices (whole nodes
    or a fraction of one) merged in, when ``N`` spans nodes and the compute lower bound of that mesh
    (:func:`_compute_floor_s`) is below the pick (else ``frontier`` itself): plans on fewer devices
    than asked are launches of that many (the rows' degrees say so), never slower than the larger
    mesh's pick for being left out. Past ``deadline`` they are not searched (it is told the cut)."""
    cluster = request.cluster
    small, per_node = cluster.devices // SMALLER_MESH, cluster.devices_per_node
    smaller = _on_mesh(request, small) if small > 1 else None
    pipelined = options.pipeline_sizes is None or any(pp > 1 for pp in options.pipeline_sizes)
    best = frontier.fastest_row  # a smaller mesh's row matters to the pick within the tie (planner.pick) of it
    if (cluster.devices % SMALLER_MESH or cluster.devices <= per_node or smaller is None or not pipelined or best is None
            or pins.pinned or "fp8" in precisions):
        return frontier  # a pinned degree or knob is the user's plan; FP8 has its own floor (not written)
    # first the matmuls' forward FLOPs at the device's fastest peak (no model to build; rules out
    # GPT-3-sized meshes: any plan computes their forward and backward, a causal flash core at least
    # half of it twice over), then the priced floor
    graph = loader(options.global_batch)
    gemm_flops = sum(op.flops for op in graph.ops if op.kind in ("matmul", "conv"))
    bound_s = best.time_s * (1 + PICK_TIE)
    if gemm_flops / max(cluster.device.peak_flops.values()) / small >= bound_s:
        return frontier
    # a stage holds at least one layer per chunk (the pipeline search's own rule, pipeline_space._pipeline_sizes):
    # a model without repeated blocks (MobileViT, an MLP) has no pipeline to add, and its search would refuse
    layers = sum(1 for group in graph.blocks for instance in group.instances if instance)
    sizes = tuple(pp for pp in (options.pipeline_sizes or divisors(small))
                  if pp > 1 and small % pp == 0 and pp * options.chunks <= layers)
    if not sizes:
        return frontier
    if deadline is not None and deadline.left_s() <= 0:  # before the priced floor: it builds the model's tables
        deadline.mark_cut(f"the search of pipelines on {small} devices")
        return frontier
    if _compute_floor_s(loader, request, options.global_batch) / small >= bound_s:
        return frontier
    extra = search(smaller, options=dataclasses.replace(options, pipeline_sizes=sizes), headroom=False)
    rows = [row for row in (extra.listing.pareto if extra.listing is not None else extra.rows) if row.point.pp > 1]
    return _merged(frontier, rows, extra) if rows else frontier


def _on_mesh(request: PlanRequest, size: int) -> PlanRequest | None:
    """``request`` on ``size`` of its cluster's devices when they are whole nodes or a fraction of one
    (the meshes a launch of fewer devices takes); ``None`` otherwise."""
    cluster, per_node = request.cluster, request.cluster.devices_per_node
    if (size % per_node if size >= per_node else per_node % size) != 0:
        return None
    return dataclasses.replace(request, cluster=dataclasses.replace(
        cluster, nodes=max(1, size // per_node), devices_per_node=min(size, per_node)))


def _compute_floor_s(loader: GraphLoader, request: PlanRequest, global_batch: int) -> float:
    """Seconds of one step's compute on one device, a floor of any plan's device-seconds: per op the
    lesser of its roofline and its fused + flash-attention price at the whole batch (a split op's
    shards take at least their share of it, eager kernels and explicit attention more), summed.
    0 under a measured cost model (no such floor holds for measured shards)."""
    if request.cost_model != "roofline":
        return 0.0
    one = dataclasses.replace(request.cluster, nodes=1, devices_per_node=1)
    floors = None
    for engine, attention in ((None, None), ("fused", "flash")):
        settings = dataclasses.replace(request.settings, engine=engine, attention=attention)
        model = PipelineCostCache(loader, cluster=one, settings=settings).model(1, global_batch, 0, "none", edges=False)
        per_op = np.array([float(detail.compute_s[0]) for detail in model.op_details])
        floors = per_op if floors is None else np.minimum(floors, per_op)
    return float(floors.sum()) if floors is not None else 0.0


def _merged(frontier: LaunchFrontier, rows: Sequence[Row], extra: LaunchFrontier) -> LaunchFrontier:
    """``frontier`` with ``rows`` (Pareto rows of the smaller mesh ``extra`` searched) in its Pareto set, the
    union collapsed and described at the frontier's ``--collapse`` and its pick made from it (:func:`collapse_rows`)."""
    listing = frontier.listing
    pareto = _pareto_rows([*(listing.pareto if listing is not None else frontier.rows), *rows])
    first_fit = next((i for i, row in enumerate(pareto) if row.fits), None)
    if first_fit is None:
        return frontier
    room = frontier.headroom
    if room is not None and room.time_s >= pareto[first_fit].time_s:
        room = None  # the smaller mesh's pick is at least as fast as the per-op plan the line named
    union = Listing(pareto=tuple(pareto), first_fit=first_fit, devices=frontier.cluster.devices, joined=extra.cluster,
                    notes=listing.notes if listing is not None else (), batch_dim=listing and listing.batch_dim)
    return collapse_rows(dataclasses.replace(
        frontier, headroom=room, listing=union, search_time_s=frontier.search_time_s + extra.search_time_s,
        combinations=frontier.combinations + extra.combinations,
        intra_op_searches=frontier.intra_op_searches + extra.intra_op_searches,
    ), frontier.collapse)  # fmt: skip


def _loader_of(
    path: str | Path, dims: Mapping[str, int], requests: Sequence[PlanRequest], global_batch: int | None,
    whole_graph: str | None = None,
) -> tuple[GraphLoader, int, int | None]:
    """``(loader, global batch, most micro-batches per step)`` of :func:`plan_launchable_file`: the
    model's batch dim varied per micro-batch, or, when the file writes its batch as a number, that one
    batch as one pass per step (:class:`~planner.pipeline.FixedBatchLoader`), or the whole graph as one
    sample (``whole_graph``: why, :class:`~planner.pipeline.WholeGraphLoader`)."""
    if whole_graph is not None:
        if global_batch not in (None, 1):
            raise InputError(f"{whole_graph}; leave out --global-batch (the whole graph is one sample per step)")
        return WholeGraphLoader(path, dims, whole_graph), 1, 1
    if batch_is_fixed(path):
        fixed = FixedBatchLoader(path, dims)
        if global_batch is not None and global_batch != fixed.samples:
            raise FixedBatch(
                f"{Path(path).name} has its batch written as a number ({fixed.samples}), so --global-batch must be "
                f"{fixed.samples} (got {global_batch}); re-export it with a named dynamic batch axis "
                "(e.g. dynamic_axes={'input_ids': {0: 'batch'}}) to plan other batches"
            )
        return fixed, fixed.samples, 1
    # a graph moved to another batch keeps the first's ONNX node shapes, which profiling reads
    loader = graph_loader(path, dims, rebatch=all(r.cost_model != "measured" for r in requests))
    if global_batch is None:
        global_batch = dims.get(loader.batch_dim)
        if global_batch is None:
            raise InputError(
                f"the global batch is unknown; pass --dim {loader.batch_dim}=N (the samples per step) or --global-batch N"
            )
    return loader, int(global_batch), None


def batch_is_fixed(path: str | Path) -> bool:
    """Whether the model's batch is a number in the file (no named dim to vary the micro-batch with)."""
    from importers import batch_dim_name

    return batch_dim_name(path) is None


def row_plan_input(row: Row) -> PlanInput:
    """The exporters' input of one row (:func:`planner.pipeline.point_plan_input`)."""
    return row.plan_input if row.plan_input is not None else point_plan_input(row.point, row.cache)


def _row_line(frontier: LaunchFrontier, index: int) -> str:
    row = frontier.rows[index]
    return (f"row {index + 1}: {row.summary}, {format_seconds(row.time_s)}/step, "
            f"{format_bytes(row.memory_bytes)}/device (--pick {index + 1})")  # fmt: skip


def export_row(frontier: LaunchFrontier, index: int, target: str) -> dict[str, Any]:
    """Export row ``index`` for ``target``; on a refusal, name the fastest row ``target`` runs
    (within the limit when one fits).

    Raises
    ------
    UnsupportedExport
        With the reason and the nearest row the target runs.
    """
    find_target(target, flag="--export")
    try:
        return export(target, row_plan_input(frontier.rows[index]))
    except UnsupportedExport as refusal:
        # first, whose row it is (exporters.listed_elsewhere)
        reason = listed_elsewhere(frontier.rows[index].targets, index, target) + refusal.reason
        if refusal.nearest_summary:
            raise UnsupportedExport(reason, nearest=refusal.nearest, nearest_summary=refusal.nearest_summary) from None
        if target in dict(frontier.refused):  # it trains no plan of the model: --target would refuse it too
            raise UnsupportedExport(reason) from None
        runnable = [i for i, row in enumerate(frontier.rows) if target in row.targets and i != index]
        best = next((i for i in runnable if frontier.rows[i].fits), runnable[0] if runnable else None)
        nearest = _row_line(frontier, best) if best is not None else f"no listed row; `--target {target}` lists the plans it runs"
        raise UnsupportedExport(reason, nearest_summary=nearest) from None
