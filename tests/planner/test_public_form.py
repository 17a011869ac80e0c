"""A strategy survives its public form: per op its split factors, their inter-node parts and its
redundant copies (``Strategy.splits``, ``inter_splits``, ``replicas``) name exactly one configuration
row, so ``evaluate()`` prices every strategy ``plan()`` returns again to the bit, and a generic plan
JSON maps back to the same rows.

Oracles: the rows a description names are found by scanning every row of the op's space (not by
the code under test), and the strategies checked include every point of the exhaustive Pareto
frontier (:func:`planner.search.exhaustive.exhaustive_frontier`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exporters.generic import MINOR_VERSION, PlanInput, plan_from_dict, save_plan, write_plan
from objectives.cluster import make_cluster
from planner.core.errors import InputError
from planner.core.strategy import OpLayout, public_form
from planner.plan import PlanRequest, build_model, evaluate, load_graph, load_plan, op_configurations, plan
from planner.search.exhaustive import MAX_COMBINATIONS, exhaustive_frontier
from planner.search.problem import config_counts
from tests.objectives.graphs import GraphBuilder, _add, _norm, gpt2_like, linear

GPT2_TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
SEEDS = range(6)
CLUSTERS = [(4, 4), (4, 2), (8, 4), (8, 2)]
"""(devices, devices per node): one node, and two nodes, where a split's placement matters."""


def _block_graph(seed: int, *, small: bool = False):
    """LayerNorm -> Linear -> Linear -> residual Add, random sizes: a norm and an add may run as
    redundant copies, the linears may not. ``small``: sizes whose choices on 8 devices the oracle
    enumerates in about a second."""
    rng = np.random.default_rng(seed)
    b, s = (2, int(rng.choice([2, 4]))) if small else (int(rng.choice([2, 4, 8])), int(rng.choice([2, 4])))
    h, ffn = (int(rng.choice([2, 4])), int(rng.choice([4, 8]))) if small else (
        int(rng.choice([4, 8, 16])), int(rng.choice([8, 16, 32])))
    g = GraphBuilder(f"block{seed}")
    x = g.tensor("x", (b, s, h), role="input")
    sizes = {"b": b, "s": s}
    y = _norm(g, "ln", x, sizes, h)
    z = linear(g, "fc1", y, ("b", "s", "k"), sizes, ffn)
    w = linear(g, "fc2", z, ("b", "s", "k"), sizes, h)
    _add(g, "add", y, w, sizes, h)
    return g.build()


def _request(devices: int, per_node: int, **kwargs) -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=per_node), **kwargs)


def _described_rows(space, splits: dict, inter: dict, copies: int) -> list[int]:
    """Brute force: every row of ``space`` whose factors, inter-node parts and copies are these."""
    names = space.dim_names
    return [
        r
        for r in range(space.size)
        if {n: int(f) for n, f in zip(names, space.factors[r]) if f > 1} == splits
        and {n: int(e) for n, e in zip(names, space.inter_factors[r]) if e > 1} == inter
        and int(space.replica_counts[r]) == copies
    ]


def _factor_rows(space, splits: dict) -> int:
    """Brute force: how many rows of ``space`` have these split factors (any placement, any copies)."""
    names = space.dim_names
    return sum({n: int(f) for n, f in zip(names, space.factors[r]) if f > 1} == splits for r in range(space.size))


def _assert_names_its_rows(graph, spaces, choice, splits, inter_splits, replicas) -> None:
    for op, space, row in zip(graph.ops, spaces, choice):
        rows = _described_rows(space, dict(splits.get(op.name, {})), dict(inter_splits.get(op.name, {})),
                               int(replicas.get(op.name, 1)))  # fmt: skip
        assert rows == [int(row)], (op.name, rows, int(row))


def _assert_same_cost(again, time_s: float, memory_bytes: float) -> None:
    assert again.time_s == pytest.approx(time_s, rel=1e-9, abs=0.0)
    assert again.memory_bytes == pytest.approx(memory_bytes, rel=1e-9, abs=0.0)


