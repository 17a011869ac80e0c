"""Tests of the calibration fit (objectives/calibration.py, planner/calibrate.py, `planner calibrate`).

Synthetic truth: steps are priced by the planner itself at known constants, the constants are reset,
and the fit must find them again. On the measured H100 rows the fit runs on part of the rows and
its held-out error is reported, not asserted tightly.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from objectives.calibration import (
    Parameter,
    StepRow,
    calibratable_parameters,
    cluster_file_dict,
    error_summary,
    fit_parameters,
    holdout_mask,
    parameter_values,
    parse_step_rows,
    read_step_rows,
    with_parameters,
)
from objectives.cluster import get_device, load_cluster, make_cluster
from planner.calibrate import calibrate_steps, check_cluster_file, price_rows
from planner.core.cluster import Cluster, Device, Link
from planner.core.errors import InputError
from tests.planner.cli_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "data" / "gpt2_tiny.onnx"


def _tiny_rows(batches, *, devices: int = 1, dp: int = 1) -> list[StepRow]:
    return [
        StepRow(id=f"tiny-b{b}-d{devices}", model={"kind": "onnx", "path": str(TINY), "dims": {"seq": 64}},
                device="h100-sxm", devices=devices, devices_per_node=devices, dp=dp, micro_batch=b,
                global_batch=b * dp, step_s=1.0)
        for b in batches
    ]


def _measured_at(rows, params, values) -> list[StepRow]:
    """The rows with their step set to the planner's own price at the true constants (plain roofline)."""
    priced = price_rows(rows, constants=(params, values), plain=True)
    assert all(p.valid for p in priced), [p.reason for p in priced]
    return [dataclasses.replace(p.row, step_s=p.time_s) for p in priced]


# ------------------------------------------------------------------------------------------------
# The fit on a known linear model


def test_fit_recovers_a_latency_and_a_reciprocal_efficiency():
    """t_i = a_i + k_i * latency + c_i / efficiency: both constants come back from exact data."""
    cluster = make_cluster("h100-sxm", devices=8)
    latency = Parameter(owner="device", field="kernel_latency_s", lower=0.0, upper=1e-2)
    # An efficiency-like parameter (time linear in its reciprocal) on a field every Link has.
    efficiency = Parameter(owner="intra_link", field="latency_s", lower=0.05, upper=1.0, reciprocal=True)
    a = np.array([0.1, 0.2, 0.05, 0.3])
    k = np.array([1000.0, 3000.0, 200.0, 5000.0])
    c = np.array([0.02, 0.01, 0.05, 0.04])
    true_latency, true_efficiency = 7e-6, 0.6

    def predict(cl: Cluster) -> np.ndarray:
        return a + k * cl.device.kernel_latency_s + c / cl.intra_link.latency_s

    measured = a + k * true_latency + c / true_efficiency
    start = with_parameters(cluster, [latency, efficiency], [0.0, 1.0])
    fit = fit_parameters(predict, start, [latency, efficiency], measured)
    assert fit.after[0] == pytest.approx(true_latency, rel=1e-3)
    assert fit.after[1] == pytest.approx(true_efficiency, rel=1e-3)
    assert fit.objective_after < 1e-8 < fit.objective_before
    assert fit.fit_after.median_abs_pct < 0.01


def test_fit_keeps_a_constant_no_row_depends_on():
    cluster = make_cluster("h100-sxm", devices=1)
    params = calibratable_parameters(cluster, ["device.kernel_latency_s", "inter_link.latency_s"])
    fit = fit_parameters(lambda cl: [0.1 + 1000 * cl.device.kernel_latency_s], cluster, params, [0.104])
    assert fit.identifiable.tolist() == [True, False]
    assert fit.after[1] == cluster.inter_link.latency_s  # untouched
    assert fit.after[0] == pytest.approx(4e-6, rel=1e-3)  # (0.104 - 0.1) / 1000
    assert any("inter_link.latency_s" in n for n in fit.notes)


