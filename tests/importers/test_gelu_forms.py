"""Issue 25: which GELU a fused GELU node computes (:mod:`importers.gelu_form`,
:func:`importers.layer_features.mlp_activation_of`).

ONNX's ``Gelu`` (opset 20) computes erf GELU or, with ``approximate="tanh"``, its tanh approximation; torch's
dynamo exporter at opset 20 writes ``F.gelu(x, approximate="tanh")`` (transformers' ``gelu_pytorch_tanh``) as
one such node. By node type alone both were ``gelu``, which the exporters train as erf. The files are
``tests/data/gelu_cases/`` (``tests/importers/make_gelu_cases.py``: transformers 5.24, torch 2.13, opset 20);
the oracle is each file's protobuf, its ``Gelu`` nodes' attribute read here with ``onnx`` alone
(:func:`_approximations`), and the onnxruntime contrib ops are hand-built graphs whose meaning is onnxruntime's
``docs/ContribOperators.md`` (``FastGelu``: ``0.5 x (1 + tanh(0.797885 x + 0.035677 x^3))``; ``BiasGelu``:
erf ``Gelu(A + B)``; ``QuickGelu``: ``x sigmoid(alpha x)``, alpha 1.702).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from exporters.megatron.families import _head_transform, family_notes, megatron_family
from importers.layer_features import mlp_activation, mlp_activation_of
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "gelu_cases"
DIMS = {"batch": 2, "seq": 16}


def _approximations(path: Path) -> Counter:
    """``Gelu`` nodes of the file by their ``approximate`` attribute (``"none"`` when absent, its default)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return Counter(next((a.s.decode() for a in n.attribute if a.name == "approximate"), "none")
                   for n in graph.node if n.op_type == "Gelu")


@pytest.mark.parametrize(("name", "gelus", "expected"), [
    # 2 MLPs + the MLM head's transform (BertPredictionHeadTransform: ACT2FN[hidden_act]); no Tanh, no Erf
    ("bert_gelu_tanh_dynamo20_bare.onnx", Counter(tanh=3), "gelu-tanh"),
    ("bert_gelu_dynamo20_bare.onnx", Counter(none=3), "gelu-erf"),
    # GPT2MLP: act(c_fc(x)) in each of 2 layers; the LM head has no transform
    ("gpt2_gelu_tanh_dynamo20_bare.onnx", Counter(tanh=2), "gelu-tanh"),
])
def test_the_mlp_activation_is_the_gelu_nodes_attribute(name: str, gelus: Counter, expected: str) -> None:
    path = CASES / name
    assert _approximations(path) == gelus
    graph = load_graph(path, DIMS)
    assert not {"Tanh", "Erf"} & set(graph.raw_op_types)  # told by the attribute alone
    assert analyze_transformer(graph).features.mlp_activation == expected


@pytest.mark.parametrize(("name", "expected"), [("bert_gelu_tanh_dynamo20_bare.onnx", "gelu-tanh"),
                                                ("bert_gelu_dynamo20_bare.onnx", "gelu-erf")])
def test_the_bert_head_transform_reads_its_gelu(name: str, expected: str) -> None:
    graph = load_graph(CASES / name, DIMS)
    linear, activation = _head_transform(graph, analyze_transformer(graph))
    assert linear is not None and activation == expected


def test_megatron_refuses_the_tanh_head_file_as_its_erf_twin() -> None:
    # BertLMHead applies F.gelu (erf), megatron-core 0.16.1 models/bert/bert_lm_head.py:42: a tanh head is
    # trained as erf with a note, as the MLPs' (family_notes); post-LN and token types refuse both files alike
    messages = []
    for name in ("bert_gelu_tanh_dynamo20_bare.onnx", "bert_gelu_dynamo20_bare.onnx"):
        graph = load_graph(CASES / name, DIMS)
        with pytest.raises(UnsupportedExport) as caught:
            megatron_family(graph, analyze_transformer(graph))
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "tanh" not in messages[0]


