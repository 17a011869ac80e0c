"""importers.param_evidence: what a file says about parameters beyond an initializer's use (issue 15).

Every count below is worked out by hand from the initializers' shapes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from importers.param_evidence import SIGNATURE_KIND_KEY, signature_kinds
from tests.importers.graph_checks import check_graph


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(0).standard_normal(shape).astype(np.float32), name)


def _vi(name: str, *shape, dtype: int = T.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _import(tmp_path: Path, nodes, inputs, outputs, inits, *, kinds: dict[str, str] | None = None,
            dims: dict[str, int] | None = None):
    """Import a helper-built model; ``kinds`` are written as torch's dynamo exporter records them."""
    records = []
    for name, kind in (kinds or {}).items():
        tensor = next(t for t in inits if t.name == name)
        info = _vi(name, *tensor.dims)
        helper.set_metadata_props(info, {SIGNATURE_KIND_KEY: kind})
        records.append(info)
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits), value_info=records)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    result = import_model(path, dims or {})
    assert check_graph(result) == []
    return result


def _output_bias_model():
    nodes = [helper.make_node("MatMul", ["x", "head.weight"], ["h"]),
             helper.make_node("Add", ["h", "final_logits_bias"], ["logits"])]
    inits = [_weight("head.weight", 8, 10), _weight("final_logits_bias", 1, 10)]
    return nodes, [_vi("x", 2, 8)], [_vi("logits", 2, 10)], inits


class TestExportRecord:
    def test_signature_kinds_read_from_value_info(self) -> None:
        info = _vi("w", 2)
        helper.set_metadata_props(info, {SIGNATURE_KIND_KEY: "BUFFER", "other": "x"})
        assert signature_kinds(helper.make_graph([], "g", [], [], value_info=[info, _vi("v", 2)])) == {"w": "BUFFER"}

    def test_recorded_buffer_is_not_counted(self, tmp_path: Path) -> None:
        """BART's final_logits_bias: a named bias the weight rule takes, a buffer by the record."""
        nodes, inputs, outputs, inits = _output_bias_model()
        assert _import(tmp_path, nodes, inputs, outputs, inits).parameter_count == 8 * 10 + 10
        recorded = _import(tmp_path, nodes, inputs, outputs, inits, kinds={"final_logits_bias": "BUFFER"})
        assert recorded.parameter_count == 8 * 10

    def test_recorded_scalar_buffer_is_not_counted(self, tmp_path: Path) -> None:
        """Gemma's embed_scale: a named scalar, stripped from the file, recorded as a buffer."""
        nodes = [helper.make_node("Mul", ["x", "model.embed_tokens.embed_scale"], ["y"])]
        inits = [_weight("model.embed_tokens.embed_scale"), _weight("model.norm.weight", 8)]
        nodes.append(helper.make_node("Mul", ["y", "model.norm.weight"], ["z"]))
        graph = _import(tmp_path, nodes, [_vi("x", 2, 8)], [_vi("z", 2, 8)], inits,
                        kinds={"model.embed_tokens.embed_scale": "BUFFER", "model.norm.weight": "PARAMETER"})
        assert graph.parameter_count == 8


def _normalised_table_model():
    """DeBERTa's relative embeddings: a table normalised, then read by a MatMul with the input."""
    nodes = [
        helper.make_node("LayerNormalization", ["enc.rel_embeddings.weight", "enc.ln.weight", "enc.ln.bias"], ["r"]),
        helper.make_node("MatMul", ["x", "r"], ["y"]),
    ]
    inits = [_weight("enc.rel_embeddings.weight", 6, 8), _weight("enc.ln.weight", 8), _weight("enc.ln.bias", 8)]
    return nodes, [_vi("x", 2, 6)], [_vi("y", 2, 8)], inits


class TestNormalisedTable:
    def test_named_table_read_by_a_norm_is_counted(self, tmp_path: Path) -> None:
        graph = _import(tmp_path, *_normalised_table_model())
        assert graph.parameter_count == 6 * 8 + 8 + 8

    def test_recorded_buffer_wins(self, tmp_path: Path) -> None:
        graph = _import(tmp_path, *_normalised_table_model(), kinds={"enc.rel_embeddings.weight": "BUFFER"})
        assert graph.parameter_count == 8 + 8


