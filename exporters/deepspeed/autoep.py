"""Whether DeepSpeed's expert parallelism (AutoEP, ``ds_config`` ``expert_parallel``) would shard a
model's experts as planned (:func:`expert_parallel_problem`), and whether ``deepspeed.moe.layer.MoE``'s
gate is the model's router (:func:`moe_layer_gate_matches`).

At ``ep = 1`` DeepSpeed trains the user's module as exported (ZeRO data parallelism, every expert on
every rank), so nothing here applies; only ``ep > 1`` needs AutoEP to find and replace the MoE
blocks. DeepSpeed 0.19.8 (``module_inject``):

- ``auto_ep.py:417-470`` (``AutoEP.ep_parser``): a block is a module whose name fullmatches the
  preset's ``moe_layer_pattern`` and which has an ``experts`` child and a ``router_pattern`` child;
  ``auto_ep.py:623-625``: none found, it logs ``AutoEP: no MoE layers detected in model.`` and trains
  on (an unknown ``model_type``; a known one raises ``ValueError``).
- ``auto_ep_presets/{mixtral,qwen3_moe,qwen3_5_moe,deepseek_v2,deepseek_v3,minimax_m3}.py``: every
  built-in preset has ``moe_layer_pattern=r"model\\.layers\\.\\d+\\.mlp"`` and ``router_pattern="gate"``;
  ``auto_ep_presets/registry.py:157-186`` tries them all for a ``model_type`` none names.
- ``auto_ep_config.py:59,71``: ``route_norm`` and ``score_func`` in the ``expert_parallel`` section
  override the preset's and the model config's (``auto_ep.py:521-530``, ``auto_ep_layer.py:540``), which the
  export pins to the graph's routing.

``deepspeed/moe/sharded_moe.py``: ``top1gating`` keeps the top softmax probability, ``top2gating``
divides the two gates by their sum (lines 383-392), ``topkgating`` divides the k gates by their sum
(lines 478-482); AutoEP's own router divides them only with ``route_norm`` (``moe/ep_router.py:181``).
"""

from __future__ import annotations

import re

from importers.moe import SPARSEMIXER_ROUTER, find_moe_layers
from importers.transformer import MoeSummary, analyze_transformer, moe_summary
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph
from planner.core.memo import IdentityMemo

__all__ = ["AUTOEP_ROUTER", "autoep_preset", "expert_parallel_problem", "expert_parallel_reason", "moe_gate_problem",
           "moe_layer_gate_matches", "router_paths"]

AUTOEP_ROUTER = re.compile(r"(?:.+\.)?model\.layers\.\d+\.mlp\.gate")
"""A router module path AutoEP's presets find: ``model.layers.N.mlp`` with a ``gate`` child. A prefix
is allowed: an ONNX export often wraps the Hugging Face model (``model.model.layers.N.mlp.gate``),
while the model handed to ``deepspeed.initialize`` names its modules from ``model.layers``."""

_PROBLEMS: IdentityMemo["tuple[str, str] | None"] = IdentityMemo(size=16)
"""The last graphs' answers, ``(reason, fix)`` (the search asks on every family and setting)."""

_GENERIC_FIX = ": plan ep=1, or use the generic plan"
"""The advice after a router DeepSpeed-MoE's gate does not run (:func:`moe_gate_problem`)."""


def router_paths(graph: OpGraph) -> list[str]:
    """The module path of each MoE layer's router linear (exporter metadata or the ONNX node name,
    ``model.layers.1.feed_forward.router``), the TopK's where the linear has none; layers with
    neither are left out."""
    paths = []
    for layer in find_moe_layers(graph):
        path = graph.ops[layer.router_op].module_path or graph.ops[layer.topk_op].module_path
        if path:
            paths.append(path)
    return paths


def moe_layer_gate_matches(moe: MoeSummary) -> bool:
    """Whether ``deepspeed.moe.layer.MoE``'s gate routes as the model does: a softmax over the
    experts, its top-k probabilities divided by their sum for ``k >= 2`` and kept as is for ``k = 1``
    (``sharded_moe.py`` ``top1gating``/``top2gating``/``topkgating``).

    >>> moe_layer_gate_matches(MoeSummary(layers=2, num_experts=8, top_k=2, renormalized=False))
    False
    """
    return moe.score_function == "softmax" and moe.renormalized == (moe.top_k > 1)


def expert_parallel_problem(graph: OpGraph) -> str | None:
    """Why DeepSpeed would not run this model's experts ``ep > 1`` ways as planned, ending with the fix,
    or ``None`` (a dense model, or MoE blocks AutoEP finds with a softmax router). A model whose routers
    carry no module path is not refused on names (nothing says AutoEP would miss them)."""
    found = _PROBLEMS.get((graph,), lambda: _problem(graph))
    return None if found is None else "".join(found)


