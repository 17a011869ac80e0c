"""Attention sinks (GPT-OSS's learned per-head logit beside the scores) are found in both torch exporters' graphs
and refused by name for Megatron-LM, whose --softmax-type learnable this export does not write; the quick-GELU
gated MLP is refused for what the graph does not show, not as a GeGLU (issue 25, task h25f)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.megatron.families import megatron_family
from exporters.megatron.sinks import attention_sinks
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
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


def test_megatron_refusal_names_the_sinks_and_the_quick_gelu(gpt_oss):
    _, graph = gpt_oss
    model = analyze_transformer(graph)
    with pytest.raises(UnsupportedExport) as refused:
        megatron_family(graph, model)
    reason = str(refused.value)
    assert "--softmax-type learnable" in reason and "2 sink tensors" in reason
    assert "quick-GELU" in reason and "GeGLU, as Gemma's" not in reason  # not the clause of GELU-gated MLPs
    # the TorchScript file's gate_up reads as gated; the dynamo file's interleaved halves (gate_up[..., ::2] and
    # [..., 1::2]) do not, and its MLP is refused as a plain one
    assert ("a = 1.702" in reason) == model.gated_mlp


def test_a_model_without_sinks_has_none():
    graph = load_graph(DATA / "llama_tiny.onnx", {"batch": 2, "seq": 16})
    assert attention_sinks(graph) == ()