class TestPositionTables:
    def test_table_added_over_the_batch_is_counted(self, tmp_path: Path) -> None:
        """Whisper's encoder positions in a TorchScript export: ``weight[:seq]`` folded to an Add constant."""
        nodes = [helper.make_node("Add", ["x", "onnx::Add_5"], ["y"])]
        graph = _import(tmp_path, nodes, [_vi("x", "batch", 4, 8)], [_vi("y", "batch", 4, 8)],
                        [_weight("onnx::Add_5", 4, 8)], dims={"batch": 3})
        assert graph.parameter_count == 4 * 8
        assert any("'onnx::Add_5' [4, 8]" in w and "(32 parameters)" in w for w in graph.warnings)

    def test_table_read_by_constant_positions_is_counted(self, tmp_path: Path) -> None:
        """Whisper's decoder positions in a dynamo export: a ``val_N`` table gathered by 0..seq-1."""
        nodes = [helper.make_node("Gather", ["val_3", "positions"], ["p"]),
                 helper.make_node("Add", ["x", "p"], ["y"])]
        inits = [_weight("val_3", 16, 8), numpy_helper.from_array(np.arange(4, dtype=np.int64), "positions")]
        graph = _import(tmp_path, nodes, [_vi("x", 2, 4, 8)], [_vi("y", 2, 4, 8)], inits)
        assert graph.parameter_count == 16 * 8

    def test_constant_of_the_full_shape_is_not_a_table(self, tmp_path: Path) -> None:
        nodes = [helper.make_node("Add", ["x", "val_7"], ["y"])]
        graph = _import(tmp_path, nodes, [_vi("x", 4, 8)], [_vi("y", 4, 8)], [_weight("val_7", 4, 8)])
        assert graph.parameter_count == 0


def _scores_model(bias: str):
    """Attention scores plus a per-window bias, then a Softmax."""
    nodes = [helper.make_node("MatMul", ["x", "blk.w"], ["s"]),
             helper.make_node("Add", ["s", bias], ["b"]),
             helper.make_node("Softmax", ["b"], ["y"], axis=-1)]
    inits = [_weight("blk.w", 16, 16), _weight(bias, 1, 2, 16, 16)]
    return nodes, [_vi("x", 3, 2, 16, 16)], [_vi("y", 3, 2, 16, 16)], inits


class TestFoldedConstants:
    @pytest.mark.parametrize("bias", ["onnx::Add_9", "val_9"])
    def test_attention_bias_is_reported_not_counted(self, tmp_path: Path, bias: str) -> None:
        graph = _import(tmp_path, *_scores_model(bias))
        assert graph.parameter_count == 16 * 16
        [warning] = [w for w in graph.warnings if "folded parameters" in w]
        assert warning.startswith(f"512 elements of constants the exporter made ('{bias}' [1, 2, 16, 16])")
        assert "do_constant_folding=False" in warning

    def test_optimizer_made_name_with_a_record_elsewhere(self, tmp_path: Path) -> None:
        """A dynamo file records its parameters; ``unsqueeze`` (an FX node's name) has no record."""
        graph = _import(tmp_path, *_scores_model("unsqueeze"), kinds={"blk.w": "PARAMETER"})
        assert graph.parameter_count == 16 * 16
        assert any(w.startswith("512 elements") for w in graph.warnings)

    def test_small_bias_the_weight_rule_took_is_still_reported(self, tmp_path: Path) -> None:
        """128 bytes: under the 1 KiB a mask must have to be reported, but it was counted before."""
        nodes = [helper.make_node("MatMul", ["x", "blk.w"], ["s"]),
                 helper.make_node("Add", ["s", "unsqueeze"], ["b"]),
                 helper.make_node("Softmax", ["b"], ["y"], axis=-1)]
        inits = [_weight("blk.w", 4, 4), _weight("unsqueeze", 1, 2, 4, 4)]
        graph = _import(tmp_path, nodes, [_vi("x", 3, 2, 4, 4)], [_vi("y", 3, 2, 4, 4)], inits,
                        kinds={"blk.w": "PARAMETER"})
        assert graph.parameter_count == 4 * 4
        assert any(w.startswith("32 elements of constants the exporter made ('unsqueeze' [1, 2, 4, 4])")
                   for w in graph.warnings)

    def test_fused_conv_is_counted_and_reported(self, tmp_path: Path) -> None:
        nodes = [helper.make_node("Conv", ["x", "onnx::Conv_1", "onnx::Conv_2"], ["y"], pads=[1, 1, 1, 1])]
        inits = [_weight("onnx::Conv_1", 4, 3, 3, 3), _weight("onnx::Conv_2", 4)]
        graph = _import(tmp_path, nodes, [_vi("x", 2, 3, 8, 8)], [_vi("y", 2, 4, 8, 8)], inits)
        assert graph.parameter_count == 4 * 3 * 3 * 3 + 4
        assert any(w.startswith("1 Conv(s) read a weight and a bias the exporter made") for w in graph.warnings)


