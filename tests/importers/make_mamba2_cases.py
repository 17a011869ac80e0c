"""Build the graph-only Mamba-2 ONNX files of ``tests/importers/test_mamba2_shapes.py`` (issue 25), with torch.

Run with the integration environment (torch CPU, transformers with ``Mamba2ForCausalLM``); no
downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_mamba2_cases.py

The model is transformers' ``Mamba2ForCausalLM`` at a small size (``CONFIG``: one layer, 8 heads of 16,
state 16, chunks of 8), whose torch path (no CUDA kernels) is the chunked scan: the sequence padded to
a multiple of the chunk size, then five Einsums per layer. Each exporter's file is saved graph-only
by ``make_param_cases._export``: every initializer external and its data file deleted (``bare``), or
the small constants inline (``consts``). ``counts.json`` records torch's parameter count and the
config.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "mamba2_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import SEED, _export, _Logits, _randomise  # noqa: E402

CONFIG = dict(vocab_size=96, hidden_size=64, state_size=16, num_heads=8, head_dim=16, expand=2, n_groups=1,
              num_hidden_layers=1, chunk_size=8, use_cache=False, tie_word_embeddings=False)
"""``Mamba2Config`` fields of the test model (expand x hidden = heads x head_dim = 128)."""


def main() -> int:
    import make_param_cases
    import transformers

    make_param_cases.OUT = OUT  # the shared exporter writes where this script's files go
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    model = _randomise(_Logits(transformers.Mamba2ForCausalLM(transformers.Mamba2Config(**CONFIG))))
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
    counts = _export(model, (ids,), ["input_ids"], ["logits"], "mamba2", fold=True)
    (OUT / "counts.json").write_text(json.dumps({"config": CONFIG, "files": counts}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
