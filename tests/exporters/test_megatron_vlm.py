"""LLaVA to Megatron-LM: refused in one line that names the vision tower, the projector and the decoder and what
``pretrain_vlm.py`` would build instead (issue 25, h28f; ``exporters/megatron/vlm.py``).

Before, the refusal was "Megatron-LM trains a uniform stack of GPT layers; this model is not one", true of
``pretrain_gpt.py`` but silent on megatron-core's ``LLaVAModel``. ``pretrain_vlm.py`` builds the tower and the projector
from the decoder's config (``deepcopy(language_transformer_config)``, only ``--encoder-num-layers`` changed; the
projector is the decoder layer spec's MLP), so a LLaVA-1.5 (CLIP tower, Llama decoder) is not what it trains.

File: ``tests/data/vlm_cases/llava_ts_consts.onnx`` (``bench/unseen_archs.py --only llava``: transformers 5.24's
``LlavaForConditionalGeneration``, a 2-layer CLIP tower of width 64, 4 heads, FFN 128, quick-GELU, 32-pixel images of
8-pixel patches; a 2-layer GELU projector 64 -> 64 -> 64; a Llama decoder of 2 layers, width 64, 4 heads over 2 KV
groups, FFN 128, SwiGLU). Expected values come from ``counts.json``'s config and transformers' defaults
(``CLIPVisionConfig.hidden_act`` quick_gelu, ``LlavaConfig.projector_hidden_act`` gelu, ``LlamaConfig.hidden_act``
silu), never from the planner.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters import export
from exporters.megatron.vlm import vlm_parts
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "vlm_cases"
NAME = "llava_ts_consts.onnx"
CONFIG = json.loads((CASES / "counts.json").read_text())["files"][NAME]["config"]
VISION = CONFIG["vision"]


@pytest.fixture(scope="module")
def llava():
    return load_graph(CASES / NAME, {"batch": 2})


def test_the_tower_projector_and_decoder_are_read(llava):
    parts = vlm_parts(llava, analyze_transformer(llava))
    vision, language = parts.vision, parts.language
    patches = (VISION["image_size"] // VISION["patch_size"]) ** 2
    assert (vision.layers, vision.hidden, vision.heads, vision.groups, vision.ffn, vision.seq) == (
        VISION["num_hidden_layers"], VISION["hidden_size"], VISION["num_attention_heads"],
        VISION["num_attention_heads"], VISION["intermediate_size"], patches + 1)  # + CLIP's class token
    assert vision.activation == "quick-GELU" and language.activation == "SwiGLU"
    assert (language.layers, language.hidden, language.heads, language.groups, language.ffn, language.seq) == (
        CONFIG["num_hidden_layers"], CONFIG["hidden_size"], CONFIG["num_attention_heads"],
        CONFIG["num_key_value_heads"], CONFIG["intermediate_size"], CONFIG["example_seq"])
    # LlavaMultiModalProjector: linear_1 vision width -> text width, GELU, linear_2 text width -> text width
    assert parts.projector == (VISION["hidden_size"], CONFIG["hidden_size"], CONFIG["hidden_size"])
    assert parts.projector_activation == "GELU"


def test_the_refusal_names_what_pretrain_vlm_would_build(llava):
    spaces = spaces_for(llava, 2)
    with pytest.raises(UnsupportedExport) as info:
        export("megatron", make_input(llava, spaces, [0] * len(spaces)))
    reason = str(info.value)
    assert "\n" not in reason and "uniform stack of GPT layers" not in reason
    assert "vision-language model" in reason and "pretrain_vlm.py" in reason and "LLaVAModel" in reason
    assert f"query groups {VISION['num_attention_heads']} vs {CONFIG['num_key_value_heads']}" in reason
    assert "activation quick-GELU vs SwiGLU" in reason
    h, f = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    assert f"projector is {VISION['hidden_size']} -> {h} -> {h} GELU, not the decoder's MLP ({VISION['hidden_size']} -> {f} -> {h} SwiGLU)" in reason


def test_a_plain_decoder_is_no_vlm():
    graph = load_graph(ROOT / "tests" / "data" / "hybrid_cases" / "granite_h_plain_dynamo_consts.onnx",
                       {"batch": 2, "seq": 16})
    assert vlm_parts(graph, analyze_transformer(graph)) is None  # no patch conv, one run of attention layers
