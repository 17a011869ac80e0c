"""The edge tables priced at the cells a search reads (:class:`objectives.edge_cells.EdgeCells`, issue 22,
nineteenth round) against the whole tables a build prices (:func:`objectives.tables.with_edges`), the oracle:
every op pair's restricted table ``time_s[np.ix_(keep[u], keep[v])]`` and every plan's cells, to the bit, in the
tables' order, as the rectangles grow (masks asked one after the other, picks outside them); and, through a
:class:`objectives.pipeline_cost.PipelineCostCache`, the search's restricted problems
(:func:`planner.search.stage_restriction.restricted`) and ``chosen_edges`` with the cells and with the whole tables
priced first, equal. The model: a GPT-2-like layer on 16 devices in nodes of 4 (node-crossing tables) under an
execution model (the sequence-split rule's NCCL calls); with tensor-parallel overlap the cells do not apply."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.edge_cells import EdgeCells
from objectives.pipeline_cost import PipelineCostCache
from objectives.tables import build_cost_model, with_edges
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from planner.pipeline import graph_loader
from planner.search.stage_restriction import restricted
from tests.objectives.graphs import gpt2_like

DEVICES, PER_NODE = 16, 4


def _bare(**settings):
    graph = gpt2_like(layers=2, hidden=256, heads=4, vocab=512, positions=64, batch=16, seq=64)
    return build_cost_model(graph, cluster=make_cluster("a100-80gb", devices=DEVICES, devices_per_node=PER_NODE),
                            settings=TrainingSettings(engine="fused", attention="flash", **settings),
                            config_options=ConfigOptions(devices=DEVICES, devices_per_node=PER_NODE), price_edges=False)


@pytest.fixture(scope="module")
def models():
    """``(bare, whole)``: the model built without its edge tables, and with them."""
    bare = _bare()
    return bare, with_edges(bare)


def _masks(model, rng: np.random.Generator, share: float) -> list[np.ndarray]:
    """Per op, sorted configurations kept (ops of one space mostly share one array, as the search's masks do)."""
    by_space: dict[int, np.ndarray] = {}
    keep = []
    for space in model.tables.configs:
        if id(space) not in by_space or rng.random() > 0.8:
            mask = rng.random(space.size) < share
            mask[int(rng.integers(space.size))] = True
            by_space[id(space)] = np.flatnonzero(mask)
        keep.append(by_space[id(space)])
    return keep


def test_the_restricted_tables_are_the_whole_tables_rows(models):
    bare, whole = models
    cells = EdgeCells.of(bare)
    assert cells is not None and EdgeCells.of(whole) is None  # a model with its tables is read as it is
    rng = np.random.default_rng(11)
    for share in (0.05, 0.3, 0.02, 0.6):  # masks one after the other: the rectangles grow
        keep = _masks(bare, rng, share)
        found = cells.restricted(keep)
        assert [(e.u, e.v) for e in found] == [(e.u, e.v) for e in whole.tables.edges]
        for mine, full in zip(found, whole.tables.edges):
            np.testing.assert_array_equal(mine.time_s, full.time_s[np.ix_(keep[full.u], keep[full.v])])
    fresh = EdgeCells.of(bare)
    fresh.restricted(_masks(bare, rng, 0.02))  # few rows: a small share of each table priced
    assert sum(c.size for c in fresh.cells) < 0.25 * sum(rows * cols for rows, cols in fresh.shapes)


def test_a_plans_cells_are_the_whole_tables_cells(models):
    bare, whole = models
    cells = EdgeCells.of(bare)
    rng = np.random.default_rng(5)
    cells.restricted(_masks(bare, rng, 0.1))
    for i in range(20):  # picks inside the priced rectangles and outside them, the rectangles grown between
        if i % 5 == 4:
            cells.restricted(_masks(bare, rng, 0.1))
        picks = np.array([rng.integers(space.size) for space in bare.tables.configs])
        producers, consumers, seconds = cells.at(picks)
        assert producers.tolist() == [e.u for e in whole.tables.edges]
        assert consumers.tolist() == [e.v for e in whole.tables.edges]
        np.testing.assert_array_equal(seconds, np.array([e.time_s[picks[e.u], picks[e.v]] for e in whole.tables.edges]))


def test_no_cells_under_tensor_parallel_overlap():
    assert EdgeCells.of(_bare(tp_comm_overlap=True)) is None


LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"


def _cache(priced_first: bool) -> PipelineCostCache:
    cache = PipelineCostCache(graph_loader(LLAMA, {"seq": 64}), cluster=make_cluster("a100-80gb", devices=8, devices_per_node=4),
                              settings=TrainingSettings(engine="fused", attention="flash"))
    if priced_first:  # the whole tables, as every search priced them before the nineteenth round
        cache.arrays(8, 2, 0, "none")
    return cache


@pytest.mark.parametrize("data_parallel", [None, 2])
def test_the_searchs_restricted_problems_and_prices_are_the_same(data_parallel):
    with_cells, whole = _cache(False), _cache(True)
    assert with_cells.edge_cells(8, 2) is not None and whole.edge_cells(8, 2) is None
    for zero, recompute in ((1, "none"), (3, "full"), (0, "selective")):
        mine = restricted(with_cells, 8, 2, zero, recompute, inside_node=True, data_parallel=data_parallel)
        theirs = restricted(whole, 8, 2, zero, recompute, inside_node=True, data_parallel=data_parallel)
        assert mine.edge_labels == theirs.edge_labels
        assert [(e.u, e.v) for e in mine.edges] == [(e.u, e.v) for e in theirs.edges]
        for a, b in zip(mine.edges, theirs.edges):
            np.testing.assert_array_equal(a.time_s, b.time_s)
    assert (8, 2) in with_cells._edgeless  # the search's reads priced no whole table
    rng = np.random.default_rng(2)
    spaces = whole.model(8, 2, 0, "none").tables.configs
    for _ in range(10):
        picks = np.array([rng.integers(space.size) for space in spaces])
        for a, b in zip(with_cells.chosen_edges(8, 2, "full", picks), whole.chosen_edges(8, 2, "full", picks)):
            np.testing.assert_array_equal(a, b)
