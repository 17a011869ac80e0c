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

References
----------
L. Zheng et al., "Alpa", OSDI 2022 (Sec. 5: stage slicing by DP). J. Tarnawski et al., "Piper",
NeurIPS 2021.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.core.errors import InputError

__all__ = [
    "Partition",
    "partition_layers",
    "partition_brute_force",
    "least_bottleneck",
    "stage_costs",
    "stage_memories",
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
    """
    cost = np.asarray(layer_cost, dtype=np.float64)
    layers = cost.shape[-1]
    _validate(np.zeros(layers), stages)
    matrix = _memory_matrix(cost, stages, layers)
    valid = np.triu(np.ones((layers + 1, layers + 1), dtype=bool), k=1)
    best = np.full(layers + 1, np.inf)
    best[0] = 0.0
    for s in range(stages):
        span = _span(np.concatenate(([0.0], np.cumsum(matrix[s]))))
        span += (first_cost if s == 0 else 0.0) + (last_cost if s == stages - 1 else 0.0)
        allowed = valid.copy()
        if s == 0:
            allowed[1:, :] = False
        if s == stages - 1:
            allowed[:, :layers] = False
        best = np.where(allowed, np.maximum(best[:, None], span), np.inf).min(axis=0)
    return float(best[layers])


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
