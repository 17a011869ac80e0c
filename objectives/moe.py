r"""Mixture-of-Experts pricing: experts cost the tokens they really get, and expert parallelism.

Two steps, both pure functions:

1. :func:`routed_graph` (graph level, once per import): the per-token gather of whole expert
   weight matrices that some exports write (``importers.moe`` style ``gather``) is an indexing
   artefact: a framework runs the experts as grouped GEMMs on the ``[E, a, b]`` weights and never
   materialises a ``[T k, a, b]`` copy. The gathers are dropped and the expert matmuls read the
   weights directly, so memory is the experts' parameters plus the routed activations.

2. :func:`price_moe` (per cost model): with :math:`T` tokens and top-:math:`k` routing over
   :math:`E` experts the experts together process :math:`R = T k \kappa` token-expert pairs, with
   :math:`\kappa` the share the expert capacity keeps (1 dropless; capacity factor :math:`c`:
   :func:`objectives.moe_terms.kept_fraction`). An expert op that computes :math:`N` token rows in
   the export (``T k`` for gathered/routed experts, ``E T`` for dense batched or per-expert exports
   that push every token through every expert) has its compute, intra-op communication and saved
   activations scaled by :math:`\rho = R / N` (:func:`routed_fraction` times :math:`\kappa`), its
   time further by the busiest expert-parallel rank's load (``rank_imbalance``) and, for the
   products, the grouped GEMM's row tiles (``tile_efficiency``); the layer's token permutations
   (``permute_bytes``) are charged to its first expert product. Each added term is in the op
   detail's ``moe_s`` (:mod:`objectives.moe_terms` derives and cites each).

   Expert parallelism of degree :math:`ep` (experts split :math:`ep` ways over the data-parallel
   ranks, Megatron's ``--expert-model-parallel-size``) changes, for each configuration of an expert
   op whose token split :math:`R_t` (the product of the factors of its dims that index no
   parameter and are not reductions: its data-parallel group) is a multiple of :math:`ep`:

   * expert parameter states: the parameter and gradient copies are divided by :math:`ep`, the
     optimizer state too unless ZeRO already shards it over the data-parallel group (stage
     :math:`\geq 1` optimizer, :math:`\geq 2` gradients, 3 parameters: those are unchanged, as
     Megatron's distributed optimizer shards expert state over the expert-data-parallel group);
   * the gradient all-reduce runs over :math:`R_t / ep` ranks on :math:`1/ep` of the bytes:
     ring bandwidth term scaled by :math:`(R_t - ep) / (ep (R_t - 1))` (latency left as is);
   * the routed tokens move by all-to-all before and after the experts, forward and backward:
     :math:`4 \times` ``objectives.collectives.all_to_all_time_s`` of
     :math:`R h b / R_t` bytes per device times the busiest rank's load over the mean
     (:math:`h` the model width, :math:`b` bytes per element)
     over the :math:`ep` ranks (inside a node as far as the node holds them after the op's other
     splits), charged to the layer's first expert matmul (``comm_s`` kind ``all_to_all``).

   Configurations of an op reading expert weights whose token split is not a multiple of
   :math:`ep` cannot run under that degree: their time is ``inf``.

References: Fedus et al., Switch Transformers (JMLR 2022) for capacity factor and all-to-all
dispatch; Megatron-Core's MoE (``--expert-model-parallel-size``) for ep over the dp ranks.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from objectives._common import element_bytes
from objectives.collectives import all_to_all_time_s
from objectives.compute import MEMORY_BANDWIDTH_EFFICIENCY
from objectives.memory import MemoryArrays
from objectives.moe_terms import PERMUTE_KERNELS, kept_fraction, permute_bytes, rank_imbalance, tile_efficiency
from planner.core.errors import InputError
from planner.core.graph import BlockGroup, Edge, Op, OpGraph, TensorAccess

__all__ = ["routed_graph", "routed_fraction", "token_split", "price_moe", "expert_degrees", "layer_terms", "LayerTerms"]


def routed_graph(graph: OpGraph, layers: Sequence) -> OpGraph:
    """``graph`` with the per-token weight gathers of ``gather``-style layers dropped.

    Each matmul that read a gathered ``[T k, a, b]`` weight reads the ``[E, a, b]`` parameter
    instead (its expert axis indexed by no dim: which expert is data-dependent); edges, blocks and
    tensors are rebuilt. Other layers and graphs come back unchanged (the same object).

    Parameters
    ----------
    graph:
        The imported op graph.
    layers:
        ``importers.moe.find_moe_layers(graph)``.
    """
    drop: set[int] = set()
    replaced: dict[int, Op] = {}
    for layer in layers:
        if layer.style != "gather":
            continue
        for g in layer.weight_gathers:
            gather = graph.ops[g]
            param = next(a.tensor for a in gather.inputs if graph.tensors[a.tensor].role == "parameter")
            gathered = gather.outputs[0].tensor
            for index in layer.expert_matmuls:
                op = replaced.get(index, graph.ops[index])
                inputs = []
                for access in op.inputs:
                    if access.tensor == gathered:
                        # the token axis (axis 0) of the gathered copy is the expert axis of the weight
                        access = TensorAccess(tensor=param, axes=((),) + tuple(access.axes[1:]))
                    inputs.append(access)
                replaced[index] = dataclasses.replace(op, inputs=tuple(inputs))
            drop.add(g)
    if not drop:
        return graph
    keep = [i for i in range(len(graph.ops)) if i not in drop]
    new_index = {old: new for new, old in enumerate(keep)}
    ops = tuple(replaced.get(i, graph.ops[i]) for i in keep)
    dropped_tensors = {a.tensor for i in drop for a in graph.ops[i].outputs}
    tensors = {name: t for name, t in graph.tensors.items() if name not in dropped_tensors}
    producers = {out.tensor: (i, p) for i, op in enumerate(ops) for p, out in enumerate(op.outputs)}
    edges = []
    for consumer, op in enumerate(ops):
        for position, access in enumerate(op.inputs):
            if access.tensor in producers:
                producer, out_position = producers[access.tensor]
                edges.append(Edge(producer=producer, consumer=consumer, tensor=access.tensor,
                                  producer_output=out_position, consumer_input=position))
    blocks = tuple(
        BlockGroup(name=group.name, instances=tuple(tuple(new_index[i] for i in inst if i in new_index) for inst in group.instances))
        for group in graph.blocks
    )
    note = f"{len(drop)} per-token gathers of expert weights read as the experts' weights (MoE: an export artefact)"
    return dataclasses.replace(graph, ops=ops, tensors=tensors, edges=tuple(edges), blocks=blocks,
                               warnings=tuple(graph.warnings) + (note,))


def _rows_computed(op: Op, graph: OpGraph) -> int:
    """Token rows the op computes in the export: its iteration size over the dims that index no
    parameter and are not reductions, divided by the last such dim of a non-parameter output axis
    that is the feature axis (the op's output elements / its feature width)."""
    out = graph.tensors[op.outputs[0].tensor]
    width = 1
    for access in op.outputs[:1]:
        if access.axes and access.axes[-1]:
            for dim in access.axes[-1]:
                width *= op.dim(dim).size
        elif out.shape:
            # a trailing broadcast axis (bmm's [.., n, 1]): take the one before
            for axis in reversed(range(len(access.axes))):
                if access.axes[axis]:
                    for dim in access.axes[axis]:
                        width *= op.dim(dim).size
                    break
    return max(1, out.num_elements // max(1, width))


def routed_fraction(layer, op: Op, graph: OpGraph) -> float:
    r""":math:`\rho`: token-expert pairs the experts process with dropless routing / the rows ``op``
    computes in the export (the capacity's dropped share is :func:`layer_terms`' ``kept``).

    ``T k`` over ``T k`` (gathered or routed experts: :math:`\rho = 1`) or over ``E T`` (dense
    batched experts; each per-expert linear computes ``T`` rows and gets ``T k / E``).
    """
    if layer.style in ("gather", "routed"):
        return 1.0
    if layer.style == "linears":
        return layer.top_k / layer.num_experts
    rows = _rows_computed(op, graph)
    return min(1.0, layer.routed_tokens / rows) if rows else 1.0


def token_split(op: Op, space, params: frozenset[str]) -> np.ndarray:
    """Per configuration, the product of the factors of the dims that index no parameter of
    ``op`` and are not reductions (the token dims: the expert op's data-parallel group)."""
    param_dims = {d for a in op.inputs if a.tensor in params for axis in a.axes for d in axis}
    mask = np.array([d.name not in param_dims and d.kind != "reduction" for d in op.dims], dtype=bool)
    if space.factors.shape[1] == 0:
        return np.ones(space.size, dtype=np.int64)
    return np.prod(np.where(mask, space.factors, 1), axis=1).astype(np.int64)


def expert_degrees(layers: Sequence, devices: int) -> list[int]:
    """The ``ep`` degrees to search: divisors of every layer's expert count that divide ``devices``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> expert_degrees([SimpleNamespace(num_experts=8)], 16)
    [1, 2, 4, 8]
    >>> expert_degrees([], 16)
    [1]
    """
    if not layers:
        return [1]
    experts = [layer.num_experts for layer in layers]
    return [ep for ep in range(1, devices + 1) if devices % ep == 0 and all(e % ep == 0 for e in experts)]


def _scaled_memory(memory: MemoryArrays, *, activations: np.ndarray, params: np.ndarray, grads: np.ndarray,
                   optimizer: np.ndarray) -> MemoryArrays:
    old_rest = memory.params_bytes + memory.grads_bytes + memory.optimizer_bytes + memory.activations_bytes
    new_rest = params + grads + optimizer + activations
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(old_rest > 0, new_rest / np.where(old_rest > 0, old_rest, 1.0), 1.0)
    return MemoryArrays(params_bytes=params, grads_bytes=grads, optimizer_bytes=optimizer,
                        activations_bytes=activations, other_bytes=memory.other_bytes * ratio)


def _dispatch_s(layer, op, space, graph, cluster, settings, params_all: frozenset, split: np.ndarray, *, ep: int,
                rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per configuration of a layer's four token all-to-alls (dispatch and combine, forward
    and backward) over ``ep`` ranks, charged to its first expert matmul: ``(within a node, across
    nodes)``, each zero where the other level carries them. ``rows``: the routed rows the busiest
    rank receives (kept tokens x top-k x the rank imbalance), whose arrival the experts wait for."""
    per_element = _element_bytes(op, graph, settings, params_all)
    routed_bytes = rows * layer.hidden * per_element
    other = np.prod(space.factors, axis=1) // np.maximum(split, 1) if space.factors.shape[1] else 1
    intra = np.clip(cluster.devices_per_node // np.maximum(other, 1), 1, ep)
    intra = np.gcd(intra.astype(np.int64), ep)
    a2a = 4.0 * all_to_all_time_s(routed_bytes, intra_size=intra, inter_size=ep // intra,
                                  intra_link=cluster.intra_link, inter_link=cluster.inter_link)
    crosses = (ep // intra) > 1
    return np.where(crosses, 0.0, a2a), np.where(crosses, a2a, 0.0)


def _element_bytes(op, graph, settings, params_all: frozenset) -> int:
    """Bytes per element of the hidden states entering ``op`` (2 where the op reads none)."""
    hidden_tensor = next((graph.tensors[a.tensor] for a in op.inputs if a.tensor not in params_all), None)
    return element_bytes(hidden_tensor, settings) if hidden_tensor is not None else 2


@dataclasses.dataclass(frozen=True, slots=True)
class LayerTerms:
    """Per configuration of an expert op (arrays ``(K,)``), the layer's terms of
    :mod:`objectives.moe_terms` at its token split."""

    kept: np.ndarray
    """Share of the routed rows the capacity keeps (1: dropless)."""
    imbalance: np.ndarray
    """Busiest expert-parallel rank's rows / the mean (1 at ``ep = 1``)."""
    tile_efficiency: np.ndarray
    """Useful / computed rows of the grouped GEMM's per-expert problems."""
    busiest_rows: np.ndarray
    """Routed rows on the busiest rank per micro-batch: ``T_r k kept imbalance``."""
    permute_forward_s: np.ndarray
    """The token permutations' forward seconds (module ``objectives.moe_terms``)."""
    permute_backward_s: np.ndarray


def layer_terms(layer, op, space, graph, cluster, settings, params_all: frozenset, split: np.ndarray, *,
                ep: int, capacity_factor: float) -> LayerTerms:
    """The :class:`LayerTerms` of ``layer`` at each configuration of ``op`` (its token split ``split``)."""
    tokens = layer.tokens / np.maximum(split, 1)
    kept = kept_fraction(tokens, top_k=layer.top_k, experts=layer.num_experts, capacity_factor=capacity_factor)
    imbalance = rank_imbalance(tokens, top_k=layer.top_k, experts=layer.num_experts, ep=ep)
    rows = tokens * layer.top_k * kept
    busiest = rows * imbalance
    local = max(layer.num_experts // ep, 1)
    efficiency = tile_efficiency(busiest / local)
    per_element = _element_bytes(op, graph, settings, params_all)
    forward_b, backward_b = permute_bytes(rows, busiest, hidden=layer.hidden, element_bytes=per_element, ep=ep,
                                          local_experts=local)
    device = cluster.device
    bandwidth = device.memory_bandwidth_bytes_per_s * MEMORY_BANDWIDTH_EFFICIENCY
    # kernels pay the device's launch overhead under an execution model only (the roofline has none);
    # the chunk sorts of ep > 1 with several local experts are one kernel each way (sort_chunks_by_idxs)
    kernels_f, kernels_b = PERMUTE_KERNELS.get(settings.engine or "", (0, 0))
    if settings.engine is not None and ep > 1 and local > 1:
        kernels_f, kernels_b = kernels_f + 2, kernels_b + 2
    overhead = device.kernel_overhead_s if settings.engine is not None else 0.0
    return LayerTerms(kept=kept, imbalance=imbalance, tile_efficiency=efficiency, busiest_rows=busiest,
                      permute_forward_s=forward_b / bandwidth + kernels_f * overhead,
                      permute_backward_s=backward_b / bandwidth + kernels_b * overhead)


def price_moe(model, layers: Sequence, *, capacity_factor: float = 1.0, ep: int = 1):
    """``model`` (an ``objectives.tables.CostModel``) with its expert ops priced by the rows they
    really compute and, for ``ep > 1``, expert parallelism (see the module docstring and
    :mod:`objectives.moe_terms`): routed and kept tokens, the busiest rank's load, the grouped GEMM's
    row tiles, the token permutations and the all-to-alls. Each op's added seconds are in its
    detail's ``moe_s`` (``permute``, ``grouped_gemm_tiles``, ``load_imbalance``).

    Parameters
    ----------
    model:
        The cost model of the (routed) graph.
    layers:
        ``importers.moe.find_moe_layers(model.graph)``.
    capacity_factor:
        Expert capacity / (tokens x top-k / experts); 1.0 is dropless routing, other values drop
        the tokens over capacity (:func:`objectives.moe_terms.kept_fraction`).
    ep:
        Expert-parallel degree; must divide every layer's expert count and the device count.

    Returns
    -------
    CostModel
        The same model when there are no layers; else a copy whose tables and op details agree.

    Raises
    ------
    InputError
        A capacity factor that is not positive, or an ``ep`` that does not divide the experts.
    """
    if not (capacity_factor > 0 and np.isfinite(capacity_factor)):
        raise InputError(f"--capacity-factor must be a positive number (got {capacity_factor}), e.g. --capacity-factor 1.25")
    if not layers:
        return model
    bad = [layer.num_experts for layer in layers if layer.num_experts % ep]
    if ep < 1 or bad or model.cluster.devices % ep:
        raise InputError(f"expert parallelism ep={ep} must divide the experts ({bad or layers[0].num_experts}) and the "
                         f"{model.cluster.devices} devices; pick ep among {expert_degrees(layers, model.cluster.devices)}")
    params_all = frozenset(p for layer in layers for p in layer.expert_parameters)
    details = list(model.op_details)
    memo: dict[tuple, object] = {}
    for layer in layers:
        first_matmul = layer.expert_matmuls[0] if layer.expert_matmuls else None
        for index in layer.expert_ops:
            if index >= len(model.graph.ops):
                continue
            detail = details[index]
            key = (id(detail), index == first_matmul, index in layer.expert_matmuls, layer.tokens, layer.top_k,
                   layer.num_experts, layer.hidden)
            if key not in memo:  # repeated layers share one priced detail, as the tables share arrays
                memo[key] = _priced_detail(model, layer, index, params_all, first=index == first_matmul, ep=ep,
                                           capacity_factor=capacity_factor)
            details[index] = memo[key]
    tables = dataclasses.replace(
        model.tables,
        node_time_s=tuple(d.time_s for d in details),
        node_memory_bytes=tuple(d.memory_bytes for d in details),
    )
    note = f"MoE: {len(layers)} routed-experts layers priced by routed tokens"
    if capacity_factor != 1.0:
        layer = layers[0]
        kept = float(kept_fraction(layer.tokens, top_k=layer.top_k, experts=layer.num_experts,
                                   capacity_factor=capacity_factor))
        note += f" (capacity factor {capacity_factor:g}: {100 * (1 - kept):.2g}% of the routed tokens dropped on one device)"
    else:
        note += " (dropless)"
    if ep > 1:
        note += f", experts split ep={ep} ways over the data-parallel ranks"
    return dataclasses.replace(model, tables=tables, op_details=tuple(details), notes=tuple(model.notes) + (note,),
                               inter_node_memo={})


def _priced_detail(model, layer, index: int, params_all: frozenset, *, first: bool, ep: int, capacity_factor: float):
    """The op detail of expert op ``index`` priced by :func:`price_moe`."""
    graph, cluster, settings = model.graph, model.cluster, model.settings
    op, space, detail = graph.ops[index], model.tables.configs[index], model.op_details[index]
    split = token_split(op, space, params_all)
    terms = layer_terms(layer, op, space, graph, cluster, settings, params_all, split, ep=ep,
                        capacity_factor=capacity_factor)
    rho = routed_fraction(layer, op, graph) * terms.kept  # rows computed, on a balanced rank
    # the busiest rank's rows, and the grouped GEMM's row tiles for the products with expert weights
    slow = terms.imbalance / (terms.tile_efficiency if index in layer.expert_matmuls else 1.0)
    memory = detail.memory
    params, grads, optimizer = memory.params_bytes, memory.grads_bytes, memory.optimizer_bytes
    comm = {k: v * rho * terms.imbalance for k, v in detail.comm_s.items()}
    sync = dict(detail.grad_sync_s)
    time_extra = np.zeros(space.size)
    reads_expert = any(a.tensor in params_all for a in op.inputs)
    if ep > 1:
        if reads_expert:  # where the expert weights live, ep ranks must split the tokens
            time_extra = np.where(split % ep == 0, 0.0, np.inf)
        if reads_expert and params.any():
            zero = settings.zero_stage
            params = params / ep if zero < 3 else params
            grads = grads / ep if zero < 2 else grads
            optimizer = optimizer / ep if zero < 1 else optimizer
            with np.errstate(divide="ignore", invalid="ignore"):
                scale = np.where(split > 1, np.maximum(split - ep, 0) / (ep * np.maximum(split - 1, 1)), 1.0)
            sync = {level: array * scale for level, array in sync.items()}
        if first:
            comm[("all_to_all", "intra")], comm[("all_to_all", "inter")] = _dispatch_s(
                layer, op, space, graph, cluster, settings, params_all, split, ep=ep, rows=terms.busiest_rows)
    # the optimizer step (inside compute_s, once per step) covers the rank's expert weights, not its rows
    step = detail.optimizer_s if detail.optimizer_s is not None else np.zeros(space.size)
    owned_step = step / ep if ep > 1 and reads_expert and settings.zero_stage < 1 else step
    base = (detail.compute_s - step) * rho
    compute = base * slow + owned_step
    forward = None if detail.forward_s is None else detail.forward_s * rho * slow
    recompute = detail.recompute_s * rho * slow
    a2a = sum((v for k, v in comm.items() if k[0] == "all_to_all"), np.zeros(space.size))
    moe_s = {"grouped_gemm_tiles": base * terms.imbalance * (slow / terms.imbalance - 1.0),
             "load_imbalance": base * (terms.imbalance - 1.0) + a2a * (1.0 - 1.0 / terms.imbalance)}
    if first:  # the permutations run once per layer: charged to its first expert product
        permute = terms.permute_forward_s + terms.permute_backward_s
        compute = compute + permute
        forward = None if forward is None else forward + terms.permute_forward_s
        recompute = np.where(recompute > 0, recompute + terms.permute_forward_s, recompute)
        moe_s["permute"] = permute
    activations = memory.activations_bytes * rho
    new_memory = _scaled_memory(memory, activations=activations, params=params, grads=grads, optimizer=optimizer)
    total_comm = sum(comm.values(), np.zeros(space.size))
    time = compute + total_comm + sum(sync.values(), np.zeros(space.size)) + time_extra
    return dataclasses.replace(
        detail, compute_s=compute, recompute_s=recompute, comm_s=comm, grad_sync_s=sync,
        memory=new_memory, time_s=time, memory_bytes=new_memory.total_bytes, forward_s=forward, moe_s=moe_s,
        optimizer_s=None if detail.optimizer_s is None else owned_step,
    )
