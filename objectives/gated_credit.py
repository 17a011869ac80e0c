"""The bytes Megatron-Core's fused SwiGLU keeps less than the tables charge, per op and configuration
(:func:`fused_swiglu_credit`), so that a launcher's search can price it per plan on a cost cache that
other launchers share: DeepSpeed runs Megatron-LM's fused kernels from the same cache and its SwiGLU is
plain PyTorch (Megatron-DeepSpeed ``megatron/model/transformer.py``, ``ParallelMLP``'s
``F.silu(x[0]) * x[1]``, which keeps the SiLU's output for the product's backward).

Under ``TrainingSettings.fused_swiglu`` the tables charge a gated unit's product without the activation's
output (``objectives.graph_facts._gated_products``: megatron-core 0.16.1 ``fusions/fused_bias_swiglu.py``,
``SwiGLUFunction`` saves fc1's output only and recomputes the SiLU). This module reads the same two
sharings of saved tensors (with and without the rule, each memoised on the graph) and prices the
operands the rule marks as charged elsewhere exactly as ``objectives.memory.saved_activation_bytes``
charges them, so a plan priced with the credit holds the bytes of a cache built with the rule.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from objectives._common import element_bytes, shard_elements
from objectives.autocast import DTYPE_SIZE, autocast_applies, saved_dtype
from objectives.execution import execution_of
from objectives.graph_facts import _graph_facts, _recompute_flags, _saved_sharing
from planner.core.configs import ConfigSpace
from planner.core.graph import OpGraph
from planner.core.settings import TrainingSettings

__all__ = ["fused_swiglu_credit"]


def fused_swiglu_credit(graph: OpGraph, spaces: Sequence[ConfigSpace], settings: TrainingSettings,
                        cost_model: str = "roofline") -> dict[int, np.ndarray]:
    """``{op: (K,) bytes per micro-batch}``: what each op of a model built under ``settings`` (without
    the rule) keeps more than the same model built with ``fused_swiglu``, per configuration; empty under
    the plain roofline (the rule needs an execution model) and PaSE's cost (no activations).

    >>> from planner.core.graph import OpGraph
    >>> fused_swiglu_credit(OpGraph(name="empty", ops=(), tensors={}, edges=()), (), TrainingSettings())
    {}
    """
    execution = execution_of(settings) if cost_model != "pase" else None
    if execution is None or not graph.ops:
        return {}
    marked_ops = _marked_operands(graph, settings, cost_model)
    if not marked_ops:  # no gated unit the rule re-charges (a GELU or ReLU model): nothing is credited
        return {}
    autocast = autocast_applies(settings, execution)
    credit: dict[int, np.ndarray] = {}
    # the gated units of every layer share one space object per class: one table per (space, operand)
    by_class: dict[tuple, np.ndarray] = {}
    for index, (marked, stored_dtypes) in marked_ops.items():
        op, total = graph.ops[index], np.zeros(spaces[index].size)
        for side, position in marked:
            access = (op.inputs if side == "in" else op.outputs)[position]
            tensor = graph.tensors[access.tensor]
            stored = stored_dtypes[0 if side == "in" else 1][position] if stored_dtypes is not None else None
            nbytes = element_bytes(tensor, settings) if stored is None else DTYPE_SIZE[
                saved_dtype(op, stored, autocast=autocast) if side == "in" else stored]
            key = (id(spaces[index]), access.axes, tuple(tensor.shape), nbytes)
            if key not in by_class:
                by_class[key] = shard_elements(spaces[index], op, access, tensor.shape) * nbytes
            total = total + by_class[key]
        credit[index] = total
    return credit


def _marked_operands(graph: OpGraph, settings: TrainingSettings, cost_model: str) -> dict[int, tuple]:
    """``{op: (sorted (side, position) operands the rule marks charged elsewhere, stored dtypes)}`` of the
    graph under ``settings``: the difference of the two sharings of saved tensors, with and without the
    rule. It depends on the graph and settings alone, so it is memoised on the graph's facts: a search
    prices hundreds of cost models of a few graphs (GPT-3 175B at 1,024 devices: 1,420 arrays of 19 graphs)."""
    facts = _graph_facts(graph)
    key = ("fused swiglu marked", settings.recompute, settings.precision, settings.autocast, settings.fp8,
           execution_of(settings),
           cost_model)
    if key not in facts.memo:
        recomputed, externals = _recompute_flags(graph, facts, settings.recompute)
        plain = _saved_sharing(graph, facts, dataclasses.replace(settings, fused_swiglu=False), cost_model,
                               recomputed, externals)
        fused = _saved_sharing(graph, facts, dataclasses.replace(settings, fused_swiglu=True), cost_model,
                               recomputed, externals)
        marked = ((index, set(after[1]) - set(before[1]), before[0])
                  for index, (before, after) in enumerate(zip(plain, fused)))
        facts.memo[key] = {index: (tuple(sorted(extra)), stored) for index, extra, stored in marked if extra}
    return facts.memo[key]
