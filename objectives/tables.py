r"""Cost tables of a whole graph: the search problem, and the breakdown of any one choice.

:func:`build_cost_model` turns an :class:`~planner.core.graph.OpGraph` and a cluster into a
:class:`CostModel`; its ``.tables`` (:class:`~planner.core.tables.CostTables`) is what search
consumes, and ``.evaluate(choice)`` explains a choice term by term (:class:`Evaluation`).

Per op :math:`i` and configuration :math:`c` (time in seconds, memory in bytes per device):

.. math::

    t_i[c] = \underbrace{t^{fwd} + t^{bwd} (+ t^{fwd}_{recompute})}_{\text{objectives.compute}}
           + \underbrace{\textstyle\sum \text{intra-op terms}}_{\text{objectives.intra\_op}}
           + \underbrace{\textstyle\sum \text{gradient sync}}_{\text{objectives.intra\_op}}, \qquad
    m_i[c] = \text{objectives.memory}

and per edge :math:`(u, v)`: :math:`t_{uv}[c_u, c_v]` = the sum over the tensors flowing from
:math:`u` to :math:`v` of their forward + backward re-layout (:mod:`objectives.redistribution`).

Graph-level rules applied here:

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
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from objectives._common import element_bytes, is_parameter_name, shard_elements
from objectives.attention import attention_roles
from objectives.compute import MeasuredFn, op_compute_time_s
from objectives.execution import ExecutionModel, execution_of
from objectives.intra_op import (
    bucketed_grad_sync_s,
    grad_sync_terms,
    hidden_under_backward,
    intra_op_terms,
    price_terms,
)
from objectives.parameters import ParameterView, parameter_ownership
from objectives.autocast import autocast_applies, operand_dtypes, stored_dtypes
from objectives.memory import (
    MemoryArrays,
    kept_operands,
    op_memory_bytes,
    shared_saved_operands,
    state_bytes_per_parameter,
)
from objectives.pase import PaseParams, pase_config_mask, pase_edge_cost, pase_node_cost
from objectives.redistribution import redistribution, redistribution_time_s
from planner.core.cluster import Cluster
from planner.core.configs import ConfigOptions, ConfigSpace, enumerate_configs
from planner.core.errors import InputError
from planner.core.graph import Op, OpGraph
from planner.core.settings import TrainingSettings
from planner.core.strategy import MemoryBreakdown, Strategy, TimeBreakdown
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
    "evaluate_choice",
]

from planner.core.settings import CostModelName  # noqa: E402  (defined once, in core)

_COMM_KINDS = ("partial_sum", "input_grad", "norm_stats", "halo")


@dataclass(frozen=True, slots=True, kw_only=True)
class OpCostDetail:
    """Everything one op costs under each configuration (arrays ``(K,)``; shared between equal ops)."""

    compute_s: np.ndarray
    """Forward + backward (+ recompute) seconds."""
    recompute_s: np.ndarray
    """The recompute forward (included in ``compute_s``)."""
    comm_s: Mapping[tuple[str, str], np.ndarray]
    """Intra-op communication by ``(kind, level)``; kinds ``partial_sum``, ``input_grad``,
    ``norm_stats``, ``halo`` (``pase_comm`` under the PaSE model); levels ``intra``, ``inter``."""
    grad_sync_s: Mapping[str, np.ndarray]
    """Gradient synchronisation by level."""
    memory: MemoryArrays
    time_s: np.ndarray
    """The node table entry: compute + communication + gradient sync."""
    memory_bytes: np.ndarray
    """The node table entry: ``memory.total_bytes``."""
    measured: int = 0
    """Configurations timed by the ``measured`` callable."""
    fallbacks: int = 0
    """Configurations that fell back to the roofline."""
    forward_s: np.ndarray | None = None
    """The forward compute seconds alone (what recomputation repeats); ``None`` under the PaSE model."""
    optimizer_s: np.ndarray | None = None
    """The optimizer step over the op's parameters (included in ``compute_s``): once per step, not
    per micro-batch; ``None`` without an execution model."""
    grad_sync_unhidden_s: Mapping[str, np.ndarray] | None = None
    """Gradient synchronisation by level before overlap with backward (``grad_sync_s`` is what stays
    exposed); ``None`` without an execution model, where nothing is overlapped. ZeRO-3's parameter
    gathers, derived from it, run on the critical path of every micro-batch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgePart:
    """One tensor of an op pair: enough to re-price it for a single configuration pair."""

    tensor: str
    producer: int
    consumer: int
    producer_output: int
    consumer_input: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeCostDetail:
    """The redistribution of one op pair (``time_s`` is ``(K_u, K_v)``, shared between equal edges)."""

    u: int
    v: int
    tensors: tuple[str, ...]
    time_s: np.ndarray
    """Forward + backward seconds (the table entry)."""
    parts: tuple[EdgePart, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class OpRow:
    """One op of an evaluated choice (a row of ``planner explain``)."""

    index: int
    name: str
    kind: str
    op_type: str
    splits: Mapping[str, int]
    """``{dim: factor}`` of the split dims."""
    inter_splits: Mapping[str, int]
    """``{dim: inter-node part}`` where a split crosses nodes."""
    devices: int
    time_s: float
    compute_s: float
    comm_s: Mapping[str, float]
    """Intra-op communication by kind."""
    grad_sync_s: float
    memory: MemoryBreakdown


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeRow:
    """The redistribution between two ops of an evaluated choice."""

    u: int
    v: int
    tensors: tuple[str, ...]
    time_s: float
    inter_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluation:
    """A choice explained: totals, breakdowns, and per-op / per-edge rows."""

    choice: tuple[int, ...]
    time_s: float
    """Equals ``CostTables.evaluate(choice)[0]`` (FLOP-equivalents under the PaSE model)."""
    memory_bytes: float
    time: TimeBreakdown
    memory: MemoryBreakdown
    comm_by_kind_s: Mapping[str, float]
    """``partial_sum``, ``input_grad``, ``norm_stats``, ``halo``, ``grad_sync``, ``redistribution``."""
    comm_by_level_s: Mapping[str, float]
    """All communication split by link level: ``intra``, ``inter``."""
    ops: tuple[OpRow, ...]
    edges: tuple[EdgeRow, ...]
    time_unit: str = "s"
    measured_configs: int = 0
    fallback_configs: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    """A graph priced on a cluster: the search tables plus what explains them."""

    graph: OpGraph
    cluster: Cluster
    settings: TrainingSettings
    config_options: ConfigOptions
    """The options the configurations were enumerated with (PaSE's when ``cost_model="pase"``)."""
    cost_model: CostModelName
    tables: CostTables
    op_details: tuple[OpCostDetail, ...]
    edge_details: tuple[EdgeCostDetail, ...]
    """Aligned with ``tables.edges``."""
    time_unit: str = "s"
    """``"s"``, or ``"flop-equivalents"`` under the PaSE model."""
    measured_configs: int = 0
    """(op, configuration) pairs of the graph whose compute time was measured."""
    fallback_configs: int = 0
    """(op, configuration) pairs that fell back to the roofline (measured model only)."""
    distinct_ops: int = 0
    """Distinct op cost tables built (the rest are shared)."""
    distinct_edges: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    edges_priced: bool = True
    """``False`` for a model built with ``price_edges=False``: ``tables.edges`` is empty until
    :func:`with_edges` prices it, so its tables are not a search problem."""
    inter_node_memo: dict[tuple[int, int, int], float] = field(default_factory=dict, repr=False, compare=False)
    """Inter-node seconds of (edge, producer row, consumer row) already re-priced by
    :func:`evaluate_choice` (the points of a frontier share most of their edges' choices)."""

    def evaluate(self, choice: Sequence[int] | np.ndarray) -> Evaluation:
        """Explain one configuration index per op; totals equal ``self.tables.evaluate(choice)``."""
        return evaluate_choice(self, choice)

    def strategy(self, choice: Sequence[int] | np.ndarray) -> Strategy:
        """The :class:`~planner.core.strategy.Strategy` of a choice, with its breakdowns."""
        result = self.evaluate(choice)
        return Strategy(
            choice=result.choice,
            time_s=result.time_s,
            memory_bytes=result.memory_bytes,
            splits={row.name: dict(row.splits) for row in result.ops if row.splits},
            inter_splits={row.name: dict(row.inter_splits) for row in result.ops if row.inter_splits},
            memory=result.memory,
            time=result.time,
        )


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


def _node_key(op: Op) -> tuple:
    node = op.node
    if node is None:
        return ("no-node", op.name)
    return (
        node.op_type,
        node.domain,
        node.attributes,
        node.input_shapes,
        node.input_dtypes,
        node.output_shapes,
        node.output_dtypes,
        tuple(sorted(node.constant_inputs.items())),
        node.opset,
        getattr(node, "input_axes", ()),
        getattr(node, "output_axes", ()),
    )


def _permutable_axes(graph: OpGraph, op: Op, access) -> frozenset[int]:
    """Axes of a matmul's output that only its parameters index (a linear layer's output features).

    Permuting the weight's columns permutes those features, so a launcher lays them out as its
    consumers want (Megatron packs a fused QKV weight so that each rank's block holds its heads' q,
    k and v): redistribution compares only tile sizes on them.
    """
    if op.kind != "matmul":
        return frozenset()
    parameter_dims: set[str] = set()
    activation_dims: set[str] = set()
    for operand in op.inputs:
        dims = {d for axis in operand.axes for d in axis}
        if is_parameter_name(graph.tensors, graph.parameter_aliases, operand.tensor):
            parameter_dims |= dims
        else:
            activation_dims |= dims
    return frozenset(
        axis
        for axis, dims in enumerate(access.axes)
        if dims and all(d in parameter_dims and d not in activation_dims for d in dims)
    )


def _has_parameter(graph: OpGraph, op: Op) -> bool:
    return any(is_parameter_name(graph.tensors, graph.parameter_aliases, a.tensor) for a in op.inputs)


def _block_instances(graph: OpGraph) -> list[int]:
    """Per op, the index of the repeated-block instance it belongs to (-1: none)."""
    instance_of = [-1] * len(graph.ops)
    number = 0
    for group in graph.blocks:
        for instance in group.instances:
            for index in instance:
                instance_of[index] = number
            number += 1
    return instance_of


def _external_inputs(
    graph: OpGraph, op: Op, index: int, recomputed: list[bool], instance_of: list[int], op_index: Mapping[str, int]
) -> tuple[int, ...]:
    """Input positions produced outside the op's recomputed region (its checkpoints).

    A region is the recomputed ops of one block instance (or, outside blocks, all of them): a
    tensor from another instance, from a non-recomputed op, or a graph input is a checkpoint.
    """
    out = []
    for position, access in enumerate(op.inputs):
        tensor = graph.tensors.get(access.tensor)
        producer = tensor.producer if tensor is not None else None
        source = op_index.get(producer, -1) if producer is not None else -1
        if source < 0 or not recomputed[source] or instance_of[source] != instance_of[index]:
            out.append(position)
    return tuple(out)


def _operand_key(tensors: Mapping, op: Op) -> tuple:
    def describe(name: str) -> tuple:
        tensor = tensors.get(name)
        if tensor is None:
            return ("missing",)
        return (tensor.shape, tensor.dtype, tensor.role)

    return (tuple(describe(a.tensor) for a in op.inputs), tuple(describe(a.tensor) for a in op.outputs))


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
) -> OpCostDetail:
    tensors = ParameterView(graph)
    times = op_compute_time_s(op, space, tensors=tensors, device=cluster.device, settings=settings, measured=measured,
                              execution=execution, role=role, owned_inputs=owned)
    recompute = times.forward_s if recomputed else np.zeros(space.size)
    compute = times.total_s + recompute  # forward + backward (+ the optimizer step under an execution model)
    comm = price_terms(intra_op_terms(op, space, tensors=tensors, settings=settings), cluster=cluster, size=space.size)
    if execution is not None:  # each collective call also pays a fixed setup (Device.collective_overhead_s)
        comm = {key: array + cluster.device.collective_overhead_s * (array > 0) for key, array in comm.items()}
    sync_terms = grad_sync_terms(op, space, tensors=tensors, settings=settings, owned_inputs=owned,
                                 recomputed=recomputed)
    unhidden = None
    if execution is not None:  # a launcher buckets gradients and overlaps their sync with backward
        unhidden = bucketed_grad_sync_s(sync_terms, cluster=cluster, size=space.size)
        sync = hidden_under_backward(unhidden, backward_s=times.backward_s)
    else:
        sync = {level: array for (_, level), array in price_terms(sync_terms, cluster=cluster, size=space.size).items()}
    memory = op_memory_bytes(
        op, space, tensors=tensors, settings=settings, owned_inputs=owned, recomputed=recomputed and not working_set,
        external_inputs=external, execution=execution, role=role, graph_output=graph_output,
        dtypes=saved[0], shared=saved[1],
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
        dtypes=saved[0], shared=saved[1],
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
class _GraphFacts:
    """What :func:`build_cost_model` derives from the graph alone (not the cluster or settings).

    A pipeline search builds ~100 cost models of a handful of graphs (every stage size, micro-batch
    and recompute mode): this is worked out once per graph (:func:`_graph_facts`).
    """

    owned: tuple[tuple[int, ...], ...]
    instance_of: tuple[int, ...]
    op_index: Mapping[str, int]
    op_class: tuple[int, ...]
    """Per op, an id equal for ops of equal ``(signature, operand shapes/dtypes/roles, owned inputs)``:
    the graph part of the key that decides which ops share cost arrays."""
    node_class: tuple[int, ...]
    """Per op, an id of its ONNX node description (``measured`` ops share only on equal nodes)."""
    selective: tuple[bool, ...]
    """The ops ``recompute="selective"`` recomputes (attention core)."""
    edges: tuple[tuple, ...]
    """``(u, v, tensor, producer access, consumer access, part, pair)`` of each edge between two ops."""
    memo: dict = field(default_factory=dict)
    """Filled on first use: ``recompute`` mode -> per-op checkpoint input positions, and the
    :class:`_BuildPlan` of each (cost model, recompute, precision)."""


# Identity-keyed (OpGraph is not weak-referenceable): the entry holds its graph, so an id is never
# reused while cached; bounded so a long session keeps only its recent graphs.
_FACTS: dict[int, tuple[OpGraph, _GraphFacts]] = {}
_FACTS_LIMIT = 32


def _classes(keys) -> tuple[int, ...]:
    """Dense ids of hashable keys, equal ids for equal keys."""
    ids: dict = {}
    return tuple(ids.setdefault(key, len(ids)) for key in keys)


def _graph_facts(graph: OpGraph) -> _GraphFacts:
    entry = _FACTS.get(id(graph))
    if entry is not None and entry[0] is graph:
        return entry[1]
    tensors = ParameterView(graph)
    owned = tuple(parameter_ownership(graph))
    edges = []
    for edge in graph.edges:
        if edge.producer == edge.consumer:
            continue
        tensor = tensors.get(edge.tensor)
        if tensor is None:
            continue
        u, v = edge.producer, edge.consumer
        part = EdgePart(
            tensor=edge.tensor, producer=u, consumer=v,
            producer_output=edge.producer_output, consumer_input=edge.consumer_input,
        )
        edges.append((
            u, v, tensor, graph.ops[u].outputs[edge.producer_output], graph.ops[v].inputs[edge.consumer_input], part,
            (u, v) if u < v else (v, u),
        ))
    facts = _GraphFacts(
        owned=owned,
        instance_of=tuple(_block_instances(graph)),
        op_index={op.name: i for i, op in enumerate(graph.ops)},
        op_class=_classes(
            (op.signature(), _operand_key(tensors, op), owned[i]) for i, op in enumerate(graph.ops)
        ),
        node_class=_classes(_node_key(op) for op in graph.ops),
        selective=tuple(
            op.kind == "softmax" or (op.kind == "matmul" and not _has_parameter(graph, op)) for op in graph.ops
        ),
        edges=tuple(edges),
    )
    if len(_FACTS) >= _FACTS_LIMIT:
        del _FACTS[next(iter(_FACTS))]
    _FACTS[id(graph)] = (graph, facts)
    return facts


def _roles(graph: OpGraph, facts: _GraphFacts) -> tuple[str | None, ...]:
    """Per op, its part in an attention core (``objectives.attention``), ``None`` outside one."""
    if "roles" not in facts.memo:
        found = attention_roles(graph)
        facts.memo["roles"] = tuple(found[i][0] if i in found else None for i in range(len(graph.ops)))
    return facts.memo["roles"]


def _graph_outputs(graph: OpGraph, facts: _GraphFacts) -> tuple[bool, ...]:
    """Per op, whether it writes a tensor no op reads (a graph output: the logits)."""
    if "outputs" not in facts.memo:
        read = {e.tensor for e in graph.edges}
        facts.memo["outputs"] = tuple(any(a.tensor not in read for a in op.outputs) for op in graph.ops)
    return facts.memo["outputs"]


def _first_instance(graph: OpGraph, facts: _GraphFacts) -> tuple[bool, ...]:
    """Per op, whether it is in the first instance of a repeated block: under an execution model its
    activations stand for the working set of re-running one recomputed region (objectives.memory)."""
    if "first" not in facts.memo:
        first = {index for group in graph.blocks if group.instances for index in group.instances[0]}
        facts.memo["first"] = tuple(i in first for i in range(len(graph.ops)))
    return facts.memo["first"]


def _recompute_flags(graph: OpGraph, facts: _GraphFacts, recompute: str) -> tuple[tuple[bool, ...], tuple]:
    """Per op, whether ``recompute`` recomputes it, and its checkpoint inputs (``()`` if not recomputed)."""
    if recompute == "selective":
        recomputed = facts.selective
    elif recompute == "full":
        recomputed = tuple(instance >= 0 for instance in facts.instance_of)
    else:
        recomputed = (False,) * len(graph.ops)
    if recompute not in facts.memo:
        instance_of = list(facts.instance_of)
        facts.memo[recompute] = tuple(
            _external_inputs(graph, op, i, list(recomputed), instance_of, facts.op_index) if recomputed[i] else ()
            for i, op in enumerate(graph.ops)
        )
    return recomputed, facts.memo[recompute]


def _saved_sharing(
    graph: OpGraph, facts: _GraphFacts, settings: TrainingSettings, cost_model: str, recomputed, externals
) -> tuple[tuple, ...]:
    """Per op, ``(stored dtypes of its operands, saved operands another op charges)``
    (:func:`objectives.memory.shared_saved_operands`) under the build's recomputation and execution
    model: each saved tensor is charged once, to the first op that keeps it. Cached per setting."""
    execution = execution_of(settings) if cost_model != "pase" else None
    key = ("saved", settings.recompute, settings.precision, execution, cost_model == "pase")
    if key in facts.memo:
        return facts.memo[key]
    if cost_model == "pase":  # PaSE's cost keeps no activations
        result = ((None, ()),) * len(graph.ops)
    else:
        stored = stored_dtypes(graph, settings=settings, execution=execution)
        dtypes = [operand_dtypes(op, stored) for op in graph.ops]
        roles, first, tensors = _roles(graph, facts), _first_instance(graph, facts), ParameterView(graph)
        kept = []
        for index, op in enumerate(graph.ops):
            # the first instance's ops keep the working set (charged as not recomputed: _price_groups)
            again = recomputed[index] and not (execution is not None and first[index])
            inputs, outputs, _ = kept_operands(op, tensors, settings=settings, recomputed=again,
                                               external_inputs=externals[index], execution=execution,
                                               role=roles[index])
            kept.append((inputs, outputs))
        shared = shared_saved_operands(graph.ops, kept=kept, dtypes=dtypes,
                                       autocast=autocast_applies(settings, execution))
        result = tuple(zip(dtypes, shared))
    facts.memo[key] = result
    return result


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
    working_set: bool = False, saved: Sequence[tuple] | None = None,
) -> _BuildPlan:
    measured = cost_model == "measured"
    roles, first = _roles(graph, facts), _first_instance(graph, facts)
    saved = saved or ((None, ()),) * len(graph.ops)
    group_of = _classes(
        (space_of[i], facts.op_class[i], recomputed[i], externals[i], facts.node_class[i] if measured else None,
         roles[i], working_set and recomputed[i] and first[i], _graph_outputs(graph, facts)[i], saved[i])
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


def _build_plan(graph: OpGraph, facts: _GraphFacts, cost_model: str, settings: TrainingSettings,
                recomputed, externals) -> _BuildPlan:
    """The sharing of a fresh build: the same for every cluster, so cached in ``facts``."""
    working_set = execution_of(settings) is not None
    # the execution model decides which saved tensors are shared (objectives.autocast), so the groups
    cache_key = ("plan", cost_model, settings.recompute, settings.precision, execution_of(settings))
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
                        _saved_sharing(graph, facts, settings, cost_model, recomputed, externals))
    edge_class: dict[tuple, int] = {}
    edge_first: list[int] = []
    grouped: dict[tuple[int, int], list[tuple[EdgePart, int]]] = {}
    for number, (u, v, tensor, access_u, access_v, part, pair) in enumerate(facts.edges):
        key = (space_of[u], space_of[v], access_u.axes, access_v.axes, tensor.shape, element_bytes(tensor, settings))
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
) -> tuple[list[EdgeCost], list[EdgeCostDetail]]:
    """Every op pair's redistribution table (one per distinct pair table of ``plan``, shared)."""
    edge_arrays = []
    for number in plan.edge_first:
        u, v, tensor, access_u, access_v, _, _ = facts.edges[number]
        common = dict(
            producer=graph.ops[u], producer_space=op_spaces[u], producer_access=access_u,
            consumer=graph.ops[v], consumer_space=op_spaces[v], consumer_access=access_v,
        )
        if cost_model == "pase":
            assert params is not None
            edge_arrays.append(pase_edge_cost(tensor.shape, params=params, **common))
        else:
            edge_arrays.append(
                redistribution_time_s(
                    tensor.shape, element_bytes(tensor, settings), cluster=cluster,
                    free_axes=_permutable_axes(graph, graph.ops[u], access_u), **common,
                )
            )
    sums = []
    for keys in plan.sum_keys:
        combined = None
        for k, transposed in keys:
            array = edge_arrays[k].T if transposed else edge_arrays[k]
            combined = array if combined is None else combined + array
        sums.append(combined)
    edge_costs: list[EdgeCost] = []
    edge_details: list[EdgeCostDetail] = []
    for (u, v), parts, tensor_names, sum_class in plan.pairs:
        combined = sums[sum_class]
        edge_costs.append(EdgeCost(u=u, v=v, time_s=combined))
        edge_details.append(EdgeCostDetail(u=u, v=v, tensors=tensor_names, time_s=combined, parts=parts))
    return edge_costs, edge_details


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
        graph, facts, plan, model.tables.configs, model.cluster, model.settings, model.cost_model, None
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
        working_set = execution is not None and recomputed[index] and first[index]
        if (
            donor is not None and donor[0][index] == recomputed[index] and donor[1][index] == externals[index]
            and donor[2][index] == saved[index]
        ):
            detail = reuse.op_details[index]
        elif (
            donor is not None and not donor[0][index] and reuse.op_details[index].forward_s is not None
            and settings.zero_stage < 3  # ZeRO-3 gathers a recomputed op's parameters once more
        ):
            detail = _recomputed_detail(
                graph, op, space, reuse.op_details[index], settings=settings, owned=owned[index],
                external=externals[index], role=roles[index], working_set=working_set,
                graph_output=outputs[index], saved=saved[index],
            )
        elif cost_model == "pase":
            detail = _pase_detail(graph, op, space, settings=settings, params=params, owned=owned[index])
        else:
            detail = _roofline_detail(
                graph, op, space, cluster=cluster, settings=settings,
                measured=measured if cost_model == "measured" else None,
                owned=owned[index], recomputed=recomputed[index], external=externals[index],
                execution=execution, role=roles[index], working_set=working_set, graph_output=outputs[index],
                saved=saved[index],
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
    price_edges: bool,
) -> _PricedEdges:
    """The build's redistribution tables: the reused model's (they do not depend on ZeRO or
    recomputation), priced now, or left out (``price_edges=False``)."""
    if reuse is not None:
        return _PricedEdges(costs=list(reuse.tables.edges), details=list(reuse.edge_details),
                            priced=reuse.edges_priced, distinct=reuse.distinct_edges)
    if price_edges:
        costs, details = _price_edges(graph, facts, plan, op_spaces, cluster, settings, cost_model, params)
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
    """Price every op and edge of ``graph`` under every configuration.

    Parameters
    ----------
    graph:
        The op graph.
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

    Returns
    -------
    CostModel

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
        plan = _op_groups(graph, facts, cost_model, _classes(id(space) for space in op_spaces), recomputed, externals,
                          execution_of(settings) is not None,
                          _saved_sharing(graph, facts, settings, cost_model, recomputed, externals))
    group_details = _price_groups(
        graph, facts, plan, op_spaces, cluster=cluster, settings=settings, cost_model=cost_model, measured=measured,
        params=params, recomputed=recomputed, externals=externals, donor=state.donor, reuse=reuse,
    )
    op_details = [group_details[g] for g in plan.group_of]
    measured_configs = sum(d.measured * n for d, n in zip(group_details, plan.group_sizes))
    fallback_configs = sum(d.fallbacks * n for d, n in zip(group_details, plan.group_sizes))

    edges = _build_edges(graph, facts, plan, op_spaces, cluster=cluster, settings=settings, cost_model=cost_model,
                         params=params, reuse=reuse, price_edges=price_edges)
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


# --------------------------------------------------------------------------------------------
# evaluation


def _one_row(space: ConfigSpace, row: int) -> ConfigSpace:
    return space.subset(np.arange(row, row + 1))


def _edge_inter_s(model: CostModel, detail: EdgeCostDetail, picks: np.ndarray) -> float:
    """Seconds of one edge's redistribution that cross nodes, re-priced for the chosen pair only."""
    graph, tensors = model.graph, ParameterView(model.graph)
    total = 0.0
    for part in detail.parts:
        producer, consumer = graph.ops[part.producer], graph.ops[part.consumer]
        tensor = tensors[part.tensor]
        moved = redistribution(
            tensor.shape,
            element_bytes(tensor, model.settings),
            producer=producer,
            producer_space=_one_row(model.tables.configs[part.producer], int(picks[part.producer])),
            producer_access=producer.outputs[part.producer_output],
            consumer=consumer,
            consumer_space=_one_row(model.tables.configs[part.consumer], int(picks[part.consumer])),
            consumer_access=consumer.inputs[part.consumer_input],
            cluster=model.cluster,
            free_axes=_permutable_axes(graph, producer, producer.outputs[part.producer_output]),
        )
        total += float(moved.inter_s.sum())
    return total


