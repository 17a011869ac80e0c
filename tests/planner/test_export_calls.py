"""``plan --pick --export`` runs no exporter more than once per exported row (issue 17).

The table's targets column comes from each target's families (mask membership), and a refusal's
nearest runnable plan from the cost tables the plan built; only the exported row meets an exporter.
Every exporter in the registry is wrapped with a counter.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from exporters.targets import TARGETS
from tests.planner.cli_helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
GPT2 = DATA / "gpt2_tiny.onnx"


@pytest.fixture
def calls(monkeypatch):
    counted: Counter[str] = Counter()
    for name, target in list(TARGETS.items()):

        def counting(plan_input, _export=target.export, _name=name):
            counted[_name] += 1
            return _export(plan_input)

        monkeypatch.setitem(TARGETS, name, dataclasses.replace(target, export=counting))  # type: ignore[index]
    return counted


@pytest.mark.parametrize("export", ["megatron", "dtensor", "generic"])
def test_one_exporter_call_for_the_exported_row(calls, export, tmp_path):
    out = tmp_path / "plan.json"
    run_cli(["plan", GPT2, "-n", "4", "--dim", "batch=8", "--dim", "seq=32", "-q", "--pick", "1",
             "--export", export, "-o", out])
    assert dict(calls) == {export: 1}
    assert json.loads(out.read_text())["target"] == export if export != "generic" else out.exists()


def test_a_refusal_calls_its_exporter_once_and_names_the_nearest_plan(calls):
    # --zero 1: Mesh-TF has no ZeRO, so it refuses every row; its nearest plan comes from the tables
    result = run_cli(["plan", GPT2, "-n", "4", "--dim", "batch=8", "--dim", "seq=32", "-q", "--zero", "1",
                      "--pick", "1", "--export", "meshtf"], expected_exit_code=2)
    assert dict(calls) == {"meshtf": 1}
    assert "Mesh-TensorFlow has no ZeRO sharding" in result.stderr


def test_the_nearest_plan_is_the_target_restricted_search_pick(calls):
    """A refused row names the plan a whole search over Megatron's families picks (the oracle:
    ``plan(..., target_filter=...)``, as ``export`` did before issue 17), found here on the tables
    already built, with no more exporter calls."""
    from objectives.cluster import make_cluster
    from planner.core.units import format_bytes, format_seconds
    from planner.export import target_filter
    from planner.plan import PlanRequest, load_graph, plan

    args = ["plan", GPT2, "-n", "4", "--dim", "batch=8", "--dim", "seq=32", "-q"]
    rows = json.loads(run_cli([*args, "--json"]).stdout)["points"]
    refused = next(i for i, p in enumerate(rows) if "megatron" not in p["targets"])
    result = run_cli([*args, "--pick", str(refused + 1), "--export", "megatron"], expected_exit_code=2)
    assert dict(calls) == {"megatron": 1}
    graph = load_graph(GPT2, {"batch": 8, "seq": 32})
    oracle = plan(graph, PlanRequest(cluster=make_cluster("a100-80gb", devices=4)), target_filter=target_filter("megatron"),
                  with_targets=False)
    best = oracle.best.strategy
    line = (f"nearest expressible plan: {oracle.best.summary}, {format_seconds(best.time_s)}/step, "
            f"{format_bytes(best.memory_bytes)}/device (plan with --target megatron)")
    assert line in result.stderr


def test_the_targets_column_runs_no_exporter(calls):
    result = run_cli(["plan", GPT2, "-n", "4", "--dim", "batch=8", "--dim", "seq=32", "-q", "--json"])
    points = json.loads(result.stdout)["points"]
    assert len(points) > 1 and any(len(p["targets"]) > 1 for p in points)
    assert sum(calls.values()) == 0


def test_the_pipeline_table_runs_no_exporter_and_exports_once(calls, tmp_path):
    # --global-batch: the targets column (masks and stage rules) and --target run no exporter; the
    # exported row meets its exporter once
    args = ["plan", GPT2, "-n", "8", "--dim", "seq=32", "--global-batch", "16", "-q", "--target", "megatron"]
    points = json.loads(run_cli([*args, "--json"]).stdout)["points"]
    assert points and all("megatron" in p["targets"] for p in points)
    assert sum(calls.values()) == 0
    out = tmp_path / "megatron.json"
    run_cli([*args, "--pick", "1", "--export", "megatron", "-o", out])
    assert dict(calls) == {"megatron": 1}
    assert json.loads(out.read_text())["target"] == "megatron"
