"""The importer counts a DeBERTa-v2 with its own position projections as torch does (issue 25).

transformers 5.24's ``DebertaV2ForMaskedLM`` with ``share_att_key=False`` gives each layer a
``pos_key_proj`` and a ``pos_query_proj`` that project ``LayerNorm(rel_embeddings)``, which reads no graph
input (``importers.parameters._trained_through_parameters``). The model is the mesh-TF integration test's
(``tests/integration/test_mesh_tf_deberta.py``'s ``built`` fixture: 2 layers, hidden 48, 6 heads of 8, 16
position buckets, weights perturbed so TorchScript folds no equal initializers, exported by TorchScript
with the weights); it is exported by dynamo here too, and the importer's count is held to
``sum(p.numel() for p in model.parameters())``. With the values in the file the TorchScript LM head's
transposed copy of the tied word table is proven and counted once, so both counts are exact (before the
rule: dynamo 91,288, which is 100,504 - 4 x 48 x 48). The dynamo export has dynamic batch and sequence
axes, as the zoo's: a static one folds DeBERTa's all-ones input mask into a float initializer named after
its FX node (``unsqueeze`` [2, 16, 1]), which the importer counted as a named scale (+32) until its
``folded_from`` record was read (``tests/integration/test_deberta_static_count.py``).
"""

from __future__ import annotations

import pytest

from importers import import_model
from tests.integration.test_mesh_tf_deberta import CONFIG, SEQ, built  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def test_torchs_count_holds_the_projections(built):
    model = built[0]
    own = sum(p.numel() for n, p in model.named_parameters() if ".pos_key_proj." in n or ".pos_query_proj." in n)
    # 2 layers x 2 projections x (48 x 48 weight + 48 bias), of torch's 100,504
    assert own == 2 * 2 * (48 * 48 + 48) == 9_408
    assert sum(p.numel() for p in model.parameters()) == 100_504


def test_the_torchscript_file_counts_as_torch(built):
    model, graph = built[0], built[1]
    assert graph.parameter_count == sum(p.numel() for p in model.parameters()), graph.warnings


def test_the_dynamo_file_counts_as_torch(built, tmp_path):
    # torch's dynamo exporter needs onnxscript, which the examples' environment installs and the
    # integration one does not (pyproject's extras); the committed dynamo fixture's exact count is held
    # by tests/importers/test_parameter_fed_weights.py either way
    pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    import torch

    model = built[0]
    ids = torch.randint(3, CONFIG["vocab_size"], (2, SEQ))
    path = tmp_path / "deberta_own_dynamo.onnx"
    torch.onnx.export(model, (ids,), str(path), input_names=["input_ids"], output_names=["logits"], dynamo=True,
                      dynamic_shapes=({0: "batch", 1: "seq"},))
    graph = import_model(path, {"batch": 2, "seq": SEQ})
    assert graph.parameter_count == sum(p.numel() for p in model.parameters()), graph.warnings
