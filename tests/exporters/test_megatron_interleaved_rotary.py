"""Megatron-LM's --rotary-interleaved from the rotation the graph computes (issue 25, h30g: "exact or refused").

transformers 5.24's ERNIE-4.5 (``modeling_ernie4_5.py``: ``rotate_half`` over ``x[..., 0::2]`` and ``x[..., 1::2]``,
stacked and flattened) pairs channels (2i, 2i + 1); Llama's ``rotate_half`` pairs (i, i + d/2). megatron-core 0.16.1
says the first with ``TransformerConfig.rotary_interleaved`` (``rope_utils._rotate_half``), Megatron-LM's
``--rotary-interleaved``; without it the export trained the halves' pairing.

Files: ``tests/data/ernie_rotary_cases`` (``tests/exporters/make_ernie_rotary_case.py``: ``Ernie4_5ForCausalLM``,
dynamo, graph-only), ``tests/data/ernie_router_cases`` (ERNIE-4.5-MoE, the same rotation) and
``tests/data/rotary_cases/llama31_*`` (Llama, halves; both exporters).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import exporters.megatron.families as families
from exporters.megatron.families import megatron_family, megatron_rotary_args
from exporters.megatron.validate import parse_megatron_args
from importers.rotary import rotary_pairs
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph

DATA = Path(__file__).resolve().parents[1] / "data"
ERNIE = DATA / "ernie_rotary_cases" / "ernie4_5_dynamo_bare.onnx"
DIMS = {"batch": 2, "seq": 16}


@pytest.mark.parametrize(("path", "layers", "pairs"), [
    (ERNIE, 2, "interleaved"),
    (DATA / "ernie_router_cases" / "ernie4_5_moe_dynamo_bare.onnx", 3, "interleaved"),
    (DATA / "rotary_cases" / "llama31_dynamo_consts.onnx", 4, "halves"),
    (DATA / "rotary_cases" / "llama31_ts_consts.onnx", 4, "halves"),
])
def test_the_pairs_a_rotation_turns_are_read_from_the_graph(path, layers, pairs):
    graph = load_graph(path, DIMS)
    assert rotary_pairs(graph, analyze_transformer(graph).attention) == (pairs,) * layers


def test_ernie_is_exported_with_rotary_interleaved_and_llama_without():
    graph = load_graph(ERNIE, DIMS)
    model = analyze_transformer(graph)
    assert megatron_family(graph, model).family == "gpt"
    flags, note = megatron_rotary_args(graph, model)
    assert flags == ["--rotary-interleaved"] and "(2i, 2i + 1)" in note
    assert parse_megatron_args(flags)["rotary-interleaved"] is True  # a flag the validator knows
    llama = load_graph(DATA / "rotary_cases" / "llama31_dynamo_consts.onnx", DIMS)
    assert "--rotary-interleaved" not in megatron_rotary_args(llama, analyze_transformer(llama))[0]


def test_layers_that_pair_channels_differently_are_refused(monkeypatch):
    graph = load_graph(ERNIE, DIMS)
    model = analyze_transformer(graph)
    monkeypatch.setattr(families, "rotary_pairs", lambda g, attention: ("interleaved", "halves"))
    with pytest.raises(UnsupportedExport, match="rotate different channel pairs"):
        megatron_family(graph, model)


def test_an_interleaved_hybrid_is_refused_for_mambamodel(monkeypatch):
    # granite_h_rope (tests/data/hybrid_cases) is exported with rope; were its pairs (2i, 2i + 1), MambaModel's
    # RotaryEmbedding (built without rotary_interleaved) would lay its frequencies out as halves
    from exporters.megatron.mamba import hybrid_stack
    from exporters.megatron.mamba_rotary import _hybrid_rotary  # unkept: hybrid_rotary keeps answers per graph

    graph = load_graph(DATA / "hybrid_cases" / "granite_h_rope_dynamo_consts.onnx", DIMS)
    stack = hybrid_stack(graph)
    assert _hybrid_rotary(stack, graph).args[:2] == ("--position-embedding-type", "rope")
    monkeypatch.setattr(families, "rotary_pairs", lambda g, attention: ("interleaved",) * len(attention))
    assert "without rotary_interleaved" in _hybrid_rotary(stack, graph).refusal
