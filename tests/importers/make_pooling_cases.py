"""Build the ONNX files of ``tests/importers/test_pooling_cases.py`` (issue 25), with torch.

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_pooling_cases.py [--ts] [--dynamo]

``siglip_{ts,dynamo}``: transformers' ``SiglipModel`` (a text and a vision tower of 2 layers, hidden 64,
4 heads), whose vision tower ends in ``SiglipMultiheadAttentionPoolingHead``: a learned probe repeated over
the batch attends over the patch tokens (``nn.MultiheadAttention``), which a second sweep of unseen
architectures found read as an encoder-decoder's cross-attention. The builders are
``tests/zoo/make_zoo.py``'s; saved graph-only (every initializer external, its data file deleted);
``counts.json`` records torch's parameter count and the input dims.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "pooling_cases"
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
import make_zoo as mz  # noqa: E402


def siglip(exporter: str):
    """SigLIP: two towers, an attention-pooling head on the vision tower."""
    import transformers

    config = transformers.SiglipConfig(
        text_config=dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                         vocab_size=1000, max_position_embeddings=16),
        vision_config=dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                           image_size=32, patch_size=8))
    model = mz._make(transformers.SiglipModel, config, fake=False)
    ids = mz._ids(1000, 2, 16)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    record = {"model_class": "SiglipModel", "output_follows_seq": False}
    return mz._built(model, {"input_ids": ids, "pixel_values": pixels},
                     {"input_ids": ["batch", 16], "pixel_values": ["batch", 3, 32, 32]}, record,
                     exporter=exporter, fake=False)


def main(argv: list[str]) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    exporters = [a[2:] for a in argv if a.startswith("--")] or ["ts", "dynamo"]
    counts_path = OUT / "counts.json"
    counts = json.loads(counts_path.read_text()) if counts_path.exists() else {}
    for exporter in exporters:
        built = siglip(exporter)
        proto = mz._export(built, exporter, fake=False, data_name=f"siglip_{exporter}.onnx.data")
        path = OUT / f"siglip_{exporter}_bare.onnx"
        mz.save_graph_only(proto, path, threshold_bytes=0)
        counts[path.name] = {"param_count": sum(p.numel() for p in built.model.parameters()),
                             "dims": built.input_dims}
        print(path.name, counts[path.name]["param_count"], flush=True)
    counts_path.write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
