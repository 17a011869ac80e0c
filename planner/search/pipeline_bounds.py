r"""Lower bounds of the pipeline search (:mod:`planner.search.pipeline`): the memory floor of a
combination (each op at its leanest allowed configuration) and the step time and memory per device
no plan of a combination goes below, whatever its per-op splits and stage cut (the pruning of
``PipelineOptions.prune``; the leaner search's stop at the floor, ``LEAN_TOLERANCE``).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Mapping, Sequence

import numpy as np

from planner.search.stage_costs import _gather, _op_minima
from planner.search.stages import least_bottleneck

__all__ = ["LEAN_TOLERANCE"]

StageArrays = Any
"""A stage's per-op costs (``objectives.pipeline_arrays._OpArrays``; :data:`planner.search.pipeline.StageArrays`)."""
LayerStructure = Any
"""``objectives.pipeline_cost.LayerStructure`` (:data:`planner.search.pipeline.LayerStructure`)."""
PipelinePricing = Any
"""The pricing the search asks (:class:`planner.search.pipeline.PipelinePricing`)."""


def _credited_minima(arrays: StageArrays, masks: Sequence[np.ndarray], weights: np.ndarray,
                     credit: Mapping[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(ops, (W, len(ops)))``: the credited ops (an index array, written over the others' minima at once) and
    each one's least memory over its allowed configurations at each
    in-flight count of ``weights``, its activations less its credit ceiling per configuration
    (``pricing.activation_credit_ceiling``), as :func:`_op_minima` gives the others'. Ops alike in
    costs (one offset into the flat arrays), credit and allowed configurations (one mask object) are
    one group, as :func:`_gather` groups the others: the layers repeat, so one masked minimum per
    group and per in-flight count (:func:`_credited_groups`)."""
    if not credit:
        return np.zeros(0, dtype=np.int64), np.zeros((len(weights), 0))
    ops, states, activations, starts, group = _credited_groups(arrays, masks, credit)
    held = states[None, :] + np.asarray(weights, dtype=np.float64)[:, None] * activations[None, :]
    return ops, np.minimum.reduceat(held, starts, axis=1)[:, group]


def _bound_activations(arrays: StageArrays, credit: Mapping[int, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """``(activations, extra)``: the flat bytes per in-flight micro-batch the memory bounds charge,
    and bytes charged once beside the states (``None``: none). The price charges a repeated block's
    first instance per in-flight micro-batch as any other (the second instance's tables at its
    configuration: its checkpoints) and the rest, the recomputation working set, once
    (:func:`objectives.pipeline_price._working_set`, :func:`objectives.memory.pipelined_activation_bytes`).
    So each op of that instance is charged the least of its own and its twin's bytes (each less its
    ``credit``) per micro-batch, and, with one repeated block, what its own exceed that by once: the
    working set is then at least the stage's share of it, and one micro-batch in flight is charged its
    tables exactly. With several (a hybrid stack) the working set is one block's, so nothing once.
    At its own tables, a stage holding the first instance with many micro-batches in flight was
    bounded above its plans (1T GPT at pp = 128, selective: a 37.20 GiB bound, a 35.47 GiB plan,
    pruned). Kept on the arrays per ``credit`` object."""
    key = ("bound activations", id(credit))
    entry = arrays.lazy.get(key)
    if entry is not None and entry[0] is credit:
        return entry[1]
    own = arrays.flat["activations_bytes"]
    charged, extra, credit_of = own, None, credit or {}
    twins, blocks = _first_instance_twins(arrays)
    for i, j in twins:
        if extra is None:
            charged, extra = own.copy(), np.zeros_like(own)
        at = slice(int(arrays.offsets[i]), int(arrays.offsets[i]) + arrays.spaces[i].size)
        own_i = charged[at] - credit_of.get(i, 0.0)
        twin = own[int(arrays.offsets[j]):int(arrays.offsets[j]) + arrays.spaces[i].size] - credit_of.get(j, 0.0)
        least = np.minimum(own_i, twin)
        charged[at] = least + credit_of.get(i, 0.0)
        if blocks == 1:
            extra[at] = np.maximum(extra[at], own_i - least)
    arrays.lazy[key] = (credit, (charged, extra if blocks == 1 else None))
    return arrays.lazy[key][1]


def _first_instance_twins(arrays: StageArrays) -> tuple[list[tuple[int, int]], int]:
    """``([(op of a repeated block's first instance, the same op of its second)], blocks)``: the pairs
    whose tables differ, of the blocks the price charges a recomputation working set (the arrays'
    ``twin_instances``, which the price reads too), and how many such blocks have some."""
    pairs, blocks = [], 0
    for first, second in getattr(arrays, "twin_instances", ()):
        differ = [(int(i), int(j)) for i, j in zip(first, second) if arrays.offsets[i] != arrays.offsets[j]]
        pairs, blocks = pairs + differ, blocks + bool(differ)
    return pairs, blocks


def _credited_groups(arrays: StageArrays, masks: Sequence[np.ndarray], credit: Mapping[int, np.ndarray]
                     ) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(ops, states, activations, starts, group)`` for :func:`_credited_minima`: the credited ops in
    order; per distinct (costs, credit, mask) group its allowed configurations' states and credited
    activations laid end to end (group ``g`` from ``starts[g]``); each op's group. Kept on the arrays
    per (credit, masks), each entry holding both so their ids stay theirs."""
    key = ("credited groups", id(credit), id(masks))
    entry = arrays.lazy.get(key)
    if entry is not None and entry[0] is credit and entry[1] is masks:
        return entry[2]
    # the classes read the offsets and the credit alone, equal at every ZeRO stage: kept with the arrays of all
    # of them (``arrays.shared``, where the pricing keeps the credit itself)
    store = getattr(arrays, "shared", arrays.lazy)
    classes = store.get(("credit classes", id(credit)))
    if classes is None or classes[0] is not credit:
        ops = sorted(credit)
        numbered: dict[tuple[int, bytes], int] = {}
        kind = [numbered.setdefault((int(arrays.offsets[op]), credit[op].tobytes()), len(numbered)) for op in ops]
        classes = store[("credit classes", id(credit))] = (credit, ops, kind)
    _, ops, kind = classes
    # each op's (class, mask) pair numbered in the order of its first op, iterated at C speed (a setdefault per
    # credited op was 1.3 of the 175B plan's 135 profiled s; issue 22, nineteenth round)
    held = itemgetter(*ops)(masks) if len(ops) > 1 else [masks[op] for op in ops]  # (one op: the item itself)
    pairs = list(zip(kind, map(id, held)))
    number = {pair: n for n, pair in enumerate(dict.fromkeys(pairs))}
    group = np.fromiter(map(number.__getitem__, pairs), dtype=np.int64, count=len(pairs))
    first = np.unique(group, return_index=True)[1]
    allowed = [np.flatnonzero(masks[ops[i]]) for i in first]
    index = np.concatenate([arrays.offsets[ops[i]] + a for i, a in zip(first, allowed)])
    taken = np.concatenate([credit[ops[i]][a] for i, a in zip(first, allowed)])
    flat = arrays.flat
    charged, extra = _bound_activations(arrays, credit)
    states = flat["params_bytes"][index] + flat["grads_bytes"][index] + flat["optimizer_bytes"][index]
    states = states if extra is None else states + extra[index]
    starts = np.concatenate(([0], np.cumsum([a.size for a in allowed])[:-1])).astype(np.int64)
    found = (np.array(ops, dtype=np.int64), states, charged[index] - taken, starts, group)
    arrays.lazy[key] = (credit, masks, found)
    return found


def _memory_floor(arrays: StageArrays, masks: Sequence[np.ndarray], in_flight: float, *, scale: float,
                  credit: Mapping[int, np.ndarray] | None = None, structure: LayerStructure | None = None) -> float:
    """A lower bound of the memory of all stages together: each op at its leanest allowed
    configuration (``scale``: the memory allowance, :attr:`PipelinePricing.memory_scale`), lowered
    by :data:`_BOUND_SLACK` like the other bounds (on one stage it equals the leanest plan's
    memory, summed in another order: unlowered, it could pass a limit that plan meets exactly).
    ``credit``: ``{op: (K,) bytes per micro-batch}`` no plan's activation credit exceeds, per
    configuration (``pricing.activation_credit_ceiling``: the sequence shard a launcher keeps), taken off
    those ops' activations so the floor stays below every credited price; ``None``: no credit. ``structure``: the
    ops after its last layer (the output layer, the loss) at one micro-batch, the least any schedule's last stage holds
    of them (a looped schedule's, ``pricing.tail_in_flight``); ``None``: at ``in_flight`` too."""

    # each distinct (op costs, allowed configurations) pair's least memory, from the flat arrays
    # (:func:`_gather`), then added op after op in the ops' order as a plain sum (the same float)
    index, starts, group = _gather(arrays, masks)
    flat = arrays.flat
    memory = flat["params_bytes"][index] + flat["grads_bytes"][index] + flat["optimizer_bytes"][index]
    charged, extra = _bound_activations(arrays, credit)
    memory = memory if extra is None else memory + extra[index]
    least = np.minimum.reduceat(memory + in_flight * charged[index], starts)
    per_op = least[group]
    credited, least_credited = _credited_minima(arrays, masks, np.array([in_flight]), credit or {})
    per_op[credited] = least_credited[0]
    tail = None if structure is None or in_flight <= 1.0 else structure.position >= structure.num_layers
    if tail is not None and tail.any():
        at_one = np.minimum.reduceat(memory + charged[index], starts)[group]
        at_one[credited] = _credited_minima(arrays, masks, np.array([1.0]), credit or {})[1][0]
        per_op = np.where(tail, at_one, per_op)
    total = 0.0
    for value in per_op.tolist():
        total += value
    return scale * total * _BOUND_SLACK


LEAN_TOLERANCE = 1e-3
"""A launcher's combination whose fastest plan holds within this factor of the combination's memory
floor has no leaner plan worth listing (far below ``--collapse``'s 1%)."""

_BOUND_SLACK = 1.0 - 1e-9
"""Bounds are lowered by this factor so that rounding (sums taken in another order) never lifts one
above the price it bounds."""


def _lower_bounds(
    pricing: PipelinePricing,
    arrays: StageArrays,
    masks: Sequence[np.ndarray],
    structure: LayerStructure,
    *,
    pp: int,
    micro_batches: int,
    in_flight: np.ndarray,
    p2p_floor_s: np.ndarray,
    schedule: str,
    chunks: int,
    credit: Mapping[int, np.ndarray] | None = None,
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
    least bottleneck of the per-stage memories (tied copies only add), each credited op's least at its
    activations less its credit ceiling (``credit``, :func:`_memory_floor`'s): with it the bound holds
    for the credited prices of a launcher's rule, and without it for the others. The ops after the last layer (the
    output layer, the loss) at the last stage's count of them (``pricing.tail_in_flight``: one under a looped schedule).
    """
    flights = np.asarray(in_flight, dtype=np.float64)
    tail_weight = getattr(pricing, "tail_in_flight", lambda n, chunks: n)(float(flights[-1]), chunks)
    weights, inverse = np.unique(np.append(flights, tail_weight), return_inverse=True)
    stage_weight, tail_row = inverse[:-1], int(inverse[-1])
    time_min, step_min, memory_min = _op_minima(arrays, masks, weights, *_bound_activations(arrays, credit))
    credited, least_credited = _credited_minima(arrays, masks, weights, credit or {})
    memory_min[:, credited] = least_credited
    layers = structure.num_layers
    scale = pricing.memory_scale
    work = float(time_min.sum())
    if pp == 1:
        makespan = pricing.makespan_floor_s(
            schedule, work_s=work, p2p_s=p2p_floor_s, stages=1, micro_batches=micro_batches, chunks=chunks
        )
        return (makespan + float(step_min.sum())) * _BOUND_SLACK, (
            scale * float(memory_min[stage_weight[0]].sum()) * _BOUND_SLACK
        )
    slot = structure.position + 1  # 0: before the layers, 1..L: the layers, L + 1: after
    time_slot = np.bincount(slot, weights=time_min, minlength=layers + 2)
    slowest = least_bottleneck(time_slot[1:-1], pp, first_cost=float(time_slot[0]), last_cost=float(time_slot[-1]))
    makespan = pricing.makespan_floor_s(
        schedule, work_s=work, bottleneck_s=slowest, p2p_s=p2p_floor_s, stages=pp, micro_batches=micro_batches,
        chunks=chunks,
    )
    first_step = float(step_min[structure.position <= 0].sum())
    memory_slot = np.stack([np.bincount(slot, weights=row, minlength=layers + 2) for row in memory_min])
    per_stage = memory_slot[stage_weight.ravel()]  # (pp, L + 2): each stage's in-flight count
    memory = least_bottleneck(
        per_stage[:, 1:-1], pp, first_cost=float(per_stage[0, 0]), last_cost=float(memory_slot[tail_row, -1])
    )
    return (makespan + first_step) * _BOUND_SLACK, scale * memory * _BOUND_SLACK
