"""``import_model`` keeps the graphs it imported (``importers.CACHED_GRAPHS``), keyed by the file as it is on
disk: the same file at the same dims gives the same graph object; a file rewritten, touched, or read at other
dims is imported again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import importers
from importers import import_model

ROOT = Path(__file__).resolve().parents[2]


def _mlp(path: Path, name: str = "fc", width: int = 32) -> None:
    """``x [batch, 16] -> MatMul(16 x width) -> Relu``: 16 x ``width`` parameters."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])
    w = helper.make_tensor("fc.weight", TensorProto.FLOAT, [16, width], [0.5] * (16 * width))
    nodes = [helper.make_node("MatMul", ["x", "fc.weight"], ["h"], name=name), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def _matmul(graph) -> tuple[str, list[tuple[str, int]]]:
    op = next(op for op in graph.ops if op.kind == "matmul")
    return op.name, [(d.name, d.size) for d in op.dims]


def test_the_same_file_at_the_same_dims_is_imported_once(tmp_path):
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    first = import_model(path, {"batch": 8})
    assert import_model(path, {"batch": 8}) is first
    assert import_model(str(path), {"batch": 8}) is first  # the same path, as a string
    assert first.parameter_count == 16 * 32
    # other dims: another graph (m = batch rows)
    other = import_model(path, {"batch": 4})
    assert other is not first and _matmul(other) == ("fc", [("m", 4), ("n", 32), ("k", 16)])


def test_a_touched_file_is_imported_again(tmp_path):
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    first = import_model(path, {"batch": 8})
    status = path.stat()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))  # 1 ms later, same bytes
    again = import_model(path, {"batch": 8})
    assert again is not first and again == first


def test_a_file_rewritten_in_place_is_imported_again_even_at_the_same_size_and_time(tmp_path):
    path = tmp_path / "mlp.onnx"
    _mlp(path, name="fc")
    first = import_model(path, {"batch": 8})
    status = path.stat()
    _mlp(path, name="gc")  # one node renamed: the same size, other bytes
    assert path.stat().st_size == status.st_size
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))  # as if written within one timestamp tick
    again = import_model(path, {"batch": 8})
    assert _matmul(first)[0] == "fc" and _matmul(again)[0] == "gc"
    _mlp(path, width=64)  # wider: 16 x 64 parameters
    assert import_model(path, {"batch": 8}).parameter_count == 1024


def test_another_path_to_the_same_bytes_is_its_own_graph(tmp_path):
    """The graph names its file (``source_path``, ``name``): a copy is another key."""
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    copy = tmp_path / "copy.onnx"
    shutil.copy(path, copy)
    first, second = import_model(path, {"batch": 8}), import_model(copy, {"batch": 8})
    assert (first.name, second.name) == ("mlp", "copy")
    assert second.source_path == str(copy) and second.source_sha256 == first.source_sha256


def test_only_the_last_graphs_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(importers, "CACHED_GRAPHS", 2)
    path = tmp_path / "mlp.onnx"
    _mlp(path)
    graphs = [import_model(path, {"batch": batch}) for batch in (1, 2, 3)]
    assert import_model(path, {"batch": 3}) is graphs[2] and import_model(path, {"batch": 2}) is graphs[1]
    assert import_model(path, {"batch": 1}) is not graphs[0]  # the least recently used, dropped


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_named_pipe_is_not_opened_to_key_it(tmp_path):
    from planner.core.errors import ModelError

    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    with pytest.raises(ModelError, match="not a regular file"):  # the loader's refusal, without blocking
        import_model(fifo, {"batch": 8})
