r"""Contiguous stage partition of a layer sequence, balanced by a dynamic program over layer boundaries.

A pipeline cuts the sequence of :math:`L` layers into :math:`S` contiguous stages, each of at least
one layer; stage :math:`s` takes layers :math:`[a_s, a_{s+1})` with :math:`a_0 = 0`,
:math:`a_S = L`. The ops before the first layer (embeddings) join the first stage and those after
the last (final norm, LM head) the last stage, as fixed extras. A stage costs

.. math::

    C_s = \sum_{\ell \in [a_s, a_{s+1})} c_\ell + [s = 0]\, c_{first} + [s = S-1]\, c_{last}

and the partition minimises the bottleneck :math:`\max_s C_s` (the pipeline's steady state runs at
the pace of its slowest stage), subject to an optional per-stage memory limit
:math:`M_s = \sum_\ell \mu_{s,\ell} + [s=0]\,\mu_{first} + [s=S-1]\,\mu_{last} \le M_{max}`, where
the per-layer memory may depend on the stage (a stage of a 1F1B pipeline keeps :math:`S - s`
micro-batches of activations). As Alpa and Piper do, the balance is over measured costs, not layer
counts.

The DP (:func:`partition_layers`): :math:`B_s(j)` = the least bottleneck of stages :math:`0..s`
covering layers :math:`[0, j)`,

.. math::

    B_0(j) = C_0(0, j), \qquad B_s(j) = \min_{i < j} \max\bigl(B_{s-1}(i),\, C_s(i, j)\bigr),

with every :math:`C_s(i, j)` read from prefix sums, one ``(L+1, L+1)`` array per stage (no Python
loop over boundaries); :math:`O(S L^2)` work. Ties go to the smallest boundary, so results are
deterministic. :func:`partition_brute_force` enumerates all :math:`\binom{L-1}{S-1}` cuts: the
oracle for tests.

The cut of least step time as the pipeline's price computes it is :func:`partition_step_time`;
:func:`pareto_cuts` adds, for the search's leaner plans, the cut of least step time under each
smaller cap of the stages' memory: every cut of a better time/memory trade-off (the time-balanced
cut is not the memory-balanced one).

References
----------
L. Zheng et al., "Alpa", OSDI 2022 (Sec. 5: stage slicing by DP). J. Tarnawski et al., "Piper",
NeurIPS 2021.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from planner.core.chunks import chunk_pad
from planner.core.errors import InputError

__all__ = [
    "Partition",
    "partition_layers",
    "partition_brute_force",
    "least_bottleneck",
    "stage_costs",
    "stage_memories",
    "StepCosts",
    "StepPartition",
    "partition_step_time",
    "partition_step_time_brute_force",
    "step_time_of_cut",
    "ParetoCut",
    "pareto_cuts",
    "pareto_cuts_brute_force",
]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Partition:
    """A cut of the layer sequence into contiguous stages."""

    bounds: tuple[int, ...]
    """``S + 1`` layer indices: stage ``s`` has layers ``bounds[s]`` to ``bounds[s+1] - 1``."""
    stage_cost: np.ndarray
    """``(S,)`` cost of each stage (the caller's unit, e.g. seconds per micro-batch)."""
    stage_memory: np.ndarray
    """``(S,)`` memory of each stage (zeros when no memory was given)."""
    feasible: bool
    """Every stage within the memory limit (True when there is no limit)."""

    @property
    def bottleneck(self) -> float:
        """The largest stage cost."""
        return float(self.stage_cost.max())

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.bounds[:-1], self.bounds[1:]))


def _validate(layer_cost: np.ndarray, stages: int) -> None:
    if layer_cost.ndim != 1:
        raise InputError("layer costs must be a 1-D array, one per layer")
    if stages < 1:
        raise InputError(f"a pipeline needs at least one stage (got {stages})")
    if stages > layer_cost.size:
        raise InputError(
            f"{stages} pipeline stages need at least {stages} layers and the model has {layer_cost.size}; "
            "use a smaller --pp"
        )


def _memory_matrix(layer_memory: np.ndarray | None, stages: int, layers: int) -> np.ndarray:
    if layer_memory is None:
        return np.zeros((stages, layers))
    memory = np.asarray(layer_memory, dtype=np.float64)
    if memory.ndim == 1:
        memory = np.broadcast_to(memory, (stages, layers))
    if memory.shape != (stages, layers):
        raise InputError(f"layer memory must be ({layers},) or ({stages}, {layers}), got {memory.shape}")
    return memory


def _span(prefix: np.ndarray) -> np.ndarray:
    """``(L+1, L+1)``: ``span[i, j] = prefix[j] - prefix[i]`` (the sum over layers ``[i, j)``)."""
    return prefix[None, :] - prefix[:, None]


def stage_costs(
    layer_cost: Sequence[float] | np.ndarray,
    bounds: Sequence[int],
    *,
    first_cost: float = 0.0,
    last_cost: float = 0.0,
) -> np.ndarray:
    """``(S,)`` cost of each stage of a partition given by its ``bounds`` (module docstring).

    Examples
    --------
    >>> stage_costs([1.0, 2.0, 3.0, 4.0], (0, 2, 4), first_cost=0.5).tolist()
    [3.5, 7.0]
    """
    cost = np.asarray(layer_cost, dtype=np.float64)
    prefix = np.concatenate(([0.0], np.cumsum(cost)))
    b = np.asarray(bounds, dtype=np.int64)
    out = prefix[b[1:]] - prefix[b[:-1]]
    out[0] += first_cost
    out[-1] += last_cost
    return out


def stage_memories(
    layer_memory: Sequence[float] | np.ndarray | None,
    bounds: Sequence[int],
    *,
    first_memory: float = 0.0,
    last_memory: float = 0.0,
) -> np.ndarray:
    """``(S,)`` memory of each stage; ``layer_memory`` is ``(L,)`` or per stage ``(S, L)``."""
    stages = len(bounds) - 1
    layers = int(bounds[-1])
    memory = _memory_matrix(None if layer_memory is None else np.asarray(layer_memory), stages, layers)
    out = np.array([memory[s, bounds[s] : bounds[s + 1]].sum() for s in range(stages)], dtype=np.float64)
    out[0] += first_memory
    out[-1] += last_memory
    return out


