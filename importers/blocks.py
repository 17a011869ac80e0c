"""Repeated blocks (transformer layers, ResNet stages) in a coarse op graph.

A :class:`~planner.core.graph.BlockGroup` lists instances whose j-th ops have equal
:meth:`~planner.core.graph.Op.signature` and whose internal edges correspond, in graph order, so the
search can build one set of cost tables per group.

Two sources:

* **Module paths** (exporter metadata or TorchScript node names): every op whose path has a numbered
  component belongs to the instance named by the *outermost* one (``transformer.h.3.attn`` ->
  list ``transformer.h``, instance 3; ``layer1.0.conv1`` -> ``layer1``, 0). Instances of one list
  with identical op signatures and internal edges form a group; a list whose instances differ (the
  first ResNet block of a stage has a downsample branch) yields a group of the identical ones.
* **Structure**, when no module paths are known: maximal tandem repeats of the op-signature sequence
  (``ABCABCABC``), found per period length with vectorised comparisons, non-overlapping, largest
  coverage first.
"""

from __future__ import annotations

import re

import numpy as np

from planner.core.graph import BlockGroup, Edge, OpGraph

__all__ = ["find_blocks"]

_NUMBERED = re.compile(r"^\d+$")


_MAX_PERIOD = 1024
"""Longest block (coarse ops) the structural search looks for. A transformer layer is 10-20 ops;
the bound keeps the search linear in the graph size (each period is one pass over the ops)."""

_OutEdges = list[list[Edge]]


def _out_edges(graph: OpGraph) -> _OutEdges:
    """Edges by producer op, so an instance's edges are found without scanning every edge."""
    out: _OutEdges = [[] for _ in graph.ops]
    for edge in graph.edges:
        if 0 <= edge.producer < len(out):
            out[edge.producer].append(edge)
    return out


def _internal_edges(out_edges: _OutEdges, instance: tuple[int, ...]) -> tuple:
    position = {op: j for j, op in enumerate(instance)}
    edges = []
    for op in instance:
        for edge in out_edges[op]:
            if edge.consumer in position:
                edges.append((position[edge.producer], position[edge.consumer], edge.producer_output, edge.consumer_input))
    return tuple(sorted(edges))


def _instance_key(out_edges: _OutEdges, instance: tuple[int, ...], signature_ids: list[int]) -> tuple:
    return (tuple(signature_ids[i] for i in instance), _internal_edges(out_edges, instance))


def _from_module_paths(graph: OpGraph, signature_ids: list[int], out_edges: _OutEdges) -> list[BlockGroup]:
    lists: dict[str, dict[int, list[int]]] = {}
    for index, op in enumerate(graph.ops):
        if not op.module_path:
            continue
        parts = op.module_path.split(".")
        for k, part in enumerate(parts):
            if _NUMBERED.match(part):
                lists.setdefault(".".join(parts[:k]), {}).setdefault(int(part), []).append(index)
                break
    groups: list[BlockGroup] = []
    for list_name, instances in lists.items():
        if len(instances) < 2:
            continue
        classes: dict[tuple, list[tuple[int, tuple[int, ...]]]] = {}
        for number in sorted(instances):
            ops = tuple(sorted(instances[number]))
            classes.setdefault(_instance_key(out_edges, ops, signature_ids), []).append((number, ops))
        found = [members for members in classes.values() if len(members) >= 2]
        for members in found:
            numbers = [n for n, _ in members]
            name = list_name or "blocks"
            if len(found) > 1 or len(members) < len(instances):
                name = f"{name}[{_ranges(numbers)}]"
            groups.append(BlockGroup(name=name, instances=tuple(ops for _, ops in members)))
    return groups


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3,5"``."""
    parts = []
    start = prev = numbers[0]
    for n in numbers[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


def _structural(graph: OpGraph, signature_ids: list[int], taken: set[int], out_edges: _OutEdges) -> list[BlockGroup]:
    """Tandem repeats (periods up to ``_MAX_PERIOD`` ops) of the signature sequence among ops not
    already in a group."""
    free = [i for i in range(len(graph.ops)) if i not in taken]
    seq = np.array([signature_ids[i] for i in free], dtype=np.int64)
    n = len(seq)
    candidates: list[tuple[int, int, int, int]] = []  # (-saved, period, start, count)
    for period in range(2, min(n // 2, _MAX_PERIOD) + 1):
        equal = seq[:-period] == seq[period:]
        if not equal.any():
            continue
        padded = np.concatenate(([False], equal, [False]))
        changes = np.flatnonzero(padded[1:] != padded[:-1])
        for start, stop in zip(changes[::2], changes[1::2]):
            run = stop - start
            count = (run + period) // period
            if count >= 2:
                candidates.append((-(count - 1) * period, period, int(start), int(count)))
    candidates.sort()
    used = np.zeros(n, dtype=bool)
    groups: list[BlockGroup] = []
    for _, period, start, count in candidates:
        stop = start + period * count
        if used[start:stop].any():
            continue
        instances = tuple(tuple(free[start + k * period + j] for j in range(period)) for k in range(count))
        keys = {_internal_edges(out_edges, inst) for inst in instances}
        if len(keys) != 1 or not keys.pop():
            continue  # same op kinds but different wiring, or unconnected ops: not a block
        used[start:stop] = True
        groups.append(BlockGroup(name=f"block{len(groups)}", instances=instances))
    return groups


def find_blocks(graph: OpGraph) -> tuple[BlockGroup, ...]:
    """Groups of identical repeated blocks, from module paths where known, else from structure.

    Parameters
    ----------
    graph:
        A coarse op graph (its ``blocks`` are ignored).

    Returns
    -------
    tuple[BlockGroup, ...]
        Ordered by their first op. An op belongs to at most one group.

    Examples
    --------
    >>> from planner.core.graph import Op, OpGraph, IterDim, TensorAccess, Edge
    >>> def op(i, kind, path):
    ...     return Op(name=f"op{i}", kind=kind, op_type="X", dims=(IterDim(name="d", size=4),),
    ...               inputs=(TensorAccess(tensor=f"t{i-1}", axes=(("d",),)),),
    ...               outputs=(TensorAccess(tensor=f"t{i}", axes=(("d",),)),), flops=1.0, module_path=path)
    >>> ops = [op(i, k, f"layers.{i // 2}") for i, k in enumerate(["matmul", "norm"] * 3)]
    >>> edges = [Edge(producer=i, consumer=i + 1, tensor=f"t{i}", producer_output=0, consumer_input=0) for i in range(5)]
    >>> [(b.name, b.instances) for b in find_blocks(OpGraph(name="g", ops=tuple(ops), tensors={}, edges=tuple(edges)))]
    [('layers', ((0, 1), (2, 3), (4, 5)))]
    """
    ids: dict[tuple, int] = {}
    signature_ids = [ids.setdefault(op.signature(), len(ids)) for op in graph.ops]
    out_edges = _out_edges(graph)
    groups = _from_module_paths(graph, signature_ids, out_edges)
    if not groups and not any(op.module_path for op in graph.ops):
        groups = _structural(graph, signature_ids, set(), out_edges)
    # An op in two groups (nested numbered paths cannot do that, but be safe): keep the first.
    taken: set[int] = set()
    result = []
    for group in sorted(groups, key=lambda g: g.instances[0][0]):
        ops = {i for inst in group.instances for i in inst}
        if ops & taken:
            continue
        taken |= ops
        result.append(group)
    return tuple(result)
