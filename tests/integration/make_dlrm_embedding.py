"""Build the DLRM-with-``nn.Embedding`` ONNX files the DTensor table plans are made from (issue 25).

Run with the integration environment (torch CPU); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/integration/make_dlrm_embedding.py

:class:`DlrmEmbedding` is ``tests/importers/make_dlrm_cases.py``'s DLRM (Naumov et al. 2019,
arXiv:1906.00091, Fig. 1) with every ``nn.EmbeddingBag`` replaced by an ``nn.Embedding`` looked up
with a ``[B, POOLING]`` index tensor and pooled by ``sum`` / ``mean`` over the pooling axis (the
fixed-pooling form of a multi-hot feature): the same values as the bags with offsets
``0, P, 2P, ...``. DTensor (torch 2.13) shards ``nn.Embedding`` (``RowwiseParallel`` /
``ColwiseParallel``) but not ``nn.EmbeddingBag`` (no sharding strategy for ``aten._embedding_bag``,
and both styles accept ``nn.Linear`` and ``nn.Embedding`` only), so this is the DLRM a DTensor plan
can shard. Exported with the dynamo exporter, which keeps the module paths a DTensor plan names.

Files, in ``tests/data/dlrm_embedding``:

* ``dlrm_emb_bare.onnx``: tables of 400,000 / 100,000 / 50,000 rows of 64 (35,522,881 parameters,
  as ``dlrm_*_bare.onnx``), graph-only, every initializer external and its data file deleted;
* ``dlrm_emb_small.onnx``: tables of 48 / 32 / 16 rows of 8 with its weights (rows and width divide
  by 2 and 4: the integration test's meshes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "dlrm_embedding"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
sys.path.insert(0, str(ROOT / "tests" / "importers"))
from make_dlrm_cases import POOLING, SEED, TABLES, WIDTH, Dlrm  # noqa: E402
from make_zoo import save_graph_only  # noqa: E402

SMALL = dict(tables=((48, "sum"), (32, "mean"), (16, "sum")), width=8, dense=13, bottom=(16,), top=(16,))
"""The small model with weights the integration test plans and runs."""


class DlrmEmbedding(Dlrm):
    """DLRM whose sparse features are ``nn.Embedding`` lookups of ``[B, POOLING]`` indices, pooled."""

    def __init__(self, tables, width: int, dense: int = 13, bottom=(512, 256), top=(512, 256)) -> None:
        super().__init__(tables, width, dense, bottom, top)
        self.tables = nn.ModuleList(nn.Embedding(rows, width) for rows, _ in tables)
        self.modes = tuple(mode for _, mode in tables)

    def forward(self, dense, indices_0, indices_1, indices_2):  # noqa: D102 - Dlrm.forward with [B, P] indices
        x = self.bottom(dense)
        pooled = []
        for table, mode, indices in zip(self.tables, self.modes, (indices_0, indices_1, indices_2)):
            rows = table(indices)  # [B, P, D]
            pooled.append(rows.sum(dim=1) if mode == "sum" else rows.mean(dim=1))
        features = torch.stack([x, *pooled], dim=1)  # [B, F, D]
        dots = torch.bmm(features, features.transpose(1, 2))  # [B, F, F]
        pairs = dots[:, self.pair_rows, self.pair_cols]
        return self.top(torch.cat([x, pairs], dim=1))


def inputs(model: DlrmEmbedding, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """``(dense [B, 13], indices_t [B, POOLING] per table)``."""
    args = [torch.randn(batch, model.bottom[0].in_features, generator=generator)]
    for table in model.tables:
        args.append(torch.randint(0, table.num_embeddings, (batch, POOLING), generator=generator))
    return tuple(args)


def step_batch(batch: int, seed: int = 1000) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The small model's inputs of one step: ``(dense [batch, 13], [indices_t [batch, POOLING]])``."""
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, SMALL["dense"], generator=generator)
    return dense, [torch.randint(0, rows, (batch, POOLING), generator=generator) for rows, _ in SMALL["tables"]]


def build_small(seed: int = SEED) -> DlrmEmbedding:
    """The small model, weights drawn under ``seed``."""
    torch.manual_seed(seed)
    return DlrmEmbedding(SMALL["tables"], SMALL["width"], SMALL["dense"], SMALL["bottom"], SMALL["top"])


def _export(model: DlrmEmbedding, args: tuple):
    names = ["dense", "indices_0", "indices_1", "indices_2"]
    batch = torch.export.Dim("batch", min=2, max=4096)
    shapes = tuple({0: batch} for _ in names)
    with torch.no_grad():
        program = torch.onnx.export(model, args, dynamo=True, opset_version=18, dynamic_shapes=shapes,
                                    input_names=names, output_names=["logit"])
    return program.model_proto


def main() -> int:
    generator = torch.Generator().manual_seed(SEED)
    small = build_small().eval()
    save_graph_only(_export(small, inputs(small, 4, generator)), OUT / "dlrm_emb_small.onnx", threshold_bytes=1 << 30)
    torch.manual_seed(SEED)
    model = DlrmEmbedding(TABLES, WIDTH).eval()
    assert sum(p.numel() for p in model.parameters()) == 35_522_881  # make_dlrm_cases' full-size count
    save_graph_only(_export(model, inputs(model, 4, generator)), OUT / "dlrm_emb_bare.onnx", threshold_bytes=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
