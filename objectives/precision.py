r"""FP8 linear layers (``TrainingSettings.fp8``, ``--dtype fp8``): what FP8 changes in a step's price.

FP8 training as Transformer Engine (Megatron-LM) and torchao float8 (torchtitan) run it computes the
linear layers' GEMMs in FP8 and keeps everything else as ``bf16-mixed``: bf16 weights, activations
and gradients, fp32 master weights and Adam moments. Four terms differ from bf16:

* **GEMM peak.** A product with a parameter operand (:func:`is_fp8_linear`) runs at the device's
  ``fp8`` peak (:func:`fp8_peak_flops_per_s`) at the same efficiency as in bf16, so a compute-bound
  GEMM takes ``peak_bf16 / peak_fp8`` of its bf16 time (1/2 on Hopper and Blackwell). Attention's
  products (no parameter), norms, softmax and elementwise ops stay bf16. A weight with a dim that is
  not a multiple of :data:`FP8_ALIGNMENT` stays bf16 (torchtitan's ``Float8LinearConverter`` skips
  such linears "due to hardware requirements"), and so does the LM head (Megatron-LM's output layer
  is a plain ``ColumnParallelLinear``, not a Transformer Engine module; torchtitan's own FP8 presets
  filter ``lm_head``).
* **Casts** (:func:`cast_bytes`): each operand quantised to FP8 is read in bf16 (2 bytes) and written
  in FP8 (1 byte) by a memory-bound kernel. Delayed scaling (Transformer Engine's ``DelayedScaling``,
  Megatron-LM's default ``--fp8-recipe delayed``) takes the scale from the amax history and writes a
  transposed copy too (Hopper's FP8 GEMMs are TN only: Transformer Engine, "Performance
  considerations: handling transposes"): forward the input and the weight, backward the output
  gradient, :data:`DELAYED_CAST_BYTES` = 2 + 1 + 1 per element. Rowwise dynamic scaling (torchao's
  ``ROWWISE`` recipe, torchtitan 0.3's default) reads each tensor once for its amax and casts it per
  GEMM along the axis that GEMM reduces (torchao's training docs: ``to_fp8(input)``, ``to_fp8(weight)``
  forward, ``to_fp8(grad_output)`` twice, ``to_fp8(weight)``, ``to_fp8(input.t())`` backward),
  :data:`DYNAMIC_CAST_BYTES` = 2 + 2 + 1 per element cast.
* **FP8 weight copies** (:func:`fp8_weight_copy_bytes`): Transformer Engine caches each weight's FP8
  cast and its transpose between micro-batches (``is_first_microbatch``), 1 + 1 bytes per weight
  element, priced as part of every parameter's state (``objectives.memory.state_bytes_per_parameter``:
  an upper bound, since embeddings and norms keep none); torchao casts on the fly and keeps none.
* **Scale/amax state** (:func:`amax_state_bytes`): delayed scaling keeps, per FP8 tensor of a linear
  (input, weight, output gradient), an fp32 amax history of ``amax_history_len`` = 1,024 entries
  (Transformer Engine's ``DelayedScaling`` default, which the Megatron-LM export sets) plus an fp32
  scale and its inverse: 3 x (1,024 + 2) x 4 = 12,312 bytes per linear, 1.6 MB for a 32-layer model's
  128 linears, under 0.01% of its states, so it is reported, not added to the memory tables.

Not priced: FP8 all-gathers under FSDP / ZeRO-3. Neither export gathers FP8 weights: torchtitan 0.3's
``Float8LinearConverter`` has no ``enable_fsdp_float8_all_gather`` (torchao's option needs the
tensorwise recipe), and Megatron-LM's ``--fp8-param-gather`` is not exported, so gathers stay bf16.
Saved activations stay bf16 (Transformer Engine saves a linear's FP8 input instead: its memory is
overestimated by 1 byte per saved input element of an FP8 linear).

References
----------
Transformer Engine ``DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_history_len=1024,
amax_compute_algo="max")``: https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/api/common.html;
transposes on Hopper: https://nvidia.github.io/TransformerEngine/features/low_precision_training/
performance_considerations/performance_considerations.html; torchao float8 recipes and casts:
https://docs.pytorch.org/ao/stable/workflows/training.html and
https://docs.pytorch.org/ao/main/api_reference/generated/torchao.float8.Float8LinearRecipeName.html.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from objectives._common import is_float, shard_elements
from planner.core.cluster import Device
from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import Op, Tensor
from planner.core.settings import TrainingSettings

__all__ = [
    "FP8_ALIGNMENT",
    "DELAYED_CAST_BYTES",
    "DYNAMIC_CAST_BYTES",
    "AMAX_HISTORY_LEN",
    "fp8_devices",
    "require_fp8",
    "fp8_peak_flops_per_s",
    "is_fp8_linear",
    "cast_bytes",
    "fp8_weight_copy_bytes",
    "amax_state_bytes",
]

FP8_ALIGNMENT = 16
"""A weight dim FP8 GEMMs need a multiple of (torchtitan 0.3 ``Float8LinearConverter``: linears with
any dim not divisible by 16 are skipped; cuBLASLt FP8 GEMMs take 16-byte aligned leading dims)."""

DELAYED_CAST_BYTES = 4.0
"""Bytes moved per element cast under delayed scaling: read bf16 (2), write FP8 (1) and its
transpose (1), one fused cast-transpose kernel (module docstring)."""

DYNAMIC_CAST_BYTES = 5.0
"""Bytes moved per element cast under dynamic (rowwise) scaling: read bf16 for the amax (2), read
bf16 again and write FP8 (2 + 1)."""

AMAX_HISTORY_LEN = 1024
"""Transformer Engine ``DelayedScaling.amax_history_len`` default, exported to Megatron-LM as
``--fp8-amax-history-len 1024`` (with ``--fp8-amax-compute-algo max``, its default too)."""

_FP8_TENSORS_PER_LINEAR = 3  # input, weight, output gradient
_SCALE_FIELDS = 2  # the fp32 scale and its inverse, beside the history


def fp8_devices() -> tuple[str, ...]:
    """The device presets that list an ``fp8`` peak (``objectives.cluster.DEVICE_PRESETS``)."""
    from objectives.cluster import DEVICE_PRESETS

    return tuple(name for name, device in DEVICE_PRESETS.items() if "fp8" in device.peak_flops)


def require_fp8(device: Device) -> None:
    """Raise :class:`InputError` (one line, naming the presets that have one) when ``device`` has no FP8 peak."""
    if "fp8" not in device.peak_flops:
        raise InputError(
            f"{device.name} has no FP8 peak for --dtype fp8; use a device that has one ({', '.join(fp8_devices())}) "
            "or add peak_flops.fp8 to the cluster file"
        )


def fp8_peak_flops_per_s(device: Device) -> float:
    """The device's dense FP8 peak in FLOP/s (:func:`require_fp8` first).

    >>> from objectives.cluster import get_device
    >>> fp8_peak_flops_per_s(get_device("h100-sxm")) / 1e12
    1979.0
    """
    require_fp8(device)
    return float(device.peak_flops["fp8"])


def _fp8_weight(op: Op, tensors: Mapping[str, Tensor]) -> Tensor | None:
    for access in op.inputs:
        tensor = tensors.get(access.tensor)
        if tensor is not None and tensor.role == "parameter" and is_float(tensor) and len(tensor.shape) >= 2:
            return tensor
    return None


def is_fp8_linear(op: Op, tensors: Mapping[str, Tensor], settings: TrainingSettings, *, graph_output: bool = False) -> bool:
    """Whether ``op`` runs as an FP8 GEMM under ``settings``: FP8 on, a product (``matmul``) with a float
    weight of at least 2 dims, each a multiple of :data:`FP8_ALIGNMENT`, that is not the LM head
    (``graph_output``: the op writes a tensor no op reads, the logits; a graph that ends in its loss
    op has its head priced in FP8 when its dims allow)."""
    if settings.fp8 is None or op.kind != "matmul" or graph_output:
        return False
    weight = _fp8_weight(op, tensors)
    return weight is not None and not any(int(size) % FP8_ALIGNMENT for size in weight.shape)


def cast_bytes(
    op: Op, space: ConfigSpace, *, tensors: Mapping[str, Tensor], settings: TrainingSettings, graph_output: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(forward, backward)`` bytes, each ``(K,)``, the FP8 casts of one micro-batch's pass move on one
    device (module docstring); zeros for an op that is not an FP8 linear.

    Delayed: forward ``4 (X + W)``, backward ``4 Y``; rowwise: forward ``5 (X + W)``, backward
    ``5 (2 Y + W + X)``, with ``X``, ``W``, ``Y`` the input, weight and output shard elements.
    """
    zeros = np.zeros(space.size)
    if not is_fp8_linear(op, tensors, settings, graph_output=graph_output):
        return zeros, zeros
    weight = np.zeros(space.size)
    activation = np.zeros(space.size)
    for access in op.inputs:
        tensor = tensors.get(access.tensor)
        if tensor is None or not is_float(tensor):
            continue
        elements = shard_elements(space, op, access, tensor.shape)
        if tensor.role == "parameter":
            weight = weight + (elements if len(tensor.shape) >= 2 else 0.0)  # a bias is not cast
        else:
            activation = activation + elements
    out = op.outputs[0]
    output = shard_elements(space, op, out, tensors[out.tensor].shape).astype(np.float64)
    if settings.fp8 == "delayed":
        return DELAYED_CAST_BYTES * (activation + weight), DELAYED_CAST_BYTES * output
    return DYNAMIC_CAST_BYTES * (activation + weight), DYNAMIC_CAST_BYTES * (2 * output + weight + activation)


def fp8_weight_copy_bytes(settings: TrainingSettings) -> float:
    """Bytes per parameter of the cached FP8 weight and its transpose: 2 under delayed scaling
    (Transformer Engine), 0 otherwise (torchao casts on the fly; no FP8)."""
    return 2.0 if settings.fp8 == "delayed" else 0.0


def amax_state_bytes(linears: int, settings: TrainingSettings) -> int:
    """Bytes of delayed scaling's amax histories and scales for ``linears`` FP8 linear layers
    (0 for rowwise or no FP8).

    >>> amax_state_bytes(128, TrainingSettings(fp8="delayed"))
    1575936
    """
    if settings.fp8 != "delayed":
        return 0
    return linears * _FP8_TENSORS_PER_LINEAR * (AMAX_HISTORY_LEN + _SCALE_FIELDS) * 4
