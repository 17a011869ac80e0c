"""bench/frontier_digest.py's ``launch/`` cases digest the table ``planner plan`` prints (issue 22 "frontier
digests are checked before and after"): each row's step time and memory to the bit, in the CLI's order, with the
CLI's pick and fastest ranks. The CLI's ``--json`` is the independent path (its own request, search and
rendering). The cases are opt-in, so the default output other trees are diffed against keeps its case list."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
GPT2_TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_frontier_digest", ROOT / "bench" / "frontier_digest.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_launch_digest_is_the_cli_table(bench):
    # one device: no NCCL buffers, so micro-batch, ZeRO and recompute trade time for memory (12 rows)
    record = bench._launch_case(GPT2_TINY, {"batch": 8, "seq": 128}, 1)
    answer = json.loads(run_cli(["plan", GPT2_TINY, "-n", "1", "--dim", "batch=8", "--dim", "seq=128",
                                 "--time-limit", "3600", "--json"]).stdout)
    rows = answer["rows"]
    assert len(record["points"]) == len(rows) > 1
    assert [float(p[0]) for p in record["points"]] == [r["step_time_s"] for r in rows]
    assert [float(p[1]) for p in record["points"]] == [r["memory_per_device_bytes"] for r in rows]
    assert [p[3].split(" [")[0] for p in record["points"]] == [r["summary"] for r in rows]
    assert record["chosen"] + 1 == answer["chosen_rank"]
    assert len({p[2] for p in record["points"]}) == len(rows)  # every listed plan digests apart


def test_launch_cases_are_opt_in(bench):
    assert not [name for name, _ in bench.cases() if name.startswith("launch/")]
    assert [name for name, _ in bench.launch_cases()] == ["launch/gpt2/16/16GB", "launch/llama/16"]
