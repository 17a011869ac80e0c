r"""Measured (PyTorch, bf16) vs roofline forward and backward time per op family, on a GPU.

``bench/cost_model.py`` compares the roofline with onnxruntime on the host CPU. This benchmark asks
the same question of a GPU, where the planner's plans run: for every op of a model and every
distinct per-device shard under a few configurations, it times the equivalent PyTorch call in
bf16, forward and backward (autograd), and divides by the roofline of
:func:`objectives.compute.op_compute_time_s` for a device preset (``h100-sxm`` by default) under
``bf16-mixed``.

Mapping an op to PyTorch (:func:`torch_call`, no torch needed)
-------------------------------------------------------------
Only ``Op.kind``, ``Op.op_type``, the iteration dims and the tensor accesses are used (never names):

* ``matmul``: the first two inputs whose accesses hold a ``reduction`` dim are ``A`` and ``B``;
  reduction dims are ``K``, other dims in both are batch, in ``A`` only ``M``, in ``B`` only ``N``.
  The shard is ``A[Bt, M, K] @ B[Bt, K, N]`` (no ``Bt``: a plain GEMM), plus a 1-D bias on ``N``
  when the op reads one. FLOPs equal ``2 Bt M N K``, the op's own count without fused ops.
* ``elementwise``: ``Add/Sub/Mul/Div/Pow/Max/Min`` on the first two inputs (a scalar second operand
  when the op lists one tensor), unary ``Relu/Gelu/Sigmoid/Tanh/Erf/Exp/Log/Neg/Sqrt/Abs/...``.
* ``norm``: ``layer_norm`` over the trailing normalized axes with weight and bias when the op reads
  two parameters, ``rms_norm`` with one (a decomposed RMSNorm is imported as LayerNormalization).
* ``softmax``: ``softmax`` over the normalized axis.
* ``embedding`` (and ``gather`` of a parameter table): ``embedding(ids, table_shard)``.
* ``slice``: each output as a contiguous copy of a column block of the input; ``concat``: ``cat``
  of the inputs that make up the output.

Other families (conv, pool, reduce, rnn, data movement, opaque) are skipped and counted. Elementwise
ops the importer fused into a coarse op are not run (they are in the roofline's FLOPs and not in
the timing, as for ``planner profile``); the tables can be split by fused count (``--group-by``).

Shards come from :func:`planner.core.configs.enumerate_configs` with ``--devices`` (default 8) and
``--max-split-dims`` (default 1: the unsplit op and every single-dim split of 2, 4, 8, i.e. data-
and tensor-parallel-like splits). Each distinct (PyTorch call, roofline) counts once.

Timing (:func:`time_call`)
--------------------------
CUDA events around one call, median of ``--repeats`` (default 25) after ``--warmup`` calls. Before
each timed call a 256 MiB buffer is zeroed (L2 flushed: H100's L2 is 50 MB, and an activation is
rarely still in it when the next op runs) and the GPU is held by ``torch.cuda._sleep`` while the
host queues the call, so the event pair times GPU work only, not Python's launch cost. Backward is
``torch.autograd.grad`` of the forward's outputs with respect to every float input (activations and
parameters) with a random output gradient, on a retained graph. On ``--device cpu`` the wall clock
is used (only to test this script: the roofline device stays the GPU preset).

Usage::

    python3 bench/gpu_roofline.py --out /tmp/gpu                           # on a GPU machine
    .venv-integration/bin/python bench/gpu_roofline.py --device cpu --quick  # smoke test, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from objectives._common import canonical_parameter, is_float  # noqa: E402
from objectives.compute import (  # noqa: E402
    BACKWARD_BYTES_FACTOR,
    DEFAULT_EFFICIENCY,
    FAMILY_EFFICIENCY,
    MEMORY_BANDWIDTH_EFFICIENCY,
    compute_dtype,
    forward_bytes,
    op_compute_time_s,
    peak_flops_per_s,
)
from planner.cli import parse_dims  # noqa: E402
from planner.core.cluster import Device  # noqa: E402
from planner.core.configs import ConfigOptions, enumerate_configs  # noqa: E402
from planner.core.graph import Op, OpGraph, Tensor, TensorAccess  # noqa: E402
from planner.core.layout import shard_shape  # noqa: E402
from planner.core.settings import TrainingSettings  # noqa: E402

__all__ = [
    "BINARY_OPS",
    "UNARY_OPS",
    "TorchCall",
    "ShardRow",
    "torch_call",
    "shard_rows",
    "time_call",
    "reference_rates",
    "FamilySummary",
    "summarize",
    "markdown_table",
    "main",
]

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


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchCall:
    """One PyTorch call standing for an op's per-device shard."""

    fn: CallFn
    shapes: tuple[tuple[int, ...], ...]
    """Input shapes: float tensors, except ``embedding``'s second (int64 ids)."""
    name: str = ""
    """``binary``/``unary``: the torch function; ``matmul``: ``"bias"`` when a bias is added."""
    dim: int = -1
    """``softmax``/``concat``: the axis; ``layer_norm``/``rms_norm``: first normalized axis."""
    widths: tuple[int, ...] = ()
    """``slice``: column width of each output in the input viewed as ``[-1, shape[-1]]``."""

    @property
    def key(self) -> tuple:
        return (self.fn, self.shapes, self.name, self.dim, self.widths)

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
    if op.op_type in BINARY_OPS and shapes:
        return TorchCall(fn="binary", shapes=tuple(shapes[:2]), name=BINARY_OPS[op.op_type])
    if op.op_type in UNARY_OPS and shapes:
        return TorchCall(fn="unary", shapes=(shapes[0],), name=UNARY_OPS[op.op_type])
    return f"elementwise op type {op.op_type} has no torch mapping"


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


