"""The per-op research search (``--target generic --method ...``) answers with the launchable
table's result type (:mod:`planner.research`): each frontier point is a launchable row (``pp = 1``,
one micro-batch of the whole batch, the request's ZeRO stage and recomputation, launcher
``generic``), written by the same JSON code, and a row re-priced from its public form gives the
seconds and bytes the table reports.

Oracles: the research search's own points (:func:`planner.plan.plan`), and :func:`planner.plan.evaluate`,
which rebuilds the cost model and finds each op's row from its public form alone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from planner.core.settings import TrainingSettings
from planner.launchable import export_row
from planner.plan import PlanRequest, evaluate, load_graph, plan
from planner.render import launch_json
from planner.research import research_frontier
from tests.objectives.graphs import gpt2_like
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.onnx"
GPT2_TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"


def _request(devices: int, per_node: int, **kwargs) -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=per_node), **kwargs)


@pytest.mark.parametrize("devices,per_node", [(4, 4), (4, 2), (8, 4)], ids=["one-node", "two-nodes", "8-on-2"])
def test_research_rows_reprice_from_their_public_form(devices: int, per_node: int):
    """Every row's JSON public form (splits, inter-node parts, copies) priced again by ``evaluate``
    gives the row's step time and memory per device; the rows are the research points, in order."""
    graph = gpt2_like(layers=1, hidden=16, heads=2, vocab=64, positions=8, batch=4, seq=8)
    request = _request(devices, per_node, settings=TrainingSettings(zero_stage=1, recompute="full"))
    result = plan(graph, request, with_targets=False)
    data = launch_json(research_frontier(result), model=graph.name)
    assert len(data["rows"]) == len(result.points) > 1
    assert data["chosen_rank"] == result.chosen + 1
    copies = placed = 0
    for row, point in zip(data["rows"], result.points):
        assert (row["step_time_s"], row["memory_per_device_bytes"]) == (point.strategy.time_s, point.strategy.memory_bytes)
        again = evaluate(graph, request, row["splits"], row["inter_node_splits"], row["replicas"])
        assert again.choice == point.strategy.choice
        assert again.time_s == pytest.approx(row["step_time_s"], rel=1e-12)
        assert again.memory_bytes == pytest.approx(row["memory_per_device_bytes"], rel=1e-12)
        copies += bool(row["replicas"])
        placed += bool(row["inter_node_splits"])
        # the launchable row's knobs: one stage, the whole batch in one micro-batch, the request's settings
        assert (row["pp"], row["micro_batches"], row["global_batch"]) == (1, 1, 4)
        assert (row["zero_stage"], row["recompute"], row["targets"]) == (1, "full", ["generic"])
        assert row["micro_batch"] == 4 // row["degrees"]["dp"]
        assert row["speedup_vs_dp"] == pytest.approx(point.speedup_vs_dp, rel=1e-12)
    assert copies > 0  # some row runs an op as redundant copies
    assert placed > 0 or per_node == devices  # on two nodes some row places a split across them


def test_research_degrees_are_named_as_the_launchable_rows_name_them():
    """A row's degrees are the dominant ones by FLOPs (``planner.families.dominant_degrees``): the
    product never exceeds the devices, ``pp = 1``, and the layout names the same dp."""
    graph = gpt2_like(layers=2, hidden=32, heads=4, vocab=64, positions=16, batch=8, seq=16)
    result = plan(graph, _request(8, 8, method="frontier"), with_targets=False)
    data = launch_json(research_frontier(result), model=graph.name)
    for row in data["rows"]:
        degrees = row["degrees"]
        assert degrees["pp"] == 1 and degrees["ep"] == 1
        assert degrees["dp"] * degrees["tp"] * degrees["cp"] <= 8
        if degrees["dp"] > 1:
            assert f"dp={degrees['dp']}" in row["layout"]


def test_the_json_shape_is_the_launchable_one():
    """The research table's JSON has the launchable table's keys, top level and per row (the
    launchable search's optional keys aside), and its own data under ``extras``."""
    common = ["plan", MLP, "--dim", "batch=8", "-n", "2", "--json", "-q"]
    launchable = json.loads(run_cli(common).stdout)
    research = json.loads(run_cli([*common, "--target", "generic", "--method", "frontier"]).stdout)
    assert set(research) == set(launchable)
    optional = {"offload", "hsdp_shard", "run"}
    assert {k for row in research["rows"] for k in row} == {k for row in launchable["rows"] for k in row} - optional
    assert set(research["baseline_data_parallel"]) == set(launchable["baseline_data_parallel"])
    assert research["launchers"] == ["generic"] and launchable["extras"] == {}
    extras = research["extras"]
    assert extras["method"] == "frontier" and extras["epsilon"] == pytest.approx(0.01)
    assert extras["baselines"]["data_parallel"]["step_time_s"] == research["baseline_data_parallel"]["step_time_s"]


