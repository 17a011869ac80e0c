r"""ZeRO-3 priced per wrapped unit, as FSDP and FSDP2 run it: one flat all-gather and one flat reduce-scatter
per ``fully_shard`` unit and pass, the next unit's gather prefetched beside this unit's compute
(``TrainingSettings.fsdp_units``; off by default, a diagnostic: docs/VALIDATION.md, "FSDP per wrapped unit").

By default the stage arrays price ZeRO-3 per op (:func:`objectives.pipeline_arrays._prefetched_sync_s`): each op
pays its 25 MB buckets' share of a collective's latency and its gathers are exposed beside its own compute. FSDP2
(torch 2.13, ``torch/distributed/fsdp/_fully_shard``) gathers a unit's parameters in one collective
(``FSDPParamGroup.unshard`` -> ``_fsdp_collectives.foreach_all_gather``), reduce-scatters its gradients in one
(``FSDPParamGroup.post_backward`` -> ``foreach_reduce``), and prefetches one unit ahead: in forward the next
unit's all-gather is issued from its pre-forward hook on the all-gather stream while this unit computes
(implicit prefetch, ``FSDPParamGroup.wait_for_unshard``'s note; ``FSDPState._pre_forward``); in backward
``FSDPParamGroup.pre_backward`` -> ``_backward_prefetch`` unshards the unit before it in ``post_forward_order``,
and the reduce-scatter of the unit just finished runs beside the next unit's backward. With units
:math:`0..n-1` in forward order, :math:`g_i` a unit's gathers of a pass, :math:`r_i` its reduce-scatter and
:math:`c_i`, :math:`b_i` its forward and backward compute, the exposed seconds per micro-batch are
(:func:`prefetched_unit_exposure_s`; :math:`x(t, c)` = :func:`objectives.intra_op.exposed_under`, the
contention the repo prices for every overlap):

.. math::

   F = g^f_0 + \sum_{i<n-1} x(g^f_{i+1}, c_i), \qquad
   B = g^b_{n-1} + \sum_i x(g^b_{i-1} + r_{i+1}, b_i) + r_0

the first unit's gather and the last reduce-scatter having nothing to hide under. A unit's collective moves
the sum of its ops' bytes (their bandwidth terms) and pays one latency: each parameter tensor its share of the
unit's bytes of its own collective's latency (one ring's over the same group, for every tensor of a plain FSDP
unit). The gathers per pass are the ones the per-op terms count
(``objectives.intra_op._zero_terms``: two per micro-batch, recomputed or not, one under
``reshard_after_forward`` ``never``). Units are :class:`objectives.pipeline_stages.LayerStructure`'s slots:
the ops before the first block, each block, the ops after the last (the exporters' ``fully_shard`` units).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from objectives.intra_op import exposed_under, grad_sync_terms, term_time_s
from objectives.pipeline_arrays import _graph_info, _OpArrays, _output_ops, _phases, _zero_sync_s
from objectives.pipeline_stages import LayerStructure
from planner.core.cluster import Cluster

__all__ = ["prefetched_unit_exposure_s", "unit_traffic", "fsdp_unit_pass_s"]


def prefetched_unit_exposure_s(gather_f: np.ndarray, compute_f: np.ndarray, gather_b: np.ndarray,
                               reduce_b: np.ndarray, compute_b: np.ndarray) -> tuple[float, float]:
    """``(forward, backward)`` exposed seconds per micro-batch of one stage's units, each argument ``(n,)`` in
    forward order (module docstring): unit ``i + 1``'s forward gather beside unit ``i``'s forward; in backward
    unit ``i``'s backward beside unit ``i - 1``'s gathers and unit ``i + 1``'s reduce-scatter (one NCCL stream:
    the two add up).

    >>> f, b = prefetched_unit_exposure_s(np.array([1.0, 1.0]), np.array([4.0, 4.0]), np.array([1.0, 1.0]),
    ...                                   np.array([2.0, 2.0]), np.array([3.0, 3.0]))
    >>> round(f, 4), round(b, 4)  # 1 + 0.1818 x 1; 1 + 0.1818 x (1 + 2) + 2
    (1.1818, 3.5455)
    """
    n = len(gather_f)
    if n == 0:
        return 0.0, 0.0
    forward = float(gather_f[0])
    if n > 1:
        ahead = exposed_under({"all": np.asarray(gather_f[1:], dtype=np.float64)},
                              compute_s=np.asarray(compute_f[:-1], dtype=np.float64))
        forward += float(np.sum(ahead["all"]))
    beside = np.zeros(n)
    beside[1:] += np.asarray(gather_b[:-1], dtype=np.float64)  # unit i - 1's gathers beside unit i's backward
    beside[:-1] += np.asarray(reduce_b[1:], dtype=np.float64)  # unit i + 1's reduce-scatter likewise
    hidden = exposed_under({"all": beside}, compute_s=np.asarray(compute_b, dtype=np.float64))["all"]
    return forward, float(gather_b[-1]) + float(np.sum(hidden)) + float(reduce_b[0])


@dataclasses.dataclass(frozen=True, slots=True)
class _OpTraffic:
    """One op's ZeRO-3 traffic at its pick, seconds per micro-batch, before any overlap."""

    gather_f: float
    """Bandwidth part of the forward gathers."""
    gather_b: float
    """Bandwidth part of the backward gathers (the recomputed forward's included)."""
    reduce_b: float
    """Bandwidth part of the reduce-scatter (and HSDP's replica all-reduce after it)."""
    latency: tuple[float, float, float]
    """Its tensors' collective latencies in the three, each times the tensor's bytes (a unit pays one collective's
    latency: these summed over its ops, over :attr:`bytes`)."""
    bytes: tuple[float, float, float]
    """The bytes its tensors' collectives move in the three, once each."""
    exposed: tuple[float, float]
    """What the per-op pricing exposes of them (:func:`objectives.pipeline_arrays._zero_sync_s`), forward and
    backward: what the unit pricing replaces."""


