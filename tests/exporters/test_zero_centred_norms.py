"""Issue 25: norms that scale by ``1 + w`` (NeMo's LayerNorm1P, Gemma's RMSNorm) are read from the
file's ``weight + 1`` (importers/zero_centred.py, ``LayerFeatures.zero_centred_norms``), exported to
Megatron-LM as ``--apply-layernorm-1p`` and refused by torchtitan, whose RMSNorm scales by ``w``.

Fixtures: ``tests/data/param_cases/nemotron_*`` (``tests/importers/make_param_cases.py``: transformers'
``NemotronForCausalLM`` of 2 layers, whose ``NemotronLayerNorm1P`` computes
``F.layer_norm(x, ..., self.weight + 1, ...)``: 2 norms per layer and the final one, 5 in all, both
exporters, with and without small constants); copies of one with a norm rewired to its plain weight,
or its ``1`` changed or stripped; ``tests/data/zero_centred_cases/gemma*`` (``make_zero_centred_cases.py``:
transformers' ``GemmaForCausalLM`` and ``Gemma3ForCausalLM`` of 2 layers, hidden 64, whose ``GemmaRMSNorm``
scales by ``1.0 + self.weight``, exported without constant folding); ``nemotron_folded_*`` there (the
Nemotron above with each exporter's default constant folding: ``weight + 1`` is a new constant the
exporter names); and a hand-built Gemma RMSNorm, ``x / rms * (1 + Cast(w))``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from exporters import export
from exporters.megatron import megatron_masks
from exporters.megatron.families import family_refusals, megatron_family, norm_args
from exporters.torchtitan import torchtitan_masks
from exporters.torchtitan.families import family_refusals as torchtitan_refusals
from exporters.validate import megatron_violations
from importers.layer_features import zero_centred_norms
from importers.transformer import analyze_transformer
from importers.zero_centred import folded_norm_scales, norm_scale_offsets
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "param_cases"
NEMOTRON = sorted(CASES.glob("nemotron_*.onnx"))
GEMMA = ROOT / "tests" / "data" / "zero_centred_cases"
FOLDED = [GEMMA / f"nemotron_folded_{style}.onnx" for style in ("ts_consts", "dynamo_consts")]
DIMS = {"batch": 4, "seq": 16}
LAYER1 = "/model/model/layers.1/input_layernorm/"  # a norm of nemotron_ts_consts.onnx, as the exporter named it


def _norms(graph) -> list[int]:
    return [i for i, op in enumerate(graph.ops) if op.kind == "norm"]


def _edited(tmp_path: Path, edit) -> Path:
    """A copy of ``nemotron_ts_consts.onnx`` (graph only, as stored) after ``edit(model)``."""
    model = onnx.load(str(CASES / "nemotron_ts_consts.onnx"), load_external_data=False)
    edit(model)
    path = tmp_path / "edited.onnx"
    onnx.save(model, str(path))
    return path


def _node(model, name: str):
    return next(n for n in model.graph.node if n.name == name)


def _plain_layer1(model) -> None:
    """Layer 1's input norm reads its weight itself: a LayerNorm among LayerNorm1Ps."""
    ln = _node(model, LAYER1 + "LayerNormalization")
    ln.input[1] = "model.model.layers.1.input_layernorm.weight"
    model.graph.node.remove(_node(model, LAYER1 + "Add"))


def _two_layer1(model) -> None:
    const = _node(model, LAYER1 + "Constant")
    const.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(2.0, np.float32)))


def _stripped_layer1(model) -> None:
    """The ``1`` as a one-element initializer whose data is not in the file (a graph-only export)."""
    const = _node(model, LAYER1 + "Constant")
    model.graph.node.remove(const)
    tensor = numpy_helper.from_array(np.array(1.0, np.float32), const.output[0])
    tensor.ClearField("raw_data")
    tensor.data_location = T.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "absent.data"
    model.graph.initializer.append(tensor)


