r"""Cost tables of a whole graph: the search problem, and the breakdown of any one choice.

:func:`build_cost_model` turns an :class:`~planner.core.graph.OpGraph` and a cluster into a
:class:`~objectives.cost_model.CostModel`; its ``.tables`` (:class:`~planner.core.tables.CostTables`)
is what search consumes, and ``.evaluate(choice)`` explains a choice term by term
(:func:`objectives.cost_model.evaluate_choice`, :class:`~objectives.cost_model.Evaluation`).

Per op :math:`i` and configuration :math:`c` (time in seconds, memory in bytes per device):

.. math::

    t_i[c] = \underbrace{t^{fwd} + t^{bwd} (+ t^{fwd}_{recompute})}_{\text{objectives.compute}}
           + \underbrace{\textstyle\sum \text{intra-op terms}}_{\text{objectives.intra\_op}}
           + \underbrace{\textstyle\sum \text{gradient sync}}_{\text{objectives.intra\_op}}, \qquad
    m_i[c] = \text{objectives.memory}

and per edge :math:`(u, v)`: :math:`t_{uv}[c_u, c_v]` = the sum over the tensors flowing from
:math:`u` to :math:`v` of their forward + backward re-layout (:mod:`objectives.redistribution`).

Graph-level rules applied here (from the facts read once per graph: :mod:`objectives.graph_facts`):

* tied parameters (``OpGraph.parameter_aliases``, or one parameter read by several ops) are
  accounted - memory and gradient sync - once, by the first op that reads them;
* recomputation (``TrainingSettings.recompute``): ``selective`` recomputes the attention core
  (softmax ops and matmuls without parameters), ``full`` every op of the repeated blocks
  (``OpGraph.blocks``; a graph without blocks recomputes nothing, and ``CostModel.notes`` says so).
  A recomputed op runs its forward again and keeps only the saved inputs produced outside its
  recomputed region - the recomputed ops of its block instance - which are the checkpoints (a
  layer's input under ``full``; q, k, v under ``selective``). Under an execution model
  (``TrainingSettings.engine`` / ``attention``, :mod:`objectives.execution`) the transient memory of
  re-running one region in backward is counted: the first instance of each repeated block keeps all
  its activations; without one it is not modelled.

Sharing: ops whose cost cannot differ (same :meth:`Op.signature`, same operand shapes, dtypes and
roles, same ownership and recompute role) get the *same* numpy arrays, and so do edges with the same
configuration spaces, accesses and tensor shape, so a 12-layer transformer costs one layer's work.

``cost_model="pase"`` prices with :mod:`objectives.pase` instead: the tables' ``time_s`` fields then
hold PaSE's FLOP-equivalents (``CostModel.time_unit == "flop-equivalents"``), memory holds the
per-device parameter bytes, and configurations follow PaSE's rule (``product_rule="at_most"`` on one
level, ``min_tile`` from the given options as the cutoff).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from objectives._common import element_bytes, shard_elements
from objectives.attention import FlashShape
from objectives.compute import MeasuredFn, op_compute_time_s
from objectives.cost_model import CostModel, EdgeCostDetail, EdgeRow, Evaluation, OpCostDetail, OpRow, evaluate_choice
from objectives.execution import ExecutionModel, execution_of
from objectives.graph_facts import (
    EdgePart,
    _classes,
    _first_instance,
    _graph_facts,
    _graph_outputs,
    _GraphFacts,
    _permutable_axes,
    _recompute_flags,
    _roles,
    _saved_sharing,
    captured_ops,
    op_settings,
)
from objectives.fixed_costs import collective_setup_s
from objectives.intra_op import (
    bucketed_grad_sync_s,
    grad_bucket_bytes,
    grad_sync_terms,
    hidden_under_backward,
    intra_op_terms,
    overlapped_zero_sync_s,
    reductions_overlap_backward,
    price_terms,
    zero_sync_split,
)
from objectives.memory import MemoryArrays, op_memory_bytes, state_bytes_per_parameter
from objectives.parameters import ParameterView
from objectives.pase import PaseParams, pase_config_mask, pase_edge_cost, pase_node_cost
from objectives.redistribution import redistribution_time_s
from objectives.sequence_split import sequence_split_table
from objectives.tp_overlap import (
    EVERY_COLLECTIVE,
    is_tp_gemm,
    micro_pipelined_collectives,
    overlapped_edge,
    overlapped_terms,
)
from planner.core.cluster import Cluster
from planner.core.configs import ConfigOptions, ConfigSpace, batch_products, enumerate_configs
from planner.core.errors import InputError
from planner.core.graph import Op, OpGraph
from planner.core.settings import CostModelName, TrainingSettings
from planner.core.tables import CostTables, EdgeCost

__all__ = [
    "launcher_options",
    "CostModelName",
    "OpCostDetail",
    "EdgePart",
    "EdgeCostDetail",
    "OpRow",
    "EdgeRow",
    "Evaluation",
    "CostModel",
    "build_cost_model",
    "build_cost_tables",
    "with_edges",
    "chosen_edges",
    "evaluate_choice",
]


# --------------------------------------------------------------------------------------------
# building


def launcher_options(options: ConfigOptions) -> ConfigOptions:
    """The configuration options of the realistic cost models (``roofline``, ``measured``).

    Launchers run cheap ops redundantly on every rank of a group, and split a vocabulary that tp
    does not divide by padding it, as Megatron-LM does (:class:`~planner.core.configs.ConfigOptions`
    ``replicate`` and ``pad``); PaSE's model has neither.
    """
    return dataclasses.replace(options, replicate=True, pad=True)


def _check_options(cluster: Cluster, options: ConfigOptions) -> None:
    if options.devices != cluster.devices:
        raise InputError(
            f"configurations are for {options.devices} devices but the cluster has {cluster.devices}; "
            "build both from the same --devices"
        )
    if options.intra_devices != min(cluster.devices, cluster.devices_per_node):
        raise InputError(
            f"configurations assume {options.devices_per_node} devices per node but the cluster has "
            f"{cluster.devices_per_node}; build both from the same --devices-per-node"
        )


def _level_sum(parts: Mapping[tuple[str, str], np.ndarray], size: int) -> np.ndarray:
    total = np.zeros(size)
    for array in parts.values():
        total = total + array
    return total


def _roofline_detail(
    graph: OpGraph,
    op: Op,
    space: ConfigSpace,
    *,
    cluster: Cluster,
    settings: TrainingSettings,
    measured: MeasuredFn | None,
    owned: tuple[int, ...],
    recomputed: bool,
    external: tuple[int, ...],
    execution: ExecutionModel | None = None,
    role: str | None = None,
    working_set: bool = False,
    graph_output: bool = False,
    saved: tuple = (None, ()),
    flash_shape: FlashShape | None = None,
) -> OpCostDetail:
    tensors = ParameterView(graph)
    times = op_compute_time_s(op, space, tensors=tensors, device=cluster.device, settings=settings, measured=measured,
                              execution=execution, role=role, owned_inputs=owned, graph_output=graph_output,
                              flash_shape=flash_shape)
    recompute = times.forward_s if recomputed else np.zeros(space.size)
    compute = times.total_s + recompute  # forward + backward (+ the optimizer step under an execution model)
    # under an execution model a collective inside a node is priced as NCCL prices it (algorithm,
    # protocol, message size: objectives.fixed_costs), plus the call's fixed setup below
    comm = price_terms(intra_op_terms(op, space, tensors=tensors, settings=settings), cluster=cluster, size=space.size,
                       nccl=execution is not None)
    if execution is not None:  # each collective call also pays a fixed setup (Device.collective_overhead_s), not in a CUDA graph
        setup = collective_setup_s(cluster.device, cuda_graphs=settings.cuda_graphs)
        comm = {key: array + setup * (array > 0) for key, array in comm.items()}
    if execution is not None and settings.tp_comm_overlap and is_tp_gemm(op, tensors):
        # Transformer Engine's userbuffers, or torch's micro-pipelined async TP, hide a linear layer's
        # tensor-parallel collectives under its GEMMs (the latter those inductor's pass matches)
        layer = EVERY_COLLECTIVE if settings.tp_overlap_method == "userbuffers" else micro_pipelined_collectives(
            graph, fp8=settings.fp8 is not None)[op.name]
        comm = overlapped_terms(comm, intra_op_terms(op, space, tensors=tensors, settings=settings),
                                forward_s=times.forward_s, backward_s=times.backward_s,
                                method=settings.tp_overlap_method, layer=layer)
    sync_terms = grad_sync_terms(op, space, tensors=tensors, settings=settings, owned_inputs=owned,
                                 recomputed=recomputed, graph_output=graph_output)
    unhidden = None
    if execution is not None:  # a launcher buckets gradients and (settings.overlap) overlaps their sync with backward
        bucket = grad_bucket_bytes(sync_terms, settings)
        unhidden = bucketed_grad_sync_s(sync_terms, cluster=cluster, size=space.size, bucket_bytes=bucket)
        if not settings.overlap:
            sync = dict(unhidden)
        elif settings.zero_stage in (1, 2):  # the parameter all-gather beside forward (--overlap-param-gather), or not
            split = zero_sync_split(sync_terms, cluster=cluster, size=space.size, bucket_bytes=bucket)
            reductions, gathers = overlapped_zero_sync_s(split, forward_s=times.forward_s, backward_s=times.backward_s,
                                                         rule=settings.zero_sync)  # None: Megatron-LM's
            sync = {level: reductions.get(level, 0.0) + gathers.get(level, 0.0) for level in {**reductions, **gathers}}
        elif not reductions_overlap_backward(settings):  # a launcher's all-reduce after the backward (DeepSpeed's ZeRO-0)
            sync = dict(unhidden)
        else:
            sync = hidden_under_backward(unhidden, backward_s=times.backward_s)
    else:
        sync = {level: array for (_, level), array in price_terms(sync_terms, cluster=cluster, size=space.size).items()}
    memory = op_memory_bytes(
        op, space, tensors=tensors, settings=settings, owned_inputs=owned, recomputed=recomputed and not working_set,
        external_inputs=external, execution=execution, role=role, graph_output=graph_output,
        dtypes=saved[0], shared=saved[1], sac_saved=len(saved) > 2 and bool(saved[2]),
    )
    time = compute + _level_sum(comm, space.size) + sum(sync.values(), np.zeros(space.size))
    return OpCostDetail(
        compute_s=compute,
        recompute_s=recompute,
        comm_s=comm,
        grad_sync_s=sync,
        memory=memory,
        time_s=time,
        memory_bytes=memory.total_bytes,
        measured=times.measured,
        fallbacks=times.fallbacks,
        forward_s=times.forward_s,
        optimizer_s=times.optimizer_s,
        grad_sync_unhidden_s=unhidden,
    )


def _recomputed_detail(
    graph: OpGraph, op: Op, space: ConfigSpace, donor: OpCostDetail, *, settings: TrainingSettings,
    owned: tuple[int, ...], external: tuple[int, ...], role: str | None = None, working_set: bool = False,
    graph_output: bool = False, saved: tuple = (None, ()),
) -> OpCostDetail:
    """:func:`_roofline_detail` of a recomputed op from the same op's detail without recomputation:
    recomputation adds one forward pass and changes which activations are kept; compute time,
    communication and gradient synchronisation are the donor's (same sums, same numbers)."""
    assert donor.forward_s is not None
    recompute = donor.forward_s
    compute = donor.compute_s + recompute  # the donor's compute_s is forward + backward (+ 0)
    memory = op_memory_bytes(
        op, space, tensors=ParameterView(graph), settings=settings, owned_inputs=owned, recomputed=not working_set,
        external_inputs=external, execution=execution_of(settings), role=role, graph_output=graph_output,
        dtypes=saved[0], shared=saved[1], sac_saved=len(saved) > 2 and bool(saved[2]),
    )
    time = compute + _level_sum(donor.comm_s, space.size) + sum(donor.grad_sync_s.values(), np.zeros(space.size))
    return dataclasses.replace(
        donor, compute_s=compute, recompute_s=recompute, memory=memory, time_s=time, memory_bytes=memory.total_bytes
    )


