r"""CPU offload (``TrainingSettings.offload``, ``--fix offload=...``): device memory traded for host-link time.

Three modes, as the launchers run them:

* ``optimizer``: the optimizer state (fp32 master weights and Adam moments, ``StateBytes.optimizer``)
  lives in host memory and the optimizer step runs on the CPU. DeepSpeed ZeRO-Offload
  (``zero_optimization.offload_optimizer.device: cpu``, ZeRO 1-3, ``DeepSpeedCPUAdam``) and
  Megatron-LM's ``--optimizer-cpu-offload --optimizer-offload-fraction 1.0`` (megatron-core 0.16.1
  ``OptimizerConfig.optimizer_cpu_offload``, ``HybridDeviceOptimizer``: "gradient transfer from
  device to host (D2H) and parameter transfer from host to device (H2D)").
* ``activations``: the activations autograd saves inside the transformer layers are copied to host
  memory during forward and back during backward (megatron-core 0.16.1 ``TransformerConfig.cpu_offloading``
  with ``cpu_offloading_num_layers``, Megatron-LM's ``--cpu-offloading-num-layers``; refused with
  recomputation and with ``pp > 1`` by ``TransformerConfig.__post_init__``).
* ``parameters`` (ZeRO-3 only, ``planner.core.settings.OFFLOAD_MIN_ZERO``): each rank's shard of the
  parameters, gradients and optimizer state lives in host memory and the step runs on the CPU; the
  shard is copied to the device before each all-gather. torch 2.13 FSDP2 ``CPUOffloadPolicy``
  (``torch/distributed/fsdp/_fully_shard/_fsdp_api.py``: "Sharded parameters are copied host-to-device
  before all-gather ... Sharded gradients are copied device-to-host in backward, and the optimizer
  step runs on CPU"; ``_fsdp_param.py`` ``all_gather_inputs`` copies the fp32 shard, then casts it to
  ``param_dtype`` on the device; ``_fsdp_collectives.py`` ``foreach_reduce`` copies the reduced
  gradient to pinned host memory on the post-reduce stream), run by torchtitan 0.3.0's
  ``training.enable_cpu_offload`` and by ``fully_shard(..., offload_policy=CPUOffloadPolicy())``;
  DeepSpeed 0.19.8 ZeRO-3 ``offload_param.device: cpu`` with ``offload_optimizer.device: cpu``
  (``runtime/zero/offload_config.py``), which fetches each partition before its all-gather the same way.
  Megatron-LM has no parameter offload.

Per op and configuration, on the per-device shard (:func:`offload_columns`, the terms
``objectives.pipeline_arrays`` sums over a stage), with :math:`B_h` the host link's per-direction
bandwidth and :math:`M_h` the host memory bandwidth one device's CPU step gets (:class:`HostSide`):

``optimizer`` (:math:`N` the parameter elements whose optimizer state this rank owns, after ZeRO):

.. math::

    t_{D2H} = N b_g / B_h, \quad t_{H2D} = N b_p / B_h, \quad
    t_{CPU} = N \, (2 b_o + 4 + b_p) / M_h

(:func:`cpu_step_bytes_per_parameter`: the step reads and writes the master weights and moments,
reads an fp32 gradient and writes the low-precision weight: 30 bytes per parameter for bf16 Adam). The
gradient copy overlaps the backward that produces it, the CPU step and the weight copy are pipelined
over parameter groups (Megatron's ``--overlap-cpu-optimizer-d2h-h2d``; DeepSpeed overlaps the copies on
its own stream): exposed per step :math:`\max(0, t_{D2H} - t_{bwd}) + \max(t_{CPU}, t_{H2D})`, where
:math:`t_{bwd}` is the op's backward of one micro-batch (the last one, after which the gradients are
final); with ``--no-overlap`` :math:`t_{D2H} + t_{CPU} + t_{H2D}`. The GPU optimizer step it replaces
(``optimizer_s``) is dropped. Device memory loses the optimizer state; gradients and weights stay.

``activations`` (ops inside the repeated blocks only, :math:`L` block instances on the stage, :math:`a`
the op's saved activation bytes per micro-batch): Megatron offloads layer :math:`k - 1` while layer
:math:`k` runs forward and reloads it while layer :math:`k` runs backward, so at most two layers'
activations are on the device at once (:data:`RESIDENT_LAYERS`); ``cpu_offloading_num_layers`` is at
most :math:`L - 1` (``TransformerConfig``), so :math:`L - 1` of the :math:`L` layers move:

.. math::

    a_{dev} = a \min(1, 2 / L), \quad t_{D2H} = t_{H2D} = a (L - 1) / (L B_h), \quad
    t_{exp} = \max(0, t_{D2H} - t_{fwd}) + \max(0, t_{H2D} - t_{bwd})

per micro-batch, the copies hidden under the same op's compute of the neighbouring layer (equal
to its own: the layers are identical). Summed over ops, a per-op overlap is an upper bound of the
per-layer one.

``parameters`` (:math:`N` the elements of the rank's ZeRO-3 shard; :func:`parameter_offload`): per
micro-batch the shard goes host to device before the forward all-gather and again before the backward
one (FSDP2 and ZeRO-3 free the gathered weights after forward), and the reduced gradient shard goes
back, both at 4 bytes per element (:data:`HOST_SHARD_BYTES`: FSDP2 keeps the fp32 shard and reduces in
fp32, torchtitan's ``mixed_precision_reduce = "float32"``); the step is the optimizer mode's CPU step
:math:`t_{CPU}` (no H2D after it: the updated shard stays on the host):

.. math::

    t_{H2D} = t_{D2H} = 4 N / B_h, \quad
    t_{fwd}' = t_{fwd} + \max(0, t_{H2D} - t_{fwd}), \quad
    t_{bwd}' = t_{bwd} + \max(0, \max(t_{H2D}, t_{D2H}) - t_{bwd})

The copies run on the all-gather's copy-in and the post-reduce streams, prefetched a block ahead as
the gathers are, so each hides under the compute of one op (the same op of the neighbouring block) and
the two directions of a full-duplex link overlap each other; with ``--no-overlap`` both add whole.
Device memory loses the shard's parameters, gradients and optimizer state; the gathered weights of
the blocks in flight (``unsharded_bytes``) stay.

What is left out: DeepSpeed's bf16 partition copies (2 bytes, priced at FSDP2's 4: an upper bound);
FSDP2's D2H of micro-batches after the first, which is synchronous (``non_blocking`` is off while
the gradient accumulates on the host, and the add runs on the CPU); the host link shared by two GPUs
behind one PCIe switch (DGX H100), pinned-memory registration, and the CPU's own time for anything but
the optimizer step.

References
----------
Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training", USENIX ATC 2021 (arXiv:2101.06840):
the optimizer state and step on the CPU, fp16 gradients D2H and fp16 parameters H2D per step, the
CPU Adam bound by memory bandwidth. DeepSpeed config ``zero_optimization.offload_optimizer``
(https://www.deepspeed.ai/docs/config-json/#optimizer-offloading). megatron-core 0.16.1
``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``, ``optimizer_config.py``,
``transformer/transformer_config.py`` (installed in the integration environment).
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from objectives.memory import state_bytes_per_parameter
from planner.core.cluster import Device
from planner.core.errors import InputError
from planner.core.settings import OFFLOAD_MIN_ZERO, OFFLOAD_MODES, TrainingSettings

__all__ = [
    "OFFLOAD_MODES",
    "HOST_SHARD_BYTES",
    "RESIDENT_LAYERS",
    "FP32_GRADIENT_BYTES",
    "HostSide",
    "HOST_SIDES",
    "host_side",
    "cpu_step_bytes_per_parameter",
    "cpu_step_s",
    "OffloadTerms",
    "optimizer_offload",
    "parameter_offload",
    "activation_offload",
    "offload_columns",
    "block_layers",
]

HOST_SHARD_BYTES = 4
"""Bytes per element of the shard that parameter offload copies each way: FSDP2 keeps the sharded
parameter in fp32 on the host and casts after the copy (torch 2.13 ``_fsdp_param.py``
``all_gather_inputs``), and torchtitan 0.3.0 reduces gradients in fp32 (``mixed_precision_reduce``)."""

RESIDENT_LAYERS = 2
"""Layers whose activations stay on the device under activation offload: the layer running and the
one being copied (megatron-core 0.16.1 ``cpu_offload``'s group prefetch: layer ``k - 1`` is offloaded
when layer ``k``'s forward starts and reloaded during layer ``k``'s backward; double buffering is off
by default, ``cpu_offloading_double_buffering = False``)."""

FP32_GRADIENT_BYTES = 4
"""Bytes per element of the gradient the CPU step reads: DeepSpeed's ``DeepSpeedCPUAdam`` and
Megatron's ``HybridDeviceOptimizer`` (``param_update_in_fp32=True``) update fp32 master weights from
fp32 gradients on the host."""

_G = 1e9
_PCIE = "PCI Express Base Specification (PCI-SIG), x16 per direction after 128b/130b encoding"


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSide:
    """What one device's offload runs on: its link to the host and its share of the host's memory."""

    link_bytes_per_s: float
    """Host link bandwidth per direction, one device (bytes/s)."""
    memory_bytes_per_s: float
    """Host memory bandwidth for this device's CPU optimizer step: the node's DRAM bandwidth over its
    devices (bytes/s)."""
    source: str

    def __post_init__(self) -> None:
        if self.link_bytes_per_s <= 0 or self.memory_bytes_per_s <= 0:
            raise InputError("a host side needs positive link and memory bandwidths; fix the preset")


def _ddr(channels: int, mt_per_s: int, sockets: int, devices: int) -> float:
    """DRAM bandwidth per device (bytes/s): 8 bytes per transfer per channel (a 64-bit DDR channel)."""
    return channels * mt_per_s * 1e6 * 8 * sockets / devices


_DGX1 = HostSide(
    link_bytes_per_s=15.75 * _G, memory_bytes_per_s=_ddr(4, 2400, 2, 8),
    source=f"{_PCIE} (Gen3 8 GT/s); NVIDIA DGX-1 datasheet: 2 Intel Xeon E5-2698 v4, 4 channels DDR4-2400 each "
           "(Intel ARK), 153.6 GB/s over 8 GPUs",
)
_DGX_A100 = HostSide(
    link_bytes_per_s=31.5 * _G, memory_bytes_per_s=_ddr(8, 3200, 2, 8),
    source=f"{_PCIE} (Gen4 16 GT/s); NVIDIA DGX A100 datasheet: 2 AMD EPYC 7742, 8 channels DDR4-3200 each "
           "(AMD product page), 409.6 GB/s over 8 GPUs",
)
_DGX_H100 = HostSide(
    link_bytes_per_s=63.0 * _G, memory_bytes_per_s=_ddr(8, 4800, 2, 8),
    source=f"{_PCIE} (Gen5 32 GT/s); NVIDIA DGX H100/H200 user guide: 2 Intel Xeon Platinum 8480C, 8 channels "
           "DDR5-4800 each (Intel ARK), 614.4 GB/s over 8 GPUs",
)
_DGX_B200 = HostSide(
    link_bytes_per_s=63.0 * _G, memory_bytes_per_s=_ddr(8, 5600, 2, 8),
    source=f"{_PCIE} (Gen5 32 GT/s); NVIDIA DGX B200 user guide: 2 Intel Xeon Platinum 8570, 8 channels "
           "DDR5-5600 each (Intel ARK), 716.8 GB/s over 8 GPUs",
)
_GB200 = HostSide(
    link_bytes_per_s=450.0 * _G, memory_bytes_per_s=512.0 * _G / 2,
    source="NVIDIA GB200 NVL72 page: NVLink-C2C 900 GB/s between Grace and Blackwell (both directions, 450 each); "
           "one Grace with up to 480 GB LPDDR5X at up to 512 GB/s per 2 Blackwell GPUs",
)
_PCIE4_HOST = HostSide(
    link_bytes_per_s=31.5 * _G, memory_bytes_per_s=_ddr(8, 3200, 1, 8),
    source=f"{_PCIE} (Gen4 16 GT/s); assumed host: one socket of 8 channels DDR4-3200 for 8 devices",
)

HOST_SIDES: dict[str, HostSide] = {
    "v100-32gb": _DGX1,
    "a100-40gb": _DGX_A100,
    "a100-80gb": _DGX_A100,
    "h100-sxm": _DGX_H100,
    "h100-sxm-96gb-500w": _DGX_H100,
    "h100-pcie": _DGX_H100,
    "h200": _DGX_H100,
    "b200": _DGX_B200,
    "gb200": _GB200,
}
"""Per device preset: its usual host (the DGX of its generation); any other device gets a PCIe 4 host
(:func:`host_side`)."""


def host_side(device: Device) -> HostSide:
    """The host link and memory of ``device``'s usual host (:data:`HOST_SIDES`).

    >>> from objectives.cluster import get_device
    >>> side = host_side(get_device("h100-sxm"))
    >>> side.link_bytes_per_s, side.memory_bytes_per_s
    (63000000000.0, 76800000000.0)
    """
    return HOST_SIDES.get(device.name, _PCIE4_HOST)


def cpu_step_bytes_per_parameter(settings: TrainingSettings) -> float:
    """Host memory bytes the CPU optimizer step moves per parameter: read and write the optimizer
    state (master weights and moments; under ``fp32`` the weight itself), read an fp32 gradient,
    write the device's weight (bf16 under ``bf16-mixed``).

    >>> cpu_step_bytes_per_parameter(TrainingSettings())  # bf16 Adam: 2 x 12 + 4 + 2
    30.0
    >>> cpu_step_bytes_per_parameter(TrainingSettings(precision="fp32"))  # 2 x (8 + 4) + 4
    28.0
    """
    per = state_bytes_per_parameter(settings)
    if settings.precision == "bf16-mixed":
        return 2.0 * per.optimizer + FP32_GRADIENT_BYTES + (per.param - per.weight_copy)
    return 2.0 * (per.optimizer + per.param) + FP32_GRADIENT_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadTerms:
    """One op's offload price, per configuration (arrays) or for one configuration (floats)."""

    moved_bytes: np.ndarray | float
    """Bytes over the host link, both directions together: per step (optimizer) or per micro-batch
    (activations)."""
    exposed_s: np.ndarray | float
    """Seconds added to the step (optimizer: once; activations: per micro-batch, per pass)."""
    saved_bytes: np.ndarray | float
    """Device memory freed (bytes)."""
    forward_s: np.ndarray | float = 0.0
    """Of :attr:`exposed_s`, the seconds added to forward (parameters: per micro-batch)."""


