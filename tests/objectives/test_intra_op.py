"""Intra-op communication and gradient sync: volumes and times by hand; halos; topology."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.intra_op import STATS_WORD_BYTES, STATS_WORDS, grad_sync_terms, intra_op_terms, term_time_s
from objectives.tables import build_cost_model
from planner.core.cluster import Cluster, Device, Link
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.settings import TrainingSettings, Zero3Gather
from tests.objectives.graphs import conv_graph, gpt2_like, single_matmul

NV = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=2e-6)
IB = Link(name="ib", bandwidth_bytes_per_s=10e9, latency_s=5e-6)
DEVICE = Device(name="toy", peak_flops={"bf16": 100e12, "fp32": 10e12}, memory_bytes=10**11,
                memory_bandwidth_bytes_per_s=1e12)
BF16 = TrainingSettings()


def cluster(nodes: int, per_node: int) -> Cluster:
    return Cluster(device=DEVICE, nodes=nodes, devices_per_node=per_node, intra_link=NV, inter_link=IB)


def ring_ar(nbytes: float, n: int, link: Link = NV) -> float:
    return 2 * (n - 1) / n * nbytes / link.bandwidth_bytes_per_s + 2 * (n - 1) * link.latency_s


def setup_matmul(devices=4):
    graph = single_matmul(64, 32, 16, x_role="activation")
    op = graph.ops[0]
    space = enumerate_configs(op, ConfigOptions(devices=devices, devices_per_node=devices))
    return graph, op, space


def terms_by_kind(terms, row):
    out = {}
    for term in terms:
        moves = term.num_bytes[row] > 0 if term.collective == "p2p" else term.intra_size[row] * term.inter_size[row] > 1
        if moves:
            out.setdefault(term.kind, []).append(term)
    return out


class TestMatMul:
    """``y[64, 32] = x[64, 16] @ w[16, 32]`` in bf16 (2 bytes), 4 devices in one node."""

    def test_k_split_all_reduces_the_output_shard(self):
        graph, op, space = setup_matmul()
        row = space.index_of({"k": 4})
        terms = terms_by_kind(intra_op_terms(op, space, tensors=graph.tensors, settings=BF16), row)
        assert set(terms) == {"partial_sum"}
        [term] = terms["partial_sum"]
        assert term.num_bytes[row] == 64 * 32 * 2 and term.intra_size[row] == 4
        assert term_time_s(term, cluster=cluster(1, 4))[row] == pytest.approx(ring_ar(4096, 4), rel=1e-12)
        # k split leaves w whole on each device but each holds different rows: no replication.
        assert not terms_by_kind(grad_sync_terms(op, space, tensors=graph.tensors, settings=BF16), row)

    def test_n_split_all_reduces_the_input_gradient(self):
        graph, op, space = setup_matmul()
        row = space.index_of({"n": 4})
        terms = terms_by_kind(intra_op_terms(op, space, tensors=graph.tensors, settings=BF16), row)
        assert set(terms) == {"input_grad"}
        [term] = terms["input_grad"]
        assert term.tensor == "x" and term.num_bytes[row] == 64 * 16 * 2
        assert term_time_s(term, cluster=cluster(1, 4))[row] == pytest.approx(ring_ar(2048, 4), rel=1e-12)

    def test_m_split_synchronises_the_weight_gradient(self):
        graph, op, space = setup_matmul()
        row = space.index_of({"m": 4})
        assert not terms_by_kind(intra_op_terms(op, space, tensors=graph.tensors, settings=BF16), row)
        [term] = terms_by_kind(grad_sync_terms(op, space, tensors=graph.tensors, settings=BF16), row)["grad_sync"]
        assert term.collective == "all_reduce" and term.num_bytes[row] == 16 * 32 * 2
        assert term_time_s(term, cluster=cluster(1, 4))[row] == pytest.approx(ring_ar(1024, 4), rel=1e-12)

    def test_mixed_split_in_the_cost_tables(self):
        # m=2, k=2: forward all-reduce of y's 32x32 shard over the k pair, weight-gradient
        # all-reduce of w's 8x32 shard over the m pair; plus roofline compute.
        graph, op, space = setup_matmul()
        model = build_cost_model(graph, cluster=cluster(1, 4), settings=BF16,
                                 config_options=ConfigOptions(devices=4, devices_per_node=4))
        row = space.index_of({"m": 2, "k": 2})
        detail = model.op_details[0]
        comm = sum(float(a[row]) for a in detail.comm_s.values())
        sync = sum(float(a[row]) for a in detail.grad_sync_s.values())
        assert comm == pytest.approx(ring_ar(32 * 32 * 2, 2), rel=1e-12)
        assert sync == pytest.approx(ring_ar(8 * 32 * 2, 2), rel=1e-12)
        assert detail.time_s[row] == pytest.approx(detail.compute_s[row] + comm + sync, rel=1e-12)

    def test_zero_stages_change_the_collectives(self):
        graph, op, space = setup_matmul()
        row = space.index_of({"m": 4})
        for stage, expected in ((1, [("reduce_scatter", 1.0), ("all_gather", 1.0)]),
                                (3, [("reduce_scatter", 1.0), ("all_gather", 2.0)])):
            settings = TrainingSettings(zero_stage=stage)
            terms = grad_sync_terms(op, space, tensors=graph.tensors, settings=settings)
            assert [(t.collective, t.count) for t in terms] == expected
            assert all(t.num_bytes[row] == 16 * 32 * 2 for t in terms)

    def test_deepspeed_zero3_gathers_a_recomputed_op_three_times(self):
        # DeepSpeed: before forward, before the forward re-run in backward, before backward: 3 ring
        # all-gathers of w's 1 KiB over 4 devices, plus one reduce-scatter of its gradient
        graph, op, space = setup_matmul()
        row = space.index_of({"m": 4})
        settings = TrainingSettings(zero_stage=3, zero3_gather=Zero3Gather(  # DeepSpeed 0.19.8's defaults
            prefetch_bucket=50_000_000, max_live=1_000_000_000, max_reuse_distance=1_000_000_000,
            persistence_threshold=100_000, reduce_bucket=500_000_000))
        terms = grad_sync_terms(op, space, tensors=graph.tensors, settings=settings, recomputed=True)
        assert [(t.collective, t.count) for t in terms] == [("reduce_scatter", 1.0), ("all_gather", 3.0)]
        ring_gather = 3 / 4 * 1024 / NV.bandwidth_bytes_per_s + 3 * NV.latency_s
        seconds = sum(float(term_time_s(t, cluster=cluster(1, 4))[row]) for t in terms)
        assert seconds == pytest.approx(4 * ring_gather, rel=1e-12)

    def test_fsdp_gathers_a_recomputed_op_twice(self):
        # FSDP1/FSDP2/Megatron-FSDP (no zero3_gather rule): the unit's pre-backward gather serves the
        # recomputed forward and the backward: 2 ring all-gathers + 1 reduce-scatter, as without recompute
        graph, op, space = setup_matmul()
        row = space.index_of({"m": 4})
        terms = grad_sync_terms(op, space, tensors=graph.tensors, settings=TrainingSettings(zero_stage=3), recomputed=True)
        assert [(t.collective, t.count) for t in terms] == [("reduce_scatter", 1.0), ("all_gather", 2.0)]
        ring = 3 / 4 * 1024 / NV.bandwidth_bytes_per_s + 3 * NV.latency_s
        seconds = sum(float(term_time_s(t, cluster=cluster(1, 4))[row]) for t in terms)
        assert seconds == pytest.approx(3 * ring, rel=1e-12)


class TestHalo:
    @pytest.mark.parametrize(
        "stride, split, halo_elements",
        [
            # 3x3, stride 1: each split boundary needs 2 extra input rows; x[8, 16, 32, 32].
            (1, {"oh": 4}, 8 * 16 * 2 * 32),  # shard 8 rows -> 10 rows
            (1, {"oh": 2, "ow": 2}, 8 * 16 * (18 * 18 - 16 * 16)),  # 16x16 -> 18x18
            # stride 2: output rows need (rows-1)*2 + 3 inputs, own 2*rows: 1 extra per boundary.
            (2, {"oh": 4}, 8 * 16 * 1 * 32),
        ],
    )
    def test_volume_by_hand(self, stride, split, halo_elements):
        graph = conv_graph(b=8, ci=16, co=32, h=32, w=32, kernel=3, stride=stride, pad=1)
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
        row = space.index_of(split)
        terms = terms_by_kind(intra_op_terms(op, space, tensors=graph.tensors, settings=BF16), row)
        assert set(terms) == {"halo"}
        [term] = terms["halo"]
        assert term.tensor == "x" and term.num_bytes[row] == halo_elements * 2
        messages = 2 * len(split)
        expected = 2 * (halo_elements * 2 / NV.bandwidth_bytes_per_s + messages * NV.latency_s)
        assert term_time_s(term, cluster=cluster(1, 4))[row] == pytest.approx(expected, rel=1e-12)

    def test_pointwise_conv_has_no_halo(self):
        graph = conv_graph(kernel=1, pad=0)
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
        assert not [t for t in intra_op_terms(op, space, tensors=graph.tensors, settings=BF16) if t.kind == "halo"]


class TestNormStats:
    def test_layernorm_hidden_split(self):
        graph = gpt2_like(layers=1, hidden=64, heads=4, vocab=128, positions=32, batch=4, seq=32)
        op = graph.ops[graph.op_index("h.0.ln_1")]
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
        row = space.index_of({"h": 4, "b": 1})
        terms = terms_by_kind(intra_op_terms(op, space, tensors=graph.tensors, settings=BF16), row)
        [term] = terms["norm_stats"]
        rows = 4 * 32
        assert term.num_bytes[row] == rows * STATS_WORDS * STATS_WORD_BYTES and term.count == 2.0
        # The input gradient is not partial (every dim indexes the input): no input_grad term.
        assert "input_grad" not in terms


class TestTopology:
    def test_keeping_the_heavy_all_reduce_in_a_node_is_cheaper(self):
        # 2 nodes x 8, y[65536, 1024] = x[65536, 1024] @ w[1024, 1024]: the same split m=2, k=8
        # placed two ways. Splitting k inside the nodes keeps the 64 MiB partial-sum all-reduce on
        # NVLink and sends only the 256 KiB weight-gradient all-reduce (group m) across; splitting k
        # across nodes sends a quarter of the 64 MiB over InfiniBand (hierarchical all-reduce).
        graph = single_matmul(65536, 1024, 1024, x_role="activation")
        model = build_cost_model(graph, cluster=cluster(2, 8), settings=BF16,
                                 config_options=ConfigOptions(devices=16, devices_per_node=8))
        space = model.tables.configs[0]
        k_inside = space.index_of({"m": 2, "k": 8}, {"m": 2})
        k_across = space.index_of({"m": 2, "k": 8}, {"k": 2})
        times = model.tables.node_time_s[0]
        assert times[k_inside] < times[k_across]
        assert model.op_details[0].compute_s[k_inside] == model.op_details[0].compute_s[k_across]
        inside = model.evaluate([k_inside])
        across = model.evaluate([k_across])
        assert inside.comm_by_level_s["inter"] < across.comm_by_level_s["inter"]
        assert np.isclose(inside.time_s, times[k_inside])
