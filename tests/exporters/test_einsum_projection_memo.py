"""``exporters._tp.einsum_projection`` is kept per (graph, model) (issue 22, speed): DTensor's and DeepSpeed's
family masks ask it for every tp > 1 family of every stage. The oracle is the uncached walk over the projections
(``_einsum_projection``): the kept answer is the one it gives, for a model whose projections are einsums (XLNet)
and one whose projections are linears (GPT-2), asked in turns so neither answer is served for the other graph."""

from __future__ import annotations

from pathlib import Path

from exporters._tp import _einsum_projection, einsum_projection
from exporters.dtensor.export import dtensor_masks
from importers.transformer import analyze_transformer
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.plan import load_graph

DATA = Path(__file__).resolve().parents[1] / "data"


def test_kept_answer_is_the_walks_for_each_graph_in_turn():
    xlnet = load_graph(DATA / "einsum_attention_cases" / "xlnet_ts_bare.onnx", {"batch": 2, "seq": 64})
    gpt2 = load_graph(DATA / "gpt2_tiny.onnx", {"batch": 2, "seq": 64})
    models = {"xlnet": (xlnet, analyze_transformer(xlnet)), "gpt2": (gpt2, analyze_transformer(gpt2))}
    walked = {name: _einsum_projection(graph, model) for name, (graph, model) in models.items()}
    # XLNet's q is a [d, n, d_head] Parameter read by torch.einsum; GPT-2's projections are Conv1D matmuls
    assert walked["xlnet"] is not None and "rel_attn.q with torch.einsum" in walked["xlnet"]
    assert walked["gpt2"] is None
    for name in ["xlnet", "gpt2", "xlnet", "gpt2"]:
        assert einsum_projection(*models[name]) == walked[name]


def test_dtensor_refuses_tp_on_xlnet_after_the_answer_is_kept():
    # the refusal reads the kept answer: tp = 2 has no mask, tp = 1 has one per op, asked twice each
    graph = load_graph(DATA / "einsum_attention_cases" / "xlnet_ts_bare.onnx", {"batch": 8, "seq": 64})
    spaces = [enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8)) for op in graph.ops]
    for _ in range(2):
        assert dtensor_masks(graph, spaces, dp=4, tp=2) is None
        masks = dtensor_masks(graph, spaces, dp=8, tp=1)
        assert masks is not None and len(masks) == len(graph.ops)
