r"""The 3-D search: pipeline stages x per-op splits x micro-batches, with ZeRO and recomputation.

The devices are split into ``pp`` pipeline stages of :math:`d = N / pp` devices each (``pp``
divides :math:`N`; stages take consecutive ranks, whole nodes or whole fractions of one). The op
graph's repeated blocks are the *layers*; the ops before the first layer (embeddings) go to the
first stage and those after the last (final norm, LM head) to the last. The global batch :math:`G`
is fixed; a pipeline micro-batch holds :math:`b` samples (split over the data-parallel replicas by
the ops' batch-dim factors) and a step runs :math:`m = G / b` of them (gradient accumulation).

The search never prices anything itself: it takes the pricing as an argument
(:class:`PipelinePricing`, in practice ``objectives.pipeline_cost.PipelineCostCache``), as pymoo's
algorithms take the problem. For each ``pp``, micro-batch :math:`b` and recomputation
(``none``/``selective``/``full``), :func:`search_pipeline`:

1. asks the pricing for every op's forward and backward seconds per micro-batch, per-step seconds
   and parameter states at each ZeRO stage on a :math:`d`-device stage at batch :math:`b`
   (``pricing.arrays``); configurations split at most two dims of an op, which keeps every
   Megatron-LM layout;
2. runs the intra-op search (PaSE's DP, :mod:`planner.search.elimination`) on the whole graph with
   op cost :math:`W (f_i + b_i) + g_i` at ZeRO-1 (:math:`W = m + pp - 1`, the number of micro-batch
   slots of the bottleneck stage; :math:`g_i` per step), restricted to configurations whose
   model-parallel factors but the sequence's (``pricing.masks``) stay inside a node when a stage spans
   nodes (``PipelineOptions.model_parallel_inside_node``, the layout Megatron-LM and Alpa use); the
   elimination plan is reused by every search with the same table structure (:func:`_solve`);
3. cuts the layers into stages, for that choice at each ZeRO stage priced, by the cut of least step
   time as the pricing prices it (:func:`planner.search.stages.partition_step_time` over the
   segment costs of :mod:`planner.search.stage_costs`), within the memory limit when it can;
4. has the pricing price the pipeline at each ZeRO stage (``pricing.price``: the schedule's
   makespan with its bubble, the stage-to-stage transfers, each stage's gradient synchronisation);
5. when the fastest choice does not fit, searches the memory-weighted objective
   :math:`W(f+b) + g + \lambda M` over a geometric range of :math:`\lambda` (Lagrangian relaxation)
   for the fastest choice that fits; with a launcher's rules, also when it fits, for the leaner
   choices of its families (a position embedding split rather than copied), until the weights buy
   no memory or what they could find is dominated: such plans are Pareto points of their own, and
   the table's ``--collapse`` bound needs them listed. In that leaner search every choice (the
   fastest and each weight's) is also priced at each stage cut of a better time/memory trade-off
   than its fastest cut (:func:`planner.search.stages.pareto_cuts`: the cut of least step time
   under each smaller cap of the stages' memory, one DP per cut), unless a point found dominates it:
   a slightly slower cut can hold far less (the time-balanced cut is not the memory-balanced one).
   So for each choice it prices, the frontier holds a point at least as good in both as every cut
   of that choice (every cut leaner than the fastest is weakly dominated by one priced, the proof
   in ``pareto_cuts``; every cut larger is slower or dominated by the fastest); which choices it
   prices is the weights' (a Lagrangian search finds the choices on the lower convex hull).

With launch-target rules (:class:`TargetRules`, handed down by the roof: the search never imports
exporters), step 2 runs once per family of configurations the target runs on a stage (e.g. each
``dp x tp`` with and without sequence parallelism) and every family's optimum is priced; the ZeRO
stages and schedules the target does not pipeline are not searched.

All points go through one Pareto filter over (step time, memory per device), kept as the search
goes (:class:`_Frontier`). Before steps 2-5, a combination (pp, micro-batch, recompute, ZeRO group)
is skipped when lower bounds of the step time and of the memory of *every* plan it could produce
are dominated by a point already found (``PipelineOptions.prune``, :func:`_lower_bounds`): each op
at its cheapest allowed configuration, the least bottleneck of any stage cut, the schedule's
makespan at that work and bottleneck; on one stage, once the DP's optimum at ZeRO-1 without
recomputation is priced, its step time bounds ZeRO-1 to 3 and every recomputation of that
micro-batch (ZeRO-0 too where it shares ZeRO-1's group; split, ZeRO-0 can be slower). Such a
combination only adds dominated points, so the frontier is the same as without pruning
(the tests compare both). The memory bounds leave out what only adds bytes: ZeRO-3's unsharded
units under either gather rule (per block, FSDP2; per sub-module, ``TargetRules.zero3_gather``) and a launcher's
bf16 gradient accumulator (``TargetRules.grad_accumulator``): the bounds kept in ``pricing.lasting`` hold for
every launcher's search. Under its memory rules (``TargetRules.sequence_shard_saved``, ``fused_swiglu``) they take
each op's activations less its largest credit (a credit lowers memory: without it they would not bound the
credited prices), kept per rules. Each pair's cost models are released once priced (``pricing.release``).

References
----------
D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC 2021. L. Zheng et al., "Alpa", OSDI 2022.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

import numpy as np

from planner.core.errors import InputError
from planner.core.settings import ZERO_SYNC_STAGES, Recompute
from planner.core.tables import CostTables
from planner.core.units import format_bytes
from planner.search import elimination, solve_clock
from planner.search.blocks import plan_elimination
from planner.search.few_choices import solve_by_enumeration
from planner.search.ordering import generate_seq, min_cells_seq
from planner.search.pipeline_space import _batches, _sizes_or_raise, least_micro_batch
from planner.search.pipeline_bounds import _BOUND_SLACK, LEAN_TOLERANCE, _lower_bounds, _memory_floor
from planner.search.point_devices import tie_group, widest_split  # noqa: F401 - re-exported (planner.launchable)
from planner.search.running_frontier import _Frontier
from planner.search.stage_costs import _step_costs, keep_newest
from planner.search.stage_restriction import _digest, _edges_per_step, _labels, _Restricted, edge_cells, restricted
from planner.search.stages import ParetoCut, StepPartition, pareto_cuts, partition_step_time, step_time_of_cut
from planner.search.target_masks import _TargetFamilies, _TargetFamily, target_families
from planner.search.zero_groups import objective_zero_stage, priced_zero_stages, zero_groups

__all__ = ["PipelineOptions", "PipelineResult", "PipelinePricing", "TargetRules", "search_pipeline", "restricted", "tie_group", "widest_split"]

StageArrays = Any
"""A stage's per-op costs (``objectives.pipeline_arrays._OpArrays``): per op ``key``, ``forward_s``,
``backward_s``, ``step_s``, ``params_bytes``, ``grads_bytes``, ``optimizer_bytes``,
``activations_bytes`` (one array per op, over its configurations), ``edges``, ``spaces``, and the
same flattened (``offsets``, ``flat``, ``edge_*``) for vectorised lookups."""
LayerStructure = Any
"""``objectives.pipeline_cost.LayerStructure``: ``position`` of each op in the layers,
``num_layers``, ``cut_bytes``, ``stage_of_ops(bounds)``."""
Priced = Any
"""A priced plan: ``time_s``, ``memory_bytes``, ``fits`` and ``point()`` (its ``PipelinePoint``)."""


class PipelinePricing(Protocol):
    """What the search asks of the pricing (``objectives.pipeline_cost.PipelineCostCache``)."""

    cluster: Any
    plans: dict
    builds: int
    memory_scale: float

    def structure(self, batch: int) -> LayerStructure: ...
    def arrays(self, devices: int, batch: int, zero_stage: int, recompute: str, *, edges: bool = True,
               zero_sync: Any = None, zero3_gather: Any = None) -> StageArrays: ...
    def masks(self, devices: int, batch: int, *, inside_node: bool, data_parallel: int | None) -> list[np.ndarray]: ...
    def model(self, devices: int, batch: int, zero_stage: int, recompute: str, *, edges: bool = True) -> Any: ...
    def graph(self, batch: int) -> Any: ...
    def holds(self, devices: int, batch: int) -> bool: ...
    def release(self, devices: int, batch: int) -> None: ...
    def derived(self, devices: int, batch: int) -> dict: ...
    def lasting(self, devices: int, batch: int) -> dict: ...
    searched_again: bool
    def in_flight(self, schedule: str, *, stages: int, micro_batches: int, chunks: int = 1,
                  stage_layers: np.ndarray | None = None) -> np.ndarray: ...
    def makespan_floor_s(self, schedule: str, **kwargs: Any) -> float: ...
    def p2p_floor_s(self, structure: LayerStructure, pp: int, devices: int) -> np.ndarray: ...
    def host_floors_s(self, layers: np.ndarray, recompute: str) -> tuple[np.ndarray, np.ndarray, float] | None: ...
    def tied_sync_s(self, grad_bytes: float) -> float: ...
    def unsharded_segment_bytes(self, arrays: StageArrays, structure: LayerStructure, picks: np.ndarray, pp: int,
                                micro_batches: int, zero3_gather: Any = None) -> np.ndarray | None: ...
    def segment_activation_bytes(self, arrays: StageArrays, structure: LayerStructure, picks: np.ndarray,
                                 activations: np.ndarray, in_flight: np.ndarray, recompute: str, *,
                                 sequence_shard_saved: bool | None = None, fused_swiglu: bool | None = None) -> np.ndarray: ...
    def activation_credit_ceiling(self, arrays: StageArrays, recompute: str, **rules: bool) -> dict[int, np.ndarray] | None: ...
    def grad_accumulator_scale(self, arrays: StageArrays, zero_stage: int, pp: int, grad_accumulator: Any = None) -> float: ...
    def price(self, **plan: Any) -> Priced: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetRules:
    """What one launch target runs in a pipeline, handed down by the roof as functions (the search
    never imports exporters; ``planner.pipeline`` builds these from ``planner.export``)."""

    name: str
    families: Callable[..., Sequence[Any]]
    """``families(graph, spaces, *, devices, devices_per_node, pp)``: the configuration families the
    target runs on one stage, each with ``label``, ``tp`` and per-op boolean ``masks``."""
    allows: Callable[..., bool]
    """``allows(*, pp, zero_stage, recompute, schedule, tp)``: whether the target pipelines these settings."""
    settings_allows: Callable[..., bool] | None = None
    """``settings_allows(family, settings, graph)``: whether its exporter runs a family's plans under these settings
    (``Target.runs_family``: torchtitan's ``tp = 1`` and ZeRO-3 at ``ep > 1``), asked of each family and ZeRO stage
    before pricing (:func:`planner.search.target_masks.target_families`); ``None``: every family at every stage."""
    zero3_gather: Any = None
    """ZeRO-3's per-sub-module gather bounds (``Target.zero3_gather``: DeepSpeed's), handed to the pricing
    with each plan, not built into its cache; only ZeRO-3's unsharded memory reads them, which no bound includes."""
    grad_accumulator: Callable[..., float] | None = None
    """``grad_accumulator(*, zero_stage, pp)``: bytes per parameter its bf16 optimizer accumulates the gradients in
    (``Target.grad_accumulator``: DeepSpeed's ``BF16_Optimizer``), handed on as :attr:`zero3_gather` is; it only adds bytes."""
    pipeline_buffers: str | None = None
    """What its pipeline runtime holds at the stage cuts (``Target.pipeline_buffers``, ``objectives.pipeline_buffers``),
    handed to each plan's price as :attr:`grad_accumulator` is (the cuts' own costs and the bounds leave it out: it
    only adds bytes); ``None``: the settings'."""
    zero_sync: Callable[..., Any] | None = None
    """``zero_sync(*, zero_stage, precision, offload)``: how it synchronises ZeRO 0-2 (``Target.zero_sync``: DeepSpeed's,
    which may cost less or more than the pricing's own), handed to every price, cut, choice and bound at ZeRO 0-2
    (:meth:`_Search.sync`; the one-stage time floor is not kept under one)."""
    sequence_shard_saved: bool = False
    """Its linear layers keep their sequence-parallel input shard (``Target.sequence_shard_saved``: Megatron-Core's)."""
    fused_swiglu: bool = False
    """Its gated MLPs keep fc1's output only (``Target.fused_swiglu``). Both memory rules go to the pricing
    with each plan and cut as :attr:`zero3_gather` does; the bounds take each op's largest credit (module docstring)."""


