"""Build the example and test ONNX models: graph-only exports of real architectures.

Every model is built from a config written in this file (no downloads), given random, distinct
weights, exported with torch's dynamo exporter (opset 18, named dynamic dims) or its TorchScript
exporter (opset 17, ``dynamic_axes``), and saved *graph-only*: tensors of at least 1 KiB go to an
external-data file that is then deleted, so the committed files keep every initializer's name,
dtype and dims (and the small int64 shape constants that shape inference needs) but no weights.
``onnx.load(path, load_external_data=False)`` reads them.

Needs torch 2.13.0 (CPU), transformers, onnxscript, onnx and onnxruntime, in a venv of its own so
that the project's venv stays torch-free (see examples/README.md)::

    .venv-examples/bin/python examples/make_examples.py            # everything
    .venv-examples/bin/python examples/make_examples.py --only gpt2

Two sets are written, each with a ``models.json`` describing its files:

* ``examples/`` -- the bundled examples at realistic sizes (GPT-2 small, BERT-base, a GQA Llama,
  ResNet-50, an MLP);
* ``tests/data/`` -- small models for importer coverage tests (T5, ViT, Mixtral, LSTM, GRU,
  TorchScript exports of nn.Transformer, GPT-2 and BERT, and a complete, runnable tiny GPT-2).

A third set, ``examples/large/`` (recorded in ``examples/models.json`` as ``large/<name>.onnx``),
holds big GPT decoders (a 48-layer GPT-2-XL shape, GPT-3 1.3B, 13B and 175B) that are never given
weights at all: the model is built under torch's ``FakeTensorMode`` (tensors with dtype, shape and
device but no storage), exported, optimised with zero-stride stand-ins for the weights and written
graph-only directly. ``--verify`` checks, at 2 layers, that this gives the very file the weighted
export gives.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Set before transformers is imported: configs are built in code, nothing is fetched.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import onnx  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

__all__ = ["Example", "EXAMPLES", "build_all", "main"]

REPO_ROOT = Path(__file__).resolve().parent.parent
SEED = 0
# Tensors at least this large (bytes) are stripped; smaller ones (int64 shape constants for
# Reshape/Slice/Unsqueeze) stay inline, without which shape inference stops early.
STRIP_THRESHOLD_BYTES = 1024
# A model kept complete (weights inline) must stay below this, so tests can run it cheaply.
INLINE_LIMIT_BYTES = 2 * 1024 * 1024


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Built:
    """A model ready to export."""

    model: nn.Module
    """The torch module, weights already re-initialised."""
    args: tuple[Any, ...]
    """Positional example inputs."""
    kwargs: dict[str, Any]
    """Keyword example inputs (the HF models take ``input_ids=...``)."""
    input_dims: dict[str, list[str | int]]
    """Per input name, its dims: a symbolic name or a fixed size."""
    config: dict[str, Any]
    """The architecture's sizes, recorded in models.json."""
    dynamic_shapes: Any = None
    """For the dynamo exporter: ``torch.export.Dim`` objects per input."""
    dynamic_axes: dict[str, dict[int, str]] | None = None
    """For the TorchScript exporter: named dynamic axes per input/output name."""
    output_names: list[str] | None = None
    """For the TorchScript exporter: output names (so ``dynamic_axes`` can name them)."""
    no_grad: bool = False
    """Export under ``torch.no_grad()`` (T5 does not export otherwise)."""
    fake_weights: bool = False
    """The model's parameters and inputs are FakeTensors (no storage): exported without data.
    The example's ``build`` then also takes ``n_layer=`` and ``fake=`` (see :func:`verify_fake`)."""
    expected_param_count: int | None = None
    """The parameter count from the architecture's formula; checked against the model's."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Example:
    """One ONNX file to produce."""

    name: str
    """File stem: ``<name>.onnx``."""
    group: str
    """``"examples"`` (bundled, realistic sizes) or ``"tests"`` (small, for importer tests)."""
    exporter: str
    """``"dynamo"`` (opset 18) or ``"torchscript"`` (opset 17)."""
    build: Callable[[], Built]
    """Builds the model and its example inputs."""
    description: str
    """One line for models.json and the README."""
    inline_weights: bool = False
    """Keep all weights in the file (a complete, runnable model) instead of stripping them."""
    notes: str = ""
    """Known quirks of the exported file, recorded in models.json."""
    subdir: str = ""
    """Folder for the file below the group's; models.json records ``<subdir>/<name>.onnx``."""


# --------------------------------------------------------------------------------------------
# Weights


