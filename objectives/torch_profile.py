r"""Per-device op shards as PyTorch calls, timed forward and backward (``planner profile --provider torch-*``).

:mod:`objectives.profile` times shards with onnxruntime, which runs the ONNX node as written; on a
GPU the kernels a training run uses are PyTorch's (cuBLAS GEMMs, fused norm and softmax kernels,
autograd's backward). This module maps an op's per-device shard to the PyTorch call that stands for
it (:func:`torch_call`, no torch needed) and times that call's forward and backward on the local
device (:func:`measure_call`, torch imported there only).

Mapping an op to PyTorch
------------------------
Only ``Op.kind``, ``Op.op_type``, the iteration dims and the tensor accesses are used (never names):

* ``matmul``: the first two inputs whose accesses hold a ``reduction`` dim are ``A`` and ``B``;
  reduction dims are ``K``, other dims in both are batch, in ``A`` only ``M``, in ``B`` only ``N``.
  The shard is ``A[Bt, M, K] @ B[Bt, K, N]`` (no ``Bt``: a plain GEMM, ``addmm`` when the op reads a
  1-D bias on ``N``). FLOPs: ``2 Bt M N K`` (+ ``Bt M N`` for the bias), :attr:`TorchCall.flops`.
* ``elementwise``: ``Add/Sub/Mul/Div/Pow/Max/Min`` on the first two inputs (a scalar second operand
  when the op lists one tensor), unary ``Relu/Gelu/Sigmoid/Tanh/Erf/Exp/Log/Neg/Sqrt/Abs/...``.
  A GELU runs in the form its node computes (:func:`planner.core.gelu.gelu_form`, read from ``Op.node``):
  ``F.gelu(x)`` (erf: ``Gelu``, ``approximate="none"``; onnxruntime's ``BiasGelu``) or
  ``F.gelu(x, approximate="tanh")`` (``approximate="tanh"``; onnxruntime's ``FastGelu``), after adding
  the node's bias input (``BiasGelu``'s ``B``, ``FastGelu``'s optional ``bias``); onnxruntime's
  ``QuickGelu`` runs as ``x * sigmoid(alpha * x)`` with the node's ``alpha``. An op without its node
  (built by hand) is taken for erf GELU, the ONNX default.
* ``norm``: ``layer_norm`` over the trailing normalized axes with weight and bias when the op reads
  two parameters, ``rms_norm`` with one (a decomposed RMSNorm is imported as LayerNormalization).
* ``softmax``: ``softmax`` over the normalized axis.
* ``embedding`` (and ``gather`` of a parameter table): ``embedding(ids, table_shard)``.
* ``slice``: each output as a contiguous copy of a column block of the input; ``concat``: ``cat``
  of the inputs that make up the output.

Other families (conv, pool, reduce, rnn, data movement, opaque) have no mapping: they keep the
roofline. Elementwise ops the importer fused into a coarse op are not run (as for onnxruntime).

Timing
------
Forward runs under ``torch.no_grad()``; backward is ``torch.autograd.grad`` of the forward's outputs
with respect to every float input (activations and parameters), with a random output gradient, on a
retained graph. On CUDA, CUDA events bracket each run; before it a buffer larger than any L2 cache
(256 MiB) is zeroed, so the run reads its operands from HBM as it would inside a model, and the GPU
is held by ``torch.cuda._sleep`` while the host queues the call, so the events time GPU work and not
Python's launch cost. On CPU the wall clock of each run is used. Warm-up runs come first (cuBLAS
picks its algorithm, the allocator caches the blocks); the stored time is the **median** of the
timed runs and the spread their interquartile range.

Torch is imported only by the functions that run calls: planning never needs it, and asking for a
``torch-*`` provider without it is a one-line :class:`~planner.core.errors.InputError`.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Sequence

import numpy as np
import onnx

from objectives._common import canonical_parameter, is_float
from objectives.host import cpu_device_name
from planner.core.errors import InputError
from planner.core.gelu import QUICK_GELU_ALPHA, gelu_form
from planner.core.graph import Op, OpGraph, Tensor, TensorAccess
from planner.core.layout import shard_shape

if TYPE_CHECKING:
    import torch

__all__ = [
    "BINARY_OPS",
    "UNARY_OPS",
    "GELU_OPS",
    "TORCH_DTYPES",
    "TorchCall",
    "TorchTiming",
    "torch_call",
    "tensor_view",
    "call_signature",
    "INSTALL_HINT",
    "require_torch",
    "check_device",
    "torch_device_name",
    "build_call",
    "time_runs",
    "measure_call",
]

INSTALL_HINT = (
    "`pip install torch==2.13.0` (CPU), or the CUDA build from https://pytorch.org for --provider torch-cuda"
)
"""The fix named by every error about a missing torch."""

#: dtype names accepted for timing -> ``torch`` attribute.
TORCH_DTYPES: dict[str, str] = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}

_FLUSH_BYTES = 256 * 2**20
"""Zeroed before each timed CUDA run: larger than the L2 of every current GPU (H100: 50 MB)."""

CallFn = Literal["matmul", "binary", "unary", "layer_norm", "rms_norm", "softmax", "embedding", "slice", "concat"]

BINARY_OPS: dict[str, str] = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow", "Max": "maximum", "Min": "minimum",
}
"""ONNX binary op type -> ``torch`` function name."""

UNARY_OPS: dict[str, str] = {
    "Relu": "relu", "Gelu": "gelu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp",
    "Log": "log", "Neg": "neg", "Sqrt": "sqrt", "Reciprocal": "reciprocal", "Abs": "abs",
    "Softplus": "softplus", "LeakyRelu": "leaky_relu", "Elu": "elu", "HardSigmoid": "hardsigmoid",
}
"""ONNX unary op type -> ``torch`` / ``torch.nn.functional`` function name."""

GELU_OPS: dict[str, int] = {"Gelu": 1, "QuickGelu": 1, "BiasGelu": 2, "FastGelu": 2}
"""GELU-family op type -> most inputs the call reads: the second is a bias added first (module docstring)."""

_GELU_NAMES = {"gelu-erf": "gelu", "gelu-tanh": "gelu_tanh"}
"""GELU form -> :attr:`TorchCall.name` (``"gelu"`` is the erf form's name since before forms were read)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchCall:
    """One PyTorch call standing for an op's per-device shard."""

    fn: CallFn
    shapes: tuple[tuple[int, ...], ...]
    """Input shapes: float tensors, except ``embedding``'s second (int64 ids)."""
    name: str = ""
    """``binary``/``unary``: the torch function (``gelu_tanh``: ``F.gelu(x, approximate="tanh")``,
    ``quick_gelu``: ``x * sigmoid(alpha * x)``); ``matmul``: ``"bias"`` when a bias is added. A ``unary``
    call with two shapes adds the second (a bias) to the first before the function."""
    dim: int = -1
    """``softmax``/``concat``: the axis; ``layer_norm``/``rms_norm``: first normalized axis."""
    widths: tuple[int, ...] = ()
    """``slice``: column width of each output in the input viewed as ``[-1, shape[-1]]``."""
    alpha: float | None = None
    """``quick_gelu``: the scale inside the sigmoid (dimensionless); ``None`` for every other call."""

    @property
    def key(self) -> tuple:
        """Everything that decides what the call runs: equal keys, equal timings (``alpha`` only where
        set, so the keys, and the stored timings, of calls without one are those of before it)."""
        base = (self.fn, self.shapes, self.name, self.dim, self.widths)
        return base if self.alpha is None else (*base, self.alpha)

    @property
    def flops(self) -> float:
        """Forward FLOPs of the call: ``2 Bt M N K`` (+ ``Bt M N`` with a bias) for a matmul, one per
        output element for elementwise calls, 0 for the rest (norms, softmax, lookups and copies are
        priced by their bytes).

        Examples
        --------
        >>> TorchCall(fn="matmul", shapes=((3, 4, 8), (3, 8, 5))).flops  # 2 * 3 * 4 * 5 * 8
        960.0
        >>> TorchCall(fn="matmul", shapes=((4, 8), (8, 5), (5,)), name="bias").flops  # 2*4*5*8 + 4*5
        340.0
        """
        if self.fn == "matmul":
            a, b = self.shapes[0], self.shapes[1]
            batch = a[0] if len(a) == 3 else 1
            m, k, n = a[-2], a[-1], b[-1]
            return float(2 * batch * m * n * k + (batch * m * n if self.name == "bias" else 0))
        if self.fn in ("binary", "unary"):
            return float(_numel(np.broadcast_shapes(*self.shapes)))
        return 0.0

    @property
    def elements(self) -> int:
        """Input elements (the ids included): sizes the memory one run needs."""
        return sum(_numel(s) for s in self.shapes)

    def describe(self) -> str:
        """Readable form, e.g. ``matmul[8192,768]x[768,2304]+bias``.

        Examples
        --------
        >>> TorchCall(fn="matmul", shapes=((4, 8), (8, 16)), name="bias").describe()
        'matmul[4,8]x[8,16]+bias'
        >>> TorchCall(fn="softmax", shapes=((2, 3),), dim=1).describe()
        'softmax[2,3] dim=1'
        """
        shapes = "x".join("[" + ",".join(map(str, s)) + "]" for s in self.shapes)
        if self.fn == "matmul":
            return f"matmul{shapes}" + ("+bias" if self.name == "bias" else "")
        label = self.name or self.fn
        extra = f" dim={self.dim}" if self.fn in ("softmax", "concat", "layer_norm", "rms_norm") else ""
        extra += f" widths={list(self.widths)}" if self.widths else ""
        extra += f" alpha={self.alpha:g}" if self.alpha is not None else ""
        return f"{label}{shapes}{extra}"


# --------------------------------------------------------------------------------------------------
# Op + configuration -> PyTorch call (pure: no torch).


def _dims_of(access: TensorAccess) -> list[str]:
    return [d for axis in access.axes for d in axis]


def _shard(tensors: Mapping[str, Tensor], access: TensorAccess, factors: Mapping[str, int]) -> tuple[int, ...] | None:
    tensor = tensors.get(access.tensor)
    if tensor is None:
        return None
    return shard_shape(tensor.shape, access, factors)


def _numel(shape: Sequence[int]) -> int:
    return int(math.prod(shape))


def _matmul_call(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor]) -> TorchCall | str:
    reduction = {d.name for d in op.dims if d.kind == "reduction"}
    operands = [a for a in op.inputs if reduction & set(_dims_of(a))]
    if len(operands) < 2:
        return "matmul without two operands holding the reduction dim"
    a_dims, b_dims = set(_dims_of(operands[0])), set(_dims_of(operands[1]))
    size = {d.name: -(-d.size // factors.get(d.name, 1)) for d in op.dims}
    groups: dict[str, int] = {"batch": 1, "m": 1, "n": 1, "k": 1}
    for d in op.dims:
        if d.name in reduction:
            if d.name not in a_dims or d.name not in b_dims:
                return f"reduction dim {d.name} not in both operands"
            group = "k"
        elif d.name in a_dims and d.name in b_dims:
            group = "batch"
        elif d.name in a_dims:
            group = "m"
        elif d.name in b_dims:
            group = "n"
        else:
            continue  # a dim only a fused operand uses (a broadcast mask): not part of the GEMM
        groups[group] *= size[d.name]
    bt, m, n, k = groups["batch"], groups["m"], groups["n"], groups["k"]
    lead = (bt,) if bt > 1 else ()
    shapes: list[tuple[int, ...]] = [(*lead, m, k), (*lead, k, n)]
    bias = any(
        len(a.axes) == 1 and set(_dims_of(a)) and set(_dims_of(a)) <= (b_dims - a_dims - reduction)
        for a in op.inputs
        if a not in operands[:2] and (t := tensors.get(a.tensor)) is not None and t.role == "parameter"
    )
    if bias:
        shapes.append((n,))
    return TorchCall(fn="matmul", shapes=tuple(shapes), name="bias" if bias else "")


def _fit(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, ...] | None:
    """An input shard as the elementwise kernel sees it: the output's shape, or a broadcast shape."""
    if _numel(shape) == _numel(out):
        return out
    try:
        if np.broadcast_shapes(shape, out) == out:
            return shape
    except ValueError:
        pass
    return None


def _elementwise_call(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor]) -> TorchCall | str:
    if not op.outputs:
        return "no output"
    out = _shard(tensors, op.outputs[0], factors)
    if out is None:
        return "unknown output shape"
    shapes = []
    for access in op.inputs:
        shape = _shard(tensors, access, factors)
        tensor = tensors.get(access.tensor)
        if shape is None or tensor is None or not is_float(tensor):
            continue
        fitted = _fit(shape, out)
        if fitted is None:
            return f"input {access.tensor} of shard shape {list(shape)} does not broadcast to {list(out)}"
        shapes.append(fitted)
    if op.op_type in GELU_OPS and shapes:
        return _gelu_call(op, shapes)
    if op.op_type in BINARY_OPS and shapes:
        return TorchCall(fn="binary", shapes=tuple(shapes[:2]), name=BINARY_OPS[op.op_type])
    if op.op_type in UNARY_OPS and shapes:
        return TorchCall(fn="unary", shapes=(shapes[0],), name=UNARY_OPS[op.op_type])
    return f"elementwise op type {op.op_type} has no torch mapping"


def _node_attributes(op: Op) -> dict[str, onnx.AttributeProto]:
    """The attributes of the op's main node by name (none when the op keeps no node)."""
    parsed = (onnx.AttributeProto.FromString(raw) for raw in (op.node.attributes if op.node else ()))
    return {a.name: a for a in parsed}


def _gelu_call(op: Op, shapes: list[tuple[int, ...]]) -> TorchCall:
    """A GELU-family op's call in its node's form, its bias (a second float input) added first."""
    attributes = _node_attributes(op)
    node_inputs = sum(1 for s in op.node.input_shapes if s) if op.node else GELU_OPS[op.op_type]
    own = tuple(shapes[: min(GELU_OPS[op.op_type], max(node_inputs, 1))])  # not a fused op's operands
    if op.op_type == "QuickGelu":
        alpha = attributes["alpha"].f if "alpha" in attributes else QUICK_GELU_ALPHA
        # as a float32 attribute holds it, so a node writing the default shares its timings
        return TorchCall(fn="unary", shapes=own[:1], name="quick_gelu", alpha=float(np.float32(alpha)))
    approximate = attributes["approximate"].s.decode(errors="replace") if "approximate" in attributes else "none"
    form = gelu_form(op.node.domain if op.node else "", op.op_type, approximate) or "gelu-erf"
    return TorchCall(fn="unary", shapes=own, name=_GELU_NAMES[form])


def _normalized_axes(op: Op, access: TensorAccess) -> list[int]:
    normalized = {d.name for d in op.dims if d.kind == "normalized"}
    return [i for i, axis in enumerate(access.axes) if normalized & set(axis)]


def _norm_call(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor]) -> TorchCall | str:
    if not op.outputs or not op.inputs:
        return "no input or output"
    out = _shard(tensors, op.outputs[0], factors)
    axes = _normalized_axes(op, op.outputs[0])
    if out is None or not axes:
        return "no normalized axis in the output"
    first = axes[0]
    if axes != list(range(first, len(out))):
        return "normalized axes are not the trailing axes"
    params = [a for a in op.inputs if (t := tensors.get(a.tensor)) is not None and t.role == "parameter"]
    width = _numel(out[first:])
    if any(_numel(_shard(tensors, p, factors) or ()) != width for p in params):
        return "norm parameters do not match the normalized shape"
    fn: CallFn = "layer_norm" if len(params) >= 2 else "rms_norm"
    shapes = (out,) + tuple(out[first:] for _ in params[:2])
    return TorchCall(fn=fn, shapes=shapes, dim=first)