def cpu_step_s(elements, *, settings: TrainingSettings, host: HostSide):
    """Seconds of the CPU optimizer step over ``elements`` parameter elements, bound by the host memory
    bandwidth (:func:`cpu_step_bytes_per_parameter`).

    >>> side = HostSide(link_bytes_per_s=50e9, memory_bytes_per_s=100e9, source="test")
    >>> round(cpu_step_s(1e9, settings=TrainingSettings(), host=side), 6)  # 1e9 x 30 B / 100 GB/s
    0.3
    """
    return elements * cpu_step_bytes_per_parameter(settings) / host.memory_bytes_per_s


def optimizer_offload(elements, *, settings: TrainingSettings, host: HostSide, backward_s) -> OffloadTerms:
    """Optimizer offload of ``elements`` owned parameter elements (module docstring).

    ``backward_s``: the op's backward of one micro-batch (s), the window the gradient copy hides under.

    >>> from planner.core.settings import TrainingSettings
    >>> side = HostSide(link_bytes_per_s=50e9, memory_bytes_per_s=100e9, source="test")
    >>> t = optimizer_offload(1e9, settings=TrainingSettings(), host=side, backward_s=0.01)
    >>> round(t.moved_bytes / 1e9, 6), round(float(t.exposed_s), 6), round(t.saved_bytes / 1e9, 6)
    (4.0, 0.33, 12.0)
    """
    per = state_bytes_per_parameter(settings)
    d2h = elements * per.grad / host.link_bytes_per_s
    low = per.param - per.weight_copy  # the weight the device trains with, not its FP8 copies
    h2d = elements * low / host.link_bytes_per_s
    cpu = cpu_step_s(elements, settings=settings, host=host)
    if settings.overlap:
        exposed = np.maximum(0.0, d2h - backward_s) + np.maximum(cpu, h2d)
    else:
        exposed = d2h + cpu + h2d
    return OffloadTerms(moved_bytes=elements * (per.grad + low), exposed_s=exposed,
                        saved_bytes=elements * per.optimizer)


