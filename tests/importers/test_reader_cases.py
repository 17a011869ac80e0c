"""Issue 25 (task H5): the transformer reader on multi-query attention and QK-LayerNorm models.

Files: ``tests/data/reader_cases/`` (built by ``tests/importers/make_reader_cases.py``, configs in its
``counts.json``) and the zoo's Falcon (``tests/zoo/zoo.json``: 4 heads, ``multi_query``). Each is read at
the sequence it is given here (``seq=96``, not the 16 it was exported at), so a length read from the graph
is that one.

- With one KV head the key has no head axis, so the score product's query-side rows hold the heads and
  the sequence: the sequence is read without the heads (:func:`importers.transformer.query_dims`). Before,
  it was seq x heads (384 for 3 heads at 96), and so were Megatron's ``--seq-length`` and the run cost.
- StableLM's and Persimmon's QK-LayerNorm read the projection through views (a split per head, a gather of
  the fused QKV), and the walk passes them (:func:`importers.qk_norm.qk_walk_verdict`). Before, the reader
  found no projection and said "no attention".
- SegFormer's K/V from a strided conv of its own input is spatial-reduction self-attention
  (:mod:`importers.attention_streams`), not an encoder-decoder's cross-attention.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import exporters
from exporters.megatron import megatron_masks
from exporters.validate import parse_megatron_args
from importers import transformer
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "reader_cases"
ZOO = ROOT / "tests" / "zoo"
SEQ, BATCH = 96, 4

# file -> (heads, KV heads, head size): the configs in make_reader_cases.CONFIGS and the zoo's Falcon
# (GPTBigCode: n_embd 64 / n_head 4 = 16; Llama: 96 / 3 = 32; Falcon: 64 / 4 = 16)
MQA = {
    CASES / "gptbigcode_mqa_ts_bare.onnx": (4, 1, 16),
    CASES / "gptbigcode_mqa_dynamo_bare.onnx": (4, 1, 16),
    CASES / "llama_mqa_ts_bare.onnx": (3, 1, 32),
    CASES / "llama_mqa_dynamo_bare.onnx": (3, 1, 32),
    ZOO / "falcon_ts_bare.onnx": (4, 1, 16),
    ZOO / "falcon_dynamo_bare.onnx": (4, 1, 16),
}


def _graph(path: Path, seq: int = SEQ):
    return load_graph(path, {"batch": BATCH, "seq": seq})


@pytest.mark.parametrize("path", list(MQA), ids=lambda p: p.stem)
def test_one_kv_head_reads_the_sequence_not_seq_times_heads(path):
    heads, groups, head_dim = MQA[path]
    model = analyze_transformer(_graph(path))
    assert (model.seq_length, model.num_attention_heads, model.num_query_groups, model.head_dim) == (
        SEQ, heads, groups, head_dim)
    assert {block.seq_length for block in model.attention} == {SEQ}
    assert model.num_layers == 2 and not model.irregular
    # the sequence class holds the query rows, the heads class the query-only head axis
    score = model.attention[0].score
    seq_dims, head_dims = transformer.query_dims(_graph(path), model.classes, model.attention[0])
    assert [_graph(path).ops[score].dim(d).size for d in seq_dims] == [SEQ]
    assert [_graph(path).ops[score].dim(d).size for d in head_dims] == [heads]
    assert model.seq_class == model.classes.of[score][seq_dims[0]]
    assert model.heads_class == model.classes.of[score][head_dims[0]]


@pytest.mark.parametrize("stem", ["gptbigcode_mqa_dynamo", "llama_mqa_ts"])
@pytest.mark.parametrize("seq", [96, 256])
def test_megatron_seq_length_is_the_planned_sequence(stem, seq):
    """``--seq-length`` is the sequence the graph was planned at (96 or 256 tokens), not 4 x or 3 x it."""
    graph = _graph(CASES / f"{stem}_bare.onnx", seq)
    spaces = spaces_for(graph, 2)
    masks = megatron_masks(graph, spaces, dp=2, tp=1, sequence_parallel=False)
    assert masks is not None
    out = exporters.export("megatron", make_input(graph, spaces, first_rows(masks), settings=TrainingSettings(),
                                                  global_batch=16))
    args = parse_megatron_args(out["args"])
    assert args["seq-length"] == seq
    assert args["num-query-groups"] == 1


def test_grouped_query_attention_is_unchanged():
    """Control: the zoo's Llama has 4 heads and 2 KV heads (zoo.json), read right before and after."""
    model = analyze_transformer(_graph(ZOO / "llama_ts_bare.onnx"))
    assert (model.seq_length, model.num_attention_heads, model.num_query_groups) == (SEQ, 4, 2)


# file -> (heads, KV heads, QK-norm kind): StableLM 4 / 2 with a LayerNorm per head (its own weights);
# Persimmon 4 / 4 (no num_key_value_heads) with one LayerNorm(head_dim 16) and its bias
QK = {
    "stablelm_qk_ts": (4, 2, "per-head-weights"),
    "stablelm_qk_dynamo": (4, 2, "per-head-weights"),
    "persimmon_qk_ts": (4, 4, "per-head"),
    "persimmon_qk_dynamo": (4, 4, "per-head"),
}


