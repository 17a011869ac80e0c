"""Build the DeepSeek-V3-style ONNX files the Megatron MoE export is tested on (issue 25), with torch.

Run with the integration environment (torch CPU, transformers' ``DeepseekV3ForCausalLM``); no downloads,
random weights, seed 0::

    .venv-integration/bin/python tests/integration/make_megatron_moe.py

``tests/data/moe_cases`` (``tests/importers/make_moe_cases.py``) routes the top 2 experts of the top 2
of 4 groups, each group scored by the sum of its top 2: Megatron-Core's group-limited routing sums the top
``topk / group_topk = 1`` there, so its export is refused. This model routes as DeepSeek-V3 does (its 8
of 256 experts in 4 of 8 groups: ``8 / 4 = 2``, the top 2 summed): the top 4 of 8 experts in the top 2
of 4 groups, sigmoid scores plus ``e_score_correction_bias`` (set to distinct random values, as a trained
model's are), the top-k weights normalised and scaled by ``routed_scaling_factor``, one shared expert,
one dense leading layer (``first_k_dense_replace=1``), multi-latent attention. Each exporter's file is
saved graph-only with its small constants inline (``consts``: the scaling factor stays readable);
``counts.json`` records the config.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
import make_moe_cases  # noqa: E402
from make_param_cases import SEED, _export, _Logits, _randomise  # noqa: E402

OUT = ROOT / "tests" / "data" / "megatron_moe"
CONFIG = dict(make_moe_cases.CONFIG, num_experts_per_tok=4)
"""``tests/data/moe_cases``' ``DeepseekV3Config`` fields with 4 experts per token instead of 2 (``4 / topk_group 2 =
2``, the top 2 of each group summed; besides ``experts_implementation="batched_mm"``, the form both exporters trace)."""

STEM = "deepseek_v3_megatron"

SPARSE = dict(
    vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
    decoder_sparse_step=2, norm_topk_prob=True, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
)
"""``Qwen3MoeConfig`` fields of a model whose MoE layers alternate with dense ones (``decoder_sparse_step=2``:
layers 1 and 3 of 0-3 route, a softmax top-2 of 4 renormalised, no shared expert): ``--moe-layer-freq``
``([0]*1+[1]*1+[0]*1+[1]*1)``. Only its TorchScript file is kept."""

SPARSE_STEM = "qwen3_moe_sparse"


def main() -> int:
    import make_param_cases
    import transformers

    make_param_cases.OUT = OUT  # the shared exporter writes where this script's files go
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    config = transformers.DeepseekV3Config(**CONFIG, experts_implementation="batched_mm")
    model = _randomise(_Logits(transformers.DeepseekV3ForCausalLM(config)))
    with torch.no_grad():  # distinct score biases, as a trained model's are
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.uniform_(-0.1, 0.1)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
    files = {}
    for name, count in _export(model, (ids,), ["input_ids"], ["logits"], STEM, fold=True).items():
        if name.endswith("_consts.onnx"):
            files[name] = {"param_count": count}
        else:
            (OUT / name).unlink()
    torch.manual_seed(SEED)
    sparse = transformers.Qwen3MoeConfig(**SPARSE, experts_implementation="batched_mm")
    model = _randomise(_Logits(transformers.Qwen3MoeForCausalLM(sparse)))
    for name, count in _export(model, (ids,), ["input_ids"], ["logits"], SPARSE_STEM, fold=True).items():
        if name.endswith("_ts_consts.onnx"):
            files[name] = {"param_count": count}
        else:
            (OUT / name).unlink()
    (OUT / "counts.json").write_text(
        json.dumps({"config": CONFIG, "sparse": SPARSE, "files": files}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
