"""Coarsening on small hand-built ONNX graphs: views folded, pointwise chains fused, norms found,
parameters recognised, batch dims marked, node specs kept. Expected values are worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from tests.importers.graph_checks import check_graph

F = T.FLOAT


def weight(name: str, *shape: int) -> onnx.TensorProto:
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def const(name: str, values, dtype=np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def build(tmp_path: Path, nodes, inputs, outputs, initializers=(), dims=None, opset=18, name="m"):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("acme", 1)])
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    result = import_model(path, dims or {})
    assert check_graph(result) == []
    return result


def vi(name, *shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def op_named(graph, name):
    return graph.ops[graph.op_index(name)]


class TestViews:
    def test_gemm_on_flattened_tokens_gets_batch_and_seq_sub_dims(self, tmp_path):
        g = build(
            tmp_path,
            [
                helper.make_node("Reshape", ["x", "flat"], ["x2"], name="flatten"),
                helper.make_node("Gemm", ["x2", "fc.weight", "fc.bias"], ["h2"], name="fc"),
                helper.make_node("Reshape", ["h2", "unflat"], ["h"], name="unflatten"),
                helper.make_node("MatMul", ["h", "out.weight"], ["y"], name="out"),
            ],
            [vi("x", "batch", "seq", 16)],
            [vi("y", "batch", "seq", 8)],
            [weight("fc.weight", 16, 32), weight("fc.bias", 32), weight("out.weight", 32, 8),
             const("flat", [-1, 16]), const("unflat", [4, 6, 32])],
            dims={"batch": 4, "seq": 6},
        )
        fc = op_named(g, "fc")
        assert [(d.name, d.size, d.is_batch) for d in fc.dims] == [
            ("m_0", 4, True), ("m_1", 6, False), ("n", 32, False), ("k", 16, False)
        ]
        assert fc.inputs[0].tensor == "x" and fc.inputs[0].axes == (("m_0",), ("m_1",), ("k",))
        assert fc.outputs[0].axes == (("m_0", "m_1"), ("n",))
        out = op_named(g, "out")
        # The consumer reads the Gemm's [24, 32] output through the unflatten view.
        assert out.inputs[0].tensor == "h2" and out.inputs[0].axes == (("b0", "m"), ("k",))
        assert [d.name for d in out.dims if d.is_batch] == ["b0"]
        assert len(g.ops) == 2 and len(g.edges) == 1

    def test_head_split_maps_hidden_to_heads_and_head_dim(self, tmp_path):
        g = build(
            tmp_path,
            [
                helper.make_node("Reshape", ["q", "heads"], ["q4"]),
                helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
                helper.make_node("Reshape", ["k", "heads"], ["k4"]),
                helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
                helper.make_node("MatMul", ["qt", "kt"], ["s"], name="scores"),
            ],
            [vi("q", 2, 16, 96), vi("k", 2, 16, 96)],
            [vi("s", 2, 4, 16, 16)],
            [const("heads", [2, 16, 4, 24])],
        )
        (scores,) = g.ops
        assert [(d.name, d.size) for d in scores.dims] == [("b0", 2), ("b1", 4), ("m", 16), ("n", 16), ("k", 24)]
        assert scores.inputs[0].axes == (("b0",), ("m",), ("b1", "k"))
        assert scores.inputs[1].axes == (("b0",), ("n",), ("b1", "k"))
        assert scores.flops == 2 * 2 * 4 * 16 * 16 * 24

    def test_unalignable_reshape_stays_a_data_movement_op(self, tmp_path):
        g = build(
            tmp_path,
            [helper.make_node("Reshape", ["x", "shape"], ["y0"], name="odd"), helper.make_node("Relu", ["y0"], ["y"], name="act")],
            [vi("x", 6, 4)],
            [vi("y", 4, 6)],
            [const("shape", [4, 6])],
        )
        odd = op_named(g, "odd")
        assert odd.kind == "data_movement" and [op.name for op in g.ops] == ["odd"]
        # The Relu is fused into it: 1 FLOP per element, the reshape itself costs none.
        assert (odd.fused_pointwise, odd.flops) == (1, 24.0)
        # Only the leading axis, preserved in size, could map; here none is.
        assert odd.inputs[0].axes == ((), ())

    def test_shape_computation_is_dropped(self, tmp_path):
        g = build(
            tmp_path,
            [
                helper.make_node("Shape", ["x"], ["shape"]),
                helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
                helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
                helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
                helper.make_node("Reshape", ["x", "target"], ["x2"]),
                helper.make_node("Relu", ["x2"], ["y"], name="act"),
            ],
            [vi("x", "batch", 4, 8)],
            [vi("y", "batch", 32)],
            [const("zero", 0), const("axes0", [0]), const("minus1", [-1])],
            dims={"batch": 3},
        )
        assert [op.name for op in g.ops] == ["act"]
        assert g.ops[0].inputs[0].tensor == "x"
        # The Relu's flattened axis (32) spans two original axes: its dim gets two sub-dims.
        assert g.ops[0].inputs[0].axes == (("d0",), ("d1_0",), ("d1_1",))
        assert [(d.name, d.size) for d in g.ops[0].dims] == [("d0", 3), ("d1_0", 4), ("d1_1", 8)]
        assert g.raw_op_types == {"Shape": 1, "Gather": 1, "Unsqueeze": 1, "Concat": 1, "Reshape": 1, "Relu": 1}


class TestFusion:
    def test_bias_and_gelu_chain_fuse_residual_stays(self, tmp_path):
        nodes = [
            helper.make_node("MatMul", ["x", "fc.weight"], ["h"], name="fc"),
            helper.make_node("Add", ["h", "fc.bias"], ["hb"], name="bias"),
            helper.make_node("Div", ["hb", "sqrt2"], ["d"], name="gelu_div"),
            helper.make_node("Erf", ["d"], ["e"], name="gelu_erf"),
            helper.make_node("Add", ["e", "one"], ["e1"], name="gelu_add"),
            helper.make_node("Mul", ["hb", "e1"], ["g0"], name="gelu_mul"),
            helper.make_node("Mul", ["g0", "half"], ["g"], name="gelu_half"),
            helper.make_node("Add", ["g", "x"], ["y"], name="residual"),
        ]
        g = build(
            tmp_path, nodes, [vi("x", 8, 16)], [vi("y", 8, 16)],
            [weight("fc.weight", 16, 16), weight("fc.bias", 16),
             const("sqrt2", 1.4142, np.float32), const("one", 1.0, np.float32), const("half", 0.5, np.float32)],
        )
        assert [op.name for op in g.ops] == ["fc", "residual"]
        fc = g.ops[0]
        assert fc.fused_pointwise == 6
        assert fc.onnx_nodes == ("fc", "bias", "gelu_div", "gelu_erf", "gelu_add", "gelu_mul", "gelu_half")
        assert fc.flops == 2 * 8 * 16 * 16 + 6 * 8 * 16
        assert {a.tensor for a in fc.inputs} == {"x", "fc.weight", "fc.bias"}
        assert g.ops[1].kind == "elementwise" and g.ops[1].fused_pointwise == 0
        assert g.parameter_count == 16 * 16 + 16

    def test_attention_stays_three_ops_with_scale_mask_and_nan_guard_fused(self, tmp_path):
        mask = numpy_helper.from_array(np.triu(np.full((16, 16), -1e9, np.float32), 1)[None, None], "causal_mask")
        nodes = [
            helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
            helper.make_node("Mul", ["s", "scale"], ["s1"], name="scale_mul"),
            helper.make_node("Add", ["s1", "causal_mask"], ["s2"], name="mask_add"),
            helper.make_node("Softmax", ["s2"], ["p"], name="softmax", axis=-1),
            helper.make_node("IsNaN", ["p"], ["nan"], name="isnan"),
            helper.make_node("Where", ["nan", "zero", "p"], ["p2"], name="where"),
            helper.make_node("MatMul", ["p2", "v"], ["o"], name="av"),
        ]
        g = build(
            tmp_path, nodes, [vi("q", 2, 4, 16, 8), vi("kt", 2, 4, 8, 16), vi("v", 2, 4, 16, 8)], [vi("o", 2, 4, 16, 8)],
            [mask, const("scale", 0.35, np.float32), const("zero", 0.0, np.float32)],
        )
        assert [(op.name, op.kind, op.fused_pointwise) for op in g.ops] == [
            ("qk", "matmul", 2), ("softmax", "softmax", 2), ("av", "matmul", 0)
        ]
        assert g.parameter_count == 0  # the causal mask is a constant, not a weight
        assert g.ops[1].flops == 5 * 2 * 4 * 16 * 16 + 2 * (2 * 4 * 16 * 16)

    def test_pointwise_behind_a_view_fuses_into_its_consumer(self, tmp_path):
        g = build(
            tmp_path,
            [
                helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
                helper.make_node("Mul", ["xt", "scale"], ["xs"], name="prescale"),
                helper.make_node("MatMul", ["xs", "w"], ["y"], name="mm"),
            ],
            [vi("x", 16, 8)],
            [vi("y", 8, 4)],
            [weight("w", 16, 4), const("scale", 0.5, np.float32)],
        )
        (mm,) = g.ops
        assert mm.onnx_nodes == ("mm", "prescale") and mm.fused_pointwise == 1
        assert {(a.tensor, a.axes) for a in mm.inputs} == {("x", (("k",), ("m",))), ("w", (("k",), ("n",)))}
        assert mm.flops == 2 * 8 * 4 * 16 + 8 * 16


class TestNorms:
    def test_decomposed_layer_norm_is_one_op(self, tmp_path):
        nodes = [
            helper.make_node("ReduceMean", ["x", "last"], ["mu"], name="mean"),
            helper.make_node("Sub", ["x", "mu"], ["xc"], name="center"),
            helper.make_node("Pow", ["xc", "two"], ["sq"], name="square"),
            helper.make_node("ReduceMean", ["sq", "last"], ["var"], name="var"),
            helper.make_node("Add", ["var", "eps"], ["ve"], name="eps_add"),
            helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
            helper.make_node("Div", ["xc", "std"], ["xn"], name="normalize"),
            helper.make_node("Mul", ["xn", "ln.weight"], ["xw"], name="scale"),
            helper.make_node("Add", ["xw", "ln.bias"], ["y"], name="shift"),
        ]
        g = build(
            tmp_path, nodes, [vi("x", 2, 5, 8)], [vi("y", 2, 5, 8)],
            [const("last", [-1]), const("two", 2.0, np.float32), const("eps", 1e-5, np.float32),
             weight("ln.weight", 8), weight("ln.bias", 8)],
        )
        (norm,) = g.ops
        assert norm.kind == "norm" and norm.op_type == "LayerNormalization"
        assert [d.kind for d in norm.dims] == ["parallel", "parallel", "normalized"]
        assert norm.flops == 5 * 2 * 5 * 8
        assert len(norm.onnx_nodes) == 9 and norm.onnx_nodes[0] == "mean"
        assert {(a.tensor, a.axes) for a in norm.inputs} == {
            ("x", (("d0",), ("d1",), ("d2",))), ("ln.weight", (("d2",),)), ("ln.bias", (("d2",),))
        }
        assert g.parameter_count == 16

    def test_rms_norm_with_casts_is_one_op(self, tmp_path):
        nodes = [
            helper.make_node("Cast", ["x"], ["x32"], to=F),
            helper.make_node("Pow", ["x32", "two"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "last"], ["ms"]),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rms"]),
            helper.make_node("Reciprocal", ["rms"], ["inv"]),
            helper.make_node("Mul", ["x32", "inv"], ["xn"]),
            helper.make_node("Cast", ["xn"], ["xn16"], to=F),
            helper.make_node("Mul", ["norm.weight", "xn16"], ["h"]),
            helper.make_node("MatMul", ["h", "proj"], ["y"], name="proj"),
        ]
        g = build(
            tmp_path, nodes, [vi("x", 3, 64)], [vi("y", 3, 32)],
            [const("last", [-1]), const("two", 2.0, np.float32), const("eps", 1e-6, np.float32),
             weight("norm.weight", 64), weight("proj", 64, 32)],
        )
        assert [op.kind for op in g.ops] == ["norm", "matmul"]
        assert g.ops[0].inputs[0].tensor == "x"
        assert g.edges[0].tensor == "h"


class TestParameters:
    def test_weight_behind_transpose_and_tied_embedding(self, tmp_path):
        nodes = [
            helper.make_node("Gather", ["wte", "ids"], ["e"], name="embed"),
            helper.make_node("Transpose", ["wte"], ["wte_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["e", "wte_t"], ["logits"], name="lm_head"),
        ]
        g = build(
            tmp_path, nodes, [vi("ids", "batch", "seq", dtype=T.INT64)], [vi("logits", "batch", "seq", 50)],
            [weight("wte", 50, 8)], dims={"batch": 2, "seq": 3},
        )
        assert g.parameter_count == 50 * 8
        embed, head = g.ops
        assert embed.kind == "embedding" and embed.dim("v").size == 50 and embed.dim("v").kind == "reduction"
        assert [d.name for d in embed.dims if d.is_batch] == ["i0"]
        assert head.inputs[1].tensor == "wte" and head.inputs[1].axes == (("n",), ("k",))
        assert [d.name for d in head.dims if d.is_batch] == ["b0"]

    def test_buffers_and_scalars_are_not_parameters(self, tmp_path):
        nodes = [
            helper.make_node("Mul", ["x", "model.rotary_emb.inv_freq"], ["r"]),
            helper.make_node("Add", ["r", "val_7"], ["y0"]),
            helper.make_node("Mul", ["y0", "scale"], ["y"]),
        ]
        g = build(
            tmp_path, nodes, [vi("x", 4, 16)], [vi("y", 4, 16)],
            [weight("model.rotary_emb.inv_freq", 16), weight("val_7", 4, 16), const("scale", 2.0, np.float32)],
        )
        assert g.parameter_count == 0
        assert all(t.role != "parameter" for t in g.tensors.values())

    def test_anonymous_bias_vector_is_a_parameter(self, tmp_path):
        g = build(
            tmp_path, [helper.make_node("Add", ["x", "val_3"], ["y"])], [vi("x", 4, 16)], [vi("y", 4, 16)],
            [weight("val_3", 16)],
        )
        assert g.parameter_count == 16

    def test_folded_batchnorm_is_restored(self, tmp_path):
        g = build(
            tmp_path,
            [helper.make_node("Conv", ["x", "conv.weight", "conv.weight_bias"], ["y"], name="conv", pads=[1, 1, 1, 1])],
            [vi("x", 2, 3, 8, 8)], [vi("y", 2, 4, 8, 8)],
            [weight("conv.weight", 4, 3, 3, 3), weight("conv.weight_bias", 4)],
        )
        # conv weight + BatchNorm scale and shift, as in the trained model
        assert g.parameter_count == 4 * 3 * 3 * 3 + 2 * 4
        # the BatchNorm training runs is an op again: 2 x 4 x 8 x 8 outputs normalised per channel
        assert [(op.kind, op.op_type) for op in g.ops] == [("conv", "Conv"), ("norm", "BatchNormalization")]
        norm = g.ops[1]
        assert {a.tensor for a in norm.inputs} >= {"conv.weight_bias.bn_scale", "conv.weight_bias"}
        assert math.prod(g.tensors[norm.outputs[0].tensor].shape) == 2 * 4 * 8 * 8
        assert g.ops[0].outputs[0].tensor == norm.inputs[0].tensor
        assert any("restored as ops" in w for w in g.warnings)

    @staticmethod
    def _head_model(tmp_path, head: onnx.TensorProto):
        nodes = [
            helper.make_node("Gather", ["emb.weight", "ids"], ["e"], name="/emb/Gather"),
            helper.make_node("MatMul", ["e", "onnx::MatMul_9"], ["logits"], name="/head/MatMul"),
        ]
        return build(
            tmp_path, nodes, [vi("ids", 2, 3, dtype=T.INT64)], [vi("logits", 2, 3, 50)],
            [weight("emb.weight", 50, 8), head],
        )

    def test_torchscript_transposed_copy_of_tied_table_counted_once(self, tmp_path):
        table = numpy_helper.to_array(weight("emb.weight", 50, 8))
        g = self._head_model(tmp_path, numpy_helper.from_array(np.ascontiguousarray(table.T), "onnx::MatMul_9"))
        assert g.parameter_count == 50 * 8
        assert g.parameter_aliases == {"onnx::MatMul_9": "emb.weight"}
        head = op_named(g, "/head/MatMul")
        assert head.inputs[1].tensor == "emb.weight" and head.inputs[1].axes == (("n",), ("k",))
        assert head.module_path == "head"

    def test_an_untied_head_of_the_same_shape_keeps_its_parameters(self, tmp_path):
        # the weights are in the file and differ from the table: not a copy
        g = self._head_model(tmp_path, weight("onnx::MatMul_9", 8, 50))
        assert g.parameter_count == 2 * 50 * 8 and not g.parameter_aliases

    def test_an_untied_lstm_lm_without_values_keeps_every_parameter(self, tmp_path):
        """Issue 15: a TorchScript LSTM LM whose decoder is not tied lost vocab x hidden parameters.

        Embedding [V, E] -> LSTM (E -> H, H = E) -> decoder MatMul by 'onnx::MatMul_N' [H, V] + bias:
        the decoder has the embedding's transposed shape. Saved graph-only (every weight external,
        its data file deleted), nothing proves a tie, so all of torch's nn.Embedding + nn.LSTM +
        nn.Linear parameters are counted, and a warning says the head could be tied.
        """
        vocab, hidden, seq, batch = 50, 8, 5, 2
        nodes = [
            helper.make_node("Gather", ["encoder.weight", "ids"], ["emb"], name="/encoder/Gather"),
            helper.make_node("LSTM", ["emb", "onnx::LSTM_W", "onnx::LSTM_R", "onnx::LSTM_B"], ["y", "h", "c"],
                             hidden_size=hidden, name="/rnn/LSTM"),
            helper.make_node("Squeeze", ["y", "one"], ["y3"], name="/rnn/Squeeze"),
            helper.make_node("MatMul", ["y3", "onnx::MatMul_42"], ["mm"], name="/decoder/MatMul"),
            helper.make_node("Add", ["mm", "decoder.bias"], ["logits"], name="/decoder/Add"),
        ]
        weights = [
            weight("encoder.weight", vocab, hidden),
            weight("onnx::LSTM_W", 1, 4 * hidden, hidden),
            weight("onnx::LSTM_R", 1, 4 * hidden, hidden),
            weight("onnx::LSTM_B", 1, 8 * hidden),
            weight("onnx::MatMul_42", hidden, vocab),
            weight("decoder.bias", vocab),
            const("one", [1]),
        ]
        graph = helper.make_graph(nodes, "lstm_lm", [vi("ids", seq, batch, dtype=T.INT64)], [vi("logits", seq, batch, vocab)], weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        path = tmp_path / "lstm_lm.onnx"
        # Weights external (their data file deleted below), the 8-byte Squeeze axes inline.
        onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=64)
        (tmp_path / "w.bin").unlink()
        g = import_model(path, {})
        assert check_graph(g) == []
        # torch: Embedding V*E; LSTM 4H*E + 4H*H + 2 * 4H (b_ih, b_hh); Linear H*V + V.
        torch_count = vocab * hidden + 4 * hidden * hidden * 2 + 2 * 4 * hidden + hidden * vocab + vocab
        assert g.parameter_count == torch_count == 400 + 512 + 64 + 450
        assert not g.parameter_aliases
        (note,) = [w for w in g.warnings if "may be a transposed copy" in w]
        assert "'onnx::MatMul_42' [8, 50]" in note and "'encoder.weight'" in note and "400 parameters" in note
        assert not g.opaque_ops

    def test_sliced_fused_projection_reads_the_whole_weight(self, tmp_path):
        nodes = [
            helper.make_node("Slice", ["in_proj", "s0", "s1", "ax0"], ["wq"]),
            helper.make_node("Slice", ["in_proj", "s1", "s2", "ax0"], ["wk"]),
            helper.make_node("Gemm", ["x", "wq"], ["q"], name="q", transB=1),
            helper.make_node("Gemm", ["x", "wk"], ["k"], name="k", transB=1),
            helper.make_node("Add", ["q", "k"], ["y"], name="join"),
        ]
        g = build(
            tmp_path, nodes, [vi("x", 4, 8)], [vi("y", 4, 8)],
            [weight("in_proj", 16, 8), const("s0", [0]), const("s1", [8]), const("s2", [16]), const("ax0", [0])],
        )
        assert [op.name for op in g.ops] == ["q", "k", "join"]
        assert op_named(g, "q").inputs[1].tensor == "in_proj"
        assert op_named(g, "q").inputs[1].axes == (("n",), ("k",))
        assert g.parameter_count == 16 * 8


class TestOpaqueAndSpecs:
    def test_unknown_op_is_opaque_with_warning(self, tmp_path):
        g = build(
            tmp_path,
            [helper.make_node("FancyAttention", ["x"], ["h"], domain="acme", name="fancy"),
             helper.make_node("Relu", ["h"], ["y"], name="act")],
            [vi("x", 4, 8)], [vi("y", 4, 8)],
        )
        fancy = op_named(g, "fancy")
        assert fancy.kind == "opaque" and all(not d.splittable for d in fancy.dims)
        assert any("acme:FancyAttention" in w and "fancy" in w for w in g.warnings)

    def test_node_spec_rebuilds_the_main_node(self, tmp_path):
        g = build(
            tmp_path,
            [helper.make_node("Reshape", ["x", "shape"], ["x2"], name="odd"), helper.make_node("Gemm", ["x2", "w"], ["y"], name="fc", transB=1)],
            [vi("x", 6, 4)], [vi("y", 4, 5)],
            [const("shape", [4, 6]), weight("w", 5, 6)],
        )
        spec = op_named(g, "fc").node
        assert spec.op_type == "Gemm" and spec.input_shapes == ((4, 6), (5, 6))
        attr = onnx.AttributeProto.FromString(spec.attributes[0])
        assert (attr.name, attr.i) == ("transB", 1)
        assert spec.input_axes == ((("m",), ("k",)), (("n",), ("k",)))
        reshape = op_named(g, "odd").node
        shape = numpy_helper.to_array(onnx.TensorProto.FromString(reshape.constant_inputs[1]))
        assert shape.tolist() == [4, 6] and reshape.input_axes[1] is None

    def test_module_path_inferred_for_nodes_without_metadata(self, tmp_path):
        g = build(
            tmp_path,
            [helper.make_node("MatMul", ["x", "w1"], ["h"], name="/block/fc1/MatMul"),
             helper.make_node("Split", ["h"], ["a", "b"], axis=1, num_outputs=2, name="split_7"),
             helper.make_node("MatMul", ["a", "w2"], ["y1"], name="/block/fc2/MatMul"),
             helper.make_node("MatMul", ["b", "w2"], ["y2"], name="/block/fc3/MatMul")],
            [vi("x", 4, 8)], [vi("y1", 4, 8), vi("y2", 4, 8)], [weight("w1", 8, 16), weight("w2", 8, 8)],
        )
        assert op_named(g, "split_7").module_path == "block"


def test_batch_dim_named_input_marks_batch_axis(tmp_path):
    # The batch is the second axis (time-major input): the dim named "batch" decides.
    g = build(
        tmp_path,
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", "seq", "batch", 8)], [vi("y", "seq", "batch", 4)], [weight("w", 8, 4)],
        dims={"seq": 5, "batch": 3},
    )
    (mm,) = g.ops
    assert [(d.name, d.size) for d in mm.dims if d.is_batch] == [("m", 3)]


@pytest.mark.parametrize("seed", range(6))
def test_missing_shapes_and_constants_never_crash(seed):
    """Shapes or folded constants the shape stage could not find make ops opaque, never an exception."""
    import dataclasses
    import random

    from importers.coarsen import build_op_graph
    from importers.onnx_load import load_onnx
    from importers.shapes import resolve_shapes

    path = Path(__file__).resolve().parents[1] / "data" / ("gpt2_tiny.onnx" if seed % 2 else "vit_tiny.onnx")
    if not path.exists():
        pytest.skip(f"{path} not generated")
    shaped = resolve_shapes(load_onnx(path)[0], {"batch": 2, "seq": 8})
    rng = random.Random(seed)
    names = sorted(shaped.shapes)
    dropped = set(rng.sample(names, len(names) // 5))
    damaged = dataclasses.replace(
        shaped,
        shapes={k: v for k, v in shaped.shapes.items() if k not in dropped},
        constants={k: v for k, v in shaped.constants.items() if rng.random() > 0.3},
    )
    graph = build_op_graph(damaged, name="damaged")
    assert graph.ops