def _randomise(model: nn.Module, seed: int = SEED) -> nn.Module:
    """Give every parameter distinct random values (fixed seed), in place.

    The dynamo exporter merges bit-identical initializers, so a default init (LayerNorm 1/0,
    zero biases) would collapse many small parameters into one shared tensor.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * 0.02
            # Norm scales near 1 keep activations sane if the model is ever run.
            base = 1.0 if _is_norm_scale(model, name) else 0.0
            param.copy_((base + noise).to(param.dtype))
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=gen) * 0.1)
                module.running_var.copy_(1.0 + torch.rand(module.running_var.shape, generator=gen) * 0.1)
    return model


def _is_norm_scale(model: nn.Module, param_name: str) -> bool:
    module_name, _, leaf = param_name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    is_norm = "norm" in type(module).__name__.lower() or isinstance(module, nn.LayerNorm)
    return is_norm and leaf == "weight"


def _param_count(model: nn.Module) -> int:
    # parameters() yields a tied (shared) tensor once.
    return sum(p.numel() for p in model.parameters())


def _ids(gen: torch.Generator, vocab: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=gen, dtype=torch.int64)


def _dim(name: str, **bounds: int) -> torch.export.Dim:
    return torch.export.Dim(name, **bounds)


# --------------------------------------------------------------------------------------------
# Hugging Face models (configs in code)


def _hf(model_cls: type, config: Any) -> nn.Module:
    torch.manual_seed(SEED)
    model = model_cls(config)
    model.eval()
    return _randomise(model)


def _gpt2(*, n_layer: int, n_embd: int, n_head: int, vocab: int, n_positions: int,
          seq: int, exporter: str, with_attention_mask: bool = False,
          fake: bool = False) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    # GPT-2's bos/eos token (50256) exists only in the full vocabulary.
    special = {} if vocab > 50256 else {"bos_token_id": None, "eos_token_id": None}
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab,
                     n_positions=n_positions, use_cache=False, **special)
    model = _fake_hf(GPT2LMHeadModel, cfg) if fake else _hf(GPT2LMHeadModel, cfg)
    gen = torch.Generator().manual_seed(SEED)
    input_ids = _ids(gen, vocab, 2, seq)
    if fake:
        input_ids = _fake_like(model, input_ids)
    config = {"architecture": "GPT2LMHeadModel", "layers": n_layer, "hidden": n_embd,
              "heads": n_head, "kv_heads": n_head, "intermediate": 4 * n_embd, "vocab": vocab,
              "max_positions": n_positions, "example_batch": 2, "example_seq": seq}
    extra = {"attention_mask": torch.ones_like(input_ids)} if with_attention_mask else None
    return _hf_built(model, input_ids, config, exporter=exporter, max_seq=n_positions,
                     extra=extra)


def _fake_hf(model_cls: type, config: Any) -> nn.Module:
    """The model with FakeTensor parameters: dtypes and shapes, no storage (any size fits)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = model_cls(config)
    return model.eval()


