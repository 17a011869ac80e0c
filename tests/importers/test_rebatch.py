"""``importers.rebatch``: a graph moved to another batch equals the file imported at that batch,
wherever the two-point check accepts the model; the check refuses models whose batch hides in a
dim the importer does not mark (DeBERTa's position table repeated over a folded batch x heads axis).
BERT's token-type lookup, whose all-zero ids are a constant expanded over the batch, is marked since
importers.shape_batch.generated_batch_dims, so it moves too."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from importers import batch_dim_name
from importers.rebatch import _comparable, rebatch, scales_linearly
from planner.pricing import load_graph

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["examples/gpt2.onnx", "examples/resnet.onnx", "tests/data/llama_tiny.onnx", "tests/data/mixtral_tiny.onnx",
          "tests/data/vit_tiny.onnx", "tests/data/lstm_lm.onnx", "tests/data/bert_tiny_ts.onnx"]
DIMS = {"seq": 32, "tgt_seq": 32}


def _at(path: Path, batch: int):
    return load_graph(path, {**DIMS, batch_dim_name(path): batch})


@pytest.mark.parametrize("name", MODELS)
def test_a_moved_graph_equals_the_imported_one(name):
    path = ROOT / name
    batch_dim = batch_dim_name(path)
    two, six, twelve = _at(path, 2), _at(path, 6), _at(path, 12)
    assert scales_linearly(two, six, batch_dim=batch_dim)
    moved = rebatch(two, batch_dim=batch_dim, batch=12)
    assert _comparable(moved) == _comparable(twelve)
    assert all(math.isclose(a.flops, b.flops, rel_tol=1e-12) for a, b in zip(moved.ops, twelve.ops))
    assert moved.dim_bindings[batch_dim] == 12


def test_a_batch_the_importer_does_not_mark_is_refused():
    path = ROOT / "tests/zoo/deberta_v2_ts_bare.onnx"
    batch_dim = batch_dim_name(path)
    assert not scales_linearly(_at(path, 2), _at(path, 6), batch_dim=batch_dim)


def test_batch_one_is_never_reached_by_moving():
    path = ROOT / "tests/data/gpt2_tiny.onnx"
    two = _at(path, 2)
    assert rebatch(two, batch_dim="batch", batch=1) is None
    assert rebatch(_at(path, 1), batch_dim="batch", batch=4) is None


def test_the_loader_moves_only_after_the_check(monkeypatch):
    import planner.pipeline as pipeline

    imported = []
    real = pipeline.load_graph
    monkeypatch.setattr(pipeline, "load_graph", lambda p, dims: imported.append(dims["batch"]) or real(p, dims))
    loader = pipeline.graph_loader(ROOT / "tests/data/gpt2_tiny.onnx", DIMS)
    for batch in (8, 4, 16, 2, 1, 32):
        loader(batch)
    assert imported == [8, 4, 1]  # the first, the check, and batch 1
    unchecked = pipeline.graph_loader(ROOT / "tests/data/gpt2_tiny.onnx", DIMS, rebatch=False)
    imported.clear()
    for batch in (8, 4, 16):
        unchecked(batch)
    assert imported == [8, 4, 16]
