"""Parameter offload (objectives.offload ``parameters``: FSDP2's ``CPUOffloadPolicy``, torchtitan's
``training.enable_cpu_offload``, DeepSpeed ZeRO-3's ``offload_param``): the host-link seconds and the device
bytes by hand, the per-op pipeline arrays against the same formulas, a whole plan's memory breakdown, the
launchers' rules, exports and refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.offload import HostSide, cpu_step_s, host_side, parameter_offload
from planner.core.degrees import Pins, parse_fix
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, graph_loader
from tests.objectives.test_offload import host_floor_s
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, 4 heads, vocab 1000
H100 = HostSide(link_bytes_per_s=63e9, memory_bytes_per_s=76.8e9, source="DGX H100 (objectives.offload)")


class TestByHand:
    def test_copies_hidden_under_short_compute(self):
        n = 1e8  # elements of one rank's ZeRO-3 shard
        t = parameter_offload(n, settings=TrainingSettings(), host=H100, forward_s=2e-3, backward_s=4e-3)
        copy = 4e8 / 63e9  # fp32 shard, one direction: 6.349 ms at PCIe 5 x16 (63 GB/s)
        assert copy == pytest.approx(6.3492e-3, rel=1e-4)
        assert float(t.forward_s) == pytest.approx(copy - 2e-3)  # one H2D before the forward all-gather
        # backward: H2D before its all-gather and the gradient's D2H, both directions at once
        assert float(t.exposed_s) == pytest.approx((copy - 2e-3) + (copy - 4e-3))
        assert t.moved_bytes == 3 * 4e8  # two H2D, one D2H per micro-batch
        assert t.saved_bytes == 16e8  # bf16 weight 2 + bf16 grad 2 + master and moments 12 bytes

    def test_serial_and_long_compute(self):
        serial = parameter_offload(1e8, settings=TrainingSettings(overlap=False), host=H100, forward_s=1.0, backward_s=1.0)
        assert float(serial.forward_s) == pytest.approx(4e8 / 63e9)
        assert float(serial.exposed_s) == pytest.approx(3 * 4e8 / 63e9)
        hidden = parameter_offload(1e8, settings=TrainingSettings(), host=H100, forward_s=1.0, backward_s=1.0)
        assert float(hidden.exposed_s) == 0.0

    def test_cpu_step_is_the_optimizer_modes(self):
        # 1e8 elements x 30 B (bf16 Adam on the host) / 76.8 GB/s = 39.06 ms
        assert cpu_step_s(1e8, settings=TrainingSettings(), host=H100) == pytest.approx(30e8 / 76.8e9)


@pytest.fixture(scope="module")
def loader():
    return graph_loader(TINY, {"seq": 128})


class TestPipelineArrays:
    def test_zero3_columns(self, loader):
        cluster = make_cluster("a100-80gb", devices=8)
        settings = TrainingSettings(engine="fused", attention="flash")
        plain = PipelineCostCache(loader, cluster=cluster, settings=settings)
        offloaded = PipelineCostCache(loader, cluster=cluster, settings=dataclasses.replace(settings, offload="parameters"))
        host = host_side(cluster.device)
        a, b = plain.arrays(8, 4, 3, "none"), offloaded.arrays(8, 4, 3, "none")
        optimizer_s = [d.optimizer_s if d.optimizer_s is not None else 0.0 for d in a.model.op_details]
        moved = False
        for i in range(len(a.key)):
            elements = a.optimizer_bytes[i] / 12.0  # the ZeRO-3 shard, 12 bytes of master and moments each
            copy = elements * 4.0 / host.link_bytes_per_s  # 31.5 GB/s: PCIe 4 x16 of a DGX A100
            np.testing.assert_allclose(b.forward_s[i], a.forward_s[i] + np.maximum(0.0, copy - a.forward_s[i]), rtol=1e-12)
            np.testing.assert_allclose(b.backward_s[i], a.backward_s[i] + np.maximum(0.0, copy - a.backward_s[i]), rtol=1e-12)
            cpu = elements * 30.0 / host.memory_bytes_per_s
            np.testing.assert_allclose(b.step_s[i], a.step_s[i] - optimizer_s[i] + np.maximum(cpu, host_floor_s(a, i)),
                                       rtol=1e-12, atol=1e-15)
            for name in ("params_bytes", "grads_bytes", "optimizer_bytes"):
                np.testing.assert_array_equal(getattr(b, name)[i], 0.0)
            np.testing.assert_array_equal(b.activations_bytes[i], a.activations_bytes[i])
            moved |= bool(np.any(elements > 0))
        assert moved
        # the gathered weights of the blocks in flight stay on the device
        np.testing.assert_array_equal(b.flat["unsharded_bytes"], a.flat["unsharded_bytes"])

    def test_below_zero3_nothing_moves(self, loader):
        cluster = make_cluster("a100-80gb", devices=8)
        settings = TrainingSettings(engine="fused", attention="flash")
        a = PipelineCostCache(loader, cluster=cluster, settings=settings).arrays(8, 4, 2, "none")
        b = PipelineCostCache(loader, cluster=cluster, settings=dataclasses.replace(settings, offload="parameters")).arrays(8, 4, 2, "none")
        for x, y in zip(a.optimizer_bytes, b.optimizer_bytes):
            np.testing.assert_array_equal(x, y)


def test_plan_memory_breakdown():
    """dp=8, ZeRO-3, the tiny GPT-2 on 8 A100s: the shard's 2 + 2 + 12 bytes per element leave the device."""
    from objectives.cluster import make_cluster as cluster_of
    from planner.launchable import plan_launchable_file
    from planner.plan import PlanRequest

    memory = {}
    for offload in ("none", "parameters"):
        _, (found,) = plan_launchable_file(TINY, {"batch": 32, "seq": 128}, [PlanRequest(cluster=cluster_of("a100-80gb", devices=8))],
                                           pins=Pins(dp=8, zero=3, pp=1, recompute="none", mb=4, offload=offload),
                                           launchers=("generic",), collapse=0.0)
        memory[offload] = found.rows[0].point.memory
    before, after = memory["none"], memory["parameters"]
    shard = before.optimizer_bytes / 12.0  # 28,704 elements per device
    assert shard == 28704
    assert after.optimizer_bytes == 0.0
    assert before.params_bytes - after.params_bytes == 2 * shard  # bf16 weight shard
    assert before.grads_bytes - after.grads_bytes == 2 * shard  # bf16 gradient shard
    assert after.activations_bytes == before.activations_bytes