def _pase_detail(graph: OpGraph, op: Op, space: ConfigSpace, *, settings: TrainingSettings, params: PaseParams,
                 owned: tuple[int, ...]) -> OpCostDetail:
    tensors = ParameterView(graph)
    cost = pase_node_cost(op, space, tensors=tensors, params=params)
    param_bytes = np.zeros(space.size)
    per_param = state_bytes_per_parameter(settings).param
    for position in owned:
        access = op.inputs[position]
        param_bytes += shard_elements(space, op, access, tensors[access.tensor].shape) * per_param
    zeros = np.zeros(space.size)
    memory = MemoryArrays(
        params_bytes=param_bytes, grads_bytes=zeros, optimizer_bytes=zeros, activations_bytes=zeros, other_bytes=zeros
    )
    return OpCostDetail(
        compute_s=cost.compute,
        recompute_s=zeros,
        comm_s={("pase_comm", "intra"): cost.comm},
        grad_sync_s={"intra": cost.grad_sync},
        memory=memory,
        time_s=cost.total,
        memory_bytes=memory.total_bytes,
    )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _BuildPlan:
    """Which ops and edges of a graph share work in one build (cached per graph and setting)."""

    space_of: tuple[int, ...] = ()
    """Per op, its configuration space's class (ops of one class get one space)."""
    space_first: tuple[int, ...] = ()
    """The first op of each space class (its space is enumerated)."""
    group_of: tuple[int, ...]
    """Per op, its cost group: ops of one group share one :class:`OpCostDetail`."""
    group_first: tuple[int, ...]
    group_sizes: tuple[int, ...]
    edge_first: tuple[int, ...] = ()
    """Index into ``_GraphFacts.edges`` of the first edge of each distinct redistribution table."""
    sum_keys: tuple[tuple[tuple[int, bool], ...], ...] = ()
    """Per distinct op-pair table: its edge tables (class, transposed) in order."""
    pairs: tuple[tuple, ...] = ()
    """``((u, v), parts, tensor names, pair-table class)`` per op pair, in first-edge order."""


