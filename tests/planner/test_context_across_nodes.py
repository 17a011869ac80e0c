"""Context parallelism across nodes (issue 24 item 1, task H12): Megatron-LM and torchtitan place ``cp``
outside ``tp`` in their rank order, so a stage's sequence split may cross nodes while tensor parallelism
stays inside one (``objectives.pipeline_cost.ContextSplit``, ``planner.launcher_options.context_split``).

Oracles: the K/V exchange of one layer across two nodes counted by hand (chunks of ``seq / cp`` tokens x
K/V heads x head size in bf16, the other node's eight chunks over the inter-node link's rate) and set
against the attention's own FLOPs at the device's peak; the masks checked dim by dim against the rule
they state; the least micro-batch from the node count and ``CP_MIN_TOKENS``; and the 131k-token frontier
against the same search with every model-parallel split kept inside a node (the planner before).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters._target import CP_MIN_TOKENS
from exporters._tp import context_dims
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from objectives.intra_op import intra_op_terms
from objectives.pipeline_cost import PipelineCostCache
from objectives.redistribution import redistribution
from planner.core.settings import TrainingSettings
from planner.launcher_options import context_split
from planner.pipeline import PipelineOptions, graph_loader, target_rules
from planner.search.pipeline_space import least_micro_batch

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "llama_tiny.onnx"
LLAMA = ROOT / "examples" / "llama.onnx"
SEQ = 16384  # 16 ranks of 1,024 tokens: the least CP_MIN_TOKENS allows at cp = 16


def _cache(seq: int, devices: int = 16, per_node: int = 8, launchers=("megatron",)) -> PipelineCostCache:
    loader = graph_loader(TINY, {"batch": 1, "seq": seq})
    cluster = make_cluster("h100-sxm", devices=devices, devices_per_node=per_node)
    return PipelineCostCache(loader, cluster=cluster, context=context_split(list(launchers)))


@pytest.fixture(scope="module")
def tiny():
    """The tiny Llama (2 layers, 8 heads, 4 K/V groups of head size 8) at 16,384 tokens on 2 nodes of 8."""
    return _cache(SEQ)


def test_only_the_sequence_crosses_nodes(tiny):
    """Every configuration the stage's masks allow has its non-batch dims inside a node, but the op's
    context dim, whose every node keeps CP_MIN_TOKENS tokens; without a launcher that runs it (DeepSpeed
    alone), none crosses."""
    graph = tiny.graph(1)
    masks = tiny.masks(16, 1, inside_node=True, data_parallel=None)
    spaces = tiny.model(16, 1, 0, "none", edges=False).tables.configs
    dims = context_dims(graph)
    crossing_ops = 0
    for op, space, mask, along in zip(graph.ops, spaces, masks, dims):
        for row in np.flatnonzero(mask):
            for column, dim in enumerate(op.dims):
                nodes = int(space.inter_factors[row, column])
                if dim.is_batch or nodes == 1:
                    continue
                assert dim.name == along, (op.name, dim.name)
                assert dim.size // nodes >= CP_MIN_TOKENS
                crossing_ops += 1
    assert crossing_ops  # the sequence does cross
    alone = _cache(SEQ, launchers=("deepspeed",))
    assert alone.context is None
    for op, space, mask in zip(graph.ops, spaces, alone.masks(16, 1, inside_node=True, data_parallel=None)):
        batch = np.array([d.is_batch for d in op.dims], dtype=bool)
        assert not np.any(space.inter_factors[np.flatnonzero(mask)][:, ~batch] > 1), op.name


def test_megatron_runs_cp16_on_two_nodes_within_the_masks(tiny):
    """Megatron-LM's dp=1 x cp=16 x tp=1 family has a configuration of every op inside the stage's masks
    (the search keeps it), and its tp=2 x cp=8 twin keeps tp inside a node."""
    from planner.search.target_masks import target_families

    found = target_families(tiny, target_rules("megatron"), 16, 1, inside_node=True, data_parallel=None)
    labels = {family.label for family in found.families}
    assert {"dp=1 x cp=16 x tp=1", "dp=1 x cp=8 x tp=2", "dp=1 x cp=4 x tp=4"} <= labels, labels
    assert not any(label.endswith("x tp=16") for label in labels)  # tp never crosses a node


def _producer(graph, tensor: str) -> int:
    return next(i for i, op in enumerate(graph.ops) if any(a.tensor == tensor for a in op.outputs))


def test_cross_node_kv_exchange_of_one_layer_by_hand(tiny):
    """cp = 16 on 2 nodes of 8 H100s, one sample of 16,384 tokens: each rank needs the 15 K chunks and
    15 V chunks it does not hold (1,024 tokens x 4 K/V heads x 8 channels, bf16); 8 of each live on
    the other node and cross the inter-node link (the rest NVLink), and in backward the dK/dV all-reduce
    runs over 8 ranks a node x 2 nodes. Set against the attention's FLOPs at the device's peak: the exposed
    exchange is a fraction of the attention it serves at this width (the row's speed-up is the
    attention's split)."""
    from exporters.megatron.export import _masks
    from exporters._tp import tp_layout
    from importers.transformer import analyze_transformer

    graph = tiny.graph(1)
    spaces = tiny.model(16, 1, 0, "none", edges=False).tables.configs
    model = analyze_transformer(graph)
    masks = _masks(graph, spaces, tp_layout(graph, model, target="megatron"), dp=1, tp=1, cp=16,
                   sequence_parallel=False, devices_per_node=8).masks
    cluster = tiny.cluster
    cp, per_node = 16, 8
    chunk = SEQ // cp * model.num_query_groups * model.head_dim  # elements of one K (or V) chunk
    inter_rate = cluster.inter_link.bandwidth_bytes_per_s
    hand_inter_s = 2 * (chunk * (cp - per_node) * 2 / inter_rate + cluster.inter_link.latency_s)  # K and V
    score = next(i for i, role in enumerate(model.roles) if role == "attention-score")
    value = next(i for i in range(score + 1, len(graph.ops)) if model.roles[i] == "attention-value")
    inter_s = 0.0
    for consumer_index in (score, value):
        consumer = graph.ops[consumer_index]
        access = consumer.inputs[1]
        producer_index = _producer(graph, access.tensor)
        producer = graph.ops[producer_index]
        row_u = np.flatnonzero(masks[producer_index])[0]
        row_v = np.flatnonzero(masks[consumer_index])[0]
        assert int(spaces[consumer_index].inter_factors[row_v].max()) == 2  # the query sequence crosses the 2 nodes
        moved = redistribution(
            graph.tensors[access.tensor].shape, 2, producer=producer, producer_space=spaces[producer_index],
            producer_access=next(a for a in producer.outputs if a.tensor == access.tensor),
            consumer=consumer, consumer_space=spaces[consumer_index], consumer_access=access, cluster=cluster,
        )
        assert float(moved.forward_elements[row_u, row_v]) == (cp - 1) * chunk
        assert float(moved.forward_inter_elements[row_u, row_v]) == (cp - per_node) * chunk
        inter_s += float(moved.inter_s[row_u, row_v])
        grads = [t for t in intra_op_terms(consumer, spaces[consumer_index], tensors=graph.tensors,
                                           settings=TrainingSettings()) if t.kind == "input_grad" and t.tensor == access.tensor]
        assert (int(grads[0].intra_size[row_v]), int(grads[0].inter_size[row_v])) == (per_node, 2)
    assert inter_s == pytest.approx(hand_inter_s, rel=1e-12)
    # the attention it serves: causal scores and values, 2 x 2 x s x s/cp x heads x head_dim / 2 FLOPs a
    # rank at the bf16 peak; this narrow model (8 heads of 8) moves more than it computes, so no overlap
    # could hide the exchange: the all-gather is priced exposed, as --cp-comm-type all_gather runs it
    attention_s = 2 * 2 * SEQ * (SEQ / cp) * model.num_attention_heads * model.head_dim / 2 / cluster.device.peak_flops["bf16"]
    assert hand_inter_s > 5 * attention_s


@pytest.mark.parametrize(("seq", "launcher", "least"), [(131072, "megatron", 1), (2048, "megatron", 4),
                                                         (1024, "megatron", 8), (131072, "deepspeed", 8)])
def test_least_micro_batch(seq, launcher, least):
    """A 64-device stage (8 nodes): the batch split spans the nodes the sequence does not; the sequence
    crosses at most seq / CP_MIN_TOKENS nodes (a divisor of 8), and only under a launcher that runs it."""
    cache = _cache(seq, devices=64, launchers=("megatron", "deepspeed"))
    options = PipelineOptions(global_batch=1)
    crossed = max(e for e in (1, 2, 4, 8) if seq >= e * CP_MIN_TOKENS)
    assert least == 8 // (crossed if launcher == "megatron" else 1)
    assert least_micro_batch(cache, options, 64, target_rules(launcher)) == least


def long_context_frontier(across: bool = True, launchers: tuple[str, ...] | None = None):
    """The bundled Llama (8 layers, hidden 1024, 16 heads, 4 K/V groups) at 131,072 tokens, global batch 4,
    on 64 H100s (8 nodes of 8); ``across=False``: with every model-parallel split inside a node (before)."""
    import planner.launchable as launchable
    from planner.launchable import plan_launchable_file
    from planner.plan import PlanRequest

    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=64, devices_per_node=8))
    kept = launchable.context_split
    try:
        if not across:
            launchable.context_split = lambda usable: None
        _, (found,) = plan_launchable_file(LLAMA, {"batch": 4, "seq": 131072}, [request], launchers=launchers)
    finally:
        launchable.context_split = kept
    return found


