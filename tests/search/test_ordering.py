"""Elimination orders: validity, GENERATESEQ by hand, networkx orders, choose_order's pick."""

from __future__ import annotations

from functools import partial

import networkx as nx
import pytest
from networkx.algorithms.approximation import treewidth_min_degree, treewidth_min_fill_in

from planner.search.ordering import (
    choose_order,
    default_heuristics,
    generate_seq,
    min_cells_seq,
    networkx_order,
    order_cost,
)
from planner.search.problem import interaction_graph

from .random_tables import KINDS, random_tables


def _sized(graph: nx.Graph, sizes: dict[int, int]) -> nx.Graph:
    nx.set_node_attributes(graph, sizes, "size")
    return graph


class TestOrders:
    @pytest.mark.parametrize("seed", range(36))
    def test_every_heuristic_returns_a_permutation(self, seed: int) -> None:
        graph = interaction_graph(random_tables(seed, KINDS[seed % len(KINDS)]))
        for name, heuristic in default_heuristics(graph).items():
            order = heuristic(graph)
            assert sorted(order) == sorted(graph.nodes), name

    @pytest.mark.parametrize("heuristic", [treewidth_min_degree, treewidth_min_fill_in])
    @pytest.mark.parametrize("seed", range(20))
    def test_networkx_order_respects_the_decomposition_width(self, heuristic, seed: int) -> None:
        graph = nx.gnp_random_graph(12, 0.3, seed=seed)
        nx.set_node_attributes(graph, 2, "size")
        width, _ = heuristic(graph)
        order = networkx_order(graph, heuristic)
        assert sorted(order) == list(range(12))
        worst, _ = order_cost(graph, order)
        # each step's table is 2 ** (1 + |dependent set|), and |dependent set| <= width
        assert worst <= 2 ** (width + 1)

    def test_generate_seq_by_hand(self) -> None:
        # a 4-cycle 0-1-2-3 with a pendant 4 on node 3
        graph = nx.Graph([(0, 1), (1, 2), (2, 3), (3, 0), (3, 4)])
        # 4 (1 neighbour); then 0, 1, 2 all have 2 (lowest index: 0); eliminating 0 joins 1 and 3
        assert generate_seq(graph) == [4, 0, 1, 2, 3]

    def test_generate_seq_frozen(self) -> None:
        graph = nx.path_graph(5)
        assert generate_seq(graph, frozen={0, 4}) == [1, 2, 3]

    def test_min_cells_prefers_small_tables(self) -> None:
        # star: hub 0 (size 100) with leaves of size 2; leaves go first (200 cells each); with one
        # leaf left, hub and leaf tie at 200 cells and the lower index (the hub) goes first
        graph = _sized(nx.star_graph(3), {0: 100, 1: 2, 2: 2, 3: 2})
        assert min_cells_seq(graph) == [1, 2, 0, 3]
        assert order_cost(graph, [1, 2, 0, 3]) == (200, 602)
        assert order_cost(graph, [0, 1, 2, 3])[0] == 800  # hub first: 100 * 2 * 2 * 2

    @pytest.mark.parametrize("seed", range(30))
    def test_min_cells_equals_the_greedy_taken_from_scratch(self, seed: int) -> None:
        # min_cells_seq keeps each dependent set's product as the sets change; the reference takes
        # every product afresh on the elimination graph (fill-in added) at every step
        rng = __import__("random").Random(seed)
        graph = nx.gnp_random_graph(14, 0.25 + 0.02 * (seed % 10), seed=seed)
        sizes = {v: rng.choice([1, 2, 3, 4, 6, 8, 16]) for v in graph}
        frozen = set(rng.sample(sorted(graph), seed % 3))
        work = _sized(graph.copy(), sizes)
        expected = []
        while set(work) - frozen:
            def cells(v: int) -> int:
                table = sizes[v]
                for u in work[v]:
                    table *= sizes[u]
                return table
            v = min(set(work) - frozen, key=lambda v: (cells(v), v))
            neighbours = list(work[v])
            work.add_edges_from((a, b) for a in neighbours for b in neighbours if a < b)
            work.remove_node(v)
            expected.append(v)
        assert min_cells_seq(_sized(graph, sizes), frozen=frozen) == expected

    def test_order_cost_by_hand(self) -> None:
        graph = _sized(nx.cycle_graph(4), {0: 2, 1: 3, 2: 4, 3: 5})
        # eliminate 0 (neighbours 1, 3): 2*3*5 = 30, fill 1-3; then 1 (2, 3): 3*4*5 = 60;
        # then 2 (3): 20; then 3: 5
        assert order_cost(graph, [0, 1, 2, 3]) == (60, 115)
        with pytest.raises(ValueError):
            order_cost(graph, [0], frozen={0})

    def test_choose_order_picks_the_smallest_largest_table(self) -> None:
        graph = _sized(nx.cycle_graph(6), {i: 2 + 3 * (i % 2) for i in range(6)})
        graph.add_edge(0, 3)
        heuristics = default_heuristics(graph)
        costs = {name: order_cost(graph, h(graph)) for name, h in heuristics.items()}
        choice = choose_order(graph, heuristics=heuristics)
        assert choice.max_table_cells == min(c[0] for c in costs.values())
        assert (choice.max_table_cells, choice.total_table_cells) == min(costs.values())
        assert costs[choice.name] == (choice.max_table_cells, choice.total_table_cells)

    def test_choose_order_with_custom_heuristics(self) -> None:
        graph = _sized(nx.path_graph(4), {0: 9, 1: 9, 2: 2, 3: 9})
        bad = lambda g: [1, 2, 0, 3]  # noqa: E731 - middle first: 9 * 9 * 2 cells
        good = partial(networkx_order, heuristic=treewidth_min_degree)
        choice = choose_order(graph, heuristics={"bad": bad, "good": good})
        assert choice.name == "good"
        assert choice.max_table_cells < order_cost(graph, bad(graph))[0]
        with pytest.raises(ValueError):
            choose_order(graph, heuristics={"broken": lambda g: [0, 1]})

    def test_deterministic(self) -> None:
        tables = random_tables(8, "dag")
        assert choose_order(tables) == choose_order(tables)

    def test_empty_graph(self) -> None:
        assert networkx_order(nx.Graph()) == []
        assert generate_seq(nx.Graph()) == []