def partition_layers(
    layer_cost: Sequence[float] | np.ndarray,
    stages: int,
    *,
    first_cost: float = 0.0,
    last_cost: float = 0.0,
    layer_memory: Sequence[float] | np.ndarray | None = None,
    first_memory: float = 0.0,
    last_memory: float = 0.0,
    memory_limit: float | None = None,
) -> Partition:
    r"""The contiguous partition into ``stages`` stages with the least bottleneck (module docstring).

    Parameters
    ----------
    layer_cost:
        ``(L,)`` cost of each layer (e.g. seconds per micro-batch), >= 0.
    stages:
        Number of stages :math:`S`, at most :math:`L`.
    first_cost, last_cost:
        Cost of the ops before the first layer / after the last (added to the first / last stage).
    layer_memory:
        ``(L,)`` or ``(S, L)`` memory of each layer (bytes), per stage when it depends on the stage.
    first_memory, last_memory:
        Memory of the ops before / after the layers.
    memory_limit:
        Per-stage limit (bytes). When no partition meets it, the least-bottleneck partition is
        returned with ``feasible=False``.

    Returns
    -------
    Partition

    Raises
    ------
    InputError
        More stages than layers, or malformed arrays.

    Examples
    --------
    >>> p = partition_layers([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 3, last_cost=2.0)
    >>> p.bounds, p.stage_cost.tolist()
    ((0, 2, 5, 6), [2.0, 3.0, 3.0])
    """
    cost = np.asarray(layer_cost, dtype=np.float64)
    _validate(cost, stages)
    layers = cost.size
    memory = _memory_matrix(layer_memory, stages, layers)
    limit = np.inf if memory_limit is None else float(memory_limit)
    span_cost = _span(np.concatenate(([0.0], np.cumsum(cost))))
    valid = np.triu(np.ones((layers + 1, layers + 1), dtype=bool), k=1)  # i < j: at least one layer

    def run(with_limit: bool) -> tuple[np.ndarray, list[np.ndarray]]:
        best = np.full(layers + 1, np.inf)
        best[0] = 0.0  # no stage yet: nothing covered, no bottleneck
        choices: list[np.ndarray] = []
        for s in range(stages):
            stage = span_cost + (first_cost if s == 0 else 0.0) + (last_cost if s == stages - 1 else 0.0)
            allowed = valid.copy()
            if s == 0:
                allowed[1:, :] = False  # the first stage starts at layer 0
            if s == stages - 1:
                allowed[:, :layers] = False  # the last stage ends at layer L
            if with_limit:
                stage_memory = _span(np.concatenate(([0.0], np.cumsum(memory[s]))))
                stage_memory += (first_memory if s == 0 else 0.0) + (last_memory if s == stages - 1 else 0.0)
                allowed &= stage_memory <= limit
            candidates = np.where(allowed, np.maximum(best[:, None], stage), np.inf)
            arg = candidates.argmin(axis=0)  # the smallest boundary wins ties
            best = candidates[arg, np.arange(layers + 1)]
            choices.append(arg)
        return best, choices

    best, choices = run(with_limit=memory_limit is not None)
    feasible = bool(np.isfinite(best[layers]))
    if not feasible:
        best, choices = run(with_limit=False)
    bounds = [layers]
    for s in range(stages - 1, 0, -1):
        bounds.append(int(choices[s][bounds[-1]]))
    bounds.append(0)
    bounds.reverse()
    costs = stage_costs(cost, bounds, first_cost=first_cost, last_cost=last_cost)
    memories = stage_memories(memory, bounds, first_memory=first_memory, last_memory=last_memory)
    return Partition(
        bounds=tuple(bounds),
        stage_cost=costs,
        stage_memory=memories,
        feasible=feasible if memory_limit is not None else True,
    )


def least_bottleneck(
    layer_cost: Sequence[float] | np.ndarray,
    stages: int,
    *,
    first_cost: float = 0.0,
    last_cost: float = 0.0,
) -> float:
    r"""The least bottleneck :math:`\min \max_s C_s` over every contiguous partition, where a layer
    may cost differently on each stage.

    Parameters
    ----------
    layer_cost:
        ``(L,)`` or ``(S, L)``: the cost of each layer, per stage when it depends on the stage (e.g.
        the memory of a layer on a 1F1B stage, which keeps :math:`S - s` micro-batches).
    stages:
        Number of stages :math:`S`, at most :math:`L`.
    first_cost, last_cost:
        Added to the first / last stage.

    Returns
    -------
    float
        The value only (the same DP as :func:`partition_layers`, without a limit).

    Examples
    --------
    >>> least_bottleneck([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]], 2)
    3.0

    Answers are kept by content (:data:`_LEAST_BOTTLENECKS`): the searches' lower bounds ask the same costs again
    (2,477 of GPT-3 175B's 5,844 calls at 1,024 devices), and the value is a function of the costs, the stage
    count and the extras alone.
    """
    cost = np.asarray(layer_cost, dtype=np.float64)
    key = (cost.shape, hashlib.blake2b(np.ascontiguousarray(cost).tobytes(), digest_size=16).digest(), int(stages),
           float(first_cost), float(last_cost))
    found = _LEAST_BOTTLENECKS.get(key)
    if found is None:
        found = _least_bottleneck(cost, stages, first_cost=first_cost, last_cost=last_cost)
        if len(_LEAST_BOTTLENECKS) >= _LEAST_BOTTLENECK_ENTRIES:
            del _LEAST_BOTTLENECKS[next(iter(_LEAST_BOTTLENECKS))]  # the oldest first
        _LEAST_BOTTLENECKS[key] = found
    return found


_LEAST_BOTTLENECKS: dict[tuple, float] = {}
""":func:`least_bottleneck`'s answers by (shape, 16-byte BLAKE2b digest of the float64 costs, stages, first cost,
last cost), the oldest dropped past :data:`_LEAST_BOTTLENECK_ENTRIES`."""

_LEAST_BOTTLENECK_ENTRIES = 16_384
"""Answers :data:`_LEAST_BOTTLENECKS` keeps (about 100 bytes each; the 1T plan asks ~15,000 times)."""


