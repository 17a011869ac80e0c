r"""How fast a fused attention kernel runs: measured FlashAttention-2 and cuDNN rates by sequence length,
head dim and mask.

A fused attention kernel's rate is not one constant. Its forward on an H100 SXM5 (BF16) runs from
309 TFLOP/s at 512 tokens to 370 at 16k (FlashAttention-2, head dim 128), its causal forward from 191
to 335 (the FLOPs of a causal run counted as half the square's, the benchmark's convention), and the
cuDNN fused kernel (TransformerEngine's ``FusedAttention``) runs 1.4-1.6x faster than both. The
figures are Shah et al. 2024, "FlashAttention-3" (arXiv:2407.08608), Figure 5 (forward, causal and not,
head dims 64 and 128) and Figure 6 (backward, not causal), measured at batch x sequence = 16k tokens
and hidden 2,048, kept here in TFLOP/s as printed (:data:`MEASURED_KERNEL_TFLOPS`).

Which kernel a launcher runs (``ExecutionModel.attention``):

``flash``
    FlashAttention-2: PyTorch's ``scaled_dot_product_attention`` (its default backend order puts the
    flash kernel first and cuDNN last), the ``flash-attn`` package (llm-foundry, Megatron-DeepSpeed's
    ``--use-flash-attn-v2``), TransformerEngine before Hopper.
``cudnn``
    cuDNN fused attention: TransformerEngine on Hopper and newer (``get_attention_backend``: "Disabling
    FlashAttention to give FusedAttention preference on Hopper+ for performance reasons"), which
    Megatron-LM and NeMo run; torchtitan's ``ScaledDotProductAttention`` (0.3: SDPA with
    ``[CUDNN_ATTENTION, FLASH_ATTENTION, MATH]`` at priority). The torchtitan export runs FlexAttention
    instead, priced ``flex`` (below). Under context parallelism torch's SDPA ring runs
    one kernel per ring step, cuDNN's among them from torch 2.13 (``_scaled_dot_product_ring_cudnn_attention``);
    torchtitan of December 2024 allowed only the flash and memory-efficient kernels there
    (``sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION])``), so its published context-parallel runs
    are FlashAttention-2's.
``flex``
    FlexAttention (``torch.nn.attention.flex_attention``), the Triton kernel torch.compile generates,
    which the torchtitan export runs (``attn_backend="flex"``; its ``kernel_options`` leave ``BACKEND`` at
    ``AUTO``, which is the Triton template: torch 2.13's CuTe-DSL ``FLASH`` backend runs only when asked,
    ``_use_flex_flash_attention``), with and without context parallelism (torchtitan 0.3.0 gathers K/V,
    ``flex_cp_allgather``, and calls the same kernel; SDPA is no longer a language-model backend there).
    No series is published for it, only its ratio to FlashAttention-2 on the same GPU, so its rates are
    FlashAttention-2's series above times that ratio, forward (the causal forward too) and backward
    (:data:`FLEX_SHARE_OF_FLASH`): on GPUs before Hopper the PyTorch team's announcement
    ("FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention", PyTorch
    blog, August 2024: A100, causal attention, the ``benchmarks/transformer/score_mod.py`` run against
    FAv2; "90% of FlashAttention2's performance in the forward pass and 85% in the backward pass", its
    backward recomputing more intermediates), from Hopper on the H100 figures of the FlexAttention
    session at GTC 2025 (Driss Guessous, Meta; its abstract, as the PyTorch blog's "PyTorch at GTC 2025"
    prints it, gives the A100 ratio above and: "On H100 GPUs, FlexAttention's forward performance
    averages 85% of FlashAttention3 and is ~25% faster than FlashAttention2, while backward performance
    averages 76% of FlashAttention3 and is ~3% faster than FlashAttention2"). Neither names the dtype,
    head dims or lengths averaged over; the ratio is applied at every length and head dim. The H100
    ratio is the one that matches the FlashAttention-2 series (measured on an H100), so it is also the
    one used on a device of unknown capability. The torchtitan runs scored in docs/VALIDATION.md
    (December 2024) ran SDPA, not FlexAttention: no measured row prices ``flex``.

Pricing (:func:`flash_efficiencies` returns the fraction of the device's dense peak per FLOP the
kernel computes, ``flex``'s by the device's compute capability; :mod:`objectives.compute` multiplies
the FLOPs by the visited tiles' share first):

* bidirectional or unknown mask: the figure's rate at the core's key length and head dim;
* causal: the measured causal rate on half the square, whatever tiles the kernel visits
  (time :math:`= F / (2 r_c)` for the square's FLOPs :math:`F`); the backward at the backward rate
  scaled by the forward's causal / non-causal ratio at that length (the paper prints no causal
  backward: an assumption);
* a sliding window: the band's tiles at the non-causal rate of a ``window``-long sequence (each query
  block sweeps about the window).
* inside a training step, the kernels priced from FlashAttention-2's H100 bars (``flash``, ``flex``) at
  :data:`FA2_IN_TRAINING_SHARE` of them, an [Empirical] share fitted on published H100 training runs
  (:func:`in_training_share`, which :mod:`objectives.compute` applies); on the A100 series at the bars.

Between the measured points the rate is interpolated linearly in :math:`\log_2` of the length and of
the head dim, and held at the ends (under 512 tokens the kernel is slower still; past 16k it has
flattened; head dims above 128, which the paper measures only forward, take 128's). The fractions are
of the H100 SXM's dense BF16 peak (:data:`MEASURED_PEAK_TFLOPS`), applied to every device but Ampere and
Ada ones (compute capability 8.0-8.9), where FlashAttention-2 (and ``flex``, derived from it) runs at its
A100 rates as fractions of the A100's 312 TFLOP/s (:data:`A100_FA2_MAX_TFLOPS`: the FlashAttention-2
paper's printed best forward and backward rates on an A100, the H100 series' shape between them). The key length is the core's, before a
context-parallel split: the exported launchers gather K and V and sweep the keys in one kernel per query
chunk (Megatron-LM's ``--cp-comm-type all_gather``, TransformerEngine's ``AttnFuncWithCPAndKVAllGather``:
two chunks of ``s / 2cp`` queries against their key prefix; torchtitan's FlexAttention,
``flex_cp_allgather``: ``s / cp`` queries against all ``s`` keys). Torch's SDPA ring, which neither
exports, runs ``cp`` steps on ``s / cp`` x ``s / 2cp`` blocks instead (docs/VALIDATION.md, "Context-parallel
rows at 131k-262k tokens").
"""

