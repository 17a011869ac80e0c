"""Block reuse: solved once, renamed onto identical blocks; equal to the plain elimination."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.graph import BlockGroup
from planner.core.tables import CostTables
from planner.search.blocks import find_regions, plan_elimination
from planner.search.elimination import solve_min
from planner.search.frontier import pareto_frontier
from planner.search.synthetic import transformer_tables

from .random_tables import assert_valid_choice, block_chain_tables


def _values(front) -> list[tuple[float, float]]:
    return [(p.time_s, p.memory_bytes) for p in front.points]


class TestBlockReuse:
    @pytest.mark.parametrize("seed", range(40))
    def test_equals_plain_elimination(self, seed: int) -> None:
        tables = block_chain_tables(
            seed, num_blocks=int(3 + seed % 4), max_size=5, perturb=seed % 5 == 0, shared_op=seed % 3 == 0
        )
        plain_min = solve_min(tables, use_blocks=False)
        block_min = solve_min(tables)
        assert block_min.value == plain_min.value
        assert_valid_choice(tables, block_min.choice, block_min.time_s, block_min.memory_bytes)
        plain_front = pareto_frontier(tables, epsilon=0.0, use_blocks=False)
        block_front = pareto_frontier(tables, epsilon=0.0)
        assert _values(block_front) == _values(plain_front)
        for p in block_front.points:
            assert_valid_choice(tables, p.choice, p.time_s, p.memory_bytes)

    @pytest.mark.parametrize("seed", range(12))
    def test_regions_are_used_on_long_chains(self, seed: int) -> None:
        tables = block_chain_tables(seed, num_blocks=12, block_size=4, max_size=5)
        plan = plan_elimination(tables)
        assert plan.regions, "a 12-block chain of 4-op blocks should reuse its block"
        assert plan.eliminated_by_reuse >= 4
        assert plan.total_table_cells < plan.plain.total_table_cells
        covered = set(plan.order)
        for region in plan.regions:
            covered |= set(region.order)
            for rho in region.renamings:
                covered |= {rho[v] for v in region.order}
        assert sorted(covered) == list(range(tables.num_ops))  # every op eliminated exactly once
        assert solve_min(tables).value == solve_min(tables, use_blocks=False).value

    def test_perturbed_block_is_not_reused(self) -> None:
        tables = block_chain_tables(3, num_blocks=7, block_size=3, max_size=5, perturb=True)
        odd = tables.blocks[0].instances[7 // 2]
        for region in find_regions(tables):
            for rho in region.renamings:
                assert not set(odd) & {rho[v] for v in region.order}
        assert solve_min(tables).value == solve_min(tables, use_blocks=False).value

    def test_transformer_stack(self) -> None:
        tables = transformer_tables(4, devices=8, batch=4, seq=8, hidden=8)
        plan = plan_elimination(tables)
        assert plan.name.startswith("blocks+")
        dp = solve_min(tables)
        assert dp.value == pytest.approx(solve_min(tables, use_blocks=False).value, rel=1e-12)
        ours = pareto_frontier(tables, epsilon=0.0, max_points=1 << 20)
        plain = pareto_frontier(tables, epsilon=0.0, max_points=1 << 20, use_blocks=False)
        assert ours.exact and plain.exact
        assert len(ours.points) == len(plain.points)
        np.testing.assert_allclose(ours.times_s, plain.times_s, rtol=1e-12)
        np.testing.assert_allclose(ours.memories_bytes, plain.memories_bytes, rtol=1e-12)

    def test_malformed_groups_are_ignored(self) -> None:
        tables = block_chain_tables(2, num_blocks=3)
        instances = tables.blocks[0].instances
        overlapping = BlockGroup(name="bad", instances=(instances[0], instances[0]))
        ragged = BlockGroup(name="ragged", instances=(instances[0], instances[1][:-1]))
        for group in (overlapping, ragged):
            odd = CostTables(
                configs=tables.configs,
                node_time_s=tables.node_time_s,
                node_memory_bytes=tables.node_memory_bytes,
                edges=tables.edges,
                blocks=(group,),
            )
            assert find_regions(odd) == ()
            assert solve_min(odd).value == solve_min(odd, use_blocks=False).value
