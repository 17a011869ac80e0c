"""Build the unseen architectures of docs/VALIDATION.md's "Unseen architectures, 2026-12-01" (issue 25, h24e).

Eight transformers 5.24 models that neither ``tests/zoo`` nor the other fixtures hold, tiny (2-3 layers, hidden
64), random weights from configs written here (no downloads), exported by both torch exporters and saved
graph-only with ``tests/zoo/make_zoo.py``'s own recipe (``build_arch``: ``_consts`` and ``_bare`` styles, the data
file deleted), with a ``manifest.json`` in the zoo's layout (torch's ``sum(p.numel())`` per file, and the exports
torch could not do under ``failures``)::

    .venv-integration/bin/python bench/unseen_archs.py --out .cache/unseen
    .venv-integration/bin/python bench/unseen_archs.py --out .cache/unseen --only gpt_oss
    .venv-integration/bin/python bench/unseen_archs.py --out .cache/unseen2 --round 2

Round 2 (``--round 2``, task h25f, "Unseen architectures, round 2"): eight more families (``ROUND2``), and five
families tried in that round whose tiny twins ``tests/exporters/data`` already holds (``ROUND2_FIXTURE_TWINS``,
built with ``--only``). Not in the zoo, for CI time: the files are for planning by hand (the section's commands).

Round 3 (``--round 3``, task h26f, "Unseen architectures, round 3"): nine families neither the zoo, the fixtures
nor rounds 1-2 hold (``ROUND3``): Falcon-H1, ERNIE-4.5-MoE, LFM2, DiffLlama, EXAONE-4.0, Moonshine, PatchTST,
DINOv3 and LLaVA-1.5::

    .venv-integration/bin/python bench/unseen_archs.py --out .cache/unseen3 --round 3

Round 4 (``--round 4``, task h29g, "Unseen architectures, round 4"): Arcee (squared-ReLU MLP), Apertus (xIELU,
QK norm), Seed-OSS (Q/K/V biases only) and HunYuan-V1-MoE (top-2 of 4 plus a shared MLP, QK norm)::

    .venv-integration/bin/python bench/unseen_archs.py --out .cache/unseen4 --round 4

Test fixtures whose TorchScript export fails (``--fixture NAME OUT``, :func:`write_fixture`: the dynamo file alone,
graph-only, beside a ``counts.json`` with torch's parameter count, the config and the versions; seed 0)::

    .venv-integration/bin/python bench/unseen_archs.py --fixture lfm2 tests/data/lfm2_cases
    .venv-integration/bin/python bench/unseen_archs.py --fixture ernie4_5_moe tests/data/ernie_router_cases
    .venv-integration/bin/python bench/unseen_archs.py --fixture apertus tests/data/apertus_cases
    .venv-integration/bin/python bench/unseen_archs.py --fixture hunyuan_v1_moe tests/data/hunyuan_cases

Issue 25's two families that no installed library builds (task h31g), in plain torch here (``PLAIN``):
``DiffusionUNet`` (a diffusion-style U-Net) and ``GAT`` (a 2-layer graph attention network)::

    .venv-integration/bin/python bench/unseen_archs.py --fixture unet tests/data/unet_cases
    .venv-integration/bin/python bench/unseen_archs.py --fixture gat tests/data/gat_cases
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
mz = importlib.util.module_from_spec(_spec)
sys.modules["make_zoo"] = mz
_spec.loader.exec_module(mz)

# the decoders' common sizes: 2 layers, hidden 64, 4 heads over 2 KV groups, FFN 128, vocab 1000
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000, max_position_embeddings=256)


def starcoder2(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    cfg = dict(SMALL, sliding_window=8, use_bias=True)
    return mz._causal_lm("Starcoder2ForCausalLM", "Starcoder2Config", cfg, exporter=exporter, fake=fake, seq=16)


def glm4(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    cfg = dict(SMALL, head_dim=16, partial_rotary_factor=0.5, attention_bias=True, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    return mz._causal_lm("Glm4ForCausalLM", "Glm4Config", cfg, exporter=exporter, fake=fake, seq=16)


def gpt_oss(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    cfg = dict(SMALL, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
               layer_types=["sliding_attention", "full_attention"], experts_implementation="batched_mm")
    return mz._causal_lm("GptOssForCausalLM", "GptOssConfig", cfg, exporter=exporter, fake=fake, seq=16)


def dbrx(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # DBRX's experts loop over expert_mask.nonzero() whatever experts_implementation says: torch.export
    # fails on it, and TorchScript traces the experts its example reached (all 4 here)
    cfg = dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=256, vocab_size=1000,
               attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000),
               ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2),
               experts_implementation="batched_mm")
    return mz._causal_lm("DbrxForCausalLM", "DbrxConfig", cfg, exporter=exporter, fake=fake, seq=16, max_key="max_seq_len")


def modernbert(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    cfg = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, intermediate_size=128,
               vocab_size=1000, max_position_embeddings=128, global_attn_every_n_layers=3, local_attention=16,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    return mz._masked_lm("ModernBertForMaskedLM", "ModernBertConfig", cfg, exporter=exporter, fake=fake, seq=32, max_seq=128)


def switch(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # the same loop: TorchScript's trace on 8 decoder tokens holds 7 of the 8 experts (importers.coarsen's note)
    cfg = dict(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_decoder_layers=2, num_heads=4, num_experts=4,
               expert_capacity=64, encoder_sparse_step=2, decoder_sparse_step=2, vocab_size=1000,
               decoder_start_token_id=0, pad_token_id=0)
    return mz._seq2seq("SwitchTransformersForConditionalGeneration", "SwitchTransformersConfig", cfg,
                       exporter=exporter, fake=fake, seq=16, tgt_seq=8, max_seq=128, vocab=1000)


def mobilevit(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    cfg = dict(image_size=64, patch_size=2, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 40, 48, 64],
               num_attention_heads=4, num_labels=10)
    return mz._vision("MobileViTForImageClassification", "MobileViTConfig", cfg, exporter=exporter, fake=fake, image=64)


def speech2text(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    import transformers
    cfg = dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000, input_feat_per_channel=16,
               input_channels=1, conv_channels=64, conv_kernel_sizes=[5, 5], max_source_positions=256,
               max_target_positions=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    config = transformers.Speech2TextConfig(use_cache=False, **cfg)
    model = mz._make(transformers.Speech2TextForConditionalGeneration, config, fake=fake)
    gen = torch.Generator().manual_seed(0)
    tensors = {"input_features": torch.randn(2, 64, 16, generator=gen),
               "decoder_input_ids": mz._ids(1000, 2, 8).clamp_(min=4)}
    dims = {"input_features": ["batch", "frames", 16], "decoder_input_ids": ["batch", "tgt_seq"]}
    if exporter == "ts":
        tensors["decoder_attention_mask"] = torch.ones(2, 8, dtype=torch.int64)
        dims["decoder_attention_mask"] = ["batch", "tgt_seq"]
    record = {"model_class": "Speech2TextForConditionalGeneration", **mz._jsonable(cfg), "example_batch": 2}
    built = mz._built(model, tensors, dims, record, exporter=exporter, fake=fake,
                      max_sizes={"tgt_seq": 64, "frames": 1024})
    if exporter == "ts":
        built = dataclasses.replace(built, dynamic_axes=dict(built.dynamic_axes, logits={0: "batch", 1: "tgt_seq"}))
    return built


# round 2 (task h25f): families people train (ROUND2 and ROUND2_FIXTURE_TWINS below)
def gemma2(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # attention and final-logit soft-capping, alternating sliding window 8, sandwich norms, GeGLU, tied
    cfg = dict(SMALL, head_dim=16, sliding_window=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
               query_pre_attn_scalar=16)
    return mz._causal_lm("Gemma2ForCausalLM", "Gemma2Config", cfg, exporter=exporter, fake=fake, seq=16)


def qwen3(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Qwen3 dense: per-head RMSNorm on queries and keys, GQA, SwiGLU, untied
    cfg = dict(SMALL, head_dim=16, tie_word_embeddings=False)
    return mz._causal_lm("Qwen3ForCausalLM", "Qwen3Config", cfg, exporter=exporter, fake=fake, seq=16)


def qwen3_moe(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Qwen3-MoE: softmax top-2 of 4 experts in every layer, no shared expert, QK norm
    cfg = dict(SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
               decoder_sparse_step=1, norm_topk_prob=True, experts_implementation="batched_mm")
    return mz._causal_lm("Qwen3MoeForCausalLM", "Qwen3MoeConfig", cfg, exporter=exporter, fake=fake, seq=16)


def olmo2(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # OLMo-2: norms after attention and MLP (inside the residual), QK RMSNorm over the whole projection
    cfg = dict(SMALL, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    return mz._causal_lm("Olmo2ForCausalLM", "Olmo2Config", cfg, exporter=exporter, fake=fake, seq=16)


def glm4_moe(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # GLM-4.5-style: a dense first layer, then sigmoid-routed experts with a bias, one shared expert
    cfg = dict(SMALL, num_hidden_layers=3, head_dim=16, partial_rotary_factor=0.5, n_routed_experts=4,
               num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=64, first_k_dense_replace=1,
               n_group=1, topk_group=1, use_qk_norm=True, experts_implementation="batched_mm")
    return mz._causal_lm("Glm4MoeForCausalLM", "Glm4MoeConfig", cfg, exporter=exporter, fake=fake, seq=16)


def nemotron_h(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Nemotron-H: Mamba-2 mixers, one attention layer, squared-ReLU MLPs (torch scan path, no kernels)
    cfg = dict(vocab_size=1000, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               intermediate_size=128, layers_block_type=["mamba", "mlp", "attention", "mlp"],
               mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=1, chunk_size=8,
               max_position_embeddings=256)
    return mz._causal_lm("NemotronHForCausalLM", "NemotronHConfig", cfg, exporter=exporter, fake=fake, seq=16,
                         max_key=None)


def convnextv2(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # ConvNeXt-V2: depthwise 7x7 blocks with global response normalisation
    cfg = dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], num_labels=10)
    return mz._vision("ConvNextV2ForImageClassification", "ConvNextV2Config", cfg, exporter=exporter, fake=fake,
                      image=64)


def mt5(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # mT5 (T5 v1.1): gated-GELU feed-forward, relative position buckets; the LM head is tied to the word table
    # (transformers 5.24's MT5Config keeps tie_word_embeddings True whatever it is passed: lm_head.weight is
    # shared.weight), so torch's count holds one 1000 x 64 table
    cfg = dict(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=1000,
               decoder_start_token_id=0, pad_token_id=0, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    return mz._seq2seq("MT5ForConditionalGeneration", "MT5Config", cfg, exporter=exporter, fake=fake, seq=16,
                       tgt_seq=8, max_seq=128, vocab=1000)


def llama4(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Llama-4 text: top-1 of 4 routed experts plus a shared expert, chunked attention (8 tokens) on RoPE layers,
    # NoPE every 4th layer (here layer 4 of 4), L2 QK norm
    cfg = dict(SMALL, num_hidden_layers=4, head_dim=16, intermediate_size=64, intermediate_size_mlp=128,
               num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=1, attention_chunk_size=8,
               pad_token_id=0, experts_implementation="batched_mm")
    return mz._causal_lm("Llama4ForCausalLM", "Llama4TextConfig", cfg, exporter=exporter, fake=fake, seq=16)


def phimoe(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Phi-3.5-MoE: top-2 of 4 experts with the sparsemixer router, LayerNorm with biases, attention biases
    cfg = dict(SMALL, num_local_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm")
    return mz._causal_lm("PhimoeForCausalLM", "PhimoeConfig", cfg, exporter=exporter, fake=fake, seq=16)


def granitemoehybrid(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Granite-4.0-H: Mamba-2 and attention layers, each followed by top-2 of 4 experts and a shared MLP
    cfg = dict(SMALL, num_hidden_layers=2, layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_head=16,
               mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=8, mamba_expand=2, num_local_experts=4,
               num_experts_per_tok=2, intermediate_size=64, shared_intermediate_size=128, position_embedding_type="rope",
               experts_implementation="batched_mm")
    return mz._causal_lm("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", cfg, exporter=exporter, fake=fake,
                         seq=16)


def cohere2(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Command R7B: parallel attention and MLP on one LayerNorm, sliding window 8 with RoPE and a full NoPE layer
    cfg = dict(SMALL, sliding_window=8, layer_types=["sliding_attention", "full_attention"], pad_token_id=0)
    return mz._causal_lm("Cohere2ForCausalLM", "Cohere2Config", cfg, exporter=exporter, fake=fake, seq=16)


def pvt_v2(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # PVT-v2: four stages of overlapping patch embeddings and spatial-reduction attention with a depthwise-conv MLP
    cfg = dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 4],
               sr_ratios=[8, 4, 2, 1], mlp_ratios=[4, 4, 4, 4], num_labels=10)
    return mz._vision("PvtV2ForImageClassification", "PvtV2Config", cfg, exporter=exporter, fake=fake, image=64)


# round 3 (task h26f): families neither the zoo, the fixtures nor rounds 1-2 hold (ROUND3 below)
def falcon_h1(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Falcon-H1: each layer runs a Mamba-2 mixer and GQA attention side by side on one RMSNorm, then a SwiGLU;
    # muP-style multipliers on the embedding, both mixers' inputs and outputs, the MLP and the LM head
    cfg = dict(SMALL, head_dim=16, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
               mamba_d_state=16, mamba_chunk_size=8, embedding_multiplier=2.0, lm_head_multiplier=0.5,
               mlp_multipliers=[0.8, 1.25], key_multiplier=0.9, attention_in_multiplier=1.1,
               attention_out_multiplier=0.7, ssm_multipliers=[1.0, 0.5, 1.5, 1.0, 0.8], ssm_in_multiplier=1.2,
               ssm_out_multiplier=0.6)
    return mz._causal_lm("FalconH1ForCausalLM", "FalconH1Config", cfg, exporter=exporter, fake=fake, seq=16)


def ernie4_5_moe(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # ERNIE-4.5-MoE: a dense first layer, then softmax top-2 of 4 experts with a correction bias on the choice
    # and one shared expert, tied embeddings
    cfg = dict(SMALL, num_hidden_layers=3, moe_intermediate_size=64, moe_k=2, moe_num_experts=4,
               moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=2, moe_layer_interval=1,
               experts_implementation="batched_mm")
    return mz._causal_lm("Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", cfg, exporter=exporter, fake=fake,
                         seq=16)


def lfm2(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # LFM2: gated short depthwise convolutions (kernel 3) in most layers, GQA attention with QK norm in the rest
    cfg = dict(SMALL, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
               block_auto_adjust_ff_dim=False, conv_L_cache=3)
    return mz._causal_lm("Lfm2ForCausalLM", "Lfm2Config", cfg, exporter=exporter, fake=fake, seq=16)


def diffllama(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Differential attention: two softmax maps per head, the second scaled by a learned lambda and subtracted,
    # then a per-head RMSNorm
    cfg = dict(SMALL, head_dim=16, num_key_value_heads=4)
    return mz._causal_lm("DiffLlamaForCausalLM", "DiffLlamaConfig", cfg, exporter=exporter, fake=fake, seq=16)


def exaone4(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # EXAONE-4.0: norms after attention and MLP (inside the residual), per-head QK RMSNorm, 3 sliding-window
    # layers to 1 global one (NoPE on the global layer)
    cfg = dict(SMALL, num_hidden_layers=4, head_dim=16, sliding_window=8, sliding_window_pattern=4)
    return mz._causal_lm("Exaone4ForCausalLM", "Exaone4Config", cfg, exporter=exporter, fake=fake, seq=16)


def moonshine(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Moonshine: raw 16 kHz audio through three strided convolutions, a RoPE encoder (partial rotary 0.9), a
    # SwiGLU decoder with cross-attention; tied embeddings
    import transformers
    cfg = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, encoder_num_hidden_layers=2,
               decoder_num_hidden_layers=2, encoder_num_attention_heads=4, decoder_num_attention_heads=4,
               encoder_num_key_value_heads=4, decoder_num_key_value_heads=4, max_position_embeddings=256,
               pad_token_id=0, decoder_start_token_id=1)
    config = transformers.MoonshineConfig(use_cache=False, **cfg)
    model = mz._make(transformers.MoonshineForConditionalGeneration, config, fake=fake)
    gen = torch.Generator().manual_seed(0)
    tensors = {"input_values": torch.randn(2, 3840, generator=gen),
               "decoder_input_ids": mz._ids(1000, 2, 8).clamp_(min=4)}
    dims = {"input_values": ["batch", "samples"], "decoder_input_ids": ["batch", "tgt_seq"]}
    if exporter == "ts":
        tensors["decoder_attention_mask"] = torch.ones(2, 8, dtype=torch.int64)
        dims["decoder_attention_mask"] = ["batch", "tgt_seq"]
    record = {"model_class": "MoonshineForConditionalGeneration", **mz._jsonable(cfg), "example_batch": 2,
              "output_follows_seq": False}
    built = mz._built(model, tensors, dims, record, exporter=exporter, fake=fake,
                      max_sizes={"tgt_seq": 256, "samples": 160000})
    if exporter == "ts":
        built = dataclasses.replace(built, dynamic_axes=dict(built.dynamic_axes, logits={0: "batch", 1: "tgt_seq"}))
    return built


def patchtst(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # PatchTST: a time-series encoder over patches of each channel (channel-independent), BatchNorm, forecast head
    import transformers
    cfg = dict(num_input_channels=7, context_length=64, patch_length=8, patch_stride=8, num_hidden_layers=2,
               d_model=64, num_attention_heads=4, ffn_dim=128, prediction_length=16, loss="mse")
    config = transformers.PatchTSTConfig(**cfg)
    model = mz._make(transformers.PatchTSTForPrediction, config, fake=fake)
    tensors = {"past_values": torch.randn(2, 64, 7, generator=torch.Generator().manual_seed(0))}
    record = {"model_class": "PatchTSTForPrediction", **mz._jsonable(cfg), "example_batch": 2,
              "output_follows_seq": False}
    return mz._built(model, tensors, {"past_values": ["batch", 64, 7]}, record, exporter=exporter, fake=fake)


def dinov3(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # DINOv3 ViT: 2-D RoPE on patch tokens, 4 register tokens, LayerScale, a SwiGLU MLP; the backbone's tokens
    cfg = dict(patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               image_size=64, num_register_tokens=4, use_gated_mlp=True, layerscale_value=0.1)
    return mz._vision("DINOv3ViTModel", "DINOv3ViTConfig", cfg, exporter=exporter, fake=fake, image=64)


def llava(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # LLaVA-1.5: a CLIP vision tower's patch features (4 x 4 patches of a 32-pixel image, the class token dropped)
    # through a 2-layer GELU projector, written over the 16 image tokens of a Llama decoder's 24
    import transformers
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  image_size=32, patch_size=8, projection_dim=64)
    text = dict(SMALL, model_type="llama")
    config = transformers.LlavaConfig(vision_config=dict(vision, model_type="clip_vision_model"),
                                      text_config=text, image_token_index=999, vision_feature_layer=-1,
                                      vision_feature_select_strategy="default", use_cache=False)
    model = mz._make(transformers.LlavaForConditionalGeneration, config, fake=fake)
    ids = mz._ids(990, 2, 24)
    ids[:, 2:18] = 999
    tensors = {"input_ids": ids, "pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
    dims = {"input_ids": ["batch", 24], "pixel_values": ["batch", 3, 32, 32]}
    if exporter == "ts":
        tensors["attention_mask"] = torch.ones(2, 24, dtype=torch.int64)
        dims["attention_mask"] = ["batch", 24]
    record = {"model_class": "LlavaForConditionalGeneration", "vision": vision, **mz._jsonable(SMALL),
              "image_token_index": 999, "example_batch": 2, "example_seq": 24}
    return mz._built(model, tensors, dims, record, exporter=exporter, fake=fake)

# round 4 (task h29g): families neither the zoo, the fixtures nor rounds 1-3 hold (ROUND4 below)
def arcee(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Arcee (AFM): a plain (ungated) MLP with squared ReLU, GQA, RMSNorm
    cfg = dict(SMALL, head_dim=16, hidden_act="relu2")
    return mz._causal_lm("ArceeForCausalLM", "ArceeConfig", cfg, exporter=exporter, fake=fake, seq=16)


def apertus(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Apertus: xIELU activation (learned alpha_p, alpha_n per layer) in an ungated MLP, per-head QK RMSNorm
    cfg = dict(SMALL, head_dim=16)
    return mz._causal_lm("ApertusForCausalLM", "ApertusConfig", cfg, exporter=exporter, fake=fake, seq=16)


def seed_oss(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Seed-OSS: Q/K/V biases without an output-projection bias, SwiGLU, GQA
    cfg = dict(SMALL, head_dim=16, attention_bias=True, attention_out_bias=False)
    return mz._causal_lm("SeedOssForCausalLM", "SeedOssConfig", cfg, exporter=exporter, fake=fake, seq=16)


def hunyuan_v1_moe(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # HunYuan-V1-MoE: every layer softmax top-2 of 4 experts plus a shared MLP, per-head QK RMSNorm
    cfg = dict(SMALL, head_dim=16, num_experts=4, moe_topk=2, experts_implementation="batched_mm")
    return mz._causal_lm("HunYuanMoEV1ForCausalLM", "HunYuanMoEV1Config", cfg, exporter=exporter, fake=fake, seq=16)



class _TimeResBlock(torch.nn.Module):
    """A diffusion U-Net residual block: GroupNorm -> SiLU -> 3x3 conv, the timestep embedding projected to the
    output channels and added per channel, GroupNorm -> SiLU -> 3x3 conv, a 1x1 conv on the skip when the
    channels change (DDPM's, Ho et al. 2020, Appendix B)."""

    def __init__(self, channels_in: int, channels_out: int, time_dim: int, groups: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.GroupNorm(groups, channels_in)
        self.conv1 = torch.nn.Conv2d(channels_in, channels_out, 3, padding=1)
        self.time_proj = torch.nn.Linear(time_dim, channels_out)
        self.norm2 = torch.nn.GroupNorm(groups, channels_out)
        self.conv2 = torch.nn.Conv2d(channels_out, channels_out, 3, padding=1)
        self.skip = (torch.nn.Conv2d(channels_in, channels_out, 1) if channels_in != channels_out
                     else torch.nn.Identity())

    def forward(self, x: torch.Tensor, time_embedding: torch.Tensor) -> torch.Tensor:
        h = self.conv1(torch.nn.functional.silu(self.norm1(x)))
        h = h + self.time_proj(torch.nn.functional.silu(time_embedding))[:, :, None, None]
        h = self.conv2(torch.nn.functional.silu(self.norm2(h)))
        return self.skip(x) + h


class _SpatialSelfAttention(torch.nn.Module):
    """Multi-head self-attention over the H*W positions of a feature map, GroupNorm first, residual after."""

    def __init__(self, channels: int, heads: int, groups: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.GroupNorm(groups, channels)
        self.qkv = torch.nn.Linear(channels, 3 * channels)
        self.out = torch.nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)                      # [batch, H*W, C]
        q, k, v = self.qkv(tokens).reshape(batch, height * width, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1)
        mixed = (scores @ v).transpose(1, 2).reshape(batch, height * width, channels)
        return x + self.out(mixed).transpose(1, 2).reshape(batch, channels, height, width)


class DiffusionUNet(torch.nn.Module):
    """A small diffusion-style U-Net (DDPM / Stable Diffusion's layout, plain torch): a sinusoidal timestep
    embedding through a 2-layer MLP; conv_in; per level one time-conditioned residual block whose output is kept
    for the skip, then a stride-2 conv down; a middle of block, self-attention (the lowest resolution), block;
    per level up: nearest x2 upsampling and a 3x3 conv, the kept skip concatenated on channels, a residual block;
    GroupNorm -> SiLU -> conv_out. Input ``sample`` [batch, channels, size, size] (size divisible by
    2**len(multipliers)), ``timestep`` [batch] (float steps)."""

    def __init__(self, *, channels: int = 4, base: int = 32, multipliers: tuple[int, ...] = (1, 2),
                 heads: int = 4, groups: int = 8) -> None:
        super().__init__()
        self.base = base
        time_dim = 4 * base
        self.time_mlp = torch.nn.Sequential(torch.nn.Linear(base, time_dim), torch.nn.SiLU(),
                                            torch.nn.Linear(time_dim, time_dim))
        widths = [base * m for m in multipliers]
        self.conv_in = torch.nn.Conv2d(channels, base, 3, padding=1)
        ins = [base] + widths[:-1]
        self.down_blocks = torch.nn.ModuleList(_TimeResBlock(i, o, time_dim, groups) for i, o in zip(ins, widths))
        self.downsamples = torch.nn.ModuleList(torch.nn.Conv2d(o, o, 3, stride=2, padding=1) for o in widths)
        low = widths[-1]
        self.mid1 = _TimeResBlock(low, low, time_dim, groups)
        self.mid_attention = _SpatialSelfAttention(low, heads, groups)
        self.mid2 = _TimeResBlock(low, low, time_dim, groups)
        ups_in = [low] + widths[::-1][:-1]
        self.upsamples = torch.nn.ModuleList(torch.nn.Conv2d(i, i, 3, padding=1) for i in ups_in)
        self.up_blocks = torch.nn.ModuleList(_TimeResBlock(i + skip, skip, time_dim, groups)
                                             for i, skip in zip(ups_in, widths[::-1]))
        self.norm_out = torch.nn.GroupNorm(groups, base * multipliers[0])
        self.conv_out = torch.nn.Conv2d(base * multipliers[0], channels, 3, padding=1)

    def _time_embedding(self, timestep: torch.Tensor) -> torch.Tensor:
        half = self.base // 2
        frequencies = torch.exp(-torch.log(torch.tensor(10000.0)) * torch.arange(half, dtype=torch.float32) / half)
        angles = timestep[:, None].float() * frequencies[None, :]
        return self.time_mlp(torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1))

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        time_embedding = self._time_embedding(timestep)
        h, skips = self.conv_in(sample), []
        for block, down in zip(self.down_blocks, self.downsamples):
            h = block(h, time_embedding)
            skips.append(h)
            h = down(h)
        h = self.mid2(self.mid_attention(self.mid1(h, time_embedding)), time_embedding)
        for upsample, block in zip(self.upsamples, self.up_blocks):
            h = upsample(torch.nn.functional.interpolate(h, scale_factor=2.0, mode="nearest"))
            h = block(torch.cat([h, skips.pop()], dim=1), time_embedding)
        return self.conv_out(torch.nn.functional.silu(self.norm_out(h)))


class _GATLayer(torch.nn.Module):
    """One graph attention layer (Velickovic et al. 2018, eq. 1-4): a shared linear map to ``heads`` x
    ``features``, per-edge scores LeakyReLU(a_src . Wh_src + a_dst . Wh_dst) (slope 0.2), softmax over each
    destination's incoming edges (shifted by the global max, exp, summed per destination with ``index_add``),
    messages alpha * Wh_src summed into their destinations; heads concatenated or averaged, plus a bias."""

    def __init__(self, features_in: int, features: int, heads: int, *, concat: bool) -> None:
        super().__init__()
        self.heads, self.features, self.concat = heads, features, concat
        self.linear = torch.nn.Linear(features_in, heads * features, bias=False)
        self.attention_src = torch.nn.Parameter(torch.empty(heads, features))
        self.attention_dst = torch.nn.Parameter(torch.empty(heads, features))
        self.bias = torch.nn.Parameter(torch.empty(heads * features if concat else features))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index[0], edge_index[1]
        h = self.linear(x).reshape(x.shape[0], self.heads, self.features)      # [nodes, heads, features]
        score_src = (h * self.attention_src).sum(-1)                           # [nodes, heads]
        score_dst = (h * self.attention_dst).sum(-1)
        scores = torch.nn.functional.leaky_relu(score_src[src] + score_dst[dst], 0.2)   # [edges, heads]
        weights = torch.exp(scores - scores.max())
        totals = torch.zeros_like(score_dst).index_add(0, dst, weights)
        alpha = weights / totals[dst]
        messages = h[src] * alpha[:, :, None]                                  # [edges, heads, features]
        out = torch.zeros_like(h).index_add(0, dst, messages)
        out = out.reshape(x.shape[0], -1) if self.concat else out.mean(dim=1)
        return out + self.bias


class GAT(torch.nn.Module):
    """The 2-layer GAT of Velickovic et al. 2018 (section 3.3, Cora): ``heads`` x ``hidden`` concatenated, ELU,
    then one averaged head of ``classes``. Inputs ``x`` [nodes, features] and ``edge_index`` [2, edges] (int64,
    source row then destination row, self loops included)."""

    def __init__(self, *, features: int = 1433, hidden: int = 8, heads: int = 8, classes: int = 7) -> None:
        super().__init__()
        self.layer1 = _GATLayer(features, hidden, heads, concat=True)
        self.layer2 = _GATLayer(heads * hidden, classes, 1, concat=False)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.layer2(torch.nn.functional.elu(self.layer1(x, edge_index)), edge_index)


UNET_SIZES = dict(channels=4, base=32, multipliers=(1, 2), heads=4, groups=8)
GAT_SIZES = dict(features=1433, hidden=8, heads=8, classes=7)


def unet(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # a latent-diffusion-style U-Net at 16 x 16 latents (no diffusers: plain torch, DiffusionUNet)
    model = mz._plain(lambda: DiffusionUNet(**UNET_SIZES), fake=fake)
    generator = torch.Generator().manual_seed(mz.SEED)
    tensors = {"sample": torch.randn(2, 4, 16, 16, generator=generator),
               "timestep": torch.tensor([10.0, 500.0])}
    record = {"model_class": "DiffusionUNet (bench/unseen_archs.py, plain torch)", **UNET_SIZES,
              "image_size": 16, "example_batch": 2}
    return mz._built(model, tensors, {"sample": ["batch", 4, 16, 16], "timestep": ["batch"]}, record,
                     exporter=exporter, fake=fake, hf=False)


def gat(*, realistic: bool, exporter: str, fake: bool) -> "mz.Built":
    # Cora's sizes (2,708 nodes there); the example graph: 40 nodes, 120 random edges plus the 40 self loops
    model = mz._plain(lambda: GAT(**GAT_SIZES), fake=fake)
    generator = torch.Generator().manual_seed(mz.SEED)
    nodes, edges = 40, 120
    loops = torch.arange(nodes)
    edge_index = torch.cat([torch.randint(0, nodes, (2, edges), generator=generator),
                            torch.stack([loops, loops])], dim=1)
    tensors = {"x": torch.randn(nodes, GAT_SIZES["features"], generator=generator), "edge_index": edge_index}
    record = {"model_class": "GAT (bench/unseen_archs.py, plain torch)", **GAT_SIZES,
              "example_nodes": nodes, "example_edges": edges + nodes}
    return mz._built(model, tensors, {"x": ["nodes", GAT_SIZES["features"]], "edge_index": [2, "edges"]}, record,
                     exporter=exporter, fake=fake, hf=False)


ROUND1 = [starcoder2, glm4, gpt_oss, dbrx, modernbert, switch, mobilevit, speech2text]
ROUND2 = [glm4_moe, llama4, phimoe, granitemoehybrid, cohere2, convnextv2, pvt_v2, mt5]
# tried in round 2 too, but tests/exporters/data holds a tiny file of each family (gemma2_tiny, qwen3_tiny,
# qwen3_moe_tiny, olmo2_tiny, nemotron_h_tiny): not unseen, kept for docs/VALIDATION.md's table (--only NAME)
ROUND2_FIXTURE_TWINS = [gemma2, qwen3, qwen3_moe, olmo2, nemotron_h]
ROUND3 = [falcon_h1, ernie4_5_moe, lfm2, diffllama, exaone4, moonshine, patchtst, dinov3, llava]
ROUND4 = [arcee, apertus, seed_oss, hunyuan_v1_moe]
ROUNDS = {1: ROUND1, 2: ROUND2, 3: ROUND3, 4: ROUND4}
# plain-torch models of the families issue 25 names that no installed library builds (task h31g)
PLAIN = [unet, gat]
ARCHS = {f.__name__: f for f in ROUND1 + ROUND2 + ROUND2_FIXTURE_TWINS + ROUND3 + ROUND4 + PLAIN}


def write_fixture(name: str, out: Path, record_keys: tuple[str, ...] = ("param_count", "config", "versions")) -> int:
    """Export model ``name`` (a key of ARCHS) with torch's dynamo exporter into ``out`` graph-only (``bare``: every
    initializer external, its data file deleted), beside a ``counts.json`` holding ``record_keys`` of its record
    (torch's parameter count, the config, ...), for a test fixture whose TorchScript export fails. Returns the
    parameter count."""
    arch = mz.Arch(name=name, description=name, build=ARCHS[name])
    with tempfile.TemporaryDirectory() as tmp:
        records, failure = mz.build_arch(arch, "dynamo", Path(tmp), realistic=False)
        if failure:
            raise SystemExit(f"export failed: {failure['error']}")
        file_name = f"{name}_dynamo_bare.onnx"
        out.mkdir(parents=True, exist_ok=True)
        (out / file_name).write_bytes((Path(tmp) / file_name).read_bytes())
    record = records[file_name]
    counts = {"files": {file_name: {key: record[key] for key in record_keys}}}
    (out / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    print(file_name, record["param_count"])
    return record["param_count"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "unseen")
    parser.add_argument("--only", action="append", choices=sorted(ARCHS))
    parser.add_argument("--round", type=int, choices=sorted(ROUNDS), default=1,
                        help="which round's eight models to build when --only is not given")
    parser.add_argument("--fixture", nargs=2, metavar=("NAME", "OUT"),
                        help="write one test fixture instead: model NAME (dynamo, graph-only) and its counts.json into "
                             "folder OUT (write_fixture), e.g. --fixture apertus tests/data/apertus_cases")
    args = parser.parse_args(argv)
    if args.fixture:
        name, out = args.fixture
        if name not in ARCHS:
            parser.error(f"--fixture: no model '{name}'; one of {', '.join(sorted(ARCHS))}")
        write_fixture(name, Path(out))
        return 0
    path = args.out / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {"files": {}, "failures": {}}
    for name in args.only or [f.__name__ for f in ROUNDS[args.round]]:
        for exporter in ("ts", "dynamo"):
            arch = mz.Arch(name=name, description=name, build=ARCHS[name])
            records, failure = mz.build_arch(arch, exporter, args.out, realistic=False)
            manifest["files"].update(records)
            manifest["failures"].pop(f"{name}_{exporter}", None)
            if failure:
                manifest["failures"][f"{name}_{exporter}"] = failure
            print(name, exporter, failure["error"] if failure else sorted(records), flush=True)
            path.write_text(json.dumps(manifest, indent=1))
    return 1 if manifest["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
