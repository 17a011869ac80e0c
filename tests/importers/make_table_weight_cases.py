"""Build the ONNX files of ``tests/importers/test_table_weights.py`` (issue 25, task H8), with torch.

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_table_weight_cases.py [CASE ...]

(only the named cases are rebuilt when some are given; ``counts.json`` keeps the others' records).

Trainable weights that a second new user's sweep (task H7, finding A) found uncounted, because no
operand of the op reading them is computed from the inputs, or because they are read through ``Exp``:

* ``swinv2_ts``: ``Swinv2ForImageClassification``. Each block's continuous position bias MLP
  (``continuous_position_bias_mlp.0``: Linear 2 -> 512 with bias, ``.2``: Linear 512 -> heads, no bias)
  maps a constant log-spaced coordinate table to the bias added to the attention scores; each block's
  ``logit_scale`` [heads, 1, 1] is read through ``Clip`` then ``Exp``.
* ``mamba1_ts``: ``MambaForCausalLM`` (untied head, so that torch's count is the file's): each mixer's
  ``A_log`` [d_inner, d_state], which the TorchScript exporter keeps as ``onnx::Exp_N`` (its ``.float()``
  folded), read as ``-exp(A_log)`` times the run-time ``dt``.
* ``swinv2_dynamo``: the same Swin-v2 through the dynamo exporter, which folds the first CPB Linear's
  weight with the constant table (``table @ W.T``, a ``val_N`` of [1, 7, 7, 512]): the file does not
  hold that weight.

The builders are ``tests/zoo/make_zoo.py``'s (random weights, seed 0); the configs are task H7's
(``/tmp/h7/make_h7.py``). Saved graph-only (every initializer external, its data file deleted).
``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())`` (``param_count``), the
named parameter shapes the tests need, the config and the input dims.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "table_weight_cases"
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
sys.path.insert(0, str(ROOT / "tests" / "importers"))
import make_sweep_cases as sweep  # noqa: E402
import make_zoo as mz  # noqa: E402


def swinv2(exporter: str):
    """Swin-v2: embed 16, depths [1, 1], heads [2, 4], window 4 (cosine attention, CPB MLP)."""
    cfg = dict(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
               num_labels=10)
    return mz._vision("Swinv2ForImageClassification", "Swinv2Config", cfg, exporter=exporter, fake=False, image=32)


def mamba1(exporter: str):
    """Mamba-1: 2 layers, d_model 64, d_state 8, expand 2 (d_inner 128), untied head."""
    cfg = dict(num_hidden_layers=2, hidden_size=64, state_size=8, expand=2, conv_kernel=4, vocab_size=1000,
               tie_word_embeddings=False)
    return mz._causal_lm("MambaForCausalLM", "MambaConfig", cfg, exporter=exporter, fake=False, seq=16,
                         max_key=None)


CASES = {"swinv2_ts": (swinv2, "ts"), "mamba1_ts": (mamba1, "ts"), "swinv2_dynamo": (swinv2, "dynamo")}
SHAPES = ("A_log", "logit_scale", "continuous_position_bias_mlp.0.weight", "continuous_position_bias_mlp.0.bias",
          "continuous_position_bias_mlp.2.weight", "lm_head.weight")
"""Parameters whose shapes ``counts.json`` records (name suffixes), for the tests' hand counts."""


def main(only: list[str]) -> int:
    """Build ``only`` (every case when empty) with ``make_sweep_cases.main``, the same loop and record."""
    sweep.OUT, sweep.CASES, sweep.SHAPES = OUT, CASES, SHAPES
    return sweep.main(only)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
