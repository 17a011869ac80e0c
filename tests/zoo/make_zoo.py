"""Build the model zoo: 36 real architectures, two exporters, two graph-only styles.

Every architecture is built from a config written in this file (transformers' own config classes,
or plain torch modules where transformers has none: the LSTM language model), with random weights
under a fixed seed, and exported twice:

* ``dynamo``: ``torch.onnx.export(..., dynamo=True, opset_version=18)`` with named dynamic dims;
* ``ts``: ``torch.onnx.export(..., dynamo=False, opset_version=17)`` with ``dynamic_axes``.

Each export is saved graph-only in two styles (the data file is deleted both times):

* ``consts``: tensors of at least 1 KiB external, the small (shape) constants kept inline, as
  ``examples/`` are saved;
* ``bare``: every initializer external (``size_threshold=0``), the shape constants too.

So one architecture gives four files, ``<arch>_<dynamo|ts>_<consts|bare>.onnx``, and the manifest
``zoo.json`` records, per file, the architecture, exporter, opset, style, the exact parameter count
from torch (``sum(p.numel() for p in model.parameters())``: a tied weight once), the elements of
tied weights, of floating-point buffers and of parameters the export folds away (each computed from
the torch model: see ``_tied_count``, ``_buffer_count``, ``_folded_count``), the symbolic dims,
each input's dims and the config. An export that torch itself cannot do is recorded under
``"failures"`` with its error, never silently skipped.

The architectures whose eval-mode exports fold parameters into constants (ResNet, EfficientNet,
SegFormer: TorchScript fuses Conv+BatchNorm; Swin, BEiT: relative position bias tables; Wav2Vec2:
TorchScript folds the weight norm's g) get
a fifth file, ``<arch>_ts_train_bare.onnx``: TorchScript with
``training=TrainingMode.TRAINING, do_constant_folding=False``, which keeps them.

Two sizes:

* small (default, committed in ``tests/zoo/``): 2 layers, hidden 64-128, vocab 1000, images 32x32;
  files of a few tens of KB, read by ``tests/zoo/test_zoo.py``;
* realistic (``--realistic OUTDIR``, for ``bench/zoo_plan.py``; default cache ``.cache/zoo/``,
  gitignored): the published base sizes (GPT-2 124M, Pythia-160M, OPT-125M, BLOOM-560M, Falcon-7B,
  Llama-2-7B, Mistral-7B, Qwen2-0.5B, Gemma-2B, Phi-2, Mixtral-8x7B, BERT-base, RoBERTa-base,
  DeBERTa-v3-base, T5-base, BART-base, Whisper-base, ViT-B/16, Swin-T, ConvNeXt-T, ResNet-50,
  EfficientNet-B0, a PTB-large LSTM LM, GPT-J-6B, Persimmon-8B, StableLM-3B-4E1T, Phi-3-mini,
  Qwen1.5-MoE-A2.7B, Granite-3.0-1B-A400M, Mamba2-130M, ALBERT-base-v2, MobileBERT, opus-mt-en-de,
  wav2vec2-base, BEiT-base/16, SegFormer-B0; these last thirteen counted on FakeTensors, not yet exported
  at that size). The dynamo exports are built under torch's
  ``FakeTensorMode`` (no weight is ever allocated; the recipe of ``examples/make_examples.py``),
  except where the constructor reads tensor values (ConvNeXt, ViT): those small models get real
  weights (``built_on`` says so).
  The TorchScript exporter cannot trace FakeTensors, so it gets real random weights, and a model
  whose weights pass ``--ts-weight-limit`` (default 2 GiB: the 7B ones) is recorded under
  ``"failures"`` as not built, with that reason.

Needs ``.venv-integration`` (torch 2.13.0 CPU, transformers, onnxscript, onnx)::

    .venv-integration/bin/python tests/zoo/make_zoo.py                    # small zoo -> tests/zoo/
    .venv-integration/bin/python tests/zoo/make_zoo.py --only gpt2 --only bert
    .venv-integration/bin/python tests/zoo/make_zoo.py --exporter dynamo  # one exporter only
    .venv-integration/bin/python tests/zoo/make_zoo.py --realistic .cache/zoo
    .venv-integration/bin/python tests/zoo/make_zoo.py --realistic .cache/zoo --only llama
    .venv-integration/bin/python tests/zoo/make_zoo.py --list             # the architecture names
    .venv-integration/bin/python tests/zoo/make_zoo.py --annotate         # recompute the counts only

``OUTDIR/zoo.json`` (small: ``tests/zoo/zoo.json``) is updated entry by entry, so ``--only`` runs
add to it. Its layout::

    {"versions": {...}, "size": "small" | "realistic",
     "files": {"<file>.onnx": {"architecture", "model_class", "exporter", "opset", "style",
                               "param_count", "tied_param_count", "buffer_param_count",
                               "folded_param_count", "dims", "inputs", "config", "node_count",
                               "size_bytes", "description"}},
     "failures": {"<arch>_<exporter>": {"architecture", "exporter", "opset", "error"}}}

The exit status is 0 when every requested export was written, 1 when some are in ``"failures"``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Set before transformers is imported: configs are built in code, nothing is fetched.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import onnx  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

__all__ = ["ARCHS", "Arch", "build_arch", "main"]

ZOO_DIR = Path(__file__).resolve().parent
REPO_ROOT = ZOO_DIR.parent.parent

# The export, weighting and FakeTensor helpers are the examples' own (one recipe for both sets).
_spec = importlib.util.spec_from_file_location("make_examples",
                                               REPO_ROOT / "examples" / "make_examples.py")
mx = importlib.util.module_from_spec(_spec)
sys.modules["make_examples"] = mx
_spec.loader.exec_module(mx)
Built = mx.Built

SEED = 0
# Style "consts" strips tensors of at least this many bytes (the examples' threshold).
CONSTS_THRESHOLD_BYTES = 1024
STYLES = {"consts": CONSTS_THRESHOLD_BYTES, "bare": 0}
EXPORTERS = {"dynamo": 18, "ts": 17, "ts_train": 17}
# ``ts_train``: TorchScript in training mode without constant folding
# (``training=TrainingMode.TRAINING, do_constant_folding=False``), which keeps what an eval-mode
# export folds away (each BatchNorm as an op, Swin's relative position bias tables as gathered
# parameters), so the importer's count is exact on them. Built only for the architectures whose
# other exports fold parameters, in the ``bare`` style only, to keep the zoo's test time.
TRAINING_ARCHS = ("resnet", "efficientnet", "swin", "wav2vec2", "beit", "segformer")
TRAINING_STYLES = ("bare",)
# The TorchScript exporter needs real weights; above this many bytes of them, not built.
TS_WEIGHT_LIMIT_BYTES = 2 * 1024**3
# Above this, a model no longer serialises into one protobuf message (TorchScript: export to a path).
PROTOBUF_LIMIT_BYTES = int(1.8 * 1024**3)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Arch:
    """One architecture of the zoo."""

    name: str
    """File stem prefix: ``<name>_<exporter>_<style>.onnx``."""
    description: str
    """Small and realistic sizes, one line each way."""
    build: Callable[..., Any]
    """``build(realistic=bool, exporter="dynamo"|"ts", fake=bool) -> Built``."""


# --------------------------------------------------------------------------------------------
# Model construction


def _make(model_cls: type, cfg: Any, *, fake: bool) -> nn.Module:
    """The model with random distinct weights (fixed seed), or FakeTensor weights (no storage)."""
    if fake:
        return mx._fake_hf(model_cls, cfg)
    torch.manual_seed(SEED)
    return mx._randomise(model_cls(cfg).eval())


def _plain(factory: Callable[[], nn.Module], *, fake: bool) -> nn.Module:
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            model = factory()
        return model.eval()
    torch.manual_seed(SEED)
    return mx._randomise(factory().eval())


def _inputs(model: nn.Module, tensors: dict[str, torch.Tensor], *, fake: bool
            ) -> dict[str, torch.Tensor]:
    return {k: mx._fake_like(model, v) for k, v in tensors.items()} if fake else tensors


def _ids(vocab: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(SEED))


def _built(model: nn.Module, tensors: dict[str, torch.Tensor], dims: dict[str, list[str | int]],
           config: dict[str, Any], *, exporter: str, fake: bool,
           max_sizes: dict[str, int] | None = None, hf: bool = True) -> Built:
    """A ``Built`` for either exporter: ``dims`` names each input's dims (str: symbolic).

    HF models take keyword inputs and return a ModelOutput; for the TorchScript exporter their
    forward is restricted to exactly these inputs and to the logits (``_restrict_forward``), and
    plain modules take the inputs positionally.
    """
    tensors = _inputs(model, tensors, fake=fake)
    max_sizes = max_sizes or {}
    if exporter == "dynamo":
        made: dict[str, torch.export.Dim] = {}

        def dim(name: str) -> torch.export.Dim:
            if name not in made:
                bounds = {"max": max_sizes[name]} if name in max_sizes else {}
                made[name] = torch.export.Dim(name, **bounds)
            return made[name]

        shapes = {k: {i: dim(d) for i, d in enumerate(dims[k]) if isinstance(d, str)}
                  for k in tensors}
        if hf:
            return Built(model=model, args=(), kwargs=tensors, input_dims=dims,
                         dynamic_shapes=shapes, config=config, no_grad=True, fake_weights=fake)
        return Built(model=model, args=tuple(tensors.values()), kwargs={}, input_dims=dims,
                     dynamic_shapes=tuple(shapes.values()), config=config, no_grad=True,
                     fake_weights=fake)
    axes = {k: {i: d for i, d in enumerate(dims[k]) if isinstance(d, str)} for k in tensors}
    # The output's leading dims follow the first input's batch (and seq for token models).
    first = dims[next(iter(tensors))]
    out_axes = {0: "batch"}
    if len(first) == 2 and isinstance(first[1], str) and config.get("output_follows_seq", True):
        out_axes[1] = first[1]
    if hf:
        mx._restrict_forward(model, list(tensors))
        return Built(model=model, args=(), kwargs=tensors, input_dims=dims,
                     dynamic_axes={**axes, "logits": out_axes}, output_names=["logits"],
                     config=config, no_grad=True)
    return Built(model=model, args=tuple(tensors.values()), kwargs={}, input_dims=dims,
                 dynamic_axes={**axes, "logits": out_axes}, output_names=["logits"],
                 config=config, no_grad=True)


def _causal_lm(model_cls: str, config_cls: str, cfg: dict[str, Any], *, exporter: str,
               fake: bool, seq: int, vocab_key: str = "vocab_size",
               max_key: str | None = "max_position_embeddings") -> Built:
    """A decoder LM, input ``input_ids`` [batch, seq] (TorchScript: and an all-ones mask).

    Without an ``attention_mask``, transformers checks ``position_ids`` for packed sequences with
    ``aten::diff``, which the TorchScript exporter cannot export (see examples/README.md).
    """
    import transformers

    config = getattr(transformers, config_cls)(use_cache=False, **cfg)
    model = _make(getattr(transformers, model_cls), config, fake=fake)
    vocab = cfg[vocab_key]
    tensors = {"input_ids": _ids(vocab, 2, seq)}
    if exporter == "ts":
        tensors["attention_mask"] = torch.ones(2, seq, dtype=torch.int64)
    dims: dict[str, list[str | int]] = {k: ["batch", "seq"] for k in tensors}
    max_sizes = {"seq": cfg[max_key]} if max_key else {}
    record = {"model_class": model_cls, **_jsonable(cfg), "example_batch": 2, "example_seq": seq}
    return _built(model, tensors, dims, record, exporter=exporter, fake=fake, max_sizes=max_sizes)


def _masked_lm(model_cls: str, config_cls: str, cfg: dict[str, Any], *, exporter: str,
               fake: bool, seq: int, max_seq: int) -> Built:
    import transformers

    config = getattr(transformers, config_cls)(**cfg)
    model = _make(getattr(transformers, model_cls), config, fake=fake)
    tensors = {"input_ids": _ids(cfg["vocab_size"], 2, seq)}
    # RoBERTa's positions count from pad+1: ids equal to the pad id would shift them.
    tensors["input_ids"].clamp_(min=3)
    record = {"model_class": model_cls, **_jsonable(cfg), "example_batch": 2, "example_seq": seq}
    return _built(model, tensors, {"input_ids": ["batch", "seq"]}, record, exporter=exporter,
                  fake=fake, max_sizes={"seq": max_seq})


def _seq2seq(model_cls: str, config_cls: str, cfg: dict[str, Any], *, exporter: str, fake: bool,
             seq: int, tgt_seq: int, max_seq: int, vocab: int) -> Built:
    import transformers

    config = getattr(transformers, config_cls)(use_cache=False, **cfg)
    model = _make(getattr(transformers, model_cls), config, fake=fake)
    tensors = {"input_ids": _ids(vocab, 2, seq).clamp_(min=3),
               "decoder_input_ids": _ids(vocab, 2, tgt_seq).clamp_(min=3)}
    dims: dict[str, list[str | int]] = {"input_ids": ["batch", "seq"],
                                        "decoder_input_ids": ["batch", "tgt_seq"]}
    record = {"model_class": model_cls, **_jsonable(cfg), "example_batch": 2, "example_seq": seq,
              "example_tgt_seq": tgt_seq, "output_follows_seq": False}
    built = _built(model, tensors, dims, record, exporter=exporter, fake=fake,
                   max_sizes={"seq": max_seq, "tgt_seq": max_seq})
    if exporter == "ts":
        # The logits follow the decoder's length.
        axes = dict(built.dynamic_axes, logits={0: "batch", 1: "tgt_seq"})
        built = dataclasses.replace(built, dynamic_axes=axes)
    return built


def _vision(model_cls: str, config_cls: str, cfg: dict[str, Any], *, exporter: str, fake: bool,
            image: int, channels: int = 3) -> Built:
    import transformers

    config = getattr(transformers, config_cls)(**cfg)
    model = _make(getattr(transformers, model_cls), config, fake=fake)
    pixels = torch.randn(2, channels, image, image, generator=torch.Generator().manual_seed(SEED))
    record = {"model_class": model_cls, **_jsonable(cfg), "image_size": image, "example_batch": 2}
    return _built(model, {"pixel_values": pixels},
                  {"pixel_values": ["batch", channels, image, image]}, record,
                  exporter=exporter, fake=fake)


def _jsonable(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items()
            if isinstance(v, (int, float, str, bool, list, tuple, type(None)))}


# --------------------------------------------------------------------------------------------
# The architectures: small (tests) and realistic (bench) configs


def gpt2(*, realistic: bool, exporter: str, fake: bool) -> Built:
    cfg = (dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
           if realistic else
           dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128,
                bos_token_id=None, eos_token_id=None))
    return _causal_lm("GPT2LMHeadModel", "GPT2Config", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16, max_key="n_positions")


def gpt_neox(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Pythia-160M.
    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                intermediate_size=3072, vocab_size=50304, max_position_embeddings=2048,
                rotary_pct=0.25)
           if realistic else
           dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256,
                vocab_size=1000, max_position_embeddings=128, rotary_pct=0.25))
    return _causal_lm("GPTNeoXForCausalLM", "GPTNeoXConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def opt(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # OPT-125M.
    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, ffn_dim=3072,
                vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=768)
           if realistic else
           dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, ffn_dim=256,
                vocab_size=1000, max_position_embeddings=128, word_embed_proj_dim=64))
    return _causal_lm("OPTForCausalLM", "OPTConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def bloom(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # BLOOM-560M (ALiBi positions: no position table, no length limit).
    cfg = (dict(n_layer=24, hidden_size=1024, n_head=16, vocab_size=250880)
           if realistic else dict(n_layer=2, hidden_size=64, n_head=4, vocab_size=1000))
    return _causal_lm("BloomForCausalLM", "BloomConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16, max_key=None)


def falcon(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Falcon-7B: multi-query attention, parallel attention/MLP, rotary.
    cfg = (dict(num_hidden_layers=32, hidden_size=4544, num_attention_heads=71, vocab_size=65024,
                multi_query=True, parallel_attn=True, bias=False, alibi=False,
                new_decoder_architecture=False, max_position_embeddings=2048)
           if realistic else
           dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000,
                multi_query=True, parallel_attn=True, bias=False, alibi=False,
                new_decoder_architecture=False, max_position_embeddings=128))
    return _causal_lm("FalconForCausalLM", "FalconConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def _llama_cfg(realistic: dict[str, Any], small: dict[str, Any], is_realistic: bool
               ) -> dict[str, Any]:
    return realistic if is_realistic else small


_SMALL_DECODER = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, vocab_size=1000,
                      max_position_embeddings=256)


def llama(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Llama-2-7B.
    cfg = _llama_cfg(dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                          num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                          max_position_embeddings=4096),
                     dict(_SMALL_DECODER), realistic)
    return _causal_lm("LlamaForCausalLM", "LlamaConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def mistral(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Mistral-7B-v0.1 (sliding window 4096).
    cfg = _llama_cfg(dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                          num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                          max_position_embeddings=32768, sliding_window=4096),
                     dict(_SMALL_DECODER, sliding_window=64), realistic)
    return _causal_lm("MistralForCausalLM", "MistralConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def qwen2(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Qwen2-0.5B: QKV biases, tied embeddings.
    cfg = _llama_cfg(dict(num_hidden_layers=24, hidden_size=896, num_attention_heads=14,
                          num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                          max_position_embeddings=32768, tie_word_embeddings=True),
                     dict(_SMALL_DECODER, tie_word_embeddings=True), realistic)
    return _causal_lm("Qwen2ForCausalLM", "Qwen2Config", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def gemma(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Gemma-2B: multi-query (1 KV head), head_dim 256, GeGLU, tied embeddings.
    cfg = _llama_cfg(dict(num_hidden_layers=18, hidden_size=2048, num_attention_heads=8,
                          num_key_value_heads=1, head_dim=256, intermediate_size=16384,
                          vocab_size=256000, max_position_embeddings=8192),
                     dict(_SMALL_DECODER, head_dim=16), realistic)
    return _causal_lm("GemmaForCausalLM", "GemmaConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def phi(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Phi-2: parallel attention/MLP, partial rotary (0.4), biases, LayerNorm.
    cfg = (dict(num_hidden_layers=32, hidden_size=2560, num_attention_heads=32,
                intermediate_size=10240, vocab_size=51200, max_position_embeddings=2048,
                partial_rotary_factor=0.4)
           if realistic else
           dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256,
                vocab_size=1000, max_position_embeddings=256, partial_rotary_factor=0.5))
    return _causal_lm("PhiForCausalLM", "PhiConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def mixtral(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Mixtral-8x7B: 8 experts, top-2. transformers' default "grouped_mm" experts do not export;
    # "batched_mm" does, as a dense gather of the expert weights (see examples/README.md).
    cfg = _llama_cfg(dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                          num_key_value_heads=8, intermediate_size=14336, vocab_size=32000,
                          max_position_embeddings=32768, num_local_experts=8,
                          num_experts_per_tok=2, experts_implementation="batched_mm"),
                     dict(_SMALL_DECODER, num_local_experts=4, num_experts_per_tok=2,
                          experts_implementation="batched_mm"), realistic)
    return _causal_lm("MixtralForCausalLM", "MixtralConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


_SMALL_ENCODER = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                      intermediate_size=128, vocab_size=1000)


def bert(*, realistic: bool, exporter: str, fake: bool) -> Built:
    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                intermediate_size=3072, vocab_size=30522, max_position_embeddings=512)
           if realistic else dict(_SMALL_ENCODER, max_position_embeddings=128))
    return _masked_lm("BertForMaskedLM", "BertConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16, max_seq=cfg["max_position_embeddings"])


def roberta(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Positions are offset by pad+1 = 2: 514 positions serve 512 tokens.
    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                intermediate_size=3072, vocab_size=50265, max_position_embeddings=514,
                type_vocab_size=1)
           if realistic else dict(_SMALL_ENCODER, max_position_embeddings=130, type_vocab_size=1))
    return _masked_lm("RobertaForMaskedLM", "RobertaConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16, max_seq=cfg["max_position_embeddings"] - 2)


def deberta_v2(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # DeBERTa-v3-base: disentangled relative attention, 256 position buckets, no absolute positions.
    common = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                  share_att_key=True, position_biased_input=False, max_relative_positions=-1,
                  type_vocab_size=0)
    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                intermediate_size=3072, vocab_size=128100, max_position_embeddings=512,
                position_buckets=256, **common)
           if realistic else
           dict(_SMALL_ENCODER, max_position_embeddings=128, position_buckets=32, **common))
    return _masked_lm("DebertaV2ForMaskedLM", "DebertaV2Config", cfg, exporter=exporter,
                      fake=fake, seq=128 if realistic else 16, max_seq=512)


def t5(*, realistic: bool, exporter: str, fake: bool) -> Built:
    cfg = (dict(num_layers=12, num_decoder_layers=12, d_model=768, num_heads=12, d_kv=64,
                d_ff=3072, vocab_size=32128, decoder_start_token_id=0)
           if realistic else
           dict(num_layers=2, num_decoder_layers=2, d_model=64, num_heads=4, d_kv=16, d_ff=128,
                vocab_size=1000, decoder_start_token_id=0))
    return _seq2seq("T5ForConditionalGeneration", "T5Config", cfg, exporter=exporter, fake=fake,
                    seq=128 if realistic else 16, tgt_seq=64 if realistic else 8, max_seq=512,
                    vocab=cfg["vocab_size"])


def bart(*, realistic: bool, exporter: str, fake: bool) -> Built:
    cfg = (dict(encoder_layers=6, decoder_layers=6, d_model=768, encoder_attention_heads=12,
                decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                vocab_size=50265, max_position_embeddings=1024)
           if realistic else
           dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                vocab_size=1000, max_position_embeddings=128))
    return _seq2seq("BartForConditionalGeneration", "BartConfig", cfg, exporter=exporter,
                    fake=fake, seq=128 if realistic else 16, tgt_seq=64 if realistic else 8,
                    max_seq=cfg["max_position_embeddings"], vocab=cfg["vocab_size"])


def whisper(*, realistic: bool, exporter: str, fake: bool) -> Built:
    """Whisper: log-mel frames [batch, mels, 2 * max_source_positions] (fixed: the encoder checks
    the length) and decoder tokens [batch, tgt_seq]."""
    import transformers

    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
                   suppress_tokens=None, begin_suppress_tokens=None)
    cfg = (dict(encoder_layers=6, decoder_layers=6, d_model=512, encoder_attention_heads=8,
                decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                vocab_size=51865, num_mel_bins=80, max_source_positions=1500,
                max_target_positions=448)
           if realistic else
           dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                vocab_size=1000, num_mel_bins=16, max_source_positions=32,
                max_target_positions=64))
    if realistic:
        special = dict(special, pad_token_id=50257, bos_token_id=50257, eos_token_id=50257,
                       decoder_start_token_id=50258)
    config = transformers.WhisperConfig(use_cache=False, **cfg, **special)
    model = _make(transformers.WhisperForConditionalGeneration, config, fake=fake)
    frames = 2 * cfg["max_source_positions"]
    tgt_seq = 64 if realistic else 8
    gen = torch.Generator().manual_seed(SEED)
    tensors = {"input_features": torch.randn(2, cfg["num_mel_bins"], frames, generator=gen),
               "decoder_input_ids": _ids(cfg["vocab_size"], 2, tgt_seq).clamp_(min=4)}
    dims: dict[str, list[str | int]] = {"input_features": ["batch", cfg["num_mel_bins"], frames],
                                        "decoder_input_ids": ["batch", "tgt_seq"]}
    if exporter == "ts":
        # As for the decoder LMs: without a mask the decoder checks its positions with aten::diff.
        tensors["decoder_attention_mask"] = torch.ones(2, tgt_seq, dtype=torch.int64)
        dims["decoder_attention_mask"] = ["batch", "tgt_seq"]
    record = {"model_class": "WhisperForConditionalGeneration", **cfg, "frames": frames,
              "example_batch": 2, "example_tgt_seq": tgt_seq}
    built = _built(model, tensors, dims, record, exporter=exporter, fake=fake,
                   max_sizes={"tgt_seq": cfg["max_target_positions"]})
    if exporter == "ts":
        built = dataclasses.replace(built, dynamic_axes=dict(built.dynamic_axes,
                                                             logits={0: "batch", 1: "tgt_seq"}))
    return built


def vit(*, realistic: bool, exporter: str, fake: bool) -> Built:
    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                intermediate_size=3072, image_size=224, patch_size=16, num_labels=1000)
           if realistic else
           dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                image_size=32, patch_size=4, num_labels=10))
    return _vision("ViTForImageClassification", "ViTConfig", cfg, exporter=exporter, fake=fake,
                   image=cfg["image_size"])


def swin(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Swin-T.
    cfg = (dict(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 6, 2],
                num_heads=[3, 6, 12, 24], window_size=7, num_labels=1000)
           if realistic else
           dict(image_size=32, patch_size=2, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                window_size=4, num_labels=10))
    return _vision("SwinForImageClassification", "SwinConfig", cfg, exporter=exporter, fake=fake,
                   image=cfg["image_size"])


def convnext(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # ConvNeXt-T.
    cfg = (dict(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3], num_labels=1000)
           if realistic else
           dict(hidden_sizes=[32, 64], depths=[2, 2], num_stages=2, num_labels=10))
    return _vision("ConvNextForImageClassification", "ConvNextConfig", cfg, exporter=exporter,
                   fake=fake, image=224 if realistic else 32)


def resnet(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # ResNet-50 (ResNetConfig's defaults are microsoft/resnet-50's).
    cfg = (dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                layer_type="bottleneck", num_labels=1000)
           if realistic else
           dict(embedding_size=16, hidden_sizes=[32, 64], depths=[1, 1], layer_type="bottleneck",
                num_labels=10))
    return _vision("ResNetForImageClassification", "ResNetConfig", cfg, exporter=exporter,
                   fake=fake, image=224 if realistic else 32)


def efficientnet(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # EfficientNet-B0 (EfficientNetConfig's defaults are B7's); small: narrow and shallow.
    cfg = (dict(image_size=224, width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280,
                dropout_rate=0.2, num_labels=1000)
           if realistic else
           # hidden_dim must be round_filters(1280) at this width: the top conv's channels.
           dict(image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320,
                num_labels=10))
    return _vision("EfficientNetForImageClassification", "EfficientNetConfig", cfg,
                   exporter=exporter, fake=fake, image=cfg["image_size"])


def lstm_lm(*, realistic: bool, exporter: str, fake: bool) -> Built:
    """Embedding -> 2-layer nn.LSTM -> Linear, the decoder NOT tied to the embedding.

    Realistic: the PTB "large" word-level LM (vocab 10000, 1500 units)."""
    sizes = (dict(vocab=10000, embed=1500, hidden=1500, layers=2) if realistic else
             dict(vocab=1000, embed=64, hidden=128, layers=2))
    model = _plain(lambda: mx.RecurrentLM("lstm", **sizes), fake=fake)
    seq = 35 if realistic else 16
    record = {"model_class": "RecurrentLM (nn.Embedding, nn.LSTM, nn.Linear; untied)", **sizes,
              "example_batch": 2, "example_seq": seq}
    return _built(model, {"input_ids": _ids(sizes["vocab"], 2, seq)},
                  {"input_ids": ["batch", "seq"]}, record, exporter=exporter, fake=fake, hf=False)


# Issue 25: twelve more architectures that earlier sweeps showed the importer reads
# (tests/data/{outside_zoo,sweep_cases,reader_cases,importer_sweep_cases,mamba2_cases,moe_router_cases}).


def gptj(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # GPT-J-6B: parallel attention/MLP, interleaved rotary on the first rotary_dim channels.
    cfg = (dict(n_layer=28, n_embd=4096, n_head=16, rotary_dim=64, vocab_size=50400, n_positions=2048)
           if realistic else dict(n_layer=2, n_embd=64, n_head=4, rotary_dim=8, vocab_size=1000, n_positions=256))
    cfg.update(bos_token_id=None, eos_token_id=None)
    return _causal_lm("GPTJForCausalLM", "GPTJConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16, max_key="n_positions")


def persimmon(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Persimmon-8B: squared ReLU, QK-LayerNorm, partial rotary 0.5, fused QKV.
    cfg = (dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=64, intermediate_size=16384,
                vocab_size=262144, max_position_embeddings=16384)
           if realistic else dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                  intermediate_size=256, vocab_size=1000, max_position_embeddings=256))
    cfg.update(partial_rotary_factor=0.5, qk_layernorm=True, hidden_act="relu2", tie_word_embeddings=False)
    return _causal_lm("PersimmonForCausalLM", "PersimmonConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def stablelm(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # StableLM-3B-4E1T: LayerNorm, partial rotary 0.25, untied head.
    cfg = _llama_cfg(dict(num_hidden_layers=32, hidden_size=2560, num_attention_heads=32,
                          num_key_value_heads=32, intermediate_size=6912, vocab_size=50304,
                          max_position_embeddings=4096),
                     dict(_SMALL_DECODER), realistic)
    cfg.update(partial_rotary_factor=0.25, tie_word_embeddings=False)
    return _causal_lm("StableLmForCausalLM", "StableLmConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def phi3(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Phi-3-mini-4k: fused qkv_proj and gate_up_proj, full rotary.
    cfg = _llama_cfg(dict(num_hidden_layers=32, hidden_size=3072, num_attention_heads=32,
                          num_key_value_heads=32, intermediate_size=8192, vocab_size=32064,
                          max_position_embeddings=4096),
                     dict(_SMALL_DECODER), realistic)
    cfg.update(pad_token_id=0, tie_word_embeddings=False)
    return _causal_lm("Phi3ForCausalLM", "Phi3Config", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def qwen2_moe(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Qwen1.5-MoE-A2.7B: 60 experts top-4 and a sigmoid-gated shared expert per layer.
    cfg = _llama_cfg(dict(num_hidden_layers=24, hidden_size=2048, num_attention_heads=16,
                          num_key_value_heads=16, intermediate_size=5632, moe_intermediate_size=1408,
                          shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                          vocab_size=151936, max_position_embeddings=8192),
                     dict(_SMALL_DECODER, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                          num_experts=4, num_experts_per_tok=2), realistic)
    cfg.update(experts_implementation="batched_mm", tie_word_embeddings=False)
    return _causal_lm("Qwen2MoeForCausalLM", "Qwen2MoeConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def granite_moe(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Granite-3.0-1B-A400M: 32 experts top-8, top-k of the logits then a softmax over the k.
    cfg = _llama_cfg(dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
                          num_key_value_heads=8, intermediate_size=512, num_local_experts=32,
                          num_experts_per_tok=8, vocab_size=49155, max_position_embeddings=4096),
                     dict(_SMALL_DECODER, num_local_experts=4, num_experts_per_tok=2), realistic)
    cfg.update(experts_implementation="batched_mm", tie_word_embeddings=True)
    return _causal_lm("GraniteMoeForCausalLM", "GraniteMoeConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16)


def mamba2(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # Mamba2-130M: chunked SSD scan (torch path), no attention, no position limit.
    cfg = (dict(num_hidden_layers=24, hidden_size=768, state_size=128, num_heads=24, head_dim=64,
                n_groups=1, vocab_size=50288, chunk_size=256)
           if realistic else dict(num_hidden_layers=2, hidden_size=64, state_size=16, num_heads=8,
                                  head_dim=16, n_groups=1, vocab_size=1000, chunk_size=8))
    cfg.update(expand=2, tie_word_embeddings=realistic)  # Mamba2-130M ties; the small zoo file does not
    return _causal_lm("Mamba2ForCausalLM", "Mamba2Config", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16, max_key=None)


def albert(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # ALBERT-base-v2: one layer shared by every depth, factorised 128-wide embedding, tied decoder.
    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                vocab_size=30000, embedding_size=128, max_position_embeddings=512)
           if realistic else dict(_SMALL_ENCODER, embedding_size=32, max_position_embeddings=128))
    return _masked_lm("AlbertForMaskedLM", "AlbertConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16, max_seq=cfg["max_position_embeddings"])


def mobilebert(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # MobileBERT (uncased): bottlenecks, stacked FFNs, a head over cat(decoder.T, dense).
    cfg = (dict(num_hidden_layers=24, hidden_size=512, num_attention_heads=4, intermediate_size=512,
                embedding_size=128, intra_bottleneck_size=128, true_hidden_size=128,
                num_feedforward_networks=4, vocab_size=30522, max_position_embeddings=512)
           if realistic else
           dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=128,
                embedding_size=64, intra_bottleneck_size=64, true_hidden_size=64,
                num_feedforward_networks=2, vocab_size=1000, max_position_embeddings=128))
    return _masked_lm("MobileBertForMaskedLM", "MobileBertConfig", cfg, exporter=exporter, fake=fake,
                      seq=128 if realistic else 16, max_seq=cfg["max_position_embeddings"])


def marian(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # opus-mt-en-de: sinusoidal position tables (frozen parameters), scaled, shared, tied embeddings.
    cfg = (dict(encoder_layers=6, decoder_layers=6, d_model=512, encoder_attention_heads=8,
                decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                vocab_size=58101, max_position_embeddings=512, pad_token_id=58100,
                decoder_start_token_id=58100, eos_token_id=0, forced_eos_token_id=0)
           if realistic else
           dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
                max_position_embeddings=128, pad_token_id=2, decoder_start_token_id=2, eos_token_id=0,
                forced_eos_token_id=0))
    cfg.update(scale_embedding=True, activation_function="swish")
    return _seq2seq("MarianMTModel", "MarianConfig", cfg, exporter=exporter, fake=fake,
                    seq=128 if realistic else 16, tgt_seq=64 if realistic else 8,
                    max_seq=cfg["max_position_embeddings"], vocab=cfg["vocab_size"] - 1)


def wav2vec2(*, realistic: bool, exporter: str, fake: bool) -> Built:
    """Wav2Vec2 CTC on raw audio [batch, samples]: a conv feature extractor, a weight-normed grouped
    positional conv, a transformer. ``mask_time_prob`` 0: the training-only ``masked_spec_embed`` is
    not built (no forward op would read it)."""
    import transformers

    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                vocab_size=32)
           if realistic else
           dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                conv_dim=[32, 32, 32], conv_stride=[5, 2, 2], conv_kernel=[10, 3, 3],
                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32,
                do_stable_layer_norm=True, feat_extract_norm="layer"))
    cfg.update(mask_time_prob=0.0)
    model = _make(transformers.Wav2Vec2ForCTC, transformers.Wav2Vec2Config(**cfg), fake=fake)
    samples = 16000 if realistic else 4000
    wave = torch.randn(2, samples, generator=torch.Generator().manual_seed(SEED))
    record = {"model_class": "Wav2Vec2ForCTC", **_jsonable(cfg), "example_batch": 2,
              "example_samples": samples, "output_follows_seq": False}
    return _built(model, {"input_values": wave}, {"input_values": ["batch", "samples"]}, record,
                  exporter=exporter, fake=fake)


def beit(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # BEiT-base/16: per-layer relative position bias, layer scale, mean pooling.
    cfg = (dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                image_size=224, patch_size=16, num_labels=1000)
           if realistic else
           dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                image_size=32, patch_size=4, num_labels=10))
    cfg.update(use_relative_position_bias=True, use_mean_pooling=True, layer_scale_init_value=0.1)
    return _vision("BeitForImageClassification", "BeitConfig", cfg, exporter=exporter, fake=fake,
                   image=cfg["image_size"])


def segformer(*, realistic: bool, exporter: str, fake: bool) -> Built:
    # SegFormer-B0 (ADE20k, 512 x 512): overlapping patch merges, efficient (spatially reduced)
    # self-attention, an all-MLP decode head.
    cfg = (dict(num_encoder_blocks=4, depths=[2, 2, 2, 2], sr_ratios=[8, 4, 2, 1],
                hidden_sizes=[32, 64, 160, 256], num_attention_heads=[1, 2, 5, 8],
                decoder_hidden_size=256, num_labels=150)
           if realistic else
           dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[32, 64],
                patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[4, 4],
                decoder_hidden_size=64, num_labels=10))
    return _vision("SegformerForSemanticSegmentation", "SegformerConfig", cfg, exporter=exporter,
                   fake=fake, image=512 if realistic else 64)


ARCHS: dict[str, Arch] = {a.name: a for a in [
    Arch(name="gpt2", build=gpt2, description="GPT2LMHeadModel; realistic GPT-2 small 124M"),
    Arch(name="gpt_neox", build=gpt_neox,
         description="GPTNeoXForCausalLM (rotary 25%); realistic Pythia-160M"),
    Arch(name="opt", build=opt, description="OPTForCausalLM; realistic OPT-125M"),
    Arch(name="bloom", build=bloom, description="BloomForCausalLM (ALiBi); realistic BLOOM-560M"),
    Arch(name="falcon", build=falcon,
         description="FalconForCausalLM (multi-query, parallel attention); realistic Falcon-7B"),
    Arch(name="llama", build=llama, description="LlamaForCausalLM (GQA 4/2); realistic Llama-2-7B"),
    Arch(name="mistral", build=mistral,
         description="MistralForCausalLM (GQA, sliding window); realistic Mistral-7B"),
    Arch(name="qwen2", build=qwen2,
         description="Qwen2ForCausalLM (QKV biases, tied); realistic Qwen2-0.5B"),
    Arch(name="gemma", build=gemma,
         description="GemmaForCausalLM (GeGLU, tied); realistic Gemma-2B"),
    Arch(name="phi", build=phi, description="PhiForCausalLM (partial rotary); realistic Phi-2"),
    Arch(name="mixtral", build=mixtral,
         description="MixtralForCausalLM (MoE top-2, batched_mm experts); realistic Mixtral-8x7B"),
    Arch(name="bert", build=bert, description="BertForMaskedLM; realistic BERT-base"),
    Arch(name="roberta", build=roberta, description="RobertaForMaskedLM; realistic RoBERTa-base"),
    Arch(name="deberta_v2", build=deberta_v2,
         description="DebertaV2ForMaskedLM (relative attention); realistic DeBERTa-v3-base"),
    Arch(name="t5", build=t5, description="T5ForConditionalGeneration; realistic T5-base"),
    Arch(name="bart", build=bart, description="BartForConditionalGeneration; realistic BART-base"),
    Arch(name="whisper", build=whisper,
         description="WhisperForConditionalGeneration; realistic Whisper-base"),
    Arch(name="vit", build=vit, description="ViTForImageClassification; realistic ViT-B/16"),
    Arch(name="swin", build=swin, description="SwinForImageClassification; realistic Swin-T"),
    Arch(name="convnext", build=convnext,
         description="ConvNextForImageClassification; realistic ConvNeXt-T"),
    Arch(name="resnet", build=resnet,
         description="ResNetForImageClassification (bottleneck); realistic ResNet-50"),
    Arch(name="efficientnet", build=efficientnet,
         description="EfficientNetForImageClassification (MBConv); realistic EfficientNet-B0"),
    Arch(name="lstm_lm", build=lstm_lm,
         description="Embedding -> 2-layer nn.LSTM -> untied Linear; realistic PTB-large LM"),
    Arch(name="gptj", build=gptj, description="GPTJForCausalLM (parallel, interleaved rotary); realistic GPT-J-6B"),
    Arch(name="persimmon", build=persimmon,
         description="PersimmonForCausalLM (relu2, QK-LayerNorm); realistic Persimmon-8B"),
    Arch(name="stablelm", build=stablelm,
         description="StableLmForCausalLM (partial rotary 0.25); realistic StableLM-3B-4E1T"),
    Arch(name="phi3", build=phi3, description="Phi3ForCausalLM (fused qkv, gate_up); realistic Phi-3-mini-4k"),
    Arch(name="qwen2_moe", build=qwen2_moe,
         description="Qwen2MoeForCausalLM (top-2 of 4, shared expert); realistic Qwen1.5-MoE-A2.7B"),
    Arch(name="granite_moe", build=granite_moe,
         description="GraniteMoeForCausalLM (top-k-first router, tied); realistic Granite-3.0-1B-A400M"),
    Arch(name="mamba2", build=mamba2, description="Mamba2ForCausalLM (chunked SSD scan); realistic Mamba2-130M"),
    Arch(name="albert", build=albert,
         description="AlbertForMaskedLM (one shared layer, factorised embedding); realistic ALBERT-base-v2"),
    Arch(name="mobilebert", build=mobilebert,
         description="MobileBertForMaskedLM (bottlenecks, 2 FFNs); realistic MobileBERT"),
    Arch(name="marian", build=marian,
         description="MarianMTModel (sinusoidal position parameters, tied); realistic opus-mt-en-de"),
    Arch(name="wav2vec2", build=wav2vec2,
         description="Wav2Vec2ForCTC (conv features, weight-normed positional conv); realistic wav2vec2-base"),
    Arch(name="beit", build=beit,
         description="BeitForImageClassification (relative position bias); realistic BEiT-base/16"),
    Arch(name="segformer", build=segformer,
         description="SegformerForSemanticSegmentation (spatial-reduction attention); realistic SegFormer-B0"),
]}


# --------------------------------------------------------------------------------------------
# Export and save


def _model_exporter(exporter: str) -> str:
    """The exporter the model is built for (``ts_train`` takes the TorchScript inputs)."""
    return "ts" if exporter == "ts_train" else exporter


def _export(built: Built, exporter: str, *, fake: bool, data_name: str) -> onnx.ModelProto:
    """The exported model: weights inline, or (``fake``) large initializers already external."""
    if fake:
        return mx._export_fake(built, data_location=data_name)
    if exporter == "dynamo":
        with torch.no_grad():
            program = torch.onnx.export(built.model, built.args, kwargs=built.kwargs,
                                        dynamo=True, opset_version=EXPORTERS["dynamo"],
                                        dynamic_shapes=built.dynamic_shapes)
        return program.model_proto
    options = dict(dynamo=False, opset_version=EXPORTERS["ts"], input_names=list(built.input_dims),
                   output_names=built.output_names, dynamic_axes=built.dynamic_axes)
    if exporter == "ts_train":
        options.update(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    weight_bytes = sum(p.numel() * p.element_size() for p in built.model.parameters())
    if weight_bytes < PROTOBUF_LIMIT_BYTES:
        buffer = io.BytesIO()
        with torch.no_grad():
            torch.onnx.export(built.model, mx._positional(built), buffer, **options)
        return onnx.load_model_from_string(buffer.getvalue())
    # Over protobuf's 2 GiB the exporter writes the weights as external data beside a file path;
    # they are read by reference only (left external, their files deleted with the folder).
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        with torch.no_grad():
            torch.onnx.export(built.model, mx._positional(built), str(path), **options)
        proto = onnx.load(str(path), load_external_data=False)
    for graph in _graphs(proto.graph):
        for init in graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = data_name
    return proto


def _to_raw(proto: onnx.ModelProto) -> None:
    """Store every inline initializer as ``raw_data`` (``onnx.save_model`` externalises only those)."""
    from onnx import numpy_helper

    for graph in _graphs(proto.graph):
        for i, init in enumerate(graph.initializer):
            if init.data_location == onnx.TensorProto.EXTERNAL or init.HasField("raw_data"):
                continue
            graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init),
                                                                  init.name))


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            for sub in attr.graphs:
                yield from _graphs(sub)


# The dynamo exporter's per-node debug strings (the FX node printed, the module classes): 80% of
# a small file's bytes, read by no importer. The module path stays in ``namespace`` and
# ``pkg.torch.onnx.name_scopes``.
DROPPED_METADATA = ("pkg.torch.onnx.fx_node", "pkg.torch.onnx.class_hierarchy")


def _drop_debug_metadata(proto: onnx.ModelProto) -> None:
    for graph in _graphs(proto.graph):
        for node in graph.node:
            kept = [p for p in node.metadata_props if p.key not in DROPPED_METADATA]
            if len(kept) != len(node.metadata_props):
                del node.metadata_props[:]
                node.metadata_props.extend(kept)


def save_graph_only(proto: onnx.ModelProto, path: Path, *, threshold_bytes: int) -> None:
    """Write ``proto`` with every initializer of at least ``threshold_bytes`` external, no data file.

    ``threshold_bytes=0`` strips every initializer, the int64 shape constants too. ``proto`` is
    not changed (saving with external data moves the weights out of the proto it is given).
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    mx._drop_stack_traces(copy)
    _drop_debug_metadata(copy)
    _to_raw(copy)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_name = f"{path.name}.data"
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name, size_threshold=threshold_bytes)
    path.with_name(data_name).unlink(missing_ok=True)


