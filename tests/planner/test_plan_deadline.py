"""``--time-limit`` is one deadline from the start of a plan (issue 22): importing the model and pricing
pure data parallelism spend it first, the searches share what is left, and a plan the limit cut says
where its time went. Every figure here is read off a fake clock the test advances by hand, so nothing
depends on the machine's speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from planner import launchable
from planner.core.errors import InputError
from planner.plan import PlanRequest
from planner.search.budget import PlanDeadline

from .cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TestPlanDeadline:
    def test_each_phase_spends_the_deadline_and_a_nested_phase_counts_apart(self):
        clock = FakeClock()
        deadline = PlanDeadline(limit_s=60.0, clock=clock)
        with deadline.phase("import", cuttable=False):
            clock.now += 4.0
        assert deadline.left_s() == 56.0
        with deadline.phase("searches"):
            clock.now += 30.0
            with deadline.phase("import", cuttable=False):  # a micro-batch size imported during a search
                clock.now += 8.0
            clock.now += 2.0
        # 4 + 8 s of import, 30 + 2 s of search: 44 s spent of 60
        assert deadline.spent() == {"import": 12.0, "searches": 32.0}
        assert deadline.left_s() == 16.0 and deadline.elapsed_s() == 44.0

    def test_no_note_when_nothing_was_cut_and_the_plan_kept_its_limit(self):
        clock = FakeClock()
        deadline = PlanDeadline(limit_s=60.0, clock=clock)
        with deadline.phase("searches"):
            clock.now += 59.0
        assert deadline.spent_note() is None

    def test_the_note_names_each_phase_and_what_was_cut(self):
        clock = FakeClock()
        deadline = PlanDeadline(limit_s=20.0, clock=clock)
        with deadline.phase("import", cuttable=False):
            clock.now += 3.0
        with deadline.phase("baselines", cuttable=False):
            clock.now += 5.0
        with deadline.phase("searches"):
            clock.now += 14.0
        clock.now += 1.0  # outside any phase: "other"
        deadline.mark_cut("the searches")
        deadline.mark_cut("the searches")  # once
        # 3 + 5 + 14 + 1 = 23 s; the two fixed phases took 8 s, under the 20 s limit: not named
        assert deadline.spent_note() == (
            "--time-limit 20 s: import 3.0 s, baselines 5.0 s, searches 14 s, other 1.0 s, 23 s in all; "
            "the limit cut the searches"
        )

    def test_a_phase_no_limit_cuts_that_takes_it_all_is_named_and_the_plan_goes_on(self):
        clock = FakeClock()
        deadline = PlanDeadline(limit_s=5.0, clock=clock)
        with deadline.phase("import", cuttable=False):
            clock.now += 12.0
        # outlasting the limit is enough for the note, nothing need be cut
        assert deadline.spent_note() == (
            "--time-limit 5 s: import 12 s, 12 s in all; import, which no limit cuts, took 12 s alone"
        )

    def test_a_sweeps_next_plan_has_the_whole_limit_from_its_own_start(self):
        clock = FakeClock()
        first = PlanDeadline(limit_s=60.0, clock=clock)
        clock.now += 45.0
        second = first.restarted()
        assert first.left_s() == 15.0 and second.left_s() == 60.0 and second.spent() == {}

    @pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
    def test_the_limit_must_be_positive(self, bad):
        with pytest.raises(InputError, match="--time-limit"):
            PlanDeadline(limit_s=bad)


@pytest.fixture
def timed_plan(monkeypatch):
    """``plan_launchable_file`` on GPT-2 tiny (DeepSpeed, pp = 1, one search per plan) under a fake
    clock: importing the model takes ``import_s`` and pricing pure data parallelism 5 s of it;
    returns ``(frontiers, the searches' time shares, the deadline)``."""
    clock = FakeClock()
    shares: list[float] = []
    loader_of, dp_points, run = launchable._loader_of, launchable.data_parallel_points, launchable._Searches.run

    def plan(import_s: float, devices: tuple[int, ...] = (8,)):
        def slow_import(*args, **kwargs):
            clock.now += import_s
            return loader_of(*args, **kwargs)

        def slow_baselines(*args, zero, **kwargs):
            clock.now += 5.0 if zero == 0 else 0.0  # one call per ZeRO stage: 5 s for all of them
            return dp_points(*args, zero=zero, **kwargs)

        def recorded(self, cache, options, *args, **kwargs):
            shares.append(options.time_limit_s)
            return run(self, cache, options, *args, **kwargs)

        monkeypatch.setattr(launchable, "_loader_of", slow_import)
        monkeypatch.setattr(launchable, "data_parallel_points", slow_baselines)
        monkeypatch.setattr(launchable._Searches, "run", recorded)
        requests = [PlanRequest(cluster=make_cluster("a100-80gb", devices=n, devices_per_node=8), time_limit_s=60.0)
                    for n in devices]
        deadline = PlanDeadline(limit_s=60.0, clock=clock)
        _, frontiers = launchable.plan_launchable_file(
            TINY, {"seq": 32}, requests, global_batch=16, pipeline_sizes=(1,), launchers=("deepspeed",), deadline=deadline)
        return frontiers, shares, deadline

    return plan


class TestPhasesSpendTheLimit:
    def test_the_search_gets_what_the_import_and_the_baselines_left(self, timed_plan):
        frontiers, shares, deadline = timed_plan(50.0)
        # 60 - 50 s of import - 5 s of baselines = 5 s left: DeepSpeed's search (weight 1, its one
        # pipeline size, of 2 with the headroom search's) gets 2.5 s; the headroom search all that is
        # left, 5 s, for the fake clock stood still during the first search
        assert shares == [2.5, 5.0]
        assert deadline.spent()["import"] == 50.0 and deadline.spent()["baselines"] == 5.0
        assert frontiers[0].rows and frontiers[0].chosen is not None

    def test_past_the_limit_the_plan_still_answers_and_says_why(self, timed_plan):
        frontiers, shares, _ = timed_plan(70.0)
        # the import alone took the limit: the pure data-parallel rows (which fit) are the answer; the
        # DeepSpeed search would stop at its first check, so it does not start, nor the headroom search
        assert shares == []
        frontier = frontiers[0]
        assert frontier.rows and frontier.chosen is not None
        assert frontier.notes[-1] == (
            "--time-limit 60 s: import 70 s, baselines 5.0 s, 75 s in all; the limit cut 1 launcher search before "
            "starting, the headroom search; import and baselines, which no limit cuts, took 75 s alone"
        )

    def test_each_plan_of_a_sweep_has_the_limit_from_its_start(self, timed_plan):
        _, shares, _ = timed_plan(50.0, devices=(8, 4))
        # 8 devices: 60 - 50 - 5 = 5 s, half to DeepSpeed's search, then all to the headroom search;
        # 4 devices: a fresh 60 s less its own 5 s of baselines (the model is imported once, for both)
        assert shares == [2.5, 5.0, 27.5, 55.0]

    def test_the_searches_on_fewer_devices_share_the_plans_deadline(self, timed_plan, monkeypatch):
        # the pipelines on N / 8 devices and the plan on fewer devices are searched again by the
        # same call: they take what the first search left of the one deadline, not a limit each
        handed = []
        with_smaller_mesh = launchable._with_smaller_mesh

        def spy(frontier, search, *args):
            handed.append((search.keywords["deadline"], args[-1]))
            return with_smaller_mesh(frontier, search, *args)

        monkeypatch.setattr(launchable, "_with_smaller_mesh", spy)
        _, _, deadline = timed_plan(50.0)
        assert len(handed) == 1 and handed[0][0] is deadline and handed[0][1] is deadline


def test_a_tiny_time_limit_still_prints_a_plan_and_where_the_time_went():
    result = run_cli(["plan", TINY, "--dim", "batch=16", "--dim", "seq=32", "-n", "8", "--time-limit", "0.001"])
    assert "picked #" in result.stdout and "│   1" in result.stdout  # a table with its pick
    notes = [line for line in result.stdout.replace("\n", " ").split("note: ") if line.startswith("--time-limit 0.001 s:")]
    assert len(notes) == 1 and "import" in notes[0] and "in all" in notes[0]


def test_the_per_op_search_has_what_the_import_left(monkeypatch):
    # --target generic --method: the first plan's search has the limit less the import; a sweep's next
    # plan its whole limit
    from planner import plan as plan_module

    clock = FakeClock()
    deadline = PlanDeadline(limit_s=60.0, clock=clock)
    load_graph = plan_module.load_graph

    def slow_import(*args, **kwargs):
        clock.now += 50.0
        return load_graph(*args, **kwargs)

    monkeypatch.setattr(plan_module, "load_graph", slow_import)
    requests = [PlanRequest(cluster=make_cluster("a100-80gb", devices=n), time_limit_s=60.0) for n in (2, 4)]
    _, results = plan_module.plan_file(TINY, {"batch": 8, "seq": 32}, requests, with_targets=False, deadline=deadline)
    assert [r.request.time_limit_s for r in results] == [10.0, 60.0]
    assert all(r.points for r in results)
