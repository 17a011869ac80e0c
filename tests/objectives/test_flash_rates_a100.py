"""FlashAttention-2 on an A100 at the A100's own rates (objectives.flash_rates): the FlashAttention-2 paper's
printed best rates on an A100 80GB SXM4 (Dao 2023, arXiv:2307.08691: "up to 230 TFLOPs/s, 73% of the
theoretical maximum" forward, "up to 63%" of 312 TFLOP/s backward) read back, the H100 series' shape
(FlashAttention-3 paper, Figures 5-6: 298 causal forward, 362 forward, 291 backward at 2,048 tokens, head
dim 128) between them, no in-training share, and a causal core's seconds on the a100-80gb preset by hand."""

from __future__ import annotations

import dataclasses

import pytest

from objectives.attention import FlashShape, find_attention_cores
from objectives.cluster import get_device, make_cluster
from objectives.execution import FLASH_BACKWARD_FLOPS_FACTOR, FLASH_BACKWARD_KERNELS
from objectives.flash_rates import (HEAD_DIMS, SEQUENCE_POINTS, flash_efficiencies, in_training_share,
                                    kernel_rate_tflops)
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import gpt2_like

A100_PEAK = 312.0            # FA2 paper, section 3.1
A100_FORWARD_BEST = 230.0    # FA2 paper, section 4.1's "up to 230 TFLOPs/s"
A100_BACKWARD_BEST = 0.63 * A100_PEAK  # FA2 paper, section 1's "up to 63% ... in the backward pass"
H100_FORWARD_BEST, H100_BACKWARD_BEST = 370.0, 322.0  # FA3 paper's FA2 bars, head dim 128, 16k tokens


def _every_point(series: str) -> list[float]:
    return [kernel_rate_tflops("flash", series, seq, dim, capability=8.0) for seq in SEQUENCE_POINTS for dim in HEAD_DIMS]


def test_the_printed_best_rates_read_back():
    assert kernel_rate_tflops("flash", "forward", 16384, 128, capability=8.0) == pytest.approx(230.0, rel=1e-12)
    assert max(_every_point("forward")) == pytest.approx(A100_FORWARD_BEST, rel=1e-12)
    assert max(_every_point("backward")) == pytest.approx(196.56, rel=1e-12)
    assert A100_FORWARD_BEST / A100_PEAK == pytest.approx(0.737, abs=5e-4)  # the paper's "73%"


def test_from_2k_tokens_every_point_is_inside_the_papers_range():
    """The abstract: "reaching 50-73% of the theoretical maximum FLOPs/s on A100"."""
    for series in ("forward", "forward_causal", "backward"):
        for seq in (2048, 4096, 8192, 16384):
            for dim in HEAD_DIMS:
                share = kernel_rate_tflops("flash", series, seq, dim, capability=8.0) / A100_PEAK
                assert 0.50 <= share <= A100_FORWARD_BEST / A100_PEAK + 1e-12, (series, seq, dim, share)


@pytest.mark.parametrize(("device", "a100_series"), [
    ("a100-80gb", True), ("a100-40gb", True), ("l40s", True),  # 8.0, 8.0, 8.9: FA2's own sm80 kernels
    ("h100-sxm", False), ("v100-32gb", False),                 # Hopper: the H100 bars; Volta: as before
])
def test_the_series_is_chosen_by_compute_capability(device, a100_series):
    capability = get_device(device).compute_capability
    rate = kernel_rate_tflops("flash", "forward_causal", 2048, 128, capability=capability)
    assert rate == pytest.approx(298 * A100_FORWARD_BEST / H100_FORWARD_BEST if a100_series else 298, rel=1e-12)
    assert in_training_share("flash", capability) == (1.0 if a100_series else 0.56)
    assert in_training_share("cudnn", capability) == 1.0


def test_flex_on_an_a100_is_its_share_of_the_a100_series():
    """PyTorch's FlexAttention announcement measured 90% / 85% of FlashAttention-2 on an A100."""
    shape = FlashShape(tiles=1.0, seq_k=4096, head_dim=64, causal=False)
    forward, backward = flash_efficiencies("flex", shape, capability=8.0)
    assert forward * A100_PEAK == pytest.approx(0.90 * 321 * A100_FORWARD_BEST / H100_FORWARD_BEST, rel=1e-12)
    assert backward * A100_PEAK == pytest.approx(0.85 * 279 * A100_BACKWARD_BEST / H100_BACKWARD_BEST, rel=1e-12)


BATCH, HEADS, HIDDEN, SEQ = 8, 16, 2048, 2048  # head dim 128: compute-bound, far above the host floor


def test_a_causal_core_on_an_a100_by_hand():
    """The Q K^T product of a causal 2,048-token core at head dim 128 on one A100 (bf16 peak 312 TFLOP/s):
    the square's FLOPs / (2 x the causal rate) forward, 2.5 x them / (2 x the causal backward rate) backward,
    plus the kernels' fixed overheads; no training share. Causal forward 298 x 230 / 370 = 185.24 TFLOP/s,
    backward 291 x 196.56 / 322 x (298 / 362) = 146.23 TFLOP/s."""
    graph = gpt2_like(layers=1, hidden=HIDDEN, heads=HEADS, vocab=512, positions=SEQ, batch=BATCH, seq=SEQ)
    core = find_attention_cores(graph)[0]
    graph = dataclasses.replace(graph, attention_masks={graph.ops[core.softmax].name: "causal"})
    model = build_cost_model(graph, cluster=make_cluster("a100-80gb", devices=1),
                             settings=TrainingSettings(engine="fused", attention="flash"),
                             config_options=ConfigOptions(devices=1, devices_per_node=1))
    device = model.cluster.device
    assert device.peak_flops["bf16"] == A100_PEAK * 1e12
    square = graph.ops[core.score].flops
    assert square == pytest.approx(2 * BATCH * HEADS * SEQ * SEQ * (HIDDEN // HEADS), rel=0.01)  # plus scale, mask
    causal_forward = 298 * A100_FORWARD_BEST / H100_FORWARD_BEST
    causal_backward = 291 * A100_BACKWARD_BEST / H100_BACKWARD_BEST * 298 / 362
    assert (causal_forward, causal_backward) == pytest.approx((185.2432, 146.2312), abs=1e-4)
    forward = square / (2 * causal_forward * 1e12) + device.kernel_overhead_s
    backward = FLASH_BACKWARD_FLOPS_FACTOR * square / (2 * causal_backward * 1e12) + FLASH_BACKWARD_KERNELS * device.kernel_overhead_s
    assert model.op_details[core.score].compute_s[0] == pytest.approx(forward + backward, rel=1e-9)
    # 2 x 8 x 16 x 2048^2 x 128 = 1.37e11 FLOPs in the products (the op's folded scale and mask add under 1%):
    # 0.371 ms forward and 1.175 ms backward, against 1.306 ms and 4.062 ms at the H100 fractions x 0.56
    # before (17% and 14% of the A100's peak per visited FLOP)
    kernels = forward + backward - (1 + FLASH_BACKWARD_KERNELS) * device.kernel_overhead_s
    assert kernels == pytest.approx(0.371e-3 + 1.175e-3, rel=1e-2)
