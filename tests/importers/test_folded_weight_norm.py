"""A weight norm the dynamo exporter's optimiser folded into one constant (``g * v / ||v||`` of a small Conv) is
named in a warning with what the count misses (issue 25: ``g`` went uncounted without a word); exported with
``optimize=False`` it counts exactly.

Fixtures: ``tests/data/weight_norm_cases`` (``tests/importers/make_weight_norm_cases.py``). Oracles: torch's
parameter count of each model and the elements of its ``g`` (``counts.json``, written by the generator from
``model.parameters()``), and by hand: Linear(8, 4) 36 + Conv1d(4, 4, 3) bias 4 + v 48 + Linear(4, 2) 10 = 98
without ``g``; ``g`` is 4 elements at ``dim=0`` (output channels), 3 at ``dim=2`` (kernel taps).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers import import_model

DATA = Path(__file__).resolve().parents[1] / "data" / "weight_norm_cases"
COUNTS = json.loads((DATA / "counts.json").read_text())
DIMS = {"batch": 2, "seq": 16}
WITHOUT_G = 36 + 4 + 48 + 10


@pytest.mark.parametrize(("name", "g"), [("weight_norm_dim0_dynamo_consts.onnx", 4),
                                         ("weight_norm_dim2_dynamo_consts.onnx", 3)])
def test_a_folded_weight_norm_is_warned_with_the_shortfall(name, g):
    graph = import_model(DATA / name, DIMS)
    assert COUNTS[name] == {"param_count": WITHOUT_G + g, "g_elements": g}
    assert graph.parameter_count == WITHOUT_G  # v counted, g not in the file
    (warning,) = [w for w in graph.warnings if "weight norm" in w]
    assert "'conv.parametrizations.weight.original0' is g" in warning and "counted as v (48)" in warning
    assert f"{g} at dim={0 if g == 4 else 2}" in warning and "\n" not in warning


def test_an_unfolded_weight_norm_counts_exactly():
    name = "weight_norm_dim2_dynamo_unfolded_consts.onnx"
    graph = import_model(DATA / name, DIMS)
    assert graph.parameter_count == COUNTS[name]["param_count"] == WITHOUT_G + 3
    assert not [w for w in graph.warnings if "weight norm" in w]
