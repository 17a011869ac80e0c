r"""The 3-D search: pipeline stages x per-op splits x micro-batches, with ZeRO and recomputation.

The devices are split into ``pp`` pipeline stages of :math:`d = N / pp` devices each (``pp``
divides :math:`N`; stages take consecutive ranks, whole nodes or whole fractions of one). The op
graph's repeated blocks (``OpGraph.blocks``) are the *layers*; the ops before the first layer
(embeddings) go to the first stage and those after the last (final norm, LM head) to the last
(:func:`layer_structure`). The global batch :math:`G` is fixed; a pipeline micro-batch holds
:math:`b` samples (split over the data-parallel replicas by the ops' batch-dim factors) and a step
runs :math:`m = G / b` of them (gradient accumulation).

For each ``pp``, micro-batch :math:`b` and recomputation (``none``/``selective``/``full``),
:func:`pipeline_search`:

1. prices every op and edge on a :math:`d`-device sub-cluster at batch :math:`b`
   (:class:`PipelineCostCache`: one ``objectives.tables`` cost model per (d, b, recompute) at
   ZeRO 0, the recompute variants reusing the first one's configuration spaces and edge tables;
   configurations split at most two dims of an op, which keeps every Megatron-LM layout); per op
   it splits the cost into forward and backward seconds per micro-batch and per-step seconds, and
   derives every ZeRO stage's states and communication (:func:`_op_arrays`, table below);
2. runs the intra-op search (PaSE's DP, ``planner.search.elimination``) on the whole graph with op
   cost :math:`W (f_i + b_i) + g_i` at ZeRO-1 (:math:`W = m + pp - 1`, the number of micro-batch
   slots of the bottleneck stage; :math:`g_i` per step), restricted to configurations whose
   model-parallel factors stay inside a node when a stage spans nodes
   (``PipelineOptions.model_parallel_inside_node``, the layout Megatron-LM and Alpa use); the
   elimination plan is reused by every search with the same table structure (:func:`_solve`);
3. cuts the layers into stages by the balanced DP (:func:`planner.search.stages.partition_layers`)
   over the per-layer times of that choice, within the memory limit when it can;
4. prices the pipeline at each ZeRO stage (:func:`evaluate_pipeline`): the schedule's makespan with
   its bubble and the stage-to-stage transfers (:mod:`objectives.schedules`), plus each stage's
   per-step gradient synchronisation after its last backward; memory per stage = its parameter
   states + the in-flight micro-batches' activations the schedule keeps + the allowance;
5. when the fastest choice does not fit, searches the memory-weighted objective
   :math:`W(f+b) + g + \lambda M` over a geometric range of :math:`\lambda` (Lagrangian relaxation)
   for the fastest choice that fits.

With a launch ``target`` (``pipeline_search(..., target="megatron")``), step 2 runs once per family
of configurations the target runs on a stage (:func:`planner.export.pipeline_target_families`, e.g.
each ``dp x tp`` with and without sequence parallelism) and every family's optimum is priced (its
stage cut and ZeRO stages as above); the ZeRO stages and schedules the target does not pipeline
(:func:`planner.export.pipeline_target_allows`) are not searched.

All points go through one Pareto filter over (step time, memory per device), kept as the search
goes (:class:`_Frontier`). Before steps 2-5, a combination (pp, micro-batch, recompute, ZeRO group)
is skipped when lower bounds of the step time and of the memory of *every* plan it could produce
are dominated by a point already found (``PipelineOptions.prune``, :func:`_lower_bounds`): each op
at its cheapest allowed configuration, the least bottleneck of any stage cut, the schedule's
makespan at that work and bottleneck; on one stage, once the DP's optimum at ZeRO-1 without
recomputation is priced, its step time bounds every other ZeRO stage and recomputation of that
micro-batch. Such a combination only adds dominated points, so the frontier is the same as
without pruning (the tests compare both). Each (stage size, micro-batch) pair's cost models are
released once it is priced (:meth:`PipelineCostCache.release`): a point keeps its graph, spaces and
choice, and :meth:`PipelineResult.cost_model` rebuilds its exact cost model on demand.

ZeRO under gradient accumulation (:func:`_zero_split`), with :math:`G_i` the op's per-step
synchronisation priced by :mod:`objectives.intra_op` (ring reduce-scatter and all-gather of equal
buffers cost the same: gradients and parameters have the same bytes per element):

=====  ==============================  =============================================
ZeRO   per micro-batch                 per step
=====  ==============================  =============================================
0      -                               all-reduce of gradients (:math:`G`)
1      -                               reduce-scatter + all-gather (:math:`G`)
2      reduce-scatter (:math:`G/2`)    all-gather of updated parameters (:math:`G/2`)
3      2 all-gathers + reduce-scatter  -
=====  ==============================  =============================================

Stage-to-stage transfers: each device sends its :math:`1/d` share of the boundary activations
(Megatron-LM's scatter/gather of the tensor-parallel copies), forward and, as gradient, backward,
on the link the boundary crosses. A parameter read in two stages (tied embeddings) is held by both,
whose gradients are all-reduced between them once per step.

References
----------
D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC 2021. L. Zheng et al., "Alpa", OSDI 2022. S. Rajbhandari et al., "ZeRO", SC 2020.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

from planner.core.cluster import Cluster
from planner.core.configs import ConfigOptions, ConfigSpace, divisors
from planner.core.errors import InputError
from planner.core.graph import OpGraph, Tensor
from planner.core.settings import Recompute, TrainingSettings
from planner.core.strategy import MemoryBreakdown
from planner.core.tables import CostTables, EdgeCost

__all__ = [
    "GraphAtBatch",
    "graph_loader",
    "LayerStructure",
    "layer_structure",
    "stage_cluster",
    "PipelineCostCache",
    "PipelineOptions",
    "StagePlan",
    "PipelineTime",
    "PipelinePoint",
    "PipelineResult",
    "evaluate_pipeline",
    "pipeline_search",
]

GraphAtBatch = Callable[[int], OpGraph]
"""``graph_at_batch(samples) -> OpGraph``: the model with its batch dim bound to ``samples``."""

_ZERO_GROUPS = ((0, 1), (2,), (3,))
"""ZeRO stages whose per-op time tables are equal (0 and 1) share one intra-op search."""
# (ZeRO 2 and 3 move their gradient traffic into every micro-batch, which changes the best split.)


# --------------------------------------------------------------------------------------------
# the model at any batch, and its layers


def graph_loader(
    path: str | Path, dims: Mapping[str, int] | None = None, *, batch_dim: str | None = None
) -> GraphAtBatch:
    """A :data:`GraphAtBatch` that imports ``path`` with ``dims`` and ``batch_dim`` set per call.

    ``batch_dim``: the symbolic dim that sets the batch; ``None``: the model's own
    (:func:`importers.batch_dim_name`: ``batch``, ``N``, ``batch_size``..., a value in ``dims`` for
    it is replaced per call). Each batch is imported once (cached). Graphs at different batches may
    differ in their ops (an importer drops a batch dim of size 1); each batch gets its own cost
    models, and :meth:`PipelineCostCache.structure` checks that the layers stay the same.

    Raises
    ------
    InputError
        The model's batch is a number in the file (no dim to vary the micro-batch with).
    """
    from planner.plan import load_graph

    if batch_dim is None:
        from importers import batch_dim_name

        found = batch_dim_name(path)
        if found is None:
            raise InputError(
                f"{Path(path).name} has no named batch dim (axis 0 of its inputs is a number or unnamed), so "
                "pipeline plans and estimates cannot vary its micro-batch; re-export it with a named dynamic batch "
                "axis (e.g. dynamic_axes={'input_ids': {0: 'batch'}}); `planner plan` without --global-batch "
                "plans it at the file's batch"
            )
        batch_dim = found
    cache: dict[int, OpGraph] = {}
    fixed = {k: v for k, v in (dims or {}).items() if k != batch_dim}

    def at(samples: int) -> OpGraph:
        if samples not in cache:
            cache[samples] = load_graph(path, {**fixed, batch_dim: int(samples)})
        return cache[samples]

    return at


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


def _element_bytes(tensor: Tensor, settings: TrainingSettings) -> int:
    from objectives._common import element_bytes

    return element_bytes(tensor, settings)


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
            nbytes = tensor.num_elements * _element_bytes(tensor, settings)
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
    sync_s: np.ndarray
    """``(K,)`` its gradient synchronisation inside the stage, per step."""
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


def _zero_split(sync_s: np.ndarray, zero_stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(forward, backward, per-step)`` parts of an op's gradient synchronisation under ZeRO
    with gradient accumulation (table in the module docstring)."""
    zero = np.zeros_like(sync_s)
    if zero_stage <= 1:
        return zero, zero, sync_s
    if zero_stage == 2:
        return zero, sync_s / 2.0, sync_s / 2.0
    return sync_s / 3.0, 2.0 * sync_s / 3.0, zero


