"""Cohere and Phi-3 (issue 25: "every architecture people train is understood"), and the two shape rules
their first exports broke.

* An empty activation that only feeds a Concat is legal (ONNX Concat takes empty operands): Phi-3's
  full-width rotary slices its pass-through half ``q[..., 16:]`` to ``[b, h, s, 0]`` and concatenates it
  back. :func:`importers.shapes.resolve_shapes` used to refuse every zero dim; it now keeps such a value
  out of the model it returns (the Concat reads the other operand alone) and still refuses one that
  reaches a MatMul or an output.
* A Reshape whose computed output holds another element count than its input (the TorchScript
  exporter's ``repeat_interleave(dim=-1)`` rewrite of a shared ``-1`` in Cohere's q/k/v views) is
  named in a warning, and cited by the later error it causes.

The files are ``tests/importers/make_unseen_cases.py``'s (graph-only TorchScript exports of transformers'
``CohereForCausalLM`` and ``Phi3ForCausalLM``, torch's parameter counts in ``counts.json``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from importers import import_model
from importers.shapes import resolve_shapes
from importers.transformer import analyze_transformer
from planner.core.errors import ModelError

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "unseen_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())
OPSET = [helper.make_opsetid("", 17)]
INT64_MAX = np.iinfo(np.int64).max


def _rotary_concat(consumer: str = "Concat") -> onnx.ModelProto:
    """x [b, 4, s, 16] -> rot = x[..., :16] * 2, pass = x[..., 16:] (empty) -> Concat(rot, pass) or
    MatMul(pass, w) when ``consumer`` says so; INT64_MAX end as torch writes ``x[..., 16:]``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, "seq", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([16], np.int64), "rot"),
        numpy_helper.from_array(np.array([INT64_MAX], np.int64), "end"),
        numpy_helper.from_array(np.array([3], np.int64), "axis"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.ones((0, 8), np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Slice", ["x", "zero", "rot", "axis"], ["q_rot"], name="slice_rot"),
        helper.make_node("Slice", ["x", "rot", "end", "axis"], ["q_pass"], name="slice_pass"),
        helper.make_node("Mul", ["q_rot", "two"], ["rotated"], name="rotate"),
        helper.make_node("Concat", ["rotated", "q_pass"], ["y"], name="concat", axis=-1)
        if consumer == "Concat" else helper.make_node("MatMul", ["q_pass", "w"], ["y"], name="matmul"),
    ]
    graph = helper.make_graph(nodes, "rotary", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=OPSET)


def test_an_empty_pass_through_half_is_shaped_as_onnx_and_onnxruntime_do():
    model = _rotary_concat()
    shaped = resolve_shapes(model, {"batch": 2, "seq": 8})
    # ONNX Slice clamps the INT64_MAX end to the axis size 16, so [16:16] is empty; Concat adds 16 + 0.
    concrete = onnx.shape_inference.infer_shapes(
        helper.make_model(helper.make_graph(
            list(model.graph.node), "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 16])],
            list(model.graph.output), initializer=list(model.graph.initializer)), opset_imports=OPSET))
    inferred = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) for vi in concrete.graph.value_info}
    assert inferred["q_pass"] == (2, 4, 8, 0)
    x = np.random.default_rng(0).standard_normal((2, 4, 8, 16)).astype(np.float32)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert shaped.shapes["y"] == y.shape == (2, 4, 8, 16)
    np.testing.assert_allclose(y, 2 * x)
    # The empty value and its Slice are gone from the returned model; the Concat, left with one
    # operand, is an Identity of it. The caller's model is untouched.
    assert "q_pass" not in shaped.shapes
    ops = {node.name: (node.op_type, list(node.input)) for node in shaped.model.graph.node}
    assert "slice_pass" not in ops and ops["concat"] == ("Identity", ["rotated"])
    assert [node.op_type for node in model.graph.node] == ["Slice", "Slice", "Mul", "Concat"]


def test_an_empty_activation_that_reaches_a_matmul_is_still_refused():
    with pytest.raises(ModelError, match=r"value 'q_pass' \(Slice node 'slice_pass'\) has computed shape "
                                         r"\[2, 4, 8, 0\] with a zero or negative dim"):
        resolve_shapes(_rotary_concat("MatMul"), {"batch": 2, "seq": 8})


