"""Learned absolute position tables read from real exports, and the launchers that train the file's
model refusing a sequence past them (issue 25).

Oracles, computed apart from the planner: a table's rows are its ONNX initializer's first dim
(``onnx.load``), and the tokens it places are the model's own maximum sequence length, from the config
``tests/zoo/make_zoo.py`` built it with (``tests/zoo/zoo.json``): GPT-2's ``n_positions``, BERT's,
OPT's and BART's ``max_position_embeddings`` (transformers' ``OPTLearnedPositionalEmbedding`` and
``BartLearnedPositionalEmbedding`` allocate it plus 2 rows and look up ``position + 2``), RoBERTa's
``max_position_embeddings - pad_token_id - 1`` (``create_position_ids_from_input_ids`` counts from
``padding_idx + 1``; ``RobertaConfig``'s default ``pad_token_id`` is 1: 130 rows place 128 tokens, as
roberta-base's 514 place 512).
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from exporters.deepspeed import rules as deepspeed_rules
from exporters.deepspeed.export import export_deepspeed
from exporters.dtensor import rules as dtensor_rules
from exporters.dtensor.export import export_dtensor
from exporters.megatron.families import family_refusals, megatron_family
from importers.position_table import position_tables
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.pricing import load_graph
from tests.exporters.graphs import make_input, spaces_for

ZOO = Path(__file__).resolve().parents[1] / "zoo"
CONFIGS = json.loads((ZOO / "zoo.json").read_text())["files"]
ROBERTA_PAD = 1  # RobertaConfig(pad_token_id=1), the default the zoo keeps


def _rows(path: Path, table: str) -> int:
    """Rows of the initializer ``table``, from the file."""
    model = onnx.load(str(path), load_external_data=False)
    return next(int(t.dims[0]) for t in model.graph.initializer if t.name == table)


def _graph(name: str, seq: int, **dims: int):
    return load_graph(ZOO / name, {"batch": 2, "seq": seq, **dims})


@pytest.mark.parametrize("name, table, places", [
    ("gpt2_dynamo_consts.onnx", "transformer.wpe.weight", lambda c: c["n_positions"]),
    ("gpt2_ts_bare.onnx", "transformer.wpe.weight", lambda c: c["n_positions"]),
    ("bert_dynamo_consts.onnx", "bert.embeddings.position_embeddings.weight", lambda c: c["max_position_embeddings"]),
    ("bert_ts_bare.onnx", "bert.embeddings.position_embeddings.weight", lambda c: c["max_position_embeddings"]),
    ("opt_dynamo_consts.onnx", "model.decoder.embed_positions.weight", lambda c: c["max_position_embeddings"]),
    ("opt_ts_bare.onnx", "model.decoder.embed_positions.weight", lambda c: c["max_position_embeddings"]),
    ("roberta_dynamo_consts.onnx", "roberta.embeddings.position_embeddings.weight",
     lambda c: c["max_position_embeddings"] - ROBERTA_PAD - 1),
    ("roberta_ts_consts.onnx", "roberta.embeddings.position_embeddings.weight",
     lambda c: c["max_position_embeddings"] - ROBERTA_PAD - 1),
])
def test_the_table_and_the_tokens_it_places(name, table, places):
    (found,) = position_tables(_graph(name, 16))  # BERT's and RoBERTa's token-type tables are not taken
    assert (found.table, found.rows, found.tokens, found.dim) == (table, _rows(ZOO / name, table), 16, "seq")
    assert found.max_tokens == places(CONFIGS[name]["config"])


@pytest.mark.parametrize("name", ["bert_dynamo_consts.onnx", "bert_ts_consts.onnx", "albert_dynamo_consts.onnx",
                                  "mobilebert_ts_consts.onnx", "bert_dynamo_bare.onnx", "bert_ts_bare.onnx"])
def test_a_sliced_position_buffer_reads_the_whole_sequence(name):
    """BERT's positions are ``self.position_ids[:, :seq]``, a slice of a buffer of max_position_embeddings
    entries, which shape inference cuts at the buffer's length: the graph's lookup is 128 long at any
    longer sequence, while the model adds it to seq token embeddings and fails past the table. The
    tokens are the sequence's, one past the table is refused, and the table itself still fits."""
    places = CONFIGS[name]["config"]["max_position_embeddings"]
    (longer,) = position_tables(_graph(name, places + 1))
    assert (longer.tokens, longer.dim, longer.fits) == (places + 1, "seq", False)
    (at,) = position_tables(_graph(name, places))
    assert (at.tokens, at.fits) == (places, True)
    assert _deepspeed_families(_graph(name, places + 1)) == []