def test_fit_respects_bounds():
    """The least-squares answer (-1e-5 s) lies below the bound 0: the fit stops at the bound."""
    cluster = make_cluster("h100-sxm", devices=1)
    params = calibratable_parameters(cluster, ["device.kernel_latency_s"])
    fit = fit_parameters(lambda cl: [0.1 + 1000 * cl.device.kernel_latency_s], cluster, params, [0.09])
    assert fit.after[0] == pytest.approx(0.0, abs=1e-12)


# ------------------------------------------------------------------------------------------------
# Synthetic truth through the planner's own pricing


def test_planner_priced_steps_give_back_the_kernel_latency():
    truth = 6e-6
    base = make_cluster("h100-sxm", devices=1)
    params = calibratable_parameters(base, ["device.kernel_latency_s"])
    rows = _measured_at(_tiny_rows([1, 2, 4, 8, 16, 32]), params, [truth])
    # The latency changes the step: the data would not pin it otherwise.
    at_zero = price_rows(rows, constants=(params, [0.0]), plain=True)
    assert all(p.time_s < r.step_s for p, r in zip(at_zero, rows))
    holdout = np.array([False, True, False, True, False, True])
    report = calibrate_steps(rows, base=base, holdout=holdout, fields=["device.kernel_latency_s"], plain=True)
    assert report.fit.before[0] == 0.0
    assert report.fit.after[0] == pytest.approx(truth, rel=1e-3)
    assert report.holdout_before.median_abs_pct > 0.5
    assert report.holdout_after.median_abs_pct < 0.05
    assert len(report.fit_rows) == 3 and len(report.holdout_rows) == 3


def test_planner_priced_steps_give_back_two_constants_on_two_devices():
    """Kernel latency and the NVLink latency together, on dp=2 steps (the gradient all-reduce pays
    the link latency): two constants, both recovered."""
    truth = [5e-6, 4e-5]
    base = make_cluster("h100-sxm", devices=2)
    params = calibratable_parameters(base, ["device.kernel_latency_s", "intra_link.latency_s"])
    rows = _measured_at(_tiny_rows([1, 2, 4, 8, 16], devices=2, dp=2) + _tiny_rows([1, 2, 4, 8]), params, truth)
    start = with_parameters(base, params, [0.0, 2e-6])
    holdout = np.zeros(len(rows), dtype=bool)
    holdout[[1, 6]] = True
    report = calibrate_steps(rows, base=start, holdout=holdout, fields=[p.name for p in params], plain=True)
    assert report.fit.after == pytest.approx(truth, rel=1e-2)
    assert report.holdout_after.median_abs_pct < 0.1


# ------------------------------------------------------------------------------------------------
# The measured H100 rows: fit on part, report the held-out error


def test_fit_on_measured_h100_rows_reports_the_held_out_error(capsys):
    rows = [r for r in read_step_rows(REPO / "bench" / "fidelity" / "runs_h100.jsonl")
            if r.model["path"].endswith("gpt2.onnx") and r.micro_batch >= 8]
    rows = [dataclasses.replace(r, model={**r.model, "path": str(REPO / r.model["path"])}) for r in rows]
    holdout = holdout_mask(rows, where={"mode": ["sdpa-compile"]})
    assert holdout.sum() == 3 and (~holdout).sum() == 6
    base = make_cluster("h100-sxm", devices=1)
    report = calibrate_steps(rows, base=base, holdout=holdout, rounds=2)
    assert report.fit.objective_after <= report.fit.objective_before
    assert report.holdout_before.rows == report.holdout_after.rows == 3
    assert math.isfinite(report.holdout_after.median_abs_pct)
    with capsys.disabled():
        print(f"\nH100 gpt2, fit on eager+sdpa, held out sdpa-compile: median |err| "
              f"{report.holdout_before.median_abs_pct:.1f}% -> {report.holdout_after.median_abs_pct:.1f}%")


# ------------------------------------------------------------------------------------------------
# Rows, parameters, files


