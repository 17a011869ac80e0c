"""Batch coupling found in real exports (importers/batch_coupling.py): a tiny ``transformers.CLIPModel``
called with ``return_loss=True`` (its contrastive loss: ``logits_per_text = text_embeds @ image_embeds.t()``)
and a torch CNN with BatchNorm exported in training mode."""

from __future__ import annotations

import pytest

from importers import import_model

pytestmark = pytest.mark.integration


def _export(module, args, path, names, axes, **kwargs):
    import torch

    torch.onnx.export(module, args, str(path), input_names=names, output_names=["loss"], dynamic_axes=axes,
                      opset_version=17, dynamo=False, **kwargs)  # fmt: skip
    return path


def test_clip_model_with_its_loss_has_one_similarity(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = transformers.CLIPConfig(
        text_config=dict(tower, vocab_size=100, max_position_embeddings=16),
        vision_config=dict(tower, image_size=16, patch_size=8), projection_dim=16,
    )  # fmt: skip
    model = transformers.CLIPModel(config).eval()

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.clip = model

        def forward(self, input_ids, pixel_values):
            return self.clip(input_ids=input_ids, pixel_values=pixel_values, return_loss=True).loss

    args = (torch.randint(0, 100, (4, 8)), torch.randn(4, 3, 16, 16))
    path = _export(WithLoss(), args, tmp_path / "clip.onnx", ["input_ids", "pixel_values"],
                   {"input_ids": {0: "batch", 1: "seq"}, "pixel_values": {0: "batch"}})  # fmt: skip
    graph = import_model(path, {"batch": 64, "seq": 8})
    # one batch x batch product; the text pooling gathers by the samples' own token ids (not flagged)
    assert [c.kind for c in graph.batch_coupled] == ["similarity"]


def test_cnn_batchnorm_in_training_mode(tmp_path):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4),
    )  # fmt: skip
    path = _export(net.train(), (torch.randn(2, 3, 16, 16),), tmp_path / "cnn.onnx", ["images"],
                   {"images": {0: "batch"}}, training=torch.onnx.TrainingMode.TRAINING)  # fmt: skip
    graph = import_model(path, {"batch": 16})
    assert [c.kind for c in graph.batch_coupled] == ["batch_norm", "batch_norm"]
