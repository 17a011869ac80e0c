"""Build the ONNX files of ``tests/importers/test_sweep_cases.py`` (issue 25, task H6), with torch.

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_sweep_cases.py [CASE ...]

(only the named cases are rebuilt when some are given; ``counts.json`` keeps the others' records).

Four files from a new user's sweep of architectures outside the zoo (task H3), each a reading the
importer got wrong:

* ``persimmon_noqk_ts``: ``PersimmonForCausalLM`` with ``hidden_act="relu2"`` (squared ReLU: ``Relu``
  then ``Mul(r, r)``), without its QK-LayerNorm so that the layers read as a transformer.
* ``wav2vec2_ts``: ``Wav2Vec2ForCTC``: a conv feature extractor whose first conv has a ``[C, 1, K]``
  weight (one input channel, not a Mamba mixer's depthwise conv) and a weight-normed grouped positional
  conv, whose ``weight_g`` the TorchScript exporter folds into the conv weight.
* ``mobilebert_ts``: ``MobileBertForMaskedLM``, whose LM head computes
  ``h @ cat([decoder.weight.t(), dense.weight], 0)``; the TorchScript exporter folds that into one
  anonymous initializer whose first ``embedding_size`` rows are the tied word table, transposed.
* ``clip_dynamo``: ``CLIPModel``, whose root-module ``logit_scale`` the dynamo exporter folds into its
  ``exp`` (the ``folded_from`` record names ``logit_scale``).

The builders are ``tests/zoo/make_zoo.py``'s (random weights, seed 0). Saved graph-only (every initializer
external, its data file deleted). ``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())``
(``param_count``), the named parameter shapes the tests need, the config and the input dims.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "sweep_cases"
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
import make_zoo as mz  # noqa: E402


def persimmon_noqk(exporter: str):
    """Persimmon with squared ReLU, partial rotary 0.5, fused QKV, no QK-LayerNorm."""
    cfg = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256,
               vocab_size=1000, max_position_embeddings=256, partial_rotary_factor=0.5, qk_layernorm=False,
               hidden_act="relu2", tie_word_embeddings=False)
    return mz._causal_lm("PersimmonForCausalLM", "PersimmonConfig", cfg, exporter=exporter, fake=False, seq=16)


def mobilebert(exporter: str):
    """MobileBERT MLM: embedding 64 wide, hidden 128, the LM head's concatenated decoder."""
    cfg = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=128,
               embedding_size=64, intra_bottleneck_size=64, true_hidden_size=64, num_feedforward_networks=2,
               vocab_size=1000, max_position_embeddings=128)
    return mz._masked_lm("MobileBertForMaskedLM", "MobileBertConfig", cfg, exporter=exporter, fake=False,
                         seq=16, max_seq=128)


def wav2vec2(exporter: str):
    """Wav2Vec2 CTC: three feature-extractor convs, a weight-normed positional conv (16 taps, 4 groups)."""
    import transformers
    cfg = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
               conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
               num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, vocab_size=32,
               do_stable_layer_norm=True, feat_extract_norm="layer")
    model = mz._make(transformers.Wav2Vec2ForCTC, transformers.Wav2Vec2Config(**cfg), fake=False)
    wave = torch.randn(2, 4000, generator=torch.Generator().manual_seed(0))
    record = {"model_class": "Wav2Vec2ForCTC", **mz._jsonable(cfg), "output_follows_seq": False}
    return mz._built(model, {"input_values": wave}, {"input_values": ["batch", "samples"]}, record,
                     exporter=exporter, fake=False)


def clip(exporter: str):
    """CLIP: text and vision towers of 2 layers, projection 32, the root-module ``logit_scale``."""
    import transformers
    config = transformers.CLIPConfig(
        text_config=dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                         vocab_size=1000, max_position_embeddings=32),
        vision_config=dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                           image_size=32, patch_size=8),
        projection_dim=32)
    model = mz._make(transformers.CLIPModel, config, fake=False)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    record = {"model_class": "CLIPModel", "output_follows_seq": False}
    return mz._built(model, {"input_ids": mz._ids(1000, 2, 16), "pixel_values": pixels},
                     {"input_ids": ["batch", "seq"], "pixel_values": ["batch", 3, 32, 32]}, record,
                     exporter=exporter, fake=False)


CASES = {"persimmon_noqk_ts": (persimmon_noqk, "ts"), "wav2vec2_ts": (wav2vec2, "ts"),
         "mobilebert_ts": (mobilebert, "ts"), "clip_dynamo": (clip, "dynamo")}
SHAPES = ("weight_g", "original0", "original1", "predictions.dense.weight", "word_embeddings.weight", "logit_scale",
          "masked_spec_embed")
"""Parameters whose shapes ``counts.json`` records (name suffixes), for the tests' hand counts."""


def main(only: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    counts_path = OUT / "counts.json"
    counts = json.loads(counts_path.read_text()) if counts_path.exists() else {}
    for name in only or list(CASES):
        build, exporter = CASES[name]
        built = build(exporter)
        proto = mz._export(built, exporter, fake=False, data_name=f"{name}.onnx.data")
        mz.save_graph_only(proto, OUT / f"{name}_bare.onnx", threshold_bytes=0)
        model = built.model
        counts[name] = {
            "model_class": built.config["model_class"],
            "param_count": sum(p.numel() for p in model.parameters()),
            "shapes": {n: list(p.shape) for n, p in model.named_parameters() if n.endswith(SHAPES)},
            "config": built.config, "dims": built.input_dims,
        }
        print(name, counts[name]["param_count"], flush=True)
    counts_path.write_text(json.dumps(counts, indent=1, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
