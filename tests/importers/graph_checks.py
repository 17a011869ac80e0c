"""Structural invariants every imported OpGraph must satisfy (shared by the importer tests)."""

from __future__ import annotations

import math

from planner.core.graph import OpGraph

__all__ = ["check_graph"]


def check_graph(graph: OpGraph) -> list[str]:
    """Problems found in ``graph`` (empty when it is well formed).

    * every access names a known tensor, with one entry per tensor axis, and only the op's dims;
    * the dims indexing an axis never hold more elements than the axis (a split never exceeds it),
      except an op's spatial dims reading a strided input window;
    * op names unique, edges go from an earlier op to a later one through a tensor the producer
      writes and the consumer reads; every activation read has exactly one producer;
    * blocks list ops of equal signature at each position, without overlap.
    """
    problems: list[str] = []
    names = [op.name for op in graph.ops]
    if len(set(names)) != len(names):
        problems.append("duplicate op names")
    producers: dict[str, int] = {}
    for index, op in enumerate(graph.ops):
        dims = {d.name: d for d in op.dims}
        if len(dims) != len(op.dims):
            problems.append(f"{op.name}: duplicate dim names")
        for access in op.inputs + op.outputs:
            tensor = graph.tensors.get(access.tensor)
            if tensor is None:
                problems.append(f"{op.name}: unknown tensor {access.tensor}")
                continue
            if len(access.axes) != len(tensor.shape):
                problems.append(f"{op.name}: {access.tensor} has rank {len(tensor.shape)}, access {access.axes}")
                continue
            for axis, (size, indexing) in enumerate(zip(tensor.shape, access.axes)):
                unknown = [d for d in indexing if d not in dims]
                if unknown:
                    problems.append(f"{op.name}: {access.tensor} axis {axis} uses unknown dims {unknown}")
                    continue
                extent = math.prod(dims[d].size for d in indexing)
                spatial = any(dims[d].kind == "spatial" for d in indexing)
                if extent > size and not spatial:
                    problems.append(f"{op.name}: {access.tensor} axis {axis} (size {size}) indexed by {indexing} ({extent})")
        for position, access in enumerate(op.outputs):
            if access.tensor in producers:
                problems.append(f"{access.tensor} produced twice")
            producers[access.tensor] = index
            if graph.tensors[access.tensor].role != "activation":
                problems.append(f"{op.name}: output {access.tensor} is not an activation")
    for op in graph.ops:
        for access in op.inputs:
            tensor = graph.tensors.get(access.tensor)
            if tensor is not None and tensor.role == "activation" and access.tensor not in producers:
                problems.append(f"{op.name}: activation {access.tensor} has no producer")
    for edge in graph.edges:
        if not edge.producer < edge.consumer:
            problems.append(f"edge {edge.tensor}: {edge.producer} -> {edge.consumer} goes backwards")
        if graph.ops[edge.producer].outputs[edge.producer_output].tensor != edge.tensor:
            problems.append(f"edge {edge.tensor}: wrong producer_output")
        if graph.ops[edge.consumer].inputs[edge.consumer_input].tensor != edge.tensor:
            problems.append(f"edge {edge.tensor}: wrong consumer_input")
    seen: set[int] = set()
    for block in graph.blocks:
        lengths = {len(instance) for instance in block.instances}
        if len(lengths) != 1 or len(block.instances) < 2:
            problems.append(f"block {block.name}: ragged or single instance")
            continue
        for j in range(lengths.pop()):
            if len({graph.ops[inst[j]].signature() for inst in block.instances}) != 1:
                problems.append(f"block {block.name}: position {j} signatures differ")
        for instance in block.instances:
            if seen & set(instance):
                problems.append(f"block {block.name}: overlaps another block")
            seen |= set(instance)
    return problems
