"""Build ``tests/data/moe_sweep_cases/``, the files of ``tests/exporters/test_deepspeed_autoep_names.py`` (issue 25,
task H9: sweep H7's findings E and G, MoE models DeepSpeed's AutoEP would not shard as planned), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
with ``tests/zoo/make_zoo.py``'s builders, its TorchScript export (node names carry the module paths,
``/model/layers.1/feed_forward/router/TopK``) and graph-only saving (``bare``)::

    .venv-integration/bin/python tests/importers/make_moe_sweep_cases.py

Each is 2 layers, hidden 64, vocabulary 1,000, top-2 routing, experts run ``batched_mm`` (the TorchScript
exporter has no ``aten::histc`` for the grouped form):

* ``jamba_ts_bare`` (``JambaForCausalLM``): a Mamba-1 layer then an attention layer whose MLP is 4 experts
  at ``model.layers.1.feed_forward`` with a ``router`` (softmax, top-2, not renormalised);
* ``olmoe_ts_bare`` (``OlmoeForCausalLM``): 8 experts at ``model.layers.N.mlp`` with a ``gate``
  (softmax, top-2, ``norm_topk_prob=False``: not renormalised);
* ``granitemoe_ts_bare`` (``GraniteMoeForCausalLM``): 4 experts at ``model.layers.N.block_sparse_moe`` with a
  ``router`` (top-2 of the logits, then a softmax over the two);
* ``qwen2moe_ts_bare`` (``Qwen2MoeForCausalLM``): 4 experts at ``model.layers.N.mlp`` with a ``gate`` and a
  ``shared_expert`` with its ``shared_expert_gate`` (softmax, top-2, ``norm_topk_prob=False``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "moe_sweep_cases"
_COMMON = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000, num_experts_per_tok=2,
               experts_implementation="batched_mm")
CASES = {
    "jamba": ("JambaForCausalLM", "JambaConfig", dict(
        _COMMON, num_key_value_heads=2, intermediate_size=128, num_experts=4, expert_layer_period=2,
        expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4,
        mamba_expand=2, mamba_dt_rank=8, use_mamba_kernels=False, tie_word_embeddings=False), None),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(
        _COMMON, num_key_value_heads=4, intermediate_size=64, max_position_embeddings=512, num_experts=8,
        tie_word_embeddings=False), 512),
    "granitemoe": ("GraniteMoeForCausalLM", "GraniteMoeConfig", dict(
        _COMMON, num_key_value_heads=2, intermediate_size=96, max_position_embeddings=512, num_local_experts=4,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0,
        tie_word_embeddings=True), 512),
    "qwen2moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        _COMMON, num_key_value_heads=2, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=64, num_experts=4, max_position_embeddings=512, tie_word_embeddings=False), 512),
}
"""name: (model class, config class, config, ``max_key`` for make_zoo: ``None`` where the config has no
position table)."""


def main(names: list[str]) -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names or list(CASES):
        cls, config_cls, config, max_key = CASES[name]
        extra = {} if max_key else {"max_key": None}
        built = mz._causal_lm(cls, config_cls, dict(config), exporter="ts", fake=False, seq=16, **extra)
        proto = mz._export(built, "ts", fake=False, data_name=f"{name}_ts.onnx.data")
        mz.save_graph_only(proto, OUT / f"{name}_ts_bare.onnx", threshold_bytes=0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
