"""Build ``tests/exporters/data/mpnet_ts_bare.onnx``, the MPNet of ``tests/exporters/test_megatron_unbuilt.py``
(issue 25: what no Megatron-Core model class builds), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.x); no downloads, random weights, seed 0,
with ``tests/zoo/make_zoo.py``'s builders and graph-only saving (every initializer external, the data file
deleted: ``bare``)::

    .venv-integration/bin/python tests/exporters/make_megatron_unbuilt.py

``MPNetForMaskedLM`` of 2 layers, hidden 64, 4 heads, FFN 128, vocabulary 1,000, 130 positions and
``MPNetConfig``'s default ``relative_attention_num_buckets = 32``: its ``relative_attention_bias`` is an
``nn.Embedding(32, 4)`` whose rows, picked by bucketed distance, are added to every layer's scores. The
ALBERT of the same tests is ``tests/data/outside_zoo/albert_dynamo_bare.onnx``
(``tests/importers/make_outside_zoo.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "exporters" / "data" / "mpnet_ts_bare.onnx"
_CONFIG = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
               max_position_embeddings=130)


def main() -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import,
    # so the unit run's doctest collection of this file needs neither
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    built = mz._masked_lm("MPNetForMaskedLM", "MPNetConfig", dict(_CONFIG), exporter="ts", fake=False, seq=16,
                          max_seq=128)
    table = built.model.mpnet.encoder.relative_attention_bias.weight
    proto = mz._export(built, "ts", fake=False, data_name=OUT.name + ".data")
    mz.save_graph_only(proto, OUT, threshold_bytes=0)
    print(OUT.name, f"{OUT.stat().st_size:,} bytes; relative_attention_bias {list(table.shape)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