def _fake_like(model: nn.Module, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a FakeTensor of ``model``'s fake mode (torch.export wants a single mode)."""
    return next(model.parameters()).fake_mode.from_tensor(tensor)


def _hf_built(model: nn.Module, input_ids: torch.Tensor, config: dict[str, Any], *,
              exporter: str, max_seq: int, extra: dict[str, torch.Tensor] | None = None) -> Built:
    """Inputs ``input_ids`` [batch, seq] (and any ``extra`` with the same dims)."""
    kwargs = {"input_ids": input_ids, **(extra or {})}
    dims: list[str | int] = ["batch", "seq"]
    if exporter == "dynamo":
        batch, seq = _dim("batch"), _dim("seq", max=max_seq)
        return Built(model=model, args=(), kwargs=kwargs,
                     input_dims={k: list(dims) for k in kwargs},
                     dynamic_shapes={k: {0: batch, 1: seq} for k in kwargs}, config=config)
    _restrict_forward(model, list(kwargs))
    return Built(model=model, args=(), kwargs=kwargs, input_dims={k: list(dims) for k in kwargs},
                 dynamic_axes={**{k: {0: "batch", 1: "seq"} for k in kwargs},
                               "logits": {0: "batch", 1: "seq"}},
                 output_names=["logits"], config=config)


def _restrict_forward(model: nn.Module, names: list[str]) -> None:
    """Make ``model.forward`` take exactly ``names`` and return the logits tensor.

    The TorchScript exporter binds its inputs to the forward signature and fills in every other
    parameter's default as a graph input: GPT-2's ``logits_to_keep=0`` became an int64 input that
    selected a single position. The override lives on the instance, so module paths (and with
    them the exported node names) stay those of the HF model.
    """
    hf_forward = model.forward

    def forward(*tensors: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        return hf_forward(**dict(zip(names, tensors)), **named, return_dict=False)[0]

    forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    model.forward = forward


def build_gpt2() -> Built:
    # GPT2Config defaults: GPT-2 small (124M).
    return _gpt2(n_layer=12, n_embd=768, n_head=12, vocab=50257, n_positions=1024, seq=128,
                 exporter="dynamo")


def build_gpt2_tiny() -> Built:
    return _gpt2(n_layer=2, n_embd=64, n_head=4, vocab=1000, n_positions=128, seq=16,
                 exporter="dynamo")


def build_gpt2_ts() -> Built:
    # Without an attention_mask, transformers checks position_ids for packed sequences with
    # aten::diff, which the TorchScript exporter cannot export; an all-ones mask skips that.
    return _gpt2(n_layer=2, n_embd=768, n_head=12, vocab=50257, n_positions=1024, seq=128,
                 exporter="torchscript", with_attention_mask=True)


def gpt2_param_count(*, n_layer: int, n_embd: int, vocab: int, n_positions: int) -> int:
    """Parameters of ``GPT2LMHeadModel`` (4x FFN, ``lm_head`` tied to ``wte``), by formula.

    Token and position embeddings ``(vocab + n_positions) * h``; per layer ``12 h^2 + 13 h``:
    ``c_attn`` h x 3h + 3h, attention ``c_proj`` h x h + h, ``c_fc`` h x 4h + 4h, MLP ``c_proj``
    4h x h + h, two LayerNorms 2h each; the final LayerNorm 2h.

    >>> gpt2_param_count(n_layer=12, n_embd=768, vocab=50257, n_positions=1024)  # GPT-2 small
    124439808
    """
    h = n_embd
    return (vocab + n_positions) * h + n_layer * (12 * h * h + 13 * h) + 2 * h


def build_large_gpt(*, n_layer: int, n_embd: int, n_head: int, n_positions: int,
                    vocab: int = 50257, fake: bool = True) -> Built:
    """A ``GPT2LMHeadModel`` of any size on FakeTensors (or, ``fake=False``, real random weights).

    GPT-3 is GPT-2's architecture at other sizes (its sparse attention layers aside), so
    ``GPT2LMHeadModel`` stands for both.
    """
    built = _gpt2(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab=vocab,
                  n_positions=n_positions, seq=128, exporter="dynamo", fake=fake)
    expected = gpt2_param_count(n_layer=n_layer, n_embd=n_embd, vocab=vocab,
                                n_positions=n_positions)
    return dataclasses.replace(built, fake_weights=fake, expected_param_count=expected)


def _bert(*, layers: int, hidden: int, heads: int, intermediate: int, seq: int,
          exporter: str) -> Built:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     intermediate_size=intermediate)
    model = _hf(BertForMaskedLM, cfg)
    gen = torch.Generator().manual_seed(SEED)
    input_ids = _ids(gen, cfg.vocab_size, 2, seq)
    config = {"architecture": "BertForMaskedLM", "layers": layers, "hidden": hidden,
              "heads": heads, "kv_heads": heads, "intermediate": intermediate,
              "vocab": cfg.vocab_size, "max_positions": cfg.max_position_embeddings,
              "example_batch": 2, "example_seq": seq}
    return _hf_built(model, input_ids, config, exporter=exporter,
                     max_seq=cfg.max_position_embeddings)


def build_bert() -> Built:
    # BERT-base: 12 layers, 768 hidden, 12 heads, 3072 FFN, vocab 30522.
    return _bert(layers=12, hidden=768, heads=12, intermediate=3072, seq=128, exporter="dynamo")


def build_bert_tiny_ts() -> Built:
    # google/bert_uncased_L-2_H-128_A-2 sizes ("bert-tiny").
    return _bert(layers=2, hidden=128, heads=2, intermediate=512, seq=32, exporter="torchscript")


def _llama_like(model_cls_name: str, config_cls_name: str, *, layers: int, hidden: int,
                heads: int, kv_heads: int, intermediate: int, vocab: int, max_positions: int,
                seq: int, **extra_cfg: Any) -> Built:
    import transformers

    config_cls = getattr(transformers, config_cls_name)
    model_cls = getattr(transformers, model_cls_name)
    cfg = config_cls(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_key_value_heads=kv_heads, intermediate_size=intermediate,
                     vocab_size=vocab, max_position_embeddings=max_positions, use_cache=False,
                     tie_word_embeddings=False, **extra_cfg)
    model = _hf(model_cls, cfg)
    gen = torch.Generator().manual_seed(SEED)
    input_ids = _ids(gen, vocab, 2, seq)
    config = {"architecture": model_cls_name, "layers": layers, "hidden": hidden, "heads": heads,
              "kv_heads": kv_heads, "head_dim": hidden // heads, "intermediate": intermediate,
              "vocab": vocab, "max_positions": max_positions, "example_batch": 2,
              "example_seq": seq, **{k: v for k, v in extra_cfg.items()
                                     if isinstance(v, (int, float, str))}}
    return _hf_built(model, input_ids, config, exporter="dynamo", max_seq=max_positions)


def build_llama() -> Built:
    return _llama_like("LlamaForCausalLM", "LlamaConfig", layers=8, hidden=1024, heads=16,
                       kv_heads=4, intermediate=2816, vocab=32000, max_positions=2048, seq=128)


def build_mixtral_tiny() -> Built:
    # The default "grouped_mm" experts do not export; "batched_mm" does, as dense gathers.
    return _llama_like("MixtralForCausalLM", "MixtralConfig", layers=2, hidden=64, heads=4,
                       kv_heads=2, intermediate=128, vocab=1000, max_positions=256, seq=16,
                       num_local_experts=4, num_experts_per_tok=2,
                       experts_implementation="batched_mm")


def build_t5_tiny() -> Built:
    from transformers import T5Config, T5ForConditionalGeneration

    layers, d_model, heads, d_kv, d_ff, vocab = 2, 64, 4, 16, 128, 1000
    cfg = T5Config(num_layers=layers, num_decoder_layers=layers, d_model=d_model, num_heads=heads,
                   d_kv=d_kv, d_ff=d_ff, vocab_size=vocab, use_cache=False,
                   decoder_start_token_id=0)
    model = _hf(T5ForConditionalGeneration, cfg)
    gen = torch.Generator().manual_seed(SEED)
    src_seq, tgt_seq = 16, 8
    kwargs = {"input_ids": _ids(gen, vocab, 2, src_seq),
              "decoder_input_ids": _ids(gen, vocab, 2, tgt_seq)}
    batch, seq, dec = _dim("batch"), _dim("seq", max=512), _dim("tgt_seq", max=512)
    config = {"architecture": "T5ForConditionalGeneration", "layers": layers,
              "decoder_layers": layers, "hidden": d_model, "heads": heads, "kv_heads": heads,
              "head_dim": d_kv, "intermediate": d_ff, "vocab": vocab, "example_batch": 2,
              "example_seq": src_seq, "example_tgt_seq": tgt_seq}
    return Built(model=model, args=(), kwargs=kwargs,
                 input_dims={"input_ids": ["batch", "seq"],
                             "decoder_input_ids": ["batch", "tgt_seq"]},
                 dynamic_shapes={"input_ids": {0: batch, 1: seq},
                                 "decoder_input_ids": {0: batch, 1: dec}},
                 config=config, no_grad=True)


def build_vit_tiny() -> Built:
    from transformers import ViTConfig, ViTForImageClassification

    layers, hidden, heads, intermediate, image, patch, labels = 2, 64, 4, 128, 32, 4, 10
    cfg = ViTConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                    intermediate_size=intermediate, image_size=image, patch_size=patch,
                    num_labels=labels)
    model = _hf(ViTForImageClassification, cfg)
    gen = torch.Generator().manual_seed(SEED)
    pixel_values = torch.randn(2, 3, image, image, generator=gen)
    config = {"architecture": "ViTForImageClassification", "layers": layers, "hidden": hidden,
              "heads": heads, "kv_heads": heads, "intermediate": intermediate,
              "image_size": image, "patch_size": patch, "num_labels": labels,
              "tokens": (image // patch) ** 2 + 1, "example_batch": 2}
    return Built(model=model, args=(), kwargs={"pixel_values": pixel_values},
                 input_dims={"pixel_values": ["batch", 3, image, image]},
                 dynamic_shapes={"pixel_values": {0: _dim("batch")}}, config=config)


# --------------------------------------------------------------------------------------------
# Plain torch models


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 -> 3x3 (stride here) -> 1x1 (x4 channels), residual add."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet-50 layout (torchvision's ``resnet50``), written out because torchvision is absent."""

    def __init__(self, blocks: tuple[int, ...] = (3, 4, 6, 3), num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = 64
        stages = []
        for i, count in enumerate(blocks):
            width = 64 * 2**i
            layers = []
            for j in range(count):
                layers.append(Bottleneck(in_channels, width, stride=2 if (i > 0 and j == 0) else 1))
                in_channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_resnet() -> Built:
    model = _randomise(ResNet().eval())
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(SEED))
    config = {"architecture": "ResNet-50 (v1.5 bottleneck)", "blocks": [3, 4, 6, 3],
              "widths": [64, 128, 256, 512], "expansion": 4, "num_classes": 1000,
              "image_size": 224, "example_batch": 2}
    return Built(model=model, args=(x,), kwargs={}, input_dims={"x": ["batch", 3, 224, 224]},
                 dynamic_shapes=({0: _dim("batch")},), config=config)


class MLP(nn.Module):
    """Linear -> ReLU -> Linear -> ReLU -> Linear."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(fan_in, fan_out))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def build_mlp() -> Built:
    sizes = (1024, 4096, 4096, 1024)
    model = _randomise(MLP(sizes).eval())
    x = torch.randn(8, sizes[0], generator=torch.Generator().manual_seed(SEED))
    config = {"architecture": "MLP", "sizes": list(sizes), "activation": "ReLU",
              "example_batch": 8}
    return Built(model=model, args=(x,), kwargs={}, input_dims={"x": ["batch", sizes[0]]},
                 dynamic_shapes=({0: _dim("batch")},), config=config)


class RecurrentLM(nn.Module):
    """Embedding -> multi-layer LSTM/GRU (batch first) -> Linear over the vocabulary."""

    def __init__(self, cell: str, *, vocab: int, embed: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, embed)
        rnn_cls = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = rnn_cls(embed, hidden, num_layers=layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embedding(input_ids))
        return self.decoder(out)


def _rnn(cell: str, *, vocab: int, embed: int, hidden: int, layers: int, seq: int) -> Built:
    torch.manual_seed(SEED)
    model = _randomise(RecurrentLM(cell, vocab=vocab, embed=embed, hidden=hidden,
                                   layers=layers).eval())
    input_ids = _ids(torch.Generator().manual_seed(SEED), vocab, 2, seq)
    config = {"architecture": f"{cell.upper()} LM (nn.{cell.upper()})", "layers": layers,
              "embed": embed, "hidden": hidden, "vocab": vocab, "example_batch": 2,
              "example_seq": seq}
    return Built(model=model, args=(input_ids,), kwargs={},
                 input_dims={"input_ids": ["batch", "seq"]},
                 dynamic_shapes=({0: _dim("batch"), 1: _dim("seq")},), config=config)


def build_lstm_lm() -> Built:
    return _rnn("lstm", vocab=1000, embed=64, hidden=128, layers=2, seq=16)


def build_gru_tiny() -> Built:
    return _rnn("gru", vocab=1000, embed=64, hidden=64, layers=2, seq=16)


class CausalTransformer(nn.Module):
    """``torch.nn.Transformer`` with a causal target mask built from the target length."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.transformer = nn.Transformer(batch_first=True, **kwargs)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=tgt.dtype)
        # The exporter needs tgt_is_causal=True alongside the causal mask.
        return self.transformer(src, tgt, tgt_mask=mask, tgt_is_causal=True)


def build_nn_transformer_ts() -> Built:
    d_model, heads, enc, dec, ff = 512, 8, 6, 6, 2048
    torch.manual_seed(SEED)
    model = _randomise(CausalTransformer(d_model=d_model, nhead=heads, num_encoder_layers=enc,
                                         num_decoder_layers=dec, dim_feedforward=ff,
                                         dropout=0.0).eval())
    gen = torch.Generator().manual_seed(SEED)
    src_seq, tgt_seq = 32, 24
    src = torch.randn(2, src_seq, d_model, generator=gen)
    tgt = torch.randn(2, tgt_seq, d_model, generator=gen)
    config = {"architecture": "torch.nn.Transformer", "encoder_layers": enc,
              "decoder_layers": dec, "hidden": d_model, "heads": heads, "kv_heads": heads,
              "intermediate": ff, "batch_first": True, "example_batch": 2,
              "example_seq": src_seq, "example_tgt_seq": tgt_seq}
    return Built(model=model, args=(src, tgt), kwargs={},
                 input_dims={"src": ["batch", "seq", d_model], "tgt": ["batch", "tgt_seq", d_model]},
                 dynamic_axes={"src": {0: "batch", 1: "seq"}, "tgt": {0: "batch", 1: "tgt_seq"},
                               "output": {0: "batch", 1: "tgt_seq"}},
                 output_names=["output"], config=config)


# --------------------------------------------------------------------------------------------
# Registry

EXAMPLES: dict[str, Example] = {e.name: e for e in [
    Example(name="gpt2", group="examples", exporter="dynamo", build=build_gpt2,
            description="GPT-2 small (GPT2LMHeadModel, GPT2Config defaults), 124M parameters"),
    Example(name="bert", group="examples", exporter="dynamo", build=build_bert,
            description="BERT-base with its masked-LM head (BertForMaskedLM)"),
    Example(name="llama", group="examples", exporter="dynamo", build=build_llama,
            description="Llama-style decoder (LlamaForCausalLM): RMSNorm, rotary, GQA 16/4 heads"),
    Example(name="resnet", group="examples", exporter="dynamo", build=build_resnet,
            description="ResNet-50 (plain torch, torchvision layout), 224x224 input",
            notes="The exporter fused every BatchNormalization into its Conv (param_count still "
                  "counts the BN scales and shifts)."),
    Example(name="mlp", group="examples", exporter="dynamo", build=build_mlp,
            description="MLP 1024->4096->4096->1024 with ReLU"),
    Example(name="t5_tiny", group="tests", exporter="dynamo", build=build_t5_tiny,
            description="T5 encoder-decoder, 2+2 layers, d_model 64 (exported under no_grad)",
            notes="Two outputs: the logits and the encoder's last hidden state."),
    Example(name="vit_tiny", group="tests", exporter="dynamo", build=build_vit_tiny,
            description="ViT classifier, 2 layers, hidden 64, 32x32 image, 4x4 patches"),
    Example(name="mixtral_tiny", group="tests", exporter="dynamo", build=build_mixtral_tiny,
            description="Mixtral MoE decoder, 2 layers, 4 experts top-2 (batched_mm experts)"),
    Example(name="lstm_lm", group="tests", exporter="dynamo", build=build_lstm_lm,
            description="Embedding -> 2-layer nn.LSTM -> Linear language model",
            notes="The output is declared [batch, 16, vocab] (the example's seq baked in) although "
                  "the graph runs at any seq."),
    Example(name="gru_tiny", group="tests", exporter="dynamo", build=build_gru_tiny,
            description="Embedding -> 2-layer nn.GRU -> Linear language model",
            notes="The output is declared [batch, 16, vocab] (the example's seq baked in) although "
                  "the graph runs at any seq."),
    Example(name="nn_transformer_ts", group="tests", exporter="torchscript",
            build=build_nn_transformer_ts,
            description="torch.nn.Transformer, d_model 512, 6+6 layers, TorchScript exporter",
            notes="The exporter baked the example lengths (seq 32, tgt_seq 24) into the attention "
                  "Reshapes: it runs at any batch but only at those lengths, although the inputs "
                  "declare seq and tgt_seq symbolic."),
    Example(name="gpt2_ts", group="tests", exporter="torchscript", build=build_gpt2_ts,
            description="GPT-2 with 2 layers (hidden 768), TorchScript exporter",
            notes="Has an attention_mask input: without one, transformers checks position_ids "
                  "for packed sequences with aten::diff, which the TorchScript exporter cannot "
                  "export."),
    Example(name="bert_tiny_ts", group="tests", exporter="torchscript", build=build_bert_tiny_ts,
            description="BERT-tiny (2 layers, hidden 128) masked LM, TorchScript exporter"),
    Example(name="gpt2_tiny", group="tests", exporter="dynamo", build=build_gpt2_tiny,
            inline_weights=True,
            description="GPT-2, 2 layers, hidden 64, vocab 1000: complete with weights, runnable"),
    Example(name="gpt_48l", group="large", subdir="large", exporter="dynamo",
            build=functools.partial(build_large_gpt, n_layer=48, n_embd=1600, n_head=25,
                                    n_positions=1024),
            description="48-layer decoder of GPT-2-XL shape (GPT2LMHeadModel: hidden 1600, 25 "
                        "heads, 1024 positions), 1.56B parameters, built on FakeTensors"),
    Example(name="gpt3_1p3b", group="large", subdir="large", exporter="dynamo",
            build=functools.partial(build_large_gpt, n_layer=24, n_embd=2048, n_head=16,
                                    n_positions=2048),
            description="GPT-3 1.3B shape (GPT2LMHeadModel: 24 layers, hidden 2048, 16 heads, "
                        "2048 positions), built on FakeTensors"),
    Example(name="gpt3_13b", group="large", subdir="large", exporter="dynamo",
            build=functools.partial(build_large_gpt, n_layer=40, n_embd=5120, n_head=40,
                                    n_positions=2048),
            description="GPT-3 13B shape (GPT2LMHeadModel: 40 layers, hidden 5120, 40 heads, "
                        "2048 positions), built on FakeTensors"),
    Example(name="gpt3_175b", group="large", subdir="large", exporter="dynamo",
            build=functools.partial(build_large_gpt, n_layer=96, n_embd=12288, n_head=96,
                                    n_positions=2048),
            description="GPT-3 175B shape (GPT2LMHeadModel: 96 layers, hidden 12288, 96 heads, "
                        "2048 positions), built on FakeTensors"),
    # the 1T model of Narayanan et al., SC 2021 (Megatron-LM, table 1): 128 layers, hidden 25600,
    # 160 heads, sequence 2048 (their vocabulary is 51,200; GPT-2's 50,257 is kept here)
    Example(name="gpt_1t", group="large", subdir="large", exporter="dynamo",
            build=functools.partial(build_large_gpt, n_layer=128, n_embd=25600, n_head=160,
                                    n_positions=2048),
            description="1T-parameter GPT shape (GPT2LMHeadModel: 128 layers, hidden 25600, 160 "
                        "heads, 2048 positions; Megatron-LM's 1T configuration), built on FakeTensors"),
]}

# The large models share examples/models.json; their files go to examples/large/.
GROUP_DIRS = {"examples": Path("examples"), "tests": Path("tests/data"), "large": Path("examples")}


# --------------------------------------------------------------------------------------------
# Export and save


def export(example: Example, built: Built) -> onnx.ModelProto:
    """Export ``built`` with the example's exporter; returns the in-memory model (weights inline).

    A FakeTensor model comes back graph-only already (see :func:`_export_fake`).
    """
    if built.fake_weights:
        return _export_fake(built, data_location=f"{example.name}.onnx.data")
    if example.exporter == "dynamo":
        context = torch.no_grad() if built.no_grad else torch.enable_grad()
        with context:
            program = torch.onnx.export(built.model, built.args, kwargs=built.kwargs, dynamo=True,
                                        opset_version=18, dynamic_shapes=built.dynamic_shapes)
        return program.model_proto
    buffer = io.BytesIO()
    torch.onnx.export(built.model, _positional(built), buffer, dynamo=False,
                      opset_version=17, input_names=list(built.input_dims),
                      output_names=built.output_names, dynamic_axes=built.dynamic_axes)
    return onnx.load_model_from_string(buffer.getvalue())


def _export_fake(built: Built, *, data_location: str) -> onnx.ModelProto:
    """Dynamo-export a FakeTensor model; large initializers point into an absent data file.

    ``torch.onnx.export`` translates FakeTensors fine, but its optimizer (constant folding,
    merging of equal small initializers) reads tensor data. So export unoptimised, give every
    FakeTensor initializer a zero-stride numpy stand-in (its dtype and shape at the memory cost
    of one element, a distinct value per tensor as random weights have, or the merging pass
    would join them), run the same optimizer the exporter runs, then replace every tensor that
    ``save`` would strip by an external reference, offsets laid out as ``onnx.save_model`` lays
    them. (The exporter optimises before renaming the dims to ``batch``/``seq``, here it is the
    other way round; ``--verify`` checks that the file is the weighted export's all the same.)
    """
    import numpy as np
    import onnx_ir as ir
    from torch._subclasses.fake_tensor import FakeTensor

    context = torch.no_grad() if built.no_grad else torch.enable_grad()
    with context:
        program = torch.onnx.export(built.model, built.args, kwargs=built.kwargs, dynamo=True,
                                    opset_version=18, dynamic_shapes=built.dynamic_shapes,
                                    optimize=False)
    model = program.model
    stand_ins: set[str] = set()
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor.raw, FakeTensor):
                stand_ins.add(value.name)
                data = np.broadcast_to(np.array(len(stand_ins), dtype=tensor.dtype.numpy()),
                                       tuple(tensor.shape.numpy()))
                value.const_value = ir.Tensor(data, name=value.name)
    program.optimize()
    offset = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            # onnx.save_model's test is sys.getsizeof(raw_data) >= threshold. A parameter below
            # it goes external all the same: its stand-in value is made up.
            small = tensor.nbytes + sys.getsizeof(b"") < STRIP_THRESHOLD_BYTES
            if small and value.name not in stand_ins:
                continue
            value.const_value = ir.ExternalTensor(data_location, offset, tensor.nbytes,
                                                  tensor.dtype, shape=tensor.shape,
                                                  name=value.name)
            offset += tensor.nbytes
    return ir.serde.serialize_model(model)


def _positional(built: Built) -> tuple[Any, ...]:
    """Keyword inputs as positional arguments, ``None`` for skipped parameters.

    The TorchScript exporter traces positional arguments only; ``None`` fills skipped
    parameters and becomes no graph input.
    """
    if not built.kwargs:
        return built.args
    params = list(inspect.signature(built.model.forward).parameters)
    last = max(params.index(name) for name in built.kwargs)
    return (*built.args, *(built.kwargs.get(name) for name in params[len(built.args):last + 1]))


def _drop_stack_traces(model: onnx.ModelProto) -> None:
    """Remove the dynamo exporter's per-node Python stack traces, in place.

    They hold this machine's absolute paths and line numbers, so files would change with every
    checkout and edit; the module path stays in ``namespace`` and ``pkg.torch.onnx.name_scopes``.
    """
    for node in model.graph.node:
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)


