"""CPU offload (objectives.offload): bytes over the host link, time exposed beyond its overlap window and
device memory freed, by hand; the per-op pipeline arrays under each mode against the same formulas; the
launchers' rules and exports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import get_device, make_cluster
from objectives.offload import (
    HostSide,
    activation_offload,
    block_layers,
    cpu_step_bytes_per_parameter,
    host_side,
    optimizer_offload,
)
from objectives.compute import updated_parameters
from objectives.parameters import ParameterView, parameter_ownership
from planner.core.errors import InputError
from planner.core.degrees import parse_fix
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, graph_loader

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, 4 heads, vocab 1000


class TestHostSide:
    def test_h100_host_by_hand(self):
        side = host_side(get_device("h100-sxm"))
        assert side.link_bytes_per_s == 63.0e9  # PCIe Gen5 x16, one direction
        # 2 sockets x 8 channels x 4,800 MT/s x 8 bytes = 614.4 GB/s over 8 GPUs
        assert side.memory_bytes_per_s == pytest.approx(614.4e9 / 8)

    def test_a100_and_custom_hosts(self):
        assert host_side(get_device("a100-80gb")).link_bytes_per_s == 31.5e9
        assert host_side(get_device("a100-80gb")).memory_bytes_per_s == pytest.approx(2 * 8 * 3200e6 * 8 / 8)
        custom = dataclasses.replace(get_device("h100-sxm"), name="my-gpu")
        assert host_side(custom).link_bytes_per_s == 31.5e9  # a PCIe 4 host when nothing is known

    def test_cpu_step_bytes(self):
        # bf16 Adam: read+write fp32 master and two moments (2 x 12), read an fp32 grad (4), write bf16 (2)
        assert cpu_step_bytes_per_parameter(TrainingSettings()) == 30.0
        # bf16 SGD: 2 x (4 master + 4 momentum) + 4 + 2
        assert cpu_step_bytes_per_parameter(TrainingSettings(optimizer="sgd")) == 22.0


class TestOptimizerOffload:
    H100 = HostSide(link_bytes_per_s=63e9, memory_bytes_per_s=76.8e9, source="test")

    def test_by_hand_overlapped(self):
        n = 1e8  # owned parameter elements, bf16 Adam
        t = optimizer_offload(n, settings=TrainingSettings(), host=self.H100, backward_s=1e-3)
        d2h = 2e8 / 63e9  # bf16 gradients out: 3.17 ms
        h2d = 2e8 / 63e9  # bf16 weights back
        cpu = 30e8 / 76.8e9  # 39.06 ms of host memory traffic
        assert t.moved_bytes == 4e8
        assert t.saved_bytes == 12e8  # 12 bytes of master weight and moments per element
        assert float(t.exposed_s) == pytest.approx((d2h - 1e-3) + max(cpu, h2d))
        assert float(t.exposed_s) == pytest.approx(0.0412371, rel=1e-5)

    def test_by_hand_serial(self):
        t = optimizer_offload(1e8, settings=TrainingSettings(overlap=False), host=self.H100, backward_s=1e-3)
        assert float(t.exposed_s) == pytest.approx(2 * 2e8 / 63e9 + 30e8 / 76.8e9)

    def test_gradient_copy_hidden_under_a_long_backward(self):
        t = optimizer_offload(1e6, settings=TrainingSettings(), host=self.H100, backward_s=1.0)
        assert float(t.exposed_s) == pytest.approx(30e6 / 76.8e9)  # the CPU step alone


class TestActivationOffload:
    LINK = HostSide(link_bytes_per_s=63e9, memory_bytes_per_s=76.8e9, source="test")

    def test_by_hand(self):
        a = 6.3e7  # bytes one op saves per micro-batch, 4 layers
        t = activation_offload(a, layers=4, host=self.LINK, forward_s=0.5e-3, backward_s=1e-3)
        # 3 of 4 layers move: 4.725e7 bytes each way, 0.75 ms each way
        assert t.moved_bytes == pytest.approx(2 * 4.725e7)
        assert float(t.exposed_s) == pytest.approx((0.75e-3 - 0.5e-3) + 0.0)
        assert t.saved_bytes == pytest.approx(a / 2)  # two of four layers stay resident

    def test_two_layers_free_nothing_at_the_peak(self):
        t = activation_offload(1e6, layers=2, host=self.LINK, forward_s=1.0, backward_s=1.0)
        assert t.saved_bytes == 0.0 and float(t.exposed_s) == 0.0

    def test_block_layers_of_the_tiny_gpt2(self):
        graph = graph_loader(TINY, {"seq": 128})(4)
        layers = block_layers(graph)
        assert layers and set(layers.values()) == {2}


@pytest.fixture(scope="module")
def loader():
    return graph_loader(TINY, {"seq": 128})


def host_floor_s(arrays, index: int) -> float:
    """The op's step floor: the host dispatches one update per parameter tensor it owns (the device's
    ``host_dispatch_s`` each), whether the update runs on the GPU or on the CPU."""
    model = arrays.model
    if model.op_details[index].optimizer_s is None:
        return 0.0
    graph = model.graph
    updated = updated_parameters(graph.ops[index], ParameterView(graph), parameter_ownership(graph)[index])
    return len(updated) * model.cluster.device.host_dispatch_s


def _caches(loader, offload: str):
    cluster = make_cluster("a100-80gb", devices=8)
    settings = TrainingSettings(engine="fused", attention="flash")
    plain = PipelineCostCache(loader, cluster=cluster, settings=settings)
    offloaded = PipelineCostCache(loader, cluster=cluster, settings=dataclasses.replace(settings, offload=offload))
    return plain, offloaded, host_side(cluster.device)


class TestPipelineArrays:
    def test_optimizer_offload_per_op(self, loader):
        plain, offloaded, host = _caches(loader, "optimizer")
        a, b = plain.arrays(8, 4, 1, "none"), offloaded.arrays(8, 4, 1, "none")
        optimizer_s = [d.optimizer_s if d.optimizer_s is not None else 0.0 for d in a.model.op_details]
        for i in range(len(a.key)):
            elements = a.optimizer_bytes[i] / 12.0  # ZeRO-1 shard, 12 bytes per element
            d2h = h2d = elements * 2.0 / host.link_bytes_per_s
            cpu = elements * 30.0 / host.memory_bytes_per_s
            exposed = np.maximum(0.0, d2h - a.backward_s[i]) + np.maximum(cpu, h2d)
            np.testing.assert_allclose(b.step_s[i], a.step_s[i] - optimizer_s[i] + np.maximum(exposed, host_floor_s(a, i)),
                                       rtol=1e-12, atol=1e-15)
            np.testing.assert_array_equal(b.optimizer_bytes[i], 0.0)
            np.testing.assert_array_equal(b.params_bytes[i], a.params_bytes[i])
            np.testing.assert_array_equal(b.activations_bytes[i], a.activations_bytes[i])

    @pytest.mark.parametrize("offload", ["optimizer", "parameters"])
    def test_an_offloaded_step_is_never_faster_than_the_devices(self, loader, offload):
        # the tiny GPT-2's states are a few hundred KiB: its GPU step is the host floor (30 us per tensor),
        # and a CPU step priced by bandwidth alone came out faster than it (no copy can make a step shorter)
        plain, offloaded, _ = _caches(loader, offload)
        zero = 3 if offload == "parameters" else 1
        a, b = plain.arrays(8, 4, zero, "none"), offloaded.arrays(8, 4, zero, "none")
        for i in range(len(a.key)):
            assert np.all(b.step_s[i] >= a.step_s[i] - 1e-15), i

    def test_activation_offload_per_op(self, loader):
        plain, offloaded, host = _caches(loader, "activations")
        a, b = plain.arrays(8, 4, 0, "none"), offloaded.arrays(8, 4, 0, "none")
        layers = block_layers(a.model.graph)
        for i in range(len(a.key)):
            if i not in layers:  # embedding, head, loss: unchanged
                np.testing.assert_array_equal(b.activations_bytes[i], a.activations_bytes[i])
                np.testing.assert_array_equal(b.forward_s[i], a.forward_s[i])
                continue
            # 2 layers: one moves (half of each op's bytes on average), both stay resident at the peak
            copy_s = a.activations_bytes[i] / 2 / host.link_bytes_per_s
            np.testing.assert_allclose(b.forward_s[i], a.forward_s[i] + np.maximum(0.0, copy_s - a.forward_s[i]))
            np.testing.assert_allclose(b.backward_s[i], a.backward_s[i] + np.maximum(0.0, copy_s - a.backward_s[i]))
            np.testing.assert_allclose(b.activations_bytes[i], a.activations_bytes[i])

    def test_no_offload_leaves_the_arrays(self, loader):
        plain, _, _ = _caches(loader, "optimizer")
        again = PipelineCostCache(loader, cluster=plain.cluster, settings=dataclasses.replace(plain.settings, offload="none"))
        a, b = plain.arrays(8, 4, 2, "full"), again.arrays(8, 4, 2, "full")
        for name in ("forward_s", "backward_s", "step_s", "optimizer_bytes", "activations_bytes"):
            for x, y in zip(getattr(a, name), getattr(b, name)):
                np.testing.assert_array_equal(x, y)


class TestKnob:
    def test_settings_and_pins(self):
        assert TrainingSettings().offload == "none"
        with pytest.raises(InputError, match="offload must be none, optimizer, activations or parameters"):
            TrainingSettings(offload="params")  # type: ignore[arg-type]
        assert parse_fix("offload=optimizer,zero=1").pinned == {"zero": 1, "offload": "optimizer"}
        with pytest.raises(InputError, match="--fix offload must be"):
            parse_fix("offload=nvme")

    def test_launcher_rules(self):
        from exporters.targets import TARGETS

        runs = {n: TARGETS[n].runs_offload for n in ("megatron", "deepspeed", "torchtitan", "generic")}
        assert runs["megatron"]("optimizer", zero_stage=1, pp=4, recompute="full")
        assert not runs["megatron"]("optimizer", zero_stage=3, pp=1, recompute="none")
        assert runs["megatron"]("activations", zero_stage=0, pp=1, recompute="none")
        assert not runs["megatron"]("activations", zero_stage=0, pp=1, recompute="selective")
        assert runs["deepspeed"]("optimizer", zero_stage=2, pp=1, recompute="none")
        assert not runs["deepspeed"]("optimizer", zero_stage=0, pp=1, recompute="none")
        assert not runs["deepspeed"]("activations", zero_stage=1, pp=1, recompute="none")
        assert not runs["torchtitan"]("optimizer", zero_stage=3, pp=1, recompute="none")
        assert runs["generic"]("activations", zero_stage=3, pp=8, recompute="full")
