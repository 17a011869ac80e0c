"""bench/efficiency_reach.py's threshold on a hand-built graph: the FLOP efficiency under which a memory-bound
op's FLOP term would outlast its bytes, worked out by hand in the comments."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from objectives.compute import MEMORY_BANDWIDTH_EFFICIENCY, op_compute_time_s
from planner.core.cluster import Device
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op, Tensor, TensorAccess
from planner.core.settings import TrainingSettings

REPO = Path(__file__).resolve().parents[2]
DEVICE = Device(name="toy", peak_flops={"bf16": 100e12, "fp32": 10e12}, memory_bytes=10**10,
                memory_bandwidth_bytes_per_s=1e12)
FP32 = TrainingSettings(precision="fp32")


@pytest.fixture(scope="module")
def reach():
    spec = importlib.util.spec_from_file_location("bench_efficiency_reach", REPO / "bench" / "efficiency_reach.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _graph():
    dims = (IterDim(name="i", size=1024), IterDim(name="j", size=1024))
    axes = (("i",), ("j",))
    relu = Op(name="relu", kind="elementwise", op_type="Relu", dims=dims,
              inputs=(TensorAccess(tensor="a", axes=axes),), outputs=(TensorAccess(tensor="b", axes=axes),),
              flops=1024 * 1024, backward_flops_factor=1.0)
    mm = Op(name="mm", kind="matmul", op_type="MatMul", dims=dims, inputs=(TensorAccess(tensor="b", axes=axes),),
            outputs=(TensorAccess(tensor="c", axes=axes),), flops=2.0 * 1024**3)
    tensors = {n: Tensor(name=n, shape=(1024, 1024), dtype="float32", role="activation") for n in "abc"}
    return SimpleNamespace(ops=[relu, mm], tensors=tensors)


def test_elementwise_threshold_by_hand(reach):
    # 1 FLOP per element, 4 + 4 bytes read and written per element (fp32): F / B = 1/8 on every shard;
    # eta* = 1/8 x (1e12 B/s x 0.8) / 10e12 FLOP/s = 0.01. Products are not visited.
    cluster = SimpleNamespace(device=DEVICE, devices=4, devices_per_node=4)
    found = reach.family_thresholds(_graph(), cluster=cluster, settings=FP32)
    assert set(found) == {"elementwise"}
    assert found["elementwise"] == pytest.approx(0.125 * 1e12 * MEMORY_BANDWIDTH_EFFICIENCY / 10e12, rel=1e-12)


def test_an_efficiency_above_the_threshold_moves_no_price(reach, monkeypatch):
    # the roofline's own price of the op is the same at any efficiency above eta*, and not below it
    import objectives.compute as compute

    graph = _graph()
    cluster = SimpleNamespace(device=DEVICE, devices=4, devices_per_node=4)
    threshold = reach.family_thresholds(graph, cluster=cluster, settings=FP32)["elementwise"]
    op = graph.ops[0]
    space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))

    def forward(efficiency):
        monkeypatch.setattr(compute, "DEFAULT_EFFICIENCY", efficiency)
        return op_compute_time_s(op, space, tensors=graph.tensors, device=DEVICE, settings=FP32).forward_s

    assert (forward(1.01 * threshold) == forward(0.5)).all()
    assert (forward(0.5 * threshold) > forward(0.5)).all()