def _op_groups(
    graph: OpGraph, facts: _GraphFacts, cost_model: str, space_of: Sequence[int], recomputed, externals,
    working_set: bool = False, saved: Sequence[tuple] | None = None, captured: Sequence[bool] = (),
) -> _BuildPlan:
    measured = cost_model == "measured"
    roles, first = _roles(graph, facts), _first_instance(graph, facts)
    saved = saved or ((None, ()),) * len(graph.ops)
    captured = captured or (False,) * len(graph.ops)  # inside a CUDA graph or not (per-layer graphs: both kinds)
    group_of = _classes(
        (space_of[i], facts.op_class[i], recomputed[i], externals[i], facts.node_class[i] if measured else None,
         roles[i], working_set and recomputed[i] and first[i], _graph_outputs(graph, facts)[i], saved[i], captured[i])
        for i in range(len(graph.ops))
    )
    first: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for index, group in enumerate(group_of):
        first.setdefault(group, index)
        sizes[group] = sizes.get(group, 0) + 1
    return _BuildPlan(
        space_of=tuple(space_of), group_of=group_of, group_first=tuple(first.values()),
        group_sizes=tuple(sizes[g] for g in first),
    )


def _reused_groups(
    graph: OpGraph, facts: _GraphFacts, cost_model: str, space_of: tuple[int, ...], recomputed, externals,
    working_set: bool, saved: Sequence[tuple], captured: tuple[bool, ...] = (),
) -> _BuildPlan:
    """:func:`_op_groups` of a build that reuses another model's spaces, kept in ``facts`` (a search
    builds thousands of such models of one graph, all grouped alike). ``externals`` and ``saved``
    are the graph's memoised tuples (:func:`_recompute_flags`, :func:`_saved_sharing`), so they are
    keyed by identity and held by the entry, which keeps their ids theirs."""
    key = ("reused groups", cost_model, space_of, tuple(recomputed), id(externals), working_set, id(saved), captured)
    entry = facts.memo.get(key)
    if entry is None or entry[0] is not externals or entry[1] is not saved:
        groups = _op_groups(graph, facts, cost_model, space_of, recomputed, externals, working_set, saved, captured)
        entry = facts.memo[key] = (externals, saved, groups)
    return entry[2]