def _tensor_view(graph: OpGraph) -> dict[str, Tensor]:
    """The graph's tensors with tied-parameter aliases resolved and marked as parameters."""
    from objectives._common import canonical_parameter

    view = dict(graph.tensors)
    for alias in graph.parameter_aliases:
        base = graph.tensors.get(alias) or graph.tensors.get(canonical_parameter(graph, alias))
        if base is not None:
            view[alias] = dataclasses.replace(base, role="parameter")
    return view


def _owned_inputs(graph: OpGraph) -> tuple[list[tuple[int, ...]], list[tuple[int, int, int]]]:
    """Per op, the parameter inputs it accounts for (the first reader of each, as
    ``objectives.tables`` counts them); and every other read ``(op, input position, owner op)``."""
    from objectives._common import canonical_parameter, is_parameter_name

    owner: dict[str, int] = {}
    owned: list[tuple[int, ...]] = []
    reads: list[tuple[int, int, int]] = []
    for index, op in enumerate(graph.ops):
        mine = []
        for position, access in enumerate(op.inputs):
            if not is_parameter_name(graph.tensors, graph.parameter_aliases, access.tensor):
                continue
            name = canonical_parameter(graph, access.tensor)
            if name not in owner:
                owner[name] = index
                mine.append(position)
            elif owner[name] != index:
                reads.append((index, position, owner[name]))
        owned.append(tuple(mine))
    return owned, reads


def _graph_info(graph: OpGraph) -> tuple:
    """What :meth:`_ModelParts.build` needs of a graph: :func:`_owned_inputs`, :func:`_tensor_view`
    and each op's batch-dim flags (the same for every cost model of the graph)."""
    owned, reads = _owned_inputs(graph)
    return owned, reads, _tensor_view(graph), [tuple(d.is_batch for d in op.dims) for op in graph.ops]