def activation_offload(activations_bytes, *, layers: int, host: HostSide, forward_s, backward_s) -> OffloadTerms:
    """Activation offload of one block op saving ``activations_bytes`` per micro-batch on a stage of
    ``layers`` block instances (module docstring); ``forward_s`` / ``backward_s``: its compute of one
    micro-batch (s), the windows the copies hide under.

    >>> side = HostSide(link_bytes_per_s=50e9, memory_bytes_per_s=100e9, source="test")
    >>> t = activation_offload(1e8, layers=4, host=side, forward_s=1e-3, backward_s=2e-3)
    >>> round(t.moved_bytes / 1e6, 3), round(float(t.exposed_s) * 1e3, 3), round(t.saved_bytes / 1e6, 3)
    (150.0, 0.5, 50.0)
    """
    if layers < 1:
        raise ValueError("activation offload needs at least one layer")
    offloaded = activations_bytes * (layers - 1) / layers
    copy_s = offloaded / host.link_bytes_per_s
    exposed = np.maximum(0.0, copy_s - forward_s) + np.maximum(0.0, copy_s - backward_s)
    kept = activations_bytes * min(1.0, RESIDENT_LAYERS / layers)
    return OffloadTerms(moved_bytes=2.0 * offloaded, exposed_s=exposed, saved_bytes=activations_bytes - kept)


