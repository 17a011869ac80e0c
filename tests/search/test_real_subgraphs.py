"""DP and frontier against the exhaustive oracle on small subgraphs of real models (priced by the
real cost model), as DESIGN.md asks beside the random graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from planner.core.tables import CostTables, EdgeCost
from planner.plan import PlanRequest, build_model, load_graph
from planner.search.elimination import solve_min
from planner.search.exhaustive import exhaustive_frontier, exhaustive_min
from planner.search.frontier import pareto_frontier

ROOT = Path(__file__).resolve().parents[2]


def _subgraph(tables: CostTables, ops: list[int], keep: int) -> CostTables:
    """Tables of ``ops`` only (edges among them), each op limited to its first ``keep`` configurations."""
    index = {op: i for i, op in enumerate(ops)}
    limits = [min(keep, tables.configs[op].size) for op in ops]
    configs = []
    for op, k in zip(ops, limits):
        space = tables.configs[op]
        configs.append(type(space)(dim_names=space.dim_names, factors=space.factors[:k], inter_factors=space.inter_factors[:k]))
    edges = tuple(
        EdgeCost(u=index[e.u], v=index[e.v], time_s=e.time_s[: limits[index[e.u]], : limits[index[e.v]]])
        for e in tables.edges
        if e.u in index and e.v in index
    )
    return CostTables(
        configs=tuple(configs),
        node_time_s=tuple(tables.node_time_s[op][:k] for op, k in zip(ops, limits)),
        node_memory_bytes=tuple(tables.node_memory_bytes[op][:k] for op, k in zip(ops, limits)),
        edges=edges,
    )


CASES = [
    ("examples/mlp.onnx", {"batch": 64}, 4, None, 99),
    ("examples/mlp.onnx", {"batch": 64}, 8, None, 99),
    ("tests/data/gpt2_tiny.onnx", {"batch": 4, "seq": 16}, 4, list(range(0, 7)), 5),
    ("tests/data/gpt2_tiny.onnx", {"batch": 4, "seq": 16}, 8, list(range(7, 14)), 5),
    ("examples/resnet.onnx", {"batch": 8}, 4, list(range(0, 6)), 6),
]


@pytest.mark.parametrize("path, dims, devices, ops, keep", CASES)
def test_dp_and_frontier_equal_the_oracle_on_real_subgraphs(path, dims, devices, ops, keep):
    graph = load_graph(ROOT / path, dims)
    model = build_model(graph, PlanRequest(cluster=make_cluster("a100-80gb", devices=devices)))
    tables = _subgraph(model.tables, ops if ops is not None else list(range(len(graph.ops))), keep)
    oracle = exhaustive_min(tables)
    found = solve_min(tables)
    assert found.time_s == pytest.approx(oracle.time_s, rel=1e-12)
    exact = exhaustive_frontier(tables)
    frontier = pareto_frontier(tables, epsilon=0.0)
    # Real costs are sums of floats: two strategies can tie in time up to the summation order's
    # rounding, and then the smaller one dominates the other. Compare up to that rounding.
    times, memories = exact.times_s, exact.memories_bytes
    tied = np.array([np.any((times <= t * (1 + 1e-12)) & (memories < m)) for t, m in zip(times, memories)])
    assert np.allclose(frontier.times_s, times[~tied], rtol=1e-12)
    assert np.allclose(frontier.memories_bytes, memories[~tied], rtol=1e-12)
