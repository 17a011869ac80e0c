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


# ---- the first forward's excess, priced in the step's first micro-batch under the stage's host floor


class TestFirstForwardNotHidden:
    """``w[4096, 4096]`` of a MatMul split 4 ways on the batch, 2 nodes x 2 toy devices, ZeRO-3 by DeepSpeed's rule
    with nothing overlapped, hpZ 2: gathers of milliseconds, above the toy device's host floor (none binds)."""

    W_BYTES = 4096 * 4096 * 2.0

    def price(self, hpz: int | None, micro_batches: int):
        from objectives.pipeline_price import price_plan
        from tests.objectives.test_intra_op import cluster

        settings = TrainingSettings(engine="fused", attention="flash", zero3_gather=ON_DEMAND, hpz_partition=hpz,
                                    overlap=False)
        cache = PipelineCostCache(lambda batch: single_matmul(batch, 4096, 4096, x_role="activation"),
                                  cluster=cluster(2, 2), settings=settings)
        arrays = cache.arrays(4, 64, 3, "none")
        row = arrays.spaces[0].index_of({"m": 4})
        priced = price_plan(cache, pp=1, batch=64, zero_stage=3, recompute="none", choice=[row], bounds=(0, 0),
                            global_batch=64 * micro_batches)
        return arrays, int(arrays.offsets[0]) + row, priced

    def test_the_excess_by_hand_once_per_step(self):
        # the first forward gathers w over all 4 ranks (a ring through both nodes: 1/2 of W/2 per node over IB at
        # 10 GB/s, 1/2 of W over NVLink at 100 GB/s, 3 hops of IB's 5 us: 1,021.633 us), the others over the node's
        # 2 (1/2 of W over NVLink, 1 hop of 2 us: 169.772 us): 851.861 us once per step, in its own column
        arrays, at, _ = self.price(2, 1)
        across, inside = _ring_across(self.W_BYTES, 2, 2), _ring_inside(self.W_BYTES, 2)
        assert across - inside == pytest.approx(851.8608e-6, rel=1e-12)
        assert arrays.flat["first_forward_s"][at] == pytest.approx(across - inside, rel=1e-12)
        assert arrays.flat["step_s"][at] == arrays.flat["update_s"][at]  # no longer in the per-step synchronisation
        plain_arrays, _, _ = self.price(None, 1)
        assert "first_forward_s" not in plain_arrays.flat

    @pytest.mark.parametrize("micro_batches", [1, 2, 4])
    def test_unhidden_the_step_pays_it_once(self, micro_batches):
        # per micro-batch hpZ saves a forward and a backward gather (each the rings' difference); once per step its
        # first forward pays that difference back: (2m - 1) x (1,021.633 - 169.772) us faster than plain ZeRO-3
        _, _, plain = self.price(None, micro_batches)
        _, _, hpz = self.price(2, micro_batches)
        for priced in (plain, hpz):
            assert priced.point().time.fixed_s["host_wait"] == 0.0  # the case is for the unhidden excess
        saved = (2 * micro_batches - 1) * (_ring_across(self.W_BYTES, 2, 2) - _ring_inside(self.W_BYTES, 2))
        assert plain.time_s - hpz.time_s == pytest.approx(saved, rel=1e-9)


def _tiny_host_bound(hpz: int | None, inter_latency_s: float | None = None) -> PipelineCostCache:
    """gpt2_tiny on 16 A100s (2 nodes of 8) under an execution model (host floors) and DeepSpeed's ZeRO-3 rule at
    :data:`TINY_GATHER`; ``inter_latency_s``: InfiniBand's latency replaced (slower gathers across nodes)."""
    cluster = make_cluster("a100-80gb", devices=16)
    if inter_latency_s is not None:
        cluster = dataclasses.replace(cluster, inter_link=dataclasses.replace(cluster.inter_link,
                                                                              latency_s=inter_latency_s))
    settings = TrainingSettings(engine="fused", attention="flash", zero3_gather=TINY_GATHER, hpz_partition=hpz)
    return PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=cluster, settings=settings)