def parameter_offload(elements, *, settings: TrainingSettings, host: HostSide, forward_s, backward_s) -> OffloadTerms:
    """Parameter offload of a ZeRO-3 shard of ``elements`` parameter elements (module docstring), per
    micro-batch: two H2D copies of the shard and one D2H of its gradient; ``forward_s`` / ``backward_s``:
    the op's compute of one micro-batch (s), the windows they hide under. :attr:`OffloadTerms.saved_bytes`
    is the shard's parameters, gradients and optimizer state; the CPU step is :func:`cpu_step_s`.

    >>> side = HostSide(link_bytes_per_s=50e9, memory_bytes_per_s=100e9, source="test")
    >>> t = parameter_offload(1e8, settings=TrainingSettings(), host=side, forward_s=2e-3, backward_s=4e-3)
    >>> round(t.moved_bytes / 1e6, 3), round(float(t.forward_s) * 1e3, 3), round(float(t.exposed_s) * 1e3, 3)
    (1200.0, 6.0, 10.0)
    >>> round(t.saved_bytes / 1e9, 3)  # 1e8 x (2 + 2 + 12) B
    1.6
    """
    copy_s = elements * HOST_SHARD_BYTES / host.link_bytes_per_s  # one direction, one copy
    if settings.overlap:
        forward = np.maximum(0.0, copy_s - forward_s)
        backward = np.maximum(0.0, copy_s - backward_s)  # H2D and D2H: both directions of the link at once
    else:
        forward, backward = copy_s, 2.0 * copy_s
    return OffloadTerms(moved_bytes=3.0 * elements * HOST_SHARD_BYTES, exposed_s=forward + backward,
                        saved_bytes=elements * state_bytes_per_parameter(settings).total, forward_s=forward)