def _match_total(parts: dict[str, float], total_bytes: float) -> None:
    """Set one memory part, within float rounding, so that ``MemoryBreakdown.total_bytes`` (parts
    summed by kind) equals ``total_bytes`` (the tables' sum, op by op) bit for bit: the two orders of
    adding differ in the last bits, and a point must not look dominated by its own breakdown.
    Rounded addition is monotone in each term, so a bisection over a part's float bit patterns finds
    it; the parts added last come first (their steps are the finest), zero parts stay zero. Parts
    are left alone when they differ by more than rounding."""
    order = ("params", "grads", "optimizer", "activations", "other")
    original = dict(parts)

    def summed() -> float:
        return MemoryBreakdown(**{f"{k}_bytes": parts[k] for k in order}).total_bytes

    if not np.isfinite(total_bytes) or abs(summed() - total_bytes) > 1e-9 * abs(total_bytes):
        return
    for name in reversed(order):
        if summed() == total_bytes:
            return
        if not original[name] > 0:
            continue
        middle = int(np.float64(original[name]).view(np.int64))

        def at(bits: int) -> float:
            parts[name] = float(np.int64(bits).view(np.float64))
            return summed()

        low = high = middle
        step = 1
        while at(low) > total_bytes and step < 1 << 40:
            low, step = max(0, middle - step), step * 2
        step = 1
        while at(high) < total_bytes and step < 1 << 40:
            high, step = middle + step, step * 2
        while low < high:  # the first bit pattern whose total reaches total_bytes
            mid = (low + high) // 2
            if at(mid) < total_bytes:
                low = mid + 1
            else:
                high = mid
        if at(low) != total_bytes:
            parts[name] = original[name]  # this part cannot hit it: try the next