def test_the_131k_frontier_picks_cp_across_nodes():
    """Four samples cannot fill 8 nodes with data parallelism: inside a node the fastest plan pipelines
    (pp = 2 x dp = 4 x cp = 8); with cp across nodes dp = 4 x cp = 16 runs all 64 devices at pp = 1,
    faster. Its exports name the degree the search priced."""
    from exporters import export
    from planner.launchable import row_plan_input

    found = long_context_frontier(launchers=("megatron", "torchtitan"))
    inside = long_context_frontier(across=False, launchers=("megatron", "torchtitan"))
    best = found.rows[found.chosen]
    assert (best.degrees.dp, best.degrees.cp, best.degrees.tp, best.point.pp) == (4, 16, 1, 1)
    assert all(row.degrees.cp * row.degrees.tp <= 8 for row in inside.rows)
    assert best.time_s < 0.9 * min(row.time_s for row in inside.rows)
    out = export("megatron", row_plan_input(best))
    assert out["degrees"]["cp"] == 16 and out["world_size"] == 64
    assert "--context-parallel-size 16" in " ".join(out["args"]) if isinstance(out["args"], list) else out["args"]
    # torchtitan's own frontier: beside Megatron-LM's (cuDNN attention on an H100, faster than the
    # FlexAttention torchtitan runs) its rows across nodes are dominated
    titan_frontier = long_context_frontier(launchers=("torchtitan",))
    titan = next(row for row in titan_frontier.rows if row.degrees.cp * row.degrees.tp > 8)
    out = export("torchtitan", row_plan_input(titan))
    assert out["degrees"]["cp"] == titan.degrees.cp and out["world_size"] == 64
