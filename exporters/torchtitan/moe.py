r"""torchtitan 0.3.0's DeepSeek-V3 MoE layers as the file's router reads them (issue 25: "every one a launcher
trains is exported to it"), or why not.

``deepseek_v3.build_mla_moe_layers`` (``torchtitan/models/deepseek_v3/__init__.py``) builds layer ``i`` with a
dense SwiGLU of ``dense_hidden_dim`` when ``i < n_dense_layers`` and a ``MoE`` otherwise: ``num_experts``
routed SwiGLU experts of ``moe_hidden_dim`` (``GroupedExperts``: ``w1``, ``w3`` ``[E, F, D]``, ``w2``
``[E, D, F]``), one shared SwiGLU of ``moe_hidden_dim x num_shared_experts`` added ungated, and a
``TokenChoiceTopKRouter`` (``models/common/moe.py``) whose ``forward`` computes, per token:

1. ``scores = sigmoid(x W)`` or ``softmax(x W)`` (``score_func``; the gate has no bias);
2. the choice reads ``scores + expert_bias_E`` where ``MoE.Config.load_balance_coeff`` is set (the
   auxiliary-loss-free bias, updated after each step; a buffer, not a parameter);
3. with ``num_expert_groups``: each group scored by the **sum of its top 2** scores
   (``_get_node_limited_routing_scores``: ``topk(2).sum``; at least 2 experts a group), the top
   ``num_limited_groups`` groups kept, the rest masked to ``-inf``;
4. the top ``top_k`` experts of that; their weights ``scores.gather(indices)``, the scores **without**
   the bias;
5. ``route_norm``: the weights divided by their sum (``+ 1e-20``, for every ``k``); then times
   ``route_scale``.

:mod:`importers.moe_router` reads each of these from the graph (score function, bias, groups and the
group score, unbiased weights, the scalar factor) and :mod:`exporters.megatron.moe` gathers the layers'
common reading (:func:`~exporters._moe_layout.moe_layout`: which layers route, the routed and dense FFN
sizes). This module holds them to the list above: transformers' ``DeepseekV3TopkRouter`` (DeepSeek-V3:
sigmoid, bias, top 2 summed per group, ``norm_topk_prob``, ``routed_scaling_factor``) is the same
function, and :func:`deepseek_routing` refuses, one clause each, what torchtitan computes otherwise: a
group scored by another count or reduction, a score bias on a softmax router or inside the weights,
dense layers after routed ones, shared experts in some MoE layers only, of a size that is not a
multiple of the routed experts' or behind a gate (Qwen2-MoE's), a factor whose constant the file lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporters._moe_layout import MoeLayout, moe_layout
from importers.moe import SPARSEMIXER_ROUTER
from importers.moe_router import RouterReading
from importers.transformer import MoeSummary, TransformerModel
from planner.core.graph import OpGraph

__all__ = ["DeepSeekRouting", "LOAD_BALANCE_COEFF", "deepseek_routing", "routed_ffn", "router_refusals"]

LOAD_BALANCE_COEFF = 1e-3
"""``MoE.Config.load_balance_coeff`` written for a router with a score bias: ``make_moe_config``'s default
and DeepSeek-V3's bias update speed ``gamma`` (Liu et al. 2024, arXiv:2412.19437, section 2.1.2)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSeekRouting:
    """``build_mla_moe_layers``' MoE arguments of a model (module docstring)."""

    n_dense_layers: int
    """Leading dense layers (DeepSeek-V3's ``first_k_dense_replace``)."""
    dense_ffn: int
    """``dense_hidden_dim`` (elements); the routed experts' size where no layer is dense (then unused)."""
    expert_ffn: int
    """``moe_hidden_dim``: each routed expert's FFN size (elements)."""
    num_shared_experts: int
    """Shared experts, their FFN ``expert_ffn`` each (0: none; the export drops the shared MLP)."""
    router: RouterReading
    """The layers' common router (:func:`importers.moe_router.router_reading`)."""
    route_norm: bool
    """The top-k weights divided by their sum."""

    @property
    def load_balance_coeff(self) -> float | None:
        """``MoE.Config.load_balance_coeff``: :data:`LOAD_BALANCE_COEFF` with a score bias, else ``None``."""
        return LOAD_BALANCE_COEFF if self.router.expert_bias else None


def routed_ffn(graph: OpGraph, model: TransformerModel) -> int:
    """Each routed expert's FFN size (elements): the MoE layout's, or the model's where no layer was found in
    full (every layer routed: the model's FFN is the experts')."""
    layout = moe_layout(graph, model)
    return model.ffn_hidden_size if layout is None else layout.expert_ffn


