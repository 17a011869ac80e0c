"""Granite's unscaled attention scores are read from both exporters' files, and Megatron-LM and torchtitan refuse
them in one line (issue 25: the dynamo file, whose optimiser drops the ``* 1.0``, showed no scaling op and read as
"not read", so only the stream factors refused it).

Fixtures: ``tests/data/granite_scale_cases`` (``tests/importers/make_granite_scale_cases.py``). Oracle:
``GraniteConfig``'s default ``attention_multiplier`` 1.0 (``GraniteAttention.scaling``; the generator asserts it)
against the 1/sqrt(head size) = 1/sqrt(128 / 2) that megatron-core's ``DotProductAttention`` and torchtitan's SDPA
apply.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.megatron.families import megatron_family
from exporters.torchtitan import families as titan
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph

DATA = Path(__file__).resolve().parents[1] / "data" / "granite_scale_cases"
DIMS = {"batch": 2, "seq": 64}
ATTENTION_MULTIPLIER, HIDDEN, HEADS = 1.0, 128, 2


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_unscaled_scores_are_read_and_refused(exporter):
    path = DATA / f"granite_unscaled_{exporter}_consts.onnx"
    graph = load_graph(path, DIMS)
    model = analyze_transformer(graph)
    assert model.head_dim == HIDDEN // HEADS
    assert model.features.attention_scale == ATTENTION_MULTIPLIER
    with pytest.raises(UnsupportedExport) as caught:
        megatron_family(graph, model)
    assert "\n" not in caught.value.reason
    assert f"scales the attention scores by 1/sqrt(1), not 1/sqrt({HIDDEN // HEADS})" in caught.value.reason
    with pytest.raises(UnsupportedExport, match=rf"1/sqrt\(1\), not 1/sqrt\({HIDDEN // HEADS}\)"):
        titan.torchtitan_arch(graph)
