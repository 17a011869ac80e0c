"""A static-shape dynamo export of DeBERTa-v2 counts as torch does (issue 25).

With no dynamic axes the dynamo exporter's optimizer folds the all-ones attention mask that
``DebertaV2Embeddings`` multiplies the embeddings by into a float initializer ``unsqueeze`` [2, 16, 1],
which the importer counted as a named scale (+32 over torch's count). Its
``pkg.onnxscript.optimizer.folded_from`` record names no parameter, so it is a constant now
(``importers.param_evidence._folded_from_no_parameter``). The model is the mesh-TF integration test's
(``built`` fixture: 2 layers, hidden 48, 6 heads, weights perturbed); the committed fixture
``tests/data/deberta_static`` (``tests/importers/make_deberta_static.py``) holds the same count for the
unit run.
"""

from __future__ import annotations

import pytest

from importers import import_model
from tests.integration.test_mesh_tf_deberta import CONFIG, SEQ, built  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_the_static_dynamo_file_counts_as_torch(built, tmp_path):
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    import onnx
    import torch

    model = built[0]
    ids = torch.randint(3, CONFIG["vocab_size"], (2, SEQ))
    path = tmp_path / "deberta_static_dynamo.onnx"
    torch.onnx.export(model, (ids,), str(path), input_names=["input_ids"], output_names=["logits"], dynamo=True)
    mask = next(i for i in onnx.load(str(path), load_external_data=False).graph.initializer if i.name == "unsqueeze")
    assert list(mask.dims) == [2, SEQ, 1]  # the folded mask is there, batch x sequence x 1 = 32 elements
    graph = import_model(path, {})
    assert graph.parameter_count == sum(p.numel() for p in model.parameters()) == 100_504, graph.warnings