def test_a_research_row_exports_through_the_launchable_export_path(tmp_path):
    """``export_row`` on a research row writes its per-op plan (no pipeline section): the API's
    ``export_row`` and the CLI's ``--pick 2 --export generic`` give the same document, and
    ``explain`` prices it to the row's seconds."""
    import exporters

    graph = load_graph(GPT2_TINY, {"batch": 8, "seq": 16})
    request = _request(4, 4, settings=TrainingSettings(engine="fused", attention="flash"), method="dp")
    frontier = research_frontier(plan(graph, request))
    document = export_row(frontier, 1, "generic")
    assert document["pipeline"] is None
    assert document["objectives"]["time_s"] == frontier.rows[1].time_s
    out = tmp_path / "plan.json"
    run_cli(["plan", GPT2_TINY, "--dim", "batch=8", "--dim", "seq=16", "-n", "4", "--target", "generic", "--method",
             "dp", "--pick", "2", "--export", "generic", "-o", out, "-q"])  # fmt: skip
    written = json.loads(out.read_text())
    assert written["ops"] == document["ops"]
    assert written["objectives"]["time_s"] == pytest.approx(frontier.rows[1].time_s, rel=1e-12)
    explained = json.loads(run_cli(["explain", out, "--json"]).stdout)
    assert explained["time_s"] == pytest.approx(frontier.rows[1].time_s, rel=1e-12)
    assert exporters.read_plan(out).pipeline is None


def test_the_table_is_the_launchable_table():
    """The research table prints the launchable table's columns, the data-parallel baseline line,
    and its own lines (other baselines, the method) as notes."""
    args = ["plan", GPT2_TINY, "--dim", "batch=8", "--dim", "seq=16", "-n", "4", "--target", "generic", "--method", "dp"]
    table = run_cli(args).stdout
    words = " ".join(table.split())
    for column in ("step time", "samples/s", "memory/device", "layout", "mb", "ZeRO", "recompute", "launchers"):
        assert column in words
    assert "baseline data parallel (dp=4" in words
    assert "note: research search: dp (exact)" in words
    assert "picked #" in words
    assert "targets" not in words  # the research renderer's column is gone


def test_moe_rows_carry_their_expert_degree():
    """An MoE point's own settings (its searched ``ep``) are the row's: degrees and execution."""
    graph = gpt2_like(layers=1, hidden=16, heads=2, vocab=64, positions=8, batch=4, seq=8)
    request = _request(4, 4)
    result = plan(graph, request, with_targets=False)
    point = result.points[0]
    tagged = dataclasses.replace(result, points=(dataclasses.replace(
        point, settings=dataclasses.replace(request.settings, expert_parallel=2)),))  # fmt: skip
    row = research_frontier(tagged).rows[0]
    assert row.degrees.ep == 2 and row.cache.settings.expert_parallel == 2
    assert row.plan_input is not None and row.plan_input.settings.expert_parallel == 2


def test_a_run_is_priced_on_research_rows_by_hand():
    """``--tokens`` prices the research rows as it prices the launchable ones: 1e9 tokens / (8 samples
    x 16 tokens) = 7,812,500 steps, each row's step time, billed for the whole cluster (4 devices)."""
    args = ["plan", GPT2_TINY, "--dim", "batch=8", "--dim", "seq=16", "-n", "4", "--target", "generic", "--method",
            "frontier", "--tokens", "1B", "--price-per-gpu-hour", "2", "--json", "-q"]  # fmt: skip
    data = json.loads(run_cli(args).stdout)
    steps = 10**9 // (8 * 16)
    assert steps * 8 * 16 == 10**9 and data["run"]["tokens_per_sample"] == 16
    for row in data["rows"] + [data["baseline_data_parallel"]]:
        seconds = steps * row["step_time_s"]
        assert row["run"]["steps"] == steps and row["run"]["devices"] == 4
        assert row["run"]["days"] == pytest.approx(seconds / 86_400, rel=1e-12)
        assert row["run"]["cost_usd"] == pytest.approx(seconds * 4 / 3_600 * 2, rel=1e-12)
