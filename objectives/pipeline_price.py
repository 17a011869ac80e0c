r"""The price of one pipeline plan (stage cut, per-op choice, ZeRO, recompute, schedule): its step
time and memory per device (:func:`price_plan`, :func:`evaluate_pipeline`), and the point it
describes (:class:`PipelinePoint`, one :class:`StagePlan` per stage).

A plan runs ``pp`` stages of :math:`d = N / pp` devices each; the global batch :math:`G` runs as
:math:`m = G / b` micro-batches of :math:`b` samples. Where each term is computed:

* each stage's share of the plan, per device: its ops' forward and backward seconds per micro-batch
  with half of the redistribution inside the stage each, its per-step seconds, and its parameter
  states and activations (:func:`_stage_sums`, from the stage's per-op arrays,
  :mod:`objectives.pipeline_arrays`);
* the stage-to-stage transfers (:func:`_boundary_p2p_s`): each device sends its :math:`1/d` share
  of the boundary activations (Megatron-LM's scatter/gather of the tensor-parallel copies), forward
  and, as gradient, backward, on the link the boundary crosses;
* the schedule's makespan with its bubble (:func:`objectives.schedules.pipeline_time_s`), plus each
  stage's per-step gradient synchronisation after its last backward: stage :math:`s` finishes its
  last backward before stage 0 by the drain of the stages in front of it, then the optimizer step,
  which waits for every stage (the global gradient norm), so the step takes
  :math:`\max_s (T_{pipe} - \text{drain}_s + \text{sync}_s) + \max_s \text{update}_s`
  (:func:`pipeline_step_s`);
* memory per stage = its parameter states + the in-flight micro-batches' activations the schedule
  keeps + the allowance (:data:`objectives.memory.OTHER_FRACTION`); under ZeRO-3 / FSDP2 the
  states add the unsharded units the stage holds at its peak (:func:`_unsharded_bytes`,
  :func:`objectives.memory.fsdp_unsharded_peak`; under a launcher that gathers per sub-module,
  DeepSpeed, :func:`objectives.memory.deepspeed_gathered_peak`: the ``zero3_gather`` argument of
  :func:`price_plan`, a per-search argument, so launchers of one execution model share one cache);
  a launcher whose bf16 optimizer accumulates the gradients in a buffer of its own (DeepSpeed's
  ``BF16_Optimizer``) adds it to the gradients at ZeRO 0-1 (:func:`grad_accumulator_scale`: its bytes per
  parameter the stage holds, the ``grad_accumulator`` argument of :func:`price_plan`, per plan);
* ZeRO-1/2's synchronisation as the launcher runs its sharded optimizer (:func:`zero_sync_rule`: Megatron-LM's
  by default; DeepSpeed's gathers the updated parameters after the step, unhidden), the ``zero_sync`` argument
  of :func:`price_plan`, per plan: the stage's arrays priced under it (``PipelineCostCache.arrays``);
* a parameter read in two stages (tied embeddings) is held by both, and the two copies' gradients
  are all-reduced between the stages once per step (:func:`_stage_sums`).

References
----------
D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC 2021.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from objectives.collectives import point_to_point_time_s, ring_all_reduce_time_s
from objectives.cuda_graph_memory import layer_static_bytes, te_graph_buffer_bytes
from objectives.first_forward import first_forward_extra_s
from objectives.fixed_costs import host_floor_s
from objectives.memory import (
    OTHER_FRACTION,
    deepspeed_gathered_peak,
    fsdp_kept_ranges,
    fsdp_unsharded_peak,
    pipelined_activation_bytes,
    state_bytes_per_parameter,
)
from objectives.fsdp_reshard import fsdp_resharded_ranges, kept_units
from objectives.fsdp_units import fsdp_unit_pass_s
from objectives.gated_credit import fused_swiglu_credit
from objectives.nccl_memory import NCCL_SIMPLE_BUFFSIZE, layout_buffer_bytes, pipeline_links
from objectives.pipeline_arrays import _OpArrays
from objectives.saved_credits import KEEPS_LINEAR_INPUTS, sequence_shard_pairs
from objectives.pipeline_stages import LayerStructure
from objectives.pipeline_buffers import looped_buffers_priced, stage_buffer_bytes
from objectives.after_layers import TAIL_IN_FLIGHT_LOOPED, tail_activation_bytes, tail_in_flight
from objectives.schedules import boundary_crosses_node, bubble_fraction, in_flight_micro_batches, pipeline_time_s
from planner.core.cluster import Cluster
from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import ZERO_SYNC_STAGES, TrainingSettings
from planner.core.strategy import MemoryBreakdown

__all__ = ["StageCosts", "StagePlan", "PipelineTime", "PipelinePoint", "evaluate_pipeline", "price_plan",
           "grad_accumulator_scale", "zero_sync_rule", "runtime_buffer_rates"]


class StageCosts(Protocol):
    """What pricing a plan reads of its cache (:class:`objectives.pipeline_cost.PipelineCostCache`):
    the cluster, each stage's per-op arrays and the model's layers."""

    cluster: Cluster

    def arrays(self, devices: int, batch: int, zero_stage: int, recompute: str, *, edges: bool = True,
               zero_sync: Any = None, zero3_gather: Any = None) -> _OpArrays:
        ...

    def structure(self, batch: int) -> LayerStructure:
        ...

    def chosen_edges(self, devices: int, batch: int, recompute: str,
                     picks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePlan:
    """One pipeline stage of a point."""

    index: int
    layers: tuple[int, int]
    """``[first, end)`` layer indices (the first stage also runs the ops before the layers, the last
    those after)."""
    ops: tuple[int, ...]
    """Indices of its ops in the graph."""
    forward_s: float
    """Seconds per micro-batch, forward (incl. intra-op communication and per-micro-batch ZeRO traffic)."""
    backward_s: float
    """Seconds per micro-batch, backward (incl. recomputation)."""
    grad_sync_s: float
    """Seconds per step of gradient synchronisation after its last backward."""
    in_flight: float
    """Micro-batches of activations the schedule keeps at its peak."""
    memory: MemoryBreakdown
    """Per device; activations are the in-flight ones."""
    summary: str
    """E.g. ``"dp=2 x tp=4"``."""

    @property
    def memory_bytes(self) -> float:
        return self.memory.total_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineTime:
    """Time per step of a point (seconds), by component."""

    step_s: float
    pipeline_s: float
    """The schedule's makespan (all micro-batches through all stages, bubble included)."""
    bubble_s: float
    """``pipeline_s`` minus ``m x`` the slowest stage's time per micro-batch."""
    p2p_s: float
    """Stage-to-stage transfer time per micro-batch and direction, summed over boundaries."""
    grad_sync_s: float
    """The part of the step after the pipeline drains (the slowest stage's synchronisation tail)."""
    bubble_fraction: float
    """The closed-form idle fraction of equal stages, :func:`objectives.schedules.bubble_fraction`."""
    fixed_s: dict = field(default_factory=dict)
    """Seconds per step the fixed costs of :mod:`objectives.fixed_costs` add beyond the kernels'
    work (execution models only): ``host_wait`` (the GPU waiting for the host's per-layer and
    per-micro-batch work), ``p2p_latency`` (the send/receive calls' fixed part) and
    ``optimizer_step`` (the slowest stage's, inside the step's tail); MoE models add ``moe_permute``,
    ``moe_grouped_gemm_tiles`` and ``moe_load_imbalance`` (``objectives.moe_terms``: the stage with
    the most of each, times the micro-batches; inside the pipeline time); empty when none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePoint:
    """One plan: pipeline, per-op splits on each stage, micro-batching, ZeRO and recomputation."""

    time_s: float
    """Seconds per step."""
    memory_bytes: float
    """Peak memory per device: the largest stage's."""
    pp: int
    dp: int
    """Dominant data-parallel degree (batch-dim split, by FLOPs)."""
    tp: int
    """Dominant model-parallel degree (other dims' split, by FLOPs)."""
    devices_per_stage: int
    micro_batch: int
    """Samples per data-parallel rank per micro-batch (Megatron's ``--micro-batch-size``):
    ``micro_batch_samples // dp``."""
    micro_batch_samples: int
    """Samples of one micro-batch across the data-parallel replicas."""
    micro_batches: int
    """Micro-batches per step (gradient accumulation steps per data-parallel rank)."""
    global_batch: int
    zero_stage: int
    recompute: str
    schedule: str
    chunks: int
    stages: tuple[StagePlan, ...]
    time: PipelineTime
    memory: MemoryBreakdown
    """Of the stage with the most memory."""
    fits: bool
    summary: str
    choice: tuple[int, ...]
    """Configuration index per op of the graph at ``micro_batch_samples``, in the stage cost model's
    spaces (``cost.tables.configs``)."""
    uniform: bool
    """Every op with FLOPs splits its batch ``dp`` ways and its other dims ``tp`` ways or not at all
    (a Megatron-style plan; whether an exporter can run it is its own check)."""
    zero3_gather: Any = None
    """The per-sub-module gather bounds its ZeRO-3 memory was priced under (a
    ``planner.core.settings.Zero3Gather``: DeepSpeed's); ``None``: below ZeRO-3, or per block (FSDP2).
    Its plan's settings carry it (``planner.pipeline.point_plan_input``), so the plan prices again alike."""
    sequence_shard_saved: bool = False
    """Its activations were credited a linear layer's sequence-parallel input shard kept instead of the
    gathered tensor (``objectives.saved_credits.sequence_shard_credit``: Megatron-Core's rule, given per
    search); ``False`` also where the rule gave no byte (no gather, or recomputed linears), so one plan
    priced alike by two launchers stays one row. Its plan's settings carry it, as they do
    :attr:`zero3_gather`."""
    fused_swiglu: bool = False
    """Its gated MLPs were priced keeping fc1's output only (``objectives.gated_credit``: Megatron-Core's
    fused SwiGLU, given per search); ``False`` also where the rule gave no byte. Its plan's settings carry it."""
    grad_accumulator_bytes: float = 0.0
    """Bytes per parameter of the gradient accumulator its memory holds (:func:`grad_accumulator_scale`: a
    launcher's bf16 optimizer, DeepSpeed's ``BF16_Optimizer``); 0 where none was priced. Its plan's settings carry it."""
    zero_sync: Any = None
    """The launcher's ZeRO-1/2 synchronisation its time was priced under (a ``planner.core.settings.ZeroSync``:
    DeepSpeed's, :func:`zero_sync_rule`); ``None``: Megatron-LM's, or another ZeRO stage. Its plan's settings carry it."""
    graph: OpGraph | None = field(default=None, repr=False, compare=False)
    """The model at ``micro_batch_samples`` (the graph ``choice`` indexes)."""
    spaces: tuple[ConfigSpace, ...] = field(default=(), repr=False, compare=False)
    """Each op's configurations on one stage's devices (``choice`` indexes them). The exact cost
    model of the point is ``PipelineCostCache.model(devices_per_stage, micro_batch_samples,
    zero_stage, recompute)``."""

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.time_s if self.time_s > 0 else math.inf

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(s.layers[1] - s.layers[0] for s in self.stages)

    @property
    def splits(self) -> dict[str, dict[str, int]]:
        """``{op name: {dim: factor}}`` of the split ops (the same on every stage's devices)."""
        assert self.graph is not None
        out = {}
        for op, space, c in zip(self.graph.ops, self.spaces, self.choice):
            split = space.describe(c)
            if split:
                out[op.name] = split
        return out


