"""bench/scale_plan.py's comparison of two ``planner plan --json`` answers: equal but for every ``search_time_s``
(the one field a faster tree may change), else the first path where they part, by hand on small answers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "scale_plan.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scale_plan", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up by name
    spec.loader.exec_module(module)
    return module


def _answer(step_s: float, search_s: float, rows: int = 2) -> dict:
    return {"chosen_rank": 1, "rows": [{"step_time_s": step_s * (i + 1)} for i in range(rows)],
            "search": {"search_time_s": search_s, "combinations": 12}}


def test_answers_equal_but_their_search_time(bench):
    ours, theirs = bench.comparable(_answer(0.5, 1.0)), bench.comparable(_answer(0.5, 7.0))
    assert "search_time_s" not in ours["search"] and ours["search"]["combinations"] == 12
    assert bench.first_difference(ours, theirs) is None


def test_the_first_difference_is_named_by_its_path(bench):
    ours, theirs = bench.comparable(_answer(0.5, 1.0)), bench.comparable(_answer(0.5, 1.0))
    theirs["rows"][1]["step_time_s"] = 1.0000000000000002  # one bit off 2 x 0.5
    assert bench.first_difference(ours, theirs) == "$.rows[1].step_time_s (1.0 against 1.0000000000000002)"
    assert bench.first_difference(ours, bench.comparable(_answer(0.5, 1.0, rows=3))) == "$.rows (2 items against 3)"
    assert bench.first_difference({"a": 1}, {"a": 1.0}) == "$.a (1 against 1.0)"  # an int is not its float
    assert bench.first_difference({"a": 1}, {"b": 1}) == "$.a (only in ours)"


def test_a_named_case_runs_this_tree_s_model_with_json(bench):
    words = bench.plan_args("gpt2", None)
    assert words[0] == "plan" and words[1] == str(bench.ROOT / "examples" / "gpt2.onnx")
    assert words[-2:] == ["--json", "-q"] and words[words.index("-n") + 1] == "16"
    with pytest.raises(SystemExit, match="must start with 'plan'"):
        bench.plan_args(None, "estimate examples/gpt2.onnx")
