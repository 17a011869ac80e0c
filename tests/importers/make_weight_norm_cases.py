"""Build the files of ``tests/importers/test_folded_weight_norm.py`` (issue 25: the dynamo exporter's optimiser folds
a small Conv's weight norm ``g * v / ||v||`` into one constant ``Mul`` output, and ``g`` went uncounted without a
word), with torch.

``weight_norm_dim{0,2}_dynamo_consts``: :class:`NormedConv` (a Linear, a Conv1d under
``torch.nn.utils.parametrizations.weight_norm(dim=0 or 2)``, a Linear: 101 parameters at ``dim=2``, 102 at
``dim=0``); ``weight_norm_dim2_dynamo_unfolded_consts``: the same exported with ``optimize=False`` (``g`` and ``v``
kept apart). ``counts.json``: torch's parameter count of each and the elements of ``g``. Graph-only with the small
constants inline; seed 0, no downloads. Run with the integration environment::

    .venv-integration/bin/python tests/importers/make_weight_norm_cases.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "weight_norm_cases"
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_zoo import save_graph_only  # noqa: E402  (the zoo's graph-only writer)


class NormedConv(nn.Module):
    """``[batch, seq, 8]`` -> Linear(8, 4) -> weight-normed Conv1d(4, 4, 3) over the sequence -> ReLU -> Linear(4, 2)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 4)
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3, padding=1), dim=dim)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(self.inp(x).transpose(1, 2)).transpose(1, 2)
        return self.out(torch.relu(h))


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    counts = {}
    x = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(0))
    dims = ({0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=64)},)
    for dim, optimize in ((0, True), (2, True), (2, False)):
        torch.manual_seed(0)
        model = NormedConv(dim).eval()
        stem = f"weight_norm_dim{dim}_dynamo" + ("" if optimize else "_unfolded") + "_consts"
        with torch.no_grad():
            program = torch.onnx.export(model, (x,), dynamo=True, opset_version=18, optimize=optimize,
                                        dynamic_shapes=dims)
        save_graph_only(program.model_proto, OUT / f"{stem}.onnx", threshold_bytes=1024)
        counts[f"{stem}.onnx"] = {"param_count": sum(p.numel() for p in model.parameters()),
                                  "g_elements": model.conv.parametrizations.weight.original0.numel()}
    (OUT / "counts.json").write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