def _fake_weight_bytes(arch: Arch) -> int | None:
    """Bytes of the realistic model's weights, built on FakeTensors; None if it cannot be."""
    try:
        probe = arch.build(realistic=True, exporter="dynamo", fake=True)
    except Exception:  # noqa: BLE001 - the caller builds it for real, then it is small
        return None
    return sum(p.numel() * p.element_size() for p in probe.model.parameters())


# The per-file counts torch gives (tied, buffer and folded elements): ``zoo_counts.py``, beside this file.
_spec = importlib.util.spec_from_file_location("zoo_counts", ZOO_DIR / "zoo_counts.py")
_counts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_counts)
_tied_count, _buffer_count, _folded_count = _counts._tied_count, _counts._buffer_count, _counts._folded_count
_initializer_shapes, _inline_float_values = _counts._initializer_shapes, _counts._inline_float_values


def _first_line(exc: BaseException) -> str:
    """``Type: first line``, and for torch.export's long reports the underlying error's line too."""
    text = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).strip().splitlines()]
    text = [line for line in text if line]
    first = f"{type(exc).__name__}: {text[0][:300] if text else ''}"
    cause = next((line for line in text[1:] if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)),
                 None)
    return f"{first} ({cause[:300]})" if cause else first


def build_arch(arch: Arch, exporter: str, out_dir: Path, *, realistic: bool,
               ts_weight_limit_bytes: int = TS_WEIGHT_LIMIT_BYTES
               ) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """Export one architecture with one exporter, save both styles; returns (records, failure)."""
    import transformers

    opset = EXPORTERS[exporter]
    # FakeTensors for the realistic dynamo exports; the TorchScript exporter needs real tensors.
    fake = realistic and exporter == "dynamo"
    key = f"{arch.name}_{exporter}"
    failure = {"architecture": arch.name, "exporter": exporter, "opset": opset}
    fake_failed = ""
    try:
        if realistic and not fake:
            weight_bytes = _fake_weight_bytes(arch)
            if weight_bytes is not None and weight_bytes > ts_weight_limit_bytes:
                return {}, {**failure, "error": (
                    f"not built: the TorchScript exporter needs real weights, "
                    f"{weight_bytes / 2**30:.1f} GiB here (limit "
                    f"{ts_weight_limit_bytes / 2**30:.1f} GiB, --ts-weight-limit)")}
        try:
            built = arch.build(realistic=realistic, exporter=_model_exporter(exporter), fake=fake)
        except Exception as exc:  # noqa: BLE001 - retried with real weights below
            if not fake:
                raise
            # Some constructors read tensor values (ConvNeXt's drop-path rates, .item()), which
            # FakeTensors do not have; those models are small, so real weights do.
            fake_failed = _first_line(exc)
            fake = False
            built = arch.build(realistic=realistic, exporter=_model_exporter(exporter), fake=False)
        param_count = sum(p.numel() for p in built.model.parameters())
        tied_count = _tied_count(built.model)
        proto = _export(built, exporter, fake=fake, data_name=f"{key}.onnx.data")
        extra_counts = {"buffer_param_count": _buffer_count(built.model),
                        "folded_param_count": _folded_count(built.model, exporter, _initializer_shapes(proto),
                                                            _inline_float_values(proto))}
    except Exception as exc:  # noqa: BLE001 - an export torch cannot do is a recorded finding
        return {}, {**failure, "error": _first_line(exc)}
    records = {}
    dims: list[str] = []
    for names in built.input_dims.values():
        dims += [d for d in names if isinstance(d, str) and d not in dims]
    for style, threshold in STYLES.items():
        if exporter == "ts_train" and style not in TRAINING_STYLES:
            continue
        path = out_dir / f"{key}_{style}.onnx"
        save_graph_only(proto, path, threshold_bytes=threshold)
        loaded = onnx.load(str(path), load_external_data=False)
        records[path.name] = {
            "architecture": arch.name,
            "model_class": built.config.get("model_class"),
            "description": arch.description,
            "exporter": exporter,
            "opset": next(o.version for o in loaded.opset_import if o.domain in ("", "ai.onnx")),
            "style": style,
            "param_count": param_count,
            "tied_param_count": tied_count,
            **extra_counts,
            "dims": dims,
            "inputs": built.input_dims,
            "config": {k: v for k, v in built.config.items()
                       if k not in ("model_class", "output_follows_seq")},
            "node_count": len(loaded.graph.node),
            "inline_initializers": sum(i.data_location != onnx.TensorProto.EXTERNAL
                                       for i in loaded.graph.initializer),
            "size_bytes": path.stat().st_size,
            "built_on": ("FakeTensorMode (no weights)" if fake else "random weights, seed 0"
                         + (f" (FakeTensorMode failed: {fake_failed})" if fake_failed else "")),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "onnx": onnx.__version__},
        }
    return records, None


