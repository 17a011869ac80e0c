"""Ops that feed every layer (search/shared.py): detection, the switch bound, exactness, block reuse."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.core.graph import BlockGroup
from planner.core.tables import CostTables, EdgeCost
from planner.search.blocks import plan_elimination
from planner.search.exhaustive import exhaustive_frontier, exhaustive_min
from planner.search.shared import best_rows, decouple, find_shared_ops, fix_ops, switch_penalties
from planner.search.synthetic import chain_tables, simple_space, transformer_tables


def _with_mask(tables: CostTables, consumers: list[int], *, k: int = 4, seed: int = 0, dominant: bool = False) -> CostTables:
    """``tables`` plus one op (the last) with an edge into each of ``consumers``, all sharing one array.

    ``dominant``: row 0 of the new op is no slower, no larger and no dearer on any edge than its
    other rows (a replicated mask that every consumer reads for free)."""
    rng = np.random.default_rng(seed)
    mask = len(tables.configs)
    node_time = rng.integers(1, 16, size=k).astype(np.float64)
    node_memory = rng.integers(1, 16, size=k).astype(np.float64) * 1024
    widths = {int(tables.node_time_s[c].shape[0]) for c in consumers}
    assert len(widths) == 1
    edge = rng.integers(0, 8, size=(k, widths.pop())).astype(np.float64)
    if dominant:
        node_time[0], node_memory[0], edge[0] = node_time.min(), node_memory.min(), 0.0
    edges = tables.edges + tuple(EdgeCost(u=mask, v=c, time_s=edge) for c in consumers)
    return dataclasses.replace(
        tables,
        configs=tables.configs + (simple_space(k),),
        node_time_s=tables.node_time_s + (node_time,),
        node_memory_bytes=tables.node_memory_bytes + (node_memory,),
        edges=edges,
    )


def _small_blocks(seed: int = 0, dominant: bool = False) -> CostTables:
    """Two 'layers' (ops 1-2 and 3-4) on a chain 0-1-2-3-4-5, a mask (op 6) read by ops 1 and 3."""
    base = chain_tables([2, 3, 2, 3, 2, 2], seed=seed)
    # ops of the two layers must share arrays to be one block group; the search does not need it here
    base = dataclasses.replace(base, blocks=(BlockGroup(name="layers", instances=((1, 2), (3, 4))),))
    return _with_mask(base, [1, 3], k=3, seed=seed + 1, dominant=dominant)


class TestFind:
    def test_mask_read_by_two_layers(self):
        tables = _small_blocks()
        found = find_shared_ops(tables)
        assert [(s.op, s.group, s.instances) for s in found] == [(6, "layers", 2)]

    def test_an_op_read_by_one_layer_is_not_shared(self):
        base = dataclasses.replace(chain_tables([2, 3, 2, 3, 2, 2]), blocks=(BlockGroup(name="layers", instances=((1, 2), (3, 4))),))
        assert find_shared_ops(_with_mask(base, [1], k=3)) == ()


class TestPenalty:
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_matches_brute_force(self, seed):
        tables = _small_blocks(seed)
        op = 6
        penalty = switch_penalties(tables, op)
        node = tables.node_time_s[op]
        edges = [e.time_s for e in tables.edges if e.u == op]
        for c in range(node.size):
            for s in range(node.size):
                by_hand = 0.0 if c == s else node[s] - node[c] + sum(float((e[s] - e[c]).max()) for e in edges)
                assert penalty[c, s] == pytest.approx(by_hand)


class TestFix:
    @pytest.mark.parametrize("seed", range(6))
    def test_bound_holds_against_the_exact_frontier(self, seed):
        tables = _small_blocks(seed)
        fixed = fix_ops(tables, [6])
        full = exhaustive_frontier(tables).points
        mine = exhaustive_frontier(fixed.tables).points
        # every fixed point, mapped back, is a real strategy of the full problem with the same cost
        values = [tables.evaluate(fixed.to_original(p.choice)) for p in mine]
        for p, (t, m) in zip(mine, values):
            assert t == pytest.approx(p.time_s) and m == pytest.approx(p.memory_bytes)
        # and every exact Pareto point has a fixed one within the quoted gaps
        for q in full:
            assert any(
                t <= q.time_s + fixed.time_gap_s + 1e-9 and m <= q.memory_bytes + fixed.memory_gap_bytes + 1e-9
                for t, m in values
            )
        # the fixed optimum is no better than the full one and within the time gap
        best_full, best_fixed = exhaustive_min(tables).time_s, exhaustive_min(fixed.tables).time_s
        assert best_full - 1e-9 <= best_fixed <= best_full + fixed.time_gap_s + 1e-9

    def test_a_dominant_row_is_exact(self):
        tables = _small_blocks(3, dominant=True)
        fixed = fix_ops(tables, [6])
        assert fixed.rows == {6: 0} and fixed.exact
        full = [(p.time_s, p.memory_bytes) for p in exhaustive_frontier(tables).points]
        mine = [(p.time_s, p.memory_bytes) for p in exhaustive_frontier(fixed.tables).points]
        assert mine == full  # dyadic costs: every sum is exact in any order

    def test_best_row_minimises_the_worst_penalty(self):
        tables = _small_blocks(4)
        row, time_gap, _ = best_rows(tables, 6)
        worst = switch_penalties(tables, 6).max(axis=0)
        assert time_gap == pytest.approx(max(0.0, worst.min())) and worst[row] == pytest.approx(worst.min())


class TestBlockReuse:
    def test_fixing_the_mask_restores_block_reuse(self):
        base = transformer_tables(4, devices=4, batch=2, seq=4, hidden=4)
        attention = [instance[2] for instance in base.blocks[0].instances]  # every layer's attention op
        tables = _with_mask(base, attention, k=8, seed=1)
        before = plan_elimination(tables)
        fixed = fix_ops(tables, [s.op for s in find_shared_ops(tables)])
        after = plan_elimination(fixed.tables)
        # once the mask is fixed its edges are folded: one region solved once, reused on the other layers
        assert after.regions and sum(len(r.renamings) for r in after.regions) >= 2
        assert after.total_table_cells < before.total_table_cells

    def test_decouple_only_when_the_full_problem_does_not_fit(self):
        base = transformer_tables(3, devices=4, batch=2, seq=4, hidden=4)
        tables = _with_mask(base, [instance[2] for instance in base.blocks[0].instances], k=8, seed=2)
        assert decouple(tables, fits=lambda *_: True) is None
        found = decouple(tables, fits=lambda *_: False)
        assert found is not None
        fixed, shared = found
        assert [s.op for s in shared] == [tables.num_ops - 1] and fixed.tables.configs[-1].size == 1
        assert not any(tables.num_ops - 1 in (e.u, e.v) for e in fixed.tables.edges)
