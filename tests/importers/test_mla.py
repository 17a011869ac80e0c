"""Multi-latent attention (DeepSeek-V2/V3) read from the graph (issue 25 item 3, :mod:`importers.mla`):
the latent ranks and head sizes of transformers' ``DeepseekV3ForCausalLM`` files
(``tests/importers/make_mla_cases.py``, configs in ``tests/data/mla_cases/counts.json``) come back from the
weights' shapes, in both exporters' files and with a full-rank query; a plain attention is not taken for MLA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers.transformer import analyze_transformer
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "mla_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())


def _model(path: Path):
    graph = load_graph(path, {"batch": 2, "seq": 16})
    return graph, analyze_transformer(graph)


@pytest.mark.parametrize("name", sorted(COUNTS["files"]))
def test_the_latent_sizes_come_from_the_weights(name):
    config = COUNTS["configs"][COUNTS["files"][name]["case"]]
    graph, model = _model(CASES / name)
    assert model.num_layers == config["num_hidden_layers"] and not model.irregular
    for block in model.attention:
        mla = block.mla
        assert mla is not None
        assert (mla.q_lora_rank, mla.kv_lora_rank) == (config["q_lora_rank"], config["kv_lora_rank"])
        assert (mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim) == (16, 8, 20)
        assert mla.heads == config["num_attention_heads"] == 4
        # the query's first projection is part of the attention, its input the hidden state
        assert (mla.q_down is not None) == (config["q_lora_rank"] is not None)
        assert block.q_proj == tuple(sorted(i for i in (mla.q_down, mla.q_up) if i is not None))
        assert set(block.k_proj) == {mla.kv_down, mla.kv_up} and block.v_proj == (mla.kv_up,)
        # the down-projections are replicated over tp (Megatron's TELinear "duplicated"), the up-projections
        # column-parallel like any Q/K/V projection
        assert {model.roles[i] for i in (mla.q_down, mla.kv_down) if i is not None} == {"latent-proj"}
        assert model.roles[mla.q_up] == model.roles[mla.kv_up] == "qkv"
    # every head has its own keys and values (kv_b_proj: heads x (16 + 20)), so no query groups; the
    # score's head size is the query's 16 + 8 channels
    assert (model.hidden_size, model.num_attention_heads, model.num_query_groups, model.head_dim) == (64, 4, 4, 24)
    assert model.ffn_hidden_size == config["intermediate_size"] == 128
    assert sum(op.kind == "norm" for op in graph.ops) == 2 * 2 + 1 + 2 * (1 + (config["q_lora_rank"] is not None))


def test_the_moe_deepseek_file_reads_the_same_attention():
    # tests/data/moe_cases: DeepSeek-V3 with routed experts; v_head_dim 16 there (counts.json)
    _, model = _model(ROOT / "tests" / "data" / "moe_cases" / "deepseek_v3_ts_bare.onnx")
    sizes = {(a.mla.q_lora_rank, a.mla.kv_lora_rank, a.mla.qk_nope_head_dim, a.mla.qk_rope_head_dim,
              a.mla.v_head_dim) for a in model.attention if a.mla is not None}
    assert sizes == {(32, 16, 16, 8, 16)} and model.hidden_size == 64


@pytest.mark.parametrize("name", ["llama_tiny.onnx", "gpt2_tiny.onnx", "mixtral_tiny.onnx"])
def test_plain_attention_is_not_mla(name):
    _, model = _model(ROOT / "tests" / "data" / name)
    assert all(a.mla is None for a in model.attention)
