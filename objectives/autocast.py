r"""The dtype each activation is stored in, and the dtype each op saves it in, under bf16 autocast.

PyTorch eager training in mixed precision (``torch.autocast(dtype=torch.bfloat16)``, fp32
parameters: ``engine="eager"``, ``precision="bf16-mixed"``) does not store every activation in
bf16. The rule, from PyTorch's autocast op lists (docs "Automatic Mixed Precision package",
"CUDA Ops that can autocast to float16" / "... to float32" / "Ops that promote to the widest input
type"; ``aten/src/ATen/autocast_mode.cpp``):

* **lower-precision ops** (``conv*``, ``linear``, ``matmul``, ``bmm``, ``addmm``, the RNN cells:
  :data:`BF16_KINDS`) cast each floating input to bf16 and write bf16;
* **fp32 ops** (``softmax``, ``log_softmax``, ``layer_norm``, ``group_norm``, ``pow``, ``exp``,
  ``log``, ``rsqrt``, ``reciprocal``, ``sum``, ``prod``, the losses: :data:`FP32_KINDS`,
  :data:`FP32_OP_TYPES`, :data:`FP32_REDUCTIONS`, and every RMS/Layer-style norm) cast to fp32 and
  write fp32;
* **every other op** runs in the widest dtype of its inputs, parameters included (they stay fp32):
  an embedding of an fp32 table writes fp32; a residual ``Add`` of a bf16 product and an fp32
  stream writes fp32; a ReLU or max-pooling of bf16 writes bf16; ``BatchNormalization`` is not in
  either list and cuDNN takes a bf16 input with fp32 statistics, so it writes its input's dtype
  (:data:`INPUT_DTYPE_NORMS`); an explicit ``Cast`` to a float (``x.float()``) writes fp32.

Graph inputs keep their file dtype (a float32 image is fp32). :func:`stored_dtypes` follows this
through the graph in op order; everything else of the cost model is unchanged.

What an op saves for backward (:func:`saved_dtype`): a lower-precision op reading an fp32 tensor
saves the bf16 copy it made (autocast caches the casts of *parameters* only, so two products of one
fp32 activation make and save two copies); an fp32 op reading a bf16 tensor likewise saves its fp32
copy; every other op saves the stored tensor itself, which autograd holds once however many
backward functions keep it (:func:`objectives.memory.shared_saved_operands` charges it once).

Without autocast (``fused`` engine: Megatron/DeepSpeed train bf16 modules with an fp32 master copy
in the optimizer, and ``torch.compile`` fuses the casts into the kernels; eager bf16 modules whose
parameters an FSDP wrapper casts to bf16, ``TrainingSettings.autocast`` off; the plain roofline; or
``fp32``) every float tensor is stored and saved at the training precision
(:func:`objectives._common.element_bytes`), so every saved tensor is shared.
"""

from __future__ import annotations

from typing import Mapping

from objectives._common import is_float
from objectives.execution import ExecutionModel
from planner.core.graph import Op, OpGraph
from planner.core.settings import TrainingSettings

__all__ = [
    "BF16",
    "FP32",
    "BF16_KINDS",
    "FP32_KINDS",
    "FP32_OP_TYPES",
    "FP32_REDUCTIONS",
    "INPUT_DTYPE_NORMS",
    "DTYPE_SIZE",
    "autocast_applies",
    "compute_dtype",
    "stored_dtypes",
    "operand_dtypes",
    "saved_dtype",
]

BF16, FP32 = "bf16", "fp32"

DTYPE_SIZE: Mapping[str, int] = {BF16: 2, FP32: 4}
"""Bytes per element of each stored dtype."""

BF16_KINDS = frozenset({"matmul", "conv", "rnn"})
"""Families autocast casts to bf16 (its "lower precision" list: conv, linear, matmul, bmm, RNN cells)."""

FP32_KINDS = frozenset({"softmax"})
"""Families autocast always runs in fp32 (``softmax``, ``log_softmax``)."""

INPUT_DTYPE_NORMS = frozenset({"BatchNormalization", "InstanceNormalization"})
"""Norms in neither autocast list (``batch_norm``, ``instance_norm``): they run in their input's
dtype. Every other norm (``layer_norm``, ``group_norm``, RMS norms built of ``pow``/``rsqrt``) is fp32."""

FP32_OP_TYPES = frozenset({
    "Pow", "Exp", "Log", "Reciprocal", "Softplus", "Cosh", "Sinh", "Tan", "Acos", "Asin", "CumSum",
})
"""Elementwise ONNX ops whose PyTorch op is on autocast's fp32 list (``pow``, ``exp``, ``log``,
``reciprocal``, ``softplus``, ``cosh``, ``sinh``, ``tan``, ``acos``, ``asin``, ``cumsum``)."""

