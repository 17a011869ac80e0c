"""Build the files of ``tests/exporters/test_rotary_layers.py`` (sweep H5 findings 3 and 4), with torch.

* ``smollm3_*``: SmolLM3 (``no_rope_layer_interval`` 2: layers 1 and 3 of 4, counting from 0, skip RoPE;
  transformers' ``SmolLM3Config.no_rope_layers[i] = int((i + 1) % interval != 0)``, 1 rotating);
  ``smollm3_list_ts``: ``no_rope_layers`` [1, 0, 1, 1] given, only layer 1 without RoPE (no period).
* ``llama31_*``: Llama with ``rope_parameters`` {rope_type: llama3, factor 8, low_freq_factor 1, high_freq_factor 4,
  original_max_position_embeddings 8192} (Llama 3.1's), base 500,000, head size 64 (32 frequencies);
  ``llama31_short_ts``: the same with original_max_position_embeddings 4096 (wavelength bounds 4096 and 1024 tokens,
  which megatron-core's fixed 8192 / 2048 do not give).
* ``*_sub_*``: the rotation written out, ``cat([x1 cos - x2 sin, x2 cos + x1 sin, rest])`` (as GPT-OSS and
  DeepSeek-V3 write it; no ``Neg``), in place of transformers' ``rotate_half`` form (:func:`written_rotary`, checked
  equal to it on the export's input): ``smollm3_sub`` is ``smollm3`` (layers 1 and 3 without RoPE, base 2,000,000);
  ``neox_sub`` a GPT-NeoX of 2 layers rotating a quarter of its 64-channel heads (``partial_rotary_factor`` 0.25,
  16 channels, 8 frequencies) with base 50,000 and its sub-layers in sequence (``use_parallel_residual`` off, so
  Megatron-LM's GPT layer is the same). GPT-OSS itself writes it so, but its experts'
  ``grouped_mm_fallback`` has no ONNX function in torch 2.13's dynamo exporter.

Both exporters (TorchScript, dynamo) where named, graph-only with the small constants (``inv_freq``) inline; random
weights, seed 0, no downloads. Run with the integration environment::

    .venv-integration/bin/python tests/importers/make_rotary_cases.py [stem ...]
"""

from __future__ import annotations

import contextlib
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

NEOX_ROPE = dict(rope_type="default", rope_theta=50000.0, partial_rotary_factor=0.25)
"""``neox_sub``'s: a quarter of each 64-channel head (16 channels) turns, base 50,000."""


def written_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb`` (``rotate_half`` form, partial rotation included) written out as
    GPT-OSS's ``_apply_rotary_emb``: ``cos`` / ``sin`` are ``cat(freqs, freqs)``, so their first half is the angle
    of each pair (channel i with channel i + d/2); channels past ``cos``'s width pass unturned."""
    half = cos.shape[-1] // 2
    cos, sin = cos.unsqueeze(unsqueeze_dim)[..., :half], sin.unsqueeze(unsqueeze_dim)[..., :half]

    def turn(x: torch.Tensor) -> torch.Tensor:
        x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)

    return turn(q), turn(k)


@contextlib.contextmanager
def _written_out(module: object, model: torch.nn.Module, ids: torch.Tensor):
    """``module.apply_rotary_pos_emb`` replaced by :func:`written_rotary` while exporting, after checking the
    model's logits on ``ids`` are the same both ways (to float32 rounding)."""
    original = module.apply_rotary_pos_emb
    with torch.no_grad():
        before = model(ids)
        module.apply_rotary_pos_emb = written_rotary
        try:
            assert torch.allclose(before, model(ids), atol=1e-5), "the written-out rotation is another model"
            yield
        finally:
            module.apply_rotary_pos_emb = original


def _models() -> dict[str, tuple[object, tuple[str, ...]]]:
    import transformers

    smol = transformers.SmolLM3Config(**SIZES, no_rope_layer_interval=2)
    smol_list = transformers.SmolLM3Config(**SIZES, no_rope_layers=[1, 0, 1, 1])
    llama = transformers.LlamaConfig(**SIZES, rope_parameters=LLAMA31)
    short = transformers.LlamaConfig(**SIZES, rope_parameters={**LLAMA31, "original_max_position_embeddings": 4096})
    neox = transformers.GPTNeoXConfig(**{k: v for k, v in SIZES.items() if k not in ("num_key_value_heads", "head_dim")},
                                      rope_parameters=NEOX_ROPE, use_parallel_residual=False)
    neox.num_hidden_layers = 2
    return {
        "smollm3": (transformers.SmolLM3ForCausalLM(smol), ("ts", "dynamo")),
        "smollm3_list": (transformers.SmolLM3ForCausalLM(smol_list), ("ts",)),
        "llama31": (transformers.LlamaForCausalLM(llama), ("ts", "dynamo")),
        "llama31_short": (transformers.LlamaForCausalLM(short), ("ts",)),
        "smollm3_sub": (transformers.SmolLM3ForCausalLM(smol), ("ts", "dynamo")),
        "neox_sub": (transformers.GPTNeoXForCausalLM(neox), ("ts", "dynamo")),
    }


def _rotation_module(stem: str) -> object | None:
    """The transformers module whose ``apply_rotary_pos_emb`` a ``*_sub`` model's file writes out."""
    if not stem.endswith("_sub"):
        return None
    from transformers.models.gpt_neox import modeling_gpt_neox
    from transformers.models.smollm3 import modeling_smollm3

    return {"smollm3_sub": modeling_smollm3, "neox_sub": modeling_gpt_neox}[stem]


def main(stems: list[str]) -> int:
    """Write the files of ``stems`` (every model when empty)."""
    make_param_cases.OUT = OUT  # _export writes beside its module's OUT
    OUT.mkdir(parents=True, exist_ok=True)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(make_param_cases.SEED))
    for stem, (model, exporters) in _models().items():
        if stems and stem not in stems:
            continue
        model.config._attn_implementation = "eager"
        torch.manual_seed(make_param_cases.SEED)
        wrapped = make_param_cases._randomise(make_param_cases._Logits(model)).eval()
        module = _rotation_module(stem)
        with _written_out(module, wrapped, ids) if module is not None else contextlib.nullcontext():
            names = make_param_cases._export(wrapped, (ids,), ["input_ids"], ["logits"], stem, fold=True)
        for name in names:
            if "_bare" in name or not any(f"_{e}_" in name for e in exporters):
                (OUT / name).unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