def _checked_picks(model: CostModel, choice: Sequence[int] | np.ndarray) -> np.ndarray:
    """``choice`` as a flat int64 array, checked: one row per op, each within its space."""
    if not model.edges_priced:
        raise ValueError("the model was built without its edges (price_edges=False); use with_edges(model)")
    picks = np.asarray(choice, dtype=np.int64).reshape(-1)
    tables = model.tables
    if picks.size != tables.num_ops:
        raise InputError(f"a choice needs one configuration per op ({tables.num_ops}), got {picks.size}")
    for i, (c, space) in enumerate(zip(picks, tables.configs)):
        if not 0 <= c < space.size:
            raise InputError(f"op {i}: configuration {int(c)} is out of range 0..{space.size - 1}")
    return picks


@dataclass(slots=True, kw_only=True)
class _Totals:
    """Running sums of one evaluation. Mutable on purpose: the figures are float sums whose last
    bits depend on the order of the additions, so every step adds into one place, op by op and
    then edge by edge, as the whole evaluation always has."""

    by_kind: dict[str, float] = field(
        default_factory=lambda: {k: 0.0 for k in (*_COMM_KINDS, "grad_sync", "redistribution")}
    )
    """Seconds per communication kind (``grad_sync`` and ``redistribution`` included)."""
    by_level: dict[str, float] = field(default_factory=lambda: {"intra": 0.0, "inter": 0.0})
    """Seconds of communication within and across nodes."""
    compute_s: float = 0.0
    memory_parts: dict[str, float] = field(
        default_factory=lambda: {"params": 0.0, "grads": 0.0, "optimizer": 0.0, "activations": 0.0, "other": 0.0}
    )
    """Bytes per device per memory kind."""
    redistribution_s: float = 0.0


