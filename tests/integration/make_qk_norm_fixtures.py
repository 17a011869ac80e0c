"""Write the QK-norm fixtures into ``tests/exporters/data/`` (graph only, TorchScript export):

* ``qwen3_tiny.onnx``: a 2-layer Qwen3 (``Qwen3ForCausalLM``): pre-LN, a per-head RMSNorm on the
  queries and keys (``q_norm`` / ``k_norm`` over ``head_dim``) before rotary, GQA, SwiGLU.
* ``olmo2_tiny.onnx``: a 2-layer OLMo-2 (``Olmo2ForCausalLM``): norms on the sub-layers' outputs and
  none on their inputs (the "reordered norm"), and ``q_norm`` / ``k_norm`` over the whole projection.
* ``gemma3_tiny.onnx``: a 2-layer Gemma-3 (``Gemma3ForCausalLM``): sandwich norms, per-head QK-norm,
  GeGLU (GELU tanh), a sliding window of 16 on both layers, ``query_pre_attn_scalar`` 256.
* ``qwen3_moe_tiny.onnx``: a 2-layer Qwen3-MoE (``Qwen3MoeForCausalLM``): ``qwen3_tiny``'s attention, and in
  every layer 4 routed experts of FFN 64, top 2, renormalised (``norm_topk_prob``), no shared expert;
  ``experts_implementation="batched_mm"``, the form the TorchScript exporter traces (the grouped form's
  ``aten::histc`` has no ONNX symbolic).
* ``granite_tiny.onnx``: a 2-layer Granite (``GraniteForCausalLM``): a Llama stack whose embedding,
  sub-layer outputs and logits are scaled by constants (``embedding_multiplier`` 12,
  ``residual_multiplier`` 0.22, ``logits_scaling`` 8).

Sizes in ``CONFIGS``: 4 heads of 16 channels (64, not the hidden size 128: ``--kv-channels``), 2 KV
heads, FFN 256, vocabulary 512, traced over 32 tokens with eager attention (the path
``scripts/`` users export, issue 25). Tensors of 1 KiB or more are stripped (graph only), so the
rotary frequencies (``inv_freq``, 32 bytes) stay. Needs ``.venv-integration``::

    .venv-integration/bin/python tests/integration/make_qk_norm_fixtures.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "exporters" / "data"

COMMON = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
"""Every fixture's sizes (transformers config fields)."""

CONFIGS = {
    "qwen3_tiny": ("Qwen3ForCausalLM", "Qwen3Config", {}),
    "olmo2_tiny": ("Olmo2ForCausalLM", "Olmo2Config", {}),
    "qwen3_moe_tiny": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "experts_implementation": "batched_mm"}),
    "gemma3_tiny": ("Gemma3ForCausalLM", "Gemma3TextConfig", {"sliding_window": 16, "query_pre_attn_scalar": 256}),
    # Granite's factors on the embedding, each sub-layer's output and the logits (the attention scale
    # standard, 1/sqrt(head_dim 16)): a Llama-shaped stack Megatron-LM's flags cannot scale
    "granite_tiny": ("GraniteForCausalLM", "GraniteConfig", {"embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                                                             "logits_scaling": 8.0, "attention_multiplier": 16 ** -0.5}),
}
"""Per fixture: the model and config classes, and the config's own fields."""

SEQ = 32
"""Tokens traced (the importer binds ``seq`` anew)."""


def build(name: str):
    import torch
    import transformers

    model_cls, config_cls, extra = CONFIGS[name]
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    config._attn_implementation = "eager"
    config.use_cache = False
    torch.manual_seed(0)
    inner = getattr(transformers, model_cls)(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = inner

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask, use_cache=False, return_dict=False)[0]

    return Logits()


def main(names: list[str]) -> int:
    import onnx
    import torch

    for name in names or list(CONFIGS):
        path = OUT / f"{name}.onnx"
        ids = torch.randint(0, COMMON["vocab_size"], (2, SEQ))
        torch.onnx.export(build(name), (ids, torch.ones(2, SEQ, dtype=torch.int64)), str(path),
                          input_names=["input_ids", "attention_mask"], output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
                          dynamo=False, opset_version=17)
        proto = onnx.load(str(path))
        data = f"{name}.data"  # weights written beside, then removed: the file keeps the graph only
        onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data,
                  size_threshold=1024)
        os.remove(OUT / data)
        print(f"wrote {path} ({path.stat().st_size} bytes, {len(proto.graph.node)} nodes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