def test_rows_parse_both_formats_and_convert_tflops():
    steps = parse_step_rows([{"model": "gpt2", "batch": 8, "seq": 1024, "mode": "eager-compile", "step_s": 0.1,
                              "peak_alloc_bytes": 5e9}], device="h100-sxm", models_dir="m")
    assert (steps[0].engine, steps[0].attention, steps[0].memory_bytes) == ("fused", "explicit", 5e9)
    assert steps[0].model["path"] == str(Path("m") / "gpt2.onnx")
    run = {"id": "x", "model": {"kind": "gpt", "layers": 24, "hidden": 2304, "heads": 24, "seq": 2048, "vocab": 51200},
           "gpus": {"device": "a100-80gb", "count": 32, "per_node": 8},
           "layout": {"tp": 1, "pp": 1, "dp": 32, "micro_batch": 1, "global_batch": 512},
           "measured": {"tflops_per_gpu": 137, "conversion": "narayanan21_eq3"}}
    (row,) = parse_step_rows([run])
    # Equation (3) by hand: 96 B s l h^2 (1 + s/6h + V/16lh) / (n X).
    flops = 96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert row.step_s == pytest.approx(flops / (32 * 137e12))
    assert row.step_s == pytest.approx(3.528, abs=0.001)
    assert row.group == "multi-node"