@pytest.mark.parametrize("stem", list(QK))
def test_qk_layernorm_models_are_read_as_transformers(stem):
    heads, groups, kind = QK[stem]
    graph = _graph(CASES / f"{stem}_bare.onnx")
    model = analyze_transformer(graph)
    assert (model.num_layers, model.num_attention_heads, model.num_query_groups, model.head_dim) == (2, heads, groups, 16)
    assert (model.hidden_size, model.seq_length) == (64, SEQ)
    assert model.features.qk_norm == kind
    # the QK-norms are attention glue: StableLM runs one per query head and one per KV head (4 + 2 per
    # layer), Persimmon one for the queries and one for the keys
    norms = [i for block in model.attention for i in block.glue if graph.ops[i].kind == "norm"]
    assert len(norms) == 2 * ((heads + groups) if kind == "per-head-weights" else 2)


def test_a_softmax_not_read_as_attention_says_why(monkeypatch):
    """Without the walk through QK-norms, StableLM's attention has no Q/K projection: the refusal says
    so (the walker's reason), not only "no attention"."""
    monkeypatch.setattr(transformer, "qk_walk_verdict", lambda graph, param_mm, back, stop: stop)
    graph = _graph(CASES / "stablelm_qk_ts_bare.onnx")
    with pytest.raises(UnsupportedExport, match=r"has no attention .*\(attention at \S+ has no Q/K/V or output projection"):
        transformer._analyze(graph)


def test_megatron_refuses_stablelm_per_head_weights_saying_so():
    """megatron-core 0.16.1 builds q_layernorm / k_layernorm once, of hidden_size_per_attention_head
    (transformer/attention.py), shared by the heads: StableLM's four query norms have their own weights."""
    from exporters.megatron.families import megatron_family

    graph = _graph(CASES / "stablelm_qk_ts_bare.onnx")
    with pytest.raises(UnsupportedExport, match=r"each query and key head with its own norm weights .*shares one weight of head_dim"):
        megatron_family(graph, analyze_transformer(graph))


def test_persimmon_qk_layernorm_is_megatrons():
    """Persimmon's q/k LayerNorm(head_dim) with its bias is --qk-layernorm under --normalization LayerNorm
    (megatron-core 0.16.1: q_layernorm is the backend's layer_norm, torch.nn.LayerNorm with a bias): its
    norms are Megatron's count, 2 x 2 layers + the final one + q and k per layer = 9."""
    from exporters.megatron.families import _gpt_norms

    graph = _graph(CASES / "persimmon_qk_ts_bare.onnx")
    model = analyze_transformer(graph)
    assert sum(op.kind == "norm" for op in graph.ops) == 9
    assert model.normalization == "LayerNorm" and model.features.qk_norm == "per-head"
    assert _gpt_norms(graph, model) == []


# SegFormer (make_reader_cases.SEGFORMER) on 64 x 64 images: stage 1's patch embedding has stride 4, so
# 16 x 16 = 256 queries; its sr conv (kernel = stride = sr_ratio 2) leaves 8 x 8 = 64 keys. Stage 2 (stride 2,
# sr_ratio 1) has 8 x 8 = 64 queries and keys and no conv.
@pytest.mark.parametrize("style", ["ts", "dynamo"])
def test_segformer_spatial_reduction_is_self_attention(style):
    from exporters.megatron.families import megatron_family
    from exporters.megatron.t5 import t5_stack

    graph = load_graph(CASES / f"segformer_{style}_bare.onnx", {"batch": 2})
    model = analyze_transformer(graph)
    first, second = model.attention
    assert graph.ops[first.kv_reduction].kind == "conv" and second.kv_reduction is None
    assert (first.seq_length, second.seq_length) == (256, 64)
    assert graph.ops[first.score].dim(transformer.exclusive_output_dims(graph, graph.ops[first.score], 1)[0]).size == 64
    assert model.irregular[0].startswith("spatial-reduction attention at ")
    assert any(r.startswith("a conv inside the MLP") for r in model.irregular)
    assert t5_stack(graph, model) is None  # no cross-attention: not an encoder-decoder
    with pytest.raises(UnsupportedExport) as refused:
        megatron_family(graph, model)
    assert "encoder-decoder" not in str(refused.value) and "cross-attention" not in str(refused.value)


def test_bart_cross_attention_is_still_cross():
    """Control: the zoo's BART (2 encoder and 2 decoder layers, zoo.json) reads its decoder's K/V from the
    encoder output: 2 cross-attentions, no spatial reduction."""
    from exporters.megatron.t5 import t5_stack

    graph = load_graph(ZOO / "bart_ts_bare.onnx", {"batch": 2, "seq": 32, "tgt_seq": 24})
    model = analyze_transformer(graph)
    stack = t5_stack(graph, model)
    assert stack is not None and len(stack.decoder_cross) == 2 and len(stack.encoder) == 2
    assert all(block.kv_reduction is None for block in model.attention)
