"""A bf16 optimizer state (``TrainingSettings.optimizer_state_dtype="bf16"``, issue 23): Apex's
``DistributedFusedAdam(dtype=torch.bfloat16)`` on a bf16 model, as NeMo builds it from ``optim.dtype: bf16``, keeps
``exp_avg`` and ``exp_avg_sq`` in bf16 and no master copy (NeMo sets ``store_params`` false when the optimizer's
dtype is the model's): 2 + 2 bytes per parameter of the ZeRO shard in place of fp32 master + moments' 4 + 4 + 4;
SGD's momentum 2 in place of 4 + 4. Counted by hand on a two-linear graph at dp 4, carried from a fidelity row's
layout to the pricing of a whole plan (only the optimizer's bytes and its step move), and refused where it is
not priced."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from objectives.calibration import parse_step_rows
from objectives.cluster import make_cluster
from objectives.memory import parameter_state_bytes, state_bytes_per_parameter
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from tests.objectives.test_fp8_gather import _two_linears

LLAMA = str(Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx")


def _states(settings: TrainingSettings) -> tuple[float, float, float]:
    """``(params, grads, optimizer)`` bytes of fc1 (W1 64 x 32 + b1 32 = 2,080 elements) replicated over dp 4."""
    graph = _two_linears()
    op = graph.ops[0]
    space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
    got = parameter_state_bytes(op, space, tensors=graph.tensors, settings=settings)
    return tuple(float(a[space.index_of({"b": 4})]) for a in got)


@pytest.mark.parametrize("optimizer, zero, fp32_state, bf16_state", [
    # Adam, ZeRO-0: 2,080 x 12 = 24,960 (fp32 master + 2 fp32 moments) against 2,080 x 4 = 8,320 (2 bf16 moments).
    ("adam", 0, 24960.0, 8320.0),
    # ZeRO-1: each rank keeps a quarter: 6,240 against 2,080.
    ("adam", 1, 6240.0, 2080.0),
    # SGD with momentum, ZeRO-1: 2,080 x 8 / 4 = 4,160 (fp32 master + momentum) against 2,080 x 2 / 4 = 1,040.
    ("sgd", 1, 4160.0, 1040.0),
])
def test_optimizer_bytes_by_hand(optimizer, zero, fp32_state, bf16_state):
    fp32 = TrainingSettings(optimizer=optimizer, zero_stage=zero)
    bf16 = dataclasses.replace(fp32, optimizer_state_dtype="bf16")
    params, grads, optimizer_bytes = _states(fp32)
    assert optimizer_bytes == fp32_state
    # the bf16 parameters (2,080 x 2 = 4,160) and gradients are the same under either state
    assert _states(bf16) == (params, grads, bf16_state) == (4160.0, 4160.0, bf16_state)


def test_bytes_per_parameter():
    assert state_bytes_per_parameter(TrainingSettings(optimizer_state_dtype="bf16")).total == 8.0  # 2 + 2 + 2 x 2
    assert state_bytes_per_parameter(TrainingSettings(optimizer_state_dtype="bf16", optimizer="sgd")).total == 6.0
    fp8 = state_bytes_per_parameter(TrainingSettings(optimizer_state_dtype="bf16", fp8="delayed"))
    assert (fp8.param, fp8.grad, fp8.optimizer) == (4.0, 2.0, 4.0)  # the cached FP8 copies stay


@pytest.mark.parametrize("settings, text", [
    (dict(precision="fp32"), "bf16-mixed training only"),
    (dict(fp8="delayed", fp8_param_gather=True, zero_stage=1), "FP8 weights gathered in FP8"),
    (dict(optimizer_state_dtype="fp16"), "optimizer_state_dtype must be fp32 or bf16"),
])
def test_unpriced_combinations_are_one_line_errors(settings, text):
    settings = {"optimizer_state_dtype": "bf16", **settings}
    with pytest.raises(InputError, match=text) as info:
        TrainingSettings(**settings)
    assert "\n" not in str(info.value)


def _row(**layout):
    run = {"id": "bf16-state", "model": {"kind": "onnx", "path": LLAMA, "dims": {"seq": 256}},
           "gpus": {"device": "h100-sxm", "count": 4, "per_node": 4},
           "layout": {"tp": 1, "pp": 1, "dp": 4, "micro_batch": 1, "global_batch": 4, "zero": 1,
                      "engine": "fused", "attention": "flash", **layout},
           "measured": {"conversion": "step_s", "step_s": 1.0}}
    (row,) = parse_step_rows([run])
    return row


def test_a_rows_layout_carries_it_to_the_plans_memory_and_optimizer_step():
    from planner.calibrate import row_settings
    from planner.estimate import estimate
    from planner.pipeline import graph_loader

    fp32_row, bf16_row = _row(), _row(optimizer_state_dtype="bf16")
    assert (fp32_row.optimizer_state_dtype, bf16_row.optimizer_state_dtype) == ("fp32", "bf16")
    assert row_settings(bf16_row).optimizer_state_dtype == "bf16"
    assert dataclasses.replace(row_settings(bf16_row), optimizer_state_dtype="fp32") == row_settings(fp32_row)
    graph = graph_loader(LLAMA, {"seq": 256})
    cluster = make_cluster("h100-sxm", devices=4)
    fp32, bf16 = (estimate(graph, cluster=cluster, tp=1, pp=1, dp=4, micro_batch=1, global_batch=4, zero=1,
                           settings=row_settings(row)) for row in (fp32_row, bf16_row))
    a, b = fp32.memory, bf16.memory
    # every parameter's optimizer state: 12 B -> 4 B per element of the ZeRO shard, a third exactly
    assert b.optimizer_bytes == pytest.approx(a.optimizer_bytes / 3, rel=1e-12)
    assert (b.params_bytes, b.grads_bytes, b.activations_bytes) == (a.params_bytes, a.grads_bytes, a.activations_bytes)
    assert bf16.time_s <= fp32.time_s  # the optimizer step moves 14 B per parameter, not 28


def test_a_malformed_rows_value_is_a_one_line_error():
    with pytest.raises(InputError, match="layout.optimizer_state_dtype must be fp32 or bf16") as info:
        _row(optimizer_state_dtype="int8")
    assert "\n" not in str(info.value)
