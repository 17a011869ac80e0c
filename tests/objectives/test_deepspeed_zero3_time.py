"""DeepSpeed's ZeRO-3 time rule (``objectives.deepspeed_zero3``, ``Target.zero3_gather``): per sub-module gathers
fetched on demand or prefetched by the predecessor, kept within the reuse distance, none for persistent parameters;
the gradient reduce-scatter bucketed beside backward. Every expected gather is a ring's bytes over bandwidth plus its
latencies by hand, on the 2-layer GPT (hidden 64) data-parallel over two nodes of 8 A100s (NVLink 300 GB/s x 0.77,
2 us; InfiniBand HDR 25 GB/s, 5 us per hop)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from exporters.deepspeed.zero3 import ZERO3_GATHER
from objectives.cluster import make_cluster
from objectives.deepspeed_zero3 import SubModuleOrder, gathers_per_micro_batch
from objectives.pipeline_cost import PipelineCostCache
from planner.core.settings import TrainingSettings, Zero3Gather
from planner.pipeline import graph_loader

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
KAPPA = 24 / 132  # objectives.intra_op.OVERLAP_CONTENTION
DEVICES, BATCH = 16, 16
# a rule that gathers this model's weights (its largest, the 1000 x 64 head, is under DeepSpeed's 1e5 threshold):
# biases and norms (<= 256 elements) persistent, the attention's 64 x 192 weight (12,288) over the live maximum,
# nothing kept (reuse distance 0), latency paid per 1e6 prefetched elements and per gradient element
SMALL = Zero3Gather(prefetch_bucket=1_000_000, max_live=10_000, max_reuse_distance=0, persistence_threshold=1_000,
                    reduce_bucket=1)

# the gradient buckets (DeepSpeed reduces one when the next gradient would overflow it, the last one after the
# backward, exposed): the whole model (172,288 elements) in the last bucket; or, backward from ln_f, one bucket of
# the 87,488 elements down to layer 0's attention projection, then the last: layer 0's QKV, its first norm, the
# embeddings (84,800)
WHOLE_TAIL = dataclasses.replace(SMALL, reduce_bucket=1_000_000_000)
SPLIT_TAIL = dataclasses.replace(SMALL, reduce_bucket=87_500)
# a reuse distance of 1e5 elements: layer 1's attention projection (32,768 gathered elements after it, 2 x that
# under 1e5) is kept for its backward, layer 0's (81,920 after it) released and gathered again
KEEP_LAST_LAYER = dataclasses.replace(SMALL, max_reuse_distance=100_000)


def _ring_s(num_bytes: float, latency_share: float = 1.0) -> float:
    """A ring all-gather (or reduce-scatter) of ``num_bytes`` over 8 x 2 devices, by hand: half the bytes over one
    node's 8 NICs, 7/8 of them over NVLink at its bus bandwidth, 15 inter-node hops of 5 us."""
    return 0.5 * num_bytes / 8 / 25e9 + 7 / 8 * num_bytes / (300e9 * 0.77) + latency_share * 15 * 5e-6


@pytest.fixture(scope="module")
def priced():
    cluster = make_cluster("a100-80gb", devices=DEVICES, devices_per_node=8)
    cache = PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=cluster,
                              settings=TrainingSettings(engine="fused", attention="flash"))
    arrays = {name: cache.arrays(DEVICES, BATCH, zero, "none", edges=False, zero3_gather=rule)
              for name, zero, rule in (("zero0", 0, None), ("fsdp", 3, None), ("small", 3, SMALL),
                                       ("deepspeed", 3, ZERO3_GATHER), ("tail", 3, WHOLE_TAIL),
                                       ("split", 3, SPLIT_TAIL), ("keep", 3, KEEP_LAST_LAYER))}
    model = cache.model(DEVICES, BATCH, 0, "none", edges=False)
    return cache.graph(BATCH), model, arrays


def _data_parallel(graph, model, arrays, name: str) -> tuple[int, int]:
    """``(op index, flat index)`` of the op named ``name`` at its configuration splitting the batch 16 ways."""
    index = next(i for i, op in enumerate(graph.ops) if op.name == name)
    batch = next(d.name for d in graph.ops[index].dims if d.is_batch)
    return index, int(arrays["zero0"].offsets[index]) + model.tables.configs[index].index_of({batch: DEVICES})


def _seconds(arrays, column: str, flat: int) -> dict[str, float]:
    return {name: float(a.flat[column][flat]) for name, a in arrays.items()}


def test_an_on_demand_gather_waits_whole(priced):
    """The attention's output projection (64 x 64): its predecessor (12,288 elements) is over the live maximum and
    prefetches nothing, and so is its successor in backward (the MLP's 64 x 256, the norm between persistent):
    each gather waits whole, 8,192 bytes, the bias (64) never gathered; the reduce-scatters beside its backward."""
    graph, model, arrays = priced
    _, flat = _data_parallel(graph, model, arrays, "node_addmm_1")
    forward, backward = _seconds(arrays, "forward_s", flat), _seconds(arrays, "backward_s", flat)
    gather = _ring_s(4096 * 2)
    assert forward["small"] - forward["zero0"] == pytest.approx(gather, rel=1e-9)  # 75.05 us
    reduce = _ring_s(4096 * 2) + _ring_s(64 * 2)  # the weight's and the bias's gradients, each its full latency
    compute = backward["zero0"]  # its own backward: the reduce-scatters hide under it, with contention
    hidden = max(0.0, reduce - compute) + KAPPA * min(reduce, compute)
    assert backward["small"] - backward["zero0"] == pytest.approx(gather + hidden, rel=1e-9)


