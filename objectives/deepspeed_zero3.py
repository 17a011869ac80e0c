r"""DeepSpeed's ZeRO-3 time rule: each sub-module's parameter all-gathers as DeepSpeed 0.19.8 fetches, keeps and
prefetches them, and its gradient reduce-scatters, priced per micro-batch (``TrainingSettings.zero3_gather``, the
launcher's ``Target.zero3_gather``; FSDP2 and Megatron-FSDP keep :func:`objectives.pipeline_arrays._prefetched_sync_s`).

What DeepSpeed does (``deepspeed/runtime/zero/partitioned_param_coordinator.py``, ``stage3.py``,
``partition_parameters.py``, ``config.py``; DeepSpeed 0.19.8):

* **One all-gather per sub-module.** ``fetch_sub_module`` runs in each module's pre-forward (and pre-backward) hook:
  it gathers the module's own parameters that are not available (``__all_gather_params`` ->
  ``all_gather_coalesced``: one ``all_gather_into_tensor`` of their partitions, in the parameter dtype), *waits* for
  them, and only then issues the prefetch. A module whose parameters no earlier fetch prefetched is therefore
  gathered on the critical path, whole.
* **Prefetch of the next sub-modules.** After the wait, with a complete trace, it gathers the next parameters of the
  trace that are not available, one coalesced call, until they reach ``min(max_live - available, prefetch_bucket)``
  elements (``stage3_max_live_parameters`` 1e9, ``stage3_prefetch_bucket_size`` 5e7; the loop adds a parameter
  while the running count is below that bound, so at least one whenever the bound is positive). While module
  :math:`k` (of :math:`e_k` gathered elements, the only ones available) computes, module :math:`k+1` is gathered
  iff :math:`e_k < M`; a module of at least :math:`M` elements prefetches nothing and its successor is fetched on
  demand. The prefetched gather runs on its own stream beside :math:`k`'s compute: exposed as
  :func:`objectives.intra_op.exposed_under` prices overlap (contention included), the window being :math:`k`'s
  compute. A linear layer's work is :math:`2 \times tokens \times e` in each GEMM, so the window is taken as the
  op's own compute times :math:`e_k / e_{k+1}` (in a stack of equal layers the predecessor's shape is fixed).
  Several prefetched sub-modules below the bucket share one call: a prefetched gather pays
  :math:`\min(1, e / B)` of the ring's latency, an on-demand one all of it.
* **Release and reuse.** After a module's forward (and backward) ``release_sub_module`` frees its parameters unless
  they are used again within ``stage3_max_reuse_distance`` (1e9) elements of the trace (``__params_to_release``
  walks the following modules, counting their elements). Sub-module :math:`k`'s next use after its forward is
  :math:`2 S_k` elements away (the rest of the forward and the backward down to it; :math:`S_k` the elements
  after it in the model): kept iff :math:`2 S_k < D`, and then its backward (and a recomputed forward) gathers
  nothing. Under recomputation the re-run forward's use and the backward's are :math:`2 S^{block}_k` apart
  (the block's sub-modules after it, re-run and back): the backward gathers again iff :math:`2 S^{block}_k \ge D`.
  So a model under :math:`D / 2` elements is gathered once per micro-batch, and at 174.6B with hidden 12,288 the
  MLP's second linear layer is not gathered again after its re-run forward.
* **Persistent parameters.** A parameter under ``stage3_param_persistence_threshold`` (1e5) is never partitioned:
  no gather (a norm, a bias).
* **Gradients.** Each gradient goes into the contiguous bucket of ``reduce_bucket_size`` (5e8) elements, which is
  reduce-scattered when full (``__reduce_and_partition_ipg_grads`` -> ``reduce_scatter_coalesced``), in the
  gradients' dtype (``communication_data_type`` unset), on its own stream when ``overlap_comm`` (default on at
  stage 3, ``DeepSpeedZeroConfig.overlap_comm_valid``): a share :math:`\min(1, g / R)` of a ring's latency per
  op, beside the op's backward. The last, partial bucket (the model's first parameters: backward runs last layer
  first) is reduced only in ``independent_gradient_partition_epilogue`` after each micro-batch's backward
  (``engine.py``: every micro-batch at stage >= 2), which then synchronizes its stream: its share waits whole
  (:func:`gradient_tail_shares`).

* **ZeRO++'s hpZ** (``TrainingSettings.hpz_partition``, ``zero_hpz_partition_size``): a gather finds the parameter's
  secondary copy (built at its first release, dropped after the optimizer step: ``_partition_param_sec``,
  ``invalidate_secondary_tensor``) and gathers it over the hpZ group instead of every rank, so only the step's first
  forward crosses every rank: its gathers are priced over the hpZ group per micro-batch (the backward-phase terms,
  ``CommTerm.phase``) and the first forward's excess once per step (:func:`deepspeed_zero3_sync_s`), which the price
  adds to the step's first micro-batch's forward under the stage's host floor
  (:func:`objectives.first_forward.first_forward_extra_s`), as plain ZeRO-3's gathers are floored.

Left out: hooks of parameter-less modules (an attention core module, a dropout) also prefetch, so after a module
of at least :math:`M` elements its successor may start beside them (priced on demand); the prefetcher's
"skipped reuse" rule (a parameter whose later use the prefetch queue popped while it was available is not
released) and the recomputed forward's distance from the plain forward (taken as :math:`2 S_k`); the RS and the
gathers share the links but are hidden each under its own window; host time of the hooks (no cited figure); the last
bucket's one latency (each op pays :math:`g / R` of it) and the bucket before it being hidden under the rest of the
backward only (priced under its own ops' backward).
The 2021 DeepSpeed of Narayanan et al.'s runs may differ (its rows say so).

Priced by :func:`deepspeed_zero3_sync_s`; the order facts of each sub-module by :func:`submodule_orders`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from objectives.intra_op import CommTerm, exposed_under, grad_sync_terms, term_time_s
from objectives.memory import state_bytes_per_parameter
from planner.core.cluster import Cluster
from planner.core.settings import Zero3Gather

__all__ = ["SubModuleOrder", "PERSISTENT", "submodule_orders", "gradient_tail_shares", "gathers_per_micro_batch",
           "deepspeed_zero3_sync_s", "deepspeed_op_sync_s"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SubModuleOrder:
    """Where a sub-module (an op with parameters it accounts for) sits in DeepSpeed's fetch trace, in elements of
    its whole parameters (before any split)."""

    elements: float
    """:math:`e_k`: its own parameters' elements."""
    previous: float
    """The elements of the sub-module before it in forward order (0: none, it is the first)."""
    following: float
    """The elements of the sub-module after it in forward order (0: none, it is the last)."""
    after_in_model: float
    """:math:`S_k`: the elements of every sub-module after it in forward order."""
    after_in_block: float
    """:math:`S^{block}_k`: those after it in its repeated block (the recomputed unit); :attr:`after_in_model`
    outside every block."""


