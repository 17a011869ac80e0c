"""Build ``tests/data/moe_router_cases/``, the files of ``tests/importers/test_moe_router_order.py`` (issue 25,
task H1): MoE models whose router takes the top-k of the raw logits, then a softmax over the k chosen logits
(transformers' ``GraniteMoeTopKRouter``, ``GraniteMoeSharedTopKRouter``), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
with ``tests/zoo/make_zoo.py``'s builders and exports, saved graph-only (``bare``: every initializer external, its
data file deleted)::

    .venv-integration/bin/python tests/importers/make_moe_router_cases.py

Each is 2 layers, hidden 64, vocabulary 1,000, 8 experts of width 32, top-2, untied embeddings (so a
graph-only TorchScript file's count is exact), experts run ``batched_mm``. Granite's multipliers are left at
1 but for ``attention_multiplier=0.25`` (``1/sqrt(head size 16)``, the standard scale), so the only thing
that sets these models apart from Mixtral is the router's order, and Megatron-LM lists them:

* ``granitemoe_{ts,dynamo}_bare`` (``GraniteMoeForCausalLM``): experts at ``model.layers.N.block_sparse_moe``;
* ``granitemoeshared_ts_bare`` (``GraniteMoeSharedForCausalLM``): the same, plus a shared MLP of width 48
  (``shared_mlp``) beside the routed experts.

``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())`` per file, the experts' share
of it (the ``experts.`` parameters) and the config.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "moe_router_cases"
_COMMON = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
               intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=512,
               tie_word_embeddings=False, attention_multiplier=0.25, experts_implementation="batched_mm")
CASES = {
    "granitemoe": ("GraniteMoeForCausalLM", "GraniteMoeConfig", dict(_COMMON), ("ts", "dynamo")),
    "granitemoeshared": ("GraniteMoeSharedForCausalLM", "GraniteMoeSharedConfig",
                         dict(_COMMON, shared_intermediate_size=48), ("ts",)),
}
"""name: (model class, config class, config, exporters)."""


def main(names: list[str]) -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = OUT / "counts.json"
    counts = json.loads(manifest.read_text()) if manifest.is_file() else {"configs": {}, "files": {}}
    for name in names or list(CASES):
        cls, config_cls, config, exporters = CASES[name]
        counts["configs"][name] = {k: v for k, v in config.items() if k != "experts_implementation"}
        for exporter in exporters:
            built = mz._causal_lm(cls, config_cls, dict(config), exporter=exporter, fake=False, seq=16)
            params = dict(built.model.named_parameters())
            proto = mz._export(built, exporter, fake=False, data_name=f"{name}_{exporter}.onnx.data")
            stem = f"{name}_{exporter}_bare"
            mz.save_graph_only(proto, OUT / f"{stem}.onnx", threshold_bytes=0)
            counts["files"][f"{stem}.onnx"] = {
                "case": name,
                "param_count": sum(p.numel() for p in params.values()),
                "expert_param_count": sum(p.numel() for k, p in params.items() if ".experts." in k),
            }
    manifest.write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
