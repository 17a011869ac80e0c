r"""A hybrid stack's MoE layers (``E`` of megatron-core's ``--hybrid-override-pattern``), read as megatron-core
0.16.1 builds them (issue 25, h27e).

``mamba_stack_spec`` (``models/mamba/mamba_layer_specs.py``) builds an ``E`` layer as a ``MoETransformerLayer``:
``pre_mlp_layernorm`` (``TENorm``, one scale of the model width), then ``get_moe_module_spec``'s ``MoELayer``
(``models/gpt/moe_module_specs.py``): a ``TopKRouter`` whose ``weight`` is ``[E, hidden]`` (``transformer/moe/
router.py``; its ``expert_bias`` is a buffer, no parameter), ``E`` experts as one ``TEGroupedMLP`` (``fc1``
``[ffn (x2 gated), hidden]`` and ``fc2`` ``[hidden, ffn]`` per expert, no bias: ``add_bias_linear`` off) and, with
``--moe-shared-expert-intermediate-size``, a ``SharedExpertMLP`` of the same form with its own width, plus a
``[1, hidden]`` gate weight under ``--moe-shared-expert-gate``. The experts, the shared experts and the dense MLP
layers all take one activation and gating from ``TransformerConfig`` (``activation_func``, ``gated_linear_unit``:
``--squared-relu`` / ``--swiglu``).

:func:`expert_sizes` reads one layer (:class:`HybridExperts`) from :func:`importers.moe.find_moe_layers`' layer and
:func:`importers.moe_router.router_reading`; :func:`expert_layer_parameters` is megatron-core's count of that layer,
which :mod:`importers.hybrid` compares with the graph's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from importers.layer_features import mlp_activation_of
from importers.moe import MoeLayer
from importers.moe_router import RouterReading, router_reading
from importers.param_role import is_parameter
from planner.core.graph import OpGraph

__all__ = ["HybridExperts", "expert_sizes", "expert_layer_parameters"]

Activation = Literal["gelu", "squared-relu", "swiglu", "relu", "other"]
"""An MLP's or expert's activation (:data:`importers.hybrid.HybridMlp` too): ``swiglu`` is a SiLU gate (gated), the
others ungated."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridExperts:
    """One ``E`` layer's sizes and router, as megatron-core's flags say them (module docstring)."""

    num_experts: int
    """``--num-experts``."""
    top_k: int
    """``--moe-router-topk``."""
    ffn: int
    """``--moe-ffn-hidden-size``: each routed expert's width."""
    activation: Activation
    """The routed experts' activation (``swiglu``: gated)."""
    router: RouterReading
    shared_ffn: int = 0
    """``--moe-shared-expert-intermediate-size`` (0: no shared experts)."""
    shared_activation: Activation | None = None
    """The shared experts' activation (``None`` without them)."""
    shared_gate: bool = False
    """A ``[hidden, 1]`` sigmoid gate scales the shared experts' output (``--moe-shared-expert-gate``)."""


def _activation(graph: OpGraph, ops: list[int], gated: bool) -> Activation:
    read = mlp_activation_of(graph, ops)
    if gated:
        return "swiglu" if read == "silu" else "other"
    return {"squared-relu": "squared-relu", "gelu": "gelu", "gelu-erf": "gelu", "relu": "relu"}.get(read or "", "other")


def _matrices(graph: OpGraph, ops) -> dict[str, tuple[int, ...]]:
    """The 2-D or 3-D parameters the ops read, each once, with their shapes."""
    return {a.tensor: tuple(graph.tensors[a.tensor].shape) for i in ops for a in graph.ops[i].inputs
            if is_parameter(graph, a.tensor) and len(graph.tensors[a.tensor].shape) in (2, 3)}


def expert_sizes(graph: OpGraph, routed: MoeLayer, why: list[str]) -> HybridExperts | None:
    """``routed``'s :class:`HybridExperts`, or ``None`` with the reason in ``why``: the experts must be ``E`` matrices
    of ``hidden x ffn`` each in two (ungated) or three (gated) parts, the shared experts likewise (an
    ``hidden x 1`` gate beside them allowed)."""
    h, e, f = routed.hidden, routed.num_experts, routed.ffn
    experts = sum(graph.tensors[p].num_elements for p in routed.expert_parameters)
    parts = experts // (e * h * f) if experts % (e * h * f) == 0 else 0
    if parts not in (2, 3):
        why.append(f"its experts hold {experts:,} parameters, not {e} experts of {h} x {f} in two or three matrices")
        return None
    last = max(routed.expert_matmuls)
    activation = _activation(graph, [i for i in routed.expert_ops if i < last], parts == 3)
    shared = _matrices(graph, routed.shared_ops)
    gates = [p for p, s in shared.items() if sorted(s) == [1, h]]
    s = routed.shared_ffn
    body = sum(n for p, n in ((p, graph.tensors[p].num_elements) for p in shared) if p not in gates)
    shared_parts = body // (h * s) if s and body % (h * s) == 0 else 0
    if s and shared_parts not in (2, 3):
        why.append(f"its shared experts hold {body:,} parameters, not {h} x {s} matrices in two or three parts")
        return None
    shared_activation = None
    if s:
        downs = [i for i in routed.shared_ops if graph.ops[i].kind == "matmul"]
        shared_activation = _activation(graph, [i for i in routed.shared_ops if i < max(downs)], shared_parts == 3)
    return HybridExperts(num_experts=e, top_k=routed.top_k, ffn=f, activation=activation,
                         router=router_reading(graph, routed), shared_ffn=s, shared_activation=shared_activation,
                         shared_gate=bool(gates))


def expert_layer_parameters(sizes: HybridExperts, hidden: int) -> int:
    """Parameters of megatron-core 0.16.1's ``E`` layer of ``sizes`` (module docstring): the pre-MLP norm's scale,
    the router's ``[E, hidden]``, ``E`` experts' ``fc1`` and ``fc2``, the shared experts' and their gate.

    >>> router = RouterReading(score_function="sigmoid", num_experts=4, top_k=2, expert_bias=True)
    >>> expert_layer_parameters(HybridExperts(num_experts=4, top_k=2, ffn=32, activation="squared-relu", router=router,
    ...                                       shared_ffn=48, shared_activation="squared-relu"), 64)
    22848
    """
    def mlp(width: int, activation: Activation | None) -> int:
        return hidden * width * (3 if activation == "swiglu" else 2)

    shared = mlp(sizes.shared_ffn, sizes.shared_activation) + hidden * sizes.shared_gate if sizes.shared_ffn else 0
    return hidden + sizes.num_experts * hidden + sizes.num_experts * mlp(sizes.ffn, sizes.activation) + shared