def _build_plan(graph: OpGraph, facts: _GraphFacts, cost_model: str, settings: TrainingSettings,
                recomputed, externals) -> _BuildPlan:
    """The sharing of a fresh build: the same for every cluster, so cached in ``facts``."""
    working_set = execution_of(settings) is not None
    # the execution model decides which saved tensors are shared (objectives.autocast), so the groups
    captured = captured_ops(graph, settings)  # per-layer CUDA graphs: an op inside a layer is priced apart
    cache_key = ("plan", cost_model, settings.recompute, settings.precision, settings.autocast, execution_of(settings),
                 captured)
    if cache_key in facts.memo:
        return facts.memo[cache_key]
    if cost_model == "pase":
        space_of = _classes((op.dims, op.kind, op.op_type) for op in graph.ops)
    else:
        space_of = _classes((op.dims,) for op in graph.ops)
    space_first: dict[int, int] = {}
    for index, cls in enumerate(space_of):
        space_first.setdefault(cls, index)
    groups = _op_groups(graph, facts, cost_model, space_of, recomputed, externals, working_set,
                        _saved_sharing(graph, facts, settings, cost_model, recomputed, externals), captured)
    edge_class: dict[tuple, int] = {}
    edge_first: list[int] = []
    grouped: dict[tuple[int, int], list[tuple[EdgePart, int]]] = {}
    for number, (u, v, tensor, access_u, access_v, part, pair) in enumerate(facts.edges):
        key = (space_of[u], space_of[v], access_u.axes, access_v.axes, tensor.shape, element_bytes(tensor, settings),
               captured[u], captured[v])
        cls = edge_class.get(key)
        if cls is None:
            cls = edge_class[key] = len(edge_first)
            edge_first.append(number)
        grouped.setdefault(pair, []).append((part, cls))
    sum_class: dict[tuple, int] = {}
    pairs = []
    for (u, v), parts in grouped.items():
        keys = tuple((k, part.producer > part.consumer) for part, k in parts)
        number = sum_class.setdefault(keys, len(sum_class))
        pairs.append(((u, v), tuple(part for part, _ in parts), tuple(part.tensor for part, _ in parts), number))
    plan = dataclasses.replace(
        groups,
        space_first=tuple(space_first.values()),
        edge_first=tuple(edge_first),
        sum_keys=tuple(sum_class),
        pairs=tuple(pairs),
    )
    facts.memo[cache_key] = plan
    return plan


def _enumerate_spaces(graph: OpGraph, space_first, space_of, options: ConfigOptions, cost_model: str) -> list[ConfigSpace]:
    spaces = []
    for index in space_first:
        op = graph.ops[index]
        space = enumerate_configs(op, options)
        if cost_model == "pase":
            keep = pase_config_mask(op, space)
            space = space.subset(keep)
        spaces.append(space)
    return [spaces[cls] for cls in space_of]


def _price_edges(
    graph: OpGraph, facts: _GraphFacts, plan: _BuildPlan, op_spaces: Sequence[ConfigSpace], cluster: Cluster,
    settings: TrainingSettings, cost_model: str, params: PaseParams | None,
    op_details: Sequence[OpCostDetail] = (),
) -> tuple[list[EdgeCost], list[EdgeCostDetail]]:
    """Every op pair's redistribution table (one per distinct pair table of ``plan``, shared)."""
    tensors = ParameterView(graph)
    edge_arrays = [_edge_table(graph, facts, number, op_spaces, cluster, settings, cost_model, params, tensors)
                   for number in plan.edge_first]
    sums = []
    for keys in plan.sum_keys:
        combined = None
        for k, transposed in keys:
            array = edge_arrays[k].T if transposed else edge_arrays[k]
            combined = array if combined is None else combined + array
        sums.append(combined)
    edge_costs: list[EdgeCost] = []
    edge_details: list[EdgeCostDetail] = []
    overlap = _EdgeOverlap.of(graph, op_spaces, settings, cost_model, op_details)
    for (u, v), parts, tensor_names, sum_class in plan.pairs:
        combined = sums[sum_class] if overlap is None else overlap.table(sums[sum_class], sum_class, u, v)
        edge_costs.append(EdgeCost(u=u, v=v, time_s=combined))
        edge_details.append(EdgeCostDetail(u=u, v=v, tensors=tensor_names, time_s=combined, parts=parts))
    return edge_costs, edge_details