def _parameter_costs(op, space: ConfigSpace, *, tensors, settings: TrainingSettings, cluster: Cluster,
                     positions: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(params, grads, optimizer)`` bytes and synchronisation seconds of some parameter inputs of an op."""
    from objectives.intra_op import grad_sync_terms, price_terms
    from objectives.memory import parameter_state_bytes

    params, grads, optimizer = parameter_state_bytes(
        op, space, tensors=tensors, settings=settings, owned_inputs=positions
    )
    terms = grad_sync_terms(op, space, tensors=tensors, settings=settings, owned_inputs=positions)
    sync = sum(price_terms(terms, cluster=cluster, size=space.size).values(), np.zeros(space.size))
    return params, grads, optimizer, sync


def _tied_copies(model, cluster: Cluster, settings: TrainingSettings, reads) -> tuple[_TiedCopy, ...]:
    from objectives._common import shard_elements
    from objectives.memory import state_bytes_per_parameter

    if not reads:
        return ()
    graph: OpGraph = model.graph
    tensors = _tensor_view(graph)
    per = state_bytes_per_parameter(settings)
    copies = []
    for index, position, owner in reads:
        op = graph.ops[index]
        space = model.tables.configs[index]
        params, grads, optimizer, sync = _parameter_costs(
            op, space, tensors=tensors, settings=settings, cluster=cluster, positions=[position]
        )
        access = op.inputs[position]
        shard = shard_elements(space, op, access, tensors[access.tensor].shape)
        copies.append(
            _TiedCopy(
                op=index, owner=owner, states_bytes=params + grads + optimizer, params_bytes=params,
                grads_bytes=grads, optimizer_bytes=optimizer, sync_s=sync, grad_bytes=shard * per.grad,
            )
        )
    return tuple(copies)


def _flat_degrees(graph: OpGraph, spaces: Sequence[ConfigSpace], rows: Sequence[int]) -> dict[str, np.ndarray]:
    """Per configuration of the ``rows`` ops (flat, row after row): batch-dim and other-dim split products."""
    from planner.families import batch_products

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
        from objectives.memory import parameter_state_bytes, state_bytes_per_parameter

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
            rows=tuple(rows),
            offsets=offsets,
            degrees=_flat_degrees(graph, spaces, rows),
            **_edge_fields(model),
        )


def _op_arrays(model, parts: _ModelParts, cluster: Cluster, zero_stage: int) -> _OpArrays:
    """Split a cost model's per-op costs into forward / backward per micro-batch and per step, for
    ``zero_stage``.

    ``model`` is priced at ZeRO 0 (the cache builds no other): parameter states and gradient
    synchronisation, the only ZeRO-dependent terms, are derived from it (the shards' replication
    degrees come from ``objectives.memory``; the tests check the result against models built at
    each stage).
    """
    from objectives.memory import state_bytes_per_parameter

    settings = dataclasses.replace(model.settings, zero_stage=zero_stage)
    per = state_bytes_per_parameter(settings)
    # Ring collectives: ZeRO-0's all-reduce costs ZeRO-1/2's reduce-scatter + all-gather (2X);
    # ZeRO-3 gathers twice (3X). States: ZeRO-z divides the optimizer (z>=1), gradients (z>=2) and
    # parameters (z>=3) of each shard by its replication degree.
    sync_scale = 1.5 if zero_stage >= 3 else 1.0
    per_key: dict[int, tuple] = {}
    for key, index in parts.first_op.items():
        detail = model.op_details[index]
        whole, kept = parts.shard_elements[key], parts.sharded_elements[key]
        params = per.param * (kept if zero_stage >= 3 else whole)
        grads = per.grad * (kept if zero_stage >= 2 else whole)
        optimizer = per.optimizer * (kept if zero_stage >= 1 else whole)
        # ZeRO-3 gathers the parameters before each micro-batch's forward and backward: on the
        # critical path, not hidden under backward as a launcher hides its gradient all-reduce
        levels = detail.grad_sync_s
        if zero_stage >= 3 and detail.grad_sync_unhidden_s is not None:
            levels = detail.grad_sync_unhidden_s
        sync = sync_scale * sum(levels.values(), np.zeros(detail.time_s.shape))
        sync_f, sync_b, step = _zero_split(sync, zero_stage)
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


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _TargetFamily:
    """A launch target's family on one stage, within the pipeline's own masks."""

    label: str
    tp: int | None
    masks: tuple[np.ndarray, ...]
    single: np.ndarray | None = None
    """The family's one plan when every op has one configuration in it (no DP to run)."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _TargetFamilies:
    families: tuple[_TargetFamily, ...]
    union: tuple[np.ndarray, ...]
    """Per op, the configurations of any family (for the lower bounds; empty without families)."""


class PipelineCostCache:
    """Graphs by batch, cost models by (stage devices, batch, recompute), and their pipeline arrays.

    One cache serves a whole search, :func:`planner.estimate.estimate` calls and grids, so each
    cost model is built once: the search builds ZeRO-0 models only (the ZeRO stages are derived,
    :func:`_op_arrays`), and the recompute variants of a (devices, batch) pair reuse the first one's
    configuration spaces and edge tables (``build_cost_model(reuse=...)``). :meth:`model` builds a
    model at any ZeRO stage on demand (to explain a point). :func:`pipeline_search` releases the
    models of each (devices, batch) pair it built once the pair is priced (:meth:`release`), so a
    search over a thousand devices holds one pair's models at a time.
    """

    __slots__ = (
        "graph_at_batch", "cluster", "settings", "cost_model", "measured", "product_rule", "max_split_dims",
        "plans", "_graphs", "_graph_info", "_structures", "_models", "_parts", "_arrays", "_masks", "_restricted",
        "_families", "_edgeless", "builds",
        "build_time_s",
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
    ) -> None:
        self.graph_at_batch = graph_at_batch
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
        self._restricted: dict[tuple, _Restricted] = {}
        self._families: dict[tuple, _TargetFamilies] = {}
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
        from objectives.tables import build_cost_model

        started = time.perf_counter()
        graph = self.graph(batch)
        cluster = stage_cluster(self.cluster, devices)
        settings = dataclasses.replace(self.settings, zero_stage=zero_stage, recompute=recompute)
        options = ConfigOptions(
            devices=devices, devices_per_node=cluster.devices_per_node, product_rule=self.product_rule,
            max_split_dims=self.max_split_dims,
        )
        reuse = next((m for k, m in self._models.items() if k[:2] == (devices, batch)), None)
        model = build_cost_model(
            graph, cluster=cluster, settings=settings, config_options=options, cost_model=self.cost_model,
            measured=self.measured, reuse=reuse, price_edges=edges or self.cost_model == "pase",
        )
        if not model.edges_priced:
            self._edgeless.add((devices, batch))
        self._models[key] = model
        self.builds += 1
        self.build_time_s += time.perf_counter() - started
        return model

    def _price_edges(self, devices: int, batch: int) -> None:
        """Price the edges of the (devices, batch) pair's models, built without them: once, shared by
        every recompute variant (their edges are equal); their pipeline arrays keep their per-op costs."""
        from objectives.tables import with_edges

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
                model, self._parts[parts_key], stage_cluster(self.cluster, devices), zero_stage
            )
        return self._arrays[key]

    def restricted(
        self, devices: int, batch: int, zero_stage: int, recompute: str, *, inside_node: bool, data_parallel: int | None,
        family: tuple[str, int] | None = None,
    ) -> "_Restricted":
        """The stage arrays restricted to :meth:`masks`, or with ``family = (target, index)`` to that
        family of :meth:`families` (built once)."""
        key = (devices, batch, zero_stage, recompute, inside_node, data_parallel, family)
        if key not in self._restricted:
            arrays = self.arrays(devices, batch, zero_stage, recompute)
            if family is None:
                masks = self.masks(devices, batch, inside_node=inside_node, data_parallel=data_parallel)
            else:
                found = self.families(devices, batch, family[0], inside_node=inside_node, data_parallel=data_parallel)
                masks = list(found.families[family[1]].masks)
            # every ZeRO / recompute variant of (devices, batch) has the same edges and spaces
            shared = next(
                (r for k, r in self._restricted.items() if k[:2] == (devices, batch) and k[4:] == key[4:]), None
            )
            self._restricted[key] = _Restricted.build(arrays, masks, shared)
        return self._restricted[key]

    def holds(self, devices: int, batch: int) -> bool:
        """Whether a cost model of ``batch`` samples on ``devices``-device stages is built."""
        return any(k[:2] == (devices, batch) for k in self._models)

    def release(self, devices: int, batch: int) -> None:
        """Drop the cost models, arrays and masks of ``batch`` samples on ``devices``-device stages.

        They are rebuilt, equal, when asked for again (:meth:`model`); the graphs and elimination
        plans are kept. A search over many (stage size, micro-batch) pairs releases each pair once
        it is priced, so its memory stays that of one pair's models.
        """
        for store in (self._models, self._parts, self._arrays, self._masks, self._restricted, self._families):
            for key in [k for k in store if k[:2] == (devices, batch)]:
                del store[key]
        self._edgeless.discard((devices, batch))

    def families(
        self, devices: int, batch: int, target: str, *, inside_node: bool, data_parallel: int | None
    ) -> "_TargetFamilies":
        """The configuration families ``target`` runs on a ``devices``-device stage
        (:func:`planner.export.pipeline_target_families`), each within :meth:`masks`; a family
        some op has no configuration of is dropped."""
        key = (devices, batch, target, inside_node, data_parallel)
        if key not in self._families:
            from planner.export import pipeline_target_families

            base = self.masks(devices, batch, inside_node=inside_node, data_parallel=data_parallel)
            spaces = self.model(devices, batch, 0, "none", edges=False).tables.configs
            found = pipeline_target_families(
                target, self.graph(batch), spaces, devices=devices,
                devices_per_node=stage_cluster(self.cluster, devices).devices_per_node,
                pp=self.cluster.devices // devices,
            )
            interned: dict[bytes, np.ndarray] = {}  # equal masks as one array: tables stay shared

            def intern(mask: np.ndarray) -> np.ndarray:
                return interned.setdefault(mask.tobytes(), mask)

            kept = []
            for family in found:
                masks = [np.asarray(m, dtype=bool) & b for m, b in zip(family.masks, base)]
                if all(m.any() for m in masks):
                    counts = np.array([m.sum() for m in masks])
                    single = np.array([int(m.argmax()) for m in masks], dtype=np.int64) if (counts == 1).all() else None
                    kept.append(
                        _TargetFamily(label=family.label, tp=family.tp, masks=tuple(intern(m) for m in masks), single=single)
                    )
            union = [intern(np.logical_or.reduce([f.masks[i] for f in kept])) for i in range(len(base))] if kept else []
            self._families[key] = _TargetFamilies(families=tuple(kept), union=tuple(union))
        return self._families[key]

    def masks(self, devices: int, batch: int, *, inside_node: bool, data_parallel: int | None) -> list[np.ndarray]:
        """Per op, the configurations the pipeline search allows on a stage (see :class:`PipelineOptions`)."""
        key = (devices, batch, inside_node, data_parallel)
        if key not in self._masks:
            from planner.families import batch_products

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
                        allowed &= space.inter_replica_counts == 1  # redundant copies are tp ranks too
                    if data_parallel is not None and batch_dims.any():
                        split, _ = batch_products(op, space)
                        allowed &= split == data_parallel
                    if not allowed.any():
                        allowed = np.all(space.factors == 1, axis=1)
                    memo[memo_key] = allowed
                masks.append(memo[memo_key])
            self._masks[key] = masks
        return self._masks[key]


