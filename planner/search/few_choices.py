r"""The exact minimum of a search problem whose ops have few joint choices, by enumeration.

A launcher's family fixes almost every op of a stage: on the README's GPT-2 at 16 devices, 371 of
the 388 intra-op problems of the default search leave one op of 160 with two configurations (the
position embedding split or copied), the rest with one. PaSE's DP (:mod:`planner.search.elimination`)
still eliminates every op (about 7 ms a problem); enumerating the joint choices of the free ops and
summing only the factors that touch them takes microseconds and finds the same minimum.

The objective is the DP's: :math:`f(c) = \sum_i \phi_i(c_i) + \sum_{(u,v)} t_{uv}(c_u, c_v)` over
``tables.node_time_s`` (which carries any memory weight) and ``tables.edges``. Factors of fixed ops
only add a constant. Ties go to the lexicographically first joint choice in op order, which is the
DP's rule (the lowest configuration index) whenever one op is free.
"""

from __future__ import annotations

import math

import numpy as np

from planner.core.tables import CostTables

__all__ = ["MAX_JOINT_CHOICES", "solve_by_enumeration"]

MAX_JOINT_CHOICES = 256
"""Joint choices up to which enumeration answers (each costs one float per touching factor; past a
few hundred the DP's elimination is as quick and its memory does not grow with the product)."""


def solve_by_enumeration(tables: CostTables, max_choices: int = MAX_JOINT_CHOICES, *,
                         edge_scale: float = 1.0) -> tuple[np.ndarray, float] | None:
    """``(choice, value)``: one configuration index per op minimising the objective (seconds, plus
    any memory weight folded into ``node_time_s``), and that minimum; ``None`` when the free ops have
    more than ``max_choices`` joint choices (then run the DP). ``value`` is ``inf`` when every joint
    choice has an infinite cost. ``edge_scale``: a factor of every edge table (micro-batch slots),
    applied to the cells read only: each the same product as in the scaled table, so the same sums.

    Examples
    --------
    >>> from planner.search.synthetic import chain_tables
    >>> from planner.search.elimination import solve_min
    >>> tables = chain_tables([1, 3, 1, 2])
    >>> choice, value = solve_by_enumeration(tables)
    >>> best = solve_min(tables)
    >>> bool(np.isclose(value, best.value)), choice.tolist() == best.choice.tolist()
    (True, True)
    """
    sizes = [int(t.shape[0]) for t in tables.node_time_s]
    free = [i for i, k in enumerate(sizes) if k > 1]
    count = math.prod(sizes[i] for i in free)
    if count > max_choices:
        return None
    # row j of `joint` is the j-th joint choice of the free ops, in C order (the first op slowest)
    joint = np.indices([sizes[i] for i in free]).reshape(len(free), count) if free else np.zeros((0, 1), dtype=np.int64)
    column = {op: joint[position] for position, op in enumerate(free)}
    constant = float(tables.constant_time_s)
    varying = np.zeros(count)
    for i, node in enumerate(tables.node_time_s):
        if i in column:
            varying += node[column[i]]
        else:
            constant += float(node[0])
    scaled = edge_scale != 1.0
    for e in tables.edges:
        u, v = column.get(e.u), column.get(e.v)
        if u is None and v is None:
            constant += float(edge_scale * e.time_s[0, 0] if scaled else e.time_s[0, 0])
        else:
            cells = e.time_s[0 if u is None else u, 0 if v is None else v]
            varying += edge_scale * cells if scaled else cells
    best = int(np.argmin(varying))
    choice = np.zeros(len(sizes), dtype=np.int64)
    for op, picks in column.items():
        choice[op] = picks[best]
    return choice, constant + float(varying[best])
