"""Issue 25: which layers a sliding window masks, and a window whose width the file does not hold.

* Qwen2 with ``use_sliding_window=True`` windows only the layers from index ``max_window_layers`` on
  (``Qwen2Config.layer_types``, transformers 5.x): ``tests/data/window_cases/`` holds a 3-layer model
  with ``sliding_window=8`` and ``max_window_layers=1`` (``make_window_cases.py``; ``counts.json``
  records transformers' ``layer_types``: full, sliding, sliding). The importer reads the window on
  layers 2 and 3 only, and Megatron-LM gets it as ``--window-size 7,0`` and the per-layer list
  ``--window-attn-skip-freq [0]*1+[1]*2`` (no integer N has layer 1 full and layer 3 windowed).
* The same model saved with every initializer external and its data file gone (``bare``) holds the
  comparison ``kv > q - W`` but not ``W``, as the zoo's ``mistral_dynamo_bare.onnx`` does: the window is
  unread, and the launchers that build causal attention from flags (Megatron-LM, torchtitan) refuse it
  in one line, so no row lists them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.megatron import megatron_masks
from exporters.megatron.families import megatron_family
from exporters.megatron.window import layer_windows, megatron_window_args, window_refusal
from exporters.torchtitan.export import torchtitan_masks
from exporters.torchtitan.families import torchtitan_arch
from exporters.validate import megatron_violations, parse_megatron_args
from importers.sliding_window import UNREAD_WINDOW_NOTE, sliding_windows, window_unread
from importers.transformer import analyze_transformer
from planner.core.errors import InputError, UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import spaces_for
from tests.exporters.test_megatron_window import _export

TESTS = Path(__file__).resolve().parents[1]
CASES = TESTS / "data" / "window_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())


def _graph(name: str, seq: int = 32):
    return load_graph(CASES / name, {"batch": 8, "seq": seq})


@pytest.mark.parametrize("name", ["qwen2_swa_dynamo_consts.onnx", "qwen2_swa_ts_consts.onnx"])
def test_qwen2_windows_the_layers_from_max_window_layers_on(name):
    """layer_types full, sliding, sliding -> per layer (None, 8, 8): the window on the layers
    transformers slides, none on the one it does not."""
    graph = _graph(name)
    model = analyze_transformer(graph)
    types = COUNTS["files"][name]["layer_types"]
    assert types == ["full_attention", "sliding_attention", "sliding_attention"]
    expected = tuple(COUNTS["configs"]["qwen2_swa"]["sliding_window"] if t == "sliding_attention" else None
                     for t in types)
    assert layer_windows(graph, model) == expected == (None, 8, 8)
    assert sliding_windows(str(CASES / name)) == (8,) and not window_unread(str(CASES / name))
    assert UNREAD_WINDOW_NOTE not in graph.warnings


@pytest.mark.parametrize("name", ["qwen2_swa_dynamo_consts.onnx", "qwen2_swa_ts_consts.onnx"])
def test_megatron_says_the_qwen2_pattern_as_a_per_layer_list(name):
    """--window-size 7,0 (8 keys: itself and 7 before) and the list Megatron-LM's moe_freq_type reads,
    entry n - 1 for layer n (is_layer_window_attention: 1 windowed, 0 full) = layer_types."""
    graph = _graph(name)
    model = analyze_transformer(graph)
    assert window_refusal(graph, model) == ""
    assert megatron_window_args(graph, model) == ["--window-size", "7,0", "--window-attn-skip-freq", "[0]*1+[1]*2"]
    export = _export(graph, dp=2)
    args = parse_megatron_args(export["args"])
    types = COUNTS["files"][name]["layer_types"]
    assert args["window-attn-skip-freq"] == [int(t == "sliding_attention") for t in types] == [0, 1, 1]
    assert (args["window-size"], args["num-layers"]) == ("7,0", 3)
    assert megatron_violations(export["args"], world_size=2, env=export["env"]) == []


def test_the_validator_reads_the_list_as_megatron_lm_does():
    """An integer, or a list expression of digits, commas, brackets, + and * (Megatron-LM's
    _eval_pattern); the list holds one 0/1 per layer."""
    base = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "1",
            "--window-size", "7,0"]
    assert parse_megatron_args("--window-attn-skip-freq ([1]*3+[0]*1)*2")["window-attn-skip-freq"] == [1, 1, 1, 0] * 2
    assert parse_megatron_args("--window-attn-skip-freq 6")["window-attn-skip-freq"] == 6
    assert megatron_violations([*base, "--window-attn-skip-freq", "[1]*3+[0]"], world_size=1) == []
    short = megatron_violations([*base, "--window-attn-skip-freq", "[1]*3"], world_size=1)
    assert short == ["--window-attn-skip-freq's list must hold one 0 (full) or 1 (windowed) per layer (4 layers; "
                     "got 3 entries)"]
    assert megatron_violations([*base, "--window-attn-skip-freq", "0"], world_size=1) == [
        "--window-attn-skip-freq must be at least 1 (got 0)"]
    for bad in ("[1]*x", "[1]**2", "[1]+2", "[1]*99999999"):
        with pytest.raises(InputError, match="is not a list expression of integers"):
            parse_megatron_args(["--window-attn-skip-freq", bad])


@pytest.mark.parametrize("path", [CASES / "qwen2_swa_dynamo_bare.onnx", TESTS / "zoo" / "mistral_dynamo_bare.onnx"])
def test_a_window_of_unread_width_is_refused_by_the_flag_launchers(path):
    """The comparison is in the file, its W (a scalar initializer, external, data file gone) is not:
    no window is recorded (priced causal), and Megatron-LM and torchtitan refuse in one line and list
    no row; the consts file of the same export reads the width (test above)."""
    graph = load_graph(path, {"batch": 8, "seq": 32})
    model = analyze_transformer(graph)
    assert (sliding_windows(str(path)), window_unread(str(path)), dict(graph.attention_windows)) == ((), True, {})
    assert UNREAD_WINDOW_NOTE in graph.warnings  # the import says so, in one line
    assert "sliding window whose width the file does not hold" in window_refusal(graph, model)
    for refuse in (lambda: megatron_family(graph, model), lambda: torchtitan_arch(graph)):
        with pytest.raises(UnsupportedExport, match="whose width the file does not hold") as caught:
            refuse()
        assert "\n" not in str(caught.value)
    spaces = spaces_for(graph, 2)
    assert megatron_masks(graph, spaces, dp=2, tp=1, sequence_parallel=False) is None
    assert torchtitan_masks(graph, spaces, dp=2, tp=1) is None


def test_a_file_without_a_window_is_not_unread():
    """A plain causal model saved the same way (every initializer external) has kv <= q and no
    kv > q - W: nothing unread, nothing refused for it."""
    path = TESTS / "zoo" / "llama_dynamo_bare.onnx"
    graph = load_graph(path, {"batch": 8, "seq": 32})
    assert (sliding_windows(str(path)), window_unread(str(path))) == ((), False)
    assert window_refusal(graph, analyze_transformer(graph)) == ""


def _mask_file(path: Path, *, inline: bool, positions: bool = True) -> None:
    """A hand-built ``Greater(kv, Sub(q, W))`` into a softmax, W = 4 inline or external with no data file;
    ``q`` the query positions (``Range``), or with ``positions=False`` a size (``Shape``)."""
    import onnx
    from onnx import TensorProto as T, helper

    w = helper.make_tensor("w", T.INT64, [], [4])
    if not inline:  # as onnx.save(..., size_threshold=0) writes it, then the data file deleted
        w.ClearField("int64_data")
        w.data_location = T.EXTERNAL
        w.external_data.add(key="location", value=path.name + ".data")
    nodes = [helper.make_node("Range", ["a", "n", "d"], ["q"]) if positions else helper.make_node("Shape", ["k"], ["q"]),
             helper.make_node("Sub", ["q", "w"], ["start"]), helper.make_node("Greater", ["k", "start"], ["m"]),
             helper.make_node("Where", ["m", "s", "ninf"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], name="sm")]
    ints = [helper.make_tensor_value_info(n, T.INT64, d) for n, d in (("k", [8]), ("a", []), ("n", []), ("d", []))]
    floats = [helper.make_tensor_value_info(n, T.FLOAT, [8]) for n in ("s", "ninf")]
    graph = helper.make_graph(nodes, "g", ints + floats, [helper.make_tensor_value_info("p", T.FLOAT, [8])], [w])
    onnx.save(helper.make_model(graph), str(path))


def test_the_width_is_read_inline_and_unread_external(tmp_path):
    """Same graph, W = 4: inline it is the window, external without its data file it is unread and
    masks no softmax (softmax_windows, hence OpGraph.attention_windows: priced causal)."""
    import onnx

    from importers.sliding_window import softmax_windows

    inline, external = tmp_path / "inline.onnx", tmp_path / "external.onnx"
    _mask_file(inline, inline=True)
    _mask_file(external, inline=False)
    assert (sliding_windows(str(inline)), window_unread(str(inline))) == ((4,), False)
    assert softmax_windows(onnx.load(str(inline))) == {"sm": 4}
    assert (sliding_windows(str(external)), window_unread(str(external))) == ((), True)
    assert softmax_windows(onnx.load(str(external), load_external_data=False)) == {}


def test_a_hybrid_stack_with_an_unread_window_is_refused(monkeypatch):
    """The hybrid (pretrain_mamba.py) export writes no window: one of unread width takes the stack
    off Megatron's rows as a read one does (tests/exporters/test_megatron_window.py)."""
    import exporters.megatron.window as window
    from exporters.megatron.mamba import hybrid_masks

    graph = load_graph(TESTS / "exporters" / "data" / "nemotron_h_tiny_ts_consts.onnx", {"batch": 8, "seq": 32})
    spaces = spaces_for(graph, 2)
    assert hybrid_masks(graph, spaces, dp=2, tp=1) is not None
    monkeypatch.setattr(window, "window_unread", lambda path, sha256="": True)  # as if its W were stripped
    assert hybrid_masks(graph, spaces, dp=2, tp=1) is None


def test_a_size_minus_a_constant_is_no_window(tmp_path):
    """Swin's shifted-window slices compare indices with a size minus the shift: the same comparison with
    q a Shape (not positions) reads no window, inline or stripped."""
    for inline in (True, False):
        path = tmp_path / f"size_{inline}.onnx"
        _mask_file(path, inline=inline, positions=False)
        assert (sliding_windows(str(path)), window_unread(str(path))) == ((), False)