@pytest.mark.parametrize("devices,per_node", CLUSTERS)
@pytest.mark.parametrize("seed", SEEDS)
def test_every_exhaustive_pareto_strategy_prices_again_through_its_public_form(seed: int, devices: int, per_node: int):
    request = _request(devices, per_node)
    # the seed's first draw the oracle can enumerate
    for draw in range(seed * 20, seed * 20 + 20):
        graph = _block_graph(draw, small=devices > 4)
        tables = build_model(graph, request).tables
        if np.prod(config_counts(tables), dtype=np.float64) <= MAX_COMBINATIONS:
            break
    assert any(space.has_replicas for space in tables.configs)  # the settings allow redundant copies
    names = [op.name for op in graph.ops]
    ambiguous = 0
    for point in exhaustive_frontier(tables).points:
        form = public_form(names, tables.configs, point.choice)
        _assert_names_its_rows(graph, tables.configs, point.choice, form.splits, form.inter_splits, form.replicas)
        again = evaluate(graph, request, form.splits, form.inter_splits, form.replicas)
        assert again.choice == tuple(int(c) for c in point.choice)
        _assert_same_cost(again, point.time_s, point.memory_bytes)
        assert dict(again.replicas) == form.replicas  # evaluate's answer carries its own public form
        # today's splits alone: accepted exactly when every op's factors name one row (brute force)
        if all(_factor_rows(space, form.splits.get(n, {})) == 1 for n, space in zip(names, tables.configs)):
            _assert_same_cost(evaluate(graph, request, form.splits), point.time_s, point.memory_bytes)
        else:
            ambiguous += 1
            with pytest.raises(InputError, match="configurations") as refused:
                evaluate(graph, request, form.splits)
            assert "\n" not in str(refused.value) and "evaluate(graph, request, strategy)" in str(refused.value)
    assert ambiguous > 0  # copies (and on two nodes, placements) make plain splits ambiguous somewhere


def _plan_cases() -> list:
    cases = [
        pytest.param(seed, devices, per_node, id=f"block{seed}-{devices}/{per_node}")
        for seed in SEEDS[:3]
        for devices, per_node in CLUSTERS
    ]
    tiny = dict(layers=1, hidden=16, heads=2, vocab=64, positions=8, batch=4, seq=8)
    return cases + [pytest.param(tiny, devices, per_node, id=f"gpt2-{devices}/{per_node}") for devices, per_node in ((4, 4), (4, 2))]


def _graph_of(case):
    return gpt2_like(**case) if isinstance(case, dict) else _block_graph(case)