class TestDetection:
    @pytest.mark.parametrize("path", NEMOTRON, ids=lambda p: p.stem)
    def test_every_layernorm_1p_reads_one_plus_its_weight(self, path):
        graph = load_graph(path, DIMS)
        assert norm_scale_offsets(graph, _norms(graph)) == [1.0] * 5  # 2 per layer x 2 layers + the final norm
        assert analyze_transformer(graph).features.zero_centred_norms == "all"
        assert folded_norm_scales(graph) == ()  # the 1 is read: nothing to say about a fold

    @pytest.mark.parametrize(("name", "norms", "params"), [
        # Gemma: 2 per layer x 2 + the final norm; embedding 96 x 64 (tied) + 2 x (q, o 64 x 64; k, v 64 x 16;
        # gate, up, down 64 x 128; 2 norms of 64) + 64 = 6,144 + 2 x 34,944 + 64
        ("gemma", 5, 76_096),
        # Gemma-3: 4 per layer (sandwich) and the per-head q_norm, k_norm (16 each) x 2 + the final norm
        ("gemma3", 13, 76_096 + 2 * (2 * 64 + 2 * 16)),
    ])
    @pytest.mark.parametrize("style", ["dynamo_consts", "ts_consts"])
    def test_every_gemma_rms_norm_reads_one_plus_its_weight(self, name, norms, params, style):
        graph = load_graph(GEMMA / f"{name}_{style}.onnx", DIMS)
        assert norm_scale_offsets(graph, _norms(graph)) == [1.0] * norms
        assert graph.parameter_count == params  # each weight counted once, weight + 1 read as it
        model = analyze_transformer(graph)
        assert model.features.zero_centred_norms == "all" and norm_args(model) == ("--apply-layernorm-1p",)
        assert not any("(1 + weight)" in w or "(weight + c)" in w for w in family_refusals(model, "gpt"))

    def test_a_folded_weight_plus_one_reads_plain(self):
        """The zoo's Gemma was exported with constant folding: ``weight + 1`` is a new constant, the file's
        only record of the scale, and nothing in the graph tells it from a plain weight."""
        graph = load_graph(ROOT / "tests" / "zoo" / "gemma_ts_consts.onnx", DIMS)
        assert analyze_transformer(graph).features.zero_centred_norms == "none"

    @pytest.mark.parametrize("style", ["ts_consts", "dynamo_consts"])
    def test_the_fold_shows_in_the_scales_names(self, style):
        """What the fold leaves: the zoo's Gemma names each norm's folded scale as the exporter made it
        (its only initializers of the hidden size, 64: 2 norms per layer x 2 + the final one, read with
        onnx), and its embedding by module path."""
        path = ROOT / "tests" / "zoo" / f"gemma_{style}.onnx"
        scales = [t.name for t in onnx.load(str(path), load_external_data=False).graph.initializer if list(t.dims) == [64]]
        assert len(scales) == 5 and not any("." in name for name in scales)
        assert sorted(folded_norm_scales(load_graph(path, DIMS))) == sorted(scales)

    @pytest.mark.parametrize("path", FOLDED, ids=lambda p: p.stem)
    def test_a_folded_layernorm_1p_lists_every_scale(self, path):
        """Nemotron folded: each LayerNormalization's scale input is the folded constant (read with onnx),
        beside its bias, which keeps its module path."""
        nodes = [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "LayerNormalization"]
        assert len(nodes) == 5 and all("." not in n.input[1] and n.input[2].endswith("layernorm.bias")
                                       or n.input[2] == "model.model.norm.bias" for n in nodes)
        graph = load_graph(path, DIMS)
        assert analyze_transformer(graph).features.zero_centred_norms == "none"
        assert sorted(folded_norm_scales(graph)) == sorted(n.input[1] for n in nodes)

    @pytest.mark.parametrize("arch", ["llama_ts_bare", "gpt2_dynamo_consts", "qwen2_ts_consts"])
    def test_plain_norms_are_none(self, arch):
        graph = load_graph(ROOT / "tests" / "zoo" / f"{arch}.onnx", DIMS)
        offsets = norm_scale_offsets(graph, _norms(graph))
        assert offsets and set(offsets) == {None}  # every norm found, none offset
        assert analyze_transformer(graph).features.zero_centred_norms == "none"
        assert folded_norm_scales(graph) == ()  # every scale keeps its module path

    def test_gemma_rms_norm_through_a_cast(self, tmp_path):
        """Gemma's ``output * (1.0 + self.weight.float())``: the constant first, the weight cast."""
        nodes = [
            helper.make_node("Pow", ["x", "two"], ["sq"], name="pow"),
            helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean", axes=[-1], keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["mse"], name="eps_add"),
            helper.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
            helper.make_node("Reciprocal", ["rms"], ["inv"], name="inv"),
            helper.make_node("Mul", ["x", "inv"], ["normed"], name="mul"),
            helper.make_node("Cast", ["norm.weight"], ["w32"], name="cast", to=T.FLOAT),
            helper.make_node("Add", ["one", "w32"], ["scale"], name="one_plus"),
            helper.make_node("Mul", ["normed", "scale"], ["h"], name="scale_mul"),
            helper.make_node("MatMul", ["h", "fc.weight"], ["y"], name="fc"),
        ]
        inits = [numpy_helper.from_array(np.zeros(16, np.float32), "norm.weight"),
                 numpy_helper.from_array(np.ones((16, 16), np.float32), "fc.weight"),
                 numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                 numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
                 numpy_helper.from_array(np.array(2.0, np.float32), "two")]
        model = helper.make_model(helper.make_graph(
            nodes, "rms1p", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 16])],
            [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", 16])], inits),
            opset_imports=[helper.make_opsetid("", 17)])
        onnx.save(model, str(tmp_path / "rms1p.onnx"))
        graph = load_graph(tmp_path / "rms1p.onnx", DIMS)
        assert len(_norms(graph)) == 1 and norm_scale_offsets(graph, _norms(graph)) == [1.0]
        assert zero_centred_norms(graph) == "all"

    @pytest.mark.parametrize(("edit", "offset", "kind"), [
        (_plain_layer1, None, "mixed"),
        (_two_layer1, 2.0, "other"),
        (_stripped_layer1, "nan", "other"),
    ])
    def test_one_norm_differs(self, tmp_path, edit, offset, kind):
        graph = load_graph(_edited(tmp_path, edit), DIMS)
        offsets = norm_scale_offsets(graph, _norms(graph))
        assert offsets.count(1.0) == 4  # the other four norms keep their 1
        (changed,) = [c for c in offsets if c != 1.0]
        assert changed is None if offset is None else (np.isnan(changed) if offset == "nan" else changed == offset)
        assert analyze_transformer(graph).features.zero_centred_norms == kind


