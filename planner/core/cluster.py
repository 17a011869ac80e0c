"""Cluster types: a device model, the links between devices, and the two-level cluster.

Presets and file loading live in :mod:`objectives.cluster`; these are the plain types every layer
shares (exporters need the world size and node shape, search needs nothing of it).
Rates are SI: FLOP/s, bytes/s; latencies in seconds; sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from planner.core.errors import InputError

__all__ = ["Device", "Link", "Cluster"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator type, from its spec sheet."""

    name: str
    """Preset key, e.g. ``"h100-sxm"``."""
    peak_flops: Mapping[str, float]
    """Dense peak FLOP/s per compute dtype: keys among ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``
    (``fp8`` is listed for reference: training is priced in bf16 or fp32)."""
    memory_bytes: int
    """Device memory (bytes)."""
    memory_bandwidth_bytes_per_s: float
    """Device memory bandwidth (bytes/s)."""
    kernel_latency_s: float = 0.0
    """Fixed time of one kernel beyond its roofline (launch and ramp), paid once per forward kernel
    and per backward kernel. About 4 us measured on an H100 (docs/COST_MODEL.md section 5); 0 in
    the presets (the published figures use none), set it in a cluster file to price it."""
    kernel_overhead_s: float = 5.0e-6
    """[Empirical] Device time of one kernel beyond its roofline (launch gap, ramp-up, tail) under an
    execution model (``--engine``; ``kernel_latency_s`` is the plain roofline's opt-in and is not
    used there). A fit ``measured = a + c * roofline`` of single H100 kernels gives a = 5-7 us of
    which 1.2-1.6 us is the CUDA event pair (docs/COST_MODEL.md §5): 5 us (s)."""
    host_dispatch_s: float = 3.0e-5
    """[Empirical] Host time to issue one kernel (Python module code, the PyTorch dispatcher and
    autograd bookkeeping, ``cudaLaunchKernel``), under an execution model. The GPU waits for the host
    when a kernel is shorter than this, so each kernel costs ``max(device time, host_dispatch_s)``:
    one H100 running GPT-2/Llama at batch 1-4 steps in 45-60 ms for 1,300-1,700 kernels, 30-40 us
    each; fitted on the GPT-2 rows of ../shared/calibration/ (bench/one_gpu_fidelity.py --fit,
    Llama and BERT held out) with ``kernel_overhead_s`` at 5 us: 30 us. PyTorch's own eager overhead is
    documented as "a few to tens of microseconds per op" (PyTorch performance tuning guide,
    CUDA graphs section) (s)."""
    collective_overhead_s: float = 2.0e-5
    """[Empirical] Fixed time of one collective call beyond its NCCL or alpha-beta price (NCCL kernel
    launch, proxy-thread setup and the ranks' synchronisation at the call), under an execution model (s).
    Fitted on named rows, which cannot pin it (h33g, 2026-12-03; docs/VALIDATION.md, "collective_overhead_s:
    the fit"): the A100 node's 12- and 20-layer rows (../shared/calibration/a100_single_node_h1024.csv,
    360 rows; the 16- and 24-layer rows held out), each value one full pricing pass (``bench/fidelity.py
    --a100-node --no-build --split fit --calibration F``, F setting only this field). Over 0-127 us the
    fit rows' median |error| stays within 5.04-5.15% (20 us: 5.11%, MAPE 7.76%), under the 0.3 points
    that would choose a value; their ranking sets the range: top-1 81% and regret 1.04% up to 40 us, 72%
    and 1.79% from 60 us. Gauss-Newton (``--calibrate-to F --fit-fields device.collective_overhead_s``)
    goes to 127 us for 0.02 points of median (held out 5.83 -> 5.85%, top-1 75 -> 61%): not adopted. Most
    calls sit under the preset's host floor: 89 of 360 fit rows move at all between 0 and 20 us (at most
    1.6%), 320 with ``layer_host_s`` and ``microbatch_host_s`` at 0 (at most 5.0%); those two refitted with
    this at 5 us (``--fit-host``) come back at their preset values, so no joint refit. The sources give a
    lower bound: nccl-tests' whole small all-reduces leave, over this model's own NCCL or alpha-beta price
    of the same call (``bench/collective_setup_sources.py``), +5.6 us (NVIDIA/nccl#583: 10.14 us, 32 B,
    2 A100-SXM4-40GB), -2.9 us (NVIDIA/nccl#1984: 3.5 us, 1 KB, 4 H800, no CUDA graph) and +9.9 us
    (NVIDIA/nccl-tests#150: 19.90 us, 8 B, two A100 nodes over HDR InfiniBand); they time a loop of calls
    with one host timer and one wait at the end (NVIDIA/nccl-tests ``src/common.cu``, ``BenchTime``), the
    ranks in step and no PyTorch stream waits, so a training step pays at least that. 20 us is kept,
    between the sources' 5.6 / 9.9 us and the fit rows' 40 us."""
    layer_host_s: float = 0.0
    """[Empirical] Host time of one repeated layer (a transformer block) per forward pass, under an
    execution model: the launcher's Python module code, its kernels' dispatch and the autograd and
    checkpointing bookkeeping. A pipeline stage's pass cannot be shorter than its layers' host time:
    a backward pass counts :data:`objectives.fixed_costs.BACKWARD_HOST_PASSES` layer passes (one
    more under full recomputation, which runs the forward again), so the GPU waits for the host
    where the kernels are short (:func:`objectives.fixed_costs.host_floor_s`). 0: no floor beyond
    the per-kernel ``host_dispatch_s`` (s)."""
    microbatch_host_s: float = 0.0
    """[Empirical] Host time per micro-batch and pipeline stage outside the layers (the schedule's
    step: the batch and loss, the stage's send/receive calls), added to the stage's host floor (s)."""
    p2p_overhead_s: float = 0.0
    """[Empirical] Fixed time of one pipeline send/receive beyond its alpha-beta price (NCCL
    send/recv launch and the stream synchronisation Megatron-LM's ``p2p_communication`` does after
    ``batch_isend_irecv``), per stage boundary, micro-batch and direction (s)."""
    compute_capability: float | None = None
    """CUDA compute capability (``9.0``: Hopper), where a launcher's kernel choice depends on it
    (TransformerEngine runs cuDNN's fused attention from 9.0 on, FlashAttention-2 below:
    :func:`objectives.execution.attention_on_device`); ``None``: unknown or not a CUDA device."""
    matmul_efficiency: float | None = None
    """[Empirical] Fraction of the dense peak FLOP/s this device's products (GEMMs, family ``matmul``)
    reach; ``None``: :data:`objectives.compute.FAMILY_EFFICIENCY`'s device-independent figure (0.70). A
    preset sets it only where it was fitted on named measured rows (its comment names them)."""
    source: str = ""
    """Where the numbers come from (URL or document)."""

    def __post_init__(self) -> None:
        if self.matmul_efficiency is not None and not 0 < self.matmul_efficiency <= 1:
            raise InputError(f"device '{self.name}': matmul_efficiency must be in (0, 1]; fix the cluster file")
        for name in ("kernel_overhead_s", "host_dispatch_s", "collective_overhead_s", "layer_host_s",
                     "microbatch_host_s", "p2p_overhead_s"):
            if not 0 <= getattr(self, name) < 1:
                raise InputError(f"device '{self.name}': {name} must be seconds in [0, 1); fix the cluster file")
        if self.memory_bytes <= 0 or self.memory_bandwidth_bytes_per_s <= 0:
            raise InputError(f"device '{self.name}': memory size and bandwidth must be positive")
        if not self.peak_flops or any(v <= 0 for v in self.peak_flops.values()):
            raise InputError(f"device '{self.name}': peak_flops must list positive FLOP/s per dtype")
        if not 0 <= self.kernel_latency_s < 1:
            raise InputError(f"device '{self.name}': kernel_latency_s must be seconds in [0, 1); fix the cluster file")


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A communication link level, priced with the alpha-beta model."""

    name: str
    """E.g. ``"nvlink4"``, ``"ib-ndr"``."""
    bandwidth_bytes_per_s: float
    """Per-device unidirectional bandwidth (bytes/s)."""
    latency_s: float
    """Per-message latency alpha (seconds)."""
    collective_efficiency: float = 1.0
    """[Empirical] Fraction of ``bandwidth_bytes_per_s`` a collective (all-reduce, all-gather,
    reduce-scatter, all-to-all) reaches: NCCL's *bus bandwidth* over the link rate. 1.0 means the
    link rate; point-to-point transfers always use the link rate (fraction in (0, 1])."""
    source: str = ""

    @property
    def collective_bandwidth_bytes_per_s(self) -> float:
        """Per-device bandwidth a collective reaches on this link (bytes/s)."""
        return self.bandwidth_bytes_per_s * self.collective_efficiency

    def __post_init__(self) -> None:
        if self.bandwidth_bytes_per_s <= 0:
            raise InputError(f"link '{self.name}': bandwidth must be positive")
        if not 0 < self.collective_efficiency <= 1:
            raise InputError(
                f"link '{self.name}': collective_efficiency must be in (0, 1] (got {self.collective_efficiency}); "
                "it is NCCL's bus bandwidth over the link rate"
            )
        if self.latency_s < 0:
            raise InputError(f"link '{self.name}': latency must not be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """``nodes x devices_per_node`` devices of one type, an intra-node and an inter-node link."""

    device: Device
    nodes: int
    devices_per_node: int
    intra_link: Link
    inter_link: Link
    extra: Mapping[str, str] = field(default_factory=dict)
    nccl_buffsize_bytes: int = 1 << 22
    """NCCL's Simple-protocol buffer per connection and channel, ``NCCL_BUFFSIZE`` (bytes; NCCL's default
    ``DEFAULT_BUFFSIZE``, 4 MiB, ``src/init.cc``): what ``objectives.nccl_memory`` prices each connection's
    largest buffer at. A cluster file's ``nccl_buffsize`` sets it, for a job run with ``NCCL_BUFFSIZE``."""

    def __post_init__(self) -> None:
        if isinstance(self.nccl_buffsize_bytes, bool) or not isinstance(self.nccl_buffsize_bytes, int) \
                or self.nccl_buffsize_bytes < 1:
            raise InputError(f"nccl_buffsize must be a positive number of bytes such as 4MiB (got "
                             f"{self.nccl_buffsize_bytes!r}); fix the cluster file")
        if self.nodes < 1 or self.devices_per_node < 1:
            raise InputError(
                f"cluster needs at least one node of at least one device (got {self.nodes} x "
                f"{self.devices_per_node}); fix --devices / --devices-per-node"
            )

    @property
    def devices(self) -> int:
        """Total device count."""
        return self.nodes * self.devices_per_node

    def without_latency(self) -> Cluster:
        """This cluster with both links' latency at 0 s: a collective priced on it is its bandwidth part alone, so
        the difference from its price here is its latency (how the fixed costs and the ZeRO-3 rules split them)."""
        return replace(self, intra_link=replace(self.intra_link, latency_s=0.0),
                       inter_link=replace(self.inter_link, latency_s=0.0))
