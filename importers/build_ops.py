r"""Coarsening stage 7: each group becomes an :class:`~planner.core.graph.Op`.

``_build_op``: accesses through views onto the original tensors; an op dim that indexes a view axis
made of several original axes is split into sub-dims (a Gemm's ``m`` over a ``[batch*seq, hidden]``
reshape becomes ``m_0`` (batch) x ``m_1`` (seq)); batch dims are marked by following the graph
inputs' batch axes (``_mark_batch``); ops whose node carries no module path take their
neighbours' common one (``_infer_module_paths``).

Operand order of an op: the main node's non-constant inputs in node order, then the inputs of the
nodes fused into it. ``Op.node`` describes the main node alone (with ``input_axes``, the dims
indexing its inputs as it sees them, before views are folded).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Callable, Mapping

import numpy as np
from onnx import numpy_helper

from importers.coarse_model import Axes, _Group, _Model, module_path_of
from importers.op_rules import RuleResult
from planner.core.graph import Edge, IterDim, NodeSpec, Op, TensorAccess


# --------------------------------------------------------------------------------------------
# 7. Ops
# --------------------------------------------------------------------------------------------


def _refinement(size: int, factorizations: list[list[int]]) -> list[int] | None:
    """Common refinement of ordered factorizations of ``size`` (outer to inner), or ``None``.

    >>> _refinement(4096, [[8, 512]]), _refinement(24, [[4, 6], [6, 4]])
    ([8, 512], None)
    """
    bounds: set[int] = set()
    for parts in factorizations:
        acc = 1
        for part in parts[:-1]:
            acc *= part
            bounds.add(acc)
    ordered = sorted(b for b in bounds if 1 < b < size)
    previous = 1
    sizes = []
    for bound in ordered + [size]:
        if bound % previous:
            return None
        sizes.append(bound // previous)
        previous = bound
    return sizes


def _expand_axes(axes: Axes, subdims: Mapping[str, list[str]]) -> Axes:
    return tuple(tuple(s for d in axis for s in subdims.get(d, [d])) for axis in axes)


def _resolve_access(
    m: _Model,
    value: str,
    axes: Axes,
    dim_size: Mapping[str, int],
    subdims: Mapping[str, list[str]],
    sub_sizes: Mapping[str, list[int]],
) -> tuple[str, Axes]:
    """Access of ``value`` (indexed by ``axes``) re-expressed on the tensor it reads."""
    view = m.views.get(value)
    if view is None:
        return _through_parts(m, value, _expand_axes(axes, subdims))
    origin_entries: list[list[tuple[int, tuple[str, ...]]]] = [[] for _ in view.origin_axes]
    for j, dims in enumerate(axes):
        if not dims or j >= len(view.axes):
            continue
        pieces = view.pieces(j)
        if not pieces:
            continue
        if len(dims) == 1 and len(pieces) > 1 and dims[0] in sub_sizes and math.prod(p.size for p in pieces) == dim_size[dims[0]]:
            subs = subdims[dims[0]]
            sizes = sub_sizes[dims[0]]
            k = 0
            for piece in pieces:
                covered: list[str] = []
                acc = 1
                while k < len(subs) and acc < piece.size:
                    covered.append(subs[k])
                    acc *= sizes[k]
                    k += 1
                if piece.origin_axis is not None and covered:
                    origin_entries[piece.origin_axis].append((piece.position, tuple(covered)))
            continue
        first = pieces[0]
        if first.origin_axis is not None:
            expanded = tuple(s for d in dims for s in subdims.get(d, [d]))
            origin_entries[first.origin_axis].append((first.position, expanded))
    origin_axes = tuple(tuple(d for _, ds in sorted(entries) for d in ds) for entries in origin_entries)
    return _through_parts(m, view.origin, origin_axes)


def _through_parts(m: _Model, name: str, axes: Axes) -> tuple[str, Axes]:
    """Access of a weight part re-expressed on the parameter it was cut from."""
    part = m.part_views.get(name)
    if part is None:
        return name, axes
    root, amap = part
    root_axes: list[tuple[str, ...]] = [()] * len(m.shape(root) or ())
    for j, dims in enumerate(axes):
        if j < len(amap) and amap[j] is not None and amap[j] < len(root_axes):
            root_axes[amap[j]] = root_axes[amap[j]] + dims
    return root, tuple(root_axes)


def _split_requests(m: _Model, accesses: list[tuple[str, Axes]], dim_size: Mapping[str, int]) -> dict[str, list[list[int]]]:
    requests: dict[str, list[list[int]]] = {}
    for value, axes in accesses:
        view = m.views.get(value)
        if view is None:
            continue
        for j, dims in enumerate(axes):
            if len(dims) != 1 or j >= len(view.axes):
                continue
            pieces = view.pieces(j)
            sizes = [p.size for p in pieces]
            if len(pieces) > 1 and math.prod(sizes) == dim_size.get(dims[0], -1):
                requests.setdefault(dims[0], []).append(sizes)
    return requests


def _node_spec(m: _Model, index: int, result: RuleResult, subdims: Mapping[str, list[str]]) -> NodeSpec:
    node = m.nodes[index]
    constant_inputs: dict[int, bytes] = {}
    input_axes: list[tuple[tuple[str, ...], ...] | None] = [None] * len(node.input)
    for position, name in enumerate(node.input):
        if name and m.status.get(name) == "const":
            value = m.constant(name)
            if value is not None:
                try:
                    constant_inputs[position] = numpy_helper.from_array(np.asarray(value), name).SerializeToString()
                except Exception:
                    pass
    for position, axes in result.inputs:
        if position < len(node.input) and m.status.get(node.input[position]) != "const":
            input_axes[position] = _expand_axes(axes, subdims)
    output_axes: list[tuple[tuple[str, ...], ...] | None] = [None] * len(node.output)
    for position, axes in result.outputs:
        if position < len(node.output):
            output_axes[position] = _expand_axes(axes, subdims)
    return NodeSpec(
        op_type=node.op_type,
        domain=node.domain,
        attributes=tuple(a.SerializeToString() for a in node.attribute),
        input_shapes=tuple(m.shape(n) or () for n in node.input),
        input_dtypes=tuple(m.dtype(n) if n else "" for n in node.input),
        output_shapes=tuple(m.shape(n) or () for n in node.output),
        output_dtypes=tuple(m.dtype(n) if n else "" for n in node.output),
        constant_inputs=constant_inputs,
        opset=m.opset or 18,
        input_axes=tuple(input_axes),
        output_axes=tuple(output_axes),
    )


def _external_outputs(m: _Model, group: _Group) -> list[str]:
    members = set(group.members)
    result = []
    for index in group.members:
        if index in m.view_nodes:
            continue
        for o in m.nodes[index].output:
            if not o or o not in group.value_axes:
                continue
            if o in m.outputs or any(c not in members for c, _ in m.consumers.get(o, ())):
                result.append(o)
    if not result:
        node = m.nodes[group.main]
        first = next((o for o in node.output if o and o in group.value_axes), None)
        if first is not None:
            result.append(first)
    return result


def _build_op(m: _Model, group: _Group) -> tuple[Op, list[tuple[str, tuple[int, ...]]], dict[str, Axes]]:
    """One coarse op (batch dims not yet marked); also its output tensors and their axes."""
    result = group.result
    main = m.nodes[group.main]
    raw_inputs: list[tuple[str, Axes]] = []
    internal = {o for i in group.members for o in m.nodes[i].output if o}
    if group.spec_override is None:
        for position, axes in result.inputs:
            name = main.input[position] if position < len(main.input) else ""
            if name and name not in internal and m.status.get(name) in ("act", "param"):
                raw_inputs.append((name, axes))
    raw_inputs.extend((n, a) for n, a in group.extra_inputs if n not in internal)
    outputs = _external_outputs(m, group)
    dim_size = {d.name: d.size for d in result.dims}
    # Sub-dims where a view axis spans several original axes (see _resolve_access).
    requests = _split_requests(m, raw_inputs, dim_size)
    subdims: dict[str, list[str]] = {}
    sub_sizes: dict[str, list[int]] = {}
    used = set(dim_size)
    for dim_name, factorizations in requests.items():
        sizes = _refinement(dim_size[dim_name], factorizations)
        if sizes is None or len(sizes) < 2:
            continue
        names = []
        for i in range(len(sizes)):
            candidate = f"{dim_name}_{i}"
            while candidate in used:
                candidate += "_"
            used.add(candidate)
            names.append(candidate)
        subdims[dim_name] = names
        sub_sizes[dim_name] = sizes
    dims: list[IterDim] = []
    for dim in result.dims:
        if dim.name in subdims:
            for i, (name, size) in enumerate(zip(subdims[dim.name], sub_sizes[dim.name])):
                inner = i == len(sub_sizes[dim.name]) - 1
                dims.append(replace(dim, name=name, size=size, halo=dim.halo if inner else 0, stride=dim.stride if inner else 1))
        else:
            dims.append(dim)
    inputs: list[TensorAccess] = []
    seen: set[tuple[str, Axes]] = set()
    for value, axes in raw_inputs:
        tensor, resolved = _resolve_access(m, value, axes, dim_size, subdims, sub_sizes)
        if tensor in m.aliases:
            # The copy is the canonical table transposed: read the table with the axes swapped.
            tensor, resolved = m.aliases[tensor], tuple(reversed(resolved))
        elif tensor in m.shared_copies:
            tensor = m.shared_copies[tensor]  # one module's weight, copied per call: read the weight
        if (tensor, resolved) not in seen:
            seen.add((tensor, resolved))
            inputs.append(TensorAccess(tensor=tensor, axes=resolved))
    out_accesses = []
    out_axes: dict[str, Axes] = {}
    for name in outputs:
        axes = _expand_axes(group.value_axes[name], subdims)
        out_axes[name] = axes
        out_accesses.append(TensorAccess(tensor=name, axes=axes))
    spec = group.spec_override
    if spec is not None and subdims:
        spec = replace(
            spec,
            input_axes=tuple(_expand_axes(a, subdims) if a is not None else None for a in spec.input_axes),
            output_axes=tuple(_expand_axes(a, subdims) if a is not None else None for a in spec.output_axes),
        )
    if spec is None:
        spec = _node_spec(m, group.main, result, subdims)
    onnx_nodes = (m.names[group.main],) + tuple(m.names[i] for i in group.members if i != group.main)
    op = Op(
        name=m.names[group.main],
        kind=group.kind or result.kind,  # type: ignore[arg-type]
        op_type=spec.op_type if group.spec_override is not None else main.op_type,
        dims=tuple(dims),
        inputs=tuple(inputs),
        outputs=tuple(out_accesses),
        flops=float(group.flops),
        backward_flops_factor=result.backward_flops_factor,
        fused_pointwise=group.fused_pointwise,
        onnx_nodes=onnx_nodes,
        node_types=tuple(m.nodes[i].op_type for i in sorted({group.main, *group.members})),  # graph order
        module_path=module_path_of(main),
        node=spec,
        note=result.note,
    )
    return op, [(name, m.shape(name) or ()) for name in outputs], out_axes


def _input_batch_axes(m: _Model) -> dict[str, set[int]]:
    """Batch axes of the graph inputs: axes whose symbolic dim is named like a batch, else axis 0."""
    named: dict[str, set[int]] = {}
    declared = {i.name: i for i in m.graph.input}
    any_named = False
    for name in m.inputs:
        axes: set[int] = set()
        info = declared.get(name)
        if info is not None and info.type.HasField("tensor_type"):
            for axis, dim in enumerate(info.type.tensor_type.shape.dim):
                if dim.dim_param and re.search(r"batch", dim.dim_param, re.IGNORECASE) and "*" not in dim.dim_param:
                    axes.add(axis)
        any_named |= bool(axes)
        named[name] = axes
    result: dict[str, set[int]] = {}
    for name in m.inputs:
        shape = m.shape(name) or ()
        if any_named:
            result[name] = named[name]
        elif shape:
            result[name] = {0}
        else:
            result[name] = set()
    return result


def _mark_batch(ops: list[Op], batch_axes: dict[str, set[int]],
                tiled: Callable[[Op, dict[str, set[int]]], set[int]] | None = None) -> list[Op]:
    """Mark ``IterDim.is_batch`` by following batch axes from the graph inputs through accesses; ``tiled``: the
    output axes an op repeats once per sample (:func:`importers.shape_batch.tiled_batch_axes`)."""
    marked: list[Op] = []
    samples = {name: set(axes) for name, axes in batch_axes.items()}  # axes that are the samples alone
    for op in ops:
        batch_dims: set[str] = set()
        for axis in tiled(op, samples) if tiled is not None and op.outputs else ():
            if axis < len(op.outputs[0].axes) and op.outputs[0].axes[axis]:
                batch_dims.add(op.outputs[0].axes[axis][0])
        for access in op.inputs:
            axes = batch_axes.get(access.tensor)
            if not axes:
                continue
            for axis in axes:
                if axis < len(access.axes) and access.axes[axis]:
                    batch_dims.add(access.axes[axis][0])
        if batch_dims:
            op = replace(op, dims=tuple(replace(d, is_batch=d.name in batch_dims) for d in op.dims))
        for access in op.outputs:
            axes = {i for i, dims in enumerate(access.axes) if dims and dims[0] in batch_dims}
            if axes:
                batch_axes[access.tensor] = axes
                # a flattened batch x heads axis is not the sample count a Tile may repeat by
                samples[access.tensor] = {i for i in axes if len(access.axes[i]) == 1}
        marked.append(op)
    return marked


def _common_prefix(paths: list[str]) -> str | None:
    """Longest common dotted prefix: ``a.b.c`` and ``a.b.d`` -> ``a.b``."""
    split = [p.split(".") for p in paths]
    common: list[str] = []
    for parts in zip(*split):
        if any(part != parts[0] for part in parts):
            break
        common.append(parts[0])
    return ".".join(common) or None


def _infer_module_paths(ops: list[Op], edges: list[Edge]) -> list[Op]:
    """Ops without a module path (nodes an optimiser created) take their neighbours' common prefix."""
    neighbours: list[list[int]] = [[] for _ in ops]
    for edge in edges:
        neighbours[edge.consumer].append(edge.producer)
        neighbours[edge.producer].append(edge.consumer)
    result = list(ops)
    for index, op in enumerate(ops):
        if op.module_path is not None:
            continue
        paths = [ops[n].module_path for n in neighbours[index] if ops[n].module_path]
        if paths:
            result[index] = replace(op, module_path=_common_prefix(paths))  # type: ignore[arg-type]
    return result
