"""An imported op graph moved to another batch size without importing the file again.

The pipeline search prices a model at many micro-batch sizes, and importing a large graph costs
about a second each time (GPT-3 175B: 1.2 s, 19 sizes at 1,024 devices). Everything in an
:class:`~planner.core.graph.OpGraph` that depends on the batch is linear in it: the size of each
batch dim (``IterDim.is_batch``, the samples or a flattened ``batch x seq``), the tensor axes those
dims index, and the FLOPs of every op that iterates over a batch dim. :func:`rebatch` scales them.

Linearity is a property of the file, not a proof: a reshape could fold the batch into a dim the
importer does not mark, or an exporter may special-case a size. So :func:`scales_linearly` checks
it on the model itself: the graph imported at one batch, rebatched to a second, must equal the
graph imported at that second batch (ops, dims, accesses, FLOPs, tensors, edges, blocks, the
bound dims); only then does a caller rebatch to further sizes. ``NodeSpec`` (the ONNX node kept
for profiling) is not rebatched: a caller that profiles shards (``--cost measured``) imports.

Batch 1 is never reached this way: the importer drops batch dims of size 1, so its graph has other
ops (:func:`rebatch` returns ``None``).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import math

from planner.core.graph import Op, OpGraph, Tensor

__all__ = ["rebatch", "scales_linearly"]


def _scaled(size: int, old: int, new: int) -> int | None:
    return None if size % old else size // old * new


def _batch_axes(graph: OpGraph) -> dict[str, set[int]]:
    """Per tensor, the axes some op indexes with a batch dim."""
    axes: dict[str, set[int]] = {}
    for op in graph.ops:
        batch = {d.name for d in op.dims if d.is_batch}
        if not batch:
            continue
        for access in (*op.inputs, *op.outputs):
            for axis, names in enumerate(access.axes):
                if batch.intersection(names):
                    axes.setdefault(access.tensor, set()).add(axis)
    return axes


def _rebatched_op(op: Op, old: int, new: int) -> Op | None:
    dims = []
    for dim in op.dims:
        if not dim.is_batch:
            dims.append(dim)
            continue
        size = _scaled(dim.size, old, new)
        if size is None:
            return None
        dims.append(dataclasses.replace(dim, size=size))
    if not any(d.is_batch for d in op.dims):
        return op
    return dataclasses.replace(op, dims=tuple(dims), flops=op.flops / old * new)


def _rebatched_tensor(tensor: Tensor, axes: set[int], old: int, new: int) -> Tensor | None:
    shape = []
    for axis, size in enumerate(tensor.shape):
        scaled = _scaled(size, old, new) if axis in axes else size
        if scaled is None:
            return None
        shape.append(scaled)
    return dataclasses.replace(tensor, shape=tuple(shape))


def _rebatched_bindings(bindings: Mapping[str, int], batch_dim: str, new: int) -> dict[str, int]:
    """The bound dims with the batch replaced and every expression of it evaluated again."""
    from importers.dim_expr import eval_dim_expr

    base = {name: value for name, value in bindings.items() if name.isidentifier()}
    base[batch_dim] = new
    out = {}
    for name, value in bindings.items():
        out[name] = base[name] if name in base else eval_dim_expr(name, base)
    return out


def rebatch(graph: OpGraph, *, batch_dim: str, batch: int) -> OpGraph | None:
    """``graph`` (imported with ``batch_dim`` bound) at ``batch`` samples, or ``None`` when a batch
    size involved is 1 or some batch-indexed size is not a multiple of the old batch.

    Only valid for models :func:`scales_linearly` accepts.
    """
    old = graph.dim_bindings.get(batch_dim)
    if old is None or old <= 1 or batch <= 1:
        return None
    if batch == old:
        return graph
    ops = []
    for op in graph.ops:
        moved = _rebatched_op(op, old, batch)
        if moved is None:
            return None
        ops.append(moved)
    axes = _batch_axes(graph)
    tensors = {}
    for name, tensor in graph.tensors.items():
        moved = _rebatched_tensor(tensor, axes.get(name, set()), old, batch) if name in axes else tensor
        if moved is None:
            return None
        tensors[name] = moved
    try:
        bindings = _rebatched_bindings(graph.dim_bindings, batch_dim, batch)
    except Exception:  # an expression the evaluator does not read: not provably linear
        return None
    return dataclasses.replace(graph, ops=tuple(ops), tensors=tensors, dim_bindings=bindings)


def _comparable(graph: OpGraph) -> tuple:
    ops = tuple(dataclasses.replace(op, node=None, flops=0.0) for op in graph.ops)
    return (ops, dict(graph.tensors), graph.edges, graph.blocks, dict(graph.dim_bindings))


def scales_linearly(imported: OpGraph, again: OpGraph, *, batch_dim: str) -> bool:
    """Whether ``imported`` rebatched to ``again``'s batch equals ``again`` (both imported from one
    file at two batch sizes; FLOPs to 1e-12): the check that lets a caller rebatch this model to
    other sizes."""
    moved = rebatch(imported, batch_dim=batch_dim, batch=again.dim_bindings.get(batch_dim, 0))
    if moved is None or len(moved.ops) != len(again.ops) or _comparable(moved) != _comparable(again):
        return False
    return all(math.isclose(a.flops, b.flops, rel_tol=1e-12, abs_tol=0.0) for a, b in zip(moved.ops, again.ops))