def block_layers(graph) -> dict[int, int]:
    """Per op index inside a repeated block (:attr:`planner.core.graph.OpGraph.blocks`), its group's
    instance count: the layers activation offload spreads over. Ops outside every block are absent.

    >>> from types import SimpleNamespace
    >>> block_layers(SimpleNamespace(blocks=(SimpleNamespace(instances=((1, 2), (3, 4), (5, 6))),)))
    {1: 3, 2: 3, 3: 3, 4: 3, 5: 3, 6: 3}
    """
    return {index: len(group.instances) for group in graph.blocks for instance in group.instances for index in instance}


def offload_columns(columns: tuple, *, settings: TrainingSettings, device: Device, optimizer_s,
                    block_layers: int, step_floor_s: float = 0.0) -> tuple:
    """One op's pipeline columns ``(forward_s, backward_s, step_s, params, grads, optimizer,
    activations)`` (``objectives.pipeline_arrays``) under ``settings.offload``, on ``device``'s host.

    ``optimizer_s``: the GPU optimizer step included in ``step_s``, which the CPU step replaces;
    ``block_layers``: the block instances on the stage when the op lies in a repeated block, else 0
    (its activations stay on the device); ``step_floor_s``: the step's host floor (one dispatch per
    updated tensor, ``objectives.compute.optimizer_step_time_s``). The host issues those updates
    whether the arithmetic runs on the GPU or on the CPU, so the step that replaces the GPU's keeps
    the floor: without it a small model's offloaded step came out faster than the GPU's.
    """
    forward, backward, step, params, grads, optimizer, activations = columns
    host = host_side(device)
    if settings.offload == "optimizer":
        per_optimizer = state_bytes_per_parameter(settings).optimizer
        terms = optimizer_offload(optimizer / per_optimizer, settings=settings, host=host, backward_s=backward)
        step = step - optimizer_s + np.maximum(terms.exposed_s, step_floor_s)
        return forward, backward, step, params, grads, optimizer - terms.saved_bytes, activations
    if settings.offload == "activations" and block_layers > 0:
        terms = activation_offload(activations, layers=block_layers, host=host, forward_s=forward, backward_s=backward)
        # the copy out hides under forward, the copy back under backward: each pass pays its own part
        out_s = np.maximum(0.0, terms.moved_bytes / 2.0 / host.link_bytes_per_s - forward)
        return (forward + out_s, backward + (terms.exposed_s - out_s), step, params, grads, optimizer,
                activations - terms.saved_bytes)
    if settings.offload == "parameters" and settings.zero_stage >= OFFLOAD_MIN_ZERO["parameters"]:
        elements = optimizer / state_bytes_per_parameter(settings).optimizer  # the rank's ZeRO-3 shard
        terms = parameter_offload(elements, settings=settings, host=host, forward_s=forward, backward_s=backward)
        step = step - optimizer_s + np.maximum(cpu_step_s(elements, settings=settings, host=host), step_floor_s)
        nothing = np.zeros_like(params)  # the shard's states live on the host; the gathered weights are apart
        return (forward + terms.forward_s, backward + (terms.exposed_s - terms.forward_s), step, nothing, nothing,
                nothing, activations)
    return columns

