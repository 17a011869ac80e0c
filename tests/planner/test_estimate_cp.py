"""``estimate(..., cp=...)``: Megatron-LM's dp x cp x tp layout priced as the search prices it.

Oracles: the launchable search pinned to the same plan (``--fix cp=2,tp=1,pp=1``: the Megatron
family dp=4 x cp=2 x tp=1), and activation bytes counted by hand from the tiny Llama's shapes
(tests/data/llama_tiny.onnx: 2 layers, hidden 64, 8 heads of 8, 4 KV heads of 8, FFN 128), never from
the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.core.settings import TrainingSettings
from planner.estimate import estimate, estimate_file
from planner.launchable import launch_frontier
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.plan import PlanRequest

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"
GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"

BATCH, SEQ, HIDDEN, HEADS, KV_DIM, FFN = 2, 16, 64, 8, 32, 128
BF16, LSE = 2, 4  # bytes: activations in bf16, flash attention's fp32 log-sum-exp per head and token


def test_cp_estimate_equals_the_searchs_price_of_the_same_plan():
    loader = graph_loader(LLAMA, {"seq": 4096})  # 2,048 tokens per cp rank: the search's cp family exists
    cluster = make_cluster("a100-80gb", devices=8, devices_per_node=8)
    frontier = launch_frontier(loader, PlanRequest(cluster=cluster), options=PipelineOptions(global_batch=4),
                               pins=Pins(cp=2, tp=1, pp=1), launchers=("megatron",))
    assert frontier.rows
    for row in frontier.rows:
        point = row.point
        assert (row.degrees.dp, row.degrees.cp, row.degrees.tp) == (4, 2, 1)
        found = estimate(row.cache, cluster=cluster, tp=1, cp=2, pp=1, micro_batch=point.micro_batch, global_batch=4,
                         zero=point.zero_stage, recompute=point.recompute,
                         sequence_shard_saved=point.sequence_shard_saved, fused_swiglu=point.fused_swiglu)  # Megatron's rules
        assert found.valid and found.config.dp == 4 and found.config.devices == 8
        assert tuple(found.point.choice) == tuple(point.choice)
        assert found.time_s == pytest.approx(point.time_s, rel=1e-12)
        assert found.memory_bytes == pytest.approx(point.memory_bytes, rel=1e-12)


def test_the_cli_estimate_prices_megatrons_memory_rules_by_default():
    """``planner estimate`` (:func:`estimate_file`) names no launcher rule: on a Megatron-LM GPT its layout is priced
    with Megatron-Core's (fused SwiGLU keeps fc1's output only; sp keeps the input shard), as the search prices the
    same row (``estimate()`` itself keeps its settings' rules unless told ``megatron_rules``)."""
    loader = graph_loader(LLAMA, {"seq": 4096})
    cluster = make_cluster("a100-80gb", devices=4, devices_per_node=8)
    frontier = launch_frontier(loader, PlanRequest(cluster=cluster), options=PipelineOptions(global_batch=4),
                               pins=Pins(cp=2, tp=2, pp=1, mb=1), launchers=("megatron",))
    assert frontier.rows
    for row in frontier.rows:
        point = row.point
        assert point.fused_swiglu  # the rule the row was priced under (SwiGLU: every row of this Llama)
        _, found = estimate_file(LLAMA, {"seq": 4096}, cluster=cluster, global_batch=4, settings=row.cache.settings,
                                 tp=2, cp=2, pp=1, micro_batch=point.micro_batch, zero=point.zero_stage,
                                 recompute=point.recompute, sequence_parallel=row.layout.endswith(" sp"))
        assert found.valid and tuple(found.point.choice) == tuple(point.choice)
        assert found.time_s == pytest.approx(point.time_s, rel=1e-12)
        assert found.memory_bytes == pytest.approx(point.memory_bytes, rel=1e-12)


def _block_activations(cp: int, recompute: str) -> float:
    """Activation bytes of the tiny Llama's second block on one rank, at ``cp`` ranks of one sample pair."""
    at = graph_loader(LLAMA, {"seq": SEQ})
    cluster = make_cluster("h100-sxm", devices=cp, devices_per_node=8)
    settings = TrainingSettings(engine="fused", attention="flash")
    cache = PipelineCostCache(at, cluster=cluster, settings=settings)
    found = estimate(cache, cluster=cluster, tp=1, pp=1, cp=cp, micro_batch=BATCH, global_batch=BATCH,
                     recompute=recompute, settings=settings)  # type: ignore[arg-type]
    assert found.valid, found.reason
    model = cache.model(cp, BATCH, 0, recompute)
    block = model.graph.blocks[0].instances[1]
    return sum(float(model.op_details[i].memory.activations_bytes[found.point.choice[i]]) for i in block)


@pytest.mark.parametrize("cp", [1, 2])
def test_each_cp_rank_keeps_seq_over_cp_tokens_of_each_activation(cp):
    tokens = BATCH * SEQ // cp  # 32 tokens, 16 on each of two cp ranks
    # full recomputation: the block's input checkpoint only (hidden values per token)
    assert _block_activations(cp, "full") == pytest.approx(tokens * HIDDEN * BF16)  # 4,096 / 2,048 bytes
    # torchtitan's op-level SAC: block input, wq, wv, attention out, w1, w2 outputs and the lse; the
    # attention's all-gathered keys and values are not kept (Megatron's cp gathers them again in backward)
    per_token = (HIDDEN + HIDDEN + KV_DIM + HIDDEN + FFN + HIDDEN) * BF16 + HEADS * LSE  # 864 bytes
    assert _block_activations(cp, "op") == pytest.approx(tokens * per_token)  # 27,648 / 13,824 bytes


class TestRefusals:
    @pytest.fixture
    def cluster(self):
        return make_cluster("a100-80gb", devices=8, devices_per_node=8)

    def test_the_devices_count_cp(self, cluster):
        at = graph_loader(LLAMA, {"seq": 64})
        found = estimate(at, cluster=cluster, tp=2, cp=2, pp=1, dp=4, micro_batch=1, global_batch=4)
        assert not found.valid
        assert found.reason == ("tp=2 x cp=2 x pp=1 x dp=4 = 16 but the cluster has 8 devices; make the product "
                                "equal --devices")

    def test_dp_defaults_to_devices_over_tp_cp_pp(self, cluster):
        found = estimate(graph_loader(LLAMA, {"seq": 64}), cluster=cluster, tp=1, cp=2, pp=2, micro_batch=1,
                         global_batch=4)
        assert found.valid and found.config.dp == 2
        assert found.config.describe().startswith("dp=2 x cp=2 x tp=1 x pp=2")

    def test_dp_cp_tp_all_above_one_is_priced_not_refused(self, cluster):
        # three split dims per op: priced in wider configuration spaces (tests/planner/test_estimate_cp_tp.py)
        found = estimate(graph_loader(LLAMA, {"seq": 256}), cluster=cluster, tp=2, cp=2, pp=1, micro_batch=1,
                         global_batch=4)
        assert found.valid, found.reason
        assert found.config.describe().startswith("dp=2 x cp=2 x tp=2 x pp=1")

    def test_a_sequence_cp_cannot_cut_says_so(self, cluster):
        # 6 tokens do not cut into 2 x cp = 8 chunks
        found = estimate(graph_loader(LLAMA, {"seq": 6}), cluster=cluster, tp=1, cp=4, pp=1, micro_batch=1,
                         global_batch=2)
        assert not found.valid
        assert found.reason == "the sequence of 6 tokens does not cut into 2 x cp = 8 chunks; choose a --cp that divides seq / 2"