from __future__ import annotations

import numpy as np

from objectives.attention import FlashShape

__all__ = ["FLASH_KERNELS", "MEASURED_KERNEL_TFLOPS", "KERNEL_TFLOPS", "MEASURED_PEAK_TFLOPS", "SEQUENCE_POINTS", "HEAD_DIMS",
           "FLEX_SHARE_OF_FLASH", "FLEX_HOPPER_CAPABILITY", "flex_share", "kernel_rate_tflops", "flash_efficiencies",
           "FA2_KERNELS", "FA2_IN_TRAINING_SHARE", "in_training_share", "AMPERE_CAPABILITY", "A100_PEAK_TFLOPS",
           "A100_FA2_MAX_TFLOPS", "on_a100_series", "series_peak_tflops"]

FLASH_KERNELS: tuple[str, ...] = ("flash", "cudnn", "flex")
"""Fused attention kernels with rates: measured (``flash``, ``cudnn``) or derived from FlashAttention-2's
by a published ratio (``flex``; module docstring)."""

FLEX_HOPPER_CAPABILITY = 9.0
"""From this compute capability on, FlexAttention is priced at its H100 ratio to FlashAttention-2, below
it at its A100 ratio (:data:`FLEX_SHARE_OF_FLASH`)."""

FLEX_SHARE_OF_FLASH: dict[str, tuple[float, float]] = {
    # PyTorch blog, "FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention"
    # (August 2024), Performance: A100, causal, Triton FlexAttention vs FAv2: 90% forward, 85% backward
    "before_hopper": (0.90, 0.85),
    # PyTorch blog, "PyTorch at GTC 2025", the FlexAttention session's abstract: on H100 "~25% faster
    # than FlashAttention2" forward, "~3% faster" backward
    "hopper": (1.25, 1.03),
}
"""FlexAttention's rate as a share of FlashAttention-2's on the same GPU, ``(forward, backward)``, as the
sources print them (module docstring): the ``flex`` series is FlashAttention-2's times these, not a fit."""