def save(model: onnx.ModelProto, path: Path, *, inline_weights: bool) -> None:
    """Write ``model`` to ``path``: complete, or graph-only with tensors >= 1 KiB stripped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _drop_stack_traces(model)
    if inline_weights:
        onnx.save_model(model, str(path))
        return
    data_name = f"{path.name}.data"
    data_path = path.with_name(data_name)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name, size_threshold=STRIP_THRESHOLD_BYTES)
    data_path.unlink(missing_ok=True)


def _dims_used(input_dims: dict[str, list[str | int]]) -> list[str]:
    names: list[str] = []
    for dims in input_dims.values():
        names += [d for d in dims if isinstance(d, str) and d not in names]
    return names


def _as_checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a graph-only model whose stripped initializers are graph inputs instead.

    The checker wants the data of an external initializer on disk; as a graph input of the
    same dtype and dims the tensor is still fully described and everything else is checked.
    """
    checkable = onnx.ModelProto()
    checkable.CopyFrom(model)
    graph = checkable.graph
    kept = []
    for init in graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type,
                                                                  list(init.dims)))
        else:
            kept.append(init)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return checkable


def _check(model: onnx.ModelProto) -> dict[str, str]:
    """Run the ONNX checker (plain, then with strict shape inference) on a loaded file."""
    result = {}
    for key, full in (("checker", False), ("checker_full", True)):
        try:
            onnx.checker.check_model(_as_checkable(model), full_check=full)
            result[key] = "ok"
        except Exception as exc:  # noqa: BLE001 - recorded in models.json, not fatal
            result[key] = f"failed: {str(exc).strip().splitlines()[0][:200]}"
    return result


