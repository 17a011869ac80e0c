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

At ``tp > 1`` (:mod:`exporters.megatron.mamba_tp`'s rules, refused in one line by :func:`moe_tp_refusal`): megatron-core
trains an MoE layer with tensor parallelism only under ``--sequence-parallel``; its ``TopKRouter`` keeps its ``[E, hidden]``
weight whole on every tp rank and routes the rank's sequence shard (the routing ops and the weighted combine run on
``dp x tp`` token shards); the token dispatcher gathers the routed tokens over the tp ranks before the experts and
reduce-scatters after them (``token_dispatcher.py``), and each expert's ``fc1`` / ``fc2`` are column / row parallel over the
expert tensor-parallel size, which defaults to ``tp`` (``ModelParallelConfig.__post_init__``; the export writes no
``--expert-tensor-parallel-size``, as the GPT family's), so ``--moe-ffn-hidden-size`` and the shared experts' width must
divide by ``tp``. ``--expert-model-parallel-size`` must divide ``dp`` (``initialize_model_parallel``: ``etp x ep x pp``
divides the world). Pipeline stages are placed as for any
hybrid stack (:func:`exporters.megatron.mamba.hybrid_stage_layers`), counted by the stack's residual adds
(an ``E`` layer's sum of its routed and shared experts, of the stream's shape too, is not one).
"""

from __future__ import annotations

from exporters._moe_layout import MoeLayout
from exporters.megatron.moe import MOE_TP_NEEDS_SP, megatron_moe_args
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


def moe_tp_refusal(stack: HybridStack, tp: int, sequence_parallel: bool) -> str | None:
    """Why megatron-core 0.16.1 does not train ``stack``'s ``E`` layers ``tp`` ways as planned, or ``None`` (module
    docstring): without ``--sequence-parallel`` its ``MoELayer.forward`` raises while training (``moe_layer.py``:
    ``self.training and self.attn_tp_group.size() > 1 and not self.config.sequence_parallel``); the experts'
    ``fc1`` / ``fc2`` and the shared experts' divide their width by the (expert) tp size (``experts.py``,
    ``divide(fc1_output_size, tp_size)``; ``SharedExpertMLP``'s column- and row-parallel linears).

    >>> from importers.hybrid import HybridStack
    >>> moe_tp_refusal(HybridStack(pattern="ME", hidden_size=64, vocab_size=96, seq_length=16, mamba=None), 2, False)[:62]
    'megatron-core 0.16.1 trains MoE layers at tp > 1 only with --s'
    """
    if tp == 1 or "E" not in stack.pattern:
        return None
    if not sequence_parallel:
        return MOE_TP_NEEDS_SP
    experts = stack.experts
    for flag, width in (("--moe-ffn-hidden-size", experts.ffn if experts else 0),
                        ("--moe-shared-expert-intermediate-size", experts.shared_ffn if experts else 0)):
        if width % tp:
            return (f"megatron-core's experts need {flag} ({width}) divisible by the expert tensor-parallel size "
                    f"tp={tp} (divide(fc1_output_size, tp_size))")
    return None