MEASURED_PEAK_TFLOPS = 989.5
"""Dense BF16 peak of the H100 SXM5 the rates were measured on (TFLOP/s; NVIDIA's datasheet, halved
from its sparse figure, as the ``h100-sxm`` preset)."""

SEQUENCE_POINTS: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
"""Sequence lengths of the measured series (tokens)."""

HEAD_DIMS: tuple[int, ...] = (64, 128)
"""Head dims of the measured series."""

MEASURED_KERNEL_TFLOPS: dict[str, dict[str, dict[int, tuple[float, ...]]]] = {
    # Shah et al. 2024, FlashAttention-3, Figure 5 (a, c: forward, no mask; b, d: forward, causal) and
    # Figure 6 (backward, no mask), H100 80GB SXM5, BF16; the FlashAttention-2 and cuDNN bars
    "flash": {
        "forward": {64: (282, 306, 318, 321, 322, 324), 128: (309, 350, 362, 368, 370, 370)},
        "forward_causal": {64: (180, 229, 262, 284, 295, 299), 128: (191, 260, 298, 319, 333, 335)},
        "backward": {64: (198, 238, 264, 279, 287, 291), 128: (214, 260, 291, 310, 318, 322)},
    },
    "cudnn": {
        "forward": {64: (335, 373, 395, 408, 412, 413), 128: (497, 574, 617, 609, 600, 595)},
        "forward_causal": {64: (225, 288, 334, 363, 379, 388), 128: (315, 410, 484, 518, 529, 539)},
        "backward": {64: (266, 348, 395, 417, 432, 433), 128: (305, 408, 465, 499, 518, 516)},
    },
}
"""TFLOP/s by kernel, pass (``forward``, ``forward_causal``, ``backward``), head dim, at :data:`SEQUENCE_POINTS`."""

AMPERE_CAPABILITY = 8.0
"""From this compute capability up to Hopper's (:data:`FLEX_HOPPER_CAPABILITY`), the kernels priced from
FlashAttention-2's bars (:data:`FA2_KERNELS`) run at its A100 rates (:data:`A100_FA2_MAX_TFLOPS`): Ampere and
Ada run FlashAttention-2's own ``sm80`` kernels, which the flash-attn README lists for "Ampere, Ada, or Hopper
GPUs"; on Hopper the same kernels run without the instructions Hopper adds (FlashAttention-3 uses them), so
there the H100 series holds. Below 8.0 FlashAttention-2 does not run at all (Turing has a separate port) and
the H100 series is kept, as before."""

A100_PEAK_TFLOPS = 312.0
"""The A100's dense FP16/BF16 peak (TFLOP/s), the "theoretical maximum" FlashAttention-2's percentages are of
(Dao 2023, arXiv:2307.08691, section 3.1: "the A100 GPU has a max theoretical throughput of 312 TFLOPs/s of
FP16/BF16 matmul"; the ``a100-80gb`` preset's, NVIDIA's datasheet)."""

A100_FA2_MAX_TFLOPS: dict[str, float] = {
    # Dao 2023, "FlashAttention-2" (arXiv:2307.08691), A100 80GB SXM4, FP16/BF16, 16k tokens, hidden 2,048,
    # head dims 64 / 128: section 4, "FlashAttention-2 reaches up to 230 TFLOPs/s, 73% of the theoretical
    # maximum TFLOPs/s on A100 GPUs" (the forward's Figure 5); section 1, "up to 73% of the theoretical max
    # throughput in the forward pass, and up to 63% of the theoretical max throughput in the backward pass"
    # (Figure 6)
    "forward": 230.0,
    "backward": 0.63 * A100_PEAK_TFLOPS,
}
"""FlashAttention-2's best rate on an A100 (TFLOP/s) by pass, as the paper's text prints it. Its Figures 4-6
print every bar, but no citable text of them was found (the one transcription found names no source and
fails a check of its own: its forward + backward bars at causal head dim 128 exceed both the forward and the
backward bars they are a weighted harmonic mean of), so the A100 series is the H100 series' shape (the same
kernel, :data:`MEASURED_KERNEL_TFLOPS`' ``flash`` rise with length, head dim and mask) scaled so each pass's
best point is the A100's: forward (its causal forward too) x 230 / 370, backward x 196.56 / 322, which puts
every point from 2k tokens on at 52-73.7% of the A100's peak (the abstract: "reaching 50-73% of the
theoretical maximum FLOPs/s on A100"). No training share applies to it (:func:`in_training_share`)."""


