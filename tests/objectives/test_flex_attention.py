"""FlexAttention (``flex``, what the torchtitan export runs) priced at FlashAttention-2's measured rates times
its published share of them on the same GPU generation (objectives.flash_rates): 90% forward / 85% backward
on an A100 (PyTorch's FlexAttention announcement, 2024), 1.25x / 1.03x on an H100 (its GTC 2025 figures).
The expected numbers are the FlashAttention-3 paper's printed FA2 bars (Shah et al. 2024, Figures 5-6, H100
SXM5 BF16) times those shares, by hand; on an A100 those bars at the A100's own best rates first (the
FlashAttention-2 paper's 230 TFLOP/s forward, 63% of 312 backward: x 230 / 370 and x 196.56 / 322)."""

from __future__ import annotations

import dataclasses

import pytest

from objectives.attention import FlashShape, find_attention_cores
from objectives.cluster import get_device, make_cluster
from objectives.execution import FLASH_BACKWARD_FLOPS_FACTOR, FLASH_BACKWARD_KERNELS
from objectives.flash_rates import MEASURED_PEAK_TFLOPS, flash_efficiencies, kernel_rate_tflops
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from planner.launcher_options import launcher_execution
from tests.objectives.graphs import gpt2_like
from tests.planner.cli_helpers import run_cli


@pytest.mark.parametrize(("capability", "series", "head_dim", "seq", "tflops"), [
    # A100 (8.0): 0.90 x the forward bars, 0.85 x the backward bars, of FlashAttention-2's A100 series
    (8.0, "forward", 128, 2048, 0.90 * 362 * 230 / 370),          # 202.52
    (8.0, "forward_causal", 64, 512, 0.90 * 180 * 230 / 370),     # 100.70
    (8.0, "backward", 128, 2048, 0.85 * 291 * 196.56 / 322),      # 150.99
    # H100 (9.0) and a device of unknown capability: 1.25 x forward, 1.03 x backward
    (9.0, "forward", 128, 16384, 1.25 * 370),         # 462.5
    (9.0, "forward_causal", 128, 2048, 1.25 * 298),   # 372.5
    (None, "backward", 64, 16384, 1.03 * 291),        # 299.73
])
def test_flex_is_flash_attention_2_times_its_published_share(capability, series, head_dim, seq, tflops):
    assert kernel_rate_tflops("flex", series, seq, head_dim, capability=capability) == pytest.approx(tflops, rel=1e-12)


def test_a_causal_flex_core_keeps_flash_attention_2s_causal_shape():
    """Causal, 2,048 tokens, head dim 128 on an A100 (312 TFLOP/s): time per square FLOP = 1 / (2 x 0.90 x
    298 a) forward and 1 / (2 x 0.85 x 291 b x 298 / 362) backward (FlashAttention-2's causal backward,
    scaled), with a = 230 / 370 and b = 196.56 / 322 (its A100 series)."""
    shape = FlashShape(tiles=0.53125, seq_k=2048, head_dim=128, causal=True)
    forward, backward = flash_efficiencies("flex", shape, capability=8.0)
    a, b = 230 / 370, 0.63 * 312 / 322
    assert shape.tiles / (forward * 312) == pytest.approx(1 / (2 * 0.90 * 298 * a), rel=1e-12)
    assert shape.tiles / (backward * 312) == pytest.approx(362 / (2 * 0.85 * 291 * b * 298), rel=1e-12)


def test_each_launcher_runs_its_own_kernel():
    """torchtitan's export runs FlexAttention on every GPU; DeepSpeed and DTensor (SDPA) FlashAttention-2;
    Megatron-LM TransformerEngine's cuDNN attention from Hopper on, FlashAttention-2 before."""
    h100, a100 = get_device("h100-sxm"), get_device("a100-80gb")
    kernels = {(launcher, device.name): launcher_execution(launcher, None, None, None, device).attention
               for launcher in ("torchtitan", "deepspeed", "dtensor", "megatron") for device in (h100, a100)}
    assert kernels == {
        ("torchtitan", h100.name): "flex", ("torchtitan", a100.name): "flex",
        ("deepspeed", h100.name): "flash", ("deepspeed", a100.name): "flash",
        ("dtensor", h100.name): "flash", ("dtensor", a100.name): "flash",
        ("megatron", h100.name): "cudnn", ("megatron", a100.name): "flash",
    }


