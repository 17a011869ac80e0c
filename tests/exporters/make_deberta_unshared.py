"""Build the DeBERTa-v2 ``share_att_key=False`` ONNX files of ``tests/exporters/test_deepspeed_autotp_deberta.py`` (issue 25).

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/exporters/make_deberta_unshared.py

The model is the zoo's small ``DebertaV2ForMaskedLM`` (``tests/zoo/make_zoo.py``'s ``deberta_v2``: 2 layers,
hidden 64, 4 heads, FFN 128, vocabulary 1000, 32 position buckets, ``pos_att_type`` p2c and c2p) with
``share_att_key=False``: each layer's ``DisentangledSelfAttention`` gets its own ``pos_key_proj`` (c2p) and
``pos_query_proj`` (p2c), which project the relative-position table instead of ``key_proj`` and
``query_proj``. Each exporter's file is saved as the zoo's ``consts`` style (graph-only, the small
constants inline, the data file deleted) by the zoo's own export and save functions, so parameter and
module names are transformers' own. ``counts.json`` records torch's parameter count and the config.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "deberta_unshared"

CONFIG = dict(
    # make_zoo's _SMALL_ENCODER, then its deberta_v2 fields with share_att_key=False
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
    relative_attention=True, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=False,
    position_biased_input=False, max_relative_positions=-1, type_vocab_size=0, max_position_embeddings=128,
    position_buckets=32,
)
"""``DebertaV2Config`` fields: the zoo's small DeBERTa-v2 with its own position projections."""


def main() -> int:
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    import make_zoo  # torch, transformers and onnx: the integration environment

    OUT.mkdir(parents=True, exist_ok=True)
    records = {}
    for exporter in ("dynamo", "ts"):
        torch.manual_seed(make_zoo.SEED)
        built = make_zoo._masked_lm("DebertaV2ForMaskedLM", "DebertaV2Config", dict(CONFIG), exporter=exporter,
                                    fake=False, seq=16, max_seq=512)
        proto = make_zoo._export(built, exporter, fake=False, data_name="unused.data")
        path = OUT / f"deberta_unshared_{exporter}_consts.onnx"
        make_zoo.save_graph_only(proto, path, threshold_bytes=make_zoo.CONSTS_THRESHOLD_BYTES)
        records[path.name] = {"param_count": sum(p.numel() for p in built.model.parameters()),
                              "size_bytes": path.stat().st_size}
    (OUT / "counts.json").write_text(json.dumps({"config": CONFIG, "files": records}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
