"""Build the files of ``tests/exporters/test_rotary_layers.py`` (sweep H5 findings 3 and 4), with torch.

* ``smollm3_*``: SmolLM3 (``no_rope_layer_interval`` 2: layers 1 and 3 of 4, counting from 0, skip RoPE;
  transformers' ``SmolLM3Config.no_rope_layers[i] = int((i + 1) % interval != 0)``, 1 rotating);
  ``smollm3_list_ts``: ``no_rope_layers`` [1, 0, 1, 1] given, only layer 1 without RoPE (no period).
* ``llama31_*``: Llama with ``rope_parameters`` {rope_type: llama3, factor 8, low_freq_factor 1, high_freq_factor 4,
  original_max_position_embeddings 8192} (Llama 3.1's), base 500,000, head size 64 (32 frequencies);
  ``llama31_short_ts``: the same with original_max_position_embeddings 4096 (wavelength bounds 4096 and 1024 tokens,
  which megatron-core's fixed 8192 / 2048 do not give).

Both exporters (TorchScript, dynamo) where named, graph-only with the small constants (``inv_freq``) inline; random
weights, seed 0, no downloads. Run with the integration environment::

    .venv-integration/bin/python tests/importers/make_rotary_cases.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "rotary_cases"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_param_cases  # noqa: E402  (its exporter settings and graph-only writer)

SIZES = dict(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, head_dim=64, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
             pad_token_id=None, bos_token_id=None, eos_token_id=None)
"""Every model's sizes (transformers config fields): 2 heads of 64 channels, so 32 rotary frequencies."""

LLAMA31 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
               original_max_position_embeddings=8192)
"""Llama 3.1's rope parameters."""


def _models() -> dict[str, tuple[object, tuple[str, ...]]]:
    import transformers

    smol = transformers.SmolLM3Config(**SIZES, no_rope_layer_interval=2)
    smol_list = transformers.SmolLM3Config(**SIZES, no_rope_layers=[1, 0, 1, 1])
    llama = transformers.LlamaConfig(**SIZES, rope_parameters=LLAMA31)
    short = transformers.LlamaConfig(**SIZES, rope_parameters={**LLAMA31, "original_max_position_embeddings": 4096})
    return {
        "smollm3": (transformers.SmolLM3ForCausalLM(smol), ("ts", "dynamo")),
        "smollm3_list": (transformers.SmolLM3ForCausalLM(smol_list), ("ts",)),
        "llama31": (transformers.LlamaForCausalLM(llama), ("ts", "dynamo")),
        "llama31_short": (transformers.LlamaForCausalLM(short), ("ts",)),
    }


def main() -> int:
    make_param_cases.OUT = OUT  # _export writes beside its module's OUT
    OUT.mkdir(parents=True, exist_ok=True)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(make_param_cases.SEED))
    for stem, (model, exporters) in _models().items():
        model.config._attn_implementation = "eager"
        torch.manual_seed(make_param_cases.SEED)
        wrapped = make_param_cases._randomise(make_param_cases._Logits(model))
        for name in make_param_cases._export(wrapped, (ids,), ["input_ids"], ["logits"], stem, fold=True):
            if "_bare" in name or not any(f"_{e}_" in name for e in exporters):
                (OUT / name).unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
