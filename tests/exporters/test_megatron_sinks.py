"""Attention sinks (GPT-OSS's learned per-head logit beside the scores) are found in both torch exporters' graphs
and exported to Megatron-LM as --softmax-type learnable, one logit per head in every layer; sinks of another shape
are refused by name (issue 25, tasks h25f and h26e; the whole GPT-OSS export is tests/exporters/test_megatron_gpt_oss.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.megatron.sinks import attention_sinks, megatron_sink_args, sink_refusal
from importers.transformer import analyze_transformer
from planner.plan import load_graph

DATA = Path(__file__).resolve().parents[1] / "data"
SINKS = DATA / "sink_cases"
COUNTS = json.loads((SINKS / "counts.json").read_text())["files"]


@pytest.fixture(scope="module", params=sorted(COUNTS))
def gpt_oss(request):
    return request.param, load_graph(SINKS / request.param, {"batch": 2, "seq": 16})


def test_one_sink_tensor_per_layer_of_one_logit_per_head(gpt_oss):
    name, graph = gpt_oss
    config = COUNTS[name]["config"]  # the transformers config the file was exported from
    sinks = attention_sinks(graph)
    assert len(sinks) == config["num_hidden_layers"]  # GptOssAttention.sinks: nn.Parameter(num_attention_heads)
    assert [graph.tensors[s].num_elements for s in sinks] == [config["num_attention_heads"]] * len(sinks)


def test_sinks_are_megatron_s_learnable_softmax(gpt_oss):
    _, graph = gpt_oss
    model = analyze_transformer(graph)
    assert megatron_sink_args(graph) == ["--softmax-type", "learnable"]
    assert sink_refusal(graph, model.num_attention_heads, model.num_layers) == []
    # DotProductAttention.softmax_offset has num_attention_heads values in every layer: another count is refused
    (clause,) = sink_refusal(graph, model.num_attention_heads * 2, model.num_layers)
    assert "2 tensors of 4 values, in a model of 2 attention layers of 8 heads" in clause
    assert "--softmax-type learnable gives every layer one logit per head" in clause


def test_a_model_without_sinks_has_none():
    graph = load_graph(DATA / "llama_tiny.onnx", {"batch": 2, "seq": 16})
    assert attention_sinks(graph) == () and megatron_sink_args(graph) == []
