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
  (``shared_mlp``) beside the routed experts;
* ``linears_ts_bare`` (:class:`_Net`, plain torch): the same router order written by hand, with
  ``torch.softmax(values, dim=-1, dtype=torch.float32)`` (a ``Cast`` after the ``Softmax``) and 8 per-expert
  SwiGLU ``nn.Linear`` MLPs every token runs (the ``linears`` style), combined through ``index == i`` masks.

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

LINEARS = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
               vocab_size=1000)
""":class:`_Net`'s sizes (the same as the Granite cases')."""


def _net(torch, **sizes):
    """A 2-layer LM of pre-norm top-k-first MoE blocks (torch imported by the caller: integration environment)."""
    nn = torch.nn

    class Expert(nn.Module):
        def __init__(self, h: int, f: int):
            super().__init__()
            self.gate, self.up = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
            self.down = nn.Linear(f, h, bias=False)

        def forward(self, x):
            return self.down(nn.functional.silu(self.gate(x)) * self.up(x))

    class TopKFirstMoE(nn.Module):
        def __init__(self, h: int, f: int, e: int, k: int):
            super().__init__()
            self.k, self.router = k, nn.Linear(h, e, bias=False)
            self.experts = nn.ModuleList(Expert(h, f) for _ in range(e))

        def forward(self, x):
            flat = x.reshape(-1, x.shape[-1])
            values, index = self.router(flat).topk(self.k, dim=-1)  # the top-k of the logits first
            weights = torch.softmax(values, dim=-1, dtype=torch.float32)
            out = torch.zeros_like(flat)
            for i, expert in enumerate(self.experts):
                out = out + (weights * (index == i)).sum(dim=-1, keepdim=True) * expert(flat)
            return out.reshape(x.shape)

    class Net(nn.Module):
        def __init__(self, *, num_hidden_layers, hidden_size, intermediate_size, num_local_experts,
                     num_experts_per_tok, vocab_size):
            super().__init__()
            h, layers = hidden_size, range(num_hidden_layers)
            self.embed = nn.Embedding(vocab_size, h)
            self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in layers)
            self.moes = nn.ModuleList(TopKFirstMoE(h, intermediate_size, num_local_experts, num_experts_per_tok)
                                      for _ in layers)
            self.final, self.head = nn.LayerNorm(h), nn.Linear(h, vocab_size, bias=False)

        def forward(self, input_ids):
            x = self.embed(input_ids)
            for norm, moe in zip(self.norms, self.moes):
                x = x + moe(norm(x))
            return self.head(self.final(x))

    return Net(**sizes)


def _linears(mz, counts: dict) -> None:
    """The hand-written case, TorchScript only (``torch.onnx.export`` with dynamic batch and seq)."""
    import io

    import onnx
    import torch

    torch.manual_seed(0)
    # distinct random values everywhere (the TorchScript exporter merges equal initializers: fresh norms' ones)
    model = mz.mx._randomise(_net(torch, **LINEARS).eval())
    ids = torch.randint(0, LINEARS["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    buffer = io.BytesIO()
    axes = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(model, (ids,), buffer, dynamo=False, opset_version=17, input_names=["input_ids"],
                          output_names=["logits"], dynamic_axes={"input_ids": axes, "logits": axes})
    mz.save_graph_only(onnx.load_model_from_string(buffer.getvalue()), OUT / "linears_ts_bare.onnx", threshold_bytes=0)
    counts["configs"]["linears"] = dict(LINEARS)
    counts["files"]["linears_ts_bare.onnx"] = {
        "case": "linears", "param_count": sum(p.numel() for p in model.parameters()),
        "expert_param_count": sum(p.numel() for k, p in model.named_parameters() if ".experts." in k)}


def main(names: list[str]) -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = OUT / "counts.json"
    counts = json.loads(manifest.read_text()) if manifest.is_file() else {"configs": {}, "files": {}}
    if not names or "linears" in names:
        _linears(mz, counts)
    for name in [n for n in names or list(CASES) if n != "linears"]:
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
