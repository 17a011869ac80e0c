"""ZeRO++'s hierarchical partitioning (hpZ, ``TrainingSettings.hpz_partition``) as DeepSpeed 0.19.8 runs it: the
forward all-gather over every data-parallel rank once per step, every other gather over the secondary group, and the
secondary copy's bytes; each figure counted by hand from the ring formulas and the parameter counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.deepspeed_zero3 import SubModuleOrder, deepspeed_zero3_sync_s
from objectives.intra_op import grad_sync_terms, hpz_group
from objectives.nccl_memory import NCCL_CONNECTION_BYTES, NCCL_MAX_CHANNELS
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings, Zero3Gather
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader
from tests.objectives.graphs import single_matmul
from tests.objectives.test_fsdp_memory import _replicated
from tests.objectives.test_intra_op import IB, NV, cluster

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000, tied head
# every bound out of the way: each gather on demand, whole; the reduce-scatter pays its whole latency
ON_DEMAND = Zero3Gather(prefetch_bucket=0, max_live=0, max_reuse_distance=0, persistence_threshold=0, reduce_bucket=1)
W_BYTES = 16 * 32 * 2.0  # w[16, 32] in bf16


def _ring_inside(nbytes: float, n: int) -> float:
    """A ring all-gather / reduce-scatter of ``nbytes`` over ``n`` devices of one node (NVLink)."""
    return (n - 1) / n * nbytes / NV.bandwidth_bytes_per_s + (n - 1) * NV.latency_s


def _ring_across(nbytes: float, per_node: int, nodes: int) -> float:
    """The same ring through ``per_node x nodes`` devices: the node's share crosses InfiniBand, every one of
    the n - 1 steps waits for an inter-node hop (objectives.collectives)."""
    n = per_node * nodes
    return ((nodes - 1) / nodes * nbytes / per_node / IB.bandwidth_bytes_per_s
            + (per_node - 1) / per_node * nbytes / NV.bandwidth_bytes_per_s + (n - 1) * IB.latency_s)


class TestOneLayer:
    """``w[16, 32]`` of a MatMul split 4 ways on the batch, on 2 nodes x 2 devices, ZeRO-3, hpZ 2."""

    def terms(self, recomputed: bool = False, **settings):
        graph = single_matmul(64, 32, 16, x_role="activation")
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=2))
        chosen = TrainingSettings(zero_stage=3, zero3_gather=ON_DEMAND, **settings)
        return grad_sync_terms(op, space, tensors=graph.tensors, settings=chosen, recomputed=recomputed), \
            space.index_of({"m": 4})

    def test_forward_gather_over_every_rank_backward_within_the_node(self):
        terms, row = self.terms(hpz_partition=2)
        shape = [(t.collective, t.phase, t.count, float(t.num_bytes[row]), int(t.intra_size[row]),
                  int(t.inter_size[row])) for t in terms]
        assert shape == [("reduce_scatter", None, 1.0, W_BYTES, 2, 2), ("all_gather", "forward", 1.0, W_BYTES, 2, 2),
                         ("all_gather", "backward", 1.0, W_BYTES, 2, 1)]
        # recomputed: DeepSpeed's re-run forward gathers a third time, from the secondary copy too
        recomputed, _ = self.terms(recomputed=True, hpz_partition=2)
        assert [(t.phase, t.count) for t in recomputed[1:]] == [("forward", 1.0), ("backward", 2.0)]

    def test_without_hpz_one_gather_term_over_every_rank(self):
        terms, row = self.terms()
        assert [(t.collective, t.phase, t.count, int(t.intra_size[row]), int(t.inter_size[row])) for t in terms] == [
            ("reduce_scatter", None, 1.0, 2, 2), ("all_gather", None, 2.0, 2, 2)]

    def test_seconds_by_hand(self):
        # nothing overlapped: each micro-batch's forward and backward gather the secondary copy inside the node
        # (ring of 2 on NVLink); the backward's reduce-scatter crosses nodes; the step's first forward gathers
        # over all 4 ranks, so the step pays that ring less the node's once
        terms, row = self.terms(hpz_partition=2)
        size = terms[0].num_bytes.shape[0]
        order = SubModuleOrder(elements=512.0, previous=0.0, following=0.0, after_in_model=1.0, after_in_block=1.0)
        zeros = np.zeros(size)
        forward, backward, step = deepspeed_zero3_sync_s(
            terms, cluster=cluster(2, 2), rule=ON_DEMAND, order=order, shard_elements=np.full(size, 512.0),
            forward_s=zeros, backward_s=zeros, recompute_s=zeros, gathered_bytes=2.0, grad_bytes=2.0, overlap=False)
        inside, across = _ring_inside(W_BYTES, 2), _ring_across(W_BYTES, 2, 2)
        assert (forward[row], backward[row], step[row]) == pytest.approx((inside, inside + across, across - inside),
                                                                         rel=1e-12)
        # plain ZeRO-3: every gather over all 4 ranks, nothing per step
        plain, _ = self.terms()
        forward, backward, step = deepspeed_zero3_sync_s(
            plain, cluster=cluster(2, 2), rule=ON_DEMAND, order=order, shard_elements=np.full(size, 512.0),
            forward_s=zeros, backward_s=zeros, recompute_s=zeros, gathered_bytes=2.0, grad_bytes=2.0, overlap=False)
        assert (forward[row], backward[row], step[row]) == pytest.approx((across, 2 * across, 0.0), rel=1e-12)

    def test_each_pass_gather_is_priced_in_its_pass(self):
        # without an execution model the terms are split into forward / backward / step by _phases: the
        # forward's gather (over every rank) in forward, the secondary copy's in backward
        from objectives.pipeline_arrays import _phases

        terms, _ = self.terms(hpz_partition=2)
        assert [_phases(t, 3) for t in terms[1:]] == [(1.0, 0.0, 0.0), (0.0, 1.0, 0.0)]

    def test_the_group_takes_consecutive_ranks_a_node_first(self):
        intra, inter = hpz_group(np.array([8, 8, 2]), np.array([4, 1, 2]), 8)
        assert (intra.tolist(), inter.tolist()) == ([8, 8, 2], [1, 1, 2])

    def test_bad_group_is_an_input_error(self):
        with pytest.raises(InputError, match="hpz must be a positive number"):
            TrainingSettings(hpz_partition=0)


# gpt2_tiny's parameters of at least 1,000 elements (tests/objectives/test_deepspeed_memory.py): the tied embedding
# (1000 x 64) and, per block, c_attn (64 x 192), c_proj (64 x 64), c_fc (64 x 256), mlp c_proj (256 x 64); norms and
# biases are under DeepSpeed's persistence threshold (never partitioned: no secondary copy); the position table is
# held whole (no data-parallel replica to shard it over)
GATHERED = 64_000 + 2 * (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64)
TINY_GATHER = Zero3Gather(prefetch_bucket=5_000, max_live=20_000, max_reuse_distance=0, persistence_threshold=1_000,
                          reduce_bucket=1_000)


@pytest.mark.parametrize("hpz", [8, 4])
def test_the_secondary_copy_and_its_communicator_by_hand(hpz):
    # 16 ranks on 2 nodes of 8, dp = 16 at ZeRO-3: each rank adds its 1/hpz of the gathered weights in bf16, and
    # NCCL's buffers for one more ring (the hpZ group: 32 channels x a connection)
    caches = [PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=16),
                                settings=TrainingSettings(zero3_gather=TINY_GATHER, hpz_partition=group))
              for group in (None, hpz)]
    points = []
    for cache in caches:
        model = cache.model(16, 16, 3, "none")
        points.append(evaluate_pipeline(cache, pp=1, batch=16, zero_stage=3, recompute="none",
                                        choice=_replicated(model, 16), bounds=(0, 2), global_batch=16))
    plain, hpz_point = (p.memory for p in points)
    assert hpz_point.params_bytes - plain.params_bytes == pytest.approx(2.0 * GATHERED / hpz, rel=1e-12)
    assert hpz_point.nccl_bytes - plain.nccl_bytes == pytest.approx(NCCL_MAX_CHANNELS * NCCL_CONNECTION_BYTES)
    same = dataclasses.replace(hpz_point, params_bytes=plain.params_bytes, nccl_bytes=plain.nccl_bytes,
                               other_bytes=plain.other_bytes)  # the allocator's reserve is a share of the rest
    assert same == plain


def test_only_deepspeed_exports_an_hpz_plan():
    # an hpZ plan is DeepSpeed's row: its export writes the group, another launcher's refuses (it would run plain
    # ZeRO-3, gathering across nodes without the copy the memory holds)
    from exporters import export
    from exporters.deepspeed.export import deepspeed_masks
    from planner.core.errors import UnsupportedExport
    from tests.exporters.graphs import gpt_graph, make_cluster as two_nodes, make_input, spaces_for

    graph = gpt_graph(batch=16)
    spaces = spaces_for(graph, 16, devices_per_node=8)
    choice = [int(np.flatnonzero(mask)[0]) for mask in deepspeed_masks(graph, spaces, dp=16, tp=1, devices_per_node=8)]
    plan = make_input(graph, spaces, choice, cluster=two_nodes(nodes=2), global_batch=16,
                      settings=TrainingSettings(zero_stage=3, hpz_partition=8))
    assert export("deepspeed", plan)["ds_config"]["zero_optimization"]["zero_hpz_partition_size"] == 8
    with pytest.raises(UnsupportedExport, match="priced with DeepSpeed's hpZ over 8 ranks"):
        export("megatron", plan)


def test_the_default_search_runs_deepspeed_at_zero3_with_a_node_group():
    # where the devices span nodes HSDP's node-sized group is searched (launcher_options.hsdp_sizes); for DeepSpeed it
    # is the hpZ group, at ZeRO-3 only (the stage DeepSpeed reads zero_hpz_partition_size at), stages of 16 or more
    from planner.launcher_options import hsdp_sizes, hybrid_groups, launcher_hsdp
    from planner.core.degrees import Pins
    from planner.plan import PlanRequest
    from planner.search.pipeline import PipelineOptions

    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=32, devices_per_node=8))
    assert hsdp_sizes(request, Pins()) == (None, 8)
    narrowed = launcher_hsdp(PipelineOptions(global_batch=64), "deepspeed", 8, pinned=False, devices=32)
    assert (narrowed.zero_stages, narrowed.pipeline_sizes) == ((3,), (1, 2))
    assert hybrid_groups("deepspeed", 8) == {"hpz": 8} and hybrid_groups("torchtitan", 8) == {"dp_shard": 8}
