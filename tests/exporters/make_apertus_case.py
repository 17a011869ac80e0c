"""Build ``tests/data/apertus_cases`` (issue 25, round 4 of unseen architectures, h29g), with torch.

Apertus (transformers 5.24 ``ApertusForCausalLM``, ``bench/unseen_archs.py``'s round-4 config: 2 layers, hidden 64,
ungated MLP with the xIELU activation, per-head QK RMSNorm), random weights, exported by torch's dynamo exporter and
saved graph-only (``bare``) beside a ``counts.json`` with torch's parameter count and the config (TorchScript cannot
export it: ``aten::expm1`` at opset 17)::

    .venv-integration/bin/python tests/exporters/make_apertus_case.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "apertus_cases"


def main() -> int:
    spec = importlib.util.spec_from_file_location("unseen_archs", ROOT / "bench" / "unseen_archs.py")
    unseen = importlib.util.module_from_spec(spec)
    sys.modules["unseen_archs"] = unseen
    spec.loader.exec_module(unseen)
    unseen.write_fixture("apertus", OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