def _edge_table(
    graph: OpGraph, facts: _GraphFacts, number: int, op_spaces: Sequence[ConfigSpace], cluster: Cluster,
    settings: TrainingSettings, cost_model: str, params: PaseParams | None, tensors: ParameterView,
    rows: np.ndarray | None = None, cols: np.ndarray | None = None,
) -> np.ndarray:
    """The redistribution table of ``facts.edges[number]`` (one tensor, producer's configurations by
    consumer's); ``rows``, ``cols``: at those configurations only (``None``: all; not under PaSE)."""
    u, v, tensor, access_u, access_v, _, _ = facts.edges[number]
    common = dict(
        producer=graph.ops[u], producer_space=op_spaces[u], producer_access=access_u,
        consumer=graph.ops[v], consumer_space=op_spaces[v], consumer_access=access_v,
    )
    if cost_model == "pase":
        assert params is not None and rows is None and cols is None
        return pase_edge_cost(tensor.shape, params=params, **common)
    free = _permutable_axes(graph, graph.ops[u], access_u)
    table = redistribution_time_s(
        tensor.shape, element_bytes(tensor, settings), cluster=cluster, free_axes=free, rows=rows, cols=cols, **common
    )
    # a partial sum feeding a sequence-split consumer runs as reduce-scatter + all-gather
    captured = captured_ops(graph, settings)  # each side's collective inside a CUDA graph or not
    return sequence_split_table(
        table, tensor.shape, tensor=tensor, cluster=cluster, tensors=tensors, settings=settings,
        nccl=execution_of(settings) is not None, free_axes=free, rows=rows, cols=cols, captured=(captured[u], captured[v]),
        **common,
    )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _EdgeOverlap:
    """The redistribution tables next to linear layers, overlapped with their GEMMs under
    ``TrainingSettings.tp_comm_overlap`` (:func:`objectives.tp_overlap.overlapped_edge`); one table per
    (pair table, consumer's and producer's cost group), so layers still share theirs."""

    into: tuple[bool, ...]
    """Per op, whether the gather into it runs under its forward GEMM (``LayerOverlap.forward_gather``)."""
    out_of: tuple[bool, ...]
    """Per op, whether the gather of its output's gradient runs under its backward (``backward_gather``)."""
    details: Sequence[OpCostDetail]
    chunks: tuple[np.ndarray, ...]
    """Per op, ``(K,)`` its tensor-parallel degree (the product of its non-batch splits)."""
    method: str = "userbuffers"
    """``TrainingSettings.tp_overlap_method``."""
    cache: dict = dataclasses.field(default_factory=dict)

    @staticmethod
    def of(graph: OpGraph, spaces: Sequence[ConfigSpace], settings: TrainingSettings, cost_model: str,
           details: Sequence[OpCostDetail]) -> "_EdgeOverlap | None":
        """``None`` where nothing is overlapped: the setting off, PaSE, or no execution model."""
        if not settings.tp_comm_overlap or cost_model == "pase" or execution_of(settings) is None or not details:
            return None
        tensors = ParameterView(graph)
        if settings.tp_overlap_method == "userbuffers":
            into = out_of = tuple(is_tp_gemm(op, tensors) for op in graph.ops)
        else:
            layers = micro_pipelined_collectives(graph, fp8=settings.fp8 is not None)
            into = tuple(layers[op.name].forward_gather for op in graph.ops)
            out_of = tuple(layers[op.name].backward_gather for op in graph.ops)
        return _EdgeOverlap(into=into, out_of=out_of, details=details, method=settings.tp_overlap_method,
                            chunks=tuple(batch_products(op, space)[1] for op, space in zip(graph.ops, spaces)))

    def _sides(self, u: int, v: int, one_u: slice, one_v: slice) -> dict:
        """:func:`~objectives.tp_overlap.overlapped_edge`'s sides of the pair ``(u, v)`` at the producer's
        configurations ``one_u`` and the consumer's ``one_v``: into a GEMM first, else out of one."""
        du, dv = self.details[u], self.details[v]
        if self.into[v] and dv.forward_s is not None:
            return dict(consumer=(dv.forward_s[one_v], self.chunks[v][one_v]), producer_backward_s=None)
        if self.out_of[u] and du.forward_s is not None:
            backward = du.compute_s - du.recompute_s - du.forward_s - (du.optimizer_s if du.optimizer_s is not None else 0.0)
            return dict(consumer=None, producer_backward_s=backward[one_u], producer_chunks=self.chunks[u][one_u])
        return dict(consumer=None, producer_backward_s=None)

    def table(self, time_s: np.ndarray, sum_class: int, u: int, v: int) -> np.ndarray:
        """The pair ``(u, v)``'s table overlapped with its consumer's or producer's GEMM."""
        du, dv = self.details[u], self.details[v]
        key = (sum_class, id(du) if self.out_of[u] else None, id(dv) if self.into[v] else None)
        if key not in self.cache:
            every = slice(None)
            self.cache[key] = overlapped_edge(time_s, method=self.method, **self._sides(u, v, every, every))
        return self.cache[key]

    def entry(self, seconds: float, u: int, v: int, cu: int, cv: int) -> float:
        """:meth:`table`'s entry ``[cu, cv]`` of the pair ``(u, v)`` whose plain table holds ``seconds`` there."""
        sides = self._sides(u, v, slice(cu, cu + 1), slice(cv, cv + 1))
        return float(overlapped_edge(np.array([[seconds]]), method=self.method, **sides)[0, 0])


def with_edges(model: CostModel) -> CostModel:
    """``model`` with its redistribution tables priced, for a model built with ``price_edges=False``
    (the same tables a build with them gives); a model that has them is returned as is."""
    if model.edges_priced:
        return model
    graph = model.graph
    facts = _graph_facts(graph)
    recomputed, externals = _recompute_flags(graph, facts, model.settings.recompute)
    plan = _build_plan(graph, facts, model.cost_model, model.settings, recomputed, externals)
    edge_costs, edge_details = _price_edges(
        graph, facts, plan, model.tables.configs, model.cluster, model.settings, model.cost_model, None,
        model.op_details,
    )
    return dataclasses.replace(
        model,
        tables=dataclasses.replace(model.tables, edges=tuple(edge_costs)),
        edge_details=tuple(edge_details),
        distinct_edges=len(plan.edge_first),
        edges_priced=True,
    )


