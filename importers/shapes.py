r"""Concrete shapes for every value of an ONNX graph, at the caller's dim bindings.

Contract (used by the coarsening stage): :func:`resolve_shapes` returns a :class:`ShapedModel`.

How shapes are found, in order of trust (computed beats declared: exports can declare wrong shapes,
e.g. an LSTM LM whose output declares ``[batch, 128, vocab]`` with the traced seq baked in):

0. **Validate** the graph: a topological order (dangling inputs, cycles and values produced twice
   are ModelErrors) and each standard op against its schema, because ONNX's C++ inference aborts
   the process on some malformed nodes. → ``_topo_order()``, ``_validate_nodes()``
1. **Bind** graph-input dims from ``dims`` (``{"batch": 32, "seq": 1024}``); derived names such as
   ``batch*seq`` or ``seq + 1`` are evaluated by :func:`eval_dim_expr` (a whitelist over Python's
   ``ast``: ints, names, ``+ - * / // %``, ``min``/``max``/``floor``/``ceil``; never ``eval``).
   An unknown name raises :class:`~planner.core.errors.UnboundDimError` naming the dim, where it
   appears (``input_ids[1]``) and the ``--dim`` flag. → ``_bind_inputs()``
2. **Infer** on a *skeleton* of the model: graph inputs made concrete, big or external initializers
   turned into graph inputs of the same dtype and dims (so no weight bytes are copied and
   onnxruntime's symbolic inference, which reads initializer data, works on stripped files), graph
   outputs' declared shapes dropped. ``onnx.shape_inference.infer_shapes(data_prop=True)``. →
   ``_skeleton()``, ``_infer()``
3. **Fold** shape-computation subgraphs in topological order (Shape, Gather, Concat, Slice, Cast,
   integer arithmetic, Range, ConstantOfShape, Where, Expand...) with numpy, or with
   ``onnx.reference.ReferenceEvaluator`` for other ops on tiny constant inputs. Folded values go to
   :attr:`ShapedModel.constants` and are injected into the next skeleton as initializers, so
   Reshape/Expand/Slice targets that ONNX's data propagation misses (e.g. after a ``Div``) become
   known. Steps 2-3 repeat while they make progress. → ``_fold_pass()``, ``_eval_numpy()``
4. **Fall back** for values still unknown: declared ``value_info`` made concrete by the bindings is
   fed to inference for exactly those values (so downstream inference resumes; this is what a
   graph-only file whose shape constants were stripped needs), then onnxruntime's
   ``SymbolicShapeInference`` when a ``com.microsoft``-style op is where inference stopped (it
   needs sympy, and is skipped without it). → ``_declared()``, ``_ort_infer()``
5. **Check**: computed shapes that contradict declared ones become warnings; a zero or negative dim
   of a non-integer runtime value (an activation, not an empty index vector of a shape subgraph)
   is a :class:`~planner.core.errors.ModelError`; values whose shape stays
   unknown are left out of :attr:`ShapedModel.shapes` with one warning.

Everything is linear in the graph size (a few inference calls, one topological order, dict
lookups); ``onnx.checker.check_model`` is never called (only the per-node ``check_node``).
"""

from __future__ import annotations

import ast
import math
import warnings
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from importers.onnx_load import printable
from importers.shape_facts import solve_shapes
from planner.core.errors import ModelError, PlannerError, UnboundDimError

__all__ = ["ShapedModel", "resolve_shapes", "eval_dim_expr", "FOLD_MAX_ELEMENTS"]

FOLD_MAX_ELEMENTS = 1 << 16
"""Largest value (elements) kept in :attr:`ShapedModel.constants`; shape tensors are far smaller,
and a causal mask at seq=1024 (1M elements) is not worth materialising."""

_REF_MAX_INPUT_ELEMENTS = 1024
"""The reference evaluator runs an op only when its constant inputs are this small in total."""

_MAX_ROUNDS = 8
_MAX_DIM = 2**62
"""Largest dim accepted (ONNX dims are int64; products of a few such dims must still fit)."""
_MAX_LISTED = 20
_DEFAULT_DOMAINS = ("", "ai.onnx")

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapedModel:
    """An ONNX model with every value's concrete shape and dtype."""

    model: onnx.ModelProto
    """As loaded, weights not loaded (``load_external_data=False``)."""
    shapes: Mapping[str, tuple[int, ...]]
    """Value name (node outputs, graph inputs, initializers) -> concrete shape."""
    dtypes: Mapping[str, str]
    """Value name -> numpy dtype name (``"float32"``, ``"int64"``...)."""
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Values known at import time: Constant nodes, small inline initializers, and results of
    shape-computation subgraphs (Shape -> Gather -> Concat...), by value name."""
    dim_bindings: Mapping[str, int] = field(default_factory=dict)
    """The bindings used, symbolic name -> value (derived ones such as ``batch*seq`` included)."""
    warnings: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# Dim expressions
# --------------------------------------------------------------------------------------------

_BINOPS: dict[type, Callable[[int, int], int | float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Div: lambda a, b: a / b,
    ast.Mod: lambda a, b: a % b,
}
_CALLS: dict[str, Callable[..., int | float]] = {
    "min": min,
    "max": max,
    "Min": min,
    "Max": max,
    "floor": math.floor,
    "ceil": math.ceil,
    "Floor": math.floor,
    "ceiling": math.ceil,
    "Ceiling": math.ceil,
}


class _Unbound(Exception):
    """A name in a dim expression has no binding."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@lru_cache(maxsize=4096)