PERSISTENT = SubModuleOrder(elements=0.0, previous=0.0, following=0.0, after_in_model=0.0, after_in_block=0.0)
"""The place of an op whose parameters are all persistent (under ``stage3_param_persistence_threshold``): in no
chain of gathers, its gradients still reduce-scattered."""


def submodule_orders(graph, owned: Sequence[Sequence[int]], tensors: Mapping, *,
                     persistent_below: float = 0.0) -> dict[int, SubModuleOrder]:
    """Per op index with parameters (``owned[i]``: the input positions op ``i`` accounts for), its
    :class:`SubModuleOrder` in graph order (the forward's), counting only its parameters of at least
    ``persistent_below`` elements (``stage3_param_persistence_threshold``: the others are never partitioned, so
    never gathered); an op with none (a norm) is not in the trace's chain of gathers.

    >>> from types import SimpleNamespace as NS
    >>> t = {"a": NS(shape=(4, 5)), "b": NS(shape=(10,)), "c": NS(shape=(3, 2))}
    >>> ops = [NS(inputs=(NS(tensor="a"),)), NS(inputs=()), NS(inputs=(NS(tensor="b"),)), NS(inputs=(NS(tensor="c"),))]
    >>> g = NS(ops=ops, blocks=(NS(instances=((2, 3),)),))
    >>> o = submodule_orders(g, [(0,), (), (0,), (0,)], t)
    >>> o[0].previous, o[0].following, o[0].after_in_model, o[0].after_in_block, o[2].after_in_block, o[3].previous
    (0.0, 10.0, 16.0, 16.0, 6.0, 10.0)
    >>> sorted(submodule_orders(g, [(0,), (), (0,), (0,)], t, persistent_below=8)), o[0].following  # c: a norm
    ([0, 2], 10.0)
    """
    def elements(index: int) -> float:
        counts = (float(np.prod(tensors[graph.ops[index].inputs[p].tensor].shape)) for p in owned[index])
        return float(sum(c for c in counts if c >= persistent_below))

    indices = [i for i, positions in enumerate(owned) if positions and elements(i) > 0.0]
    sizes = [elements(i) for i in indices]
    block_of = {op: instance for group in getattr(graph, "blocks", ()) for instance in group.instances for op in instance}
    total_after = np.concatenate((np.cumsum(sizes[::-1])[::-1][1:], [0.0])) if sizes else np.zeros(0)
    position = {op: n for n, op in enumerate(indices)}
    orders = {}
    for n, op in enumerate(indices):
        instance = block_of.get(op)
        in_block = float(total_after[n]) if instance is None else float(
            sum(sizes[position[j]] for j in instance if j > op and j in position))
        orders[op] = SubModuleOrder(elements=sizes[n], previous=sizes[n - 1] if n else 0.0,
                                    following=sizes[n + 1] if n + 1 < len(sizes) else 0.0,
                                    after_in_model=float(total_after[n]), after_in_block=in_block)
    return orders


