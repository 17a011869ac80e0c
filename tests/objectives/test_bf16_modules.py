"""bf16 modules without autocast (``TrainingSettings.autocast`` off: FSDP's ``MixedPrecision(param_dtype=bf16)``
under eager, fms-fsdp's and torchtitan's FSDP runs), priced by hand against the autocast rule it replaces
(``objectives.compute.eager_fp32_traffic``, ``casts_parameters``; ``objectives.autocast``), and the row field
that turns it on (``layout.autocast``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from objectives.autocast import stored_dtypes
from objectives.calibration import read_step_rows
from objectives.compute import MEMORY_BANDWIDTH_EFFICIENCY, op_compute_time_s
from objectives.execution import ExecutionModel
from planner.calibrate import row_settings
from planner.core.cluster import Device
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.graph import IterDim, Op, Tensor, TensorAccess
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import single_matmul
from tests.objectives.test_saved_once import three_projections

ROWS, COLS = 4096, 4096
RC = ROWS * COLS
KAPPA = 5e-6
BW = 1e12 * MEMORY_BANDWIDTH_EFFICIENCY
DEVICE = Device(name="toy", peak_flops={"bf16": 100e12, "fp32": 10e12}, memory_bytes=10**10,
                memory_bandwidth_bytes_per_s=1e12, kernel_overhead_s=KAPPA, host_dispatch_s=0.0)
EAGER = ExecutionModel(engine="eager", attention="flash")
AUTOCAST = TrainingSettings(engine="eager", attention="flash")
MODULES = TrainingSettings(engine="eager", attention="flash", autocast=False)


def _access(name: str, *axes: str) -> TensorAccess:
    return TensorAccess(tensor=name, axes=tuple((a,) for a in axes))


def rms_norm() -> tuple[Op, dict[str, Tensor]]:
    """``y = w * x * rsqrt(mean(x^2))`` over rows of ``x[ROWS, COLS]``: the main node and 3 folded ones
    (Pow, ReduceMean, Mul after the main Mul), as the fp32 export of Hugging Face's RMSNorm folds them."""
    tensors = {"x": Tensor(name="x", shape=(ROWS, COLS), dtype="float32", role="activation"),
               "w": Tensor(name="w", shape=(COLS,), dtype="float32", role="parameter"),
               "y": Tensor(name="y", shape=(ROWS, COLS), dtype="float32", role="activation", producer="norm")}
    dims = (IterDim(name="m", size=ROWS, is_batch=True), IterDim(name="n", size=COLS))
    op = Op(name="norm", kind="norm", op_type="LayerNormalization", dims=dims,
            inputs=(_access("x", "m", "n"), _access("w", "n")), outputs=(_access("y", "m", "n"),),
            flops=5.0 * RC, fused_pointwise=3, onnx_nodes=("norm", "pow", "mean", "mul"),
            node_types=("Mul", "Pow", "ReduceMean", "Mul"))
    return op, tensors


def residual_add() -> tuple[Op, dict[str, Tensor]]:
    """``y = x + z`` on ``[ROWS, COLS]``: one node, no parameter."""
    tensors = {name: Tensor(name=name, shape=(ROWS, COLS), dtype="float32", role="activation") for name in "xzy"}
    dims = (IterDim(name="m", size=ROWS, is_batch=True), IterDim(name="n", size=COLS))
    op = Op(name="add", kind="elementwise", op_type="Add", dims=dims,
            inputs=(_access("x", "m", "n"), _access("z", "m", "n")), outputs=(_access("y", "m", "n"),), flops=1.0 * RC)
    return op, tensors


def times(op: Op, tensors, settings: TrainingSettings, device: Device = DEVICE):
    space = enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1))
    priced = op_compute_time_s(op, space, tensors=tensors, device=device, settings=settings, execution=EAGER)
    return float(priced.forward_s[0]), float(priced.backward_s[0])


class TestNorm:
    """Operands (x, w, y) and 3 folded nodes (2 passes of y's size each); backward 2x the operands, 1.5x the
    folded passes; kernels 1 + 3 forward, 2 + 2 x 3 backward (+ 1 gradient cast of w under autocast)."""

    def test_autocast_moves_fp32_everywhere(self):
        forward, backward = times(*rms_norm(), AUTOCAST)
        operands, folded = (2 * RC + COLS) * 4, 3 * 2 * RC * 4
        assert forward == pytest.approx((operands + folded) / BW + 4 * KAPPA, rel=1e-12)
        assert backward == pytest.approx((2 * operands + 1.5 * folded) / BW + 9 * KAPPA, rel=1e-12)

    def test_bf16_modules_read_and_write_bf16_and_keep_fp32_statistics(self):
        forward, backward = times(*rms_norm(), MODULES)
        operands, folded = (2 * RC + COLS) * 2, 3 * 2 * RC * 4  # the operands bf16, the upcast interior fp32
        assert forward == pytest.approx((operands + folded) / BW + 4 * KAPPA, rel=1e-12)
        assert backward == pytest.approx((2 * operands + 1.5 * folded) / BW + 8 * KAPPA, rel=1e-12)


