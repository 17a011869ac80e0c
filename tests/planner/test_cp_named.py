"""A context-parallel row is called cp everywhere, and ``--fix tp_overlap=on`` means tp > 1 (issue 22/24,
sweep H5 findings 2 and 10).

Oracles: the degrees the pins ask for (``--fix cp=4,tp=1,pp=1`` on 8 devices: dp = 8 / 4 = 2, tp = 1),
hand-built one-op graphs whose split dims are named by hand, and Megatron-LM's rule that the
tensor-parallel overlap needs ``tp > 1`` with sequence parallelism.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from exporters import export
from exporters._common import strategy_degrees
from exporters._target import Family
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.degrees import Pins, dominant_degrees, parse_fix
from planner.core.errors import InputError, UnsupportedExport
from planner.core.graph import IterDim, Op, OpGraph, Tensor, TensorAccess
from planner.core.settings import TrainingSettings
from planner.families import named_point
from planner.launchable import launch_frontier, row_plan_input
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest
from tests.planner.cli_helpers import run_cli

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"
CP_PLAN = ["plan", LLAMA, "-n", "8", "--dim", "batch=4", "--dim", "seq=4096", "--target", "megatron", "-q"]


def _one_matmul(seq_split: int, hidden_split: int):
    """``y[s, n] = x[s, k] @ w[k, n]`` with ``--dim seq=4096`` bound: ``s`` is the sequence (cp),
    ``n`` a weight dim (tp)."""
    op = Op(name="mm", kind="matmul", op_type="MatMul", flops=2.0 * 4096 * 64 * 64,
            inputs=(TensorAccess(tensor="x", axes=(("s",), ("k",))), TensorAccess(tensor="w", axes=(("k",), ("n",)))),
            outputs=(TensorAccess(tensor="y", axes=(("s",), ("n",))),),
            dims=(IterDim(name="s", size=4096), IterDim(name="n", size=64), IterDim(name="k", size=64, kind="reduction")))
    tensors = {"x": Tensor(name="x", shape=(4096, 64), dtype="float32", role="activation"),
               "w": Tensor(name="w", shape=(64, 64), dtype="float32", role="parameter"),
               "y": Tensor(name="y", shape=(4096, 64), dtype="float32", role="activation")}
    graph = OpGraph(name="g", ops=(op,), tensors=tensors, edges=(), dim_bindings={"seq": 4096})
    space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    return graph, [space], [space.index_of({"s": seq_split, "n": hidden_split})]


class TestNamedByWhatTheySplit:
    @pytest.mark.parametrize(("seq_split", "hidden_split", "tp", "cp", "summary"),
                             [(8, 1, 1, 8, "cp=8"), (1, 8, 8, 1, "tp=8"), (4, 2, 2, 4, "cp=4 x tp=2")])
    def test_the_generic_plans_mesh_degrees(self, seq_split, hidden_split, tp, cp, summary):
        graph, spaces, choice = _one_matmul(seq_split, hidden_split)
        degrees = strategy_degrees(graph, spaces, choice)
        assert (degrees.dp, degrees.tp, degrees.cp, degrees.devices_used) == (1, tp, cp, 8)
        assert degrees.summary == summary
        assert dominant_degrees(graph, spaces, choice)[0] == (1, tp, cp, 1)


@pytest.fixture(scope="module")
def cp_files(tmp_path_factory):
    """The table's JSON and row 1's generic plan of ``--fix cp=4,tp=1,pp=1``, and a data-parallel plan."""
    folder = tmp_path_factory.mktemp("cp")
    table = json.loads(run_cli([*CP_PLAN, "--fix", "cp=4,tp=1,pp=1", "--json", "--pick", 1, "--export", "generic",
                                "-o", folder / "cp.json"]).stdout)
    run_cli([*CP_PLAN, "--fix", "dp=4,tp=1,cp=1,pp=1", "--pick", 1, "--export", "generic", "-o", folder / "dp.json"])
    return table, folder


class TestContextRowsOnTheCommandLine:
    def test_every_json_row_says_tp_1_and_cp_4(self, cp_files):
        table, _ = cp_files
        assert table["rows"]
        for row in table["rows"]:
            assert (row["dp"], row["tp"], row["cp"], row["pp"]) == (2, 1, 4, 1)  # 8 devices / cp 4 = dp 2
            assert row["degrees"] == {"dp": 2, "tp": 1, "pp": 1, "cp": 4, "ep": 1}

    def test_the_generic_plans_mesh(self, cp_files):
        _, folder = cp_files
        mesh = json.loads((folder / "cp.json").read_text())["mesh"]
        assert {k: mesh[k] for k in ("devices_used", "dp", "tp", "cp", "pp", "summary")} == {
            "devices_used": 8, "dp": 2, "tp": 1, "cp": 4, "pp": 1, "summary": "dp=2 x cp=4"}

    def test_explain_and_compare_say_cp(self, cp_files):
        _, folder = cp_files
        explained = json.loads(run_cli(["explain", folder / "cp.json", "--json"]).stdout)
        assert (explained["dp"], explained["tp"], explained["cp"]) == (2, 1, 4)
        assert explained["summary"].startswith("pp=1 x dp=2 x cp=4, mb=")
        assert run_cli(["explain", folder / "cp.json"]).stdout.startswith("pp=1 x dp=2 x cp=4, mb=")
        compared = json.loads(run_cli(["compare", folder / "dp.json", folder / "cp.json", "--json"]).stdout)
        assert compared["settings_that_differ"]["dp"] == [4, 2]
        assert compared["settings_that_differ"]["cp"] == [1, 4]
        assert "tp" not in compared["settings_that_differ"]

    def test_a_plan_written_before_cp_still_reads(self, cp_files, tmp_path):
        _, folder = cp_files
        document = json.loads((folder / "cp.json").read_text())
        del document["mesh"]["cp"]
        document["mesh"].update(tp=4, summary="tp=4")  # as the planner wrote a cp row before
        old = tmp_path / "old.json"
        old.write_text(json.dumps(document))
        explained = json.loads(run_cli(["explain", old, "--json"]).stdout)
        assert (explained["tp"], explained["cp"]) == (1, 4)  # named from the ops, not the old mesh


@pytest.fixture(scope="module")
def cp_row():
    loader = graph_loader(LLAMA, {"seq": 4096})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8))
    found = launch_frontier(loader, request, options=PipelineOptions(global_batch=4), pins=Pins(cp=4, tp=1, pp=1),
                            launchers=("megatron",))
    return found.rows[0]


def test_a_priced_points_degrees_are_named_by_what_they_split(cp_row):
    """The pipeline point counts every non-batch split in its ``tp`` (4 here); :func:`named_point`, which
    the headroom line and explain read, says cp=4 and tp=1 as the pins do."""
    point = cp_row.point
    assert (point.dp, point.tp) == (2, 4)
    dp, tp, cp, summary = named_point(point)
    assert (dp, tp, cp) == (2, 1, 4)
    assert summary == f"pp=1 x dp=2 x cp=4, mb={point.summary.split(', mb=', 1)[1]}" and "tp=" not in summary


def test_deepspeed_names_context_parallelism_not_autotp(cp_row):
    """A Megatron-LM cp row is refused by DeepSpeed for what it is (ring context parallelism, which
    DeepSpeed runs only as Ulysses), never as 'AutoTP tp=4 must divide ...'."""
    plan_input = row_plan_input(cp_row)
    # Megatron's fused SwiGLU credit is refused first for DeepSpeed; drop it to reach the layout's reason
    plan_input = dataclasses.replace(plan_input, settings=dataclasses.replace(plan_input.settings, fused_swiglu=False))
    with pytest.raises(UnsupportedExport) as refused:
        export("deepspeed", plan_input)
    message = str(refused.value)
    assert "cp=4" in message and "Ulysses" in message and "AutoTP" not in message and "tp=4" not in message


class TestTensorParallelOverlapPin:
    SETTINGS = TrainingSettings(tp_comm_overlap=True)

    @pytest.mark.parametrize(("tp", "cp", "sp", "runs"), [(1, 4, False, False), (1, 1, False, False),
                                                          (2, 1, True, True), (2, 2, True, True), (2, 1, False, False)])
    def test_megatron_runs_the_overlap_only_with_tp_and_sequence_parallelism(self, tp, cp, sp, runs):
        family = Family(label="f", tp=tp, cp=cp, sp=sp, masks=(np.ones(1, bool),))
        assert TARGETS["megatron"].runs_tp_overlap(family, self.SETTINGS) is runs
        assert TARGETS["megatron"].runs_tp_overlap(family, TrainingSettings()) is True  # off: every family

    def test_a_pinned_tp_1_is_refused_in_one_line(self):
        with pytest.raises(InputError, match="tp=1 does not have"):
            parse_fix("tp_overlap=on,tp=1")
        result = run_cli([*CP_PLAN, "--fix", "tp_overlap=on,tp=1"], expected_exit_code=2)
        assert len(result.stderr.strip().splitlines()) == 1

    def test_every_listed_row_has_tp_above_1_and_sequence_parallelism(self):
        table = json.loads(run_cli([*CP_PLAN, "--fix", "tp_overlap=on", "--json"]).stdout)
        assert table["rows"]
        for row in table["rows"]:
            assert row["tp"] > 1 and row["layout"].endswith(" sp"), row["summary"]
            assert row["dp"] * row["cp"] * row["tp"] * row["pp"] <= 8