@pytest.mark.parametrize("inter_latency_s", [None, 2e-5])
@pytest.mark.parametrize("hpz", [8, 4])
def test_host_bound_hpz_is_never_slower_than_plain_zero3(hpz, inter_latency_s):
    # hpZ's traffic is a subset of plain ZeRO-3's: its first forward gathers what plain ZeRO-3 gathers in every
    # forward, the rest over fewer ranks. gpt2_tiny's stage is bound by the host (2.8 ms forward floor), which hides
    # plain ZeRO-3's forward gathers; at InfiniBand's latency hpZ 8's excess (0.40 ms) hides under the first
    # micro-batch's wait too (equal step times; charged after the pipeline it was 0.40 ms slower); at 20 us it
    # (2.30 ms) exceeds the wait (the plain forward, 3.19 ms, is above the floor): only the part above is paid
    from objectives.pipeline_price import price_plan

    caches = {group: _tiny_host_bound(group, inter_latency_s) for group in (None, hpz)}
    choice = _replicated(caches[None].model(16, 16, 3, "none"), 16)
    for micro_batches in (1, 2, 8):
        plain, grouped = (price_plan(caches[group], pp=1, batch=16, zero_stage=3, recompute="none", choice=choice,
                                     bounds=(0, 2), global_batch=16 * micro_batches) for group in (None, hpz))
        assert grouped.point().time.fixed_s["host_wait"] > 0.0  # host-bound
        assert grouped.time_s <= plain.time_s * (1.0 + 1e-12), micro_batches
    arrays = caches[hpz].arrays(16, 16, 3, "none")
    assert arrays.flat["first_forward_s"][arrays.offsets + np.asarray(choice)].sum() > 3e-4  # there was one to hide


@pytest.mark.parametrize("inter_latency_s", [None, 2e-5])
@pytest.mark.parametrize("pp, hpz", [(1, 8), (2, 4)])
def test_the_search_prices_the_first_forward_as_the_price(pp, hpz, inter_latency_s):
    # the search's segment costs (planner.search.stage_costs) hold the floored excess per segment: every cut's step
    # time is price_plan's, hidden (InfiniBand's latency), partly hidden (20 us) or over a pipeline's stages
    from objectives.pipeline_price import price_plan
    from planner.search.stage_costs import _step_costs
    from planner.search.stages import step_time_of_cut

    cache = _tiny_host_bound(hpz, inter_latency_s)
    devices = 16 // pp
    arrays = cache.arrays(devices, 16, 3, "none")
    assert "first_forward_s" in arrays.flat
    choice = np.asarray(_replicated(cache.model(devices, 16, 3, "none"), devices))
    cuts = [(0, 2)] if pp == 1 else [(0, 1, 2)]
    for micro_batches in (1, 4):
        costs = _step_costs(cache, arrays, cache.structure(16), choice, pp=pp, recompute="none",
                            in_flight=cache.in_flight("1f1b", stages=pp, micro_batches=micro_batches, chunks=1),
                            schedule="1f1b", micro_batches=micro_batches, chunks=1, zero_stage=3)
        for bounds in cuts:
            priced = price_plan(cache, pp=pp, batch=16, zero_stage=3, recompute="none", choice=choice, bounds=bounds,
                                global_batch=16 * micro_batches)
            assert step_time_of_cut(costs, bounds) == pytest.approx(priced.time_s, rel=1e-12), bounds


def test_partly_hidden_the_step_pays_plain_zero3s_forward_above_the_floor():
    # InfiniBand at 20 us a hop: plain ZeRO-3's forward (its gathers over all 16 ranks) is above the stage's 2.8 ms
    # floor, hpZ's (over the node's 8) below it. hpZ's first forward gathers as plain ZeRO-3 does in each, so its
    # step pays once what plain ZeRO-3's forward takes beyond the floor; planner explain's terms (objectives.stage_ops)
    # name it and, with the ops' per-step seconds, give the stage's
    from objectives.pipeline_price import price_plan
    from objectives.stage_ops import stage_ops

    caches = {group: _tiny_host_bound(group, 2e-5) for group in (None, 8)}
    choice = _replicated(caches[None].model(16, 16, 3, "none"), 16)
    plain, grouped = (price_plan(caches[group], pp=1, batch=16, zero_stage=3, recompute="none", choice=choice,
                                 bounds=(0, 2), global_batch=64).point() for group in (None, 8))
    floor = grouped.stages[0].forward_s  # hpZ's forward waits for the host
    assert plain.stages[0].forward_s > floor + 1e-4 and plain.time.fixed_s["host_wait"] == 0.0
    (stage,) = stage_ops(caches[8], grouped)
    assert stage.host_wait_forward_s > 0.0
    assert stage.first_forward_s == pytest.approx(plain.stages[0].forward_s - floor, rel=1e-9)
    per_step = sum(op.step_s for op in stage.ops) + stage.tied_step_s + stage.first_forward_s
    assert per_step == pytest.approx(grouped.stages[0].grad_sync_s, rel=1e-12)
    # the step: four floored forwards and backwards, that excess once, the optimizer step (no synchronisation after
    # the backward: DeepSpeed's reduce-scatters run in it)
    s0 = grouped.stages[0]
    assert grouped.time_s == pytest.approx(4 * (s0.forward_s + s0.backward_s) + stage.first_forward_s
                                           + grouped.time.fixed_s["optimizer_step"], rel=1e-12)