BATCH, HEADS, HIDDEN, SEQ = 8, 16, 2048, 2048  # head dim 128: compute-bound, far above the host floor


@pytest.fixture(scope="module")
def causal_graph():
    graph = gpt2_like(layers=1, hidden=HIDDEN, heads=HEADS, vocab=512, positions=SEQ, batch=BATCH, seq=SEQ)
    masks = {graph.ops[core.softmax].name: "causal" for core in find_attention_cores(graph)}
    return dataclasses.replace(graph, attention_masks=masks)


def _score_kernel_s(graph, device: str, attention: str) -> float:
    """The Q K^T product's seconds (forward + backward) less the kernels' fixed overheads."""
    model = build_cost_model(graph, cluster=make_cluster(device, devices=1),
                             settings=TrainingSettings(engine="fused", attention=attention),  # type: ignore[arg-type]
                             config_options=ConfigOptions(devices=1, devices_per_node=1))
    core = find_attention_cores(graph)[0]
    overheads = (1 + FLASH_BACKWARD_KERNELS) * model.cluster.device.kernel_overhead_s
    return float(model.op_details[core.score].compute_s[0]) - overheads


@pytest.mark.parametrize(("device", "ratio"), [
    # H100: flash 1/596 + 2.5/479.105 = 0.0068959 s per square PFLOP; flex 1/745 + 2.5/493.478 = 0.0064084
    ("h100-sxm", 0.929298),
    # A100, FlashAttention-2's A100 series (x 230 / 370 forward, x 196.56 / 322 backward): flash 2 x 185.243
    # = 370.486 forward, 292.462 backward; flex 1/333.438 + 2.5/248.593 = 0.0130557
    ("a100-80gb", 1.160785),
])
def test_a_torchtitan_attention_core_against_the_same_core_priced_flash(causal_graph, device, ratio):
    """A torchtitan row's attention kernel (its launcher's ``flex``) over the same core priced ``flash``:
    causal at 2,048 tokens, head dim 128, FlashAttention-2's rates 2 x 298 forward and 2 x 291 x 298 / 362
    = 479.105 backward (per square FLOP), the backward 2.5 x the forward FLOPs."""
    titan = launcher_execution("torchtitan", causal_graph, None, None, get_device(device)).attention
    assert titan == "flex"
    priced = _score_kernel_s(causal_graph, device, titan) / _score_kernel_s(causal_graph, device, "flash")
    assert priced == pytest.approx(ratio, rel=1e-5)
    # the same ratio from the formula's parts, as a check on the hand arithmetic above
    share_fwd, share_bwd = (1.25, 1.03) if device == "h100-sxm" else (0.90, 0.85)
    flash_fwd, flash_bwd = 2 * 298, 2 * 291 * 298 / 362
    if device == "a100-80gb":
        flash_fwd, flash_bwd = flash_fwd * 230 / 370, flash_bwd * 0.63 * 312 / 322
    by_parts = ((1 / (share_fwd * flash_fwd) + FLASH_BACKWARD_FLOPS_FACTOR / (share_bwd * flash_bwd))
                / (1 / flash_fwd + FLASH_BACKWARD_FLOPS_FACTOR / flash_bwd))
    assert by_parts == pytest.approx(ratio, rel=1e-5)


def test_the_cli_takes_attention_flex_and_names_it():
    result = run_cli(["plan", "tests/data/llama_tiny.onnx", "-n", "1", "--dim", "batch=4", "--dim", "seq=64",
                      "--target", "deepspeed", "--attention", "flex", "--fix", "pp=1,zero=0,recompute=none",
                      "--top", "1"])
    assert "fused kernels + FlexAttention (fused+flex)" in result.stdout
    refused = run_cli(["plan", "tests/data/llama_tiny.onnx", "-n", "1", "--dim", "batch=4", "--dim", "seq=64",
                       "--attention", "flexible"], expected_exit_code=2)
    assert "flash, cudnn, flex or explicit" in refused.stderr