# --------------------------------------------------------------------------------------------------
# Shards of a model with their roofline times.


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRow:
    """One distinct (PyTorch call, roofline) shard, with its measured times once timed."""

    model: str
    op: str
    """Name of the first op that has this shard."""
    kind: str
    op_type: str
    fused_pointwise: int
    factors: dict[str, int]
    """Split dims of the first configuration that gives this shard."""
    call: str
    """:meth:`TorchCall.describe`."""
    flops: float
    """Forward FLOPs of the shard (the op's, fused ops included)."""
    bytes: float
    """Forward bytes of the shard (``objectives.compute.forward_bytes``)."""
    roofline_forward_s: float
    roofline_backward_s: float
    compute_bound: bool
    """The roofline's forward FLOP term is at least its bytes term (and the op has FLOPs)."""
    backward_flops_factor: float
    configs: int = 1
    """(op, configuration) pairs of the model with this shard."""
    measured_forward_s: float = float("nan")
    measured_backward_s: float = float("nan")

    @property
    def forward_ratio(self) -> float:
        return self.measured_forward_s / self.roofline_forward_s if self.roofline_forward_s > 0 else float("nan")

    @property
    def backward_ratio(self) -> float:
        return self.measured_backward_s / self.roofline_backward_s if self.roofline_backward_s > 0 else float("nan")


def _tensor_view(graph: OpGraph) -> dict[str, Tensor]:
    tensors = dict(graph.tensors)
    for alias in graph.parameter_aliases:
        if alias not in tensors:
            canonical = graph.tensors.get(canonical_parameter(graph, alias))
            if canonical is not None:
                tensors[alias] = canonical
    return tensors


def shard_rows(
    graph: OpGraph,
    options: ConfigOptions,
    *,
    device: Device,
    settings: TrainingSettings,
) -> tuple[list[tuple[ShardRow, TorchCall]], dict[str, int]]:
    """Every distinct mappable shard of ``graph`` under ``options``' configurations, with rooflines.

    Returns
    -------
    (rows, skipped)
        One ``(ShardRow, TorchCall)`` per distinct (call, roofline forward, roofline backward); and
        per op kind the (op, configuration) pairs that could not be mapped (skipped).
    """
    tensors = _tensor_view(graph)
    peak = peak_flops_per_s(device, compute_dtype(settings))
    found: dict[tuple, tuple[ShardRow, TorchCall]] = {}
    skipped: dict[str, int] = {}
    for op in graph.ops:
        space = enumerate_configs(op, options)
        times = op_compute_time_s(op, space, tensors=tensors, device=device, settings=settings)
        num_bytes = forward_bytes(op, space, tensors=tensors, settings=settings)
        flops = op.flops / space.devices_used.astype(np.float64)
        flop_s = flops / (peak * FAMILY_EFFICIENCY.get(op.kind, DEFAULT_EFFICIENCY))
        for row in range(space.size):
            factors = {n: int(f) for n, f in zip(space.dim_names, space.factors[row])}
            call = torch_call(op, factors, tensors=tensors)
            if isinstance(call, str):
                skipped[op.kind] = skipped.get(op.kind, 0) + 1
                continue
            forward, backward = float(times.forward_s[row]), float(times.backward_s[row])
            key = (op.kind, call.key, forward, backward)
            if key in found:
                shard, _ = found[key]
                found[key] = (_replace(shard, configs=shard.configs + 1), call)
                continue
            found[key] = (
                ShardRow(
                    model=graph.name,
                    op=op.name,
                    kind=op.kind,
                    op_type=op.op_type,
                    fused_pointwise=op.fused_pointwise,
                    factors={n: f for n, f in factors.items() if f > 1},
                    call=call.describe(),
                    flops=float(flops[row]),
                    bytes=float(num_bytes[row]),
                    roofline_forward_s=forward,
                    roofline_backward_s=backward,
                    compute_bound=bool(op.flops > 0 and flop_s[row] >= forward),
                    backward_flops_factor=op.backward_flops_factor,
                ),
                call,
            )
    return list(found.values()), skipped


