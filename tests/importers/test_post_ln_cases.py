"""Issue 25: where the layers normalise is read along the residual stream
(:func:`importers.layer_features.residual_after_norm`), so the embedding projection of ALBERT and ELECTRA
before the first layer no longer reads their post-LN stacks as pre-LN.

The files are ``tests/data/post_ln_cases/`` (``tests/importers/make_post_ln_cases.py``) and
``tests/data/outside_zoo/albert_dynamo_bare.onnx``. The oracle is the ONNX protobuf itself, read here without
the importer (:func:`_post_ln_adds`), and the modules that wrote it (transformers 5.24, the integration
test ``tests/integration/test_megatron_bert_head.py`` runs or reads them):

* ``ElectraSelfOutput`` / ``ElectraOutput``: ``LayerNorm(dropout(dense(h)) + input_tensor)``;
* ``AlbertAttention``: ``LayerNorm(hidden_states + projected_context)``, ``AlbertLayer``:
  ``full_layer_layer_norm(ffn_output + attention_output)``;
* ``torch.nn.TransformerEncoderLayer`` / ``DecoderLayer`` with ``norm_first=False`` (the default, which
  ``examples/make_examples.py``'s ``nn_transformer_ts`` keeps): ``norm1(x + self._sa_block(x))``;
* megatron-core's ``TransformerLayer`` (``tests/integration/make_megatron_bert.py``): ``x + attn(LN(x))``.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from importers.transformer import analyze_transformer
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "post_ln_cases"
DIMS = {"batch": 2, "seq": 16, "tgt_seq": 16}


_NORM_OPS = {"LayerNormalization", "Pow", "ReduceMean"}  # a LayerNorm op, or an RMSNorm's x ** 2 and mean


def _post_ln_adds(path: Path) -> int:
    """Adds, read from the protobuf, whose output a norm reads (:data:`_NORM_OPS`) and one of whose inputs a
    ``MatMul`` / ``Gemm`` reads too: ``norm(x + f(x))`` with ``x`` the sub-layer's own input. Pre-LN's
    ``x`` is read by the norm and the add, never by a linear."""
    graph = onnx.load(str(path), load_external_data=False).graph
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for tensor in node.input:
            readers.setdefault(tensor, []).append(node.op_type)
    return sum(node.op_type == "Add" and bool(_NORM_OPS & set(readers.get(node.output[0], [])))
               and any(r in ("MatMul", "Gemm") for t in node.input for r in readers.get(t, []))
               for node in graph.node)


@pytest.mark.parametrize(("path", "post"), [
    # 2 layers x (attention, MLP): 4 post-LN adds each, the first reading the 32 -> 64 embedding projection
    (CASES / "electra_ts_bare.onnx", True), (CASES / "electra_dynamo_bare.onnx", True),
    (CASES / "albert_ts_bare.onnx", True), (ROOT / "tests" / "data" / "outside_zoo" / "albert_dynamo_bare.onnx", True),
    # BERT: the first layer reads the embedding LayerNorm (read as post-LN before issue 25 too)
    (CASES / "bert_gelu_tanh_ts_bare.onnx", True), (CASES / "bert_gelu_new_dynamo_bare.onnx", True),
    # megatron-core's pre-LN layers: no add reads a linear's input
    (CASES / "megatron_bert_tanh_dynamo.onnx", False),
])
def test_placement_follows_the_residual_stream(path: Path, post: bool) -> None:
    assert _post_ln_adds(path) == (4 if post else 0)
    assert analyze_transformer(load_graph(path, DIMS)).features.post_layernorm is post


def test_the_first_layer_reads_the_embedding_projection() -> None:
    # what made the old rule ("every sub-layer's input is a norm's output") read ELECTRA as pre-LN: the first
    # attention's Q, K and V read embeddings_project (ElectraModel: a Linear(embedding_size, hidden_size)
    # after the embedding LayerNorm), and the residual add reads it too
    graph = onnx.load(str(CASES / "electra_ts_bare.onnx"), load_external_data=False).graph
    projected = "/electra/embeddings_project/Add_output_0"
    readers = sorted(n.name for n in graph.node if projected in n.input and n.op_type != "Shape")
    assert readers == ["/electra/encoder/layer.0/attention/output/Add",
                       "/electra/encoder/layer.0/attention/self/key/MatMul",
                       "/electra/encoder/layer.0/attention/self/query/MatMul",
                       "/electra/encoder/layer.0/attention/self/value/MatMul"]


def test_nn_transformer_is_post_ln() -> None:
    # torch.nn.Transformer with norm_first=False (6 encoder, 6 decoder layers): each stack's first layer reads
    # the graph's input (src, tgt), no norm, so the old rule read it as pre-LN
    graph = load_graph(ROOT / "tests" / "data" / "nn_transformer_ts.onnx", DIMS)
    assert analyze_transformer(graph).features.post_layernorm is True


@pytest.mark.parametrize("path", [
    ROOT / "tests" / "zoo" / "gpt2_ts_bare.onnx", ROOT / "tests" / "zoo" / "llama_dynamo_bare.onnx",
    ROOT / "tests" / "exporters" / "data" / "olmo2_tiny.onnx", ROOT / "tests" / "exporters" / "data" / "gemma2_tiny.onnx",
    ROOT / "tests" / "zoo" / "falcon_dynamo_bare.onnx", ROOT / "tests" / "exporters" / "data" / "megatron_bert_tiny.onnx",
])
def test_pre_ln_reordered_and_sandwich_stacks_stay_not_post_ln(path: Path) -> None:
    # pre-LN (GPT-2, Llama, megatron-core's BERT), OLMo-2's x + norm(f(x)) (its add is reached through a norm),
    # Gemma-2's sandwich, Falcon's parallel x + attn(norm(x)) + mlp(norm(x)): none normalises x + f(x)
    assert _post_ln_adds(path) == 0
    assert analyze_transformer(load_graph(path, DIMS)).features.post_layernorm is False
