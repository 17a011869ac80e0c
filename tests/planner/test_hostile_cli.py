"""Hostile and careless input to the `planner` command: markup in names, huge numbers, malformed
YAML/JSON, special files, usage errors. Each is refused (or printed literally) in one line, exit 2,
never "internal error" (exit 1) or a traceback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from shlex import quote as shlex_quote

import onnx
import pytest
from onnx import TensorProto, helper

from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.onnx"
GPT2 = ROOT / "examples" / "gpt2.onnx"
FAST = ["--dim", "batch=8"]  # the default answer: the launchable search (small on the MLP)
PER_OP = [*FAST, "--target", "generic", "--method", "dp"]  # the per-op frontier
LINK = "[link=file:///etc/passwd]click[/link]"


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout and "internal error" not in result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def markup_model(path: Path, batch: str = "[bold]batch") -> Path:
    """Two MatMuls named like Rich markup, on an input and a dim named like markup too (``batch``:
    the dim's name; a plain ``batch`` is read as the batch, so the launchable search runs)."""
    x = helper.make_tensor_value_info("x[/b]", TensorProto.FLOAT, [batch, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16])
    w1 = helper.make_tensor("w[/i]", TensorProto.FLOAT, [64, 32], [0.01] * (64 * 32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [32, 16], [0.01] * (32 * 16))
    nodes = [
        helper.make_node("MatMul", ["x[/b]", "w[/i]"], ["h"], name="[/mm]"),
        helper.make_node("MatMul", ["h", "w2"], ["y"], name=LINK),
    ]
    graph = helper.make_graph(nodes, "[red]g[/red]", [x], [y], [w1, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


class TestMarkupIsText:
    def test_inspect_missing_markup_path(self, tmp_path):
        line = one_error_line(run_cli(["inspect", "x[/y].onnx"], 2))
        assert "x[/y].onnx" in line

    def test_inspect_markup_path_prints_literally(self, tmp_path):
        path = tmp_path / "x[" / "y].onnx"
        path.parent.mkdir()
        shutil.copy(MLP, path)
        result = run_cli(["inspect", path, "--dim", "batch=8"])
        assert "parameter count" in result.stdout

    def test_link_in_path_is_not_a_terminal_link(self, tmp_path):
        result = run_cli(["plan", tmp_path / f"{LINK}.onnx"], 2)
        line = one_error_line(result)  # the path's "//" reads as "/"
        assert "[link=file:/etc/passwd]click[/link].onnx" in line
        assert "\x1b]8;" not in result.stderr  # the OSC 8 hyperlink escape

    def test_markup_names_in_inspect_plan_and_explain(self, tmp_path):
        model = markup_model(tmp_path / "m.onnx")
        dim = "--dim", "[bold]batch=8"
        shown = run_cli(["inspect", model, *dim]).stdout
        assert "[bold]batch 8" in shown
        table = run_cli(["plan", model, *dim, "-n", "2", "--top", "3"])
        assert "baseline data parallel" in table.stdout
        plan = tmp_path / "plan.json"
        run_cli(["plan", model, *dim, "-n", "2", "--target", "generic", "--method", "dp", "--pick", "1", "-o", plan, "-q"])
        explained = run_cli(["explain", plan, "--all"]).stdout
        assert "[/mm]" in explained and LINK in explained and "\x1b]8;" not in explained
        ops = {row["op"] for row in json.loads(run_cli(["explain", plan, "--json"]).stdout)["ops"]}
        assert {"[/mm]", LINK} <= ops

    def test_markup_names_in_the_launchable_table_and_its_plan(self, tmp_path):
        model = markup_model(tmp_path / "[bold]m.onnx", batch="batch")
        table = run_cli(["plan", model, "--dim", "batch=8", "-n", "2", "--top", "3"]).stdout
        assert table.startswith("[bold]m: 2 x ") and "global batch 8" in table.splitlines()[0]
        assert "baseline data parallel" in table and "\x1b]8;" not in table
        data = json.loads(run_cli(["plan", model, "--dim", "batch=8", "-n", "2", "--json", "-q"]).stdout)
        assert data["model"] == "[bold]m" and data["rows"]
        assert set().union(*(row["splits"] for row in data["rows"])) <= {"[/mm]", LINK}
        plan = tmp_path / "plan.json"
        run_cli(["plan", model, "--dim", "batch=8", "-n", "2", "--pick", "1", "-o", plan, "-q"])
        explained = run_cli(["explain", plan, "--all"])  # each stage's ops, by name as written
        assert "\x1b]8;" not in explained.stdout and explained.stderr == ""
        assert "[/mm]" in explained.stdout and LINK in explained.stdout

    def test_markup_in_dim_flag_and_cluster_values(self, tmp_path):
        line = one_error_line(run_cli(["plan", MLP, "--dim", "[/x]=oops"], 2))
        assert "--dim [/x] needs an integer value (got 'oops')" in line
        cluster = tmp_path / "c.yaml"
        cluster.write_text("device: '[/bad]'\nnodes: 1\n")
        assert "'[/bad]'" in one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", cluster], 2))

    def test_terminal_escapes_in_names_are_shown_not_sent(self, tmp_path):
        """An ESC in a node name would start the terminal's own sequences (an OSC 8 link here)."""
        osc_link = "\x1b]8;;file:///etc/passwd\x1b\\click\x1b]8;;\x1b\\"
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
        w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], [0.5] * 32)
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name=osc_link)], "g", [x], [y], [w])
        model = tmp_path / "esc.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), model)
        plan = tmp_path / "plan.json"
        shown = run_cli(["plan", model, "--dim", "batch=8", "-n", "2"])  # the launchable table
        assert "\x1b" not in shown.stdout + shown.stderr
        run_cli(["plan", model, "--dim", "batch=8", "-n", "2", "--target", "generic", "--method", "dp", "--pick", "1",
                 "-o", plan, "-q"])
        explained = run_cli(["explain", plan, "--all"]).stdout
        assert "\x1b" not in explained
        assert "\\x1b]8;;file:///etc/passwd\\x1b\\click" in explained
        line = one_error_line(run_cli(["inspect", tmp_path / "a\x1b[2Jb.onnx"], 2))
        assert "a\\x1b[2Jb.onnx" in line and "\x1b" not in line

    @pytest.mark.parametrize("module, name, args", [
        ("planner.launchable", "graph_loader", FAST),  # the default answer
        ("planner.plan", "load_graph", PER_OP),
    ], ids=["launchable", "generic"])  # fmt: skip
    def test_internal_error_handler_survives_markup(self, monkeypatch, module, name, args):
        import importlib

        def crash(*args, **kwargs):
            raise RuntimeError("bug near [/mm] and [link=x]y[/link]")

        monkeypatch.setattr(importlib.import_module(module), name, crash)
        result = run_cli(["plan", MLP, *args], 1)
        assert result.stderr.startswith("internal error: RuntimeError: bug near [/mm] and [link=x]y[/link]")


