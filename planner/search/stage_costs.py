"""What the pipeline search cuts the layers by: per segment of layers, the sums a stage's price is made
of (``objectives.pipeline_price``'s ``_stage_sums``, boundary transfers and host floors), as
:class:`planner.search.stages.StepCosts` (:func:`_step_costs`). The search never imports objectives:
the transfers come from ``pricing.p2p_floor_s``, the host floors and a tied copy's all-reduce from
``pricing.host_floors_s`` and ``pricing.tied_sync_s`` (the functions the price uses), and
``tests/planner/test_launchable_exact.py`` checks every cut's step time against the price. Also
each op's least costs over its allowed configurations, read from the flat arrays
(:func:`_op_minima`, :func:`_gather`), which the search's lower bounds are made of."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from planner.search.stages import StepCosts

PipelinePricing = Any
StageArrays = Any
LayerStructure = Any


class _OneCut:
    """A layer structure with one possible cut carrying ``nbytes`` (for ``pricing.p2p_floor_s``:
    the transfer of each boundary at exactly those bytes)."""

    def __init__(self, nbytes: float) -> None:
        self.num_layers, self.cut_bytes = 2, np.array([0.0, float(nbytes), 0.0])


def _spans(slot: np.ndarray, weights: np.ndarray, layers: int) -> np.ndarray:
    """``(L+1, L+1)``: ``[i, j]`` the sum of ``weights`` over the ops whose layer slot is in ``[i, j)``."""
    prefix = np.concatenate(([0.0], np.cumsum(np.bincount(slot, weights=weights, minlength=layers))))
    return np.triu(prefix[None, :] - prefix[:, None])


def _inside(lo: np.ndarray, hi: np.ndarray, weights: np.ndarray, layers: int) -> np.ndarray:
    """``(L+1, L+1)``: ``[i, j]`` the sum of ``weights`` over the pairs with both slots in ``[i, j)``
    (``lo <= hi``)."""
    pairs = np.zeros((layers, layers))
    np.add.at(pairs, (lo, hi), weights)
    below = np.concatenate((np.zeros((layers, 1)), np.cumsum(pairs, axis=1)), axis=1)  # hi < j
    return np.concatenate((np.cumsum(below[::-1], axis=0)[::-1], np.zeros((1, layers + 1))))  # lo >= i


def _segment_costs(
    pricing: PipelinePricing, arrays: StageArrays, structure: LayerStructure, picks: np.ndarray, pp: int, recompute: str,
    accumulator: float = 0.0, chosen: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Per segment of layers, what ``pricing.price`` sums over a stage's ops
    (``objectives.pipeline_price._stage_sums``): forward, backward (each with half of the transfers
    between two ops of the stage), per-step seconds, parameter states, activations; a tied copy's
    costs where its owner is not in the segment and their all-reduce on both sides. Also the
    transfer of boundary ``k`` before layer ``j``, ``(pp-1, L+1)``, and the host floors by layer
    count (``(2, L+1)``, zeros without fixed costs). The per-step seconds hold what the host floor leaves of the
    step's first forward's extra (ZeRO++'s hpZ, ``first_forward_s``), a segment's own (not a sum over its layers). ``accumulator``: bytes of a launcher's bf16 gradient
    accumulator per gradient byte (``pricing.grad_accumulator_scale``), held with the gradients."""
    layers = structure.num_layers
    slot = np.clip(structure.position, 0, layers - 1)  # a stage runs the ops of its layers, the ends with theirs
    flat, index = arrays.flat, arrays.offsets + picks
    out = {name: _spans(slot, flat[name][index], layers)
           for name in ("forward_s", "backward_s", "step_s", "update_s", "activations_bytes")}
    grads = (1.0 + accumulator) * flat["grads_bytes"][index]
    out["states"] = _spans(slot, flat["params_bytes"][index] + grads + flat["optimizer_bytes"][index], layers)
    if chosen is None and arrays.edges:  # (``chosen``: the edges at ``picks``, priced apart: ``pricing.chosen_edges``)
        chosen = arrays.edge_u, arrays.edge_v, arrays.edge_time_s(picks)
    if chosen is not None:
        su, sv = slot[chosen[0]], slot[chosen[1]]
        half = _inside(np.minimum(su, sv), np.maximum(su, sv), chosen[2] / 2.0, layers)
        out["forward_s"], out["backward_s"] = out["forward_s"] + half, out["backward_s"] + half
    cluster = pricing.cluster
    ends = np.arange(layers + 1)
    for copy in getattr(arrays, "tied", ()):
        q, owner, c = int(slot[copy.op]), int(slot[copy.owner]), int(picks[copy.op])
        holds = (ends[:, None] <= q) & (ends[None, :] > q)
        held_by_owner = (ends[:, None] <= owner) & (ends[None, :] > owner)
        alone, owner_alone = holds & ~held_by_owner, held_by_owner & ~holds
        shared = pricing.tied_sync_s(float(copy.grad_bytes[c]))
        out["forward_s"] = out["forward_s"] + alone * float(copy.forward_s[c])
        out["backward_s"] = out["backward_s"] + alone * float(copy.backward_s[c])
        out["step_s"] = out["step_s"] + alone * (float(copy.step_s[c]) + shared) + owner_alone * shared
        states = float(copy.params_bytes[c]) + (1.0 + accumulator) * float(copy.grads_bytes[c]) + float(copy.optimizer_bytes[c])
        out["states"] = out["states"] + alone * states
    devices = cluster.devices // pp
    p2p = np.zeros((pp - 1, layers + 1))
    inner = structure.cut_bytes[1:layers]
    for nbytes in np.unique(inner):
        at = np.flatnonzero(inner == nbytes) + 1
        p2p[:, at] = np.asarray(pricing.p2p_floor_s(_OneCut(nbytes), pp, devices))[:, None]
    floors = np.zeros((2, layers + 1))
    fixed = pricing.host_floors_s(np.arange(layers + 1, dtype=np.float64), recompute)
    if fixed is not None:
        floors[0], floors[1], per_transfer = fixed
        p2p = p2p + per_transfer
    if "first_forward_s" in flat:  # hpZ: the step's first forward's extra, what its floor leaves of it, once per step
        extra = _spans(slot, flat["first_forward_s"][index], layers)  # (objectives.first_forward.first_forward_extra_s)
        if fixed is not None:
            floor = floors[0][np.clip(ends[None, :] - ends[:, None], 0, layers)]  # by the segment's layer count
            extra = np.maximum(out["forward_s"] + extra, floor) - np.maximum(out["forward_s"], floor)
        out["step_s"] = out["step_s"] + extra
    return out, p2p, floors


