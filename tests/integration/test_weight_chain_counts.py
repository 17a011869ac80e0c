"""Weights read through an elementwise chain count as torch counts them, against the real libraries (issue 25, task H3).

The oracle is ``sum(p.numel() for p in model.parameters())`` of a model torch builds here:

* ``nn.utils.parametrizations.weight_norm`` on a ``Conv1d`` (torch 2.13), exported by TorchScript in training
  mode, which computes ``g * v / ||v||`` in the graph (``ReduceL2 / Div / Mul`` of the named
  ``parametrizations.weight.original0`` / ``original1``), and by dynamo where it runs;
* transformers 5.24's ``ZambaForCausalLM`` from the config of ``tests/data/weight_chain_cases/counts.json``
  (its ``-exp(A_log)[head]``) and ``Wav2Vec2ForCTC`` from the zoo's ``wav2vec2_ts_train_bare.onnx`` record
  (its weight-normed positional conv), whose committed graph-only files the importer reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers import import_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class _WeightNormedConv(torch.nn.Module):
    """Conv1d(4 -> 8, kernel 3) with weight_norm over dim 0, then a Linear(8 -> 2) head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 8, 3, padding=1))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.conv(x).transpose(1, 2))


def _torch_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_a_weight_norm_exported_in_training_mode_counts_g_and_v(tmp_path):
    torch.manual_seed(0)
    model = _WeightNormedConv()
    # g [8, 1, 1] + v [8, 4, 3] + conv bias 8 + head 8 x 2 + 2
    assert _torch_count(model) == 8 + 96 + 8 + 16 + 2 == 130
    path = tmp_path / "wn_ts_train.onnx"
    torch.onnx.export(model.train(), (torch.randn(2, 4, 16),), str(path), input_names=["x"], output_names=["y"],
                      dynamo=False, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"x": {0: "batch", 2: "length"}})
    graph = import_model(path, {"batch": 2, "length": 16})
    assert graph.parameter_count == _torch_count(model) == 130, graph.warnings


def test_zamba_counts_as_torch():
    record = json.loads((ROOT / "data" / "weight_chain_cases" / "counts.json").read_text())["zamba_ts"]
    config = {k: v for k, v in record["config"].items() if k not in ("model_class", "example_batch", "example_seq")}
    model = transformers.ZambaForCausalLM(transformers.ZambaConfig(use_cache=False, **config))
    graph = import_model(ROOT / "data" / "weight_chain_cases" / "zamba_ts_bare.onnx", {"batch": 2, "seq": 8})
    assert graph.parameter_count == _torch_count(model) == record["param_count"] == 45_376


def test_wav2vec2_training_export_counts_as_torch():
    record = json.loads((ROOT / "zoo" / "zoo.json").read_text())["files"]["wav2vec2_ts_train_bare.onnx"]
    config = {k: v for k, v in record["config"].items() if not k.startswith("example_")}
    model = transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(**config))
    graph = import_model(ROOT / "zoo" / "wav2vec2_ts_train_bare.onnx", {"batch": 4, "samples": 4000})
    assert graph.parameter_count == _torch_count(model) == record["param_count"] == 94_448