_Cuts = Literal["fastest", "pareto", "leaner"]
"""Which stage cuts of a choice are priced (:meth:`_Slot.price_one`)."""

_NO_FASTER = 1.0 - 1e-12
"""ZeRO-0 counts as faster than ZeRO-1 only below this factor of its time (equal sums taken in
another order differ in the last bits)."""
_OWN: Any = object()
"""The search's own ZeRO synchronisation rule (:meth:`_Search.sync`), where another search's may be given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineOptions:
    """The search space of :func:`pipeline_search`."""

    global_batch: int
    """Samples per optimizer step (``--global-batch``)."""
    micro_batch: int | None = None
    """Samples per data-parallel rank per micro-batch (Megatron's ``--micro-batch-size``); ``None``:
    searched (every pipeline micro-batch size dividing the global batch)."""
    pipeline_sizes: tuple[int, ...] | None = None
    """Pipeline sizes to try; ``None``: every divisor of the device count up to the layer count
    whose stages fill whole nodes or fractions of one."""
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[Recompute, ...] = ("none", "selective", "full")
    schedule: Literal["gpipe", "1f1b", "interleaved", "zb-h1", "zbv"] = "1f1b"
    chunks: int = 1
    """Model chunks per device (``interleaved``, ``zb-h1``; ``zbv``: 2)."""
    model_parallel_inside_node: bool = True
    """On stages that span nodes, split an op's non-batch dims only inside a node (data parallelism, and the
    pricing's context split, across nodes), as Megatron-LM's rank order does; keeps 64-device stages fast."""
    memory_search_steps: int = 6
    """Memory-weighted searches tried per combination when its fastest choice does not fit."""
    fill_pipeline: bool = True
    """Require at least ``pp`` micro-batches per step: with fewer, stages idle most of the step and a
    1F1B stage holds as many activations (``m`` micro-batches of ``G / m`` samples) as with ``pp``
    micro-batches of ``G / pp``, so such plans are slower for the same memory."""
    skip_unfit: bool = True
    """Skip the micro-batch sizes that are multiples of one (itself a multiple of the stage's device
    count) whose leanest split of every op already exceeds the memory limit: activations only grow
    with the micro-batch, so none of their plans could fit (the result counts them)."""
    exact_recompute: bool = False
    """Run the intra-op search once per recomputation setting instead of once per (pp, micro-batch)
    with the first setting's costs (recomputation adds each recomputed op's forward time, which
    rarely changes the best split); the stage partition and the price are always per setting, and
    the memory-weighted searches use each setting's own costs."""
    exact_zero: bool = True
    """Run the intra-op search once per ZeRO group (0-1, 2, 3) instead of once per combination with
    ZeRO-1's costs, every stage then priced on that choice (ZeRO changes memory and the
    synchronisation pattern, rarely the best split). In the 0-1 group ZeRO-0 is priced only when
    ZeRO-1 is not searched: where no op's ZeRO-0 all-reduce is faster than its ZeRO-1
    reduce-scatter + all-gather (ring collectives) a ZeRO-0 point is never on the frontier beside
    its ZeRO-1 twin, which holds less; where one is (a tree all-reduce across nodes), ZeRO-0 gets
    its own search (:meth:`_Slot.zero_groups`)."""

    prune: bool = True
    """Skip a (pp, micro-batch, recompute, ZeRO) combination when a lower bound of its step time and
    one of its memory (:func:`_lower_bounds`) are dominated by a point already found: none of its
    plans could reach the frontier, so the frontier is the same with or without (the result counts
    them); ``False`` searches every combination (for comparisons)."""
    time_limit_s: float | None = None
    """Wall-clock seconds for the search (``--time-limit``): past it, once some point is found, no
    further (pipeline size, micro-batch) combination is started and the notes say which were left;
    ``None``: no limit."""
    max_micro_batches: int | None = None
    """Most micro-batches per step (``None``: any); 1 for a contrastive loss (:mod:`planner.coupling`)."""

    def __post_init__(self) -> None:
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise InputError(f"--time-limit must be a positive number of seconds (got {self.time_limit_s}), e.g. --time-limit 60")
        if self.global_batch < 1:
            raise InputError(f"--global-batch must be at least 1 (got {self.global_batch})")
        if self.micro_batch is not None and (self.micro_batch < 1 or self.global_batch % self.micro_batch):
            raise InputError(
                f"--micro-batch {self.micro_batch} must be positive and divide --global-batch {self.global_batch}"
            )
        for z in self.zero_stages:
            if z not in (0, 1, 2, 3):
                raise InputError(f"ZeRO stages are 0, 1, 2 or 3 (got {z})")
        for r in self.recompute:
            if r not in ("none", "selective", "mlp", "full", "op"):
                raise InputError(f"--recompute must be none, selective, mlp, full or op (got {r})")
        if self.schedule not in ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv"):  # objectives.schedules.SCHEDULES
            raise InputError(f"unknown pipeline schedule '{self.schedule}'; use gpipe, 1f1b, interleaved, zb-h1 or zbv")
        if self.chunks < 1 or (self.chunks > 1 and self.schedule not in ("interleaved", "zb-h1", "zbv")):
            raise InputError("--chunks > 1 needs --schedule interleaved, zb-h1 or zbv")
        if self.schedule == "zbv" and self.chunks != 2:
            raise InputError(f"--schedule zbv runs two model chunks per device in a V; pass --chunks 2 (got {self.chunks})")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineResult:
    """The frontier over (dp, per-op splits, pp, micro-batch, ZeRO, recompute)."""

    points: tuple[PipelinePoint, ...]
    """Pareto-optimal in (time, memory), fastest first."""
    chosen: int | None
    """The fastest point within the memory limit (``None``: none fits)."""
    memory_limit_bytes: float
    options: PipelineOptions
    message: str = ""
    search_time_s: float = 0.0
    combinations: int = 0
    """(pp, micro-batch, recompute, ZeRO group) combinations searched."""
    intra_op_searches: int = 0
    """Intra-op DPs run."""
    candidates: int = 0
    """Points priced before the Pareto filter."""
    cost_builds: int = 0
    skipped: int = 0
    """Combinations not priced: micro-batch sizes that cannot fit (``PipelineOptions.skip_unfit``)."""
    pruned: int = 0
    """Combinations not searched because their lower bounds are dominated (``PipelineOptions.prune``)."""
    notes: tuple[str, ...] = ()
    unsearched_sizes: tuple[int, ...] = ()
    """Pipeline sizes the time limit left not (fully) searched, in the order they were to be searched
    (empty: the search finished; a note says it too)."""
    target: str | None = None
    """The launch target the search was restricted to (``None``: every plan)."""
    cache: PipelinePricing | None = field(default=None, repr=False, compare=False)
    """The graphs and cost models the points were priced with (share it with
    :func:`planner.estimate.estimate` to rank a configuration without pricing again)."""

    def cost_model(self, point: PipelinePoint):
        """The ``objectives.tables.CostModel`` of one stage of ``point`` (for explanations; the
        search releases its models, so this builds it again, equal, on first use)."""
        assert self.cache is not None
        return self.cache.model(point.devices_per_stage, point.micro_batch_samples, point.zero_stage, point.recompute)

    @property
    def best(self) -> PipelinePoint | None:
        return None if self.chosen is None else self.points[self.chosen]


