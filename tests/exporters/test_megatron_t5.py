"""Issue 25: the Megatron exporter's encoder-decoder family, ``pretrain_t5.py`` (exporters/megatron/t5.py).

Fixture: ``tests/exporters/data/megatron_t5_tiny.onnx`` (``tests/integration/make_megatron_t5.py``), an
encoder-decoder computed as megatron-core 0.16.1's ``T5Model`` with Megatron-LM's default flags: 2 + 2
layers, hidden 64, 4 heads, FFN 256, vocabulary 1,000, 128 learned positions, biases everywhere, a tied
head with its output bias. The zoo's Hugging Face T5, BART and Whisper are refused, each feature named.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters.megatron import export_megatron, megatron_masks
from exporters.megatron.families import megatron_family
from exporters.megatron.rules import families, stage_rule
from exporters.megatron.t5 import t5_refusals, t5_stack, t5_view
from exporters.validate import parse_megatron_args
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "exporters" / "data" / "megatron_t5_tiny.onnx"
ZOO = ROOT / "tests" / "zoo"
DIMS = {"batch": 16, "seq": 16, "tgt_seq": 8}


def _graph(path: Path = FIXTURE):
    return load_graph(path, DIMS)


@pytest.fixture(scope="module")
def t5():
    return _graph()


def _export(graph, dp, tp, sp=False):
    spaces = spaces_for(graph, dp * tp)
    masks = megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp)
    assert masks is not None
    return export_megatron(make_input(graph, spaces, first_rows(masks), settings=TrainingSettings(), global_batch=16))


def _refusal(path: Path) -> str:
    graph = _graph(path)
    with pytest.raises(UnsupportedExport) as info:
        megatron_family(graph, analyze_transformer(graph))
    reason = str(info.value)
    assert "\n" not in reason and "encoder-decoder (cross-attention at" in reason and "pretrain_t5.py" in reason
    return reason


class TestMegatronShapedT5:
    def test_parameters_and_stack(self, t5):
        # by hand: word 1000 x 64 + positions 128 x 64 = 72,192; an encoder layer 2 LN (256) + qkv 12,480 + proj
        # 4,160 + fc1 16,640 + fc2 16,448 = 49,984; a decoder layer adds LN 128 + q 4,160 + kv 8,320 + proj 4,160;
        # two final LNs (256) and the output bias (1,000)
        encoder_layer = 256 + 12_480 + 4_160 + 16_640 + 16_448
        decoder_layer = encoder_layer + 128 + 4_160 + 8_320 + 4_160
        assert t5.parameter_count == 72_192 + 2 * encoder_layer + 2 * decoder_layer + 256 + 1_000 == 306_920
        model = analyze_transformer(t5)
        stack = t5_stack(t5, model)
        assert stack is not None and stack.ordered
        assert (stack.encoder, stack.decoder_self, stack.decoder_cross) == ((0, 1), (2, 4), (3, 5))
        assert (stack.encoder_seq_length, stack.decoder_seq_length) == (16, 8)
        assert t5_refusals(t5, model, stack) == []
        view = t5_view(t5, model, stack)
        assert (view.num_layers, view.seq_length, view.position_table_rows) == (2, 16, 128)

    def test_family(self, t5):
        family = megatron_family(t5, analyze_transformer(t5))
        assert (family.family, family.script, family.args) == ("t5", "pretrain_t5.py", ("--decoder-seq-length", "8"))

    @pytest.mark.parametrize(("dp", "tp"), [(8, 1), (2, 4), (4, 2)])
    def test_export(self, t5, dp, tp):
        out = _export(t5, dp, tp)
        args = parse_megatron_args(out["args"])
        assert out["model_family"] == "t5" and " pretrain_t5.py " in out["command"]
        assert (args["num-layers"], args["hidden-size"], args["ffn-hidden-size"], args["num-attention-heads"]) == (
            2, 64, 256, 4)
        assert (args["seq-length"], args["decoder-seq-length"], args["max-position-embeddings"]) == (16, 8, 128)
        assert (args["tensor-model-parallel-size"], args["pipeline-model-parallel-size"]) == (tp, 1)
        # Megatron's defaults say the rest: learned positions, biases, LayerNorm, GELU, the tied head
        for absent in ("position-embedding-type", "disable-bias-linear", "normalization", "swiglu",
                       "untie-embeddings-and-output-weights", "kv-channels", "context-parallel-size"):
            assert absent not in args

    def test_no_context_or_pipeline_parallel_row(self, t5):
        spaces = spaces_for(t5, 8)
        assert megatron_masks(t5, spaces, dp=4, tp=1, cp=2) is None
        labels = {f.label for f in families(t5, spaces, devices=8, devices_per_node=8, pp=1)}
        assert labels and not any("cp=" in label for label in labels)
        assert "dp=8 x tp=1" in labels and "dp=2 x tp=4" in labels

    def test_every_listed_row_exports(self, t5):
        """No row lists megatron that its export refuses: each family's first configuration exports, as
        pretrain_t5.py at the family's degrees (no sequence-parallel or cp family is listed)."""
        spaces = spaces_for(t5, 8)
        listed = families(t5, spaces, devices=8, devices_per_node=8, pp=1)
        # every dp x tp on up to 8 devices with tp dividing the 4 heads; never cp > 1 or sp
        assert {(f.dp, f.tp, f.cp, f.sp) for f in listed} == {
            (dp, tp, 1, False) for tp in (1, 2, 4) for dp in (1, 2, 4, 8) if dp * tp <= 8}
        for family in listed:
            out = export_megatron(make_input(t5, spaces, first_rows(list(family.masks)), settings=TrainingSettings(),
                                             global_batch=16))
            assert out["script"] == "pretrain_t5.py"
            assert (out["degrees"]["dp"], out["degrees"]["tp"]) == (family.dp, family.tp)

    def test_pipeline_is_refused(self, t5):
        from tests.exporters.graphs import make_cluster, pipeline_spec

        spaces = spaces_for(t5, 4)
        masks = megatron_masks(t5, spaces, dp=4, tp=1)
        spec = pipeline_spec(t5, [1, 1], devices_per_stage=4, micro_batch=4, micro_batches=4,
                             settings=TrainingSettings())
        plan = make_input(t5, spaces, first_rows(masks), cluster=make_cluster(1, 8), global_batch=spec.global_batch,
                          pipeline=spec)
        with pytest.raises(UnsupportedExport, match="Pipeline parallelism is not supported for T5"):
            export_megatron(plan)
        family = families(t5, spaces, devices=4, devices_per_node=8, pp=2)[0]
        assert stage_rule(family, plan) is False


