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
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "cross_rotary_cases"


def main() -> int:
    spec = importlib.util.spec_from_file_location("unseen_archs", ROOT / "bench" / "unseen_archs.py")
    unseen = importlib.util.module_from_spec(spec)
    sys.modules["unseen_archs"] = unseen
    spec.loader.exec_module(unseen)
    mz = unseen.mz
    arch = mz.Arch(name="moonshine", description="Moonshine, tiny", build=unseen.moonshine)
    with tempfile.TemporaryDirectory() as tmp:
        records, failure = mz.build_arch(arch, "dynamo", Path(tmp), realistic=False)
        if failure:
            raise SystemExit(f"export failed: {failure['error']}")
        name = "moonshine_dynamo_bare.onnx"
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / name).write_bytes((Path(tmp) / name).read_bytes())
    record = records[name]
    counts = {"files": {name: {"param_count": record["param_count"], "config": record["config"],
                               "inputs": record["inputs"], "versions": record["versions"]}}}
    (OUT / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    print(name, record["param_count"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