class TestUsageErrorsAreOneLine:
    @pytest.mark.parametrize(
        "args, needle",
        [
            (["plan"], "Missing argument"),
            (["plan", MLP, "--bogus"], "No such option: --bogus"),
            (["plan", MLP, "-n"], "requires an argument"),
            (["plan", MLP, "--top", "0"], "'--top'"),
            (["plan", MLP, "--zero", "x"], "'--zero'"),
            (["plan", MLP, "--method", "nsga2", "--seed", "-1"], "'--seed'"),
            (["estimate", MLP], "Missing option"),
            (["bogus"], "No such command 'bogus'"),
            (["explain"], "Missing argument"),
        ],
    )
    def test_one_line_exit_2(self, args, needle):
        line = one_error_line(run_cli(args, 2))
        assert needle in line and line.endswith("--help")

    def test_help_still_works(self):
        assert "Usage" in run_cli(["plan", "--help"]).stdout


class TestExportOfARefusedTarget:
    def test_the_launchers_refusal_is_the_error(self, tmp_path):
        """``--target megatron --export megatron`` on a model Megatron-LM cannot run (an MLP: no
        attention): one line with the launcher's reason, not a bare "nothing to export"."""
        out = tmp_path / "plan.json"
        line = one_error_line(run_cli(["plan", MLP, *FAST, "--target", "megatron", "--export", "megatron", "-o", out], 2))
        assert line.startswith("error: nothing to export: ") and "--target megatron can run no plan of mlp" in line
        assert "no attention" in line and not out.exists()


