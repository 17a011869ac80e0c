"""What launchers really do, as configurations: redundant replicas of cheap ops, padded vocabularies,
permutable linear outputs (issue 14, defects 1 and 3). Every expected number is worked out by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from objectives.memory import state_bytes_per_parameter
from objectives.redistribution import redistribution
from planner.core.cluster import Cluster, Device, Link
from planner.core.configs import ConfigOptions, _dim_factors, enumerate_configs
from planner.core.graph import IterDim, Op, TensorAccess
from planner.core.settings import TrainingSettings

NV = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=2e-6)
IB = Link(name="ib", bandwidth_bytes_per_s=10e9, latency_s=5e-6)
DEVICE = Device(name="toy", peak_flops={"bf16": 1e14}, memory_bytes=10**10, memory_bandwidth_bytes_per_s=1e12)


def norm(b: int = 8, h: int = 64) -> tuple[Op, TensorAccess]:
    access = TensorAccess(tensor="x", axes=(("b",), ("h",)))
    op = Op(name="ln", kind="norm", op_type="LayerNormalization", flops=0.0, inputs=(access,), outputs=(access,),
            dims=(IterDim(name="b", size=b, is_batch=True), IterDim(name="h", size=h, kind="normalized")))
    return op, access


def linear(b: int = 8, k: int = 64, n: int = 256) -> tuple[Op, TensorAccess]:
    x = TensorAccess(tensor="x", axes=(("b",), ("k",)))
    w = TensorAccess(tensor="w", axes=(("k",), ("n",)))
    y = TensorAccess(tensor="y", axes=(("b",), ("n",)))
    op = Op(name="fc", kind="matmul", op_type="MatMul", flops=2.0 * b * k * n, inputs=(x, w), outputs=(y,),
            dims=(IterDim(name="b", size=b, is_batch=True), IterDim(name="n", size=n),
                  IterDim(name="k", size=k, kind="reduction")))
    return op, x


class TestReplicas:
    def test_every_cheap_configuration_also_fills_the_devices(self):
        op, _ = norm()
        space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8, replicate=True))
        # b in {1,2,4,8} x h in {1,2,4,8} with a product dividing 8: 10 combinations; the 6 on fewer
        # than 8 devices appear twice (copies filling the devices, and idle), the 4 on 8 once
        assert space.size == 16
        assert int((space.replica_counts > 1).sum()) == 6
        assert int((space.devices_held == 8).sum()) == 10
        row = space.index_of({"b": 2}, replicas=None)  # the copies come first
        assert space.replica_counts[row] == 4 and space.devices_used[row] == 2
        assert space.index_of({}, replicas=8) == 0  # first row: no split, 8 copies

    def test_heavy_ops_and_pase_have_no_replicas(self):
        op, _ = linear()
        assert not enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8, replicate=True)).has_replicas
        op, _ = norm()
        pase = ConfigOptions(devices=8, devices_per_node=8, replicate=True, product_rule="at_most")
        assert not enumerate_configs(op, pase).has_replicas

    def test_replicas_take_the_innermost_places(self):
        # b split 4 on 2 nodes x 4: the 2 copies stay inside a node, so b crosses the 2 nodes
        op, _ = norm()
        space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=4, replicate=True))
        rows = [r for r in range(space.size) if space.describe(r) == {"b": 4} and space.replica_counts[r] > 1]
        assert len(rows) == 1
        assert space.inter_factors[rows[0]].tolist() == [2, 1] and space.inter_replica_counts[rows[0]] == 1

    def test_replicated_norm_feeds_a_column_parallel_linear_for_free(self):
        # Megatron at dp=2 x tp=4 on 2 nodes of 4: the norm runs b/2 on every rank (4 copies), the
        # linear splits b 2 ways (across nodes) and n 4 ways (inside): each rank already holds its
        # [4, 64] input tile, so nothing moves either way.
        (u, acc_u), (v, acc_v) = norm(), linear()
        options = ConfigOptions(devices=8, devices_per_node=4, replicate=True)
        su, sv = enumerate_configs(u, options), enumerate_configs(v, options)
        cluster = Cluster(device=DEVICE, nodes=2, devices_per_node=4, intra_link=NV, inter_link=IB)
        moved = redistribution((8, 64), 2, producer=u, producer_space=su, producer_access=acc_u, consumer=v,
                               consumer_space=sv, consumer_access=acc_v, cluster=cluster)
        a = su.index_of({"b": 2}, {"b": 2}, replicas=4)
        c = sv.index_of({"b": 2, "n": 4}, {"b": 2})
        assert moved.forward_elements[a, c] == 0 and moved.backward_elements[a, c] == 0
        # PaSE's idle layout (the norm on 2 devices of one node) must send the 4 x 64 tile to the
        # other 6 ranks, 4 of them in the other node: 256 elements per device, all across nodes
        idle = enumerate_configs(u, ConfigOptions(devices=8, devices_per_node=4))
        moved = redistribution((8, 64), 2, producer=u, producer_space=idle, producer_access=acc_u, consumer=v,
                               consumer_space=sv, consumer_access=acc_v, cluster=cluster)
        a = idle.index_of({"b": 2})
        assert moved.forward_elements[a, c] == 256 and moved.forward_inter_elements[a, c] == 256


class TestPadding:
    def test_a_vocabulary_splits_by_padding(self):
        options = ConfigOptions(devices=8, devices_per_node=8, pad=True)
        # 50257 = 29 x 1733: no power of two divides it; 8 x 6283 = 50264 rows, 7 of padding
        assert _dim_factors(50257, True, ConfigOptions(devices=8, devices_per_node=8)) == [1]
        assert _dim_factors(50257, True, options) == [1, 2, 4, 8]
        assert _dim_factors(50257, True, options, is_batch=True) == [1]  # never a batch

    def test_padding_is_bounded(self):
        # 1025 = 5^2 x 41 rows on 16 devices: 8 ways pad to 1032 (0.7%): kept; 16 ways to 1040 (1.5%):
        # refused; 5 divides it
        options = ConfigOptions(devices=16, devices_per_node=8, pad=True)
        assert _dim_factors(1025, True, options) == [1, 2, 4, 5, 8]
        assert _dim_factors(999, True, options) == [1, 3, 9]  # under 1024 rows: divisors only


class TestPermutableOutputs:
    def test_fused_qkv_to_split_moves_nothing(self):
        """GPT-2's c_attn [b, 3h] split 4 ways over its output features feeds a Split into q, k, v
        whose offset dim is split 4 ways: Megatron packs the weight per rank, so nothing moves."""
        from importers.op_rules._base import NodeContext
        from importers.op_rules.concat import split_rule
        from objectives.graph_facts import _permutable_axes
        from planner.core.graph import OpGraph, Tensor

        rule = split_rule(NodeContext(name="s", op_type="Split", attrs={"axis": 1},
                                      input_shapes=((8, 192),), output_shapes=((8, 64),) * 3))
        dims = tuple(rule.dims)
        split = Op(name="split", kind="slice", op_type="Split", flops=0.0,
                   inputs=(TensorAccess(tensor="y", axes=rule.inputs[0][1]),),
                   outputs=tuple(TensorAccess(tensor=f"o{j}", axes=a) for j, a in rule.outputs), dims=dims)
        fc, _ = linear(b=8, k=64, n=192)
        graph = OpGraph(name="g", ops=(fc, split), edges=(), tensors={
            "x": Tensor(name="x", shape=(8, 64), dtype="float32", role="input"),
            "w": Tensor(name="w", shape=(64, 192), dtype="float32", role="parameter"),
            "y": Tensor(name="y", shape=(8, 192), dtype="float32", role="activation"),
            **{f"o{j}": Tensor(name=f"o{j}", shape=(8, 64), dtype="float32", role="activation") for j in range(3)},
        })
        free = _permutable_axes(graph, fc, fc.outputs[0])
        assert free == frozenset({1})
        options = ConfigOptions(devices=4, devices_per_node=4, replicate=True)
        su, sv = enumerate_configs(fc, options), enumerate_configs(split, options)
        cluster = Cluster(device=DEVICE, nodes=1, devices_per_node=4, intra_link=NV, inter_link=IB)
        kwargs = dict(producer=fc, producer_space=su, producer_access=fc.outputs[0], consumer=split,
                      consumer_space=sv, consumer_access=split.inputs[0], cluster=cluster)
        a, c = su.index_of({"n": 4}), sv.index_of({"d1": 4})
        assert redistribution((8, 192), 2, free_axes=free, **kwargs).forward_elements[a, c] == 0
        # in [q | k | v] order a rank's 48 contiguous columns hold 16 of q and need 16 of each:
        # it holds 16 of the 48 it needs, so 8 rows x 32 columns arrive
        assert redistribution((8, 192), 2, **kwargs).forward_elements[a, c] == pytest.approx(8 * 32)


class TestCollectiveBandwidth:
    def test_collectives_run_at_bus_bandwidth_p2p_at_link_rate(self):
        from objectives.collectives import point_to_point_time_s, ring_all_reduce_time_s

        link = Link(name="nv", bandwidth_bytes_per_s=300e9, latency_s=0.0, collective_efficiency=0.77)
        # 1 GB over 8 ranks: 2 x 7/8 x 1e9 B / (0.77 x 300e9 B/s) = 7.5758 ms
        assert float(ring_all_reduce_time_s(1e9, 8, link)) == pytest.approx(2 * 7 / 8 * 1e9 / 231e9)
        p2p = point_to_point_time_s(1e9, crosses_node=False, intra_link=link, inter_link=link)
        assert float(p2p) == pytest.approx(1e9 / 300e9)

    def test_presets_and_cluster_files_carry_it(self, tmp_path):
        from objectives.cluster import get_link, load_cluster

        assert get_link("nvlink3").collective_bandwidth_bytes_per_s == pytest.approx(231e9)
        path = tmp_path / "c.yaml"
        path.write_text(
            "device: a100-80gb\nnodes: 2\ndevices_per_node: 8\n"
            "inter_link: {name: ib, bandwidth_bytes_per_s: 2.5e10, latency_s: 5.0e-6, collective_efficiency: 0.9}\n"
        )
        assert load_cluster(path).inter_link.collective_efficiency == 0.9
        with pytest.raises(Exception, match="collective_efficiency must be in"):
            Link(name="x", bandwidth_bytes_per_s=1.0, latency_s=0.0, collective_efficiency=1.5)


class TestLauncherGradSync:
    """Bucketed, overlapped gradient all-reduce (objectives.intra_op.launcher_grad_sync_s), by hand."""

    def cluster(self):
        link = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=1e-4)
        return Cluster(device=DEVICE, nodes=1, devices_per_node=8, intra_link=link, inter_link=link)

    def term(self, nbytes: float):
        from objectives.intra_op import CommTerm

        return CommTerm(kind="grad_sync", collective="all_reduce", tensor="w", num_bytes=np.array([nbytes]),
                        intra_size=np.array([8]), inter_size=np.array([1]))

    def test_small_gradients_share_a_bucket_latency(self):
        from objectives.intra_op import GRAD_BUCKET_BYTES, launcher_grad_sync_s

        nbytes = GRAD_BUCKET_BYTES / 4  # a quarter bucket pays a quarter of the 14 latencies
        moving = 2 * 7 / 8 * nbytes / 100e9
        got = launcher_grad_sync_s([self.term(nbytes)], cluster=self.cluster(), size=1, backward_s=np.zeros(1))
        assert got["intra"][0] == pytest.approx(moving + 14 * 1e-4 / 4)

    def test_backward_hides_the_sync(self):
        from objectives.intra_op import GRAD_BUCKET_BYTES, launcher_grad_sync_s

        nbytes = 4 * GRAD_BUCKET_BYTES  # several buckets: every latency paid
        whole = 2 * 7 / 8 * nbytes / 100e9 + 14 * 1e-4
        kappa = 24 / 132  # the overlapped part's contention: 24 NCCL blocks on 132 SMs
        for backward, exposed in ((0.0, whole), (whole / 2, whole / 2 + kappa * whole / 2), (2 * whole, kappa * whole)):
            got = launcher_grad_sync_s([self.term(nbytes)], cluster=self.cluster(), size=1,
                                       backward_s=np.array([backward]))
            assert got["intra"][0] == pytest.approx(exposed)

    def test_sharded_optimizer_buckets_grow_with_the_data_parallel_group(self):
        """ZeRO-1/2: Megatron-Core's bucket of max(40M, 1M x dp) parameters, so a 32 MB bf16 gradient shard
        reduce-scattered over 256 ranks pays 16M / 256M of the ring's 255 latencies, each of its two collectives."""
        from objectives.intra_op import CommTerm, bucketed_grad_sync_s, grad_bucket_bytes

        link = Link(name="ib", bandwidth_bytes_per_s=50e9, latency_s=1e-5)
        cluster = Cluster(device=DEVICE, nodes=32, devices_per_node=8, intra_link=link, inter_link=link)
        settings = TrainingSettings(zero_stage=1)
        grad_bytes = 16e6 * 2  # 16M bf16 gradients (the settings' per.grad)
        assert state_bytes_per_parameter(settings).grad == 2
        common = dict(kind="grad_sync", tensor="w", intra_size=np.array([8]), inter_size=np.array([32]))
        terms = [CommTerm(collective="reduce_scatter", num_bytes=np.array([grad_bytes]), **common),
                 CommTerm(collective="all_gather", num_bytes=np.array([16e6 * 2]), **common)]
        bucket = grad_bucket_bytes(terms, settings)
        assert bucket[0] == 256e6 * 2
        # one ring through all 256 devices each (objectives.collectives: node-aggregate bandwidth, 255 latencies)
        moving = sum((32 - 1) / 32 * (b / 8) / 50e9 + (8 - 1) / 8 * b / 50e9 for b in (grad_bytes, 16e6 * 2))
        got = bucketed_grad_sync_s(terms, cluster=cluster, size=1, bucket_bytes=bucket)
        assert got["inter"][0] == pytest.approx(moving + 2 * 255 * 1e-5 * (16e6 / 256e6))
        small = grad_bucket_bytes([dataclasses.replace(t, intra_size=np.array([2]), inter_size=np.array([1])) for t in terms],
                                  settings)
        assert small[0] == 40e6 * 2  # the 40M floor below 40 ranks
        assert grad_bucket_bytes(terms, TrainingSettings(zero_stage=3)) == 25 * 2**20  # FSDP gathers per block

    def test_param_gather_overlaps_the_forward_and_the_reductions_the_backward(self):
        """ZeRO-1/2 as Megatron-LM overlaps it (--overlap-grad-reduce, --overlap-param-gather): each collective
        beside its own window, by hand with the exposed-time rule (what outlasts the compute, plus 24/132 of the
        overlapped part)."""
        from objectives.intra_op import CommTerm, overlapped_zero_sync_s, zero_sync_split

        common = dict(kind="grad_sync", tensor="w", intra_size=np.array([8]), inter_size=np.array([1]))
        nbytes = 8 * 25 * 2**20  # several buckets: every latency paid
        terms = [CommTerm(collective=c, num_bytes=np.array([nbytes]), **common) for c in ("reduce_scatter", "all_gather")]
        each = 7 / 8 * nbytes / 100e9 + 7 * 1e-4  # a ring reduce-scatter or all-gather over 8 (objectives.collectives)
        kappa = 24 / 132
        forward, backward = np.array([each / 2]), np.array([2 * each])
        split = zero_sync_split(terms, cluster=self.cluster(), size=1, bucket_bytes=25 * 2**20)
        reductions, gathers = overlapped_zero_sync_s(split, forward_s=forward, backward_s=backward)
        assert reductions["intra"][0] == pytest.approx(kappa * each)  # hidden under a backward twice as long
        assert gathers["intra"][0] == pytest.approx(each / 2 + kappa * each / 2)  # half outlasts the forward