def _build_options(
    cluster: Cluster, config_options: ConfigOptions, cost_model: str, measured: MeasuredFn | None,
    pase_params: PaseParams | None,
) -> tuple[ConfigOptions, PaseParams | None]:
    """The configuration options a build enumerates (PaSE's one-level ``at_most`` rule, or the
    launchers' options checked against the cluster) and PaSE's constants (``None`` for the others)."""
    if cost_model not in ("roofline", "measured", "pase"):
        raise InputError(f"unknown cost model '{cost_model}'; use roofline, measured or pase")
    if cost_model == "measured" and measured is None:
        raise InputError("the measured cost model needs per-op timings; run `planner profile` first")
    if cost_model == "pase":
        config_options = dataclasses.replace(
            config_options, product_rule="at_most", devices_per_node=config_options.devices
        )
        return config_options, pase_params or PaseParams()
    _check_options(cluster, config_options)
    return launcher_options(config_options), None


def _price_groups(
    graph: OpGraph, facts: _GraphFacts, plan: _BuildPlan, op_spaces: Sequence[ConfigSpace], *, cluster: Cluster,
    settings: TrainingSettings, cost_model: str, measured: MeasuredFn | None, params: PaseParams | None,
    recomputed, externals, donor, reuse: CostModel | None,
) -> list[OpCostDetail]:
    """One :class:`OpCostDetail` per cost group of ``plan`` (priced on its first op): taken from the
    ``donor`` (the reused model's recompute flags) where the op is recomputed alike, its forward
    reused where only this build recomputes it, else priced by PaSE's or the roofline model."""
    owned = facts.owned
    group_details: list[OpCostDetail] = []
    execution = execution_of(settings) if cost_model != "pase" else None
    roles, first, outputs = _roles(graph, facts), _first_instance(graph, facts), _graph_outputs(graph, facts)
    saved = _saved_sharing(graph, facts, settings, cost_model, recomputed, externals)
    for index in plan.group_first:
        op, space = graph.ops[index], op_spaces[index]
        priced = op_settings(graph, settings, index)  # outside per-layer CUDA graphs: launched kernel by kernel
        working_set = execution is not None and recomputed[index] and first[index]
        if (
            donor is not None and donor[0][index] == recomputed[index] and donor[1][index] == externals[index]
            and donor[2][index] == saved[index]
        ):
            detail = reuse.op_details[index]
        elif (
            # recomputed here only: the donor's detail plus one forward pass. An op recomputed in neither
            # build but kept otherwise (one that op-level SAC saves, recompute "op" from "none") is priced
            # afresh below: it runs no second forward. ZeRO-3's gathers depend on recomputation (DeepSpeed's rule
            # gathers a recomputed op once more, the FSDP launchers' do not), so ZeRO-3 ops are priced afresh too
            donor is not None and recomputed[index] and not donor[0][index]
            and reuse.op_details[index].forward_s is not None and settings.zero_stage < 3
        ):
            detail = _recomputed_detail(
                graph, op, space, reuse.op_details[index], settings=priced, owned=owned[index],
                external=externals[index], role=roles[index], working_set=working_set,
                graph_output=outputs[index], saved=saved[index],
            )
        elif cost_model == "pase":
            detail = _pase_detail(graph, op, space, settings=settings, params=params, owned=owned[index])
        else:
            detail = _roofline_detail(
                graph, op, space, cluster=cluster, settings=priced,
                measured=measured if cost_model == "measured" else None,
                owned=owned[index], recomputed=recomputed[index], external=externals[index],
                execution=execution, role=roles[index], working_set=working_set, graph_output=outputs[index],
                saved=saved[index], flash_shape=facts.flash_shapes[index],
            )
        group_details.append(detail)
    return group_details


@dataclass(frozen=True, slots=True, kw_only=True)
class _RecomputeState:
    """What recomputation means for one build (:func:`_recompute_state`)."""

    recomputed: tuple[bool, ...]
    """Per op: recomputed in backward (never under PaSE)."""
    externals: tuple
    """Per op: its checkpoint inputs (``()`` where not recomputed)."""
    donor: tuple | None
    """The reused model's own ``(recomputed, externals, saved sharing)`` when only the recomputation differs
    (the ops recomputed alike keep their priced arrays), else ``None``."""


def _recompute_state(
    graph: OpGraph, facts: _GraphFacts, settings: TrainingSettings, cost_model: str, reuse: CostModel | None
) -> _RecomputeState:
    """Which ops the build recomputes, what they read, and the donor of a reusing build."""
    if cost_model == "pase":
        recomputed, externals = (False,) * len(graph.ops), ((),) * len(graph.ops)
    else:
        recomputed, externals = _recompute_flags(graph, facts, settings.recompute)
    # The recompute variants of one model differ only in the ops they recompute: the others' arrays
    # are the reused model's own (same inputs, same numbers), so only those are priced again.
    donor = None
    if (
        reuse is not None
        and cost_model == "roofline"
        and dataclasses.replace(reuse.settings, recompute=settings.recompute) == settings
    ):
        flags = _recompute_flags(graph, facts, reuse.settings.recompute)
        donor = (*flags, _saved_sharing(graph, facts, reuse.settings, cost_model, *flags))
    return _RecomputeState(recomputed=recomputed, externals=externals, donor=donor)


