"""A causal core with a sliding window under flash attention computes the band of tiles the window
crosses (:func:`objectives.attention.causal_tile_fraction` with ``window``: FlashAttention-2's
``n_block_min``), explicit attention still the whole grid. Numbers by hand."""

from __future__ import annotations

import dataclasses

import pytest

from objectives.attention import _band_tiles, causal_tile_fraction, find_attention_cores
from objectives.cluster import make_cluster
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import gpt2_like

SEQ, HIDDEN, HEADS = 1024, 256, 4  # head dim 64: FlashAttention-2's 128 x 128 tiles, 8 x 8 of them
LONG = 8192  # products compute-bound (above the per-kernel launch floor) on one H100


@pytest.mark.parametrize(("seq", "window", "scores"), [
    (8, 3, 21),  # rows see 1, 2, 3, 3, 3, 3, 3, 3 keys
    (6, 1, 6),  # each row itself
    (10, 10, 55),  # a window as long as the sequence: causal's s (s + 1) / 2
    (16, 5, 70),  # 1 + 2 + 3 + 4 + 12 x 5
])
def test_one_by_one_tiles_are_the_band(seq, window, scores):
    """With 1 x 1 tiles the visited tiles are the visible scores: W (2 s - W + 1) / 2 of s^2."""
    assert _band_tiles(seq, seq, 1, 1, window) == scores == window * (2 * seq - window + 1) // 2


@pytest.mark.parametrize(("seq", "head_dim", "window", "fraction"), [
    (1024, 64, 256, 21 / 64),  # row block m starts at key block (128 m - 255) // 128: visits 1, 2, 3, 3, 3, 3, 3, 3
    (1024, 64, 128, 15 / 64),  # 1 then 2 per row block: the band's edge crosses two key blocks
    (1024, 64, 1024, 36 / 64),  # no narrower than the sequence: the causal 1 + ... + 8
    (1024, 64, 4096, 36 / 64),
    (512, 128, 64, 11 / 32),  # 128 x 64 tiles, 4 x 8: row block 0 visits key blocks 0-1, block m > 0 blocks 2m - 1 to 2m + 1
])
def test_tile_fraction_by_hand(seq, head_dim, window, fraction):
    assert causal_tile_fraction(seq, seq, head_dim, window) == pytest.approx(fraction, rel=1e-12)


def _model(graph, **settings):
    cluster = make_cluster("h100-sxm", devices=1)
    return build_cost_model(graph, cluster=cluster, settings=TrainingSettings(**settings),
                            config_options=ConfigOptions(devices=1, devices_per_node=1))


def _windowed(graph, window):
    """``graph`` with every attention causal and, with ``window``, windowed (what the importer reads)."""
    names = [graph.ops[core.softmax].name for core in find_attention_cores(graph)]
    return dataclasses.replace(graph, attention_masks={n: "causal" for n in names},
                               attention_windows={n: window for n in names} if window else {})


@pytest.fixture(scope="module")
def graph():
    return gpt2_like(layers=1, hidden=HIDDEN, heads=HEADS, vocab=64, positions=SEQ, batch=1, seq=SEQ)


def test_the_window_reaches_the_core(graph):
    core = find_attention_cores(_windowed(graph, 256))[0]
    assert (core.window, core.flash_work) == (256, 21 / 64)
    assert find_attention_cores(_windowed(graph, None))[0].flash_work == 36 / 64


def test_flash_products_price_the_band():
    """Under flash a window of 1,024 at 8,192 tokens does 1 + 2 + ... + 8 + 56 x 9 = 540 of the
    causal kernel's 2,080 tiles (64 x 64 tiles of 128 x 128), so its products take less time; a window
    no narrower than the sequence is causal attention's price."""
    long = gpt2_like(layers=1, hidden=HIDDEN, heads=HEADS, vocab=64, positions=LONG, batch=1, seq=LONG)
    windowed, causal, wide = (_model(_windowed(long, w), engine="fused", attention="flash") for w in (1024, None, LONG))
    core = find_attention_cores(long)[0]
    assert causal_tile_fraction(LONG, LONG, 64, 1024) == 540 / 4096
    for index in (core.score, core.value):
        assert windowed.op_details[index].compute_s[0] < causal.op_details[index].compute_s[0]
        assert wide.op_details[index].compute_s[0] == causal.op_details[index].compute_s[0]


def test_explicit_attention_pays_the_whole_grid(graph):
    windowed = _model(_windowed(graph, 256), engine="fused", attention="explicit")
    causal = _model(_windowed(graph, None), engine="fused", attention="explicit")
    for index in find_attention_cores(graph)[0].ops:
        assert windowed.op_details[index].compute_s[0] == causal.op_details[index].compute_s[0]
