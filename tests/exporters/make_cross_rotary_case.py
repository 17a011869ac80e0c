"""Build ``tests/data/cross_rotary_cases/``, the file of ``tests/exporters/test_cross_rotary.py`` (issue 25, task
h26f): transformers' ``MoonshineForConditionalGeneration``, an encoder-decoder whose self-attention layers rotate
their queries and keys (RoPE, partial rotary 0.9) and whose decoder cross-attention layers rotate nothing.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
``bench/unseen_archs.py``'s ``moonshine`` config (2 encoder and 2 decoder layers, hidden 64, 4 heads, vocabulary
1,000, tied) and ``tests/zoo/make_zoo.py``'s dynamo export, saved graph-only (``bare``: every initializer external,
its data file deleted); torch's TorchScript exporter fails on this model ("All tensors must have the same rank")::

    .venv-integration/bin/python tests/exporters/make_cross_rotary_case.py

``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())`` and the config.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "cross_rotary_cases"


def main() -> int:
    spec = importlib.util.spec_from_file_location("unseen_archs", ROOT / "bench" / "unseen_archs.py")
    unseen = importlib.util.module_from_spec(spec)
    sys.modules["unseen_archs"] = unseen
    spec.loader.exec_module(unseen)
    unseen.write_fixture("moonshine", OUT, record_keys=("param_count", "config", "inputs", "versions"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
