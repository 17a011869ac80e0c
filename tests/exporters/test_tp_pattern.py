"""Tests of exporters._tp, the per-op tensor-parallel rules shared by Megatron-LM and DeepSpeed."""

from __future__ import annotations

import dataclasses

from exporters._tp import OpRule, layout_masks, pure_data_parallel_masks, tp_layout
from importers.transformer import analyze_transformer
from tests.exporters.graphs import cnn_graph, gpt_graph, spaces_for


def test_rules_by_role():
    g = gpt_graph()
    layout = tp_layout(g, analyze_transformer(g), target="megatron")
    rules = dict(zip((op.name for op in g.ops), layout.rules))
    assert rules["qkv_0"].split == ("n",) and rules["qkv_0"].required
    assert rules["out_0"].split == ("k_0", "k_1")
    assert rules["tok_emb"].split == ("v",) and rules["tok_emb"].fallback_replicated
    assert rules["gelu_0"].split == ("d2",) and rules["gelu_0"].capped
    assert rules["split_0"].split == ("d2",) and rules["split_0"].fallback_replicated  # unsplittable QKV columns
    assert rules["ln1_0"].split == () and rules["ln1_0"].sequence == "d1" and rules["ln1_0"].sequence_required
    assert rules["pos_emb"].sequence == "i1" and not rules["pos_emb"].sequence_required
    deepspeed = dict(zip((op.name for op in g.ops), tp_layout(g, analyze_transformer(g), target="deepspeed").rules))
    assert deepspeed["tok_emb"].split == () and deepspeed["lm_head"].split == () and deepspeed["ln1_0"].sequence is None


def test_attention_without_a_heads_dim_cannot_be_split():
    # An export that merges heads into the batch dim leaves nothing for tp to split.
    g = gpt_graph()
    layout = tp_layout(g, analyze_transformer(g), target="megatron")
    index = g.op_index("score_0")
    rules = list(layout.rules)
    rules[index] = OpRule(split=(), required=True, role="attention-score")
    broken = dataclasses.replace(layout, rules=tuple(rules))
    spaces = spaces_for(g, 4)
    result = layout_masks(g, spaces, broken, dp=2, tp=2, sequence_parallel=False, devices_per_node=4)
    assert result.masks is None and "score_0 (attention-score) cannot split any dim" in result.reason
    assert layout_masks(g, spaces, broken, dp=4, tp=1, sequence_parallel=False, devices_per_node=4).masks is not None


def test_pure_data_parallel_needs_a_divisible_batch():
    g = cnn_graph(batch=6)
    assert pure_data_parallel_masks(g, spaces_for(g, 4), dp=4).masks is None
    result = pure_data_parallel_masks(g, spaces_for(g, 4), dp=2)
    assert result.masks is not None and all(m.sum() == 1 for m in result.masks)


def test_layout_masks_of_shared_spaces_equal_per_op_matching():
    # ops of repeated layers share spaces, and layout_masks one mask per equal request: the masks
    # must be those each op gets on its own (a one-op layout per op, nothing shared)
    from exporters._tp import _tp_layout

    g = gpt_graph()
    layout = tp_layout(g, analyze_transformer(g), target="megatron")
    assert layout is tp_layout(g, analyze_transformer(g), target="megatron")  # kept per graph
    assert layout.rules == _tp_layout(g, analyze_transformer(g), target="megatron").rules
    spaces = spaces_for(g, 8)
    for dp, tp, sequence_parallel in ((2, 4, False), (4, 2, True), (8, 1, False)):
        masks = layout_masks(g, spaces, layout, dp=dp, tp=tp, sequence_parallel=sequence_parallel, devices_per_node=8)
        fresh = layout_masks(
            g, [dataclasses.replace(s) for s in spaces], layout, dp=dp, tp=tp, sequence_parallel=sequence_parallel,
            devices_per_node=8,
        )
        assert masks.masks is not None and fresh.masks is not None
        assert all((a == b).all() for a, b in zip(masks.masks, fresh.masks))