def router_refusals(router: RouterReading) -> list[str]:
    """What ``TokenChoiceTopKRouter`` computes otherwise than ``router`` (module docstring, steps 1-5), one
    clause each.

    >>> from importers.moe_router import RouterReading as R
    >>> v3 = R(score_function="sigmoid", num_experts=256, top_k=8, groups=8, topk_groups=4, group_score_k=2,
    ...        expert_bias=True, scaling=2.5)  # DeepSeek-V3's config.json
    >>> router_refusals(v3), len(router_refusals(R(score_function="softmax", num_experts=64, top_k=6, groups=8,
    ...                                            topk_groups=3, group_score_k=1)))  # DeepSeek-V2: a group's max
    ([], 1)
    """
    out = []
    if router.score_function == "sparsemixer":
        out.append(f"its router is {SPARSEMIXER_ROUTER}, and TokenChoiceTopKRouter takes the top-k of a softmax or a "
                   "sigmoid over every expert")
    elif router.score_function not in ("softmax", "sigmoid"):
        out.append("its router's scores are neither a softmax nor a sigmoid in the graph")
    if router.expert_bias and router.score_function == "softmax":
        out.append("its softmax router adds a score bias, whose place beside the softmax the graph does not give "
                   "(torchtitan adds it to the probabilities)")
    if router.expert_bias and not router.weights_unbiased:
        out.append("its expert weights include the score bias and torchtitan's are the scores without it")
    if router.groups > 1:
        if router.group_score_k is None:
            out.append("its router's group scores lost their shape in the file, so how many experts score a group is "
                       "not known (torchtitan sums the top 2)")
        elif router.group_score_k != 2 or not router.group_score_sum:
            how = "sum" if router.group_score_sum else "reduction"
            out.append(f"its router scores each of {router.groups} groups by the {how} of its top "
                       f"{router.group_score_k} experts and torchtitan's group-limited routing by the sum of the top 2")
        if router.num_experts // router.groups < 2:
            out.append(f"its {router.groups} groups hold fewer than 2 of its {router.num_experts} experts each, "
                       "which torchtitan's group-limited routing refuses")
    if router.scaling is None:
        out.append("its router multiplies the top-k weights by a factor whose constant is not in the file (a "
                   "graph-only export without its small constants), and route_scale must say it")
    return out


def _layer_refusals(model: TransformerModel, moe: MoeSummary, layout: MoeLayout) -> list[str]:
    """What ``build_mla_moe_layers`` builds otherwise than the layers: dense ones first, one shared MLP in
    every MoE layer, a multiple of the experts' size, ungated."""
    out, dense = [], layout.pattern.count(0)
    if any(layout.pattern[:dense]):
        routed = [i for i, p in enumerate(layout.pattern) if p]
        out.append(f"its layers {routed} route and the others are dense, and the family's first n_dense_layers are "
                   "dense and every later one routes")
    if not layout.dense_uniform:
        out.append("its dense layers' MLPs differ in size and the family builds them with one dense_hidden_dim")
    shared = model.shared_experts
    if shared and len(shared) != moe.layers:
        out.append(f"{len(shared)} of its {moe.layers} MoE layers have shared experts and the family's every one")
    sizes = {m.ffn_hidden_size for m in shared}
    if len(sizes) > 1:
        out.append("its shared experts differ in size")
    elif sizes and next(iter(sizes)) % layout.expert_ffn:
        out.append(f"its shared experts' FFN {next(iter(sizes))} is not a multiple of the routed experts' "
                   f"{layout.expert_ffn} (the family's is moe_hidden_dim x num_shared_experts)")
    if shared and (model.shared_expert_gate or not all(m.gated for m in shared)):
        out.append("its shared experts are gated by a sigmoid (Qwen2-MoE's shared_expert_gate) or not SwiGLU, and "
                   "the family adds one SwiGLU ungated")
    return out


def deepseek_routing(graph: OpGraph, model: TransformerModel,
                     moe: MoeSummary) -> tuple[DeepSeekRouting | None, list[str]]:
    """``(the MoE arguments, [])`` where torchtitan's deepseek_v3 MoE layers compute ``model``'s, else
    ``(None, one clause per difference)`` (module docstring)."""
    layout = moe_layout(graph, model)
    if layout is None:
        return None, ["its routed experts were not found in full (experts, score bias, groups, scaling), so "
                      "torchtitan's router cannot be checked against it"]
    if layout.router is None:
        return None, ["its MoE layers' routers differ (score function, groups, bias or scaling) and the family "
                      "builds one router for every layer"]
    out = _layer_refusals(model, moe, layout) + router_refusals(layout.router)
    if out:
        return None, out
    shared = model.shared_experts[0].ffn_hidden_size // layout.expert_ffn if model.shared_experts else 0
    dense = layout.pattern.count(0)
    return DeepSeekRouting(n_dense_layers=dense, dense_ffn=layout.dense_ffn if dense else layout.expert_ffn,
                           expert_ffn=layout.expert_ffn, num_shared_experts=shared, router=layout.router,
                           route_norm=moe.renormalized), []
