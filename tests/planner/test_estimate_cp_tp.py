"""``estimate`` with ``dp``, ``cp`` and ``tp`` all above 1 (issue 24): Megatron-LM's layout then splits a linear
layer's batch, sequence and weight dims, and the attention core's batch, query sequence and heads, at once; the
estimate prices it in configuration spaces of 3 split dims (``planner.estimate._holding_split_dims``), where the
search's hold 2.

Oracles: hand counts from the tiny Llama's shapes (tests/data/llama_tiny.onnx: 2 layers, hidden 64, 8 heads of 8,
4 K/V groups, FFN 128; never read from the code under test): the keys and values each cp rank receives, the
gathered dK/dV all-reduce over the cp ranks, every linear weight's gradient all-reduce over the ``dp x cp`` ranks
and its ring seconds (``2 (n - 1) / n x B / bw + 2 (n - 1) x latency``, docs/DESIGN.md section 4); and the
search itself over spaces of 3 split dims, pinned to the same family, each of whose points the estimate prices
equal, from the search's cache and from a plain loader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from importers.transformer import analyze_transformer
from objectives.cluster import make_cluster
from objectives.intra_op import grad_sync_terms, intra_op_terms
from objectives.redistribution import redistribution
from planner.core.degrees import Pins
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.launcher_options import pinned_options, pinned_rules
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.search.pipeline import search_pipeline

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"
SEQ, KV_HEADS, HEAD_DIM, HIDDEN, FFN, HEADS = 64, 4, 8, 64, 128, 8
DP, CP, TP = 2, 2, 2
BF16 = 2  # bytes: bf16-mixed gradients and activations
LINEAR_WEIGHTS = {  # role -> (in, out) of each linear weight of a layer
    "qkv": [(HIDDEN, HEADS * HEAD_DIM), (HIDDEN, KV_HEADS * HEAD_DIM), (HIDDEN, KV_HEADS * HEAD_DIM)],
    "out-proj": [(HEADS * HEAD_DIM, HIDDEN)],
    "fc1": [(HIDDEN, FFN), (HIDDEN, FFN)],
    "fc2": [(FFN, HIDDEN)],
}


@pytest.fixture(scope="module")
def priced():
    """The estimate of dp=2 x cp=2 x tp=2 (one sample per data-parallel rank, 64 tokens) on one node of 8 A100s,
    with the configuration spaces it priced in."""
    cluster = make_cluster("a100-80gb", devices=8, devices_per_node=8)
    cache = PipelineCostCache(graph_loader(LLAMA, {"seq": SEQ}), cluster=cluster, max_split_dims=3)
    found = estimate(cache, cluster=cluster, tp=TP, cp=CP, pp=1, micro_batch=1, global_batch=DP)
    assert found.valid, found.reason
    assert found.config.dp == DP and found.config.devices == 8
    return found, cache.model(8, DP, 0, "none"), cluster


def _producer(graph, tensor: str) -> int:
    return next(i for i, op in enumerate(graph.ops) if any(a.tensor == tensor for a in op.outputs))


def _ring_all_reduce_s(num_bytes: float, ranks: int, link) -> float:
    return 2 * (ranks - 1) / ranks * num_bytes / link.collective_bandwidth_bytes_per_s + 2 * (ranks - 1) * link.latency_s


def test_kv_exchange_and_its_gradient_by_hand(priced):
    """Each cp rank holds seq / cp tokens of its tp rank's kv_heads / tp K/V heads and receives the other cp - 1
    chunks of K and of V; in backward the gathered dK (dV) of seq tokens is all-reduced over the cp ranks."""
    found, model, cluster = priced
    graph, spaces, picks = model.graph, model.tables.configs, found.point.choice
    roles = analyze_transformer(graph).roles
    chunk = (SEQ // CP) * (KV_HEADS // TP) * HEAD_DIM  # elements of one K chunk of one sample: 32 x 2 x 8 = 512
    gathered_bytes = SEQ * (KV_HEADS // TP) * HEAD_DIM * BF16  # dK of the whole sequence: 2,048 bytes
    cores = [i for i, role in enumerate(roles) if role in ("attention-score", "attention-value")]
    assert len(cores) == 4  # 2 layers
    for index in cores:
        consumer, row = graph.ops[index], picks[index]
        factors = dict(zip(spaces[index].dim_names, spaces[index].factors[row].tolist()))
        assert sorted(f for f in factors.values() if f > 1) == [DP, CP, TP]  # batch, query sequence, K/V heads
        access = consumer.inputs[1]  # K of the score product, V of the value product
        producer = _producer(graph, access.tensor)
        moved = redistribution(
            graph.tensors[access.tensor].shape, BF16, producer=graph.ops[producer], producer_space=spaces[producer],
            producer_access=next(a for a in graph.ops[producer].outputs if a.tensor == access.tensor),
            consumer=consumer, consumer_space=spaces[index], consumer_access=access, cluster=cluster,
        )
        assert float(moved.forward_elements[picks[producer], row]) == (CP - 1) * chunk
        grads = [t for t in intra_op_terms(consumer, spaces[index], tensors=graph.tensors, settings=TrainingSettings())
                 if t.kind == "input_grad" and t.tensor == access.tensor]
        assert len(grads) == 1 and grads[0].collective == "all_reduce"
        assert int(grads[0].intra_size[row] * grads[0].inter_size[row]) == CP
        assert float(grads[0].num_bytes[row]) == gathered_bytes
        if roles[index] == "attention-score":  # the score product's only all-reduce in backward is dK's
            seconds = model.op_details[index].comm_s[("input_grad", "intra")][row]
            assert seconds == pytest.approx(_ring_all_reduce_s(gathered_bytes, CP, cluster.intra_link), rel=1e-12)


def test_each_linear_weight_gradient_is_all_reduced_over_dp_x_cp_by_hand(priced):
    """A linear weight is split tp ways and whole on the dp x cp ranks that share it: its bf16 gradient shard
    (in x out / tp elements) is all-reduced over dp x cp = 4 ranks, at the ring's seconds."""
    found, model, cluster = priced
    graph, spaces, picks = model.graph, model.tables.configs, found.point.choice
    roles = analyze_transformer(graph).roles
    settings = TrainingSettings()
    seen: dict[str, list[tuple[int, int]]] = {role: [] for role in LINEAR_WEIGHTS}
    for index, role in enumerate(roles):
        if role not in LINEAR_WEIGHTS:
            continue
        row = picks[index]
        (term,) = grad_sync_terms(graph.ops[index], spaces[index], tensors=graph.tensors, settings=settings)
        shape = tuple(graph.tensors[term.tensor].shape)
        seen[role].append(tuple(sorted(shape)))
        assert int(term.intra_size[row] * term.inter_size[row]) == DP * CP
        hand_bytes = np.prod(shape) / TP * BF16
        assert float(term.num_bytes[row]) == hand_bytes
        seconds = model.op_details[index].grad_sync_s["intra"][row]
        assert seconds == pytest.approx(_ring_all_reduce_s(hand_bytes, DP * CP, cluster.intra_link), rel=1e-12)
    for role, shapes in LINEAR_WEIGHTS.items():  # every linear weight of both layers was checked
        assert sorted(seen[role]) == sorted(tuple(sorted(s)) for s in shapes * 2)


