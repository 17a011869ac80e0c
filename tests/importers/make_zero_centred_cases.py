"""Build the Gemma files of ``tests/exporters/test_zero_centred_norms.py`` (issue 25), with torch.

transformers' ``GemmaRMSNorm`` scales by ``1.0 + self.weight`` (Gemma and Gemma-3, whose per-head
``q_norm`` / ``k_norm`` are the same module). A small model's exports fold ``weight + 1`` into a new
constant (the zoo's ``gemma_*``), which no graph reading can tell from a plain weight; these are written
as ``make_param_cases.py`` writes its Nemotron (``optimize=False`` / ``do_constant_folding=False``: the
``Add`` stays), both exporters, graph-only with small constants inline. ``nemotron_folded_*`` is
``make_param_cases.py``'s Nemotron exported with each exporter's default constant folding, where
``weight + 1`` becomes a constant with a name the exporter made. Random weights, seed 0, no
downloads; run with the integration environment::

    .venv-integration/bin/python tests/importers/make_zero_centred_cases.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "zero_centred_cases"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_param_cases  # noqa: E402  (its exporter settings and graph-only writer)

SIZES = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=1, head_dim=16, max_position_embeddings=64, use_cache=False)
"""Both models' sizes (transformers config fields)."""


def main() -> int:
    import transformers

    make_param_cases.OUT = OUT  # _export writes beside its module's OUT
    OUT.mkdir(parents=True, exist_ok=True)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(make_param_cases.SEED))
    models = {
        "gemma": transformers.GemmaForCausalLM(transformers.GemmaConfig(**SIZES)),
        "gemma3": transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**SIZES, sliding_window=64)),
    }
    for stem, model in models.items():
        model.config._attn_implementation = "eager"
        model = make_param_cases._randomise(make_param_cases._Logits(model))
        for name in make_param_cases._export(model, (ids,), ["input_ids"], ["logits"], stem, fold=False):
            if "_bare" in name:  # every initializer stripped: the consts files are the ones tested
                (OUT / name).unlink()
    torch.manual_seed(make_param_cases.SEED)  # make_param_cases.main's Nemotron, folded
    nemotron = transformers.NemotronConfig(**{**SIZES, "num_key_value_heads": 4, "head_dim": None},
                                           tie_word_embeddings=False, hidden_act="gelu")
    model = make_param_cases._randomise(make_param_cases._Logits(transformers.NemotronForCausalLM(nemotron)))
    for name in make_param_cases._export(model, (ids,), ["input_ids"], ["logits"], "nemotron_folded", fold=True):
        if "_bare" in name:
            (OUT / name).unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
