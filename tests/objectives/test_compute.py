"""Roofline compute time by hand; dtype fallbacks; measured times with counted fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.objectives.graphs import single_matmul
from objectives.cluster import get_device
from objectives.compute import (
    BACKWARD_BYTES_FACTOR,
    FAMILY_EFFICIENCY,
    MEMORY_BANDWIDTH_EFFICIENCY,
    op_compute_time_s,
    peak_flops_per_s,
)
from planner.core.cluster import Device
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op, Tensor, TensorAccess
from planner.core.settings import TrainingSettings

DEVICE = Device(name="toy", peak_flops={"bf16": 100e12, "fp32": 10e12}, memory_bytes=10**10,
                memory_bandwidth_bytes_per_s=1e12)
BF16 = TrainingSettings(precision="bf16-mixed")
FP32 = TrainingSettings(precision="fp32")


def matmul_setup(m=4096, n=4096, k=4096, devices=4):
    graph = single_matmul(m, n, k)
    op = graph.ops[0]
    space = enumerate_configs(op, ConfigOptions(devices=devices, devices_per_node=devices))
    return graph, op, space


class TestRoofline:
    def test_compute_bound_matmul_by_hand(self):
        graph, op, space = matmul_setup()
        times = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16)
        row = space.index_of({"m": 2})
        flops = 2 * 4096**3 / 2  # per device
        eff = FAMILY_EFFICIENCY["matmul"]
        # bytes: x shard 2048x4096, w 4096x4096, y 2048x4096, 2 bytes each -> far below the FLOP time
        num_bytes = (2048 * 4096 + 4096 * 4096 + 2048 * 4096) * 2
        assert num_bytes / (1e12 * MEMORY_BANDWIDTH_EFFICIENCY) < flops / (100e12 * eff)
        latency = DEVICE.kernel_latency_s  # one forward kernel, two backward (both gradients)
        assert times.forward_s[row] == pytest.approx(flops / (100e12 * eff) + latency, rel=1e-12)
        assert times.backward_s[row] == pytest.approx(2 * flops / (100e12 * eff) + 2 * latency, rel=1e-12)
        assert times.fallbacks == 0 and times.measured == 0

    def test_precision_picks_the_peak(self):
        graph, op, space = matmul_setup()
        bf16 = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16)
        fp32 = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=FP32)
        latency = DEVICE.kernel_latency_s  # the fixed per-kernel part does not scale with the peak
        np.testing.assert_allclose(fp32.forward_s - latency, 10 * (bf16.forward_s - latency), rtol=1e-9)

    def test_memory_bound_elementwise_by_hand(self):
        op = Op(
            name="relu", kind="elementwise", op_type="Relu",
            dims=(IterDim(name="i", size=1024), IterDim(name="j", size=1024)),
            inputs=(TensorAccess(tensor="a", axes=(("i",), ("j",))),),
            outputs=(TensorAccess(tensor="b", axes=(("i",), ("j",))),),
            flops=1024 * 1024, backward_flops_factor=1.0,
        )
        tensors = {n: Tensor(name=n, shape=(1024, 1024), dtype="float32", role="activation") for n in "ab"}
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
        times = op_compute_time_s(op, space, tensors=tensors, device=DEVICE, settings=FP32)
        row = space.index_of({"i": 4})
        num_bytes = 2 * (256 * 1024) * 4  # in + out shards, fp32
        expected = num_bytes / (1e12 * MEMORY_BANDWIDTH_EFFICIENCY)
        latency = DEVICE.kernel_latency_s  # one kernel each way
        assert times.forward_s[row] == pytest.approx(expected + latency, rel=1e-12)
        assert times.backward_s[row] == pytest.approx(BACKWARD_BYTES_FACTOR * expected + latency, rel=1e-12)

    def test_kernel_latency_is_the_floor_of_a_tiny_shard(self):
        # a shard of a few elements costs the kernels' fixed time, whatever its FLOPs and bytes
        import dataclasses

        op = Op(
            name="mm", kind="matmul", op_type="MatMul",
            dims=(IterDim(name="m", size=2), IterDim(name="k", size=2, kind="reduction")),
            inputs=(TensorAccess(tensor="a", axes=(("m",), ("k",))),),
            outputs=(TensorAccess(tensor="b", axes=(("m",),)),), flops=8.0,
        )
        tensors = {"a": Tensor(name="a", shape=(2, 2), dtype="float32", role="activation"),
                   "b": Tensor(name="b", shape=(2,), dtype="float32", role="activation")}
        space = enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1))
        slow = dataclasses.replace(DEVICE, kernel_latency_s=1e-3)
        times = op_compute_time_s(op, space, tensors=tensors, device=slow, settings=FP32)
        assert times.forward_s[0] == pytest.approx(1e-3, rel=1e-6)
        assert times.backward_s[0] == pytest.approx(2e-3, rel=1e-6)

    def test_more_devices_never_slower(self):
        graph, op, space = matmul_setup()
        times = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16)
        one = times.total_s[0]
        assert np.all(times.total_s[1:] <= one)


class TestPeak:
    def test_fallbacks(self):
        assert peak_flops_per_s(get_device("v100-32gb"), "bf16") == pytest.approx(125e12)
        assert peak_flops_per_s(get_device("gtx-1080ti"), "bf16") == pytest.approx(11.34e12)
        assert peak_flops_per_s(get_device("h100-sxm"), "bf16") == pytest.approx(989.5e12)
        only_tf32 = Device(name="x", peak_flops={"tf32": 5e13, "bf16": 1e14}, memory_bytes=1,
                           memory_bandwidth_bytes_per_s=1.0)
        assert peak_flops_per_s(only_tf32, "fp32") == 5e13


class TestMeasured:
    def test_measured_with_counted_fallbacks(self):
        graph, op, space = matmul_setup(64, 64, 64)
        seen = []

        def measured(o, factors):
            seen.append(dict(factors))
            return 1e-3 if factors["m"] == 2 else None

        times = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16, measured=measured)
        roofline = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16)
        rows = np.flatnonzero(space.factors[:, 0] == 2)
        assert times.measured == rows.size and times.fallbacks == space.size - rows.size
        np.testing.assert_allclose(times.forward_s[rows], 1e-3)
        np.testing.assert_allclose(times.backward_s[rows], op.backward_flops_factor * 1e-3)
        others = np.setdiff1d(np.arange(space.size), rows)
        np.testing.assert_allclose(times.forward_s[others], roofline.forward_s[others])
        assert len(seen) == space.size and set(seen[0]) == {"m", "n", "k"}


class TestExecutionModels:
    """Eager vs fused on a tiny graph, by hand (objectives.compute module docstring)."""

    ROWS, COLS = 4096, 4096
    KAPPA, HOST = 5e-6, 1e-5

    def setup(self):
        from planner.core.graph import OpGraph

        device = Device(name="toy", peak_flops={"bf16": 100e12, "fp32": 10e12}, memory_bytes=10**10,
                        memory_bandwidth_bytes_per_s=1e12, kernel_overhead_s=self.KAPPA, host_dispatch_s=self.HOST)
        tensors = {
            "x": Tensor(name="x", shape=(self.ROWS, self.COLS), dtype="float32", role="activation"),
            "y": Tensor(name="y", shape=(self.ROWS, self.COLS), dtype="float32", role="activation", producer="gelu"),
        }
        dims = (IterDim(name="m", size=self.ROWS, is_batch=True), IterDim(name="n", size=self.COLS))
        access = lambda t: TensorAccess(tensor=t, axes=(("m",), ("n",)))  # noqa: E731
        op = Op(name="gelu", kind="elementwise", op_type="Mul", dims=dims, inputs=(access("x"),),
                outputs=(access("y"),), flops=4.0 * self.ROWS * self.COLS, fused_pointwise=3,
                onnx_nodes=("gelu", "tanh", "add", "mul"))
        space = enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1))
        return device, tensors, op, space

    def times(self, engine, precision="fp32"):
        from objectives.execution import ExecutionModel

        device, tensors, op, space = self.setup()
        return op_compute_time_s(op, space, tensors=tensors, device=device,
                                 settings=TrainingSettings(precision=precision),
                                 execution=ExecutionModel(engine=engine, attention="flash"))

    def test_fused_chain_is_one_kernel_over_its_operands(self):
        bw = 1e12 * MEMORY_BANDWIDTH_EFFICIENCY
        tensor = self.ROWS * self.COLS * 4  # fp32
        times = self.times("fused")
        assert times.forward_s[0] == pytest.approx(2 * tensor / bw + self.KAPPA, rel=1e-12)
        assert times.backward_s[0] == pytest.approx(2 * 2 * tensor / bw + self.KAPPA, rel=1e-12)

    def test_eager_chain_pays_every_node(self):
        bw = 1e12 * MEMORY_BANDWIDTH_EFFICIENCY
        tensor = self.ROWS * self.COLS * 4
        times = self.times("eager")
        # 3 folded nodes: each reads and writes the tensor once (2 passes) forward, 1.5x that backward;
        # 4 kernels forward, 1 + 2 x 3 backward
        forward = 2 * tensor / bw + 3 * 2 * tensor / bw + 4 * self.KAPPA
        backward = 2 * 2 * tensor / bw + 1.5 * 3 * 2 * tensor / bw + 7 * self.KAPPA
        assert times.forward_s[0] == pytest.approx(forward, rel=1e-12)
        assert times.backward_s[0] == pytest.approx(backward, rel=1e-12)

    def test_eager_exact_gelu_is_one_kernel(self):
        """The exporter's exact GELU (Div, Erf, Add, Mul, Mul) runs as one eager kernel (nn.GELU): the
        op's own read and write forward, its backward's, one kernel each way; no folded node's traffic."""
        import dataclasses

        from objectives.execution import ExecutionModel

        device, tensors, op, space = self.setup()
        op = dataclasses.replace(op, fused_pointwise=4, onnx_nodes=("d", "e", "a", "m", "m2"),
                                 node_types=("Div", "Erf", "Add", "Mul", "Mul"))
        times = op_compute_time_s(op, space, tensors=tensors, device=device, settings=TrainingSettings(precision="fp32"),
                                  execution=ExecutionModel(engine="eager", attention="flash"))
        bw = 1e12 * MEMORY_BANDWIDTH_EFFICIENCY
        tensor = self.ROWS * self.COLS * 4
        assert times.forward_s[0] == pytest.approx(2 * tensor / bw + self.KAPPA, rel=1e-12)
        assert times.backward_s[0] == pytest.approx(2 * 2 * tensor / bw + self.KAPPA, rel=1e-12)

    def test_eager_autocast_moves_fp32(self):
        """bf16-mixed under eager: elementwise ops run on fp32 tensors (autocast), as fp32 does."""
        assert self.times("eager", "bf16-mixed").forward_s[0] == pytest.approx(self.times("eager").forward_s[0])
        assert self.times("fused", "bf16-mixed").forward_s[0] < self.times("fused").forward_s[0]

    def test_misaligned_gemm_is_slow(self):
        from objectives.compute import MISALIGNED_MATMUL_EFFICIENCY
        from objectives.execution import ExecutionModel

        fused = ExecutionModel(engine="fused", attention="flash")
        times = {}
        for n in (50257, 50304):
            graph = single_matmul(8192, n, 768)
            op = graph.ops[0]
            space = enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1))
            times[n] = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16,
                                         execution=fused).forward_s[0]
        assert times[50304] == pytest.approx(2 * 8192 * 50304 * 768 / (100e12 * FAMILY_EFFICIENCY["matmul"])
                                             + DEVICE.kernel_overhead_s, rel=1e-9)
        assert times[50257] == pytest.approx(2 * 8192 * 50257 * 768 / (100e12 * MISALIGNED_MATMUL_EFFICIENCY)
                                             + DEVICE.kernel_overhead_s, rel=1e-9)