def _degrees(arrays: _OpArrays, flat_index: np.ndarray, flops: np.ndarray, has_batch: np.ndarray) -> tuple[int, int, bool]:
    """The dominant ``(dp, tp)`` by FLOPs among the given ops' configurations, and whether the plan
    is uniform: every op with FLOPs splits its batch dims ``dp`` ways (ops without batch dims: 1)
    and its other dims ``tp`` ways or not at all (Megatron-LM's pattern,
    :func:`planner.families.uniform_masks`; lookups such as embeddings may differ)."""
    working = flops > 0
    if not working.any():
        return 1, 1, True
    batch = arrays.flat["batch_split"][flat_index]
    other = arrays.flat["model_split"][flat_index]
    codes = batch[working] * (int(other.max()) + 1) + other[working]  # (dp, tp) pairs as sortable codes
    pairs, inverse = np.unique(codes, return_inverse=True)
    weight = np.bincount(inverse, weights=flops[working], minlength=pairs.size)
    best = int(np.argmax(weight))  # ties: the smallest (dp, tp) pair
    dp, tp = divmod(int(pairs[best]), int(other.max()) + 1)
    follows = (batch == np.where(has_batch, dp, 1)) & ((other == tp) | (other == 1))
    uniform = bool(np.all(follows[working]))
    return dp, tp, uniform


def _describe(dp: int, tp: int, uniform: bool) -> str:
    parts = [f"dp={dp}"] if dp > 1 else []
    if tp > 1:
        parts.append(f"tp={tp}")
    text = " x ".join(parts) or "replicated"
    return text if uniform else text + " (mixed)"


def evaluate_pipeline(
    cache: StageCosts,
    *,
    pp: int,
    batch: int,
    zero_stage: int,
    recompute: str,
    choice: Sequence[int] | np.ndarray,
    bounds: Sequence[int],
    global_batch: int,
    schedule: str = "1f1b",
    chunks: int = 1,
    memory_limit_bytes: float | None = None,
    zero3_gather: Any = None,
    sequence_shard_saved: bool | None = None,
    fused_swiglu: bool | None = None,
    grad_accumulator: Callable[..., float] | float | None = None,
    zero_sync: Any = None,
    chosen_edges: bool = False,
    pipeline_buffers: str | None = None,
) -> PipelinePoint:
    r"""Price one pipeline plan: step time and memory per device (module docstring, step 4).

    Parameters
    ----------
    cache:
        Graphs and cost models.
    pp:
        Pipeline stages; each runs on ``cache.cluster.devices // pp`` devices.
    batch:
        Samples per pipeline micro-batch :math:`b` (dividing ``global_batch``).
    zero_stage, recompute:
        Training settings of the plan.
    choice:
        Configuration index per op, in the spaces of ``cache.model(d, batch, zero_stage, recompute)``.
    bounds:
        ``pp + 1`` layer boundaries (:class:`planner.search.stages.Partition`).
    global_batch:
        Samples per step.
    schedule, chunks:
        Pipeline schedule (:mod:`objectives.schedules`).
    memory_limit_bytes:
        Per device (default: the device's memory).
    zero3_gather:
        ZeRO-3's per-sub-module gather bounds (a ``Zero3Gather``: DeepSpeed's, ``Target.zero3_gather``);
        ``None``: the cache's settings' (``TrainingSettings.zero3_gather``; none: per block, FSDP2).
    sequence_shard_saved:
        Whether the launcher's linear layers keep their sequence-parallel input shard
        (``Target.sequence_shard_saved``: Megatron-Core's, :func:`objectives.saved_credits.sequence_shard_credit`);
        ``None``: the cache's settings' (``TrainingSettings.sequence_shard_saved``).
    fused_swiglu:
        Whether the launcher's gated MLPs keep fc1's output only (``Target.fused_swiglu``: Megatron-Core's,
        :func:`objectives.gated_credit.fused_swiglu_credit`); ``None``: as the cache's tables were built.
    grad_accumulator:
        The launcher's bf16 optimizer's gradient accumulator, bytes per parameter the rank holds, or its rule
        ``grad_accumulator(*, zero_stage, pp)`` (``Target.grad_accumulator``: DeepSpeed's ``BF16_Optimizer``,
        :func:`grad_accumulator_scale`); ``None``: the cache's settings' (``TrainingSettings.grad_accumulator_bytes``).
    zero_sync:
        How the launcher synchronises ZeRO-1/2 (a ``ZeroSync``, or its rule ``zero_sync(*, zero_stage, precision,
        offload)``: ``Target.zero_sync``, DeepSpeed's; :func:`zero_sync_rule`); ``None``: the cache's settings'
        (``TrainingSettings.zero_sync``; none: Megatron-LM's).
    chosen_edges:
        Price each op pair's redistribution at ``choice`` alone (``cache.chosen_edges``), its tables left
        unpriced: for a choice fixed before pricing (:func:`planner.estimate.estimate`); the same seconds.
    pipeline_buffers:
        What the launcher's pipeline runtime holds at the stage cuts (``Target.pipeline_buffers``:
        :mod:`objectives.pipeline_buffers`); ``None``: the cache's settings' (``TrainingSettings.pipeline_buffers``).

    Returns
    -------
    PipelinePoint
    """
    return price_plan(
        cache, pp=pp, batch=batch, zero_stage=zero_stage, recompute=recompute, choice=choice, bounds=bounds,
        global_batch=global_batch, schedule=schedule, chunks=chunks, memory_limit_bytes=memory_limit_bytes,
        zero3_gather=zero3_gather, sequence_shard_saved=sequence_shard_saved, fused_swiglu=fused_swiglu,
        grad_accumulator=grad_accumulator, zero_sync=zero_sync, chosen_edges=chosen_edges, pipeline_buffers=pipeline_buffers,
    ).point()


class _Priced:
    """A plan's step time and memory, its :class:`PipelinePoint` built on first use (the search
    builds only the points that reach its running frontier)."""

    __slots__ = ("time_s", "memory_bytes", "fits", "_build", "_point")

    def __init__(self, *, time_s: float, memory_bytes: float, fits: bool, build: Callable[[], PipelinePoint]) -> None:
        self.time_s, self.memory_bytes, self.fits = time_s, memory_bytes, fits
        self._build: Callable[[], PipelinePoint] | None = build
        self._point: PipelinePoint | None = None

    def point(self) -> PipelinePoint:
        if self._point is None:
            assert self._build is not None
            self._point, self._build = self._build(), None
        return self._point


