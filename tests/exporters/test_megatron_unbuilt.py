"""Issue 25: what no Megatron-Core model class builds is the first reason of the Megatron refusal
(``exporters/megatron/families.py``: ``_shared_layers``, ``_factorised_embedding``, ``_relative_bias``).

ALBERT used to be refused for its MLM head ("reads the last layer directly", which is wrong: its head has a
dense, GELU and a norm, at the embedding width) and MPNet as "not a uniform stack of GPT layers". Their real
differences from every megatron-core 0.16.1 model class:

* ALBERT (``tests/data/outside_zoo/albert_dynamo_bare.onnx``, ``tests/importers/make_outside_zoo.py``:
  ``AlbertForMaskedLM``, 2 layers, hidden 64, ``embedding_size`` 32, one layer group): one layer's weights
  applied by both layers (``TransformerBlock`` builds a ``TransformerLayer`` of its own weights per layer,
  ``transformer/transformer_block.py:367-372``), and 32-wide embeddings projected to 64
  (``LanguageModelEmbedding``'s tables are ``hidden_size`` wide, ``language_model_embedding.py:56-58``);
* MPNet (``tests/exporters/data/mpnet_ts_bare.onnx``, ``tests/exporters/make_megatron_unbuilt.py``:
  ``MPNetForMaskedLM``, 4 heads, ``relative_attention_num_buckets`` 32 by default): a learned 32 x 4
  relative-position bias, which only the encoder-decoder ``T5Model`` has (``position_embedding_type
  'relative'``, ``models/T5/t5_model.py:145-147``; GPT's and BERT's Literals have no such value).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.megatron.families import megatron_family
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
ALBERT = ROOT / "tests" / "data" / "outside_zoo" / "albert_dynamo_bare.onnx"
MPNET = ROOT / "tests" / "exporters" / "data" / "mpnet_ts_bare.onnx"
PHI3_INIT = ROOT / "tests" / "data" / "unseen_cases" / "phi3_init_ts_bare.onnx"
DIMS = {"batch": 16, "seq": 16}
PREFIX = "Megatron-LM would train a different model: "


def _refusal(path: Path) -> str:
    graph = load_graph(path, DIMS)
    with pytest.raises(UnsupportedExport) as caught:
        megatron_family(graph, analyze_transformer(graph))
    return str(caught.value)


def _clauses(message: str) -> list[str]:
    assert message.startswith(PREFIX) and "\n" not in message
    return message[len(PREFIX):].split("; ")


def test_albert_first_reasons_are_shared_layers_and_the_factorised_embedding() -> None:
    clauses = _clauses(_refusal(ALBERT))
    # the dynamo file's two attentions (q k^T at node_MatMul_83, then at node_MatMul_153) read one weight set
    assert clauses[0].startswith("its layers share their weights (cross-layer parameter sharing, as ALBERT's: "
                                 "the attention at node_MatMul_153 reads the weights of the one at node_MatMul_83)")
    # AlbertConfig(embedding_size=32, hidden_size=64)
    assert clauses[1].startswith("its token embeddings are 32 wide and its layers 64 (a factorised embedding")
    assert not any("BertLMHead" in c or "LM head" in c for c in clauses)


def test_mpnet_first_reason_is_its_relative_position_bias() -> None:
    clauses = _clauses(_refusal(MPNET))
    # MPNetConfig: relative_attention_num_buckets = 32 (default), num_attention_heads = 4
    assert clauses[0].startswith("its attention adds a learned relative-position bias to the scores (a 32 x 4 "
                                 "table of distance buckets")
    assert "only the encoder-decoder T5 has one" in clauses[0]


def test_shared_norm_scales_are_not_shared_layers() -> None:
    # The TorchScript exporter merges Phi-3's five all-ones RMSNorm scales into one initializer
    # (tests/importers/test_shared_vectors.py); its layers' matrices are their own, and it stays a GPT.
    graph = load_graph(PHI3_INIT, DIMS)
    assert megatron_family(graph, analyze_transformer(graph)).family == "gpt"


def test_the_cli_refuses_albert_in_one_line_with_exit_2() -> None:
    result = run_cli(["plan", ALBERT, "-n", 2, "--dim", "batch=16", "--dim", "seq=16", "--target", "megatron", "-q"],
                     expected_exit_code=2)
    # the import's warnings about the model print under -q too (their own "warning:" lines); the error is one line
    line, = [text for text in result.stderr.strip().splitlines() if not text.startswith("warning:")]
    assert PREFIX + "its layers share their weights" in line and "Traceback" not in result.stderr
