"""A pinned expert-parallel degree a launcher cannot run says why (issue 25, task H1). ``--target deepspeed --fix
ep=2`` on a model DeepSpeed's AutoEP cannot shard ended in the general "no plan that deepspeed runs was found"
advice; it now gives AutoEP's own reason (the one the DeepSpeed export gives, :func:`exporters.deepspeed.autoep.
expert_parallel_problem`) and the pin to change. A launcher whose mesh has no expert axis (DTensor, Mesh-TF) says so.

Oracles: the router module paths are read here off the ONNX nodes' names (``/model/layers.0/block_sparse_moe/
router/MatMul``), the pattern every DeepSpeed 0.19.8 AutoEP preset matches is ``model.layers.N.mlp`` with a
``gate`` child (``module_inject/auto_ep_presets``; the real ``AutoEP.ep_parser`` on these configs:
``tests/integration/test_deepspeed_autoep_detect.py``), and the launchers' registry says which meshes have an
expert axis.
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from exporters.deepspeed.autoep import expert_parallel_problem
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launch_messages import pinned_refusal
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
GRANITE = ROOT / "tests" / "data" / "moe_router_cases" / "granitemoe_ts_bare.onnx"
DEEPSEEK = ROOT / "tests" / "data" / "moe_cases" / "deepseek_v3_ts_bare.onnx"
OLMOE = ROOT / "tests" / "data" / "moe_sweep_cases" / "olmoe_ts_bare.onnx"
DIMS = {"batch": 8, "seq": 16}
PRESET_BLOCK = re.compile(r"(?:.+\.)?model\.layers\.\d+\.mlp")  # auto_ep_presets' moe_layer_pattern, any wrapper


def _refusal(path: Path, launcher: str, pins: Pins) -> str:
    graph = graph_loader(path, DIMS)(DIMS["batch"])
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8))
    return pinned_refusal(graph, request, PipelineOptions(global_batch=DIMS["batch"]), pins, [launcher])


def _routers(path: Path) -> list[str]:
    """The router modules, from the TopK nodes' names (``/model/layers.0/block_sparse_moe/router/TopK``)."""
    names = [n.name for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "TopK"]
    return [".".join(part for part in n.strip("/").split("/")[:-1]) for n in names]


def test_granite_router_autoep_does_not_find_is_named():
    routers = _routers(GRANITE)
    assert routers == ["model.layers.0.block_sparse_moe.router", "model.layers.1.block_sparse_moe.router"]
    assert not any(PRESET_BLOCK.fullmatch(r.rsplit(".", 1)[0]) for r in routers)  # no preset finds the block
    line = _refusal(GRANITE, "deepspeed", Pins(ep=2))
    head, _, fix = line.partition("); ")
    assert head.startswith("deepspeed runs ep 1 on this model (ep=2: ")
    assert routers[0] in head and "detect no MoE layer" in head
    assert fix == "--fix ep=2 leaves none: drop it or use --fix ep=1"
    # the export's reason, word for word (without its own advice)
    reason = head.removeprefix("deepspeed runs ep 1 on this model (ep=2: ")
    assert expert_parallel_problem(graph_loader(GRANITE, DIMS)(DIMS["batch"])) == f"{reason}; plan ep=1"


def test_sigmoid_router_autoep_finds_gives_the_gate_reason():
    # DeepSeek-V3's blocks are named as AutoEP's presets look for them; its sigmoid router is the reason
    assert all(PRESET_BLOCK.fullmatch(r.rsplit(".", 1)[0]) for r in _routers(DEEPSEEK))
    line = _refusal(DEEPSEEK, "deepspeed", Pins(ep=2))
    assert line.startswith("deepspeed runs ep 1 on this model (ep=2: DeepSpeed-MoE's gate is a softmax top-2; "
                           "this model routes with sigmoid scores")
    assert line.endswith("; --fix ep=2 leaves none: drop it or use --fix ep=1")


def test_a_model_autoep_runs_has_no_ep_reason():
    line = _refusal(OLMOE, "deepspeed", Pins(ep=2))
    assert "ep 1" not in line and "--fix ep=" not in line


@pytest.mark.parametrize("launcher", [name for name in ("dtensor", "meshtf") if not TARGETS[name].expert_parallel])
def test_mesh_without_expert_axis(launcher: str):
    assert _refusal(GRANITE, launcher, Pins(ep=2)) == (
        f"{launcher} runs ep 1 (its mesh has no expert axis: every rank keeps every expert); "
        "--fix ep=2 leaves none: drop it or use --fix ep=1")


def test_cli_says_it_in_one_line_exit_2():
    # 2 devices (ep=2 fits them): the same line as on 8 but for its "8 devices: " prefix, in 70% of the time
    result = run_cli(["plan", GRANITE, "-n", "2", "--dim", "batch=8", "--dim", "seq=16", "--target", "deepspeed",
                      "--fix", "ep=2"], expected_exit_code=2)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "block_sparse_moe.router" in lines[0] and lines[0].endswith("--fix ep=2 leaves none: drop it or use --fix ep=1")