# --------------------------------------------------------------------------------------------
# results


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
    schedule: Literal["gpipe", "1f1b", "interleaved"] = "1f1b"
    chunks: int = 1
    """Model chunks per device (``interleaved`` only)."""
    model_parallel_inside_node: bool = True
    """On stages that span nodes, split an op's non-batch dims only inside a node (data parallelism
    across nodes), as Megatron-LM's rank order does; keeps 64-device stages searchable in seconds."""
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
    synchronisation pattern, rarely the best split). ZeRO-0 is priced only when ZeRO-1 is not
    searched: its reduce-scatter + all-gather cost what ZeRO-0's all-reduce costs (ring collectives)
    and it holds less, so a ZeRO-0 point is never on the frontier beside its ZeRO-1 twin."""

    prune: bool = True
    """Skip a (pp, micro-batch, recompute, ZeRO) combination when a lower bound of its step time and
    one of its memory (:func:`_lower_bounds`) are dominated by a point already found: none of its
    plans could reach the frontier, so the frontier is the same with or without (the result counts
    them); ``False`` searches every combination (for comparisons)."""
    time_limit_s: float | None = None
    """Wall-clock seconds for the search (``--time-limit``): past it, once some point is found, no
    further (pipeline size, micro-batch) combination is started and the notes say which were left;
    ``None``: no limit."""

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
            if r not in ("none", "selective", "full"):
                raise InputError(f"--recompute must be none, selective or full (got {r})")
        if self.schedule not in ("gpipe", "1f1b", "interleaved"):
            raise InputError(f"unknown pipeline schedule '{self.schedule}'; use gpipe, 1f1b or interleaved")
        if self.chunks < 1 or (self.chunks > 1 and self.schedule != "interleaved"):
            raise InputError("--chunks > 1 needs --schedule interleaved")


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
    target: str | None = None
    """The launch target the search was restricted to (``None``: every plan)."""
    cache: PipelineCostCache | None = field(default=None, repr=False, compare=False)
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
    return _price_plan(
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


def _price_plan(
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
    """:func:`evaluate_pipeline`'s numbers, the point itself built on demand."""
    from objectives.collectives import point_to_point_time_s, ring_all_reduce_time_s
    from objectives.memory import OTHER_FRACTION
    from objectives.schedules import (
        boundary_crosses_node,
        bubble_fraction,
        in_flight_micro_batches,
        pipeline_time_s,
    )

    if pp < 1 or cache.cluster.devices % pp:
        raise InputError(f"--pp {pp} must divide the {cache.cluster.devices} devices")
    if batch < 1 or global_batch % batch:
        raise InputError(f"--global-batch {global_batch} is not a multiple of the micro-batch's {batch} samples")
    if len(bounds) != pp + 1:
        raise InputError(f"a {pp}-stage pipeline needs {pp + 1} layer bounds, got {len(bounds)}")
    devices = cache.cluster.devices // pp
    micro_batches = global_batch // batch
    arrays = cache.arrays(devices, batch, zero_stage, recompute)
    structure = cache.structure(batch)
    graph: OpGraph = arrays.model.graph  # type: ignore[attr-defined]
    picks = np.asarray(choice, dtype=np.int64)
    stage = structure.stage_of_ops(bounds) if pp > 1 else np.zeros(len(graph.ops), dtype=np.int64)
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
        shared = float(ring_all_reduce_time_s(copy.grad_bytes[c], 2, link))
        step[s] += float(copy.sync_s[c]) + shared
        step[owner] += shared
    in_flight = in_flight_micro_batches(schedule, stages=pp, micro_batches=micro_batches, chunks=chunks)
    held = activations * in_flight
    states = params + grads + optimizer
    other = OTHER_FRACTION * (states + held)
    memory = states + held + other
    if pp > 1:
        cut = structure.cut_bytes[np.asarray(bounds[1:-1], dtype=np.int64)] / devices
        crosses = boundary_crosses_node(
            stages=pp, devices_per_stage=devices, devices_per_node=cache.cluster.devices_per_node
        )
        p2p = point_to_point_time_s(
            cut, crosses_node=crosses, intra_link=cache.cluster.intra_link, inter_link=cache.cluster.inter_link
        )  # p2p_time_s of each boundary's bytes, all boundaries at once
    else:
        p2p = np.zeros(0)
    pipeline = float(
        pipeline_time_s(schedule, forward_s=forward, backward_s=backward, p2p_s=p2p, micro_batches=micro_batches, chunks=chunks)
    )
    # Stage s finishes its last backward before stage 0 by the drain of the stages in front of it.
    drain = np.concatenate(([0.0], np.cumsum(backward[:-1] + (p2p if p2p.size else 0.0))))
    finish = pipeline - drain
    step_time = float(np.max(finish + step))
    slowest = float((forward + backward).max())
    limit = float(memory_limit_bytes) if memory_limit_bytes is not None else float(cache.cluster.device.memory_bytes)
    worst = int(np.argmax(memory))
    peak = float(memory[worst])

    def build() -> PipelinePoint:
        stage_plans = []
        bounds_t = tuple(int(x) for x in bounds) if pp > 1 else (0, structure.num_layers)
        flops = np.array([op.flops for op in graph.ops])
        has_batch = np.array([any(d.is_batch for d in op.dims) for op in graph.ops])
        for s in range(pp):
            ops = tuple(int(i) for i in np.flatnonzero(stage == s))
            here = stage == s
            dp, tp, uniform = _degrees(arrays, flat_index[here], flops[here], has_batch[here])
            stage_plans.append(
                StagePlan(
                    index=s,
                    layers=(bounds_t[s], bounds_t[s + 1]),
                    ops=ops,
                    forward_s=float(forward[s]),
                    backward_s=float(backward[s]),
                    grad_sync_s=float(step[s]),
                    in_flight=float(in_flight[s]),
                    memory=MemoryBreakdown(
                        params_bytes=float(params[s]), grads_bytes=float(grads[s]), optimizer_bytes=float(optimizer[s]),
                        activations_bytes=float(held[s]), other_bytes=float(other[s]),
                    ),
                    summary=_describe(dp, tp, uniform),
                )
            )
        dp, tp, uniform = _degrees(arrays, flat_index, flops, has_batch)
        micro = max(batch // dp, 1)
        summary = f"pp={pp} x {_describe(dp, tp, uniform)}, mb={micro}, zero={zero_stage}, recompute={recompute}"
        return PipelinePoint(
            time_s=step_time,
            memory_bytes=peak,
            pp=pp,
            dp=dp,
            tp=tp,
            devices_per_stage=devices,
            micro_batch=micro,
            micro_batch_samples=batch,
            micro_batches=micro_batches,
            global_batch=global_batch,
            zero_stage=zero_stage,
            recompute=recompute,
            schedule=schedule,
            chunks=chunks,
            stages=tuple(stage_plans),
            time=PipelineTime(
                step_s=step_time,
                pipeline_s=pipeline,
                bubble_s=max(pipeline - micro_batches * slowest, 0.0),
                p2p_s=float(p2p.sum()),
                grad_sync_s=step_time - pipeline if step_time > pipeline else 0.0,
                bubble_fraction=bubble_fraction(schedule, stages=pp, micro_batches=micro_batches, chunks=chunks),
            ),
            memory=stage_plans[worst].memory,
            fits=peak <= limit,
            summary=summary,
            choice=tuple(int(c) for c in picks),
            uniform=uniform,
            graph=graph,
            spaces=arrays.spaces,
        )

    return _Priced(time_s=step_time, memory_bytes=peak, fits=peak <= limit, build=build)


# --------------------------------------------------------------------------------------------
# the search


def _layer_costs(arrays: _OpArrays, structure: LayerStructure, picks: np.ndarray) -> tuple[np.ndarray, float, float, np.ndarray, float, float, np.ndarray, float, float]:
    """Per layer (and before / after the layers): time per micro-batch, parameter states, activations."""
    layers = structure.num_layers
    slot = structure.position + 1  # 0: before, 1..L: layers, L+1: after
    flat_index = arrays.offsets + picks
    time_op = arrays.flat["forward_s"][flat_index] + arrays.flat["backward_s"][flat_index]
    states_op = (
        arrays.flat["params_bytes"][flat_index] + arrays.flat["grads_bytes"][flat_index]
        + arrays.flat["optimizer_bytes"][flat_index]
    )
    act_op = arrays.flat["activations_bytes"][flat_index]
    time_slot = np.bincount(slot, weights=time_op, minlength=layers + 2)
    if arrays.edges:
        edge_time = arrays.edge_flat[arrays.edge_offsets + picks[arrays.edge_u] * arrays.edge_strides + picks[arrays.edge_v]]
        time_slot += np.bincount(slot[arrays.edge_v], weights=edge_time, minlength=layers + 2)
    states_slot = np.bincount(slot, weights=states_op, minlength=layers + 2)
    act_slot = np.bincount(slot, weights=act_op, minlength=layers + 2)
    return (
        time_slot[1:-1], float(time_slot[0]), float(time_slot[-1]),
        states_slot[1:-1], float(states_slot[0]), float(states_slot[-1]),
        act_slot[1:-1], float(act_slot[0]), float(act_slot[-1]),
    )


def _labels(hashes: Sequence[tuple]) -> tuple[int, ...]:
    """Label each item by the first item with the same hash (which tables are equal)."""
    first: dict[tuple, int] = {}
    return tuple(first.setdefault(h, i) for i, h in enumerate(hashes))


def _digest(array: np.ndarray) -> tuple:
    return (array.shape, hash(np.ascontiguousarray(array).tobytes()))


@dataclass(frozen=True, slots=True, eq=False)
class _Restricted:
    """A stage cost model's arrays restricted to the allowed configurations (once per mask)."""

    index_maps: tuple[np.ndarray, ...]
    key: tuple[int, ...]
    time_s: Mapping[int, np.ndarray]
    """Per op key: forward + backward seconds per micro-batch, restricted."""
    step_s: Mapping[int, np.ndarray]
    states_bytes: Mapping[int, np.ndarray]
    activations_bytes: Mapping[int, np.ndarray]
    configs: tuple[ConfigSpace, ...]
    edges: tuple[EdgeCost, ...]
    """Per micro-batch, restricted."""
    edge_labels: tuple[int, ...]
    """Which restricted edge tables are equal (their equality does not change with the weights)."""
    blocks: tuple

    @staticmethod
    def build(arrays: _OpArrays, masks: Sequence[np.ndarray], shared: "_Restricted | None" = None) -> "_Restricted":
        """Restrict ``arrays`` to ``masks``; ``shared``: a restriction of another model of the same
        (devices, batch) under the same masks, whose edges and spaces (equal) are taken as they are."""
        keep = [np.flatnonzero(m) for m in masks]
        time_s: dict[int, np.ndarray] = {}
        step_s: dict[int, np.ndarray] = {}
        states: dict[int, np.ndarray] = {}
        acts: dict[int, np.ndarray] = {}
        key_of: list[int] = []
        seen: dict[tuple[int, int], int] = {}
        for i, base_key in enumerate(arrays.key):
            k = seen.setdefault((base_key, id(masks[i])), len(seen))
            key_of.append(k)
            if k not in time_s:
                rows = keep[i]
                time_s[k] = (arrays.forward_s[i] + arrays.backward_s[i])[rows]
                step_s[k] = arrays.step_s[i][rows]
                states[k] = (arrays.params_bytes[i] + arrays.grads_bytes[i] + arrays.optimizer_bytes[i])[rows]
                acts[k] = arrays.activations_bytes[i][rows]
        if shared is not None:
            edges, edge_labels, configs = shared.edges, shared.edge_labels, shared.configs
        else:
            memo: dict[tuple, np.ndarray] = {}
            edge_list = []
            for e in arrays.edges:
                memo_key = (id(e.time_s), id(masks[e.u]), id(masks[e.v]))
                if memo_key not in memo:
                    memo[memo_key] = e.time_s[np.ix_(keep[e.u], keep[e.v])]
                edge_list.append(EdgeCost(u=e.u, v=e.v, time_s=memo[memo_key]))
            digests = {id(a): _digest(a) for a in memo.values()}
            edges = tuple(edge_list)
            edge_labels = _labels([(e.u, e.v, digests[id(e.time_s)]) for e in edges])
            configs = tuple(
                c.subset(k) for c, k in zip(arrays.spaces, keep)
            )
        return _Restricted(
            index_maps=tuple(keep),
            key=tuple(key_of),
            time_s=time_s,
            step_s=step_s,
            states_bytes=states,
            activations_bytes=acts,
            configs=configs,
            edges=edges,
            edge_labels=edge_labels,
            blocks=arrays.model.graph.blocks,  # type: ignore[attr-defined]
        )


def _solve(cache: "PipelineCostCache", tables: CostTables, key_labels: tuple, edge_labels: tuple) -> np.ndarray | None:
    """PaSE's DP on ``tables``, reusing the elimination plan of tables with the same structure.

    Any plan whose regions were matched on the same equality pattern (which tables are equal) gives
    the exact optimum; the configuration counts only steer the order heuristics towards small tables.
    So one plan serves every recomputation, ZeRO stage, slot and memory weight, and every stage size
    and batch with the same equality pattern and the same ops at one configuration (the counts of a
    stage's ops grow together with its devices and batch, so the order chosen for one fits the
    others); choosing it costs more than the elimination itself.
    """
    from planner.search import elimination
    from planner.search.blocks import plan_elimination
    from planner.search.ordering import generate_seq, min_cells_seq

    # elimination._solve(tables, plan, node_cost) runs a given plan; solve_min plans every time. Should
    # the private function change, the public entry point gives the same optimum, only slower.
    runner = getattr(elimination, "_solve", None)
    if runner is None:
        best = elimination.solve_min(tables, objective="time")
        return best.choice if np.isfinite(best.value) else None
    single = tuple(t.shape[0] == 1 for t in tables.node_time_s)
    plan_key = (single, key_labels, edge_labels)
    plan = cache.plans.get(plan_key)
    if plan is None:
        # PaSE's GENERATESEQ and the fewest-cells order: on a chain of layers they find the orders the
        # networkx tree-decomposition heuristics find, several times faster
        plan = plan_elimination(tables, heuristics={"generate_seq": generate_seq, "min_cells": min_cells_seq})
        cache.plans[plan_key] = plan
    try:
        choice, value = runner(tables, plan, tables.node_time_s)
    except TypeError:  # a changed signature
        best = elimination.solve_min(tables, objective="time")
        choice, value = best.choice, best.value
    return choice if np.isfinite(value) else None


def _choose_intra_op(
    cache: "PipelineCostCache",
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
    from objectives.memory import OTHER_FRACTION

    times: dict[int, np.ndarray] = {}
    memories: dict[int, np.ndarray] = {}
    for k, t in restricted.time_s.items():
        memory = (1.0 + OTHER_FRACTION) * (restricted.states_bytes[k] + in_flight * restricted.activations_bytes[k])
        cost = slots * t + restricted.step_s[k]
        if memory_weight_s_per_byte:
            cost = cost + memory_weight_s_per_byte * memory
        times[k] = cost
        memories[k] = memory
    digests = {k: (_digest(times[k]), _digest(memories[k])) for k in times}
    node_labels = _labels([digests[k] for k in restricted.key])
    edge_memo: dict[int, np.ndarray] = {}
    edges = []
    for e in restricted.edges:
        if id(e.time_s) not in edge_memo:
            edge_memo[id(e.time_s)] = slots * e.time_s
        edges.append(EdgeCost(u=e.u, v=e.v, time_s=edge_memo[id(e.time_s)]))
    tables = CostTables(
        configs=restricted.configs,
        node_time_s=tuple(times[k] for k in restricted.key),
        node_memory_bytes=tuple(memories[k] for k in restricted.key),
        edges=tuple(edges),
        blocks=restricted.blocks,
    )
    picks = _solve(cache, tables, node_labels, restricted.edge_labels)
    if picks is None:
        return None
    return np.array([int(m[c]) for m, c in zip(restricted.index_maps, picks)], dtype=np.int64)


def _memory_floor(arrays: _OpArrays, masks: Sequence[np.ndarray], in_flight: float) -> float:
    """A lower bound of the memory of all stages together: each op at its leanest allowed configuration."""
    from objectives.memory import OTHER_FRACTION

    memo: dict[tuple, float] = {}
    total = 0.0
    for i, key in enumerate(arrays.key):
        memo_key = (key, id(masks[i]))
        if memo_key not in memo:
            memory = (
                arrays.params_bytes[i] + arrays.grads_bytes[i] + arrays.optimizer_bytes[i]
                + in_flight * arrays.activations_bytes[i]
            )
            memo[memo_key] = float(memory[masks[i]].min())
        total += memo[memo_key]
    return (1.0 + OTHER_FRACTION) * total


def _gather(arrays: _OpArrays, masks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(index, starts, group)``: the flat-array entries of every distinct (op costs, allowed
    configurations) pair, concatenated (pair ``g`` starts at ``starts[g]``), and each op's pair."""
    key = ("gather", id(masks))
    if key not in arrays.shared:
        mask_ids = np.fromiter((id(m) for m in masks), dtype=np.int64, count=len(masks))
        _, first, group = np.unique(
            np.stack([arrays.offsets, mask_ids], axis=1), axis=0, return_index=True, return_inverse=True
        )
        allowed = [arrays.offsets[i] + np.flatnonzero(masks[i]) for i in first]
        starts = np.concatenate(([0], np.cumsum([a.size for a in allowed])[:-1])).astype(np.int64)
        arrays.shared[key] = (np.concatenate(allowed), starts, group.ravel())
    return arrays.shared[key]


def _op_minima(
    arrays: _OpArrays, masks: Sequence[np.ndarray], in_flight: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per op, the least of its costs over its allowed configurations: ``(time_s, step_s, memory)``
    with ``time_s`` = forward + backward per micro-batch, ``step_s`` the per-step part and
    ``memory[j]`` = parameter states + ``in_flight[j]`` x activations (bytes, without the allowance).
    Each is minimised on its own (a bound, not one configuration)."""
    index, starts, group = _gather(arrays, masks)
    flat = arrays.flat
    weights = np.asarray(in_flight, dtype=np.float64)
    time_s = np.minimum.reduceat(flat["forward_s"][index] + flat["backward_s"][index], starts)
    step_s = np.minimum.reduceat(flat["step_s"][index], starts)
    states = flat["params_bytes"][index] + flat["grads_bytes"][index] + flat["optimizer_bytes"][index]
    memory = states[None, :] + weights[:, None] * flat["activations_bytes"][index][None, :]
    memory = np.minimum.reduceat(memory, starts, axis=1)
    return time_s[group], step_s[group], memory[:, group]


_BOUND_SLACK = 1.0 - 1e-9
"""Bounds are lowered by this factor so that rounding (sums taken in another order) never lifts one
above the price it bounds."""


def _p2p_floor_s(cache: "PipelineCostCache", structure: LayerStructure, pp: int, devices: int) -> np.ndarray:
    """``(pp - 1,)`` the cheapest transfer across each boundary over every cut it could fall on."""
    from objectives.collectives import point_to_point_time_s
    from objectives.schedules import boundary_crosses_node

    if pp <= 1:
        return np.zeros(0)
    cuts = structure.cut_bytes[1 : structure.num_layers] / devices  # a boundary falls before layer 1..L-1
    crosses = boundary_crosses_node(
        stages=pp, devices_per_stage=devices, devices_per_node=cache.cluster.devices_per_node
    )
    times = point_to_point_time_s(
        cuts[None, :], crosses_node=crosses[:, None], intra_link=cache.cluster.intra_link,
        inter_link=cache.cluster.inter_link,
    )
    return times.min(axis=1)


def _lower_bounds(
    arrays: _OpArrays,
    masks: Sequence[np.ndarray],
    structure: LayerStructure,
    *,
    pp: int,
    micro_batches: int,
    in_flight: np.ndarray,
    p2p_floor_s: np.ndarray,
    schedule: str,
    chunks: int,
) -> tuple[float, float]:
    r"""``(step seconds, memory bytes per device)`` that no plan of these arrays and masks goes below,
    whatever its per-op splits and stage cut.

    Every op at its cheapest allowed configuration, separately for time and for memory, gives each
    layer (and the ops before / after the layers) a least time and, per stage, a least memory
    (states + that stage's in-flight micro-batches of activations). Time: the stages' work is at
    least the sum and their slowest at least the least bottleneck of any cut
    (:func:`planner.search.stages.least_bottleneck`), transfers inside stages cost >= 0 and each
    boundary at least its cheapest cut; the schedule's makespan is then at least
    :func:`objectives.schedules.pipeline_time_lower_bound_s`, and the step ends no earlier than the
    first stage's gradient synchronisation after it. Memory: the largest stage holds at least the
    least bottleneck of the per-stage memories (tied copies only add).
    """
    from objectives.memory import OTHER_FRACTION
    from objectives.schedules import pipeline_time_lower_bound_s
    from planner.search.stages import least_bottleneck

    weights, stage_weight = np.unique(np.asarray(in_flight, dtype=np.float64), return_inverse=True)
    time_min, step_min, memory_min = _op_minima(arrays, masks, weights)
    layers = structure.num_layers
    scale = 1.0 + OTHER_FRACTION
    work = float(time_min.sum())
    if pp == 1:
        makespan = pipeline_time_lower_bound_s(
            schedule, work_s=work, p2p_s=p2p_floor_s, stages=1, micro_batches=micro_batches, chunks=chunks
        )
        return (makespan + float(step_min.sum())) * _BOUND_SLACK, (
            scale * float(memory_min[stage_weight[0]].sum()) * _BOUND_SLACK
        )
    slot = structure.position + 1  # 0: before the layers, 1..L: the layers, L + 1: after
    time_slot = np.bincount(slot, weights=time_min, minlength=layers + 2)
    slowest = least_bottleneck(time_slot[1:-1], pp, first_cost=float(time_slot[0]), last_cost=float(time_slot[-1]))
    makespan = pipeline_time_lower_bound_s(
        schedule, work_s=work, bottleneck_s=slowest, p2p_s=p2p_floor_s, stages=pp, micro_batches=micro_batches,
        chunks=chunks,
    )
    first_step = float(step_min[structure.position <= 0].sum())
    memory_slot = np.stack([np.bincount(slot, weights=row, minlength=layers + 2) for row in memory_min])
    per_stage = memory_slot[stage_weight.ravel()]  # (pp, L + 2): each stage's in-flight count
    memory = least_bottleneck(
        per_stage[:, 1:-1], pp, first_cost=float(per_stage[0, 0]), last_cost=float(per_stage[-1, -1])
    )
    return (makespan + first_step) * _BOUND_SLACK, scale * memory * _BOUND_SLACK


class _Frontier:
    """The Pareto set of the points priced so far (first of equal points), in the order found:
    the same set :func:`planner.search.pareto.pareto_mask` keeps from all of them at the end."""

    __slots__ = ("points", "priced")

    def __init__(self) -> None:
        self.points: list[PipelinePoint] = []
        self.priced = 0

    def add(self, priced: "_Priced") -> None:
        self.priced += 1
        t, m = priced.time_s, priced.memory_bytes
        if any(q.time_s <= t and q.memory_bytes <= m for q in self.points):
            return  # dominated, or equal to an earlier point
        self.points = [q for q in self.points if not (t <= q.time_s and m <= q.memory_bytes)]
        self.points.append(priced.point())

    def beats(self, time_s: float, memory_bytes: float) -> bool:
        """Whether a point found dominates every point at or above ``(time_s, memory_bytes)``."""
        return any(
            q.time_s <= time_s and q.memory_bytes <= memory_bytes
            and (q.time_s < time_s or q.memory_bytes < memory_bytes)
            for q in self.points
        )


def _priced_zero_stages(group: tuple[int, ...]) -> tuple[int, ...]:
    """The ZeRO stages of a group that are priced: ZeRO-0 only when ZeRO-1 is not searched (ZeRO-1
    costs ZeRO-0's time with less memory)."""
    return tuple(z for z in group if not (z == 0 and 1 in group))


def _pipeline_sizes(devices: int, per_node: int, layers: int, chunks: int, wanted: tuple[int, ...] | None) -> list[int]:
    sizes = []
    for pp in divisors(devices) if wanted is None else wanted:
        if devices % pp:
            continue
        d = devices // pp
        if not (d % per_node == 0 or per_node % d == 0):
            continue
        if pp > 1 and pp * chunks > layers:
            continue
        sizes.append(pp)
    return sizes


def _batches(options: PipelineOptions, devices: int, inside_node_nodes: int) -> list[tuple[int, int | None]]:
    """``(samples per micro-batch, required data-parallel degree or None)`` pairs to try."""
    g = options.global_batch
    if options.micro_batch is not None:
        return [
            (options.micro_batch * dp, dp) for dp in divisors(devices)
            if g % (options.micro_batch * dp) == 0 and dp >= inside_node_nodes
        ]
    return [(b, None) for b in divisors(g) if b >= inside_node_nodes]


def pipeline_search(
    graph_at_batch: GraphAtBatch | PipelineCostCache,
    *,
    cluster: Cluster,
    options: PipelineOptions,
    settings: TrainingSettings | None = None,
    memory_limit_bytes: float | None = None,
    cost_model: Literal["roofline", "measured", "pase"] = "roofline",
    measured=None,
    progress: Callable[[str, float], None] | None = None,
    target: str | None = None,
) -> PipelineResult:
    r"""The frontier over pipeline size, per-op splits, micro-batch, ZeRO stage and recomputation.

    Parameters
    ----------
    graph_at_batch:
        ``samples -> OpGraph`` (e.g. :func:`graph_loader`), or a :class:`PipelineCostCache` to share
        cost models with other calls (its own settings and cost model then apply).
    cluster:
        All devices.
    options:
        The search space (global batch, micro-batch, pipeline sizes, ZeRO stages, recomputation,
        schedule).
    settings:
        Precision and optimizer (its ZeRO stage and recomputation are replaced by the searched ones).
    memory_limit_bytes:
        Per device; default the device's memory.
    cost_model, measured:
        As for :func:`planner.plan.build_model`.
    progress:
        ``(stage, fraction)`` callback.
    target:
        Search only plans this launch target runs (``megatron``, ``deepspeed``, ``meshtf``,
        ``dtensor``; ``None`` or ``generic``: every plan). Each stage's intra-op search then runs
        once per family of the target on the stage's devices
        (:func:`planner.export.pipeline_target_families`: e.g. one per ``dp x tp``, sequence
        parallelism on or off) and every family's optimum is priced; pipeline settings the target's
        exporter refuses (:func:`planner.export.pipeline_target_allows`: e.g. ZeRO-2/3 with
        ``pp > 1``) are not searched. The pruning bounds use the union of the families.

    Returns
    -------
    PipelineResult
        Pareto points (fastest first) and the fastest that fits.

    Raises
    ------
    InputError
        No pipeline size is possible (e.g. a ``pp`` that does not divide the devices).
    """
    started = time.perf_counter()
    report = progress or (lambda stage, fraction: None)
    if target == "generic":
        target = None
    if target is not None:
        from planner.export import PIPELINE_TARGETS, pipeline_target_allows

        if target not in PIPELINE_TARGETS:
            raise InputError(f"unknown --target '{target}'; use generic, megatron, deepspeed, meshtf or dtensor")
    if isinstance(graph_at_batch, PipelineCostCache):
        cache = graph_at_batch
    else:
        cache = PipelineCostCache(
            graph_at_batch, cluster=cluster, settings=settings, cost_model=cost_model, measured=measured
        )
    from objectives.memory import OTHER_FRACTION
    from objectives.schedules import in_flight_micro_batches
    from planner.search.stages import partition_layers

    limit = float(memory_limit_bytes) if memory_limit_bytes is not None else float(cluster.device.memory_bytes)
    probe = cache.structure(options.global_batch if options.micro_batch is None else options.micro_batch)
    layers = probe.num_layers
    sizes = _pipeline_sizes(cluster.devices, cluster.devices_per_node, layers, options.chunks, options.pipeline_sizes)
    if not sizes and layers == 0:
        raise InputError(
            "the model has no repeated blocks (layers) to cut into pipeline stages; pass --pp 1 or leave --pp out"
        )
    if not sizes:
        raise InputError(
            f"no pipeline size fits {cluster.devices} devices and {layers} layers; pass --pp with a divisor of "
            "--devices that is at most the layer count"
        )
    notes = []
    if layers == 0:
        notes.append("the model has no repeated blocks (layers): it runs as one stage (pp=1)")
    if target is not None:
        notes.append(f"searched only plans {target} runs (its dp x tp families on each stage, ZeRO stages and schedules)")
    if options.exact_zero:
        zero_groups = [tuple(z for z in group if z in options.zero_stages) for group in _ZERO_GROUPS]
        zero_groups = [g for g in zero_groups if g]
    else:
        zero_groups = [tuple(sorted(set(options.zero_stages)))]
    frontier = _Frontier()
    combos = searches = skipped = pruned = 0
    total = len(sizes)
    deadline_s = None if options.time_limit_s is None else started + options.time_limit_s
    stopped_at: int | None = None
    for step_index, pp in enumerate(sizes):
        if stopped_at is not None or (deadline_s is not None and frontier.points and time.perf_counter() > deadline_s):
            stopped_at = pp if stopped_at is None else stopped_at  # the time limit: the points found are kept
            break
        report("pipeline search", step_index / total)
        devices = cluster.devices // pp
        nodes = max(1, devices // cluster.devices_per_node)
        min_batch = nodes if options.model_parallel_inside_node else 1
        unfit: dict[str, int] = {}  # recompute -> a micro-batch size too large to fit
        for batch, data_parallel in _batches(options, devices, min_batch):
            if deadline_s is not None and frontier.points and time.perf_counter() > deadline_s:
                stopped_at = pp
                break
            micro_batches = options.global_batch // batch
            if options.schedule == "interleaved" and pp > 1 and micro_batches % pp:
                continue
            if options.fill_pipeline and micro_batches < pp:
                continue
            release = not cache.holds(devices, batch)  # built here: dropped when this batch is done
            structure = cache.structure(batch)
            in_flight = in_flight_micro_batches(
                options.schedule, stages=pp, micro_batches=micro_batches, chunks=options.chunks
            )
            masks = cache.masks(
                devices, batch, inside_node=options.model_parallel_inside_node, data_parallel=data_parallel
            )
            families: tuple[_TargetFamily, ...] = ()
            families_known = target is None

            def target_families() -> tuple[_TargetFamily, ...]:
                """The target's families here, computed on first need (a pruned micro-batch needs
                none); from then on the bounds use their union, tighter than the pipeline's masks."""
                nonlocal families, families_known, masks
                if not families_known:
                    found = cache.families(
                        devices, batch, target, inside_node=options.model_parallel_inside_node,  # type: ignore[arg-type]
                        data_parallel=data_parallel,
                    )
                    families, families_known = found.families, True
                    if families:
                        masks = list(found.union)
                return families
            slots = micro_batches + pp - 1
            shared: dict[tuple, dict] = {}  # intra-op choices (per family) shared between recompute settings
            p2p_floor = _p2p_floor_s(cache, structure, pp, devices) if options.prune else np.zeros(0)

            def zeros(group: tuple[int, ...], recompute: str, tp: int | None) -> tuple[int, ...]:
                """The ZeRO stages of ``group`` priced for a family of tensor-parallel degree ``tp``."""
                if target is None:
                    return _priced_zero_stages(group)
                allowed = tuple(
                    z for z in group
                    if pipeline_target_allows(
                        target, pp=pp, zero_stage=z, recompute=recompute, schedule=options.schedule, tp=tp
                    )
                )
                return _priced_zero_stages(allowed)

            def any_zeros(group: tuple[int, ...], recompute: str) -> tuple[int, ...]:
                """The ZeRO stages of ``group`` priced for some family, whatever its ``tp`` (the rules
                tell only ``tp = 1`` from ``tp > 1``): a superset, for the bounds before the families."""
                return tuple(sorted({z for tp in (None, 1, 2) for z in zeros(group, recompute, tp)}))

            def group_families(group: tuple[int, ...]) -> list[int]:
                """Families with a ZeRO stage of ``group`` priced under some recomputation setting."""
                return [
                    i for i, f in enumerate(families) if any(zeros(group, r, f.tp) for r in options.recompute)
                ]

            lower: dict[tuple, tuple[float, float]] = {}
            time_floor = 0.0  # pp=1: the least step time of any plan here, once known (see below)

            def beaten(key: tuple, recompute: str, stages: Sequence[int], bound_masks: Sequence[np.ndarray]) -> bool:
                """Whether a point already found dominates every plan of ``bound_masks`` at these ZeRO
                stages (:func:`_lower_bounds`, the least over the stages; kept under ``key``)."""
                if not options.prune or not frontier.points:
                    return False
                if key not in lower:
                    bound_t = bound_m = math.inf
                    for z in stages:
                        t, m = _lower_bounds(
                            cache.arrays(devices, batch, z, recompute, edges=False), bound_masks, structure, pp=pp,
                            micro_batches=micro_batches, in_flight=in_flight, p2p_floor_s=p2p_floor,
                            schedule=options.schedule, chunks=options.chunks,
                        )
                        bound_t, bound_m = min(bound_t, t), min(bound_m, m)
                    lower[key] = (bound_t, bound_m)
                bound_t, bound_m = lower[key]
                return frontier.beats(max(bound_t, time_floor), bound_m)

            def family_dominated(index: int | None, recompute: str, group: tuple[int, ...]) -> bool:
                """Whether every plan of one family of the target in the combination is provably
                dominated by a point already found (its own masks: tighter than the union's)."""
                if index is None:
                    return False
                family = families[index]
                return beaten((index, recompute, group), recompute, zeros(group, recompute, family.tp), family.masks)

            def live_families(recompute: str, group: tuple[int, ...]) -> list[int | None]:
                """The families (``[None]`` without a target) whose plans in the combination are not all
                dominated already."""
                if target is None:
                    return [None]
                return [i for i in group_families(group) if not family_dominated(i, recompute, group)]

            def choose(
                zero: int, recompute: str, weight: float, wanted: Sequence[int | None]
            ) -> dict[int | None, np.ndarray | None]:
                """Family (or ``None``) -> choice of the intra-op DP (``None``: no finite choice), for
                the ``wanted`` families."""
                nonlocal searches
                chosen: dict[int | None, np.ndarray | None] = {}
                for index in wanted:
                    single = None if index is None else families[index].single
                    if single is not None:
                        # any weight picks the one plan, priced at weight 0 already
                        chosen[index] = None if weight else single
                        continue
                    searches += 1
                    restricted = cache.restricted(
                        devices, batch, zero, recompute, inside_node=options.model_parallel_inside_node,
                        data_parallel=data_parallel, family=None if index is None else (target, index),
                    )
                    chosen[index] = _choose_intra_op(
                        cache, restricted, slots=slots, in_flight=float(in_flight[0]), memory_weight_s_per_byte=weight
                    )
                return chosen

            def price(
                candidates: Mapping[int | None, np.ndarray | None], zero: int, recompute: str, group: tuple[int, ...]
            ) -> list[_Priced]:
                found = []
                for index, picks in candidates.items():
                    if picks is None:
                        continue
                    tp = None if index is None else families[index].tp
                    found += price_one(picks, zero, recompute, zeros(group, recompute, tp))
                return found

            def price_one(picks: np.ndarray, zero: int, recompute: str, priced: tuple[int, ...]) -> list[_Priced]:
                if not priced:
                    return []
                arrays = cache.arrays(devices, batch, zero, recompute)
                bounds: Sequence[int] = (0, structure.num_layers)
                if pp > 1:
                    t, t_first, t_last, st, st_first, st_last, act, act_first, act_last = _layer_costs(
                        arrays, structure, picks
                    )
                    scale = 1.0 + OTHER_FRACTION
                    layer_memory = scale * (st[None, :] + in_flight[:, None] * act[None, :])
                    partition = partition_layers(
                        t, pp, first_cost=t_first, last_cost=t_last,
                        layer_memory=layer_memory,
                        first_memory=scale * (st_first + in_flight[0] * act_first),
                        last_memory=scale * (st_last + in_flight[-1] * act_last),
                        memory_limit=limit,
                    )
                    bounds = partition.bounds
                found = [
                    _price_plan(
                        cache, pp=pp, batch=batch, zero_stage=z, recompute=recompute, choice=picks,
                        bounds=bounds, global_batch=options.global_batch, schedule=options.schedule,
                        chunks=options.chunks, memory_limit_bytes=limit,
                    )
                    for z in priced
                ]
                for point in found:
                    frontier.add(point)
                return found

            def dominated(recompute: str, group: tuple[int, ...]) -> bool:
                """Whether every plan of the combination is provably dominated by a point already found."""
                stages = any_zeros(group, recompute) if target is not None else _priced_zero_stages(group)
                return beaten((None, recompute, group), recompute, stages, masks)

            for recompute in options.recompute:
                if recompute in unfit and batch % unfit[recompute] == 0 and data_parallel is None:
                    skipped += len(zero_groups)
                    continue
                if options.skip_unfit and batch % devices == 0 and data_parallel is None:
                    lean = cache.arrays(devices, batch, max(options.zero_stages), recompute, edges=False)
                    if _memory_floor(lean, masks, float(in_flight.min())) / pp > limit:
                        unfit.setdefault(recompute, batch)  # it and its multiples: no plan fits
                        skipped += len(zero_groups)
                        continue
                for group in zero_groups:
                    if target is not None and not any_zeros(group, recompute):
                        continue  # the target refuses every ZeRO stage of the group here
                    combos += 1
                    if dominated(recompute, group):
                        pruned += 1
                        continue
                    if target is not None and not any(zeros(group, recompute, f.tp) for f in target_families()):
                        continue  # no family of the target here takes these settings
                    objective_zero = 1 if 1 in group else group[0]
                    objective_recompute = recompute if options.exact_recompute else options.recompute[0]
                    wanted = live_families(recompute, group)
                    store = shared.setdefault((objective_zero, objective_recompute), {})
                    store.update(
                        choose(objective_zero, objective_recompute, 0.0, [i for i in wanted if i not in store])
                    )
                    found = price({i: store[i] for i in wanted}, objective_zero, recompute, group)
                    every_family = target is None or len(wanted) == len(families)
                    if (
                        found and pp == 1 and objective_zero <= 1 and recompute == objective_recompute == "none"
                        and every_family
                    ):
                        # One stage: the DP's objective is the step time itself, so its optimum is the
                        # least step time of every plan of this micro-batch; ZeRO-2/3 only add
                        # synchronisation to it and recomputation only adds compute.
                        time_floor = max(time_floor, min(p.time_s for p in found) * _BOUND_SLACK)
                    if not found or any(p.fits for p in found) or options.memory_search_steps <= 0:
                        continue
                    lean = cache.arrays(devices, batch, max(group), recompute, edges=False)
                    if _memory_floor(lean, masks, float(in_flight.min())) / pp > limit:
                        continue  # no split of the ops fits: do not search memory weights
                    fastest = min(found, key=lambda p: p.time_s)
                    weight = fastest.time_s / max(fastest.memory_bytes, 1.0)
                    leanest = min(p.memory_bytes for p in found)
                    for _ in range(options.memory_search_steps):
                        if dominated(recompute, group):
                            break  # whatever the next weights find is dominated already
                        more = price(
                            choose(max(group), recompute, weight, live_families(recompute, group)), max(group),
                            recompute, group,
                        )
                        if not more or any(p.fits for p in more):
                            break
                        lowest = min(p.memory_bytes for p in more)
                        if lowest >= leanest * (1.0 - 1e-3):
                            break  # the weight no longer buys memory: the splits are at their leanest
                        leanest = lowest
                        weight *= 4.0
            if release:
                cache.release(devices, batch)
    report("pipeline search", 1.0)
    if stopped_at is not None:
        left = [pp for pp in sizes if pp >= stopped_at]
        notes.append(
            f"search stopped at the time limit ({options.time_limit_s:g} s): pipeline sizes {', '.join(map(str, left))} "
            "were not (fully) searched; the points found are kept (pass a larger --time-limit or --pp to search them)"
        )
    points = sorted(frontier.points, key=lambda p: (p.time_s, p.memory_bytes))
    fitting = [i for i, p in enumerate(points) if p.fits]
    chosen = fitting[0] if fitting else None
    message = ""
    if not points and target is not None:
        message = (
            f"{target} runs no plan of this model on {cluster.devices} devices (its layouts, ZeRO stages and "
            "schedules); plan without --target, or change --global-batch, --pp or --schedule"
        )
    elif chosen is None:
        from planner.core.units import format_bytes

        smallest = min((p.memory_bytes for p in points), default=math.inf)
        message = (
            f"no plan fits in {format_bytes(limit)} per device; the smallest needs {format_bytes(smallest)}; "
            "try more devices or a smaller --global-batch"
        )
    return PipelineResult(
        points=tuple(points),
        chosen=chosen,
        memory_limit_bytes=limit,
        options=options,
        message=message,
        search_time_s=time.perf_counter() - started,
        combinations=combos,
        intra_op_searches=searches,
        candidates=frontier.priced,
        cost_builds=cache.builds,
        skipped=skipped,
        pruned=pruned,
        notes=tuple(notes),
        target=target,
        cache=cache,
    )