# Symbolic dim sizes for --verify: different from the export's example sizes on purpose.
VERIFY_SIZES = {"batch": 3, "seq": 11, "tgt_seq": 7}


def verify(built: Built, proto: onnx.ModelProto) -> str:
    """Run the complete exported model in onnxruntime at new dim sizes and compare with torch.

    Returns ``"ok ..."`` with the sizes and the largest absolute difference, or ``"failed: ..."``.
    """
    import numpy as np
    import onnxruntime as ort

    gen = torch.Generator().manual_seed(SEED + 1)
    examples = dict(zip(built.input_dims, [*built.args, *built.kwargs.values()]))
    inputs: dict[str, torch.Tensor] = {}
    for name, dims in built.input_dims.items():
        shape = [VERIFY_SIZES[d] if isinstance(d, str) else d for d in dims]
        example = examples[name]
        if name == "attention_mask":
            inputs[name] = torch.ones(shape, dtype=torch.int64)
        elif example.dtype == torch.int64:
            inputs[name] = torch.randint(0, int(example.max()) + 1, shape, generator=gen)
        else:
            inputs[name] = torch.randn(shape, generator=gen)
    with torch.no_grad():
        if built.args:
            expected = built.model(*inputs.values())
        else:
            expected = built.model(**inputs)
    if not isinstance(expected, torch.Tensor):
        expected = expected[0]
    sizes = ", ".join(f"{d}={VERIFY_SIZES[d]}" for d in _dims_used(built.input_dims))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        # External data keeps protobuf's 2 GB limit out of the way for the big models; saving
        # that way moves the weights out of the proto it is given, hence the copy.
        complete = onnx.ModelProto()
        complete.CopyFrom(proto)
        onnx.save_model(complete, str(path), save_as_external_data=True,
                        location="model.onnx.data")
        del complete
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
        try:
            got = session.run(None, feeds)[0]
        except Exception as exc:  # noqa: BLE001 - a baked-in size is a finding, not a crash
            return f"failed at {sizes}: {str(exc).strip().splitlines()[0][:160]}"
    if got.shape != tuple(expected.shape):
        return f"failed at {sizes}: shape {got.shape} != torch {tuple(expected.shape)}"
    diff = float(np.abs(got - expected.numpy()).max())
    return f"ok at {sizes} (max abs diff vs torch {diff:.1e})"


