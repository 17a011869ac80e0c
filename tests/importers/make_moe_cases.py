"""Build the DeepSeek-V3-style ONNX files of ``tests/importers/test_moe_deepseek.py`` (issue 25), with torch.

Run with the integration environment (torch CPU, transformers with ``DeepseekV3ForCausalLM``); no
downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_moe_cases.py

The model is transformers' ``DeepseekV3ForCausalLM`` at a small size (``CONFIG``): one dense layer
(``first_k_dense_replace=1``), then two MoE layers of 8 routed experts in 4 groups (the top 2 groups
kept, top-2 experts), sigmoid scores plus ``e_score_correction_bias``, normalised top-k weights times
``routed_scaling_factor``, one shared expert; multi-latent attention. The experts run as
``experts_implementation="batched_mm"`` (the form both exporters can trace: a per-token gather of the
stacked expert weights by the top-k indices, then a batched matmul). The score-correction biases are
buffers, set to distinct random values as a trained model's are (left at zero, the TorchScript
exporter shares one initializer between the layers).

A wider model (``WIDE``) is exported the same way. Each exporter's file is saved graph-only, as ``make_param_cases.py`` does: every initializer external
and its data file deleted (``bare``), or the small constants inline (``consts``). ``counts.json``
records torch's parameter count (``sum(p.numel() for p in model.parameters())``, the score biases
not included: buffers) and the config's numbers the tests compare against.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "moe_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import SEED, _export, _Logits, _randomise  # noqa: E402

CONFIG = dict(
    vocab_size=96, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
    first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_group=4,
    topk_group=2, num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
    max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
)
"""``DeepseekV3Config`` fields of the small test model (besides ``experts_implementation``)."""

WIDE = dict(
    CONFIG, vocab_size=1000, hidden_size=256, intermediate_size=1024, moe_intermediate_size=256,
    n_routed_experts=64, n_group=8, topk_group=4, num_experts_per_tok=6, n_shared_experts=2, q_lora_rank=64,
    kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=256,
)
"""A wider one (64 experts of 256, top-6 of the top 4 of 8 groups, 2 shared experts; 27.5M parameters, 25.2M
of them experts'), where the experts' states outweigh the activations of a small batch, so expert
parallelism earns its place on the frontier. Graph-only, its files are as small as the small model's;
only two of its four files are kept (``KEEP_WIDE``)."""

CASES = {"deepseek_v3": CONFIG, "deepseek_v3_wide": WIDE}
KEEP_WIDE = ("deepseek_v3_wide_dynamo_consts.onnx", "deepseek_v3_wide_ts_bare.onnx")


def main() -> int:
    import make_param_cases
    import transformers

    make_param_cases.OUT = OUT  # the shared exporter writes where this script's files go
    OUT.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict] = {}
    for stem, fields in CASES.items():
        torch.manual_seed(SEED)
        config = transformers.DeepseekV3Config(**fields, experts_implementation="batched_mm")
        model = _randomise(_Logits(transformers.DeepseekV3ForCausalLM(config)))
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buffer.uniform_(-0.1, 0.1)
        ids = torch.randint(0, fields["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
        score_bias = sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
        for name, count in _export(model, (ids,), ["input_ids"], ["logits"], stem, fold=True).items():
            if stem != "deepseek_v3_wide" or name in KEEP_WIDE:
                records[name] = {"case": stem, "param_count": count, "score_bias_elements": score_bias}
            else:
                (OUT / name).unlink()
    (OUT / "counts.json").write_text(json.dumps({"configs": CASES, "files": records}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