class TestRules:
    def test_pins(self):
        assert parse_fix("offload=parameters,zero=3").pinned == {"zero": 3, "offload": "parameters"}
        with pytest.raises(InputError, match="needs ZeRO-3"):
            parse_fix("offload=parameters,zero=2")
        with pytest.raises(InputError, match="none, optimizer, activations or parameters"):
            TrainingSettings(offload="nvme")  # type: ignore[arg-type]

    def test_launchers(self):
        from exporters.targets import TARGETS

        def runs(name, zero, pp=1):
            return TARGETS[name].runs_offload("parameters", zero_stage=zero, pp=pp, recompute="full")

        assert runs("torchtitan", 3) and runs("deepspeed", 3) and runs("dtensor", 3) and runs("generic", 3)
        assert not any(runs(name, 2) for name in ("torchtitan", "deepspeed", "dtensor", "generic"))
        assert not runs("torchtitan", 3, pp=2) and not runs("deepspeed", 3, pp=2)
        assert not runs("megatron", 3) and not runs("megatron", 1)  # Megatron-LM has no parameter offload

    def test_torchtitan_flag(self):
        from exporters.torchtitan.validate import parse_torchtitan_overrides, torchtitan_violations

        args = ["--training.enable_cpu_offload", "--parallelism.data_parallel_shard_degree", "8"]
        assert parse_torchtitan_overrides(args)["training.enable_cpu_offload"] is True
        assert parse_torchtitan_overrides([])["training.enable_cpu_offload"] is False  # torchtitan 0.3.0's default
        assert torchtitan_violations(args, world_size=8) == []


def test_deepspeed_export_offloads_params_and_optimizer():
    from exporters import export
    from objectives.cluster import make_cluster as cluster_of
    from planner.launchable import plan_launchable_file, row_plan_input
    from planner.plan import PlanRequest

    _, (found,) = plan_launchable_file(TINY, {"batch": 32, "seq": 128}, [PlanRequest(cluster=cluster_of("a100-80gb", devices=8))],
                                       pins=Pins(dp=8, pp=1, mb=4, offload="parameters"), launchers=("deepspeed",))
    row = next(row for row in found.rows if "deepspeed" in row.targets)
    zero = export("deepspeed", row_plan_input(row))["ds_config"]["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}


@pytest.mark.parametrize("extra, message", [
    (["--fix", "offload=parameters,zero=1"], "needs ZeRO-3"),
    (["--fix", "offload=parameters", "--target", "megatron"], "megatron runs offload none, optimizer or activations"),
])
def test_cli_refusals_one_line_exit_2(extra, message):
    result = run_cli(["plan", str(TINY), "--devices", "8", "--dim", "batch=32", "--dim", "seq=128", "-q", *extra],
                     expected_exit_code=2)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr


def test_generic_plan_round_trips_the_mode(tmp_path):
    """The plan JSON (its schema's ``offload`` enum) writes and reads ``parameters`` back."""
    from exporters.generic import read_plan, save_plan
    from objectives.cluster import make_cluster as cluster_of
    from planner.launchable import plan_launchable_file, row_plan_input
    from planner.plan import PlanRequest

    _, (found,) = plan_launchable_file(TINY, {"batch": 32, "seq": 128}, [PlanRequest(cluster=cluster_of("a100-80gb", devices=8))],
                                       pins=Pins(dp=8, zero=3, pp=1, recompute="none", mb=4, offload="parameters"),
                                       launchers=("generic",), collapse=0.0)
    document = save_plan(row_plan_input(found.rows[0]), tmp_path / "plan.json")
    assert document["training"]["offload"] == "parameters"
    assert read_plan(tmp_path / "plan.json").settings().offload == "parameters"