def test_runs_rows_carry_context_parallelism_and_the_fp8_recipe_to_the_pricing():
    from planner.calibrate import row_settings
    from planner.estimate import estimate
    from planner.pipeline import graph_loader

    llama = str(Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx")
    run = {"id": "cp", "model": {"kind": "onnx", "path": llama, "dims": {"seq": 4096}},
           "gpus": {"device": "h100-sxm", "count": 8, "per_node": 8},
           "layout": {"tp": 1, "pp": 1, "dp": 4, "cp": 2, "micro_batch": 1, "global_batch": 8, "zero": 1,
                      "precision": "te-current", "engine": "fused", "attention": "flash"},
           "measured": {"conversion": "step_s", "step_s": 1.0}}
    (row,) = parse_step_rows([run])
    assert (row.cp, row.precision, row.fp8) == (2, "te-current", "delayed")  # Transformer Engine's modules
    assert row_settings(row).fp8 == "delayed"
    bf16 = dataclasses.replace(row, precision="bf16")
    assert bf16.fp8 is None and row_settings(bf16).fp8 is None
    (priced,) = price_rows([row])
    direct = estimate(graph_loader(llama, {"seq": 4096}), cluster=make_cluster("h100-sxm", devices=8), tp=1, pp=1,
                      dp=4, cp=2, micro_batch=1, global_batch=8, zero=1, settings=row_settings(row))
    assert priced.valid and direct.config.devices == 8
    # the bench's memory is the allocator's: the plan's less NCCL's buffers (planner.calibrate._allocator_figures)
    assert priced.time_s == pytest.approx(direct.time_s) and priced.memory_bytes == pytest.approx(direct.memory.allocator_bytes)
    assert priced.nccl_bytes == direct.memory.nccl_bytes > 0


@pytest.mark.parametrize(
    "record, text",
    [
        ({"model": "gpt2", "batch": 8}, "step_s"),
        ({"model": "gpt2", "batch": 0, "step_s": 1.0}, "'batch' must be a positive whole number"),
        ({"model": "gpt2", "batch": 8, "step_s": 1.0, "mode": "jit"}, "unknown mode 'jit'"),
        ({"id": "r", "model": {}, "gpus": {"device": "h100-sxm", "count": 1}, "layout": {"micro_batch": 1, "global_batch": 1},
          "measured": {"conversion": "watts"}}, "unknown conversion 'watts'"),
        ({"id": "r", "model": {}, "gpus": {"device": "h100-sxm", "count": 1}, "layout": {"micro_batch": 1, "global_batch": 1},
          "measured": {"conversion": "narayanan21_eq3"}}, "needs"),
        ({"id": "r", "model": {}, "gpus": {"device": "h100-sxm", "count": 1},
          "layout": {"micro_batch": 1, "global_batch": 1, "precision": "fp8"}, "measured": {"step_s": 1.0}},
         "layout.precision must be one of bf16, te-delayed"),
        ({"id": "r", "model": {}, "gpus": {"device": "h100-sxm", "count": 1},
          "layout": {"micro_batch": 1, "global_batch": 1, "cp": 0}, "measured": {"step_s": 1.0}},
         "'cp' must be a positive whole number"),
    ],
)
def test_malformed_rows_are_one_line_errors(record, text):
    with pytest.raises(InputError, match=text) as info:
        parse_step_rows([record], device="h100-sxm")
    assert "\n" not in str(info.value)


def test_calibratable_fields_are_found_by_name_on_any_device_or_link():
    # Names no class has yet: a field added later is fitted without a change to the calibration.
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class FutureDevice(Device):
        future_overhead_s: float = 2e-3

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class FutureLink(Link):
        future_efficiency: float = 0.77

    base = make_cluster("a100-80gb", devices=16)
    device = FutureDevice(**{f.name: getattr(base.device, f.name) for f in dataclasses.fields(Device)})
    link = FutureLink(**{f.name: getattr(base.inter_link, f.name) for f in dataclasses.fields(Link)})
    cluster = dataclasses.replace(base, device=device, inter_link=link)
    names = {p.name: p for p in calibratable_parameters(cluster)}
    assert "device.future_overhead_s" in names and "device.kernel_latency_s" in names
    assert names["inter_link.future_efficiency"].reciprocal and not names["device.future_overhead_s"].reciprocal
    assert not any(n.endswith("_per_s") for n in names)  # rates are spec-sheet data
    assert parameter_values(cluster, [names["inter_link.future_efficiency"]]).tolist() == [0.77]
    with pytest.raises(InputError, match="choose among"):
        calibratable_parameters(cluster, ["device.peak_flops"])


def test_cluster_file_round_trips_through_the_loader(tmp_path):
    base = make_cluster("a100-80gb", devices=16)
    params = calibratable_parameters(base, ["device.kernel_latency_s", "intra_link.latency_s", "inter_link.latency_s"])
    fitted = with_parameters(base, params, [3e-6, 7e-6, 9e-6])
    path = tmp_path / "fitted.yaml"
    path.write_text(yaml.safe_dump(cluster_file_dict(fitted, preset=get_device("a100-80gb"))), encoding="utf-8")
    loaded = load_cluster(path)
    assert loaded.device.name == "a100-80gb" and (loaded.nodes, loaded.devices_per_node) == (2, 8)
    assert parameter_values(loaded, params).tolist() == [3e-6, 7e-6, 9e-6]
    assert loaded.inter_link.bandwidth_bytes_per_s == base.inter_link.bandwidth_bytes_per_s
    assert check_cluster_file(path, params, [3e-6, 7e-6, 9e-6]) == []
    (unread,) = check_cluster_file(path, params[:1], [5e-6])
    assert "device.kernel_latency_s" in unread


def test_error_summary_by_hand():
    s = error_summary([1.2, 0.9, 1.0, 3.0], [1.0, 1.0, 2.0, 2.0])
    # signed errors: +20, -10, -50, +50 %
    assert (s.rows, s.median_abs_pct, s.mape_pct) == (4, 35.0, 32.5)
    assert s.bias_pct == pytest.approx(5.0) and s.mean_signed_pct == pytest.approx(2.5)


# ------------------------------------------------------------------------------------------------
# The command


def _steps_file(tmp_path: Path, truth: float) -> Path:
    base = make_cluster("h100-sxm", devices=1)
    params = calibratable_parameters(base, ["device.kernel_latency_s"])
    rows = _measured_at(_tiny_rows([1, 2, 4, 8, 16, 32]), params, [truth])
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(json.dumps({"model": "gpt2_tiny", "batch": r.micro_batch, "seq": 64, "step_s": r.step_s}) + "\n"
                            for r in rows), encoding="utf-8")
    return path