# --verify on a FakeTensor model exports its architecture at this many layers on real weights too,
# if those weights fit in this many bytes.
VERIFY_FAKE_LAYERS = 2
VERIFY_FAKE_LIMIT_BYTES = 4 * 1024**3


def verify_fake(example: Example) -> str:
    """Check the FakeTensor route against the weighted one, at :data:`VERIFY_FAKE_LAYERS` layers.

    Exports the example's architecture at that depth twice, on FakeTensors and on random weights
    (the route of the other examples), saves both graph-only under the same file name and compares
    the files byte for byte. Returns ``"ok ..."``, ``"skipped: ..."`` (the weights would exceed
    :data:`VERIFY_FAKE_LIMIT_BYTES`) or ``"failed: ..."`` with the first difference.
    """
    layers = VERIFY_FAKE_LAYERS
    fake = example.build(n_layer=layers, fake=True)
    weight_bytes = sum(p.numel() * p.element_size() for p in fake.model.parameters())
    if weight_bytes > VERIFY_FAKE_LIMIT_BYTES:
        return (f"skipped: the weighted export at {layers} layers needs "
                f"{weight_bytes / 2**30:.1f} GiB of weights (limit "
                f"{VERIFY_FAKE_LIMIT_BYTES / 2**30:.0f} GiB)")
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for kind in ("fake", "weighted"):
            built = fake if kind == "fake" else example.build(n_layer=layers, fake=False)
            paths[kind] = Path(tmp) / kind / f"{example.name}.onnx"
            save(export(example, built), paths[kind], inline_weights=False)
            del built
        fake_bytes, weighted_bytes = (paths[k].read_bytes() for k in ("fake", "weighted"))
        if fake_bytes == weighted_bytes:
            return (f"ok: at {layers} layers the FakeTensor export is byte-identical to the "
                    f"weighted one ({len(fake_bytes):,} bytes)")
        a, b = (onnx.load(str(paths[k]), load_external_data=False) for k in ("fake", "weighted"))
    for field in ("node", "initializer", "value_info", "input", "output"):
        items_a, items_b = getattr(a.graph, field), getattr(b.graph, field)
        for i, (x, y) in enumerate(zip(items_a, items_b)):
            if x != y:
                return f"failed: graph.{field}[{i}] differs ({x.name!r} vs {y.name!r})"
        if len(items_a) != len(items_b):
            return f"failed: {len(items_a)} vs {len(items_b)} graph.{field} entries"
    return "failed: the files differ outside the graph's nodes, initializers and values"


