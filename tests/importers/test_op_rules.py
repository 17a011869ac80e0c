"""Per-family op rules on single nodes: dims, kinds, access maps and FLOPs computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from importers.op_rules import OP_RULES, NodeContext, apply_rule, rule_for
from importers.op_rules.opaque import opaque_rule
from planner.core.errors import ModelError


def ctx(op_type: str, inputs, outputs, attrs=None, constants=None, parameters=(), opset=18, domain=""):
    return NodeContext(
        name=f"n_{op_type}",
        op_type=op_type,
        domain=domain,
        attrs=attrs or {},
        input_shapes=tuple(inputs),
        input_dtypes=tuple("float32" if s is not None else None for s in inputs),
        output_shapes=tuple(outputs),
        output_dtypes=tuple("float32" for _ in outputs),
        constants=constants or {},
        parameters=frozenset(parameters),
        opset=opset,
    )


def dims_of(result):
    return {d.name: (d.size, d.kind, d.splittable) for d in result.dims}


class TestMatMul:
    def test_batched_with_broadcast_weight(self):
        r = apply_rule(ctx("MatMul", [(4, 12, 32, 64), (64, 16)], [(4, 12, 32, 16)]))
        assert dims_of(r) == {
            "b0": (4, "parallel", True),
            "b1": (12, "parallel", True),
            "m": (32, "parallel", True),
            "n": (16, "parallel", True),
            "k": (64, "reduction", True),
        }
        assert r.inputs == ((0, (("b0",), ("b1",), ("m",), ("k",))), (1, (("k",), ("n",))))
        assert r.outputs == ((0, (("b0",), ("b1",), ("m",), ("n",))),)
        assert r.flops == 2 * 4 * 12 * 32 * 16 * 64
        assert r.backward_flops_factor == 2.0

    def test_size_one_batch_axis_maps_to_nothing(self):
        # A [1, 8, 4] x B [3, 4, 5]: A's batch axis is broadcast, so it is never split by this op.
        r = apply_rule(ctx("MatMul", [(1, 8, 4), (3, 4, 5)], [(3, 8, 5)]))
        assert r.inputs[0] == (0, ((), ("m",), ("k",)))
        assert r.inputs[1] == (1, (("b0",), ("k",), ("n",)))
        assert r.flops == 2 * 3 * 8 * 5 * 4

    def test_vector_operands(self):
        r = apply_rule(ctx("MatMul", [(8,), (8, 5)], [(5,)]))
        assert r.inputs == ((0, (("k",),)), (1, (("k",), ("n",))))
        assert r.outputs == ((0, (("n",),)),)
        assert r.flops == 2 * 5 * 8

    def test_gemm_transposes_and_bias(self):
        r = apply_rule(ctx("Gemm", [(16, 8), (32, 16), (32,)], [(8, 32)], attrs={"transA": 1, "transB": 1}))
        assert r.inputs == ((0, (("k",), ("m",))), (1, (("n",), ("k",))), (2, (("n",),)))
        assert r.flops == 2 * 8 * 32 * 16 + 8 * 32

    def test_einsum_contraction(self):
        r = apply_rule(ctx("Einsum", [(2, 3, 4), (2, 4, 5)], [(2, 3, 5)], attrs={"equation": "bij,bjk->bik"}))
        assert dims_of(r)["j"] == (4, "reduction", True)
        assert r.inputs == ((0, (("b",), ("i",), ("j",))), (1, (("b",), ("j",), ("k",))))
        assert r.flops == 2 * (2 * 3 * 4 * 5)

    def test_einsum_ellipsis_and_implicit_output(self):
        r = apply_rule(ctx("Einsum", [(7, 3, 4), (4, 5)], [(7, 3, 5)], attrs={"equation": "...ij,jk"}))
        assert r.kind == "matmul"
        assert r.outputs == ((0, (("E0",), ("i",), ("k",))),)


class TestProductShapesMustFit:
    """Issue 16: a MatMul of [batch, 64] by [32, 64] was planned with a weak warning."""

    @pytest.mark.parametrize(
        "op_type, a, b, attrs, what",
        [
            ("MatMul", (4, 64), (32, 64), {}, "inner dims 64 != 32"),
            ("MatMul", (2, 3, 8, 16), (5, 16, 4), {}, "batch dims do not broadcast"),
            ("MatMul", (16,), (8, 4), {}, "inner dims 16 != 8"),
            ("Gemm", (4, 64), (32, 64), {}, "inner dims 64 != 32 with transA=0, transB=0"),
            ("Gemm", (4, 64), (32, 48), {"transB": 1}, "inner dims 64 != 48 with transA=0, transB=1"),
        ],
    )
    def test_mismatch_is_a_one_line_model_error_naming_node_and_shapes(self, op_type, a, b, attrs, what):
        with pytest.raises(ModelError) as exc:
            apply_rule(ctx(op_type, [a, b], [None], attrs=attrs))
        text = str(exc.value)
        assert "\n" not in text
        assert text.startswith(f"{op_type} node 'n_{op_type}': operands {list(a)} and {list(b)}")
        assert f"({what})" in text and text.endswith("re-export the model (or check the --dim values)")

    def test_file_refused_at_import(self, tmp_path):
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        from importers import import_model

        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
        w = numpy_helper.from_array(np.zeros((32, 64), np.float32), "fc.weight")
        node = helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="fc")
        model = helper.make_model(helper.make_graph([node], "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 18)])
        onnx.save(model, tmp_path / "bad.onnx")
        with pytest.raises(ModelError, match=r"^MatMul node 'fc': operands \[8, 64\] and \[32, 64\] do not fit"):
            import_model(tmp_path / "bad.onnx", {"batch": 8})

    def test_einsum_index_of_two_sizes(self):
        with pytest.raises(ModelError, match=r"index 'j' is 4 in one operand and 5 in another"):
            apply_rule(ctx("Einsum", [(2, 3, 4), (2, 5, 6)], [None], attrs={"equation": "bij,bjk->bik"}))

    @pytest.mark.parametrize("a, b", [((4, 64), (64, 32)), ((3, 1, 8, 16), (5, 16, 4)), ((16,), (16, 4))])
    def test_products_that_fit_still_import(self, a, b):
        # numpy's matmul is the oracle: it accepts exactly the shapes that multiply.
        expected = np.matmul(np.zeros(a), np.zeros(b)).shape
        r = apply_rule(ctx("MatMul", [a, b], [expected]))
        assert r.kind == "matmul"
        assert r.flops == 2 * np.prod(expected) * a[-1]


class TestConv:
    def test_conv_dims_halo_and_flops(self):
        r = apply_rule(
            ctx("Conv", [(8, 3, 32, 32), (16, 3, 5, 5), (16,)], [(8, 16, 14, 14)],
                attrs={"strides": [2, 2], "dilations": [1, 1]})
        )
        d = {x.name: x for x in r.dims}
        assert (d["oh"].kind, d["oh"].halo, d["oh"].stride) == ("spatial", 4, 2)
        assert (d["ci"].kind, d["kh"].splittable) == ("reduction", False)
        assert r.inputs[0] == (0, (("b",), ("ci",), ("oh",), ("ow",)))
        assert r.inputs[1] == (1, (("co",), ("ci",), ("kh",), ("kw",)))
        assert r.flops == 2 * 8 * 16 * 14 * 14 * 3 * 5 * 5 + 8 * 16 * 14 * 14

    def test_grouped_conv_indexes_channels_by_group(self):
        r = apply_rule(ctx("Conv", [(2, 32, 8, 8), (64, 8, 3, 3)], [(2, 64, 8, 8)], attrs={"group": 4}))
        assert r.inputs[0][1][1] == ("g", "ci")
        assert r.inputs[1][1][0] == ("g", "co")
        assert r.outputs[0][1][1] == ("g", "co")
        assert r.flops == 2 * 2 * 64 * 8 * 8 * (32 // 4) * 9

    def test_depthwise_conv_has_no_channel_reduction(self):
        r = apply_rule(ctx("Conv", [(2, 32, 8, 8), (32, 1, 3, 3)], [(2, 32, 8, 8)], attrs={"group": 32}))
        assert "ci" not in dims_of(r) and "co" not in dims_of(r)
        assert r.flops == 2 * 2 * 32 * 64 * 9


class TestElementwise:
    def test_broadcast_operand_maps_only_its_axes(self):
        r = apply_rule(ctx("Add", [(8, 128, 768), (768,)], [(8, 128, 768)]))
        assert r.inputs[1] == (1, (("d2",),))
        assert r.flops == 8 * 128 * 768
        assert r.pointwise

    def test_size_one_axes_map_to_nothing(self):
        r = apply_rule(ctx("Where", [(8, 1, 1, 128), (8, 12, 128, 128), ()], [(8, 12, 128, 128)]))
        assert r.inputs[0] == (0, (("d0",), (), (), ("d3",)))
        assert r.inputs[2] == (2, ())


class TestNormalisations:
    def test_layer_norm_axis(self):
        r = apply_rule(ctx("LayerNormalization", [(4, 16, 64), (16, 64), (16, 64)], [(4, 16, 64)], attrs={"axis": -2}))
        assert [d.kind for d in r.dims] == ["parallel", "normalized", "normalized"]
        assert r.inputs[1] == (1, (("d1",), ("d2",)))
        assert r.flops == 5 * 4 * 16 * 64

    def test_softmax_before_opset_13_normalises_trailing_axes(self):
        r = apply_rule(ctx("Softmax", [(4, 8, 16)], [(4, 8, 16)], attrs={"axis": 1}, opset=11))
        assert [d.kind for d in r.dims] == ["parallel", "normalized", "normalized"]

    def test_batch_norm_channel_params(self):
        r = apply_rule(ctx("BatchNormalization", [(8, 64, 7, 7)] + [(64,)] * 4, [(8, 64, 7, 7)]))
        assert [(d.name, d.kind) for d in r.dims] == [("b", "parallel"), ("c", "parallel"), ("h", "normalized"), ("w", "normalized")]
        assert all(axes == (("c",),) for _, axes in r.inputs[1:])

    def test_group_norm(self):
        r = apply_rule(ctx("GroupNormalization", [(2, 16, 8, 8), (16,), (16,)], [(2, 16, 8, 8)], attrs={"num_groups": 4}, opset=21))
        assert r.inputs[0] == (0, (("b",), ("g", "c"), ("h",), ("w",)))
        assert r.inputs[1] == (1, (("g", "c"),))


class TestReductions:
    def test_reduce_sum_axes_from_constant_input(self):
        r = apply_rule(ctx("ReduceSum", [(4, 8, 16), (1,)], [(4, 16)], attrs={"keepdims": 0},
                           constants={1: np.array([1])}))
        assert [d.kind for d in r.dims] == ["parallel", "reduction", "parallel"]
        assert r.outputs == ((0, (("d0",), ("d2",))),)
        assert r.flops == 4 * 8 * 16

    def test_reduce_mean_attribute_axes_keepdims(self):
        r = apply_rule(ctx("ReduceMean", [(4, 8)], [(4, 1)], attrs={"axes": [-1]}, opset=13))
        assert r.outputs == ((0, (("d0",), ())),)

    def test_cumsum_scan_axis_not_splittable(self):
        r = apply_rule(ctx("CumSum", [(4, 8), ()], [(4, 8)], constants={1: np.array(-1)}))
        assert [d.splittable for d in r.dims] == [True, False]

    def test_topk(self):
        r = apply_rule(ctx("TopK", [(4, 1000), (1,)], [(4, 5), (4, 5)], constants={1: np.array([5])}))
        assert r.outputs[0] == (0, (("d0",), ()))
        assert r.dims[1].splittable is False


class TestGather:
    def test_embedding_is_vocab_splittable(self):
        r = apply_rule(ctx("Gather", [(1000, 64), (2, 16)], [(2, 16, 64)], parameters={0}))
        assert r.kind == "embedding"
        assert dims_of(r)["v"] == (1000, "reduction", True)
        assert r.outputs == ((0, (("i0",), ("i1",), ("d",))),)

    def test_gather_on_activation_is_data_movement(self):
        r = apply_rule(ctx("Gather", [(4, 10, 8), (3,)], [(4, 3, 8)], attrs={"axis": 1}))
        assert r.kind == "data_movement"
        assert r.inputs == ((0, (("o0",), (), ("o2",))), (1, (("o1",),)))

    def test_scatter_nd_addressed_axes(self):
        r = apply_rule(ctx("ScatterND", [(8, 16), (3, 1), (3, 16)], [(8, 16)]))
        assert [d.splittable for d in r.dims] == [False, True]


class TestMovement:
    def test_concat_axis_not_splittable(self):
        r = apply_rule(ctx("Concat", [(2, 3, 8), (2, 5, 8)], [(2, 8, 8)], attrs={"axis": 1}))
        assert [d.splittable for d in r.dims] == [True, False, True]
        assert r.inputs[0] == (0, (("d0",), (), ("d2",)))

    def test_slice_and_pad(self):
        r = apply_rule(ctx("Slice", [(8, 1024, 64)], [(8, 512, 64)]))
        assert r.inputs == ((0, (("d0",), (), ("d2",))),)
        r = apply_rule(ctx("Pad", [(1, 3, 8, 8)], [(1, 3, 10, 10)]))
        assert [d.splittable for d in r.dims] == [True, False, False]

    def test_transpose_kept_as_op_maps_permuted_axes(self):
        r = apply_rule(ctx("Transpose", [(4, 8, 16)], [(16, 4, 8)], attrs={"perm": [2, 0, 1]}))
        assert r.inputs == ((0, (("d1",), ("d2",), ("d0",))),)
        assert r.flops == 0

    def test_reshape_kept_as_op_maps_outer_sub_dims(self):
        r = apply_rule(ctx("Reshape", [(8, 768), (3,)], [(8, 12, 64)]))
        assert r.inputs[0] == (0, (("d0",), ("d1", "d2")))


class TestPoolAndRnn:
    def test_max_pool(self):
        r = apply_rule(ctx("MaxPool", [(2, 8, 16, 16)], [(2, 8, 8, 8)], attrs={"kernel_shape": [2, 2], "strides": [2, 2]}))
        assert [(d.name, d.halo, d.stride) for d in r.dims] == [("b", 0, 1), ("c", 0, 1), ("oh", 1, 2), ("ow", 1, 2)]
        assert r.flops == 2 * 8 * 8 * 8 * 4

    def test_gru_flops(self):
        r = apply_rule(ctx("GRU", [(10, 4, 16), (1, 96, 16), (1, 96, 32), (1, 192)],
                           [(10, 1, 4, 32), (1, 4, 32)], attrs={"hidden_size": 32}))
        assert r.kind == "rnn"
        assert dims_of(r)["t"] == (10, "parallel", False)
        assert r.flops == 10 * 4 * (2 * 3 * 32 * (16 + 32) + 4 * 3 * 32)


# One representative node per op type the brief requires a rule for.
COVERAGE = {
    "Abs": ([(4, 8)], [(4, 8)], {}),
    "Add": ([(4, 8), (8,)], [(4, 8)], {}),
    "And": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "AveragePool": ([(1, 3, 8, 8)], [(1, 3, 4, 4)], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "BatchNormalization": ([(2, 3, 4, 4)] + [(3,)] * 4, [(2, 3, 4, 4)], {}),
    "Cast": ([(4, 8)], [(4, 8)], {"to": 1}),
    "Clip": ([(4, 8), (), ()], [(4, 8)], {}),
    "Concat": ([(4, 8), (4, 8)], [(8, 8)], {"axis": 0}),
    "Constant": ([], [(4,)], {}),
    "ConstantOfShape": ([(2,)], [(4, 8)], {}),
    "Conv": ([(1, 3, 8, 8), (4, 3, 3, 3)], [(1, 4, 6, 6)], {}),
    "CumSum": ([(4, 8), ()], [(4, 8)], {}),
    "Div": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "Dropout": ([(4, 8)], [(4, 8)], {}),
    "Einsum": ([(4, 8), (8, 3)], [(4, 3)], {"equation": "ij,jk->ik"}),
    "Equal": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "Erf": ([(4, 8)], [(4, 8)], {}),
    "Exp": ([(4, 8)], [(4, 8)], {}),
    "Expand": ([(1, 8), (2,)], [(4, 8)], {}),
    "Flatten": ([(4, 2, 4)], [(4, 8)], {}),
    "Gather": ([(10, 8), (4,)], [(4, 8)], {}),
    "GatherND": ([(4, 5, 6), (4, 3, 1)], [(4, 3, 6)], {"batch_dims": 1}),
    "Gelu": ([(4, 8)], [(4, 8)], {}),
    "Gemm": ([(4, 8), (8, 3)], [(4, 3)], {}),
    "GlobalAveragePool": ([(1, 3, 8, 8)], [(1, 3, 1, 1)], {}),
    "Greater": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "GreaterOrEqual": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "GroupNormalization": ([(2, 4, 8), (2,), (2,)], [(2, 4, 8)], {"num_groups": 2}),
    "Identity": ([(4, 8)], [(4, 8)], {}),
    "IsNaN": ([(4, 8)], [(4, 8)], {}),
    "LayerNormalization": ([(4, 8), (8,), (8,)], [(4, 8)], {}),
    "LeakyRelu": ([(4, 8)], [(4, 8)], {}),
    "Less": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "LessOrEqual": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "Log": ([(4, 8)], [(4, 8)], {}),
    "LogSoftmax": ([(4, 8)], [(4, 8)], {}),
    "LSTM": ([(5, 2, 8), (1, 64, 8), (1, 64, 16)], [(5, 1, 2, 16)], {"hidden_size": 16}),
    "GRU": ([(5, 2, 8), (1, 48, 8), (1, 48, 16)], [(5, 1, 2, 16)], {"hidden_size": 16}),
    "MatMul": ([(4, 8), (8, 3)], [(4, 3)], {}),
    "Max": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "MaxPool": ([(1, 3, 8, 8)], [(1, 3, 4, 4)], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "Min": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "Mod": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "Mul": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "Neg": ([(4, 8)], [(4, 8)], {}),
    "Not": ([(4, 8)], [(4, 8)], {}),
    "Or": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "Pad": ([(4, 8), (4,)], [(6, 8)], {}),
    "Pow": ([(4, 8), ()], [(4, 8)], {}),
    "Range": ([(), (), ()], [(8,)], {}),
    "Reciprocal": ([(4, 8)], [(4, 8)], {}),
    "ReduceMax": ([(4, 8)], [(4, 1)], {"axes": [1]}),
    "ReduceMean": ([(4, 8)], [(4, 1)], {"axes": [1]}),
    "ReduceSum": ([(4, 8), (1,)], [(4, 1)], {}),
    "Relu": ([(4, 8)], [(4, 8)], {}),
    "Reshape": ([(4, 8), (2,)], [(8, 4)], {}),
    "ScatterND": ([(8, 4), (2, 1), (2, 4)], [(8, 4)], {}),
    "Shape": ([(4, 8)], [(2,)], {}),
    "Sigmoid": ([(4, 8)], [(4, 8)], {}),
    "Sin": ([(4, 8)], [(4, 8)], {}),
    "Cos": ([(4, 8)], [(4, 8)], {}),
    "Slice": ([(4, 8), (1,), (1,)], [(4, 4)], {}),
    "Softmax": ([(4, 8)], [(4, 8)], {}),
    "Split": ([(4, 8)], [(4, 4), (4, 4)], {"axis": 1}),
    "Sqrt": ([(4, 8)], [(4, 8)], {}),
    "Squeeze": ([(4, 1, 8)], [(4, 8)], {}),
    "Sub": ([(4, 8), (4, 8)], [(4, 8)], {}),
    "Tanh": ([(4, 8)], [(4, 8)], {}),
    "Tile": ([(4, 8), (2,)], [(8, 8)], {}),
    "TopK": ([(4, 8), (1,)], [(4, 2), (4, 2)], {}),
    "Transpose": ([(4, 8)], [(8, 4)], {"perm": [1, 0]}),
    "Trilu": ([(8, 8)], [(8, 8)], {}),
    "Unsqueeze": ([(4, 8)], [(4, 1, 8)], {}),
    "Where": ([(4, 8), (4, 8), (4, 8)], [(4, 8)], {}),
}


@pytest.mark.parametrize("op_type", sorted(COVERAGE))
def test_every_required_op_type_has_a_rule(op_type):
    inputs, outputs, attrs = COVERAGE[op_type]
    assert rule_for(op_type) is not None, op_type
    result = apply_rule(ctx(op_type, inputs, outputs, attrs=attrs))
    assert result.kind != "opaque", result.note
    assert not result.warning
    dim_names = {d.name for d in result.dims}
    for _, axes in result.inputs + result.outputs:
        assert all(name in dim_names for axis in axes for name in axis)


def test_coverage_list_is_registered():
    assert set(COVERAGE) <= set(OP_RULES)


class TestOpaque:
    def test_unknown_op_is_replicated_with_a_warning(self):
        result = apply_rule(ctx("FancyAttention", [(4, 8)], [(4, 8)], domain="acme"))
        assert result.kind == "opaque"
        assert all(not d.splittable for d in result.dims)
        assert result.inputs == ((0, ((), ())),)
        assert "acme:FancyAttention" in result.warning and "n_FancyAttention" in result.warning

    def test_malformed_node_does_not_crash(self):
        # A Conv whose weight has no shape: the rule fails, the node becomes opaque.
        result = apply_rule(ctx("Conv", [(1, 3, 8, 8), None], [(1, 4, 6, 6)]))
        assert result.kind == "opaque"
        assert "could not be analysed" in result.warning

    def test_opaque_rule_directly(self):
        assert opaque_rule(ctx("X", [], [(3,)])).flops == 3.0