def _check_plan(cache: StageCosts, *, pp: int, batch: int, bounds: Sequence[int], global_batch: int) -> None:
    if pp < 1 or cache.cluster.devices % pp:
        raise InputError(f"--pp {pp} must divide the {cache.cluster.devices} devices")
    if batch < 1 or global_batch % batch:
        raise InputError(f"--global-batch {global_batch} is not a multiple of the micro-batch's {batch} samples")
    if len(bounds) != pp + 1:
        raise InputError(f"a {pp}-stage pipeline needs {pp + 1} layer bounds, got {len(bounds)}")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _StageSums:
    """A plan's per-op costs summed per stage (``(pp,)`` arrays), per device."""

    forward_s: np.ndarray
    """Seconds per micro-batch, forward, with half of the stage's redistribution."""
    backward_s: np.ndarray
    """Seconds per micro-batch, backward, with the other half."""
    step_s: np.ndarray
    """Seconds per step after the stage's last backward (synchronisation, optimizer step)."""
    params_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    """Of one micro-batch."""
    update_s: np.ndarray
    """The optimizer step's part of :attr:`step_s`, which starts once every stage's gradients are in
    (:func:`price_plan`)."""
    first_forward_s: np.ndarray | None = None
    """Seconds the step's first micro-batch's forward adds (ZeRO++'s hpZ), before the host floor; :func:`price_plan`
    adds what the floor leaves of it to :attr:`step_s` (:func:`objectives.first_forward.first_forward_extra_s`).
    ``None``: none."""


def pipeline_step_s(pipeline_s: float, sums: _StageSums, p2p_s: np.ndarray) -> float:
    r"""Seconds of a step: stage :math:`s` finishes its last backward before stage 0 by the drain of the
    stages in front of it, :math:`D_s = \sum_{k<s} (b_k + c_k)`, then synchronises its gradients
    (:math:`g_s`); the optimizer step (:math:`u_s`) starts once every stage has, since the launchers
    clip by the global gradient norm over all stages (Megatron-LM's ``--clip-grad`` 1.0 by default;
    DeepSpeed's ``BF16_Optimizer.step`` takes the norm over the pipeline group first, deepspeed 0.19.8
    ``runtime/bf16_optimizer.py:389-392`` and ``runtime/utils.py:957-959``; torchtitan's
    ``clip_grad_norm_`` reduces it over the pipeline mesh):

    .. math:: T = \max_s (T_{pipe} - D_s + g_s) + \max_s u_s

    One stage: :math:`T_{pipe} + g_0 + u_0`. Before, each stage's update ran as soon as its own
    gradients were in, so a late stage's update hid under the drain (a 2-stage Marian priced faster
    than data parallelism on its optimizer step alone).

    >>> sums = _StageSums(forward_s=np.zeros(2), backward_s=np.array([2.0, 2.0]), step_s=np.array([1.0, 3.0]),
    ...                   params_bytes=np.zeros(2), grads_bytes=np.zeros(2), optimizer_bytes=np.zeros(2),
    ...                   activations_bytes=np.zeros(2), update_s=np.array([0.5, 2.5]))
    >>> pipeline_step_s(10.0, sums, np.array([0.0]))  # max(10 + 0.5, 10 - 2 + 0.5) + 2.5
    13.0
    """
    drain = np.concatenate(([0.0], np.cumsum(sums.backward_s[:-1] + (p2p_s if p2p_s.size else 0.0))))
    return float(np.max(pipeline_s - drain + sums.step_s - sums.update_s) + np.max(sums.update_s))


def stage_host_floors_s(cache: StageCosts, layers: np.ndarray, recompute: str) -> tuple[np.ndarray, np.ndarray, float] | None:
    """``(forward, backward, per transfer)``: the host seconds a stage of ``layers`` layers needs per
    micro-batch at least (:func:`objectives.fixed_costs.host_floor_s`) and the fixed part of each
    send/receive call, under an execution model (a launcher's fixed costs); ``None`` under the
    plain roofline, which has none."""
    settings = getattr(cache, "settings", None)
    if settings is None or (settings.engine is None and settings.attention is None):
        return None
    share_of = getattr(cache, "recomputed_share", None)  # PipelineCostCache's; a bare StageCosts: full or nothing
    extra_of = getattr(cache, "eager_extra_kernels", None)  # the eager engine's kernels beyond the fused floor's
    floor_f, floor_b = host_floor_s(layers, device=cache.cluster.device, recompute=recompute,
                                    recomputed_share=None if share_of is None else share_of(recompute),
                                    cuda_graphs=settings.cuda_graphs,  # a captured micro-batch: one replay's launch
                                    scope=settings.cuda_graph_scope,  # or one per layer and pass (Megatron-LM's)
                                    extra_kernels=(0.0, 0.0) if extra_of is None else extra_of())
    return floor_f, floor_b, float(cache.cluster.device.p2p_overhead_s)


def _first_forward_paid(sums: _StageSums, floors: tuple | None) -> _StageSums:
    """``sums`` with what each stage's forward floor (``floors``: :func:`stage_host_floors_s`'s) leaves of its step's
    first forward's extra (:attr:`_StageSums.first_forward_s`, ZeRO++'s hpZ) in its per-step seconds
    (:func:`objectives.first_forward.first_forward_extra_s`, whose docstring states the schedule assumption)."""
    if sums.first_forward_s is None:
        return sums
    extra = first_forward_extra_s(sums.forward_s, sums.first_forward_s, None if floors is None else floors[0])
    return dataclasses.replace(sums, step_s=sums.step_s + extra)


def tied_sync_s(cache: StageCosts, grad_bytes: float) -> float:
    """Seconds per step of the all-reduce between the two copies of a parameter two stages read (a
    tied embedding): a ring over 2 devices, across nodes when the pipeline spans nodes."""
    crosses = cache.cluster.devices > cache.cluster.devices_per_node
    return float(ring_all_reduce_time_s(grad_bytes, 2, cache.cluster.inter_link if crosses else cache.cluster.intra_link))


