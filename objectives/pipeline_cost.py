r"""Price pipeline plans: per-op costs split into forward / backward / per-step parts, and a whole plan.

A pipeline plan (:mod:`planner.search.pipeline` searches them) runs ``pp`` stages of
:math:`d = N / pp` devices each; the global batch :math:`G` runs as :math:`m = G / b` micro-batches
of :math:`b` samples. Every op and edge is priced by the ordinary cost model
(:func:`objectives.tables.build_cost_model`) on a :math:`d`-device stage
(:func:`stage_cluster`) at batch :math:`b`, once per (d, b, recompute) at ZeRO 0
(:class:`PipelineCostCache`: the recompute variants reuse the first one's configuration spaces and
edge tables). Where each term is computed:

* the layers and the bytes crossing each cut: :func:`layer_structure`;
* per op, forward and backward seconds per micro-batch and per-step seconds, and the parameter
  states at every ZeRO stage: :class:`_ModelParts` (ZeRO-independent) and :func:`_op_arrays`;
* which op accounts for each parameter (the tables' rule: its first reader) and its copies in
  other stages (tied embeddings): :func:`_parameter_reads`, :func:`_tied_copies`;
* one plan (stage cut, per-op choice, ZeRO, recompute, schedule): :func:`price_plan`, the
  schedule's makespan with its bubble and the stage-to-stage transfers
  (:mod:`objectives.schedules`), plus each stage's per-step gradient synchronisation after its
  last backward; memory per stage = its parameter states + the in-flight micro-batches'
  activations the schedule keeps + the allowance (:data:`objectives.memory.OTHER_FRACTION`).

ZeRO under gradient accumulation (:func:`_zero_sync_s`, :func:`_phases`): the collectives
:func:`objectives.intra_op.grad_sync_terms` prices for one step at the ZeRO stage (one rule for
what ZeRO moves, shared with the single-stage tables), each placed where it runs; with
:math:`G_i` the op's ZeRO-0 all-reduce, since ring reduce-scatter and all-gather of equal buffers
cost half of it each (gradients and parameters have the same bytes per element):

=====  ==============================  =============================================
ZeRO   per micro-batch                 per step
=====  ==============================  =============================================
0      -                               all-reduce of gradients (:math:`G`)
1      -                               reduce-scatter + all-gather (:math:`G`)
2      reduce-scatter (:math:`G/2`)    all-gather of updated parameters (:math:`G/2`)
3      all-gather before forward        -
       (:math:`G/2`); all-gather +
       reduce-scatter in backward
       (:math:`G`)
=====  ==============================  =============================================

Under an execution model the synchronisation is bucketed as the tables bucket it, and the gradient
reductions of ZeRO 0-2 overlap backward; ZeRO-3's traffic stays on the critical path (a parameter
gather must finish before the compute that reads it).

Stage-to-stage transfers: each device sends its :math:`1/d` share of the boundary activations
(Megatron-LM's scatter/gather of the tensor-parallel copies), forward and, as gradient, backward,
on the link the boundary crosses. A parameter read in two stages (tied embeddings) is held by both:
each copy is synchronised inside its stage by the ZeRO rule above (:func:`_tied_copies`), and the
two copies' gradients are all-reduced between the stages once per step.

References
----------
D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC 2021. S. Rajbhandari et al., "ZeRO", SC 2020.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from objectives._common import canonical_parameter, element_bytes, is_parameter_name, shard_elements
from objectives.collectives import point_to_point_time_s, ring_all_reduce_time_s
from objectives.intra_op import (
    CommTerm,
    bucketed_grad_sync_s,
    grad_sync_terms,
    hidden_under_backward,
    price_terms,
    term_time_s,
)
from objectives.memory import OTHER_FRACTION, parameter_state_bytes, state_bytes_per_parameter
from objectives.schedules import (
    boundary_crosses_node,
    bubble_fraction,
    in_flight_micro_batches,
    pipeline_time_lower_bound_s,
    pipeline_time_s,
)
# one rule for who accounts for a parameter and for the tensors' parameter view: the tables'
from objectives.parameters import ParameterView, parameter_ownership
from objectives.tables import build_cost_model, with_edges
from planner.core.cluster import Cluster
from planner.core.configs import ConfigOptions, ConfigSpace, batch_products
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import TrainingSettings
from planner.core.strategy import MemoryBreakdown
from planner.core.tables import EdgeCost

__all__ = [
    "GraphAtBatch",
    "LayerStructure",
    "layer_structure",
    "stage_cluster",
    "PipelineCostCache",
    "StagePlan",
    "PipelineTime",
    "PipelinePoint",
    "evaluate_pipeline",
    "price_plan",
]

GraphAtBatch = Callable[[int], OpGraph]
"""``graph_at_batch(samples) -> OpGraph``: the model with its batch dim bound to ``samples``."""


# --------------------------------------------------------------------------------------------
# the layers

@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LayerStructure:
    """Where each op sits in the layer sequence, and what crosses each cut."""

    position: np.ndarray
    """``(n_ops,)`` int64: -1 before the first layer, ``0..L-1`` the layer, ``L`` after the last."""
    num_layers: int
    cut_bytes: np.ndarray
    """``(L + 1,)`` bytes of activations crossing a cut just before layer ``l`` (one micro-batch of
    this graph's batch, at the training precision; entries 0 and ``L`` unused)."""

    def stage_of_ops(self, bounds: Sequence[int]) -> np.ndarray:
        """``(n_ops,)`` stage index of each op under a partition's ``bounds``."""
        b = np.asarray(bounds, dtype=np.int64)
        stages = b.size - 1
        pos = np.clip(self.position, 0, max(self.num_layers - 1, 0))
        return np.clip(np.searchsorted(b, pos, side="right") - 1, 0, stages - 1)


def layer_structure(graph: OpGraph, settings: TrainingSettings | None = None) -> LayerStructure:
    """The layers of ``graph`` (its repeated blocks, in graph order) and the bytes crossing each cut.

    An op belongs to the layer whose first op most closely precedes it in the graph's topological
    order, so every edge runs from a layer to the same or a later one and any cut is a valid pipeline
    boundary. A graph without repeated blocks has no layers: it runs as one stage.
    """
    settings = settings or TrainingSettings()
    n = len(graph.ops)
    instances = sorted((inst for group in graph.blocks for inst in group.instances if inst), key=min)
    if not instances:
        return LayerStructure(position=np.full(n, -1, dtype=np.int64), num_layers=0, cut_bytes=np.zeros(1))
    starts = np.array([min(inst) for inst in instances], dtype=np.int64)
    last = max(instances[-1])
    index = np.arange(n, dtype=np.int64)
    position = np.searchsorted(starts, index, side="right") - 1
    position[index > last] = len(instances)
    layers = len(instances)
    # Bytes crossing each cut: a tensor crosses every cut between its producer and its last consumer.
    crossing = np.zeros(layers + 2)
    last_use: dict[str, int] = {}
    producer: dict[str, int] = {}
    for edge in graph.edges:
        producer[edge.tensor] = edge.producer
        last_use[edge.tensor] = max(last_use.get(edge.tensor, -2), int(position[edge.consumer]))
    for name, consumer_position in last_use.items():
        tensor = graph.tensors.get(name)
        if tensor is None:
            continue
        start = int(position[producer[name]]) + 1
        if consumer_position >= start:
            nbytes = tensor.num_elements * element_bytes(tensor, settings)
            crossing[max(start, 0)] += nbytes
            crossing[consumer_position + 1] -= nbytes
    cut_bytes = np.cumsum(crossing)[: layers + 1]
    return LayerStructure(position=position, num_layers=layers, cut_bytes=cut_bytes)


# --------------------------------------------------------------------------------------------
# costs per (stage devices, batch, ZeRO, recompute)


def stage_cluster(cluster: Cluster, devices: int) -> Cluster:
    """The sub-cluster of one pipeline stage: ``devices`` consecutive ranks.

    Raises :class:`InputError` when a stage would straddle nodes unevenly (``devices`` neither
    divides nor is a multiple of the devices per node).
    """
    per_node = cluster.devices_per_node
    if devices >= per_node:
        if devices % per_node:
            raise InputError(
                f"a stage of {devices} devices does not fill whole nodes of {per_node}; choose --pp so that "
                "devices / pp is a multiple or a divisor of the devices per node"
            )
        return dataclasses.replace(cluster, nodes=devices // per_node, devices_per_node=per_node)
    if per_node % devices:
        raise InputError(
            f"a stage of {devices} devices straddles nodes of {per_node}; choose --pp so that devices / pp "
            "divides the devices per node"
        )
    return dataclasses.replace(cluster, nodes=1, devices_per_node=devices)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _TiedCopy:
    """A parameter an op reads but another op accounts for (a tied embedding read in two stages)."""

    op: int
    owner: int
    states_bytes: np.ndarray
    """``(K,)`` the copy's parameter states."""
    params_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    forward_s: np.ndarray
    """``(K,)`` its synchronisation inside the stage in each micro-batch's forward (ZeRO-3's gather)."""
    backward_s: np.ndarray
    """``(K,)`` the same in each micro-batch's backward (ZeRO 2-3)."""
    step_s: np.ndarray
    """``(K,)`` the same once per step (ZeRO 0-2), by :func:`_zero_sync_s` as for the owner."""
    grad_bytes: np.ndarray
    """``(K,)`` bytes of its gradient shard, all-reduced with the owner's stage."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _OpArrays:
    """A cost model's per-op costs split the way a pipeline needs them (arrays shared like the model's)."""

    model: object
    """The ``objectives.tables.CostModel``."""
    key: tuple[int, ...]
    """Per op, an id equal for ops whose arrays are the same objects."""
    forward_s: tuple[np.ndarray, ...]
    backward_s: tuple[np.ndarray, ...]
    step_s: tuple[np.ndarray, ...]
    params_bytes: tuple[np.ndarray, ...]
    grads_bytes: tuple[np.ndarray, ...]
    optimizer_bytes: tuple[np.ndarray, ...]
    activations_bytes: tuple[np.ndarray, ...]
    edges: tuple[EdgeCost, ...]
    """Per micro-batch redistribution (forward + backward) of each op pair."""
    tied_source: tuple
    """``(cluster, settings, reads)`` to price the tied copies with (:attr:`tied`, on first use)."""
    shared: dict
    """:attr:`_ModelParts.shared` of the model (equal at every ZeRO stage)."""
    offsets: np.ndarray
    """``(n_ops,)`` start of each op's configurations in the flat arrays."""
    flat: Mapping[str, np.ndarray]
    """The distinct per-op arrays concatenated (ops with equal arrays share a row), for vectorised
    lookups of a choice: op ``i`` at configuration ``c`` is entry ``offsets[i] + c``."""
    edge_offsets: np.ndarray
    edge_strides: np.ndarray
    edge_u: np.ndarray
    edge_v: np.ndarray
    edge_flat: np.ndarray

    lazy: dict = field(default_factory=dict)
    """Values computed on first use (the tied copies: only priced plans need them)."""

    @property
    def spaces(self) -> tuple[ConfigSpace, ...]:
        return self.model.tables.configs  # type: ignore[attr-defined]

    @property
    def tied(self) -> tuple[_TiedCopy, ...]:
        """Parameters read by an op that another op accounts for (tied embeddings)."""
        if "tied" not in self.lazy:
            cluster, settings, reads = self.tied_source
            self.lazy["tied"] = _tied_copies(self.model, cluster, settings, reads)
        return self.lazy["tied"]


_ZERO_PHASES: Mapping[int, Mapping[str, tuple[float, float, float]]] = {
    0: {"all_reduce": (0.0, 0.0, 1.0)},
    1: {"reduce_scatter": (0.0, 0.0, 1.0), "all_gather": (0.0, 0.0, 1.0)},
    2: {"reduce_scatter": (0.0, 1.0, 0.0), "all_gather": (0.0, 0.0, 1.0)},
    3: {"reduce_scatter": (0.0, 1.0, 0.0)},
}
"""Where each collective of :func:`objectives.intra_op.grad_sync_terms` runs under gradient
accumulation: its ``(forward, backward)`` shares per micro-batch and its share per step (the table in
the module docstring). ZeRO-2 reduce-scatters each micro-batch's gradients as backward produces them
and gathers the updated parameters once per step; ZeRO-3 gathers the parameters per micro-batch
(:func:`_phases`) and keeps no per-step traffic (DeepSpeed ZeRO-3; Rajbhandari et al., SC 2020,
section 5)."""


def _phases(term: CommTerm, zero_stage: int) -> tuple[float, float, float]:
    """``(forward, backward, per step)`` shares of ``term``'s seconds (:data:`_ZERO_PHASES`). A
    ZeRO-3 parameter gather runs ``term.count`` times per micro-batch: once before forward, the rest
    in backward (before the backward, and before a recomputed op's re-run forward)."""
    if zero_stage >= 3 and term.collective == "all_gather":
        return (1.0 / term.count, (term.count - 1.0) / term.count, 0.0)
    return _ZERO_PHASES[zero_stage][term.collective]


def _zero_sync_s(
    op, space: ConfigSpace, detail, *, tensors, settings: TrainingSettings, owned: Sequence[int], cluster: Cluster,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(forward, backward, per-step)`` seconds of an op's gradient synchronisation at
    ``settings.zero_stage``: the terms ``objectives.intra_op`` prices for one step
    (:func:`~objectives.intra_op.grad_sync_terms`), priced as ``objectives.tables`` prices them
    (bucketed under an execution model), split by :data:`_ZERO_PHASES`.

    ``detail`` is the op's ``OpCostDetail`` at ZeRO 0 (its compute and whether an execution model
    buckets). Under an execution model the gradient reductions overlap backward (the tables'
    :func:`~objectives.intra_op.hidden_under_backward`) but ZeRO-3's traffic does not: its parameter
    gathers must finish before the compute that reads them, on every micro-batch's critical path.
    """
    zeros = np.zeros(space.size)
    recomputed = bool(np.any(detail.recompute_s > 0.0))
    terms: list[CommTerm] = grad_sync_terms(op, space, tensors=tensors, settings=settings, owned_inputs=owned,
                                            recomputed=recomputed)
    if not terms:
        return zeros, zeros, zeros
    weights = [np.asarray(_phases(t, settings.zero_stage), dtype=np.float64) for t in terms]
    executed = detail.grad_sync_unhidden_s is not None  # an execution model buckets and overlaps
    if all(np.array_equal(w, weights[0]) for w in weights):  # one phase: the tables' sum as it is
        return tuple(w * _exposed_sync_s(terms, detail, settings, cluster) for w in weights[0])  # type: ignore[return-value]
    seconds = [term_time_s(t, cluster=cluster) for t in terms]
    parts = [sum((w[phase] * t for w, t in zip(weights, seconds)), zeros) for phase in range(3)]
    if not executed:
        return tuple(parts)  # type: ignore[return-value]
    whole = parts[0] + parts[1] + parts[2]  # each phase keeps its share of the bucketed, exposed sum
    scale = np.divide(_exposed_sync_s(terms, detail, settings, cluster), whole, out=zeros.copy(), where=whole > 0.0)
    return tuple(part * scale for part in parts)  # type: ignore[return-value]


def _exposed_sync_s(terms: list[CommTerm], detail, settings: TrainingSettings, cluster: Cluster) -> np.ndarray:
    """``(K,)`` seconds of ``terms`` as the tables price an op's synchronisation: summed over the
    levels; under an execution model bucketed and, below ZeRO-3, hidden under the op's backward."""
    size = detail.time_s.shape[0]
    if detail.grad_sync_unhidden_s is None:
        levels = {level: t for (_, level), t in price_terms(terms, cluster=cluster, size=size).items()}
    else:
        levels = bucketed_grad_sync_s(terms, cluster=cluster, size=size)
        if settings.zero_stage < 3:
            optimizer = detail.optimizer_s if detail.optimizer_s is not None else 0.0
            backward = detail.compute_s - detail.recompute_s - optimizer - detail.forward_s
            levels = hidden_under_backward(levels, backward_s=backward)
    return sum(levels.values(), np.zeros(size))


def _parameter_reads(graph: OpGraph, owned: Sequence[tuple[int, ...]]) -> list[tuple[int, int, int]]:
    """Every read ``(op, input position, owner op)`` of a parameter by an op that does not account
    for it (a tied embedding read by the LM head); ``owned``: the tables' ownership (first reader)."""
    owner: dict[str, int] = {}
    for index, positions in enumerate(owned):
        for position in positions:
            owner[canonical_parameter(graph, graph.ops[index].inputs[position].tensor)] = index
    reads = []
    for index, op in enumerate(graph.ops):
        for position, access in enumerate(op.inputs):
            if position in owned[index] or not is_parameter_name(graph.tensors, graph.parameter_aliases, access.tensor):
                continue
            first = owner.get(canonical_parameter(graph, access.tensor))
            if first is not None and first != index:
                reads.append((index, position, first))
    return reads


def _graph_info(graph: OpGraph) -> tuple:
    """What :meth:`_ModelParts.build` needs of a graph: who accounts for each parameter and its other
    readers (:func:`_parameter_reads`), the parameter view of the tensors, and each op's batch-dim
    flags (the same for every cost model of the graph)."""
    owned = parameter_ownership(graph)
    return owned, _parameter_reads(graph, owned), ParameterView(graph), [tuple(d.is_batch for d in op.dims) for op in graph.ops]


def _tied_copies(model, cluster: Cluster, settings: TrainingSettings, reads) -> tuple[_TiedCopy, ...]:
    """The copies of ``reads`` (:func:`_parameter_reads`): their states and their synchronisation
    inside the reader's stage, placed by :func:`_zero_sync_s` as the owner's is."""
    if not reads:
        return ()
    graph: OpGraph = model.graph
    tensors = ParameterView(graph)
    per = state_bytes_per_parameter(settings)
    copies = []
    for index, position, owner in reads:
        op = graph.ops[index]
        space = model.tables.configs[index]
        params, grads, optimizer = parameter_state_bytes(
            op, space, tensors=tensors, settings=settings, owned_inputs=[position]
        )
        forward, backward, step = _zero_sync_s(
            op, space, model.op_details[index], tensors=tensors, settings=settings, owned=[position], cluster=cluster
        )
        access = op.inputs[position]
        shard = shard_elements(space, op, access, tensors[access.tensor].shape)
        copies.append(
            _TiedCopy(
                op=index, owner=owner, states_bytes=params + grads + optimizer, params_bytes=params,
                grads_bytes=grads, optimizer_bytes=optimizer, forward_s=forward, backward_s=backward, step_s=step,
                grad_bytes=shard * per.grad,
            )
        )
    return tuple(copies)


def _flat_degrees(graph: OpGraph, spaces: Sequence[ConfigSpace], rows: Sequence[int]) -> dict[str, np.ndarray]:
    """Per configuration of the ``rows`` ops (flat, row after row): batch-dim and other-dim split products."""
    batches, others = [], []
    for i in rows:
        batch, other = batch_products(graph.ops[i], spaces[i])
        batches.append(batch)
        others.append(other)
    return {"batch_split": np.concatenate(batches), "model_split": np.concatenate(others)}


def _edge_fields(model) -> dict[str, np.ndarray]:
    """A model's edge tables flattened for vectorised lookups (``edge_*`` of :class:`_ModelParts`):
    each distinct table once (layers share theirs), pair ``e`` at ``edge_offsets[e]``."""
    edges = tuple(model.tables.edges)
    distinct: dict[int, int] = {}
    blocks: list[np.ndarray] = []
    start = 0
    edge_offsets = []
    for e in edges:
        if id(e.time_s) not in distinct:
            distinct[id(e.time_s)] = start
            blocks.append(e.time_s.ravel())
            start += e.time_s.size
        edge_offsets.append(distinct[id(e.time_s)])
    return {
        "edge_offsets": np.array(edge_offsets, dtype=np.int64),
        "edge_strides": np.array([e.time_s.shape[1] for e in edges], dtype=np.int64),
        "edge_u": np.array([e.u for e in edges], dtype=np.int64),
        "edge_v": np.array([e.v for e in edges], dtype=np.int64),
        "edge_flat": np.concatenate(blocks) if blocks else np.zeros(0),
    }


@dataclass(frozen=True, slots=True, eq=False)
class _ModelParts:
    """What of a cost model does not depend on the ZeRO stage, split for the pipeline."""

    key: tuple[int, ...]
    forward_s: Mapping[int, np.ndarray]
    """Per distinct op detail: forward seconds per micro-batch (compute + forward communication)."""
    shard_elements: Mapping[int, np.ndarray]
    """Per distinct detail: elements of the parameter shards the op accounts for."""
    sharded_elements: Mapping[int, np.ndarray]
    """The same, each shard divided by its replication degree (what ZeRO keeps of it)."""
    backward_s: Mapping[int, np.ndarray]
    optimizer_s: Mapping[int, np.ndarray | float]
    """Per distinct detail: the optimizer step's seconds, once per step (execution models; else 0)."""
    activations_bytes: Mapping[int, np.ndarray]
    first_op: Mapping[int, int]
    """Per distinct detail, an op that has it."""
    owned: tuple[tuple[int, ...], ...]
    reads: tuple[tuple[int, int, int], ...]
    tensors: Mapping
    """The graph's tensors, tied aliases as parameters (``objectives.tables``' view)."""
    rows: tuple[int, ...]
    """One op per distinct (cost detail, batch dims): the flat arrays hold these ops' configurations
    only (the layers share theirs), which keeps them small on 96-layer models."""
    offsets: np.ndarray
    """``(n_ops,)`` start of each op's configurations in the flat arrays (its row's)."""
    degrees: Mapping[str, np.ndarray]
    edge_offsets: np.ndarray
    edge_strides: np.ndarray
    edge_u: np.ndarray
    edge_v: np.ndarray
    edge_flat: np.ndarray
    shared: dict = field(default_factory=dict)
    """Values derived on first use and shared by the model's arrays at every ZeRO stage."""

    @staticmethod
    def build(model, graph_info: tuple | None = None) -> "_ModelParts":
        """Split ``model``; ``graph_info``: :func:`_graph_info` of its graph, when already known."""
        graph: OpGraph = model.graph

        forward_s: dict[int, np.ndarray] = {}
        backward_s: dict[int, np.ndarray] = {}
        optimizer_step: dict[int, np.ndarray | float] = {}
        acts: dict[int, np.ndarray] = {}
        shards: dict[int, np.ndarray] = {}
        sharded: dict[int, np.ndarray] = {}
        first: dict[int, int] = {}
        keys = []
        owned, reads, tensors, batch_dims = graph_info or _graph_info(graph)
        per = state_bytes_per_parameter(model.settings)
        zero3 = dataclasses.replace(model.settings, zero_stage=3)
        for index, (op, detail) in enumerate(zip(graph.ops, model.op_details)):
            key = id(detail)
            keys.append(key)
            if key in first:
                continue
            first[key] = index
            # the optimizer step runs once per step (after the last micro-batch), not per micro-batch
            optimizer_step[key] = detail.optimizer_s if detail.optimizer_s is not None else 0.0
            base = detail.compute_s - detail.recompute_s - optimizer_step[key]
            forward = base / (1.0 + op.backward_flops_factor)
            backward = base - forward + detail.recompute_s  # recomputation runs just before backward
            for (kind, _level), seconds in detail.comm_s.items():
                if kind == "partial_sum":
                    forward = forward + seconds
                elif kind == "input_grad":
                    backward = backward + seconds
                else:  # statistics, halos, PaSE's lump: both passes
                    forward = forward + seconds / 2.0
                    backward = backward + seconds / 2.0
            forward_s[key], backward_s[key], acts[key] = forward, backward, detail.memory.activations_bytes
            if model.settings.zero_stage != 0:
                raise ValueError("pipeline arrays are derived from a ZeRO-0 cost model")
            shards[key] = detail.memory.params_bytes / per.param
            if owned[index]:
                params3, _, _ = parameter_state_bytes(
                    op, model.tables.configs[index], tensors=tensors, settings=zero3, owned_inputs=owned[index]
                )
                sharded[key] = params3 / per.param
            else:
                sharded[key] = shards[key]
        spaces = model.tables.configs
        row_of: dict[tuple, int] = {}
        rows: list[int] = []
        row_start: list[int] = []
        offsets = np.empty(len(graph.ops), dtype=np.int64)
        filled = 0
        for index in range(len(graph.ops)):
            row_key = (keys[index], batch_dims[index])
            if row_key not in row_of:
                row_of[row_key] = len(rows)
                rows.append(index)
                row_start.append(filled)
                filled += spaces[index].size
            offsets[index] = row_start[row_of[row_key]]
        return _ModelParts(
            key=tuple(keys),
            forward_s=forward_s,
            shard_elements=shards,
            sharded_elements=sharded,
            backward_s=backward_s,
            optimizer_s=optimizer_step,
            activations_bytes=acts,
            first_op=first,
            owned=tuple(owned),
            reads=tuple(reads),
            tensors=tensors,
            rows=tuple(rows),
            offsets=offsets,
            degrees=_flat_degrees(graph, spaces, rows),
            **_edge_fields(model),
        )


def _op_arrays(model, parts: _ModelParts, cluster: Cluster, zero_stage: int, sync_memo: dict | None = None) -> _OpArrays:
    """Split a cost model's per-op costs into forward / backward per micro-batch and per step, for
    ``zero_stage``.

    ``model`` is priced at ZeRO 0 (the cache builds no other): parameter states and gradient
    synchronisation, the only ZeRO-dependent terms, are priced here at ``zero_stage`` by the rules
    the tables use (states: ``objectives.memory``, whose ZeRO-z divides the optimizer (z>=1),
    gradients (z>=2) and parameters (z>=3) of each shard by its replication degree; synchronisation:
    :func:`_zero_sync_s`); the tests check the result against models built at each stage.
    ``sync_memo``: synchronisation already priced for other models of the same stage and batch
    (by op and ZeRO stage; by recomputation too under an execution model, whose overlap reads the
    op's compute).
    """
    settings = dataclasses.replace(model.settings, zero_stage=zero_stage)
    per = state_bytes_per_parameter(settings)
    per_key: dict[int, tuple] = {}
    memo = sync_memo if sync_memo is not None else {}
    for key, index in parts.first_op.items():
        detail = model.op_details[index]
        whole, kept = parts.shard_elements[key], parts.sharded_elements[key]
        params = per.param * (kept if zero_stage >= 3 else whole)
        grads = per.grad * (kept if zero_stage >= 2 else whole)
        optimizer = per.optimizer * (kept if zero_stage >= 1 else whole)
        memo_key = (
            index, zero_stage, bool(np.any(detail.recompute_s > 0.0)),  # ZeRO-3 gathers a recomputed op again
            settings.recompute if detail.grad_sync_unhidden_s is not None else None,
        )
        if memo_key not in memo:
            memo[memo_key] = _zero_sync_s(
                model.graph.ops[index], model.tables.configs[index], detail, tensors=parts.tensors,
                settings=settings, owned=parts.owned[index], cluster=cluster,
            )
        sync_f, sync_b, step = memo[memo_key]
        step = step + parts.optimizer_s[key]
        per_key[key] = (
            parts.forward_s[key] + sync_f, parts.backward_s[key] + sync_b, step, params, grads, optimizer,
            parts.activations_bytes[key],
        )
    columns = list(zip(*(per_key[k] for k in parts.key)))
    names = ("forward_s", "backward_s", "step_s", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
    row_columns = list(zip(*(per_key[parts.key[i]] for i in parts.rows)))
    flat = {name: np.concatenate(row_columns[i]) for i, name in enumerate(names)}
    flat.update(parts.degrees)
    return _OpArrays(
        model=model,
        key=parts.key,
        **{name: tuple(columns[i]) for i, name in enumerate(names)},
        edges=tuple(model.tables.edges),
        tied_source=(cluster, settings, parts.reads),
        shared=parts.shared,
        offsets=parts.offsets,
        flat=flat,
        edge_offsets=parts.edge_offsets,
        edge_strides=parts.edge_strides,
        edge_u=parts.edge_u,
        edge_v=parts.edge_v,
        edge_flat=parts.edge_flat,
    )



class PipelineCostCache:
    """Graphs by batch, cost models by (stage devices, batch, recompute), and their pipeline arrays.

    One cache serves a whole search, :func:`planner.estimate.estimate` calls and grids, so each
    cost model is built once: the search builds ZeRO-0 models only (the ZeRO stages are derived,
    :func:`_op_arrays`), and the recompute variants of a (devices, batch) pair reuse the first one's
    configuration spaces and edge tables (``build_cost_model(reuse=...)``). :meth:`model` builds a
    model at any ZeRO stage on demand (to explain a point). The pipeline search
    (:func:`planner.search.pipeline.search_pipeline`) takes the cache as its pricing and releases the
    models of each (devices, batch) pair it built once the pair is priced (:meth:`release`), so a
    search over a thousand devices holds one pair's models at a time.
    """

    __slots__ = (
        "graph_at_batch", "cluster", "settings", "cost_model", "measured", "product_rule", "max_split_dims", "moe_layers", "keep",
        "plans", "_graphs", "_graph_info", "_structures", "_models", "_parts", "_arrays", "_masks", "_derived",
        "_edgeless", "builds", "build_time_s",
    )

    def __init__(
        self,
        graph_at_batch: GraphAtBatch,
        *,
        cluster: Cluster,
        settings: TrainingSettings | None = None,
        cost_model: Literal["roofline", "measured", "pase"] = "roofline",
        measured=None,
        product_rule: Literal["divides", "at_most"] = "divides",
        max_split_dims: int | None = 2,
        moe_layers: Callable[[OpGraph], Sequence] | None = None,
    ) -> None:
        self.graph_at_batch = graph_at_batch
        self.moe_layers = moe_layers
        self.keep = False
        """Keep every (devices, batch) pair's models when a search releases them (:meth:`release`
        does nothing): for several searches over one cache (one per launch target), which would
        otherwise each build them again; memory then grows with the pairs searched."""
        """``graph -> its routed-experts layers`` (``importers.moe.find_moe_layers``, handed down by
        the roof): each stage model's expert ops are then priced by the tokens routed to them and
        split ``settings.expert_parallel`` ways (:func:`objectives.moe.price_moe`), as the per-op
        plan prices them; ``None``: priced as the dense ops of the graph."""
        self.cluster = cluster
        self.settings = settings or TrainingSettings()
        self.cost_model = cost_model
        self.measured = measured
        self.product_rule = product_rule
        self.max_split_dims = max_split_dims
        """At most this many dims of an op split at once (``None``: any): 2 keeps every Megatron-LM
        layout (the batch and one model dim, or batch and sequence) and makes 64-device stages cheap
        to price."""
        self.plans: dict[tuple, object] = {}
        """Elimination plans by table structure (which tables are equal, which ops have one configuration)."""
        self._graphs: dict[int, OpGraph] = {}
        self._graph_info: dict[int, tuple] = {}
        self._structures: dict[int, LayerStructure] = {}
        self._models: dict[tuple, object] = {}
        self._arrays: dict[tuple, _OpArrays] = {}
        self._parts: dict[tuple, _ModelParts] = {}
        self._masks: dict[tuple, list[np.ndarray]] = {}
        self._derived: dict[tuple[int, int], dict] = {}
        self._edgeless: set[tuple[int, int]] = set()
        """(devices, batch) pairs whose models were built without their edge tables."""
        self.builds = 0
        """Cost models built (for benchmarks)."""
        self.build_time_s = 0.0

    def graph(self, batch: int) -> OpGraph:
        """The model at ``batch`` samples."""
        if batch not in self._graphs:
            self._graphs[batch] = self.graph_at_batch(int(batch))
        return self._graphs[batch]

    def structure(self, batch: int) -> LayerStructure:
        """The layer structure of the model at ``batch``.

        Every batch must give the same layers (op counts may differ: an importer may drop a batch
        dim of size 1, and each batch has its own cost models).
        """
        if batch not in self._structures:
            structure = layer_structure(self.graph(batch), self.settings)
            if self._structures:
                reference = next(iter(self._structures.values()))
                if structure.num_layers != reference.num_layers:
                    raise InputError(
                        f"the model has {structure.num_layers} layers at batch {batch} but {reference.num_layers} "
                        "at another batch; a pipeline needs the same layers at every batch"
                    )
            self._structures[batch] = structure
        return self._structures[batch]

    def model(self, devices: int, batch: int, zero_stage: int, recompute: str, *, edges: bool = True):
        """The ``objectives.tables.CostModel`` of the model at ``batch`` on one ``devices``-device stage.

        ``edges=False``: its redistribution tables may be missing (``edges_priced`` false): enough
        for configuration spaces and lower bounds, which need per-op costs only. The search prices
        the edges of a (devices, batch) pair only once it runs an intra-op search or prices a plan
        there, so pairs its bounds prune never pay for them.
        """
        key = (devices, batch, zero_stage, recompute)
        if edges and (devices, batch) in self._edgeless:
            self._price_edges(devices, batch)
        if key in self._models:
            return self._models[key]
        started = time.perf_counter()
        graph = self.graph(batch)
        cluster = stage_cluster(self.cluster, devices)
        settings = dataclasses.replace(self.settings, zero_stage=zero_stage, recompute=recompute)
        options = ConfigOptions(
            devices=devices, devices_per_node=cluster.devices_per_node, product_rule=self.product_rule,
            max_split_dims=self.max_split_dims,
        )
        layers = self.moe_layers(graph) if self.moe_layers is not None and self.cost_model != "pase" else ()
        # a model whose experts are priced (below) carries them in its op details: reusing it would price them twice
        reuse = None if layers else next((m for k, m in self._models.items() if k[:2] == (devices, batch)), None)
        model = build_cost_model(
            graph, cluster=cluster, settings=settings, config_options=options, cost_model=self.cost_model,
            measured=self.measured, reuse=reuse, price_edges=edges or self.cost_model == "pase",
        )
        if layers:
            from objectives.moe import price_moe

            model = price_moe(model, layers, capacity_factor=settings.capacity_factor, ep=settings.expert_parallel)
        if not model.edges_priced:
            self._edgeless.add((devices, batch))
        self._models[key] = model
        self.builds += 1
        self.build_time_s += time.perf_counter() - started
        return model

    def _price_edges(self, devices: int, batch: int) -> None:
        """Price the edges of the (devices, batch) pair's models, built without them: once, shared by
        every recompute variant (their edges are equal); their pipeline arrays keep their per-op costs."""
        self._edgeless.discard((devices, batch))
        keys = [k for k in self._models if k[:2] == (devices, batch)]
        if not keys:
            return
        started = time.perf_counter()
        priced = with_edges(self._models[keys[0]])
        for k in keys:
            model = self._models[k]
            self._models[k] = priced if k == keys[0] else dataclasses.replace(
                model, tables=dataclasses.replace(model.tables, edges=priced.tables.edges),
                edge_details=priced.edge_details, distinct_edges=priced.distinct_edges, edges_priced=True,
            )
        fields = _edge_fields(priced)
        for k in [k for k in self._parts if k[:2] == (devices, batch)]:
            self._parts[k] = dataclasses.replace(self._parts[k], **fields)
        for k in [k for k in self._arrays if k[:2] == (devices, batch)]:
            self._arrays[k] = dataclasses.replace(
                self._arrays[k], model=self._models[(devices, batch, 0, k[3])], edges=priced.tables.edges, **fields
            )
        self.build_time_s += time.perf_counter() - started

    def arrays(self, devices: int, batch: int, zero_stage: int, recompute: str, *, edges: bool = True) -> _OpArrays:
        """Per-op pipeline costs at ``zero_stage`` (from the ZeRO-0 cost model, re-priced);
        ``edges=False``: possibly without the edge tables (see :meth:`model`)."""
        if edges and (devices, batch) in self._edgeless:
            self._price_edges(devices, batch)
        key = (devices, batch, zero_stage, recompute)
        if key not in self._arrays:
            model = self.model(devices, batch, 0, recompute, edges=edges)
            parts_key = (devices, batch, recompute)
            if parts_key not in self._parts:
                if batch not in self._graph_info:
                    self._graph_info[batch] = _graph_info(self.graph(batch))
                self._parts[parts_key] = _ModelParts.build(model, self._graph_info[batch])
            self._arrays[key] = _op_arrays(
                model, self._parts[parts_key], stage_cluster(self.cluster, devices), zero_stage,
                self.derived(devices, batch).setdefault(("zero_sync",), {}),
            )
        return self._arrays[key]

    def holds(self, devices: int, batch: int) -> bool:
        """Whether a cost model of ``batch`` samples on ``devices``-device stages is built."""
        return any(k[:2] == (devices, batch) for k in self._models)

    def release(self, devices: int, batch: int) -> None:
        """Drop the cost models, arrays and masks of ``batch`` samples on ``devices``-device stages.

        They are rebuilt, equal, when asked for again (:meth:`model`); the graphs and elimination
        plans are kept. A search over many (stage size, micro-batch) pairs releases each pair once
        it is priced, so its memory stays that of one pair's models (unless :attr:`keep`).
        """
        if self.keep:
            return
        for store in (self._models, self._parts, self._arrays, self._masks):
            for key in [k for k in store if k[:2] == (devices, batch)]:
                del store[key]
        self._derived.pop((devices, batch), None)
        self._edgeless.discard((devices, batch))

    def derived(self, devices: int, batch: int) -> dict:
        """A store for what a caller derives from the (devices, batch) pair's models (the search's
        restricted tables and target families), dropped with them by :meth:`release`."""
        return self._derived.setdefault((devices, batch), {})

    # What the pipeline search needs of the pricing besides the per-op arrays (it never imports
    # objectives): the memory allowance, the schedule's in-flight counts and makespan floor, the
    # boundary transfers' floor, and the price of a plan.

    memory_scale = 1.0 + OTHER_FRACTION
    """Memory per device is ``memory_scale x`` (parameter states + activations): the allowance of
    :data:`objectives.memory.OTHER_FRACTION`."""

    @staticmethod
    def in_flight(schedule: str, *, stages: int, micro_batches: int, chunks: int = 1) -> np.ndarray:
        """:func:`objectives.schedules.in_flight_micro_batches`."""
        return in_flight_micro_batches(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks)

    @staticmethod
    def makespan_floor_s(schedule: str, **kwargs: Any) -> float:
        """:func:`objectives.schedules.pipeline_time_lower_bound_s`."""
        return pipeline_time_lower_bound_s(schedule, **kwargs)

    def p2p_floor_s(self, structure: LayerStructure, pp: int, devices: int) -> np.ndarray:
        """``(pp - 1,)`` the cheapest transfer across each boundary over every cut it could fall on."""
        if pp <= 1:
            return np.zeros(0)
        cuts = structure.cut_bytes[1 : structure.num_layers] / devices  # a boundary falls before layer 1..L-1
        crosses = boundary_crosses_node(stages=pp, devices_per_stage=devices, devices_per_node=self.cluster.devices_per_node)
        times = point_to_point_time_s(
            cuts[None, :], crosses_node=crosses[:, None], intra_link=self.cluster.intra_link,
            inter_link=self.cluster.inter_link,
        )
        return times.min(axis=1)

    def price(self, **plan: Any) -> "_Priced":
        """:func:`price_plan` with this cache."""
        return price_plan(self, **plan)

    def masks(self, devices: int, batch: int, *, inside_node: bool, data_parallel: int | None) -> list[np.ndarray]:
        """Per op, the configurations the pipeline search allows on a stage: ``inside_node``: the
        non-batch dims split inside a node only (``PipelineOptions.model_parallel_inside_node``), and the
        redundant copies of an op with a batch dim too (copies of one without are data parallel);
        ``data_parallel``: the batch dims split exactly that many ways (``None``: any)."""
        key = (devices, batch, inside_node, data_parallel)
        if key not in self._masks:
            graph = self.graph(batch)
            model = self.model(devices, batch, 0, "none", edges=False)
            memo: dict[tuple, np.ndarray] = {}
            masks = []
            for op, space in zip(graph.ops, model.tables.configs):
                is_batch = tuple(d.is_batch for d in op.dims)
                memo_key = (id(space), is_batch)
                if memo_key not in memo:
                    allowed = np.ones(space.size, dtype=bool)
                    batch_dims = np.array(is_batch, dtype=bool)
                    if inside_node and space.factors.shape[1]:
                        allowed &= np.all(space.inter_factors[:, ~batch_dims] == 1, axis=1)
                        # redundant copies are tp ranks too, except those of an op without a batch
                        # dim (a position table's lookup), which runs once per data-parallel rank:
                        # its copies across nodes are data parallelism
                        if batch_dims.any():
                            allowed &= space.inter_replica_counts == 1
                    if data_parallel is not None and batch_dims.any():
                        split, _ = batch_products(op, space)
                        allowed &= split == data_parallel
                    if not allowed.any():
                        allowed = np.all(space.factors == 1, axis=1)
                    memo[memo_key] = allowed
                masks.append(memo[memo_key])
            self._masks[key] = masks
        return self._masks[key]


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
    cache: PipelineCostCache,
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

    Returns
    -------
    PipelinePoint
    """
    return price_plan(
        cache, pp=pp, batch=batch, zero_stage=zero_stage, recompute=recompute, choice=choice, bounds=bounds,
        global_batch=global_batch, schedule=schedule, chunks=chunks, memory_limit_bytes=memory_limit_bytes,
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


def _check_plan(cache: PipelineCostCache, *, pp: int, batch: int, bounds: Sequence[int], global_batch: int) -> None:
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


def _stage_sums(cache: PipelineCostCache, arrays: _OpArrays, stage: np.ndarray, picks: np.ndarray, pp: int) -> _StageSums:
    """Each stage's share of the plan: its ops' costs, the edges inside it, and the copies of
    parameters another stage owns (a tied embedding: held by both, gradients all-reduced between them
    once per step)."""
    flat_index = arrays.offsets + picks

    def per_stage(name: str) -> np.ndarray:
        return np.bincount(stage, weights=arrays.flat[name][flat_index], minlength=pp)

    forward, backward, step = per_stage("forward_s"), per_stage("backward_s"), per_stage("step_s")
    params, grads, optimizer = per_stage("params_bytes"), per_stage("grads_bytes"), per_stage("optimizer_bytes")
    activations = per_stage("activations_bytes")
    if arrays.edges:
        edge_time = arrays.edge_flat[arrays.edge_offsets + picks[arrays.edge_u] * arrays.edge_strides + picks[arrays.edge_v]]
        inside = stage[arrays.edge_u] == stage[arrays.edge_v]
        edge_stage = stage[arrays.edge_u][inside]
        half = np.bincount(edge_stage, weights=edge_time[inside] / 2.0, minlength=pp)
        forward, backward = forward + half, backward + half
    crosses_first_last = cache.cluster.devices > cache.cluster.devices_per_node
    link = cache.cluster.inter_link if crosses_first_last else cache.cluster.intra_link
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
        shared = float(ring_all_reduce_time_s(copy.grad_bytes[c], 2, link))
        step[s] += float(copy.step_s[c]) + shared
        step[owner] += shared
    return _StageSums(
        forward_s=forward, backward_s=backward, step_s=step, params_bytes=params, grads_bytes=grads,
        optimizer_bytes=optimizer, activations_bytes=activations,
    )


def _boundary_p2p_s(cache: PipelineCostCache, structure: LayerStructure, bounds: Sequence[int], pp: int) -> np.ndarray:
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

    cache: PipelineCostCache
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
                    ),
                    summary=_describe(dp, tp, uniform),
                )
            )
        return plans

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
            ),
            memory=stage_plans[worst].memory,
            fits=peak <= self.limit_bytes,
            summary=(
                f"pp={self.pp} x {_describe(dp, tp, uniform)}, mb={micro}, zero={self.zero_stage}, "
                f"recompute={self.recompute}"
            ),
            choice=tuple(int(c) for c in self.picks),
            uniform=uniform,
            graph=graph,
            spaces=self.arrays.spaces,
        )


def price_plan(
    cache: PipelineCostCache,
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
) -> _Priced:
    """:func:`evaluate_pipeline`'s numbers, the point itself built on demand (the search builds only
    the points that reach its running frontier)."""
    _check_plan(cache, pp=pp, batch=batch, bounds=bounds, global_batch=global_batch)
    devices = cache.cluster.devices // pp
    micro_batches = global_batch // batch
    arrays = cache.arrays(devices, batch, zero_stage, recompute)
    structure = cache.structure(batch)
    picks = np.asarray(choice, dtype=np.int64)
    stage = structure.stage_of_ops(bounds) if pp > 1 else np.zeros(len(picks), dtype=np.int64)
    sums = _stage_sums(cache, arrays, stage, picks, pp)
    in_flight = in_flight_micro_batches(schedule, stages=pp, micro_batches=micro_batches, chunks=chunks)
    held = sums.activations_bytes * in_flight
    states = sums.params_bytes + sums.grads_bytes + sums.optimizer_bytes
    other = OTHER_FRACTION * (states + held)
    p2p = _boundary_p2p_s(cache, structure, bounds, pp)
    pipeline = float(
        pipeline_time_s(
            schedule, forward_s=sums.forward_s, backward_s=sums.backward_s, p2p_s=p2p, micro_batches=micro_batches,
            chunks=chunks,
        )
    )
    # Stage s finishes its last backward before stage 0 by the drain of the stages in front of it.
    drain = np.concatenate(([0.0], np.cumsum(sums.backward_s[:-1] + (p2p if p2p.size else 0.0))))
    step_time = float(np.max(pipeline - drain + sums.step_s))
    limit = float(memory_limit_bytes) if memory_limit_bytes is not None else float(cache.cluster.device.memory_bytes)
    return _PlanPrice(
        cache=cache, arrays=arrays, structure=structure, pp=pp, batch=batch, global_batch=global_batch,
        zero_stage=zero_stage, recompute=recompute, schedule=schedule, chunks=chunks, picks=picks, bounds=bounds,
        stage=stage, sums=sums, in_flight=in_flight, held=held, other=other, memory=states + held + other,
        pipeline_s=pipeline, p2p_s=p2p, step_s=step_time, limit_bytes=limit,
    ).priced()
