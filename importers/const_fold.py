r"""Shape stage 3: fold shape-computation subgraphs to constants.

3. **Fold** shape-computation subgraphs in topological order (Shape, Gather, Concat, Slice, Cast,
   integer arithmetic, Range, ConstantOfShape, Where, Expand...) with numpy
   (:data:`_NUMPY_EVALUATORS`), or with ``onnx.reference.ReferenceEvaluator`` for other ops on tiny
   constant inputs (:data:`_REF_FOLD_OPS`, at most :data:`_REF_MAX_INPUT_ELEMENTS` input elements).
   Folded values go to :attr:`~importers.shapes.ShapedModel.constants` and are injected into the next
   skeleton as initializers, so Reshape/Expand/Slice targets that ONNX's data propagation misses
   (e.g. after a ``Div``) become known. → ``_fold_pass()``, ``_eval_numpy()``
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from importers.onnx_protos import _DEFAULT_DOMAINS, _attr, _has_subgraph

__all__ = ["FOLD_MAX_ELEMENTS"]

FOLD_MAX_ELEMENTS = 1 << 16
"""Largest value (elements) kept in :attr:`ShapedModel.constants`; shape tensors are far smaller,
and a causal mask at seq=1024 (1M elements) is not worth materialising."""

_REF_MAX_INPUT_ELEMENTS = 1024
"""The reference evaluator runs an op only when its constant inputs are this small in total."""

# Ops the reference evaluator may fold: those whose output size is bounded by their inputs'
# (small, see _REF_MAX_INPUT_ELEMENTS), so that a corrupt attribute cannot ask for gigabytes (Pad,
# Resize, ConvTranspose are left out on purpose), and that are deterministic.
_REF_FOLD_OPS = frozenset(
    {
        "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh",
        "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast", "CastLike",
        "Ceil", "Clip", "Compress", "Concat", "Cos", "Cosh", "CumSum", "DepthToSpace", "Div",
        "Elu", "Equal", "Erf", "Exp", "Flatten", "Floor", "Gather", "GatherElements", "GatherND",
        "Gelu", "Gemm", "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "Hardmax",
        "Identity", "IsInf", "IsNaN", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax",
        "MatMul", "Max", "Mean", "Min", "Mod", "Mul", "Neg", "NonZero", "Not", "Or", "Pow",
        "PRelu", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
        "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu",
        "Reshape", "Round", "ScatterElements", "ScatterND", "Selu", "Shrink", "Sigmoid", "Sign",
        "Sin", "Sinh", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt",
        "Squeeze", "Sub", "Sum", "Tan", "Tanh", "TopK", "Transpose", "Trilu", "Unique", "Unsqueeze",
        "Where", "Xor",
    }
)


# --------------------------------------------------------------------------------------------
# Constant folding
# --------------------------------------------------------------------------------------------


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """Value of a Constant node (None for strings, sparse or external data)."""
    for a in node.attribute:
        if a.name == "value":
            if a.t.data_location == TensorProto.EXTERNAL or a.t.data_type == TensorProto.STRING:
                return None
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, dtype=np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), dtype=np.float32)
        if a.name == "value_int":
            return np.array(a.i, dtype=np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), dtype=np.int64)
    return None


_NUMPY_CASTS = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
     "float32", "float64"}
)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX integer Div: truncation toward zero (numpy's // floors)."""
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _guard(count: int) -> None:
    if count < 0 or count > FOLD_MAX_ELEMENTS:
        raise _TooBig


class _TooBig(Exception):
    """A folded value would exceed FOLD_MAX_ELEMENTS; the node is left unfolded."""


def _axes(node: onnx.NodeProto, ins: list[np.ndarray | None], index: int) -> list[int] | None:
    attr = _attr(node, "axes")
    if attr is not None:
        return [int(a) for a in attr]
    if len(ins) > index and ins[index] is not None:
        return [int(a) for a in np.asarray(ins[index]).reshape(-1)]
    return None


def _identity(node: onnx.NodeProto, ins: list) -> list | None:
    return [ins[0]]


def _cast(node: onnx.NodeProto, ins: list) -> list | None:
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(_attr(node, "to"))))
    if dtype.name not in _NUMPY_CASTS:
        return None  # bfloat16/float8/int4/string: the reference evaluator knows their rounding
    return [np.asarray(ins[0]).astype(dtype)]


