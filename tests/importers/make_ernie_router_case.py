"""Build ``tests/data/ernie_router_cases/``, the file of ``tests/importers/test_moe_router.py``'s ERNIE-4.5-MoE test
(issue 25, task h26f): transformers' ``Ernie4_5_MoeForCausalLM``, whose router chooses its experts by the top-k of
``softmax(logits) + e_score_correction_bias`` and mixes them by the unbiased softmax, renormalised.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
``bench/unseen_archs.py``'s ``ernie4_5_moe`` config (3 layers, hidden 64, a dense first layer, then 4 experts of
width 64, top-2, one shared expert; tied embeddings) and ``tests/zoo/make_zoo.py``'s export, saved graph-only
(``bare``: every initializer external, its data file deleted); torch's TorchScript exporter fails on this model
(``IndexError``), so the dynamo file alone::

    .venv-integration/bin/python tests/importers/make_ernie_router_case.py

``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())`` and the config.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "ernie_router_cases"


def main() -> int:
    spec = importlib.util.spec_from_file_location("unseen_archs", ROOT / "bench" / "unseen_archs.py")
    unseen = importlib.util.module_from_spec(spec)
    sys.modules["unseen_archs"] = unseen
    spec.loader.exec_module(unseen)
    unseen.write_fixture("ernie4_5_moe", OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
