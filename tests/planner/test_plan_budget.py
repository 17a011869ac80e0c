"""plan() within a time and memory budget: it degrades with a note, never fails (issue 15)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from planner.core.errors import InputError
from planner.plan import PlanRequest, load_graph, plan
from planner.search import budget as budget_module
from planner.search.pareto import pareto_mask

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpt2_graph():
    return load_graph(ROOT / "examples" / "gpt2.onnx", {"batch": 8, "seq": 64})


def _request(devices: int, **kwargs) -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=devices), **kwargs)


class TestRequest:
    @pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
    def test_time_limit_must_be_positive(self, bad):
        with pytest.raises(InputError, match="--time-limit"):
            _request(2, time_limit_s=bad)

    def test_max_memory_must_be_positive(self):
        with pytest.raises(InputError, match="--max-memory"):
            _request(2, max_memory_bytes=0.0)


class TestDegrades:
    def test_no_memory_left_gives_nsga2_rows_with_a_note(self, gpt2_graph):
        exact = plan(gpt2_graph, _request(4, epsilon=0.0), with_targets=False)
        squeezed = plan(gpt2_graph, _request(4, max_memory_bytes=1.0, time_limit_s=10.0), with_targets=False)
        assert any("NSGA-II" in note for note in squeezed.cost.notes)
        assert not squeezed.exact and squeezed.points
        # the baselines are real strategies the degraded search keeps: it is never slower than them
        # no memory left for the baselines' DPs either: they are skipped, and said so
        assert all(b.point is None for b in squeezed.baselines)
        assert any(note.startswith("search: baselines not priced") for note in squeezed.cost.notes)
        # and it never beats the exact frontier: every row is matched or dominated by an exact row
        for p in squeezed.points:
            assert any(
                q.strategy.time_s <= p.strategy.time_s * (1 + 1e-12)
                and q.strategy.memory_bytes <= p.strategy.memory_bytes * (1 + 1e-12)
                for q in exact.points
            )
        times = np.array([p.strategy.time_s for p in squeezed.points])
        memories = np.array([p.strategy.memory_bytes for p in squeezed.points])
        assert pareto_mask(times, memories).all()  # the rows are a Pareto set

    @pytest.fixture(scope="class")
    @classmethod
    def restricted(cls, gpt2_graph):
        """GPT-2 on 8 devices with a full DP predicted at 1 s per cell, past the 60 s limit: the ladder
        restricts the splits. No smaller mesh is searched (its embedded plan's rows would be kept by the
        restriction too), so every row is the degraded search's. Planned once for both tests."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(budget_module, "SECONDS_PER_CELL", 1e-4)
            patch.setattr("planner.plan._SMALLER_MESH_DIVISORS", ())
            return plan(gpt2_graph, _request(8), with_targets=False)

    def test_predicted_too_slow_restricts_configurations(self, restricted):
        result = restricted
        notes = " | ".join(result.cost.notes)
        assert "restricted configurations" in notes or "NSGA-II" in notes
        assert not result.exact
        if "restricted configurations" in notes:
            level = int(notes.split("splits at most ")[1].split(" ")[0])
            kept = [{b.point.strategy.choice[i] for b in result.baselines if b.point is not None} for i in range(len(result.spaces))]
            for index, p in enumerate(result.points):
                if index == result.chosen:
                    continue  # the exact pick searches the full tables: it may leave the restriction
                # each op: a row within the restriction, or one a baseline uses (the ladder keeps those)
                for i, (space, c) in enumerate(zip(result.spaces, p.strategy.choice)):
                    assert np.count_nonzero(space.factors[c] > 1) <= level or c in kept[i]

    def test_degraded_rows_are_never_slower_than_the_baselines(self, restricted):
        # the ladder keeps the baselines' configurations and lists the baselines themselves
        result = restricted
        baseline_times = [b.point.strategy.time_s for b in result.baselines if b.point is not None]
        assert baseline_times and not result.exact
        assert result.points[0].strategy.time_s <= min(baseline_times) * (1 + 1e-12)

    def test_exact_when_the_budget_allows(self, gpt2_graph):
        result = plan(gpt2_graph, _request(4), with_targets=False)
        assert not any(note.startswith("search:") for note in result.cost.notes)


