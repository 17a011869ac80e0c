"""Build ``tests/data/lfm2_cases/``, the file of ``tests/importers/test_short_conv_mixers.py`` (issue 25, task h27i):
transformers' ``Lfm2ForCausalLM``, whose ``conv`` layers mix tokens by a gated short convolution
(``in_proj`` to ``3 h``, split into ``B, C, x``; ``B * x`` through a depthwise causal ``Conv1d`` of kernel
``conv_L_cache`` along the sequence; ``C *`` that; ``out_proj``) in place of attention, beside a SwiGLU MLP in
every layer.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
``bench/unseen_archs.py``'s ``lfm2`` config (round 3: 3 layers ``conv, full_attention, conv``, hidden 64, FFN
128, tied embeddings) and ``tests/zoo/make_zoo.py``'s export, saved graph-only (``bare``: every initializer
external, its data file deleted), the dynamo file::

    .venv-integration/bin/python tests/importers/make_lfm2_case.py

``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())`` and the config.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "lfm2_cases"


def main() -> int:
    spec = importlib.util.spec_from_file_location("unseen_archs", ROOT / "bench" / "unseen_archs.py")
    unseen = importlib.util.module_from_spec(spec)
    sys.modules["unseen_archs"] = unseen
    spec.loader.exec_module(unseen)
    unseen.write_fixture("lfm2", OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
