r"""Elimination orders over the op interaction graph, and how much table each one needs.

Eliminating op :math:`v` builds a table over :math:`v` and its *dependent set* :math:`D(v)` (its
neighbours in the current elimination graph: ops not yet eliminated that share a factor with it),
then minimises :math:`v` out, leaving a factor over :math:`D(v)` and connecting :math:`D(v)` into
a clique. The work of that step is

.. math::

    \text{cells}(v) = K_v \prod_{u \in D(v)} K_u

(:func:`order_cost`), so the order decides everything: PaSE's cost :math:`O(|V| K^{M+1})`.

Heuristics (each ``graph -> order``, passed around as plain functions, compared by
:func:`choose_order`):

* :func:`generate_seq`: PaSE's GENERATESEQ: repeatedly take the unvisited node whose dependent set
  is smallest, merge its set into its neighbours' sets (minimum degree on the elimination graph).
* :func:`min_cells_seq`: the same greedy, weighted: smallest table (cells) first.
* :func:`networkx_order` with ``treewidth_min_degree`` or ``treewidth_min_fill_in``: networkx's
  tree-decomposition heuristics; the order is read off the decomposition by peeling leaf bags.

References
----------
V. Elango, "PaSE: Parallelization Strategies for Efficient DNN Training", IPDPS 2021, Alg. 2
(GENERATESEQ).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import networkx as nx
from networkx.algorithms.approximation import treewidth_min_degree, treewidth_min_fill_in

from planner.core.tables import CostTables
from planner.search.problem import interaction_graph

__all__ = [
    "OrderHeuristic",
    "OrderChoice",
    "generate_seq",
    "min_cells_seq",
    "networkx_order",
    "order_cost",
    "default_heuristics",
    "choose_order",
]

OrderHeuristic = Callable[[nx.Graph], list[int]]
"""A function from an interaction graph (nodes with a ``size`` attribute) to an elimination order
of all its nodes."""

# networkx's min-fill-in scans every node at every step; past this size it costs more than the DP.
_MIN_FILL_MAX_NODES = 1500


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderChoice:
    """An elimination order and what it costs."""

    order: tuple[int, ...]
    """Op indices, first eliminated first."""
    name: str
    """The heuristic that produced it."""
    max_table_cells: int
    """Largest :math:`K_v \\prod_{D(v)} K_u` over the order."""
    total_table_cells: int = 0
    """Sum of the same over the order (the DP's work, up to a constant)."""


def _greedy(graph: nx.Graph, priority: Callable[[int, set[int]], int], frozen: Collection[int],
            merged: Callable[[int, set[int], int], None] | None = None) -> list[int]:
    """Eliminate non-frozen nodes one by one, smallest ``priority(node, dependent set)`` first.

    Ties go to the lowest node index. Priorities change only for the neighbours of the eliminated
    node, so a heap with lazy deletion keeps this O(E log V) plus the fill-in. ``merged(u, added,
    v)``, if given, hears each change of a dependent set before its new priority is asked: ``u``
    gains the nodes ``added`` and loses the eliminated ``v``.
    """
    adjacency = {v: set(graph[v]) - {v} for v in graph}
    frozen_set = set(frozen)
    heap = [(priority(v, adjacency[v]), v) for v in graph if v not in frozen_set]
    heapq.heapify(heap)
    current = {v: p for p, v in heap}
    order: list[int] = []
    while heap:
        p, v = heapq.heappop(heap)
        if v not in current or current[v] != p:
            continue  # stale entry
        del current[v]
        order.append(v)
        dependent = adjacency.pop(v)
        for u in dependent:
            # merge v's dependent set into u's (PaSE); u's neighbours now form a clique with D(v)
            if merged is not None:
                merged(u, dependent - adjacency[u] - {u}, v)
            adjacency[u] |= dependent
            adjacency[u].discard(u)
            adjacency[u].discard(v)
        for u in dependent:
            if u in current:
                new = priority(u, adjacency[u])
                if new != current[u]:
                    current[u] = new
                    heapq.heappush(heap, (new, u))
    return order


def generate_seq(graph: nx.Graph, *, frozen: Collection[int] = ()) -> list[int]:
    """PaSE's GENERATESEQ: smallest dependent set first (ties: lowest index).

    Parameters
    ----------
    graph:
        Interaction graph.
    frozen:
        Nodes never eliminated (left out of the order), e.g. the boundary of a repeated block.

    Examples
    --------
    >>> g = nx.Graph([(0, 1), (1, 2), (2, 3), (3, 0), (3, 4)])
    >>> generate_seq(g)
    [4, 0, 1, 2, 3]
    """
    return _greedy(graph, lambda v, dep: len(dep), frozen)


def min_cells_seq(graph: nx.Graph, *, frozen: Collection[int] = ()) -> list[int]:
    """Greedy: smallest table :math:`K_v \\prod_{D(v)} K_u` first (ties: lowest index).

    Examples
    --------
    >>> g = nx.Graph([(0, 1), (1, 2)])
    >>> nx.set_node_attributes(g, {0: 9, 1: 2, 2: 3}, "size")
    >>> min_cells_seq(g)  # 2 (6 cells); then 0 and 1 tie at 18: lowest index
    [2, 0, 1]
    """
    sizes = nx.get_node_attributes(graph, "size")
    # each node's product over its dependent set, kept exact (Python integers) as the sets change:
    # a set of a dense region holds ~100 nodes, and the product was re-taken at every change
    product = {v: math.prod(sizes.get(u, 1) for u in graph[v] if u != v) for v in graph}

    def merged(u: int, added: set[int], eliminated: int) -> None:
        product[u] = product[u] * math.prod(sizes.get(w, 1) for w in added) // sizes.get(eliminated, 1)

    return _greedy(graph, lambda v, dep: sizes.get(v, 1) * product[v], frozen, merged)


# Orders of recent graph structures (oldest evicted first).
_NETWORKX_ORDERS: dict[tuple, tuple[int, ...]] = {}
_NETWORKX_CACHE_SIZE = 64


def networkx_order(
    graph: nx.Graph, heuristic: Callable[[nx.Graph], tuple[int, nx.Graph]] = treewidth_min_fill_in
) -> list[int]:
    """An elimination order from a networkx tree decomposition (``treewidth_min_degree`` or
    ``treewidth_min_fill_in``).

    A leaf bag :math:`B` with neighbour bag :math:`P` holds nodes :math:`B \\setminus P` that appear
    in no other bag (running intersection), so they can be eliminated with dependent sets inside
    :math:`B`; remove the leaf and repeat. The order's dependent sets are thus no larger than the
    decomposition's width.

    Examples
    --------
    >>> g = nx.cycle_graph(5)
    >>> nx.set_node_attributes(g, 2, "size")
    >>> order = networkx_order(g, treewidth_min_degree)
    >>> sorted(order), order_cost(g, order)[0]  # width 2: at most 2 * 2 * 2 cells
    ([0, 1, 2, 3, 4], 8)
    """
    if graph.number_of_nodes() == 0:
        return []
    # The decomposition depends on the structure alone, not on the sizes: restricted problems
    # (baselines, memory weights, pipeline stages) share it.
    key = (
        getattr(heuristic, "__name__", repr(heuristic)),
        tuple(sorted(graph.nodes)),
        tuple(sorted((min(a, b), max(a, b)) for a, b in graph.edges)),
    )
    cached = _NETWORKX_ORDERS.get(key)
    if cached is not None:
        return list(cached)
    _, decomposition = heuristic(graph)
    tree = nx.Graph(decomposition)
    eliminated: set[int] = set()
    order: list[int] = []

    def take(nodes: Iterable[int]) -> None:
        for v in sorted(nodes):
            if v not in eliminated:
                eliminated.add(v)
                order.append(v)

    # peel leaves, lowest bag (by sorted content) first, so the order is deterministic
    def bag_key(bag: frozenset) -> tuple:
        return tuple(sorted(bag))

    while tree.number_of_nodes() > 0:
        leaves = [b for b in tree if tree.degree(b) <= 1]
        bag = min(leaves, key=bag_key)
        neighbours = list(tree[bag])
        if neighbours:
            take(set(bag) - set(neighbours[0]))
        else:
            take(bag)
        tree.remove_node(bag)
    take(set(graph.nodes) - eliminated)  # isolated nodes a decomposition may drop
    if len(_NETWORKX_ORDERS) >= _NETWORKX_CACHE_SIZE:
        _NETWORKX_ORDERS.pop(next(iter(_NETWORKX_ORDERS)))
    _NETWORKX_ORDERS[key] = tuple(order)
    return order


def order_cost(graph: nx.Graph, order: Sequence[int], *, frozen: Collection[int] = ()) -> tuple[int, int]:
    """``(max, total)`` table cells of eliminating ``order`` (frozen nodes stay, never eliminated).

    Examples
    --------
    >>> g = nx.path_graph(3)
    >>> nx.set_node_attributes(g, {0: 2, 1: 3, 2: 4}, "size")
    >>> order_cost(g, [0, 1, 2])  # 2*3, then 3*4, then 4
    (12, 22)
    """
    sizes = nx.get_node_attributes(graph, "size")
    adjacency = {v: set(graph[v]) - {v} for v in graph}
    frozen_set = set(frozen)
    worst = total = 0
    for v in order:
        if v in frozen_set:
            raise ValueError(f"node {v} is frozen and cannot be eliminated")
        dependent = adjacency.pop(v)
        cells = sizes.get(v, 1) * math.prod(sizes.get(u, 1) for u in dependent)
        worst = max(worst, cells)
        total += cells
        for u in dependent:
            adjacency[u] |= dependent
            adjacency[u].discard(u)
            adjacency[u].discard(v)
    return worst, total


def default_heuristics(graph: nx.Graph) -> dict[str, OrderHeuristic]:
    """The heuristics :func:`choose_order` tries by default (min-fill-in only on smaller graphs)."""
    heuristics: dict[str, OrderHeuristic] = {
        "generate_seq": generate_seq,
        "min_cells": min_cells_seq,
        "min_degree": partial(networkx_order, heuristic=treewidth_min_degree),
    }
    if graph.number_of_nodes() <= _MIN_FILL_MAX_NODES:
        heuristics["min_fill_in"] = partial(networkx_order, heuristic=treewidth_min_fill_in)
    return heuristics


def choose_order(
    problem: CostTables | nx.Graph, *, heuristics: Mapping[str, OrderHeuristic] | None = None
) -> OrderChoice:
    """Run every heuristic and keep the order with the smallest largest table.

    Ties go to the smaller total, then to the heuristic listed first.

    Parameters
    ----------
    problem:
        Cost tables, or an interaction graph with node attribute ``size``.
    heuristics:
        ``{name: graph -> order}``; default :func:`default_heuristics`.

    Examples
    --------
    >>> g = nx.Graph([(0, 1), (1, 2), (2, 0), (2, 3)])
    >>> nx.set_node_attributes(g, {0: 4, 1: 4, 2: 4, 3: 100}, "size")
    >>> choice = choose_order(g)
    >>> choice.max_table_cells, choice.total_table_cells   # 3 goes first, alone with 2
    (400, 484)
    """
    graph = interaction_graph(problem) if isinstance(problem, CostTables) else problem
    candidates = default_heuristics(graph) if heuristics is None else heuristics
    best: OrderChoice | None = None
    for name, heuristic in candidates.items():
        order = tuple(heuristic(graph))
        if sorted(order) != sorted(graph.nodes):
            raise ValueError(f"heuristic {name!r} did not return an order of all nodes")
        worst, total = order_cost(graph, order)
        if best is None or (worst, total) < (best.max_table_cells, best.total_table_cells):
            best = OrderChoice(order=order, name=name, max_table_cells=worst, total_table_cells=total)
    if best is None:
        raise ValueError("no heuristic given")
    return best