def _cast_like(node: onnx.NodeProto, ins: list) -> list | None:
    return [np.asarray(ins[0]).astype(ins[1].dtype)]


def _gather(node: onnx.NodeProto, ins: list) -> list | None:
    axis = int(_attr(node, "axis", 0))
    data = np.asarray(ins[0])
    idx = np.asarray(ins[1]).astype(np.int64)
    size = data.shape[axis]
    idx = np.where(idx < 0, idx + size, idx)
    if np.any(idx < 0) or np.any(idx >= size):
        return None
    return [np.take(data, idx, axis=axis)]


def _unsqueeze(node: onnx.NodeProto, ins: list) -> list | None:
    x = ins[0]
    axes = _axes(node, ins, 1)
    if axes is None:
        return None
    rank = x.ndim + len(axes)
    norm = sorted(a + rank if a < 0 else a for a in axes)
    return [np.expand_dims(x, tuple(norm))]


def _squeeze(node: onnx.NodeProto, ins: list) -> list | None:
    x = ins[0]
    axes = _axes(node, ins, 1)
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(a + x.ndim if a < 0 else a for a in axes))]


def _concat(node: onnx.NodeProto, ins: list) -> list | None:
    parts = [np.asarray(p) for p in ins if p is not None]
    if any(p.ndim == 0 for p in parts):
        return None
    return [np.concatenate(parts, axis=int(_attr(node, "axis")))]


_BINARY = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater,
    "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
    "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
}


def _binary(node: onnx.NodeProto, ins: list) -> list | None:
    op = node.op_type
    a, b = np.asarray(ins[0]), np.asarray(ins[1])
    if a.dtype != b.dtype and op != "Pow":
        return None
    _guard(math.prod(np.broadcast_shapes(a.shape, b.shape)))
    if op == "Div" and a.dtype.kind in "iu":
        if np.any(b == 0):
            return None
        return [_int_div(a, b)]
    if op == "Mod":
        if a.dtype.kind in "iu" and np.any(b == 0):
            return None
        return [np.fmod(a, b) if _attr(node, "fmod", 0) else np.mod(a, b)]
    if op == "Pow":
        return None  # ONNX Pow's mixed-type rules differ from numpy's; the reference evaluator knows them
    result = _BINARY[op](a, b)
    if op in ("Add", "Sub", "Mul", "Div"):
        result = result.astype(a.dtype)
    return [np.asarray(result)]


