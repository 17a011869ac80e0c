"""Framework-style strategy families in the vocabulary engineers use: data and tensor parallel degrees.

A configuration of an op splits its *batch* dims (``IterDim.is_batch``, FlexFlow's Sample
dimension) by a product we call its data-parallel degree, and its other dims by its model-parallel
(tensor-parallel) degree. This module turns families of strategies into boolean masks over each op's
configurations, so a baseline is the exact DP over the restricted tables:

* pure data parallelism: every op splits only its batch dims, as far as the devices allow;
* uniform ``dp x tp`` (Megatron style): every op splits its batch dims by ``dp`` and its other dims
  by ``tp`` (or keeps them whole, as Megatron does for norms when sequence parallelism is off);
* "one weird trick" (Krizhevsky, 2014): convolutions data parallel, fully connected layers model
  parallel.

It also describes any strategy in those terms (``dp=4 x tp=4``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.core.configs import ConfigSpace, batch_products
from planner.core.degrees import dominant_degrees  # re-exported: research and launchable read it here
from planner.core.graph import Op, OpGraph

__all__ = [
    "batch_products",
    "data_parallel_masks",
    "uniform_masks",
    "weird_trick_masks",
    "uniform_degrees",
    "describe_choice",
    "dominant_degrees",
    "named_point",
]


def _replicated(space: ConfigSpace) -> np.ndarray:
    mask = np.zeros(space.size, dtype=bool)
    mask[np.all(space.factors == 1, axis=1)] = True
    return mask


def _fewest_nodes(space: ConfigSpace, mask: np.ndarray) -> np.ndarray:
    """Within ``mask``, keep the placements that cross nodes least (frameworks keep groups local)."""
    if not mask.any():
        return mask
    crossings = np.prod(space.inter_factors, axis=1)
    best = crossings[mask].min()
    return mask & (crossings == best)


def data_parallel_masks(graph: OpGraph, spaces: Sequence[ConfigSpace]) -> list[np.ndarray]:
    """Pure data parallelism: each op splits only its batch dims, by the largest degree it allows."""
    masks = []
    for op, space in zip(graph.ops, spaces):
        batch, other = batch_products(op, space)
        candidates = other == 1
        best = batch[candidates].max() if candidates.any() else 1
        masks.append(_fewest_nodes(space, candidates & (batch == best)))
    return masks


def uniform_masks(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, dp: int, tp: int
) -> list[np.ndarray] | None:
    """One ``dp x tp`` degree for every op; ``None`` when some op cannot be split ``dp`` ways.

    An op splits its batch dims exactly ``dp`` ways (ops without batch dims: 1) and its other dims
    ``tp`` ways or not at all.
    """
    masks = []
    for op, space in zip(graph.ops, spaces):
        batch, other = batch_products(op, space)
        has_batch = any(d.is_batch for d in op.dims)
        want_batch = dp if has_batch else 1
        mask = (batch == want_batch) & ((other == tp) | (other == 1))
        if not mask.any():
            if has_batch and op.kind != "opaque":
                return None
            mask = _replicated(space)
        masks.append(mask)
    return masks


def weird_trick_masks(graph: OpGraph, spaces: Sequence[ConfigSpace]) -> list[np.ndarray] | None:
    """Convolutions data parallel, fully connected (matmul) layers model parallel; ``None`` if the
    graph has no convolution (the trick is for CNNs)."""
    if not any(op.kind == "conv" for op in graph.ops):
        return None
    data_parallel = data_parallel_masks(graph, spaces)
    masks = []
    for op, space, dp_mask in zip(graph.ops, spaces, data_parallel):
        if op.kind == "matmul":
            batch, other = batch_products(op, space)
            candidates = batch == 1
            best = other[candidates].max() if candidates.any() else 1
            masks.append(candidates & (other == best))
        elif op.kind in ("conv", "pool", "norm"):
            masks.append(dp_mask)
        else:
            masks.append(np.ones(space.size, dtype=bool))
    return masks


def uniform_degrees(devices: int) -> list[tuple[int, int]]:
    """Every ``(dp, tp)`` with ``dp * tp == devices``.

    Examples
    --------
    >>> uniform_degrees(8)
    [(1, 8), (2, 4), (4, 2), (8, 1)]
    """
    return [(devices // tp, tp) for tp in range(devices, 0, -1) if devices % tp == 0]


def describe_choice(graph: OpGraph, spaces: Sequence[ConfigSpace], choice: Sequence[int]) -> str:
    """One line: the dominant degrees by FLOPs, each named for what it splits (``dp`` the batch,
    ``tp`` the weights, ``cp`` the sequence of ops with weights, ``hw`` a convolution's spatial
    dims: :func:`planner.core.degrees.op_degrees`), and how uniform the strategy is.

    Examples: ``"dp=16"``, ``"dp=4 x tp=4"``, ``"dp=2 x cp=4"``, ``"dp=4 x tp=4 (83% of FLOPs), 3 layouts"``.
    """
    dominant = dominant_degrees(graph, spaces, choice)
    if dominant is None:
        return "replicated"
    degrees, share, layouts = dominant
    parts = [f"{name}={value}" for name, value in zip(("dp", "tp", "cp", "hw"), degrees) if value > 1]
    text = " x ".join(parts) if parts else "replicated"
    if share < 0.995:
        text += f" ({share:.0%} of FLOPs), {layouts} layouts"
    return text


def named_point(point) -> tuple[int, int, int, str] | None:
    """``(dp, tp, cp, summary)`` of a priced pipeline point (``objectives.pipeline_price.PipelinePoint``),
    each degree named for what the ops of the most FLOPs split (:func:`dominant_degrees`; a spatial split
    counts as tp): the point's own ``tp`` and summary count every non-batch split, the sequence's too,
    so a context-parallel plan read ``tp=8``. ``None``: a point without its graph or without FLOPs."""
    dominant = dominant_degrees(point.graph, point.spaces, point.choice) if point.graph is not None else None
    if dominant is None:
        return None
    dp, tp, cp, spatial = dominant[0]
    parts = [f"{name}={value}" for name, value in (("dp", dp), ("cp", cp), ("tp", tp * spatial)) if value > 1]
    layout = (" x ".join(parts) or "replicated") + ("" if point.uniform else " (mixed)")
    rest = point.summary.split(", mb=", 1)[1]  # objectives.pipeline_price: "pp=P x LAYOUT, mb=..., zero=..., ..."
    return dp, tp * spatial, cp, f"pp={point.pp} x {layout}, mb={rest}"