class TestRefusals:
    @pytest.mark.parametrize("name", ["t5_dynamo_bare.onnx", "t5_dynamo_consts.onnx"])
    def test_hugging_face_t5_dynamo(self, name):
        reason = _refusal(ZOO / name)
        for clause in ("its MLP uses ReLU", "relative-position biases", "a 32 x 4 table per stack",
                       "not scaled by 1/sqrt(d)", "d_model^-0.5", "tied vocabulary projection has no bias"):
            assert clause in reason
        assert "uniform" not in reason  # the decoder's shorter sequence is its stack's own

    @pytest.mark.parametrize("name", ["t5_ts_bare.onnx", "t5_ts_consts.onnx"])
    def test_hugging_face_t5_torchscript(self, name):
        # TorchScript's SDPA multiplies q and k by constants a graph-only file may lack: not proven unscaled
        reason = _refusal(ZOO / name)
        for clause in ("its MLP uses ReLU", "relative-position biases", "d_model^-0.5"):
            assert clause in reason
        assert "not scaled" not in reason

    @pytest.mark.parametrize("name", ["bart_ts_bare.onnx", "bart_dynamo_consts.onnx"])
    def test_bart(self, name):
        reason = _refusal(ZOO / name)
        assert "post-LN" in reason and "2 position or word tables" in reason

    @pytest.mark.parametrize("name", ["whisper_ts_bare.onnx", "whisper_dynamo_bare.onnx"])
    def test_whisper(self, name):
        reason = _refusal(ZOO / name)
        assert "encoder reads no token embedding" in reason
        assert "not scaled" not in reason  # Whisper scales q in q_proj(x) * scaling

    @pytest.mark.parametrize("name", ["t5_ts_bare.onnx", "bart_dynamo_bare.onnx", "whisper_ts_consts.onnx"])
    def test_no_megatron_row(self, name):
        graph = _graph(ZOO / name)
        assert megatron_masks(graph, spaces_for(graph, 2), dp=2, tp=1) is None

    def test_each_mutation_gives_its_clause(self, t5):
        model = analyze_transformer(t5)
        stack = t5_stack(t5, model)
        untied = t5_refusals(t5, dataclasses.replace(model, tied_embeddings=False), stack)
        assert len(untied) == 1 and "untied vocabulary projection has a bias" in untied[0]
        grouped = t5_refusals(t5, dataclasses.replace(model, num_query_groups=2), stack)
        assert len(grouped) == 1 and "CrossAttention refuses it" in grouped[0]
        shallow = dataclasses.replace(stack, encoder=(0,))  # 1 encoder layer against 2 decoder layers
        unordered = dataclasses.replace(stack, ordered=False)
        assert any("not an encoder stack followed by decoder layers" in c for c in t5_refusals(t5, model, unordered))
        assert any("its encoder has 1 layers and its decoder 2" in c for c in t5_refusals(t5, model, shallow))
