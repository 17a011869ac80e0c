"""Build ``tests/data/importer_sweep_cases/``, the files of ``tests/importers/test_importer_sweep.py`` (issue 25,
task H3: importer readings a sweep found wrong), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
with ``tests/zoo/make_zoo.py``'s builders and graph-only saving (every initializer external, its data file
deleted)::

    .venv-integration/bin/python tests/importers/make_importer_sweep_cases.py [CASE ...]

(only the named cases are rebuilt when some are given; ``counts.json`` keeps the others' records).

* ``mamba1_seq8_ts``: ``MambaForCausalLM`` (2 layers, d_model 32, d_state 4, expand 2) traced by TorchScript at
  8 tokens: transformers' slow path loops over the sequence (``for i in range(seq_len)``), so the trace writes the
  selective scan as 8 steps, each a ``Gather`` at a constant position, stacked back by a ``Concat`` of 8;
* ``jamba_swiglu_ts``: ``JambaForCausalLM``, 4 layers (Mamba-1 + dense SwiGLU MLP, attention + 4 experts, twice),
  hidden 32: the hybrid reader's case;
* ``stablelm_qk_ts`` / ``stablelm_qk_dynamo``: ``StableLmForCausalLM(qk_layernorm=True)``: one ``LayerNorm(head_dim)``
  per head on the queries and on the keys (``StableLmLayerNormPerHead``), each with its own weights (the dynamo file
  is not committed: ``tests/data/reader_cases/stablelm_qk_dynamo_bare.onnx`` is the same model);
* ``detr_ts``: ``DetrForObjectDetection`` with transformers' ResNet backbone (no timm): post-LN encoder and decoder
  layers whose queries and keys read ``x + positions``; the decoder starts from zero queries;
* ``marian_ts``, ``roformer_ts``: frozen sinusoidal position tables (``requires_grad`` False), which
  ``trainable_count`` leaves out.

``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())`` (``param_count``) and the trainable
count (``trainable_count``, ``requires_grad``), the config and the input dims.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "importer_sweep_cases"
sys.path.insert(0, str(ROOT / "tests" / "zoo"))


def _mz():
    import make_zoo as mz  # torch and transformers: the integration environment

    return mz


def mamba1_seq8(exporter: str):
    """Mamba-1 traced at 8 tokens (module docstring)."""
    cfg = dict(num_hidden_layers=2, hidden_size=32, state_size=4, expand=2, conv_kernel=4, vocab_size=500,
               tie_word_embeddings=False)
    return _mz()._causal_lm("MambaForCausalLM", "MambaConfig", cfg, exporter=exporter, fake=False, seq=8,
                            max_key=None)


def jamba_swiglu(exporter: str):
    """Jamba: layers M+MLP, attention+MoE, M+MLP, attention+MoE (module docstring)."""
    cfg = dict(num_hidden_layers=4, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, vocab_size=500, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
               expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=4, mamba_d_conv=4,
               mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False, tie_word_embeddings=False,
               experts_implementation="batched_mm")
    return _mz()._causal_lm("JambaForCausalLM", "JambaConfig", cfg, exporter=exporter, fake=False, seq=8,
                            max_key=None)


def stablelm_qk(exporter: str):
    """StableLM with per-head QK LayerNorm: 2 layers, hidden 64, 4 heads of 16, partial rotary 0.25."""
    cfg = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
               intermediate_size=128, vocab_size=1000, max_position_embeddings=256, qk_layernorm=True,
               tie_word_embeddings=False)
    return _mz()._causal_lm("StableLmForCausalLM", "StableLmConfig", cfg, exporter=exporter, fake=False, seq=16)


def detr(exporter: str):
    """DETR: a 2-stage ResNet backbone (transformers' own, no timm), 2 + 2 post-LN layers of 32, 10 queries."""
    import torch
    import transformers

    mz = _mz()
    backbone = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                         out_features=["stage2"], num_channels=3)
    cfg = dict(use_timm_backbone=False, use_pretrained_backbone=False, backbone=None, d_model=32, encoder_layers=2,
               decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
               decoder_ffn_dim=64, num_queries=10, num_labels=5)
    model = mz._make(transformers.DetrForObjectDetection, transformers.DetrConfig(backbone_config=backbone, **cfg),
                     fake=False)
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    record = {"model_class": "DetrForObjectDetection", **mz._jsonable(cfg), "output_follows_seq": False}
    return mz._built(model, {"pixel_values": pixels}, {"pixel_values": ["batch", 3, 64, 64]}, record,
                     exporter=exporter, fake=False)


def marian(exporter: str):
    """Marian: 2 + 2 layers of 64, frozen sinusoidal position tables of 128 rows (``_freeze=True``)."""
    cfg = dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000, decoder_vocab_size=1000,
               max_position_embeddings=128, pad_token_id=0, decoder_start_token_id=0)
    return _mz()._seq2seq("MarianMTModel", "MarianConfig", cfg, exporter=exporter, fake=False, seq=16, tgt_seq=8,
                          max_seq=128, vocab=1000)


def roformer(exporter: str):
    """RoFormer MLM: 2 layers of 64, 4 heads of 16, a frozen sinusoidal table of 128 x 16 (rotary)."""
    cfg = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
               max_position_embeddings=128)
    return _mz()._masked_lm("RoFormerForMaskedLM", "RoFormerConfig", cfg, exporter=exporter, fake=False, seq=16,
                            max_seq=128)


CASES = {"mamba1_seq8_ts": (mamba1_seq8, "ts"), "jamba_swiglu_ts": (jamba_swiglu, "ts"),
         "stablelm_qk_ts": (stablelm_qk, "ts"), "stablelm_qk_dynamo": (stablelm_qk, "dynamo"),
         "detr_ts": (detr, "ts"), "marian_ts": (marian, "ts"), "roformer_ts": (roformer, "ts")}


def main(only: list[str]) -> int:
    mz = _mz()
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
            "trainable_count": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "config": built.config, "dims": built.input_dims,
        }
        print(name, counts[name]["param_count"], flush=True)
        counts_path.write_text(json.dumps(counts, indent=1, sort_keys=True, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