def _replace(row: ShardRow, **changes) -> ShardRow:
    from dataclasses import replace

    return replace(row, **changes)


# --------------------------------------------------------------------------------------------------
# Running and timing a call (torch imported here only).


def _build(call: TorchCall, device: str):
    """``(forward, backward)`` closures for one call on ``device`` in bf16."""
    import torch
    import torch.nn.functional as F

    dtype = torch.bfloat16

    def leaf(shape: tuple[int, ...]) -> "torch.Tensor":
        return torch.randn(shape, device=device, dtype=dtype).requires_grad_(True)

    if call.fn == "embedding":
        table = leaf(call.shapes[0])
        ids = torch.randint(0, call.shapes[0][0], call.shapes[1], device=device)
        leaves = [table]
        run = lambda: (F.embedding(ids, table),)  # noqa: E731
    else:
        leaves = [leaf(s) for s in call.shapes]
        if call.fn == "matmul":
            a, b = leaves[0], leaves[1]
            if len(leaves) > 2 and a.dim() == 2:  # nn.Linear's path: bias in cuBLAS's epilogue
                bias = leaves[2]
                run = lambda: (torch.addmm(bias, a, b),)  # noqa: E731
            elif len(leaves) > 2:
                bias = leaves[2]
                run = lambda: (torch.matmul(a, b) + bias,)  # noqa: E731
            else:
                run = lambda: (torch.matmul(a, b),)  # noqa: E731
        elif call.fn == "binary":
            fn = getattr(torch, call.name)
            if len(leaves) == 2:
                run = lambda: (fn(leaves[0], leaves[1]),)  # noqa: E731
            else:  # the other operand is a constant: a scalar
                run = lambda: (fn(leaves[0], 0.5),)  # noqa: E731
        elif call.fn == "unary":
            fn = getattr(F, call.name, None) or getattr(torch, call.name)
            run = lambda: (fn(leaves[0]),)  # noqa: E731
        elif call.fn == "softmax":
            run = lambda: (torch.softmax(leaves[0], dim=call.dim),)  # noqa: E731
        elif call.fn == "layer_norm":
            shape = call.shapes[0][call.dim :]
            weight, bias = (leaves[1], leaves[2]) if len(leaves) > 2 else (None, None)
            run = lambda: (F.layer_norm(leaves[0], shape, weight, bias),)  # noqa: E731
        elif call.fn == "rms_norm":
            shape = call.shapes[0][call.dim :]
            weight = leaves[1] if len(leaves) > 1 else None
            run = lambda: (F.rms_norm(leaves[0], shape, weight, eps=1e-6),)  # noqa: E731
        elif call.fn == "slice":
            source = leaves[0]
            last = call.shapes[0][-1]
            offsets = np.concatenate([[0], np.cumsum(call.widths)]).tolist()

            def run():
                flat = source.view(-1, last)
                return tuple(flat[:, lo:hi].contiguous() for lo, hi in zip(offsets, offsets[1:]))
        elif call.fn == "concat":
            run = lambda: (torch.cat(leaves, dim=call.dim),)  # noqa: E731
        else:  # pragma: no cover - every CallFn is handled above
            raise ValueError(call.fn)

    def forward():
        with torch.no_grad():
            return run()

    with torch.enable_grad():
        outputs = run()
    grads = tuple(torch.randn_like(o) for o in outputs)

    def backward():
        return torch.autograd.grad(outputs, leaves, grads, retain_graph=True)

    return forward, backward