KERNEL_TFLOPS = MEASURED_KERNEL_TFLOPS
"""The rates priced: the measured ones (``bench/constant_fit.py --attention-scale`` rebinds a scaled copy
in its own process, a diagnostic)."""

FA2_KERNELS: tuple[str, ...] = ("flash", "flex")
"""Kernels priced from FlashAttention-2's bars (the ``flash`` series; ``flex`` is those times a published
ratio): :data:`FA2_IN_TRAINING_SHARE` applies to them, not to cuDNN's."""

FA2_IN_TRAINING_SHARE = 0.56
"""[Empirical] FlashAttention-2's rate inside a training step as a share of its microbenchmark bars
(:data:`MEASURED_KERNEL_TFLOPS`' ``flash`` series), one factor at every length, head dim and mask
(:func:`in_training_share`). Published runs that trained with FlashAttention-2 (llm-foundry's MPT H100
table, torchtitan's SDPA rows) imply 1.6-1.8x the bars' attention time from 4k tokens; the cuDNN rows
(TransformerEngine) show no such bias (docs/VALIDATION.md, "Context-parallel rows at 131k-262k tokens").

Fitted on fit rows only, the 31 rows of ``bench/fidelity/runs_*.jsonl`` marked ``fit`` that run
``flash``: llm-foundry MPT-1B and MPT-13B (19: 512-65,536 tokens on 8 H100s, 2,048 tokens on 8-64),
torchtitan Llama 3.1 8B Table 1 (2) and the one-H100 GPT-2 / BERT SDPA rows (10). Least squares of the
relative step-time error over a grid of the time factor 1 / share (``bench/fidelity.py --fit-flash-share
--no-build``): root mean square 18.9% at 1.0, 11.25% at 1.78-1.80 (the minimum; 11.3% from 1.75 to 1.85),
so 0.56 = 1 / 1.786. Why one factor: scaling the bars keeps their own rise with length, and leaves the MPT
fit rows' signed error flat in log2 of the sequence (at 8 GPUs: -4.3 points per doubling at 1.0, +1.0 here),
so a length term (a second parameter) is not asked for; the other one-parameter form tried, a cap on the
rate (an in-training rate flat in length, ``min(bar, c)``), fitted worse on the same rows (12.0% at its best,
c = 165-170 TFLOP/s). Measured on H100s; applied wherever the H100 bars are, not to the A100 series
(:func:`in_training_share`; 2026-12-01; the held-out scores before and after: docs/VALIDATION.md,
"FlashAttention-2's speed inside training")."""


def flex_share(capability: float | None) -> tuple[float, float]:
    """FlexAttention's ``(forward, backward)`` rate as a share of FlashAttention-2's on a device of compute
    ``capability`` (:data:`FLEX_SHARE_OF_FLASH`; ``None``, unknown: the H100's, the GPU the FlashAttention-2
    series was measured on).

    >>> flex_share(8.0), flex_share(9.0), flex_share(None)
    ((0.9, 0.85), (1.25, 1.03), (1.25, 1.03))
    """
    before = capability is not None and capability < FLEX_HOPPER_CAPABILITY
    return FLEX_SHARE_OF_FLASH["before_hopper" if before else "hopper"]