def _stage_sums(cache: StageCosts, arrays: _OpArrays, stage: np.ndarray, picks: np.ndarray, pp: int,
                chosen: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> _StageSums:
    """Each stage's share of the plan: its ops' costs, the edges inside it, and the copies of
    parameters another stage owns (a tied embedding: held by both, gradients all-reduced between them
    once per step). ``chosen``: the edges' ``(producers, consumers, seconds)`` at ``picks``, priced apart
    (``StageCosts.chosen_edges``); ``None``: read from the arrays' tables."""
    flat_index = arrays.offsets + picks

    def per_stage(name: str) -> np.ndarray:
        return np.bincount(stage, weights=arrays.flat[name][flat_index], minlength=pp)

    forward, backward, step = per_stage("forward_s"), per_stage("backward_s"), per_stage("step_s")
    update = per_stage("update_s")
    first = per_stage("first_forward_s") if "first_forward_s" in arrays.flat else None
    params, grads, optimizer = per_stage("params_bytes"), per_stage("grads_bytes"), per_stage("optimizer_bytes")
    activations = per_stage("activations_bytes")
    if chosen is None and arrays.edges:
        chosen = arrays.edge_u, arrays.edge_v, arrays.edge_time_s(picks)
    if chosen is not None and chosen[0].size:
        edge_u, edge_v, edge_time = chosen
        inside = stage[edge_u] == stage[edge_v]
        edge_stage = stage[edge_u][inside]
        half = np.bincount(edge_stage, weights=edge_time[inside] / 2.0, minlength=pp)
        forward, backward = forward + half, backward + half
    for copy in arrays.tied:
        s, owner = int(stage[copy.op]), int(stage[copy.owner])
        if s == owner:
            continue
        c = int(picks[copy.op])
        params[s] += copy.params_bytes[c]
        grads[s] += copy.grads_bytes[c]
        optimizer[s] += copy.optimizer_bytes[c]
        forward[s] += copy.forward_s[c]
        backward[s] += copy.backward_s[c]
        shared = tied_sync_s(cache, float(copy.grad_bytes[c]))
        step[s] += float(copy.step_s[c]) + shared
        step[owner] += shared
    return _StageSums(
        forward_s=forward, backward_s=backward, step_s=step, params_bytes=params, grads_bytes=grads,
        optimizer_bytes=optimizer, activations_bytes=activations, update_s=update, first_forward_s=first,
    )


def _unsharded_bytes(arrays: _OpArrays, structure: LayerStructure, stage: np.ndarray, picks: np.ndarray, pp: int,
                     micro_batches: int, gather: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``(params, grads)``, each ``(pp,)``: the unsharded parameters and gradient buffers each stage
    holds at its peak under ZeRO-3 / FSDP2 (:func:`objectives.memory.fsdp_unsharded_peak`), per device.

    The units are what the exporters wrap in ``fully_shard`` (``exporters/torchtitan``: torchtitan's
    ``apply_fsdp_to_decoder``; ``exporters/dtensor``: ``_fsdp_section``): the ops before the first
    block (the embedding), each repeated block, and the ops after the last (final norm + output head).
    Resharding after forward follows ``TrainingSettings.reshard_after_forward`` (:func:`kept_units`):
    torchtitan's default policy keeps the head unit whole from forward to backward
    (``reshard_after_forward=False`` for ``[norm, lm_head]``), under a pipeline every unit (the policy's
    ``not pp_enabled``); ``never`` keeps every unit, ``always`` none. With several micro-batches in a
    pipeline the gradients accumulate unsharded and every unit stays whole. The DTensor plan's root unit
    (embedding and head together, ``reshard_after_forward`` passed explicitly, so FSDP2's root heuristic does
    not apply) is priced as two units. Zeros below ZeRO-3.

    A launcher that gathers per sub-module (``gather``, :func:`_gather_rule`: DeepSpeed) holds what
    :func:`_gathered_per_module` gives instead."""
    flat = arrays.flat.get("unsharded_bytes")
    if flat is None:
        return np.zeros(pp), np.zeros(pp)
    if gather is not None:
        whole = _gathered_per_module(arrays, picks, gather)
        return np.full(pp, whole[0]), np.full(pp, whole[1])
    slots = structure.num_layers + 2  # 0: before the blocks, 1..L: the blocks, L + 1: after them
    unit = stage * slots + structure.position + 1
    units = np.bincount(unit, weights=flat[arrays.offsets + picks], minlength=pp * slots).reshape(pp, slots)
    counts = _unit_elements(arrays, unit, picks, pp * slots)
    kept = kept_units(arrays.model.settings.reshard_after_forward, slots, pp)  # type: ignore[attr-defined]
    per = state_bytes_per_parameter(arrays.model.settings)  # type: ignore[attr-defined]
    params, grads = np.zeros(pp), np.zeros(pp)
    for s in range(pp):
        present = units[s] > 0.0
        peak = fsdp_unsharded_peak(units[s][present], kept=kept[present], per=per,
                                   accumulate=pp > 1 and micro_batches > 1,
                                   elements=None if counts is None else counts.reshape(pp, slots)[s][present])
        params[s], grads[s] = peak.params_bytes, peak.grads_bytes
    return params, grads


def _fsdp_unit_sums(arrays: _OpArrays, structure: LayerStructure, stage: np.ndarray, picks: np.ndarray, pp: int,
                    sums: _StageSums, *, zero_stage: int, gather: Any) -> _StageSums:
    """``sums`` with ZeRO-3's exposure priced per ``fully_shard`` unit (:func:`objectives.fsdp_units.fsdp_unit_pass_s`)
    where the settings ask for it (``TrainingSettings.fsdp_units``, overlapped, FSDP's rule: ``gather`` unset);
    else ``sums`` as they are (per op)."""
    settings = getattr(arrays.model, "settings", None)  # a bare StageCosts' arrays may carry none
    if zero_stage < 3 or gather is not None or not getattr(settings, "fsdp_units", False) or not settings.overlap:
        return sums
    forward, backward = fsdp_unit_pass_s(arrays, structure, stage, picks, pp, arrays.tied_source[0],
                                         sums.forward_s, sums.backward_s)
    return dataclasses.replace(sums, forward_s=forward, backward_s=backward)


def _unit_elements(arrays: _OpArrays, unit: np.ndarray, picks: np.ndarray, units: int) -> np.ndarray | None:
    """``(units,)`` gathered elements per unit where their bytes are not elements x one size (FP8 weights
    gathered at 1 B: ``objectives.pipeline_arrays``' ``unsharded_elements``); ``None`` elsewhere."""
    count = arrays.flat.get("unsharded_elements")
    return None if count is None else np.bincount(unit, weights=count[arrays.offsets + picks], minlength=units)


def _gather_rule(arrays: _OpArrays, zero3_gather: Any) -> Any:
    """The ZeRO-3 gather bounds a plan is priced under: ``zero3_gather`` (the search's launcher's,
    passed per search so that launchers of one execution model share one cost cache), else the
    cache's settings' (``TrainingSettings.zero3_gather``: a library caller's, the fidelity rows', a
    saved plan's); ``None``: per block (FSDP2)."""
    if zero3_gather is not None:
        return zero3_gather
    return getattr(arrays.model.settings, "zero3_gather", None)  # type: ignore[attr-defined]


def _gathered_per_module(arrays: _OpArrays, picks: np.ndarray, gather: Any) -> tuple[float, float]:
    """``(params, grads)`` bytes per device that a launcher gathering ZeRO-3 per sub-module holds at its
    peak (:func:`objectives.memory.deepspeed_gathered_peak` under the bounds ``gather``): the
    ops with gathered parameters are its sub-modules, in op order. Every stage gets the whole model's
    peak, an upper bound: DeepSpeed, the launcher that gathers so, runs no ZeRO-3 pipeline (its
    ``PipelineEngine`` takes ZeRO 0-1, ``exporters.deepspeed.rules.pipeline_allows``)."""
    sizes = arrays.flat["unsharded_bytes"][arrays.offsets + picks]
    peak = deepspeed_gathered_peak(sizes[sizes > 0.0], gather=gather,
                                   per=state_bytes_per_parameter(arrays.model.settings))  # type: ignore[attr-defined]
    return peak.params_bytes, peak.grads_bytes


def unsharded_segment_bytes(arrays: _OpArrays, structure: LayerStructure, picks: np.ndarray, pp: int,
                            micro_batches: int, zero3_gather: Any = None) -> np.ndarray | None:
    """``(L+1, L+1)``: ``[a, b]`` the bytes :func:`_unsharded_bytes` adds (parameters + gradient
    buffers) to a stage of the layers ``[a, b)``, the first stage's with the ops before the blocks and
    the last's with those after, for the pipeline search's cuts (``planner.search.stage_costs``);
    with one stage only ``[0, L]`` is set. ``None`` below ZeRO-3. ``zero3_gather``: as
    :func:`price_plan`'s."""
    flat = arrays.flat.get("unsharded_bytes")
    if flat is None:
        return None
    layers = structure.num_layers
    out = np.zeros((layers + 1, layers + 1))
    gather = _gather_rule(arrays, zero3_gather)
    if gather is not None:
        a, b = np.arange(layers + 1)[:, None], np.arange(layers + 1)[None, :]
        segment = (b > a) if pp > 1 else (a == 0) & (b == layers)  # one stage: only [0, L] is set
        return np.where(segment, sum(_gathered_per_module(arrays, picks, gather)), 0.0)
    if pp == 1:
        params, grads = _unsharded_bytes(arrays, structure, np.zeros(len(picks), dtype=np.int64), picks, 1, micro_batches)
        out[0, layers] = params[0] + grads[0]
        return out
    units = np.bincount(structure.position + 1, weights=flat[arrays.offsets + picks], minlength=layers + 2)
    settings = arrays.model.settings  # type: ignore[attr-defined]
    per = state_bytes_per_parameter(settings)
    elements = _unit_elements(arrays, structure.position + 1, picks, layers + 2)
    if settings.reshard_after_forward == "always" and micro_batches == 1:  # no unit kept, none accumulated
        ranges = fsdp_resharded_ranges(units, per=per, elements=elements)
    else:
        ranges = fsdp_kept_ranges(units, per=per, accumulate=micro_batches > 1, elements=elements)
    a, b = np.arange(layers + 1)[:, None], np.arange(layers + 1)[None, :]
    lo = np.minimum(np.where(a == 0, 0, a + 1), layers + 1)  # unit 0: before the blocks; layer j: unit j + 1
    hi = np.where(b == layers, layers + 1, b)  # the last stage's segment ends with the ops after the blocks
    return np.where(b > a, ranges[lo, hi], 0.0)


def p2p_overlapped(arrays: _OpArrays) -> bool:
    """Whether the plan's settings run the interleaved schedule's steady-state transfers asynchronously
    (``TrainingSettings.p2p_overlap``, :func:`objectives.schedules.pipeline_time_s`)."""
    return bool(getattr(getattr(arrays.model, "settings", None), "p2p_overlap", False))


def _boundary_p2p_s(cache: StageCosts, structure: LayerStructure, bounds: Sequence[int], pp: int) -> np.ndarray:
    """``(pp - 1,)`` seconds of each stage boundary's transfer per micro-batch and direction: each
    device sends its ``1 / d`` share of the activations crossing the cut."""
    if pp <= 1:
        return np.zeros(0)
    devices = cache.cluster.devices // pp
    cut = structure.cut_bytes[np.asarray(bounds[1:-1], dtype=np.int64)] / devices
    crosses = boundary_crosses_node(stages=pp, devices_per_stage=devices, devices_per_node=cache.cluster.devices_per_node)
    return point_to_point_time_s(
        cut, crosses_node=crosses, intra_link=cache.cluster.intra_link, inter_link=cache.cluster.inter_link
    )  # p2p_time_s of each boundary's bytes, all boundaries at once


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _PlanPrice:
    """A priced plan: its numbers, and what its :class:`PipelinePoint` is built from."""

    cache: StageCosts
    arrays: _OpArrays
    structure: LayerStructure
    pp: int
    batch: int
    global_batch: int
    zero_stage: int
    recompute: str
    schedule: str
    chunks: int
    picks: np.ndarray
    bounds: Sequence[int]
    stage: np.ndarray
    """``(n_ops,)`` stage of each op."""
    sums: _StageSums
    in_flight: np.ndarray
    held: np.ndarray
    """``(pp,)`` bytes of the in-flight micro-batches' activations."""
    other: np.ndarray
    memory: np.ndarray
    pipeline_s: float
    p2p_s: np.ndarray
    step_s: float
    limit_bytes: float
    work: tuple | None = None
    """``(forward_s, backward_s, p2p_s)`` of the stages before the fixed costs' floors (execution
    models), for :attr:`PipelineTime.fixed_s`; ``None``: no fixed costs were added."""
    gather: Any = None
    """The ZeRO-3 gather bounds its memory was priced under (:attr:`PipelinePoint.zero3_gather`)."""
    shard_saved: bool = False
    """Its activations hold a sequence-shard credit (:attr:`PipelinePoint.sequence_shard_saved`)."""
    gated: bool = False
    """Its activations hold the fused SwiGLU's credit, or its tables were built with it
    (:attr:`PipelinePoint.fused_swiglu`)."""
    graph_buffers: np.ndarray | None = None
    """``(pp,)`` bytes of the per-layer CUDA graphs' static buffers (:func:`_graph_buffers`); ``None``: none."""
    nccl: np.ndarray | None = None
    """``(pp,)`` bytes of NCCL's buffers per rank of each stage (:func:`nccl_stage_bytes`); ``None``: none."""
    accumulator: float = 0.0
    """Bytes per parameter of the gradient accumulator in its gradients (:attr:`PipelinePoint.grad_accumulator_bytes`)."""
    zero_sync: Any = None
    """The launcher's ZeRO-1/2 synchronisation its time was priced under (:attr:`PipelinePoint.zero_sync`)."""

    @property
    def devices(self) -> int:
        return self.cache.cluster.devices // self.pp

    @property
    def micro_batches(self) -> int:
        return self.global_batch // self.batch

    def priced(self) -> _Priced:
        peak = float(self.memory[int(np.argmax(self.memory))])
        return _Priced(time_s=self.step_s, memory_bytes=peak, fits=peak <= self.limit_bytes, build=self.point)

    def _stage_plans(self, graph: OpGraph, flops: np.ndarray, has_batch: np.ndarray) -> list[StagePlan]:
        flat_index = self.arrays.offsets + self.picks
        bounds_t = tuple(int(x) for x in self.bounds) if self.pp > 1 else (0, self.structure.num_layers)
        sums, plans = self.sums, []
        for s in range(self.pp):
            here = self.stage == s
            dp, tp, uniform = _degrees(self.arrays, flat_index[here], flops[here], has_batch[here])
            plans.append(
                StagePlan(
                    index=s,
                    layers=(bounds_t[s], bounds_t[s + 1]),
                    ops=tuple(int(i) for i in np.flatnonzero(here)),
                    forward_s=float(sums.forward_s[s]),
                    backward_s=float(sums.backward_s[s]),
                    grad_sync_s=float(sums.step_s[s]),
                    in_flight=float(self.in_flight[s]),
                    memory=MemoryBreakdown(
                        params_bytes=float(sums.params_bytes[s]), grads_bytes=float(sums.grads_bytes[s]),
                        optimizer_bytes=float(sums.optimizer_bytes[s]), activations_bytes=float(self.held[s]),
                        other_bytes=float(self.other[s]),
                        graph_buffers_bytes=float(self.graph_buffers[s]) if self.graph_buffers is not None else 0.0,
                        nccl_bytes=float(self.nccl[s]) if self.nccl is not None else 0.0,
                    ),
                    summary=_describe(dp, tp, uniform),
                )
            )
        return plans

    def _fixed_s(self) -> dict:
        """:attr:`PipelineTime.fixed_s`: the makespan with each fixed cost, less the one without it."""
        if self.work is None:
            return {}
        forward, backward, p2p = self.work

        def makespan(f: np.ndarray, b: np.ndarray, p: np.ndarray) -> float:
            return float(pipeline_time_s(self.schedule, forward_s=f, backward_s=b, p2p_s=p,
                                         micro_batches=self.micro_batches, chunks=self.chunks,
                                         stage_layers=np.diff(np.asarray(self.bounds)) if self.pp > 1 else None,
                                         p2p_overlapped=p2p_overlapped(self.arrays)))

        bare = makespan(forward, backward, p2p)
        floored = makespan(self.sums.forward_s, self.sums.backward_s, p2p)
        out = {"host_wait": max(floored - bare, 0.0), "p2p_latency": max(self.pipeline_s - floored, 0.0)}
        # the optimizer step, once per step: the slowest stage's, as priced (the rank's share of it from
        # ZeRO-1 on, objectives.pipeline_arrays; not the ZeRO-0 tables' whole-model step)
        details = getattr(self.arrays.model, "op_details", ())
        if details:
            out["optimizer_step"] = float(np.max(self.sums.update_s))
            out.update(self._moe_s(details))
        return out

    def _moe_s(self, details) -> dict:
        """MoE terms (``OpCostDetail.moe_s``: ``moe_permute``, ``moe_grouped_gemm_tiles``,
        ``moe_load_imbalance``) per step: the stage with the most of them, times the micro-batches."""
        sums: dict[str, np.ndarray] = {}
        for op, (detail, pick) in enumerate(zip(details, self.picks)):
            for name, seconds in (detail.moe_s or {}).items():
                sums.setdefault(name, np.zeros(self.pp))[self.stage[op]] += float(seconds[pick])
        return {f"moe_{name}": float(per_stage.max()) * self.micro_batches for name, per_stage in sums.items()}

    def point(self) -> PipelinePoint:
        graph: OpGraph = self.arrays.model.graph  # type: ignore[attr-defined]
        flops = np.array([op.flops for op in graph.ops])
        has_batch = np.array([any(d.is_batch for d in op.dims) for op in graph.ops])
        stage_plans = self._stage_plans(graph, flops, has_batch)
        dp, tp, uniform = _degrees(self.arrays, self.arrays.offsets + self.picks, flops, has_batch)
        micro = max(self.batch // dp, 1)
        worst = int(np.argmax(self.memory))
        peak = float(self.memory[worst])
        slowest = float((self.sums.forward_s + self.sums.backward_s).max())
        pipeline, m = self.pipeline_s, self.micro_batches
        return PipelinePoint(
            time_s=self.step_s, memory_bytes=peak, pp=self.pp, dp=dp, tp=tp, devices_per_stage=self.devices,
            micro_batch=micro, micro_batch_samples=self.batch, micro_batches=m, global_batch=self.global_batch,
            zero_stage=self.zero_stage, recompute=self.recompute, schedule=self.schedule, chunks=self.chunks,
            stages=tuple(stage_plans),
            time=PipelineTime(
                step_s=self.step_s,
                pipeline_s=pipeline,
                bubble_s=max(pipeline - m * slowest, 0.0),
                p2p_s=float(self.p2p_s.sum()),
                grad_sync_s=self.step_s - pipeline if self.step_s > pipeline else 0.0,
                bubble_fraction=bubble_fraction(self.schedule, stages=self.pp, micro_batches=m, chunks=self.chunks),
                fixed_s=self._fixed_s(),
            ),
            memory=stage_plans[worst].memory,
            fits=peak <= self.limit_bytes,
            summary=(
                f"pp={self.pp} x {_describe(dp, tp, uniform)}, mb={micro}, zero={self.zero_stage}, "
                f"recompute={self.recompute}"
            ),
            choice=tuple(int(c) for c in self.picks),
            uniform=uniform,
            zero3_gather=self.gather,
            sequence_shard_saved=self.shard_saved,
            fused_swiglu=self.gated,
            grad_accumulator_bytes=self.accumulator,
            zero_sync=self.zero_sync,
            graph=graph,
            spaces=self.arrays.spaces,
        )


def _working_set(arrays: _OpArrays, stage: np.ndarray, picks: np.ndarray, pp: int,
                 credit: dict | None = None) -> tuple[np.ndarray, float]:
    """``((pp,) bytes, bytes)``: the recomputation working set inside each stage's per-micro-batch
    activations, and the working set itself (:func:`objectives.memory.pipelined_activation_bytes`).

    The tables charge the first instance of each repeated block as not recomputed (its activations
    stand for one region re-run); the rest of its charge is what any other instance keeps. So the
    working set is the first instance's activations less the second's, each op of the second at
    the first's configuration (the instances are alike op by op), never below zero. Of several
    repeated blocks (a hybrid model) one region re-runs at a time: the largest."""
    inside, largest = np.zeros(pp), 0.0
    for op, excess in _block_excess(arrays, picks, credit):
        inside[int(stage[op])] += max(excess, 0.0)
        largest = max(largest, excess)
    return inside, largest


def _block_excess(arrays: _OpArrays, picks: np.ndarray, credit: dict | None = None) -> list[tuple[int, float]]:
    """``(first op, bytes)`` of each repeated block: its first instance's first op and the working
    set that instance's activations stand for (:func:`_working_set`), which may be negative; each op's
    activations less its ``credit`` (``{op: (K,) bytes}``, :func:`_gated_credit`), as the tables built
    with the rule hold them."""
    found = []
    activations = arrays.flat["activations_bytes"]
    for first, second in arrays.twin_instances:
        excess = sum(float(activations[arrays.offsets[i] + picks[i]] - activations[arrays.offsets[j] + picks[i]])
                     for i, j in zip(first, second))
        for i, j in zip(first, second):
            if credit and (i in credit or j in credit):
                excess -= float(credit[i][picks[i]] if i in credit else 0.0) - float(
                    credit[j][picks[i]] if j in credit else 0.0)
        found.append((int(first[0]), excess))
    return found


def _shard_rule(arrays: _OpArrays, sequence_shard_saved: bool | None) -> bool:
    """Whether a plan's linear layers keep their sequence-parallel input shard: ``sequence_shard_saved``
    (the search's launcher's, per search: launchers of one execution model share one cache), else the
    cache's settings' (a library caller's, the fidelity rows', a saved plan's)."""
    if sequence_shard_saved is not None:
        return bool(sequence_shard_saved)
    return bool(getattr(getattr(arrays.model, "settings", None), "sequence_shard_saved", False))


def _shard_pairs(arrays: _OpArrays, picks: np.ndarray, recompute: str,
                 rule: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`objectives.saved_credits.sequence_shard_pairs` of a plan under ``rule``; ``None`` where
    no credit applies (no rule, or the linears re-run from a checkpoint)."""
    settings = getattr(arrays.model, "settings", None)
    if not rule or settings is None or recompute not in KEEPS_LINEAR_INPUTS:
        return None
    producer, reader, credit = sequence_shard_pairs(arrays.model.graph, arrays.spaces, picks, settings, arrays.shared)  # type: ignore[attr-defined]
    kept = arrays.flat.get("activations_kept")
    if kept is not None and reader.size:  # the reader's saved input offloaded with the rest of its activations
        credit = credit * kept[arrays.offsets[reader] + picks[reader]]
    return producer, reader, credit


def _gated_credit(arrays: _OpArrays, recompute: str, fused_swiglu: bool | None) -> dict | None:
    """``{op: (K,) bytes}`` a launcher's fused SwiGLU (``fused_swiglu``, per search) keeps less than the
    cache's tables charge (:func:`objectives.gated_credit.fused_swiglu_credit`, kept on the arrays);
    ``None`` where nothing is credited: no rule, or tables built with it already (the cache's settings:
    a saved plan's, the fidelity rows')."""
    settings = getattr(arrays.model, "settings", None)
    if not fused_swiglu or settings is None or settings.fused_swiglu:
        return None
    if "fused swiglu" not in arrays.lazy:
        credit = fused_swiglu_credit(
            arrays.model.graph, arrays.spaces, dataclasses.replace(settings, recompute=recompute),  # type: ignore[attr-defined]
            getattr(arrays.model, "cost_model", "roofline"))
        kept = arrays.flat.get("activations_kept")
        if kept is not None and credit:  # offloaded activations: the credit shrinks with the charge it is taken from
            credit = {op: table * kept[arrays.offsets[op]:arrays.offsets[op] + len(table)] for op, table in credit.items()}
        arrays.lazy["fused swiglu"] = credit
    return arrays.lazy["fused swiglu"] or None


def grad_accumulator_scale(arrays: _OpArrays, zero_stage: int, pp: int,
                           grad_accumulator: Callable[..., float] | float | None = None) -> tuple[float, float]:
    r"""``(bytes per parameter, bytes per gradient byte)`` of the gradient accumulator a launcher's bf16
    optimizer keeps beside the bf16 gradients of every parameter the rank holds.

    DeepSpeed's ``BF16_Optimizer`` allocates ``fp32_groups_gradients_flat``, ``torch.zeros_like`` the flat
    bf16 parameters of each group in ``grad_acc_dtype``, whole on every data-parallel rank, and adds each
    ``param.grad`` into it after backward (``deepspeed/runtime/bf16_optimizer.py``, ``_setup_for_real_optimizer``
    and ``_update_hp_grad``, DeepSpeed 0.19.8); which settings select it is the launcher's rule
    (``exporters.deepspeed.bf16_optimizer.grad_accumulator``). The stage's bf16 gradients are those elements
    times 2 bytes at ZeRO 0-1, so the accumulator adds :math:`a / b_g` of them (:math:`a` its bytes per
    parameter, :math:`b_g` the gradient's). ZeRO 2-3 and fp32 training: none (0, 0).

    ``grad_accumulator``: bytes per parameter, or the rule ``grad_accumulator(*, zero_stage, pp, offload)`` (the
    search's launcher's, per plan; ``offload``: the settings'); ``None``: the cache's settings' ``grad_accumulator_bytes``."""
    settings = getattr(arrays.model, "settings", None)
    if settings is None or not settings.keeps_grad_accumulator(zero_stage):
        return 0.0, 0.0
    if grad_accumulator is None:
        grad_accumulator = settings.grad_accumulator_bytes
    per = float(grad_accumulator(zero_stage=zero_stage, pp=pp, offload=settings.offload) if callable(grad_accumulator)
                else grad_accumulator)
    return per, per / state_bytes_per_parameter(settings).grad


def zero_sync_rule(cache: StageCosts, zero_stage: int, zero_sync: Any = None) -> Any:
    """The ZeRO 0-2 synchronisation a plan at ``zero_stage`` is priced under (a ``planner.core.settings.ZeroSync``):
    ``zero_sync`` itself, or what its rule ``zero_sync(*, zero_stage, precision, offload)`` says for the cache's
    settings (the search's launcher's, per plan: ``Target.zero_sync``, DeepSpeed's
    ``exporters.deepspeed.zero_sync.zero_sync``); ``None``: the cache's settings' (``TrainingSettings.zero_sync``).
    ``None`` at ZeRO-3, where no rule applies, and wherever the result is Megatron-LM's own."""
    if zero_stage not in ZERO_SYNC_STAGES:
        return None
    settings = getattr(cache, "settings", None)
    if zero_sync is None:
        return getattr(settings, "zero_sync", None)
    if callable(zero_sync):
        settings = settings if settings is not None else TrainingSettings()
        return zero_sync(zero_stage=zero_stage, precision=settings.precision, offload=settings.offload)
    return zero_sync


def _credit_at(credit: dict, picks: np.ndarray) -> np.ndarray:
    """``(n_ops,)`` bytes: each op's credit at its configuration in ``picks``."""
    out = np.zeros(len(picks))
    for op, table in credit.items():
        out[op] = table[picks[op]]
    return out


def _pair_spans(lo: np.ndarray, hi: np.ndarray, weights: np.ndarray, layers: int) -> np.ndarray:
    """``(L+1, L+1)``: ``[i, j]`` the sum of ``weights`` over the pairs with both layer slots in ``[i, j)``
    (``lo <= hi``; ``planner.search.stage_costs._inside``, which the search may not import the other way)."""
    pairs = np.zeros((layers, layers))
    np.add.at(pairs, (lo, hi), weights)
    below = np.concatenate((np.zeros((layers, 1)), np.cumsum(pairs, axis=1)), axis=1)  # hi < j
    return np.concatenate((np.cumsum(below[::-1], axis=0)[::-1], np.zeros((1, layers + 1))))  # lo >= i


def segment_activation_bytes(arrays: _OpArrays, structure: LayerStructure, picks: np.ndarray,
                             activations: np.ndarray, in_flight: np.ndarray, recompute: str, *,
                             sequence_shard_saved: bool | None = None, fused_swiglu: bool | None = None,
                             chunks: int = 1) -> np.ndarray:
    """``(S, L+1, L+1)`` bytes: the activations stage ``s`` holds at its peak when it runs layers
    ``[i, j)``, :func:`price_plan`'s ``held`` per segment for the pipeline search's cut
    (``planner/search/stage_costs.py``). ``activations``: ``(L+1, L+1)`` per-micro-batch sums of the
    segments' ops; ``in_flight``: ``(S,)``, or ``(S, L+1, L+1)`` per segment. A segment holds the working set of the repeated blocks
    whose first instance's first op it runs (an op's layer as ``LayerStructure.stage_of_ops`` reads
    it); with recomputation every stage adds the largest (:func:`_working_set`,
    :func:`objectives.memory.pipelined_activation_bytes`). Under ``sequence_shard_saved`` (as
    :func:`price_plan` reads it) a segment's activations lose the shard credit of every
    (producer, reader) pair it runs both of, as a stage's do; under ``fused_swiglu`` its ops' and its
    working set's the fused SwiGLU's credit (:func:`_gated_credit`). Under a looped schedule (``chunks > 1``) the
    last stage's segments ``[i, L)`` hold one micro-batch of the ops after the last layer
    (:mod:`objectives.after_layers`), as :func:`price_plan`'s."""
    layers = structure.num_layers
    slot = np.clip(structure.position, 0, max(layers - 1, 0))  # the ends run with the first / last layer
    pairs = _shard_pairs(arrays, picks, recompute, _shard_rule(arrays, sequence_shard_saved))
    if pairs is not None and pairs[0].size and layers > 0:
        su, sv = slot[pairs[0]], slot[pairs[1]]
        activations = np.asarray(activations) - _pair_spans(np.minimum(su, sv), np.maximum(su, sv), pairs[2], layers)
    gated = _gated_credit(arrays, recompute, fused_swiglu)
    if gated and layers > 0:  # each segment's ops' credits (the sums of planner.search.stage_costs._spans)
        prefix = np.concatenate(([0.0], np.cumsum(np.bincount(slot, weights=_credit_at(gated, picks), minlength=layers))))
        activations = np.asarray(activations) - np.triu(prefix[None, :] - prefix[:, None])
    inside, largest = np.zeros((layers + 1, layers + 1)), 0.0
    if recompute != "none":
        ends = np.arange(layers + 1)
        for op, excess in _block_excess(arrays, picks, gated):
            at = int(np.clip(structure.position[op], 0, max(layers - 1, 0)))
            inside += max(excess, 0.0) * ((ends[:, None] <= at) & (ends[None, :] > at))
            largest = max(largest, excess)
    n = np.asarray(in_flight, dtype=np.float64)
    n = n if n.ndim == 3 else n[:, None, None]  # (S, L+1, L+1): a looped schedule's per segment (chunk_pad)
    if chunks <= 1 or layers == 0:
        return pipelined_activation_bytes(np.asarray(activations)[None], n, inside[None], largest)
    tail = np.zeros((n.shape[0], layers + 1, layers + 1))
    tail[-1, :layers, layers] = tail_activation_bytes(arrays.flat["activations_bytes"][arrays.offsets + picks],
                                                      structure.position, layers, pairs, _credit_at(gated, picks) if gated else None)
    return pipelined_activation_bytes(np.asarray(activations)[None], n, inside[None], largest, tail, TAIL_IN_FLIGHT_LOOPED)


def price_plan(
    cache: StageCosts,
    *,
    pp: int,
    batch: int,
    zero_stage: int,
    recompute: str,
    choice: Sequence[int] | np.ndarray,
    bounds: Sequence[int],
    global_batch: int,
    schedule: str = "1f1b",
    chunks: int = 1,
    memory_limit_bytes: float | None = None,
    zero3_gather: Any = None,
    sequence_shard_saved: bool | None = None,
    fused_swiglu: bool | None = None,
    grad_accumulator: Callable[..., float] | float | None = None,
    zero_sync: Any = None,
    chosen_edges: bool = False,
    pipeline_buffers: str | None = None,
) -> _Priced:
    """:func:`evaluate_pipeline`'s numbers, the point itself built on demand (the search builds only
    the points that reach its running frontier). ``zero3_gather``: the launcher's per-sub-module
    gather bounds (:func:`_gather_rule`; only ZeRO-3's unsharded memory reads them);
    ``sequence_shard_saved``, ``fused_swiglu``: the launcher's shard and SwiGLU rules (:func:`_shard_rule`,
    :func:`_gated_credit`), per search too; ``grad_accumulator``: its optimizer's gradient accumulator
    (:func:`grad_accumulator_scale`), per plan; ``zero_sync``: its ZeRO-1/2 synchronisation (:func:`zero_sync_rule`),
    per plan; ``chosen_edges``: the edges priced at ``choice`` alone (:func:`evaluate_pipeline`); ``pipeline_buffers``:
    what the launcher's pipeline runtime holds at the cuts (:func:`_runtime_buffers`; ``None``: the settings')."""
    _check_plan(cache, pp=pp, batch=batch, bounds=bounds, global_batch=global_batch)
    devices = cache.cluster.devices // pp
    micro_batches = global_batch // batch
    sync_rule = zero_sync_rule(cache, zero_stage, zero_sync)
    arrays = cache.arrays(devices, batch, zero_stage, recompute, zero_sync=sync_rule, edges=not chosen_edges,
                          zero3_gather=zero3_gather)  # its time too (deepspeed_zero3), from ZeRO-3 on
    structure = cache.structure(batch)
    picks = np.asarray(choice, dtype=np.int64)
    stage = structure.stage_of_ops(bounds) if pp > 1 else np.zeros(len(picks), dtype=np.int64)
    sums = _stage_sums(cache, arrays, stage, picks, pp,
                       cache.chosen_edges(devices, batch, recompute, picks) if chosen_edges else None)
    gather = _gather_rule(arrays, zero3_gather) if zero_stage >= 3 else None
    sums = _fsdp_unit_sums(arrays, structure, stage, picks, pp, sums, zero_stage=zero_stage, gather=gather)
    if zero_stage >= 3:  # FSDP2 / ZeRO-3: the units whole at the peak, beside the sharded states
        whole_params, whole_grads = _unsharded_bytes(arrays, structure, stage, picks, pp, micro_batches, gather)
        sums = dataclasses.replace(sums, params_bytes=sums.params_bytes + whole_params,
                                   grads_bytes=sums.grads_bytes + whole_grads)
    accumulator, scale = grad_accumulator_scale(arrays, zero_stage, pp, grad_accumulator)
    if scale:  # a launcher's bf16 optimizer accumulates the stage's gradients in a buffer of its own
        sums = dataclasses.replace(sums, grads_bytes=sums.grads_bytes * (1.0 + scale))
    layers = np.diff(np.asarray(bounds, dtype=np.float64))  # a looped schedule's unequal chunks (chunk_pad)
    in_flight = in_flight_micro_batches(schedule, stages=pp, micro_batches=micro_batches, chunks=chunks,
                                        stage_layers=layers if pp > 1 else None)
    gated, settings = _gated_credit(arrays, recompute, fused_swiglu), getattr(arrays.model, "settings", None)
    inside, working = _working_set(arrays, stage, picks, pp, gated) if recompute != "none" else (0.0, 0.0)
    per_micro_batch = sums.activations_bytes
    if gated:  # the fused SwiGLU keeps fc1's output only (objectives.gated_credit)
        per_micro_batch = per_micro_batch - np.bincount(stage, weights=_credit_at(gated, picks), minlength=pp)
    pairs = _shard_pairs(arrays, picks, recompute, _shard_rule(arrays, sequence_shard_saved)) if devices > 1 else None
    shard_saved = False
    if pairs is not None and pairs[0].size:  # a linear keeps its producer's shard (sequence_shard_credit)
        same = stage[pairs[0]] == stage[pairs[1]]
        credit = np.bincount(stage[pairs[1]][same], weights=pairs[2][same], minlength=pp)
        per_micro_batch, shard_saved = per_micro_batch - credit, bool(credit.any())
    held = _held_bytes(arrays, structure, bounds, picks, devices, (per_micro_batch, inside, working, pairs, gated), in_flight,
                       micro_batches, chunks, schedule, pipeline_buffers)
    states = sums.params_bytes + sums.grads_bytes + sums.optimizer_bytes
    graphs = _graph_buffers(arrays, structure, picks, bounds if pp > 1 else (0, structure.num_layers), in_flight)
    other = OTHER_FRACTION * (states + held + graphs)
    nccl = nccl_stage_bytes(cache, arrays, picks, pp, interleaved=chunks > 1)
    p2p = _boundary_p2p_s(cache, structure, bounds, pp)
    floors = stage_host_floors_s(cache, np.diff(np.asarray(bounds, dtype=np.float64)), recompute)
    work, sums = None, _first_forward_paid(sums, floors)  # hpZ's first forward, floored with its micro-batch
    if floors is not None:
        # fixed costs of a launcher (objectives.fixed_costs): a stage's pass is at least its layers'
        # and its micro-batch's host work; each send/receive call pays its fixed part
        work = (sums.forward_s, sums.backward_s, p2p)
        floor_f, floor_b, per_transfer = floors
        sums = dataclasses.replace(sums, forward_s=np.maximum(sums.forward_s, floor_f),
                                   backward_s=np.maximum(sums.backward_s, floor_b))
        p2p = p2p + per_transfer
    pipeline = float(
        pipeline_time_s(
            schedule, forward_s=sums.forward_s, backward_s=sums.backward_s, p2p_s=p2p, micro_batches=micro_batches,
            chunks=chunks, stage_layers=layers if pp > 1 else None, p2p_overlapped=p2p_overlapped(arrays),
        )
    )
    step_time = pipeline_step_s(pipeline, sums, p2p)
    limit = float(memory_limit_bytes) if memory_limit_bytes is not None else float(cache.cluster.device.memory_bytes)
    if sync_rule is not None and not np.any((arrays.flat["step_s"] - arrays.flat["update_s"])[arrays.offsets + picks] > 0.0):
        sync_rule = None  # no sharded-optimizer traffic (one data-parallel rank): priced alike under every rule, one row
    return _PlanPrice(
        cache=cache, arrays=arrays, structure=structure, pp=pp, batch=batch, global_batch=global_batch,
        zero_stage=zero_stage, recompute=recompute, schedule=schedule, chunks=chunks, picks=picks, bounds=bounds,
        stage=stage, sums=sums, in_flight=in_flight, held=held, other=other, memory=states + held + graphs + other + nccl,
        pipeline_s=pipeline, p2p_s=p2p, step_s=step_time, limit_bytes=limit, work=work, gather=gather,
        shard_saved=shard_saved, gated=bool(gated) or bool(getattr(settings, "fused_swiglu", False)),
        accumulator=accumulator if scale else 0.0, zero_sync=sync_rule, graph_buffers=graphs, nccl=nccl,
    ).priced()


def _held_bytes(arrays: _OpArrays, structure: LayerStructure, bounds: Sequence[int], picks: np.ndarray, devices: int,
                activations: tuple, in_flight: np.ndarray, micro_batches: int, chunks: int, schedule: str,
                kind: str | None) -> np.ndarray:
    """``(pp,)`` bytes :func:`price_plan` holds beyond the states: the in-flight activations
    (:func:`objectives.memory.pipelined_activation_bytes`, ``activations``: each stage's per micro-batch, the
    recomputation working set inside them and itself, the shard pairs and the SwiGLU credit), the last stage's ops after
    the last layer at their own count (:mod:`objectives.after_layers`), and the runtime's buffers (:func:`_runtime_buffers`)."""
    per_micro_batch, inside, working, pairs, gated = activations
    tail = np.zeros(np.shape(per_micro_batch))
    if chunks > 1:  # else held at the stage's own count, as the rest: nothing to take apart
        tail[-1] = tail_activation_bytes(arrays.flat["activations_bytes"][arrays.offsets + picks], structure.position,
                                         structure.num_layers, pairs, _credit_at(gated, picks) if gated else None)
    held = pipelined_activation_bytes(per_micro_batch, in_flight, inside, working, tail, tail_in_flight(in_flight, chunks))
    return held + _runtime_buffers(arrays, structure, bounds, picks, devices, in_flight, micro_batches, chunks, kind, schedule)


def runtime_buffer_rates(arrays: _OpArrays, picks: np.ndarray, in_flight: np.ndarray, micro_batches: int, chunks: int,
                         kind: str | None = None, schedule: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """``(per input byte, per output byte)``: each stage's bytes the launcher's pipeline runtime ``kind`` holds per
    byte (per device) of the activation entering and leaving it (:func:`objectives.pipeline_buffers.stage_buffer_bytes`,
    linear in both; ``in_flight`` as it takes it); ``None`` where it holds nothing. ``kind`` ``None``: the settings'
    (``TrainingSettings.pipeline_buffers``); per plan, ``TargetRules.pipeline_buffers``. Under a looped ``schedule``
    (``chunks > 1``) per chunk, at the schedule's chunk passes (not padded for unequal chunks: a chunk's buffers are
    its cuts', whatever its layers), where the runtime has them
    (:func:`objectives.pipeline_buffers.looped_buffers_priced`: torch's, not under ZB-V)."""
    kind = kind or getattr(getattr(arrays.model, "settings", None), "pipeline_buffers", "none")
    f = np.asarray(in_flight, dtype=np.float64)
    if kind == "none" or f.shape[0] <= 1 or (chunks > 1 and not looped_buffers_priced(kind, schedule)):
        return None
    if chunks > 1:
        f = in_flight_micro_batches(schedule, stages=f.shape[0], micro_batches=micro_batches, chunks=chunks)
    tensor_parallel = bool(np.max(arrays.flat["tp_split"][arrays.offsets + picks]) > 1)
    rate = functools.partial(stage_buffer_bytes, kind, in_flight=f, micro_batches=micro_batches, chunks=chunks,
                             tensor_parallel=tensor_parallel)
    return rate(cut_in=1.0, cut_out=0.0), rate(cut_in=0.0, cut_out=1.0)


def _runtime_buffers(arrays: _OpArrays, structure: LayerStructure, bounds: Sequence[int], picks: np.ndarray, devices: int,
                     in_flight: np.ndarray, micro_batches: int, chunks: int, kind: str | None = None,
                     schedule: str | None = None) -> np.ndarray:
    """``(pp,)`` bytes the launcher's pipeline runtime holds at each stage's cuts beyond the layers' tensors
    (:func:`runtime_buffer_rates`): the activation crossing each cut over the stage's devices, as
    :func:`_boundary_p2p_s` sends it; the first stage's input and the last's output, not sent, read as its other cut
    (a looped schedule's chunk boundaries there are like the others)."""
    rates = runtime_buffer_rates(arrays, picks, in_flight, micro_batches, chunks, kind, schedule)
    if rates is None:
        return np.zeros(len(bounds) - 1)
    cuts = structure.cut_bytes[np.asarray(bounds, dtype=np.int64)] / devices
    cuts[0], cuts[-1] = cuts[1], cuts[-2]
    return rates[0] * cuts[:-1] + rates[1] * cuts[1:]


def nccl_stage_bytes(cache: StageCosts, arrays: _OpArrays, picks: np.ndarray, pp: int, *, interleaved: bool) -> np.ndarray:
    """``(pp,)`` bytes of NCCL's buffers on a rank of each stage (:func:`objectives.nccl_memory.layout_buffer_bytes`):
    the plan's tensor- and context-parallel groups (the ``tp`` / ``cp`` split of the plan's most FLOPs,
    ``planner.core.degrees.dim_roles``, as its degrees are named), its gradient group (the stage's other devices,
    ``dp x cp``; two under hybrid sharding), the expert-parallel all-to-all (``TrainingSettings.expert_parallel``) and
    each stage's pipeline neighbours (:func:`objectives.nccl_memory.pipeline_links`: on its node, or across nodes).
    The groups are the whole plan's, not each stage's own, so a stage's term does not depend on where the
    cuts fall and the search's segment costs (``planner.search.stage_costs._step_costs``) hold it as the price
    does. ``NCCL_BUFFSIZE``: ``Cluster.nccl_buffsize_bytes``."""
    if cache.cluster.devices <= 1:
        return np.zeros(pp)
    devices = cache.cluster.devices // pp
    flat_index = arrays.offsets + picks
    tp_all = arrays.flat["tp_split"][flat_index].astype(np.int64)
    cp_all = arrays.flat["cp_split"][flat_index].astype(np.int64)
    width = devices + 1
    keys, inverse = np.unique(tp_all * width + cp_all, return_inverse=True)
    weight = np.bincount(inverse.reshape(-1), weights=arrays.flat["op_flops"][flat_index], minlength=keys.size)
    tp, cp = divmod(int(keys[int(np.argmax(weight))]), width)  # ties: smallest tp
    settings = getattr(arrays.model, "settings", None)
    ep = int(getattr(settings, "expert_parallel", 1) or 1)
    buffsize = int(getattr(cache.cluster, "nccl_buffsize_bytes", NCCL_SIMPLE_BUFFSIZE))
    links = pipeline_links(pp, devices_per_stage=devices, devices_per_node=cache.cluster.devices_per_node,
                           interleaved=interleaved)
    return np.array([layout_buffer_bytes(tp=tp, cp=cp, dp=max(devices // (tp * cp), 1), ep=ep, p2p_peers=links[s][0],
                                         net_peer=links[s][1], dp_shard=getattr(settings, "dp_shard", None),
                                         buffsize=buffsize, hpz=getattr(settings, "hpz_partition", None)
                                         if arrays.states_zero_stage >= 3 else None) for s in range(pp)])


def _graph_buffers(arrays: _OpArrays, structure: LayerStructure, picks: np.ndarray, bounds: Sequence[int],
                   in_flight: np.ndarray) -> np.ndarray:
    """``(pp,)`` bytes per device of Transformer Engine's per-layer CUDA graphs' static buffers
    (:mod:`objectives.cuda_graph_memory`) under ``TrainingSettings.cuda_graph_scope = "layers"`` (Megatron-LM's
    ``--cuda-graph-impl transformer_engine``); zeros otherwise (a whole-step graph's inputs are the batch's tokens)."""
    settings = getattr(arrays.model, "settings", None)
    graphs = np.zeros(len(bounds) - 1)
    if settings is None or not settings.cuda_graphs or settings.cuda_graph_scope != "layers" or not structure.num_layers:
        return graphs
    graph: OpGraph = arrays.model.graph  # type: ignore[attr-defined]
    hidden, mask = layer_static_bytes(graph, structure.position, structure.num_layers, arrays.spaces, picks)
    return te_graph_buffer_bytes(hidden, mask, bounds, in_flight)
