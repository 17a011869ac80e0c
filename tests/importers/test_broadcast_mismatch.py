"""A broadcasting node whose inputs do not broadcast is named as the cause of the shapes left out (issue 25,
task h26f).

PatchTST's TorchScript file (transformers 5.24, torch 2.13): the exporter writes ``x.unfold(-2, 8, 8)`` of the
scaled series ``[b, 64, 7]`` as slices unsqueezed and concatenated at axis -2 of 4-D windows, so after the model's
``transpose(-2, -3)`` the patches read ``[b, 8 patches, 7 channels, 8]`` (onnxruntime on the export: ``(2, 8, 7,
8)``; torch: ``(2, 7, 8, 8)``), and the position table ``[8, 64]`` meets ``[b, 8, 7, 64]``. The importer left the
109 values after that Add out ("could not compute the shapes") and all 17 MatMuls opaque without saying why; the
twin is that Add, written by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model


def _model(tmp_path: Path, embedded: list[int]) -> Path:
    """``x`` ``embedded`` + ``position_enc`` [8, 64], then @ ``w`` [64, 64]."""
    table = numpy_helper.from_array(np.zeros((8, 64), np.float32), "position_enc")
    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "position_enc"], ["h"], name="positional_encoder/Add"),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="proj/MatMul")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, embedded)],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)], [table, weight])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_inputs_that_do_not_broadcast_are_named(tmp_path):
    graph = import_model(_model(tmp_path, [2, 8, 7, 64]), {})
    said = [w for w in graph.warnings if "do not broadcast" in w]
    assert said == ["Add node 'positional_encoder/Add' reads [2, 8, 7, 64] and [8, 64], which do not broadcast (each "
                    "axis, aligned from the right, equal or 1); the file's shapes are inconsistent at these dims"]


def test_inputs_that_broadcast_say_nothing(tmp_path):
    graph = import_model(_model(tmp_path, [2, 7, 8, 64]), {})  # torch's order: [b, channels, patches, d]
    assert not [w for w in graph.warnings if "broadcast" in w] and not graph.opaque_ops
