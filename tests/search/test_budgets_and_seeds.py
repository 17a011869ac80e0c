"""Issue 25, budgets and seeds: every elimination checks its budget (the pipeline's per-stage
intra-op DP degrades instead of raising MemoryError), and a degraded search starts from the
replicated plan and a smaller mesh's best plan, embedded, so more devices never give a slower plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.core.configs import ConfigSpace
from planner.core.tables import CostTables, EdgeCost
from planner.search import degrade
from planner.search import nsga2 as nsga2_module
from planner.search import pipeline as pipeline_search
from planner.search.budget import SearchBudget
from planner.search.nsga2_seeds import baseline_seeds, embed_choice, merge_seeds
from planner.search.synthetic import chain_tables


def _scan_tables(steps: int = 24, configs: int = 6, seed: int = 0) -> CostTables:
    """A scan-heavy problem with no repeated blocks: every step reads the state and the (shared)
    input op, so the elimination's tables grow with the steps."""
    rng = np.random.default_rng(seed)
    spaces = tuple(
        ConfigSpace(dim_names=("b",), factors=np.arange(1, configs + 1).reshape(-1, 1), inter_factors=np.ones((configs, 1), np.int64))
        for _ in range(steps + 1)
    )
    edges = []
    for t in range(1, steps + 1):
        edges.append(EdgeCost(u=0, v=t, time_s=rng.uniform(0.0, 1.0, (configs, configs))))
        if t > 1:
            edges.append(EdgeCost(u=t - 1, v=t, time_s=rng.uniform(0.0, 1.0, (configs, configs))))
        for back in range(2, min(t, 6)):  # a scan's carried states: each step reads a few earlier ones
            edges.append(EdgeCost(u=t - back, v=t, time_s=rng.uniform(0.0, 1.0, (configs, configs))))
    return CostTables(
        configs=spaces,
        node_time_s=tuple(rng.uniform(0.5, 2.0, configs) for _ in spaces),
        node_memory_bytes=tuple(rng.uniform(1.0, 4.0, configs) for _ in spaces),
        edges=tuple(edges),
    )


class _Cache:
    """What ``_solve`` reads of a ``PipelineCostCache``: its plan memo and the caps."""

    def __init__(self, max_memory_bytes: float | None = None, max_solve_s: float | None = None) -> None:
        self.plans: dict = {}
        self.max_memory_bytes = max_memory_bytes
        self.max_solve_s = max_solve_s