def gradient_tail_shares(graph, owned: Sequence[Sequence[int]], tensors: Mapping, *, reduce_bucket: float,
                         ) -> dict[int, float]:
    """Per op index with parameters, the share of its gradient elements in the backward's last bucket, which
    DeepSpeed reduce-scatters only in ``independent_gradient_partition_epilogue`` and waits for (exposed).

    Gradients arrive in reverse forward order (graph order; an op's parameters by position) and go into the bucket
    of ``reduce_bucket`` elements, which is reduced first when the next gradient would overflow it
    (``reduce_independent_p_g_buckets_and_remove_grads``): so the last bucket holds the model's first parameters,
    all of a model under the bucket. Every parameter counts, persistent ones too (their gradients are reduced).

    >>> from types import SimpleNamespace as NS
    >>> t = {"a": NS(shape=(4, 5)), "b": NS(shape=(10,)), "c": NS(shape=(3, 2))}
    >>> ops = [NS(inputs=(NS(tensor="a"),)), NS(inputs=()), NS(inputs=(NS(tensor="b"),)), NS(inputs=(NS(tensor="c"),))]
    >>> gradient_tail_shares(NS(ops=ops), [(0,), (), (0,), (0,)], t, reduce_bucket=100)  # 36 elements: one bucket
    {0: 1.0, 2: 1.0, 3: 1.0}
    >>> gradient_tail_shares(NS(ops=ops), [(0,), (), (0,), (0,)], t, reduce_bucket=16)  # c + b, then a alone
    {0: 1.0, 2: 0.0, 3: 0.0}
    """
    gradients = [(op, float(np.prod(tensors[graph.ops[op].inputs[p].tensor].shape)))
                 for op, positions in enumerate(owned) for p in positions]
    filled, tail = 0.0, []
    for op, elements in reversed(gradients):
        if filled + elements > reduce_bucket and filled > 0.0:  # the bucket is reduced beside backward
            filled, tail = 0.0, []
        filled += elements
        tail.append((op, elements))
    in_tail: dict[int, float] = {}
    for op, elements in tail:
        in_tail[op] = in_tail.get(op, 0.0) + elements
    total: dict[int, float] = {}
    for op, elements in gradients:
        total[op] = total.get(op, 0.0) + elements
    return {op: in_tail.get(op, 0.0) / total[op] if total[op] > 0.0 else 0.0
            for op, positions in enumerate(owned) if positions}


