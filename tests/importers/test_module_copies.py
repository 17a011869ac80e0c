"""importers.parameters._find_module_copies: one ``nn.Linear`` called twice reads one weight.

torch 2.13's dynamo exporter folds the weight's ``Transpose`` of each call into its own ``val_N``
(ALBERT's shared layer, applied twice: 6 copies of 32,768 elements in a 2-layer export). Every count
below is worked out by hand from the initializers' shapes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from tests.importers.graph_checks import check_graph

_LINEAR = "torch.nn.modules.linear.Linear"


def _weight(name: str, seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal((8, 8)).astype(np.float32), name)


def _matmul(x: str, w: str, y: str, module: str, cls: str, call: str) -> onnx.NodeProto:
    """A MatMul as the dynamo exporter writes it inside ``module`` (of class ``cls``)."""
    node = helper.make_node("MatMul", [x, w], [y], name=f"node_{y}")
    helper.set_metadata_props(node, {
        "pkg.torch.onnx.name_scopes": str(["", "enc", module, call]),
        "namespace": f": Model/enc: Encoder/{module}: {cls}/{call}: aten.linear.default",
    })
    return node


def _import(tmp_path: Path, second_module: str, cls: str = _LINEAR, *, same_values: bool = True):
    """x -> Linear -> Linear (``second_module``), weights ``val_1`` and ``val_2`` [8, 8] the exporter made."""
    nodes = [_matmul("x", "val_1", "h", "enc.layer.q", cls, "linear"),
             _matmul("h", "val_2", "y", second_module, cls, "linear_1")]
    inits = [_weight("val_1", 0), _weight("val_2", 0 if same_values else 1)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", T.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 8])], initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    result = import_model(path, {})
    assert check_graph(result) == []
    return result


def test_copies_read_by_one_linear_are_counted_once(tmp_path: Path) -> None:
    graph = _import(tmp_path, "enc.layer.q")
    assert graph.parameter_count == 8 * 8  # one [8, 8] weight, not two
    # Both MatMuls read the kept weight, as a TorchScript export's shared initializer is read.
    reads = sorted(a.tensor for op in graph.ops if op.kind == "matmul" for a in op.inputs if a.tensor.startswith("val_"))
    assert reads == ["val_1", "val_1"]
    assert any("'val_2' of 'val_1'" in w and "(64 elements not counted again)" in w for w in graph.warnings)
    # Both calls still train the weight: 2 x 8 x 8 x 2 forward FLOPs each, x3 with backward.
    assert graph.training_flops() == 2 * (2 * 2 * 8 * 8) * 3


def test_two_linears_keep_their_weights(tmp_path: Path) -> None:
    assert _import(tmp_path, "enc.layer.k").parameter_count == 2 * 8 * 8


def test_a_module_of_several_weights_keeps_them(tmp_path: Path) -> None:
    """A custom module may read two matrices of one shape in one call: no proof they are one."""
    assert _import(tmp_path, "enc.layer.q", "my.Block").parameter_count == 2 * 8 * 8


def test_different_values_are_different_weights(tmp_path: Path) -> None:
    assert _import(tmp_path, "enc.layer.q", same_values=False).parameter_count == 2 * 8 * 8
