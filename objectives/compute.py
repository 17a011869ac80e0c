r"""Compute time of one op under each configuration: roofline, or measured with roofline fallback.

Roofline, for the per-device shard of a configuration on :math:`P = \prod_d f_d` devices:

.. math::

    t_{fwd} = \max\left(\frac{F / P}{\pi_{dtype}\,\eta_{family}},
                         \frac{B_{fwd}}{bw_{mem}\,\eta_{mem}}\right), \qquad
    t_{bwd} = \max\left(\frac{\rho F / P}{\pi_{dtype}\,\eta_{family}},
                         \frac{2 B_{fwd}}{bw_{mem}\,\eta_{mem}}\right)

plus the device's ``kernel_latency_s`` once per kernel (one forward, :data:`BACKWARD_KERNELS`
backward), with :math:`F` the op's forward FLOPs (``Op.flops``), :math:`\rho` its ``backward_flops_factor``,
:math:`B_{fwd}` the bytes of every operand shard it reads and writes (:func:`forward_bytes`), and
:math:`\pi` the device's dense peak for the training precision (:func:`peak_flops_per_s`).

Measured: a ``measured(op, factors) -> seconds | (forward, backward) | None`` callable (the profile
database of :mod:`objectives.profile`) gives the forward time of the shard, and the backward time
where it was measured too (PyTorch profiles); otherwise backward is :math:`\rho` times the forward.
Where it returns ``None`` the roofline is used and the fallback is counted
(:attr:`ComputeTimes.fallbacks`), so a report can say how much of the model was really measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from objectives._common import element_bytes, shard_elements
from planner.core.cluster import Device
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, Tensor
from planner.core.settings import TrainingSettings

__all__ = [
    "FAMILY_EFFICIENCY",
    "DEFAULT_EFFICIENCY",
    "MEMORY_BANDWIDTH_EFFICIENCY",
    "BACKWARD_BYTES_FACTOR",
    "BACKWARD_KERNELS",
    "MeasuredFn",
    "ComputeTimes",
    "compute_dtype",
    "peak_flops_per_s",
    "forward_bytes",
    "roofline_time_s",
    "op_compute_time_s",
]

MeasuredFn = Callable[[Op, Mapping[str, int]], "float | tuple[float, float | None] | None"]
"""``(op, {dim: factor}) -> forward seconds of the per-device shard`` (or ``(forward, backward)``
seconds where the backward was measured), ``None`` if unknown."""

FAMILY_EFFICIENCY: dict[str, float] = {
    "matmul": 0.70,
    "conv": 0.60,
    "rnn": 0.40,
    "embedding": 0.50,
    "gather": 0.50,
}
"""[Empirical] Fraction of the dense peak FLOP/s an op family reaches. Large GEMMs reach 70-80% of
peak on recent GPUs (cuBLAS/Megatron MFU reports), convolutions a little less, recurrent cells
(many small GEMMs) much less. Other families are memory-bound, where this barely matters."""

DEFAULT_EFFICIENCY = 0.50
"""[Empirical] FLOP/s efficiency of families not in :data:`FAMILY_EFFICIENCY`."""

MEMORY_BANDWIDTH_EFFICIENCY = 0.80
"""[Empirical] Fraction of the spec-sheet memory bandwidth a streaming kernel reaches (STREAM-like
kernels measure 80-90% on HBM GPUs)."""

BACKWARD_KERNELS: dict[str, int] = {"matmul": 2, "conv": 2, "norm": 2, "rnn": 2}
"""Kernels of an op's backward pass, each paying the device's ``kernel_latency_s`` (the gradients of
both operands of a product, of the input and the parameters of a norm); 1 for other families."""

BACKWARD_BYTES_FACTOR = 2.0
"""[Empirical] Backward bytes / forward bytes: the backward pass reads the output gradient and the
saved operands and writes one gradient per operand, about twice the forward's traffic."""


def compute_dtype(settings: TrainingSettings) -> str:
    """The peak-FLOP/s key the training precision computes in: ``bf16`` or ``fp32``.

    Examples
    --------
    >>> compute_dtype(TrainingSettings(precision="fp32"))
    'fp32'
    """
    return "bf16" if settings.precision == "bf16-mixed" else "fp32"


def peak_flops_per_s(device: Device, dtype: str) -> float:
    """Dense peak FLOP/s of ``device`` in ``dtype``, with a fallback for dtypes it lacks.

    A half-precision dtype the device cannot run (bf16 on a V100) falls back to the fastest of
    fp16/bf16/fp32 it has, which is what mixed-precision training would use there; a missing fp32
    falls back to tf32, then to the slowest listed figure.

    Examples
    --------
    >>> from objectives.cluster import get_device
    >>> peak_flops_per_s(get_device("v100-32gb"), "bf16")  # no bf16: fp16 tensor cores
    125000000000000.0
    >>> peak_flops_per_s(get_device("gtx-1080ti"), "bf16")  # fp16 at 1/64 rate: fp32 is faster
    11340000000000.0
    """
    peaks = device.peak_flops
    if dtype in peaks:
        return float(peaks[dtype])
    if dtype in ("bf16", "fp16"):
        present = [peaks[k] for k in ("fp16", "bf16", "fp32") if k in peaks]
        if present:
            return float(max(present))
    if dtype == "fp32" and "tf32" in peaks:
        return float(peaks["tf32"])
    return float(min(peaks.values()))