def _least_bottleneck(cost: np.ndarray, stages: int, *, first_cost: float, last_cost: float) -> float:
    """:func:`least_bottleneck` computed (its min-max DP), ``cost`` as float64."""
    layers = cost.shape[-1]
    _validate(np.zeros(layers), stages)
    matrix = _memory_matrix(cost, stages, layers)
    prefixes = np.concatenate((np.zeros((stages, 1)), np.cumsum(matrix, axis=1)), axis=1)
    if stages == 1:
        return float(prefixes[0, layers] + first_cost + last_cost)
    # Stage 0 starts at layer 0 and the last stage ends at layer L: vectors; the stages between take
    # a min-max step. Every stage holds at least one layer, so stage s starts at a layer in
    # [s, s + width) and ends before one in [s + 1, s + 1 + width), width = L - S + 1: only that
    # (width, width) window of spans is read (a start outside it leaves some stage empty), which
    # takes the same minimum over the same sums as the whole (L+1, L+1) matrix, S times cheaper
    # at S = L. ``best[a]``: the least bottleneck of stages 0..s-1 ending before layer s + a.
    width = layers - stages + 1
    best = prefixes[0, 1 : 1 + width] + first_cost
    if width == 1:  # as many stages as layers: one cut, a layer per stage; the min-max steps are a running maximum
        middle = np.arange(1, stages - 1)
        row = np.zeros_like(middle) if cost.ndim == 1 else middle  # stage s's prefix row (row 0 when uniform, as below)
        spans = prefixes[row, middle + 1] - prefixes[row, middle]
        best = np.maximum(best, spans.max(initial=-np.inf))  # taken at once: 0.66 -> 0.12 ms at 128 of 128 layers
    else:
        invalid = np.tril(np.ones((width, width), dtype=bool), -1)  # ends at or before the start
        uniform_span = _span(prefixes[0]) if cost.ndim == 1 else None  # every stage costs alike: one matrix
        for s in range(1, stages - 1):
            starts, ends = slice(s, s + width), slice(s + 1, s + 1 + width)
            if uniform_span is not None:
                span = uniform_span[starts, ends]
            else:
                span = prefixes[s][None, ends] - prefixes[s][starts, None]
            step = np.maximum(best[:, None], span)
            step[invalid] = np.inf
            best = step.min(axis=0)
    last = prefixes[stages - 1, layers] - prefixes[stages - 1, stages - 1 : layers] + last_cost
    return float(np.maximum(best, last).min())


def partition_brute_force(
    layer_cost: Sequence[float] | np.ndarray,
    stages: int,
    *,
    first_cost: float = 0.0,
    last_cost: float = 0.0,
    layer_memory: Sequence[float] | np.ndarray | None = None,
    first_memory: float = 0.0,
    last_memory: float = 0.0,
    memory_limit: float | None = None,
) -> Partition:
    """The oracle: every cut of the sequence, the least bottleneck kept (same rules as the DP).

    Examples
    --------
    >>> partition_brute_force([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 3, last_cost=2.0).bottleneck
    3.0
    """
    cost = np.asarray(layer_cost, dtype=np.float64)
    _validate(cost, stages)
    layers = cost.size
    memory = _memory_matrix(layer_memory, stages, layers)
    limit = np.inf if memory_limit is None else float(memory_limit)
    best: tuple[float, tuple[int, ...]] | None = None
    best_any: tuple[float, tuple[int, ...]] | None = None
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *cuts, layers)
        bottleneck = float(stage_costs(cost, bounds, first_cost=first_cost, last_cost=last_cost).max())
        fits = bool(
            np.all(stage_memories(memory, bounds, first_memory=first_memory, last_memory=last_memory) <= limit)
        )
        if best_any is None or bottleneck < best_any[0]:
            best_any = (bottleneck, bounds)
        if fits and (best is None or bottleneck < best[0]):
            best = (bottleneck, bounds)
    feasible = best is not None
    chosen = best if best is not None else best_any
    assert chosen is not None
    bounds = chosen[1]
    return Partition(
        bounds=bounds,
        stage_cost=stage_costs(cost, bounds, first_cost=first_cost, last_cost=last_cost),
        stage_memory=stage_memories(memory, bounds, first_memory=first_memory, last_memory=last_memory),
        feasible=feasible if memory_limit is not None else True,
    )


# --------------------------------------------------------------------------------------------
# the cut of least step time (the schedule's closed form, each stage's per-step work, fixed costs)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StepCosts:
    r"""What the step time of a cut is made of, per *segment* of layers :math:`[i, j)` (the ops
    before the layers belong to every segment with :math:`i = 0`, those after to every one with
    :math:`j = L`). Segment values need not add up over segments: a transfer between two ops is
    work of their stage only when both are in it, a parameter copy only when its owner is not.

    With :math:`n = j - i` layers, a stage running segment :math:`[i, j)` takes
    :math:`f = \max(F_{ij}, \phi^f_n)` forward and :math:`b = \max(B_{ij}, \phi^b_n)` backward per
    micro-batch (the floors: a launcher's host work) and :math:`g = G_{ij}` per step after its last
    backward, of which :math:`u = U_{ij}` is the optimizer step that waits for every stage; boundary :math:`k` (between stages :math:`k` and :math:`k+1`) placed before layer
    :math:`j` costs :math:`c_k = P_{kj}` per micro-batch and direction. The step time of the cut is
    :func:`step_time_of_cut`.
    """

    forward: np.ndarray
    """``(L+1, L+1)``: ``[i, j]`` forward seconds per micro-batch of a stage running layers ``[i, j)``."""
    backward: np.ndarray
    """``(L+1, L+1)``: backward seconds per micro-batch."""
    step: np.ndarray
    """``(L+1, L+1)``: seconds per step after the stage's last backward (synchronisation, optimizer)."""
    p2p: np.ndarray
    """``(S-1, L+1)``: ``[k, j]`` seconds of boundary ``k``'s transfer when it falls before layer ``j``."""
    floor_forward: np.ndarray | None = None
    """``(L+1,)``: the least forward seconds of a stage of ``n`` layers (``None``: no floor)."""
    floor_backward: np.ndarray | None = None
    """``(L+1,)``: the least backward seconds."""
    memory: np.ndarray | None = None
    """``(S, L+1, L+1)``: memory of stage ``s`` running ``[i, j)`` (``None``: not limited)."""
    update: np.ndarray | None = None
    """``(L+1, L+1)``: the optimizer step's part of :attr:`step`, which starts once every stage's
    gradients are in (``objectives.pipeline_price.pipeline_step_s``); ``None``: none."""
    schedule: str = "1f1b"
    micro_batches: int = 1
    chunks: int = 1


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StepPartition:
    """A cut of least step time (:func:`partition_step_time`)."""

    bounds: tuple[int, ...]
    step_s: float
    """Its step time (:func:`step_time_of_cut`)."""
    feasible: bool
    """Every stage within the memory limit (True when there is no limit)."""