def _update_manifest(path: Path, *, realistic: bool, records: dict[str, dict[str, Any]],
                     failures: dict[str, dict[str, Any] | None]) -> None:
    import transformers

    manifest = json.loads(path.read_text()) if path.exists() else {}
    files = manifest.get("files", {})
    fails = manifest.get("failures", {})
    files.update(records)
    for key, failure in failures.items():
        if failure is None:
            fails.pop(key, None)
        else:
            fails[key] = failure
            # A stale file of an export that fails now must not stay listed.
            for style in STYLES:
                files.pop(f"{key}_{style}.onnx", None)
    manifest = {
        "size": "realistic" if realistic else "small",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__},
        "dropped_metadata": list(DROPPED_METADATA) + ["pkg.torch.onnx.stack_trace"],
        "styles": {"consts": f"initializers >= {CONSTS_THRESHOLD_BYTES} bytes external, data "
                             "file deleted", "bare": "every initializer external "
                                                     "(size_threshold=0), data file deleted"},
        "files": dict(sorted(files.items())),
        "failures": dict(sorted(fails.items())),
    }
    path.write_text(json.dumps(manifest, indent=1) + "\n")


def annotate(manifest_path: Path, *, realistic: bool) -> int:
    """Recompute the per-file counts torch gives (no export) and write them into the manifest.

    Builds each listed architecture once per exporter (random weights; seconds at the small size)
    and updates ``tied_param_count``, ``buffer_param_count`` and ``folded_param_count``, checking
    that ``param_count`` is unchanged, so a new count reaches the committed files without
    re-exporting them.
    """
    manifest = json.loads(manifest_path.read_text())
    models: dict[tuple[str, str], nn.Module] = {}
    for name, record in manifest["files"].items():
        key = (record["architecture"], record["exporter"])
        if key not in models:
            try:  # FakeTensors at the realistic size (no 7B allocation); counts need no values
                models[key] = ARCHS[key[0]].build(realistic=realistic, exporter=_model_exporter(key[1]),
                                                  fake=realistic).model
            except Exception:  # noqa: BLE001 - constructors that read values (ViT, ConvNeXt) are small
                models[key] = ARCHS[key[0]].build(realistic=realistic, exporter=_model_exporter(key[1]),
                                                  fake=False).model
        model = models[key]
        shapes = _initializer_shapes(onnx.load(str(manifest_path.parent / name), load_external_data=False))
        counts = {"param_count": sum(p.numel() for p in model.parameters()),
                  "tied_param_count": _tied_count(model),
                  "buffer_param_count": _buffer_count(model),
                  # Without the values a reshaped table reads as folded (BEiT's TorchScript one):
                  # the count the build proved from the values stands.
                  "folded_param_count": min(_folded_count(model, key[1], shapes),
                                            record.get("folded_param_count", 1 << 62))}
        if counts["param_count"] != record["param_count"]:
            print(f"{name}: torch now counts {counts['param_count']:,}, the file was built at "
                  f"{record['param_count']:,}: rebuild it", file=sys.stderr)
            return 1
        record.update(counts)
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--realistic", type=Path, metavar="OUTDIR", default=None,
                        help="build the published base sizes into OUTDIR (e.g. .cache/zoo)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of the small zoo (default: tests/zoo/)")
    parser.add_argument("--only", action="append", choices=sorted(ARCHS), metavar="ARCH",
                        help="build only this architecture (repeatable)")
    parser.add_argument("--exporter", action="append", choices=sorted(EXPORTERS),
                        help="only this exporter (repeatable; default both)")
    parser.add_argument("--ts-weight-limit", type=float, default=TS_WEIGHT_LIMIT_BYTES / 2**30,
                        metavar="GIB", help="realistic TorchScript exports above this many GiB "
                                            "of weights are not built (default 2)")
    parser.add_argument("--list", action="store_true", help="print the architectures and exit")
    parser.add_argument("--annotate", action="store_true",
                        help="only recompute torch's per-file counts (tied, buffer, folded elements) "
                             "into the existing zoo.json, without exporting")
    args = parser.parse_args(argv)
    if args.list:
        for arch in ARCHS.values():
            print(f"{arch.name:14s} {arch.description}")
        return 0
    realistic = args.realistic is not None
    out_dir = args.realistic if realistic else (args.out or ZOO_DIR)
    if args.annotate:
        return annotate(out_dir / "zoo.json", realistic=realistic)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = args.only or list(ARCHS)
    exporters = args.exporter or list(EXPORTERS)
    failed = 0
    for name in names:
        for exporter in exporters:
            if exporter == "ts_train" and name not in TRAINING_ARCHS:
                continue
            start = time.perf_counter()
            records, failure = build_arch(ARCHS[name], exporter, out_dir, realistic=realistic,
                                          ts_weight_limit_bytes=int(args.ts_weight_limit * 2**30))
            took = time.perf_counter() - start
            if failure:
                failed += 1
                print(f"[{name}/{exporter}] FAILED ({took:.0f} s): {failure['error']}",
                      file=sys.stderr, flush=True)
            else:
                first = next(iter(records.values()))
                print(f"[{name}/{exporter}] {first['param_count']:,} params, "
                      f"{first['node_count']} nodes, "
                      + ", ".join(f"{f} {r['size_bytes']:,} B" for f, r in records.items())
                      + f" ({took:.0f} s)", file=sys.stderr, flush=True)
            _update_manifest(out_dir / "zoo.json", realistic=realistic, records=records,
                             failures={f"{name}_{exporter}": failure})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