def build_one(example: Example, out_dir: Path, *, check_runtime: bool = False) -> dict[str, Any]:
    """Build, export, save and check one example; returns its models.json record."""
    import transformers

    built = example.build()
    param_count = _param_count(built.model)
    if built.expected_param_count not in (None, param_count):
        raise RuntimeError(f"the model has {param_count:,} parameters, its formula says "
                           f"{built.expected_param_count:,}")
    proto = export(example, built)
    runtime = None
    if check_runtime:
        runtime = verify_fake(example) if built.fake_weights else verify(built, proto)
    path = out_dir / example.subdir / f"{example.name}.onnx"
    inline = example.inline_weights and proto.ByteSize() < INLINE_LIMIT_BYTES
    save(proto, path, inline_weights=inline)
    loaded = onnx.load(str(path), load_external_data=False)
    graph = loaded.graph
    opset = next(o.version for o in loaded.opset_import if o.domain in ("", "ai.onnx"))
    record = {
        "file": path.relative_to(out_dir).as_posix(),
        "description": example.description,
        "exporter": example.exporter,
        "opset": opset,
        "ir_version": loaded.ir_version,
        "weights": "inline" if inline else "stripped",
        "config": built.config,
        "param_count": param_count,
        "dims": _dims_used(built.input_dims),
        "inputs": built.input_dims,
        "graph_inputs": [i.name for i in graph.input],
        "graph_outputs": [o.name for o in graph.output],
        "node_count": len(graph.node),
        "initializer_count": len(graph.initializer),
        "op_types": sorted({n.op_type for n in graph.node}),
        **_check(loaded),
        "size_bytes": path.stat().st_size,
        "notes": example.notes,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__},
    }
    if built.fake_weights:
        record["built_on"] = "FakeTensorMode (no weights materialised)"
        record["param_count_check"] = "formula == sum(p.numel()) of the FakeTensor model"
    if runtime is not None:
        record["weighted_export_check" if built.fake_weights else "onnxruntime_check"] = runtime
    return record