class TestZeroBubbleUnderCompile:
    def test_the_empty_table_says_why(self):
        """torchtitan's zero-bubble schedules do not run torch.compile'd blocks (its default, fused
        execution): the one-line error says so and how to list them, not only "no plan was found"."""
        llama = ROOT / "examples" / "llama.onnx"
        args = ["plan", llama, "--dim", "batch=16", "--dim", "seq=128", "-n", "8", "--target", "torchtitan",
                "--fix", "pp=2", "--schedule", "zbv", "--chunks", "2"]
        line = one_error_line(run_cli(args, 2))
        assert "zero-bubble schedules" in line and "(add --engine eager)" in line
        assert "picked #1" in run_cli([*args, "--engine", "eager"]).stdout


class TestHugeNumbers:
    @pytest.mark.parametrize(
        "args, needle",
        [
            (["--mem-limit", "1e400TB"], "too large"),
            (["-n", "1073741824"], "at most 1,048,576"),
            (["-n", "1-1000000000000"], "at most 1,048,576"),
            (["-n", "9" * 5000], "cannot read --devices"),
            (["--dim", "batch=" + "9" * 5000], "--dim batch"),
            (["--target", "generic", "--epsilon", "nan"], "epsilon"),
            (["--target", "generic", "--method", "dp", "--mem-limit", "1e400TB"], "too large"),
            (["--global-batch", "9" * 5000], "--global-batch"),
            (["--fix", "pp=" + "9" * 5000], "pp"),
        ],
    )
    def test_plan_flags(self, args, needle):
        line = one_error_line(run_cli(["plan", MLP, "--dim", "batch=8", *args], 2))
        assert needle in line and len(line) < 400

    def test_estimate_devices_bounded(self):
        line = one_error_line(run_cli(
            ["estimate", GPT2, "-n", str(10**20), "--tp", "1", "--pp", "1", "--micro-batch", "1",
             "--global-batch", "8", "--dim", "seq=128"], 2))
        assert "at most 1,048,576" in line