def _step_costs(
    pricing: PipelinePricing, arrays: StageArrays, structure: LayerStructure, picks: np.ndarray, *, pp: int,
    recompute: str, in_flight: np.ndarray, schedule: str, micro_batches: int, chunks: int, zero3_gather: Any = None,
    sequence_shard_saved: bool | None = None, fused_swiglu: bool | None = None, grad_accumulator: Any = None,
    zero_stage: int | None = None, pipeline_buffers: str | None = None,
    chosen: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> StepCosts:
    """What ``pricing.price`` makes the step time of each cut of ``picks`` from
    (:class:`planner.search.stages.StepCosts`; memory per device with the allowance). ``zero3_gather``:
    the launcher's ZeRO-3 gather bounds, as ``pricing.price`` is given them (``TargetRules.zero3_gather``);
    ``sequence_shard_saved``, ``fused_swiglu``: its memory rules, likewise (``TargetRules``); ``grad_accumulator``:
    its optimizer's gradient accumulator at the arrays' ``zero_stage``, likewise (``TargetRules.grad_accumulator``;
    ``zero_stage`` ``None``: none priced); ``pipeline_buffers``: what its pipeline runtime holds at the cuts, likewise
    (``TargetRules.pipeline_buffers``; ``None``: the pricing's settings'); ``chosen``: the edges' ``(producers,
    consumers, seconds)`` at ``picks`` (``pricing.chosen_edges``), for ``arrays`` without edge tables."""
    accumulator = 0.0 if zero_stage is None else pricing.grad_accumulator_scale(arrays, zero_stage, pp, grad_accumulator)
    sums, p2p, floors = _segment_costs(pricing, arrays, structure, picks, pp, recompute, accumulator, chosen)
    if chunks > 1 and pp > 1:  # a looped schedule: each in-flight chunk as the segment's largest (unequal chunks)
        ends = np.arange(structure.num_layers + 1)
        lengths = np.broadcast_to(np.maximum(ends[None, :] - ends[:, None], 0), (pp, ends.size, ends.size))
        in_flight = pricing.in_flight(schedule, stages=pp, micro_batches=micro_batches, chunks=chunks,
                                      stage_layers=lengths)
    # each stage's activations at its peak, as the price holds them (the recomputation working set)
    held = pricing.segment_activation_bytes(arrays, structure, picks, sums["activations_bytes"], in_flight, recompute,
                                            sequence_shard_saved=sequence_shard_saved, fused_swiglu=fused_swiglu, chunks=chunks)
    # ZeRO-3's whole units, under the launcher's gather rule (no argument when it has none: the cache's)
    gather = {} if zero3_gather is None else {"zero3_gather": zero3_gather}
    unsharded = pricing.unsharded_segment_bytes(arrays, structure, picks, pp, micro_batches, **gather)
    if unsharded is not None:
        held = held + unsharded[None]
    held = held + _runtime_buffers(pricing, arrays, structure, picks, pp, in_flight, micro_batches, chunks, pipeline_buffers,
                                   schedule)
    # NCCL's buffers per stage: the plan's groups and the stage's neighbours, whatever the cut (as the price holds them)
    stage_nccl = getattr(pricing, "nccl_stage_bytes", None)
    nccl = 0.0 if stage_nccl is None else stage_nccl(arrays, picks, pp, interleaved=chunks > 1)[:, None, None]
    return StepCosts(
        forward=sums["forward_s"], backward=sums["backward_s"], step=sums["step_s"], update=sums["update_s"], p2p=p2p,
        floor_forward=floors[0], floor_backward=floors[1],
        memory=pricing.memory_scale * (sums["states"][None] + held) + nccl,
        schedule=schedule, micro_batches=micro_batches, chunks=chunks,
    )


def _runtime_buffers(pricing: PipelinePricing, arrays: StageArrays, structure: LayerStructure, picks: np.ndarray, pp: int,
                     in_flight: np.ndarray, micro_batches: int, chunks: int, kind: str | None,
                     schedule: str | None = None) -> np.ndarray | float:
    """``(pp, L+1, L+1)``: what the launcher's pipeline runtime holds at stage ``s``'s cuts when it runs layers
    ``[lo, hi)`` (``pricing.runtime_buffer_rates`` per byte of the cuts before ``lo`` and ``hi``, over the stage's
    devices; the first stage's input and the last's output read as its other cut, as ``pricing.price`` holds them;
    ``schedule``: a looped one's chunks hold their own, ``pricing.runtime_buffer_rates``)."""
    rates = getattr(pricing, "runtime_buffer_rates", None)
    rates = None if rates is None or pp <= 1 else rates(arrays, picks, in_flight, micro_batches, chunks, kind, schedule=schedule)
    if rates is None:
        return 0.0
    cut = structure.cut_bytes / (pricing.cluster.devices // pp)
    a_in, a_out = np.broadcast_to(cut[:, None], (cut.size, cut.size)), np.broadcast_to(cut[None, :], (cut.size, cut.size))
    a_in, a_out = np.stack([a_in] * pp), np.stack([a_out] * pp)
    a_in[0], a_out[-1] = a_out[0], a_in[-1]
    per_in, per_out = (r if r.ndim == 3 else r[:, None, None] for r in rates)
    return per_in * a_in + per_out * a_out


KEPT_COSTS_BYTES = 8 * 2**20
"""Bytes of segment costs a pipeline slot keeps for the choices it cut (``planner.search.pipeline._Slot.fastest_cuts``):
GPT-2's take ~10 kB a choice, a 96-layer model's at 64 stages ~5 MB (the ``(S, L+1, L+1)`` memory)."""


def keep_newest(store: dict, key: tuple, value: tuple[StepCosts, Any]) -> None:
    """``store[key] = value`` (``(costs, ...)``), its oldest entries dropped while their costs, about one
    size each (one slot's), exceed :data:`KEPT_COSTS_BYTES`; a dropped entry is computed again, equal."""
    store[key] = value
    costs = value[0]
    size = sum(a.nbytes for a in (costs.forward, costs.backward, costs.step, costs.p2p, costs.floor_forward,
                                  costs.floor_backward, costs.memory, costs.update) if a is not None)
    while len(store) > 1 and len(store) * size > KEPT_COSTS_BYTES:
        del store[next(iter(store))]


def _gather(arrays: StageArrays, masks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(index, starts, group)``: the flat-array entries of every distinct (op costs, allowed
    configurations) pair, concatenated (pair ``g`` starts at ``starts[g]``), and each op's pair."""
    key = ("gather", id(masks))
    entry = arrays.shared.get(key)
    if entry is None or entry[0] is not masks:  # the entry holds its masks: their ids stay theirs
        mask_ids = np.fromiter(map(id, masks), dtype=np.int64, count=len(masks))
        # the distinct (offset, mask) rows in (offset, mask id) order, as np.unique(axis=0) gives
        # them, from one 1-D code (the masks numbered in id order): far faster than sorting rows
        _, mask_code = np.unique(mask_ids, return_inverse=True)
        codes = np.asarray(arrays.offsets, dtype=np.int64) * (int(mask_code.max(initial=0)) + 1) + mask_code.ravel()
        _, first, group = np.unique(codes, return_index=True, return_inverse=True)
        allowed = [arrays.offsets[i] + np.flatnonzero(masks[i]) for i in first]
        starts = np.concatenate(([0], np.cumsum([a.size for a in allowed])[:-1])).astype(np.int64)
        entry = arrays.shared[key] = (masks, (np.concatenate(allowed), starts, group.ravel()))
    return entry[1]


def _op_minima(
    arrays: StageArrays, masks: Sequence[np.ndarray], in_flight: Sequence[float], activations: np.ndarray | None = None,
    once: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per op, the least of its costs over its allowed configurations: ``(time_s, step_s, memory)``
    with ``time_s`` = forward + backward per micro-batch, ``step_s`` the per-step part and
    ``memory[j]`` = parameter states + ``in_flight[j]`` x activations (bytes, without the allowance;
    ``activations``: the flat activations to charge, default the arrays'; ``once``: flat bytes added
    to the states, default none).
    Each is minimised on its own (a bound, not one configuration)."""
    index, starts, group = _gather(arrays, masks)
    flat = arrays.flat
    weights = np.asarray(in_flight, dtype=np.float64)
    time_s = np.minimum.reduceat(flat["forward_s"][index] + flat["backward_s"][index], starts)
    step_s = np.minimum.reduceat(flat["step_s"][index], starts)
    states = flat["params_bytes"][index] + flat["grads_bytes"][index] + flat["optimizer_bytes"][index]
    states = states if once is None else states + once[index]
    charged = flat["activations_bytes"] if activations is None else activations
    memory = states[None, :] + weights[:, None] * charged[index][None, :]
    memory = np.minimum.reduceat(memory, starts, axis=1)
    return time_s[group], step_s[group], memory[:, group]
