"""Issue 25: the Megatron exporter's model families (exporters/megatron/families.py) and the importer's
proof of what they need (importers/attention_masks.py, importers/layer_features.py).

Fixtures: the zoo (``tests/zoo``) for what Hugging Face models are, and
``tests/exporters/data/megatron_bert{,_binary}_tiny.onnx`` (``tests/integration/make_megatron_bert.py``):
a BERT computed as megatron-core's ``BertModel`` does (pre-LN, no embedding norm, ``BertLMHead``), of
2 layers, hidden 64, 4 heads, FFN 256, vocabulary 1,000 and 128 positions; 177,576 parameters
(binary head: 181,994), torch's count at export.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters.megatron import export_megatron, feature_refusals, megatron_masks
from exporters.megatron.families import megatron_family
from exporters.validate import parse_megatron_args
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "exporters" / "data"
ZOO = ROOT / "tests" / "zoo"
DIMS = {"batch": 16, "seq": 16, "tgt_seq": 16}


def _graph(path: Path):
    return load_graph(path, DIMS)


@pytest.fixture(scope="module")
def bert():
    return _graph(DATA / "megatron_bert_tiny.onnx")


@pytest.fixture(scope="module")
def bert_binary():
    return _graph(DATA / "megatron_bert_binary_tiny.onnx")


def _export(graph, dp, tp, sp=False):
    spaces = spaces_for(graph, dp * tp)
    masks = megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp)
    assert masks is not None
    return export_megatron(make_input(graph, spaces, first_rows(masks), settings=TrainingSettings(), global_batch=16))


class TestAttentionMasks:
    @pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral", "qwen2", "phi", "falcon", "bloom", "gpt_neox", "opt"])
    @pytest.mark.parametrize("style", ["dynamo_bare", "ts_bare", "dynamo_consts", "ts_consts"])
    def test_every_decoder_lm_of_the_zoo_is_causal(self, arch, style):
        graph = _graph(ZOO / f"{arch}_{style}.onnx")
        assert set(graph.attention_masks.values()) == {"causal"}
        assert analyze_transformer(graph).features.attention_mask == "causal"

    @pytest.mark.parametrize("arch", ["bert", "roberta", "vit"])
    @pytest.mark.parametrize("style", ["dynamo_bare", "ts_bare"])
    def test_encoders_are_bidirectional(self, arch, style):
        assert analyze_transformer(_graph(ZOO / f"{arch}_{style}.onnx")).features.attention_mask == "bidirectional"

    def test_a_padding_mask_input_is_per_key(self, bert):
        # the fixture takes attention_mask [b, s] and adds it as [b, 1, 1, s]: still bidirectional
        assert list(bert.attention_masks.values()) == ["bidirectional"] * 2

    def test_t5_self_cross_and_relative_bias(self):
        masks = _graph(ZOO / "t5_ts_consts.onnx").attention_masks
        kinds = {name.split("/")[1] + ":" + name.split("/")[4]: kind for name, kind in masks.items()}
        # the encoder's relative-position bias is q - k arithmetic on the grid: not proven either way
        assert kinds == {"encoder:SelfAttention": "unknown", "decoder:SelfAttention": "causal",
                         "decoder:EncDecAttention": "bidirectional"}


class TestPostLayerNorm:
    @pytest.mark.parametrize(("name", "post"), [
        ("bert_dynamo_bare.onnx", True), ("bert_ts_bare.onnx", True), ("roberta_ts_consts.onnx", True),
        ("gpt2_dynamo_bare.onnx", False), ("gpt2_ts_bare.onnx", False), ("llama_ts_bare.onnx", False),
        ("falcon_dynamo_bare.onnx", False),  # parallel attention + MLP from one norm: pre-LN
    ])
    def test_zoo(self, name, post):
        assert analyze_transformer(_graph(ZOO / name)).features.post_layernorm is post

    def test_megatron_shaped_bert_is_pre_ln(self, bert):
        assert analyze_transformer(bert).features.post_layernorm is False


class TestGptRefusals:
    def test_each_new_feature_gives_its_clause(self, bert):
        model = analyze_transformer(bert)
        causal = dataclasses.replace(model.features, attention_mask="causal")
        assert feature_refusals(dataclasses.replace(model, features=causal)) == []
        bidi = feature_refusals(model)
        assert len(bidi) == 1 and "bidirectional" in bidi[0] and "causal" in bidi[0]
        post = dataclasses.replace(causal, post_layernorm=True)
        (clause,) = feature_refusals(dataclasses.replace(model, features=post))
        assert "post-LN" in clause

    @pytest.mark.parametrize("name", ["bert_ts_bare.onnx", "bert_dynamo_bare.onnx", "roberta_dynamo_bare.onnx"])
    def test_hugging_face_bert_is_refused_in_one_line(self, name):
        graph = _graph(ZOO / name)
        with pytest.raises(UnsupportedExport) as info:
            megatron_family(graph, analyze_transformer(graph))
        reason = str(info.value)
        assert "\n" not in reason and "pretrain_bert.py" in reason and "post-LN" in reason
        assert "token-type embedding" in reason  # BERT's 2 rows, RoBERTa's 1, read with no binary head
        assert megatron_masks(graph, spaces_for(graph, 2), dp=2, tp=1) is None

    def test_vit_is_refused_in_one_line(self):
        graph = _graph(ZOO / "vit_ts_bare.onnx")
        with pytest.raises(UnsupportedExport, match="bidirectional encoder without an LM head"):
            megatron_family(graph, analyze_transformer(graph))

    @pytest.mark.parametrize("name", ["mobilebert_dynamo_bare.onnx", "mobilebert_dynamo_consts.onnx"])
    def test_mobilebert_is_refused_for_its_head_not_for_lacking_one(self, name):
        """MobileBERT's LM head multiplies by cat([decoder.weight.t(), dense.weight]) ([64 + 64, 1000] from the
        tied [1000, 64] table and a [64, 1000] weight, transformers' MobileBertLMPredictionHead): the refusal names
        that head, not a missing one (h32f; it said "an encoder without an LM head" before)."""
        graph = _graph(ZOO / name)
        with pytest.raises(UnsupportedExport) as info:
            megatron_family(graph, analyze_transformer(graph))
        reason = str(info.value)
        assert "\n" not in reason and "without an LM head" not in reason
        assert "concatenated at run time from 'cls.predictions.decoder.weight' [1000, 64], " \
               "'cls.predictions.dense.weight' [64, 1000]" in reason
        assert "ColumnParallelLinear(config.hidden_size, vocab_size)" in reason

    @pytest.mark.parametrize("name", ["t5_ts_bare.onnx", "t5_dynamo_consts.onnx", "bart_ts_bare.onnx",
                                      "whisper_dynamo_bare.onnx"])
    def test_encoder_decoders_are_refused_in_one_line(self, name):
        graph = _graph(ZOO / name)
        with pytest.raises(UnsupportedExport) as info:
            megatron_family(graph, analyze_transformer(graph))
        reason = str(info.value)
        assert "\n" not in reason and "encoder-decoder (cross-attention at" in reason and "pretrain_t5.py" in reason

    @pytest.mark.parametrize("name", ["gpt2_ts_bare.onnx", "llama_dynamo_bare.onnx", "qwen2_ts_consts.onnx"])
    def test_gpts_stay_gpts(self, name):
        graph = _graph(ZOO / name)
        assert megatron_family(graph, analyze_transformer(graph)).script == "pretrain_gpt.py"


class TestBertExport:
    def test_family_and_parameters(self, bert, bert_binary):
        # torch's own count when make_megatron_bert.py wrote them: the graph-only files prove it exactly
        assert (bert.parameter_count, bert_binary.parameter_count) == (177_576, 181_994)
        family = megatron_family(bert, analyze_transformer(bert))
        assert (family.family, family.script, family.args, family.binary_head) == (
            "bert", "pretrain_bert.py", ("--bert-no-binary-head",), False)
        binary = megatron_family(bert_binary, analyze_transformer(bert_binary))
        assert (binary.args, binary.binary_head) == ((), True)

    @pytest.mark.parametrize(("dp", "tp", "sp"), [(8, 1, False), (2, 4, False), (2, 4, True), (1, 4, True)])
    def test_export(self, bert, dp, tp, sp):
        out = _export(bert, dp, tp, sp)
        args = parse_megatron_args(out["args"])
        assert out["model_family"] == "bert" and out["script"] == "pretrain_bert.py"
        assert " pretrain_bert.py " in out["command"]
        assert (args["num-layers"], args["hidden-size"], args["ffn-hidden-size"], args["num-attention-heads"]) == (
            2, 64, 256, 4)
        assert (args["seq-length"], args["max-position-embeddings"]) == (16, 128)
        assert args["tensor-model-parallel-size"] == tp and bool(args.get("sequence-parallel")) == sp
        assert args.get("bert-no-binary-head") is True
        # LayerNorm with biases, GELU MLP, the output layer tied to the word embeddings: all defaults
        for flag in ("swiglu", "normalization", "disable-bias-linear", "untie-embeddings-and-output-weights",
                     "position-embedding-type", "group-query-attention"):
            assert flag not in args

    def test_binary_head_export(self, bert_binary):
        args = parse_megatron_args(_export(bert_binary, 2, 2)["args"])
        assert "bert-no-binary-head" not in args and args["num-layers"] == 2

    def test_no_context_parallelism(self, bert):
        assert megatron_masks(bert, spaces_for(bert, 2), dp=1, tp=1, cp=2) is None