def _softmax_call(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor]) -> TorchCall | str:
    if not op.outputs:
        return "no output"
    out = _shard(tensors, op.outputs[0], factors)
    axes = _normalized_axes(op, op.outputs[0])
    if out is None or len(axes) != 1:
        return "softmax needs exactly one normalized axis"
    return TorchCall(fn="softmax", shapes=(out,), dim=axes[0])


def _embedding_call(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor]) -> TorchCall | str:
    tables = [a for a in op.inputs if (t := tensors.get(a.tensor)) is not None and t.role == "parameter"]
    if not tables or not op.outputs:
        return "lookup without a parameter table"
    table = _shard(tensors, tables[0], factors)
    out = _shard(tensors, op.outputs[0], factors)
    if table is None or out is None or len(table) != 2:
        return "lookup table is not 2-D"
    ids = next(
        (
            _shard(tensors, a, factors)
            for a in op.inputs
            if (t := tensors.get(a.tensor)) is not None and t.dtype.startswith(("int", "uint"))
        ),
        None,
    )
    if ids is None:  # constant indices (position ids) are left out of Op.inputs: one per output row
        ids = (_numel(out) // max(table[1], 1),)
    if _numel(ids) * table[1] != _numel(out):
        return "lookup output is not rows x table width"
    return TorchCall(fn="embedding", shapes=(table, ids))


def _slice_call(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor]) -> TorchCall | str:
    if not op.inputs or not op.outputs:
        return "no input or output"
    source = _shard(tensors, op.inputs[0], factors)
    if source is None or not source:
        return "unknown input shape"
    last, total = source[-1], _numel(source)
    widths = []
    for access in op.outputs:
        out = _shard(tensors, access, factors)
        if out is None:
            return "unknown output shape"
        width, rest = divmod(_numel(out) * last, total)
        if rest or width < 1:
            return "output is not a column block of the input"
        widths.append(width)
    if sum(widths) > last:
        return "outputs exceed the input"
    return TorchCall(fn="slice", shapes=(source,), widths=tuple(widths))