FP32_REDUCTIONS = frozenset({
    "ReduceSum", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
})
"""Reductions on autocast's fp32 list (``sum``, ``prod``, ``norm``, ``logsumexp``); ``mean`` and
``max`` run in their input's dtype."""


def autocast_applies(settings: TrainingSettings, execution: ExecutionModel | None) -> bool:
    """True when activations follow autocast's dtypes: PyTorch eager in ``bf16-mixed`` under ``torch.autocast``
    (``TrainingSettings.autocast``; bf16 modules without it store every activation in bf16).

    >>> from objectives.execution import ExecutionModel
    >>> eager = ExecutionModel(engine="eager", attention="flash")
    >>> autocast_applies(TrainingSettings(), eager), autocast_applies(TrainingSettings(autocast=False), eager)
    (True, False)
    """
    return settings.precision == "bf16-mixed" and settings.autocast and execution is not None and execution.eager


def compute_dtype(op: Op) -> str | None:
    """The dtype autocast runs ``op`` in: ``bf16``, ``fp32``, or ``None``: its inputs' (the widest,
    parameters included; a batch norm's data input's)."""
    if op.kind in BF16_KINDS:
        return BF16
    if op.kind in FP32_KINDS:
        return FP32
    if op.kind == "norm":
        return None if op.op_type in INPUT_DTYPE_NORMS else FP32
    if op.kind == "elementwise" and (op.op_type in FP32_OP_TYPES or op.op_type == "Cast"):
        return FP32  # an explicit cast to a float in an fp32 export is ``.float()``
    if op.kind == "reduce" and op.op_type in FP32_REDUCTIONS:
        return FP32
    return None


def _widest(dtypes) -> str:
    # a float made of no float input (arange, a mask from indices) is torch's default dtype, fp32
    return FP32 if FP32 in dtypes or not dtypes else BF16


def stored_dtypes(
    graph: OpGraph, *, settings: TrainingSettings, execution: ExecutionModel | None
) -> dict[str, str]:
    """Float tensor name -> the dtype it is stored in (``bf16`` or ``fp32``), module docstring.

    Without autocast every float tensor is at the training precision.
    """
    tensors = graph.tensors
    floats = {name for name, t in tensors.items() if is_float(t)}
    if not autocast_applies(settings, execution):
        dtype = BF16 if settings.precision == "bf16-mixed" else FP32
        return {name: dtype for name in floats}
    stored: dict[str, str] = {}
    for name in floats:
        tensor = tensors[name]
        if tensor.role == "parameter":
            stored[name] = FP32  # autocast keeps fp32 parameters (casts of them are cached, not stored)
        elif tensor.producer is None:
            stored[name] = BF16 if tensor.dtype in ("bfloat16", "float16") else FP32
    for op in graph.ops:
        fixed = compute_dtype(op)
        if op.kind == "norm" and fixed is None:
            data = [stored[a.tensor] for a in op.inputs[:1] if a.tensor in stored]
            out = data[0] if data else BF16
        elif fixed is not None:
            out = fixed
        else:
            out = _widest([stored[a.tensor] for a in op.inputs if a.tensor in stored])
        for access in op.outputs:
            if access.tensor in floats:
                stored[access.tensor] = out
    for name in floats:
        stored.setdefault(name, FP32)
    return stored


def operand_dtypes(
    op: Op, stored: Mapping[str, str]
) -> tuple[tuple[str | None, ...], tuple[str | None, ...]]:
    """The stored dtype of each of ``op``'s inputs and outputs (``None``: not a float tensor)."""
    return (
        tuple(stored.get(a.tensor) for a in op.inputs),
        tuple(stored.get(a.tensor) for a in op.outputs),
    )


def saved_dtype(op: Op, stored: str, *, autocast: bool) -> str:
    """The dtype ``op`` saves an input stored as ``stored`` in: its compute dtype under autocast
    for the fixed-dtype families (a copy when it differs), else the stored tensor's own.

    Examples
    --------
    >>> from planner.core.graph import Op
    >>> linear = Op(name="q", kind="matmul", op_type="MatMul", dims=(), inputs=(), outputs=(), flops=0.0)
    >>> saved_dtype(linear, "fp32", autocast=True), saved_dtype(linear, "fp32", autocast=False)
    ('bf16', 'fp32')
    """
    if not autocast:
        return stored
    fixed = compute_dtype(op)
    return stored if fixed is None else fixed