def on_a100_series(kernel: str, capability: float | None) -> bool:
    """Whether ``kernel`` on a device of compute ``capability`` is priced from FlashAttention-2's A100 rates
    (:data:`AMPERE_CAPABILITY`): a FlashAttention-2-derived kernel on Ampere or Ada.

    >>> on_a100_series("flash", 8.0), on_a100_series("flex", 8.9), on_a100_series("flash", 9.0)
    (True, True, False)
    >>> on_a100_series("cudnn", 8.0), on_a100_series("flash", 7.0), on_a100_series("flash", None)
    (False, False, False)
    """
    return kernel in FA2_KERNELS and capability is not None and AMPERE_CAPABILITY <= capability < FLEX_HOPPER_CAPABILITY


def series_peak_tflops(kernel: str, capability: float | None) -> float:
    """The dense peak (TFLOP/s) of the GPU ``kernel``'s rates on ``capability`` were measured on: the A100's
    for the A100 series (:func:`on_a100_series`), else the H100's.

    >>> series_peak_tflops("flash", 8.0), series_peak_tflops("flash", 9.0)
    (312.0, 989.5)
    """
    return A100_PEAK_TFLOPS if on_a100_series(kernel, capability) else MEASURED_PEAK_TFLOPS


def kernel_rate_tflops(kernel: str, series: str, seq: int, head_dim: int, *, capability: float | None = None) -> float:
    """A kernel's rate (TFLOP/s) at ``seq`` tokens and ``head_dim``, interpolated in log2 of both and held
    at the measured ends (module docstring); ``flex``: FlashAttention-2's times :func:`flex_share` of the
    device's compute ``capability`` (the forward share for ``forward`` and ``forward_causal``); on Ampere and
    Ada (:func:`on_a100_series`) FlashAttention-2's A100 series (:data:`A100_FA2_MAX_TFLOPS`).

    Examples
    --------
    >>> kernel_rate_tflops("flash", "forward_causal", 2048, 128)
    298.0
    >>> round(kernel_rate_tflops("flash", "forward", 1448, 128), 2)   # 2^10.4999 tokens: about (350 + 362) / 2
    356.0
    >>> kernel_rate_tflops("cudnn", "backward", 65536, 256), kernel_rate_tflops("flash", "forward", 128, 32)
    (516.0, 282.0)
    >>> round(kernel_rate_tflops("flash", "forward", 1024, 96), 2)   # 2^6.585: 0.585 of 306 -> 350
    331.74
    >>> round(kernel_rate_tflops("flex", "backward", 2048, 128, capability=9.0), 2)   # 1.03 x 291
    299.73

    On an A100 the H100 series' shape at the A100's best points: the forward at 16k tokens, head dim 128, is
    the paper's 230 TFLOP/s, the backward 63% of 312:

    >>> kernel_rate_tflops("flash", "forward", 16384, 128, capability=8.0)
    230.0
    >>> round(kernel_rate_tflops("flash", "backward", 16384, 128, capability=8.0), 2)
    196.56
    >>> round(kernel_rate_tflops("flash", "forward_causal", 2048, 128, capability=8.0), 2)   # 298 x 230 / 370
    185.24
    """
    if kernel == "flex":
        forward_share, backward_share = flex_share(capability)
        share = backward_share if series == "backward" else forward_share
        return share * kernel_rate_tflops("flash", series, seq, head_dim, capability=capability)
    table = KERNEL_TFLOPS[kernel][series]
    log_seq = np.log2(SEQUENCE_POINTS)
    at_dims = [float(np.interp(np.log2(max(seq, 1)), log_seq, table[dim])) for dim in HEAD_DIMS]
    rate = float(np.interp(np.log2(max(head_dim, 1)), np.log2(HEAD_DIMS), at_dims))
    return rate * _a100_scale(series) if on_a100_series(kernel, capability) else rate


def _a100_scale(series: str) -> float:
    """The A100 series over the H100's for ``series``' pass: the A100's best rate (:data:`A100_FA2_MAX_TFLOPS`)
    over the H100 FlashAttention-2 series' best (the measured bars, not a diagnostic's rescaled copy)."""
    name = "backward" if series == "backward" else "forward"
    best = max(max(rates) for rates in MEASURED_KERNEL_TFLOPS["flash"][name].values())
    return A100_FA2_MAX_TFLOPS[name] / best


