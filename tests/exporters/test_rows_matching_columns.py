"""``exporters._tp._rows_matching`` reads each space's batch products, devices and replicas from a memo per
(tables, dims) (issue 22, tenth round: a 1T plan asks ~29,000 times, a few hundred distinct spaces). Checked
against the rule written out whole here, as the function computed it before the memo: every op of a GPT graph
on 16 devices in nodes of 4, at dp x tp = 8 x 2 and 2 x 8 (the batch, then tp, across nodes; ``_node_split``), with
and without a sequence split (``context``), mask for mask; the masks it returns are fresh (callers write into them)."""

from __future__ import annotations

import itertools

import numpy as np

from exporters._tp import _node_split, _rows_matching
from tests.exporters.graphs import gpt_graph, spaces_for


def _rule(op, space, *, want_batch, other, nodes, world, context=None):
    """The rule without the memo: every product over the whole factor tables."""
    names = space.dim_names
    is_batch = np.array([d.is_batch for d in op.dims], dtype=bool)
    want = np.array([other.get(n, 1) for n in names], dtype=np.int64)
    factors = space.factors
    if factors.shape[1] == 0:
        return np.full(space.size, want_batch == 1 and not other, dtype=bool)
    mask = np.all(np.where(is_batch, True, factors == want), axis=1)
    mask &= np.prod(np.where(is_batch, factors, 1), axis=1) == want_batch
    used = want_batch * int(np.prod(list(other.values()) or [1]))
    filled, idle = mask & (space.devices_held == world), mask & (space.replica_counts == 1)
    mask = filled if filled.any() else idle if idle.any() else mask
    inter = space.inter_factors
    if nodes is not None and max(nodes) > 1 and (want_batch > 1 or used == world):
        split = np.array([other.get(n, 1) > 1 and n != context for n in names], dtype=bool)
        batch_nodes = np.prod(np.where(is_batch, inter, 1), axis=1)
        tp_nodes = np.prod(np.where(split, inter, 1), axis=1) * space.inter_replica_counts
        placed = (batch_nodes == nodes[0]) & (tp_nodes == nodes[1])
        if context is not None and other.get(context, 1) > 1:
            placed = (batch_nodes == nodes[0]) & (tp_nodes * inter[:, names.index(context)] == nodes[1] * nodes[2])
        mask &= (space.devices_held != world) | placed
    elif nodes is not None and (nodes[1] > 1 or nodes[0] > 1) and not is_batch.any() and used > 1:
        split = np.array([other.get(n, 1) > 1 for n in names], dtype=bool)
        mask &= (space.devices_held != world) | (np.prod(np.where(split, inter, 1), axis=1) <= nodes[1] * nodes[2])
    return mask


def test_memoised_columns_give_the_rule_s_masks():
    graph = gpt_graph()
    spaces = spaces_for(graph, 16, devices_per_node=4)
    asked = matched = 0
    for (dp, tp), (index, op) in itertools.product(((8, 2), (2, 8)), enumerate(graph.ops)):
        space, nodes = spaces[index], _node_split(dp, tp, 4)
        batch = dp if any(d.is_batch for d in op.dims) else 1
        splits = [{}] + [{d.name: tp} for d in op.dims if not d.is_batch and d.size % tp == 0 and tp > 1]
        for other, context in itertools.product(splits, [None] + [d.name for d in op.dims if not d.is_batch][:1]):
            for _ in range(2):  # the second ask reads the memo
                got = _rows_matching(op, space, want_batch=batch, other=other, nodes=nodes, world=dp * tp, context=context)
                expected = _rule(op, space, want_batch=batch, other=other, nodes=nodes, world=dp * tp, context=context)
                np.testing.assert_array_equal(got, expected)
                assert got.dtype == bool and got.flags.writeable and got.flags.owndata
                asked, matched = asked + 1, matched + int(got.any())
    assert asked > 200 and 0 < matched < asked  # both outcomes, over many ops and degrees
