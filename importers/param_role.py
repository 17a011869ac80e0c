"""Whether a tensor of an op graph is a trainable parameter: the one test every structure reader shares
(:mod:`importers.transformer`, :mod:`importers.hybrid`, :mod:`importers.mamba_mixer`), kept apart so that
they import it without importing one another."""

from __future__ import annotations

from planner.core.graph import OpGraph

__all__ = ["is_parameter"]


def is_parameter(graph: OpGraph, tensor: str) -> bool:
    """True when ``tensor`` is a trainable parameter (or an alias of a tied one)."""
    canonical = graph.parameter_aliases.get(tensor, tensor)
    for name in (tensor, canonical):
        found = graph.tensors.get(name)
        if found is not None and found.role == "parameter":
            return True
    return False