def _concat_call(op: Op, factors: Mapping[str, int], tensors: Mapping[str, Tensor]) -> TorchCall | str:
    if not op.outputs:
        return "no output"
    out = _shard(tensors, op.outputs[0], factors)
    if out is None:
        return "unknown output shape"
    parts: list[tuple[int, ...]] = []
    for access in op.inputs:  # the concatenated inputs come first; fused operands follow
        shape = _shard(tensors, access, factors)
        if shape is None or len(shape) != len(out):
            return "concat input of another rank"
        parts.append(shape)
        if sum(_numel(p) for p in parts) >= _numel(out):
            break
    if sum(_numel(p) for p in parts) != _numel(out):
        return "inputs do not add up to the output"
    differ = {i for p in parts for i, (a, b) in enumerate(zip(p, out)) if a != b}
    if len(differ) > 1:
        return "inputs differ from the output on several axes"
    return TorchCall(fn="concat", shapes=tuple(parts), dim=differ.pop() if differ else len(out) - 1)


_MAPPERS: dict[str, Callable[[Op, Mapping[str, int], Mapping[str, Tensor]], "TorchCall | str"]] = {
    "matmul": _matmul_call,
    "elementwise": _elementwise_call,
    "norm": _norm_call,
    "softmax": _softmax_call,
    "embedding": _embedding_call,
    "gather": _embedding_call,
    "slice": _slice_call,
    "concat": _concat_call,
}