@pytest.mark.parametrize("case,devices,per_node", _plan_cases())
def test_plan_strategies_and_their_plan_json_price_again(case, devices: int, per_node: int):
    """Every row plan() lists, the pick among them, re-priced from the strategy (its public fields
    only) and from its generic plan JSON read back."""
    graph = _graph_of(case)
    unlimited = plan(graph, _request(devices, per_node), with_targets=False)
    memories = sorted(p.strategy.memory_bytes for p in unlimited.points)
    request = _request(devices, per_node, memory_limit_bytes=memories[len(memories) // 2])  # a binding limit
    result = plan(graph, request, with_targets=False)
    assert result.best is not None
    names = [op.name for op in graph.ops]
    copies = 0
    for point in result.points:
        strategy = point.strategy
        assert strategy.replicas is not None
        assert public_form(names, result.spaces, strategy.choice).replicas == dict(strategy.replicas)
        _assert_names_its_rows(graph, result.spaces, strategy.choice, strategy.splits, strategy.inter_splits,
                               strategy.replicas)  # fmt: skip
        again = evaluate(graph, request, strategy)
        assert again.choice == strategy.choice
        _assert_same_cost(again, strategy.time_s, strategy.memory_bytes)
        copies += bool(strategy.replicas)
        document = json.loads(json.dumps(write_plan(PlanInput(
            graph=graph, cluster=request.cluster, settings=request.settings, spaces=result.spaces, strategy=strategy,
        ))))  # fmt: skip
        read = plan_from_dict(document)
        assert tuple(op.row_in(space) for op, space in zip(read.ops, result.spaces)) == strategy.choice
        _assert_same_cost(evaluate(graph, request, read.strategy()), strategy.time_s, strategy.memory_bytes)
    assert copies > 0  # some listed strategy runs an op as redundant copies


def test_a_saved_plan_loads_back_to_its_rows(tmp_path):
    """plan -> generic JSON file -> load_plan (re-imports the ONNX file, rebuilds the cost model):
    the same rows and costs, on two nodes, for every listed row."""
    request = _request(8, 4)
    graph = load_graph(GPT2_TINY, {"batch": 8, "seq": 16})
    result = plan(graph, request, with_targets=False)
    # the fastest row, and rows with copies and with splits across nodes
    chosen = [result.points[0], *(p for p in result.points if p.strategy.replicas and p.strategy.inter_splits)][:4]
    assert len(chosen) == 4
    for number, point in enumerate(chosen):
        path = tmp_path / f"plan{number}.json"
        save_plan(PlanInput(graph=graph, cluster=request.cluster, settings=request.settings, spaces=result.spaces,
                            strategy=point.strategy), path)  # fmt: skip
        loaded = load_plan(path)
        assert loaded.choice == point.strategy.choice
        assert loaded.cost.tables.evaluate(loaded.choice) == (point.strategy.time_s, point.strategy.memory_bytes)


def test_plans_that_did_not_record_copies_still_load():
    """A plan of minor version 1 (no ``replicas`` entries) matches any copies: its recorded row
    where that is among the matches."""
    graph = _block_graph(0)
    request = _request(4, 4)
    result = plan(graph, request, with_targets=False)
    point = next(p for p in result.points if p.strategy.replicas)
    document = write_plan(PlanInput(graph=graph, cluster=request.cluster, settings=request.settings,
                                    spaces=result.spaces, strategy=point.strategy))  # fmt: skip
    assert document["minor_version"] == MINOR_VERSION
    document["minor_version"] = 1
    for entry in document["ops"]:
        entry.pop("replicas", None)
    read = plan_from_dict(document)
    assert read.strategy().replicas is None  # not recorded: evaluate would check each op for ambiguity
    assert tuple(op.row_in(space) for op, space in zip(read.ops, result.spaces)) == point.strategy.choice


class TestEvaluateRefusals:
    def test_unknown_names_and_dims(self):
        graph = _block_graph(1)
        request = _request(4, 4)
        with pytest.raises(InputError, match="no op called 'nope'.*replicas"):
            evaluate(graph, request, {}, {}, {"nope": 2})
        with pytest.raises(InputError, match="op 'fc1' has no dim 'q'; its dims are b, s, n, k"):
            evaluate(graph, request, {"fc1": {"q": 2}}, {}, {})

    def test_a_strategy_is_passed_alone(self):
        graph = _block_graph(1)
        request = _request(4, 4)
        strategy = evaluate(graph, request, {}, {}, {})  # every op whole, run once
        with pytest.raises(InputError, match="not both"):
            evaluate(graph, request, strategy, {}, None)

    def test_copies_that_are_no_configuration(self):
        graph = _block_graph(1)
        with pytest.raises(InputError, match="op 'fc1' has no configuration .* as 4 copies"):
            evaluate(graph, _request(4, 4), {}, {}, {"fc1": 4})  # a matmul never runs as copies


@pytest.mark.parametrize("devices,per_node", CLUSTERS)
def test_op_configurations_are_the_model_rows(devices: int, per_node: int):
    """op_configurations lists the rows of the cost model's space (copies and placements too), each
    description naming exactly that row."""
    graph = _block_graph(2)
    request = _request(devices, per_node)
    spaces = build_model(graph, request).tables.configs
    for op, space in zip(graph.ops, spaces):
        layouts = op_configurations(graph, request, op.name)
        assert len(layouts) == space.size == len(set(map(str, layouts)))
        for row, layout in enumerate(layouts):
            assert isinstance(layout, OpLayout)
            assert _described_rows(space, dict(layout.splits), dict(layout.inter_splits), layout.replicas) == [row]
    with pytest.raises(InputError, match="no op called"):
        op_configurations(graph, request, "nope")
