"""Restricted problems (baselines): optimum over allowed rows, mapped back to original indices."""

from __future__ import annotations

import numpy as np
import pytest

from planner.core.errors import InputError
from planner.search.elimination import solve_min
from planner.search.exhaustive import _all_choices
from planner.search.restrict import restrict

from .random_tables import assert_valid_choice, block_chain_tables, random_tables


def _oracle_restricted(tables, masks) -> float:
    best = np.inf
    for _, choices, time_s, _ in _all_choices(tables, 10**6):
        allowed = np.all([m[choices[:, i]] for i, m in enumerate(masks)], axis=0)
        if allowed.any():
            best = min(best, float(time_s[allowed].min()))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_restricted_optimum(seed: int) -> None:
    tables = random_tables(seed)
    rng = np.random.default_rng(seed)
    masks = []
    for t in tables.node_time_s:
        m = rng.random(t.size) < 0.5
        m[int(rng.integers(0, t.size))] = True
        masks.append(m)
    sub = restrict(tables, masks)
    result = solve_min(sub.tables)
    choice = sub.to_original(result.choice)
    assert all(masks[i][c] for i, c in enumerate(choice))
    assert_valid_choice(tables, choice, result.time_s, result.memory_bytes)
    assert result.time_s == _oracle_restricted(tables, masks)
    assert np.array_equal(sub.to_restricted(choice), result.choice)


def test_shared_arrays_stay_shared_and_blocks_still_reused() -> None:
    tables = block_chain_tables(1, num_blocks=8, block_size=3, max_size=5)
    masks = [np.arange(t.size) % 2 == 0 for t in tables.node_time_s]
    sub, index_maps = restrict(tables, masks)
    a, b = tables.blocks[0].instances[2][0], tables.blocks[0].instances[3][0]
    assert sub.node_time_s[a] is sub.node_time_s[b]
    assert solve_min(sub).value == solve_min(sub, use_blocks=False).value
    assert [m.tolist() for m in index_maps[:1]] == [list(range(0, tables.node_time_s[0].size, 2))]


def test_to_restricted_of_a_dropped_row() -> None:
    tables = random_tables(4, "chain")
    masks = [np.arange(t.size) == t.size - 1 for t in tables.node_time_s]
    sub = restrict(tables, masks)
    assert sub.to_restricted(np.zeros(tables.num_ops, dtype=np.int64)) is None or all(
        t.size == 1 for t in tables.node_time_s
    )


def test_bad_masks() -> None:
    tables = random_tables(0, "chain")
    with pytest.raises(InputError, match="one mask per op"):
        restrict(tables, [])
    masks = [np.ones(t.size, bool) for t in tables.node_time_s]
    masks[0] = np.zeros(tables.node_time_s[0].size, bool)
    with pytest.raises(InputError, match="allows no configuration"):
        restrict(tables, masks)
    masks[0] = np.ones(tables.node_time_s[0].size + 1, bool)
    with pytest.raises(InputError, match="shape"):
        restrict(tables, masks)
