"""Build the DLRM-style ONNX files of ``tests/importers/test_embedding_bag.py`` (issue 25), with torch.

Run with the integration environment (torch CPU); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_dlrm_cases.py

The model (:class:`Dlrm`) is DLRM's shape (Naumov et al. 2019, "Deep Learning Recommendation Model
for Personalization and Recommendation Systems", arXiv:1906.00091, Fig. 1): a bottom MLP over the
dense features, one ``nn.EmbeddingBag`` per sparse feature (``TABLES``: sum, mean and sum pooling of
``POOLING`` indices per sample, offsets given), the pairwise dot products of the dense vector and the
pooled embeddings, and a top MLP. Both torch exporters write each EmbeddingBag as an ONNX ``Loop``
over the bags.

Files, in ``tests/data/dlrm_cases``:

* ``dlrm_{ts,dynamo}_{bare,consts}.onnx``: the model at its full size (tables of 400,000, 100,000 and
  50,000 rows of 64), saved graph-only as ``make_param_cases.py`` does: every initializer external
  and its data file deleted (``bare``), or the small constants inline (``consts``);
* ``dlrm_small_{ts,dynamo}.onnx`` with its weights (tables of 50, 30 and 20 rows of 8, a few KB),
  and in ``counts.json`` its inputs and torch's output for them, so a test can run the rewritten
  graph with onnx's reference evaluator and compare.

``counts.json`` also records torch's parameter count (``sum(p.numel() for p in model.parameters())``)
and the tables' shapes and modes. Each export is checked here before it is written: the rewritten
small model reproduces torch's output (onnxruntime runs the function-carrying graph).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "dlrm_cases"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_zoo import save_graph_only  # noqa: E402  (the zoo's graph-only writer)

SEED = 0
POOLING = 20
"""Indices per sample per table (the ``nnz`` axis of each table's indices is ``20*batch``)."""
TABLES = ((400_000, "sum"), (100_000, "mean"), (50_000, "sum"))
"""(rows, mode) of each embedding table of the full-size model; the row width is ``WIDTH``."""
WIDTH = 64
SMALL = dict(tables=((50, "sum"), (30, "mean"), (20, "max")), width=8, dense=13, bottom=(16,), top=(16,))
"""The small model with weights (a max table too: its loop has the same form)."""


class Dlrm(nn.Module):
    """DLRM: bottom MLP, EmbeddingBags, pairwise dot-product interaction, top MLP."""

    def __init__(self, tables, width: int, dense: int = 13, bottom=(512, 256), top=(512, 256)) -> None:
        super().__init__()
        self.bottom = _mlp((dense, *bottom, width))
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, width, mode=mode) for rows, mode in tables)
        features = len(tables) + 1
        pairs = features * (features - 1) // 2
        self.top = _mlp((width + pairs, *top, 1))
        rows, cols = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)

    def forward(self, dense, indices_0, offsets_0, indices_1, offsets_1, indices_2, offsets_2):
        # three tables (both configurations): torch.export wants one named argument per input
        sparse = (indices_0, offsets_0, indices_1, offsets_1, indices_2, offsets_2)
        x = self.bottom(dense)
        pooled = [table(sparse[2 * i], sparse[2 * i + 1]) for i, table in enumerate(self.tables)]
        features = torch.stack([x, *pooled], dim=1)  # [B, F, D]
        dots = torch.bmm(features, features.transpose(1, 2))  # [B, F, F]
        pairs = dots[:, self.pair_rows, self.pair_cols]
        return self.top(torch.cat([x, pairs], dim=1))


def _mlp(sizes) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _inputs(model: Dlrm, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    args = [torch.randn(batch, model.bottom[0].in_features, generator=generator)]
    for table in model.tables:
        args.append(torch.randint(0, table.num_embeddings, (batch * POOLING,), generator=generator))
        args.append(torch.arange(0, batch * POOLING, POOLING))
    return tuple(args)


def _names(model: Dlrm) -> list[str]:
    return ["dense"] + [f"{kind}_{i}" for i in range(len(model.tables)) for kind in ("indices", "offsets")]


def _export(model: Dlrm, args: tuple) -> dict[str, onnx.ModelProto]:
    """Both exporters at a dynamic batch (``batch``; indices ``20*batch``)."""
    names = _names(model)
    batch = torch.export.Dim("batch", min=2, max=4096)
    shapes = tuple({0: POOLING * batch if name.startswith("indices") else batch} for name in names)
    with torch.no_grad():
        program = torch.onnx.export(model, args, dynamo=True, opset_version=18, dynamic_shapes=shapes,
                                    input_names=names, output_names=["logit"])
    path = OUT / "tmp_ts.onnx"
    axes = {n: {0: f"{POOLING}*batch" if n.startswith("indices") else "batch"} for n in names}
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17, input_names=names,
                          output_names=["logit"], dynamic_axes=axes)
    scripted = onnx.load(str(path))
    path.unlink()
    return {"dynamo": program.model_proto, "ts": scripted}


def _check_rewrite(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], want: np.ndarray) -> None:
    """The rewritten graph computes torch's output (onnxruntime runs the model-local functions)."""
    import onnxruntime as ort

    from importers.embedding_bag import recognise_embedding_bags

    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    assert recognise_embedding_bags(copy) == len(SMALL["tables"])
    got = ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict] = {"pooling": POOLING, "files": {}}
    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    small = Dlrm(SMALL["tables"], SMALL["width"], SMALL["dense"], SMALL["bottom"], SMALL["top"]).eval()
    args = _inputs(small, 4, generator)
    with torch.no_grad():
        want = small(*args).numpy()
    feeds = {name: value.numpy() for name, value in zip(_names(small), args)}
    for exporter, proto in _export(small, args).items():
        _check_rewrite(proto, feeds, want)
        name = f"dlrm_small_{exporter}.onnx"
        save_graph_only(proto, OUT / name, threshold_bytes=1 << 30)  # every weight kept inline, traces dropped
        records["files"][name] = {"param_count": sum(p.numel() for p in small.parameters()),
                                  "tables": [list(t) for t in SMALL["tables"]], "width": SMALL["width"]}
    records["small_io"] = {"inputs": {k: v.tolist() for k, v in feeds.items()}, "logit": want.tolist()}
    torch.manual_seed(SEED)
    model = Dlrm(TABLES, WIDTH).eval()
    args = _inputs(model, 4, generator)
    for exporter, proto in _export(model, args).items():
        for style, threshold in (("bare", 0), ("consts", 1024)):
            name = f"dlrm_{exporter}_{style}.onnx"
            save_graph_only(proto, OUT / name, threshold_bytes=threshold)
            records["files"][name] = {"param_count": sum(p.numel() for p in model.parameters()),
                                      "tables": [list(t) for t in TABLES], "width": WIDTH}
    (OUT / "counts.json").write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