def test_an_encoder_decoder_has_one_table_per_stack():
    # BART: the encoder's table bounds seq, the decoder's tgt_seq (BartLearnedPositionalEmbedding, offset 2)
    graph = _graph("bart_ts_consts.onnx", 16, tgt_seq=8)
    found = [(t.table, t.rows, t.tokens, t.dim, t.max_tokens) for t in position_tables(graph)]
    places = CONFIGS["bart_ts_consts.onnx"]["config"]["max_position_embeddings"]
    rows = _rows(ZOO / "bart_ts_consts.onnx", "model.encoder.embed_positions.weight")
    assert found == [("model.encoder.embed_positions.weight", rows, 16, "seq", places),
                     ("model.decoder.embed_positions.weight", rows, 8, "tgt_seq", places)]
    # the importer's largest-table reading takes the decoder's word lookup (1,000 rows) instead
    assert analyze_transformer(graph).position_table_rows == CONFIGS["bart_ts_consts.onnx"]["config"]["vocab_size"]


def test_an_offset_the_file_does_not_hold_leaves_the_whole_table():
    # a graph-only dynamo export saved every initializer external: OPT's "+ 2" is not in the file, so the
    # bound is the table's rows (130), the longest any offset allows
    (found,) = position_tables(_graph("opt_dynamo_bare.onnx", 16))
    assert found.first_row is None
    assert found.max_tokens == _rows(ZOO / "opt_dynamo_bare.onnx", "model.decoder.embed_positions.weight") == 130


@pytest.mark.parametrize("name, dims", [
    ("t5_dynamo_consts.onnx", {"tgt_seq": 512}),  # relative-position buckets (32 rows, 4 heads wide)
    ("t5_ts_bare.onnx", {"tgt_seq": 512}),
    ("llama_dynamo_consts.onnx", {}),  # rotary: no table
    ("deberta_v2_ts_consts.onnx", {}),  # rel_embeddings: added through its own projections, not looked up
])
def test_relative_and_rotary_positions_are_no_table(name, dims):
    assert position_tables(_graph(name, 512, **dims)) == ()


def _deepspeed_families(graph, devices=2):
    return deepspeed_rules.families(graph, spaces_for(graph, devices), devices=devices, devices_per_node=devices, pp=1)


def _dtensor_families(graph, devices=2):
    return dtensor_rules.families(graph, spaces_for(graph, devices), devices=devices, devices_per_node=devices, pp=1)


@pytest.mark.parametrize("name, places", [("gpt2_dynamo_consts.onnx", 128), ("opt_ts_consts.onnx", 128)])
def test_deepspeed_and_dtensor_list_the_table_length_and_refuse_past_it(name, places):
    fits, longer = _graph(name, places), _graph(name, places + 1)
    assert _deepspeed_families(fits) and _dtensor_families(fits)
    assert _deepspeed_families(longer) == [] and _dtensor_families(longer) == []
    spaces = spaces_for(longer, 2)
    plan = make_input(longer, spaces, [0] * len(spaces))
    for export, who in ((export_deepspeed, "DeepSpeed"), (export_dtensor, "A DTensor plan")):
        with pytest.raises(UnsupportedExport) as refused:
            export(plan)
        message = str(refused.value)
        assert message.startswith(f"{who} trains the model as exported, and its learned position table has 130 rows"
                                  if "opt" in name else f"{who} trains the model as exported, and its learned "
                                  "position table has 128 rows")
        assert f"the sequence is {places + 1} tokens" in message and f"--dim seq={places} or less" in message
        assert "\n" not in message


def test_megatron_counts_from_roberta_first_row():
    # 130 rows place 128 tokens: Megatron's BERT clause refuses 129, as the user's RoBERTa would fail there
    name = "roberta_dynamo_consts.onnx"
    assert not any("position table" in c for c in family_refusals(analyze_transformer(_graph(name, 128)), "bert"))
    clauses = family_refusals(analyze_transformer(_graph(name, 129)), "bert")
    (clause,) = [c for c in clauses if "position table" in c]
    assert "has 130 rows and the sequence is 129 tokens" in clause and "from row 2" in clause
    assert "--dim seq=128 or less" in clause


@pytest.mark.parametrize("name, dims", [("t5_ts_consts.onnx", {"tgt_seq": 64}), ("llama_ts_consts.onnx", {})])
def test_no_table_no_refusal(name, dims):
    # T5's 32-bucket relative tables and Llama's rotary positions place any length
    assert _deepspeed_families(_graph(name, 512, **dims)) and _dtensor_families(_graph(name, 512, **dims))


