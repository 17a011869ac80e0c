"""Fused attention priced at its measured rates (objectives.flash_rates): the FlashAttention-3 paper's
H100 figures read back at their points, and a causal and a bidirectional core priced through the cost
tables, by hand from those figures."""

from __future__ import annotations

import dataclasses
import math

import pytest

from objectives.attention import FlashShape, find_attention_cores
from objectives.cluster import make_cluster
from objectives.execution import FLASH_BACKWARD_FLOPS_FACTOR, FLASH_BACKWARD_KERNELS
from objectives.flash_rates import MEASURED_PEAK_TFLOPS, flash_efficiencies, kernel_rate_tflops
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import gpt2_like

# Shah et al. 2024, Figure 5 (forward) and 6 (backward), H100 SXM5 BF16, at 512 and 16k tokens
PRINTED = [
    ("flash", "forward", 64, 512, 282), ("flash", "forward", 128, 16384, 370),
    ("flash", "forward_causal", 64, 512, 180), ("flash", "forward_causal", 128, 2048, 298),
    ("flash", "backward", 128, 512, 214), ("flash", "backward", 64, 16384, 291),
    ("cudnn", "forward", 128, 2048, 617), ("cudnn", "forward_causal", 128, 16384, 539),
    ("cudnn", "backward", 64, 4096, 417),
]


@pytest.mark.parametrize(("kernel", "series", "head_dim", "seq", "tflops"), PRINTED)
def test_the_printed_figures_read_back(kernel, series, head_dim, seq, tflops):
    assert kernel_rate_tflops(kernel, series, seq, head_dim) == tflops


def test_between_and_beyond_the_points():
    # 3,000 tokens: log2 3000 = 11.55, 0.55 of the way from 2k (298) to 4k (319)
    share = math.log2(3000) - 11
    assert kernel_rate_tflops("flash", "forward_causal", 3000, 128) == pytest.approx(298 + share * 21, rel=1e-9)
    assert kernel_rate_tflops("flash", "forward", 256, 64) == 282  # held at 512
    assert kernel_rate_tflops("cudnn", "forward", 1 << 20, 256) == 595  # held at 16k and head dim 128


def test_a_causal_kernel_costs_half_the_square_at_its_causal_rate():
    """Whatever share of tiles the kernel visits, time = square FLOPs / (2 x the causal rate)."""
    for tiles in (0.53125, 0.75, 1.0):
        shape = FlashShape(tiles=tiles, seq_k=2048, head_dim=128, causal=True)
        forward, backward = flash_efficiencies("cudnn", shape)
        assert tiles / (forward * MEASURED_PEAK_TFLOPS) == pytest.approx(1 / (2 * 484), rel=1e-12)
        assert tiles / (backward * MEASURED_PEAK_TFLOPS) == pytest.approx(617 / (2 * 484 * 465), rel=1e-12)


def test_a_window_runs_at_the_rate_of_its_length():
    shape = FlashShape(tiles=0.3, seq_k=8192, head_dim=64, causal=False, window=1024)
    assert [x * MEASURED_PEAK_TFLOPS for x in flash_efficiencies("flash", shape)] == pytest.approx([306, 238])


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="cudnn"):
        flash_efficiencies("xformers", FlashShape(tiles=1.0, seq_k=512, head_dim=64, causal=False))


BATCH, HEADS, HIDDEN, SEQ = 8, 16, 2048, 2048  # head dim 128: compute-bound, far above the host floor


@pytest.fixture(scope="module")
def long_graph():
    return gpt2_like(layers=1, hidden=HIDDEN, heads=HEADS, vocab=512, positions=SEQ, batch=BATCH, seq=SEQ)


def _priced(graph, mask, attention):
    softmaxes = {graph.ops[core.softmax].name: mask for core in find_attention_cores(graph)}
    graph = dataclasses.replace(graph, attention_masks=softmaxes)
    model = build_cost_model(graph, cluster=make_cluster("h100-sxm", devices=1),
                             settings=TrainingSettings(engine="fused", attention=attention),
                             config_options=ConfigOptions(devices=1, devices_per_node=1))
    return graph, model


@pytest.mark.parametrize(("mask", "attention", "forward_tflops", "backward_tflops"), [
    # FlashAttention-2 inside training at 0.56 of its bars (FA2_IN_TRAINING_SHARE); cuDNN at its own
    ("causal", "flash", 0.56 * 2 * 298, 0.56 * 2 * 291 * 298 / 362),   # the rates count half the square
    ("causal", "cudnn", 2 * 484, 2 * 465 * 484 / 617),
    ("bidirectional", "flash", 0.56 * 362, 0.56 * 291),
    ("bidirectional", "cudnn", 617, 465),
])
def test_the_score_product_by_hand(long_graph, mask, attention, forward_tflops, backward_tflops):
    """The Q K^T product of a 2,048-token core at head dim 128, on one H100 (peak 989.5 TFLOP/s, the
    figures' own): its square's FLOPs at the figure's rate, plus the kernels' fixed overheads."""
    graph, model = _priced(long_graph, mask, attention)
    core = find_attention_cores(graph)[0]
    device = model.cluster.device
    square = graph.ops[core.score].flops  # the product's FLOPs with its folded scale and mask
    peak_ratio = device.peak_flops["bf16"] / 1e12 / MEASURED_PEAK_TFLOPS  # 1 on the h100-sxm preset
    forward = square / (forward_tflops * 1e12 * peak_ratio) + device.kernel_overhead_s
    backward = (FLASH_BACKWARD_FLOPS_FACTOR * square / (backward_tflops * 1e12 * peak_ratio)
                + FLASH_BACKWARD_KERNELS * device.kernel_overhead_s)
    assert model.op_details[core.score].compute_s[0] == pytest.approx(forward + backward, rel=1e-9)