class TestPipelineTimeLimit:
    def test_stops_after_the_first_points_and_says_which_sizes_were_left(self):
        from planner.pipeline import PipelineOptions, graph_loader, pipeline_search

        loader = graph_loader(ROOT / "tests" / "data" / "gpt2_tiny.onnx", {"seq": 16})
        cluster = make_cluster("a100-80gb", devices=8)
        full = pipeline_search(loader, cluster=cluster, options=PipelineOptions(global_batch=16, recompute=("none",)))
        # a limit already past when the search starts: it stops as soon as one point exists
        cut = pipeline_search(
            loader, cluster=cluster, options=PipelineOptions(global_batch=16, recompute=("none",), time_limit_s=1e-9)
        )
        note = next(note for note in cut.notes if "stopped at the time limit" in note)
        # the sizes it left, not the full frontier's (where each pp > 1 point of this tiny model holds a pipeline
        # neighbour's NCCL buffers and is dominated): pp = 2 is among them
        assert cut.points and "2" in note.split("pipeline sizes ")[1].split(" were")[0].split(", ")
        # what it found is real: each point is on, or dominated by, the full search's frontier
        for p in cut.points:
            assert any(q.time_s <= p.time_s * (1 + 1e-12) and q.memory_bytes <= p.memory_bytes * (1 + 1e-12) for q in full.points)

    def test_a_search_stops_at_the_limit_with_seeds_alone(self):
        # issue 25, "every elimination checks the time budget": the headroom search (informs=True)
        # is seeded with the pick and may find nothing better; past its limit it stops at once instead
        # of searching on until a point of its own (DeBERTa-v2 at 256 devices: 95 s of a 60 s limit).
        # A launcher's search seeded with a plan that fits does too (DeepSpeed after Megatron-LM on
        # GPT-3 175B at 1,024 devices: 48 s of a 24 s share)
        from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
        from planner.search.pipeline import search_pipeline

        loader = graph_loader(ROOT / "tests" / "data" / "gpt2_tiny.onnx", {"seq": 16})
        cluster = make_cluster("a100-80gb", devices=8)
        options = PipelineOptions(global_batch=16, recompute=("none",), time_limit_s=1e-9)
        seeds = [(1e-9, 1.0)]  # dominates every plan: no point of the search's own survives
        for informs in (True, False):
            # a seed within the memory limit is the table's pick already: a launcher's search stops too
            stops = search_pipeline(PipelineCostCache(loader, cluster=cluster), options=options, seeds=seeds,
                                    informs=informs)
            assert not stops.points and stops.combinations == 0
            assert any("stopped at the time limit" in note for note in stops.notes)
        # a seed over the limit (80 GB) gives no pick: a launcher's search goes on to its first point
        over = [(1e-9, 1e15)]
        goes_on = search_pipeline(PipelineCostCache(loader, cluster=cluster), options=options, seeds=over)
        stops = search_pipeline(PipelineCostCache(loader, cluster=cluster), options=options, seeds=over, informs=True)
        assert goes_on.points and goes_on.combinations > 0 and stops.combinations == 0

    def test_a_cut_in_the_last_slot_is_noted(self, monkeypatch):
        # one pipeline size and one micro-batch size: one (pp, batch) slot, cut after its first
        # (recompute, ZeRO) group. The cut used to be silent (notes empty: a partial frontier shown as
        # complete) since only the next slot's check noted it, and there is none
        from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
        from planner.search import pipeline as search_module

        loader = graph_loader(ROOT / "tests" / "data" / "gpt2_tiny.onnx", {"seq": 16})
        cluster = make_cluster("a100-80gb", devices=1)
        options = PipelineOptions(global_batch=16, micro_batch=2, pipeline_sizes=(1,), recompute=("none", "full"),
                                  time_limit_s=5.0)
        clock = [0.0]
        monkeypatch.setattr(search_module.time, "perf_counter", lambda: clock[0])
        search_group = search_module._Slot._search_group

        def late_after(slot, *args, **kwargs):
            search_group(slot, *args, **kwargs)
            clock[0] = 10.0  # past the 5 s limit once the first group is searched

        monkeypatch.setattr(search_module._Slot, "_search_group", late_after)
        cut = search_module.search_pipeline(PipelineCostCache(loader, cluster=cluster), options=options)
        assert cut.points and {p.recompute for p in cut.points} == {"none"}
        assert any("stopped at the time limit" in note and "sizes 1 were" in note for note in cut.notes)

    # the searches of one plan share its limit, the import included: tests/planner/test_plan_deadline.py

    def test_time_limit_must_be_positive(self):
        from planner.pipeline import PipelineOptions

        with pytest.raises(InputError, match="--time-limit"):
            PipelineOptions(global_batch=16, time_limit_s=0.0)
