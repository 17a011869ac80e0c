"""HSDP (``TrainingSettings.dp_shard``): states divided by the shard group, its collectives on the
right links, the replicas' all-reduce, and plain ZeRO where the shard group is every replica."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.intra_op import grad_sync_terms, term_time_s
from objectives.replication import hsdp_groups, hsdp_shard_degree
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import GPT2_SMALL_PARAMS, gpt2_like, single_matmul
from tests.objectives.test_intra_op import IB, NV, cluster
# 8 devices in one node; the position table has no batch dim and stays whole (tests/objectives/test_memory.py)
from tests.objectives.test_memory import DEVICES, WPE, build, data_parallel_choice


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_like(seq=128, batch=8)


class TestMemory:
    @pytest.mark.parametrize("stage, divided", [(1, 12), (2, 14), (3, 16)])
    def test_states_divided_by_the_shard_group_not_dp(self, gpt2, stage, divided):
        # dp=8 as 4 replicas x a shard group of 2: Adam + bf16 mixed is 2 + 2 + 12 bytes per
        # parameter; ZeRO-z divides its `divided` bytes of each replicated parameter by 2 (not 8)
        evaluation = (model := build(gpt2, zero_stage=stage, dp_shard=2)).evaluate(data_parallel_choice(model))
        replicated = GPT2_SMALL_PARAMS - WPE
        expected = (16 - divided) * GPT2_SMALL_PARAMS + divided * (replicated / 2 + WPE)
        m = evaluation.memory
        assert m.params_bytes + m.grads_bytes + m.optimizer_bytes == pytest.approx(expected, rel=1e-12)

    @pytest.mark.parametrize("stage", [1, 3])
    def test_a_shard_group_of_every_replica_is_plain_zero(self, gpt2, stage):
        # regression: dp_shard == dp prices exactly as today's ZeRO (memory and step time)
        plain, hybrid = build(gpt2, zero_stage=stage), build(gpt2, zero_stage=stage, dp_shard=DEVICES)
        choice = data_parallel_choice(plain)
        a, b = plain.evaluate(choice), hybrid.evaluate(choice)
        assert (a.time_s, a.memory.total_bytes) == (b.time_s, b.memory.total_bytes)

    def test_zero0_ignores_the_shard_group(self, gpt2):
        plain, hybrid = build(gpt2), build(gpt2, dp_shard=2)
        choice = data_parallel_choice(plain)
        assert plain.evaluate(choice).time_s == hybrid.evaluate(choice).time_s


class TestCollectives:
    """``w[16, 32]`` (1 KiB in bf16) of a MatMul split 4 ways on m, on 2 nodes x 2 devices."""

    def terms(self, **settings):
        graph = single_matmul(64, 32, 16, x_role="activation")
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=2))
        row = space.index_of({"m": 4})
        return grad_sync_terms(op, space, tensors=graph.tensors, settings=TrainingSettings(**settings)), row

    def test_reduce_scatter_and_gathers_in_the_node_all_reduce_across(self):
        terms, row = self.terms(zero_stage=3, dp_shard=2)
        shape = [(t.collective, t.count, float(t.num_bytes[row]), int(t.intra_size[row]), int(t.inter_size[row]))
                 for t in terms]
        assert shape == [("reduce_scatter", 1.0, 1024.0, 2, 1), ("all_gather", 2.0, 1024.0, 2, 1),
                         ("all_reduce", 1.0, 512.0, 1, 2)]
        # ring times by hand: RS and AG move (n-1)/n of the bytes over NVLink, n = 2; the replicas'
        # all-reduce moves 2 (n-1)/n of the 512-byte shard over InfiniBand, n = 2
        rs = 1 / 2 * 1024 / NV.bandwidth_bytes_per_s + NV.latency_s
        ar = 2 * 1 / 2 * 512 / IB.bandwidth_bytes_per_s + 2 * IB.latency_s
        seconds = [float(term_time_s(t, cluster=cluster(2, 2))[row]) for t in terms]
        assert seconds == pytest.approx([rs, 2 * rs, ar], rel=1e-12)

    def test_plain_zero3_gathers_across_nodes(self):
        terms, row = self.terms(zero_stage=3)
        assert [(t.collective, int(t.intra_size[row]), int(t.inter_size[row])) for t in terms] == [
            ("reduce_scatter", 2, 2), ("all_gather", 2, 2)]
        same, _ = self.terms(zero_stage=3, dp_shard=4)
        for a, b in zip(terms, same, strict=True):
            assert (a.collective, a.count) == (b.collective, b.count)
            np.testing.assert_array_equal(a.num_bytes, b.num_bytes)
            np.testing.assert_array_equal(a.intra_size * a.inter_size, b.intra_size * b.inter_size)

    def test_megatron_instances_zero1(self):
        # ZeRO-1 with 2 instances: RS + one AG over the node, the shard all-reduced across
        terms, row = self.terms(zero_stage=1, dp_shard=2)
        assert [(t.collective, t.count) for t in terms] == [("reduce_scatter", 1.0), ("all_gather", 1.0), ("all_reduce", 1.0)]


class TestGroups:
    def test_split_by_hand(self):
        (s_in, s_out), (r_in, r_out) = hsdp_groups(np.array([8, 4, 2]), np.array([4, 1, 8]), 16)
        # 32 devices over 4 nodes: 8 per node x 2 nodes shard; 4 in one node: all 4 shard; 2 x 8: 2 x 8 shard
        assert (s_in.tolist(), s_out.tolist(), r_in.tolist(), r_out.tolist()) == (
            [8, 4, 2], [2, 1, 8], [1, 1, 1], [2, 1, 1])
        assert hsdp_shard_degree(np.array([6, 12]), 4).tolist() == [2, 4]

    def test_bad_shard_group_is_one_line(self):
        with pytest.raises(InputError, match="hsdp must be a positive number"):
            TrainingSettings(zero_stage=3, dp_shard=0)


class TestPipelineArrays:
    """The pipeline search re-prices a ZeRO-0 model per stage (``objectives.pipeline_arrays``): under
    HSDP its states and synchronisation equal a model built at that stage by the tables."""

    @pytest.mark.parametrize("zero", [1, 3])
    def test_derived_equals_built(self, zero):
        from pathlib import Path

        from planner.pipeline import PipelineCostCache, graph_loader

        tiny = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
        cache = PipelineCostCache(graph_loader(tiny, {"seq": 128}), settings=TrainingSettings(dp_shard=8),
                                  cluster=make_cluster("a100-80gb", devices=16, devices_per_node=8))
        arrays, model = cache.arrays(16, 16, zero, "none"), cache.model(16, 16, zero, "none")
        hybrid = 0
        for i, detail in enumerate(model.op_details):
            np.testing.assert_allclose(arrays.params_bytes[i], detail.memory.params_bytes, rtol=1e-12)
            np.testing.assert_allclose(arrays.optimizer_bytes[i], detail.memory.optimizer_bytes, rtol=1e-12)
            total = arrays.forward_s[i] + arrays.backward_s[i] + arrays.step_s[i]
            np.testing.assert_allclose(total, detail.time_s, rtol=1e-9, atol=1e-15)
            hybrid += any(level == "inter" for level in detail.grad_sync_s)
        assert hybrid  # some configuration all-reduces across the two nodes
