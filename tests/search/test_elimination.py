"""PaSE DP (solve_min) against the exhaustive oracle on random small problems."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.errors import InputError
from planner.core.tables import CostTables, EdgeCost
from planner.search import elimination
from planner.search.blocks import plan_elimination
from planner.search.elimination import solve_min
from planner.search.exhaustive import exhaustive_min
from planner.search.ordering import choose_order, default_heuristics
from planner.search.problem import interaction_graph
from planner.search.synthetic import chain_tables, simple_space

from .random_tables import assert_valid_choice, random_tables

SEEDS = range(240)


class TestSolveMin:
    @pytest.mark.parametrize("seed", SEEDS)
    def test_time_equals_oracle(self, seed: int) -> None:
        tables = random_tables(seed)
        ours = solve_min(tables)
        oracle = exhaustive_min(tables)
        assert ours.value == oracle.value
        assert ours.time_s == oracle.time_s
        assert_valid_choice(tables, ours.choice, ours.time_s, ours.memory_bytes)

    @pytest.mark.parametrize("seed", range(0, 240, 4))
    def test_memory_objective_equals_oracle(self, seed: int) -> None:
        tables = random_tables(seed)
        ours = solve_min(tables, objective="memory")
        oracle = exhaustive_min(tables, objective="memory")
        # lexicographic: least memory, then least time among those
        assert (ours.memory_bytes, ours.time_s) == (oracle.memory_bytes, oracle.time_s)
        assert ours.value == ours.memory_bytes
        assert_valid_choice(tables, ours.choice, ours.time_s, ours.memory_bytes)

    @pytest.mark.parametrize("seed", range(1, 240, 4))
    def test_weighted_memory_equals_oracle(self, seed: int) -> None:
        weight = 2.0**-12  # seconds per byte: 1 KiB costs 1/4 s, so both terms matter
        tables = random_tables(seed)
        ours = solve_min(tables, memory_weight_s_per_byte=weight)
        oracle = exhaustive_min(tables, memory_weight_s_per_byte=weight)
        assert ours.value == oracle.value
        assert ours.value == ours.time_s + weight * ours.memory_bytes
        assert_valid_choice(tables, ours.choice, ours.time_s, ours.memory_bytes)

    @pytest.mark.parametrize("seed", range(2, 240, 8))
    def test_infinite_costs(self, seed: int) -> None:
        tables = random_tables(seed, infinite=0.3)
        ours = solve_min(tables)
        oracle = exhaustive_min(tables)
        assert ours.value == oracle.value  # inf == inf when nothing is feasible
        assert_valid_choice(tables, ours.choice, ours.time_s, ours.memory_bytes)
        if np.isfinite(oracle.value):
            assert ours.time_s == oracle.time_s

    def test_continuous_costs(self) -> None:
        rng = np.random.default_rng(5)
        sizes = [4, 5, 3, 6, 2]
        tables = CostTables(
            configs=tuple(simple_space(k) for k in sizes),
            node_time_s=tuple(rng.random(k) for k in sizes),
            node_memory_bytes=tuple(rng.random(k) * 1e9 for k in sizes),
            edges=tuple(EdgeCost(u=u, v=v, time_s=rng.random((sizes[u], sizes[v]))) for u, v in
                        [(0, 1), (1, 2), (2, 3), (3, 4), (0, 3), (1, 4)]),
        )
        ours = solve_min(tables)
        oracle = exhaustive_min(tables)
        assert ours.value == pytest.approx(oracle.value, rel=1e-12)
        assert ours.time_s == pytest.approx(oracle.time_s, rel=1e-12)

    def test_every_heuristic_order_gives_the_optimum(self) -> None:
        tables = random_tables(17, "dag")
        oracle = exhaustive_min(tables)
        graph = interaction_graph(tables)
        for name, heuristic in default_heuristics(graph).items():
            result = solve_min(tables, order=heuristic(graph))
            assert result.value == oracle.value, name
            assert result.order_name == "given"
        chosen = choose_order(tables)
        assert solve_min(tables, order=chosen).order_name == chosen.name

    def test_deterministic(self) -> None:
        tables = random_tables(33, "skip")
        first = solve_min(tables)
        for _ in range(3):
            again = solve_min(tables)
            assert np.array_equal(again.choice, first.choice)
            assert (again.value, again.order_name, again.max_table_cells) == (
                first.value, first.order_name, first.max_table_cells)

    def test_ties_go_to_the_lowest_index(self) -> None:
        # every configuration costs the same: the choice must be all zeros
        sizes = [3, 4, 2]
        tables = CostTables(
            configs=tuple(simple_space(k) for k in sizes),
            node_time_s=tuple(np.ones(k) for k in sizes),
            node_memory_bytes=tuple(np.ones(k) for k in sizes),
            edges=(EdgeCost(u=0, v=1, time_s=np.ones((3, 4))), EdgeCost(u=1, v=2, time_s=np.ones((4, 2)))),
        )
        assert solve_min(tables).choice.tolist() == [0, 0, 0]

    def test_hand_example(self) -> None:
        # two ops: replicated (0) or split (1); the edge punishes switching layouts
        tables = CostTables(
            configs=(simple_space(2), simple_space(2)),
            node_time_s=(np.array([4.0, 1.0]), np.array([3.0, 2.5])),
            node_memory_bytes=(np.array([8.0, 4.0]), np.array([8.0, 4.0])),
            edges=(EdgeCost(u=0, v=1, time_s=np.array([[0.0, 2.0], [2.0, 0.0]])),),
            constant_time_s=0.5,
        )
        result = solve_min(tables)
        assert result.choice.tolist() == [1, 1]
        assert result.value == 0.5 + 1.0 + 2.5 + 0.0
        assert (result.time_s, result.memory_bytes) == (4.0, 8.0)

    def test_single_op_and_no_edges(self) -> None:
        tables = chain_tables([5], seed=3)
        assert solve_min(tables).value == float(tables.node_time_s[0].min())

    def test_bad_arguments(self) -> None:
        tables = chain_tables([2, 2])
        with pytest.raises(InputError):
            solve_min(tables, objective="speed")  # type: ignore[arg-type]
        with pytest.raises(InputError):
            solve_min(tables, memory_weight_s_per_byte=-1.0)
        with pytest.raises(ValueError):
            solve_min(tables, order=[0, 0])
        bad = CostTables(
            configs=(simple_space(2),),
            node_time_s=(np.array([np.nan, 1.0]),),
            node_memory_bytes=(np.zeros(2),),
            edges=(),
        )
        with pytest.raises(InputError, match="NaN"):
            solve_min(bad)


class TestBoundedMinPlus:
    """The bounded (min,+) product against the plain one, and the DP when it always runs."""

    @pytest.mark.parametrize("dense_fraction", [0.0, 0.5, 2.0])  # always, sometimes, never dense
    @pytest.mark.parametrize("seed", range(40))
    @pytest.mark.parametrize("product", ["_bounded_min_plus", "_min_plus"])
    def test_equals_dense_product(self, seed: int, dense_fraction: float, product: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(elimination, "_MIN_PLUS_DENSE_FRACTION", dense_fraction)
        self._check_product(seed, product)

    @pytest.mark.parametrize("dense_cells", [7, 1 << 17])  # blocks of one column and ragged ends; one block
    @pytest.mark.parametrize("seed", range(40))
    def test_dense_product_equals_broadcast_sum(self, seed: int, dense_cells: int, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(elimination, "_MIN_PLUS_DENSE_CELLS", dense_cells)
        self._check_product(seed, "_dense_min_plus")

    @staticmethod
    def _check_product(seed: int, product: str) -> None:
        rng = np.random.default_rng(seed)
        k, rows, columns = (int(x) for x in rng.integers(1, 60, size=3))
        # small integers: many ties; some infinite (infeasible) entries
        left = rng.integers(0, 16, size=(k, rows)).astype(np.float64)
        right = rng.integers(0, 16, size=(k, columns)).astype(np.float64)
        left[rng.random(left.shape) < 0.2] = np.inf
        right[rng.random(right.shape) < 0.2] = np.inf
        dense = (left[:, :, None] + right[:, None, :]).min(axis=0)
        assert np.array_equal(getattr(elimination, product)(left, right), dense)

    @pytest.mark.parametrize("dense_fraction", [0.0, 0.5, 2.0])
    def test_spread_costs(self, dense_fraction: float, monkeypatch: pytest.MonkeyPatch) -> None:
        # costs spread over orders of magnitude (as redistribution costs are): still exact
        monkeypatch.setattr(elimination, "_MIN_PLUS_DENSE_FRACTION", dense_fraction)
        rng = np.random.default_rng(5)
        left = rng.lognormal(0.0, 3.0, size=(300, 70))
        right = rng.lognormal(0.0, 3.0, size=(300, 90))
        dense = (left[:, :, None] + right[:, None, :]).min(axis=0)
        assert np.array_equal(elimination._bounded_min_plus(left, right), dense)
        assert np.array_equal(elimination._dense_min_plus(left, right), dense)

    @pytest.mark.parametrize("bounded_min_k", [1, 10**9])  # always bounded, always dense
    @pytest.mark.parametrize("seed", range(0, 240, 3))
    def test_dp_equals_oracle_with_products_everywhere(self, seed: int, bounded_min_k: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(elimination, "_MIN_PLUS_MIN_WORK", 0)
        monkeypatch.setattr(elimination, "_MIN_PLUS_BOUNDED_MIN_K", bounded_min_k)
        products = []
        real = elimination._min_plus
        monkeypatch.setattr(elimination, "_min_plus", lambda a, b: products.append(1) or real(a, b))
        tables = random_tables(seed, infinite=0.1 if seed % 2 else 0.0)
        # a random order eliminates ops between others, where the product structure appears
        order = np.random.default_rng(seed).permutation(tables.num_ops).tolist()
        ours = solve_min(tables, order=order)
        oracle = exhaustive_min(tables)
        assert ours.value == oracle.value
        assert_valid_choice(tables, ours.choice, ours.time_s, ours.memory_bytes)
        if np.isfinite(oracle.value):
            assert ours.time_s == oracle.time_s
        self.products_by_seed[seed] = len(products)

    products_by_seed: dict[int, int] = {}

    def test_products_were_exercised(self) -> None:
        for seed in range(0, 240, 3):
            if seed not in self.products_by_seed:
                with pytest.MonkeyPatch.context() as patch:
                    self.test_dp_equals_oracle_with_products_everywhere(seed, 1, patch)
        assert sum(1 for n in self.products_by_seed.values() if n) > 40  # of 80 seeds

    def test_given_plan_is_reused(self) -> None:
        tables = chain_tables([3, 4, 2, 5], seed=7, extra_edges=[(0, 3)])
        plan = plan_elimination(tables)
        weight = 2.0**-12
        shared = solve_min(tables, memory_weight_s_per_byte=weight, plan=plan)
        fresh = solve_min(tables, memory_weight_s_per_byte=weight)
        assert shared.value == fresh.value == exhaustive_min(tables, memory_weight_s_per_byte=weight).value
        with pytest.raises(InputError, match="objective='time'"):
            solve_min(tables, objective="memory", plan=plan)


class TestTableAxes:
    """A table has one axis per op it joins, and a numpy array holds at most 64 axes: eliminating the hub of
    a star of many one-configuration ops first (a 66-axis table crashed numpy inside the Mesh-TF search of
    a Zamba export, sweep H4) is refused as too large for exact search, not an internal error."""

    @staticmethod
    def _star(leaves: int):
        # op 0 (2 configurations) joined to ops 1..leaves (1 configuration each): chain 0-1 plus 0-i edges
        return chain_tables([2] + [1] * leaves, seed=3, extra_edges=[(0, i) for i in range(2, leaves + 1)])

    def test_a_table_past_numpys_axes_is_refused(self) -> None:
        with pytest.raises(InputError, match="more than the 64 axes an array holds"):
            solve_min(self._star(70), order=list(range(71)))  # the hub first: one table over 70 ops

    def test_a_table_within_the_axes_is_exact(self) -> None:
        tables = self._star(40)
        found = solve_min(tables, order=list(range(41)))
        assert found.time_s == pytest.approx(exhaustive_min(tables).time_s)