def chosen_edges(model: CostModel, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(producers, consumers, seconds)``, ``(E,)`` each: every op pair ``(u, v)`` of ``with_edges(model).tables.edges``,
    in its order, and its redistribution at ``picks`` (a configuration per op), ``time_s[picks[u], picks[v]]``
    to the bit, priced at those configurations only. A plan whose choice is fixed before it is priced (pure data
    parallelism, :func:`planner.estimate.estimate`) reads one cell of each table; the whole tables of a
    3,072-device stage model were a third of a 1T plan's CPU (issue 22, ninth round)."""
    picks = np.asarray(picks, dtype=np.int64)
    if model.edges_priced:  # PaSE's always: its tables come with the build
        edges = model.tables.edges
        return (np.array([e.u for e in edges], dtype=np.int64), np.array([e.v for e in edges], dtype=np.int64),
                np.array([e.time_s[picks[e.u], picks[e.v]] for e in edges], dtype=np.float64))
    graph = model.graph
    facts = _graph_facts(graph)
    recomputed, externals = _recompute_flags(graph, facts, model.settings.recompute)
    plan = _build_plan(graph, facts, model.cost_model, model.settings, recomputed, externals)

    def cell(u: int, v: int, transposed: bool) -> tuple[int, int]:
        return (int(picks[v]), int(picks[u])) if transposed else (int(picks[u]), int(picks[v]))

    wanted: dict[int, set[tuple[int, int]]] = {}  # per distinct table, the (producer, consumer) cells read
    for (u, v), _parts, _names, sum_class in plan.pairs:
        for k, transposed in plan.sum_keys[sum_class]:
            wanted.setdefault(k, set()).add(cell(u, v, transposed))
    tensors, values = ParameterView(graph), {}
    for k, cells in wanted.items():
        rows, cols = np.unique([r for r, _ in cells]), np.unique([c for _, c in cells])
        table = _edge_table(graph, facts, plan.edge_first[k], model.tables.configs, model.cluster, model.settings,
                            model.cost_model, None, tensors, rows=rows, cols=cols)
        for r, c in cells:
            values[k, r, c] = table[np.searchsorted(rows, r), np.searchsorted(cols, c)]
    overlap = _EdgeOverlap.of(graph, model.tables.configs, model.settings, model.cost_model, model.op_details)
    out = np.empty(len(plan.pairs))
    for e, ((u, v), _parts, _names, sum_class) in enumerate(plan.pairs):
        combined = None
        for k, transposed in plan.sum_keys[sum_class]:  # summed in the order the tables are (float rounding)
            value = values[(k, *cell(u, v, transposed))]
            combined = value if combined is None else combined + value
        out[e] = combined if overlap is None else overlap.entry(combined, u, v, int(picks[u]), int(picks[v]))
    return (np.array([u for (u, _v), *_ in plan.pairs], dtype=np.int64),
            np.array([v for (_u, v), *_ in plan.pairs], dtype=np.int64), out)


@dataclass(frozen=True, slots=True, kw_only=True)
class _PricedEdges:
    """A build's redistribution tables: priced, reused from another model, or left out."""

    costs: list[EdgeCost]
    details: list[EdgeCostDetail]
    priced: bool
    """``False``: left out (``price_edges=False``), for :func:`with_edges` to add."""
    distinct: int
    """Distinct redistribution tables priced (the rest shared)."""


def _build_edges(
    graph: OpGraph, facts: _GraphFacts, plan: _BuildPlan, op_spaces: Sequence[ConfigSpace], *, cluster: Cluster,
    settings: TrainingSettings, cost_model: str, params: PaseParams | None, reuse: CostModel | None,
    price_edges: bool, op_details: Sequence[OpCostDetail] = (),
) -> _PricedEdges:
    """The build's redistribution tables: the reused model's (they do not depend on ZeRO or
    recomputation), priced now, or left out (``price_edges=False``)."""
    if reuse is not None:
        return _PricedEdges(costs=list(reuse.tables.edges), details=list(reuse.edge_details),
                            priced=reuse.edges_priced, distinct=reuse.distinct_edges)
    if price_edges:
        costs, details = _price_edges(graph, facts, plan, op_spaces, cluster, settings, cost_model, params, op_details)
        return _PricedEdges(costs=costs, details=details, priced=True, distinct=len(plan.edge_first))
    return _PricedEdges(costs=[], details=[], priced=False, distinct=0)


def _check_reuse(
    reuse: CostModel | None, graph: OpGraph, cluster: Cluster, config_options: ConfigOptions, cost_model: str,
    settings: TrainingSettings,
) -> None:
    """A reused model must share everything its spaces and edges depend on (a caller's bug otherwise)."""
    if reuse is not None and (
        reuse.graph is not graph
        or reuse.cluster != cluster
        or reuse.config_options != config_options
        or reuse.cost_model != cost_model
        or reuse.settings.precision != settings.precision
        or reuse.settings.autocast != settings.autocast  # operand dtypes and eager traffic
        or reuse.settings.tp_comm_overlap != settings.tp_comm_overlap  # edges overlapped with the GEMMs or not
        or reuse.settings.tp_overlap_method != settings.tp_overlap_method  # and how
    ):
        raise ValueError("reuse needs a model of the same graph, cluster, options, cost model and precision")


def build_cost_model(
    graph: OpGraph,
    *,
    cluster: Cluster,
    settings: TrainingSettings,
    config_options: ConfigOptions,
    cost_model: CostModelName = "roofline",
    measured: MeasuredFn | None = None,
    pase_params: PaseParams | None = None,
    reuse: CostModel | None = None,
    price_edges: bool = True,
) -> CostModel:
    """Price every op and edge of ``graph`` under every configuration: its :class:`CostModel`.

    Parameters
    ----------
    cluster:
        Devices and links; must match ``config_options`` (devices, devices per node).
    settings:
        Precision, optimizer, ZeRO stage, recomputation.
    config_options:
        Which configurations each op gets. Under ``cost_model="pase"`` it is replaced by PaSE's rule
        on one level (``product_rule="at_most"``, ``min_tile`` kept as the cutoff).
    cost_model:
        ``roofline`` (analytic compute), ``measured`` (``measured`` callable, roofline fallback,
        fallbacks counted), or ``pase`` (PaSE's FLOP-equivalent cost function).
    measured:
        ``(op, factors) -> forward seconds | None``; required for ``cost_model="measured"``.
    pase_params:
        PaSE's machine constants (default: the reference code's).
    reuse:
        A model of the same graph, cluster, configuration options, cost model and precision (built
        with other ZeRO / recompute settings): its configuration spaces and edge tables, which do
        not depend on those settings, are taken as they are and only per-op costs are priced again.
    price_edges:
        ``False``: leave the redistribution tables out (``tables.edges`` empty, ``edges_priced``
        false), for callers that need per-op costs only (lower bounds); :func:`with_edges` adds
        them later. A model built with ``reuse`` has the edges of the model it reuses. Not with
        ``cost_model="pase"``.

    Raises
    ------
    InputError
        Options that do not match the cluster; ``measured`` model without a callable.
    """
    config_options, params = _build_options(cluster, config_options, cost_model, measured, pase_params)
    _check_reuse(reuse, graph, cluster, config_options, cost_model, settings)
    if not price_edges and cost_model == "pase":
        raise ValueError("the PaSE cost model prices its edges with the build (price_edges=False is not supported)")
    facts = _graph_facts(graph)
    state = _recompute_state(graph, facts, settings, cost_model, reuse)
    recomputed, externals = state.recomputed, state.externals
    if reuse is None:
        plan = _build_plan(graph, facts, cost_model, settings, recomputed, externals)
        op_spaces = _enumerate_spaces(graph, plan.space_first, plan.space_of, config_options, cost_model)
    else:
        op_spaces = list(reuse.tables.configs)
        plan = _reused_groups(graph, facts, cost_model, _classes(id(space) for space in op_spaces), recomputed,
                              externals, execution_of(settings) is not None,
                              _saved_sharing(graph, facts, settings, cost_model, recomputed, externals),
                              captured_ops(graph, settings))
    group_details = _price_groups(
        graph, facts, plan, op_spaces, cluster=cluster, settings=settings, cost_model=cost_model, measured=measured,
        params=params, recomputed=recomputed, externals=externals, donor=state.donor, reuse=reuse,
    )
    op_details = [group_details[g] for g in plan.group_of]
    measured_configs = sum(d.measured * n for d, n in zip(group_details, plan.group_sizes))
    fallback_configs = sum(d.fallbacks * n for d, n in zip(group_details, plan.group_sizes))

    edges = _build_edges(graph, facts, plan, op_spaces, cluster=cluster, settings=settings, cost_model=cost_model,
                         params=params, reuse=reuse, price_edges=price_edges, op_details=op_details)
    tables = CostTables(
        configs=tuple(op_spaces),
        node_time_s=tuple(d.time_s for d in op_details),
        node_memory_bytes=tuple(d.memory_bytes for d in op_details),
        edges=tuple(edges.costs),
        blocks=graph.blocks,
    )
    notes = []
    if settings.recompute == "full" and not graph.blocks and cost_model != "pase":
        notes.append("full recomputation applies to repeated blocks and this graph has none: nothing is recomputed")
    return CostModel(
        graph=graph,
        cluster=cluster,
        settings=settings,
        config_options=config_options,
        cost_model=cost_model,
        tables=tables,
        op_details=tuple(op_details),
        edge_details=tuple(edges.details),
        time_unit="flop-equivalents" if cost_model == "pase" else "s",
        measured_configs=measured_configs,
        fallback_configs=fallback_configs,
        distinct_ops=len(plan.group_first),
        distinct_edges=edges.distinct,
        notes=tuple(notes),
        edges_priced=edges.priced,
    )


def build_cost_tables(
    graph: OpGraph,
    *,
    cluster: Cluster,
    settings: TrainingSettings,
    config_options: ConfigOptions,
    cost_model: CostModelName = "roofline",
    measured: MeasuredFn | None = None,
    pase_params: PaseParams | None = None,
) -> CostTables:
    """The search tables of ``graph``: ``build_cost_model(...).tables`` (same parameters)."""
    return build_cost_model(
        graph, cluster=cluster, settings=settings, config_options=config_options, cost_model=cost_model,
        measured=measured, pase_params=pase_params,
    ).tables