def torch_call(op: Op, factors: Mapping[str, int], *, tensors: Mapping[str, Tensor]) -> TorchCall | str:
    """The PyTorch call for ``op``'s per-device shard under ``factors``, or why there is none.

    Parameters
    ----------
    op:
        The op.
    factors:
        ``{dim: split factor}`` (missing dims: 1).
    tensors:
        The graph's tensors (tied parameters resolved).

    Returns
    -------
    TorchCall or str
        The call, or a one-line reason it cannot be mapped.

    Examples
    --------
    >>> from planner.core.graph import IterDim
    >>> t = {"x": Tensor(name="x", shape=(8, 6), dtype="float32", role="activation"),
    ...      "w": Tensor(name="w", shape=(6, 4), dtype="float32", role="parameter"),
    ...      "y": Tensor(name="y", shape=(8, 4), dtype="float32", role="activation")}
    >>> mm = Op(name="mm", kind="matmul", op_type="MatMul", flops=2.0 * 8 * 6 * 4,
    ...         dims=(IterDim(name="m", size=8), IterDim(name="n", size=4),
    ...               IterDim(name="k", size=6, kind="reduction")),
    ...         inputs=(TensorAccess(tensor="x", axes=(("m",), ("k",))),
    ...                 TensorAccess(tensor="w", axes=(("k",), ("n",)))),
    ...         outputs=(TensorAccess(tensor="y", axes=(("m",), ("n",))),))
    >>> torch_call(mm, {"n": 2}, tensors=t).describe()
    'matmul[8,6]x[6,2]'
    """
    mapper = _MAPPERS.get(op.kind)
    if mapper is None:
        return f"family {op.kind} has no torch mapping"
    return mapper(op, factors, tensors)




