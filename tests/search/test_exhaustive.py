"""The oracle itself, checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.errors import InputError
from planner.core.tables import CostTables, EdgeCost
from planner.search.exhaustive import exhaustive_frontier, exhaustive_min
from planner.search.synthetic import chain_tables, simple_space


def _two_ops() -> CostTables:
    # op 0: fast/big (0) or slow/small (1); op 1 likewise; switching layouts costs 1 s
    return CostTables(
        configs=(simple_space(2), simple_space(2)),
        node_time_s=(np.array([1.0, 3.0]), np.array([2.0, 4.0])),
        node_memory_bytes=(np.array([10.0, 4.0]), np.array([20.0, 8.0])),
        edges=(EdgeCost(u=0, v=1, time_s=np.array([[0.0, 1.0], [1.0, 0.0]])),),
        constant_memory_bytes=1.0,
    )


class TestExhaustive:
    def test_min_by_hand(self) -> None:
        # (time, memory) of the four choices: 00: (3, 31); 01: (6, 19); 10: (6, 25); 11: (7, 13)
        result = exhaustive_min(_two_ops())
        assert result.choice.tolist() == [0, 0] and result.value == 3.0
        by_memory = exhaustive_min(_two_ops(), objective="memory")
        assert by_memory.choice.tolist() == [1, 1] and by_memory.value == 13.0
        weighted = exhaustive_min(_two_ops(), memory_weight_s_per_byte=1.0)
        assert weighted.choice.tolist() == [1, 1] and weighted.value == 20.0

    def test_frontier_by_hand(self) -> None:
        front = exhaustive_frontier(_two_ops())
        assert [(p.time_s, p.memory_bytes) for p in front.points] == [(3.0, 31.0), (6.0, 19.0), (7.0, 13.0)]
        assert [p.choice.tolist() for p in front.points] == [[0, 0], [0, 1], [1, 1]]
        assert front.exact and front.method == "exhaustive"

    def test_refuses_large_problems(self) -> None:
        with pytest.raises(InputError, match="exceeds"):
            exhaustive_min(chain_tables([10] * 7), max_combinations=1000)

    def test_ties_keep_the_lowest_index(self) -> None:
        tables = CostTables(
            configs=(simple_space(3),),
            node_time_s=(np.array([2.0, 1.0, 1.0]),),
            node_memory_bytes=(np.array([5.0, 5.0, 5.0]),),
            edges=(),
        )
        assert exhaustive_min(tables).choice.tolist() == [1]
        assert [p.choice.tolist() for p in exhaustive_frontier(tables).points] == [[1]]
