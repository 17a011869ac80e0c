r"""A graph priced on a cluster (:class:`CostModel`), and the breakdown of any one choice.

:func:`objectives.tables.build_cost_model` builds a :class:`CostModel`: its ``.tables``
(:class:`~planner.core.tables.CostTables`) is what search consumes, and per op and edge the terms
they sum (:class:`OpCostDetail`, :class:`EdgeCostDetail`, arrays shared between equal ops and edges).

:func:`evaluate_choice` (``CostModel.evaluate(choice)``) explains one configuration per op term by
term (:class:`Evaluation`: per-op rows :class:`OpRow`, per-edge rows :class:`EdgeRow`, the time and
memory breakdowns, communication by kind and by link level). Its totals equal
``CostTables.evaluate(choice)``; an edge's inter-node share is re-priced for the chosen pair of
configurations only (memoised on the model: the points of a frontier share most of their edges).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from objectives._common import element_bytes
from objectives.graph_facts import EdgePart, _permutable_axes
from objectives.memory import MemoryArrays
from objectives.parameters import ParameterView
from objectives.redistribution import redistribution
from planner.core.cluster import Cluster
from planner.core.configs import ConfigOptions, ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import CostModelName, TrainingSettings
from planner.core.strategy import MemoryBreakdown, Strategy, TimeBreakdown, public_form
from planner.core.tables import CostTables

__all__ = ["OpCostDetail", "EdgeCostDetail", "OpRow", "EdgeRow", "Evaluation", "CostModel", "evaluate_choice"]

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
    moe_s: Mapping[str, np.ndarray] | None = None
    """Mixture-of-Experts ops (``objectives.moe.price_moe``): seconds per micro-batch the layer's
    terms add beyond its balanced, untiled expert work, included in ``compute_s`` and ``comm_s``:
    ``permute`` (token permutations), ``grouped_gemm_tiles`` (row-tile padding),
    ``load_imbalance`` (the busiest expert-parallel rank); ``None`` for other ops."""


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
        form = public_form([op.name for op in self.graph.ops], self.tables.configs, result.choice)
        return Strategy(
            choice=result.choice,
            time_s=result.time_s,
            memory_bytes=result.memory_bytes,
            splits={row.name: dict(row.splits) for row in result.ops if row.splits},
            inter_splits={row.name: dict(row.inter_splits) for row in result.ops if row.inter_splits},
            replicas=form.replicas,
            memory=result.memory,
            time=result.time,
        )


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
