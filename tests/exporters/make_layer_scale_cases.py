"""Build ``tests/exporters/data/layer_scale_cases/``, the BEiTs of ``tests/exporters/test_layer_scale_wording.py``
(issue 25, task H2: what each launcher says of a LayerScale), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
with ``tests/zoo/make_zoo.py``'s builders and graph-only saving (every initializer external, the data file
deleted: ``bare``)::

    .venv-integration/bin/python tests/exporters/make_layer_scale_cases.py

``BeitForImageClassification`` of 2 layers, hidden 64, 4 heads, FFN 128, 32 x 32 pixels in 8 x 8 patches, 10
labels, ``layer_scale_init_value = 0.1``: every layer multiplies its attention output by ``lambda_1`` and its
MLP output by ``lambda_2``, learned vectors of 64, before the residual adds (80,266 parameters), exported by
TorchScript (``beit_ts_bare``) and dynamo (``beit_dynamo_bare``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "exporters" / "data" / "layer_scale_cases"
_CONFIG = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, image_size=32,
               patch_size=8, num_labels=10, layer_scale_init_value=0.1)


def main() -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import,
    # so the unit run's doctest collection of this file needs neither
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    OUT.mkdir(parents=True, exist_ok=True)
    for exporter in ("ts", "dynamo"):
        built = mz._vision("BeitForImageClassification", "BeitConfig", dict(_CONFIG), exporter=exporter, fake=False,
                           image=32)
        scales = {n: list(p.shape) for n, p in built.model.named_parameters() if ".lambda_" in n}
        path = OUT / f"beit_{exporter}_bare.onnx"
        mz.save_graph_only(mz._export(built, exporter, fake=False, data_name=path.name + ".data"), path, threshold_bytes=0)
        print(path.name, f"{path.stat().st_size:,} bytes;", sum(p.numel() for p in built.model.parameters()),
              "parameters; scales", scales)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
