"""A memo dict per op graph (:func:`graph_memo`), for what the objectives derive from a graph alone.

A pipeline search builds hundreds of cost models of a few graphs (one per stage size and
micro-batch): what depends on the graph and a setting or two is worked out once per graph and kept
here, keyed by the deriving module's own names.
"""

from __future__ import annotations

from planner.core.graph import OpGraph

__all__ = ["graph_memo"]

# Identity-keyed (OpGraph is not weak-referenceable): the entry holds its graph, so an id is never
# reused while cached; bounded so a long session keeps only its recent graphs.
_MEMOS: dict[int, tuple[OpGraph, dict]] = {}
_LIMIT = 32


def graph_memo(graph: OpGraph) -> dict:
    """The memo of ``graph`` (empty on first use), kept while it is one of the last 32 graphs asked for.

    >>> graph = OpGraph(name="empty", ops=(), tensors={}, edges=())
    >>> graph_memo(graph)["answer"] = 42
    >>> graph_memo(graph)["answer"]
    42
    """
    entry = _MEMOS.get(id(graph))
    if entry is not None and entry[0] is graph:
        return entry[1]
    if len(_MEMOS) >= _LIMIT:
        del _MEMOS[next(iter(_MEMOS))]
    memo: dict = {}
    _MEMOS[id(graph)] = (graph, memo)
    return memo