def tensor_view(graph: OpGraph) -> dict[str, Tensor]:
    """The graph's tensors, tied-parameter aliases resolved to their canonical tensor."""
    tensors = dict(graph.tensors)
    for alias in graph.parameter_aliases:
        if alias not in tensors:
            canonical = graph.tensors.get(canonical_parameter(graph, alias))
            if canonical is not None:
                tensors[alias] = canonical
    return tensors


def call_signature(call: TorchCall, dtype: str) -> str:
    """The profile database key of ``call`` run in ``dtype``: equal calls share one timing.

    Examples
    --------
    >>> a = TorchCall(fn="softmax", shapes=((2, 3),), dim=1)
    >>> call_signature(a, "float32") == call_signature(TorchCall(fn="softmax", shapes=((2, 3),), dim=1), "float32")
    True
    >>> call_signature(a, "float32") == call_signature(a, "bfloat16")
    False
    >>> call_signature(a, "float32").startswith("torch:")
    True
    """
    return "torch:" + hashlib.sha256(repr((call.key, dtype)).encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------------
# Running and timing a call (torch imported here only).


def require_torch():  # noqa: ANN201 (the torch module, which may not be installed)
    """The ``torch`` module; :class:`InputError` naming the install command when it is missing."""
    try:
        import torch
    except ImportError:
        raise InputError(f"PyTorch is not installed; {INSTALL_HINT}") from None
    return torch


def check_device(device: str) -> None:
    """:class:`InputError` when ``device`` (``"cpu"`` or ``"cuda"``) cannot run torch here."""
    torch = require_torch()
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError(
            f"torch {torch.__version__} sees no CUDA GPU here; use --provider torch-cpu, or install the CUDA "
            "build from https://pytorch.org on a machine with a GPU"
        )
    if device not in ("cpu", "cuda"):
        raise InputError(f"unknown torch device '{device}'; use cpu or cuda")


def torch_device_name(device: str) -> str:
    """The name of the hardware torch runs on: the GPU's (``torch.cuda.get_device_name``) or the CPU's."""
    if device == "cuda":
        return str(require_torch().cuda.get_device_name())
    return cpu_device_name()


_Leaves = list  # of torch.Tensor
_Run = Callable[[], tuple]


def _run_matmul(call: TorchCall, leaves: _Leaves, F) -> _Run:  # noqa: ANN001, N803 (torch.nn.functional)
    import torch

    a, b = leaves[0], leaves[1]
    if len(leaves) > 2 and a.dim() == 2:  # nn.Linear's path: the bias in cuBLAS's epilogue
        bias = leaves[2]
        return lambda: (torch.addmm(bias, a, b),)
    if len(leaves) > 2:
        bias = leaves[2]
        return lambda: (torch.matmul(a, b) + bias,)
    return lambda: (torch.matmul(a, b),)


def _run_binary(call: TorchCall, leaves: _Leaves, F) -> _Run:  # noqa: ANN001, N803
    import torch

    fn = getattr(torch, call.name)
    if len(leaves) == 2:
        return lambda: (fn(leaves[0], leaves[1]),)
    return lambda: (fn(leaves[0], 0.5),)  # the other operand is a constant: a scalar


def _run_unary(call: TorchCall, leaves: _Leaves, F) -> _Run:  # noqa: ANN001, N803
    import torch

    if call.name == "gelu_tanh":
        fn = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
    elif call.name == "quick_gelu":
        alpha = call.alpha if call.alpha is not None else QUICK_GELU_ALPHA
        fn = lambda x: x * torch.sigmoid(alpha * x)  # noqa: E731
    else:
        fn = getattr(F, call.name, None) or getattr(torch, call.name)
    if len(leaves) > 1:  # a bias added first (BiasGelu, FastGelu with its bias)
        return lambda: (fn(leaves[0] + leaves[1]),)
    return lambda: (fn(leaves[0]),)


def _run_softmax(call: TorchCall, leaves: _Leaves, F) -> _Run:  # noqa: ANN001, N803
    return lambda: (F.softmax(leaves[0], dim=call.dim),)


def _run_layer_norm(call: TorchCall, leaves: _Leaves, F) -> _Run:  # noqa: ANN001, N803
    shape = call.shapes[0][call.dim :]
    weight, bias = (leaves[1], leaves[2]) if len(leaves) > 2 else (None, None)
    return lambda: (F.layer_norm(leaves[0], shape, weight, bias),)


def _run_rms_norm(call: TorchCall, leaves: _Leaves, F) -> _Run:  # noqa: ANN001, N803
    shape = call.shapes[0][call.dim :]
    weight = leaves[1] if len(leaves) > 1 else None
    return lambda: (F.rms_norm(leaves[0], shape, weight, eps=1e-6),)


def _run_slice(call: TorchCall, leaves: _Leaves, F) -> _Run:  # noqa: ANN001, N803
    source, last = leaves[0], call.shapes[0][-1]
    offsets = np.concatenate([[0], np.cumsum(call.widths)]).astype(int).tolist()

    def run() -> tuple:
        flat = source.view(-1, last)
        return tuple(flat[:, lo:hi].contiguous() for lo, hi in zip(offsets, offsets[1:]))

    return run


def _run_concat(call: TorchCall, leaves: _Leaves, F) -> _Run:  # noqa: ANN001, N803
    import torch

    return lambda: (torch.cat(leaves, dim=call.dim),)


#: Call kind -> builder of the closure that runs it on its leaf tensors (embedding: see build_call).
_RUNNERS: dict[str, Callable[[TorchCall, _Leaves, object], _Run]] = {
    "matmul": _run_matmul,
    "binary": _run_binary,
    "unary": _run_unary,
    "softmax": _run_softmax,
    "layer_norm": _run_layer_norm,
    "rms_norm": _run_rms_norm,
    "slice": _run_slice,
    "concat": _run_concat,
}


def build_call(call: TorchCall, device: str, dtype: str = "bfloat16") -> tuple[_Run, _Run]:
    """``(forward, backward)`` closures running ``call`` on ``device`` with random ``dtype`` inputs.

    ``forward`` runs under ``torch.no_grad()``; ``backward`` is ``torch.autograd.grad`` of one
    retained forward's outputs with respect to every float input, with a random output gradient.

    Raises
    ------
    InputError
        torch is missing, or ``dtype`` is not one of :data:`TORCH_DTYPES`.
    """
    torch = require_torch()
    import torch.nn.functional as F  # noqa: N812

    if dtype not in TORCH_DTYPES:
        raise InputError(f"cannot time torch calls in '{dtype}'; use one of: {', '.join(TORCH_DTYPES)}")
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])

    def leaf(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, device=device, dtype=torch_dtype).requires_grad_(True)

    if call.fn == "embedding":
        table = leaf(call.shapes[0])
        ids = torch.randint(0, call.shapes[0][0], call.shapes[1], device=device)
        leaves = [table]  # the ids are integers: no gradient

        def run() -> tuple:
            return (F.embedding(ids, table),)
    else:
        leaves = [leaf(s) for s in call.shapes]
        run = _RUNNERS[call.fn](call, leaves, F)

    def forward() -> tuple:
        with torch.no_grad():
            return run()

    with torch.enable_grad():
        outputs = run()
    grads = tuple(torch.randn_like(o) for o in outputs)

    def backward() -> tuple:
        return torch.autograd.grad(outputs, leaves, grads, retain_graph=True)

    return forward, backward


