"""Tests of importers.transformer: dimension classes and transformer recognition, checked by hand and
against the model configs recorded in examples/models.json and tests/data/models.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers.transformer import analyze_transformer, dim_classes, head_dims, output_side_dims, reduction_side_dims
from planner.core.errors import UnsupportedExport
from tests.exporters.graphs import cnn_graph, gpt_graph, llama_graph

ROOT = Path(__file__).resolve().parents[2]


def _same(classes, graph, a: tuple[str, str], b: tuple[str, str]) -> bool:
    return classes.cls(graph.op_index(a[0]), a[1]) == classes.cls(graph.op_index(b[0]), b[1])


class TestDimClasses:
    def test_gpt_classes_follow_tensor_axes(self):
        g = gpt_graph()
        c = dim_classes(g)
        # Heads: the score's head dim, the softmax's, the value's and the output projection's outer k.
        for other in (("softmax_0", "d1"), ("value_0", "b1"), ("out_0", "k_0")):
            assert _same(c, g, ("score_0", "b1"), other)
        # Hidden (residual stream) is one class across layers, embedding and LM head.
        for other in (("ln2_0", "d2"), ("fc1_0", "k"), ("fc2_0", "n"), ("qkv_1", "k"), ("tok_emb", "d"), ("pos_emb", "d"), ("lm_head", "k")):
            assert _same(c, g, ("add1_0", "d2"), other)
        # FFN: fc1's output, the activation, fc2's reduction.
        assert _same(c, g, ("fc1_0", "n"), ("gelu_0", "d2")) and _same(c, g, ("gelu_0", "d2"), ("fc2_0", "k"))
        # The merged [batch*seq] Gemm output joins both sub-dims (same split structure on both ends).
        assert _same(c, g, ("fc2_0", "m_1"), ("add2_0", "d1")) and _same(c, g, ("fc2_0", "m_0"), ("add2_0", "d0"))
        # The Split's unsplittable axis maps to () in its outputs: QKV columns are not heads.
        assert _same(c, g, ("qkv_0", "n"), ("split_0", "d2"))
        assert not _same(c, g, ("qkv_0", "n"), ("score_0", "b1"))
        # Query and key lengths are the same sequence; different layers' heads are different classes.
        assert _same(c, g, ("score_0", "m"), ("score_0", "n"))
        assert not _same(c, g, ("score_0", "b1"), ("score_1", "b1"))
        # The tied table joins the embedding rows and the LM head's output columns.
        assert _same(c, g, ("tok_emb", "v"), ("lm_head", "n"))

    def test_every_dim_has_one_class(self):
        g = llama_graph()
        c = dim_classes(g)
        members = [m for group in c.members for m in group]
        assert len(members) == len(set(members)) == sum(len(op.dims) for op in g.ops)


class TestStructureHelpers:
    def test_column_and_row_dims(self):
        g = gpt_graph()
        assert output_side_dims(g, g.ops[g.op_index("qkv_0")]) == ("n",)
        assert reduction_side_dims(g, g.ops[g.op_index("out_0")]) == ("k_0", "k_1")
        assert head_dims(g, g.ops[g.op_index("score_0")]) == ("b1",)
        gq = llama_graph()
        assert head_dims(gq, gq.ops[gq.op_index("score_0")]) == ("b1_0", "b1_1")
        assert output_side_dims(gq, gq.ops[gq.op_index("q_0")]) == ("n",)


class TestAnalyzeTransformer:
    def test_gpt(self):
        g = gpt_graph()
        m = analyze_transformer(g)
        sizes = (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.head_dim, m.ffn_hidden_size)
        assert sizes == (2, 64, 4, 4, 16, 256)
        assert (m.seq_length, m.vocab_size, m.position_table_rows) == (16, 96, 32)
        assert m.tied_embeddings and not m.gated_mlp and m.linear_bias
        assert m.normalization == "LayerNorm" and m.irregular == ()
        roles = dict(zip((op.name for op in g.ops), m.roles))
        assert [roles[n] for n in ("pos_emb", "tok_emb", "ln1_0", "qkv_0", "split_0", "score_0", "softmax_0", "value_0", "out_0", "add1_0", "ln2_0", "fc1_0", "gelu_0", "fc2_0", "add2_0", "ln_f", "lm_head")] == [
            "position-embedding", "embedding", "norm", "qkv", "attention-glue", "attention-score", "softmax",
            "attention-value", "out-proj", "residual", "norm", "fc1", "mlp-glue", "fc2", "residual", "norm", "lm-head",
        ]

    def test_llama_gqa(self):
        g = llama_graph(heads=8, kv_heads=2, hidden=128, ffn=192)
        m = analyze_transformer(g)
        assert (m.num_attention_heads, m.num_query_groups, m.head_dim, m.hidden_size) == (8, 2, 16, 128)
        assert m.ffn_hidden_size == 192 and m.gated_mlp
        assert m.normalization == "RMSNorm" and not m.linear_bias and not m.tied_embeddings
        assert m.position_table_rows is None and m.seq_length == 16
        block = m.attention[0]
        assert [g.ops[i].name for i in (*block.q_proj, *block.k_proj, *block.v_proj, *block.out_proj)] == ["q_0", "k_0", "v_0", "o_proj_0"]
        assert [g.ops[i].name for i in m.mlps[0].fc1] == ["gate_0", "up_0"]

    @pytest.mark.parametrize("kv_heads", [8, 2])
    def test_fused_qkv_query_groups(self, kv_heads):
        # (heads + 2 * groups) * head_dim columns in one projection.
        m = analyze_transformer(llama_graph(heads=8, kv_heads=kv_heads, fused_qkv=True, named_weights=False))
        assert m.num_query_groups == kv_heads and m.num_attention_heads == 8

    def test_extra_linear_is_irregular(self):
        m = analyze_transformer(gpt_graph(extra_linear=True))
        assert m.irregular and "dense" in m.irregular[0]
        assert m.roles[len(m.roles) - 1] == "lm-head"

    def test_cnn_is_refused(self):
        with pytest.raises(UnsupportedExport, match="not a transformer"):
            analyze_transformer(cnn_graph())


_MODELS = [("examples", "gpt2"), ("examples", "llama"), ("examples", "bert"), ("tests/data", "gpt2_tiny"), ("tests/data", "bert_tiny_ts"), ("tests/data", "gpt2_ts")]


@pytest.mark.parametrize(("folder", "name"), _MODELS)
def test_real_exports_match_their_configs(folder, name):
    meta_path = ROOT / folder / "models.json"
    if not meta_path.exists():
        pytest.skip(f"{meta_path} not present")
    meta = json.loads(meta_path.read_text())[name]
    path = ROOT / folder / meta["file"]
    if not path.exists():
        pytest.skip(f"{path} not present")
    from importers import import_model

    graph = import_model(path, {"batch": 2, "seq": 32})
    m = analyze_transformer(graph)
    config = meta["config"]
    assert m.num_layers == config["layers"]
    assert m.hidden_size == config["hidden"]
    assert m.num_attention_heads == config["heads"]
    assert m.num_query_groups == config["kv_heads"]
    assert m.ffn_hidden_size == config["intermediate"]
    assert m.vocab_size == config["vocab"]
    assert m.seq_length == 32


@pytest.mark.parametrize(("folder", "name"), [("examples", "resnet"), ("examples", "mlp"), ("tests/data", "lstm_lm")])
def test_real_non_transformers_are_refused(folder, name):
    meta_path = ROOT / folder / "models.json"
    if not meta_path.exists():
        pytest.skip(f"{meta_path} not present")
    meta = json.loads(meta_path.read_text())[name]
    path = ROOT / folder / meta["file"]
    if not path.exists():
        pytest.skip(f"{path} not present")
    from importers import import_model

    graph = import_model(path, {d: (2 if "batch" in d else 16) for d in meta["dims"]})
    with pytest.raises(UnsupportedExport, match="not a transformer"):
        analyze_transformer(graph)


def test_an_irregular_attention_names_what_differs():
    # T5's decoder self-attention runs over the target sequence (16), its encoder's over the source
    # (32): same heads and head size, so the message names the sequence lengths
    from planner.plan import load_graph

    graph = load_graph(ROOT / "tests" / "data" / "t5_tiny.onnx", {"batch": 2, "seq": 32, "tgt_seq": 16})
    first = analyze_transformer(graph).irregular[0]
    assert "(sequence length 16 vs 32)" in first and "heads" not in first
