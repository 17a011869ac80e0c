"""Issue 25, round 4 of unseen architectures (h29g): an MLP activation none of Megatron-LM's flags builds is refused.

Fixture: ``tests/data/apertus_cases`` (``bench/unseen_archs.py --fixture apertus tests/data/apertus_cases``):
transformers' Apertus, whose ungated
MLP applies xIELU (``Where(x > 0, a_p x^2 + b x, a_n (expm1(min(x, eps)) - x) + b x)``, with ``a_p``, ``a_n`` learned
per layer; Huang et al. 2024, arXiv:2411.13010). The activation used to read as "none found", and the GPT export then
wrote no activation flag: megatron-core 0.16.1 would train GELU (``TransformerConfig.activation_func`` defaults to
``F.gelu``), a different model, without a word.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.megatron import feature_refusals
from importers.transformer import analyze_transformer
from planner.plan import load_graph

CASES = Path(__file__).resolve().parents[1] / "data" / "apertus_cases"
NAME = "apertus_dynamo_bare.onnx"
RECORD = json.loads((CASES / "counts.json").read_text())["files"][NAME]


@pytest.fixture(scope="module")
def model():
    return analyze_transformer(load_graph(CASES / NAME, {"batch": 2, "seq": 16}))


def test_xielu_reads_as_an_activation_no_flag_names(model):
    assert not model.gated_mlp and model.features.mlp_activation == "other"
    assert len(model.mlps) == RECORD["config"]["num_hidden_layers"] and not model.irregular


def test_megatron_gpt_export_is_refused_naming_the_activation(model):
    refusals = feature_refusals(model)
    assert len(refusals) == 1
    assert "its MLP uses an activation that is none of GELU" in refusals[0] and "plain MLP is GELU" in refusals[0]


def test_the_layers_are_read_otherwise_as_the_config_says(model):
    config = RECORD["config"]
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size) == (
        config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"])
    assert (model.num_attention_heads, model.num_query_groups) == (config["num_attention_heads"],
                                                                  config["num_key_value_heads"])
    assert model.features.qk_norm == "per-head"