def test_estimate_equals_the_searchs_price_over_three_split_dims():
    """The search over spaces of 3 split dims, pinned to Megatron-LM's dp=2 x cp=2 x tp=2 family, finds points the
    estimate prices equal: from the search's own cache (the same configuration), and from a plain loader, whose
    cache of 2 split dims the estimate widens (the same seconds and bytes, another configuration index)."""
    loader = graph_loader(LLAMA, {"seq": 4096})  # 2,048 tokens per cp rank: the search lists cp = 2
    cluster = make_cluster("a100-80gb", devices=8, devices_per_node=8)
    cache = PipelineCostCache(loader, cluster=cluster, max_split_dims=3)
    pins = Pins(dp=DP, cp=CP, tp=TP, pp=1, mb=1)
    result = search_pipeline(cache, options=pinned_options(PipelineOptions(global_batch=4), pins),
                             rules=pinned_rules("megatron", pins))
    assert len(result.points) >= 3
    for point in result.points:
        common = dict(cluster=cluster, tp=TP, cp=CP, pp=1, micro_batch=1, global_batch=4, zero=point.zero_stage,
                      recompute=point.recompute, sequence_shard_saved=point.sequence_shard_saved,
                      fused_swiglu=point.fused_swiglu)
        same = [e for sp in (False, True) if (e := estimate(cache, sequence_parallel=sp, **common)).valid
                and tuple(e.point.choice) == tuple(point.choice)]
        assert len(same) == 1, (point.summary, len(same))
        assert same[0].time_s == pytest.approx(point.time_s, rel=1e-12)
        assert same[0].memory_bytes == pytest.approx(point.memory_bytes, rel=1e-12)
        widened = estimate(loader, sequence_parallel=same[0].config.sequence_parallel, **common)
        assert widened.valid
        assert widened.time_s == pytest.approx(point.time_s, rel=1e-12)
        assert widened.memory_bytes == pytest.approx(point.memory_bytes, rel=1e-12)


@pytest.mark.parametrize(("dp", "cp", "tp", "sp"), [(4, 1, 2, False), (4, 1, 2, True), (4, 2, 1, False)])
def test_a_wider_space_prices_a_two_dim_layout_the_same(dp, cp, tp, sp):
    """The claim the widening rests on: spaces of 3 split dims add configurations and change none's price. A layout
    of 2 split dims, which both spaces hold, costs the same seconds and bytes in each."""
    loader = graph_loader(LLAMA, {"seq": SEQ})
    cluster = make_cluster("a100-80gb", devices=8, devices_per_node=8)
    found = [estimate(PipelineCostCache(loader, cluster=cluster, max_split_dims=dims), cluster=cluster, tp=tp, cp=cp,
                      pp=1, micro_batch=1, global_batch=2 * dp, zero=1, recompute="selective", sequence_parallel=sp)
             for dims in (2, 3)]
    assert all(e.valid for e in found)
    assert found[0].time_s == pytest.approx(found[1].time_s, rel=1e-12)
    assert found[0].memory_bytes == pytest.approx(found[1].memory_bytes, rel=1e-12)