def expert_parallel_reason(graph: OpGraph) -> str | None:
    """:func:`expert_parallel_problem`'s reason without its fix (``"plan ep=1"``), for a message that
    names the pin to change itself (:mod:`planner.launch_messages`, ``--fix ep=N``)."""
    found = _PROBLEMS.get((graph,), lambda: _problem(graph))
    return None if found is None else found[0]


def _problem(graph: OpGraph) -> tuple[str, str] | None:
    """``(reason, fix)`` of :func:`expert_parallel_problem`."""
    moe = moe_summary(graph)
    if moe is None:
        return None
    missed = [path for path in router_paths(graph) if not AUTOEP_ROUTER.fullmatch(path)]
    if missed:
        return (
            f"DeepSpeed 0.19.8's AutoEP finds MoE blocks named model.layers.N.mlp with a 'gate' router "
            f"(module_inject/auto_ep_presets), and this model's router is {missed[0]}: it would detect no MoE "
            "layer and keep every expert on every rank", "; plan ep=1"
        )
    reason = _gate_reason(moe)
    if reason is not None:
        return reason, _GENERIC_FIX
    if autoep_preset(graph) is None:
        shared = next(path for path in _shared_paths(graph) if not _QWEN_SHARED.fullmatch(path)) or "unnamed"
        return (
            f"DeepSpeed 0.19.8's AutoEP replaces a whole model.layers.N.mlp block, and its softmax presets keep "
            f"shared experts named shared_expert (qwen3_moe) only; this model's are {shared}", ": plan ep=1"
        )
    return None


_QWEN_SHARED = re.compile(r"(?:.+\.)?model\.layers\.\d+\.mlp\.shared_expert(?:_gate)?(?:\..+)?")
"""A module path inside Qwen2-MoE's shared expert or its gate (``auto_ep_presets/qwen3_moe.py``)."""


def _shared_paths(graph: OpGraph) -> list[str]:
    """The module paths of the ops of every layer's shared experts (none without them): those
    :func:`importers.moe.find_moe_layers` links to a layer, and the shared MLPs the transformer reader finds
    (``TransformerModel.shared_experts``), which include one computed before the router, outside the layer's
    span (ERNIE-4.5-MoE's ``mlp.shared_experts``: read as no shared expert, it was exported as AutoEP's
    ``mixtral`` preset, which replaces the block without it)."""
    ops = [i for layer in find_moe_layers(graph) for i in layer.shared_ops]
    try:
        ops += [i for block in analyze_transformer(graph).shared_experts for i in (*block.fc1, block.fc2)]
    except UnsupportedExport:  # no attention: the routed layers' own reading alone
        pass
    return [graph.ops[i].module_path or "" for i in dict.fromkeys(ops)]


def autoep_preset(graph: OpGraph) -> str | None:
    """The AutoEP preset the export names (``expert_parallel.preset_model``): ``mixtral`` without
    shared experts, ``qwen3_moe`` with Qwen2-MoE's ``shared_expert``, ``None`` for shared experts by
    another name. Named because AutoEP tries all six presets for a ``model_type`` none lists
    (``registry.py:186``), and all six match a ``model.layers.N.mlp`` with ``gate`` and ``experts``
    children: it then refuses the model as ambiguous (``auto_ep.py:73-86``; OLMoE, ``olmoe``). The
    two presets differ only in the shared expert (``auto_ep_presets/mixtral.py``, ``qwen3_moe.py``);
    ``mixtral`` on Qwen2-MoE would replace the block without its shared expert."""
    shared = _shared_paths(graph)
    if not shared:
        return "mixtral"
    return "qwen3_moe" if all(_QWEN_SHARED.fullmatch(path) for path in shared) else None


def moe_gate_problem(moe: MoeSummary) -> str | None:
    """Why DeepSpeed's expert parallelism would train another router than the model's, or ``None``:
    AutoEP and ``deepspeed.moe.layer.MoE`` take the top-k of a softmax over the experts, so a
    sigmoid router (DeepSeek-V3's scores, bias correction and group-limited top-k) or an unread one
    has no DeepSpeed form at ``ep > 1``."""
    reason = _gate_reason(moe)
    return None if reason is None else reason + _GENERIC_FIX


def _gate_reason(moe: MoeSummary) -> str | None:
    """:func:`moe_gate_problem`'s reason without its fix."""
    if moe.score_function != "softmax":
        router = {"sigmoid": "sigmoid scores (DeepSeek-V3-style)", "sparsemixer": SPARSEMIXER_ROUTER}.get(
            moe.score_function, "scores the importer could not read")
        return (f"DeepSpeed-MoE's gate is a softmax top-{moe.top_k}; this model routes with {router}, so ep > 1 would "
                "train another router")
    return None