def test_megatron_notes_the_gpt2_tanh_mlp() -> None:
    graph = load_graph(CASES / "gpt2_gelu_tanh_dynamo20_bare.onnx", DIMS)
    model = analyze_transformer(graph)
    notes = family_notes(megatron_family(graph, model), [], mlp_activation=model.features.mlp_activation)
    assert len(notes) == 1 and notes[0].startswith("the model's MLP uses GELU's tanh approximation")


def _contrib(op_type: str, path: Path, **attributes: object) -> tuple[object, list[int]]:
    """A hand-built ``MatMul -> com.microsoft op_type -> MatMul`` file at ``path``, its op graph and its ops."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node(op_type, ["h", "b1"] if op_type == "BiasGelu" else ["h"], ["a"], name="act",
                              domain="com.microsoft", **attributes),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2")]
    weights = [numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in (("w1", (8, 16)), ("b1", (16,)),
                                                                                  ("w2", (16, 8)))]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 8])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20),
                                                      helper.make_opsetid("com.microsoft", 1)]), path)
    loaded = load_graph(path, {"batch": 4})
    return loaded, list(range(len(loaded.ops)))


@pytest.mark.parametrize(("op_type", "attributes", "expected"), [
    ("FastGelu", {}, "gelu-tanh"), ("BiasGelu", {}, "gelu-erf"), ("Gelu", {}, "gelu-erf"),
    ("QuickGelu", {"alpha": 1.702}, "scaled-sigmoid"),
])
def test_onnxruntime_contrib_gelus(tmp_path: Path, op_type: str, attributes: dict, expected: str) -> None:
    graph, indices = _contrib(op_type, tmp_path / "m.onnx", **attributes)
    assert any(op_type in op.node_types for op in graph.ops)
    assert mlp_activation_of(graph, indices) == expected


def test_without_a_file_a_gelu_stays_unread() -> None:
    # a hand-built op graph has no file: the type alone says GELU, not which one
    assert mlp_activation(("MatMul", "Add", "Gelu")) == "gelu"
    assert mlp_activation(("MatMul", "FastGelu")) == "gelu-tanh"


def _run_one(op_type: str, domain: str, x: np.ndarray, **attributes: object) -> np.ndarray:
    """``op_type`` applied to ``x`` (and a zero bias for ``BiasGelu``) by onnxruntime."""
    import onnxruntime

    inputs = ["x", "b"] if op_type == "BiasGelu" else ["x"]
    node = helper.make_node(op_type, inputs, ["y"], domain=domain, **attributes)
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", T.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", T.FLOAT, list(x.shape))],
                              [numpy_helper.from_array(np.zeros(x.shape[-1:], np.float32), "b")][: len(inputs) - 1])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize(("op_type", "domain", "attributes", "form"), [
    ("Gelu", "", {"approximate": "tanh"}, "gelu-tanh"), ("Gelu", "", {}, "gelu-erf"),
    ("FastGelu", "com.microsoft", {}, "gelu-tanh"), ("BiasGelu", "com.microsoft", {}, "gelu-erf"),
    ("Gelu", "com.microsoft", {}, "gelu-erf"),
])
def test_each_form_is_what_onnxruntime_computes(op_type: str, domain: str, attributes: dict, form: str) -> None:
    # the two GELUs by their formulas (Hendrycks & Gimpel 2016, eq. 1 and its tanh approximation) differ most
    # near x = -2.70, by 4.7e-4: far above float32 rounding there (~1e-8), so onnxruntime's output tells them apart
    x = np.array([-2.70, -1.0, 0.5, 2.0], np.float64)
    erf = 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))
    tanh = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert abs(erf[0] - tanh[0]) > 4.6e-4
    y = _run_one(op_type, domain, x.astype(np.float32), **attributes)
    assert np.allclose(y, tanh if form == "gelu-tanh" else erf, atol=1e-5)
    assert not np.allclose(y, erf if form == "gelu-tanh" else tanh, atol=1e-5)


def test_quick_gelu_is_a_scaled_sigmoid() -> None:
    x = np.array([-2.0, 0.5, 3.0], np.float64)
    y = _run_one("QuickGelu", "com.microsoft", x.astype(np.float32), alpha=1.702)
    assert np.allclose(y, x / (1 + np.exp(-1.702 * x)), atol=1e-5)
