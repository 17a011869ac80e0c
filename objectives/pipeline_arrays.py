r"""A stage's per-op costs split the way a pipeline needs them: forward and backward seconds per
micro-batch, per-step seconds, and the parameter states at every ZeRO stage.

Each (stage devices, batch, recompute) cost model is priced once, at ZeRO 0
(:class:`objectives.pipeline_cost.PipelineCostCache`); where each term is computed:

* what does not depend on the ZeRO stage (forward and backward compute and communication, the
  optimizer step, activations, parameter shard sizes): :class:`_ModelParts`;
* the parameter states and gradient synchronisation at a ZeRO stage, re-priced from it:
  :func:`_op_arrays` (states: ``objectives.memory``; synchronisation: :func:`_zero_sync_s`);
* which op accounts for each parameter (the tables' rule: its first reader) and its copies in
  other stages (tied embeddings): :func:`_parameter_reads`, :func:`_tied_copies`.

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
reductions of ZeRO 0-2 overlap backward, ZeRO-1/2's parameter all-gather the next step's forward
(:func:`_param_gather_overlapped_s`; under a launcher's rule, ``TrainingSettings.zero_sync``, handed to
:func:`_op_arrays` per plan, what it does not overlap stays whole: DeepSpeed's gather after the step); ZeRO-3's traffic is prefetched: each phase's gathers and
reduce-scatters run beside the compute of that phase, as FSDP and DeepSpeed ZeRO-3 prefetch the next
block's parameters (:func:`_prefetched_sync_s`). What overlaps still costs its contention
(:data:`objectives.intra_op.OVERLAP_CONTENTION`).

A parameter read in two stages (tied embeddings) is held by both: each copy is synchronised inside
its stage by the ZeRO rule above (:func:`_tied_copies`); the price of a plan all-reduces the two
copies' gradients between the stages once per step (:mod:`objectives.pipeline_price`).

References
----------
S. Rajbhandari et al., "ZeRO", SC 2020.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from objectives._common import canonical_parameter, is_parameter_name, shard_elements
from objectives.intra_op import (
    CommTerm,
    bucketed_grad_sync_s,
    exposed_under,
    grad_bucket_bytes,
    grad_sync_terms,
    hidden_under_backward,
    overlapped_zero_sync_s,
    price_terms,
    reductions_overlap_backward,
    term_time_s,
    zero_sync_split,
)
from objectives.compute import updated_parameters
from objectives.deepspeed_zero3 import (PERSISTENT, deepspeed_op_sync_s, gathers_per_micro_batch, gradient_tail_shares,
                                         submodule_orders)
from objectives.memory import fp8_weight_elements, parameter_state_bytes, state_bytes_per_parameter
from objectives.precision import FP8_PARAM_BYTES, fp8_primary_bytes
from objectives.offload import block_layers, offload_columns
from objectives.replication import hpz_secondary_elements
# one rule for who accounts for a parameter and for the tensors' parameter view: the tables'
from objectives.parameters import ParameterView, parameter_ownership
from planner.core.cluster import Cluster
from planner.core.configs import ConfigSpace, batch_products
from planner.core.degrees import dim_roles
from planner.core.graph import OpGraph
from planner.core.settings import ZERO_SYNC_STAGES, TrainingSettings
from planner.core.tables import EdgeCost

__all__: list[str] = []  # the cache's parts (objectives.pipeline_cost), private to the pipeline modules


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


_COLUMNS = ("forward_s", "backward_s", "step_s", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
            "update_s")
"""The per-op arrays of :class:`_OpArrays`, in the order of its ``per_key`` tuples. ``update_s`` is the part
of ``step_s`` that updates the weights (the optimizer step, on the device or the host), which waits for every
pipeline stage's gradients (:func:`objectives.pipeline_price.price_plan`); the rest of ``step_s`` is the
stage's own gradient synchronisation. Beside them ``flat`` holds ``first_forward_s`` where some op has one: seconds
once per step that the step's first micro-batch's forward adds (ZeRO++'s hpZ gathers over every rank,
:func:`objectives.deepspeed_zero3.deepspeed_zero3_sync_s`), floored with that forward
(:func:`objectives.first_forward.first_forward_extra_s`), in no other column."""


class _Column:
    """A per-op tuple of :class:`_OpArrays` (one of :data:`_COLUMNS`), built from its ``per_key`` on
    first use and kept in its ``lazy`` store."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.position = _COLUMNS.index(name)

    def __get__(self, arrays: "_OpArrays | None", owner: type | None = None):
        if arrays is None:
            return self
        if self.name not in arrays.lazy:
            arrays.lazy[self.name] = tuple(arrays.per_key[k][self.position] for k in arrays.key)
        return arrays.lazy[self.name]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _OpArrays:
    """A cost model's per-op costs split the way a pipeline needs them (arrays shared like the model's)."""

    model: object
    """The ``objectives.tables.CostModel``."""
    key: tuple[int, ...]
    """Per op, an id equal for ops whose arrays are the same objects."""
    per_key: Mapping[int, tuple[np.ndarray, ...]]
    """Per distinct key, its arrays in the order of :data:`_COLUMNS` (the per-op tuples below are
    built from it on first use: the search reads them for a few models, and building them for every
    one of a 1T search's thousands cost ~1,700 tuple entries each)."""
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
    lazy: dict = field(default_factory=dict)
    """Values computed on first use (the tied copies: only priced plans need them)."""
    edge_store: dict = field(default_factory=dict)
    """Where the flat edge tables are kept (:func:`_edge_fields`): the (stage size, micro-batch) pair's
    store, which its recompute variants and ZeRO stages share (their edge tuple is one object)."""

    # per op, its array of each column (:data:`_COLUMNS`: forward and backward seconds per micro-batch,
    # seconds once per step, parameter / gradient / optimizer bytes at the ZeRO stage, activations
    # of one micro-batch), built from ``per_key`` on first use (:class:`_Column`)
    forward_s = _Column()
    backward_s = _Column()
    step_s = _Column()
    params_bytes = _Column()
    grads_bytes = _Column()
    optimizer_bytes = _Column()
    activations_bytes = _Column()
    update_s = _Column()

    @property
    def spaces(self) -> tuple[ConfigSpace, ...]:
        return self.model.tables.configs  # type: ignore[attr-defined]

    @property
    def states_zero_stage(self) -> int:
        """The ZeRO stage its parameter states and synchronisation are priced at: the arrays' own, or ZeRO-1's for
        ZeRO-0 on a pipeline stage under a rule whose optimizer partitions it (``ZeroSync.partition_stage``:
        DeepSpeed's ``BF16_Optimizer``)."""
        return self.tied_source[1].zero_stage

    @property
    def twin_instances(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """``((first instance's ops, second instance's ops), ...)`` of the repeated blocks whose first
        instance stands for a recomputation working set (:func:`objectives.pipeline_price._working_set`;
        the search's memory bounds charge it alike, :mod:`planner.search.pipeline_bounds`): two or more
        instances, alike op by op (as many ops, their spaces of one size). Built on first use."""
        if "twin instances" not in self.lazy:
            found = []
            for group in getattr(getattr(self.model, "graph", None), "blocks", ()):
                if len(group.instances) < 2 or len(group.instances[0]) != len(group.instances[1]):
                    continue
                first, second = tuple(group.instances[0]), tuple(group.instances[1])
                if all(self.spaces[i].size == self.spaces[j].size for i, j in zip(first, second)):
                    found.append((first, second))
            self.lazy["twin instances"] = tuple(found)
        return self.lazy["twin instances"]

    # The edge tables flattened for vectorised lookups (:func:`_edge_fields`), built on first use:
    # only a stage the search prices reads them, and on a 1T model they are tens of MB per pair.

    @property
    def edge_offsets(self) -> np.ndarray:
        """``(E,)`` start of each op pair's table in :attr:`edge_flat`."""
        return _edge_fields(self.edges, self.edge_store)["edge_offsets"]

    @property
    def edge_strides(self) -> np.ndarray:
        """``(E,)`` row length of each pair's table (the consumer's configurations)."""
        return _edge_fields(self.edges, self.edge_store)["edge_strides"]

    @property
    def edge_u(self) -> np.ndarray:
        """``(E,)`` producer op of each pair."""
        return _edge_groups(self.edges, self.edge_store)[1]

    @property
    def edge_v(self) -> np.ndarray:
        """``(E,)`` consumer op of each pair."""
        return _edge_groups(self.edges, self.edge_store)[2]

    @property
    def edge_flat(self) -> np.ndarray:
        """The distinct edge tables concatenated: pair ``e`` at ``(cu, cv)`` is
        ``edge_flat[edge_offsets[e] + cu * edge_strides[e] + cv]``."""
        return _edge_fields(self.edges, self.edge_store)["edge_flat"]

    def edge_time_s(self, picks: np.ndarray) -> np.ndarray:
        """``(E,)`` seconds per micro-batch of each op pair's redistribution under ``picks`` (one
        configuration per op): ``edge_flat``'s entries, read from each distinct table in place. The
        search prices with this: on the 1T model copying the tables into ``edge_flat`` (hundreds of
        MB per stage model, transposed sums copied once more) was a quarter of the search's time."""
        out = np.empty(len(self.edges))
        for table, u, v, at in _edge_groups(self.edges, self.edge_store)[0]:
            out[at] = table[picks[u], picks[v]]
        return out

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
    in backward (before the backward, and before a recomputed op's re-run forward); one of a single pass
    (``term.phase``: ZeRO++'s hpZ splits them by group) runs in that pass."""
    if zero_stage >= 3 and term.collective == "all_gather" and term.phase is not None:
        return (1.0, 0.0, 0.0) if term.phase == "forward" else (0.0, 1.0, 0.0)
    if zero_stage >= 3 and term.collective == "all_gather":
        return (1.0 / term.count, (term.count - 1.0) / term.count, 0.0)
    if zero_stage >= 1 and term.collective == "all_reduce":  # HSDP's replica all-reduce follows the reduce-scatter
        return _ZERO_PHASES[zero_stage]["reduce_scatter"]
    return _ZERO_PHASES[zero_stage][term.collective]


@dataclass(frozen=True, slots=True)
class _PricedSync:
    """An op's gradient synchronisation at a ZeRO stage, priced before it meets the op's compute:
    what :func:`_zero_sync_s` reads of its terms (equal for ops of one shape, parameters and
    configurations, whatever their micro-batch or recomputation)."""

    weights: np.ndarray | None
    """``(3,)`` the phase shares every term has (:func:`_phases`), or ``None`` when they differ."""
    levels: Mapping[str, np.ndarray]
    """``{level: (K,) seconds}`` summed over the terms: bucketed when an execution model runs the op
    (:func:`~objectives.intra_op.bucketed_grad_sync_s`), else as :func:`price_terms` sums them."""
    parts: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    """``(K,)`` seconds per phase, unbucketed (only where the terms' phases differ)."""
    split: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = None
    """ZeRO-1/2 under an execution model: ``(reductions, gathers)``, the bucketed ``{level: (K,) seconds}`` of the
    gradient reductions and of the parameter all-gather apart (:func:`_param_gather_overlapped_s`)."""


def _space_digest(space: ConfigSpace, digests: dict | None) -> bytes:
    """A digest of the configurations' content; ``digests``: those of live spaces by table identity."""
    if digests is not None and ("digest", space.table_key) in digests:
        return digests[("digest", space.table_key)]
    digest = hashlib.blake2b(digest_size=16)
    for table in (space.factors, space.inter_factors, space.replicas, space.inter_replicas):
        digest.update(b"-" if table is None else np.ascontiguousarray(table).tobytes())
    if digests is not None:
        digests[("digest", space.table_key)] = digest.digest()
    return digest.digest()


def _sync_op_key(op, space: ConfigSpace, tensors, owned: Sequence[int], digests: dict | None = None) -> tuple:
    """The part of :func:`_sync_key` that is the op's alone, whatever the settings: the configurations' content
    (:func:`_space_digest`), their shape and dim names, the op's dims, and each synchronised parameter's axes, shape
    and dtype."""
    parameters = tuple(
        (op.inputs[p].axes, tensors[op.inputs[p].tensor].shape, tensors[op.inputs[p].tensor].dtype) for p in sorted(owned)
    )
    return _space_digest(space, digests), space.factors.shape, space.dim_names, tuple(d.name for d in op.dims), parameters


def _sync_key(op, space: ConfigSpace, tensors, owned: Sequence[int], settings: TrainingSettings, *, recomputed: bool,
              executed: bool, digests: dict | None = None, graph_output: bool = False, op_key: tuple | None = None,
              ) -> tuple:
    """What :func:`_price_sync` reads, as a key: the configurations' content (:func:`_space_digest`),
    the op's dims, and each synchronised parameter's axes, shape and dtype (the terms never read the
    op's name or compute; whether the op is recomputed only from ZeRO-3 on, whose gathers it repeats).
    ``op_key``: :func:`_sync_op_key` of the op, when already known (the same tuple)."""
    return (
        *(op_key if op_key is not None else _sync_op_key(op, space, tensors, owned, digests)),
        state_bytes_per_parameter(settings), settings.zero_stage, settings.dp_shard, settings.hpz_partition,
        recomputed and settings.zero_stage >= 3,
        executed, settings.zero_sync if settings.zero_stage in ZERO_SYNC_STAGES else None,  # a launcher's ZeRO 0-2 rule
        settings.gathers_fp8 and (op.kind, settings.fp8, graph_output),  # FP8 weights gathered in FP8
        settings.reshard_after_forward if settings.zero_stage >= 3 else None,  # FSDP2's "never": one gather
        settings.zero3_gather if settings.zero_stage >= 3 else None,  # DeepSpeed's rule: a recomputed op gathers 3 times
    )


def _price_sync(op, space: ConfigSpace, *, tensors, settings: TrainingSettings, owned: Sequence[int], cluster: Cluster,
                recomputed: bool, executed: bool, graph_output: bool = False) -> _PricedSync | None:
    """:class:`_PricedSync` of the op's :func:`~objectives.intra_op.grad_sync_terms` (``None``: none)."""
    terms: list[CommTerm] = grad_sync_terms(op, space, tensors=tensors, settings=settings, owned_inputs=owned,
                                            recomputed=recomputed, graph_output=graph_output)
    if not terms:
        return None
    size = space.size
    weights = [np.asarray(_phases(t, settings.zero_stage), dtype=np.float64) for t in terms]
    split = None
    if executed:
        bucket = grad_bucket_bytes(terms, settings)
        levels = bucketed_grad_sync_s(terms, cluster=cluster, size=size, bucket_bytes=bucket)
        if settings.zero_stage in (1, 2):  # the parameter gather overlaps its own window (_param_gather_overlapped_s)
            split = zero_sync_split(terms, cluster=cluster, size=size, bucket_bytes=bucket)
    else:
        levels = {level: t for (_, level), t in price_terms(terms, cluster=cluster, size=size).items()}
    if all(np.array_equal(w, weights[0]) for w in weights):  # one phase: the tables' sum as it is
        return _PricedSync(weights=weights[0], levels=levels, parts=None, split=split)
    zeros = np.zeros(size)
    seconds = [term_time_s(t, cluster=cluster) for t in terms]
    parts = tuple(sum((w[phase] * t for w, t in zip(weights, seconds)), zeros) for phase in range(3))
    return _PricedSync(weights=None, levels=levels, parts=parts, split=split)  # type: ignore[arg-type]


def _zero_sync_s(
    op, space: ConfigSpace, detail, *, tensors, settings: TrainingSettings, owned: Sequence[int], cluster: Cluster,
    memo: dict | None = None, digests: dict | None = None, graph_output: bool = False, op_key: tuple | None = None,
    recomputed: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(forward, backward, per-step)`` seconds of an op's gradient synchronisation at
    ``settings.zero_stage``: the terms ``objectives.intra_op`` prices for one step
    (:func:`~objectives.intra_op.grad_sync_terms`), priced as ``objectives.tables`` prices them
    (bucketed under an execution model), split by :data:`_ZERO_PHASES`.

    ``detail`` is the op's ``OpCostDetail`` at ZeRO 0 (its compute and whether an execution model
    buckets). Under an execution model the gradient reductions overlap backward (the tables'
    :func:`~objectives.intra_op.hidden_under_backward`), ZeRO-1/2's parameter all-gather the forward
    (:func:`_param_gather_overlapped_s`); ZeRO-3's is prefetched beside the compute of its own phase
    (:func:`_prefetched_sync_s`).
    ``memo``: terms already priced on ``cluster`` (:func:`_sync_key`), shared by ops of one shape
    across micro-batches and recomputation settings; ``digests``: :func:`_space_digest`'s store for
    spaces alive while it is. ``graph_output``: the op writes a graph output (the LM head, whose weight is
    never gathered in FP8: :func:`objectives.precision.gathered_bytes`). ``op_key``: :func:`_sync_op_key` of the op,
    ``recomputed``: whether ``detail`` recomputes (some ``recompute_s > 0``), when the caller knows them.
    """
    recomputed = bool(np.any(detail.recompute_s > 0.0)) if recomputed is None else recomputed
    executed = detail.grad_sync_unhidden_s is not None  # an execution model buckets and overlaps
    if memo is None:
        priced = _price_sync(op, space, tensors=tensors, settings=settings, owned=owned, cluster=cluster,
                             recomputed=recomputed, executed=executed, graph_output=graph_output)
    else:
        key = _sync_key(op, space, tensors, owned, settings, recomputed=recomputed, executed=executed, digests=digests,
                        graph_output=graph_output, op_key=op_key)
        if key not in memo:
            memo[key] = _price_sync(op, space, tensors=tensors, settings=settings, owned=owned, cluster=cluster,
                                    recomputed=recomputed, executed=executed, graph_output=graph_output)
        priced = memo[key]
    zeros = np.zeros(space.size)
    if priced is None:
        return zeros, zeros, zeros
    if executed and settings.overlap and settings.zero_stage >= 3 and priced.weights is None:
        return _prefetched_sync_s(priced, detail)
    if executed and settings.overlap and priced.split is not None:
        return _param_gather_overlapped_s(priced.split, detail, settings)
    exposed = _exposed_sync_s(priced.levels, detail, settings)
    if priced.weights is not None:
        return tuple(w * exposed for w in priced.weights)  # type: ignore[return-value]
    if not executed:
        return priced.parts  # type: ignore[return-value]
    whole = priced.parts[0] + priced.parts[1] + priced.parts[2]  # each phase keeps its share of the bucketed, exposed sum
    scale = np.divide(exposed, whole, out=zeros.copy(), where=whole > 0.0)
    return tuple(part * scale for part in priced.parts)  # type: ignore[return-value]


def _prefetched_sync_s(priced: _PricedSync, detail) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ZeRO-3 / FSDP as launchers run it: each phase's bucketed traffic (the gathers before forward;
    the gathers and reduce-scatters of backward) is prefetched beside the compute of its phase
    (FSDP's forward and backward prefetch, DeepSpeed ZeRO-3's ``overlap_comm`` and prefetch bucket,
    Megatron-FSDP's ``--overlap-param-gather``): in a stack of equal layers the next block's gather
    runs while this one computes, so what stays on the critical path is
    :func:`~objectives.intra_op.exposed_under` the phase's compute (contention included)."""
    zeros = np.zeros(priced.parts[0].shape)
    unbucketed = priced.parts[0] + priced.parts[1] + priced.parts[2]
    bucketed = sum(priced.levels.values(), zeros)
    share = np.divide(bucketed, unbucketed, out=zeros.copy(), where=unbucketed > 0.0)  # latency paid per bucket
    optimizer = detail.optimizer_s if detail.optimizer_s is not None else 0.0
    backward = detail.compute_s - optimizer - detail.forward_s  # a recomputed op's re-run forward included
    forward_s = sum(exposed_under({"all": priced.parts[0] * share}, compute_s=detail.forward_s).values(), zeros)
    backward_s = sum(exposed_under({"all": priced.parts[1] * share}, compute_s=backward).values(), zeros)
    return forward_s, backward_s, priced.parts[2] * share


def _param_gather_overlapped_s(split, detail, settings: TrainingSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ZeRO-1/2 as Megatron-LM overlaps it (:func:`~objectives.intra_op.overlapped_zero_sync_s`): the gradient
    reductions beside the op's backward, once per step (ZeRO-1) or per micro-batch (ZeRO-2's reduce-scatter), and
    the parameter all-gather beside the op's forward of the next step's first micro-batch, once per step; under a
    launcher's rule (``settings.zero_sync``: DeepSpeed's) what it does not overlap stays whole, in the same phase."""
    zero_stage = settings.zero_stage
    zeros = np.zeros(detail.time_s.shape[0])
    optimizer = detail.optimizer_s if detail.optimizer_s is not None else 0.0
    backward = detail.compute_s - detail.recompute_s - optimizer - detail.forward_s
    reductions, gathers = overlapped_zero_sync_s(split, forward_s=detail.forward_s, backward_s=backward,
                                                 rule=settings.zero_sync)
    reduced, gathered = sum(reductions.values(), zeros), sum(gathers.values(), zeros)
    if zero_stage == 1:
        return zeros, zeros, reduced + gathered
    return zeros, reduced, gathered


def _exposed_sync_s(levels: Mapping[str, np.ndarray], detail, settings: TrainingSettings) -> np.ndarray:
    """``(K,)`` seconds of an op's synchronisation as the tables price it: ``levels`` summed; under
    an execution model (bucketed already), below ZeRO-3, hidden under the op's backward, unless the launcher's
    rule runs it after the backward (:func:`~objectives.intra_op.reductions_overlap_backward`: DeepSpeed's ZeRO-0)."""
    size = detail.time_s.shape[0]
    if detail.grad_sync_unhidden_s is not None and settings.overlap and settings.zero_stage < 3 \
            and reductions_overlap_backward(settings):
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
    flags, also as ``(n_ops,)`` class numbers (the same for every cost model of the graph)."""
    owned = parameter_ownership(graph)
    batch_dims = [tuple(d.is_batch for d in op.dims) for op in graph.ops]
    classes: dict[tuple[bool, ...], int] = {}
    batch_class = np.array([classes.setdefault(flags, len(classes)) for flags in batch_dims], dtype=np.int64)
    return owned, _parameter_reads(graph, owned), ParameterView(graph), batch_dims, batch_class


def _tied_copies(model, cluster: Cluster, settings: TrainingSettings, reads) -> tuple[_TiedCopy, ...]:
    """The copies of ``reads`` (:func:`_parameter_reads`): their states and their synchronisation
    inside the reader's stage, placed by :func:`_zero_sync_s` as the owner's is."""
    if not reads:
        return ()
    graph: OpGraph = model.graph
    tensors = ParameterView(graph)
    per = state_bytes_per_parameter(settings)
    copies, heads = [], _output_ops(graph, settings)
    for index, position, owner in reads:
        op = graph.ops[index]
        space = model.tables.configs[index]
        params, grads, optimizer = parameter_state_bytes(
            op, space, tensors=tensors, settings=settings, owned_inputs=[position], graph_output=index in heads
        )
        forward, backward, step = _zero_sync_s(
            op, space, model.op_details[index], tensors=tensors, settings=settings, owned=[position], cluster=cluster,
            graph_output=index in heads,
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
    """Per configuration of the ``rows`` ops (flat, row after row): batch-dim and other-dim split products,
    the tensor- and context-parallel parts of the latter (``planner.core.degrees.dim_roles``) and the op's
    FLOPs: the communicators NCCL's buffers are priced for (``objectives.pipeline_price.nccl_stage_bytes``)."""
    batches, others, tps, cps, flops = [], [], [], [], []
    for i in rows:
        flops.append(np.full(spaces[i].size, float(graph.ops[i].flops)))
        batch, other = batch_products(graph.ops[i], spaces[i])
        batches.append(batch)
        others.append(other)
        roles = np.array(dim_roles(graph, graph.ops[i]), dtype=object)
        factors = spaces[i].factors
        for role, out in (("tp", tps), ("cp", cps)):
            mask = roles == role
            out.append(np.prod(np.where(mask, factors, 1), axis=1) if factors.shape[1] else np.ones(spaces[i].size, dtype=np.int64))
    return {"batch_split": np.concatenate(batches), "model_split": np.concatenate(others),
            "tp_split": np.concatenate(tps), "cp_split": np.concatenate(cps), "op_flops": np.concatenate(flops)}


def _edge_fields(edges: Sequence[EdgeCost], store: dict) -> dict[str, np.ndarray]:
    """``edges`` flattened for vectorised lookups (the ``edge_*`` properties of :class:`_OpArrays`):
    each distinct table once (layers share theirs), pair ``e`` at ``edge_offsets[e]``; kept in
    ``store`` (:attr:`_OpArrays.edge_store`) with the tuple it was built from, so edges priced later
    are flattened again."""
    entry = store.get("edge_fields")
    if entry is None or entry[0] is not edges:
        entry = store["edge_fields"] = (edges, _flatten_edges(tuple(edges)))
    return entry[1]


def _edge_groups(edges: Sequence[EdgeCost], store: dict) -> tuple[tuple, np.ndarray, np.ndarray]:
    """``(groups, producers, consumers)``: ``edges`` grouped by table (layers share theirs), per
    distinct table ``(table, producers, consumers, positions in edges)``, for
    :meth:`_OpArrays.edge_time_s`, and each pair's ``(E,)`` producer and consumer op; kept in ``store``
    with the tuple it was built from, as :func:`_edge_fields` keeps its arrays (which copy the tables:
    only what reads ``edge_flat`` builds them)."""
    entry = store.get("edge_groups")
    if entry is None or entry[0] is not edges:
        members: dict[int, list[int]] = {}
        for e, edge in enumerate(edges):
            members.setdefault(id(edge.time_s), []).append(e)
        groups = []
        for positions in members.values():
            at = np.array(positions, dtype=np.int64)
            groups.append((
                edges[positions[0]].time_s, np.array([edges[e].u for e in positions], dtype=np.int64),
                np.array([edges[e].v for e in positions], dtype=np.int64), at,
            ))
        producers = np.array([e.u for e in edges], dtype=np.int64)
        consumers = np.array([e.v for e in edges], dtype=np.int64)
        entry = store["edge_groups"] = (edges, (tuple(groups), producers, consumers))
    return entry[1]


def _flatten_edges(edges: tuple[EdgeCost, ...]) -> dict[str, np.ndarray]:
    """:func:`_edge_fields` of ``edges``, computed."""
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


def _flat_rows(keys: tuple[int, ...], batch_class: np.ndarray, spaces: Sequence[ConfigSpace]) -> tuple[list[int], np.ndarray]:
    """``(rows, offsets)`` of :class:`_ModelParts`: the first op of each distinct (cost detail, batch
    dims) pair in graph order, and each op's start in the flat arrays (its pair's rows laid out in
    that order, each its space's size long)."""
    pairs = np.stack([np.fromiter(keys, dtype=np.int64, count=len(keys)), batch_class], axis=1)
    _, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # pairs numbered by their first op
    rows = [int(i) for i in first[order]]
    sizes = np.array([spaces[i].size for i in rows], dtype=np.int64)
    starts = np.empty(len(rows), dtype=np.int64)
    starts[order] = np.concatenate(([0], np.cumsum(sizes)[:-1]))  # by pair (np.unique's numbering)
    return rows, starts[inverse.ravel()]


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
    """Per distinct detail: the optimizer step's seconds at ZeRO 0, once per step (execution models; else 0)."""
    optimizer_floor_s: Mapping[int, float]
    """Per distinct detail: the step's host floor, one dispatch per owned float parameter tensor
    (:func:`objectives.compute.optimizer_step_time_s`), which no ZeRO sharding shortens."""
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
    shared: dict = field(default_factory=dict)
    """Values derived on first use and shared by the model's arrays at every ZeRO stage."""
    fp8_elements: Mapping[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """Per distinct detail, the ``(whole, sharded)`` elements of its FP8 linear weights that the settings'
    ``fp8_param_gather`` keeps in FP8 at ZeRO 1-3 (:func:`objectives.memory.fp8_weight_elements`); empty
    where the rule is off."""

    @staticmethod
    def build(model, graph_info: tuple | None = None) -> "_ModelParts":
        """Split ``model``; ``graph_info``: :func:`_graph_info` of its graph, when already known."""
        graph: OpGraph = model.graph

        forward_s: dict[int, np.ndarray] = {}
        backward_s: dict[int, np.ndarray] = {}
        optimizer_step: dict[int, np.ndarray | float] = {}
        floors: dict[int, float] = {}
        acts: dict[int, np.ndarray] = {}
        shards: dict[int, np.ndarray] = {}
        sharded: dict[int, np.ndarray] = {}
        owned, reads, tensors, _, batch_class = graph_info or _graph_info(graph)
        per = state_bytes_per_parameter(model.settings)
        zero3 = dataclasses.replace(model.settings, zero_stage=3, fp8_param_gather=False)  # elements: every one at per.param
        fp8 = dataclasses.replace(zero3, fp8_param_gather=model.settings.fp8_param_gather)
        fp8_elements, heads = {}, _output_ops(graph, fp8)
        if model.settings.zero_stage != 0:
            raise ValueError("pipeline arrays are derived from a ZeRO-0 cost model")
        # ops of one cost group share one detail object: its first op in graph order prices it
        keys = tuple(map(id, model.op_details))
        first = {key: index for index, key in reversed(tuple(enumerate(keys)))}  # the least index wins
        first = dict(sorted(first.items(), key=lambda item: item[1]))
        for key, index in first.items():
            op, detail = graph.ops[index], model.op_details[index]
            # the optimizer step runs once per step (after the last micro-batch), not per micro-batch
            optimizer_step[key] = detail.optimizer_s if detail.optimizer_s is not None else 0.0
            updated = len(updated_parameters(op, tensors, owned[index]))
            floors[key] = updated * model.cluster.device.host_dispatch_s if detail.optimizer_s is not None else 0.0
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
            shards[key] = detail.memory.params_bytes / per.param
            if owned[index]:
                params3, _, _ = parameter_state_bytes(
                    op, model.tables.configs[index], tensors=tensors, settings=zero3, owned_inputs=owned[index]
                )
                sharded[key] = params3 / per.param
                if fp8.gathers_fp8:
                    fp8_elements[key] = fp8_weight_elements(op, model.tables.configs[index], tensors=tensors, settings=fp8,
                                                            owned_inputs=owned[index], graph_output=index in heads)
            else:
                sharded[key] = shards[key]
        spaces = model.tables.configs
        rows, offsets = _flat_rows(keys, batch_class, spaces)
        return _ModelParts(
            key=keys,
            forward_s=forward_s,
            shard_elements=shards,
            sharded_elements=sharded,
            backward_s=backward_s,
            optimizer_s=optimizer_step,
            optimizer_floor_s=floors,
            activations_bytes=acts,
            first_op=first,
            owned=tuple(owned),
            reads=tuple(reads),
            tensors=tensors,
            rows=tuple(rows),
            offsets=offsets,
            degrees=_flat_degrees(graph, spaces, rows),
            fp8_elements=fp8_elements,
        )


def _output_ops(graph: OpGraph, settings: TrainingSettings) -> frozenset[int]:
    """The ops that write a tensor no op reads (the LM head), needed only where FP8 weights are gathered
    in FP8 (``settings.gathers_fp8``: the head's stays bf16); empty elsewhere, where it is not read."""
    if not settings.gathers_fp8:
        return frozenset()
    read = {e.tensor for e in graph.edges}
    return frozenset(i for i, op in enumerate(graph.ops) if any(a.tensor not in read for a in op.outputs))


def _gathered_elements(parts: _ModelParts, key: int, fp8: bool = False) -> np.ndarray:
    """Per configuration, the elements ZeRO-3 gathers whole for the op: its parameter shards where ZeRO
    divides them (a shard with no data-parallel replica is held whole already and gathers nothing);
    ``fp8``: of those, its FP8 weights' (:attr:`_ModelParts.fp8_elements`; zeros for an op without)."""
    whole, kept = parts.shard_elements[key], parts.sharded_elements[key]
    gathered = parts.fp8_elements[key][0] if fp8 and key in parts.fp8_elements else (0.0 if fp8 else whole)
    return np.where(kept < whole, gathered, 0.0)


def _hpz_elements(model, parts: _ModelParts, key: int, index: int, orders: Mapping | None, hpz: int) -> np.ndarray:
    """Per configuration, the elements of op ``index``'s share of ZeRO++'s secondary parameter copy
    (:func:`objectives.replication.hpz_secondary_elements`), its persistent parameters aside under DeepSpeed's rule
    (``orders``: :func:`_submodule_orders`): they are gathered whole after the first step and their secondary copy
    dropped (0.19.8 ``stage3.py`` ``_post_step``: ``invalidate_secondary_tensor``, then ``persistent_parameters``
    all-gathered, never partitioned again)."""
    whole, kept = parts.shard_elements[key], parts.sharded_elements[key]
    share = 1.0
    if orders is not None:
        op = model.graph.ops[index]
        owned = float(sum(np.prod(parts.tensors[op.inputs[p].tensor].shape) for p in parts.owned[index]))
        share = orders.get(index, PERSISTENT).elements / owned if owned > 0.0 else 0.0
    return hpz_secondary_elements(whole, kept, hpz) * share


def _submodule_orders(model, parts: _ModelParts, settings: TrainingSettings) -> dict | None:
    """Each sub-module's place in DeepSpeed's fetch trace (:func:`objectives.deepspeed_zero3.submodule_orders`) where
    ``settings`` gathers ZeRO-3 by a launcher's rule (``TrainingSettings.zero3_gather``), kept with the parts (an op
    absent gathers nothing: its parameters are persistent); ``None``: no such rule, the pricing's own."""
    if settings.zero_stage < 3 or settings.zero3_gather is None:
        return None
    key = ("submodule_orders", settings.zero3_gather.persistence_threshold)
    if key not in parts.shared:
        parts.shared[key] = submodule_orders(model.graph, parts.owned, parts.tensors,
                                             persistent_below=settings.zero3_gather.persistence_threshold)
    return parts.shared[key]


def _gradient_tails(parts: _ModelParts, settings: TrainingSettings, graph) -> dict:
    """Per op, the share of its gradient in DeepSpeed's last ZeRO-3 bucket, reduced exposed after the backward
    (:func:`objectives.deepspeed_zero3.gradient_tail_shares`), kept with the parts."""
    key = ("gradient_tails", settings.zero3_gather.reduce_bucket)
    if key not in parts.shared:
        parts.shared[key] = gradient_tail_shares(graph, parts.owned, parts.tensors,
                                                 reduce_bucket=settings.zero3_gather.reduce_bucket)
    return parts.shared[key]


def _row_members(parts: _ModelParts) -> dict[int, tuple[int, ...]]:
    """Per distinct detail (:attr:`_ModelParts.key`), every op that has it (the row's ops), kept with the parts."""
    if "row members" not in parts.shared:
        members: dict[int, list[int]] = {}
        for op, key in enumerate(parts.key):
            members.setdefault(key, []).append(op)
        parts.shared["row members"] = {key: tuple(ops) for key, ops in members.items()}
    return parts.shared["row members"]


def _row_sync_s(model, parts: _ModelParts, key: int, index: int, *, settings: TrainingSettings, cluster: Cluster,
                memo: dict, priced_sync: dict | None, heads: frozenset, orders: Mapping | None) -> tuple:
    """``(forward, backward, per-step, first forward)`` synchronisation seconds of the flat row of detail ``key``
    (``index``: its first op; :func:`_op_sync_s`'s columns): that op's (:func:`_op_sync_s`, kept in ``memo``); under a launcher's ZeRO-3 rule (``orders``) the mean
    over every op the row stands for, each priced at its own place in the trace (the layers of a stack are kept or
    gathered again by their own reuse distance, their gradients in the last bucket or not), so the row summed over
    the stack is what its ops pay (each op's distinct place priced once: its gathers per micro-batch, neighbours,
    last-bucket share; the places found once per row, :func:`_row_places`)."""
    detail = model.op_details[index]
    recomputed = bool(np.any(detail.recompute_s > 0.0))  # ZeRO-3 gathers a recomputed op again
    # under an execution model the overlap reads the op's compute, so the entry is the detail's own: a recompute
    # variant that keeps the op's detail (the donor's, objectives.tables._price_groups) reads the same entry
    executed = detail.grad_sync_unhidden_s is not None
    base = (index, settings.zero_stage, recomputed, id(detail) if executed else None,
            settings.zero_sync if settings.zero_stage in ZERO_SYNC_STAGES else None)
    members, distinct = ((None,), ((index, None),)) if orders is None else _row_places(
        model, parts, key, settings=settings, recomputed=recomputed, heads=heads, orders=orders)
    priced = {}
    for op, place in distinct:  # the first op of each place prices it, as one op after the other would
        memo_key = (*base, place)
        hit = memo.get(memo_key)
        if hit is None or (executed and hit[0] is not detail):  # the entry holds its detail: its id is no other's
            hit = memo[memo_key] = (detail, _op_sync_s(
                model, parts, op, detail, settings=settings, cluster=cluster, priced_sync=priced_sync, digests=memo,
                graph_output=op in heads, orders=orders, recomputed=recomputed))
        priced[place] = hit[1]
    if len(members) == 1:
        return priced[members[0]]
    return tuple(sum(column) / len(members) for column in zip(*(priced[place] for place in members)))


def _row_places(model, parts: _ModelParts, key: int, *, settings: TrainingSettings, recomputed: bool, heads: frozenset,
                orders: Mapping) -> tuple[tuple, tuple]:
    """``(places, distinct)`` of the row of detail ``key`` under a launcher's ZeRO-3 rule: each op's place in the
    trace (its memo key's last part: the rule, its gathered elements and neighbours, gathers per micro-batch,
    last-bucket share, owned inputs, whether it writes a graph output), in the row's op order, and each distinct
    place with the first op that has it; kept with the parts per (row, rule, recomputation, output ops), which fix
    them all (the orders and tails are the parts' at the rule's threshold and bucket)."""
    cache_key = ("row places", key, settings.zero3_gather, recomputed, heads)
    found = parts.shared.get(cache_key)
    if found is None:
        tails = _gradient_tails(parts, settings, model.graph)
        places, distinct = [], {}
        for op in _row_members(parts)[key]:
            order = orders.get(op, PERSISTENT)
            place = (settings.zero3_gather, order.elements, order.previous, order.following,
                     gathers_per_micro_batch(order, settings.zero3_gather, recomputed=recomputed),
                     tails.get(op), parts.owned[op], op in heads)
            places.append(place)
            distinct.setdefault(place, op)
        found = parts.shared[cache_key] = (tuple(places), tuple((op, place) for place, op in distinct.items()))
    return found


def _op_sync_s(model, parts: _ModelParts, index: int, detail, *, settings: TrainingSettings, cluster: Cluster,
               priced_sync: dict | None, digests: dict, graph_output: bool, orders: Mapping | None,
               recomputed: bool | None = None) -> tuple:
    """``(forward, backward, per-step, first forward)`` seconds of op ``index``'s ZeRO synchronisation: by the
    launcher's ZeRO-3 rule where it has one (``orders``: :func:`_submodule_orders`;
    :func:`objectives.deepspeed_zero3.deepspeed_op_sync_s`, whose once-per-step term, ZeRO++'s hpZ excess, runs in the
    step's first micro-batch's forward: the fourth column, ``first_forward_s``), else :func:`_zero_sync_s` (the op's
    part of its key kept with the parts; ``recomputed``: :func:`_zero_sync_s`'s; no first-forward term)."""
    op, space = model.graph.ops[index], model.tables.configs[index]
    common = dict(tensors=parts.tensors, settings=settings, owned=parts.owned[index], cluster=cluster,
                  graph_output=graph_output)
    if orders is not None:
        priced = deepspeed_op_sync_s(op, space, detail, order=orders.get(index, PERSISTENT),
                                     shard_elements=parts.shard_elements[parts.key[index]],
                                     tail_share=_gradient_tails(parts, settings, model.graph).get(index, 0.0), **common)
        if priced is not None:
            forward, backward, first = priced
            return forward, backward, np.zeros(forward.shape), first
    op_key = None
    if priced_sync is not None:  # the op's part of _sync_key: its space's content, dims and parameters (the parts fix them)
        op_key = parts.shared.get(("sync op key", index))
        if op_key is None:
            op_key = parts.shared[("sync op key", index)] = _sync_op_key(op, space, parts.tensors, parts.owned[index],
                                                                         digests)
    priced = _zero_sync_s(op, space, detail, memo=priced_sync, digests=digests, op_key=op_key, recomputed=recomputed,
                          **common)
    return (*priced, np.zeros(np.shape(priced[0])))


def _op_arrays(
    model, parts: _ModelParts, cluster: Cluster, zero_stage: int, sync_memo: dict | None = None,
    priced_sync: dict | None = None, edge_store: dict | None = None, zero_sync=None, pipelined: bool = False,
    zero3_gather=None,
) -> _OpArrays:
    """Split a cost model's per-op costs into forward / backward per micro-batch and per step, for
    ``zero_stage``.

    ``model`` is priced at ZeRO 0 (the cache builds no other): parameter states and gradient
    synchronisation, the only ZeRO-dependent terms, are priced here at ``zero_stage`` by the rules
    the tables use (states: ``objectives.memory``, whose ZeRO-z divides the optimizer (z>=1),
    gradients (z>=2) and parameters (z>=3) of each shard by its replication degree; synchronisation:
    :func:`_zero_sync_s`); the tests check the result against models built at each stage.
    ``sync_memo``: synchronisation already priced for other models of the same stage and batch
    (by op and ZeRO stage; by recomputation too under an execution model, whose overlap reads the
    op's compute); ``priced_sync``: :func:`_zero_sync_s`'s memo of terms priced on ``cluster``;
    ``edge_store``: :attr:`_OpArrays.edge_store`. ``zero_sync``: a launcher's ZeRO-1/2 rule
    (``TrainingSettings.zero_sync``, handed per plan); ``None``: the model's settings'. ``pipelined``: the stage is
    one of a pipeline, where a rule may partition ZeRO-0's optimizer (``ZeroSync.partition_stage``: DeepSpeed's
    ``BF16_Optimizer``), priced at ZeRO-1's states and synchronisation. ``zero3_gather``: a launcher's ZeRO-3 gathers
    (``TrainingSettings.zero3_gather``, handed per search: DeepSpeed's, priced by ``objectives.deepspeed_zero3``).
    """
    settings = dataclasses.replace(model.settings, zero_stage=zero_stage)
    if zero3_gather is not None and zero_stage >= 3:
        settings = dataclasses.replace(settings, zero3_gather=zero3_gather)
    if zero_sync is not None:
        settings = dataclasses.replace(settings, zero_sync=zero_sync)
    if zero_stage in ZERO_SYNC_STAGES and settings.zero_sync is not None:
        zero_stage = settings.zero_sync.partition_stage(zero_stage, pipelined=pipelined)
        settings = dataclasses.replace(settings, zero_stage=zero_stage)
    per = state_bytes_per_parameter(settings)
    per_key: dict[int, tuple] = {}
    memo = sync_memo if sync_memo is not None else {}
    heads = _output_ops(model.graph, settings)
    layers = block_layers(model.graph) if settings.offload != "none" else None  # objectives.offload
    kept_share: dict[int, np.ndarray] = {}  # activation offload: the share of each op's activations left on the device
    first_forward: dict[int, np.ndarray] = {}  # hpZ: each row's extra in the step's first forward (objectives.first_forward)
    orders = _submodule_orders(model, parts, settings)  # DeepSpeed's ZeRO-3 rule: each sub-module's place in its trace
    for key, index in parts.first_op.items():
        detail = model.op_details[index]
        whole, kept = parts.shard_elements[key], parts.sharded_elements[key]
        params = per.param * (kept if zero_stage >= 3 else whole)
        if settings.gathers_fp8 and key in parts.fp8_elements:  # FP8 weights kept in FP8: objectives.precision
            params = params - (per.param - fp8_primary_bytes(settings)) * parts.fp8_elements[key][zero_stage >= 3]
        if zero_stage >= 3 and settings.hpz_partition is not None:  # ZeRO++'s secondary copy, in the parameters' dtype
            params = params + per.gathered * _hpz_elements(model, parts, key, index, orders, settings.hpz_partition)
        grads = per.grad * (kept if zero_stage >= 2 else whole)
        optimizer = per.optimizer * (kept if zero_stage >= 1 else whole)
        sync_f, sync_b, step, first = _row_sync_s(model, parts, key, index, settings=settings, cluster=cluster,
                                                  memo=memo, priced_sync=priced_sync, heads=heads, orders=orders)
        if np.any(first > 0.0):
            first_forward[key] = np.broadcast_to(first, parts.forward_s[key].shape)
        optimizer_s = parts.optimizer_s[key]
        if zero_stage >= 1:
            # from ZeRO-1 on each rank updates its share of the optimizer state (the bytes above):
            # the step's memory-bound pass shrinks with it, its per-tensor host floor does not
            share = np.divide(kept, whole, out=np.ones_like(whole, dtype=np.float64), where=whole > 0)
            optimizer_s = np.maximum(optimizer_s * share, parts.optimizer_floor_s[key])
        sync_s = step
        columns = (
            parts.forward_s[key] + sync_f, parts.backward_s[key] + sync_b, step + optimizer_s, params, grads, optimizer,
            parts.activations_bytes[key],
        )
        if layers is not None:  # host memory priced by the host link (objectives.offload)
            columns = offload_columns(columns, settings=settings, device=cluster.device, optimizer_s=optimizer_s,
                                      block_layers=layers.get(index, 0), step_floor_s=parts.optimizer_floor_s[key])
            before = parts.activations_bytes[key]
            if settings.offload == "activations" and np.any(columns[6] != before):
                kept_share[key] = np.divide(columns[6], before, out=np.ones(before.shape), where=before > 0)
        per_key[key] = (*columns, columns[2] - sync_s)  # update_s: the step less the stage's own synchronisation
    row_columns = list(zip(*(per_key[parts.key[i]] for i in parts.rows)))
    flat = {name: np.concatenate(row_columns[i]) for i, name in enumerate(_COLUMNS)}
    flat.update(parts.degrees)
    if kept_share:  # the credits priced against the tables' activations shrink with them (objectives.pipeline_price)
        flat["activations_kept"] = np.concatenate([kept_share.get(parts.key[i], np.ones(parts.activations_bytes[parts.key[i]].shape))
                                                   for i in parts.rows])
    if first_forward:  # kept apart from step_s: the price floors it with the first micro-batch's forward
        flat["first_forward_s"] = np.concatenate([first_forward.get(parts.key[i], np.zeros(parts.forward_s[parts.key[i]].shape))
                                                  for i in parts.rows])
    if zero_stage >= 3:  # each op's sharded parameters whole, as FSDP2 / ZeRO-3 gathers them (objectives.memory.fsdp_unsharded_peak)
        gathered = np.concatenate([_gathered_elements(parts, parts.key[i]) for i in parts.rows])
        flat["unsharded_bytes"] = per.gathered * gathered
        if settings.gathers_fp8 and parts.fp8_elements:  # FP8 weights gathered at 1 B: elements kept apart
            fp8 = np.concatenate([_gathered_elements(parts, parts.key[i], fp8=True) for i in parts.rows])
            flat["unsharded_bytes"] = flat["unsharded_bytes"] - (per.gathered - FP8_PARAM_BYTES) * fp8
            flat["unsharded_elements"] = gathered
    return _OpArrays(
        model=model,
        key=parts.key,
        per_key=per_key,
        edges=tuple(model.tables.edges),
        tied_source=(cluster, settings, parts.reads),
        shared=parts.shared,
        edge_store=edge_store if edge_store is not None else {},
        offsets=parts.offsets,
        flat=flat,
    )