_UNARY = {"Neg": np.negative, "Abs": np.abs, "Not": np.logical_not, "Floor": np.floor,
          "Ceil": np.ceil, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Sign": np.sign}


def _unary(node: onnx.NodeProto, ins: list) -> list | None:
    op, x = node.op_type, ins[0]
    if op in ("Floor", "Ceil", "Sqrt", "Reciprocal") and x.dtype.kind != "f":
        return None
    return [np.asarray(_UNARY[op](x)).astype(x.dtype)]


def _min_max(node: onnx.NodeProto, ins: list) -> list | None:
    parts = [np.asarray(p) for p in ins if p is not None]
    if len({p.dtype for p in parts}) != 1:
        return None
    _guard(math.prod(np.broadcast_shapes(*(p.shape for p in parts))))
    fn2 = np.minimum if node.op_type == "Min" else np.maximum
    result = parts[0]
    for p in parts[1:]:
        result = fn2(result, p)
    return [np.asarray(result)]


def _where(node: onnx.NodeProto, ins: list) -> list | None:
    c, a, b = (np.asarray(v) for v in ins[:3])
    if a.dtype != b.dtype:
        return None
    _guard(math.prod(np.broadcast_shapes(c.shape, a.shape, b.shape)))
    return [np.where(c.astype(bool), a, b)]


def _range(node: onnx.NodeProto, ins: list) -> list | None:
    start, limit, delta = (np.asarray(v).reshape(()) for v in ins[:3])
    if delta == 0:
        return None
    count = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    _guard(count)
    return [(start + delta * np.arange(count, dtype=start.dtype)).astype(start.dtype)]


def _constant_of_shape(node: onnx.NodeProto, ins: list) -> list | None:
    shape = [int(v) for v in np.asarray(ins[0]).reshape(-1)]
    _guard(math.prod(shape) if all(v >= 0 for v in shape) else -1)
    value = _attr(node, "value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    if fill.size != 1:
        return None
    return [np.full(shape, fill[0], dtype=fill.dtype)]


def _expand(node: onnx.NodeProto, ins: list) -> list | None:
    x = ins[0]
    shape = tuple(int(v) for v in np.asarray(ins[1]).reshape(-1))
    if any(v < 0 for v in shape):
        return None
    out_shape = np.broadcast_shapes(x.shape, shape)
    _guard(math.prod(out_shape))
    return [np.broadcast_to(x, out_shape).copy()]


def _tile(node: onnx.NodeProto, ins: list) -> list | None:
    x = ins[0]
    reps = [int(v) for v in np.asarray(ins[1]).reshape(-1)]
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        return None
    _guard(x.size * math.prod(reps))
    return [np.tile(x, reps)]


def _reshape(node: onnx.NodeProto, ins: list) -> list | None:
    x = ins[0]
    target = [int(v) for v in np.asarray(ins[1]).reshape(-1)]
    if not _attr(node, "allowzero", 0):
        target = [x.shape[i] if v == 0 and i < x.ndim else v for i, v in enumerate(target)]
    return [np.reshape(x, target)]


def _transpose(node: onnx.NodeProto, ins: list) -> list | None:
    perm = _attr(node, "perm")
    return [np.transpose(ins[0], None if perm is None else [int(p) for p in perm])]


def _eval_numpy(node: onnx.NodeProto, ins: list[np.ndarray | None]) -> list[np.ndarray] | None:
    """numpy semantics of the shape-computation ops (:data:`_NUMPY_EVALUATORS`); None when the op is
    not covered here."""
    evaluate = _NUMPY_EVALUATORS.get(node.op_type)
    return None if evaluate is None or not ins else evaluate(node, ins)


def _one_hot(node: onnx.NodeProto, ins: list[np.ndarray | None]) -> list[np.ndarray] | None:
    """ONNX OneHot: the TorchScript exporter computes ``Tile`` repeats with it (Mixtral's experts).

    Indices in ``[-depth, depth)`` wrap like Python's; others give an all-``off`` row.
    """
    if len(ins) < 3 or any(v is None for v in ins[:3]):
        return None
    indices, depth_value, values = (np.asarray(v) for v in ins[:3])
    if indices.dtype.kind not in "iuf" or depth_value.size != 1 or values.size != 2:
        return None
    depth = int(depth_value.reshape(-1)[0])
    if depth < 1:
        return None
    _guard(indices.size * depth)
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + depth, idx)
    rank = indices.ndim + 1
    axis = int(_attr(node, "axis", -1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        return None
    flat = values.reshape(-1)
    hot = np.where(idx[..., None] == np.arange(depth), flat[1], flat[0]).astype(values.dtype)
    return [np.moveaxis(hot, -1, axis)]



def _slice(node: onnx.NodeProto, ins: list[np.ndarray | None]) -> list[np.ndarray] | None:
    data = np.asarray(ins[0])
    if _attr(node, "starts") is not None:  # opset < 10: bounds as attributes
        starts, ends = list(_attr(node, "starts")), list(_attr(node, "ends"))
        axes = list(_attr(node, "axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        def vec(i: int) -> list[int] | None:
            return None if len(ins) <= i or ins[i] is None else [int(v) for v in np.asarray(ins[i]).reshape(-1)]

        starts, ends = vec(1), vec(2)
        if starts is None or ends is None:
            return None
        axes = vec(3) or list(range(len(starts)))
        steps = vec(4) or [1] * len(starts)
    if not (len(starts) == len(ends) == len(axes) == len(steps)) or 0 in steps:
        return None
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = a + data.ndim if a < 0 else a
        if not 0 <= a < data.ndim:
            return None
        # Python slicing clamps out-of-range bounds exactly as ONNX Slice does.
        index[a] = slice(s, e, st)
    return [data[tuple(index)]]



_NUMPY_EVALUATORS: dict[str, Callable[[onnx.NodeProto, list], list | None]] = {
    "Identity": _identity, "Cast": _cast, "CastLike": _cast_like, "Gather": _gather,
    "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "Concat": _concat, "Slice": _slice,
    **{op: _binary for op in (*_BINARY, "Mod", "Pow")},
    **{op: _unary for op in _UNARY},
    "Min": _min_max, "Max": _min_max, "Where": _where, "Range": _range,
    "ConstantOfShape": _constant_of_shape, "Expand": _expand, "Tile": _tile,
    "OneHot": _one_hot, "Reshape": _reshape, "Transpose": _transpose,
}
"""ONNX op type -> its numpy evaluation on constant inputs (``None``: not covered, the reference
evaluator or nothing takes over)."""


def _eval_reference(
    node: onnx.NodeProto, ins: list[np.ndarray | None], model: onnx.ModelProto
) -> list[np.ndarray] | None:
    """Run one node with onnx's reference evaluator (small constant inputs only)."""
    if node.op_type not in _REF_FOLD_OPS:
        return None
    present = [v for v in ins if v is not None]
    if sum(v.size for v in present) > _REF_MAX_INPUT_ELEMENTS or any(v.dtype.kind in "OUS" for v in present):
        return None
    from onnx.reference import ReferenceEvaluator

    feeds: dict[str, np.ndarray] = {}
    vis = []
    for name, value in zip(node.input, ins):
        if name and value is not None and name not in feeds:
            feeds[name] = value
            vis.append(
                helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
            )
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], "fold", vis, outs)
    one = helper.make_model(graph, opset_imports=list(model.opset_import))
    one.ir_version = model.ir_version
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = ReferenceEvaluator(one).run(None, feeds)
    named = dict(zip([o for o in node.output if o], results))
    return [np.asarray(named[o]) if o else np.zeros(0) for o in node.output]


def _fold_pass(
    model: onnx.ModelProto,
    order: Sequence[int],
    done: set[int],
    constants: dict[str, np.ndarray],
    folded: dict[str, np.ndarray],
    known_shape: Callable[[str], tuple[int, ...] | None],
) -> int:
    """Fold every node whose value is now known; returns the number of newly folded nodes."""
    nodes = model.graph.node
    new = 0
    for i in order:
        if i in done:
            continue
        node = nodes[i]
        if node.domain not in _DEFAULT_DOMAINS or _has_subgraph(node):
            done.add(i)
            continue
        op = node.op_type
        results: list[np.ndarray] | None = None
        try:
            with np.errstate(all="ignore"):
                if op == "Constant":
                    value = _constant_node_value(node)
                    results = None if value is None else [value]
                    done.add(i)  # a Constant's value never changes between rounds
                elif op in ("Shape", "Size"):
                    shape = known_shape(node.input[0]) if node.input else None
                    if shape is not None:
                        if op == "Size":
                            results = [np.array(math.prod(shape), dtype=np.int64)]
                        else:
                            rank = len(shape)
                            start = int(_attr(node, "start", 0))
                            end = _attr(node, "end")
                            end = rank if end is None else int(end)
                            start = min(max(start + rank if start < 0 else start, 0), rank)
                            end = min(max(end + rank if end < 0 else end, 0), rank)
                            results = [np.array(shape[start:end], dtype=np.int64)]
                elif node.input and all(not n or n in constants for n in node.input):
                    ins = [constants[n] if n else None for n in node.input]
                    results = _eval_numpy(node, ins)
                    if results is None:
                        results = _eval_reference(node, ins, model)
        except _TooBig:
            done.add(i)
            results = None
        except Exception:  # noqa: BLE001 - folding is best effort: an op numpy or the reference
            # evaluator rejects (bad attributes in a corrupt model, out-of-range indices) simply
            # stays unfolded, and its shape comes from inference instead.
            done.add(i)
            results = None
        if results is None:
            continue
        done.add(i)
        if len(results) != len(node.output):
            continue
        stored = False
        for name, value in zip(node.output, results):
            value = np.asarray(value)
            if name and value.size <= FOLD_MAX_ELEMENTS and value.dtype.kind not in "OUS":
                constants[name] = value
                folded[name] = value
                stored = True
        new += stored
    return new