def forward_bytes(op: Op, space: ConfigSpace, *, tensors: Mapping[str, Tensor], settings: TrainingSettings) -> np.ndarray:
    """``(K,)`` bytes of every operand shard the op reads or writes in its forward pass.

    A lookup (embedding, gather) reads only the table rows it gathers, at most as many elements as
    it writes, not the whole table shard.
    """
    total = np.zeros(space.size, dtype=np.float64)
    lookup = op.kind in ("embedding", "gather") and op.outputs
    written = None
    if lookup:
        out = op.outputs[0]
        out_tensor = tensors.get(out.tensor)
        if out_tensor is not None:
            written = shard_elements(space, op, out, out_tensor.shape)
    for access in (*op.inputs, *op.outputs):
        tensor = tensors.get(access.tensor)
        if tensor is None:
            continue
        elements = shard_elements(space, op, access, tensor.shape)
        if written is not None and tensor.role == "parameter":
            elements = np.minimum(elements, written)
        total += elements * element_bytes(tensor, settings)
    return total


def roofline_time_s(
    flops: np.ndarray | float,
    num_bytes: np.ndarray | float,
    *,
    peak_flops_per_s: float,
    memory_bandwidth_bytes_per_s: float,
    efficiency: float,
) -> np.ndarray:
    """``max(flops / (peak * efficiency), bytes / (bandwidth * MEMORY_BANDWIDTH_EFFICIENCY))`` in s.

    Examples
    --------
    >>> float(roofline_time_s(1e12, 1e9, peak_flops_per_s=1e12, memory_bandwidth_bytes_per_s=1e12,
    ...                       efficiency=0.5))
    2.0
    """
    flop_time = np.asarray(flops, dtype=np.float64) / (peak_flops_per_s * efficiency)
    byte_time = np.asarray(num_bytes, dtype=np.float64) / (memory_bandwidth_bytes_per_s * MEMORY_BANDWIDTH_EFFICIENCY)
    return np.maximum(flop_time, byte_time)


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeTimes:
    """Compute time of one op under each of its configurations."""

    forward_s: np.ndarray
    """``(K,)`` seconds of the forward pass."""
    backward_s: np.ndarray
    """``(K,)`` seconds of the backward pass."""
    measured: int = 0
    """Configurations whose forward time came from ``measured``."""
    fallbacks: int = 0
    """Configurations where ``measured`` had no entry and the roofline was used."""

    @property
    def total_s(self) -> np.ndarray:
        return self.forward_s + self.backward_s


def op_compute_time_s(
    op: Op,
    space: ConfigSpace,
    *,
    tensors: Mapping[str, Tensor],
    device: Device,
    settings: TrainingSettings,
    measured: MeasuredFn | None = None,
) -> ComputeTimes:
    """Forward and backward compute time of ``op`` under every configuration of ``space``.

    Parameters
    ----------
    op, space:
        The op and its configurations.
    tensors:
        The graph's tensors (shapes and dtypes of the operands).
    device:
        Peak FLOP/s and memory bandwidth.
    settings:
        Training precision (picks the peak and the element sizes).
    measured:
        Optional measured forward seconds per configuration (see :data:`MeasuredFn`).

    Returns
    -------
    ComputeTimes
    """
    devices_used = space.devices_used.astype(np.float64)
    flops_fwd = op.flops / devices_used
    bytes_fwd = forward_bytes(op, space, tensors=tensors, settings=settings)
    rates = dict(
        peak_flops_per_s=peak_flops_per_s(device, compute_dtype(settings)),
        memory_bandwidth_bytes_per_s=device.memory_bandwidth_bytes_per_s,
        efficiency=FAMILY_EFFICIENCY.get(op.kind, DEFAULT_EFFICIENCY),
    )
    # each pass also pays a fixed time per kernel, which dominates shards of a few microseconds
    latency = device.kernel_latency_s
    forward = roofline_time_s(flops_fwd, bytes_fwd, **rates) + latency
    backward = roofline_time_s(op.backward_flops_factor * flops_fwd, BACKWARD_BYTES_FACTOR * bytes_fwd, **rates)
    backward = backward + BACKWARD_KERNELS.get(op.kind, 1) * latency
    if measured is None:
        return ComputeTimes(forward_s=forward, backward_s=backward)
    found = 0
    for row in range(space.size):
        factors = {name: int(f) for name, f in zip(space.dim_names, space.factors[row])}
        seconds = measured(op, factors)
        if seconds is None:
            continue
        found += 1
        forward_s, backward_s = seconds if isinstance(seconds, tuple) else (seconds, None)
        forward[row] = float(forward_s)
        backward[row] = op.backward_flops_factor * float(forward_s) if backward_s is None else float(backward_s)
    return ComputeTimes(forward_s=forward, backward_s=backward, measured=found, fallbacks=space.size - found)
