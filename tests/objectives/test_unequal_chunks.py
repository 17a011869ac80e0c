"""Looped schedules whose stages' layers do not cut into equal chunks: the split, and the closed
forms against the event simulation of Megatron-LM's interleaved order with each chunk's own passes."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.schedules import chunk_layers, chunk_pad, in_flight_micro_batches, pipeline_time_s, simulate


@pytest.mark.parametrize("layers, chunks", [(1, 3), (7, 2), (8, 2), (10, 4), (13, 5)])
def test_chunks_are_as_even_as_whole_layers_allow(layers, chunks):
    for first in (False, True):
        sizes = chunk_layers(layers, chunks, first_stage=first)
        assert sum(sizes) == layers and len(sizes) == chunks
        assert max(sizes) - min(sizes) <= 1
        # the embedding's chunk (first stage, chunk 0) and the loss's (any other, the last) are the lighter
        assert (sizes[0] == min(sizes)) if first else (sizes[-1] == min(sizes))
    assert chunk_pad([layers], chunks)[0] == pytest.approx(chunks * -(-layers // chunks) / layers)


def _layout(rng: np.random.Generator) -> tuple[int, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    stages, chunks = int(rng.integers(2, 5)), int(rng.integers(2, 4))
    layers = rng.integers(1, 9, size=stages)
    per_layer = rng.uniform(0.5, 2.0, size=stages)
    f = layers * per_layer
    return stages, chunks, stages * int(rng.integers(1, 4)), layers, f, f * rng.uniform(1.5, 2.5, size=stages), \
        rng.uniform(0.0, 0.5, size=stages - 1)


@pytest.mark.parametrize("seed", range(30))
def test_closed_form_bounds_the_simulation(seed):
    rng = np.random.default_rng(seed)
    stages, v, m, layers, f, b, c = _layout(rng)
    for p2p in (0.0, c):
        timeline = simulate("interleaved", forward_s=f, backward_s=b, p2p_s=p2p, micro_batches=m, chunks=v,
                            stage_layers=layers)
        closed = float(pipeline_time_s("interleaved", forward_s=f, backward_s=b, p2p_s=p2p, micro_batches=m,
                                       chunks=v, stage_layers=layers))
        assert timeline.makespan_s <= closed * (1 + 1e-12)
        # the activations: each in-flight chunk as the stage's largest bounds the simulated peak
        held = in_flight_micro_batches("interleaved", stages=stages, micro_batches=m, chunks=v, stage_layers=layers)
        assert np.all(timeline.peak_in_flight <= held + 1e-12)


def test_equal_chunks_simulate_and_price_as_before():
    f, b, layers = [4.0, 2.0, 3.0], [8.0, 4.0, 6.0], [4, 2, 6]
    for v in (2,):  # every stage's layers cut into two equal chunks
        with_layers = simulate("interleaved", forward_s=f, backward_s=b, p2p_s=0.1, micro_batches=6, chunks=v,
                               stage_layers=layers)
        plain = simulate("interleaved", forward_s=f, backward_s=b, p2p_s=0.1, micro_batches=6, chunks=v)
        assert with_layers.makespan_s == plain.makespan_s
        assert with_layers.peak_in_flight.tolist() == plain.peak_in_flight.tolist()
        assert float(pipeline_time_s("interleaved", forward_s=f, backward_s=b, micro_batches=6, chunks=v,
                                     stage_layers=layers)) == float(
            pipeline_time_s("interleaved", forward_s=f, backward_s=b, micro_batches=6, chunks=v))


def test_unequal_chunks_stall_the_steady_state():
    # Four stages of 3 layers (1 s forward, 2 s backward a layer) in chunks of 2 and 1 (the first
    # stage 1 and 2): the event simulation takes longer than the equal-chunk closed form on the
    # stages' totals, (m + 3/2) x 9 s, so the price counts each chunk as the largest, (m + 3/2) x 12 s.
    layers, m = [3, 3, 3, 3], 16
    timeline = simulate("interleaved", forward_s=[3.0] * 4, backward_s=[6.0] * 4, micro_batches=m, chunks=2,
                        stage_layers=layers)
    assert timeline.makespan_s > (m + 1.5) * 9.0
    closed = float(pipeline_time_s("interleaved", forward_s=[3.0] * 4, backward_s=[6.0] * 4, micro_batches=m,
                                   chunks=2, stage_layers=layers))
    assert closed == pytest.approx((m + 1.5) * 12.0)
    assert timeline.makespan_s <= closed


def test_zero_bubble_credit_is_the_smallest_chunks():
    # zb-h1 with two chunks saves 2 (S - 1) min_s w_s / v, w_s the stage's smallest chunk's W times v:
    # stages of 4 and 3 layers (chunks 2 + 2 and 2 + 1), W half the backward: min(2 x 2/4 x 2, 1.75 x 1/3 x 2)
    f, b, layers = [2.0, 1.75], [4.0, 3.5], [4, 3]
    interleaved = float(pipeline_time_s("interleaved", forward_s=f, backward_s=b, micro_batches=4, chunks=2,
                                        stage_layers=layers))
    zb = float(pipeline_time_s("zb-h1", forward_s=f, backward_s=b, micro_batches=4, chunks=2, stage_layers=layers))
    smallest_w = min(2.0 * 2 * 2 / 4, 1.75 * 2 * 1 / 3)  # W = b/2; the stage's W x v x smallest chunk / layers
    assert interleaved - zb == pytest.approx(2 * (2 - 1) * smallest_w / 2)