def _looped(costs: StepCosts) -> bool:
    """Whether the schedule runs ``costs.chunks > 1`` model chunks per device."""
    return costs.schedule in ("interleaved", "zb-h1", "zbv") and costs.chunks > 1


def _stage_passes(costs: StepCosts, bounds: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(forward, backward, step, p2p)`` of each stage (boundary) of a cut, the floors applied."""
    a = np.asarray(bounds, dtype=np.int64)
    i, j = a[:-1], a[1:]
    f, b = costs.forward[i, j], costs.backward[i, j]
    n = j - i
    if costs.floor_forward is not None:
        f = np.maximum(f, costs.floor_forward[n])
    if costs.floor_backward is not None:
        b = np.maximum(b, costs.floor_backward[n])
    c = costs.p2p[np.arange(a.size - 2), a[1:-1]] if a.size > 2 else np.zeros(0)
    return f, b, costs.step[i, j], c


def _updates(costs: StepCosts, bounds: Sequence[int]) -> np.ndarray:
    """Each stage's optimizer step of a cut (zeros without :attr:`StepCosts.update`)."""
    a = np.asarray(bounds, dtype=np.int64)
    return np.zeros(a.size - 1) if costs.update is None else costs.update[a[:-1], a[1:]]


def step_time_of_cut(costs: StepCosts, bounds: Sequence[int]) -> float:
    r"""The step time of a cut: the schedule's makespan
    (:func:`objectives.schedules.pipeline_time_s`'s closed forms over the stages' floored passes and
    the boundaries' transfers) then each stage's per-step work after its last backward, which comes
    the drain of the stages in front of it before the end of the pipeline:

    .. math:: T = \max_s \bigl(T_{pipe} - \textstyle\sum_{k<s} (b_k + c_k) + g_s - u_s\bigr) + \max_s u_s

    with the optimizer steps :math:`u_s` after every stage's synchronisation
    (``objectives.pipeline_price.pipeline_step_s``, reimplemented on segment costs).

    Examples
    --------
    >>> z = np.zeros((3, 3))
    >>> fw = np.array([[0, 1, 2], [0, 0, 1], [0, 0, 0]], dtype=float)
    >>> costs = StepCosts(forward=fw, backward=2 * fw, step=z, p2p=np.zeros((1, 3)), micro_batches=4)
    >>> step_time_of_cut(costs, (0, 1, 2))  # 1F1B: 6 + 3 x 3
    15.0
    """
    f, b, g, c = _stage_passes(costs, bounds)
    t, m, stages = f + b, costs.micro_batches, f.size
    c_sum, c_max = (float(c.sum()), float(c.max())) if c.size else (0.0, 0.0)
    if costs.schedule == "gpipe":
        pipe = t.sum() + 2.0 * c_sum + (m - 1) * (f.max() + b.max())
    elif _looped(costs):
        # the zero-bubble schedules' cut: their interleaved form, less a W credit no cut changes much
        # (objectives.schedules.pipeline_time_s: 2(S-1) min_s w_s / v); the price is theirs. Unequal
        # chunks: each stage's passes times its chunk_pad (every chunk as its largest)
        v = costs.chunks
        pad = chunk_pad(np.diff(np.asarray(bounds)), v)
        slowest = (f * pad).max() + (b * pad).max()
        pipe = (m + (stages - 1) / v) * slowest + 2.0 * v * c_sum + 2.0 * v * (m - 1) * c_max
    else:
        pipe = t.sum() + 2.0 * c_sum + (m - 1) * (t.max() + 2.0 * c_max)
    drain = np.concatenate(([0.0], np.cumsum(b[:-1] + c)))
    u = _updates(costs, bounds)
    return float(np.max(pipe - drain + g - u) + np.max(u))


def _cuts(layers: int, stages: int):
    for inner in itertools.combinations(range(1, layers), stages - 1):
        yield (0, *inner, layers)


def partition_step_time_brute_force(costs: StepCosts, stages: int, *, memory_limit: float | None = None) -> StepPartition:
    """The oracle: every cut priced by :func:`step_time_of_cut`, the least kept (the fitting ones
    when some fit; ties: the first cut in lexicographic order)."""
    layers = costs.forward.shape[0] - 1
    _validate(np.zeros(layers), stages)
    best: tuple[float, tuple[int, ...]] | None = None
    best_any: tuple[float, tuple[int, ...]] | None = None
    limit = np.inf if memory_limit is None or costs.memory is None else float(memory_limit)
    for bounds in _cuts(layers, stages):
        value = step_time_of_cut(costs, bounds)
        fits = costs.memory is None or all(
            costs.memory[s, bounds[s], bounds[s + 1]] <= limit for s in range(stages)
        )
        if best_any is None or value < best_any[0]:
            best_any = (value, bounds)
        if fits and (best is None or value < best[0]):
            best = (value, bounds)
    chosen = best if best is not None else best_any
    assert chosen is not None
    return StepPartition(bounds=chosen[1], step_s=chosen[0], feasible=best is not None or memory_limit is None)


def _schedule_terms(schedule: str, stages: int, m: int, chunks: int) -> tuple[float, float, dict[str, float]]:
    r"""``(alpha, gamma, weights)``: the makespan is :math:`\alpha \sum_s t_s + \gamma \sum_k c_k +
    \sum_d w_d \max_s d_s` over the quantities ``d`` of ``weights`` (``t``, ``f``, ``b``, ``c``)."""
    if schedule == "gpipe":
        return 1.0, 2.0, {"f": m - 1.0, "b": m - 1.0}
    if schedule in ("interleaved", "zb-h1", "zbv") and chunks > 1:  # as step_time_of_cut (f, b: chunk_pad's)
        slots = m + (stages - 1) / chunks
        return 0.0, 2.0 * chunks, {"f": slots, "b": slots, "c": 2.0 * chunks * (m - 1.0)}
    return 1.0, 2.0, {"t": m - 1.0, "c": 2.0 * (m - 1.0)}


class _StepModel:
    """Segment matrices of one :func:`partition_step_time` call: floored passes, the segments each
    stage may run, and the DP of the step time's suffix values (:func:`partition_step_time`)."""

    def __init__(self, costs: StepCosts, stages: int, memory_limit: float | None) -> None:
        layers = costs.forward.shape[0] - 1
        self.costs, self.stages, self.layers = costs, stages, layers
        idx = np.arange(layers + 1)
        count = np.clip(idx[None, :] - idx[:, None], 0, layers)
        f, b = np.asarray(costs.forward, dtype=np.float64), np.asarray(costs.backward, dtype=np.float64)
        if costs.floor_forward is not None:
            f = np.maximum(f, np.asarray(costs.floor_forward)[count])
        if costs.floor_backward is not None:
            b = np.maximum(b, np.asarray(costs.floor_backward)[count])
        self.u = np.zeros_like(f) if costs.update is None else np.asarray(costs.update, dtype=np.float64)
        self.f, self.b, self.t, self.g = f, b, f + b, np.asarray(costs.step, dtype=np.float64) - self.u
        # the makespan's maxima of a looped schedule: each segment's passes times its chunk_pad
        pad = chunk_pad(count, costs.chunks) if _looped(costs) else None
        self.slow_f, self.slow_b = (f, b) if pad is None else (f * pad, b * pad)
        self.c = np.vstack([np.asarray(costs.p2p, dtype=np.float64).reshape(stages - 1, layers + 1),
                            np.zeros((1, layers + 1))])  # the last stage has no boundary after it
        self.alpha, self.gamma, weights = _schedule_terms(costs.schedule, stages, costs.micro_batches, costs.chunks)
        weights = {**weights, "u": 1.0 if costs.update is not None else 0.0}  # the update after every stage's
        self.weights = {d: w for d, w in weights.items() if w > 0 and (d != "c" or stages > 1)}
        valid = np.triu(np.ones((layers + 1, layers + 1), dtype=bool), k=1)
        allowed = np.broadcast_to(valid, (stages, layers + 1, layers + 1)).copy()
        allowed[0, 1:, :] = False  # the first stage starts at layer 0
        allowed[-1, :, :layers] = False  # the last stage ends at layer L
        self.feasible = True
        if memory_limit is not None and costs.memory is not None:
            fits = allowed & (np.asarray(costs.memory) <= float(memory_limit))
            self.feasible = self._reaches(fits)
            allowed = fits if self.feasible else allowed  # no cut fits: the limit is dropped
        self.allowed = allowed
        self.additive = self._suffix_is_additive()

    def _reaches(self, allowed: np.ndarray) -> bool:
        reach = np.zeros(self.layers + 1, dtype=bool)
        reach[0] = True
        for s in range(self.stages):
            reach = (reach[:, None] & allowed[s]).any(axis=0)
        return bool(reach[self.layers])

    def _suffix_is_additive(self) -> bool:
        r"""Whether :math:`\alpha \sum t + \gamma \sum c` over the stages from layer :math:`i` on
        depends only on :math:`i` and the stage index: segment times that add up
        (:math:`t_{ij} = t_{iL} - t_{jL}`) and each boundary's transfer the same wherever it falls."""
        layers = self.layers
        inner = self.c[:-1, 1:layers]
        if inner.size and not np.all(inner == inner[:, :1]):
            return False
        if self.alpha == 0.0:
            return True
        t = self.t
        potential = np.append(t[:layers, layers], 0.0)
        gap = np.abs(t - (potential[:, None] - potential[None, :]))
        scale = max(float(np.abs(potential).max()), 1e-300)
        return bool(np.all(gap[self.allowed.any(axis=0)] <= 1e-12 * scale))

    def metric(self, dim: str, s: int) -> np.ndarray:
        """``(L+1, L+1)`` (broadcast) value of quantity ``dim`` for stage ``s`` running ``[i, j)``."""
        if dim == "c":
            return self.c[s][None, :]
        return {"t": self.t, "f": self.slow_f, "b": self.slow_b, "u": self.u}[dim]

    def masks(self, caps: dict[str, float]) -> np.ndarray:
        allowed = self.allowed.copy()
        for dim, cap in caps.items():
            for s in range(self.stages):
                allowed[s] &= self.metric(dim, s) <= cap
        return allowed

    def value(self, bounds: Sequence[int]) -> float:
        return step_time_of_cut(self.costs, bounds)

    def maximum(self, dim: str, bounds: Sequence[int]) -> float:
        return max(float(np.broadcast_to(self.metric(dim, s), self.t.shape)[bounds[s], bounds[s + 1]])
                   for s in range(self.stages))

    def candidates(self, dim: str) -> np.ndarray:
        """Sorted distinct values of ``dim`` over the segments some stage may run."""
        if dim == "c":
            values = [self.c[s][self.allowed[s].any(axis=0)] for s in range(self.stages - 1)]
            return np.unique(np.concatenate(values)) if values else np.zeros(0)
        return np.unique(self.metric(dim, 0)[self.allowed.any(axis=0)])

    def balanced(self) -> tuple[int, ...]:
        """The allowed cut of least ``max_s t_s`` (ties: the smallest boundaries)."""
        best = np.full(self.layers + 1, np.inf)
        best[0] = -np.inf
        choices = []
        for s in range(self.stages):
            cand = np.where(self.allowed[s], np.maximum(best[:, None], self.t), np.inf)
            arg = cand.argmin(axis=0)
            best = cand[arg, np.arange(self.layers + 1)]
            choices.append(arg)
        bounds = [self.layers]
        for s in range(self.stages - 1, 0, -1):
            bounds.append(int(choices[s][bounds[-1]]))
        return (0, *reversed(bounds))

    def least_max(self, dim: str) -> float:
        """The least ``max_s dim_s`` over the allowed cuts (a minimax DP, as :func:`least_bottleneck`)."""
        best = np.full(self.layers + 1, np.inf)
        best[0] = -np.inf
        for s in range(self.stages):
            metric = np.broadcast_to(self.metric(dim, s), self.t.shape)
            best = np.where(self.allowed[s], np.maximum(best[:, None], metric), np.inf).min(axis=0)
        return float(best[self.layers])

    def least_suffix(self, allowed: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
        r"""The least :math:`V_0` over the cuts ``allowed`` (:func:`partition_step_time`), and its cut."""
        if self.additive:
            return self._scalar_dp(allowed)
        return self._pareto_dp(allowed)

    def _scalar_dp(self, allowed: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
        """:math:`V_s(i)` alone: the suffix sum is a function of ``(s, i)``."""
        layers, stages, alpha, gamma = self.layers, self.stages, self.alpha, self.gamma
        potential = np.append(self.t[:layers, layers], 0.0)
        p2p = self.c[:, 1] if layers > 1 else np.zeros(stages)  # the same at every position
        tail = np.concatenate((np.cumsum(p2p[::-1])[::-1], [0.0]))  # tail[s] = sum of c_k, k >= s
        value = np.full(layers + 1, np.inf)
        choices: list[np.ndarray] = []
        for s in range(stages - 1, -1, -1):
            suffix = alpha * potential + gamma * tail[s]  # (L+1,) by the stage's first layer
            own = suffix[:, None] + self.g
            if s == stages - 1:
                cand = own
            else:
                step = alpha * self.t + (gamma - 1.0) * self.c[s][None, :] - self.b
                cand = np.maximum(own, value[None, :] + step)
            cand = np.where(allowed[s], cand, np.inf)
            arg = cand.argmin(axis=1)
            value = cand[np.arange(layers + 1), arg]
            choices.append(arg)
        if not np.isfinite(value[0]):
            return None
        bounds = [0]
        for arg in reversed(choices):
            bounds.append(int(arg[bounds[-1]]))
        return float(value[0]), tuple(bounds)

    def _pareto_dp(self, allowed: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
        r"""Pareto fronts of :math:`(\Sigma_s, V_s)` per ``(s, i)``: both only grow the final value."""
        layers, stages, alpha, gamma = self.layers, self.stages, self.alpha, self.gamma
        last = np.flatnonzero(allowed[-1][:, layers])
        suf = alpha * self.t[last, layers]
        fronts = [(last, suf, suf + self.g[last, layers], np.full(last.size, -1))]  # (i, suffix, V, back)
        for s in range(stages - 2, -1, -1):
            starts, sufs, values = fronts[-1][0], fronts[-1][1], fronts[-1][2]
            # every first layer i of stage s at once: rows i, columns the next stage's front
            firsts = np.zeros(1, dtype=np.int64) if s == 0 else np.arange(s, layers)
            cells = np.ix_(firsts, starts)
            ok = allowed[s][cells]
            t, c = self.t[cells], self.c[s, starts]
            suffix = sufs + alpha * t + gamma * c
            value = np.maximum(suffix + self.g[cells], values + alpha * t + (gamma - 1.0) * c - self.b[cells])
            # per row, the Pareto-minimal pairs among the allowed ones (those left out sort last)
            order = np.lexsort((np.where(ok, value, np.inf), np.where(ok, suffix, np.inf), ~ok), axis=-1)
            ranked = np.take_along_axis(value, order, axis=1)
            low = np.minimum.accumulate(ranked, axis=1)
            keep = np.take_along_axis(ok, order, axis=1)
            keep[:, 1:] &= ranked[:, 1:] < low[:, :-1]
            rows, ranks = np.nonzero(keep)
            if not rows.size:
                return None
            back = order[rows, ranks]
            fronts.append((firsts[rows], suffix[rows, back], value[rows, back], back))
        first = fronts[-1]
        if not first[0].size:
            return None
        k = int(np.argmin(first[2]))
        best, bounds = float(first[2][k]), [0]
        for level in range(len(fronts) - 1, 0, -1):
            k = int(fronts[level][3][k])
            bounds.append(int(fronts[level - 1][0][k]))
        bounds.append(layers)
        return best, tuple(bounds)


class _Descent:
    """The search over the maxima's caps of :func:`partition_step_time` (its docstring), one
    quantity a level, the incumbent shared."""

    def __init__(self, model: _StepModel) -> None:
        self.model = model
        self.dims = sorted(model.weights, key=lambda d: (len(model.candidates(d)), d))
        self.lows = {d: model.least_max(d) for d in self.dims}
        self.values = {d: model.candidates(d) for d in self.dims}
        free = model.least_suffix(model.allowed)
        assert free is not None
        self.floor_v = free[0]  # no cut has a smaller V, whatever the caps
        self.best_s, self.best = model.value(free[1]), free[1]
        self.evaluations = 1

    def offer(self, bounds: tuple[int, ...]) -> None:
        value = self.model.value(bounds)
        if value < self.best_s or (value == self.best_s and bounds < self.best):
            self.best_s, self.best = value, bounds

    def level(self, d: int, caps: dict[str, float]) -> tuple[float, tuple[int, ...]] | None:
        r"""The least :math:`\sum_{d' \ge d} w_{d'} \max d' + V_0` over the cuts within ``caps``, or
        ``None`` when it is at least what could still beat the incumbent."""
        model = self.model
        outer = sum(model.weights[x] * self.lows[x] for x in self.dims[:d])
        if d == len(self.dims):
            self.evaluations += 1
            found = model.least_suffix(model.masks(caps))
            if found is None:
                return None
            self.offer(found[1])
            return found if found[0] < self.best_s - outer else None
        dim, weight, values = self.dims[d], model.weights[self.dims[d]], self.values[self.dims[d]]
        inner_low = self.floor_v + sum(model.weights[x] * self.lows[x] for x in self.dims[d + 1:])
        top = np.searchsorted(values, (self.best_s - outer - inner_low) / weight, side="right") - 1
        result: tuple[float, tuple[int, ...]] | None = None
        while top >= 0 and values[top] >= self.lows[dim]:
            found = self.level(d + 1, {**caps, dim: float(values[top])})
            if found is None:
                break  # nothing at this cap or below can beat the incumbent
            highest = model.maximum(dim, found[1])
            total = weight * highest + found[0]
            if result is None or total < result[0]:
                result = (total, found[1])
            if weight * self.lows[dim] + found[0] >= self.best_s - outer:
                break
            top = np.searchsorted(values, highest, side="left") - 1
        if result is None or result[0] >= self.best_s - outer:
            return None
        return result


def partition_step_time(costs: StepCosts, stages: int, *, memory_limit: float | None = None) -> StepPartition:
    r"""The contiguous cut of least step time (:func:`step_time_of_cut`) among those within the
    memory limit (when none is, among all, with ``feasible=False``).

    The makespan is :math:`\alpha \sum_s t_s + \gamma \sum_k c_k + K`, with :math:`K = \sum_d w_d
    \max_s d_s` a weighted sum of maxima of stage quantities :math:`d \in \{t, f, b, c, u\}` (the
    optimizer steps :math:`u`, weight 1, come after every stage's synchronisation: :func:`step_time_of_cut`)
    (1F1B: :math:`\alpha = 1, \gamma = 2`, :math:`K = (m-1)(\max t + 2\max c)`; GPipe:
    :math:`K = (m-1)(\max f + \max b)`; interleaved: :math:`\alpha = 0, \gamma = 2v`,
    :math:`K = (m + \frac{S-1}{v})(\max f + \max b) + 2v(m-1)\max c`, each segment's :math:`f, b` times
    its ``chunk_pad`` where its chunks are unequal). The rest of the step,
    :math:`V_0 = \max_r (\alpha \sum t + \gamma \sum c - \sum_{k<r}(b_k + c_k) + g_r)`, runs right
    to left: with :math:`\Sigma_s = \sum_{k \ge s} (\alpha t_k + \gamma c_k)`,

    .. math:: V_{S-1} = \Sigma_{S-1} + g_{S-1}, \qquad
              V_s = \max\bigl(\Sigma_s + g_s,\; V_{s+1} + \alpha t_s + (\gamma - 1) c_s - b_s\bigr),

    nondecreasing in :math:`(\Sigma_{s+1}, V_{s+1})`, so per ``(stage, first layer)`` only the
    Pareto-minimal pairs matter (one value when :math:`\Sigma_s` depends on the first layer only:
    segment times that add up and transfers alike at every boundary; then the DP is one
    ``(L+1, L+1)`` array operation per stage).

    The maxima: for caps :math:`\theta_d`, the DP over the segments within them gives
    :math:`G(\theta) = \min V_0`, and the step time is :math:`\min_\theta K(\theta) + G(\theta)`
    (the optimal cut is feasible at its own maxima; any :math:`\theta`'s cut costs at most
    :math:`K(\theta) + G(\theta)`). One quantity at a time, caps descend through the distinct
    segment values: a cap's optimum has actual maximum :math:`\mu \le \theta`, :math:`G` is constant
    on :math:`[\mu, \theta]`, so the next cap is the largest value below :math:`\mu`; caps stop
    when :math:`w_d \underline{d} + G(\theta)` (:math:`\underline{d}` the least maximum of any cut)
    cannot beat the incumbent, and start at the largest :math:`\theta` with
    :math:`w_d \theta + \min V_0 + \ldots` below it. Every pruned cut is provably no faster than
    the incumbent, so the result is the least step time. Ties: the smallest bounds.

    Examples
    --------
    One micro-batch: the stages run one after another and stage 0's per-step work (5 s a layer)
    comes after the whole pipeline; the balanced cut gives stage 0 two layers and takes 18 s.

    >>> span = lambda per_layer: np.triu(np.subtract.outer(*[np.cumsum([0.0, *per_layer])] * 2).T)
    >>> costs = StepCosts(forward=span([1, 1, 2]), backward=span([1, 1, 2]), step=span([5, 5, 5]),
    ...                   p2p=np.zeros((1, 4)))
    >>> p = partition_step_time(costs, 2)
    >>> p.bounds, p.step_s
    ((0, 1, 3), 17.0)
    >>> partition_layers([2.0, 2.0, 4.0], 2).bounds, step_time_of_cut(costs, (0, 2, 3))
    ((0, 2, 3), 18.0)
    """
    layers = costs.forward.shape[0] - 1
    _validate(np.zeros(layers), stages)
    if stages == 1:
        return StepPartition(
            bounds=(0, layers), step_s=step_time_of_cut(costs, (0, layers)), feasible=_fits_one(costs, memory_limit)
        )
    model = _StepModel(costs, stages, memory_limit)
    if layers * stages > EXACT_CUT_LIMIT:
        cuts = [model.balanced()]
        if model.additive:
            free = model.least_suffix(model.allowed)
            cuts += [free[1]] if free is not None else []
        best = min(cuts, key=lambda c: (model.value(c), c))
        return StepPartition(bounds=best, step_s=model.value(best), feasible=model.feasible)
    descent = _Descent(model)
    descent.level(0, {})
    return StepPartition(bounds=descent.best, step_s=descent.best_s, feasible=model.feasible)


EXACT_CUT_LIMIT = 256
"""Above this many layers x stages, :func:`partition_step_time` is not exact (its cap search takes
tenths of a second to seconds at 96 layers): it takes the faster of the least-bottleneck cut of the
stage times and, where the suffix sums add up, the cut of least :math:`V_0` without caps."""


def _fits_one(costs: StepCosts, memory_limit: float | None) -> bool:
    if memory_limit is None or costs.memory is None:
        return True
    layers = costs.forward.shape[0] - 1
    return bool(costs.memory[0, 0, layers] <= memory_limit)


# --------------------------------------------------------------------------------------------
# the trade-off of cuts: least step time under each cap of the stages' memory


@dataclass(frozen=True, slots=True, kw_only=True)
class ParetoCut:
    """One cut of a choice's Pareto set over (step time, peak stage memory) (:func:`pareto_cuts`)."""

    bounds: tuple[int, ...]
    step_s: float
    """Seconds per step (:func:`step_time_of_cut`)."""
    memory_bytes: float
    """Bytes of its largest stage, ``max_s costs.memory[s, a_s, a_{s+1}]``."""


def _peak(memory: np.ndarray, bounds: Sequence[int]) -> float:
    """The largest stage memory of a cut (bytes)."""
    return max(float(memory[s, bounds[s], bounds[s + 1]]) for s in range(len(bounds) - 1))


def _stage_segments(stages: int, layers: int) -> np.ndarray:
    """``(S, L+1, L+1)`` bool: the segments ``[i, j)`` stage ``s`` runs in some cut (each stage
    holds at least one layer: stage ``s`` starts at layer ``>= s`` and leaves ``S - 1 - s`` after it)."""
    idx = np.arange(layers + 1)
    s = np.arange(stages)[:, None, None]
    i, j = idx[None, :, None], idx[None, None, :]
    ok = (i < j) & (i >= s) & (layers - j >= stages - 1 - s)
    ok &= (s > 0) | (i == 0)  # the first stage starts at layer 0
    ok &= (s < stages - 1) | (j == layers)  # the last stage ends at layer L
    return ok


def _least_peak(memory: np.ndarray, segments: np.ndarray) -> float:
    """The least largest stage memory of any cut (a minimax DP, as :func:`least_bottleneck`)."""
    best = np.full(memory.shape[-1], np.inf)
    best[0] = -np.inf
    for s in range(memory.shape[0]):
        best = np.where(segments[s], np.maximum(best[:, None], memory[s]), np.inf).min(axis=0)
    return float(best[-1])


def pareto_cuts(
    costs: StepCosts, stages: int, *, memory_limit: float | None = None, ceiling: Callable[[float], float] | None = None,
    first: StepPartition | None = None,
) -> tuple[ParetoCut, ...]:
    r"""The cuts of least step time under each cap of the stages' memory, fastest first: the cut of
    :func:`partition_step_time` (within ``memory_limit`` when some cut is), then every cut leaner
    than it that is Pareto-optimal in (step time, peak stage memory :math:`\mu = \max_s M_s`), and
    at most, where step times tie, a cut that an equally fast leaner one dominates.

    A stage's memory :math:`M_s(i, j)` is known per segment (``costs.memory``), so "least step time
    with every stage :math:`\le \theta`" is :func:`partition_step_time` with ``memory_limit``
    :math:`= \theta` (the segments above it removed). The caps descend through the distinct segment
    memories :math:`\Theta`: from a cut of peak :math:`\mu_k`, the next cap is
    :math:`\theta_{k+1} = \max\{\theta \in \Theta : \theta < \mu_k\}`, until :math:`\mu_k` is the
    least peak of any cut, :math:`\underline{\mu}`: one DP per cut returned.

    Why every Pareto cut is found: let :math:`c^*`, of :math:`(t^*, \mu^*)` with
    :math:`\mu^* \le \mu_0`, be Pareto-optimal, and :math:`k` the last step with
    :math:`\theta_k \ge \mu^*` (:math:`\theta_0 = \mu_0`). :math:`c^*` lies within :math:`\theta_k`,
    so :math:`t_k \le t^*`. And :math:`\mu_k \le \mu^*`: either the caps stopped at
    :math:`\mu_k = \underline{\mu} \le \mu^*`, or :math:`\theta_{k+1} < \mu^*`, while
    :math:`\mu^* \in \Theta` would be a candidate below :math:`\mu_k` larger than
    :math:`\theta_{k+1}` were :math:`\mu^* < \mu_k`. So :math:`c_k` weakly dominates :math:`c^*`,
    hence equals it in both. Exact when :func:`partition_step_time` is (layers x stages at most
    :data:`EXACT_CUT_LIMIT`).

    ``ceiling(t)``: bytes at or above which a cut of step time :math:`\ge t` is dominated by
    points found elsewhere (the caller's frontier). Every cut after :math:`c_k` is no faster than
    :math:`t_k`, so the next cap is the largest below :math:`\min(\mu_k, \text{ceiling}(t_k))`;
    the argument above then finds every Pareto cut those points do not dominate, with fewer DPs.
    ``first``: the fastest cut's :func:`partition_step_time` when the caller has it already.

    Examples
    --------
    Two stages of three layers of 2, 2 and 4 s (forward and backward alike), 4 micro-batches;
    stage 0 holds 2 bytes a layer (1F1B keeps more micro-batches in flight there), stage 1 one.
    1F1B takes :math:`\sum_s t_s + 3 \max_s t_s`: the balanced cut (0, 2, 3) takes 8 + 3 x 4 = 20 s
    with 4 B on stage 0; the cut (0, 1, 3) takes 8 + 3 x 6 = 26 s with 2 B on each stage.

    >>> span = lambda per_layer: np.triu(np.subtract.outer(*[np.cumsum([0.0, *per_layer])] * 2).T)
    >>> costs = StepCosts(forward=span([1, 1, 2]), backward=span([1, 1, 2]), step=np.zeros((4, 4)),
    ...                   p2p=np.zeros((1, 4)), memory=np.stack([2 * span([1, 1, 1]), span([1, 1, 1])]),
    ...                   micro_batches=4)
    >>> [(c.bounds, c.step_s, c.memory_bytes) for c in pareto_cuts(costs, 2)]
    [((0, 2, 3), 20.0, 4.0), ((0, 1, 3), 26.0, 2.0)]
    """
    first = first or partition_step_time(costs, stages, memory_limit=memory_limit)
    layers = costs.forward.shape[0] - 1
    memory = np.zeros((stages, layers + 1, layers + 1)) if costs.memory is None else np.asarray(costs.memory, dtype=np.float64)
    found = [ParetoCut(bounds=first.bounds, step_s=first.step_s, memory_bytes=_peak(memory, first.bounds))]
    if costs.memory is None or stages == 1:
        return tuple(found)
    segments = _stage_segments(stages, layers)
    caps = np.unique(memory[segments])  # the distinct stage memories, ascending
    least = _least_peak(memory, segments)
    while True:
        top = found[-1].memory_bytes if ceiling is None else min(found[-1].memory_bytes, ceiling(found[-1].step_s))
        if top <= least:
            break  # every cut holds at least the least peak: none left below the top
        below = int(np.searchsorted(caps, top, side="left"))  # caps[below - 1] < top (least is a cap)
        cut = partition_step_time(costs, stages, memory_limit=float(caps[below - 1]))
        found.append(ParetoCut(bounds=cut.bounds, step_s=cut.step_s, memory_bytes=_peak(memory, cut.bounds)))
    return tuple(found)


def pareto_cuts_brute_force(costs: StepCosts, stages: int) -> tuple[ParetoCut, ...]:
    """The oracle: every cut priced by :func:`step_time_of_cut` and its peak stage memory, the Pareto
    set over the two, fastest first (of cuts equal in both, the first in lexicographic order)."""
    layers = costs.forward.shape[0] - 1
    _validate(np.zeros(layers), stages)
    memory = np.asarray(costs.memory, dtype=np.float64)
    every = sorted((step_time_of_cut(costs, b), _peak(memory, b), b) for b in _cuts(layers, stages))
    kept: list[ParetoCut] = []
    for step_s, peak, bounds in every:  # by time, then memory: kept when leaner than every one before
        if not kept or peak < kept[-1].memory_bytes:
            kept.append(ParetoCut(bounds=bounds, step_s=step_s, memory_bytes=peak))
    return tuple(kept)
