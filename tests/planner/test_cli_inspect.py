"""`planner inspect`, `planner devices`, and the one-line exit-2 errors for bad model files."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "examples" / "gpt2.onnx"
EXAMPLES = json.loads((ROOT / "examples" / "models.json").read_text())


def _matmul_model(opset: int = 18, *, batch: object = "batch", control_flow: bool = False) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], [0.5] * 32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    if control_flow:
        branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 8])])
        cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
        nodes.append(helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=branch, name="if"))
        graph = helper.make_graph(nodes, "g", [x, cond], [y, helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], [w])
    else:
        graph = helper.make_graph(nodes, "g", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


class TestInspect:
    def test_parameter_count_of_example(self):
        result = run_cli(["inspect", GPT2, "--dim", "batch=2", "--dim", "seq=64", "--json"])
        data = json.loads(result.stdout)
        assert data["parameter_count"] == EXAMPLES["gpt2"]["param_count"]
        assert data["raw_node_count"] == EXAMPLES["gpt2"]["node_count"]
        assert data["blocks"][0]["count"] == EXAMPLES["gpt2"]["config"]["layers"]

    def test_table(self):
        result = run_cli(["inspect", GPT2, "--dim", "batch=2", "--dim", "seq=64"])
        assert "parameter count" in result.stdout and "124,439,808" in result.stdout


class TestBadModels:
    @pytest.fixture
    def folder(self, tmp_path):
        return tmp_path

    def _check(self, args, needle):
        result = run_cli(args, 2)
        assert needle in result.stderr.lower()
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr + result.stdout

    def test_missing_file(self, folder):
        self._check(["inspect", folder / "nope.onnx"], "nope.onnx")

    def test_not_onnx(self, folder):
        path = folder / "notes.onnx"
        path.write_text("this is not a model\n" * 10)
        self._check(["inspect", path], "onnx")

    def test_truncated(self, folder):
        path = folder / "cut.onnx"
        path.write_bytes(GPT2.read_bytes()[:5000])
        self._check(["inspect", path, "--dim", "batch=1", "--dim", "seq=8"], "onnx")

    def test_control_flow(self, folder):
        path = folder / "if.onnx"
        onnx.save(_matmul_model(control_flow=True), path)
        self._check(["inspect", path, "--dim", "batch=2"], "if")

    def test_old_opset_is_converted_with_a_note(self, folder):
        path = folder / "old.onnx"
        onnx.save(_matmul_model(opset=11), path)
        result = run_cli(["inspect", path, "--dim", "batch=2"])
        assert "uses opset 11: converted to opset 13 with onnx.version_converter" in result.stderr
        assert "version_converter" not in result.stdout  # said once, on stderr, not again under the table
        assert "32" in result.stdout  # the 8 x 4 weight

    @pytest.mark.parametrize("value", ["0", "-3"])
    def test_zero_or_negative_dim(self, folder, value):
        path = folder / "m.onnx"
        onnx.save(_matmul_model(), path)
        self._check(["inspect", path, "--dim", f"batch={value}"], "batch")

    def test_zero_dim_in_file(self, folder):
        path = folder / "zero.onnx"
        onnx.save(_matmul_model(batch=0), path)
        self._check(["inspect", path], "0")

    def test_every_unbound_dim_is_named_in_one_line(self, folder):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
        mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq", 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])
        graph = helper.make_graph([helper.make_node("Add", ["x", "mask"], ["y"])], "g", [x, mask], [y])
        path = folder / "two.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
        # each name once, at the first place it is read, in the inputs' order
        self._check(["inspect", path], "dims 'batch' (x[0]) and 'seq' (x[1]) are unbound; "
                                       "pass --dim batch=value --dim seq=value")
        self._check(["inspect", path, "--dim", "batch=2"], "dim 'seq' is unbound (x[1]); pass --dim seq=value")

    def test_unbound_dim_names_flag(self, folder):
        path = folder / "m.onnx"
        onnx.save(_matmul_model(), path)
        self._check(["inspect", path], "--dim batch=")


def test_devices_lists_presets():
    data = json.loads(run_cli(["devices", "--json"]).stdout)
    names = {row["name"] for row in data}
    assert {"v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "l40s", "rtx-4090",
            "gtx-1080ti", "rtx-2080ti", "mi300x"} <= names
