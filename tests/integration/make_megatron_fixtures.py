"""Write the Megatron exporter's architecture fixtures into ``tests/exporters/data/`` (graph only):

* ``gemma2_tiny.onnx``: a 2-layer Gemma-2 (``Gemma2ForCausalLM``): GeGLU (GELU tanh) MLP, attention
  soft-capping 50 and final-logit soft-capping 30, sandwich norms (post-attention and post-MLP
  RMSNorms), a sliding window of 8 on layer 1 and full attention on layer 2, over 16 tokens (so the
  window masks something). Eager attention, the implementation that applies the soft-capping.
* ``qwen2_moe_tiny.onnx``: a 2-layer Qwen2-MoE (``Qwen2MoeForCausalLM``): 4 routed experts of FFN
  32, top-2 without renormalising the top-k probabilities (``norm_topk_prob=False``), and a shared
  expert of FFN 64 scaled by a sigmoid gate.

The recipe of ``examples/make_examples.py`` (``_llama_like``: dynamo export, opset 18, tensors of
1 KiB or more stripped); sizes in ``CONFIGS`` below. Needs ``.venv-integration``::

    .venv-integration/bin/python tests/integration/make_megatron_fixtures.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import make_examples  # noqa: E402

OUT = ROOT / "tests" / "exporters" / "data"

_COMMON = dict(layers=2, hidden=64, heads=4, kv_heads=2, vocab=1000, max_positions=256, seq=16)

CONFIGS = {
    "gemma2_tiny": dict(
        _COMMON, model="Gemma2ForCausalLM", config="Gemma2Config", intermediate=128,
        extra=dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, attn_implementation="eager"),
    ),
    "qwen2_moe_tiny": dict(
        _COMMON, model="Qwen2MoeForCausalLM", config="Qwen2MoeConfig", intermediate=128,
        extra=dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                   shared_expert_intermediate_size=64, norm_topk_prob=False,
                   experts_implementation="batched_mm"),
    ),
}
"""Per fixture: the model and config classes and the sizes (``extra``: the config's own fields)."""


def build(name: str):
    cfg = CONFIGS[name]
    return make_examples._llama_like(
        cfg["model"], cfg["config"], layers=cfg["layers"], hidden=cfg["hidden"], heads=cfg["heads"],
        kv_heads=cfg["kv_heads"], intermediate=cfg["intermediate"], vocab=cfg["vocab"],
        max_positions=cfg["max_positions"], seq=cfg["seq"], **cfg["extra"],
    )


def main(names: list[str]) -> int:
    for name in names or list(CONFIGS):
        example = make_examples.Example(name=name, group="tests", exporter="dynamo", build=lambda n=name: build(n),
                                        description=name)
        proto = make_examples.export(example, build(name))
        path = OUT / f"{name}.onnx"
        make_examples.save(proto, path, inline_weights=False)
        print(f"wrote {path} ({path.stat().st_size} bytes, {len(proto.graph.node)} nodes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