class TestOutputBias:
    def test_exporter_made_output_bias_is_counted_with_a_warning(self, tmp_path: Path) -> None:
        nodes, inputs, outputs, inits = _output_bias_model()
        nodes[1].input[1] = "onnx::Add_7"
        inits[1] = _weight("onnx::Add_7", 1, 10)
        graph = _import(tmp_path, nodes, inputs, outputs, inits)
        assert graph.parameter_count == 8 * 10 + 10
        assert any("may be a non-trainable buffer" in w and "counted (10 parameters)" in w for w in graph.warnings)

    def test_named_one_row_output_bias_is_counted_with_a_warning(self, tmp_path: Path) -> None:
        """Marian's and Pegasus' final_logits_bias keeps its name in TorchScript; [1, V] is a buffer's shape."""
        graph = _import(tmp_path, *_output_bias_model())
        assert graph.parameter_count == 8 * 10 + 10
        assert any("may be a non-trainable buffer" in w and "counted (10 parameters)" in w for w in graph.warnings)

    def test_named_linear_bias_needs_no_warning(self, tmp_path: Path) -> None:
        nodes, inputs, outputs, inits = _output_bias_model()
        nodes[1].input[1] = "head.bias"
        inits[1] = _weight("head.bias", 10)  # nn.Linear's bias: [V]
        graph = _import(tmp_path, nodes, inputs, outputs, inits)
        assert graph.parameter_count == 8 * 10 + 10
        assert not any("buffer" in w for w in graph.warnings)


class TestGatheredBiasTable:
    def test_table_gathered_into_the_scores_is_counted(self, tmp_path: Path) -> None:
        """Swin's relative position bias table where the optimizer left it: ``[(2w-1)^2, heads]``
        gathered by a constant index ``[w^2 w^2]`` into the scores' bias ``[heads, w^2, w^2]``."""
        index = np.random.default_rng(1).integers(0, 9, size=16).astype(np.int64)
        nodes = [
            helper.make_node("Gather", ["val_62", "index"], ["g"]),  # [16, 2]
            helper.make_node("Reshape", ["g", "shape"], ["r"]),  # [4, 4, 2]
            helper.make_node("Transpose", ["r"], ["bias"], perm=[2, 0, 1]),  # [2, 4, 4]
            helper.make_node("MatMul", ["x", "blk.w"], ["s"]),
            helper.make_node("Add", ["s", "bias"], ["b"]),
            helper.make_node("Softmax", ["b"], ["y"], axis=-1),
        ]
        inits = [_weight("val_62", 9, 2), numpy_helper.from_array(index, "index"),
                 numpy_helper.from_array(np.array([4, 4, 2], np.int64), "shape"), _weight("blk.w", 4, 4)]
        graph = _import(tmp_path, nodes, inputs=[_vi("x", 3, 2, 4, 4)], outputs=[_vi("y", 3, 2, 4, 4)], inits=inits)
        assert graph.parameter_count == 9 * 2 + 4 * 4
        assert any("'val_62' [9, 2]" in w and "relative position bias table (18 parameters)" in w
                   for w in graph.warnings)