_FLUSH: dict[str, object] = {}
"""Device -> the buffer zeroed before each timed CUDA run (allocated once)."""


def _flush_buffer(device: str):  # noqa: ANN202 (a torch.Tensor)
    torch = require_torch()
    if device not in _FLUSH:
        _FLUSH[device] = torch.empty(_FLUSH_BYTES // 2, dtype=torch.float16, device=device)
    return _FLUSH[device]


def time_runs(
    fn: Callable[[], object],
    *,
    device: str,
    warmup: int,
    repeats: int,
    flush: bool = True,
    time_budget_s: float | None = None,
) -> list[float]:
    """Seconds of each of up to ``repeats`` timed runs of ``fn`` after ``warmup`` runs.

    Parameters
    ----------
    fn:
        The call to time.
    device:
        ``"cuda"``: CUDA events around each run, preceded by an L2 flush (``flush``) and a GPU sleep
        that covers the host's queueing; ``"cpu"``: wall clock (``time.perf_counter``) per run.
    warmup:
        Untimed runs first (at least one is made, to size the budget).
    repeats:
        Timed runs at most.
    flush:
        Zero a 256 MiB buffer before each CUDA run, so operands come from HBM, not L2.
    time_budget_s:
        Rough time allowed for the timed runs (seconds): a slow call gets fewer (at least one).

    Returns
    -------
    list[float]
        Seconds per timed run.
    """
    torch = require_torch()
    cuda = device != "cpu"

    def wall(call: Callable[[], object]) -> float:
        start = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    first = wall(fn)
    for _ in range(max(warmup - 1, 0)):
        first = min(first, wall(fn))
    if time_budget_s is not None:
        repeats = max(1, min(repeats, int(time_budget_s / max(first, 1e-9))))
    if not cuda:
        return [wall(fn) for _ in range(repeats)]
    buffer = _flush_buffer(device) if flush else None
    sleep = getattr(torch.cuda, "_sleep", None)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    torch.cuda.synchronize()
    for start, end in events:
        if buffer is not None:
            buffer.zero_()
        if sleep is not None:
            sleep(1_000_000)  # about 0.5 ms of GPU clock: longer than queueing one autograd call
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e-3 for start, end in events]


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchTiming:
    """Timed runs of one call."""

    forward_s: tuple[float, ...]
    """Seconds of each timed forward run."""
    backward_s: tuple[float, ...]
    """Seconds of each timed backward run (empty when the call has no float input)."""
    method: Literal["cuda-events", "wall"]


def measure_call(
    call: TorchCall,
    *,
    device: str,
    dtype: str,
    repeats: int = 10,
    warmup: int = 2,
    flush: bool = True,
    time_budget_s: float | None = 2.0,
) -> TorchTiming | str:
    """Time ``call``'s forward and backward on ``device`` (see the module docstring).

    Returns
    -------
    TorchTiming | str
        The timed runs, or a one-line reason the call could not run (out of memory, a kernel
        missing for the dtype on this device).
    """
    torch = require_torch()
    budget = None if time_budget_s is None else time_budget_s / 2  # half for each pass
    try:
        forward, backward = build_call(call, device, dtype)
        timing = dict(device=device, warmup=max(warmup, 1), repeats=repeats, flush=flush, time_budget_s=budget)
        fwd = time_runs(forward, **timing)
        bwd = time_runs(backward, **timing)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:  # OOM is a RuntimeError
        if device != "cpu":
            torch.cuda.empty_cache()
        text = str(error).strip().splitlines()
        return f"torch failed to run it: {type(error).__name__}: {(text[0] if text else '')[:200]}"
    return TorchTiming(forward_s=tuple(fwd), backward_s=tuple(bwd), method="cuda-events" if device != "cpu" else "wall")