def in_training_share(kernel: str, capability: float | None = None) -> float:
    """The share of its bars (:func:`flash_efficiencies`) a ``kernel`` reaches inside a training step on a
    device of compute ``capability``: :data:`FA2_IN_TRAINING_SHARE` for the kernels priced from
    FlashAttention-2's H100 bars (:data:`FA2_KERNELS` off the A100 series), 1 for the others.

    Not on the A100 series (:func:`on_a100_series`): the share was fitted on H100 rows against the H100 bars
    (FlashAttention-3's paper), and the FlashAttention-2 paper's own A100 training runs leave no room for it
    (Table 1, "up to 225 TFLOPs/s (72% model FLOPs utilization) per A100 GPU": at 0.56 of the A100 bars its
    GEMMs would need 0.78-0.89 of peak with nothing else in the step, at the bars 0.62-0.71; docs/COST_MODEL.md,
    "FlashAttention-2 on Ampere and Ada").

    >>> in_training_share("flash"), in_training_share("cudnn"), in_training_share("flash", 9.0)
    (0.56, 1.0, 0.56)
    >>> in_training_share("flash", 8.0), in_training_share("flex", 8.6)
    (1.0, 1.0)
    """
    return FA2_IN_TRAINING_SHARE if kernel in FA2_KERNELS and not on_a100_series(kernel, capability) else 1.0


def flash_efficiencies(kernel: str, shape: FlashShape, *, capability: float | None = None) -> tuple[float, float]:
    """``(forward, backward)`` fractions of the dense peak per FLOP the ``kernel`` computes on a core of
    ``shape`` (module docstring), to divide the visited tiles' FLOPs (``shape.tiles`` x the square's) by;
    ``capability``: the device's compute capability (``flex``'s share of FlashAttention-2 depends on it).

    Examples
    --------
    >>> shape = FlashShape(tiles=1.0, seq_k=2048, head_dim=128, causal=False)
    >>> [round(x * MEASURED_PEAK_TFLOPS, 1) for x in flash_efficiencies("flash", shape)]
    [362.0, 291.0]

    A causal core: the time is the square's FLOPs / (2 x the causal rate) whatever the visited share:

    >>> causal = FlashShape(tiles=0.53125, seq_k=2048, head_dim=128, causal=True)
    >>> forward, backward = flash_efficiencies("flash", causal)
    >>> round(causal.tiles / (forward * MEASURED_PEAK_TFLOPS), 6) == round(1 / (2 * 298), 6)
    True
    >>> round(backward / forward, 4) == round(291 / 362, 4)   # the backward at the forward's causal ratio
    True

    FlexAttention on an H100: FlashAttention-2's times 1.25 forward, 1.03 backward, causal or not:

    >>> [round(x * MEASURED_PEAK_TFLOPS, 2) for x in flash_efficiencies("flex", shape, capability=9.0)]
    [452.5, 299.73]

    FlashAttention-2 on an A100: fractions of the A100's 312 TFLOP/s (362 x 230 / 370 and 291 x 196.56 / 322):

    >>> [round(x, 4) for x in flash_efficiencies("flash", shape, capability=8.0)]
    [0.7212, 0.5693]
    """
    if kernel not in FLASH_KERNELS:
        raise ValueError(f"no measured rates for attention kernel '{kernel}'; use one of {', '.join(FLASH_KERNELS)}")
    seq = min(shape.window, shape.seq_k) if shape.window else shape.seq_k
    forward = kernel_rate_tflops(kernel, "forward", seq, shape.head_dim, capability=capability)
    backward = kernel_rate_tflops(kernel, "backward", seq, shape.head_dim, capability=capability)
    if shape.causal:
        causal = kernel_rate_tflops(kernel, "forward_causal", seq, shape.head_dim, capability=capability)
        # the rate counts half the square's FLOPs: per visited FLOP it is 2 x tiles x the rate
        visited = 2.0 * shape.tiles
        forward, backward = visited * causal, visited * backward * causal / forward
    peak = series_peak_tflops(kernel, capability)
    return forward / peak, backward / peak