def _op_row(model: CostModel, index: int, c: int, totals: _Totals) -> OpRow:
    """Op ``index`` at configuration ``c``: its row, its figures added to ``totals``."""
    op, detail, space = model.graph.ops[index], model.op_details[index], model.tables.configs[index]
    compute = float(detail.compute_s[c])
    totals.compute_s += compute
    comm: dict[str, float] = {}
    for (kind, level), array in detail.comm_s.items():
        value = float(array[c])
        if value:
            comm[kind] = comm.get(kind, 0.0) + value
        totals.by_kind[kind] = totals.by_kind.get(kind, 0.0) + value
        totals.by_level[level] += value
    sync = 0.0
    for level, array in detail.grad_sync_s.items():
        value = float(array[c])
        sync += value
        totals.by_level[level] += value
    totals.by_kind["grad_sync"] += sync
    mem = detail.memory
    breakdown = MemoryBreakdown(
        params_bytes=float(mem.params_bytes[c]),
        grads_bytes=float(mem.grads_bytes[c]),
        optimizer_bytes=float(mem.optimizer_bytes[c]),
        activations_bytes=float(mem.activations_bytes[c]),
        other_bytes=float(mem.other_bytes[c]),
    )
    for name, value in (
        ("params", breakdown.params_bytes),
        ("grads", breakdown.grads_bytes),
        ("optimizer", breakdown.optimizer_bytes),
        ("activations", breakdown.activations_bytes),
        ("other", breakdown.other_bytes),
    ):
        totals.memory_parts[name] += value
    return OpRow(
        index=index,
        name=op.name,
        kind=op.kind,
        op_type=op.op_type,
        splits=space.describe(c),
        inter_splits={n: int(e) for n, e in zip(space.dim_names, space.inter_factors[c]) if e > 1},
        devices=int(space.devices_held[c]),
        time_s=float(detail.time_s[c]),
        compute_s=compute,
        comm_s=comm,
        grad_sync_s=sync,
        memory=breakdown,
    )


