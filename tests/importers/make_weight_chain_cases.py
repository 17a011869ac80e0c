"""Build the ONNX file of ``tests/importers/test_weight_chains.py`` (issue 25, task H3), with torch.

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_weight_chain_cases.py [CASE ...]

(only the named cases are rebuilt when some are given; ``counts.json`` keeps the others' records).

* ``zamba_ts``: ``ZambaForCausalLM`` (untied head, so that torch's count is the file's). Its Mamba mixer
  runs each of its ``n_mamba_heads`` heads apart, so the TorchScript exporter keeps each mixer's ``A_log``
  [heads, d_inner / heads, d_state] as ``onnx::Exp_N`` (its ``.float()`` folded) read as ``-exp(A_log)``
  and then per head, ``Gather`` at a constant index, before it meets the run-time ``dt``: a trainable
  weight read through an elementwise chain, which the importer dropped (16,384 of 1,067,008 at the
  new-user sweep's size). The mixer's slow path loops over the sequence, so the file is traced at seq 8.

The builders are ``tests/zoo/make_zoo.py``'s (random weights, seed 0), saved graph-only (every initializer
external, its data file deleted). ``counts.json`` records torch's ``sum(p.numel() for p in
model.parameters())`` (``param_count``), the named parameter shapes the tests need, the config and the
input dims.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "weight_chain_cases"
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
sys.path.insert(0, str(ROOT / "tests" / "importers"))
import make_sweep_cases as sweep  # noqa: E402
import make_zoo as mz  # noqa: E402


def zamba(exporter: str):
    """Zamba: 2 layers (the second a hybrid, attention + Mamba), hidden 32, 2 Mamba heads, d_state 8, untied head."""
    cfg = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=2, attention_hidden_size=64, attention_head_dim=32, mamba_d_state=8,
               mamba_expand=2, n_mamba_heads=2, mamba_dt_rank=4, attn_layer_period=2, attn_layer_offset=1,
               layers_block_type=["mamba", "hybrid"], tie_word_embeddings=False, max_position_embeddings=64)
    return mz._causal_lm("ZambaForCausalLM", "ZambaConfig", cfg, exporter=exporter, fake=False, seq=8)


CASES = {"zamba_ts": (zamba, "ts")}
SHAPES = ("A_log", "lm_head.weight", "embed_tokens.weight")
"""Parameters whose shapes ``counts.json`` records (name suffixes), for the tests' hand counts."""


def main(only: list[str]) -> int:
    """Build ``only`` (every case when empty) with ``make_sweep_cases.main``, the same loop and record."""
    sweep.OUT, sweep.CASES, sweep.SHAPES = OUT, CASES, SHAPES
    return sweep.main(only)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
