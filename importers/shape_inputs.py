r"""Shape stages 0-1: validate the graph, then bind the graph inputs' dims.

0. **Validate** the graph: a topological order (dangling inputs, cycles and values produced twice
   are ModelErrors) and each standard op against its schema, because ONNX's C++ inference aborts
   the process on some malformed nodes. → ``_topo_order()``, ``_validate_nodes()``
1. **Bind** graph-input dims from ``dims`` (``{"batch": 32, "seq": 1024}``); derived names such as
   ``batch*seq`` or ``seq + 1`` are evaluated by :func:`importers.dim_expr.eval_dim_expr`. An
   unknown name raises :class:`~planner.core.errors.UnboundDimError` naming the dim, where it
   appears (``input_ids[1]``) and the ``--dim`` flag. → ``_bind_inputs()``
"""

from __future__ import annotations

import ast
from collections import deque
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from importers.dim_expr import _MAX_DIM, _parse_dim, eval_dim_expr
from importers.onnx_protos import _DEFAULT_DOMAINS, _attr, _dim_text, _first_line, _is_anonymous, _tensor_type
from planner.core.errors import ModelError, UnboundDimError


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
    missing: list[UnboundDimError] = []  # every unbound dim of the used inputs, named in one error
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
        unbound: list[UnboundDimError] = []
        for axis, d in enumerate(tt.shape.dim):
            where = f"{vi.name}[{axis}]"
            try:
                value = _bound_value(d, where, vi.name, bindings, derived)
            except UnboundDimError as exc:
                unbound.append(exc)
                continue
            if value <= 0 or value > _MAX_DIM:
                raise ModelError(
                    f"graph input '{vi.name}' dim {axis} ({_dim_text(d)}) is {value}; dims must "
                    f"be positive and below 2**62: pass a sensible --dim value or re-export "
                    "the model"
                )
            dims.append(value)
        if unbound:
            if used:
                missing += unbound
            else:
                warn.append(f"graph input '{vi.name}' is unused and has an unbound dim ({unbound[0]})")
            continue
        shapes[vi.name] = tuple(dims)
        concrete_vis[vi.name] = helper.make_tensor_value_info(vi.name, tt.elem_type, dims)
    if missing:
        raise UnboundDimError.of_all(missing)
    return shapes, concrete_vis


def _bound_value(dim: onnx.TensorShapeProto.Dimension, where: str, input_name: str, bindings: dict[str, int],
                 derived: dict[str, int]) -> int:
    """The value of one dim of a graph input: its number, its ``--dim input[axis]`` binding or its
    expression over the bound names (recorded in ``derived``); :class:`UnboundDimError` when unbound."""
    if dim.WhichOneof("value") == "dim_value":
        return int(dim.dim_value)
    if where in bindings:
        return bindings[where]
    if _is_anonymous(dim):
        raise UnboundDimError(where, f"an unnamed dim of graph input '{input_name}'")
    value = eval_dim_expr(dim.dim_param, bindings, where=where)
    derived[dim.dim_param] = value
    return value