def test_token_types_without_a_position_table_are_not_refused(tmp_path):
    # BERT with its position lookup cut out (a token-type table and no learned positions, as RoFormer, whose
    # positions are rotary): the 2-row token-type table is the largest beside the words, and no table bounds seq
    model = onnx.load(str(ZOO / "bert_ts_consts.onnx"), load_external_data=False)
    nodes = model.graph.node
    lookup = next(n for n in nodes if n.op_type == "Gather" and n.input[0].endswith("position_embeddings.weight"))
    add = next(n for n in nodes if lookup.output[0] in n.input)
    kept = next(i for i in add.input if i != lookup.output[0])
    for node in nodes:
        node.input[:] = [kept if i == add.output[0] else i for i in node.input]
    for gone in (lookup, add):
        nodes.remove(gone)
    onnx.save(model, str(tmp_path / "bert_no_positions.onnx"))
    graph = load_graph(tmp_path / "bert_no_positions.onnx", {"batch": 2, "seq": 512})
    assert position_tables(graph) == ()
    assert analyze_transformer(graph).position_table_rows == 2  # type_vocab_size, BertConfig's default
    assert _deepspeed_families(graph) and _dtensor_families(graph)
    assert not any("position table" in c for c in family_refusals(analyze_transformer(graph), "bert"))


@pytest.mark.parametrize("name, first_row", [("whisper_dynamo_consts.onnx", 0), ("whisper_dynamo_bare.onnx", None),
                                             ("whisper_ts_consts.onnx", 0), ("whisper_ts_bare.onnx", 0)])
def test_whisper_decoder_table_read_from_either_exporter(name, first_row):
    """Whisper's decoder looks its table up as ``weight[position_ids]``: TorchScript writes a ``Gather``, the
    dynamo exporter a ``GatherND`` of the positions unsqueezed to ``[batch, tgt_seq, 1]``. Both bound
    ``tgt_seq`` at the config's ``max_target_positions`` (WhisperPositionalEmbedding holds that many rows;
    the bare dynamo file keeps even the ``Range``'s start outside, so its first row is unread and the whole
    table is the bound). The encoder's frozen sinusoidal table is added, not looked up: no second table."""
    places = CONFIGS[name]["config"]["max_target_positions"]
    (past,) = position_tables(_graph(name, 16, tgt_seq=places + 1))
    assert (past.rows, past.first_row, past.tokens, past.dim, past.max_tokens, past.fits) == (
        places, first_row, places + 1, "tgt_seq", places, False)
    (at,) = position_tables(_graph(name, 16, tgt_seq=places))
    assert at.fits
    model = analyze_transformer(_graph(name, 16, tgt_seq=places))
    assert model.position_table_rows == places  # the lookup is the model's position embedding either way


def test_whisper_dynamo_and_torchscript_refuse_one_way():
    """The two exports of one model: the same refusal from each launcher that trains the file's model, past
    the table (``max_target_positions`` rows), and no Megatron clause saying there is no table."""
    places = CONFIGS["whisper_ts_consts.onnx"]["config"]["max_target_positions"]
    reasons = {}
    for name in ("whisper_ts_consts.onnx", "whisper_dynamo_consts.onnx"):
        graph = _graph(name, 16, tgt_seq=4 * places)
        assert _deepspeed_families(graph) == [] and _dtensor_families(graph) == []
        spaces = spaces_for(graph, 2)
        plan = make_input(graph, spaces, [0] * len(spaces))
        for export in (export_deepspeed, export_dtensor):
            with pytest.raises(UnsupportedExport) as refused:
                export(plan)
            reasons.setdefault(export.__name__, set()).add(str(refused.value))
        with pytest.raises(UnsupportedExport) as refused:  # Megatron's T5 family, which would learn a longer table
            megatron_family(graph, analyze_transformer(graph))
        t5 = str(refused.value)
        assert f"table has {places} rows and the sequence is {4 * places} tokens" in t5
        assert "it has no learned position table" not in t5
    for messages in reasons.values():
        (message,) = messages  # word for word the same from both files
        assert f"table has {places} rows and the sequence is {4 * places} tokens" in message
        assert f"--dim tgt_seq={places} or less" in message and "\n" not in message


def test_an_anonymous_dynamo_table_is_named_by_its_module():
    # the dynamo exporter names the folded table val_N; its lookup's module is the TorchScript file's table name
    (ts,) = position_tables(_graph("whisper_ts_consts.onnx", 16, tgt_seq=8))
    (dynamo,) = position_tables(_graph("whisper_dynamo_consts.onnx", 16, tgt_seq=8))
    assert dynamo.table.startswith("val_") and dynamo.module + ".weight" == ts.table
    assert dynamo.named == f"{dynamo.table} of {dynamo.module}" and (ts.module, ts.named) == ("", ts.table)
