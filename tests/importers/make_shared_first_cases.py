"""Build ``tests/data/shared_first_cases/``, the files of ``tests/importers/test_moe_shared_first.py`` (issue 25,
h27e): MoE layers whose shared expert is computed before the router, and routers whose expert choice reads a scalar
shift of the scores (no bias) or a per-expert vector (a bias).

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
both of torch's exporters, graph-only (``bare``: every initializer external, its data gone; ``consts``: small
constants inline), through ``tests/importers/make_param_cases.py``'s writer::

    .venv-integration/bin/python tests/importers/make_shared_first_cases.py

Cases, all ``Qwen2MoeForCausalLM`` (transformers 5.24's ``Qwen2MoeSparseMoeBlock.forward`` runs
``self.shared_expert`` before ``self.gate``, so every exporter writes the shared expert's gate and up projections
ahead of the router linear; ERNIE-4.5-MoE, Qwen3-Next and Qwen3.5-MoE do the same), 2 layers, hidden 64, 4
experts of FFN 32, top-2, a shared expert of FFN 96 behind a sigmoid gate, the experts as ``batched_mm``:

* ``qwen2moe``: the model as transformers writes it;
* ``qwen2moe_shift``: its router patched to choose by ``topk(softmax(logits) + 0.5)`` and weigh by the unshifted
  probabilities gathered at the chosen indices: the same function (a constant added to every score changes no
  top-k), but a scalar ``Add`` stands between the softmax and the TopK, as a folded ``x + c`` or a temperature
  offset would;
* ``qwen2moe_bias``: the same patch with a per-expert vector ``[4]`` (an ``nn.Parameter`` without gradient, as
  ERNIE-4.5-MoE's ``moe_statics.e_score_correction_bias``) in place of the 0.5: a real expert bias.

And ``cohere2moe`` (``Cohere2MoeForCausalLM``, :data:`COHERE`): parallel attention and MoE on one input norm
(``residual + attn(n) + mlp(n)``), so the attention's Q/K/V projections read the router's input before the router
linear, beside one shared expert of FFN 32 summed with the routed experts (``shared_expert_combination_strategy``
``sum``); only the shared expert is one. ``python tests/importers/make_shared_first_cases.py cohere2moe`` builds
that case alone and keeps the others' records.

``counts.json`` records the configs, torch's ``sum(p.numel() for p in model.parameters())`` and, per file, the
elements of the shared experts' parameters (``shared_expert`` and ``shared_expert_gate``) and of the routed
experts' (``experts``), both by torch's own ``named_parameters``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "shared_first_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))

CONFIG = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=96, num_experts=4,
              num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False,
              experts_implementation="batched_mm", use_cache=False)
SHIFT = 0.5
"""The scalar the ``qwen2moe_shift`` router adds to its probabilities before the TopK."""
KEEP = ("dynamo_bare", "ts_bare", "dynamo_consts")
COHERE = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
              shared_expert_combination_strategy="sum", max_position_embeddings=64,
              layer_types=["full_attention", "full_attention"],
              experts_implementation="batched_mm", use_cache=False)
"""``Cohere2MoeConfig`` fields of the ``cohere2moe`` case (the experts and the shared expert both FFN 32)."""


def _shifted_forward(self, hidden_states):
    """Qwen2MoeTopKRouter.forward with the choice made on ``probs + self.score_shift`` and the weights gathered
    from ``probs`` (the same function as transformers' when the shift is one constant)."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
    _, indices = torch.topk(probs + self.score_shift, self.top_k, dim=-1)
    weights = probs.gather(1, indices)
    if self.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return router_logits, weights.to(router_logits.dtype), indices


def _counts(model: torch.nn.Module) -> dict[str, int]:
    params = dict(model.named_parameters())
    shared = sum(p.numel() for n, p in params.items() if ".mlp.shared_expert" in n)  # Qwen's and Cohere's names
    experts = sum(p.numel() for n, p in params.items() if ".mlp.experts." in n)
    return {"param_count": sum(p.numel() for p in params.values()), "shared_param_count": shared,
            "expert_param_count": experts}


def _cohere(records: dict[str, dict]) -> None:
    """The ``cohere2moe`` case's files and records."""
    import transformers
    from make_param_cases import SEED, _export, _Logits, _randomise

    torch.manual_seed(SEED)
    model = _randomise(_Logits(transformers.Cohere2MoeForCausalLM(transformers.Cohere2MoeConfig(**COHERE))))
    ids = torch.randint(0, COHERE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
    counts = _counts(model)
    for name in _export(model, (ids,), ["input_ids"], ["logits"], "cohere2moe", fold=True):
        if name.removeprefix("cohere2moe_").removesuffix(".onnx") in KEEP:
            records[name] = {"case": "cohere2moe", **counts}
        else:
            (OUT / name).unlink()


def main(names: list[str]) -> int:
    import make_param_cases
    import transformers
    from make_param_cases import SEED, _export, _Logits, _randomise

    make_param_cases.OUT = OUT
    OUT.mkdir(parents=True, exist_ok=True)
    router_class = transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter
    plain_forward = router_class.forward
    record_path = OUT / "counts.json"
    records: dict[str, dict] = json.loads(record_path.read_text())["files"] if names and record_path.exists() else {}
    if not names or "cohere2moe" in names:
        _cohere(records)
    for stem, shift in (("qwen2moe", None), ("qwen2moe_shift", "scalar"), ("qwen2moe_bias", "vector")):
        if names and stem not in names:
            continue
        router_class.forward = plain_forward if shift is None else _shifted_forward
        torch.manual_seed(SEED)
        model = transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**CONFIG))
        for module in model.modules():
            if isinstance(module, router_class) and shift == "scalar":
                module.score_shift = SHIFT
            elif isinstance(module, router_class) and shift == "vector":
                module.score_shift = torch.nn.Parameter(torch.zeros(CONFIG["num_experts"]), requires_grad=False)
        model = _randomise(_Logits(model))
        ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
        counts = _counts(model)
        for name in _export(model, (ids,), ["input_ids"], ["logits"], stem, fold=True):
            if name.removeprefix(stem + "_").removesuffix(".onnx") in KEEP:
                records[name] = {"case": stem, **counts}
            else:
                (OUT / name).unlink()
    router_class.forward = plain_forward
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    record_path.write_text(json.dumps({"config": CONFIG, "cohere_config": COHERE, "shift": SHIFT, "files": records,
                                       "versions": versions}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