def _parse_dim(expr: str) -> ast.expr | None:
    """The whitelisted expression tree of ``expr``, or None when it is an opaque name."""
    if len(expr) > 256:
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _CALLS) or node.keywords:
                return None
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return None
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                return None
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                return None
        elif not isinstance(node, (ast.Expression, ast.Name, ast.Load) + tuple(_BINOPS)) and not (
            isinstance(node, (ast.USub, ast.UAdd))
        ):
            return None
    return tree.body


def _eval_tree(node: ast.expr, bindings: Mapping[str, int], expr: str) -> int | float:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in bindings:
            raise _Unbound(node.id)
        return bindings[node.id]
    if isinstance(node, ast.UnaryOp):
        value = _eval_tree(node.operand, bindings, expr)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _eval_tree(node.left, bindings, expr)
        right = _eval_tree(node.right, bindings, expr)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ModelError(f"dim expression '{expr}' divides by zero; check the --dim values")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.Call):
        args = [_eval_tree(a, bindings, expr) for a in node.args]
        try:
            return _CALLS[node.func.id](*args)  # type: ignore[union-attr]
        except TypeError:
            raise ModelError(
                f"dim expression '{expr}' calls {node.func.id} with {len(args)} arguments; "  # type: ignore[union-attr]
                "re-export the model with plain dim names"
            ) from None
    raise ModelError(f"dim expression '{expr}' is not supported; re-export with plain dim names")


def eval_dim_expr(expr: str, bindings: Mapping[str, int], *, where: str = "") -> int:
    """Value of a symbolic ONNX dim (``dim_param``) under the given bindings.

    The text is parsed with :mod:`ast` and only integers, names, ``+ - * / // %``, unary minus and
    ``min``/``max``/``floor``/``ceil`` calls are accepted (never ``eval``); anything else is taken
    as one opaque name, looked up as a whole. A name bound as a whole (``bindings["batch*seq"]``)
    wins over evaluating it.

    Parameters
    ----------
    expr:
        The ``dim_param`` text, e.g. ``"batch"``, ``"batch*seq"``, ``"seq + 1"``.
    bindings:
        Symbolic name -> size (elements).
    where:
        Where the dim appears (``"input_ids[1]"``), for the error message.

    Returns
    -------
    int
        The dim's size in elements.

    Raises
    ------
    UnboundDimError
        A name in ``expr`` has no binding; the message names it, ``where``, and ``--dim NAME=VALUE``.
    ModelError
        The expression divides by zero or its value is not an integer.

    Examples
    --------
    >>> eval_dim_expr("batch*seq", {"batch": 2, "seq": 8})
    16
    >>> eval_dim_expr("(seq + 1) // 2", {"seq": 8})
    4
    >>> eval_dim_expr("__import__('os')", {})
    Traceback (most recent call last):
    ...
    planner.core.errors.UnboundDimError: dim '__import__('os')' is unbound (__import__('os')); pass --dim '__import__('\\''os'\\'')=VALUE'
    """
    if expr in bindings:
        return int(bindings[expr])
    tree = _parse_dim(expr)
    try:
        if tree is None:
            raise _Unbound(expr)
        value = _eval_tree(tree, bindings, expr)
    except _Unbound as missing:
        raise UnboundDimError(missing.name, where or expr) from None
    if isinstance(value, float):
        if not value.is_integer():
            raise ModelError(
                f"dim expression '{expr}' = {value} is not an integer at "
                f"{_format_bindings(bindings, tree)}; pick --dim values it divides evenly"
            )
        value = int(value)
    return int(value)


def _try_eval_dim(expr: str, bindings: Mapping[str, int]) -> int | None:
    """Like :func:`eval_dim_expr` but None when unbound or not an integer."""
    try:
        return eval_dim_expr(expr, bindings)
    except ModelError:
        return None


def _format_bindings(bindings: Mapping[str, int], tree: ast.expr | None) -> str:
    names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}) if tree else []
    return ", ".join(f"{n}={bindings[n]}" for n in names if n in bindings) or "these bindings"


# --------------------------------------------------------------------------------------------
# Small helpers on protos
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _dtype_name(elem_type: int) -> str | None:
    """numpy dtype name of an ONNX element type (``bfloat16`` stays ``bfloat16``)."""
    if elem_type == TensorProto.STRING:
        return "string"
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # UNDEFINED or an unknown code in a corrupt file
        return None


def _tensor_type(vi: onnx.ValueInfoProto) -> onnx.TypeProto.Tensor | None:
    if vi.type.WhichOneof("value") != "tensor_type":
        return None
    return vi.type.tensor_type


