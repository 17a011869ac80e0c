"""The enumeration of few joint choices against the oracle (:func:`planner.search.exhaustive.exhaustive_min`,
which shares no code with it): the same minimum to the last bit, the same (lowest) choice."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner.search.exhaustive import exhaustive_min
from planner.search.few_choices import solve_by_enumeration
from tests.search.random_tables import KINDS, random_tables


def _fix_most(tables, rng: np.random.Generator, free: int):
    """The tables with all but ``free`` ops cut to one configuration (a random one), as a launcher's
    family cuts a stage's ops."""
    keep = set(rng.choice(tables.num_ops, size=min(free, tables.num_ops), replace=False).tolist())
    rows = [np.arange(len(t)) if i in keep else np.array([int(rng.integers(len(t)))]) for i, t in enumerate(tables.node_time_s)]
    return dataclasses.replace(
        tables,
        configs=tuple(c.subset(r) for c, r in zip(tables.configs, rows)),
        node_time_s=tuple(t[r] for t, r in zip(tables.node_time_s, rows)),
        node_memory_bytes=tuple(m[r] for m, r in zip(tables.node_memory_bytes, rows)),
        edges=tuple(dataclasses.replace(e, time_s=e.time_s[np.ix_(rows[e.u], rows[e.v])]) for e in tables.edges),
        constant_time_s=1.5,
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(12))
def test_the_minimum_and_choice_are_the_oracles(kind: str, seed: int):
    rng = np.random.default_rng(seed)
    tables = _fix_most(random_tables(seed, kind, infinite=0.1 if seed % 3 == 0 else 0.0), rng, free=1 + seed % 3)
    found = solve_by_enumeration(tables)
    assert found is not None
    choice, value = found
    oracle = exhaustive_min(tables)
    assert value == oracle.value or (np.isinf(value) and np.isinf(oracle.value))
    if np.isfinite(oracle.value):
        assert choice.tolist() == oracle.choice.tolist()
        assert tables.evaluate(choice)[0] == value


def test_too_many_joint_choices_are_left_to_the_dp():
    tables = random_tables(3, "chain")
    sizes = [len(t) for t in tables.node_time_s]
    product = int(np.prod([k for k in sizes if k > 1]))
    assert solve_by_enumeration(tables, max_choices=product - 1) is None
    assert solve_by_enumeration(tables, max_choices=product) is not None


def test_no_free_op_is_the_sum_of_every_factor():
    tables = _fix_most(random_tables(5, "dag"), np.random.default_rng(0), free=0)
    choice, value = solve_by_enumeration(tables)
    assert choice.tolist() == [0] * tables.num_ops
    assert value == tables.evaluate(choice)[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("scale", [1, 3, 7.0, 0.37])
def test_an_edge_scale_reads_as_the_scaled_tables(kind: str, seed: int, scale: float):
    """``edge_scale`` (the pipeline search's micro-batch slots, h32a) scales only the cells it reads: to the bit
    the answer on the tables whose edges were scaled whole first (as ``stage_restriction._edges_per_step`` does),
    whose minimum is the oracle's."""
    rng = np.random.default_rng(100 + seed)
    tables = _fix_most(random_tables(seed, kind, infinite=0.1 if seed % 3 == 0 else 0.0), rng, free=seed % 3)
    scaled = dataclasses.replace(tables, edges=tuple(dataclasses.replace(e, time_s=scale * e.time_s) for e in tables.edges))
    choice, value = solve_by_enumeration(tables, edge_scale=scale)
    want_choice, want_value = solve_by_enumeration(scaled)
    assert np.float64(value).tobytes() == np.float64(want_value).tobytes()
    assert choice.tolist() == want_choice.tolist()
    oracle = exhaustive_min(scaled)  # to the bit where the scaled costs stay exact in any order (whole scales)
    exact = value == oracle.value if float(scale).is_integer() else np.isclose(value, oracle.value, rtol=1e-12)
    assert exact or (np.isinf(value) and np.isinf(oracle.value))
    if scale != 1 and any(e.time_s.any() for e in tables.edges) and np.isfinite(value):
        assert value != solve_by_enumeration(tables)[1]  # the scale is read (an unscaled sum differs)
