"""`planner plan --global-batch`: picking and exporting rows of the launchable frontier (pipelines
among them), --target, the pipeline options, saved pipeline plans re-exported, and `planner estimate`
with a schedule and a stage split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.validate import parse_megatron_args, parse_pipeline_layout
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "examples" / "gpt2.onnx"
BASE = ["plan", GPT2, "--dim", "batch=8", "--dim", "seq=128", "-n", "4", "--global-batch", "16", "-q"]
# The same launchable-table command on the 2-layer GPT-2 and 2 devices (25 rows, the leanest 880.83 KiB a
# device): the refusals that need a table but not BASE's, at about half its search.
TINY = ["plan", ROOT / "tests" / "data" / "gpt2_tiny.onnx", "--dim", "batch=8", "--dim", "seq=128", "-n", "2",
        "--global-batch", "16", "-q"]


def _megatron_layers_per_rank(args: dict) -> list[int]:
    """Layers Megatron-LM puts on each pipeline rank for these flags (transformer_block.get_num_layers_to_build)."""
    pp, layers = args["pipeline-model-parallel-size"], args["num-layers"]
    if "pipeline-model-parallel-layout" in args:
        stages = parse_pipeline_layout(args["pipeline-model-parallel-layout"])
        return [sum(stage.count("t") for stage in stages[rank::pp]) for rank in range(pp)]
    first, last = args.get("decoder-first-pipeline-num-layers"), args.get("decoder-last-pipeline-num-layers")
    middle_stages = pp - (first is not None) - (last is not None)
    middle = (layers - (first or 0) - (last or 0)) // middle_stages if middle_stages else 0
    counts = [middle] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def _run_recorded(args: list) -> tuple:
    """``run_cli(args)`` and the one launchable frontier the command rendered (its rows, for ``export_row``)."""
    import planner.launchable as launchable

    seen = []

    def recorded(*args, **kwargs):
        warnings, frontiers = plan_launchable_file(*args, **kwargs)
        seen.extend(frontiers)
        return warnings, frontiers

    plan_launchable_file = launchable.plan_launchable_file
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launchable, "plan_launchable_file", recorded)
        result = run_cli(args)
    assert len(seen) == 1
    return result, seen[0]


@pytest.fixture(scope="module")
def frontier(tmp_path_factory):
    """The JSON frontier, row 1 saved as a generic plan, and the frontier object the command rendered."""
    path = tmp_path_factory.mktemp("pipeline") / "plan.json"
    result, rendered = _run_recorded([*BASE, "--json", "--pick", "1", "--export", "generic", "-o", path])
    return json.loads(result.stdout), path, rendered


def _row(data, target: str, runnable: bool = True) -> int:
    for row in data["rows"]:
        if (target in row["targets"]) == runnable:
            return row["rank"]
    pytest.skip(f"no frontier row {'runnable' if runnable else 'unrunnable'} by {target}")


class TestPlanExport:
    def test_every_row_lists_its_targets(self, frontier):
        from planner.launchable import export_row

        data, _, rendered = frontier
        assert data["rows"] and data["launchers"]
        assert [row["step_time_s"] for row in data["rows"]] == [row.time_s for row in rendered.rows]
        for index, row in enumerate(data["rows"]):
            assert row["targets"] and set(row["targets"]) <= set(data["launchers"]), row["rank"]
            for target in row["targets"]:  # each launcher it lists exports it
                document = export_row(rendered, index, target)
                assert document, (row["rank"], target)

    def test_saved_plan_is_the_picked_row(self, frontier):
        data, path, _ = frontier
        assert data["fastest_rank"] == 1  # saved with --pick 1; the pick (*) may be a row tied with it (planner.pick)
        row, saved = data["rows"][0], json.loads(path.read_text())
        section = saved["pipeline"]
        assert (section["pp"], section["layers_per_stage"], section["micro_batch"], section["micro_batches"]) == (
            row["pp"], row["layers_per_stage"], row["micro_batch"], row["micro_batches"]
        )
        assert (section["zero_stage"], section["recompute"], section["global_batch"]) == (row["zero_stage"], row["recompute"], 16)
        assert saved["objectives"]["time_s"] == pytest.approx(row["step_time_s"], rel=1e-12)
        assert saved["mesh"]["pp"] == row["pp"] and saved["batch"]["grad_accum"] == row["micro_batches"]

    def test_megatron_export_of_a_row(self, frontier):
        """The row's Megatron-LM export, as ``plan --pick RANK --export megatron`` writes it (``export_row`` of the
        table the command rendered), from the fixture's search: a second search of the same command could list
        other rows where its time limit cut it (a loaded machine), and the CLI's --pick of a row past the first
        is TestOptions.test_target_restricts_the_search's."""
        from planner.launchable import export_row

        data, _, rendered = frontier
        rank = _row(data, "megatron")
        row = data["rows"][rank - 1]
        document = json.loads(json.dumps(export_row(rendered, rank - 1, "megatron")))
        args = parse_megatron_args(document["args"])
        assert args["pipeline-model-parallel-size"] == row["pp"] and args["tensor-model-parallel-size"] == row["tp"]
        assert (args["micro-batch-size"], args["global-batch-size"]) == (row["micro_batch"], 16)
        assert _megatron_layers_per_rank(args) == row["layers_per_stage"]
        assert document["world_size"] == 4 and document["batch"]["num_microbatches"] == row["micro_batches"]

    def test_saved_pipeline_plan_re_exports(self, frontier, tmp_path):
        data, path, _ = frontier
        row = data["rows"][0]
        if "megatron" in row["targets"]:
            out = tmp_path / "m.json"
            run_cli(["export", path, "--format", "megatron", "-o", out])
            args = parse_megatron_args(json.loads(out.read_text())["args"])
            assert _megatron_layers_per_rank(args) == row["layers_per_stage"]
        if "deepspeed" in row["targets"]:
            result = run_cli(["export", path, "--format", "deepspeed"])
            config = json.loads(result.stdout)["ds_config"]
            assert (config["train_batch_size"], config["gradient_accumulation_steps"]) == (16, row["micro_batches"])
            assert config["pipeline"]["stages"] == row["pp"]
        if row["pp"] > 1:  # Mesh-TensorFlow runs neither pipelines nor Megatron's recomputed MLP: the first rule broken
            result = run_cli(["export", path, "--format", "meshtf"], 2)
            # (since the tie rule, 2026-12-02, the row may be a sequence-parallel one, whose memory Mesh-TF's does not hold)
            reason = ("not 'mlp'" if row["recompute"] == "mlp" else "keeps the gathered sequence-parallel input"
                      if row["layout"].endswith(" sp") else "no pipeline parallelism")
            assert reason in result.stderr and result.stderr.count("\n") == 1
        # explain prices the saved row again, stages and all: the row's seconds and bytes
        explained = json.loads(run_cli(["explain", path, "--json"]).stdout)
        assert explained["pp"] == row["pp"] and explained["layers_per_stage"] == row["layers_per_stage"]
        assert explained["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-9)
        assert explained["memory_per_device_bytes"] == pytest.approx(row["memory_per_device_bytes"], rel=1e-9)

    def test_refusal_names_the_nearest_runnable_row(self, frontier):
        data, _, _ = frontier
        # a launcher that runs some rows and not others (every row here is a launcher's)
        target = next((name for name in data["launchers"]
                       if any(name in row["targets"] for row in data["rows"])
                       and not all(name in row["targets"] for row in data["rows"])), None)  # fmt: skip
        if target is None:
            pytest.skip("every launcher runs every row or none")
        rank = _row(data, target, runnable=False)
        nearest = next(row["rank"] for row in data["rows"] if target in row["targets"] and row["fits"])
        result = run_cli([*BASE, "--pick", rank, "--export", target], 2)
        assert "nearest expressible plan: row" in result.stderr and f"(--pick {nearest})" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1

    def test_pick_out_of_range(self):
        result = run_cli([*TINY, "--pick", "99", "--export", "megatron"], 2)
        assert "--pick 99 is out of range" in result.stderr

    def test_nothing_fits(self):
        result = run_cli([*TINY, "--mem-limit", "100KB", "--export", "megatron"], 2)
        assert "nothing fits to export" in result.stderr


class TestOptions:
    def test_target_keeps_rows_it_runs(self):
        data = json.loads(run_cli([*BASE, "--target", "deepspeed", "--json"]).stdout)
        assert data["rows"] and all("deepspeed" in row["targets"] for row in data["rows"])
        assert data["launchers"] == ["deepspeed"]  # only DeepSpeed's plans were searched

    def test_target_restricts_the_search(self, tmp_path):
        # 8 devices: the unrestricted frontier is all "mixed" there, the restricted one must not be empty
        base = ["plan", GPT2, "--dim", "seq=128", "-n", "8", "--global-batch", "16", "-q", "--target", "megatron"]
        # the table and the fastest row's export from one run (one search); the leanest row's as `--pick` would
        # export it from that table (export_row of the rendered frontier), not from a second search of the same command
        from planner.launchable import export_row

        result, rendered = _run_recorded([*base, "--json", "--pick", 1, "--export", "megatron",
                                          "-o", tmp_path / "row1.json"])
        data = json.loads(result.stdout)
        points = data["rows"]
        assert points and all("megatron" in p["targets"] for p in points)
        assert data["launchers"] == ["megatron"]  # only Megatron-LM's plans were searched
        assert [p["step_time_s"] for p in points] == [row.time_s for row in rendered.rows]
        for rank in sorted({1, len(points)}):  # the fastest row's export from the CLI, the leanest row's from its table
            row = points[rank - 1]
            out = tmp_path / f"row{rank}.json"
            if rank > 1:
                out.write_text(json.dumps(export_row(rendered, rank - 1, "megatron")))
            document = json.loads(out.read_text())
            args = parse_megatron_args(document["args"])
            assert args["pipeline-model-parallel-size"] == row["pp"] and args["tensor-model-parallel-size"] == row["tp"]
            assert (args["micro-batch-size"], args["global-batch-size"]) == (row["micro_batch"], 16)
            assert _megatron_layers_per_rank(args) == row["layers_per_stage"] and document["world_size"] == 8

    def test_target_help_says_it_restricts_the_search(self):
        import typer.main

        from planner.cli import app

        run_cli(["plan", "--help"])
        command = typer.main.get_command(app).commands["plan"]
        (option,) = [param for param in command.params if "--target" in param.opts]
        assert option.help.startswith("List only the plans this launcher runs")

    def test_pp_schedule_and_chunks(self):
        data = json.loads(run_cli([*BASE, "--pp", "2", "--schedule", "interleaved", "--chunks", "2", "--json"]).stdout)
        assert data["rows"] and {(p["pp"], p["schedule"], p["chunks"]) for p in data["rows"]} == {(2, "interleaved", 2)}
        assert all(p["micro_batches"] % 2 == 0 for p in data["rows"])  # interleaving fills groups of pp

    @pytest.mark.parametrize("flag", [["--pp", "2"], ["--schedule", "gpipe"], ["--chunks", "2"], ["--global-batch", "8"]])
    def test_the_per_op_research_search_plans_one_step(self, flag):
        args = ["plan", GPT2, "--dim", "batch=8", "--dim", "seq=128", "-n", "4", "--target", "generic", "--method", "dp"]
        result = run_cli([*args, *flag], 2)
        assert f"{flag[0]} shape pipelines" in result.stderr and "leave those out" in result.stderr

    def test_target_generic_searches_the_same_knobs(self):
        """``--target generic`` is the same search as the launchers' with no launcher's rules: pipelines,
        micro-batches, ZeRO and recomputation, every row naming ``generic`` among its launchers."""
        args = ["plan", GPT2, "--dim", "batch=8", "--dim", "seq=128", "-n", "4", "--target", "generic", "--pp", "2", "-q"]
        data = json.loads(run_cli([*args, "--json"]).stdout)
        assert data["launchers"] == ["generic"] and data["global_batch"] == 8
        assert data["rows"] and {row["pp"] for row in data["rows"]} == {2}
        assert all(row["targets"][0] == "generic" for row in data["rows"])
        assert all(row["micro_batch"] * row["dp"] * row["micro_batches"] == 8 for row in data["rows"])

    def test_pipeline_options_take_the_models_batch_as_the_global_batch(self):
        args = ["plan", GPT2, "--dim", "batch=8", "--dim", "seq=128", "-n", "4", "--pp", "2", "--target", "megatron", "-q"]
        data = json.loads(run_cli([*args, "--json"]).stdout)
        assert data["global_batch"] == 8
        assert data["rows"] and {row["pp"] for row in data["rows"]} == {2}
        assert all(row["micro_batch"] * row["dp"] * row["micro_batches"] == 8 for row in data["rows"])

    def test_bad_pp_list(self):
        result = run_cli([*BASE, "--pp", "2,x"], 2)
        assert "cannot read --pp '2,x'" in result.stderr


class TestEstimate:
    def test_stage_layers_and_schedule_match_the_api(self):
        from objectives.cluster import make_cluster
        from planner.estimate import estimate
        from planner.pipeline import graph_loader

        args = ["estimate", GPT2, "--dim", "seq=128", "-n", "4", "--tp", "1", "--pp", "4", "--micro-batch", "2",
                "--global-batch", "16", "--stage-layers", "2,4,4,2", "--schedule", "gpipe", "--no-rank", "--json", "-q"]
        data = json.loads(run_cli(args).stdout)
        from planner.core.settings import TrainingSettings

        api = estimate(
            graph_loader(GPT2, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=4), tp=1, pp=4, micro_batch=2,
            global_batch=16, stage_layers=(2, 4, 4, 2), schedule="gpipe",
            settings=TrainingSettings(engine="fused", attention="flash"),  # the CLI's default: Megatron's kernels
        )
        assert data["valid"] and data["step_time_s"] == pytest.approx(api.time_s, rel=1e-12)
        assert data["memory_per_device_bytes"] == pytest.approx(api.memory_bytes, rel=1e-12)

    def test_bad_stage_layers(self):
        args = ["estimate", GPT2, "--dim", "seq=128", "-n", "4", "--tp", "1", "--pp", "4", "--micro-batch", "2",
                "--global-batch", "16", "--stage-layers", "2,4,4", "--no-rank", "-q"]
        assert "stage_layers" in run_cli(args, 2).stderr


def test_a_target_that_cannot_run_the_model_says_why_in_one_line():
    # the MLP is not a transformer: Megatron-LM runs none of its plans, pipelined or not; the reason is
    # the exporter's own refusal of the replicated strategy, as for plan without --global-batch
    from objectives.cluster import make_cluster
    from planner.core.settings import TrainingSettings
    from planner.plan import load_graph, target_refusal

    mlp = ROOT / "examples" / "mlp.onnx"
    result = run_cli(["plan", mlp, "-n", "8", "--global-batch", "16", "--target", "megatron", "-q"], expected_exit_code=2)
    assert result.stdout == ""  # no empty table
    message = result.stderr.strip()
    assert "\n" not in message and message.startswith("error: 8 devices: --target megatron can run no plan of mlp: ")
    reason = target_refusal(load_graph(mlp, {"batch": 2}), make_cluster("a100-80gb", devices=8), TrainingSettings(), "megatron")
    assert reason and "not a transformer" in reason and reason in message
    plain = run_cli(["plan", mlp, "-n", "8", "--dim", "batch=16", "--target", "megatron", "-q"], expected_exit_code=2)
    assert reason in plain.stderr  # the same reason as the plain search gives


def test_rows_of_a_model_without_repeated_blocks_cut_no_layers(frontier):
    # an MLP has no repeated block to put on pipeline stages: its rows are one stage with no layer count
    # (null, not [0]), as the generic export leaves num_layers and layers_per_stage out; GPT-2's rows
    # count its blocks, read here from the file's h.N. weight names
    mlp = ROOT / "examples" / "mlp.onnx"
    rows = json.loads(run_cli(["plan", mlp, "-n", "4", "--dim", "batch=16", "--target", "generic", "--json", "-q"]).stdout)["rows"]
    assert rows and all(row["pp"] == 1 and row["layers_per_stage"] is None for row in rows)
    import re

    import onnx

    weights = onnx.load(GPT2, load_external_data=False).graph.initializer
    blocks = {m.group(1) for w in weights if (m := re.search(r"(?:^|\.)h\.(\d+)\.", w.name))}
    gpt = frontier[0]["rows"]  # `plan BASE --json`, run once for the module
    assert len(blocks) == 12
    assert all(sum(row["layers_per_stage"]) == 12 and len(row["layers_per_stage"]) == row["pp"] for row in gpt)
