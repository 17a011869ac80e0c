"""Issue 25's two families no installed library builds (h31g): a diffusion-style U-Net and a 2-layer GAT, written in
plain torch in ``bench/unseen_archs.py`` (``DiffusionUNet``, ``GAT``) and exported graph-only by its ``--fixture``
route (``tests/data/unet_cases``, ``tests/data/gat_cases``).

Oracles: torch's ``sum(p.numel() for p in model.parameters())`` recorded in each ``counts.json`` when it was built,
and for the GAT the count by hand from Velickovic et al. 2018's Cora sizes: layer 1 a 1,433 x 64 map, two 8 x 8
attention vectors and a 64 bias (91,904); layer 2 a 64 x 7 map, two 1 x 7 vectors and a 7 bias (469): 92,373.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers import import_model

DATA = Path(__file__).resolve().parents[1] / "data"
CASES = {"unet": ({"batch": 4}, 585_444), "gat": ({"nodes": 50, "edges": 200}, 1433 * 64 + 3 * 64 + 64 * 7 + 3 * 7)}


def _torch_count(name: str) -> int:
    counts = json.loads((DATA / f"{name}_cases" / "counts.json").read_text())
    return counts["files"][f"{name}_dynamo_bare.onnx"]["param_count"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_parameter_count_is_torchs(name):
    dims, expected = CASES[name]
    graph = import_model(DATA / f"{name}_cases" / f"{name}_dynamo_bare.onnx", dims)
    assert _torch_count(name) == expected
    assert graph.parameter_count == expected


def test_gat_nodes_are_read_as_indexed_by_the_edge_index():
    # the node dim is gathered from and scattered into by edge_index: not a dim of independent samples
    graph = import_model(DATA / "gat_cases" / "gat_dynamo_bare.onnx", CASES["gat"][0])
    assert graph.batch_coupled and {c.kind for c in graph.batch_coupled} == {"indexed"}
    assert "'nodes'" in graph.batch_coupled[0].reason and "edge_index[2, edges]" in graph.batch_coupled[0].reason


def test_unet_samples_are_independent():
    # GroupNorm normalises within one sample (exported as InstanceNormalization over groups): nothing couples samples
    assert import_model(DATA / "unet_cases" / "unet_dynamo_bare.onnx", CASES["unet"][0]).batch_coupled == ()