def _input(graph, masks_fn, dp: int = 2):
    spaces = spaces_for(graph, dp)
    return make_input(graph, spaces, first_rows(masks_fn(graph, spaces, dp=dp, tp=1)), cluster=make_cluster(1, dp))


def _llama_with_a_folded_norm(tmp_path: Path) -> Path:
    """The zoo's Llama with its final norm's weight renamed as the TorchScript exporter names a constant it
    folded (``onnx::Mul_N``), as if the model scaled by ``weight + 1``."""
    model = onnx.load(str(ROOT / "tests" / "zoo" / "llama_ts_consts.onnx"), load_external_data=False)
    (weight,) = [t for t in model.graph.initializer if t.name == "model.norm.weight"]
    weight.name = "onnx::Mul_9999"
    for node in model.graph.node:
        node.input[:] = ["onnx::Mul_9999" if name == "model.norm.weight" else name for name in node.input]
    path = tmp_path / "llama_folded.onnx"
    onnx.save(model, str(path))
    return path


class TestMegatron:
    @pytest.mark.parametrize("path", NEMOTRON, ids=lambda p: p.stem)
    def test_layernorm_1p_is_the_flag(self, path):
        graph = load_graph(path, DIMS)
        model = analyze_transformer(graph)
        assert "apply-layernorm-1p" not in " ".join(family_refusals(model, "gpt"))
        family = megatron_family(graph, model)
        assert family.family == "gpt" and family.args == ("--apply-layernorm-1p",)

    @pytest.mark.parametrize("path", FOLDED, ids=lambda p: p.stem)
    def test_a_folded_file_exports_plain_norms_and_says_so(self, path):
        out = export("megatron", _input(load_graph(path, DIMS), megatron_masks))
        assert "--apply-layernorm-1p" not in out["args"]
        (note,) = [n for n in out["notes"] if "constant folding" in n]
        assert "and 4 more) are constants the ONNX exporter computed" in note and "add --apply-layernorm-1p" in note

    def test_no_note_where_the_file_shows_the_offset(self):
        out = export("megatron", _input(load_graph(NEMOTRON[0], DIMS), megatron_masks))
        assert "--apply-layernorm-1p" in out["args"] and not any("constant folding" in n for n in out["notes"])

    def test_plain_norms_take_no_flag(self):
        graph = load_graph(ROOT / "tests" / "zoo" / "llama_ts_bare.onnx", DIMS)
        assert norm_args(analyze_transformer(graph)) == ()

    def test_mixed_norms_are_refused(self, tmp_path):
        graph = load_graph(_edited(tmp_path, _plain_layer1), DIMS)
        with pytest.raises(UnsupportedExport, match=r"some of its norms scale by \(1 \+ weight\) .* others by the "
                                                    r"weight, and Megatron-LM's GPT model centres all or none"):
            megatron_family(graph, analyze_transformer(graph))
        assert megatron_masks(graph, spaces_for(graph, 2), dp=2, tp=1) is None  # no Megatron row is listed

    @pytest.mark.parametrize("edit", [_two_layer1, _stripped_layer1])
    def test_an_offset_other_than_one_is_refused(self, tmp_path, edit):
        graph = load_graph(_edited(tmp_path, edit), DIMS)
        with pytest.raises(UnsupportedExport, match=r"a norm scales by \(weight \+ c\) with c not 1 or not in the file"):
            megatron_family(graph, analyze_transformer(graph))


