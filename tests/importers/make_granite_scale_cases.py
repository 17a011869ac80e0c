"""Build the files of ``tests/exporters/test_granite_unscaled.py`` (issue 25: Granite's unscaled scores in a dynamo
file showed no scaling op and were not read), with torch.

``granite_unscaled_{ts,dynamo}_consts``: a 2-layer Granite (``GraniteForCausalLM``) at ``GraniteConfig``'s default
``attention_multiplier`` 1.0 (``GraniteAttention.scaling``: the scores are ``q k^T * 1.0``, not ``/ sqrt(64)``), with
its stream factors (``embedding_multiplier`` 12, ``residual_multiplier`` 0.22, ``logits_scaling`` 8). TorchScript
writes the ``* 1.0``; the dynamo exporter's optimiser drops it, leaving ``MatMul(q, k^T) + mask``.

Graph-only with the small constants inline; random weights, seed 0, no downloads. Run with the integration
environment::

    .venv-integration/bin/python tests/importers/make_granite_scale_cases.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "granite_scale_cases"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_param_cases  # noqa: E402  (its exporter settings and graph-only writer)

CONFIG = dict(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
              pad_token_id=None, bos_token_id=None, eos_token_id=None, embedding_multiplier=12.0,
              residual_multiplier=0.22, logits_scaling=8.0)
"""``GraniteConfig`` fields; ``attention_multiplier`` left at its default, 1.0 (checked in :func:`main`)."""


def main() -> int:
    import transformers

    make_param_cases.OUT = OUT  # _export writes beside its module's OUT
    OUT.mkdir(parents=True, exist_ok=True)
    config = transformers.GraniteConfig(**CONFIG)
    assert config.attention_multiplier == 1.0, config.attention_multiplier
    model = transformers.GraniteForCausalLM(config)
    model.config._attn_implementation = "eager"
    torch.manual_seed(make_param_cases.SEED)
    wrapped = make_param_cases._randomise(make_param_cases._Logits(model))
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(make_param_cases.SEED))
    for name in make_param_cases._export(wrapped, (ids,), ["input_ids"], ["logits"], "granite_unscaled", fold=True):
        if "_bare" in name:
            (OUT / name).unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
