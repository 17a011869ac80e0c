"""The transformer analyses kept per graph (:func:`importers.transformer.analyze_transformer`), and the graphs that
have another graph's analysis because they are that graph moved to another batch size (:func:`analyzed_alike`).

A pipeline search asks for the analysis of every micro-batch size's graph, launcher after launcher, and the
launchers' families, layouts and masks ask again for every stage. Graphs are frozen, so an analysis is kept by the
graph's identity, each entry holding its graph so that an id is not reused under it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

from planner.core.graph import OpGraph

__all__ = ["alike_of", "analyzed_alike", "kept_per_graph"]

CACHE_SIZE = 16
"""Analyses kept (the graphs asked for last)."""

ALIKE_SIZE = 64
"""Moved graphs remembered (:func:`analyzed_alike`): more than a 1T plan's micro-batch sizes."""

_ALIKE: "OrderedDict[int, tuple[OpGraph, OpGraph]]" = OrderedDict()


def kept_per_graph(store: "OrderedDict[int, tuple[OpGraph, Any]]", graph: OpGraph, compute: Callable[[OpGraph], Any]) -> Any:
    """``compute(graph)``, kept in ``store`` for the last :data:`CACHE_SIZE` graphs asked for, by identity (a graph
    others were moved from, asked for each of theirs, stays)."""
    cached = store.get(id(graph))
    if cached is None or cached[0] is not graph:
        store[id(graph)] = cached = (graph, compute(graph))
        while len(store) > CACHE_SIZE:
            store.popitem(last=False)
    store.move_to_end(id(graph))
    return cached[1]


def analyzed_alike(graph: OpGraph, like: OpGraph) -> None:
    """Let the analysis of ``graph`` be ``like``'s (or its refusal), not found again: ``graph`` is ``like`` moved to
    another batch size (:func:`importers.rebatch.rebatch`, or imported at it and found equal to that by
    :func:`importers.rebatch.scales_linearly`), which changes the sizes of the batch dims, the FLOPs and the bound dims
    only, none of which the recognition reads (``tests/importers/test_analyzed_alike.py``: the recognition run afresh
    on moved graphs of seven models equals the first graph's, at batch sizes equal to the heads, head dim, hidden
    size and sequence among them). Kept for the last :data:`ALIKE_SIZE` graphs (each entry holds both)."""
    if graph is like:
        return
    _ALIKE[id(graph)] = (graph, like)
    _ALIKE.move_to_end(id(graph))
    while len(_ALIKE) > ALIKE_SIZE:
        _ALIKE.popitem(last=False)


def alike_of(graph: OpGraph) -> OpGraph | None:
    """The graph whose analysis ``graph`` has (:func:`analyzed_alike`); ``None``: its own."""
    alike = _ALIKE.get(id(graph))
    return alike[1] if alike is not None and alike[0] is graph else None
