"""A norm's epsilon read from the file (:mod:`importers.norm_eps`): a fused norm's ``epsilon``
attribute, a decomposed RMSNorm's ``ReduceMean -> Add(eps)`` with the scalar as a ``Constant`` node
or an initializer, nothing where the scalar is not in the file. The fixtures' values are their
transformers configs' defaults: ``Qwen3Config.rms_norm_eps`` 1e-6, ``Olmo2Config.rms_norm_eps`` 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers.norm_eps import norm_epsilons
from planner.plan import load_graph

DATA = Path(__file__).resolve().parents[1] / "exporters" / "data"
HIDDEN = 8


def _norms(graph) -> list[int]:
    return [i for i, op in enumerate(graph.ops) if op.kind == "norm"]


def _save(path: Path, nodes, initializers, inputs=()) -> Path:
    """``x -> nodes -> y -> MatMul -> z`` (the projection gives the norm a consumer, as in a model)."""
    mm = numpy_helper.from_array(np.ones((HIDDEN, HIDDEN), np.float32), "mm")
    nodes = [*nodes, helper.make_node("MatMul", ["y", "mm"], ["z"], name="proj")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", HIDDEN]), *inputs],
                              [helper.make_tensor_value_info("z", T.FLOAT, ["batch", HIDDEN])],
                              initializer=[*initializers, mm])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _rms_nodes(eps_name: str) -> list:
    """Hugging Face's RMSNorm as the TorchScript exporter writes it: x * 1/sqrt(mean(x^2) + eps) * w."""
    return [
        helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", T.FLOAT, [], [2.0])),
        helper.make_node("Pow", ["x", "two"], ["sq"], name="pow"),
        helper.make_node("ReduceMean", ["sq"], ["mean"], name="mean", axes=[-1], keepdims=1),
        helper.make_node("Add", ["mean", eps_name], ["var"], name="add"),
        helper.make_node("Sqrt", ["var"], ["root"], name="sqrt"),
        helper.make_node("Reciprocal", ["root"], ["inv"], name="inv"),
        helper.make_node("Mul", ["x", "inv"], ["normed"], name="mul"),
        helper.make_node("Mul", ["normed", "w"], ["y"], name="scale"),
    ]


def _weight():
    return numpy_helper.from_array(np.ones(HIDDEN, np.float32), "w")


def test_a_fused_layernorm_attribute(tmp_path):
    bias = numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "b")
    node = helper.make_node("LayerNormalization", ["x", "w", "b"], ["y"], name="ln", axis=-1, epsilon=1e-5)
    graph = load_graph(_save(tmp_path / "ln.onnx", [node], [_weight(), bias]), {"batch": 4})
    assert norm_epsilons(graph, _norms(graph)) == (1e-5,)


def test_a_decomposed_rmsnorm_with_a_constant_node(tmp_path):
    eps = helper.make_node("Constant", [], ["eps"], value=helper.make_tensor("eps", T.FLOAT, [], [1e-6]))
    graph = load_graph(_save(tmp_path / "rms.onnx", [eps, *_rms_nodes("eps")], [_weight()]), {"batch": 4})
    (norm,) = _norms(graph)
    assert norm_epsilons(graph, [norm]) == (1e-6,)  # float32 1e-6 reads 9.99999997e-07, shown as written


def test_a_decomposed_rmsnorm_with_an_initializer(tmp_path):
    eps = numpy_helper.from_array(np.array(3e-5, np.float32), "eps")  # the dynamo exporter's scalar
    graph = load_graph(_save(tmp_path / "rms.onnx", _rms_nodes("eps"), [_weight(), eps]), {"batch": 4})
    assert norm_epsilons(graph, _norms(graph)) == (3e-5,)


def test_an_epsilon_not_in_the_file_is_not_read(tmp_path):
    """The scalar stored outside the file (a stripped external tensor): no value, not a guess."""
    eps = numpy_helper.from_array(np.array(1e-6, np.float32), "eps")
    eps.ClearField("raw_data")
    eps.data_location = onnx.TensorProto.EXTERNAL
    eps.external_data.add(key="location", value="missing.data")
    graph = load_graph(_save(tmp_path / "rms.onnx", _rms_nodes("eps"), [_weight(), eps]), {"batch": 4})
    assert _norms(graph) and norm_epsilons(graph, _norms(graph)) is None


def test_a_graph_without_its_file_reads_nothing(tmp_path):
    eps = numpy_helper.from_array(np.array(1e-6, np.float32), "eps")
    path = _save(tmp_path / "rms.onnx", _rms_nodes("eps"), [_weight(), eps])
    graph = load_graph(path, {"batch": 4})
    path.unlink()
    assert norm_epsilons(graph, _norms(graph)) is None


@pytest.mark.parametrize(("name", "eps"), [("qwen3_tiny", 1e-6), ("olmo2_tiny", 1e-5), ("gemma3_tiny", 1e-6)])
def test_the_fixtures(name, eps):
    graph = load_graph(DATA / f"{name}.onnx", {"batch": 2, "seq": 16})
    assert norm_epsilons(graph, _norms(graph)) == (eps,)