# --------------------------------------------------------------------------------------------
# pricing one plan

def _solve(cache: PipelinePricing, tables: CostTables, key_labels: tuple, edge_labels: tuple) -> np.ndarray | None:
    """PaSE's DP on ``tables``, reusing the elimination plan of tables with the same structure.

    Any plan whose regions were matched on the same equality pattern (which tables are equal) gives
    the exact optimum; the configuration counts only steer the order heuristics towards small tables.
    So one plan serves every recomputation, ZeRO stage, slot and memory weight, and every stage size
    and batch with the same equality pattern and the same ops at one configuration (the counts of a
    stage's ops grow together with its devices and batch, so the order chosen for one fits the
    others); choosing it costs more than the elimination itself.

    Like the flat search (:func:`planner.search.degrade.fastest_within`), the DP runs only when its
    predicted cost (:func:`planner.search.budget.estimate_plan`, once per plan) fits: at most
    ``cache.max_solve_s`` (default :data:`_MAX_SOLVE_S`) and the memory the process has left under
    ``cache.max_memory_bytes`` (default ``--max-memory``'s, ``min(4 GiB, half of RAM)``); otherwise a
    short seeded NSGA-II answers (:func:`planner.search.degrade.quick_fastest`: never slower than the
    replicated plans or each op's fastest row alone), never a ``MemoryError``.
    """
    from planner.search.budget import SearchBudget, default_max_memory_bytes, estimate_plan
    from planner.search.degrade import _NSGA2_MIN_S, quick_fastest, solve_fits

    single = tuple(t.shape[0] == 1 for t in tables.node_time_s)
    plan_key = (single, key_labels, edge_labels)
    plan = cache.plans.get(plan_key)
    if plan is None:
        # PaSE's GENERATESEQ and the fewest-cells order: on a chain of layers they find the orders the
        # networkx tree-decomposition heuristics find, several times faster
        plan = plan_elimination(tables, heuristics={"generate_seq": generate_seq, "min_cells": min_cells_seq})
        cache.plans[plan_key] = plan
    if ("estimate", plan_key) not in cache.plans:
        cache.plans[("estimate", plan_key)] = estimate_plan(tables, plan)
    estimate, ceiling = cache.plans[("estimate", plan_key)], getattr(cache, "max_memory_bytes", None) or default_max_memory_bytes()
    fits = solve_fits(estimate, max_seconds=float(getattr(cache, "max_solve_s", None) or _MAX_SOLVE_S),
                      memory_left_bytes=SearchBudget(max_memory_bytes=ceiling).memory_left_bytes())
    runner = getattr(elimination, "_solve", None)  # runs a given plan (solve_min, if it changes, plans again)
    try:
        if not (fits and solve_clock.in_time(estimate.time_s)):  # over the budget, or past the search's deadline
            raise MemoryError  # answered as when the process runs out
        if runner is None:
            raise TypeError
        choice, value = runner(tables, plan, tables.node_time_s, solve_clock.check)  # stops it past the deadline
    except TypeError:  # a changed signature
        best = elimination.solve_min(tables, objective="time", plan=plan)
        choice, value = best.choice, best.value
    except (MemoryError, solve_clock.SolvePastDeadline):  # the heuristic answers in time (counted: the search says so)
        cache.plans[_DEGRADED] = cache.plans.get(_DEGRADED, 0) + 1
        return quick_fastest(tables, time_limit_s=solve_clock.heuristic_seconds(_NSGA2_MIN_S))
    return choice if np.isfinite(value) else None


_MAX_SOLVE_S = 30.0
"""Predicted seconds above which one per-stage intra-op DP is not run (the search runs many)."""

_DEGRADED = ("degraded",)  # key of pricing.plans: intra-op searches a heuristic answered (_solve)


