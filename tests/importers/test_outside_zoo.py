"""GPT-J, ALBERT and DINOv2 (issue 25: architectures outside the zoo) count torch's parameters.

The files are ``tests/importers/make_outside_zoo.py``'s graph-only exports (every initializer external);
``counts.json`` holds torch's ``sum(p.numel() for p in model.parameters())`` and the elements of
parameters no forward op reads (DINOv2's ``mask_token``: in neither exporter's file). Each file was
counted wrong without a warning before: GPT-J +2,048 (its rotary sin/cos buffer taken for an
embedding), ALBERT +32,768 (its shared layer's weights once per call), DINOv2 -1,024 (its position
table's patch grid, interpolated, not followed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers import import_model
from importers.transformer import analyze_transformer

CASES = Path(__file__).resolve().parents[1] / "data" / "outside_zoo"
COUNTS = json.loads((CASES / "counts.json").read_text())
DIMS = {"batch": 4, "seq": 32}


def _graph(name: str):
    return import_model(CASES / name, {d: DIMS[d] for d in COUNTS[name]["dims"]})


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_parameter_count_is_torchs(name: str) -> None:
    record = COUNTS[name]
    assert _graph(name).parameter_count == record["param_count"] - record["unread_param_count"]


def test_gptj_names_the_rotary_table() -> None:
    # 256 positions x rotary_dim 8 (GPTJConfig n_positions=256, rotary_dim=8).
    assert any("rotary sin/cos table" in w and "(2,048 elements)" in w for w in _graph("gptj_dynamo_bare.onnx").warnings)


def test_albert_shared_layer_is_two_layers_of_one_weight_set() -> None:
    """Six Linears (q, k, v, dense, ffn, ffn_output) copied once more for the second call:
    4 x 64 x 64 + 2 x 64 x 128 = 32,768 elements not counted again; the stack still reads 2 layers."""
    graph = _graph("albert_dynamo_bare.onnx")
    assert any(w.startswith("6 weight(s) the exporter made are copies") and "(32,768 elements" in w
               for w in graph.warnings)
    assert analyze_transformer(graph).num_layers == 2
