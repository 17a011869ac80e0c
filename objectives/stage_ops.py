r"""A priced pipeline plan's stages op by op: each op's entries of the stage's pipeline arrays, and the
stage's other terms, which together give the stage's seconds the plan reports.

:func:`objectives.pipeline_price.price_plan` prices a stage from its ops' entries of the pipeline
arrays (:mod:`objectives.pipeline_arrays`: forward and backward seconds per micro-batch, seconds once
per step, parameter states and one micro-batch's activations, at the plan's ZeRO stage and
recomputation) plus three terms no op owns. For stage :math:`s` with ops :math:`O_s`:

.. math::

    F_s &= \sum_{i \in O_s} f_i + \tfrac{1}{2} R_s + T^f_s + H^f_s, \qquad
    B_s = \sum_{i \in O_s} b_i + \tfrac{1}{2} R_s + T^b_s + H^b_s, \\
    G_s &= \sum_{i \in O_s} g_i + T^g_s + X_s

with :math:`R_s` the redistribution between the stage's own ops per micro-batch (half in each pass;
an edge between stages is the stage-to-stage transfer, priced in the schedule), :math:`T` the copies
of parameters another stage owns (a tied embedding: its ZeRO traffic, and the all-reduce between the
two copies once per step, paid by both stages) and :math:`H` the host-wait floor of an execution
model (:func:`objectives.pipeline_price.stage_host_floors_s`): :math:`H^f_s = \max(0, \text{floor}^f_s -
\text{work}^f_s)`, what the host's per-layer and per-micro-batch work adds beyond the kernels'. :math:`X_s`: what
the step's first micro-batch's forward adds once per step beyond its host wait (ZeRO++'s hpZ gathers over every
rank, :mod:`objectives.first_forward`), 0 elsewhere.

The states add up alike: the ops' parameters, gradients and optimizer state, the tied copies', ZeRO-3's
units held whole at the peak (:func:`objectives.pipeline_price._unsharded_bytes`) and a launcher's bf16
gradient accumulator (:func:`objectives.pipeline_price.grad_accumulator_scale`) give the stage's; its
activations (the in-flight micro-batches, credits and working set) are the stage's own figure.

Here every term is read from what the price read: the same arrays of the same cache (so the
stage-model entries, never a second pricing), the same edge lookups and tied copies, the same floors.
The per-op rows also say what of an op's time is communication: its intra-op collectives by kind
(the stage model's ``OpCostDetail.comm_s``, inside forward and backward), the ZeRO traffic each
micro-batch adds at the plan's stage (its arrays less those at ZeRO 0) and its gradient
synchronisation once per step (``step_s`` less the optimizer's ``update_s``). Under an execution model
each row also carries its fixed costs (:mod:`objectives.fixed_cost_parts`: its kernels and their launch
seconds, its collectives' NCCL algorithm, protocol and latency), parts of its forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from objectives.first_forward import first_forward_extra_s
from objectives.fixed_cost_parts import OpFixedCosts, op_fixed_costs
from objectives.pipeline_price import (
    PipelinePoint,
    _gather_rule,
    _unsharded_bytes,
    grad_accumulator_scale,
    stage_host_floors_s,
    tied_sync_s,
)

__all__ = ["OpStageCost", "StageOps", "stage_ops"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpStageCost:
    """One op of a stage at its configuration, per device of the stage."""

    op: int
    """Index in the point's graph (the model at the micro-batch's samples)."""
    name: str
    kind: str
    forward_s: float
    """Seconds per micro-batch, forward (compute, intra-op communication, ZeRO-3's gather)."""
    backward_s: float
    """Seconds per micro-batch, backward (recomputation included)."""
    step_s: float
    """Seconds once per step: the gradient synchronisation left after the last backward and the optimizer step."""
    update_s: float
    """The optimizer step's part of :attr:`step_s`."""
    comm_s: Mapping[str, float]
    """Intra-op communication per micro-batch by kind (``partial_sum``, ``input_grad``, ``norm_stats``,
    ``halo``), inside :attr:`forward_s` and :attr:`backward_s`; kinds with 0 s are left out."""
    zero_s: float
    """ZeRO traffic per micro-batch (ZeRO-2's reduce-scatter, ZeRO-3's gathers), inside forward and backward."""
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    """Of one micro-batch, before the schedule's in-flight count and the stage's credits."""
    fixed: OpFixedCosts | None = None
    """Its kernel launches and collectives' latency inside :attr:`forward_s` and :attr:`backward_s`
    (:func:`objectives.fixed_cost_parts.op_fixed_costs`); ``None`` without an execution model."""

    @property
    def grad_sync_s(self) -> float:
        """Seconds per step of its gradient synchronisation (:attr:`step_s` less the optimizer step)."""
        return self.step_s - self.update_s

    @property
    def states_bytes(self) -> float:
        """Its parameters, gradients and optimizer state, per device."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def per_step_s(self, micro_batches: int) -> float:
        """Its seconds in one step on its stage: ``micro_batches x (forward + backward) + step``."""
        return micro_batches * (self.forward_s + self.backward_s) + self.step_s


@dataclass(frozen=True, slots=True, kw_only=True)
class StageOps:
    """A stage's ops and the terms no op owns (module docstring); the stage's own figures beside them."""

    index: int
    ops: tuple[OpStageCost, ...]
    redistribution_s: float
    """Per micro-batch, forward + backward, between ops of this stage (half in each pass)."""
    tied_forward_s: float
    tied_backward_s: float
    tied_step_s: float
    """Copies of parameters another stage owns: their ZeRO traffic and the all-reduce between stages."""
    host_wait_forward_s: float
    host_wait_backward_s: float
    """What the host-work floor adds per micro-batch beyond the kernels' (0 under the plain roofline)."""
    first_forward_s: float = 0.0
    """Per step: what its step's first micro-batch's forward adds beyond that micro-batch's host wait (ZeRO++'s hpZ,
    :func:`objectives.first_forward.first_forward_extra_s`), in the stage's ``grad_sync_s``; 0 without hpZ."""
    tied_states_bytes: float
    """Parameters, gradients and optimizer state of the tied copies it holds."""
    gathered_bytes: float
    """ZeRO-3 / FSDP: the parameters and gradients of the units it holds whole at its peak (0 below ZeRO-3)."""
    accumulator_bytes: float
    """A launcher's bf16 gradient accumulator beside its gradients (0 where none is priced)."""
    forward_s: float
    backward_s: float
    grad_sync_s: float
    """The stage's figures as the plan reports them (:class:`objectives.pipeline_price.StagePlan`)."""
    states_bytes: float
    """Its parameters, gradients and optimizer state per device as the plan reports them: the ops' states
    plus :attr:`tied_states_bytes`, :attr:`gathered_bytes` and :attr:`accumulator_bytes`."""


def _tied_terms(cache: Any, arrays: Any, stage_of: np.ndarray, picks: np.ndarray, pp: int) -> np.ndarray:
    """``(pp, 5)`` forward, backward and per-step seconds, gradient and other state bytes of the tied copies
    each stage holds, as :func:`objectives.pipeline_price._stage_sums` adds them."""
    out = np.zeros((pp, 5))
    for copy in arrays.tied:
        s, owner = int(stage_of[copy.op]), int(stage_of[copy.owner])
        if s == owner:
            continue
        c = int(picks[copy.op])
        shared = tied_sync_s(cache, float(copy.grad_bytes[c]))
        out[s] += (float(copy.forward_s[c]), float(copy.backward_s[c]), float(copy.step_s[c]) + shared,
                   float(copy.grads_bytes[c]), float(copy.params_bytes[c] + copy.optimizer_bytes[c]))
        out[owner, 2] += shared
    return out


def _op_row(point: PipelinePoint, arrays: Any, zero_arrays: Any, op: int, pick: int) -> OpStageCost:
    """Op ``op``'s entries of the stage arrays at configuration ``pick``."""
    at = int(arrays.offsets[op]) + pick
    flat = arrays.flat
    details = getattr(arrays.model, "op_details", ())
    comm: dict[str, float] = {}
    if details:
        for (kind, _level), seconds in details[op].comm_s.items():
            comm[kind] = comm.get(kind, 0.0) + float(seconds[pick])
    node = point.graph.ops[op]
    passes = float(flat["forward_s"][at] + flat["backward_s"][at])
    unsynced = float(zero_arrays.flat["forward_s"][at] + zero_arrays.flat["backward_s"][at])
    return OpStageCost(
        op=op, name=node.name, kind=node.kind, forward_s=float(flat["forward_s"][at]),
        backward_s=float(flat["backward_s"][at]), step_s=float(flat["step_s"][at]), update_s=float(flat["update_s"][at]),
        comm_s={kind: seconds for kind, seconds in comm.items() if seconds > 0.0},
        zero_s=max(passes - unsynced, 0.0) if zero_arrays is not arrays else 0.0,
        params_bytes=float(flat["params_bytes"][at]), grads_bytes=float(flat["grads_bytes"][at]),
        optimizer_bytes=float(flat["optimizer_bytes"][at]), activations_bytes=float(flat["activations_bytes"][at]),
        fixed=op_fixed_costs(arrays.model, op, pick) if details else None,
    )  # fmt: skip


def _held_states(cache: Any, arrays: Any, point: PipelinePoint, stage_of: np.ndarray, picks: np.ndarray,
                 grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``((pp,), (pp,))`` bytes each stage holds beyond its ops' and tied copies' states, as
    :func:`objectives.pipeline_price.price_plan` adds them: ZeRO-3's units held whole (parameters and
    gradients), and the bf16 gradient accumulator (``grads``: the stage's gradient bytes before it)."""
    gathered, whole_grads = np.zeros(point.pp), np.zeros(point.pp)
    if point.zero_stage >= 3:
        params, whole_grads = _unsharded_bytes(arrays, cache.structure(point.micro_batch_samples), stage_of, picks,
                                               point.pp, point.micro_batches, _gather_rule(arrays, point.zero3_gather))
        gathered = params + whole_grads
    _, scale = grad_accumulator_scale(arrays, point.zero_stage, point.pp, point.grad_accumulator_bytes)
    return gathered, scale * (grads + whole_grads)


def stage_ops(cache: Any, point: PipelinePoint) -> tuple[StageOps, ...]:
    """Each stage of ``point`` op by op, from ``cache`` (the
    :class:`objectives.pipeline_cost.PipelineCostCache` that priced it): the ops' entries and the
    stage's other terms (module docstring), whose sums give each stage's ``forward_s``, ``backward_s``
    and ``grad_sync_s``."""
    pp, devices, batch = point.pp, point.devices_per_stage, point.micro_batch_samples
    arrays = cache.arrays(devices, batch, point.zero_stage, point.recompute,  # its launcher's ZeRO-3 time rule too
                          zero3_gather=getattr(point, "zero3_gather", None))
    zero_arrays = arrays if point.zero_stage == 0 else cache.arrays(devices, batch, 0, point.recompute)
    picks = np.asarray(point.choice, dtype=np.int64)
    stage_of = np.zeros(len(picks), dtype=np.int64)
    for stage in point.stages:
        stage_of[list(stage.ops)] = stage.index
    redistribution = np.zeros(pp)
    if arrays.edges:
        inside = stage_of[arrays.edge_u] == stage_of[arrays.edge_v]
        redistribution = np.bincount(stage_of[arrays.edge_u][inside], weights=arrays.edge_time_s(picks)[inside],
                                     minlength=pp)  # fmt: skip
    tied = _tied_terms(cache, arrays, stage_of, picks, pp)
    grads = np.bincount(stage_of, weights=arrays.flat["grads_bytes"][arrays.offsets + picks], minlength=pp) + tied[:, 3]
    gathered, accumulator = _held_states(cache, arrays, point, stage_of, picks, grads)
    bounds = [stage.layers[0] for stage in point.stages] + [point.stages[-1].layers[1]]
    floors = stage_host_floors_s(cache, np.diff(np.asarray(bounds, dtype=np.float64)), point.recompute)
    first = arrays.flat.get("first_forward_s")  # hpZ's first forward (objectives.first_forward), as the price adds it
    first = np.zeros(pp) if first is None else np.bincount(stage_of, weights=first[arrays.offsets + picks], minlength=pp)
    out = []
    for stage in point.stages:
        s = stage.index
        rows = tuple(_op_row(point, arrays, zero_arrays, op, int(picks[op])) for op in stage.ops)
        work_f = sum(r.forward_s for r in rows) + redistribution[s] / 2.0 + tied[s, 0]
        work_b = sum(r.backward_s for r in rows) + redistribution[s] / 2.0 + tied[s, 1]
        wait_f = 0.0 if floors is None else max(float(floors[0][s]) - work_f, 0.0)
        wait_b = 0.0 if floors is None else max(float(floors[1][s]) - work_b, 0.0)
        out.append(StageOps(
            index=s, ops=rows, redistribution_s=float(redistribution[s]), tied_forward_s=float(tied[s, 0]),
            tied_backward_s=float(tied[s, 1]), tied_step_s=float(tied[s, 2]), host_wait_forward_s=wait_f,
            host_wait_backward_s=wait_b, tied_states_bytes=float(tied[s, 3] + tied[s, 4]),
            first_forward_s=float(first_forward_extra_s(work_f, first[s], None if floors is None else floors[0][s])),
            gathered_bytes=float(gathered[s]), accumulator_bytes=float(accumulator[s]), forward_s=stage.forward_s,
            backward_s=stage.backward_s, grad_sync_s=stage.grad_sync_s,
            states_bytes=stage.memory.params_bytes + stage.memory.grads_bytes + stage.memory.optimizer_bytes,
        ))  # fmt: skip
    return tuple(out)
