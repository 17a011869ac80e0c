"""The tokens a position table places, as the planner reads them, are what the model runs (issue 25).

Oracle: transformers itself. Each zoo model is rebuilt from the config its file was exported with
(``tests/zoo/zoo.json``) and run at :attr:`~importers.position_table.PositionTable.max_tokens` tokens
(it runs) and one more (it fails: ``nn.Embedding`` raises ``IndexError`` reading past the table, or BERT's
and RoBERTa's ``token_type_ids`` buffer, as long as the table, fails first with a ``RuntimeError``), so
the launchers that train the file's model list the first and refuse the second. RoFormer, token types
and rotary positions, exported fresh: its 2-row token-type table is not taken, and its frozen sinusoidal
table (``max_position_embeddings`` rows, one head wide, looked up at ``arange`` positions) bounds the
sequence as a learned table does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.deepspeed import rules as deepspeed_rules
from importers.position_table import position_tables
from planner.pricing import load_graph
from tests.exporters.graphs import spaces_for

pytestmark = pytest.mark.integration

ZOO = Path(__file__).resolve().parents[1] / "zoo"
FILES = json.loads((ZOO / "zoo.json").read_text())["files"]


def _model(name: str):
    transformers = pytest.importorskip("transformers")
    entry = FILES[name]
    cls = getattr(transformers, entry["model_class"])
    config = {k: v for k, v in entry["config"].items() if not k.startswith("example_") and k != "output_follows_seq"}
    return cls(cls.config_class(**config)).eval(), config


def _runs(model, vocab: int, tokens: int) -> bool:
    torch = pytest.importorskip("torch")
    ids = torch.randint(3, vocab, (1, tokens))  # no pad id (RoBERTa's 1 would keep its padding row)
    try:
        with torch.no_grad():
            model(input_ids=ids)
    except (IndexError, RuntimeError):  # the lookup, or first the buffers BERT and RoBERTa size like the table
        return False
    return True


@pytest.mark.parametrize("name", ["gpt2_ts_consts.onnx", "opt_dynamo_consts.onnx", "roberta_ts_bare.onnx",
                                  "bert_dynamo_consts.onnx"])
def test_the_model_runs_the_tokens_its_table_places_and_not_one_more(name):
    (table,) = position_tables(load_graph(ZOO / name, {"batch": 2, "seq": 16}))
    model, config = _model(name)
    assert _runs(model, config["vocab_size"], table.max_tokens)
    assert not _runs(model, config["vocab_size"], table.max_tokens + 1)


def test_roformer_token_types_are_not_its_table(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.RoFormerConfig(vocab_size=100, embedding_size=64, hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=128, max_position_embeddings=32)
    model = transformers.RoFormerForMaskedLM(config).eval()
    ids = torch.randint(3, 100, (2, 16))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with torch.no_grad():
        torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(tmp_path / "roformer.onnx"),
                          input_names=names, dynamic_axes={n: {0: "batch", 1: "seq"} for n in names}, dynamo=False,
                          opset_version=17)
    graph = load_graph(tmp_path / "roformer.onnx", {"batch": 2, "seq": 64})
    (table,) = position_tables(graph)
    assert (table.table, table.rows, table.max_tokens) == ("roformer.encoder.embed_positions.weight", 32, 32)
    assert _runs(model, 100, 32) and not _runs(model, 100, 33)
    assert deepspeed_rules.families(graph, spaces_for(graph, 2), devices=2, devices_per_node=2, pp=1) == []
    fits = load_graph(tmp_path / "roformer.onnx", {"batch": 2, "seq": 32})
    assert deepspeed_rules.families(fits, spaces_for(fits, 2), devices=2, devices_per_node=2, pp=1)


@pytest.mark.parametrize("name", ["whisper_dynamo_consts.onnx", "whisper_dynamo_bare.onnx", "whisper_ts_consts.onnx"])
def test_whisper_decoder_runs_the_tokens_its_table_places_and_not_one_more(name):
    """The dynamo file's decoder table is a GatherND of the positions (TorchScript's a Gather): both read as
    the table that bounds ``tgt_seq``, and the decoder itself fails one token past it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    (table,) = position_tables(load_graph(ZOO / name, {"batch": 2, "tgt_seq": 8}))
    config = {k: v for k, v in FILES[name]["config"].items() if not k.startswith("example_") and k != "frames"}
    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3)  # make_zoo.whisper's
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**config, **special)).eval()
    features = torch.randn(1, config["num_mel_bins"], 2 * config["max_source_positions"])

    def decodes(tokens: int) -> bool:
        try:
            with torch.no_grad():
                model(input_features=features, decoder_input_ids=torch.randint(3, config["vocab_size"], (1, tokens)))
        except (IndexError, RuntimeError):
            return False
        return True

    assert table.dim == "tgt_seq" and decodes(table.max_tokens) and not decodes(table.max_tokens + 1)
