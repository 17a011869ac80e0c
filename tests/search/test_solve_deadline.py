"""Issue 22 / 25, "--time-limit bounds the wall clock": a pipeline search's per-stage intra-op DPs stop at
the search's deadline (:mod:`planner.search.solve_clock`). Before, a DP ran to its end once started (its own
cap, 30 s of predicted CPU, was the only bound): the headroom search on Mamba-2 at 32 devices started one
with 0.3 s of its share left and took 14.7 s, and the plan 175.6 s under ``--time-limit 60`` at a load of 22.

No timed assertion: a fake clock advances one second per elimination step, so "past the deadline" is a
count of steps, the same on any machine."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from planner.search import elimination, solve_clock
from planner.search import pipeline as pipeline_search
from planner.search.synthetic import chain_tables

DATA = Path(__file__).resolve().parents[1] / "data"


class _Cache:
    """What ``pipeline._solve`` reads of a ``PipelineCostCache``: its plan memo (no caps: the defaults)."""

    def __init__(self) -> None:
        self.plans: dict = {}
        self.max_memory_bytes = None
        self.max_solve_s = None


class _SteppedClock:
    """``time.perf_counter`` plus one second per elimination step run (``elimination._eliminate``), each
    step's start recorded on it: the steps a DP runs are its only clock that moves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = time.perf_counter
        self.offset_s = 0.0
        self.step_starts: list[float] = []
        eliminate = elimination._eliminate

        def stepped(*args, **kwargs):
            self.step_starts.append(self())
            self.offset_s += 1.0
            return eliminate(*args, **kwargs)

        monkeypatch.setattr(time, "perf_counter", self)
        monkeypatch.setattr(elimination, "_eliminate", stepped)

    def __call__(self) -> float:
        return self.real() + self.offset_s


def _tables():
    """A chain of 12 ops with 6 configurations each and a few skip edges: a DP of 12 elimination steps."""
    return chain_tables([6] * 12, seed=5, extra_edges=[(0, 3), (2, 6), (5, 9), (7, 11)])


class TestTheDPStopsAtTheSearchDeadline:
    def test_no_dp_starts_past_the_deadline(self, monkeypatch):
        """The deadline passed before the DP: it is not run (not one step), the heuristic answers and is counted."""
        clock = _SteppedClock(monkeypatch)
        cache, tables = _Cache(), _tables()
        choice = solve_clock.run_until(time.perf_counter() - 1.0, pipeline_search._solve, cache, tables, (), ())
        assert clock.step_starts == []
        assert choice is not None and np.isfinite(tables.evaluate(choice)[0])
        assert cache.plans[pipeline_search._DEGRADED] == 1

    def test_a_dp_stops_at_the_first_step_past_the_deadline(self, monkeypatch):
        """The deadline 2.5 s (steps) in: steps start at 0, 1 and 2 s, none at 3 s; the heuristic answers."""
        clock = _SteppedClock(monkeypatch)
        cache, tables = _Cache(), _tables()
        deadline_s = time.perf_counter() + 2.5
        choice = solve_clock.run_until(deadline_s, pipeline_search._solve, cache, tables, (), ())
        assert len(clock.step_starts) == 3 and all(start <= deadline_s for start in clock.step_starts)
        assert choice is not None and np.isfinite(tables.evaluate(choice)[0])
        assert cache.plans[pipeline_search._DEGRADED] == 1

    def test_without_a_deadline_the_dp_is_exact(self, monkeypatch):
        """Outside a bounded search (or under a generous limit) every step runs and the DP's optimum stands:
        the same choice as ``solve_min``, not the heuristic's."""
        clock = _SteppedClock(monkeypatch)
        cache, tables = _Cache(), _tables()
        choice = pipeline_search._solve(cache, tables, (), ())
        generous = solve_clock.run_until(time.perf_counter() + 36000.0, pipeline_search._solve, _Cache(), tables, (), ())
        exact = elimination.solve_min(tables)
        assert len(clock.step_starts) >= 2 * tables.num_ops  # both DPs ran every step (solve_min's too)
        assert choice.tolist() == generous.tolist() == exact.choice.tolist()
        assert pipeline_search._DEGRADED not in cache.plans


class TestTheSearchStopsItsDPs:
    def test_a_headroom_search_runs_no_step_past_its_deadline(self, monkeypatch):
        """The launchable table's headroom search (no launcher's rules, it only informs, seeded) on GPT-2 tiny at
        8 devices with a limit of 2.5 s of steps: before, its first combination's DP ran all its steps past the
        deadline (the search checks only between combinations); now none starts past it, the search stops
        there and says so (the pipeline sizes it did not search, the heuristic that answered)."""
        from objectives.cluster import make_cluster
        from objectives.pipeline_cost import PipelineCostCache
        from planner.core.settings import TrainingSettings
        from planner.pipeline import PipelineOptions, graph_loader

        monkeypatch.setattr(pipeline_search, "solve_by_enumeration", lambda tables, **kwargs: None)  # every choice a DP
        loader = graph_loader(DATA / "gpt2_tiny.onnx", {"seq": 64})
        cluster = make_cluster("a100-80gb", devices=8, devices_per_node=8)
        cache = PipelineCostCache(loader, cluster=cluster, settings=TrainingSettings())
        options = PipelineOptions(global_batch=16, time_limit_s=2.5, fill_pipeline=False)
        clock = _SteppedClock(monkeypatch)
        started = time.perf_counter()
        result = pipeline_search.search_pipeline(cache, options=options, seeds=[(1.0, 0.0)], informs=True)
        past = [start for start in clock.step_starts if start > started + 2.5]
        assert clock.step_starts and past == []
        assert result.unsearched_sizes  # it stopped at the deadline
        assert any("heuristic answered" in note for note in result.notes)
