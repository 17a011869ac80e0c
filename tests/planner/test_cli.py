"""The `planner` command: exit codes, tables, JSON, export, one-line errors."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import parse_devices
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "examples" / "gpt2.onnx"
MLP = ROOT / "examples" / "mlp.onnx"
SMALL = ["--dim", "batch=8", "--dim", "seq=128"]


class TestParseDevices:
    def test_list_and_range(self):
        assert parse_devices("8,16,32") == [8, 16, 32]
        assert parse_devices("8-64") == [8, 16, 32, 64]
        assert parse_devices("16") == [16]

    @pytest.mark.parametrize("text", ["0", "-4", "x", "8-4", ""])
    def test_bad(self, text):
        from planner.core.errors import InputError

        with pytest.raises(InputError):
            parse_devices(text)


class TestPlan:
    def test_table_on_gpt2(self):
        result = run_cli(["plan", GPT2, "--devices", "16", "--mem-limit", "16GB", *SMALL, "--target", "generic", "--method", "dp"])
        assert "step time" in result.stdout
        assert "baseline data parallel" in result.stdout
        assert "picked #" in result.stdout

    def test_json_matches_api(self):
        """The per-op table is priced fused + flash unless asked otherwise: the API with those
        settings gives the same points (and ``--engine roofline`` the API's plain default)."""
        from objectives.cluster import make_cluster
        from planner.core.settings import TrainingSettings
        from planner.core.strategy import public_form
        from planner.core.units import parse_size
        from planner.plan import PlanRequest, load_graph, plan

        result = run_cli(["plan", GPT2, "-n", "8", "--mem-limit", "16GB", *SMALL, "--target", "generic", "--method", "dp", "--json"])
        data = json.loads(result.stdout)
        assert {row["execution"] for row in data["rows"]} == {"fused+flash"}
        graph = load_graph(GPT2, {"batch": 8, "seq": 128})
        request = PlanRequest(
            cluster=make_cluster("a100-80gb", devices=8), method="dp", memory_limit_bytes=parse_size("16GB"),
            settings=TrainingSettings(engine="fused", attention="flash"),
        )
        api = plan(graph, request)
        # the rows are the API's points in its order: the same public form (splits, placements, copies)
        forms = [public_form([op.name for op in graph.ops], api.spaces, p.strategy.choice) for p in api.points]
        assert [(r["splits"], r["inter_node_splits"], r["replicas"]) for r in data["rows"]] == [
            (f.splits, f.inter_splits, f.replicas) for f in forms]
        assert data["rows"][0]["step_time_s"] == pytest.approx(api.points[0].strategy.time_s, rel=1e-12)
        assert data["chosen_rank"] == api.chosen + 1
        plain = json.loads(run_cli(["plan", GPT2, "-n", "8", "--mem-limit", "16GB", *SMALL, "--target", "generic",
                                    "--method", "dp", "--engine", "roofline", "--json"]).stdout)
        roofline = plan(graph, dataclasses.replace(request, settings=TrainingSettings()))
        assert plain["rows"][0]["execution"] == "roofline"
        assert plain["rows"][0]["step_time_s"] == pytest.approx(roofline.points[0].strategy.time_s, rel=1e-12)

    def test_devices_list_shows_scaling(self):
        result = run_cli(["plan", MLP, "-n", "2,4", "--dim", "batch=64", "--target", "generic", "--method", "dp"])
        assert "Scaling with devices" in result.stdout

    def test_seven_devices_still_plans(self):
        # 7 divides no dim of the model: replication is valid, so planning succeeds.
        result = run_cli(["plan", MLP, "-n", "7", "--devices-per-node", "7", "--dim", "batch=64", "--target", "generic",
                          "--method", "dp", "--json"])
        data = json.loads(result.stdout)
        assert data["rows"]

    @pytest.mark.parametrize("per_op", [[], ["--target", "generic", "--method", "dp"]], ids=["launchable", "generic"])
    def test_nothing_fits_is_a_result_with_exit_2(self, per_op):
        # 10 KB: with its parameters offloaded to the host (ZeRO-3), the launchable MLP fits in 844.8 KiB
        # at 32 micro-batches of 2 (1 MB would fit); the least any of its plans keeps is 26.4 KiB
        result = run_cli(["plan", MLP, "-n", "2", "--dim", "batch=64", "--mem-limit", "10KB", *per_op], 2)
        assert "smallest needs" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


class TestErrors:
    @pytest.mark.parametrize(
        "args, needle",
        [
            (["plan", MLP, "--mem-limit", "16XB", "--dim", "batch=8"], "unknown size unit"),
            (["plan", MLP, "--devices", "0", "--dim", "batch=8"], "--devices"),
            (["plan", "missing.onnx"], "missing.onnx"),
            (["plan", GPT2, "--dim", "batch=8"], "--dim seq="),
            (["plan", MLP, "--dim", "batch=8", "--pick", "999", "--target", "generic", "--method", "dp"], "--pick 999"),
            (["plan", MLP, "--dim", "batch=8", "--pick", "999"], "--pick 999"),
            (["plan", MLP, "--dim", "batch=8", "--device", "tpu-v9"], "tpu-v9"),
            (["plan", MLP, "--dim", "batch=oops"], "integer"),
            (["plan", MLP, "--dim", "batch=8", "-n", "3-20"], "--devices 3-20 means 3, 6, 12; 12 devices"),
            (["plan", MLP, "-n", "8", "--global-batch", "64", "--pp", "2"], "no repeated blocks"),
        ],
    )
    def test_one_line_exit_2(self, args, needle):
        result = run_cli(args, 2)
        assert needle in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr

    @pytest.mark.parametrize(
        "extra, needle",
        [
            (["--export", "alpa"], "unknown --export 'alpa'"),
            (["--pick", "0"], "--pick 0"),
            (["-o", "/no/such/folder/plan.json"], "does not exist"),
        ],
    )
    def test_export_flags_are_checked_before_the_search(self, monkeypatch, extra, needle):
        import planner.plan as plan_module

        def no_search(*args, **kwargs):
            raise AssertionError("searched before checking the export flags")

        import planner.launchable as launchable_module

        monkeypatch.setattr(plan_module, "plan", no_search)
        monkeypatch.setattr(launchable_module, "plan_launchable_file", no_search)
        monkeypatch.setattr(launchable_module, "launch_frontier", no_search)
        result = run_cli(["plan", MLP, "--dim", "batch=8", *extra], 2)
        assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1

    def test_unknown_dim_is_a_warning(self):
        for per_op in ([], ["--target", "generic", "--method", "dp"]):
            result = run_cli(["plan", MLP, "--dim", "batch=8", "--dim", "sequence=3", *per_op])
            assert "--dim sequence: not a dim of the model's inputs" in " ".join(result.stderr.split())

    def test_output_exists_is_refused(self, tmp_path):
        out = tmp_path / "plan.json"
        out.write_text("mine")
        result = run_cli(["plan", MLP, "--dim", "batch=8", "--target", "generic", "--method", "dp", "--export", "generic", "-o", out], 2)
        assert "--force" in result.stderr
        assert out.read_text() == "mine"


@pytest.mark.slow
def test_installed_script_runs_main_job(tmp_path):
    """The console script itself (not the in-process runner) runs a plan to its table and pick. The README's main
    job (GPT-2 on 16 devices, 9-24 s) runs in-process in tests/planner/test_readme.py; here the MLP on 2 devices
    (about 2 s) runs the same entry point, options and printing."""
    script = shutil.which("planner", path=str(Path(sys.executable).parent))
    assert script is not None, "the planner console script is not installed in this environment"
    completed = subprocess.run(
        [script, "plan", str(MLP), "--devices", "2", "--mem-limit", "16GB", "--dim", "batch=8"],
        capture_output=True, text=True, timeout=600,
    )
    assert completed.returncode == 0, completed.stderr
    assert "step time" in completed.stdout
    assert "picked #" in completed.stdout


class TestPickExport:
    def test_pick_export_writes_plan_that_reads_back(self, tmp_path):
        from exporters import read_plan

        out = tmp_path / "plan.json"
        result = run_cli(["plan", GPT2, "-n", "8", *SMALL, "--target", "generic", "--method", "dp", "--json", "--pick", "1",
                          "--export", "generic", "-o", out])
        data = json.loads(result.stdout)
        document = read_plan(out)
        assert document.pipeline is None  # a per-op plan: `explain` prices it per op
        assert {k: dict(v) for k, v in document.strategy().splits.items()} == data["rows"][0]["splits"]
        assert document.time_s == pytest.approx(data["rows"][0]["step_time_s"], rel=1e-12)

    def test_explain_and_compare_and_reexport(self, tmp_path):
        first, second = tmp_path / "a.json", tmp_path / "b.json"
        run_cli(["plan", GPT2, "-n", "8", *SMALL, "--target", "generic", "--method", "dp", "--pick", "1", "-o", first, "-q"])
        run_cli(["plan", GPT2, "-n", "8", *SMALL, "--target", "generic", "--method", "dp", "--pick", "2", "-o", second, "-q"])
        explained = json.loads(run_cli(["explain", first, "--json"]).stdout)
        assert explained["time_s"] == pytest.approx(json.loads(first.read_text())["objectives"]["time_s"], rel=1e-12)
        compared = json.loads(run_cli(["compare", first, second, "--json"]).stdout)
        assert compared["time_s"]["delta"] == pytest.approx(compared["time_s"]["b"] - compared["time_s"]["a"])
        again = tmp_path / "again.json"
        run_cli(["export", first, "--format", "generic", "-o", again])
        assert json.loads(again.read_text())["ops"] == json.loads(first.read_text())["ops"]

    def test_plot_writes_png(self, tmp_path):
        png = tmp_path / "frontier.png"
        run_cli(["plan", MLP, "-n", "4", "--dim", "batch=64", "--target", "generic", "--plot", png, "-q"])
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class TestPipelineCommands:
    def test_plan_with_global_batch_shows_pipeline_columns(self):
        # the 2-layer GPT-2: its 26 rows split the 16 samples every way (pp 1-2, dp 1-4, tp 1-4), where the
        # 12-layer one's 19 kept dp = 1, in two thirds of the CPU time (5.1 against 7.7 s)
        tiny = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
        result = run_cli(["plan", tiny, "-n", "4", "--dim", "seq=128", "--global-batch", "16", "--json"])
        data = json.loads(result.stdout)
        assert data["global_batch"] == 16
        assert data["rows"] and {"pp", "dp", "tp", "micro_batch", "micro_batches", "zero_stage", "recompute"} <= set(data["rows"][0])
        for row in data["rows"]:
            assert row["pp"] * row["dp"] * row["tp"] <= 4
            assert row["micro_batch"] * row["dp"] * row["micro_batches"] == 16

    def test_estimate_prices_and_ranks(self):
        result = run_cli(["estimate", GPT2, "-n", "4", "--tp", "2", "--pp", "2", "--micro-batch", "1",
                          "--global-batch", "16", "--dim", "seq=128", "--json"])
        data = json.loads(result.stdout)
        assert data["valid"] and data["step_time_s"] > 0
        assert data["best_time_s"] <= data["step_time_s"]

    def test_estimate_invalid_configuration_exit_2(self):
        result = run_cli(["estimate", GPT2, "-n", "4", "--tp", "3", "--pp", "1", "--dp", "1", "--micro-batch", "1",
                          "--global-batch", "16", "--dim", "seq=128", "--no-rank"], 2)
        assert len(result.stderr.strip().splitlines()) == 1


def test_repeated_fix_pins_every_key_once():
    """``--fix pp=2 --fix zero=1`` is ``--fix pp=2,zero=1`` (a repeated option used to keep the last
    only, silently); a key given in two ``--fix`` is the one-line error of a key given twice in one."""
    tiny = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
    args = ["plan", tiny, "-n", "4", "--dim", "batch=8", "--dim", "seq=32", "-q", "--json"]

    def rows(*fix: str) -> list:
        found = json.loads(run_cli([*args, *fix]).stdout)["rows"]
        return [(r["pp"], r["zero_stage"], r["step_time_s"], r["memory_per_device_bytes"]) for r in found]

    joined = rows("--fix", "pp=2,zero=1")
    assert joined and {(pp, zero) for pp, zero, _, _ in joined} == {(2, 1)}
    assert rows("--fix", "pp=2", "--fix", "zero=1") == joined
    result = run_cli([*args, "--fix", "pp=2", "--fix", "pp=4"], expected_exit_code=2)
    assert "--fix names pp twice; give each key once" in result.stderr
