r"""Price pipeline plans: per-stage cost models cached, per-op costs split into forward / backward /
per-step parts, and a whole plan.

A pipeline plan (:mod:`planner.search.pipeline` searches them) runs ``pp`` stages of
:math:`d = N / pp` devices each; the global batch :math:`G` runs as :math:`m = G / b` micro-batches
of :math:`b` samples. Every op and edge is priced by the ordinary cost model
(:func:`objectives.tables.build_cost_model`) on a :math:`d`-device stage
(:func:`~objectives.pipeline_stages.stage_cluster`) at batch :math:`b`, once per (d, b, recompute)
at ZeRO 0 (:class:`PipelineCostCache`, here: the recompute variants reuse the first one's
configuration spaces and edge tables). Where each term is computed, each part's math in its
module's docstring:

* the layers and the bytes crossing each cut: :func:`~objectives.pipeline_stages.layer_structure`
  (:mod:`objectives.pipeline_stages`);
* per op, forward and backward seconds per micro-batch and per-step seconds, the parameter states
  and the gradient synchronisation at every ZeRO stage (ZeRO under gradient accumulation), and the
  copies of tied parameters: :mod:`objectives.pipeline_arrays`;
* one plan (stage cut, per-op choice, ZeRO, recompute, schedule): its step time with the bubble,
  the stage-to-stage transfers and each stage's per-step synchronisation, and its memory per stage:
  :func:`~objectives.pipeline_price.price_plan` (:mod:`objectives.pipeline_price`).

Every public name of those modules is importable from here.

References
----------
D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC 2021. S. Rajbhandari et al., "ZeRO", SC 2020.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Literal, Sequence

import numpy as np

from objectives.after_layers import tail_in_flight
from objectives.collectives import point_to_point_time_s
from objectives.edge_cells import EdgeCells
from objectives.memory import OTHER_FRACTION
from objectives.nccl_memory import NCCL_MAX_CHANNELS, connection_bytes, net_p2p_bytes
from objectives.pipeline_arrays import _graph_info, _ModelParts, _op_arrays, _OpArrays
from objectives.pipeline_price import (
    PipelinePoint,
    PipelineTime,
    StagePlan,
    _gated_credit,
    _Priced,
    evaluate_pipeline,
    grad_accumulator_scale,
    nccl_stage_bytes,
    price_plan,
    runtime_buffer_rates,
    segment_activation_bytes,
    stage_host_floors_s,
    tied_sync_s,
    unsharded_segment_bytes,
    zero_sync_rule,
)
from objectives.pipeline_stages import LayerStructure, layer_structure, stage_cluster
from objectives.saved_credits import KEEPS_LINEAR_INPUTS, sequence_shard_ceiling
from objectives.schedules import boundary_crosses_node, in_flight_micro_batches, pipeline_time_lower_bound_s
from objectives.tables import build_cost_model, chosen_edges, with_edges
from planner.core.cluster import Cluster
from planner.core.configs import ConfigOptions, batch_products
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import TrainingSettings

__all__ = [
    "GraphAtBatch",
    "LayerStructure",
    "layer_structure",
    "stage_cluster",
    "PipelineCostCache",
    "ContextSplit",
    "StagePlan",
    "PipelineTime",
    "PipelinePoint",
    "evaluate_pipeline",
    "price_plan",
]

GraphAtBatch = Callable[[int], OpGraph]
"""``graph_at_batch(samples) -> OpGraph``: the model with its batch dim bound to ``samples``."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ContextSplit:
    """Where context parallelism may split a sequence across nodes (handed down by the roof, from
    the launchers' own rules): :meth:`PipelineCostCache.masks` lets each op's sequence dim cross
    nodes, its tensor-parallel dims staying inside one, as Megatron-LM and torchtitan place ``cp``
    outside ``tp`` in their rank order."""

    dims: Callable[[OpGraph], Sequence[str | None]]
    """``graph -> per op, the dim context parallelism splits`` (``None``: none; an empty sequence:
    the model has no sequence to split)."""
    launchers: frozenset[str] = frozenset()
    """The launch targets that run it (a search under another's rules keeps its batch split on every node)."""
    min_tokens: int
    """Each context-parallel rank keeps at least this many tokens (``exporters._target.CP_MIN_TOKENS``):
    so a sequence of ``s`` tokens crosses at most ``s / min_tokens`` nodes."""


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
        "graph_at_batch", "cluster", "settings", "cost_model", "measured", "product_rule", "max_split_dims", "moe_layers", "keep", "context",
        "plans", "_graphs", "_graph_info", "_structures", "_models", "_parts", "_arrays", "_masks", "_contexts", "_splits", "_derived", "_lasting", "_priced_sync", "_moe",
        "_edgeless", "builds", "build_time_s", "searched_again", "later_memory_rules", "later_zero_syncs",
        "later_zero3_gathers", "later_rules",
        "_host_shares",
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
        priced_sync: dict[int, dict] | None = None,
        context: ContextSplit | None = None,
    ) -> None:
        self.graph_at_batch = graph_at_batch
        self.context = context
        """Which sequence split may cross nodes (:class:`ContextSplit`); ``None``: none does."""
        self.moe_layers = moe_layers
        """``graph -> its routed-experts layers`` (``importers.moe.find_moe_layers``, handed down by
        the roof): each stage model's expert ops are then priced by the tokens routed to them and
        split ``settings.expert_parallel`` ways (:func:`objectives.moe.price_moe`), as the per-op
        plan prices them; ``None``: priced as the dense ops of the graph."""
        self.keep = False
        """Keep every (devices, batch) pair's models when a search releases them (:meth:`release`
        does nothing): for several searches over one cache (one per launch target), which would
        otherwise each build them again; memory then grows with the pairs searched."""
        self.searched_again = False
        """Another search reads this cache after the one running (the next launcher's, the headroom
        search): a launcher's search then keeps, besides its own bounds, those over the search's
        masks for it (``planner.search.pipeline._Slot.keep_own_bounds``), which no later search
        would read otherwise."""
        self.later_memory_rules: frozenset[tuple[bool, ...]] | None = None
        """The memory rules ``(sequence_shard_saved, fused_swiglu)`` of the searches that read this cache after
        the running one (``planner.launchable``): those bounds are kept under these rules only; ``None``: not
        known (a search of its own), under its own rules and without any."""
        self.later_zero_syncs: frozenset | None = None
        """The ZeRO synchronisation rules (``TargetRules.zero_sync``; ``None`` in the set: the pricing's own) of the
        searches that read this cache after the running one: their 0-1 splits and bounds are kept under these rules
        (a later search's own would build the pair's models again to find them); ``None``: not known, the running
        search's rule alone."""
        self.later_zero3_gathers: frozenset | None = None
        """The same for their ZeRO-3 gathers (``TargetRules.zero3_gather``, whose time ``objectives.deepspeed_zero3``
        prices; ``None`` in the set: the pricing's own): their ZeRO-3 bounds are kept under these too."""
        self.later_rules: tuple | None = None
        """Those searches' rules themselves (``planner.search.pipeline.TargetRules``; ``None`` in the tuple: a search
        without), so that only the bounds one of them may ask are kept (what its launcher pipelines at each size,
        ``planner.search.pipeline._Slot._read_later``); ``None``: not known, every bound the sets above allow."""
        self._host_shares: dict[str, Any] = {}
        """:meth:`recomputed_share` per recompute mode and :meth:`eager_extra_kernels` (read at every plan priced)."""
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
        self._contexts: dict[int, tuple[str | None, ...]] = {}
        self._splits: dict[int, frozenset[tuple[str, str]]] = {}  # context_splits per batch (read by every model built)
        self._derived: dict[tuple[int, int], dict] = {}
        self._lasting: dict[tuple[int, int], dict] = {}
        self._moe: dict[int, tuple] = {}
        self._priced_sync: dict[int, dict] = {} if priced_sync is None else priced_sync
        """Gradient synchronisation priced per stage size, by content (shared across micro-batches
        and kept when a pair is released: ``objectives.pipeline_arrays._sync_key``); ``priced_sync``:
        another cache's on the same cluster (the key holds every setting the terms read, so caches of
        other execution models and HSDP shard groups share it)."""
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
            max_split_dims=self.max_split_dims, context_dims=self.context_splits(batch),
        )
        layers = self._moe_layers_at(batch, graph)
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

    def _moe_layers_at(self, batch: int, graph: OpGraph) -> Sequence:
        """The MoE layers of the graph at ``batch`` (found once per batch: every stage size reads them)."""
        if self.moe_layers is None or self.cost_model == "pase":
            return ()
        if batch not in self._moe:
            self._moe[batch] = tuple(self.moe_layers(graph))
        return self._moe[batch]

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
        for k in [k for k in self._arrays if k[:2] == (devices, batch)]:  # their flat edges follow on first use
            self._arrays[k] = dataclasses.replace(
                self._arrays[k], model=self._models[(devices, batch, 0, k[3])], edges=priced.tables.edges
            )
        self.build_time_s += time.perf_counter() - started

    def arrays(self, devices: int, batch: int, zero_stage: int, recompute: str, *, edges: bool = True,
               zero_sync: Any = None, zero3_gather: Any = None) -> _OpArrays:
        """Per-op pipeline costs at ``zero_stage`` (from the ZeRO-0 cost model, re-priced);
        ``edges=False``: possibly without the edge tables (see :meth:`model`); ``zero_sync``: a launcher's
        ZeRO-1/2 synchronisation (``TrainingSettings.zero_sync``, or its rule ``zero_sync(*, zero_stage, precision,
        offload)``, per plan; ``None`` or another ZeRO stage: the settings'); ``zero3_gather``: a launcher's ZeRO-3
        gathers (``Target.zero3_gather``, DeepSpeed's: ``objectives.deepspeed_zero3``), per search; ``None`` or
        another ZeRO stage: the settings')."""
        if edges and (devices, batch) in self._edgeless:
            self._price_edges(devices, batch)
        # a launcher's rule (Target.zero_sync) asked at these settings; None stays the settings' own
        zero_sync = zero_sync_rule(self, zero_stage, zero_sync) if zero_sync is not None else None
        zero3_gather = zero3_gather if zero_stage >= 3 else None
        key = (devices, batch, zero_stage, recompute) + ((zero_sync,) if zero_sync is not None else ()) \
            + (("zero3", zero3_gather) if zero3_gather is not None else ())
        if key not in self._arrays:
            model = self.model(devices, batch, 0, recompute, edges=edges)
            parts_key = (devices, batch, recompute)
            if parts_key not in self._parts:
                if batch not in self._graph_info:
                    self._graph_info[batch] = _graph_info(self.graph(batch))
                self._parts[parts_key] = _ModelParts.build(model, self._graph_info[batch])
            self._arrays[key] = _op_arrays(
                model, self._parts[parts_key], stage_cluster(self.cluster, devices), zero_stage,
                self.derived(devices, batch).setdefault(("zero_sync",), {}), self._priced_sync.setdefault(devices, {}),
                edge_store=self.derived(devices, batch).setdefault(("edge_fields",), {}), zero_sync=zero_sync,
                zero3_gather=zero3_gather,
                pipelined=devices < self.cluster.devices,  # a stage of devices / pp ranks (ZeroSync.partition_stage)
            )
        return self._arrays[key]

    def chosen_edges(self, devices: int, batch: int, recompute: str,
                     picks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(producers, consumers, seconds)`` of every op pair of the ``devices``-device stage model at
        ``batch`` with the choice ``picks`` (:func:`objectives.tables.chosen_edges`): read from its tables
        where they are priced, else priced at ``picks`` alone, no table built or kept (a plan whose choice
        is fixed before pricing: ``PipelinePoint``'s seconds and bytes are those of the tables)."""
        model = self.model(devices, batch, 0, recompute, edges=False)
        if not model.edges_priced:  # from the model :meth:`_price_edges` would price them with (recompute variants share them)
            cells = self.edge_cells(devices, batch)
            if cells is not None:  # the cells the search reads, priced once for all its plans (objectives.edge_cells)
                return cells.at(picks)
            model = next(m for k, m in self._models.items() if k[:2] == (devices, batch))
        return chosen_edges(model, picks)

    def edge_cells(self, devices: int, batch: int) -> EdgeCells | None:
        """The (devices, batch) pair's edge tables priced at the cells its searches read
        (:class:`objectives.edge_cells.EdgeCells`, kept with the pair's models: :meth:`derived`), from the model
        :meth:`_price_edges` would price them with; ``None`` where its tables are priced (read them) or the cells
        do not apply (PaSE, tensor-parallel overlap: ``EdgeCells.of``)."""
        if (devices, batch) not in self._edgeless:  # (a set: asked once per plan priced, before any model scan)
            if self.holds(devices, batch):
                return None  # priced whole already (or PaSE's, with the build)
            self.model(devices, batch, 0, "none", edges=False)
            if (devices, batch) not in self._edgeless:
                return None
        store = self.derived(devices, batch)
        if ("edge cells",) not in store:
            first = next(m for k, m in self._models.items() if k[:2] == (devices, batch))
            store[("edge cells",)] = EdgeCells.of(first)
        return store[("edge cells",)]

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

    def lasting(self, devices: int, batch: int) -> dict:
        """A store for the few numbers a caller derives from the (devices, batch) pair's models (the
        search's lower bounds over its own masks), kept when they are released: a later search over
        this cache (the next launcher's, the headroom search) then needs no model it prunes by them."""
        return self._lasting.setdefault((devices, batch), {})

    # What the pipeline search needs of the pricing besides the per-op arrays (it never imports
    # objectives): the memory allowance, the schedule's in-flight counts and makespan floor, the
    # boundary transfers' floor, and the price of a plan.

    memory_scale = 1.0 + OTHER_FRACTION
    """Memory per device is ``memory_scale x`` (parameter states + activations): the allowance of
    :data:`objectives.memory.OTHER_FRACTION`."""

    @staticmethod
    def in_flight(schedule: str, *, stages: int, micro_batches: int, chunks: int = 1,
                  stage_layers: np.ndarray | None = None) -> np.ndarray:
        """:func:`objectives.schedules.in_flight_micro_batches`."""
        return in_flight_micro_batches(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks,
                                       stage_layers=stage_layers)

    @staticmethod
    def tail_in_flight(in_flight: float, chunks: int) -> float:
        """:func:`objectives.after_layers.tail_in_flight` (the micro-batches of the ops after the last layer the last
        stage holds: one under a looped schedule), for the search's bounds."""
        return float(tail_in_flight(in_flight, chunks))

    def makespan_floor_s(self, schedule: str, **kwargs: Any) -> float:
        """:func:`objectives.schedules.pipeline_time_lower_bound_s`; transfers at 0 under ``settings.p2p_overlap``."""
        overlapped = bool(getattr(getattr(self, "settings", None), "p2p_overlap", False))
        return pipeline_time_lower_bound_s(schedule, p2p_overlapped=overlapped, **kwargs)

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

    def recomputed_share(self, recompute: str) -> float:
        """:func:`objectives.graph_facts.recomputed_share` of the model (any batch: the same ops)."""
        from objectives.graph_facts import recomputed_share

        if not self._graphs:
            return float(recompute == "full")
        if recompute not in self._host_shares:
            self._host_shares[recompute] = recomputed_share(next(iter(self._graphs.values())), recompute)
        return self._host_shares[recompute]

    def eager_extra_kernels(self) -> tuple[float, float]:
        """:func:`objectives.fixed_cost_parts.eager_extra_kernels` of the model under its settings (any batch)."""
        from objectives.fixed_cost_parts import eager_extra_kernels

        if not self._graphs:
            return 0.0, 0.0
        if "eager_extra" not in self._host_shares:
            self._host_shares["eager_extra"] = eager_extra_kernels(next(iter(self._graphs.values())), self.settings)
        return self._host_shares["eager_extra"]

    def host_floors_s(self, layers: np.ndarray, recompute: str) -> tuple[np.ndarray, np.ndarray, float] | None:
        """:func:`objectives.pipeline_price.stage_host_floors_s` with this cache."""
        return stage_host_floors_s(self, layers, recompute)

    def tied_sync_s(self, grad_bytes: float) -> float:
        """:func:`objectives.pipeline_price.tied_sync_s` with this cache."""
        return tied_sync_s(self, grad_bytes)

    def unsharded_segment_bytes(self, arrays: _OpArrays, structure: LayerStructure, picks: np.ndarray, pp: int,
                                micro_batches: int, zero3_gather: Any = None) -> np.ndarray | None:
        """:func:`objectives.pipeline_price.unsharded_segment_bytes` (ZeRO-3's unsharded units per segment;
        ``zero3_gather``: the searching launcher's gather bounds, per search, not per cache)."""
        return unsharded_segment_bytes(arrays, structure, picks, pp, micro_batches, zero3_gather)

    def segment_activation_bytes(self, arrays: _OpArrays, structure: LayerStructure, picks: np.ndarray,
                                 activations: np.ndarray, in_flight: np.ndarray, recompute: str, *,
                                 sequence_shard_saved: bool | None = None, fused_swiglu: bool | None = None,
                                 chunks: int = 1) -> np.ndarray:
        """:func:`objectives.pipeline_price.segment_activation_bytes` (the activations a stage holds per segment;
        ``sequence_shard_saved``, ``fused_swiglu``: the searching launcher's rules, per search, not per cache)."""
        return segment_activation_bytes(arrays, structure, picks, activations, in_flight, recompute,
                                        sequence_shard_saved=sequence_shard_saved, fused_swiglu=fused_swiglu, chunks=chunks)

    def grad_accumulator_scale(self, arrays: _OpArrays, zero_stage: int, pp: int, grad_accumulator: Any = None) -> float:
        """Bytes of a launcher's bf16 gradient accumulator per byte of the gradients a stage holds
        (:func:`objectives.pipeline_price.grad_accumulator_scale`; ``grad_accumulator``: the searching
        launcher's rule, per plan, not per cache)."""
        return grad_accumulator_scale(arrays, zero_stage, pp, grad_accumulator)[1]

    def runtime_buffer_rates(self, arrays: _OpArrays, picks: np.ndarray, in_flight: np.ndarray, micro_batches: int,
                             chunks: int, kind: str | None = None, schedule: str | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """Each stage's bytes of its launcher's pipeline buffers per byte of its input and output cut
        (:func:`objectives.pipeline_price.runtime_buffer_rates`), for the search's segment costs."""
        return runtime_buffer_rates(arrays, picks, in_flight, micro_batches, chunks, kind, schedule)

    def nccl_stage_bytes(self, arrays: _OpArrays, picks: np.ndarray, pp: int, *, interleaved: bool) -> np.ndarray:
        """``(pp,)`` bytes of NCCL's buffers on a rank of each stage of the plan ``picks``
        (:func:`objectives.pipeline_price.nccl_stage_bytes`), for the search's segment costs."""
        return nccl_stage_bytes(self, arrays, picks, pp, interleaved=interleaved)

    def nccl_floor_bytes(self, devices: int, pp: int) -> float:
        """Bytes of NCCL's buffers every plan of ``pp`` stages of ``devices`` devices holds on its fullest stage at
        least (:func:`objectives.pipeline_price.nccl_stage_bytes`): a stage of two or more devices is in one collective
        group at least (its tensor-, context- or data-parallel group), a pipeline's rank has a neighbour, an
        expert-parallel rank ``ep - 1`` all-to-all peers; for the search's memory bounds, which the term must
        not leave below every plan's price."""
        if self.cluster.devices <= 1:
            return 0.0
        ep = int(getattr(self.settings, "expert_parallel", 1) or 1)
        ring = NCCL_MAX_CHANNELS * connection_bytes(self.cluster.nccl_buffsize_bytes)
        neighbour = min(ring, net_p2p_bytes()) if pp > 1 else 0.0  # on the node or across: the lesser
        return float((int(devices > 1) + max(ep - 1, 0)) * ring + neighbour)

    def activation_credit_ceiling(self, arrays: _OpArrays, recompute: str, *, sequence_shard_saved: bool = False,
                                  fused_swiglu: bool = False) -> dict[int, np.ndarray] | None:
        """``{op: (K,) bytes per micro-batch}`` no plan's activation credit under these rules exceeds, per
        configuration, for the search's lower bounds: the sequence shard's ceiling
        (:func:`objectives.saved_credits.sequence_shard_ceiling`) plus the fused SwiGLU's credit itself (one
        op's, :func:`objectives.gated_credit.fused_swiglu_credit`); ``None`` where none applies. Kept with the
        arrays of every ZeRO stage (``arrays.shared``: it reads the graph, the configurations and the activations,
        none of which ZeRO moves): one object per rules, which the bounds' own memo keys by."""
        key = ("credit ceiling", recompute, bool(sequence_shard_saved), bool(fused_swiglu))
        if key not in arrays.shared:
            credit: dict[int, np.ndarray] = {}
            if sequence_shard_saved and recompute in KEEPS_LINEAR_INPUTS:
                credit.update(sequence_shard_ceiling(arrays.model.graph, arrays.spaces, self.settings, arrays.shared))
            for op, table in (_gated_credit(arrays, recompute, fused_swiglu) or {}).items():
                credit[op] = credit[op] + table if op in credit else table
            arrays.shared[key] = credit or None
        return arrays.shared[key]

    def price(self, **plan: Any) -> "_Priced":
        """:func:`price_plan` with this cache."""
        return price_plan(self, **plan)

    def masks(self, devices: int, batch: int, *, inside_node: bool, data_parallel: int | None) -> list[np.ndarray]:
        """Per op, the configurations the pipeline search allows on a stage: ``inside_node``: the
        non-batch dims split inside a node only (``PipelineOptions.model_parallel_inside_node``), but
        the sequence dim of :attr:`context` (context parallelism), which may cross nodes while each
        node keeps ``min_tokens`` of it, and the redundant copies of an op with a batch dim too
        (copies of one without are data parallel); ``data_parallel``: the batch dims split exactly
        that many ways (``None``: any)."""
        key = (devices, batch, inside_node, data_parallel)
        if key not in self._masks:
            graph = self.graph(batch)
            model = self.model(devices, batch, 0, "none", edges=False)
            if batch not in self._graph_info:
                self._graph_info[batch] = _graph_info(graph)
            along = self.context_dims(batch) if inside_node else ()
            memo: dict[tuple, np.ndarray] = {}
            # ops of one class share one space object: looked up by its id first (the spaces live
            # while the model does), the tables' key only once per space
            by_space: dict[tuple[int, tuple[bool, ...], str | None], np.ndarray] = {}
            masks = []
            for index, (op, space, is_batch) in enumerate(zip(graph.ops, model.tables.configs, self._graph_info[batch][3])):
                sequence = along[index] if along else None
                known = by_space.get((id(space), is_batch, sequence))
                if known is not None:
                    masks.append(known)
                    continue
                memo_key = (space.table_key, is_batch, sequence)
                if memo_key not in memo:
                    memo[memo_key] = self._allowed(op, space, is_batch, sequence, inside_node, data_parallel)
                by_space[(id(space), is_batch, sequence)] = memo[memo_key]
                masks.append(memo[memo_key])
            self._masks[key] = masks
        return self._masks[key]

    def _allowed(self, op, space, is_batch: tuple[bool, ...], sequence: str | None, inside_node: bool,
                 data_parallel: int | None) -> np.ndarray:
        """One op's mask of :meth:`masks` (``sequence``: its dim that may cross nodes, or ``None``)."""
        allowed = np.ones(space.size, dtype=bool)
        batch_dims = np.array(is_batch, dtype=bool)
        if inside_node and space.factors.shape[1]:
            inside = ~batch_dims
            if sequence is not None and self.context is not None:
                column = space.dim_names.index(sequence)
                inside[column] = False
                nodes = space.inter_factors[:, column]
                allowed &= (nodes == 1) | (op.dim(sequence).size >= nodes * self.context.min_tokens)
            allowed &= np.all(space.inter_factors[:, inside] == 1, axis=1)
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
        return allowed

    def context_dims(self, batch: int) -> tuple[str | None, ...]:
        """Per op of the model at ``batch``, the dim :attr:`context` lets cross nodes (``()``: none)."""
        if self.context is None:
            return ()
        if batch not in self._contexts:
            self._contexts[batch] = tuple(self.context.dims(self.graph(batch)))
        return self._contexts[batch]

    def context_splits(self, batch: int) -> frozenset[tuple[str, str]]:
        """``(op name, dim name)`` of each sequence dim of :attr:`context` long enough for ``cp >= 2``
        (``min_tokens`` a rank), in the model at ``batch``: the stage models' spaces then hold ``dp x cp x tp``
        configurations of 3 split dims (:attr:`planner.core.configs.ConfigOptions.context_dims`); empty: none (no
        launcher that runs context parallelism searched, or short sequences: the spaces are those of 2 split dims)."""
        if self.context is None or self.max_split_dims != 2:
            return frozenset()
        if batch not in self._splits:  # one object per batch: the graph, the context and the split limit are fixed
            graph = self.graph(batch)
            self._splits[batch] = frozenset((op.name, d) for op, d in zip(graph.ops, self.context_dims(batch))
                                            if d is not None and op.dim(d).size >= 2 * self.context.min_tokens)
        return self._splits[batch]

    def context_nodes(self, devices: int, batch: int) -> int:
        """The most nodes a ``devices``-device stage's sequence split may cross (:attr:`context`: each
        node keeps ``min_tokens``; 1 without it), read on the model at ``batch`` (any: the sequence
        does not change with the batch)."""
        nodes = devices // self.cluster.devices_per_node
        dims = self.context_dims(batch) if nodes > 1 else ()
        if not dims or self.context is None:
            return 1
        graph = self.graph(batch)
        tokens = max((op.dim(d).size for op, d in zip(graph.ops, dims) if d is not None), default=0)
        return max((e for e in range(1, nodes + 1) if nodes % e == 0 and tokens >= e * self.context.min_tokens),
                   default=1)