def build_all(names: list[str], out_root: Path | None, *,
              check_runtime: bool = False) -> dict[str, dict[str, Any]]:
    """Build the named examples; update each group's models.json; returns records by name."""
    records: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for name in names:
        example = EXAMPLES[name]
        out_dir = out_root if out_root is not None else REPO_ROOT / GROUP_DIRS[example.group]
        print(f"[{name}] building ({example.exporter}) ...", file=sys.stderr, flush=True)
        try:
            record = build_one(example, out_dir, check_runtime=check_runtime)
        except Exception as exc:  # noqa: BLE001 - one failing export must not stop the rest
            failures[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            print(f"[{name}] FAILED: {failures[name]}", file=sys.stderr, flush=True)
            continue
        records[name] = record
        print(f"[{name}] {record['node_count']} nodes, {record['param_count']:,} params, "
              f"{record['size_bytes']:,} bytes, checker {record['checker']}/{record['checker_full']}"
              + (f", onnxruntime {record['onnxruntime_check']}" if "onnxruntime_check" in record
                 else "")
              + (f", {record['weighted_export_check']}" if "weighted_export_check" in record
                 else ""),
              file=sys.stderr, flush=True)
        index_path = out_dir / "models.json"
        index = json.loads(index_path.read_text()) if index_path.exists() else {}
        index[name] = record
        index_path.write_text(json.dumps(dict(sorted(index.items())), indent=2) + "\n")
    if failures:
        print("failed: " + "; ".join(f"{k}: {v}" for k, v in failures.items()), file=sys.stderr)
    return records


def main(argv: list[str] | None = None) -> int:
    """Command line: ``make_examples.py [--out DIR] [--only NAME ...]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="write every file here (default: examples/ for the bundled examples, "
                             "examples/large/ for the large ones, tests/data/ for the test "
                             "models)")
    parser.add_argument("--only", action="append", choices=sorted(EXAMPLES), metavar="NAME",
                        help=f"build only this model (repeatable); one of {', '.join(EXAMPLES)}")
    parser.add_argument("--group", choices=sorted(GROUP_DIRS), default=None,
                        help="build only this group")
    parser.add_argument("--verify", action="store_true",
                        help="also run each complete export in onnxruntime at other dim sizes and "
                             "compare with torch (slow; records onnxruntime_check); for the "
                             "FakeTensor models, compare their export with the weighted one at "
                             f"{VERIFY_FAKE_LAYERS} layers (records weighted_export_check)")
    args = parser.parse_args(argv)
    names = args.only or [n for n, e in EXAMPLES.items() if args.group in (None, e.group)]
    records = build_all(names, args.out, check_runtime=args.verify)
    return 0 if len(records) == len(names) else 1


if __name__ == "__main__":
    raise SystemExit(main())
