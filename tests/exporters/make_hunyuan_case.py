"""Build ``tests/data/hunyuan_cases`` (issue 25, round 4 of unseen architectures; h29j), with torch.

HunYuan-V1-MoE (transformers 5.24 ``HunYuanMoEV1ForCausalLM``, ``bench/unseen_archs.py``'s round-4 config: 2 layers,
hidden 64, 4 heads of 16 channels over 2 KV groups, top-2 of 4 experts plus a shared MLP, per-head QK RMSNorm applied
AFTER the rotary embedding), random weights, exported by torch's dynamo exporter and saved graph-only (``bare``)
beside a ``counts.json`` with torch's parameter count and the config::

    .venv-integration/bin/python tests/exporters/make_hunyuan_case.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "hunyuan_cases"


def main() -> int:
    spec = importlib.util.spec_from_file_location("unseen_archs", ROOT / "bench" / "unseen_archs.py")
    unseen = importlib.util.module_from_spec(spec)
    sys.modules["unseen_archs"] = unseen
    spec.loader.exec_module(unseen)
    unseen.write_fixture("hunyuan_v1_moe", OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