def test_calibrate_command_writes_a_cluster_file_the_planner_reads(tmp_path):
    steps = _steps_file(tmp_path, 8e-6)
    out = tmp_path / "h100.yaml"
    result = run_cli(["calibrate", steps, "--device", "h100-sxm", "--models-dir", REPO / "tests" / "data",
                      "--fit", "device.kernel_latency_s", "--holdout-every", "2", "-o", out])
    assert "held-out rows, after" in result.stdout
    assert load_cluster(out).device.kernel_latency_s == pytest.approx(8e-6, rel=1e-3)
    again = run_cli(["calibrate", steps, "--device", "h100-sxm", "--models-dir", REPO / "tests" / "data", "-o", out], 2)
    assert "--force" in again.stderr
    data = json.loads(run_cli(["calibrate", steps, "--device", "h100-sxm", "--models-dir", REPO / "tests" / "data",
                               "--fit", "kernel_latency_s", "--holdout", "id=gpt2_tiny-b4-step", "--holdout-every", "0",
                               "-o", out, "--force", "--json"]).stdout)
    assert data["holdout_rows"] == ["gpt2_tiny-b4-step"]
    assert data["parameters"][0]["after"] == pytest.approx(8e-6, rel=1e-3)


def test_calibrate_command_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": "gpt2_tiny", "batch": 1}\n', encoding="utf-8")
    result = run_cli(["calibrate", bad, "--device", "h100-sxm", "-o", tmp_path / "x.yaml"], 2)
    assert "step_s" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    steps = _steps_file(tmp_path, 8e-6)
    result = run_cli(["calibrate", steps, "--device", "h100-sxm", "--models-dir", REPO / "tests" / "data",
                      "--holdout-every", "0", "-o", tmp_path / "y.yaml"], 2)
    assert "no row is held out" in result.stderr
    # GPT rows of bench/fidelity name a shape, not a file: the error says where their models come from
    result = run_cli(["calibrate", REPO / "bench" / "fidelity" / "runs_megatron.jsonl", "-o", tmp_path / "z.yaml"], 2)
    assert "bench/fidelity.py --calibrate-to" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_every_device_constant_that_moves_a_step_is_recovered():
    """Whatever [Empirical] device fields exist (the execution model's per-kernel, host and collective
    overheads included), each one that changes an eager- or fused-mode step is found again alone
    from steps priced at a known value (1.5 x its preset, or 5 us where the preset is 0).

    A constant changes a step where the steps priced at that value differ from the steps at the presets
    (priced once); only those are fitted, and each must be identifiable and recovered. The others' fits (a
    third of the estimates the test made, h29b) only said that no step depends on them."""
    base = make_cluster("h100-sxm", devices=2)
    rows = []
    for engine, attention in (("eager", "explicit"), ("fused", "flash")):
        for b in (1, 16):  # (1, 4, 16) recovered the same two constants in 28% more time
            for devices in (1, 2):
                rows.append(StepRow(id=f"{engine}-b{b}-d{devices}", model={"kind": "onnx", "path": str(TINY), "dims": {"seq": 64}},
                                    device="h100-sxm", devices=devices, devices_per_node=devices, dp=devices,
                                    micro_batch=b, global_batch=b * devices, engine=engine, attention=attention, step_s=1.0))
    at_presets = price_rows(rows)
    if not all(x.valid for x in at_presets):
        pytest.skip(f"the execution model cannot price the tiny rows: {at_presets[0].reason}")
    recovered, unmoved = [], []
    for p in calibratable_parameters(base):
        if p.owner != "device":
            continue
        preset = float(parameter_values(base, [p])[0])
        truth = 1.5 * preset if preset else 5e-6
        priced = price_rows(rows, constants=([p], [truth]))
        assert all(x.valid for x in priced), p.name
        if [x.time_s for x in priced] == [x.time_s for x in at_presets]:
            unmoved.append(p.field)  # no step depends on it here (e.g. the plain roofline's kernel_latency_s)
            continue
        measured = [dataclasses.replace(x.row, step_s=x.time_s) for x in priced]
        holdout = np.zeros(len(measured), dtype=bool)
        holdout[::4] = True
        start = p.lower if p.reciprocal else 0.0  # an efficiency (a device's matmul_efficiency) must stay > 0
        report = calibrate_steps(measured, base=with_parameters(base, [p], [start]), holdout=holdout, fields=[p.name],
                                 rounds=8)
        assert report.fit.identifiable[0], p.name
        assert report.fit.after[0] == pytest.approx(truth, rel=2e-2), p.name
        recovered.append(p.field)
    print(f"\nrecovered {recovered}; moving no step {unmoved}")
    assert recovered, "no device constant moves an eager or fused step"
