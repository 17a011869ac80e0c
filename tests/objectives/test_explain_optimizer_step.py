"""The optimizer step ``planner explain`` shows (``PipelineTime.fixed_s["optimizer_step"]``) is the rank's,
as priced: under ZeRO-1 each of the dp ranks updates its 1/dp share of the optimizer state, so the step's
memory-bound pass moves a quarter of the bytes at dp = 4. Counted by hand from the ONNX file's parameters:
Adam(W) moves 28 B per parameter (objectives.compute.OPTIMIZER_BYTES_PER_PARAMETER) at 80% of the device's
memory bandwidth; the per-tensor host floor is set to 0 so the stream is the whole step."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest

from objectives.cluster import get_device, make_cluster
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader

MODEL = "tests/data/llama_tiny.onnx"


# llama_tiny's parameters by hand: vocabulary 1,000, width 64, 2 layers, 4 query heads and 2 key/value heads of 16,
# SwiGLU width 128, untied output (the exporter renames the transposed weights, so they are counted from the shape)
LAYER = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64  # q, k and v, o, gate / up / down, two norms
PARAMETERS = 1000 * 64 + 2 * LAYER + 64 + 64 * 1000  # embedding, layers, final norm, output projection


def test_the_hand_count_is_the_files():
    """202,048 elements: the file's float initializers with 1 dim or more, less the rotary ``inv_freq`` (a
    buffer: 4 elements)."""
    model = onnx.load(MODEL, load_external_data=False)
    floats = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 1
              and "inv_freq" not in t.name]
    assert sum(int(np.prod(t.dims)) for t in floats) == PARAMETERS == 202_048


@pytest.fixture(scope="module")
def priced():
    device = dataclasses.replace(get_device("a100-80gb"), host_dispatch_s=0.0)
    cluster = dataclasses.replace(make_cluster("a100-80gb", devices=4), device=device)
    loader = graph_loader(MODEL, {"seq": 64})
    return {zero: estimate(loader, cluster=cluster, tp=1, pp=1, dp=4, micro_batch=1, global_batch=4, zero=zero,
                           settings=TrainingSettings(engine="fused", attention="flash"))
            for zero in (0, 1)}, device


def test_zero_1_shows_the_ranks_step_by_hand(priced):
    estimates, device = priced
    whole_s = PARAMETERS * 28.0 / (device.memory_bandwidth_bytes_per_s * 0.80)
    assert estimates[0].point.time.fixed_s["optimizer_step"] == pytest.approx(whole_s, rel=1e-6)
    assert estimates[1].point.time.fixed_s["optimizer_step"] == pytest.approx(whole_s / 4, rel=1e-6)


def test_the_shown_step_is_the_priced_ones_difference(priced):
    """ZeRO-1 at dp = 4 prices 3/4 of the whole step less than ZeRO-0 does, the rest of the step alike but
    for its synchronisation (reduce-scatter + all-gather in place of the all-reduce)."""
    estimates, _ = priced
    shown = {zero: e.point.time.fixed_s["optimizer_step"] for zero, e in estimates.items()}
    assert shown[1] < shown[0]
    assert shown[0] - shown[1] == pytest.approx(0.75 * shown[0], rel=1e-6)
