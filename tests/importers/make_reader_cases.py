"""Build the ONNX files of ``tests/importers/test_reader_cases.py`` (issue 25, task H5), with torch.

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights (seed 0,
``make_zoo._make``)::

    .venv-integration/bin/python tests/importers/make_reader_cases.py [CASE ...]

Each case is a small transformers model that the reader once misread, exported by both exporters
(TorchScript ``ts`` and ``dynamo``) and saved graph-only (every initializer external, its data file
deleted), through ``tests/zoo/make_zoo.py``'s builders:

- ``gptbigcode_mqa``: GPTBigCode with ``multi_query=True`` (4 heads, 1 KV head), whose sequence was read
  as seq x heads;
- ``llama_mqa``: Llama with 3 heads and ``num_key_value_heads=1`` (head size 32), the same;
- ``stablelm_qk``: StableLM with ``qk_layernorm=True`` (``StableLmLayerNormPerHead``: one LayerNorm per head);
- ``persimmon_qk``: Persimmon with ``qk_layernorm=True`` (``LayerNorm(head_dim)`` with a bias after a fused
  QKV view);
- ``segformer``: ``SegformerForSemanticSegmentation`` (``SEGFORMER``) on 64 x 64 images, whose first stage's
  efficient self-attention (``sr_ratio`` 2) takes K/V from a strided conv of its own input (256 queries,
  64 keys), once read as an encoder-decoder's cross-attention.

``counts.json`` records each file's config, torch's parameter count and its input dims.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "reader_cases"
sys.path.insert(0, str(ROOT / "tests" / "zoo"))

CONFIGS: dict[str, tuple[str, str, dict]] = {
    "gptbigcode_mqa": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", dict(
        n_layer=2, n_embd=64, n_head=4, multi_query=True, vocab_size=1001, n_positions=256, n_inner=256,
        activation_function="gelu_pytorch_tanh", bos_token_id=None, eos_token_id=None)),
    "llama_mqa": ("LlamaForCausalLM", "LlamaConfig", dict(
        num_hidden_layers=2, hidden_size=96, num_attention_heads=3, num_key_value_heads=1, intermediate_size=200,
        vocab_size=1000, max_position_embeddings=256, tie_word_embeddings=True, rms_norm_eps=1e-5)),
    "stablelm_qk": ("StableLmForCausalLM", "StableLmConfig", dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=160,
        vocab_size=1000, max_position_embeddings=256, partial_rotary_factor=0.25, use_parallel_residual=True,
        qk_layernorm=True, use_qkv_bias=True, tie_word_embeddings=False, layer_norm_eps=1e-5)),
    "persimmon_qk": ("PersimmonForCausalLM", "PersimmonConfig", dict(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256, vocab_size=1000,
        max_position_embeddings=256, partial_rotary_factor=0.5, qk_layernorm=True, hidden_act="relu2",
        tie_word_embeddings=False)),
}
"""Case -> (model class, config class, config fields)."""

_MAX_KEY = {"gptbigcode_mqa": "n_positions"}

SEGFORMER = dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[32, 64], patch_sizes=[7, 3],
                 strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[4, 4], decoder_hidden_size=64, num_labels=10)
"""``SegformerConfig`` fields: two stages of one block, the first with spatial reduction 2."""


def _segformer(mz, exporter: str):
    import torch
    import transformers

    model = mz._make(transformers.SegformerForSemanticSegmentation, transformers.SegformerConfig(**SEGFORMER), fake=False)
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    record = {"model_class": "SegformerForSemanticSegmentation", **mz._jsonable(SEGFORMER), "output_follows_seq": False}
    return mz._built(model, {"pixel_values": pixels}, {"pixel_values": ["batch", 3, 64, 64]}, record,
                     exporter=exporter, fake=False)


def main(argv: list[str]) -> int:
    import make_zoo as mz

    OUT.mkdir(parents=True, exist_ok=True)
    counts_path = OUT / "counts.json"
    counts = json.loads(counts_path.read_text()) if counts_path.exists() else {}
    for case in [a for a in argv if a in CONFIGS or a == "segformer"] or [*CONFIGS, "segformer"]:
        model_cls, _, cfg = CONFIGS.get(case, ("SegformerForSemanticSegmentation", "SegformerConfig", SEGFORMER))
        for exporter in ("ts", "dynamo"):
            if case == "segformer":
                built = _segformer(mz, exporter)
            else:
                built = mz._causal_lm(model_cls, CONFIGS[case][1], cfg, exporter=exporter, fake=False, seq=16,
                                      max_key=_MAX_KEY.get(case, "max_position_embeddings"))
            proto = mz._export(built, exporter, fake=False, data_name=f"{case}_{exporter}.onnx.data")
            path = OUT / f"{case}_{exporter}_bare.onnx"
            mz.save_graph_only(proto, path, threshold_bytes=0)
            counts[path.name] = {"model_class": model_cls, "config": cfg, "dims": built.input_dims,
                                 "param_count": sum(p.numel() for p in built.model.parameters())}
            print(path.name, counts[path.name]["param_count"], flush=True)
    counts_path.write_text(json.dumps(counts, indent=1, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
