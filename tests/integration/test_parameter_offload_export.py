"""Parameter offload rows (issue 24 item 4, objectives.offload ``parameters``) accepted by the launchers' own
config code: torchtitan 0.3.0's ``ConfigManager`` reads ``--training.enable_cpu_offload`` on a ZeRO-3
(FSDP2) layout, and DeepSpeed 0.19.8's ``DeepSpeedConfig`` builds ZeRO-3 with ``offload_param`` and
``offload_optimizer`` on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import export
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.integration.test_launchable_export import deepspeed_config
from tests.integration.test_torchtitan_export import LLAMA, _parse

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _rows(path: Path, dims: dict, launcher: str):
    plan_request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8))
    _, (found,) = plan_launchable_file(path, dims, [plan_request], pins=Pins(offload="parameters"), launchers=(launcher,))
    rows = [row for row in found.rows if launcher in row.targets]
    assert rows and all(row.offload == "parameters" and row.point.zero_stage == 3 and row.point.pp == 1 for row in rows)
    return rows


def test_torchtitan_rows_enable_cpu_offload(tmp_path):
    pytest.importorskip("torchtitan")
    from torchtitan.distributed import ParallelDims

    for row in _rows(LLAMA, {"batch": 16, "seq": 128}, "torchtitan"):
        out = export("torchtitan", row_plan_input(row))
        assert "--training.enable_cpu_offload" in out["overrides"]
        config = _parse(out, tmp_path)
        assert config.training.enable_cpu_offload is True
        dims = ParallelDims.from_config(config.parallelism, out["world_size"])
        # ZeRO-3: every data-parallel rank shards; torchtitan applies fully_shard (with CPUOffloadPolicy) even
        # at dp_shard 1 (llama3/parallelize.py: "Always run apply_fsdp_to_decoder")
        assert dims.dp_shard == row.degrees.dp


def test_deepspeed_rows_offload_params_and_optimizer(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")

    for row in _rows(ROOT / "examples" / "gpt2.onnx", {"batch": 32, "seq": 128}, "deepspeed"):
        config = deepspeed_config(export("deepspeed", row_plan_input(row)), monkeypatch)
        zero = config.zero_config
        assert zero.stage == 3
        assert zero.offload_param is not None and zero.offload_param.device == "cpu" and zero.offload_param.pin_memory
        assert zero.offload_optimizer is not None and zero.offload_optimizer.device == "cpu"
