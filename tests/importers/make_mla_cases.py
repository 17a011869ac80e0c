"""Build the multi-latent-attention ONNX files of ``tests/importers/test_mla.py`` (issue 25 item 3), with torch.

Run with the integration environment (torch CPU, transformers with ``DeepseekV3ForCausalLM``); no
downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_mla_cases.py

The models are transformers' ``DeepseekV3ForCausalLM`` at a small size, every layer dense
(``first_k_dense_replace`` = the layer count, so no router: multi-latent attention is tested alone):

* ``mla`` (``CONFIG``): DeepSeek-V3's attention, the query low-rank (``q_a_proj`` to ``q_lora_rank``,
  RMSNorm, ``q_b_proj``), keys and values from ``kv_a_proj_with_mqa`` (``kv_lora_rank`` + the shared
  rotary part ``qk_rope_head_dim``), RMSNorm, ``kv_b_proj`` up to heads x (``qk_nope_head_dim`` +
  ``v_head_dim``); ``v_head_dim`` differs from both query sizes so each is read from its own weight;
* ``mla_lite`` (``LITE``): DeepSeek-V2-Lite's, the query one full-rank ``q_proj`` (``q_lora_rank=None``);
* ``mla_yarn`` (``YARN``): ``CONFIG`` with DeepSeek-V3's YaRN rope scaling (factor 4 here, 40 in V3,
  ``mscale`` 1), which the Megatron export refuses (its frequencies are not a geometric series).

Each is saved graph-only, as ``make_param_cases.py`` does (every initializer external and its data
file deleted: ``bare``; the small constants inline, the rotary frequencies among them: ``consts``);
only the files in ``KEEP`` are committed. ``counts.json`` records torch's parameter count
(``sum(p.numel() for p in model.parameters())``) and the configs the tests compare against.
"""

from __future__ import annotations

import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "mla_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import write_causal_lm_cases  # noqa: E402

CONFIG = dict(
    vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, first_k_dense_replace=2,
    num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
    qk_nope_head_dim=16, v_head_dim=20, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
)
"""``DeepseekV3Config`` fields of the small MLA model."""

LITE = dict(CONFIG, q_lora_rank=None)
"""DeepSeek-V2-Lite's query path: one full-rank projection."""

YARN = dict(CONFIG, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "mscale": 1.0, "mscale_all_dim": 1.0})
"""DeepSeek-V3's rope scaling (its config.json: YaRN, factor 40 over 4,096 positions, beta 32 / 1, mscale 1 / 1),
here factor 4 over 16 positions (the 64 of the small model)."""

CASES = {"mla": CONFIG, "mla_lite": LITE, "mla_yarn": YARN}
KEEP = ("mla_dynamo_consts.onnx", "mla_ts_bare.onnx", "mla_lite_ts_consts.onnx", "mla_yarn_ts_consts.onnx")


def main() -> int:
    write_causal_lm_cases(OUT, CASES, KEEP, "DeepseekV3Config", "DeepseekV3ForCausalLM")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
