r"""The MoE layers of a Megatron-LM hybrid export: ``E`` in ``--hybrid-override-pattern`` and the MoE flags the
GPT family's export writes (issue 25, h27e).

megatron-core 0.16.1's ``MambaStack`` builds an ``E`` layer from ``mamba_stack_spec``'s ``moe_layer``, a
``MoETransformerLayer`` whose ``MoELayer`` takes every size and router field from ``TransformerConfig``
(:mod:`importers.hybrid_moe`), the same fields Megatron-LM's ``pretrain_mamba.py`` fills from the flags the dense MoE
export writes (:func:`exporters.megatron.moe.megatron_moe_args`): ``--num-experts``, ``--moe-router-topk``, the
router's score function, bias, groups and scaling (:func:`~exporters.megatron.moe.megatron_router_args`, refused
where ``TopKRouter`` computes other weights), ``--moe-ffn-hidden-size`` (the experts' width; ``--ffn-hidden-size``
stays the MLP layers'), ``--moe-shared-expert-intermediate-size`` and ``--moe-shared-expert-gate``, and
``--expert-model-parallel-size``. Which layers route is the pattern's ``E``s: ``MambaStack`` reads no
``--moe-layer-freq``.

Exported with ``tp = 1`` only (:func:`moe_tp_refusal`): under ``tp > 1`` megatron-core keeps the router whole on
every rank and splits the experts by ``--expert-tensor-parallel-size``, which :mod:`exporters.megatron.mamba_tp`'s
rules (a linear reading the residual stream is column-parallel) do not say. Pipeline stages are placed as for any
hybrid stack (:func:`exporters.megatron.mamba.hybrid_stage_layers`), counted by the stack's residual adds
(an ``E`` layer's sum of its routed and shared experts, of the stream's shape too, is not one).
"""

from __future__ import annotations

from exporters._moe_layout import MoeLayout
from exporters.megatron.moe import megatron_moe_args
from importers.hybrid import HybridStack
from importers.transformer import moe_summary
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph

__all__ = ["hybrid_moe_args", "moe_tp_refusal"]


def hybrid_moe_args(graph: OpGraph, stack: HybridStack, *, ep: int, dp: int, capacity_factor: float = 1.0) -> list[str]:
    """The MoE flags of ``stack`` (module docstring); ``[]`` without ``E`` layers (where ``ep > 1`` is refused, as
    :func:`~exporters.megatron.moe.megatron_moe_args` refuses it for a dense model).

    Raises :class:`UnsupportedExport` where Megatron-LM's router computes other weights, or ``ep`` does not divide
    the experts and ``dp``."""
    experts = stack.experts
    if experts is None:
        return megatron_moe_args(None, ep=ep)
    summary = moe_summary(graph)
    if summary is None:
        raise UnsupportedExport("its MoE layers route differently from one another (experts, top-k or score "
                                "function), and Megatron-LM's TransformerConfig holds one router for every layer")
    layout = MoeLayout(pattern=tuple(1 for kind in stack.pattern if kind == "E"), router=experts.router,
                       expert_ffn=experts.ffn, dense_ffn=None)
    args = megatron_moe_args(summary, ep=ep, capacity_factor=capacity_factor, dp=dp,
                             shared_ffn=experts.shared_ffn or None, shared_gate=experts.shared_gate, layout=layout)
    return args + ["--moe-ffn-hidden-size", str(experts.ffn)]


def moe_tp_refusal(stack: HybridStack, tp: int) -> str | None:
    """Why the hybrid export does not run ``stack``'s ``E`` layers ``tp`` ways, or ``None`` (module docstring).

    >>> from importers.hybrid import HybridStack
    >>> moe_tp_refusal(HybridStack(pattern="ME", hidden_size=64, vocab_size=96, seq_length=16, mamba=None), 2)[:44]
    "the hybrid export writes MoE layers ('E') at"
    """
    if tp == 1 or "E" not in stack.pattern:
        return None
    return ("the hybrid export writes MoE layers ('E') at tp=1 only: megatron-core keeps the router whole on every tp "
            "rank and splits the experts by --expert-tensor-parallel-size, which the hybrid layout does not price")