def _concrete_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """Shape of a value info when every dim has a value, else None."""
    tt = _tensor_type(vi)
    if tt is None or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.WhichOneof("value") != "dim_value":
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def _dim_text(d: onnx.TensorShapeProto.Dimension) -> str:
    which = d.WhichOneof("value")
    if which == "dim_value":
        return str(d.dim_value)
    if which == "dim_param" and d.dim_param:
        return d.dim_param
    return "?"


def _is_anonymous(d: onnx.TensorShapeProto.Dimension) -> bool:
    which = d.WhichOneof("value")
    return which is None or (which == "dim_param" and (not d.dim_param or d.dim_param.startswith("unk__")))


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def _limited(items: Sequence[str]) -> str:
    shown = ", ".join(items[:5])
    return shown + (f" and {len(items) - 5} more" if len(items) > 5 else "")


# --------------------------------------------------------------------------------------------
# Graph structure
# --------------------------------------------------------------------------------------------


def _validate_nodes(model: onnx.ModelProto) -> None:
    """ModelError for a standard-op node that breaks its ONNX schema.

    ONNX's C++ shape inference trusts the schema: a Split with more outputs than ``num_outputs``
    aborts the whole process (a failed bounds assertion), so such nodes are stopped here. Ops the
    installed onnx does not know, and other domains, are left alone (they become opaque ops).
    ``onnx.checker.check_node`` is per node and cheap (about 1 us), unlike ``check_model``.
    """
    opsets = {o.domain: o.version for o in model.opset_import}
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version if 0 < model.ir_version <= onnx.IR_VERSION else onnx.IR_VERSION
    ctx.opset_imports = opsets
    nodes = list(model.graph.node)
    for function in model.functions:
        nodes.extend(function.node)
    for node in nodes:
        if node.domain not in _DEFAULT_DOMAINS or node.op_type == "Constant":
            continue
        if not onnx.defs.has(node.op_type, node.domain):
            continue
        try:
            onnx.checker.check_node(node, ctx)
        except Exception as exc:  # onnx's ValidationError, or anything its binding raises
            raise ModelError(
                f"node '{node.name}' ({node.op_type}) does not match the ONNX {node.op_type} schema "
                f"({_first_line(exc)}); the model is invalid: re-export it"
            ) from None
        if node.op_type == "Split":
            count = _attr(node, "num_outputs")
            if count is not None and count != len(node.output):
                raise ModelError(
                    f"node '{node.name}' (Split) has num_outputs={count} but {len(node.output)} "
                    "outputs; the model is invalid: re-export it"
                )


