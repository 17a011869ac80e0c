r"""The search problem seen from search: checks, the op interaction graph, batch evaluation.

:class:`planner.core.tables.CostTables` defines

.. math::

    T(c) = T_0 + \sum_i t_i[c_i] + \sum_{(u,v)} t_{uv}[c_u, c_v], \qquad M(c) = M_0 + \sum_i m_i[c_i].

The *interaction graph* has one node per op (attribute ``size`` = :math:`K_i`) and one undirected
edge per op pair with an edge table; elimination orders are computed on it
(:mod:`planner.search.ordering`).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np

from planner.core.errors import InputError
from planner.core.tables import CostTables

__all__ = [
    "check_tables",
    "config_counts",
    "interaction_graph",
    "evaluate_many",
    "check_choice",
    "same_array",
    "oriented_edges",
]


def config_counts(tables: CostTables) -> np.ndarray:
    """``(num_ops,)`` int64: configurations per op, :math:`K_i`."""
    return np.array([t.shape[0] for t in tables.node_time_s], dtype=np.int64)


def check_tables(tables: CostTables) -> None:
    """Raise :class:`InputError` when the tables are not a well-formed search problem.

    Infinite costs are allowed (they mark infeasible configurations); NaN is not.
    """
    n = len(tables.node_time_s)
    if len(tables.node_memory_bytes) != n or len(tables.configs) != n:
        raise InputError(
            "cost tables disagree on the number of ops (configs, node times, node memories); "
            "rebuild them with objectives.tables"
        )
    for i, (t, m) in enumerate(zip(tables.node_time_s, tables.node_memory_bytes)):
        if t.ndim != 1 or t.shape != m.shape or t.shape[0] == 0:
            raise InputError(
                f"op {i} has node tables of shapes {t.shape} and {m.shape}; each must be (K,) with "
                "K >= 1; give every op at least its replicated configuration"
            )
        if np.isnan(t).any() or np.isnan(m).any():
            raise InputError(f"op {i} has NaN costs; fix the cost model that produced them")
    for e in tables.edges:
        if not (0 <= e.u < n and 0 <= e.v < n) or e.u == e.v:
            raise InputError(
                f"edge ({e.u}, {e.v}) does not join two different ops of 0..{n - 1}; fix the edge list"
            )
        want = (tables.node_time_s[e.u].shape[0], tables.node_time_s[e.v].shape[0])
        if e.time_s.shape != want:
            raise InputError(
                f"edge ({e.u}, {e.v}) has a table of shape {e.time_s.shape}, expected {want}; "
                "rebuild it over both ops' configurations"
            )
        if np.isnan(e.time_s).any():
            raise InputError(f"edge ({e.u}, {e.v}) has NaN costs; fix the cost model")


def interaction_graph(tables: CostTables) -> nx.Graph:
    """Undirected op graph: node ``i`` with ``size`` = K_i, an edge per op pair with an edge table.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> g = interaction_graph(chain_tables([2, 3, 4]))
    >>> sorted(g.edges()), g.nodes[2]["size"]
    ([(0, 1), (1, 2)], 4)
    """
    graph = nx.Graph()
    for i, t in enumerate(tables.node_time_s):
        graph.add_node(i, size=int(t.shape[0]))
    for e in tables.edges:
        graph.add_edge(e.u, e.v)
    return graph


def oriented_edges(tables: CostTables) -> dict[tuple[int, int], list[np.ndarray]]:
    """Edge tables keyed by ``(min, max)`` op pair, each oriented ``(K_min, K_max)``."""
    out: dict[tuple[int, int], list[np.ndarray]] = {}
    for e in tables.edges:
        key = (min(e.u, e.v), max(e.u, e.v))
        out.setdefault(key, []).append(e.time_s if e.u < e.v else e.time_s.T)
    return out


def evaluate_many(tables: CostTables, choices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(time_s, memory_bytes)`` of many choices at once.

    Sums in the same order as :meth:`CostTables.evaluate`, so every value is bit-identical to
    evaluating that choice alone.

    Parameters
    ----------
    tables:
        The problem.
    choices:
        ``(P, num_ops)`` integer configuration indices.

    Returns
    -------
    tuple of ndarray
        ``(P,)`` seconds and ``(P,)`` bytes.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> tables = chain_tables([2, 2])
    >>> t, m = evaluate_many(tables, np.array([[0, 1], [1, 0]]))
    >>> [(float(a), float(b)) for a, b in zip(t, m)] == [tables.evaluate([0, 1]), tables.evaluate([1, 0])]
    True
    """
    picks = np.asarray(choices, dtype=np.int64)
    if picks.ndim != 2 or picks.shape[1] != tables.num_ops:
        raise ValueError(f"choices must be (P, {tables.num_ops}), got {picks.shape}")
    count = picks.shape[0]
    # Python's sum() starts at integer 0 and adds left to right; 0 + x == x exactly, so starting
    # from 0.0 and adding op by op reproduces CostTables.evaluate bit for bit.
    node_time = np.zeros(count)
    node_memory = np.zeros(count)
    for i, (t, m) in enumerate(zip(tables.node_time_s, tables.node_memory_bytes)):
        node_time = node_time + t[picks[:, i]]
        node_memory = node_memory + m[picks[:, i]]
    time_s = tables.constant_time_s + node_time
    memory = tables.constant_memory_bytes + node_memory
    edge_time = np.zeros(count)
    for e in tables.edges:
        edge_time = edge_time + e.time_s[picks[:, e.u], picks[:, e.v]]
    return time_s + edge_time, memory


def check_choice(tables: CostTables, choice: Sequence[int] | np.ndarray) -> np.ndarray:
    """The choice as ``(num_ops,)`` int64; ``ValueError`` if its length or any index is out of range."""
    picks = np.asarray(choice, dtype=np.int64)
    if picks.shape != (tables.num_ops,):
        raise ValueError(f"choice has shape {picks.shape}, expected ({tables.num_ops},)")
    sizes = np.array([t.shape[0] for t in tables.node_time_s], dtype=np.int64)
    bad = np.flatnonzero((picks < 0) | (picks >= sizes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"op {i}: configuration {int(picks[i])} is not in 0..{int(sizes[i]) - 1}")
    return picks


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """True when two cost arrays are the same object or equal in shape and every value."""
    return a is b or (a.shape == b.shape and bool(np.array_equal(a, b)))
