r"""A quick-GELU gated MLP (GPT-OSS's) as Megatron-LM's flags, or the one clause that says why it cannot be (issue 25).

The file's gate (:func:`importers.quick_geglu.quick_geglu_gates`) computes
:math:`\operatorname{clamp}(g, l_g, u_g)\,\sigma(a\,\cdot)\,(\operatorname{clamp}(u, l_u, u_u) + c)`. Megatron-LM
(``megatron/training/arguments.py``, ``core_transformer_config_from_args``, core_v0.16.1) says it with

* ``--quick-geglu``: ``gated_linear_unit = True``, ``activation_func = quick_gelu``, ``x * sigmoid(1.702 x)``
  (megatron-core 0.16.1 ``core/activations.py:15-17``): :math:`a` must be 1.702 (float32);
* ``--activation-func-clamp-value L``: ``MLP`` and ``TEGroupedMLP`` clamp the gate to :math:`(-\infty, L]` and the
  linear half to :math:`[-L, L]` (``transformer/mlp.py:222-223``, ``transformer/moe/experts.py:724-725``), so the
  file's bounds must be :math:`u_g = L`, :math:`l_g` open, :math:`l_u = -L`, :math:`u_u = L`, or none at all;
* ``--glu-linear-offset c``: ``activation_func(x_glu) * (x_linear + c)``;
* ``--no-bias-gelu-fusion``: with ``--quick-geglu`` Megatron-LM sets ``bias_activation_fusion`` from
  ``--bias-gelu-fusion`` (on by default), and the dense ``MLP``'s fused path takes only GELU and SwiGLU ("Only
  support fusion of gelu and swiglu", ``transformer/mlp.py:213``); unfused, both ``MLP`` and the grouped experts add
  the bias before the clamp, as the file does (``TEGroupedMLP``'s fc1 keeps its bias, ``skip_bias_add=False``).

The halves are Megatron's ``torch.chunk(x, 2)`` (gate first); GPT-OSS interleaves them (``gate_up[..., ::2]`` and
``[..., 1::2]``), a permutation of fc1's output columns: the same model trained from scratch, not the same
checkpoint layout.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from importers.quick_geglu import QuickGeglu, quick_geglu_gates
from importers.transformer import TransformerModel
from planner.core.graph import OpGraph

__all__ = ["MEGATRON_QUICK_GELU_ALPHA", "quick_geglu_args", "quick_geglu_refusal"]

MEGATRON_QUICK_GELU_ALPHA = 1.702
"""``a`` of megatron-core 0.16.1's ``quick_gelu`` (``core/activations.py:17``, ``fusions/fused_bias_geglu.py``)."""


def _quick_gated(model: TransformerModel) -> bool:
    """Whether ``model``'s MLP is gated by quick-GELU (:func:`importers.layer_features.mlp_activation`)."""
    return model.gated_mlp and model.features.mlp_activation == "scaled-sigmoid"


def _gate(graph: OpGraph) -> tuple[QuickGeglu | None, str]:
    """``(the file's one gate, "")`` or ``(None, why it cannot be read as one)``."""
    path = graph.source_path
    gates = quick_geglu_gates(str(path), getattr(graph, "source_sha256", "")) if path and Path(path).is_file() else ()
    if not gates:
        return None, ("the exporter finds no x * sigmoid(a x) with a constant a in the file (no file, or a fused "
                      "node), so it reads neither a nor the clamps or the offset of the linear half")
    # a constant saved external reads NaN, and NaN != NaN would make equal gates look different: check it first
    numbers = [v for gate in gates for v in (gate.alpha, gate.linear_offset, *gate.gate_clamp, *gate.linear_clamp)
               if v is not None]
    if any(math.isnan(v) for v in numbers):
        return None, ("a constant of its quick-GELU gate is not in the file (a graph-only export saved it external); "
                      "export it with its small constants inline")
    if len(set(gates)) > 1:
        return None, "its layers' quick-GELU gates differ (a, clamps or offset) and Megatron-LM sets one for every layer"
    return gates[0], ""


def _clamp_value(gate: QuickGeglu) -> tuple[float | None, str]:
    """``(L, "")`` for ``--activation-func-clamp-value L`` (``None``: no clamp), or ``(None, why not)``."""
    if gate.gate_clamp == (None, None) and gate.linear_clamp == (None, None):
        return None, ""
    limit = gate.gate_clamp[1]
    if gate.gate_clamp[0] is None and limit is not None and gate.linear_clamp == (-limit, limit):
        return limit, ""
    return None, (f"it clamps the gate to {_interval(gate.gate_clamp)} and the linear half to "
                  f"{_interval(gate.linear_clamp)}, and Megatron-LM's --activation-func-clamp-value L clamps them to "
                  "(-inf, L] and [-L, L]")


def _interval(bounds: tuple[float | None, float | None]) -> str:
    """``(-inf, 7]``-style text of ``bounds``."""
    low, high = bounds
    return f"{'(-inf' if low is None else f'[{low:g}'}, {'inf)' if high is None else f'{high:g}]'}"


def quick_geglu_refusal(graph: OpGraph | None, model: TransformerModel) -> list[str]:
    """One clause when ``model``'s quick-GELU gated MLP is not what Megatron-LM's flags say (module docstring), else
    ``[]`` (also for any other MLP)."""
    if not _quick_gated(model):
        return []
    head = "its gated MLP gates with x * sigmoid(a x) (quick-GELU, as GPT-OSS's) and "
    if graph is None:
        return [head + "the exporter reads neither a nor the clamps or the offset without the graph"]
    gate, problem = _gate(graph)
    if gate is None:
        return [head + problem + ", while Megatron-LM's --quick-geglu fixes a = 1.702 and takes them as "
                "--activation-func-clamp-value and --glu-linear-offset"]
    problems = [] if np.float32(gate.alpha) == np.float32(MEGATRON_QUICK_GELU_ALPHA) else [
        f"its a is {gate.alpha:.6g} and Megatron-LM's --quick-geglu fixes a = 1.702"]
    problems += [p for p in (_clamp_value(gate)[1],) if p]
    return [head + "; ".join(problems)] if problems else []


def quick_geglu_args(graph: OpGraph, model: TransformerModel) -> list[str]:
    """``--quick-geglu --no-bias-gelu-fusion`` with the file's clamp and offset (module docstring); ``[]`` for
    any other MLP. The caller has refused what :func:`quick_geglu_refusal` names.

    >>> from types import SimpleNamespace as N
    >>> quick_geglu_args(None, N(gated_mlp=True, features=N(mlp_activation="silu")))
    []
    """
    if not _quick_gated(model):
        return []
    gate, _ = _gate(graph)
    args = ["--quick-geglu", "--no-bias-gelu-fusion"]
    if gate is None:
        return args
    limit, _ = _clamp_value(gate)
    if limit is not None:
        args += ["--activation-func-clamp-value", f"{limit:g}"]
    if gate.linear_offset:
        args += ["--glu-linear-offset", f"{gate.linear_offset:g}"]
    return args
