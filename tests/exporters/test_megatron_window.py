"""Issue 25: a sliding attention window goes to Megatron-LM as ``--window-size W-1,0`` (and
``--window-attn-skip-freq N`` where every N-th layer attends fully, else the per-layer list), or is refused in one line
(:mod:`exporters.megatron.window`). The zoo's Mistral has ``sliding_window`` 64 on both of its 2
layers (``tests/zoo/zoo.json``); Gemma-2's fixture windows its first layer of two at 8
(``tests/exporters/data/gemma2_tiny.onnx``) and stays refused for its other features."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters.megatron import export_megatron, megatron_masks
from exporters.megatron.families import megatron_family
from exporters.megatron.window import layer_windows, megatron_window_args, window_refusal
from exporters.validate import parse_megatron_args
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
MISTRAL = ROOT / "tests" / "zoo" / "mistral_ts_consts.onnx"
GEMMA2 = ROOT / "tests" / "exporters" / "data" / "gemma2_tiny.onnx"


def _export(graph, dp=1, tp=1):
    spaces = spaces_for(graph, dp * tp)
    masks = megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=False)
    assert masks is not None
    return export_megatron(make_input(graph, spaces, first_rows(masks), settings=TrainingSettings(), global_batch=16))


@pytest.fixture(scope="module")
def mistral():
    return load_graph(MISTRAL, {"batch": 16, "seq": 128})


def _with_windows(graph, windows):
    """``graph`` with its layers' softmaxes windowed as ``windows`` (``None``: full causal)."""
    model = analyze_transformer(graph)
    names = [graph.ops[block.softmax].onnx_nodes[0] for block in model.attention]
    return dataclasses.replace(graph, attention_windows={n: w for n, w in zip(names, windows) if w is not None})


def test_the_zoo_mistral_exports_its_window(mistral):
    """Window 64: each query sees itself and 63 keys before it, megatron-core's (63, 0), on every layer."""
    export = _export(mistral, dp=2)
    args = parse_megatron_args(export["args"])
    assert args["window-size"] == "63,0"
    assert "window-attn-skip-freq" not in args
    assert (args["seq-length"], args["num-layers"]) == (128, 2)


def test_a_window_no_narrower_than_the_sequence_is_still_written(mistral):
    """At 64 tokens the window masks nothing, but the model is the windowed one: a longer
    --seq-length keeps it (the flags are the model's, not the planned length's)."""
    short = load_graph(MISTRAL, {"batch": 16, "seq": 64})
    assert megatron_window_args(short, analyze_transformer(short)) == ["--window-size", "63,0"]


@pytest.mark.parametrize(("windows", "args"), [
    ((64, None), ["--window-size", "63,0", "--window-attn-skip-freq", "2"]),  # Gemma-2: layer 2 full
    ((64, 64), ["--window-size", "63,0"]),
    # full then windowed (Qwen2's max_window_layers = 1): no N windows layer 2 and not layer 1, the list does
    ((None, 64), ["--window-size", "63,0", "--window-attn-skip-freq", "[0]*1+[1]*1"]),
])
def test_patterns_megatron_says(mistral, windows, args):
    graph = _with_windows(mistral, windows)
    assert megatron_window_args(graph, analyze_transformer(graph)) == args


@pytest.mark.parametrize(("windows", "clause"), [
    ((64, 32), r"different sliding windows \(32, 64 tokens\) and Megatron-LM's --window-size is one"),
])
def test_patterns_megatron_cannot_say_are_refused_in_one_line(mistral, windows, clause):
    graph = _with_windows(mistral, windows)
    model = analyze_transformer(graph)
    assert layer_windows(graph, model) == windows
    with pytest.raises(UnsupportedExport, match=clause) as caught:
        megatron_family(graph, model)
    assert "\n" not in str(caught.value)
    assert megatron_masks(graph, spaces_for(graph, 2), dp=2, tp=1, sequence_parallel=False) is None  # no row lists it


def test_gemma2_stays_refused_for_its_other_features():
    """Its window pattern is one Megatron says (every other layer full), and the model is still refused
    for GeGLU, soft-capping and sandwich norms: the window makes no refused model exportable."""
    graph = load_graph(GEMMA2, {"batch": 2, "seq": 32})
    model = analyze_transformer(graph)
    assert layer_windows(graph, model) == (8, None)
    assert window_refusal(graph, model) == ""
    with pytest.raises(UnsupportedExport, match="GeGLU.*soft-caps"):
        megatron_family(graph, model)


def test_a_windowed_hybrid_stack_is_refused():
    """The hybrid (pretrain_mamba.py) export writes no window: a window read from the file takes the
    stack off Megatron's rows (its other checks pass: tests/exporters/test_megatron_mamba.py)."""
    from exporters.megatron.mamba import hybrid_masks

    graph = load_graph(ROOT / "tests" / "exporters" / "data" / "nemotron_h_tiny_ts_consts.onnx", {"batch": 8, "seq": 32})
    spaces = spaces_for(graph, 2)
    assert hybrid_masks(graph, spaces, dp=2, tp=1) is not None
    softmax = next(op for op in graph.ops if op.kind == "softmax")
    windowed = dataclasses.replace(graph, attention_windows={softmax.onnx_nodes[0]: 16})
    assert hybrid_masks(windowed, spaces, dp=2, tp=1) is None