class TestValidator:
    BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "1",
            "--apply-layernorm-1p"]

    @pytest.mark.parametrize(("extra", "violated"), [
        ([], False),  # transformer_engine, Megatron-LM's default: TENorm honours it
        (["--normalization", "RMSNorm"], False),
        (["--transformer-impl", "local"], False),  # local LayerNorm: Apex's FusedLayerNorm honours it
        (["--transformer-impl", "local", "--normalization", "RMSNorm"], True),  # WrappedTorchNorm asserts it off
        (["--transformer-impl", "inference_optimized", "--normalization", "RMSNorm"], True),  # TransformerConfig asserts
    ])
    def test_where_megatron_core_honours_it(self, extra, violated):
        found = [v for v in megatron_violations([*self.BASE, *extra], world_size=1) if "layernorm-1p" in v]
        assert bool(found) == violated, found


class TestTorchtitan:
    @pytest.mark.parametrize("path", [*NEMOTRON[:2], GEMMA / "gemma_ts_consts.onnx"], ids=lambda p: p.stem)
    def test_refused(self, path):
        model = analyze_transformer(load_graph(path, DIMS))
        why = torchtitan_refusals(model, "llama3")
        assert any(w.startswith("its norms scale by (1 + weight)") and "nn.RMSNorm" in w for w in why)

    def test_mixed_refused(self, tmp_path):
        model = analyze_transformer(load_graph(_edited(tmp_path, _plain_layer1), DIMS))
        assert any(w.startswith("some of its norms scale by (1 + weight)") for w in torchtitan_refusals(model, "llama3"))

    def test_a_folded_norm_is_noted(self, tmp_path):
        graph = load_graph(_llama_with_a_folded_norm(tmp_path), DIMS)
        assert folded_norm_scales(graph) == ("onnx::Mul_9999",)
        notes = [n for n in export("torchtitan", _input(graph, torchtitan_masks))["notes"] if "constant folding" in n]
        assert len(notes) == 1 and notes[0].startswith("the norms' scales (onnx::Mul_9999) are constants")
        assert "torchtitan's RMSNorm, which scales by the weight, trains another parametrisation" in notes[0]

    def test_plain_llama_has_no_such_clause(self):
        model = analyze_transformer(load_graph(ROOT / "tests" / "zoo" / "llama_ts_bare.onnx", DIMS))
        assert not any("(1 + weight)" in w for w in torchtitan_refusals(model, "llama3"))