def _choose_intra_op(
    cache: PipelinePricing,
    restricted: _Restricted,
    *,
    slots: float,
    in_flight: float,
    memory_weight_s_per_byte: float = 0.0,
) -> np.ndarray | None:
    r"""The intra-op DP of step 2: minimise :math:`\sum_i W(f_i + b_i) + g_i + \lambda M_i` over
    the allowed configurations (:math:`M_i` = states + ``in_flight`` x activations, with the
    allowance), :math:`W` = ``slots``. ``None`` when every choice has infinite cost.
    """
    times: dict[int, np.ndarray] = {}
    memories: dict[int, np.ndarray] = {}
    for k, t in restricted.time_s.items():
        memory = cache.memory_scale * (restricted.states_bytes[k] + in_flight * restricted.activations_bytes[k])
        cost = slots * t + restricted.step_s[k]
        if memory_weight_s_per_byte:
            cost = cost + memory_weight_s_per_byte * memory
        times[k] = cost
        memories[k] = memory
    tables = CostTables(
        configs=restricted.configs,
        node_time_s=tuple(times[k] for k in restricted.key),
        node_memory_bytes=tuple(memories[k] for k in restricted.key),
        edges=restricted.edges,  # per micro-batch: the enumeration scales the cells it reads
        blocks=restricted.blocks,
    )
    few = solve_by_enumeration(tables, edge_scale=slots)  # a family that leaves a few ops free: no elimination needed
    if few is not None:
        picks = few[0] if np.isfinite(few[1]) else None
    else:
        tables = CostTables(configs=tables.configs, node_time_s=tables.node_time_s, blocks=tables.blocks,
                            node_memory_bytes=tables.node_memory_bytes, edges=_edges_per_step(restricted, slots))
        digests = {k: (_digest(times[k]), _digest(memories[k])) for k in times}
        picks = _solve(cache, tables, _labels([digests[k] for k in restricted.key]), restricted.edge_labels)
    if picks is None:
        return None
    return np.array([int(m[c]) for m, c in zip(restricted.index_maps, picks)], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# the search (a stage's restrictions, the search's masks and a target's families: planner.search.stage_restriction)


@dataclass(slots=True, kw_only=True, eq=False)
class _Search:
    """The state of one search: its frontier and counts, shared by every (pp, micro-batch) slot."""

    pricing: PipelinePricing
    options: PipelineOptions
    limit_bytes: float
    rules: TargetRules | None
    zero_groups: list[tuple[int, ...]]
    frontier: _Frontier = field(default_factory=lambda: _Frontier())
    deadline_s: float | None = None
    """``time.perf_counter()`` past which, once a point is found, no further combination starts."""
    informs: bool = False  # past the deadline, any seed stands for a point found (search_pipeline's informs)
    combos: int = 0
    searches: int = 0
    skipped: int = 0
    pruned: int = 0

    @property
    def memory_rules(self) -> dict[str, bool]:
        """:func:`search_memory_rules` of this search."""
        return search_memory_rules(self.rules, self.pricing)

    def sync(self, zero_stage: int, rule: Any = _OWN, gather: Any = _OWN) -> dict[str, Any]:
        """``{"zero_sync": rule}`` at ZeRO 0-2 under a launcher's rule (:attr:`TargetRules.zero_sync`), and
        ``{"zero3_gather": bounds}`` at ZeRO-3 under the search's own (:attr:`TargetRules.zero3_gather`: DeepSpeed's
        gathers, their time priced by ``objectives.deepspeed_zero3``), else none: the keyword every ``pricing.arrays``
        and ``pricing.price`` of the search takes, and part of its kept keys. ``rule``, ``gather``: another search's
        ZeRO 0-2 rule and ZeRO-3 gathers (a later search's over the pricing, :meth:`_Slot.keep_own_bounds`; ``None``:
        none)."""
        gather = getattr(self.rules, "zero3_gather", None) if gather is _OWN else gather  # ZeRO-3's time rule
        if zero_stage >= 3:
            return {"zero3_gather": gather} if gather is not None else {}
        rule = getattr(self.rules, "zero_sync", None) if rule is _OWN else rule
        return {"zero_sync": rule} if rule is not None and zero_stage in ZERO_SYNC_STAGES else {}

    def run(self, sizes: Sequence[int], report: Callable[[str, float], None], deadline_s: float | None) -> int | None:
        """Search every pipeline size; the first size not (fully) searched at the deadline, or ``None``."""
        cluster = self.pricing.cluster
        stopped_at: int | None = None
        self.deadline_s = deadline_s
        for step_index, pp in enumerate(sizes):
            if not self.runs_any(pp):
                continue  # the target runs no plan at this pipeline size (DTensor's pp > 1): nothing is built
            if stopped_at is not None or self._late(deadline_s):
                return pp if stopped_at is None else stopped_at  # the time limit: the points found are kept
            report("pipeline search", step_index / len(sizes))
            devices = cluster.devices // pp
            min_batch = least_micro_batch(self.pricing, self.options, devices, self.rules)  # the batch split's nodes
            unfit: dict[str, int] = {}  # recompute -> a micro-batch size too large to fit
            for batch, data_parallel in _batches(self.options, devices, min_batch, pp):
                if self._late(deadline_s):
                    stopped_at = pp
                    break
                micro_batches = self.options.global_batch // batch
                looped = self.options.schedule == "interleaved" or (self.options.schedule == "zb-h1" and self.options.chunks > 1)
                if (looped and pp > 1 and micro_batches % pp) or (self.options.fill_pipeline and micro_batches < pp):
                    continue
                release = not self.pricing.holds(devices, batch)  # built here: dropped when this batch is done
                if _Slot.make(self, pp=pp, batch=batch, data_parallel=data_parallel).run(unfit):
                    stopped_at = pp  # cut short inside (pp, batch): noted even when it was the last one
                if release and not getattr(self.pricing, "keep", False):  # (kept: nothing is dropped)
                    self.frontier.points  # noqa: B018 - the points of its plans built while its models are held
                    self.pricing.release(devices, batch)
        return stopped_at

    def runs_any(self, pp: int, recompute: Sequence[str] | None = None) -> bool:
        """Whether the target runs some plan at pipeline size ``pp`` with a recompute setting of
        ``recompute`` (default: the search's), whatever its ZeRO stage and tensor-parallel degree
        (the rules tell only ``tp = 1`` from ``tp > 1``); without a target, always."""
        rules, schedule = self.rules, self.options.schedule
        return rules is None or any(
            rules.allows(pp=pp, zero_stage=z, recompute=r, schedule=schedule, tp=tp)
            for r in (recompute or self.options.recompute) for group in self.zero_groups for z in group
            for tp in (None, 1, 2)
        )

    def _late(self, deadline_s: float | None) -> bool:
        """Past the deadline with a plan to show: its own, or a seed within the memory limit (the
        table's pick; any seed if it ``informs``). Without one a launcher's search goes on to its first."""
        seeds = [s for s in self.frontier.seeds if self.informs or s[1] <= self.limit_bytes]
        return deadline_s is not None and bool(self.frontier.entries or seeds) and time.perf_counter() > deadline_s


@dataclass(slots=True, kw_only=True, eq=False)
class _Slot:
    """One (pipeline size, micro-batch) of the search: its recompute x ZeRO-group combinations."""

    search: _Search
    pp: int
    devices: int
    batch: int
    data_parallel: int | None
    micro_batches: int
    structure: LayerStructure
    in_flight: np.ndarray
    p2p_floor_s: np.ndarray
    mask_list: list[np.ndarray] | None = None
    """:attr:`masks` once built; with a target, the union of its families once they are known."""
    search_masks: bool = True
    """Whether :attr:`masks` are the search's own (``pricing.masks``), not a target's union."""
    families: tuple[_TargetFamily, ...] = ()
    families_known: bool = False
    shared: dict[tuple, dict] = field(default_factory=dict)
    """Intra-op choices (per family) shared between recompute settings."""
    lower: dict[tuple, tuple[float, float]] = field(default_factory=dict)
    time_floor: float = 0.0
    """pp=1: the least step time of any plan here at ZeRO-1 or above, once known (:meth:`_search_group`)."""
    floor_bounds_zero0: bool = True
    """Whether :attr:`time_floor` bounds ZeRO-0's plans too: only where the 0-1 group is searched as one (ZeRO-0
    at ZeRO-1's time); split (:meth:`zero_groups`), ZeRO-0's plans may be faster than ZeRO-1's optimum."""
    fastest_cuts: dict[tuple, tuple[Any, StepPartition]] = field(default_factory=dict)
    """``(the picks' bytes, ZeRO stage, recompute) -> (segment costs, cut of least step time)``, for a choice's
    leaner cuts and the equal choices the memory search finds again (:meth:`_cuts`; oldest out past
    :data:`~planner.search.stage_costs.KEPT_COSTS_BYTES`)."""

    @staticmethod
    def make(search: _Search, *, pp: int, batch: int, data_parallel: int | None) -> _Slot:
        pricing, options = search.pricing, search.options
        devices = pricing.cluster.devices // pp
        micro_batches = options.global_batch // batch
        structure = pricing.structure(batch)
        in_flight = pricing.in_flight(options.schedule, stages=pp, micro_batches=micro_batches, chunks=options.chunks)
        return _Slot(
            search=search, pp=pp, devices=devices, batch=batch, data_parallel=data_parallel,
            micro_batches=micro_batches, structure=structure, in_flight=in_flight,
            p2p_floor_s=pricing.p2p_floor_s(structure, pp, devices) if options.prune else np.zeros(0),
            families_known=search.rules is None,
        )

    @property
    def masks(self) -> list[np.ndarray]:
        """The search's masks (built on first need: a slot that bounds kept from an earlier search
        prune builds no model); with a target, the union of its families once they are known."""
        if self.mask_list is None:
            self.mask_list = self.own_masks()
        return self.mask_list

    def own_masks(self) -> list[np.ndarray]:
        """The search's own masks (``pricing.masks``), whether or not :attr:`masks` is a target's union."""
        options = self.search.options
        return self.search.pricing.masks(
            self.devices, self.batch, inside_node=options.model_parallel_inside_node, data_parallel=self.data_parallel
        )

    def kept(self, what: tuple, compute: Callable[[], Any], *, reads_masks: bool = True) -> Any:
        """``compute()``, kept in ``pricing.lasting`` under ``what`` when it reads the pair's models
        and at most the search's own masks: every search over this pricing builds those alike (the
        next launcher's, the headroom search), so their bounds need no model built again. On a miss
        the masks are built first, so the pair's first model is the one they build, as before."""
        if reads_masks and not self.search_masks:
            return compute()
        store = self.search.pricing.lasting(self.devices, self.batch)
        key = (*what, self.search.options.model_parallel_inside_node, self.data_parallel)
        if key not in store:
            self.masks  # noqa: B018 - built first (see above)
            store[key] = compute()
        return store[key]

    @property
    def slots(self) -> int:
        """Micro-batch slots of the bottleneck stage, :math:`W = m + pp - 1`."""
        return self.micro_batches + self.pp - 1

    # ---- the target's families and ZeRO stages

    def target_families(self) -> tuple[_TargetFamily, ...]:
        """The target's families here, computed on first need (a pruned micro-batch needs none);
        from then on the bounds use their union, tighter than the pipeline's masks."""
        if not self.families_known:
            assert self.search.rules is not None
            found = target_families(
                self.search.pricing, self.search.rules, self.devices, self.batch,
                inside_node=self.search.options.model_parallel_inside_node, data_parallel=self.data_parallel,
            )
            self.families, self.families_known = found.families, True
            if self.families:
                self.mask_list, self.search_masks = list(found.union), False
        return self.families

    def zeros(self, group: tuple[int, ...], recompute: str, tp: int | None,
              runs: frozenset[tuple[int, str]] | None = None) -> tuple[int, ...]:
        """The ZeRO stages of ``group`` priced for a family of tensor-parallel degree ``tp`` (``runs``: the pairs its
        exporter runs it at, ``_TargetFamily.runs``; ``None``: any)."""
        rules = self.search.rules
        if rules is None:
            return priced_zero_stages(group)
        allowed = tuple(
            z for z in group if (runs is None or (z, recompute) in runs)
            and rules.allows(pp=self.pp, zero_stage=z, recompute=recompute, schedule=self.search.options.schedule, tp=tp)
        )
        return priced_zero_stages(allowed)

    def any_zeros(self, group: tuple[int, ...], recompute: str) -> tuple[int, ...]:
        """The ZeRO stages of ``group`` priced for some family, whatever its ``tp`` (the rules tell
        only ``tp = 1`` from ``tp > 1``): a superset, for the bounds before the families."""
        return tuple(sorted({z for tp in (None, 1, 2) for z in self.zeros(group, recompute, tp)}))

    def group_families(self, group: tuple[int, ...]) -> list[int]:
        """Families with a ZeRO stage of ``group`` priced under some recomputation setting."""
        return [
            i for i, f in enumerate(self.families)
            if any(self.zeros(group, r, f.tp, f.runs) for r in self.search.options.recompute)
        ]

    # ---- pruning by lower bounds

    def beaten(self, key: tuple, recompute: str, stages: Sequence[int], family: _TargetFamily | None = None) -> bool:
        """Whether a point already found dominates every plan of ``family`` (``None``: of
        :attr:`masks`) at these ZeRO stages (:func:`_lower_bounds`, the least over the stages; kept
        under ``key``, and those of the search's own masks in ``pricing.lasting``)."""
        search, options = self.search, self.search.options
        if not options.prune or search.frontier.empty:
            return False
        if key not in self.lower:
            bound_t = bound_m = math.inf
            for z in stages:
                what = ("bounds", z, recompute, self.pp, self.micro_batches, options.schedule, options.chunks,
                        *search.memory_rules.values(), *search.sync(z).values())
                # (the masks read inside: a kept bound builds none)
                t, m = self.bound(z, recompute, family.masks) if family is not None else self.kept(
                    what, lambda z=z: self.bound(z, recompute, self.masks))
                bound_t, bound_m = min(bound_t, t), min(bound_m, m)
            self.lower[key] = (bound_t, bound_m)
        bound_t, bound_m = self.lower[key]
        floor = self.time_floor if self.floor_bounds_zero0 or 0 not in stages else 0.0
        return search.frontier.beats(max(bound_t, floor), bound_m)

    def bound(self, z: int, recompute: str, masks: Sequence[np.ndarray], rules: dict | None = None,
              zero_sync: Any = _OWN, zero3_gather: Any = _OWN) -> tuple[float, float]:
        """:func:`_lower_bounds` of the combination at ZeRO stage ``z`` over ``masks`` (``rules``: the
        memory rules, default the search's; ``zero_sync``, ``zero3_gather``: the ZeRO synchronisation rule and ZeRO-3
        gathers, default the search's)."""
        search, options = self.search, self.search.options
        arrays = search.pricing.arrays(self.devices, self.batch, z, recompute, edges=False,
                                       **search.sync(z, zero_sync, zero3_gather))
        bound_t, bound_m = _lower_bounds(
            search.pricing, arrays, masks, self.structure, pp=self.pp, micro_batches=self.micro_batches,
            in_flight=self.in_flight, p2p_floor_s=self.p2p_floor_s, schedule=options.schedule, chunks=options.chunks,
            credit=self.credit(arrays, recompute, rules),
        )
        return bound_t, bound_m + self.nccl_floor()

    def nccl_floor(self) -> float:
        """Bytes of NCCL's buffers every plan here holds at least (the pricing's ``nccl_floor_bytes``; 0 for a
        pricing without them): a term of every price, so of every memory bound and floor."""
        floor = getattr(self.search.pricing, "nccl_floor_bytes", None)
        return float(floor(self.devices, self.pp)) if floor is not None else 0.0

    def credit(self, arrays: StageArrays, recompute: str, rules: dict | None = None) -> dict | None:
        """Each op's largest activation credit under ``rules`` (default the search's
        :attr:`_Search.memory_rules`), for bounds below every credited price; ``None``: none."""
        return self.search.pricing.activation_credit_ceiling(arrays, recompute, **(rules or self.search.memory_rules))

    def keep_own_bounds(self, groups: Sequence[tuple[int, ...]], recompute: str) -> None:
        """Keep the bounds over the search's own masks of every ZeRO stage of ``groups`` in
        ``pricing.lasting``, while this pair's models are built (issue 22, seventh round). A
        target's search bounds by its families' union and skips the groups it refuses; a later
        search over the cache (the next launcher's, the headroom search) bounds every group by the
        search's masks, and with these kept prunes the pair without building its models again.
        Under a later search's ZeRO synchronisation rule (``pricing.later_zero_syncs``: DeepSpeed's after
        Megatron-LM's search) its own 0-1 split (:meth:`zero_groups`) and bounds are kept too, and under a
        later search's memory rules the micro-batch's memory floor (:meth:`_unfit`): each would otherwise
        build the pair's models again (issue 22, eighth round)."""
        options = self.search.options
        # only under the memory rules of a search still to read the cache (None: not known, both)
        later = getattr(self.search.pricing, "later_memory_rules", None)
        syncs = getattr(self.search.pricing, "later_zero_syncs", None)  # None: not known, the search's own
        own = getattr(self.search.rules, "zero_sync", None)
        gathers = getattr(self.search.pricing, "later_zero3_gathers", None)  # their ZeRO-3 time rules (DeepSpeed's)
        own_gather = getattr(self.search.rules, "zero3_gather", None)
        none = dict.fromkeys(self.search.memory_rules, False)  # also without them: for the launchers without
        memory_rules = [rules for rules in [self.search.memory_rules] + ([none] if self.search.memory_rules != none else [])
                        if later is None or tuple(rules.values()) in later]
        for rule in [own] if syncs is None else [own, *(r for r in syncs if r is not own)]:
            if syncs is not None and rule not in syncs:
                continue
            # a later rule's own 0-1 split (kept as its search asks it), so its ZeRO-0 bounds are kept where it splits
            stage_groups = groups if rule is own else self.zero_groups(recompute, rule)
            for z in sorted({z for group in stage_groups for z in priced_zero_stages(group)}):
                for gather, rules in itertools.product([own_gather] if z < 3 or gathers is None else gathers, memory_rules):
                    sync = self.search.sync(z, rule, gather)
                    if not self._read_later(z, recompute, rules, sync):
                        continue  # no later search asks this key (its launcher runs no such plan here): never read
                    what = ("bounds", z, recompute, self.pp, self.micro_batches, options.schedule, options.chunks,
                            *rules.values(), *sync.values())
                    self.kept(what, lambda z=z, rules=rules, rule=rule, gather=gather: self.bound(
                        z, recompute, self.own_masks(), rules, rule, gather), reads_masks=False)
        if later is not None and self._floored():
            for values in later:  # the floor _unfit keeps under the search's own rules, under a later search's
                rules = dict(zip(self.search.memory_rules, values))
                self.kept(self._floor_key(recompute, rules), lambda rules=rules: self._floor(recompute, self.own_masks(), rules),
                          reads_masks=False)

    def _read_later(self, z: int, recompute: str, rules: Mapping[str, bool], sync: Mapping[str, Any]) -> bool:
        """Whether a later search over the pricing (``pricing.later_rules``: their :class:`TargetRules`, ``None`` for
        one without; the attribute ``None``: not known, every key may be) may ask the bound kept under ZeRO stage ``z``,
        ``recompute``, memory ``rules`` and ZeRO synchronisation ``sync``: one whose launcher pipelines ``z`` at this
        size for some ``tp`` (:meth:`_Slot.any_zeros`, the stages its :meth:`dominated` bounds), under those memory
        rules and that synchronisation (:meth:`_Search.sync` of its rules). Any other key is never read: DeepSpeed's
        ZeRO-3 gathers at ``pp > 1``, where DeepSpeed runs no ZeRO-3 (GPT-3 175B / 1,024 devices: 396 such bounds
        kept during Megatron-LM's search, none read, 17% of the plan's CPU; docs/PERFORMANCE.md, eleventh round)."""
        later = getattr(self.search.pricing, "later_rules", None)
        if later is None:
            return True
        schedule = self.search.options.schedule
        for other in later:
            if other is not None and not any(other.allows(pp=self.pp, zero_stage=z, recompute=recompute, schedule=schedule,
                                                          tp=tp) for tp in (None, 1, 2)):
                continue
            if search_memory_rules(other, self.search.pricing) != dict(rules):
                continue
            theirs = self.search.sync(z, getattr(other, "zero_sync", None), getattr(other, "zero3_gather", None))
            if theirs.keys() == sync.keys() and all(theirs[k] is sync[k] or theirs[k] == sync[k] for k in sync):
                return True
        return False

    def family_dominated(self, index: int | None, recompute: str, group: tuple[int, ...]) -> bool:
        """Whether every plan of one family of the target in the combination is provably dominated
        by a point already found (its own masks: tighter than the union's)."""
        if index is None:
            return False
        family = self.families[index]
        return self.beaten((index, recompute, group), recompute, self.zeros(group, recompute, family.tp, family.runs), family)

    def live_families(self, recompute: str, group: tuple[int, ...]) -> list[int | None]:
        """The families (``[None]`` without a target) whose plans in the combination are not all
        dominated already."""
        if self.search.rules is None:
            return [None]
        return [i for i in self.group_families(group) if not self.family_dominated(i, recompute, group)]

    def dominated(self, recompute: str, group: tuple[int, ...]) -> bool:
        """Whether every plan of the combination is provably dominated by a point already found."""
        if self.search.rules is not None:
            stages = self.any_zeros(group, recompute)
        else:
            stages = priced_zero_stages(group)
        return self.beaten((None, recompute, group), recompute, stages)

    # ---- intra-op choices and their prices

    def choose(
        self, zero: int, recompute: str, weight: float, wanted: Sequence[int | None]
    ) -> dict[int | None, np.ndarray | None]:
        """Family (or ``None``) -> choice of the intra-op DP (``None``: no finite choice), for the
        ``wanted`` families."""
        search, options = self.search, self.search.options
        chosen: dict[int | None, np.ndarray | None] = {}
        for index in wanted:
            single = None if index is None else self.families[index].single
            if single is not None:
                # any weight picks the one plan, priced at weight 0 already
                chosen[index] = None if weight else single
                continue
            search.searches += 1
            family = None
            if index is not None:
                assert search.rules is not None
                family = ((search.rules.name, index), self.families[index].masks)
            table = restricted(
                search.pricing, self.devices, self.batch, zero, recompute,
                inside_node=options.model_parallel_inside_node, data_parallel=self.data_parallel, family=family,
                **search.sync(zero),
            )
            chosen[index] = _choose_intra_op(
                search.pricing, table, slots=self.slots, in_flight=float(self.in_flight[0]),
                memory_weight_s_per_byte=weight,
            )
        return chosen

    def price(
        self, candidates: Mapping[int | None, np.ndarray | None], zero: int, recompute: str, group: tuple[int, ...],
        *, cuts: _Cuts = "fastest",
    ) -> list[Priced]:
        found = []
        for index, picks in candidates.items():
            if picks is None:
                continue
            family = None if index is None else self.families[index]
            priced = self.zeros(group, recompute, family and family.tp, family and family.runs)
            found += self.price_one(picks, zero, recompute, priced, cuts=cuts)
        return found

    def price_one(
        self, picks: np.ndarray, zero: int, recompute: str, priced: tuple[int, ...], *, cuts: _Cuts = "fastest"
    ) -> list[Priced]:
        """Cut the layers into stages for ``picks`` at each ZeRO stage of ``priced`` and price the plan;
        every price goes to the frontier, and the plans at the cut of least step time are returned (what
        the memory search measures its weights by). ``cuts``: that cut only; ``"pareto"``: also the
        leaner cuts of the time/memory trade-off (:meth:`_cuts`, step 5), each priced unless a point
        found dominates its segment costs (which are its price); ``"leaner"``: those alone (the
        fastest cut priced already)."""
        if not priced:
            return []
        search, options = self.search, self.search.options
        found, leaner = [], []
        cells = {"chosen_edges": True} if edge_cells(search.pricing, self.devices, self.batch, data_parallel=self.data_parallel,
                                                     inside_node=options.model_parallel_inside_node) is not None else {}

        def price(z: int, bounds: Sequence[int]) -> Priced:  # (with cells: the edges at the picks, no whole table)
            return search.pricing.price(
                pp=self.pp, batch=self.batch, zero_stage=z, recompute=recompute, choice=picks, bounds=bounds,
                global_batch=options.global_batch, schedule=options.schedule, chunks=options.chunks,
                memory_limit_bytes=search.limit_bytes, grad_accumulator=getattr(search.rules, "grad_accumulator", None),
                pipeline_buffers=getattr(search.rules, "pipeline_buffers", None), **cells,
                **search.memory_rules, **{"zero3_gather": getattr(search.rules, "zero3_gather", None), **search.sync(z)},
            )

        for z in priced:
            arrays = search.pricing.arrays(self.devices, self.batch, z, recompute, edges=not cells, **search.sync(z))
            chosen = self._cuts(arrays, picks, z, recompute, pareto=cuts != "fastest")
            if cuts != "leaner":
                found.append(price(z, chosen[0].bounds))
            leaner += [(z, cut) for cut in chosen[1:]]
        for point in found:
            search.frontier.add(point)
        for z, cut in leaner:  # lowered by the bounds' slack: only a point that surely dominates skips one
            if not search.frontier.beats(cut.step_s * _BOUND_SLACK, cut.memory_bytes * _BOUND_SLACK):
                search.frontier.add(price(z, cut.bounds))
        return found

    def _cuts(self, arrays: StageArrays, picks: np.ndarray, z: int, recompute: str, *, pareto: bool) -> tuple[ParetoCut, ...]:
        """The stage bounds of least step time for ``picks`` as ``pricing.price`` prices it
        (:func:`planner.search.stages.partition_step_time` over :func:`_segment_costs`), among the
        cuts within the memory limit when some are; with ``pareto``, then the cut of least step time
        under each smaller cap of the stages' memory (:func:`planner.search.stages.pareto_cuts`: every
        cut of a better trade-off a point found does not dominate; the first cut kept from the
        choice's pricing at its fastest cut, :attr:`fastest_cuts`). One stage: its one cut (step time
        and memory not computed: NaN)."""
        if self.pp <= 1:
            return (ParetoCut(bounds=(0, self.structure.num_layers), step_s=math.nan, memory_bytes=math.nan),)
        pricing, options, limit = self.search.pricing, self.search.options, self.search.limit_bytes
        key = (picks.tobytes(), z, recompute)
        if key not in self.fastest_cuts:
            costs = _step_costs(
                pricing, arrays, self.structure, picks, pp=self.pp, recompute=recompute, in_flight=self.in_flight,
                schedule=options.schedule, micro_batches=self.micro_batches, chunks=options.chunks,
                zero_stage=z, zero3_gather=getattr(self.search.rules, "zero3_gather", None),  # None: the pricing's own
                grad_accumulator=getattr(self.search.rules, "grad_accumulator", None), **self.search.memory_rules,
                pipeline_buffers=getattr(self.search.rules, "pipeline_buffers", None),
                chosen=pricing.chosen_edges(self.devices, self.batch, recompute, picks)  # the cells' (objectives.edge_cells)
                if not arrays.edges and edge_cells(pricing, self.devices, self.batch) is not None else None,
            )
            bounds = partition_step_time(costs, self.pp, memory_limit=limit).bounds
            keep_newest(self.fastest_cuts, key, (costs, StepPartition(
                bounds=bounds, step_s=step_time_of_cut(costs, bounds), feasible=True)))
        costs, first = self.fastest_cuts[key]
        if pareto:  # the caps skip the cuts a point found dominates
            return pareto_cuts(costs, self.pp, memory_limit=limit, ceiling=self.search.frontier.ceiling, first=first)
        return (ParetoCut(bounds=first.bounds, step_s=first.step_s, memory_bytes=math.nan),)

    # ---- the combinations

    def _unfit(self, recompute: str, unfit: dict[str, int]) -> bool:
        """Whether no plan of this micro-batch can fit with ``recompute`` (``PipelineOptions.skip_unfit``),
        recording the smallest such micro-batch in ``unfit``: its multiples cannot fit either."""
        search = self.search
        if recompute in unfit and self.batch % unfit[recompute] == 0 and self.data_parallel is None:
            return True
        if self._floored():
            what = self._floor_key(recompute, search.memory_rules)
            floor = self.kept(what, lambda: self._floor(recompute, self.masks))
            if not self.search_masks:  # a target's union: the floor over the search's own masks kept for later searches
                self.kept(what, lambda: self._floor(recompute, self.own_masks()), reads_masks=False)
            if floor / self.pp + self.nccl_floor() > search.limit_bytes:
                unfit.setdefault(recompute, self.batch)  # it and its multiples: no plan fits
                return True
        return False

    def _floored(self) -> bool:
        """Whether :meth:`_unfit` bounds this micro-batch by its memory floor."""
        return self.search.options.skip_unfit and self.batch % self.devices == 0 and self.data_parallel is None

    def _floor_key(self, recompute: str, rules: dict[str, bool]) -> tuple:
        """The kept key of :meth:`_floor` under the memory ``rules``."""
        return ("floor", max(self.search.options.zero_stages), recompute, float(self.in_flight.min()), *rules.values())

    def _floor(self, recompute: str, masks: Sequence[np.ndarray], rules: dict[str, bool] | None = None) -> float:
        """The least memory of a plan of this micro-batch over ``masks`` at the search's largest ZeRO stage, all on
        one stage (``rules``: the memory rules, default the search's)."""
        search = self.search
        arrays = search.pricing.arrays(self.devices, self.batch, max(search.options.zero_stages), recompute, edges=False)
        return _memory_floor(arrays, masks, float(self.in_flight.min()), scale=search.pricing.memory_scale,
                             credit=self.credit(arrays, recompute, rules), structure=self.structure)

    def zero_groups(self, recompute: str, rule: Any = _OWN) -> list[tuple[int, ...]]:
        """The search's ZeRO groups here: the 0-1 group split in two where some op's ZeRO-0
        synchronisation is faster than its ZeRO-1 one (an all-reduce across nodes as a tree, while
        ZeRO-1's reduce-scatter and all-gather run as rings), or where the launcher's rule prices ZeRO-0 at
        ZeRO-1's states (DeepSpeed's ``BF16_Optimizer`` on a pipeline stage, ``StageArrays.states_zero_stage``:
        no longer ZeRO-1's leaner twin, its own optimizer's bytes apart), so that ZeRO-0's plans are searched.
        ``rule``: under another ZeRO synchronisation rule than the search's (:meth:`_Search.sync`)."""
        groups, sync = self.search.zero_groups, self.search.sync(1, rule)
        if (0, 1) not in groups or (self.devices <= self.search.pricing.cluster.devices_per_node and not sync):
            return groups  # inside a node every collective is a ring: ZeRO-0's all-reduce is no faster (a launcher's rule may be)
        pricing = self.search.pricing

        def faster() -> bool:
            zero0 = pricing.arrays(self.devices, self.batch, 0, recompute, edges=False, **self.search.sync(0, rule))
            zero1 = pricing.arrays(self.devices, self.batch, 1, recompute, edges=False, **sync)
            return bool(np.any(zero0.flat["step_s"] < _NO_FASTER * zero1.flat["step_s"])
                        or getattr(zero0, "states_zero_stage", 0) > 0)

        if not self.kept(("zero-0 faster", recompute, *sync.values()), faster, reads_masks=False):
            return groups
        at = groups.index((0, 1))
        return [*groups[:at], (0,), (1,), *groups[at + 1:]]

    def run(self, unfit: dict[str, int]) -> bool:
        """Search every (recompute, ZeRO group) of this slot; whether the time limit cut it short."""
        search = self.search
        for recompute in search.options.recompute:
            if search._late(search.deadline_s):
                return True
            if not search.runs_any(self.pp, (recompute,)):
                continue  # the target runs nothing with this recompute setting here: no model is built for it
            if self._unfit(recompute, unfit):
                search.skipped += len(search.zero_groups)
                continue
            groups = self.zero_groups(recompute)
            for group in groups:
                if search._late(search.deadline_s):
                    return True
                self._search_group(recompute, group)
            # the models of this recompute setting are built: bounded here, unless they are kept for the later searches
            # (PipelineCostCache.keep), which bound by them as cheaply, and only where they prune
            if search.rules is not None and search.pricing.searched_again and not getattr(search.pricing, "keep", False) \
                    and any(key[1] == recompute for key in self.lower):
                self.keep_own_bounds(groups, recompute)
        return False

    def _search_group(self, recompute: str, group: tuple[int, ...]) -> None:
        """One (recompute, ZeRO group) combination: bound it, choose, price, and search memory
        weights when its fastest choice does not fit. At pp = 1 the DP optimum of the group holding ZeRO-1
        bounds the step time of every later plan of the micro-batch at ZeRO-1 or above (:attr:`time_floor`)."""
        search, options = self.search, self.search.options
        targeted = search.rules is not None
        if targeted and not self.any_zeros(group, recompute):
            return  # the target refuses every ZeRO stage of the group here
        search.combos += 1
        if self.dominated(recompute, group):
            search.pruned += 1
            return
        self.masks  # noqa: B018 - the pair's first model is the one its masks build (kept bounds may have built none)
        if targeted and not any(self.zeros(group, recompute, f.tp, f.runs) for f in self.target_families()):
            return  # no family of the target here takes these settings
        objective_zero = objective_zero_stage(group)
        objective_recompute = recompute if options.exact_recompute else options.recompute[0]
        wanted = self.live_families(recompute, group)
        store = self.shared.setdefault((objective_zero, objective_recompute), {})
        store.update(self.choose(objective_zero, objective_recompute, 0.0, [i for i in wanted if i not in store]))
        by_family = {i: self.price({i: store[i]}, objective_zero, recompute, group) for i in wanted}
        found = [p for more in by_family.values() for p in more]
        every_family = not targeted or len(wanted) == len(self.families)
        if (
            found and self.pp == 1 and objective_zero == 1
            and recompute == objective_recompute == "none" and every_family and not search.sync(1)
        ):
            # One stage: the DP's objective is the step time itself, so its optimum is the least step
            # time of every ZeRO-1 plan of this micro-batch; the later ZeRO stages only add synchronisation
            # to it and recomputation only adds compute. ZeRO-0 in the group costs ZeRO-1's time; in a group
            # of its own (split where some op's all-reduce is faster) its plans may be faster than this
            # optimum, so the floor does not bound them (before, ZeRO-0's optimum bounded ZeRO-1/2: GPT-3
            # 175B / 1,024 at pp 1, its 17.67 s pruned a 16.85 s ZeRO-2 plan; issue 22, h30i). (A launcher's
            # ZeRO-1/2 rule may price ZeRO-2 below ZeRO-1: no floor then.)
            self.time_floor = max(self.time_floor, min(p.time_s for p in found) * _BOUND_SLACK)
            self.floor_bounds_zero0 = 0 in group
        if not found or options.memory_search_steps <= 0 or (any(p.fits for p in found) and not targeted):
            return
        lean = search.pricing.arrays(self.devices, self.batch, max(group), recompute, edges=False)
        floor = _memory_floor(lean, self.masks, float(self.in_flight.min()), scale=search.pricing.memory_scale,
                              credit=self.credit(lean, recompute), structure=self.structure) / self.pp + self.nccl_floor()
        if floor > search.limit_bytes:
            return  # no split of the ops fits: do not search memory weights
        if any(p.fits for p in found) and min(p.memory_bytes for p in found) <= floor * (1.0 + LEAN_TOLERANCE):
            # no leaner plan of the combination to list (the DP's objective is not the step time,
            # so a leaner choice may also be faster: only the bounds of _memory_search prune it)
            return
        if targeted:  # the leaner search: the fastest choices' leaner stage cuts are Pareto points of their own
            self.price({i: store[i] for i in wanted}, objective_zero, recompute, group, cuts="leaner")
        self._memory_search(recompute, group, by_family, until_fits=not targeted)

    def _memory_search(
        self, recompute: str, group: tuple[int, ...], by_family: Mapping[int | None, list[Priced]], *, until_fits: bool
    ) -> None:
        """Step 5: the memory-weighted objective over a geometric range of weights, until a choice fits
        (``until_fits``) or, for a launcher's rows, until the weights buy no memory a listed row
        could need: a family's leaner per-op choices (a position embedding split rather than copied)
        are Pareto points of their own even when the fastest fits."""
        # each family on its own: its weights start from its own fastest plan and it stops once they
        # buy it no memory, so which other families are live (pruned or not) changes nothing of it
        # a family whose plans reach its own memory floor has no leaner plan to list; a fitting one
        # is no pick either (its fastest plan fits): it is not searched (the union's floor, tested
        # before, is the leanest family's only)
        search = self.search
        lean = search.pricing.arrays(self.devices, self.batch, max(group), recompute, edges=False)

        floors: dict[int | None, float] = {}

        def at_floor(i: int | None, memory_bytes: float) -> bool:
            if i not in floors:
                masks = self.masks if i is None else self.families[i].masks
                floors[i] = _memory_floor(lean, masks, float(self.in_flight.min()), scale=search.pricing.memory_scale,
                                          credit=self.credit(lean, recompute), structure=self.structure)
            return memory_bytes <= (floors[i] / self.pp + self.nccl_floor()) * (1.0 + LEAN_TOLERANCE)

        weights, leanest = {}, {}
        for i, more in by_family.items():
            if more and not (any(p.fits for p in more) and at_floor(i, min(p.memory_bytes for p in more))):
                fastest = min(more, key=lambda p: p.time_s)
                weights[i] = fastest.time_s / max(fastest.memory_bytes, 1.0)
                leanest[i] = min(p.memory_bytes for p in more)
        for _ in range(self.search.options.memory_search_steps):
            if self.dominated(recompute, group):
                break  # whatever the next weights find is dominated already
            searching = [i for i in self.live_families(recompute, group) if i in leanest]
            priced = {i: self.price(self.choose(max(group), recompute, weights[i], [i]), max(group), recompute, group,
                                    cuts="fastest" if until_fits else "pareto") for i in searching}
            if until_fits and any(p.fits for more in priced.values() for p in more):
                break
            for i, more in priced.items():
                lowest = min((p.memory_bytes for p in more), default=math.inf)
                if lowest >= leanest[i] * (1.0 - 1e-3) or (any(p.fits for p in more) and at_floor(i, lowest)):
                    del leanest[i]  # the weight no longer buys memory (or none is left): its splits are at their leanest
                else:
                    leanest[i], weights[i] = lowest, weights[i] * 4.0
            if not leanest:
                break


def search_memory_rules(rules: TargetRules | None, pricing: Any) -> dict[str, bool]:
    """The memory rules every price, cut and bound of a search under ``rules`` is under: the launcher's
    (:attr:`TargetRules.sequence_shard_saved`, :attr:`TargetRules.fused_swiglu`), else the pricing's own."""
    if rules is not None:
        return {"sequence_shard_saved": rules.sequence_shard_saved, "fused_swiglu": rules.fused_swiglu}
    return {"sequence_shard_saved": bool(getattr(getattr(pricing, "settings", None), "sequence_shard_saved", False)),
            "fused_swiglu": False}


def search_pipeline(
    pricing: PipelinePricing,
    *,
    options: PipelineOptions,
    memory_limit_bytes: float | None = None,
    progress: Callable[[str, float], None] | None = None,
    rules: TargetRules | None = None,
    seeds: Sequence[tuple[float, float]] = (),
    informs: bool = False,
) -> PipelineResult:
    r"""The frontier over pipeline size, per-op splits, micro-batch, ZeRO stage and recomputation.

    Parameters
    ----------
    pricing:
        Prices stages and plans (``objectives.pipeline_cost.PipelineCostCache``): its cluster is
        all devices.
    options:
        The search space (global batch, micro-batch, pipeline sizes, ZeRO, recomputation, schedule).
    memory_limit_bytes:
        Per device; default the device's memory.
    progress:
        ``(stage, fraction)`` callback.
    rules:
        Search only plans one launch target runs (``None``: every plan): each stage's intra-op
        search then runs once per family of the target and every family's optimum is priced;
        settings it refuses are not searched. The pruning bounds use the union of the families.
    seeds:
        ``(seconds, bytes)`` of plans found elsewhere (another launcher's search): a combination
        they provably dominate is not searched, as for points this search found. The result then
        holds this search's points that no seed dominates at their bounds (the Pareto union with
        the seeds' plans is the same as without seeds); its ``chosen`` is this search's own.
    informs:
        The search only informs (the launchable table's headroom line): with ``seeds`` it stops at
        its time limit even before a point of its own (a launcher's search goes on to its first
        unless a seed is within the memory limit). Only its fastest plan that fits (``best``) is read,
        so a combination whose plans are all slower than one found that fits is pruned whatever its
        memory (``_Frontier.fastest_only``): ``best`` is exact, the other points need not be the frontier.

    Returns
    -------
    PipelineResult
        Pareto points (fastest first, times compared exactly: the launchable table ties the union of its
        launchers' frontiers, ``planner.search.pareto``'s "Tie groups") and the fastest that fits.

    Raises
    ------
    InputError
        No pipeline size is possible (e.g. a ``pp`` that does not divide the devices).
    """
    started = time.perf_counter()
    cluster = pricing.cluster
    limit = float(memory_limit_bytes) if memory_limit_bytes is not None else float(cluster.device.memory_bytes)
    sizes, layers = _sizes_or_raise(pricing, options)
    notes = []
    if layers == 0:
        notes.append("the model has no repeated blocks (layers): it runs as one stage (pp=1)")
    if rules is not None:
        notes.append(f"searched only plans {rules.name} runs (its dp x tp families on each stage, ZeRO stages and schedules)")
    search = _Search(pricing=pricing, options=options, limit_bytes=limit, rules=rules,
                     frontier=_Frontier(seeds, fastest_only=informs),
                     zero_groups=zero_groups(options.zero_stages, exact=options.exact_zero), informs=informs)
    report = progress or (lambda stage, fraction: None)
    deadline_s = None if options.time_limit_s is None else started + options.time_limit_s
    degraded = -pricing.plans.get(_DEGRADED, 0)
    stopped_at = solve_clock.run_until(deadline_s, search.run, sizes, report, deadline_s)  # its DPs stop there too
    if degraded := degraded + pricing.plans.get(_DEGRADED, 0):
        notes.append(f"{degraded} per-stage intra-op searches were over the search budget and a short seeded "
                     "heuristic answered them: those stages' splits are not proven optimal")
    report("pipeline search", 1.0)
    left: list[int] = []
    if stopped_at is not None:
        left = [pp for pp in sizes[sizes.index(stopped_at):] if search.runs_any(pp)]  # tried in the given order
        notes.append(
            f"search stopped at the time limit ({options.time_limit_s:g} s): pipeline sizes {', '.join(map(str, left))} "
            "were not (fully) searched; the points found are kept (pass a larger --time-limit or --pp to search them)"
        )
    # exact: the launchable table ties the union of the launchers' frontiers (pareto's docstring, "Tie groups")
    points = sorted(search.frontier.points, key=lambda p: (p.time_s, p.memory_bytes))
    fitting = [i for i, p in enumerate(points) if p.fits]
    chosen = fitting[0] if fitting else None
    return PipelineResult(
        points=tuple(points),
        chosen=chosen,
        memory_limit_bytes=limit,
        options=options,
        message=_message(points, chosen, rules, cluster.devices, limit),
        search_time_s=time.perf_counter() - started,
        combinations=search.combos,
        intra_op_searches=search.searches,
        candidates=search.frontier.priced,
        cost_builds=pricing.builds,
        skipped=search.skipped,
        pruned=search.pruned,
        notes=tuple(notes),
        unsearched_sizes=tuple(left),
        target=None if rules is None else rules.name,
        cache=pricing,
    )


def _message(points: Sequence[Any], chosen: int | None, rules: TargetRules | None, devices: int, limit: float) -> str:
    if not points and rules is not None:
        return (
            f"{rules.name} runs no plan of this model on {devices} devices (its layouts, ZeRO stages and "
            "schedules); plan without --target, or change --global-batch, --pp or --schedule"
        )
    if chosen is None:
        smallest = min((p.memory_bytes for p in points), default=math.inf)
        return (
            f"no plan fits in {format_bytes(limit)} per device; the smallest needs {format_bytes(smallest)}; "
            "try more devices or a smaller --global-batch"
        )
    return ""