def gathers_per_micro_batch(order: SubModuleOrder, rule: Zero3Gather, *, recomputed: bool) -> tuple[int, int, int]:
    """``(forward, re-run forward, backward)`` all-gathers of a sub-module per micro-batch under ``rule``'s reuse
    distance :math:`D` (module docstring): 1 in forward; after it, kept iff :math:`2 S_k < D`; a recomputed op's
    re-run forward gathers iff it was not kept, and its backward iff :math:`2 S^{block}_k \\ge D`.

    >>> rule = Zero3Gather(prefetch_bucket=50, max_live=1000, max_reuse_distance=100, persistence_threshold=0,
    ...                    reduce_bucket=500)
    >>> mid = SubModuleOrder(elements=30, previous=30, following=30, after_in_model=300, after_in_block=40)
    >>> gathers_per_micro_batch(mid, rule, recomputed=False), gathers_per_micro_batch(mid, rule, recomputed=True)
    ((1, 0, 1), (1, 1, 0))
    >>> gathers_per_micro_batch(dataclasses.replace(mid, after_in_model=40), rule, recomputed=True)  # the tail
    (1, 0, 0)
    """
    kept = 2.0 * order.after_in_model < rule.max_reuse_distance
    if not recomputed:
        return 1, 0, 0 if kept else 1
    again = 2.0 * order.after_in_block >= rule.max_reuse_distance
    return 1, 0 if kept else 1, 1 if (again and not kept) else 0


def _latency_shared(term: CommTerm, cluster: Cluster, share: np.ndarray | float) -> np.ndarray:
    """``(K,)`` seconds of one run of ``term`` (its ``count`` set aside) paying ``share`` of its latency."""
    one = dataclasses.replace(term, count=1.0)
    full = term_time_s(one, cluster=cluster)
    flat = cluster.without_latency()
    moving = term_time_s(one, cluster=flat)
    return moving + (full - moving) * share


def _exposed(seconds: np.ndarray, window: np.ndarray) -> np.ndarray:
    """``seconds`` of communication beside ``window`` of compute, as :func:`objectives.intra_op.exposed_under`
    leaves them on the critical path (contention included; all of it beside no compute)."""
    return sum(exposed_under({"all": seconds}, compute_s=window).values(), np.zeros(window.shape))