class TestClusterFiles:
    @pytest.mark.parametrize(
        "text, needle",
        [
            ("device: h100-sxm\nnodes: " + str(10**29) + "\n", "at most 1,048,576"),
            ("device: {name: x, peak_flops: {bf16: .inf}, memory: 80GB, memory_bandwidth_bytes_per_s: 1.0e12}\n"
             "devices: 8\n", "positive, finite number of FLOP/s"),
            ("device: {name: x, peak_flops: {bf16: 1.0e14}, memory_bytes: .inf, memory_bandwidth_bytes_per_s: 1.0e12}\n"
             "devices: 8\n", "'memory_bytes' must be a finite number"),
            ("device: {name: x, peak_flops: {bf16: 1.0e14}, memory: 80GB, memory_bandwidth_bytes_per_s: .nan}\n"
             "devices: 8\n", "'memory_bandwidth_bytes_per_s' must be a finite number"),
            ("device: h100-sxm\nnodes: 1\ninter_link: {bandwidth_bytes_per_s: .nan, latency_s: 0}\n", "finite"),
            ("device: [unclosed\n", "not valid YAML"),
            ("- just\n- a list\n", "must hold a mapping"),
        ],
    )
    def test_bad_values_one_line(self, tmp_path, text, needle):
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(text)
        assert needle in one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", cluster], 2))

    def test_alias_bomb_refused_before_expanding(self, tmp_path):
        lines = ["device: h100-sxm", "nodes: 1", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
        for prev, name in zip("abcdefgh", "bcdefghi"):
            lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        cluster = tmp_path / "bomb.yaml"
        cluster.write_text("\n".join(lines) + "\n")
        assert cluster.stat().st_size < 1000  # 9**9 = 387,420,489 strings once expanded
        assert "YAML aliases" in one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", cluster], 2))

    def test_special_and_oversized_files(self, tmp_path):
        fifo = tmp_path / "fifo.yaml"
        os.mkfifo(fifo)  # reading it would block for ever
        for special in (fifo, Path("/dev/zero"), tmp_path):
            assert "not a regular file" in one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", special], 2))
        big = tmp_path / "big.yaml"
        big.write_text("device: h100-sxm\nnodes: 1\n# " + "x" * (1 << 20) + "\n")
        assert "over the 1,048,576" in one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", big], 2))

    def test_file_count_wins_over_default_and_conflicts_loudly(self, tmp_path):
        cluster = tmp_path / "four.yaml"
        cluster.write_text("device: h100-sxm\ndevices: 4\n")
        data = json.loads(run_cli(["plan", MLP, *FAST, "--cluster", cluster, "--json"]).stdout)
        assert data["devices"] == 4 and data["device"] == "h100-sxm"
        data = json.loads(run_cli(["plan", MLP, *PER_OP, "--cluster", cluster, "--json"]).stdout)
        assert data["devices"] == 4 and data["device"] == "h100-sxm"  # the launchable table's JSON
        line = one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", cluster, "-n", "8"], 2))
        assert "--devices 8 contradicts the cluster file" in line and "4 devices" in line
        run_cli(["plan", MLP, *FAST, "--cluster", cluster, "-n", "4", "-q"])


class TestPlanJson:
    @pytest.fixture(params=[FAST, PER_OP], ids=["launchable", "generic"])
    def kind(self, request) -> list:
        return request.param

    def _plan(self, tmp_path, kind: list = FAST) -> Path:
        plan = tmp_path / "plan.json"
        run_cli(["plan", MLP, *kind, "-n", "2", "--pick", "1", "-o", plan, "-q"])
        return plan

    def test_deeply_nested_and_huge_integer(self, tmp_path):
        deep = tmp_path / "deep.json"
        deep.write_text("[" * 200_000)
        assert "nested too deeply" in one_error_line(run_cli(["explain", deep], 2))
        huge = tmp_path / "huge.json"
        huge.write_text('{"a": ' + "9" * 5000 + "}")
        assert "digits" in one_error_line(run_cli(["explain", huge], 2))

    @pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999"])
    def test_non_finite_bandwidth(self, tmp_path, value, kind):
        plan = self._plan(tmp_path, kind)
        text = plan.read_text()
        data = json.loads(text)
        old = json.dumps(data["cluster"]["inter_link"]["bandwidth_bytes_per_s"])
        assert text.count(f'"bandwidth_bytes_per_s": {old}') >= 1
        plan.write_text(text.replace(f'"bandwidth_bytes_per_s": {old}', f'"bandwidth_bytes_per_s": {value}', 1))
        result = run_cli(["explain", plan], 2)
        assert "re-export it" in one_error_line(result) and "nan" not in result.stdout.lower()

    def test_fifo_plan(self, tmp_path):
        fifo = tmp_path / "plan.json"
        os.mkfifo(fifo)
        assert "not a regular file" in one_error_line(run_cli(["explain", fifo], 2))


class TestDeeplyNestedClusterFile:
    """PyYAML's scanner is quadratic in the nesting of flow collections: 100,000 ``[`` kept it busy for
    2 min 44 s before it said "not valid YAML". The nesting is counted first (issue 25)."""

    @pytest.mark.parametrize("text", ["[" * 100_000, "{" * 100_000, "{a: " * 100_000, "- " * 100_000,
                                      "a: " + "[" * 40 + "1" + "]" * 40 + "\n"],
                             ids=["brackets", "braces", "flow-keys", "block-dashes", "closed-40-deep"])  # fmt: skip
    def test_refused_in_one_line_reading_a_few_events(self, tmp_path, text, monkeypatch):
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(text)
        events = _count_parse_events(monkeypatch)
        line = one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", cluster], 2))
        assert "nests lists or mappings more than 32 levels deep" in line and str(cluster) in line
        # the stream stops one level past the bar: the scanner never reads the rest (no timing here)
        assert events[0] <= 2 * 33 + 4

    def test_without_libyaml_too(self, tmp_path, monkeypatch):
        """PyYAML without its C library counts on its own event stream, and stops at level 33."""
        import yaml

        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text("[" * 100_000)
        events = _count_parse_events(monkeypatch)
        assert "32 levels deep" in one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", cluster], 2))
        assert events[0] <= 33 + 2  # stream start, document start, then 33 list starts


def _count_parse_events(monkeypatch) -> list[int]:
    """``yaml.parse`` wrapped to count the events it hands out (one cell, read after the call)."""
    import yaml

    count, parse = [0], yaml.parse

    def counted(*args, **kwargs):
        for event in parse(*args, **kwargs):
            count[0] += 1
            yield event

    monkeypatch.setattr(yaml, "parse", counted)
    return count

    def test_depth_is_counted_exactly(self, tmp_path):
        """``a: [[1]]`` is three levels (the mapping, two lists); 32 levels load, 33 do not."""
        from planner.input_files import MAX_CLUSTER_NESTING, _nesting_depth

        import yaml

        assert _nesting_depth("a: [[1]]\n", yaml.SafeLoader) == 3
        fits = tmp_path / "fits.yaml"  # the mapping, then 31 lists: 32 levels; load_cluster ignores unknown keys
        fits.write_text("device: h100-sxm\nnodes: 1\nx: " + "[" * 31 + "1" + "]" * 31 + "\n")
        assert MAX_CLUSTER_NESTING == 32
        run_cli(["plan", MLP, *FAST, "--cluster", fits, "-q"])
        deeper = tmp_path / "deeper.yaml"
        deeper.write_text("device: h100-sxm\nnodes: 1\nx: " + "[" * 32 + "1" + "]" * 32 + "\n")
        assert "32 levels deep" in one_error_line(run_cli(["plan", MLP, *FAST, "--cluster", deeper], 2))

    def test_estimate_and_calibrate_check_it_too(self, tmp_path):
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text("[" * 100_000)
        estimate = ["estimate", GPT2, "-n", "8", "--tp", "1", "--pp", "1", "--micro-batch", "1", "--global-batch", "8",
                    "--dim", "seq=128", "--cluster", cluster]  # fmt: skip
        assert "32 levels deep" in one_error_line(run_cli(estimate, 2))
        steps = tmp_path / "steps.jsonl"
        steps.write_text("")
        calibrate = ["calibrate", steps, "--cluster", cluster, "-o", tmp_path / "out.yaml"]
        assert "32 levels deep" in one_error_line(run_cli(calibrate, 2))
        assert not (tmp_path / "out.yaml").exists()


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    """A plan of the launchable table, saved."""
    plan = tmp_path_factory.mktemp("stdin") / "plan.json"
    run_cli(["plan", MLP, *FAST, "-n", "2", "--pick", "1", "-o", plan, "-q"])
    return plan


class TestPlanFromStdin:
    """``cat plan.json | planner explain -`` (and ``/dev/stdin`` on a pipe, ``compare``, ``export``)."""

    @staticmethod
    def piped(args: list, text: str, code: int = 0):
        from typer.testing import CliRunner

        from planner.cli import app

        result = CliRunner().invoke(app, [str(a) for a in args], input=text)
        assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
        return result

    def test_explain_dash_equals_explain_file(self, plan):
        from_file = json.loads(run_cli(["explain", plan, "--json"]).stdout)
        from_stdin = json.loads(self.piped(["explain", "-", "--json"], plan.read_text()).stdout)
        assert from_stdin == from_file and from_file["step_time_s"] > 0

    def test_per_op_plan_names_stdin(self, tmp_path):
        plan = tmp_path / "per-op.json"
        run_cli(["plan", MLP, *PER_OP, "-n", "2", "--pick", "1", "-o", plan, "-q"])
        data = json.loads(self.piped(["explain", "-", "--json"], plan.read_text()).stdout)
        assert data["plan"] == "<stdin>" and data["time_s"] == json.loads(run_cli(["explain", plan, "--json"]).stdout)["time_s"]

    def test_compare_and_export_read_dash(self, plan):
        compared = json.loads(self.piped(["compare", plan, "-", "--json"], plan.read_text()).stdout)
        assert compared == json.loads(run_cli(["compare", plan, plan, "--json"]).stdout)
        exported = json.loads(self.piped(["export", "-", "--format", "deepspeed"], plan.read_text()).stdout)
        assert exported == json.loads(run_cli(["export", plan, "--format", "deepspeed"]).stdout)

    @pytest.mark.parametrize("text, needle", [
        ("", "standard input is empty; pipe a plan in"),
        ("not json", "plan file <stdin> is not JSON"),
        ("[" * 200_000, "plan file <stdin> is not a plan (nested too deeply)"),
    ])  # fmt: skip
    def test_bad_stdin_one_line(self, text, needle, tmp_path, monkeypatch):
        import tempfile

        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        line = one_error_line(self.piped(["explain", "-"], text, 2))
        assert needle in line and "planner-stdin" not in line
        assert list(tmp_path.iterdir()) == []  # the private copy is removed

    def test_two_dashes_refused(self, plan):
        line = one_error_line(self.piped(["compare", "-", "-"], plan.read_text(), 2))
        assert "reads a pipe once" in line

    def test_dev_stdin_on_a_pipe(self, plan, tmp_path):
        """``/dev/stdin`` on a pipe (a FIFO: refused as "not a regular file" before) is read once, in a
        real process; an existing FIFO that is not stdin is still refused."""
        import subprocess
        import sys

        environment = {**os.environ, "TMPDIR": str(tmp_path)}
        for args in (["explain", "/dev/stdin", "--json"], ["compare", plan, "/dev/stdin", "--json"],
                     ["explain", "-", "--json"]):
            done = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *map(str, args)],
                                  input=plan.read_text(), capture_output=True, text=True, cwd=ROOT, env=environment,
                                  timeout=120)  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)
        assert list(tmp_path.iterdir()) == []
        fifo = tmp_path / "fifo.json"
        os.mkfifo(fifo)  # not a descriptor's pipe: no writer may ever come, so it is still refused
        assert "not a regular file" in one_error_line(run_cli(["explain", fifo], 2))

    def test_two_process_substitutions(self, plan, tmp_path):
        """bash's ``<(...)``: two pipes, /dev/fd/63 and /dev/fd/62, each read once."""
        import subprocess
        import sys

        if shutil.which("bash") is None:
            pytest.skip("needs bash")
        script = (f"{shlex_quote(sys.executable)} -c 'from planner.cli import main; main()' compare "
                  f"<(cat {shlex_quote(str(plan))}) <(cat {shlex_quote(str(plan))}) --json")  # fmt: skip
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={**os.environ, "TMPDIR": str(tmp_path)})  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == json.loads(run_cli(["compare", plan, plan, "--json"]).stdout)
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("source, needle", [
        ("/dev/zero", "standard input is a device, not a plan"),
        ("/dev/null", "standard input is a device, not a plan"),
        ("PLAN", None),  # `planner explain - < plan.json`: a regular file on stdin reads as well
    ])  # fmt: skip
    def test_stdin_redirected_from_a_file(self, plan, source, needle):
        import subprocess
        import sys

        with open(plan if source == "PLAN" else source, "rb") as stdin:
            done = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", "explain", "-"],
                                  stdin=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
        if needle is None:
            assert done.returncode == 0 and "Where the time goes" in done.stdout, done.stderr
        else:
            assert done.returncode == 2 and done.stderr.splitlines() == [done.stderr.strip()] and needle in done.stderr