def _rotary_model(combine: str):
    """GPT-J's rotary: a ``val_N`` [16, 8] sin/cos table gathered by the positions [4], split into its
    sin and cos halves [4, 4] that multiply the projected queries (``combine="Mul"``); with
    ``combine="Add"`` the halves are added instead, as a learned position table's rows are."""
    nodes = [
        helper.make_node("MatMul", ["x", "attn.q.weight"], ["q"]),  # [2, 4, 8]
        helper.make_node("Gather", ["val_3", "positions"], ["sincos"]),  # [4, 8]
        helper.make_node("Split", ["sincos", "halves"], ["sin", "cos"], axis=-1),  # [4, 4] each
        helper.make_node("Split", ["q", "halves"], ["q1", "q2"], axis=-1),
        helper.make_node(combine, ["q1", "cos"], ["a"]),
        helper.make_node(combine, ["q2", "sin"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    inits = [_weight("attn.q.weight", 8, 8), _weight("val_3", 16, 8),
             numpy_helper.from_array(np.array([4, 4], np.int64), "halves")]
    return nodes, [_vi("x", 2, 4, 8), _vi("positions", 4, dtype=T.INT64)], [_vi("y", 2, 4, 4)], inits


class TestRotaryTable:
    def test_sin_cos_table_that_multiplies_the_queries_is_not_counted(self, tmp_path: Path) -> None:
        """GPT-J's ``embed_positions`` (a non-persistent buffer, ``val_N`` in a dynamo export): torch
        counts the 8 x 8 query weight only (64), not the 16 x 8 table."""
        graph = _import(tmp_path, *_rotary_model("Mul"), kinds={"attn.q.weight": "PARAMETER"})
        assert graph.parameter_count == 8 * 8
        assert any("'val_3' [16, 8]" in w and "rotary sin/cos table" in w and "(128 elements)" in w
                   for w in graph.warnings)

    def test_table_whose_rows_are_added_stays_counted(self, tmp_path: Path) -> None:
        graph = _import(tmp_path, *_rotary_model("Add"), kinds={"attn.q.weight": "PARAMETER"})
        assert graph.parameter_count == 8 * 8 + 16 * 8
        assert not any("rotary" in w for w in graph.warnings)


class TestInterpolatedPositionTable:
    def test_table_cut_interpolated_and_joined_is_counted(self, tmp_path: Path) -> None:
        """DINOv2's ``position_embeddings`` [1, 5, 8] in a TorchScript export: the class row
        ``onnx::Concat_3`` [1, 1, 8] and the patch grid ``onnx::Reshape_5`` [1, 4, 8], reshaped to
        2 x 2, resized to the image's grid (the same 2 x 2 here), flattened and joined again before
        the Add. torch counts the whole table: 5 x 8 = 40, plus the 8 x 8 projection."""
        i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
        nodes = [
            helper.make_node("Reshape", ["onnx::Reshape_5", "grid"], ["g"]),  # [1, 2, 2, 8]
            helper.make_node("Transpose", ["g"], ["gt"], perm=[0, 3, 1, 2]),  # [1, 8, 2, 2]
            helper.make_node("Resize", ["gt", "", "", "sizes"], ["r"], mode="linear"),  # [1, 8, 2, 2]
            helper.make_node("Transpose", ["r"], ["rt"], perm=[0, 2, 3, 1]),  # [1, 2, 2, 8]
            helper.make_node("Reshape", ["rt", "flat"], ["patches"]),  # [1, 4, 8]
            helper.make_node("Concat", ["onnx::Concat_3", "patches"], ["table"], axis=1),  # [1, 5, 8]
            helper.make_node("MatMul", ["x", "proj.weight"], ["h"]),  # [2, 5, 8]
            helper.make_node("Add", ["h", "table"], ["y"]),
        ]
        inits = [_weight("onnx::Reshape_5", 1, 4, 8), _weight("onnx::Concat_3", 1, 1, 8), _weight("proj.weight", 8, 8),
                 i64("grid", [1, 2, 2, 8]), i64("sizes", [1, 8, 2, 2]), i64("flat", [1, 4, 8])]
        graph = _import(tmp_path, nodes, [_vi("x", 2, 5, 8)], [_vi("y", 2, 5, 8)], inits)
        assert graph.parameter_count == 5 * 8 + 8 * 8
        assert any("'onnx::Reshape_5' [1, 4, 8]" in w and "position-embedding table (32 parameters)" in w
                   for w in graph.warnings)


def _per_head_bias_model(positions: int):
    """A projection split into heads with two anonymous [heads, head_dim] biases added to it, scaled, as
    Funnel's ``q_head * scale + r_w_bias * scale`` (and ``r_r_bias``) folds in a TorchScript export, and
    ``positions`` anonymous [5, 8] position tables added to the embeddings before the projection."""
    i64 = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes, value = [], "x"  # [2, 5, 8]
    for index in range(positions):
        nodes.append(helper.make_node("Add", [value, f"onnx::Add_{index}"], [f"e{index}"]))
        value = f"e{index}"
    nodes += [
        helper.make_node("MatMul", [value, "q.weight"], ["q"]),  # [2, 5, 8]
        helper.make_node("Reshape", ["q", "heads"], ["qh"]),  # [2, 5, 2, 4]: 2 heads of 4
        helper.make_node("Constant", [], ["scale"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("Mul", ["qh", "scale"], ["qs"]),
        helper.make_node("Add", ["qs", "onnx::Add_20"], ["content"]),
        helper.make_node("Add", ["qs", "onnx::Add_21"], ["position"]),
        helper.make_node("Add", ["content", "position"], ["y"]),
    ]
    inits = [_weight("q.weight", 8, 8), _weight("onnx::Add_20", 2, 4), _weight("onnx::Add_21", 2, 4), i64("heads", [2, 5, 2, 4])]
    inits += [_weight(f"onnx::Add_{index}", 5, 8) for index in range(positions)]
    return nodes, [_vi("x", 2, 5, 8)], [_vi("y", 2, 5, 2, 4)], inits


class TestPerHeadBias:
    def test_folded_per_head_biases_are_counted_in_one_warning_that_says_what_they_are(self, tmp_path: Path) -> None:
        """Funnel's 9 folded biases printed 9 position-table warnings (sweep H4, finding 7g). Two [2, 4]
        biases on a 2-head split: one warning, counted 2 x 2 x 4 = 16, not called position tables; the
        one [5, 8] table added before the split is (40): 8 x 8 + 16 + 40 = 120 in all."""
        graph = _import(tmp_path, *_per_head_bias_model(positions=1))
        assert graph.parameter_count == 8 * 8 + 2 * 2 * 4 + 5 * 8 == 120
        heads = [w for w in graph.warnings if "per-head attention biases" in w]
        assert len(heads) == 1
        assert "'onnx::Add_20' [2, 4], 'onnx::Add_21' [2, 4] (2 tables) are [heads, head_dim]" in heads[0]
        assert "(16 parameters)" in heads[0] and "position-embedding" not in heads[0]
        tables = [w for w in graph.warnings if "position-embedding table" in w]
        assert len(tables) == 1 and tables[0].startswith("'onnx::Add_0' [5, 8] is added") and "(40 parameters)" in tables[0]

    def test_position_tables_of_one_kind_share_one_line(self, tmp_path: Path) -> None:
        """Five anonymous [5, 8] tables added to the embeddings: one line with the count, the first three
        names and 5 x 5 x 8 = 200 parameters."""
        graph = _import(tmp_path, *_per_head_bias_model(positions=5))
        assert graph.parameter_count == 8 * 8 + 16 + 5 * 5 * 8 == 280
        tables = [w for w in graph.warnings if "position-embedding tables" in w]
        assert len(tables) == 1 and not any("position-embedding table (" in w for w in graph.warnings)
        assert tables[0].startswith("'onnx::Add_0' [5, 8], 'onnx::Add_1' [5, 8], 'onnx::Add_2' [5, 8], ... (5 tables) are")
        assert "(200 parameters)" in tables[0]