def deepspeed_zero3_sync_s(terms: Sequence[CommTerm], *, cluster: Cluster, rule: Zero3Gather, order: SubModuleOrder,
                           shard_elements: np.ndarray, forward_s: np.ndarray, backward_s: np.ndarray,
                           recompute_s: np.ndarray, gathered_bytes: float, grad_bytes: float, overlap: bool = True,
                           tail_share: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""``(forward, backward, per step)`` exposed seconds per micro-batch of a sub-module's ZeRO-3 traffic as
    DeepSpeed 0.19.8 runs it (module docstring).

    ``terms``: the op's :func:`objectives.intra_op.grad_sync_terms` at ZeRO-3 (all-gathers, reduce-scatters; their
    counts are ignored: :func:`gathers_per_micro_batch` says how many run); ``shard_elements``: ``(K,)`` elements
    of its gathered (non-persistent) parameter shards per device before ZeRO (:math:`e_k` per configuration),
    ``order`` the whole parameters' trace facts (their ratio scales to the shard); ``forward_s``, ``backward_s``,
    ``recompute_s``: ``(K,)`` compute seconds of the op's forward, backward (without the re-run) and re-run forward;
    ``gathered_bytes`` / ``grad_bytes``: bytes per element of the gathered parameters and of the reduced gradients.
    ``overlap`` off (``--no-overlap``): nothing hidden. ``tail_share``: the share of its gradient in the backward's
    last bucket (:func:`gradient_tail_shares`), whose reduce-scatter waits whole at the backward's end. Per step:
    under ZeRO++'s hpZ (the gather terms split by ``CommTerm.phase``), what the step's first forward gather, over
    every rank, exposes beyond the later micro-batches' forward gathers of the secondary copy; else nothing. It runs
    inside the step's first micro-batch's forward: the stage's arrays keep it apart (``first_forward_s``,
    ``objectives.pipeline_arrays``) and the price adds it to that forward under the host floor
    (:func:`objectives.first_forward.first_forward_extra_s`), not after the pipeline.

    Examples
    --------
    One 8-device node at 100 GB/s collective bandwidth and 1 us per hop; a 1e6-element bf16 sub-module between two
    of 2e6, prefetch bucket 4e6, live maximum 1e9: its forward gather (2 MB, :math:`7/8 \times 2` MB / 100 GB/s
    = 17.5 us + a quarter of 7 us: 19.25 us) is prefetched beside the predecessor's forward, 2 x 10 us, which
    outlasts it: 24/132 x 19.25 = 3.5 us. Its backward gathers again (the model after it, 4e6, is over D/2), with
    the reduce-scatter (17.5 us + 7 us x 2e6 / (5e8 x 2) = 17.514 us), 36.764 us beside the successor's backward
    and its own, 2 x 20 + 20 us: 24/132 x 36.764 = 6.684 us.

    >>> from planner.core.cluster import Link
    >>> from objectives.cluster import make_cluster
    >>> link = Link(name="l", bandwidth_bytes_per_s=100e9, latency_s=1e-6)
    >>> cl = dataclasses.replace(make_cluster("a100-80gb", devices=8, devices_per_node=8), intra_link=link)
    >>> one = np.array([1]); eight = np.array([8])
    >>> terms = [CommTerm(kind="grad_sync", collective="reduce_scatter", tensor="w", num_bytes=np.array([2e6]),
    ...                   intra_size=eight, inter_size=one),
    ...          CommTerm(kind="grad_sync", collective="all_gather", tensor="w", num_bytes=np.array([2e6]),
    ...                   intra_size=eight, inter_size=one, count=2.0)]
    >>> rule = Zero3Gather(prefetch_bucket=4_000_000, max_live=1_000_000_000, max_reuse_distance=1_000_000,
    ...                    persistence_threshold=100_000, reduce_bucket=500_000_000)
    >>> order = SubModuleOrder(elements=1e6, previous=2e6, following=2e6, after_in_model=4e6, after_in_block=4e6)
    >>> f, b, s = deepspeed_zero3_sync_s(terms, cluster=cl, rule=rule, order=order, shard_elements=np.array([1e6]),
    ...     forward_s=np.array([10e-6]), backward_s=np.array([20e-6]), recompute_s=np.array([0.0]),
    ...     gathered_bytes=2.0, grad_bytes=2.0)
    >>> round(float(f[0]) * 1e6, 3), round(float(b[0]) * 1e6, 3), float(s[0])
    (3.5, 6.684, 0.0)
    """
    size = shard_elements.shape[0]
    zeros = np.zeros(size)
    reduce_s = zeros.copy()
    for term in terms:
        if term.collective != "all_gather":  # the reduce-scatter of the contiguous bucket: this gradient's share of its latency
            reduce_s += _latency_shared(term, cluster, np.minimum(1.0, term.num_bytes / (rule.reduce_bucket * grad_bytes)))
    on_demand, prefetched = _gather_s(terms, cluster, rule, gathered_bytes, "backward", size)
    scale = np.divide(shard_elements, order.elements, out=np.zeros(size), where=order.elements > 0.0)
    if not overlap:
        window_f = window_b = window_r = zeros
        before = after = np.zeros(size, dtype=bool)
    else:
        before = (order.previous > 0.0) & (order.previous * scale < rule.max_live)  # the predecessor prefetches it
        after = (order.following > 0.0) & (order.following * scale < rule.max_live)  # in backward: the successor
        share = 1.0 / order.elements if order.elements > 0.0 else 0.0  # a GEMM's work is in proportion to its weight
        previous, following = order.previous * share, order.following * share
        window_f, window_r, window_b = forward_s * previous, recompute_s * previous, backward_s * following
    count_f, count_r, count_b = gathers_per_micro_batch(order, rule, recomputed=bool(np.any(recompute_s > 0.0)))

    def forward_s(gathers: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        return count_f * (_exposed(np.where(before, gathers[1], 0.0), window_f) + np.where(before, 0.0, gathers[0]))

    # ZeRO++'s hpZ: every forward gathers the secondary copy but the step's first, which crosses every rank (per step)
    forward = forward_s((on_demand, prefetched))
    first = forward_s(_gather_s(terms, cluster, rule, gathered_bytes, "forward", size)) - forward
    # backward: the prefetched gathers and the reduce-scatter share the links, hidden together under the compute
    # that runs beside them (the predecessors' re-run forward and the successor's backward; the op's own backward
    # for its gradient's bucket, the last one's share excepted: reduced after the backward, waited for); a gather no
    # one prefetched waits whole
    hidden = count_r * np.where(before, prefetched, 0.0) + count_b * np.where(after, prefetched, 0.0) \
        + (1.0 - tail_share) * reduce_s
    window = count_r * np.where(before, window_r, 0.0) + count_b * np.where(after, window_b, 0.0) \
        + (backward_s if overlap else zeros)
    waited = count_r * np.where(before, 0.0, on_demand) + count_b * np.where(after, 0.0, on_demand) \
        + tail_share * reduce_s
    return forward, _exposed(hidden, window) + waited, np.maximum(first, 0.0)


def _gather_s(terms: Sequence[CommTerm], cluster: Cluster, rule: Zero3Gather, gathered_bytes: float,
              phase: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(on demand, prefetched)``: ``(K,)`` seconds of one gather of the op's non-persistent parameters in
    ``phase`` (the all-gather terms of that phase or of every phase, ``CommTerm.phase``), whole or paying
    ``min(1, bytes / prefetch bucket)`` of the latency (module docstring); ``size``: the configurations."""
    on_demand, prefetched = np.zeros(size), np.zeros(size)
    for term in terms:
        if term.collective == "all_gather" and term.phase in (None, phase):  # a persistent parameter is never gathered
            live = term.num_bytes >= rule.persistence_threshold * gathered_bytes
            bucket_share = np.minimum(1.0, term.num_bytes / (max(rule.prefetch_bucket, 1) * gathered_bytes))
            on_demand += np.where(live, _latency_shared(term, cluster, 1.0), 0.0)
            prefetched += np.where(live, _latency_shared(term, cluster, bucket_share), 0.0)
    return on_demand, prefetched