class TestPipelineEliminationBudget:
    def test_a_tiny_memory_budget_degrades_instead_of_raising(self, monkeypatch):
        tables = _scan_tables()
        ran = []
        monkeypatch.setattr(pipeline_search.elimination, "_solve", lambda *a, **k: ran.append(1) or (_ for _ in ()).throw(MemoryError))
        choice = pipeline_search._solve(_Cache(max_memory_bytes=1.0), tables, (), ())
        assert not ran  # refused before it allocated anything
        assert choice is not None and choice.shape == (tables.num_ops,)
        time_s, memory = tables.evaluate(choice)
        assert np.isfinite(time_s) and np.isfinite(memory)
        # never slower than the replicated plans the heuristic starts from
        assert time_s <= min(tables.evaluate(s)[0] for s in baseline_seeds(tables)) + 1e-12

    def test_each_degraded_solve_is_counted(self, monkeypatch):
        cache = _Cache(max_memory_bytes=1.0)
        for _ in range(2):
            pipeline_search._solve(cache, _scan_tables(), (), ())
        assert cache.plans[pipeline_search._DEGRADED] == 2

    def test_the_search_says_when_a_heuristic_answered(self, monkeypatch):
        """Every per-stage DP over a budget of ~0 s: the pipeline search's notes say how many a
        heuristic answered, and the launchable table carries the note. (Megatron's families leave
        few ops free, which enumeration answers exactly without a DP: turned off here, so that
        every search is a DP. Each heuristic answer is NSGA-II for 2 s of wall clock by default: on
        4 devices at batch 8, 50-odd of them ran into the plan's 60 s limit; 2 devices at batch 2 make
        22, each given 0.05 s (one generation), so the search finishes and the note counts them all.)"""
        monkeypatch.setattr(pipeline_search, "solve_by_enumeration", lambda tables, **kwargs: None)
        heuristic = degrade.quick_fastest
        monkeypatch.setattr(degrade, "quick_fastest", lambda tables, **kwargs: heuristic(tables, **{**kwargs, "time_limit_s": 0.05}))
        from objectives.cluster import make_cluster
        from planner.launchable import launch_frontier
        from planner.pipeline import PipelineOptions, graph_loader
        from planner.plan import PlanRequest

        data = Path(__file__).resolve().parents[1] / "data"
        loader = graph_loader(data / "gpt2_tiny.onnx", {"seq": 64})
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2, devices_per_node=2))
        original = pipeline_search._MAX_SOLVE_S
        try:
            pipeline_search._MAX_SOLVE_S = 1e-12
            frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=2), launchers=("megatron",),
                                       headroom=False)
        finally:
            pipeline_search._MAX_SOLVE_S = original
        said = [note for note in frontier.notes if "heuristic answered" in note]
        assert frontier.rows and len(said) == 1 and said[0].startswith("megatron: ")
        assert int(said[0].split(": ")[1].split()[0]) == frontier.intra_op_searches

    def test_a_memory_error_inside_the_dp_degrades_too(self, monkeypatch):
        tables = chain_tables([3, 4, 2], seed=1)

        def out_of_memory(*args, **kwargs):
            raise MemoryError

        monkeypatch.setattr(pipeline_search.elimination, "_solve", out_of_memory)
        choice = pipeline_search._solve(_Cache(), tables, (), ())
        assert choice is not None and np.isfinite(tables.evaluate(choice)[0])

    def test_within_budget_the_dp_stays_exact(self):
        from planner.search.exhaustive import exhaustive_min

        tables = chain_tables([3, 4, 2], seed=4)
        choice = pipeline_search._solve(_Cache(), tables, (), ())
        assert tables.evaluate(choice)[0] == pytest.approx(exhaustive_min(tables).time_s)


class TestEmbedding:
    def test_the_best_plan_on_8_devices_runs_as_fast_on_64(self, tmp_path):
        """The fastest plan on 8 devices, embedded on 64 (same split factors, copies or idle devices
        for the rest): every op keeps its factors and the fastest variant is no slower."""
        from objectives.cluster import make_cluster
        from planner.plan import PlanRequest, build_model, load_graph
        from planner.search.elimination import solve_min

        graph = load_graph(_scan_model(tmp_path / "scan.onnx", steps=4), {})
        small, large = (build_model(graph, PlanRequest(cluster=make_cluster("a100-80gb", devices=n))).tables for n in (8, 64))
        best = solve_min(small).choice
        embedded = embed_choice(small.configs, best, large)
        assert len(embedded)
        for row in embedded:
            for s_space, l_space, c_small, c_large in zip(small.configs, large.configs, best, row):
                assert tuple(np.asarray(l_space.factors)[c_large]) == tuple(np.asarray(s_space.factors)[c_small])
        assert min(large.evaluate(r)[0] for r in embedded) <= small.evaluate(best)[0] * (1 + 1e-9)


