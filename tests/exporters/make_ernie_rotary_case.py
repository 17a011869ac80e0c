"""Build ``tests/data/ernie_rotary_cases/``, the file of ``tests/exporters/test_megatron_interleaved_rotary.py``
(issue 25, task h30g): transformers' dense ``Ernie4_5ForCausalLM``, whose rotary embedding turns channel pairs
``(0, 1), (2, 3), ...`` (``rotate_half`` over ``x[..., 0::2]`` and ``x[..., 1::2]``, stacked and flattened; cos and
sin repeated with ``repeat_interleave(2)``), not Llama's halves ``(i, i + d/2)``.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
``bench/unseen_archs.py``'s small decoder sizes (2 layers, hidden 64, 4 heads over 2 KV groups, FFN 128, vocabulary
1,000; ERNIE's tied embeddings) and ``tests/zoo/make_zoo.py``'s dynamo export, saved graph-only (``bare``: every
initializer external, its data file deleted)::

    .venv-integration/bin/python tests/exporters/make_ernie_rotary_case.py

``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())`` and the config.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "ernie_rotary_cases"


def main() -> int:
    spec = importlib.util.spec_from_file_location("unseen_archs", ROOT / "bench" / "unseen_archs.py")
    unseen = importlib.util.module_from_spec(spec)
    sys.modules["unseen_archs"] = unseen
    spec.loader.exec_module(unseen)

    def ernie4_5(*, realistic: bool, exporter: str, fake: bool):
        cfg = dict(unseen.SMALL, head_dim=16)
        return unseen.mz._causal_lm("Ernie4_5ForCausalLM", "Ernie4_5Config", cfg, exporter=exporter, fake=fake, seq=16)

    unseen.ARCHS["ernie4_5"] = ernie4_5
    unseen.write_fixture("ernie4_5", OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
