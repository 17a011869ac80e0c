r"""FP8 linear layers (``TrainingSettings.fp8``, ``--dtype fp8``): what FP8 changes in a step's price.

FP8 training as Transformer Engine (Megatron-LM) and torchao float8 (torchtitan) run it computes the
linear layers' GEMMs in FP8 and keeps everything else as ``bf16-mixed``: bf16 weights, activations
and gradients, fp32 master weights and Adam moments. Four terms differ from bf16:

* **GEMM rate.** A product with a parameter operand (:func:`is_fp8_linear`) runs at the device's
  ``fp8`` peak times :data:`FP8_GEMM_EFFICIENCY_GAIN` (:func:`fp8_peak_flops_per_s`) at the bf16
  efficiency: FP8 GEMMs reach a larger fraction of their peak than bf16 ones (torchao's float8
  roofline measures 0.78 against 0.69 on H100 for large shapes), so a compute-bound GEMM takes
  ``peak_bf16 / (peak_fp8 x 0.78 / 0.69)`` of its bf16 time (0.442 on Hopper and Blackwell). Attention's
  products (no parameter), norms, softmax and elementwise ops stay bf16. A weight with a dim that is
  not a multiple of :data:`FP8_ALIGNMENT` stays bf16 (torchtitan's ``Float8LinearConverter`` skips
  such linears "due to hardware requirements"), and so does the LM head (Megatron-LM's output layer
  is a plain ``ColumnParallelLinear``, not a Transformer Engine module; torchtitan's own FP8 presets
  filter ``lm_head``).
* **Casts** (:func:`cast_bytes`): each operand quantised to FP8 is read in bf16 (2 bytes) and written
  in FP8 (1 byte) by a memory-bound kernel, per micro-batch. Delayed scaling (Transformer Engine's
  ``DelayedScaling``, Megatron-LM's default ``--fp8-recipe delayed``) takes the scale from the amax
  history and writes a transposed copy in the same kernel (``fp8_cast_transpose_fused``; Hopper's FP8
  GEMMs are TN only: Transformer Engine, "Performance considerations: handling transposes"): forward
  the input, backward the output gradient, :data:`DELAYED_CAST_BYTES` = 2 + 1 + 1 per element. Its
  weight is cast (and transposed) once per step, not per micro-batch: Transformer Engine keeps the
  FP8 weight between micro-batches (``is_first_microbatch``: ``update_fp8_weights`` only on the first;
  Megatron-Core's schedules call ``set_is_first_microbatch()`` at each step's first micro-batch), so
  the per-micro-batch tables carry no weight cast; the once-per-step pass, 4 bytes per FP8 weight
  element (6.5 ms a step for Llama 2 70B's 4.4e9 weights per H100 at tp 4 x pp 4), is not priced
  (under 0.2% of every step of ``bench/fidelity/runs_h100_fp8_cp.jsonl``). Rowwise dynamic scaling
  (torchao's ``ROWWISE`` recipe, torchtitan 0.3's default) casts each tensor per GEMM along the axis
  that GEMM reduces (torchao's training docs: ``to_fp8(input)``, ``to_fp8(weight)`` forward,
  ``to_fp8(grad_output)`` twice, ``to_fp8(weight)``, ``to_fp8(input.t())`` backward), each in one kernel
  that reduces the row's (or column's) amax on chip and writes the FP8 values (torchao's float8
  roofline, ``torchao/testing/training/roofline_utils.py``, ``get_tensor_memory_traffic_bytes``:
  rowwise "x_bf16 -> x_float8_dim0" and "x_bf16 -> x_float8_dim1", read bf16 once and write FP8 once
  each), :data:`DYNAMIC_CAST_BYTES` = 2 + 1 per element cast. torchao's *tensorwise* recipe (one
  dynamic scale per tensor: torchtitan's Float8 default, priced as rowwise) moves, by the same roofline,
  6 bytes per input and output-gradient element (a whole-tensor amax pass, 2, then one kernel writing
  both layouts, 2 + 1 + 1) and 8 per weight element (amax 2, cast forward 3 and again backward 3):
  rowwise's 3 + 3 per tensor prices it 2 bytes per weight element low.
* **FP8 weight copies** (:func:`fp8_weight_copy_bytes`): Transformer Engine caches each weight's FP8
  cast and its transpose between micro-batches (``is_first_microbatch``), 1 + 1 bytes per weight
  element, priced as part of every parameter's state (``objectives.memory.state_bytes_per_parameter``:
  an upper bound, since embeddings and norms keep none); torchao casts on the fly and keeps none.
* **Scale/amax state** (:func:`amax_state_bytes`): delayed scaling keeps, per FP8 tensor of a linear
  (input, weight, output gradient), an fp32 amax history of ``amax_history_len`` = 1,024 entries
  (Transformer Engine's ``DelayedScaling`` default, which the Megatron-LM export sets) plus an fp32
  scale and its inverse: 3 x (1,024 + 2) x 4 = 12,312 bytes per linear, 1.6 MB for a 32-layer model's
  128 linears, under 0.01% of its states, so it is reported, not added to the memory tables.

* **FP8 parameter all-gathers** (:func:`gathered_bytes`): with ``TrainingSettings.gathers_fp8`` (FP8 on,
  the launcher's ``fp8_param_gather`` rule on, ZeRO 1-3) an FP8 linear's weight is kept in FP8 and
  ZeRO's parameter all-gather moves :data:`FP8_PARAM_BYTES` = 1 byte per element instead of bf16's 2:
  Megatron-LM's ``--fp8-param-gather`` (``TransformerConfig.fp8_param`` and
  ``DistributedDataParallelConfig.fp8_param_gather`` in megatron-core 0.16.1: the distributed optimizer
  re-quantises its fp32 main shards to FP8, ``fp8_utils.quantize_param_shard``, and all-gathers the FP8
  bytes; Megatron-LM's ``validate_args`` allows it only with the distributed optimizer, torch FSDP2 or
  Megatron-FSDP). Biases, norms, embeddings and the LM head stay bf16, and every gradient
  reduce-scatter keeps the gradient's dtype (the grad buffer is bf16/fp32 either way). The per-tensor
  fp32 scale (4 bytes per weight tensor, under 1e-6 of the gathered bytes of a 4096-wide layer) is not
  added. torchtitan 0.3.0 gathers no FP8: its ``Float8LinearConverter.Config`` offers the ``rowwise``
  recipes only and no ``enable_fsdp_float8_all_gather`` (torchao's option needs the tensorwise
  recipe), so its rows gather bf16 (``Target.fp8_param_gather`` is off).
* **FP8 primary weights** (:func:`fp8_primary_bytes`): under the same rule the FP8 weight is the
  parameter, no bf16 copy and no cached FP8 copy beside it: it holds 2 bytes per element at ZeRO 1-2
  (the FP8 data, whole in the distributed optimizer's ``uint8`` buffer, and its transpose,
  :data:`FP8_TRANSPOSE_BYTES`), 1 at ZeRO-3 (its shard's data; the transpose lives only while the weight is
  gathered), where bf16's 2 and the cached copy's 2 are charged otherwise; the fp32 main shard and Adam
  moments stay as they are. ZeRO-3's gathered unsharded weight is held at 1 byte too
  (``objectives.pipeline_arrays``: its elements kept apart, so the unit's gradient buffers keep theirs,
  ``objectives.memory.fsdp_unsharded_peak``). Left out: the running unit's transpose under ZeRO-3 (1 byte
  per FP8 weight element of one gathered unit, made for its backward) and the per-tensor fp32 scale_inv.
Saved activations: Transformer Engine saves a linear's FP8 input, 1 byte per element, under delayed
scaling (``objectives.memory.fp8_saved_input``); torchao keeps the bf16 input. Two Transformer Engine fusions the
per-op tables cannot see (each needs the op that produced the input): a ``LayerNormLinear`` (Megatron-
Core's QKV and FC1) has its norm write the FP8 input directly and only transposes it for the weight
gradient (``fp8_transpose``, 2 bytes per element, not 4: overestimated by 2 bytes per such input
element), and under sequence parallelism it all-gathers that FP8 input, and a row-parallel linear its
FP8 output gradient (``grad_output_preprocess``: "cast, transpose for efficient gather"), at 1 byte
per element where the redistribution tables move 2.

References
----------
Transformer Engine ``DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_history_len=1024,
amax_compute_algo="max")``: https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/api/common.html;
transposes on Hopper: https://nvidia.github.io/TransformerEngine/features/low_precision_training/
performance_considerations/performance_considerations.html; torchao float8 recipes and casts:
https://docs.pytorch.org/ao/stable/workflows/training.html and
https://docs.pytorch.org/ao/main/api_reference/generated/torchao.float8.Float8LinearRecipeName.html;
torchao's float8 roofline (cast bytes, FP8 / bf16 GEMM efficiency):
https://github.com/pytorch/ao/blob/main/torchao/testing/training/roofline_utils.py; Transformer Engine
1.x ``module/layernorm_linear.py``, ``module/linear.py``, ``module/base.py`` (``update_fp8_weights``,
``fp8_cast_transpose_fused``, ``grad_output_preprocess``): https://github.com/NVIDIA/TransformerEngine.
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
    "FP8_GEMM_EFFICIENCY_GAIN",
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
    "FP8_PARAM_BYTES",
    "FP8_TRANSPOSE_BYTES",
    "keeps_fp8",
    "gathered_bytes",
    "fp8_primary_bytes",
]

FP8_ALIGNMENT = 16
"""A weight dim FP8 GEMMs need a multiple of (torchtitan 0.3 ``Float8LinearConverter``: linears with
any dim not divisible by 16 are skipped; cuBLASLt FP8 GEMMs take 16-byte aligned leading dims)."""

FP8_GEMM_EFFICIENCY_GAIN = 0.78 / 0.69
"""[Empirical, external] How much larger a fraction of its dense peak an FP8 GEMM reaches than a bf16
GEMM of the same shape: torchao's float8 roofline (``torchao/testing/training/roofline_utils.py``,
``gpu_name_to_specs["NVIDIA H100"]``: ``pct_achievable_gemm_tops_bf16`` 0.69, ``pct_achievable_gemm_tops_fp8``
0.78, "based on experimental observation with sample large inputs"; its B200 entry, 0.69 / 0.775, is
copied from H100). Both run cuBLASLt (``torch._scaled_mm``, Transformer Engine's ``fp8_gemm``). A ratio,
so a device's fitted bf16 ``matmul_efficiency`` carries over: 0.616 x 1.130 = 0.696 on ``h100-sxm``.
Not fitted to any measured training step."""

DELAYED_CAST_BYTES = 4.0
"""Bytes moved per element cast under delayed scaling: read bf16 (2), write FP8 (1) and its
transpose (1), one fused cast-transpose kernel (module docstring)."""

DYNAMIC_CAST_BYTES = 3.0
"""Bytes moved per element cast under dynamic rowwise scaling: read bf16 (2) and write FP8 (1), the
row's amax reduced inside the same kernel (torchao's float8 roofline, module docstring)."""

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
    """The rate an FP8 GEMM is priced at, in FLOP/s, before the bf16 GEMM efficiency the roofline
    applies (:func:`require_fp8` first): the device's dense FP8 peak times
    :data:`FP8_GEMM_EFFICIENCY_GAIN`, since FP8 GEMMs reach a larger fraction of their peak.

    >>> from objectives.cluster import get_device
    >>> round(fp8_peak_flops_per_s(get_device("h100-sxm")) / 1e12, 1)  # 1,979 x 0.78 / 0.69
    2237.1
    """
    require_fp8(device)
    return float(device.peak_flops["fp8"]) * FP8_GEMM_EFFICIENCY_GAIN


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

    Delayed: forward ``4 X``, backward ``4 Y`` (the weight is cast once per step, not per
    micro-batch); rowwise: forward ``3 (X + W)``, backward ``3 (2 Y + W + X)``, with ``X``, ``W``, ``Y``
    the input, weight and output shard elements.
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
        # the cached FP8 weight (is_first_microbatch) is cast on the step's first micro-batch only
        return DELAYED_CAST_BYTES * activation, DELAYED_CAST_BYTES * output
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


FP8_PARAM_BYTES = 1.0
"""Bytes per element of an FP8 weight all-gathered in FP8 (e4m3: Transformer Engine's ``Float8Tensor`` data)."""


FP8_TRANSPOSE_BYTES = 1.0
"""Bytes per element of the transpose an FP8 weight kept in FP8 carries beside its data where the GEMMs are
TN only (Hopper): Transformer Engine's ``post_all_gather_processing`` calls ``Float8Tensor._create_transpose()``
unless ``is_non_tn_fp8_gemm_supported()`` (``transformer_engine/pytorch/tensor/utils.py``), which megatron-core
0.16.1 calls after each parameter all-gather (``distributed/param_and_grad_buffer.py``, ``finish_param_sync``)."""


def keeps_fp8(op: Op, tensors: Mapping[str, Tensor], settings: TrainingSettings, tensor: Tensor, *,
              graph_output: bool = False) -> bool:
    """Whether ``tensor``, a parameter of ``op``, is an FP8 linear's weight (a float parameter of at least 2
    dims of an op :func:`is_fp8_linear` prices in FP8): the tensors ``--fp8-param-gather`` keeps in FP8."""
    return len(tensor.shape) >= 2 and is_float(tensor) and is_fp8_linear(op, tensors, settings, graph_output=graph_output)


def gathered_bytes(op: Op, tensors: Mapping[str, Tensor], settings: TrainingSettings, tensor: Tensor, *,
                   bf16_bytes: float, graph_output: bool = False) -> float:
    """Bytes per element ZeRO's parameter all-gather moves for ``tensor``, a parameter of ``op``:
    :data:`FP8_PARAM_BYTES` for an FP8 linear's weight (:func:`keeps_fp8`) under ``settings.gathers_fp8``,
    else ``bf16_bytes`` (the parameter dtype's, ``objectives.memory.StateBytes.gathered``).

    Checked by hand-counted bytes in ``tests/objectives/test_fp8_gather.py``.
    """
    if settings.gathers_fp8 and keeps_fp8(op, tensors, settings, tensor, graph_output=graph_output):
        return FP8_PARAM_BYTES
    return bf16_bytes


def fp8_primary_bytes(settings: TrainingSettings) -> float:
    """Bytes per element a device holds of an FP8 weight kept in FP8 (``settings.gathers_fp8``), in place of
    ``objectives.memory.StateBytes.param`` (bf16's 2 and the cached FP8 copy's 2): no bf16 weight and no
    cached copy, the weight *is* the FP8 tensor (megatron-core 0.16.1 ``distributed_data_parallel.py``: an FP8
    parameter's buffer is ``torch.uint8``; ``optimizer/distrib_optimizer.py``: the fp32 main shard is made from
    ``get_high_precision_init_val()``, then ``clear_high_precision_init_val()``). ZeRO 1-2 hold it whole, data
    and transpose (:data:`FP8_TRANSPOSE_BYTES`): 2. ZeRO-3 (Megatron-FSDP ``optim_grads_params``) holds its
    shard's data only, 1 per element before the division: the transpose is made after the backward gather
    and dropped with the gathered weight (``megatron_fsdp.py``: ``fp8_create_transpose_cache`` /
    ``release_params_fp8_transpose_cache``, ``keep_fp8_transpose_cache`` off by default). The fp32 scale_inv,
    4 bytes per tensor, is left out.

    >>> fp8_primary_bytes(TrainingSettings(fp8="delayed", fp8_param_gather=True, zero_stage=1))
    2.0
    >>> fp8_primary_bytes(TrainingSettings(fp8="delayed", fp8_param_gather=True, zero_stage=3))
    1.0
    """
    return FP8_PARAM_BYTES + (FP8_TRANSPOSE_BYTES if settings.zero_stage < 3 else 0.0)
