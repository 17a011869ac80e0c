"""Fixed costs (objectives/fixed_costs.py): each term against a value computed by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import get_device, make_cluster
from objectives.fixed_costs import (
    host_floor_s,
    launch_time_s,
    nccl_choice,
    nccl_collective_time_s,
    p2p_fixed_s,
)
from planner.core.cluster import Link

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

NVLINK = Link(name="nv", bandwidth_bytes_per_s=300e9, latency_s=2e-6, collective_efficiency=0.77)
BUS = 300e9 * 0.77


class TestNccl:
    def test_tiny_all_reduce_is_ring_ll_latency(self):
        # ring LL: base 3.6 us + 2(n-1) = 14 hops x 0.47 us; 8 bytes over 231 GB/s / 4 is 0.06 ns
        t = float(nccl_collective_time_s("all_reduce", 8, 8, NVLINK))
        assert t == pytest.approx((3.6 + 14 * 0.47) * 1e-6 + 8 * 14 / 8 / (BUS / 4), rel=1e-9)
        assert nccl_choice("all_reduce", 8, 8, NVLINK) == ("ring", "LL")

    def test_two_mib_all_reduce_is_ring_ll128(self):
        b = 2 * 2**20
        by_hand = {
            ("ring", "LL"): (3.6 + 14 * 0.47) * 1e-6 + b * 14 / 8 / (BUS / 4),
            ("ring", "LL128"): (10.0 + 14 * 1.9) * 1e-6 + b * 14 / 8 / (BUS * 0.92),
            ("ring", "Simple"): (8.4 + 14 * 3.4) * 1e-6 + b * 14 / 8 / BUS,
            ("tree", "LL128"): (4.4 + 14 * 1.2) * 1e-6 + b / (110e9 * 7 / 9 * 0.5),
        }
        assert min(by_hand, key=by_hand.get) == ("ring", "LL128")
        assert float(nccl_collective_time_s("all_reduce", b, 8, NVLINK)) == pytest.approx(by_hand[("ring", "LL128")])
        assert by_hand[("ring", "LL128")] * 1e6 == pytest.approx(53.87, abs=0.01)

    def test_large_all_reduce_is_ring_simple_at_bus_bandwidth(self):
        b = 1e9
        t = float(nccl_collective_time_s("all_reduce", b, 8, NVLINK))
        assert t == pytest.approx((8.4 + 14 * 3.4) * 1e-6 + b * 14 / 8 / BUS, rel=1e-9)

    def test_all_gather_has_no_tree_and_half_the_hops(self):
        # ring LL for all-gather inside a node: 1/3 of the bus bandwidth, n - 1 = 3 hops
        t = float(nccl_collective_time_s("all_gather", 64, 4, NVLINK))
        assert t == pytest.approx((3.6 + 3 * 0.47) * 1e-6 + 64 * 3 / 4 / (BUS / 3), rel=1e-9)

    def test_one_device_or_nothing_costs_nothing(self):
        assert nccl_collective_time_s("all_reduce", [0.0, 1e6], [8, 1], NVLINK).tolist() == [0.0, 0.0]


class TestHostAndP2p:
    def test_host_floor_by_hand(self):
        dev = dataclasses.replace(get_device("a100-80gb"), layer_host_s=0.8e-3, microbatch_host_s=1e-3)
        f, b = host_floor_s(np.array([6.0]), device=dev, recompute="full")
        assert float(f[0]) == pytest.approx(6 * 0.8e-3 + 1e-3)
        assert float(b[0]) == pytest.approx(3 * 6 * 0.8e-3)  # backward (2 passes) + the recomputed forward
        f, b = host_floor_s(np.array([6.0]), device=dev, recompute="none")
        assert float(b[0]) == pytest.approx(2 * 6 * 0.8e-3)

    def test_a_partial_recompute_replays_its_share_of_the_layer(self):
        """GPT-2's block is 13 ops (two norms, four Gemms, the Q/K/V split, the scores and value
        matmuls, softmax, GELU, two residual adds); Megatron's recomputed MLP replays 3 of them (c_fc,
        GELU, c_proj), so the backward's host floor is 2 + 3/13 passes of the layer's host work."""
        from objectives.graph_facts import recomputed_share
        from planner.plan import load_graph

        graph = load_graph(EXAMPLES / "gpt2.onnx", {"batch": 2, "seq": 32})
        block = graph.blocks[0].instances[0]
        assert len(block) == 13 and [graph.ops[i].op_type for i in block].count("Gemm") == 4
        assert recomputed_share(graph, "mlp") == pytest.approx(3 / 13)
        assert (recomputed_share(graph, "none"), recomputed_share(graph, "full")) == (0.0, 1.0)
        dev = dataclasses.replace(get_device("a100-80gb"), layer_host_s=0.8e-3, microbatch_host_s=1e-3)
        _, b = host_floor_s(np.array([6.0]), device=dev, recompute="mlp", recomputed_share=3 / 13)
        assert float(b[0]) == pytest.approx((2 + 3 / 13) * 6 * 0.8e-3)

    def test_p2p_fixed(self):
        dev = dataclasses.replace(get_device("a100-80gb"), p2p_overhead_s=7e-5)
        assert p2p_fixed_s(3, device=dev) == pytest.approx(2.1e-4)
        assert p2p_fixed_s(0, device=dev) == 0.0

    def test_launch_of_a_three_op_graph(self):
        # 3 ops of 1, 2 and 1 kernels doing 2, 100 and 10 us of work; 5 us per kernel on the GPU, 30 us
        # per kernel on the host: max(7, 30) + max(110, 60) + max(15, 30) = 170 us
        dev = dataclasses.replace(get_device("a100-80gb"), kernel_overhead_s=5e-6, host_dispatch_s=3e-5)
        assert launch_time_s([(1, 2e-6), (2, 1e-4), (1, 1e-5)], device=dev) == pytest.approx(170e-6)


@pytest.fixture(scope="module")
def loader():
    from planner.pipeline import graph_loader

    return graph_loader("tests/data/gpt2_tiny.onnx", {"seq": 128})


class TestInPricing:
    """The terms reach a priced plan and its fixed-cost breakdown."""

    def _estimate(self, loader, device, *, pp=2, engine="fused"):
        from planner.core.settings import TrainingSettings
        from planner.estimate import estimate

        cluster = dataclasses.replace(make_cluster("a100-80gb", devices=2), device=device)
        return estimate(loader, cluster=cluster, tp=1, pp=pp, micro_batch=1, global_batch=4, recompute="full",
                        settings=TrainingSettings(engine=engine, attention="flash"))

    def test_host_floor_sets_the_pass(self, loader):
        base = dataclasses.replace(get_device("a100-80gb"), layer_host_s=0.0, microbatch_host_s=0.0, p2p_overhead_s=0.0)
        slow = dataclasses.replace(base, layer_host_s=1e-3, microbatch_host_s=0.5e-3, p2p_overhead_s=1e-4)
        e = self._estimate(loader, slow)
        # gpt2_tiny has 2 layers: one per stage; every stage pass is host-bound at these sizes
        for stage in e.point.stages:
            assert stage.forward_s == pytest.approx(1e-3 + 0.5e-3)
            assert stage.backward_s == pytest.approx(3 * 1e-3)
        fixed = e.point.time.fixed_s
        assert fixed["host_wait"] > 0 and fixed["p2p_latency"] > 0
        bare = self._estimate(loader, base)
        assert {k: bare.point.time.fixed_s[k] for k in ("host_wait", "p2p_latency")} == {"host_wait": 0.0, "p2p_latency": 0.0}
        assert bare.point.time.fixed_s["optimizer_step"] > 0
        assert e.time_s > bare.time_s

    def test_plain_roofline_has_no_fixed_costs(self, loader):
        from planner.core.settings import TrainingSettings
        from planner.estimate import estimate

        slow = dataclasses.replace(get_device("a100-80gb"), layer_host_s=1e-3)
        cluster = dataclasses.replace(make_cluster("a100-80gb", devices=2), device=slow)
        e = estimate(loader, cluster=cluster, tp=1, pp=2, micro_batch=1, global_batch=4, settings=TrainingSettings())
        assert e.point.time.fixed_s == {}


def test_a100_preset_carries_the_fitted_host_costs():
    """The values docs/VALIDATION.md reports as fitted on the 12- and 20-layer rows of the A100 node."""
    dev = get_device("a100-80gb")
    assert (dev.layer_host_s, dev.microbatch_host_s, dev.p2p_overhead_s) == (0.9e-3, 1.0e-3, 0.0)
    assert get_device("h100-sxm").layer_host_s == 0.0  # not measured there: no floor


def test_saved_plan_keeps_the_host_costs():
    from exporters.generic import _cluster_section

    section = _cluster_section(make_cluster("a100-80gb", devices=8))
    assert section["device"]["layer_host_s"] == 0.9e-3 and "p2p_overhead_s" not in section["device"]
    assert "layer_host_s" not in _cluster_section(make_cluster("h100-sxm", devices=8))["device"]

