"""Build ``tests/data/multi_stack_cases/``, the files of ``tests/exporters/test_deepspeed_multi_stack.py`` (issue 25,
task H4: models whose repeated blocks are more than one chain), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24, onnxscript); no downloads, random
weights, seed 0, with ``tests/zoo/make_zoo.py``'s builders, its dynamo export and graph-only saving (every
initializer external, the data file deleted: ``bare``)::

    .venv-integration/bin/python tests/importers/make_multi_stack_cases.py

Each stack has 2 layers, hidden 64, 4 heads, FFN 128, vocabulary 1,000:

* ``marian_dynamo_bare`` (``MarianMTModel``): an encoder and a decoder; every decoder layer's
  cross-attention reads the encoder's output (16 source, 12 target tokens);
* ``mbart_dynamo_bare`` (``MBartForConditionalGeneration``): the same with pre-LN layers and the
  encoder's final LayerNorm between the stacks;
* ``clip_dynamo_bare`` (``CLIPModel``): a text tower (16 tokens) and a vision tower (32 x 32 pixels,
  8 x 8 patches) side by side, joined only by the contrastive logits.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "importers"))
from make_gelu_cases import _save  # noqa: E402  (dynamo export at the default opset here, graph-only saving)
OUT = ROOT / "tests" / "data" / "multi_stack_cases"
_SEQ2SEQ = dict(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128)
_TOWER = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)


def main() -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import,
    # so the unit run's doctest collection of this file needs neither
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    OUT.mkdir(parents=True, exist_ok=True)
    marian = dict(_SEQ2SEQ, pad_token_id=999, decoder_start_token_id=999, activation_function="swish")
    built = mz._seq2seq("MarianMTModel", "MarianConfig", marian, exporter="dynamo", fake=False, seq=16, tgt_seq=12,
                        max_seq=128, vocab=999)
    _save(mz, built, OUT / "marian_dynamo_bare.onnx")
    built = mz._seq2seq("MBartForConditionalGeneration", "MBartConfig", dict(_SEQ2SEQ), exporter="dynamo",
                        fake=False, seq=16, tgt_seq=12, max_seq=128, vocab=1000)
    _save(mz, built, OUT / "mbart_dynamo_bare.onnx")
    _save(mz, _clip(mz), OUT / "clip_dynamo_bare.onnx")
    return 0


def _clip(mz):
    """``CLIPModel`` with two 2-layer towers, its input ids and pixels (batch 2)."""
    import torch
    import transformers

    config = transformers.CLIPConfig(
        text_config=dict(_TOWER, vocab_size=1000, max_position_embeddings=32),
        vision_config=dict(_TOWER, image_size=32, patch_size=8), projection_dim=32)
    model = mz._make(transformers.CLIPModel, config, fake=False)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return mz._built(model, {"input_ids": mz._ids(1000, 2, 16), "pixel_values": pixels},
                     {"input_ids": ["batch", "seq"], "pixel_values": ["batch", 3, 32, 32]},
                     {"model_class": "CLIPModel", "output_follows_seq": False}, exporter="dynamo", fake=False)


if __name__ == "__main__":
    sys.exit(main())
