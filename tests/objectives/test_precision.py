"""FP8 linear layers (objectives.precision): GEMM time at the FP8 peak, the casts, memory terms, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from tests.objectives.graphs import single_matmul
from objectives.cluster import get_device
from objectives.compute import FAMILY_EFFICIENCY, MEMORY_BANDWIDTH_EFFICIENCY, op_compute_time_s
from objectives.execution import ExecutionModel
from objectives.memory import parameter_state_bytes, state_bytes_per_parameter
from objectives.precision import (
    AMAX_HISTORY_LEN,
    amax_state_bytes,
    cast_bytes,
    fp8_devices,
    is_fp8_linear,
    require_fp8,
)
from planner.core.cluster import Device
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings

DEVICE = Device(name="toy", peak_flops={"bf16": 100e12, "fp8": 200e12, "fp32": 10e12}, memory_bytes=10**10,
                memory_bandwidth_bytes_per_s=1e12)
BF16 = TrainingSettings()
DELAYED = TrainingSettings(fp8="delayed")
ROWWISE = TrainingSettings(fp8="rowwise")


def _setup(m=4096, n=4096, k=4096, devices=4):
    graph = single_matmul(m, n, k)
    op = graph.ops[0]
    return graph, op, enumerate_configs(op, ConfigOptions(devices=devices, devices_per_node=devices))


class TestGemmTime:
    def test_fp8_gemm_by_hand(self):
        # y[4096, 4096] = x[4096, 4096] @ w, m split 2 ways: 2 * 2048 * 4096^2 FLOPs per device, compute-bound
        graph, op, space = _setup()
        row = space.index_of({"m": 2})
        times = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=DELAYED)
        flops = 2 * 2048 * 4096 * 4096
        eff = FAMILY_EFFICIENCY["matmul"]
        stream = 1e12 * MEMORY_BANDWIDTH_EFFICIENCY
        x, w, y = 2048 * 4096, 4096 * 4096, 2048 * 4096
        latency = DEVICE.kernel_latency_s
        # FP8 GEMMs reach 0.78 of their peak where bf16 ones reach 0.69 (torchao's H100 roofline), so the
        # FP8 rate is 200 x 0.78 / 0.69 = 226.1 TFLOP/s before the bf16 efficiency
        rate = 200e12 * 0.78 / 0.69
        # delayed scaling: forward casts x (read 2 B, write 1 B + a 1 B transpose), backward dY; the weight
        # is cast once per step (Transformer Engine's cached FP8 weight), not per micro-batch
        assert times.forward_s[row] == pytest.approx(flops / (rate * eff) + latency + 4 * x / stream)
        assert times.backward_s[row] == pytest.approx(2 * flops / (rate * eff) + 2 * latency + 4 * y / stream)
        assert w == 4096 * 4096  # the weight's 16.8M elements cost no cast per micro-batch

    def test_compute_bound_ratio_is_the_peak_ratio(self):
        # without the casts (their bytes subtracted), FP8 over bf16 is peak_bf16 / (peak_fp8 x 0.78 / 0.69)
        # = 0.69 / 1.56 = 0.4423
        graph, op, space = _setup()
        bf16 = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16)
        fp8 = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=DELAYED)
        cast_fwd, _ = cast_bytes(op, space, tensors=graph.tensors, settings=DELAYED)
        latency = DEVICE.kernel_latency_s
        gemm = fp8.forward_s - cast_fwd / (1e12 * MEMORY_BANDWIDTH_EFFICIENCY) - latency
        np.testing.assert_allclose(gemm, (bf16.forward_s - latency) * 0.69 / (2 * 0.78), rtol=1e-9)

    def test_h100_preset_halves_a_compute_bound_gemm(self):
        # h100-sxm: 1,979 / 989.5 TFLOP/s (datasheet, dense), FP8 at 0.78 / 0.69 the bf16 efficiency
        graph, op, space = _setup(8192, 8192, 8192, devices=1)
        device = get_device("h100-sxm")
        bf16 = op_compute_time_s(op, space, tensors=graph.tensors, device=device, settings=BF16)
        fp8 = op_compute_time_s(op, space, tensors=graph.tensors, device=device, settings=ROWWISE)
        cast_fwd, _ = cast_bytes(op, space, tensors=graph.tensors, settings=ROWWISE)
        stream = device.memory_bandwidth_bytes_per_s * MEMORY_BANDWIDTH_EFFICIENCY
        assert (fp8.forward_s[0] - cast_fwd[0] / stream) / bf16.forward_s[0] == pytest.approx(989.5 * 0.69 / (1979.0 * 0.78), rel=1e-6)

    def test_under_an_execution_model_too(self):
        graph, op, space = _setup()
        fused = ExecutionModel(engine="fused", attention="flash")
        bf16 = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16, execution=fused)
        fp8 = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=DELAYED, execution=fused)
        row = space.index_of({"m": 2})
        cast_fwd, _ = cast_bytes(op, space, tensors=graph.tensors, settings=DELAYED)
        overhead = DEVICE.kernel_overhead_s
        gemm = fp8.forward_s[row] - cast_fwd[row] / (1e12 * MEMORY_BANDWIDTH_EFFICIENCY) - overhead
        assert gemm == pytest.approx((bf16.forward_s[row] - overhead) * 0.69 / (2 * 0.78), rel=1e-9)

    def test_rowwise_casts_by_hand(self):
        graph, op, space = _setup()
        row = space.index_of({"m": 2})
        forward, backward = cast_bytes(op, space, tensors=graph.tensors, settings=ROWWISE)
        x, w, y = 2048 * 4096, 4096 * 4096, 2048 * 4096
        # one kernel per cast: read bf16 (2), the row's amax on chip, write FP8 (1) (torchao's roofline);
        # backward: dY twice (along each axis), w and x^T once each
        assert forward[row] == 3 * (x + w) == 75_497_472
        assert backward[row] == 3 * (2 * y + w + x) == 125_829_120

    def test_delayed_casts_by_hand(self):
        # m split 2 ways: x and y are 2048 x 4096 = 8,388,608 elements per device; 4 B each (cast +
        # transpose), the cached weight none
        graph, op, space = _setup()
        row = space.index_of({"m": 2})
        forward, backward = cast_bytes(op, space, tensors=graph.tensors, settings=DELAYED)
        assert forward[row] == 4 * 8_388_608 == 33_554_432
        assert backward[row] == 33_554_432
        # a split of the weight's n: the input stays whole (4096 x 4096), the output is halved
        row = space.index_of({"n": 2})
        forward, backward = cast_bytes(op, space, tensors=graph.tensors, settings=DELAYED)
        assert (forward[row], backward[row]) == (4 * 16_777_216, 4 * 8_388_608)

    def test_bf16_pricing_untouched(self):
        # the FP8 terms only apply with settings.fp8: a bf16 run of the same GEMM prices at the bf16 peak
        graph, op, space = _setup()
        row = space.index_of({"m": 2})
        times = op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=BF16)
        flops = 2 * 2048 * 4096 * 4096
        bytes_fwd = 2 * (2048 * 4096 + 4096 * 4096 + 2048 * 4096)
        expected = max(flops / (100e12 * FAMILY_EFFICIENCY["matmul"]), bytes_fwd / (1e12 * MEMORY_BANDWIDTH_EFFICIENCY))
        assert times.forward_s[row] == pytest.approx(expected + DEVICE.kernel_latency_s)
        assert not cast_bytes(op, space, tensors=graph.tensors, settings=BF16)[0].any()


class TestWhichLinears:
    def test_unaligned_weight_and_the_head_stay_bf16(self):
        graph, op, _ = _setup(64, 50257, 768)  # GPT-2's head: 50,257 is no multiple of 16
        assert not is_fp8_linear(op, graph.tensors, DELAYED)
        graph, op, _ = _setup(64, 1024, 768)
        assert is_fp8_linear(op, graph.tensors, DELAYED)
        assert not is_fp8_linear(op, graph.tensors, DELAYED, graph_output=True)
        assert not is_fp8_linear(op, graph.tensors, BF16)

    def test_product_of_two_activations_stays_bf16(self):
        graph = single_matmul(64, 64, 64, param=False)
        assert not is_fp8_linear(graph.ops[0], graph.tensors, DELAYED)


class TestMemory:
    def test_state_bytes(self):
        # delayed: bf16 weight (2) + its FP8 copy and transpose (1 + 1), grads 2, fp32 master + Adam 12
        per = state_bytes_per_parameter(DELAYED)
        assert (per.param, per.grad, per.optimizer, per.gathered) == (4.0, 2.0, 12.0, 2.0)
        assert state_bytes_per_parameter(ROWWISE).total == state_bytes_per_parameter(BF16).total == 16.0

    def test_parameter_state_by_hand(self):
        graph, op, space = _setup(64, 1024, 768, devices=1)
        params, grads, optimizer = parameter_state_bytes(op, space, tensors=graph.tensors, settings=DELAYED)
        assert (params[0], grads[0], optimizer[0]) == (768 * 1024 * 4, 768 * 1024 * 2, 768 * 1024 * 12)

    def test_amax_history(self):
        # Transformer Engine DelayedScaling: amax_history_len 1024; input, weight and grad per linear,
        # each with the history plus scale and scale_inv, fp32
        assert AMAX_HISTORY_LEN == 1024
        assert amax_state_bytes(1, DELAYED) == 3 * (1024 + 2) * 4 == 12312
        assert amax_state_bytes(128, ROWWISE) == 0


class TestRefusals:
    def test_device_without_fp8(self):
        with pytest.raises(InputError, match=r"a100-80gb has no FP8 peak.*h100-sxm.*h200.*b200.*gb200"):
            require_fp8(get_device("a100-80gb"))
        graph, op, space = _setup()
        with pytest.raises(InputError, match="no FP8 peak"):
            op_compute_time_s(op, space, tensors=graph.tensors, device=get_device("a100-80gb"), settings=DELAYED)
        assert {"h100-sxm", "h200", "b200", "gb200"} <= set(fp8_devices())

    def test_settings(self):
        with pytest.raises(InputError, match="bf16 elsewhere"):
            TrainingSettings(precision="fp32", fp8="delayed")
        with pytest.raises(InputError, match="delayed or rowwise"):
            TrainingSettings(fp8="tensorwise")  # type: ignore[arg-type]
        assert DELAYED.precision_label == "fp8" and BF16.precision_label == "bf16-mixed"