class TestElementwise:
    def test_residual_add_halves_its_traffic(self):
        op, tensors = residual_add()
        fp32, bf16 = times(op, tensors, AUTOCAST), times(op, tensors, MODULES)
        assert fp32 == pytest.approx((3 * RC * 4 / BW + KAPPA, 2 * 3 * RC * 4 / BW + KAPPA), rel=1e-12)
        assert bf16 == pytest.approx((3 * RC * 2 / BW + KAPPA, 2 * 3 * RC * 2 / BW + KAPPA), rel=1e-12)


class TestProduct:
    def test_no_weight_cast_and_no_gradient_cast(self):
        # a compute-bound GEMM: the same work, one kernel fewer each way (autocast's cast of w to bf16 forward,
        # w's gradient cast back to fp32 backward)
        graph = single_matmul(4096, 4096, 4096)
        op = graph.ops[0]
        (f_amp, b_amp), (f_bf16, b_bf16) = times(op, graph.tensors, AUTOCAST), times(op, graph.tensors, MODULES)
        assert f_amp - f_bf16 == pytest.approx(KAPPA, rel=1e-6)
        assert b_amp - b_bf16 == pytest.approx(KAPPA, rel=1e-6)


def test_bf16_modules_store_every_activation_in_bf16():
    graph = three_projections()
    assert set(stored_dtypes(graph, settings=MODULES, execution=EAGER).values()) == {"bf16"}
    assert "fp32" in set(stored_dtypes(graph, settings=AUTOCAST, execution=EAGER).values())


def test_autocast_must_be_a_bool():
    with pytest.raises(InputError, match="autocast must be true or false"):
        TrainingSettings(autocast="no")  # type: ignore[arg-type]


ROW = {"id": "r", "source": {}, "model": {"kind": "onnx", "path": "m.onnx"},
       "gpus": {"device": "a100-80gb", "count": 8, "per_node": 8},
       "layout": {"dp": 8, "micro_batch": 1, "global_batch": 8, "zero": 3, "engine": "eager", "attention": "flash"},
       "measured": {"conversion": "step_s", "step_s": 1.0}}


class TestRowField:
    def rows(self, tmp_path, **layout):
        path = tmp_path / "runs_x.jsonl"
        path.write_text(json.dumps({**ROW, "layout": {**ROW["layout"], **layout}}) + "\n")
        return read_step_rows(path)

    def test_layout_autocast_false_reaches_the_settings(self, tmp_path):
        (row,) = self.rows(tmp_path, autocast=False)
        assert row.autocast is False and row_settings(row).autocast is False
        (row,) = self.rows(tmp_path)
        assert row.autocast is True and row_settings(row).autocast is True

    def test_a_bad_value_is_an_input_error(self, tmp_path):
        with pytest.raises(InputError, match="layout.autocast must be true or false"):
            self.rows(tmp_path, autocast="no")


def test_an_fp8_plan_still_prices_under_eager():
    # the fp32 stand-in settings are made only for the ops that move fp32: an FP8 plan's cannot be (FP8 needs
    # bf16-mixed), and a fused-engine or eager FP8 GEMM prices as before
    graph = single_matmul(4096, 4096, 4096)
    device = dataclasses.replace(DEVICE, peak_flops={**DEVICE.peak_flops, "fp8": 200e12})
    bf16 = times(graph.ops[0], graph.tensors, MODULES, device)
    for autocast in (True, False):
        settings = TrainingSettings(engine="eager", attention="flash", fp8="rowwise", autocast=autocast)
        forward, backward = times(graph.ops[0], graph.tensors, settings, device)
        assert 0.0 < forward < bf16[0] and 0.0 < backward < bf16[1]  # twice the peak, a few casts beside


@pytest.mark.parametrize("autocast", [True, False])
@pytest.mark.parametrize("extra", [{"fp8": "rowwise"}, {"optimizer_state_dtype": "bf16"}], ids=["fp8", "bf16-state"])
def test_an_fp8_or_bf16_state_plan_prices_its_norm_under_eager(autocast, extra):
    # an FP8 plan's norm is no FP8 linear, and the optimizer state moves no activation: it prices as the bf16
    # plan's (TestNorm's figures by hand), where the fp32 stand-in settings once kept fp8 or the bf16 state and
    # raised ("FP8 linear layers train with bf16 elsewhere", "a bf16 optimizer state is priced for bf16-mixed")
    settings = TrainingSettings(engine="eager", attention="flash", autocast=autocast, **extra)
    forward, backward = times(*rms_norm(), settings)
    operands, folded = (2 * RC + COLS) * (4 if autocast else 2), 3 * 2 * RC * 4
    assert forward == pytest.approx((operands + folded) / BW + 4 * KAPPA, rel=1e-12)
    assert backward == pytest.approx((2 * operands + 1.5 * folded) / BW + (9 if autocast else 8) * KAPPA, rel=1e-12)
