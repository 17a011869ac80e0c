"""Tests of importers.shapes: binding dims, inference + folding, declared fallbacks, bad input.

The oracle for computed shapes and folded constants is onnxruntime running the model on real
data with every intermediate value exposed as a graph output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from importers.onnx_load import load_onnx
from importers.shapes import FOLD_MAX_ELEMENTS, ShapedModel, eval_dim_expr, resolve_shapes
from planner.core.errors import ModelError, UnboundDimError

REPO = Path(__file__).resolve().parents[2]
OPSET = [helper.make_opsetid("", 18)]


# ------------------------------------------------------------------------------------------------
# Model builders
# ------------------------------------------------------------------------------------------------


def attention_model(*, hidden: int = 16, heads: int = 4, value_info: bool = True) -> onnx.ModelProto:
    """One self-attention block whose head split is computed from Shape -> Gather -> Div -> Concat.

    ONNX's data propagation does not go through ``Div``, so the Reshape targets need folding.
    """
    rng = np.random.default_rng(0)
    hd = hidden // heads
    inits = [
        numpy_helper.from_array(rng.standard_normal((hidden, 3 * hidden)).astype(np.float32), "w_qkv"),
        numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "w_o"),
        numpy_helper.from_array(np.array([heads], np.int64), "heads"),
        numpy_helper.from_array(np.array([0], np.int64), "i0"),
        numpy_helper.from_array(np.array([1], np.int64), "i1"),
        numpy_helper.from_array(np.array([2], np.int64), "i2"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
        numpy_helper.from_array(np.array(float(hd) ** 0.5, np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"], name="qkv_proj"),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=2, num_outputs=3, name="split"),
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        helper.make_node("Gather", ["x_shape", "i0"], ["b"], axis=0, name="g_b"),
        helper.make_node("Gather", ["x_shape", "i1"], ["s"], axis=0, name="g_s"),
        helper.make_node("Gather", ["x_shape", "i2"], ["h"], axis=0, name="g_h"),
        helper.make_node("Div", ["h", "heads"], ["hd"], name="div_hd"),
        helper.make_node("Concat", ["b", "s", "heads", "hd"], ["heads_shape"], axis=0, name="cat"),
        helper.make_node("Reshape", ["q", "heads_shape"], ["q4"], name="rq"),
        helper.make_node("Reshape", ["k", "heads_shape"], ["k4"], name="rk"),
        helper.make_node("Reshape", ["v", "heads_shape"], ["v4"], name="rv"),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3], name="tq"),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="tk"),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3], name="tv"),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"], name="qk"),
        helper.make_node("Div", ["scores", "scale"], ["scaled"], name="scale_div"),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["probs", "vt"], ["ctx"], name="pv"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3], name="tctx"),
        helper.make_node("Concat", ["b", "s", "minus1"], ["out_shape"], axis=0, name="cat2"),
        helper.make_node("Reshape", ["ctx_t", "out_shape"], ["merged"], name="rmerge"),
        helper.make_node("MatMul", ["merged", "w_o"], ["y"], name="out_proj"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", hidden])
    vis = []
    if value_info:
        declared = {
            "qkv": ["batch", "seq", 3 * hidden], "q4": ["batch", "seq", heads, hd],
            "k4": ["batch", "seq", heads, hd], "v4": ["batch", "seq", heads, hd],
            "qt": ["batch", heads, "seq", hd], "kt": ["batch", heads, hd, "seq"],
            "vt": ["batch", heads, "seq", hd], "scores": ["batch", heads, "seq", "seq"],
            "scaled": ["batch", heads, "seq", "seq"], "probs": ["batch", heads, "seq", "seq"],
            "ctx": ["batch", heads, "seq", hd], "ctx_t": ["batch", "seq", heads, hd],
            "merged": ["batch", "seq", hidden],
        }
        vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in declared.items()]
    graph = helper.make_graph(nodes, "attn", [x], [y], initializer=inits, value_info=vis)
    return helper.make_model(graph, opset_imports=OPSET)


def causal_mask_model() -> onnx.ModelProto:
    """Scores [batch, seq, seq] masked by a causal mask built with Range/Less/Where/Expand."""
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "neg"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zf"),
        numpy_helper.from_array(np.array([1], np.int64), "i1"),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1], name="t"),
        helper.make_node("MatMul", ["x", "xt"], ["scores"], name="mm"),
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "i1"], ["seq_1d"], axis=0, name="g"),
        helper.make_node("Squeeze", ["seq_1d"], ["seq_s"], name="sq"),
        helper.make_node("Range", ["zero", "seq_s", "one"], ["pos"], name="range"),
        helper.make_node("Unsqueeze", ["pos", "axis1"], ["pos_col"], name="unsq"),
        helper.make_node("Less", ["pos", "pos_col"], ["future"], name="less"),
        helper.make_node("Where", ["future", "neg", "zf"], ["mask"], name="where"),
        helper.make_node("Add", ["scores", "mask"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "mask",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", "seq"])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=OPSET)


def _single_op(op: str, inputs: list, outputs: list, inits=(), vis=(), **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, [i.name for i in inputs] + [t.name for t in inits],
                            [o.name for o in outputs], name=op.lower(), **attrs)
    graph = helper.make_graph([node], op, inputs, outputs, initializer=list(inits), value_info=list(vis))
    return helper.make_model(graph, opset_imports=OPSET)


def _ort_oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output's value, computed by onnxruntime on real data."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.value_info[:]
    outputs = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in outputs:
                exposed.graph.output.append(helper.make_empty_tensor_value_info(name))
                outputs.add(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def _save_stripped(model: onnx.ModelProto, path: Path, *, threshold: int) -> Path:
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=threshold)
    return path.with_name(path.name + ".data")


def _node_outputs(model: onnx.ModelProto) -> list[str]:
    return [o for n in model.graph.node for o in n.output if o]


# ------------------------------------------------------------------------------------------------
# eval_dim_expr
# ------------------------------------------------------------------------------------------------


class TestEvalDimExpr:
    @pytest.mark.parametrize(
        ("expr", "value"),
        [
            ("batch", 3),
            ("batch*seq", 3 * 10),
            ("seq + 1", 11),
            ("2*seq", 20),
            ("seq - 1", 9),
            ("(seq + 2) // 4", 3),
            ("seq/2", 5),
            ("seq % 4", 2),
            ("-batch + 2*seq", 17),
            ("max(seq, 16)", 16),
            ("Min(seq, 16)", 10),
            ("floor(seq/4)", 2),
            ("ceil(seq/4)", 3),
            ("  seq  ", 10),
        ],
    )
    def test_arithmetic(self, expr: str, value: int) -> None:
        assert eval_dim_expr(expr, {"batch": 3, "seq": 10}) == value

    def test_whole_name_binding_wins(self) -> None:
        assert eval_dim_expr("batch*seq", {"batch*seq": 7, "batch": 1, "seq": 1}) == 7

    def test_unbound_names_the_dim(self) -> None:
        with pytest.raises(UnboundDimError) as exc:
            eval_dim_expr("batch*seq", {"batch": 3}, where="input_ids[1]")
        assert exc.value.dim_name == "seq" and exc.value.where == "input_ids[1]"
        assert str(exc.value) == "dim 'seq' is unbound (input_ids[1]); pass --dim seq=VALUE"

    @pytest.mark.parametrize(
        "expr",
        ["__import__('os').system('true')", "seq.real", "[seq]", "seq**2", "lambda: 1", "seq if 1 else 2",
         "open('x')", "1.5*seq", "seq < 2", "a.b"],
    )
    def test_never_evaluates_python(self, expr: str) -> None:
        # Anything outside the whitelist is one opaque name: unbound unless bound as a whole.
        with pytest.raises(UnboundDimError) as exc:
            eval_dim_expr(expr, {"seq": 4, "a": 1})
        assert exc.value.dim_name == expr
        assert eval_dim_expr(expr, {expr: 5}) == 5

    def test_non_integer(self) -> None:
        with pytest.raises(ModelError, match=r"'seq/2' = 4.5 is not an integer at seq=9"):
            eval_dim_expr("seq/2", {"seq": 9})

    def test_division_by_zero(self) -> None:
        with pytest.raises(ModelError, match="divides by zero"):
            eval_dim_expr("seq // (seq - seq)", {"seq": 9})


# ------------------------------------------------------------------------------------------------
# Binding
# ------------------------------------------------------------------------------------------------


class TestBinding:
    def test_bound_dims(self) -> None:
        shaped = resolve_shapes(attention_model(), {"batch": 3, "seq": 7})
        assert isinstance(shaped, ShapedModel)
        assert shaped.shapes["x"] == (3, 7, 16)
        assert shaped.shapes["y"] == (3, 7, 16)
        assert shaped.dim_bindings["batch"] == 3 and shaped.dim_bindings["seq"] == 7

    def test_unbound_dim_names_dim_and_place(self) -> None:
        with pytest.raises(UnboundDimError) as exc:
            resolve_shapes(attention_model(), {"batch": 3})
        assert exc.value.dim_name == "seq" and exc.value.where == "x[1]"
        assert "--dim seq=VALUE" in str(exc.value) and "\n" not in str(exc.value)

    def test_derived_input_dims(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch*seq", "seq + 1", "2*seq"])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        shaped = resolve_shapes(_single_op("Relu", [x], [y]), {"batch": 2, "seq": 5})
        assert shaped.shapes["x"] == (10, 6, 10) and shaped.shapes["y"] == (10, 6, 10)
        assert shaped.dim_bindings["batch*seq"] == 10
        assert shaped.dim_bindings["seq + 1"] == 6 and shaped.dim_bindings["2*seq"] == 10

    def test_unnamed_input_dim(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", None])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        model = _single_op("Relu", [x], [y])
        with pytest.raises(UnboundDimError) as exc:
            resolve_shapes(model, {"batch": 2})
        assert exc.value.dim_name == "x[1]" and "unnamed dim of graph input 'x'" in str(exc.value)
        assert resolve_shapes(model, {"batch": 2, "x[1]": 9}).shapes["y"] == (2, 9)

    def test_unused_input_with_unbound_dim_warns(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
        unused = helper.make_tensor_value_info("unused", TensorProto.FLOAT, ["mystery"])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        node = helper.make_node("Relu", ["x"], ["y"])
        graph = helper.make_graph([node], "g", [x, unused], [y])
        shaped = resolve_shapes(helper.make_model(graph, opset_imports=OPSET), {"batch": 2})
        assert shaped.shapes["y"] == (2, 4) and "unused" not in shaped.shapes
        assert any("'unused' is unused" in w for w in shaped.warnings)

    @pytest.mark.parametrize("value", [0, -4])
    def test_non_positive_binding(self, value: int) -> None:
        with pytest.raises(ModelError, match=rf"dim 'seq' = {value} is not positive; pass --dim seq=N"):
            resolve_shapes(attention_model(), {"batch": 2, "seq": value})

    @pytest.mark.parametrize("value", [True, 2.5, "8"])
    def test_non_integer_binding(self, value: object) -> None:
        with pytest.raises(ModelError, match="is not an integer"):
            resolve_shapes(attention_model(), {"batch": 2, "seq": value})  # type: ignore[dict-item]

    def test_too_large_binding(self) -> None:
        with pytest.raises(ModelError, match="too large"):
            resolve_shapes(attention_model(), {"batch": 2, "seq": 2**63})

    def test_numpy_integer_binding(self) -> None:
        shaped = resolve_shapes(attention_model(), {"batch": np.int64(2), "seq": np.int32(3)})
        assert shaped.shapes["y"] == (2, 3, 16)

    def test_zero_declared_input_dim(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 0])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        with pytest.raises(ModelError, match=r"graph input 'x' dim 1 \(0\) is 0"):
            resolve_shapes(_single_op("Relu", [x], [y]), {"batch": 2})

    def test_zero_computed_dim(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        inits = [numpy_helper.from_array(np.array([5], np.int64), n) for n in ("starts", "ends")]
        model = _single_op("Slice", [x], [y], inits=inits)
        with pytest.raises(ModelError, match=r"value 'y' \(Slice node 'slice'\) has computed shape "
                                             r"\[0, 8\] with a zero or negative dim") as exc:
            resolve_shapes(model, {"batch": 2})
        assert "\n" not in str(exc.value)


# ------------------------------------------------------------------------------------------------
# Computed shapes, folding, against onnxruntime
# ------------------------------------------------------------------------------------------------


class TestComputedShapes:
    @pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 5), (3, 64)])
    def test_attention_against_onnxruntime(self, batch: int, seq: int) -> None:
        model = attention_model(value_info=False)
        shaped = resolve_shapes(model, {"batch": batch, "seq": seq})
        feeds = {"x": np.random.default_rng(1).standard_normal((batch, seq, 16)).astype(np.float32)}
        truth = _ort_oracle(model, feeds)
        for name in _node_outputs(model):
            assert shaped.shapes[name] == truth[name].shape, name
            assert shaped.dtypes[name] == truth[name].dtype.name, name
        # Every folded value equals what onnxruntime computed.
        for name, value in shaped.constants.items():
            if name in truth:
                np.testing.assert_array_equal(value, truth[name], err_msg=name)
        assert shaped.constants["heads_shape"].tolist() == [batch, seq, 4, 4]
        assert shaped.constants["hd"].tolist() == [4]
        assert shaped.warnings == ()

    def test_causal_mask_folded(self) -> None:
        model = causal_mask_model()
        shaped = resolve_shapes(model, {"batch": 2, "seq": 6})
        truth = _ort_oracle(model, {"x": np.ones((2, 6, 4), np.float32)})
        for name in _node_outputs(model):
            assert shaped.shapes[name] == truth[name].shape, name
        np.testing.assert_array_equal(shaped.constants["mask"], truth["mask"])
        assert shaped.constants["pos"].tolist() == list(range(6))

    @pytest.mark.parametrize("axis", [-1, 0, 1])
    def test_one_hot_tile_repeats(self, axis: int) -> None:
        """TorchScript's ``repeat`` of Mixtral's tokens: Tile repeats built by a OneHot of k (issue 15).

        ``OneHot(indices=[[1], [-1]], depth=3, values=[1, k])`` gives the repeats; ``k`` comes from
        the TopK output's shape, so the whole chain folds and the Tile's shape is known.
        """
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        nodes = [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Slice", ["shape", "zero", "one"], ["rows"]),
            helper.make_node("Concat", ["off", "rows"], ["values"], axis=0),
            helper.make_node("OneHot", ["indices", "depth", "values"], ["hot"], axis=axis),
            helper.make_node("Reshape", ["hot", "flat"], ["reps_all"]),
            helper.make_node("Slice", ["reps_all", "zero", "two"], ["reps"]),
            helper.make_node("Tile", ["x", "reps"], ["y"]),
        ]
        inits = [
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
            numpy_helper.from_array(np.array([1], np.int64), "off"),
            numpy_helper.from_array(np.array([[1], [-1]], np.int64), "indices"),
            numpy_helper.from_array(np.array(3, np.int64), "depth"),
            numpy_helper.from_array(np.array([-1], np.int64), "flat"),
        ]
        model = helper.make_model(helper.make_graph(nodes, "one_hot", [x], [y], initializer=inits), opset_imports=OPSET)
        shaped = resolve_shapes(model, {"batch": 3})
        truth = _ort_oracle(model, {"x": np.ones((3, 4), np.float32)})
        np.testing.assert_array_equal(shaped.constants["hot"], truth["hot"])
        assert shaped.shapes["y"] == truth["y"].shape
        # By hand: axis -1 -> [[1, 3, 1], [1, 1, 3]], so the repeats are [1, 3] and y is [3, 12].
        if axis == -1:
            assert shaped.constants["hot"].tolist() == [[[1, 3, 1]], [[1, 1, 3]]]
            assert shaped.shapes["y"] == (3, 12)

    def test_big_values_not_folded(self) -> None:
        seq = 1 + int(np.sqrt(FOLD_MAX_ELEMENTS))  # the mask has more than FOLD_MAX_ELEMENTS entries
        shaped = resolve_shapes(causal_mask_model(), {"batch": 1, "seq": seq})
        assert "mask" not in shaped.constants and "pos" in shaped.constants
        assert shaped.shapes["mask"] == (seq, seq) and shaped.shapes["y"] == (1, seq, seq)

    def test_inline_weights_are_not_constants(self) -> None:
        shaped = resolve_shapes(attention_model(), {"batch": 2, "seq": 3})
        assert "w_qkv" not in shaped.constants and shaped.shapes["w_qkv"] == (16, 48)
        assert shaped.dtypes["w_qkv"] == "float32"
        assert shaped.constants["heads"].tolist() == [4]  # small int64 initializer

    def test_value_info_unknown_dims_are_computed(self) -> None:
        # Exporters leave some dims with neither value nor name (inference calls them unk__N).
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "unk__3"])
        mid = helper.make_tensor_value_info("mid", TensorProto.FLOAT, [None, None])
        nodes = [helper.make_node("Relu", ["x"], ["mid"]), helper.make_node("Concat", ["mid", "x"], ["y"], axis=1)]
        graph = helper.make_graph(nodes, "g", [x], [y], value_info=[mid])
        shaped = resolve_shapes(helper.make_model(graph, opset_imports=OPSET), {"batch": 2})
        assert shaped.shapes["mid"] == (2, 6) and shaped.shapes["y"] == (2, 12)
        assert shaped.warnings == ()

    def test_dtypes(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
        nodes = [
            helper.make_node("Cast", ["x"], ["bf"], to=TensorProto.BFLOAT16),
            helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.INT32),
        ]
        outs = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in ("bf", "h", "s32")]
        graph = helper.make_graph(nodes, "g", [x], outs)
        shaped = resolve_shapes(helper.make_model(graph, opset_imports=OPSET), {"batch": 2})
        assert shaped.dtypes == {"x": "float32", "bf": "bfloat16", "h": "float16", "s": "int64", "s32": "int32"}
        assert shaped.constants["s32"].tolist() == [2, 4]

    def test_shape_start_end(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])
        nodes = [helper.make_node("Shape", ["x"], ["s"], start=-2), helper.make_node("Size", ["x"], ["n"])]
        outs = [helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in ("s", "n")]
        graph = helper.make_graph(nodes, "g", [x], outs)
        shaped = resolve_shapes(helper.make_model(graph, opset_imports=OPSET), {"batch": 2, "seq": 3})
        assert shaped.constants["s"].tolist() == [3, 4] and int(shaped.constants["n"]) == 24


# ------------------------------------------------------------------------------------------------
# Declared shapes: value_info fallback, contradictions
# ------------------------------------------------------------------------------------------------


class TestDeclared:
    def _custom_op_model(self) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        nodes = [
            helper.make_node("Mystery", ["x"], ["m"], domain="custom.ops", name="mystery"),
            helper.make_node("Relu", ["m"], ["y"], name="relu"),
        ]
        vi = helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", "2*batch"])
        graph = helper.make_graph(nodes, "g", [x], [y], value_info=[vi])
        return helper.make_model(graph, opset_imports=OPSET + [helper.make_opsetid("custom.ops", 1)])

    def test_value_info_fills_what_inference_cannot(self) -> None:
        shaped = resolve_shapes(self._custom_op_model(), {"batch": 3})
        assert shaped.shapes["m"] == (3, 6)
        assert shaped.shapes["y"] == (3, 6)  # inference resumed downstream of the declared value
        assert any("declared value_info" in w and "m" in w for w in shaped.warnings)

    def test_unknown_without_value_info_is_a_warning(self) -> None:
        model = self._custom_op_model()
        del model.graph.value_info[:]
        shaped = resolve_shapes(model, {"batch": 3})
        assert "m" not in shaped.shapes and "y" not in shaped.shapes
        assert any("could not compute the shapes of 2 values" in w and "Mystery" in w for w in shaped.warnings)

    def test_onnxruntime_symbolic_inference_fallback(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # com.microsoft ops are unknown to ONNX's inference; onnxruntime's knows SkipLayerNorm but
        # not this made-up one, so its partial result must still be used, and nothing written.
        pytest.importorskip("sympy")
        monkeypatch.chdir(tmp_path)
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        inits = [numpy_helper.from_array(np.ones(8, np.float32), n) for n in ("gamma", "beta")]
        nodes = [
            helper.make_node("SkipLayerNormalization", ["x", "x", "gamma", "beta"], ["ln"],
                             domain="com.microsoft", name="sln"),
            helper.make_node("Relu", ["ln"], ["r"], name="relu"),
            helper.make_node("MadeUpOp", ["r"], ["y"], domain="com.microsoft", name="made_up"),
        ]
        graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        )
        shaped = resolve_shapes(model, {"batch": 2, "seq": 3})
        assert shaped.shapes["ln"] == (2, 3, 8) and shaped.shapes["r"] == (2, 3, 8)
        assert "y" not in shaped.shapes
        assert list(tmp_path.iterdir()) == []

    def test_wrong_declared_output_is_overridden(self) -> None:
        # An LSTM LM exported at seq=128 declared [batch, 128, vocab] for its output.
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 10])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 128, 10])
        wrong_mid = helper.make_tensor_value_info("mid", TensorProto.FLOAT, ["batch", "seq", 11])
        nodes = [helper.make_node("Relu", ["x"], ["mid"]), helper.make_node("Neg", ["mid"], ["y"])]
        graph = helper.make_graph(nodes, "g", [x], [y], value_info=[wrong_mid])
        shaped = resolve_shapes(helper.make_model(graph, opset_imports=OPSET), {"batch": 2, "seq": 7})
        assert shaped.shapes["y"] == (2, 7, 10) and shaped.shapes["mid"] == (2, 7, 10)
        joined = "\n".join(shaped.warnings)
        assert "'y' declared [batch, 128, 10], computed [2, 7, 10]" in joined
        assert "'mid' declared [batch, seq, 11], computed [2, 7, 10]" in joined

    def test_value_info_agreeing_gives_no_warning(self) -> None:
        shaped = resolve_shapes(attention_model(value_info=True), {"batch": 2, "seq": 5})
        assert shaped.warnings == ()
        assert shaped.shapes["scores"] == (2, 4, 5, 5)


# ------------------------------------------------------------------------------------------------
# Stripped files (graph only)
# ------------------------------------------------------------------------------------------------


class TestStripped:
    def test_stripped_keeping_small_ints(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        _save_stripped(attention_model(value_info=False), path, threshold=1024).unlink()
        model, _ = load_onnx(path)
        shaped = resolve_shapes(model, {"batch": 2, "seq": 5})
        assert all(name in shaped.shapes for name in _node_outputs(model))
        assert shaped.shapes["merged"] == (2, 5, 16) and shaped.warnings == ()

    def test_stripped_everything_with_value_info(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        _save_stripped(attention_model(value_info=True), path, threshold=0).unlink()
        model, _ = load_onnx(path)
        shaped = resolve_shapes(model, {"batch": 2, "seq": 5})
        expected = resolve_shapes(attention_model(), {"batch": 2, "seq": 5}).shapes
        for name in _node_outputs(model):
            assert shaped.shapes[name] == expected[name], name
        assert any("declared value_info" in w for w in shaped.warnings)

    def test_stripped_everything_without_value_info(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        _save_stripped(attention_model(value_info=False), path, threshold=0).unlink()
        model, _ = load_onnx(path)
        shaped = resolve_shapes(model, {"batch": 2, "seq": 5})
        # The Reshape targets are lost with the data file: no crash, what is known is right.
        assert shaped.shapes["qkv"] == (2, 5, 48) and shaped.shapes["heads_shape"] == (4,)
        assert "q4" not in shaped.shapes
        assert any("could not compute" in w for w in shaped.warnings)

    def test_data_file_present_is_used_for_small_ints(self, tmp_path: Path) -> None:
        path = tmp_path / "m.onnx"
        _save_stripped(attention_model(value_info=False), path, threshold=0)
        model, _ = load_onnx(path)
        shaped = resolve_shapes(model, {"batch": 2, "seq": 5})
        assert shaped.shapes["q4"] == (2, 5, 4, 4) and shaped.warnings == ()
        assert "w_qkv" not in shaped.constants  # the float weight was not read

    def test_external_constant_node(self, tmp_path: Path) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        w = numpy_helper.from_array(np.ones((64, 32), np.float32), "wc")
        nodes = [helper.make_node("Constant", [], ["w"], value=w), helper.make_node("MatMul", ["x", "w"], ["y"])]
        path = tmp_path / "c.onnx"
        model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=OPSET)
        onnx.external_data_helper.convert_model_to_external_data(
            model, location="c.data", size_threshold=0, convert_attribute=True
        )
        onnx.save_model(model, str(path))
        (tmp_path / "c.data").unlink()
        shaped = resolve_shapes(load_onnx(path)[0], {"batch": 3})
        assert shaped.shapes["w"] == (64, 32) and shaped.shapes["y"] == (3, 32)


# ------------------------------------------------------------------------------------------------
# Invalid graphs
# ------------------------------------------------------------------------------------------------


class TestInvalidGraphs:
    def test_dangling_input(self) -> None:
        model = attention_model()
        del model.graph.node[0]
        with pytest.raises(ModelError, match="reads 'qkv', which nothing produces"):
            resolve_shapes(model, {"batch": 2, "seq": 3})

    def test_cycle(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
                 helper.make_node("Relu", ["a"], ["y"], name="n3")]
        model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=OPSET)
        with pytest.raises(ModelError, match="cycle"):
            resolve_shapes(model, {})

    def test_value_produced_twice(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
        model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=OPSET)
        with pytest.raises(ModelError, match="'y' is produced twice"):
            resolve_shapes(model, {})

    def test_input_without_shape(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        with pytest.raises(ModelError, match="graph input 'x' declares no shape"):
            resolve_shapes(_single_op("Relu", [x], [y]), {})

    def test_split_outputs_disagree_with_num_outputs(self) -> None:
        # ONNX's C++ inference aborts the process on this one, so it must be stopped before.
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abcd"]
        model = _single_op("Split", [x], outs, axis=1, num_outputs=3)
        with pytest.raises(ModelError, match="num_outputs=3 but 4 outputs; the model is invalid"):
            resolve_shapes(model, {"batch": 2})

    def test_attribute_of_wrong_type(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        model = _single_op("Transpose", [x], [y], perm=[1.0, 0.0])
        with pytest.raises(ModelError, match="does not match the ONNX Transpose schema"):
            resolve_shapes(model, {"batch": 2})

    def test_unknown_standard_op_is_left_opaque(self) -> None:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        shaped = resolve_shapes(_single_op("NoSuchOp", [x], [y]), {"batch": 2})
        assert "y" not in shaped.shapes and any("NoSuchOp" in w for w in shaped.warnings)

    def test_messages_stay_one_line(self) -> None:
        model = attention_model()
        model.graph.node[1].input[0] = "qkv\nsecond line"
        with pytest.raises(ModelError) as exc:
            resolve_shapes(model, {"batch": 2, "seq": 3})
        assert "\n" not in str(exc.value) and "qkv\\nsecond line" in str(exc.value)

    def test_unsorted_nodes(self) -> None:
        model = attention_model()
        nodes = list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(reversed(nodes))
        shaped = resolve_shapes(model, {"batch": 2, "seq": 3})
        assert shaped.shapes["y"] == (2, 3, 16) and shaped.constants["hd"].tolist() == [4]


# ------------------------------------------------------------------------------------------------
# Real exports, when examples/ and tests/data/ have been generated
# ------------------------------------------------------------------------------------------------


def _example_files() -> list[tuple[Path, dict]]:
    found = []
    for folder in (REPO / "examples", REPO / "tests" / "data"):
        index = folder / "models.json"
        if not index.exists():
            continue
        for record in json.loads(index.read_text()).values():
            path = folder / record["file"]
            if path.exists():
                found.append((path, record))
    return found


def _example_dims(record: dict) -> dict[str, int]:
    return {name: 2 if "batch" in name else 8 for name in record.get("dims", [])}


@pytest.mark.skipif(not _example_files(), reason="examples/ and tests/data/ not generated yet")
@pytest.mark.parametrize("path_record", _example_files(), ids=lambda pr: pr[0].name)
def test_real_exports_fully_shaped(path_record: tuple[Path, dict]) -> None:
    path, record = path_record
    model, _ = load_onnx(path)
    shaped = resolve_shapes(model, _example_dims(record))
    missing = [name for name in _node_outputs(model) if name not in shaped.shapes]
    assert not missing, (missing[:10], shaped.warnings)


def _runnable_examples() -> list[tuple[Path, dict]]:
    return [(p, r) for p, r in _example_files() if r.get("weights") == "inline"]


@pytest.mark.skipif(not _runnable_examples(), reason="no runnable example generated yet")
@pytest.mark.parametrize("path_record", _runnable_examples(), ids=lambda pr: pr[0].name)
def test_runnable_export_against_onnxruntime(path_record: tuple[Path, dict]) -> None:
    path, record = path_record
    model = onnx.load(str(path))
    dims = _example_dims(record)
    shaped = resolve_shapes(model, dims)
    feeds = {}
    for vi in model.graph.input:
        shape = shaped.shapes[vi.name]
        dtype = shaped.dtypes[vi.name]
        feeds[vi.name] = (np.ones(shape, dtype) if dtype.startswith("int") else
                          np.random.default_rng(0).standard_normal(shape).astype(dtype))
    truth = _ort_oracle(model, feeds)
    for name in _node_outputs(model):
        assert shaped.shapes[name] == truth[name].shape, name
    for name, value in shaped.constants.items():
        if name in truth:
            np.testing.assert_array_equal(value, truth[name], err_msg=name)


def test_three_thousand_nodes_complete() -> None:
    """A 3,000-node graph (140 attention blocks) is shaped completely (speed is benchmarked apart)."""
    base = attention_model(value_info=False)
    nodes, inits = [], []
    prev = "x"
    for block in range(140):
        def rename(name: str, block: int = block, prev: str = prev) -> str:
            return prev if name == "x" else (f"b{block}/{name}" if name else name)

        for node in base.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"b{block}/{node.name}"
            copy.input[:] = [rename(n) for n in node.input]
            copy.output[:] = [rename(n) for n in node.output]
            nodes.append(copy)
        for tensor in base.graph.initializer:
            t = onnx.TensorProto()
            t.CopyFrom(tensor)
            t.name = rename(tensor.name)
            inits.append(t)
        prev = f"b{block}/y"
    out = helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", "seq", 16])
    graph = helper.make_graph(nodes, "stack", list(base.graph.input), [out], initializer=inits)
    model = helper.make_model(graph, opset_imports=OPSET)
    assert len(model.graph.node) == 3080
    shaped = resolve_shapes(model, {"batch": 2, "seq": 9})
    assert all(n in shaped.shapes for n in _node_outputs(model))
    assert shaped.shapes[prev] == (2, 9, 16) and shaped.warnings == ()
