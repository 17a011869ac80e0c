"""Trainable parameters as the cost model counts them: tied weights are one tensor, held by one op.

A graph may read one parameter in several places (an embedding tied to the LM head, under another
name: ``OpGraph.parameter_aliases``). :class:`ParameterView` shows every alias as the parameter it
stands for, and :func:`parameter_ownership` gives each parameter to its first reader, which alone
counts its bytes, gradient synchronisation and optimizer state (the plain cost tables and the
pipeline's stages use the same rule).
"""

from __future__ import annotations

import dataclasses
from collections import abc

from objectives._common import canonical_parameter, is_parameter_name
from planner.core.graph import OpGraph

__all__ = ["ParameterView", "parameter_ownership"]


def parameter_ownership(graph: OpGraph) -> list[tuple[int, ...]]:
    """Per op, the input positions of the parameters it accounts for: each parameter (tied copies
    as one) is held, synchronised and updated by its first reader in op order."""
    seen: set[str] = set()
    owned: list[tuple[int, ...]] = []
    for op in graph.ops:
        mine = []
        for position, access in enumerate(op.inputs):
            if not is_parameter_name(graph.tensors, graph.parameter_aliases, access.tensor):
                continue
            canonical = canonical_parameter(graph, access.tensor)
            if canonical in seen:
                continue
            seen.add(canonical)
            mine.append(position)
        owned.append(tuple(mine))
    return owned


class ParameterView(abc.Mapping):
    """The graph's tensors, with aliases of tied parameters resolved and marked as parameters."""

    __slots__ = ("_graph",)

    def __init__(self, graph: OpGraph) -> None:
        self._graph = graph

    def __getitem__(self, name: str):
        graph = self._graph
        tensor = graph.tensors.get(name)
        if name in graph.parameter_aliases:
            canonical = graph.tensors.get(canonical_parameter(graph, name))
            base = tensor or canonical
            if base is None:
                raise KeyError(name)
            if base.role != "parameter":
                base = dataclasses.replace(base, role="parameter")
            return base
        if tensor is None:
            raise KeyError(name)
        return tensor

    def __iter__(self):
        return iter(self._graph.tensors)

    def __len__(self) -> int:
        return len(self._graph.tensors)