def _topo_order(graph: onnx.GraphProto, sources: set[str]) -> list[int]:
    """Node indices in a topological order (stable); ModelError on dangling inputs or cycles."""
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer or out in sources:
                raise ModelError(
                    f"value '{out}' is produced twice (node '{node.name}' {node.op_type}); the model "
                    "is invalid: re-export it"
                )
            producer[out] = i
    n = len(graph.node)
    indegree = [0] * n
    consumers: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(graph.node):
        deps = set()
        for name in node.input:
            if not name or name in sources:
                continue
            if name not in producer:
                raise ModelError(
                    f"node '{node.name}' ({node.op_type}) reads '{name}', which nothing produces; "
                    "the model is truncated or corrupt: re-export it"
                )
            deps.add(producer[name])
        indegree[i] = len(deps)
        for d in deps:
            consumers[d].append(i)
    ready = deque(i for i in range(n) if indegree[i] == 0)
    order: list[int] = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in consumers[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if len(order) != n:
        stuck = next(graph.node[i] for i in range(n) if indegree[i] > 0)
        raise ModelError(
            f"the graph has a cycle (through node '{stuck.name}' {stuck.op_type}); the model is "
            "invalid: re-export it"
        )
    return order


# --------------------------------------------------------------------------------------------
# Binding graph inputs
# --------------------------------------------------------------------------------------------


def _check_dims(dims: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ModelError(f"dim '{name}' = {value!r} is not an integer; pass --dim {name}=N")
        if value <= 0:
            raise ModelError(
                f"dim '{name}' = {value} is not positive; pass --dim {name}=N with N >= 1"
            )
        if value > _MAX_DIM:
            raise ModelError(f"dim '{name}' = {value} is too large; pass --dim {name}=N with N < 2**62")
        out[str(name)] = int(value)
    return out


def _input_dim_names(inputs: Sequence[onnx.ValueInfoProto], *, positional: bool = True) -> set[str]:
    """The names a ``--dim`` can bind: the symbols in the inputs' dim expressions and, with
    ``positional``, every ``input[axis]`` of a symbolic or unnamed axis."""
    names: set[str] = set()
    for vi in inputs:
        tt = _tensor_type(vi)
        if tt is None or not tt.HasField("shape"):
            continue
        for axis, d in enumerate(tt.shape.dim):
            if d.WhichOneof("value") == "dim_value":
                continue
            if positional:
                names.add(f"{vi.name}[{axis}]")
            tree = _parse_dim(d.dim_param) if d.dim_param else None
            if tree is not None:
                names.update(node.id for node in ast.walk(tree) if isinstance(node, ast.Name))
            elif d.dim_param:
                names.add(d.dim_param)
    return names


def _bind_inputs(
    inputs: Sequence[onnx.ValueInfoProto],
    bindings: dict[str, int],
    derived: dict[str, int],
    consumed: set[str],
    warn: list[str],
) -> tuple[dict[str, tuple[int, ...]], dict[str, onnx.ValueInfoProto]]:
    """Concrete shapes of graph inputs and their concrete value infos for the skeleton."""
    shapes: dict[str, tuple[int, ...]] = {}
    concrete_vis: dict[str, onnx.ValueInfoProto] = {}
    for vi in inputs:
        tt = _tensor_type(vi)
        used = vi.name in consumed
        if tt is None or not tt.HasField("shape"):
            if used:
                what = "is not a tensor" if tt is None else "declares no shape"
                raise ModelError(
                    f"graph input '{vi.name}' {what}; re-export the model with tensor inputs of "
                    "known rank"
                )
            continue
        dims: list[int] = []
        try:
            for axis, d in enumerate(tt.shape.dim):
                where = f"{vi.name}[{axis}]"
                if d.WhichOneof("value") == "dim_value":
                    value = int(d.dim_value)
                elif where in bindings:
                    value = bindings[where]
                elif _is_anonymous(d):
                    raise UnboundDimError(where, f"an unnamed dim of graph input '{vi.name}'")
                else:
                    value = eval_dim_expr(d.dim_param, bindings, where=where)
                    derived[d.dim_param] = value
                if value <= 0 or value > _MAX_DIM:
                    raise ModelError(
                        f"graph input '{vi.name}' dim {axis} ({_dim_text(d)}) is {value}; dims must "
                        f"be positive and below 2**62: pass a sensible --dim value or re-export "
                        "the model"
                    )
                dims.append(value)
        except UnboundDimError as exc:
            if used:
                raise
            warn.append(f"graph input '{vi.name}' is unused and has an unbound dim ({exc})")
            continue
        shapes[vi.name] = tuple(dims)
        concrete_vis[vi.name] = helper.make_tensor_value_info(vi.name, tt.elem_type, dims)
    return shapes, concrete_vis


# --------------------------------------------------------------------------------------------
# Declared shapes (value_info, graph outputs)
# --------------------------------------------------------------------------------------------


class _Decl(NamedTuple):
    """A shape declared in the model (graph outputs, ``value_info``)."""

    values: tuple[int | None, ...] | None
    """Dims evaluated under the bindings (None where unknown); None when no shape is declared."""
    texts: tuple[str, ...]
    """Dims as written (``"batch"``, ``"128"``, ``"?"``), for messages."""
    elem_type: int
    """ONNX element type, 0 when undeclared."""


def _declared(
    graph: onnx.GraphProto, bindings: Mapping[str, int], derived: dict[str, int]
) -> dict[str, _Decl]:
    """Declared shapes of intermediate values and graph outputs; records evaluated dim_params."""
    out: dict[str, _Decl] = {}
    for vi in list(graph.value_info) + list(graph.output):
        tt = _tensor_type(vi)
        if tt is None:
            continue
        if not tt.HasField("shape"):
            out[vi.name] = _Decl(values=None, texts=(), elem_type=tt.elem_type)
            continue
        values: list[int | None] = []
        texts: list[str] = []
        for d in tt.shape.dim:
            texts.append(_dim_text(d))
            if d.WhichOneof("value") == "dim_value":
                values.append(int(d.dim_value))
            elif not _is_anonymous(d):
                value = _try_eval_dim(d.dim_param, bindings)
                if value is not None:
                    derived.setdefault(d.dim_param, value)
                values.append(value)
            else:
                values.append(None)
        out[vi.name] = _Decl(values=tuple(values), texts=tuple(texts), elem_type=tt.elem_type)
    return out


# --------------------------------------------------------------------------------------------
# Skeleton and inference
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Parts:
    """The fixed parts of every skeleton model."""

    inputs: list[onnx.ValueInfoProto]
    initializers: list[onnx.TensorProto]
    outputs: list[onnx.ValueInfoProto]
    dropped_nodes: set[int]


def _skeleton(
    model: onnx.ModelProto,
    parts: _Parts,
    removed: set[int],
    injected: Mapping[str, np.ndarray],
    extra_vis: Iterable[onnx.ValueInfoProto],
) -> onnx.ModelProto:
    """A weightless copy of ``model`` with concrete inputs, for shape inference."""
    skel = onnx.ModelProto()
    skel.ir_version = model.ir_version
    skel.opset_import.extend(model.opset_import)
    skel.functions.extend(model.functions)
    g = skel.graph
    g.name = "skeleton"
    g.node.extend(
        node
        for i, node in enumerate(model.graph.node)
        if i not in removed and i not in parts.dropped_nodes
    )
    g.input.extend(parts.inputs)
    g.initializer.extend(parts.initializers)
    for name, value in injected.items():
        g.initializer.append(numpy_helper.from_array(value, name))
    g.output.extend(parts.outputs)
    g.value_info.extend(extra_vis)
    return skel


def _infer(skel: onnx.ModelProto, warn: list[str]) -> onnx.ModelProto | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return onnx.shape_inference.infer_shapes(
                skel, check_type=False, strict_mode=False, data_prop=True
            )
    except Exception as exc:  # onnx raises InferenceError, ValueError, RuntimeError...
        warn.append(
            f"ONNX shape inference failed ({_first_line(exc)}); using folded and declared shapes"
        )
        return None


def _ort_infer(skel: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnxruntime's symbolic shape inference on the skeleton, or None (no sympy, or it failed)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except Exception:  # ImportError without sympy; anything else from an odd install
        return None
    # The steps of SymbolicShapeInference.infer_shapes, run here because that wrapper discards
    # partial results (raising when any shape stays unknown) and then writes
    # ``sym_shape_infer_temp.onnx`` into the working directory.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = SymbolicShapeInference(2**31 - 1, True, True, 0)
            engine._preprocess(skel)
            for _ in range(_MAX_ROUNDS):
                if not engine.run_:
                    break
                engine._infer_impl()
            engine._update_output_from_vi()
            return engine.out_mp_
    except Exception:  # plain Exceptions on ops it does not know; AttributeError if its API moved
        return None


def _first_line(exc: object) -> str:
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def _harvest(
    inferred: onnx.ModelProto,
) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Concrete shapes and element types of every value that inference annotated."""
    shapes: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = _tensor_type(vi)
        if tt is None:
            continue
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        shape = _concrete_shape(vi)
        if shape is not None:
            shapes[vi.name] = shape
    return shapes, types


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


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------


def resolve_shapes(model: onnx.ModelProto, dims: Mapping[str, int]) -> ShapedModel:
    """Concrete shape and dtype of every value of ``model`` at the given dim bindings.

    See the module docstring for the order of sources (inference on a weightless skeleton, constant
    folding, declared ``value_info``, onnxruntime's symbolic inference) and the checks.

    Parameters
    ----------
    model:
        The model as loaded by :func:`importers.onnx_load.load_onnx` (weights need not be present).
    dims:
        Symbolic dim name -> size in elements, e.g. ``{"batch": 32, "seq": 1024}``. A dim with no
        name may be bound by position, ``{"input_ids[1]": 1024}``. Unused names are ignored.

    Returns
    -------
    ShapedModel
        Shapes of graph inputs, initializers and node outputs (values whose shape cannot be
        computed are left out, with a warning), numpy dtype names, folded constants, the bindings
        used (derived dims included) and warnings (declared shapes contradicting computed ones).

    Raises
    ------
    UnboundDimError
        A graph input dim has no binding (names the dim, where it appears, and ``--dim NAME=VALUE``).
    ModelError
        A non-positive dim (bound or computed), a dangling input, a cycle, a value produced twice.

    Examples
    --------
    >>> from onnx import helper, TensorProto
    >>> x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    >>> y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch*seq", 8])
    >>> nodes = [
    ...     helper.make_node("Constant", [], ["shape"], value_ints=[-1, 8]),
    ...     helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ... ]
    >>> m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
    ...                       opset_imports=[helper.make_opsetid("", 18)])
    >>> shaped = resolve_shapes(m, {"batch": 2, "seq": 16})
    >>> shaped.shapes["y"], shaped.dtypes["y"], shaped.dim_bindings["batch*seq"]
    ((32, 8), 'float32', 32)
    """
    try:
        resolver = _Resolver(model, _check_dims(dims))
        resolver.iterate()
        return resolver.result()
    except PlannerError as exc:
        # Names in a corrupt file may hold newlines or control characters: keep messages one line.
        exc.args = (printable(str(exc)),)
        raise


_SMALL_CONST_TYPES = frozenset(
    {
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
        TensorProto.BOOL,
    }
)


_PROBE_PRIMES = (211, 223, 227, 229, 233, 239, 241, 251, 257, 263, 269, 271)
"""Probe values for the bound dims (:meth:`_Resolver._probe`): primes above any head count and
head size, and no factor of the usual hidden sizes and vocabularies (768, 4096, 32000, 50257...),
small enough that a probe's attention mask (batch x seq x seq) stays a few MB (primes near 10^4
made some exports ask for 14 GB)."""


def _unprobe(value: int, probes: Mapping[str, int], bindings: Mapping[str, int], literals: set[int]) -> int | None:
    """A dim computed at probe bindings, at the caller's bindings (each probe prime replaced).

    ``None`` when what is left after dividing out the primes is not a plausible literal (below the
    smallest prime, or a dim written in the file): ``seq + 1`` at the probe is 224, which is no
    product of bound dims.

    >>> _unprobe(4 * 211 * 223, {"batch": 211, "seq": 223}, {"batch": 2, "seq": 16}, set())
    128
    >>> _unprobe(224, {"seq": 223}, {"seq": 16}, set()) is None
    True
    """
    result = 1
    for name, prime in probes.items():
        while value % prime == 0 and value > 0:
            value //= prime
            result *= bindings[name]
    if value <= 0 or (value >= _PROBE_PRIMES[0] and value not in literals):
        return None
    return result * value


class _Resolver:
    """State of one :func:`resolve_shapes` call (private; every field is filled in ``__init__``)."""

    def __init__(self, model: onnx.ModelProto, bindings: dict[str, int]) -> None:
        self.model = model
        self.graph = graph = model.graph
        self.bindings = bindings
        self.warn: list[str] = []
        self.init_names = {t.name for t in graph.initializer}
        sparse = {t.values.name: t for t in graph.sparse_initializer}
        real_inputs = [
            vi for vi in graph.input if vi.name not in self.init_names and vi.name not in sparse
        ]
        sources = {vi.name for vi in real_inputs} | self.init_names | set(sparse)
        self.order = _topo_order(graph, sources)
        _validate_nodes(model)
        self.producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
        consumed = {name for node in graph.node for name in node.input if name}
        consumed.update(vi.name for vi in graph.output)

        self.derived: dict[str, int] = {}
        input_shapes, input_vis = _bind_inputs(
            real_inputs, bindings, self.derived, consumed, self.warn
        )
        unknown = sorted(set(bindings) - _input_dim_names(real_inputs))
        if unknown:
            known = sorted(_input_dim_names(real_inputs, positional=False))
            self.warn.append(
                f"--dim {', '.join(unknown)}: not a dim of the model's inputs, ignored (its named dims: "
                f"{', '.join(known) or 'none'}); check the spelling"
            )
        self.shapes: dict[str, tuple[int, ...]] = dict(input_shapes)
        self.types: dict[str, int] = {}
        for vi in real_inputs:
            tt = _tensor_type(vi)
            if tt is not None and tt.elem_type:
                self.types[vi.name] = tt.elem_type

        # Initializers: small integer ones (and scalars) are constants and stay inline in the
        # skeleton; everything else becomes a typed graph input there, so no weight bytes are
        # copied and nothing reads data that a stripped file lacks.
        self.constants: dict[str, np.ndarray] = {}
        inline: list[onnx.TensorProto] = []
        skel_inputs = [input_vis.get(vi.name, vi) for vi in real_inputs]
        for tensor in graph.initializer:
            tdims = tuple(int(d) for d in tensor.dims)
            if any(d < 0 for d in tdims):
                raise ModelError(
                    f"initializer '{tensor.name}' has a negative dim {list(tdims)}; the file is "
                    "corrupt: re-export it"
                )
            self.shapes[tensor.name] = tdims
            self.types[tensor.name] = tensor.data_type
            size = math.prod(tdims)
            small_int = tensor.data_type in _SMALL_CONST_TYPES and size <= FOLD_MAX_ELEMENTS
            if tensor.data_location != TensorProto.EXTERNAL and (small_int or size <= 1):
                try:
                    self.constants[tensor.name] = numpy_helper.to_array(tensor)
                    inline.append(tensor)
                    continue
                except Exception:  # data that does not match dims/dtype in a corrupt file
                    self.warn.append(
                        f"initializer '{tensor.name}' has data that does not match its dims and "
                        "dtype; its values are ignored"
                    )
            skel_inputs.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, tdims))
        for name, sp in sparse.items():
            sdims = tuple(int(d) for d in sp.dims)
            self.shapes[name] = sdims
            self.types[name] = sp.values.data_type
            skel_inputs.append(helper.make_tensor_value_info(name, sp.values.data_type, sdims))

        # Constant nodes whose data was stripped to an external file become typed inputs too.
        self.computed: dict[str, tuple[int, ...]] = {}
        dropped: set[int] = set()
        for i, node in enumerate(graph.node):
            if node.op_type != "Constant" or node.domain not in _DEFAULT_DOMAINS or not node.output:
                continue
            for a in node.attribute:
                if a.name == "value" and a.t.data_location == TensorProto.EXTERNAL:
                    tdims = tuple(int(d) for d in a.t.dims)
                    dropped.add(i)
                    self.computed[node.output[0]] = tdims
                    self.types[node.output[0]] = a.t.data_type
                    skel_inputs.append(
                        helper.make_tensor_value_info(node.output[0], a.t.data_type, tdims)
                    )

        out_vis = []
        for vi in graph.output:
            tt = _tensor_type(vi)
            out_vis.append(
                helper.make_tensor_value_info(vi.name, tt.elem_type, None)
                if tt is not None
                else helper.make_empty_tensor_value_info(vi.name)
            )
        self.parts = _Parts(
            inputs=skel_inputs, initializers=inline, outputs=out_vis, dropped_nodes=dropped
        )
        self.declared = _declared(graph, bindings | self.derived, self.derived)
        self.node_outputs = [o for i in self.order for o in graph.node[i].output if o]
        self.node_output_set = set(self.node_outputs)
        self.folded: dict[str, np.ndarray] = {}
        self.done: set[int] = set()
        self.declared_fed: list[str] = []
        self.facts_fed: list[str] = []

    # -- helpers -------------------------------------------------------------------------------

    def known_shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.constants:
            return tuple(self.constants[name].shape)
        if name in self.computed:
            return self.computed[name]
        return self.shapes.get(name)

    def missing(self) -> list[str]:
        return [o for o in self.node_outputs if o not in self.folded and o not in self.computed]

    def skeleton_inputs(self) -> tuple[set[int], dict[str, np.ndarray]]:
        """Nodes replaced by their folded values, and the folded values the rest still reads."""
        nodes = self.graph.node
        removed = {
            i for i in self.order if nodes[i].output and all(o in self.folded for o in nodes[i].output if o)
        }
        needed = {n for i, node in enumerate(nodes) if i not in removed for n in node.input if n}
        needed.update(vi.name for vi in self.graph.output)
        injected = {
            n: v for n, v in self.folded.items() if n in needed and n not in self.init_names
        }
        return removed, injected

    def merge(self, inferred: onnx.ModelProto | None, *, only_new: bool = False) -> bool:
        """Take concrete shapes (and dtypes) of node outputs from an inferred model."""
        if inferred is None:
            return False
        got, got_types = _harvest(inferred)
        gained = False
        for name, shape in got.items():
            if name not in self.node_output_set or name in self.folded:
                continue
            if only_new and name in self.computed:
                continue
            gained |= name not in self.computed
            self.computed[name] = shape
        for name, t in got_types.items():
            self.types.setdefault(name, t)
        return gained

    def fold(self) -> None:
        _fold_pass(self.model, self.order, self.done, self.constants, self.folded, self.known_shape)

    # -- the rounds ----------------------------------------------------------------------------

    def iterate(self, *, facts: bool = True) -> None:
        """Infer, fold, and feed folded values back until no more shapes can be found."""
        use_declared = False
        ort_tried = False
        facts_tried = not facts
        extra: list[onnx.ValueInfoProto] = []
        for _ in range(_MAX_ROUNDS):
            removed, injected = self.skeleton_inputs()
            skel = _skeleton(self.model, self.parts, removed, injected, extra)
            self.merge(_infer(skel, self.warn))
            self.fold()
            missing = self.missing()
            if not missing:
                return
            if self.skeleton_inputs()[1].keys() - injected.keys():
                continue  # newly folded Reshape/Expand/Slice arguments: infer again with them
            if not use_declared:
                extra = _declared_vis(self.declared, missing, self.types)
                if extra:
                    use_declared = True
                    self.declared_fed = [vi.name for vi in extra]
                    continue
            # onnxruntime's inference only adds knowledge of its own (com.microsoft) ops, and it
            # is slow Python: run it only when such an op is where inference stopped.
            if not ort_tried and any(
                self.graph.node[self.producer[o]].domain not in _DEFAULT_DOMAINS for o in missing
            ):
                ort_tried = True
                if self.merge(_ort_infer(skel), only_new=True):
                    self.fold()
                    if self.missing() and self.skeleton_inputs()[1].keys() - injected.keys():
                        continue
            # Last: shapes the graph's structure alone determines (a graph-only file whose shape
            # constants were stripped), fed back so that inference resumes after them.
            if not facts_tried:
                facts_tried = True
                solved = self.solve_from_facts()
                if solved:
                    extra = extra + solved
                    self.facts_fed = [vi.name for vi in solved]
                    continue
            return

    def _facts(self) -> dict[str, tuple[int, ...]]:
        """:func:`solve_shapes` on what this resolver knows."""
        known: dict[str, tuple[int, ...]] = dict(self.shapes)
        known.update(self.computed)
        known.update({n: tuple(v.shape) for n, v in self.folded.items()})
        known.update({n: tuple(v.shape) for n, v in self.constants.items()})
        partial = {
            name: decl.values
            for name, decl in self.declared.items()
            if decl.values is not None and name not in known
        }
        return solve_shapes(self.graph, self.order, known, partial)

    def _probe(self, names: set[str]) -> dict[str, tuple[int, ...]]:
        """Shapes of ``names`` solved at probe bindings (distinct large primes), mapped back.

        At the caller's dims two shapes can both fit the facts by coincidence (seq 16 and 16 heads
        make ``[2, 16, 1024]`` as consistent as ``[32, 16, 64]``); at pairwise distinct primes only
        the structural answer does, and each of its dims, factored by the primes, is the same
        product of the caller's dims.
        """
        if not self.bindings or len(self.bindings) > len(_PROBE_PRIMES):
            return {}
        probes = dict(zip(sorted(self.bindings), _PROBE_PRIMES))
        try:
            other = _Resolver(self.model, probes)
            other.iterate(facts=False)
            solved = other._facts()
        except PlannerError:
            return {}
        literals = {int(d) for t in self.graph.initializer for d in t.dims}
        for decl in self.declared.values():
            literals.update(int(v) for v, text in zip(decl.values or (), decl.texts) if text.isdigit() and v is not None)
        back: dict[str, tuple[int, ...]] = {}
        for name in names:
            shape = solved.get(name) or other.computed.get(name)
            if shape is None:
                continue
            dims = [_unprobe(d, probes, self.bindings, literals) for d in shape]
            if all(d is not None for d in dims):
                back[name] = tuple(dims)  # type: ignore[arg-type]
        return back

    def solve_from_facts(self) -> list[onnx.ValueInfoProto]:
        """Value infos for missing values whose shape the graph's facts determine."""
        solved = self._facts()
        missing = set(self.missing())
        unsolved = missing - solved.keys()
        if unsolved:
            solved.update(self._probe(unsolved))
        out = []
        for name, shape in solved.items():
            elem = self.types.get(name) or (self.declared[name].elem_type if name in self.declared else 0)
            if name in missing and elem and all(0 < d <= _MAX_DIM for d in shape):
                out.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return out

    # -- the result ----------------------------------------------------------------------------

    def result(self) -> ShapedModel:
        graph = self.graph
        # Values fed from value_info whose inferred shape is just that declaration.
        filled = [
            n
            for n in self.declared_fed
            if n in self.computed and n in self.declared and self.declared[n].values == self.computed[n]
        ]
        # Last resort: declared shapes for what is still unknown (inference may have failed).
        for name in self.missing():
            decl = self.declared.get(name)
            if decl and decl.values is not None and all(v is not None for v in decl.values):
                self.computed[name] = tuple(int(v) for v in decl.values)  # type: ignore[arg-type]
                filled.append(name)

        shapes = self.shapes
        for name in self.node_outputs:
            if name in self.folded:
                shapes[name] = tuple(self.folded[name].shape)
            elif name in self.computed:
                shapes[name] = self.computed[name]
        dtypes: dict[str, str] = {}
        for name, decl in self.declared.items():
            if decl.elem_type and (dname := _dtype_name(decl.elem_type)) is not None:
                dtypes[name] = dname
        for name, t in self.types.items():
            if (dname := _dtype_name(t)) is not None:
                dtypes[name] = dname
        for name, value in self.constants.items():
            dtypes[name] = value.dtype.name

        _check_positive(graph, self.order, shapes, dtypes, self.constants)
        warn = self.warn
        if filled:
            warn.append(
                f"shapes of {len(filled)} values were taken from the model's declared value_info "
                f"because they could not be computed (e.g. {_limited(filled)})"
            )
        if self.facts_fed:
            warn.append(
                f"shapes of {len(self.facts_fed)} values were derived from the graph's structure because "
                f"their shape constants are absent (e.g. {_limited(self.facts_fed)})"
            )
        _contradictions(self.declared, shapes, set(filled), warn)
        unknown = [o for o in self.node_outputs if o not in shapes]
        if unknown:
            ops = sorted({graph.node[self.producer[o]].op_type for o in unknown})
            warn.append(
                f"could not compute the shapes of {len(unknown)} values ({_limited(unknown)}; "
                f"from {_limited(ops)} nodes); they are left out"
            )
        bound = dict(self.bindings)
        bound.update(self.derived)
        return ShapedModel(
            model=self.model,
            shapes=shapes,
            dtypes=dtypes,
            constants=self.constants,
            dim_bindings=bound,
            warnings=tuple(dict.fromkeys(printable(w) for w in warn)),
        )


def _declared_vis(
    declared: Mapping[str, _Decl], names: Iterable[str], types: Mapping[str, int]
) -> list[onnx.ValueInfoProto]:
    """Concrete declared value infos for ``names`` (those whose every dim evaluates)."""
    out = []
    for name in names:
        decl = declared.get(name)
        if decl is None or decl.values is None:
            continue
        if any(v is None or not 0 <= v <= _MAX_DIM for v in decl.values):
            continue
        elem = decl.elem_type or types.get(name, 0)
        if elem:
            out.append(helper.make_tensor_value_info(name, elem, list(decl.values)))
    return out


def _check_positive(
    graph: onnx.GraphProto,
    order: Sequence[int],
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, str],
    constants: Mapping[str, np.ndarray],
) -> None:
    """ModelError for a runtime activation with a zero or negative dim.

    Integer and bool values are exempt: empty index/shape vectors are normal in shape subgraphs.
    """
    for i in order:
        node = graph.node[i]
        for name in node.output:
            shape = shapes.get(name) if name else None
            if shape is None or name in constants or dtypes.get(name, "float32") in _INT_NAMES:
                continue
            if any(d <= 0 for d in shape):
                raise ModelError(
                    f"value '{name}' ({node.op_type} node '{node.name}') has computed shape "
                    f"{list(shape)} with a zero or negative dim; pass larger --dim values or "
                    "re-export the model"
                )


_INT_NAMES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "string"}
)


def _contradictions(
    declared: Mapping[str, _Decl],
    shapes: Mapping[str, tuple[int, ...]],
    skip: set[str],
    warn: list[str],
) -> None:
    """Warn where a declared shape disagrees with the computed one (the computed one is kept)."""
    found: list[str] = []
    for name, decl in declared.items():
        if decl.values is None or name in skip or name not in shapes:
            continue
        shape = shapes[name]
        if len(decl.values) != len(shape) or any(
            v is not None and v != s for v, s in zip(decl.values, shape)
        ):
            found.append(f"'{name}' declared [{', '.join(decl.texts)}], computed {list(shape)}")
    for line in found[:_MAX_LISTED]:
        warn.append(f"{line}: declared shape contradicts the computed one; using the computed one")
    if len(found) > _MAX_LISTED:
        warn.append(
            f"... and {len(found) - _MAX_LISTED} more declared shapes contradict computed ones"
        )
