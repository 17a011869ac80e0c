"""Issue 25, "exact or refused": a factor on the residual stream or the logits (Granite's
``embedding_multiplier``, ``residual_multiplier`` and ``logits_scaling``; Gemma's embedding normaliser)
is read from the graph (:func:`importers.layer_features.stream_scales`), and Megatron-LM's and
torchtitan's Llama families, which scale none of them, refuse it in one line instead of training the
unscaled model. ``granite_tiny`` is ``tests/integration/make_qk_norm_fixtures.py``'s (a 2-layer Granite:
factors 12, 0.22 and 8, the attention scale the standard 1/sqrt(16))."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.megatron import export_megatron
from exporters.torchtitan.export import llama_refusals
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import make_input, spaces_for

DATA = Path(__file__).resolve().parent / "data"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DIMS = {"batch": 4, "seq": 16}


@pytest.mark.parametrize(("path", "scales"), [
    (DATA / "granite_tiny.onnx", ("embedding", "attention output", "logits")),
    (DATA / "qwen3_tiny.onnx", ()),  # a Llama-shaped stack without factors
    (EXAMPLES / "llama.onnx", ()),
    (EXAMPLES / "gpt2.onnx", ()),
])
def test_the_factors_are_read_where_the_model_has_them(path, scales):
    model = analyze_transformer(load_graph(path, DIMS))
    assert model.features.stream_scales == scales
    if path.name == "granite_tiny.onnx":  # the standard attention scale: only the factors differ from Llama
        assert model.features.attention_scale == pytest.approx(16 ** -0.5)


def test_megatron_refuses_in_one_line():
    graph = load_graph(DATA / "granite_tiny.onnx", DIMS)
    spaces = spaces_for(graph, 4)
    with pytest.raises(UnsupportedExport) as caught:
        export_megatron(make_input(graph, spaces, [0] * len(graph.ops), global_batch=16))
    reason = caught.value.reason
    assert "\n" not in reason and reason.startswith("Megatron-LM would train a different model: ")
    assert "scales the embedding and the attention output and the logits by a factor" in reason


def test_torchtitan_llama3_refuses():
    refusals = llama_refusals(analyze_transformer(load_graph(DATA / "granite_tiny.onnx", DIMS)))
    assert any("by a factor (Granite's multipliers" in r for r in refusals)
