"""LFM2's gated short convolutions are token mixers, not MLPs (issue 25, task h27i).

transformers 5.24's ``Lfm2ShortConv``: ``in_proj`` (hidden -> 3 x hidden) split into ``B, C, x``, a depthwise
causal conv of ``B * x`` along the sequence, times ``C``, ``out_proj``. Read back from ``out_proj``, ``C`` reaches
``in_proj`` without the conv, so the MLP reader took each for an MLP of FFN ``hidden``: round 3's LFM2 read "1
attention blocks but 5 MLP blocks" and an FFN size of 64, the first layer's convolution's (``importers.conv_mixer``).

File: ``tests/data/lfm2_cases`` (``bench/unseen_archs.py --fixture lfm2 tests/data/lfm2_cases``:
``Lfm2ForCausalLM``, round 3's config,
dynamo, graph-only). Expected numbers come from the config and torch's own count (``counts.json``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers import import_model
from importers.transformer import analyze_transformer
from planner.plan import load_graph

CASES = Path(__file__).resolve().parents[1] / "data" / "lfm2_cases"
NAME = "lfm2_dynamo_bare.onnx"
RECORD = json.loads((CASES / "counts.json").read_text())["files"][NAME]
CONFIG = RECORD["config"]
DIMS = {"batch": CONFIG["example_batch"], "seq": CONFIG["example_seq"]}


@pytest.fixture(scope="module")
def graph():
    return load_graph(CASES / NAME, DIMS)


def test_one_mlp_per_layer_and_the_convolutions_named(graph) -> None:
    model = analyze_transformer(graph)
    layers, types = CONFIG["num_hidden_layers"], CONFIG["layer_types"]
    assert model.num_layers == types.count("full_attention") == 1  # the layer count is the attention blocks'
    # every layer has its SwiGLU MLP (w1, w3, w2 of intermediate_size: block_auto_adjust_ff_dim is False)
    assert model.ffn_hidden_size == CONFIG["intermediate_size"] == 128
    assert f"{types.count('full_attention')} attention blocks but {layers} MLP blocks" in model.irregular
    (clause,) = [reason for reason in model.irregular if "gated short convolution" in reason]
    assert clause.startswith(f"{types.count('conv')} gated short convolution(s)")
    named = clause.split("ending at ")[1].split(" ")[0]
    (op,) = [o for o in graph.ops if o.name == named]
    assert op.module_path == "model.layers.0.conv.out_proj"  # the first conv layer's output projection


def test_the_parameter_count_is_torchs() -> None:
    assert import_model(CASES / NAME, DIMS).parameter_count == RECORD["param_count"] == 183_648
