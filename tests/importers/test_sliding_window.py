"""Sliding windows read from the file (:mod:`importers.sliding_window`): the ``kv > q - W`` comparison
both torch exporters write for transformers' ``sliding_window``. The windows are the fixtures'
configs: ``tests/exporters/data/gemma2_tiny.onnx`` 8 (``make_megatron_fixtures.py``),
``gemma3_tiny.onnx`` 16 (``make_qk_norm_fixtures.py``), the zoo's Mistral 64 (``tests/zoo/make_zoo.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from importers.sliding_window import sliding_windows

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("path", "windows"), [
    ("exporters/data/gemma2_tiny.onnx", (8,)),
    ("exporters/data/gemma3_tiny.onnx", (16,)),
    ("zoo/mistral_ts_consts.onnx", (64,)),
    ("zoo/mistral_ts_bare.onnx", (64,)),  # TorchScript keeps the scalar as a Constant node
    ("zoo/mistral_dynamo_consts.onnx", (64,)),
    # dynamo's scalar initializer stripped with the weights: not read, but known to be there (window_unread;
    # tests/importers/test_sliding_window_layers.py)
    ("zoo/mistral_dynamo_bare.onnx", ()),
    ("exporters/data/qwen3_tiny.onnx", ()),  # plain causal: kv <= q, no constant
    ("zoo/llama_ts_consts.onnx", ()),
    # GreaterOrEqual(Range, Sub(size, shift)): shifted-window slices, a size minus a constant, not positions
    ("zoo/swin_ts_consts.onnx", ()),
])
def test_the_fixtures_windows(path, windows):
    assert sliding_windows(str(TESTS / path)) == windows


@pytest.mark.parametrize(("path", "layers"), [
    ("exporters/data/gemma2_tiny.onnx", (8, None)),  # layer_types: sliding, full (every other layer)
    ("exporters/data/gemma3_tiny.onnx", (16, 16)),  # five of six sliding: both of its two layers
    ("zoo/mistral_ts_consts.onnx", (64, 64)),
    ("zoo/mistral_dynamo_consts.onnx", (64, 64)),
    ("zoo/llama_ts_consts.onnx", (None, None)),
])
def test_which_attentions_the_window_masks(path, layers):
    """Per layer (softmax in graph order), the window the graph records (OpGraph.attention_windows)."""
    from objectives.attention import find_attention_cores
    from planner.plan import load_graph

    graph = load_graph(TESTS / path, {"batch": 2, "seq": 32})
    assert tuple(core.window for core in find_attention_cores(graph)) == layers


def test_every_zoo_file_reads_its_config_window():
    """Each zoo file (tests/zoo/zoo.json) has its config's sliding_window read, or unread in the one
    style that strips it (dynamo, every initializer external: window_unread), and no window without one."""
    import json

    from importers.sliding_window import window_unread

    manifest = json.loads((TESTS / "zoo" / "zoo.json").read_text())
    for name, record in manifest["files"].items():
        window = record["config"].get("sliding_window")
        stripped = (record["exporter"], record["style"]) == ("dynamo", "bare")
        expected = ((), True) if window and stripped else (((window,) if window else ()), False)
        assert (sliding_windows(str(TESTS / "zoo" / name)), window_unread(str(TESTS / "zoo" / name))) == expected, name