def _edge_rows(model: CostModel, picks: np.ndarray, totals: _Totals) -> list[EdgeRow]:
    """Every op pair's redistribution at ``picks`` (with the part that crosses nodes), added to ``totals``."""
    edge_rows = []
    for edge_index, detail in enumerate(model.edge_details):
        cu, cv = int(picks[detail.u]), int(picks[detail.v])
        t = float(detail.time_s[cu, cv])
        if model.cost_model == "pase" or t == 0.0:
            inter = 0.0  # nothing moves, or no link levels (PaSE's model)
        else:
            key = (edge_index, cu, cv)
            inter = model.inter_node_memo.get(key)
            if inter is None:
                inter = model.inter_node_memo[key] = _edge_inter_s(model, detail, picks)
        totals.redistribution_s += t
        totals.by_level["inter"] += inter
        totals.by_level["intra"] += t - inter
        edge_rows.append(EdgeRow(u=detail.u, v=detail.v, tensors=detail.tensors, time_s=t, inter_s=inter))
    return edge_rows


def evaluate_choice(model: CostModel, choice: Sequence[int] | np.ndarray) -> Evaluation:
    """Explain one configuration index per op of ``model``'s graph.

    Parameters
    ----------
    model:
        A built :class:`CostModel`.
    choice:
        One row index into each op's configuration space.

    Returns
    -------
    Evaluation
        Totals equal ``model.tables.evaluate(choice)`` up to float rounding.

    Raises
    ------
    InputError
        A choice of the wrong length or with an index out of range.
    """
    picks = _checked_picks(model, choice)
    tables = model.tables
    totals = _Totals()
    rows = [_op_row(model, index, int(picks[index]), totals) for index in range(len(model.graph.ops))]
    edge_rows = _edge_rows(model, picks, totals)
    by_kind, memory_parts = totals.by_kind, totals.memory_parts
    by_kind["redistribution"] = totals.redistribution_s

    time_s, memory_bytes = tables.evaluate(picks)
    _match_total(memory_parts, memory_bytes)
    intra_op = sum(v for k, v in by_kind.items() if k not in ("grad_sync", "redistribution"))
    return Evaluation(
        choice=tuple(int(c) for c in picks),
        time_s=time_s,
        memory_bytes=memory_bytes,
        time=TimeBreakdown(
            compute_s=totals.compute_s,
            intra_op_comm_s=intra_op,
            redistribution_s=totals.redistribution_s,
            grad_sync_s=by_kind["grad_sync"],
        ),
        memory=MemoryBreakdown(
            params_bytes=memory_parts["params"],
            grads_bytes=memory_parts["grads"],
            optimizer_bytes=memory_parts["optimizer"],
            activations_bytes=memory_parts["activations"],
            other_bytes=memory_parts["other"],
        ),
        comm_by_kind_s=by_kind,
        comm_by_level_s=totals.by_level,
        ops=tuple(rows),
        edges=tuple(edge_rows),
        time_unit=model.time_unit,
        measured_configs=model.measured_configs,
        fallback_configs=model.fallback_configs,
    )
