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

import dataclasses
import json
from pathlib import Path

import pytest

from exporters import export
from exporters.megatron import vlm
from exporters.megatron.vlm import Tower, VlmParts, nearest_preset, vlm_parts
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


# ---------------------------------------------------------------------------------------------------------------
# h30d: the two launchers against LLaVA-1.5's own tower (tests/exporters/make_llava_cases.py). Expected values come
# from the fixtures' configs (counts.json) and Megatron-LM's examples/multimodal/config.py (commit 00caa53: the clip
# preset is 24 layers of 1024, 16 heads of 64, FFN 4096 quick-GELU, LayerNorm, biases; mistral_7b's projector is
# FFN 14336 GELU without biases or norm), never from the planner.

FILES = json.loads((CASES / "counts.json").read_text())["files"]


@pytest.fixture(scope="module")
def llava15():
    return load_graph(CASES / "llava15_ts_consts.onnx", {"batch": 1})


@pytest.fixture(scope="module")
def tied():
    return load_graph(CASES / "llava_tied_ts_consts.onnx", {"batch": 1})


def _refusal(graph) -> str:
    spaces = spaces_for(graph, 1)
    with pytest.raises(UnsupportedExport) as info:
        export("megatron", make_input(graph, spaces, [0] * len(spaces)))
    return str(info.value)


def test_llava15_tower_is_clip_less_its_last_layer(llava15):
    config = FILES["llava15_ts_consts.onnx"]["config"]
    vision, text = config["vision"], config["text"]
    parts = vlm_parts(llava15, analyze_transformer(llava15))
    # vision_feature_layer=-2: the last layer's output is never read, so the file holds one layer fewer
    assert config["vision_feature_layer"] == -2 and parts.vision.layers == vision["num_hidden_layers"] - 1
    assert (parts.vision.hidden, parts.vision.heads, parts.vision.head_dim, parts.vision.ffn) == (
        vision["hidden_size"], vision["num_attention_heads"], vision["hidden_size"] // vision["num_attention_heads"],
        vision["intermediate_size"])
    assert parts.vision.seq == (vision["image_size"] // vision["patch_size"]) ** 2 + 1  # CLIP's class token
    assert (parts.patch, parts.image) == (vision["patch_size"], (vision["image_size"], vision["image_size"]))
    assert parts.vision.activation == "quick-GELU" and parts.vision.normalization == "LayerNorm"
    assert parts.vision.bias and parts.vision.qkv_bias and parts.tower_pre_norm  # CLIP's pre_layrnorm
    # the reader's MLPs are the tower's width (1024): the projector and the decoder's are read by vlm_parts
    assert parts.projector == (vision["hidden_size"], text["hidden_size"], text["hidden_size"])
    assert parts.projector_bias and parts.projector_norms == 0 and parts.projector_activation == "GELU"
    assert (parts.language.layers, parts.language.hidden, parts.language.ffn, parts.language.activation) == (
        text["num_hidden_layers"], text["hidden_size"], text["intermediate_size"], "SwiGLU")
    preset, differ = nearest_preset(parts)
    assert preset.name == "clip" and len(differ) == 1 and differ[0].startswith("layers 23 vs 24 ")


def test_llava15_refusal_names_clip_and_the_projector(llava15):
    reason = _refusal(llava15)
    assert "\n" not in reason and reason.endswith("as the generic plan")
    assert "the nearest, clip (24 layers of width 1024, 16 heads of 64, FFN 4096 quick-GELU), differs in layers 23 vs 24" in reason
    assert "vision_feature_layer=-2" in reason
    assert "no --language-model-type pairs a projector 1024 -> 64 -> 64 GELU with biases and 0 norms before it" in reason
    assert "only mistral_7b's projector has no norm" in reason and "TELayerNormColumnParallelLinear" in reason


def test_tied_tower_is_the_decoder_and_only_the_projector_norm_differs(tied):
    parts = vlm_parts(tied, analyze_transformer(tied))
    assert vlm._differences(parts.vision, parts.language) == []  # Starcoder2's layers at CLIP's sizes: the same
    assert parts.projector == (64, 64, 64) and parts.language.ffn == 64 and parts.projector_norms == 0
    reason = _refusal(tied)
    assert "its vision tower's layers differ" not in reason and "not the decoder's MLP" not in reason
    assert ("and it has no norm between its tower's last layer and its projector's first linear, where "
            "pretrain_vlm.py's projector (the decoder layer spec's MLP) has one with Transformer Engine") in reason
    assert "--transformer-impl local, whose tower attends causally" in reason


def _clip_mistral(**change) -> VlmParts:
    """Hand-made parts: the clip preset's tower beside a mistral_7b decoder and projector (config.py, 00caa53)."""
    tower = Tower(layers=24, hidden=1024, heads=16, groups=16, head_dim=64, seq=577, ffn=4096, activation="quick-GELU")
    decoder = Tower(layers=2, hidden=14336, heads=8, groups=8, head_dim=1792, seq=1024, ffn=14336, activation="SwiGLU",
                    normalization="RMSNorm", bias=False, qkv_bias=False)
    fields = dict(vision=tower, language=decoder, projector=(1024, 14336, 14336), projector_activation="GELU",
                  projector_bias=False, projector_norms=0, tower_pre_norm=True, patch=14, image=(336, 336))
    return VlmParts(**{**fields, **change})


def test_examples_multimodal_matches_only_its_preset_pairs():
    assert vlm._multimodal_clause(_clip_mistral()) == ""  # clip + mistral_7b: examples/multimodal's own model
    assert vlm._projector_presets(_clip_mistral(), 0) == ["mistral_7b"]
    biased = vlm._multimodal_clause(_clip_mistral(projector_bias=True))
    assert biased.startswith("no --language-model-type pairs a projector 1024 -> 14336 -> 14336 GELU with biases")
    # llama3_8b's projector has the same FFN but a norm before its first linear (it keeps --normalization)
    assert vlm._projector_presets(_clip_mistral(projector_norms=1), 1) == ["llama3_8b"]
    no_class = vlm._multimodal_clause(_clip_mistral(vision=dataclasses.replace(_clip_mistral().vision, seq=576)))
    assert "differs in class token no vs yes" in no_class


def test_pretrain_vlm_matches_only_a_tower_of_the_decoders_layers_and_a_normed_projector():
    """pretrain_vlm.py with Transformer Engine: tower = the decoder's layers, projector = one norm then the decoder's
    MLP (tower width -> decoder FFN -> decoder width, its activation and biases), the head untied."""
    layers = Tower(layers=2, hidden=64, heads=4, groups=4, head_dim=16, seq=17, ffn=64, activation="GELU")
    own = _clip_mistral(vision=layers, language=dataclasses.replace(layers, seq=24), projector=(64, 64, 64),
                        projector_bias=True, projector_norms=1, patch=8, image=(32, 32))
    assert vlm._pretrain_vlm_clause(own) == ""
    assert vlm._pretrain_vlm_clause(dataclasses.replace(own, projector_norms=0)).startswith("it has no norm between")
    assert vlm._pretrain_vlm_clause(dataclasses.replace(own, tied_head=True)).startswith("its LM head is its token")
    wider = vlm._pretrain_vlm_clause(dataclasses.replace(own, projector=(64, 256, 64)))
    assert wider == "its projector is 64 -> 256 -> 64 GELU, not the decoder's MLP (64 -> 64 -> 64 GELU)"