def deepspeed_op_sync_s(op, space, detail, *, tensors, settings, owned: Sequence[int], cluster: Cluster,
                        order: SubModuleOrder | None, shard_elements: np.ndarray, graph_output: bool = False,
                        tail_share: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`deepspeed_zero3_sync_s` of one op of a stage's arrays (``objectives.pipeline_arrays._op_arrays``): its
    ZeRO-3 terms (:func:`objectives.intra_op.grad_sync_terms`) under ``settings.zero3_gather``; ``None`` where the
    rule does not apply (below ZeRO-3, no launcher rule, no execution model, no parameters): the pricing's own.
    ``tail_share``: :func:`gradient_tail_shares`' share of its gradient in the backward's last bucket."""
    rule = settings.zero3_gather
    if settings.zero_stage < 3 or rule is None or order is None or detail.grad_sync_unhidden_s is None:
        return None
    recomputed = bool(np.any(detail.recompute_s > 0.0))
    terms = grad_sync_terms(op, space, tensors=tensors, settings=settings, owned_inputs=owned, recomputed=recomputed,
                            graph_output=graph_output)
    optimizer = detail.optimizer_s if detail.optimizer_s is not None else 0.0
    backward = detail.compute_s - detail.recompute_s - optimizer - detail.forward_s
    per = state_bytes_per_parameter(settings)
    owned_elements = float(sum(np.prod(tensors[op.inputs[p].tensor].shape) for p in owned))
    gathered = shard_elements * (order.elements / owned_elements if owned_elements > 0.0 else 0.0)  # persistent aside
    return deepspeed_zero3_sync_s(terms, cluster=cluster, rule=rule, order=order, shard_elements=gathered,
                                  forward_s=detail.forward_s, backward_s=backward, recompute_s=detail.recompute_s,
                                  gathered_bytes=per.gathered, grad_bytes=per.grad, overlap=settings.overlap,
                                  tail_share=tail_share)