def unit_traffic(arrays: _OpArrays, picks: np.ndarray, cluster: Cluster, settings) -> dict[int, _OpTraffic]:
    """Per op with ZeRO-3 traffic under an execution model, its :class:`_OpTraffic` at ``picks``
    (``settings``: the arrays' ZeRO-3 settings; ``cluster``: the stage's)."""
    model = arrays.model
    graph = model.graph
    owned, _, tensors, _, _ = _graph_info(graph)
    flat = cluster.without_latency()
    heads = _output_ops(graph, settings)
    out: dict[int, _OpTraffic] = {}
    for index, op in enumerate(graph.ops):
        detail = model.op_details[index]
        if not owned[index] or detail.grad_sync_unhidden_s is None:
            continue
        space, pick = model.tables.configs[index], int(picks[index])
        terms = grad_sync_terms(op, space, tensors=tensors, settings=settings, owned_inputs=owned[index],
                                recomputed=bool(np.any(detail.recompute_s > 0.0)), graph_output=index in heads)
        if not terms:
            continue
        moving, latency, size = np.zeros(3), np.zeros(3), np.zeros(3)  # forward gathers, backward gathers, reductions
        for term in terms:
            whole = float(term_time_s(term, cluster=cluster)[pick])
            bandwidth = float(term_time_s(term, cluster=flat)[pick])
            moved = float(np.asarray(term.num_bytes, dtype=np.float64)[pick]) if whole > 0.0 else 0.0  # a group of one: none
            shares = _phases(term, 3)
            slots = ((0, shares[0]), (1, shares[1])) if term.collective == "all_gather" else ((2, 1.0),)
            for slot, share in slots:
                moving[slot] += share * bandwidth
                latency[slot] += share * (whole - bandwidth) * moved
                size[slot] += moved if share > 0.0 else 0.0
        forward, backward, _ = _zero_sync_s(op, space, detail, tensors=tensors, settings=settings, owned=owned[index],
                                            cluster=cluster, graph_output=index in heads)
        out[index] = _OpTraffic(gather_f=moving[0], gather_b=moving[1], reduce_b=moving[2],
                                latency=(latency[0], latency[1], latency[2]), bytes=(size[0], size[1], size[2]),
                                exposed=(float(forward[pick]), float(backward[pick])))
    return out


def fsdp_unit_pass_s(arrays: _OpArrays, structure: LayerStructure, stage: np.ndarray, picks: np.ndarray, pp: int,
                     cluster: Cluster, forward_s: np.ndarray, backward_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)``, each ``(pp,)``: the stages' per-micro-batch seconds ``forward_s`` / ``backward_s``
    (:func:`objectives.pipeline_price._stage_sums`'), their per-op ZeRO-3 exposure replaced by the units'
    (module docstring). A unit's compute is its ops' seconds less their per-op exposure; its latency, one
    collective's, is its tensors' collective latencies weighted by their shares of the bytes it moves."""
    settings = arrays.tied_source[1]
    traffic = unit_traffic(arrays, picks, cluster, settings)
    slots = structure.num_layers + 2
    unit = stage * slots + structure.position + 1
    size = pp * slots
    flat_index = arrays.offsets + picks
    exposed_f = np.array([traffic[i].exposed[0] if i in traffic else 0.0 for i in range(len(picks))])
    exposed_b = np.array([traffic[i].exposed[1] if i in traffic else 0.0 for i in range(len(picks))])
    compute_f = np.bincount(unit, weights=arrays.flat["forward_s"][flat_index] - exposed_f, minlength=size)
    compute_b = np.bincount(unit, weights=arrays.flat["backward_s"][flat_index] - exposed_b, minlength=size)
    ops = np.array(sorted(traffic), dtype=np.int64)
    passes = []
    for part in range(3):
        def per_unit(values: list[float]) -> np.ndarray:
            return np.bincount(unit[ops], weights=values, minlength=size) if ops.size else np.zeros(size)

        moving = per_unit([(traffic[i].gather_f, traffic[i].gather_b, traffic[i].reduce_b)[part] for i in ops])
        moved = per_unit([traffic[i].bytes[part] for i in ops])
        weighted = per_unit([traffic[i].latency[part] for i in ops])
        passes.append(moving + np.divide(weighted, moved, out=np.zeros(size), where=moved > 0.0))
    forward, backward = np.array(forward_s, dtype=np.float64), np.array(backward_s, dtype=np.float64)
    present = np.bincount(unit, minlength=size) > 0
    for s in range(pp):
        units = np.arange(s * slots, (s + 1) * slots)[present[s * slots:(s + 1) * slots]]
        f, b = prefetched_unit_exposure_s(passes[0][units], compute_f[units], passes[1][units], passes[2][units],
                                          compute_b[units])
        inside = stage == s
        forward[s] += f - float(exposed_f[inside].sum())
        backward[s] += b - float(exposed_b[inside].sum())
    return forward, backward