def _baked_reshape(tmp_path: Path) -> Path:
    """h [b, s, 64] -> Reshape to [b, s, 2, 16] (the Cohere exporter bug: 2 where -1 was) -> MatMul
    with a [16, 64] weight after merging the heads back: [b, s, 32] @ [64, 64] does not fit."""
    h = helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", "seq", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [
        numpy_helper.from_array(np.array([2, 16], np.int64), "heads"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), "merged"),
        helper.make_tensor("o_proj", TensorProto.FLOAT, [64, 64], np.zeros(64 * 64, np.float32)),
    ]
    nodes = [
        helper.make_node("Shape", ["h"], ["shape"], name="shape", end=2),
        helper.make_node("Concat", ["shape", "heads"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["h", "target"], ["q"], name="view_q"),
        helper.make_node("Reshape", ["q", "merged"], ["attn"], name="merge"),
        helper.make_node("MatMul", ["attn", "o_proj"], ["y"], name="o_proj"),
    ]
    path = tmp_path / "baked.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [h], [y], initializer=inits), opset_imports=OPSET), path)
    return path


def test_a_reshape_that_changes_the_element_count_is_named(tmp_path):
    path = _baked_reshape(tmp_path)
    shaped = resolve_shapes(onnx.load(path), {"batch": 2, "seq": 8})
    # 2 x 8 x 64 = 1,024 elements in, 2 x 8 x 2 x 16 = 512 out
    assert shaped.shapes["q"] == (2, 8, 2, 16)
    assert any("Reshape node 'view_q' turns [2, 8, 64] (1,024 elements) into [2, 8, 2, 16] (512 elements)" in w
               for w in shaped.warnings)
    with pytest.raises(ModelError, match=r"operands \[2, 8, 32\] and \[64, 64\] do not fit.*; first cause: "
                                         r"Reshape node 'view_q' turns \[2, 8, 64\]") as exc:
        import_model(path, {"batch": 2, "seq": 8})
    assert "\n" not in str(exc.value)


def _files(case: str) -> list[str]:
    return [name for name, record in sorted(COUNTS["files"].items()) if record["case"] == case]


@pytest.mark.parametrize("name", _files("cohere") + _files("phi3"))
def test_cohere_and_phi3_import_with_torchs_parameter_count(name):
    record = COUNTS["files"][name]
    graph = import_model(CASES / name, {"batch": 2, "seq": 16})
    assert graph.parameter_count == record["param_count"]
    # by hand (config: hidden 64, 4 heads over 2 key/value groups of 16, ffn 128, vocab 96, 2 layers,
    # untied head): embed 96*64 + head 64*96; q 64*64, k and v 64*32 each, o 64*64, gate and up
    # 64*128 each, down 128*64; Cohere: one bias-free LayerNorm per layer + the final one; Phi-3: two
    # RMSNorms per layer + the final one
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    norms = {"cohere": 2 + 1, "phi3": 2 * 2 + 1}[record["case"]]
    assert record["param_count"] == 2 * 96 * 64 + 2 * layer + norms * 64
    model = analyze_transformer(graph)
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_query_groups,
            model.head_dim, model.ffn_hidden_size, model.gated_mlp) == (2, 64, 4, 2, 16, 128, True)
    # Cohere runs attention and MLP on the same normed input (Megatron's GPT layer cannot); Phi-3 is pre-LN
    assert model.features.parallel_residual == (record["case"] == "cohere")
    # Cohere's norm is a LayerNorm without a bias (one parameter, but it centres its input): not RMSNorm
    assert model.normalization == {"cohere": "LayerNorm", "phi3": "RMSNorm"}[record["case"]]


def test_the_exporter_bug_cohere_file_is_refused_at_its_first_wrong_reshape():
    (name,) = _files("cohere_tsbug")
    with pytest.raises(ModelError, match=r"o_proj/MatMul': operands \[2, 16, 2\] and \[64, 64\] do not fit.*"
                                         r"first cause: Reshape node '/model/model/layers.0/self_attn/Reshape' "
                                         r"turns \[2, 16, 64\] \(2,048 elements\) into \[2, 16, 2, 16\]"):
        import_model(CASES / name, {"batch": 2, "seq": 16})
