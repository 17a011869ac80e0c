"""Build the GPT-OSS-style ONNX files of ``tests/exporters/test_megatron_gpt_oss.py`` (issue 25, task h26e), with torch.

Run with the integration environment (torch CPU, transformers 5.24 with ``GptOssForCausalLM``); no downloads,
random weights, seed 0::

    .venv-integration/bin/python tests/exporters/make_gpt_oss_cases.py

The model is transformers' ``GptOssForCausalLM`` at the small size of ``tests/data/sink_cases`` (2 layers, 4 heads
of 16 in 2 query groups, 4 experts top-2, a sliding window of 8 tokens on the first layer of each pair) with every
GPT-OSS feature kept but its YaRN rope scaling: ``rope_parameters`` is a plain rotary embedding of base 150,000
(GPT-OSS's ``rope_theta``), so Megatron-LM's flags can say every feature. Its quick-GELU gate keeps GPT-OSS's
``alpha = 1.702`` and ``swiglu_limit = 7`` (``GptOssExperts``), its attention GPT-OSS's sinks and biases.
``sink_cases`` holds the YaRN-scaled files (GptOssConfig's default ``rope_parameters``).

Saved graph-only as ``make_param_cases.py`` does; only the files in ``KEEP`` are committed. ``counts.json``
records torch's parameter count and the config the tests compare against.
"""

from __future__ import annotations

import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "gpt_oss_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import write_causal_lm_cases  # noqa: E402

CONFIG = dict(
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=128, vocab_size=1000, max_position_embeddings=256, num_local_experts=4, num_experts_per_tok=2,
    sliding_window=8, layer_types=["sliding_attention", "full_attention"], experts_implementation="batched_mm",
    rope_parameters={"rope_type": "default", "rope_theta": 150000.0}, use_cache=False,
)
"""``GptOssConfig`` fields: ``sink_cases``' model without the YaRN scaling."""

CASES = {"gpt_oss_rope": CONFIG}
KEEP = ("gpt_oss_rope_ts_consts.onnx", "gpt_oss_rope_dynamo_consts.onnx")


def main() -> int:
    write_causal_lm_cases(OUT, CASES, KEEP, "GptOssConfig", "GptOssForCausalLM")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
