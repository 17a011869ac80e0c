"""Build the DeepSeek-V2-style ONNX files of ``tests/importers/test_moe_scaled_choice.py``, with torch.

Run with the integration environment (torch CPU, transformers with ``DeepseekV2ForCausalLM``); no
downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_moe_v2_cases.py

The model is transformers' ``DeepseekV2ForCausalLM`` at a small size (``CONFIG``): one dense layer, then
two MoE layers of 8 routed experts, greedy top-2 of a softmax over the experts, two shared experts,
multi-latent attention without a query LoRA (DeepSeek-V2-Lite's shape). Its router multiplies the
top-k values straight out of ``torch.topk`` by ``routed_scaling_factor`` (16.0, DeepSeek-V2's
published value), which the TorchScript exporter writes as ``TopK -> Mul``: the form the importer
folds into one op whose outputs are the indices, then the scaled weights.

DeepSeek-V2's rotary runs on complex tensors (``torch.polar``, ``view_as_complex``), which neither of
torch's exporters handles: :func:`_real_rotary` swaps in the same interleaved-pair rotation in real
arithmetic before the export. The files are saved graph-only as ``make_param_cases.py`` does; only
the TorchScript ``bare`` and dynamo ``consts`` files are kept (``KEEP``). ``counts.json`` records
torch's parameter count and the config the tests compare against.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "moe_v2_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import SEED, _export, _Logits, _randomise  # noqa: E402

CONFIG = dict(
    vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
    first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
    num_experts_per_tok=2, n_shared_experts=2, topk_method="greedy", routed_scaling_factor=16.0,
    q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
    max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
)
"""``DeepseekV2Config`` fields of the test model (besides ``experts_implementation``)."""

KEEP = ("deepseek_v2_ts_bare.onnx", "deepseek_v2_dynamo_consts.onnx")


def _real_rotary() -> None:
    """Replace DeepSeek-V2's complex rotary by the same rotation of interleaved pairs in real arithmetic:
    ``(a, b) -> (a cos - b sin, a sin + b cos)`` per pair, the product of ``a + ib`` by ``e^{i theta}``."""
    import transformers.models.deepseek_v2.modeling_deepseek_v2 as module

    def angles(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        return torch.stack([freqs.cos(), freqs.sin()], -1) * self.attention_scaling

    def rotate(xq, xk, cos_sin):
        cos, sin = cos_sin.unsqueeze(1)[..., 0], cos_sin.unsqueeze(1)[..., 1]

        def pairs(x):
            x = x.float().reshape(*x.shape[:-1], -1, 2)
            return torch.stack([x[..., 0] * cos - x[..., 1] * sin, x[..., 0] * sin + x[..., 1] * cos], -1).flatten(3)

        return pairs(xq).type_as(xq), pairs(xk).type_as(xk)

    module.DeepseekV2RotaryEmbedding.forward = angles
    module.apply_rotary_emb = rotate


def main() -> int:
    import make_param_cases
    import transformers

    _real_rotary()
    make_param_cases.OUT = OUT  # the shared exporter writes where this script's files go
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    config = transformers.DeepseekV2Config(**CONFIG, experts_implementation="batched_mm")
    model = _randomise(_Logits(transformers.DeepseekV2ForCausalLM(config)))
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
    records = {}
    for name, count in _export(model, (ids,), ["input_ids"], ["logits"], "deepseek_v2", fold=True).items():
        if name in KEEP:
            records[name] = {"param_count": count}
        else:
            (OUT / name).unlink()
    (OUT / "counts.json").write_text(json.dumps({"config": CONFIG, "files": records}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