def time_call(fn: Callable[[], object], *, device: str, warmup: int, repeats: int, flush=None) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after ``warmup`` (CUDA events on a GPU).

    On CUDA each run is preceded by zeroing ``flush`` (an L2-sized buffer or more) and a GPU sleep
    long enough for the host to queue the run, so the events time GPU work only.
    """
    import torch

    for _ in range(warmup):
        fn()
    if device == "cpu":
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    sleep = getattr(torch.cuda, "_sleep", None)
    for start, end in events:
        if flush is not None:
            flush.zero_()
        if sleep is not None:
            sleep(1_000_000)  # about 0.5 ms of GPU clock: longer than queueing one autograd call
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e-3 for start, end in events)


def reference_rates(device: str, *, flush: bool = True) -> dict[str, float]:
    """What the hardware reaches on two simple kernels, with :func:`time_call`'s method.

    ``gemm_flops_per_s``: an 8192^3 bf16 matrix product (1024^3 on CPU); ``copy_bytes_per_s``: a
    1 GiB bf16 ``copy_`` (64 MiB on CPU), read + write counted. The efficiencies they imply against
    the preset are the best the roofline's ``eta`` can honestly be.
    """
    import torch

    size, elements = (8192, 2**29) if device != "cpu" else (1024, 2**25)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    src = torch.randn(elements, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    buffer = torch.empty(2**27, dtype=torch.float16, device=device) if device != "cpu" and flush else None
    gemm_s = time_call(lambda: torch.matmul(a, b), device=device, warmup=5, repeats=25, flush=buffer)
    copy_s = time_call(lambda: dst.copy_(src), device=device, warmup=5, repeats=25, flush=buffer)
    return {
        "gemm_size": size,
        "gemm_flops_per_s": 2.0 * size**3 / gemm_s,
        "copy_bytes": 2.0 * elements * 2,
        "copy_bytes_per_s": 2.0 * elements * 2 / copy_s,
    }


def _measure(
    pairs: list[tuple[ShardRow, TorchCall]], *, device: str, warmup: int, repeats: int, flush: bool, log
) -> list[ShardRow]:
    import torch

    buffer = torch.empty(2**27, dtype=torch.float16, device=device) if device != "cpu" and flush else None
    cache: dict[tuple, tuple[float, float]] = {}
    done = []
    started = time.perf_counter()
    for index, (row, call) in enumerate(pairs):
        if call.key not in cache:
            try:
                forward, backward = _build(call, device)
                fwd = time_call(forward, device=device, warmup=warmup, repeats=repeats, flush=buffer)
                bwd = time_call(backward, device=device, warmup=warmup, repeats=repeats, flush=buffer)
                del forward, backward
            except (RuntimeError, TypeError, ValueError) as error:  # report and go on
                log(f"  {call.describe()}: {type(error).__name__}: {str(error).splitlines()[0]}")
                fwd = bwd = float("nan")
            cache[call.key] = (fwd, bwd)
        fwd, bwd = cache[call.key]
        done.append(_replace(row, measured_forward_s=fwd, measured_backward_s=bwd))
        if (index + 1) % 50 == 0:
            log(f"  {index + 1}/{len(pairs)} shards, {time.perf_counter() - started:.0f} s")
    return done


# --------------------------------------------------------------------------------------------------
# Statistics.


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilySummary:
    """Measured / roofline statistics of one family (over its measured shards)."""

    family: str
    shards: int
    configs: int
    forward_median: float
    forward_min: float
    forward_max: float
    backward_median: float
    backward_min: float
    backward_max: float
    median_measured_forward_s: float
    median_roofline_forward_s: float
    compute_bound: float
    """Fraction of shards whose forward roofline is compute-bound."""
    implied_flop_efficiency: float
    """Median over compute-bound shards of forward FLOP/s / peak (``nan`` if none)."""
    implied_bandwidth_efficiency: float
    """Median over memory-bound shards of forward bytes/s / spec bandwidth (``nan`` if none)."""
    backward_over_forward: float
    """Median over shards of measured backward / measured forward."""


def _label(row: ShardRow, group_by: str) -> str:
    if group_by == "op_type":
        return row.op_type
    if group_by == "kind+fused":
        return f"{row.kind} +{row.fused_pointwise} fused" if row.fused_pointwise else row.kind
    return row.kind


def summarize(rows: Sequence[ShardRow], *, device: Device, settings: TrainingSettings, group_by: str = "kind") -> list[FamilySummary]:
    """Per family: ratio medians and ranges, forward and backward, and the efficiencies they imply.

    Examples
    --------
    >>> from objectives.cluster import get_device
    >>> r = ShardRow(model="m", op="o", kind="matmul", op_type="MatMul", fused_pointwise=0,
    ...              factors={}, call="c", flops=1e12, bytes=1.0, roofline_forward_s=1.0,
    ...              roofline_backward_s=2.0, compute_bound=True, backward_flops_factor=2.0,
    ...              measured_forward_s=2.0, measured_backward_s=3.0)
    >>> [s] = summarize([r], device=get_device("h100-sxm"), settings=TrainingSettings())
    >>> (s.shards, s.forward_median, s.backward_median, s.backward_over_forward)
    (1, 2.0, 1.5, 1.5)
    """
    peak = peak_flops_per_s(device, compute_dtype(settings))
    groups: dict[str, list[ShardRow]] = {}
    for row in rows:
        if np.isfinite(row.measured_forward_s) and row.roofline_forward_s > 0:
            groups.setdefault(_label(row, group_by), []).append(row)
    out = []
    for family in sorted(groups):
        members = groups[family]
        fwd = np.array([r.forward_ratio for r in members])
        bwd = np.array([r.backward_ratio for r in members])
        bound = [r for r in members if r.compute_bound]
        free = [r for r in members if not r.compute_bound]
        flop_eff = [r.flops / r.measured_forward_s / peak for r in bound]
        bw_eff = [r.bytes / r.measured_forward_s / device.memory_bandwidth_bytes_per_s for r in free]
        nan = float("nan")
        out.append(
            FamilySummary(
                family=family,
                shards=len(members),
                configs=sum(r.configs for r in members),
                forward_median=float(np.median(fwd)),
                forward_min=float(fwd.min()),
                forward_max=float(fwd.max()),
                backward_median=float(np.nanmedian(bwd)) if np.isfinite(bwd).any() else nan,
                backward_min=float(np.nanmin(bwd)) if np.isfinite(bwd).any() else nan,
                backward_max=float(np.nanmax(bwd)) if np.isfinite(bwd).any() else nan,
                median_measured_forward_s=float(np.median([r.measured_forward_s for r in members])),
                median_roofline_forward_s=float(np.median([r.roofline_forward_s for r in members])),
                compute_bound=len(bound) / len(members),
                implied_flop_efficiency=float(np.median(flop_eff)) if flop_eff else nan,
                implied_bandwidth_efficiency=float(np.median(bw_eff)) if bw_eff else nan,
                backward_over_forward=float(
                    np.nanmedian([r.measured_backward_s / r.measured_forward_s for r in members])
                ),
            )
        )
    return out


def _g(value: float, fmt: str = ".3g") -> str:
    return "-" if not np.isfinite(value) else format(value, fmt)


def markdown_table(stats: Sequence[FamilySummary], *, family_header: str = "family") -> str:
    """The statistics as a Markdown table (times in microseconds, efficiencies as fractions)."""
    lines = [
        f"| {family_header} | shards | (op, config) pairs | fwd measured/roofline median (min-max) | "
        "bwd measured/roofline median (min-max) | median fwd measured / roofline (us) | compute-bound | "
        "implied FLOP eff. | implied BW eff. | bwd/fwd measured |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stats:
        lines.append(
            f"| {s.family} | {s.shards} | {s.configs} | {_g(s.forward_median)} ({_g(s.forward_min)}-"
            f"{_g(s.forward_max)}) | {_g(s.backward_median)} ({_g(s.backward_min)}-{_g(s.backward_max)}) | "
            f"{_g(s.median_measured_forward_s * 1e6)} / {_g(s.median_roofline_forward_s * 1e6)} | "
            f"{s.compute_bound:.0%} | {_g(s.implied_flop_efficiency, '.2f')} | "
            f"{_g(s.implied_bandwidth_efficiency, '.2f')} | {_g(s.backward_over_forward)} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Command line.


def _device_name(device: str) -> str:
    if device == "cpu":
        from objectives.profile import detect_device_name

        return detect_device_name("cpu")
    import torch

    return torch.cuda.get_device_name()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path,
                        default=[ROOT / "examples" / "gpt2.onnx", ROOT / "examples" / "llama.onnx"])
    parser.add_argument("--dim", action="append", default=[], help="NAME=INT (default batch=8, seq=1024)")
    parser.add_argument("--devices", type=int, default=8, help="configurations for this many devices")
    parser.add_argument("--max-split-dims", type=int, default=1, help="dims split at once (default 1)")
    parser.add_argument("--preset", default="h100-sxm", help="roofline device preset")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where torch runs")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few repeats (smoke test)")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-flush", action="store_true", help="do not flush L2 before each timed run")
    parser.add_argument("--max-shards", type=int, default=None, help="time at most this many shards")
    parser.add_argument("--out", type=Path, default=None, help="write gpu_roofline.json and .md here")
    args = parser.parse_args(argv)

    from objectives.cluster import make_cluster
    from planner.plan import load_graph

    dims = parse_dims(args.dim) or {"batch": 8, "seq": 1024}
    devices, repeats, warmup = args.devices, args.repeats, args.warmup
    if args.quick:
        dims = parse_dims(args.dim) or {"batch": 1, "seq": 16}
        devices, repeats, warmup = min(devices, 2), min(repeats, 3), min(warmup, 1)
    cluster = make_cluster(args.preset, devices=devices)
    device = cluster.device
    settings = TrainingSettings(precision="bf16-mixed")
    options = ConfigOptions(devices=devices, devices_per_node=cluster.devices_per_node,
                            max_split_dims=args.max_split_dims)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    pairs: list[tuple[ShardRow, TorchCall]] = []
    skipped_all: dict[str, dict[str, int]] = {}
    for path in args.models:
        graph = load_graph(path, dims)
        found, skipped = shard_rows(graph, options, device=device, settings=settings)
        log(f"{path.name}: {len(graph.ops)} ops, {len(found)} distinct shards, skipped (op, config) "
            f"pairs by kind: {skipped or 'none'}")
        pairs.extend(found)
        skipped_all[graph.name] = skipped
    if args.max_shards is not None:
        pairs = pairs[: args.max_shards]
    name = _device_name(args.device)
    rates = reference_rates(args.device, flush=not args.no_flush)
    peak = peak_flops_per_s(device, "bf16")
    log(f"reference: {rates['gemm_size']}^3 bf16 GEMM {rates['gemm_flops_per_s']:.4g} FLOP/s "
        f"({rates['gemm_flops_per_s'] / peak:.2f} of {device.name}'s bf16 peak), bf16 copy "
        f"{rates['copy_bytes_per_s']:.4g} B/s ({rates['copy_bytes_per_s'] / device.memory_bandwidth_bytes_per_s:.2f} "
        f"of its bandwidth)")
    log(f"timing {len(pairs)} shards on {name} ({args.device}), {repeats} repeats")
    rows = _measure(pairs, device=args.device, warmup=warmup, repeats=repeats, flush=not args.no_flush, log=log)

    command = "python3 bench/gpu_roofline.py " + " ".join(sys.argv[1:] if argv is None else argv)
    header = (
        f"<!-- {command}; torch on {name} ({args.device}); models {', '.join(p.name for p in args.models)}; "
        f"dims {dims}; configurations for {devices} devices, at most {args.max_split_dims} split dims; "
        f"roofline: {device.name}, bf16 peak {peak_flops_per_s(device, 'bf16'):.4g} FLOP/s, bandwidth "
        f"{device.memory_bandwidth_bytes_per_s:.4g} B/s x {MEMORY_BANDWIDTH_EFFICIENCY}, backward bytes "
        f"x {BACKWARD_BYTES_FACTOR}; L2 flush {'off' if args.no_flush else 'on'}; reference: "
        f"{rates['gemm_size']}^3 bf16 GEMM {rates['gemm_flops_per_s']:.4g} FLOP/s = "
        f"{rates['gemm_flops_per_s'] / peak:.2f} x peak, copy {rates['copy_bytes_per_s']:.4g} B/s = "
        f"{rates['copy_bytes_per_s'] / device.memory_bandwidth_bytes_per_s:.2f} x bandwidth -->"
    )
    tables = [header]
    for group_by, title in (("kind", "family"), ("kind+fused", "family + fused ops"), ("op_type", "op type")):
        tables.append(markdown_table(summarize(rows, device=device, settings=settings, group_by=group_by),
                                     family_header=title))
    skipped_line = "skipped (op, configuration) pairs: " + "; ".join(
        f"{model}: " + (", ".join(f"{k} {v}" for k, v in sorted(s.items())) or "none")
        for model, s in skipped_all.items()
    )
    tables.append(skipped_line)
    text = "\n\n".join(tables)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_roofline.md").write_text(text + "\n", encoding="utf-8")
        document = {
            "command": command,
            "device": name,
            "torch_device": args.device,
            "dims": dims,
            "devices": devices,
            "preset": device.name,
            "skipped": skipped_all,
            "reference": rates,
            "rows": [asdict(r) for r in rows],
        }
        (args.out / "gpu_roofline.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
