"""torchtitan's refusal does not call a decoder's cross-attention a NoPE layer (issue 25, task h26f).

Moonshine (``tests/data/cross_rotary_cases``, ``tests/exporters/make_cross_rotary_case.py``) rotates the queries
and keys of its 2 encoder and 2 decoder self-attention layers and, by design, not those of its 2 cross-attention
layers (keys from the encoder's output). ``--target torchtitan`` refused it, rightly, but said "in layers 3, 5
(counting from 0) its attention does not rotate the queries and keys (NoPE layers, as SmolLM3's)": the blocks in
order are encoder 0, 1, decoder self 2, cross 3, self 4, cross 5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.torchtitan.families import torchtitan_arch
from importers.rotary import rotated_layers
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.pricing import load_graph

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "cross_rotary_cases"


def test_cross_attention_is_no_nope_layer():
    config = json.loads((CASES / "counts.json").read_text())["files"]["moonshine_dynamo_bare.onnx"]["config"]
    graph = load_graph(CASES / "moonshine_dynamo_bare.onnx", {"batch": 2, "samples": 16000, "tgt_seq": 8})
    model = analyze_transformer(graph)
    layers = config["encoder_num_hidden_layers"] + 2 * config["decoder_num_hidden_layers"]
    turned = rotated_layers(graph, model.attention)
    # the graph does show two unrotated blocks (the cross-attentions): the reading is right, the clause was not
    assert len(turned) == layers == 6 and [i for i, t in enumerate(turned) if t != "both"] == [3, 5]
    with pytest.raises(UnsupportedExport) as refused:  # an encoder-decoder, with GELU and SiLU MLPs: refused
        torchtitan_arch(graph)
    said = str(refused.value)
    assert "would train a different model" in said and "NoPE" not in said and "does not rotate" not in said, said
