r"""Megatron-Core's MoE layers in Megatron-LM's flags: the experts, the router and which layers route
(issue 25: "exact or refused").

Megatron-Core 0.16.1's ``TopKRouter`` computes its weights in ``moe_utils.topk_routing_with_score_function``
(``megatron/core/transformer/moe/moe_utils.py``), from ``TransformerConfig``'s fields (their flags):

=====================================  ===========================================  ==========================
flag                                   ``TransformerConfig`` field                  read from the graph
=====================================  ===========================================  ==========================
``--num-experts``                      ``num_moe_experts``                          the choice TopK's width
``--moe-router-topk``                  ``moe_router_topk``                          its ``k``
``--moe-router-score-function``        ``moe_router_score_function``                softmax / sigmoid
``--moe-router-pre-softmax``           ``moe_router_pre_softmax``                   softmax not renormalised
``--moe-router-enable-expert-bias``    ``moe_router_enable_expert_bias``            a per-expert score bias
``--moe-router-num-groups``            ``moe_router_num_groups``                    the expert groups
``--moe-router-group-topk``            ``moe_router_group_topk``                    the groups kept
``--moe-router-topk-scaling-factor``   ``moe_router_topk_scaling_factor``           the weights' scalar factor
``--moe-ffn-hidden-size``              ``moe_ffn_hidden_size``                      the experts' FFN size
``--moe-shared-expert-intermediate-    ``moe_shared_expert_intermediate_size``      the shared experts' size
size``
``--moe-layer-freq``                   ``moe_layer_freq`` (a 0/1 list per layer)    which layers route
=====================================  ===========================================  ==========================

What the router computes, and when the graph (:mod:`importers.moe_router`) is the same function:

* **softmax** (Mixtral, Qwen2-MoE): the default takes the top-k logits and a softmax over them, which
  is a softmax over all experts with the top-k renormalised; without the renormalisation it is
  ``--moe-router-pre-softmax`` (softmax, then top-k). ``TransformerConfig.__post_init__`` rejects a
  top-1 router without ``moe_router_pre_softmax`` ("Please use --moe-router-pre-softmax when topk is
  1"), so a renormalised top-1 router (every weight 1) is refused.
* **sigmoid** (DeepSeek-V3): ``scores = sigmoid(logits)``; with the expert bias the choice reads
  ``scores + expert_bias`` and the weights are ``scores.gather(1, top_indices)`` (the unbiased
  scores, as transformers' ``DeepseekV3MoE`` gathers ``router_logits``); then ``probs = scores /
  (scores.sum(-1) + 1e-20) if topk > 1 else scores``. So a sigmoid router is exported only when its
  top-k weights are divided by their sum (``norm_topk_prob=True``) for ``k > 1`` and not for ``k =
  1``; ``TransformerConfig`` allows the expert bias with the sigmoid only.
* **groups** (``group_limited_topk``): the experts in ``moe_router_num_groups`` groups, each scored by
  the sum of its top ``topk // group_topk`` scores, the top ``moe_router_group_topk`` groups kept
  (the rest masked to ``-inf``), then the top-k of the kept experts. DeepSeek-V3 sums the top 2 of
  each group (transformers' ``topk(2)``): the same when ``k / topk_group = 2`` (its 8 of 256 in 4 of
  8 groups), refused otherwise. A softmax router groups its probabilities only with
  ``--moe-router-pre-softmax`` (without it the groups are ranked on the logits): refused there.
* **scaling**: ``if scaling_factor: probs = probs * scaling_factor``, for both score functions
  (whatever the field's docstring says of ``moe_router_pre_softmax``); a factor the file does not
  hold (a graph-only file whose constants were stripped) is refused, since the weights would differ.

The expert bias is not a weight a launcher loads but a load-balancing state: Megatron adds it to the
choice and updates it after each step by ``--moe-router-bias-update-rate`` (1e-3 by default, DeepSeek-V3's
``gamma``: Liu et al. 2024, arXiv:2412.19437, section 2.1.2); the graph shows its place, not its rule,
so the export says so in a note (:data:`EXPERT_BIAS_NOTE`).

``--moe-layer-freq``: a layer routes when its MLP is a MoE layer's (the choice TopK lies between its
attention and the next one); dense layers (DeepSeek-V3's ``first_k_dense_replace`` leading ones,
Qwen2-MoE's ``mlp_only_layers``) are ``0``. Written as Megatron-LM's ``moe_freq_type`` reads it
(``megatron/training/arguments.py``: a string with ``[`` is evaluated as a Python list expression),
run-length: ``([0]*3+[1]*58)``; omitted when every layer routes. ``--ffn-hidden-size`` is then the
dense layers' FFN and ``--moe-ffn-hidden-size`` the experts'.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby

from exporters.elsewhere import ELSEWHERE
from exporters._moe_layout import MoeLayout, explained_irregular, moe_layout, router_norm_ops
from importers.moe import SPARSEMIXER_ROUTER
from importers.moe_router import RouterReading
from importers.transformer import MoeSummary, TransformerModel
from planner.core.errors import UnsupportedExport

__all__ = ["EXPERT_BIAS_NOTE", "MOE_TP_NEEDS_SP", "MoeLayout", "moe_layout", "explained_irregular", "router_norm_ops",
           "megatron_moe_args", "megatron_router_args", "moe_layer_freq", "dense_view"]

EXPERT_BIAS_NOTE = (
    "the router adds a per-expert bias to its scores before the expert choice (DeepSeek-V3's "
    "e_score_correction_bias): --moe-router-enable-expert-bias, which Megatron-LM updates after each step at "
    "--moe-router-bias-update-rate (1e-3 by default, DeepSeek-V3's); the graph shows the bias, not its update rule"
)
"""The note of an export with ``--moe-router-enable-expert-bias`` (module docstring)."""

MOE_TP_NEEDS_SP = ("megatron-core 0.16.1 trains MoE layers at tp > 1 only with --sequence-parallel (MoELayer.forward "
                   "raises 'During training, performance may degrade if MoE and tensor parallelism are enabled without "
                   "also enabling sequence parallelism')")
"""Why an MoE model's ``tp > 1`` family without sequence parallelism is not offered (``transformer/moe/moe_layer.py``,
``MoELayer.forward``: ``self.training and self.attn_tp_group.size() > 1 and not self.config.sequence_parallel``)."""


def dense_view(model: TransformerModel, layout: MoeLayout | None) -> TransformerModel:
    """``model`` with ``ffn_hidden_size`` the dense layers' (``--ffn-hidden-size``) where some layers
    are dense; as it is otherwise."""
    if layout is None or layout.dense_ffn is None or all(layout.pattern):
        return model
    return replace(model, ffn_hidden_size=layout.dense_ffn)


def moe_layer_freq(pattern: tuple[int, ...]) -> str:
    """``--moe-layer-freq``'s run-length list expression of ``pattern`` (module docstring).

    >>> moe_layer_freq((0, 0, 0, 1, 1)), moe_layer_freq((1, 0, 1, 0))
    ('([0]*3+[1]*2)', '([1]*1+[0]*1+[1]*1+[0]*1)')
    """
    return "(" + "+".join(f"[{value}]*{len(list(run))}" for value, run in groupby(pattern)) + ")"


def _group_refusals(router: RouterReading) -> list[str]:
    if router.groups <= 1:
        return []
    megatron_k = router.top_k // router.topk_groups  # group_limited_topk: topk // group_topk
    if router.group_score_k is None:
        return ["its router's group scores lost their shape in the file, so how many experts score a group is not "
                "known (Megatron-LM sums the top moe_router_topk / moe_router_group_topk)"]
    if router.group_score_k != megatron_k or (router.group_score_k > 1 and not router.group_score_sum):
        how = "sum" if router.group_score_sum else "reduction"
        return [f"its router scores each of {router.groups} groups by the {how} of its top {router.group_score_k} "
                f"experts and Megatron-LM's group-limited routing sums the top topk / group_topk = {router.top_k} / "
                f"{router.topk_groups} = {megatron_k}"]
    return []


def megatron_router_args(router: RouterReading, *, renormalized: bool) -> list[str]:
    """The router's flags (module docstring), or :class:`UnsupportedExport` naming what Megatron-Core's
    ``TopKRouter`` would compute differently.

    >>> from importers.moe_router import RouterReading as R
    >>> " ".join(megatron_router_args(R(score_function="sigmoid", num_experts=256, top_k=8, groups=8, topk_groups=4,
    ...     group_score_k=2, expert_bias=True, scaling=2.5), renormalized=True))  # DeepSeek-V3
    '--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5'
    """
    why, args = _group_refusals(router), []
    if router.score_function == "sigmoid":
        args += ["--moe-router-score-function", "sigmoid"]
        if router.top_k > 1 and not renormalized:
            why.append("its sigmoid router keeps the top-k scores as they are and Megatron-LM divides them by their sum "
                       "(for topk > 1)")
        if router.top_k == 1 and renormalized:
            why.append("its top-1 sigmoid router divides the score by itself (weight 1) and Megatron-LM keeps it")
        if router.expert_bias and not router.weights_unbiased:
            why.append("its expert weights include the score bias and Megatron-LM's weights are the scores without it")
        if router.expert_bias:
            args.append("--moe-router-enable-expert-bias")
    elif router.score_function == "softmax":
        if not renormalized:
            args.append("--moe-router-pre-softmax")
        elif router.top_k == 1:
            why.append("its top-1 softmax router renormalises the chosen probability (weight 1) and Megatron-LM needs "
                       "--moe-router-pre-softmax for topk 1, which keeps it")
        if router.expert_bias:
            why.append("its softmax router adds a score bias and Megatron-LM's expert bias is for sigmoid routers only")
        if router.groups > 1 and renormalized:
            why.append("its softmax router groups the probabilities and renormalises the top-k; Megatron-LM ranks the "
                       "groups on the logits unless --moe-router-pre-softmax, which does not renormalise")
    elif router.score_function == "sparsemixer":  # megatron-core 0.16.1 moe_router_score_function: softmax | sigmoid
        why.append(f"its router is {SPARSEMIXER_ROUTER}, and megatron-core 0.16.1's TopKRouter takes the top-k of one "
                   "softmax or sigmoid over every expert")
    else:
        why.append("its router's scores are neither a softmax nor a sigmoid in the graph")
    if router.groups > 1:
        args += ["--moe-router-num-groups", str(router.groups), "--moe-router-group-topk", str(router.topk_groups)]
    if router.scaling is None:
        why.append("its router multiplies the top-k weights by a factor whose constant is not in the file (a graph-only "
                   "export without its small constants), and --moe-router-topk-scaling-factor must say it")
    elif router.scaling != 1.0:
        args += ["--moe-router-topk-scaling-factor", f"{router.scaling:.7g}"]
    if why:
        raise UnsupportedExport("Megatron-LM's MoE router would compute different weights: " + "; ".join(why) + ELSEWHERE)
    return args


def megatron_moe_args(
    moe: MoeSummary | None,
    *,
    ep: int,
    capacity_factor: float = 1.0,
    dp: int | None = None,
    shared_ffn: int | None = None,
    shared_gate: bool = False,
    layout: MoeLayout | None = None,
    model: TransformerModel | None = None,
) -> list[str]:
    """Megatron-Core's MoE flags (megatron-core 0.16.1: ``--num-experts``, ``--moe-router-topk``,
    ``--expert-model-parallel-size``; the all-to-all token dispatcher and grouped GEMM the planner
    prices; a capacity factor only when tokens may drop), ``[]`` for a dense model.

    The router (:func:`megatron_router_args`, from ``layout``'s reading; without one, a softmax router
    as ``moe`` reads it): ``--moe-router-pre-softmax`` for a softmax not renormalised, the sigmoid,
    bias, group and scaling flags. Shared experts (``shared_ffn``: their FFN size, Qwen2-MoE, DeepSeek)
    are ``--moe-shared-expert-intermediate-size`` and their sigmoid gate ``--moe-shared-expert-gate``
    (``TransformerConfig.moe_shared_expert_gate``: ``sigmoid(x w)`` with ``w`` of shape ``[1, hidden]``,
    as Qwen2-MoE's ``shared_expert_gate``). With ``layout`` and ``model``: ``--moe-ffn-hidden-size``
    where the experts' FFN is not ``model.ffn_hidden_size`` and ``--moe-layer-freq`` where some layers are dense.

    Raises :class:`UnsupportedExport` when ``ep`` does not divide the experts or the data-parallel
    size (Megatron places the expert-parallel group inside the data-parallel ranks), or when the
    router computes weights Megatron's does not (:func:`megatron_router_args`).

    Examples
    --------
    >>> megatron_moe_args(MoeSummary(layers=2, num_experts=8, top_k=2), ep=4)  # doctest: +NORMALIZE_WHITESPACE
    ['--num-experts', '8', '--moe-router-topk', '2', '--expert-model-parallel-size', '4',
     '--moe-token-dispatcher-type', 'alltoall', '--moe-grouped-gemm']
    >>> megatron_moe_args(None, ep=1)
    []
    """
    if moe is None:
        if ep > 1:
            raise UnsupportedExport(f"ep={ep} needs a Mixture-of-Experts model; this one has no routed experts")
        return []
    if moe.num_experts % ep or (dp is not None and dp % ep):
        raise UnsupportedExport(
            f"Megatron-LM needs --expert-model-parallel-size ({ep}) to divide the {moe.num_experts} experts and the "
            f"data-parallel size ({dp}); pick another point"
        )
    router = layout.router if layout is not None else None
    if layout is not None and router is None:
        raise UnsupportedExport("its MoE layers' routers differ (score function, groups, bias or scaling) and "
                                "Megatron-LM's TransformerConfig holds one router for every layer" + ELSEWHERE)
    if router is None and moe.score_function != "softmax":
        raise UnsupportedExport(
            f"the MoE router's scores are a {moe.score_function}, not a softmax, and its layers were not found in full "
            "(experts, bias, groups, scaling), so Megatron-LM's sigmoid router cannot be checked against it" + ELSEWHERE)
    if router is None:  # no layer found in full (its experts not recognised): the summary's plain softmax router
        router = RouterReading(score_function=moe.score_function, num_experts=moe.num_experts, top_k=moe.top_k)
    args = ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
            "--expert-model-parallel-size", str(ep)]
    args += megatron_router_args(router, renormalized=moe.renormalized)
    if layout is not None and model is not None:
        if layout.expert_ffn != model.ffn_hidden_size:
            args += ["--moe-ffn-hidden-size", str(layout.expert_ffn)]
        if not all(layout.pattern):
            args += ["--moe-layer-freq", moe_layer_freq(layout.pattern)]
    if shared_ffn:
        args += ["--moe-shared-expert-intermediate-size", str(shared_ffn)]
        if shared_gate:
            args.append("--moe-shared-expert-gate")
    if ep > 1:
        args += ["--moe-token-dispatcher-type", "alltoall"]
    args.append("--moe-grouped-gemm")
    if capacity_factor != 1.0:
        args += ["--moe-expert-capacity-factor", f"{capacity_factor:g}"]
    return args