class TestSeeds:
    def test_degraded_nsga2_starts_from_the_seeds_and_keeps_them(self, monkeypatch):
        tables = _scan_tables()
        started = {}
        real = nsga2_module.nsga2_frontier

        def spy(tables, **kwargs):
            started["initial"] = kwargs.get("initial")
            return real(tables, **{**kwargs, "time_limit_s": 0.5, "generations": 2})

        monkeypatch.setattr(nsga2_module, "nsga2_frontier", spy)
        smaller = np.full((1, tables.num_ops), 3, dtype=np.int64)
        found = degrade.frontier_within(
            tables, SearchBudget(max_memory_bytes=1.0), more_seeds=lambda deadline: smaller
        )  # no memory left: every exact rung is refused
        assert found.tier == "nsga2"
        initial = {tuple(r) for r in started["initial"]}
        assert tuple(smaller[0]) in initial  # the smaller mesh's plan
        assert all(tuple(r) in initial for r in baseline_seeds(tables))  # the replicated plans
        fastest = found.result.points[0].time_s
        assert fastest <= min(tables.evaluate(r)[0] for r in started["initial"]) + 1e-12

    def test_merge_keeps_a_dominating_seed(self):
        tables = chain_tables([3, 3], seed=2)
        from planner.search.exhaustive import exhaustive_frontier

        exact = exhaustive_frontier(tables)
        best = exact.points[0]
        worse = type(exact)(**{**{f: getattr(exact, f) for f in exact.__dataclass_fields__}, "points": exact.points[1:]})
        merged = merge_seeds(tables, worse, np.array([best.choice]))
        assert merged.points[0].time_s == best.time_s


def _scan_model(path: Path, steps: int = 10, batch: int = 64, hidden: int = 64) -> Path:
    """An unrolled scan (no repeated blocks the importer matches): h_t = tanh(h_{t-1} W_t + x_t)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, steps, hidden])
    out = helper.make_tensor_value_info(f"h{steps}", TensorProto.FLOAT, [batch, hidden])
    nodes, inits = [], []
    h = "h0_in"
    nodes.append(helper.make_node("ReduceMean", ["x"], ["h0_in"], axes=[1], keepdims=0, name="init"))
    inits.append(helper.make_tensor("axes1", TensorProto.INT64, [1], [1]))
    for t in range(steps):
        inits.append(helper.make_tensor(f"w{t}", TensorProto.FLOAT, [hidden, hidden], [0.01] * hidden * hidden))
        inits.append(helper.make_tensor(f"i{t}", TensorProto.INT64, [1], [t]))
        nodes += [
            helper.make_node("Gather", ["x", f"i{t}"], [f"xs{t}"], axis=1, name=f"slice{t}"),
            helper.make_node("Squeeze", [f"xs{t}", "axes1"], [f"x{t}"], name=f"sq{t}"),
            helper.make_node("MatMul", [h, f"w{t}"], [f"m{t}"], name=f"mm{t}"),
            helper.make_node("Add", [f"m{t}", f"x{t}"], [f"a{t}"], name=f"add{t}"),
            helper.make_node("Tanh", [f"a{t}"], [f"h{t + 1}" if t + 1 == steps else f"h{t + 1}_"], name=f"tanh{t}"),
        ]
        h = f"h{t + 1}" if t + 1 == steps else f"h{t + 1}_"
    graph = helper.make_graph(nodes, "scan", [x], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


@pytest.mark.slow
def test_more_devices_never_give_a_slower_best_plan(tmp_path):
    """``--devices 8,64`` on a scan with no repeated blocks, no memory left for any exact DP (the
    search degrades to NSGA-II on both): the best plan at 64 is no slower than the best at 8."""
    from objectives.cluster import make_cluster
    from planner.plan import PlanRequest, plan_file

    path = _scan_model(tmp_path / "scan.onnx")
    requests = [
        PlanRequest(cluster=make_cluster("a100-80gb", devices=n), max_memory_bytes=1.0, time_limit_s=8.0, method="dp")
        for n in (8, 64)
    ]
    _graph, (at_8, at_64) = plan_file(path, {}, requests, target="generic")
    assert any("NSGA-II" in note for note in at_64.cost.notes)
    best_8 = min(p.strategy.time_s for p in at_8.points)
    best_64 = min(p.strategy.time_s for p in at_64.points)
    assert best_64 <= best_8 * (1 + 1e-9)
