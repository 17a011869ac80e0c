"""Two-sided (local) attention windows, issue 25 (h25c): an encoder's local layers let query ``q`` see the keys
``|q - k| <= w`` (transformers' ``sliding_window_bidirectional_overlay``; ModernBERT's ``sliding_window`` is
``local_attention // 2``). The importer reads ``w`` per layer (:func:`importers.sliding_window.softmax_bands`) and a
flash kernel computes only the tiles the band crosses (:func:`objectives.attention.band_tile_fraction`); explicit
attention still computes and writes the whole grid. The fixtures are ``tests/data/window_cases/modernbert_local_*``
(``tests/importers/make_window_cases.py``: 3 layers, ``global_attn_every_n_layers=3``, ``local_attention=16``).
Numbers by hand or by brute force.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from importers.sliding_window import UNREAD_BAND_NOTE, UNREAD_WINDOW_NOTE
from objectives.attention import _visited_tiles, band_tile_fraction, find_attention_cores
from objectives.cluster import make_cluster
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.objectives.graphs import gpt2_like

CASES = Path(__file__).resolve().parents[1] / "data" / "window_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())
HALF = COUNTS["configs"]["modernbert_local"]["local_attention"] // 2  # ModernBertConfig.sliding_window: 8


@pytest.mark.parametrize(("seq", "w"), [(8, 1), (16, 3), (10, 0), (32, 8), (7, 10)])
def test_one_by_one_tiles_are_the_visible_scores(seq, w):
    """With 1 x 1 tiles the visited tiles are the pairs |i - k| <= w: by brute force, and for 2 w + 1 <= s by
    Longformer's count s (2 w + 1) - w (w + 1) (the band's diagonals less its two corner triangles)."""
    visible = sum(1 for i in range(seq) for k in range(seq) if abs(i - k) <= w)
    assert _visited_tiles(seq, seq, 1, 1, w, w) == visible
    if 2 * w + 1 <= seq:
        assert visible == seq * (2 * w + 1) - w * (w + 1)


@pytest.mark.parametrize(("seq", "head_dim", "w", "fraction"), [
    (1024, 64, 64, 22 / 64),  # 128 x 128 tiles, 8 x 8: row blocks visit 2, 3, 3, 3, 3, 3, 3, 2 key blocks
    (1024, 16, HALF, 22 / 64),  # ModernBERT's w = 8 at head dim 16: the band still crosses 3 key blocks a row
    (512, 128, 32, 14 / 32),  # 128 x 64 tiles, 4 x 8: key blocks 0-2, 1-4, 3-6, 5-7
    (1024, 64, 1024, 1.0),  # wider than the sequence: every tile
])
def test_tile_fraction_by_hand(seq, head_dim, w, fraction):
    assert band_tile_fraction(seq, seq, head_dim, w) == pytest.approx(fraction, rel=1e-12)


@pytest.mark.parametrize("name", ["modernbert_local_dynamo_consts.onnx", "modernbert_local_ts_consts.onnx"])
def test_modernbert_reads_its_local_layers(name):
    """layer_types global, local, local -> bands (None, 8, 8), no causal window; at 1,024 tokens a local layer's
    flash kernel does 22 of 64 tiles: 22/64 x 2 b h s^2 (d + d_v) = 22/64 x 2 x 2 x 4 x 1024^2 x 32 FLOPs."""
    graph = load_graph(CASES / name, {"batch": 2, "seq": 1024})
    types = COUNTS["files"][name]["layer_types"]
    cores = find_attention_cores(graph)
    assert tuple(c.band for c in cores) == tuple(HALF if t == "sliding_attention" else None for t in types) == (None, 8, 8)
    assert all(c.window is None for c in cores) and not graph.attention_windows
    hand = 22 / 64 * 2 * 2 * 4 * 1024 ** 2 * (16 + 16)
    assert [c.flash_work * c.flops for c in cores] == pytest.approx([2 * 2 * 4 * 1024 ** 2 * 32, hand, hand], rel=1e-12)
    assert cores[1].flash_shape.window == 2 * HALF + 1 and not cores[1].flash_shape.causal
    assert UNREAD_BAND_NOTE not in graph.warnings


def test_a_band_whose_width_is_not_in_the_file_is_priced_whole_and_said_once():
    """The dynamo file saved with every initializer external and its data file gone holds |q - k| <= w but not
    w: no band read, every tile priced, one warning (and not the causal window's)."""
    graph = load_graph(CASES / "modernbert_local_dynamo_bare.onnx", {"batch": 2, "seq": 1024})
    assert [c.band for c in find_attention_cores(graph)] == [None, None, None]
    assert [c.flash_work for c in find_attention_cores(graph)] == [1.0, 1.0, 1.0]
    assert graph.warnings.count(UNREAD_BAND_NOTE) == 1 and UNREAD_WINDOW_NOTE not in graph.warnings


def _model(graph, **settings):
    cluster = make_cluster("h100-sxm", devices=1)
    return build_cost_model(graph, cluster=cluster, settings=TrainingSettings(**settings),
                            config_options=ConfigOptions(devices=1, devices_per_node=1))


def test_flash_prices_the_band_and_explicit_the_grid():
    """A GPT-2-like core at 8,192 tokens (head dim 64) with the mask left bidirectional: a band of w = 512 costs
    the flash products less than the whole grid (fraction by hand: row blocks of 128 visit 5, 6, 6, ... key
    blocks); under explicit attention every op costs the same with and without it."""
    seq = 8192
    graph = gpt2_like(layers=1, hidden=256, heads=4, vocab=64, positions=seq, batch=1, seq=seq)
    core = find_attention_cores(graph)[0]
    name = graph.ops[core.softmax].name
    banded = dataclasses.replace(graph, attention_masks={name: "bidirectional"}, attention_bands={name: 512})
    whole = dataclasses.replace(graph, attention_masks={name: "bidirectional"})
    # row block i visits key blocks max(0, 128 i - 512) // 128 .. ceil(min(8192, 128 (i + 1) + 512) / 128): 64 rows
    by_hand = sum(min(64, i + 5) - max(0, i - 4) for i in range(64))
    assert find_attention_cores(banded)[0].flash_work == by_hand / 4096 == band_tile_fraction(seq, seq, 64, 512)
    flash = [_model(g, engine="fused", attention="flash") for g in (banded, whole)]
    explicit = [_model(g, engine="fused", attention="explicit") for g in (banded, whole)]
    for index in (core.score, core.value):
        assert flash[0].op_details[index].compute_s[0] < flash[1].op_details[index].compute_s[0]
    for index in core.ops:
        assert explicit[0].op_details[index].compute_s[0] == explicit[1].op_details[index].compute_s[0]


@pytest.mark.parametrize("name", ["t5_ts_consts.onnx", "t5_dynamo_consts.onnx", "t5_dynamo_bare.onnx"])
def test_t5_relative_buckets_are_no_band(name):
    """T5's relative-position buckets compare |k - q| with a constant too (``is_small = relative_position <
    max_exact``, 7 here), but only to pick the row of a bias table: a gather's indices, no mask. Read as a band
    of 7 before the lookup rule; no band and no unread-band warning now."""
    graph = load_graph(CASES.parent.parent / "zoo" / name, {"batch": 2, "seq": 16, "tgt_seq": 8})
    assert not graph.attention_bands and UNREAD_BAND_NOTE not in graph.warnings


def test_no_zoo_file_has_a_band():
    """None of the zoo's architectures (tests/zoo/zoo.json) has a two-sided local window."""
    import onnx

    from importers.sliding_window import band_unread_in, softmax_bands

    for path in sorted((CASES.parent.parent / "zoo").glob("*.onnx")):
        model = onnx.load(path, load_external_data=False)
        assert not softmax_bands(model) and not band_unread_in(model), path.name