def test_a_prefetched_gather_hides_beside_its_predecessor(priced):
    """The MLP's first layer (64 x 256): the output projection before it (4,096 elements, under the maximum)
    prefetches it, so its forward gather runs beside that layer's forward, a quarter of its own (4,096 / 16,384
    elements of the same GEMM shape), paying 16,384 / 1e6 of the ring's latency."""
    graph, model, arrays = priced
    _, flat = _data_parallel(graph, model, arrays, "node_addmm_2")
    forward = _seconds(arrays, "forward_s", flat)
    gather = _ring_s(16384 * 2, latency_share=16384 / 1e6)
    window = forward["zero0"] * 4096 / 16384
    assert forward["small"] - forward["zero0"] == pytest.approx(
        max(0.0, gather - window) + KAPPA * min(gather, window), rel=1e-9)


def test_deepspeed_defaults_gather_nothing_of_a_small_model(priced):
    """Under DeepSpeed's defaults every parameter of this model is under ``stage3_param_persistence_threshold``
    (1e5): nothing is gathered, so the forward costs what ZeRO-0's does, where the per-block rule (FSDP2's) gathers."""
    graph, model, arrays = priced
    for name in ("node_embedding", "node_addmm", "node_addmm_2"):  # the tied head (node_linear) owns no parameter
        _, flat = _data_parallel(graph, model, arrays, name)
        forward = _seconds(arrays, "forward_s", flat)
        assert forward["deepspeed"] == forward["zero0"] < forward["fsdp"]


def test_reuse_distance_keeps_the_tail():
    """``stage3_max_reuse_distance``: a sub-module used again within D elements is not released (DeepSpeed's
    ``__params_to_release``): after the forward its next use is 2 S elements away (S: the elements after it)."""
    rule = Zero3Gather(prefetch_bucket=50, max_live=1000, max_reuse_distance=100, persistence_threshold=0,
                       reduce_bucket=500)
    order = SubModuleOrder(elements=30, previous=30, following=30, after_in_model=60, after_in_block=20)
    assert gathers_per_micro_batch(order, rule, recomputed=False) == (1, 0, 1)  # 120 >= 100: gathered again
    kept = SubModuleOrder(elements=30, previous=30, following=30, after_in_model=49, after_in_block=20)
    assert gathers_per_micro_batch(kept, rule, recomputed=True) == (1, 0, 0)  # 98 < 100: kept through both
    block = SubModuleOrder(elements=30, previous=30, following=30, after_in_model=500, after_in_block=50)
    assert gathers_per_micro_batch(block, rule, recomputed=True) == (1, 1, 1)  # re-run, and 100 >= 100 again



def test_the_last_bucket_is_reduced_exposed(priced):
    """DeepSpeed reduce-scatters the last, partial gradient bucket after the backward and waits for it
    (``independent_gradient_partition_epilogue``): a model under the bucket pays its reduce-scatters whole, each
    gradient its share of one latency (4,096 and 64 of 1e9 elements), nothing hidden under its backward."""
    graph, model, arrays = priced
    _, flat = _data_parallel(graph, model, arrays, "node_addmm_1")
    backward = _seconds(arrays, "backward_s", flat)
    gather = _ring_s(4096 * 2)  # on demand, as under SMALL
    reduce = _ring_s(4096 * 2, latency_share=4096 / 1e9) + _ring_s(64 * 2, latency_share=64 / 1e9)
    assert backward["tail"] - backward["zero0"] == pytest.approx(gather + reduce, rel=1e-9)


def test_only_the_first_gradients_are_in_the_last_bucket(priced):
    """At a bucket of 87,500 elements the last one holds layer 0's first norm but not the attention projections:
    those reduce beside their backward as before; the five norms share one priced row, one of them in the last
    bucket, so the row (their mean) pays a fifth of its two 64-element reduce-scatters exposed, four fifths beside
    its backward (the norms' parameters are persistent: no gather)."""
    graph, model, arrays = priced
    _, flat = _data_parallel(graph, model, arrays, "node_addmm_1")
    backward = _seconds(arrays, "backward_s", flat)
    reduce = _ring_s(4096 * 2, latency_share=4096 / 87_500) + _ring_s(64 * 2, latency_share=64 / 87_500)
    hidden = max(0.0, reduce - backward["zero0"]) + KAPPA * min(reduce, backward["zero0"])
    assert backward["split"] - backward["zero0"] == pytest.approx(_ring_s(4096 * 2) + hidden, rel=1e-9)
    _, flat = _data_parallel(graph, model, arrays, "node_layer_norm")
    backward = _seconds(arrays, "backward_s", flat)
    reduce = 2 * _ring_s(64 * 2, latency_share=64 / 87_500)
    hidden = max(0.0, reduce - backward["zero0"]) + KAPPA * min(reduce, backward["zero0"])
    assert backward["split"] - backward["zero0"] == pytest.approx(0.2 * reduce + 0.8 * hidden, rel=1e-9)


def test_each_layer_keeps_by_its_own_reuse_distance(priced):
    """The two layers' attention projections share one priced row: its forward gathers on demand in both, its
    backward gathers again in layer 0 only, so the row (the mean of the two) pays half a backward gather, the
    reduce-scatters beside its backward as under SMALL."""
    graph, model, arrays = priced
    _, flat = _data_parallel(graph, model, arrays, "node_addmm_1")
    forward, backward = _seconds(arrays, "forward_s", flat), _seconds(arrays, "backward_s", flat)
    gather = _ring_s(4096 * 2)
    assert forward["keep"] - forward["zero0"] == pytest.approx(gather, rel=1e-9)
    reduce = _ring_s(4096 * 2) + _ring_s(64 * 2)
    hidden = max(0.0, reduce - backward["zero0"]) + KAPPA * min(reduce, backward["zero0"])
    assert backward["keep"] - backward["zero0"] == pytest.approx(gather / 2 + hidden, rel=1e-9)
