"""Which transformer layers of a model route tokens to experts, with what router and what sizes
(:func:`moe_layout`), read once for every launcher that exports MoE layers: Megatron-LM's
``--moe-layer-freq`` and router flags (:mod:`exporters.megatron.moe`) and torchtitan's deepseek_v3 and
qwen3 MoE arguments (:mod:`exporters.torchtitan.moe`). The router's own reading is
:mod:`importers.moe_router`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from importers.moe import find_moe_layers
from importers.moe_router import RouterReading, router_reading
from importers.transformer import MlpBlock, TransformerModel
from planner.core.graph import OpGraph
from planner.core.memo import IdentityMemo

__all__ = ["MoeLayout", "moe_layout", "explained_irregular", "router_norm_ops"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayout:
    """Which transformer layers route tokens, with what router and what sizes."""

    pattern: tuple[int, ...]
    """Per transformer layer, 1 where its MLP is a MoE layer, 0 where it is dense."""
    router: RouterReading | None
    """The routers' common reading; ``None`` where the layers' routers differ."""
    expert_ffn: int
    """The routed experts' FFN size (elements)."""
    dense_ffn: int | None
    """The dense layers' FFN size (elements; ``None``: no dense layer, or their sizes differ)."""
    dense_uniform: bool = True
    """The dense layers' MLPs all have one size and gating."""


def _layer_of(model: TransformerModel, index: int) -> int:
    """The transformer layer whose ops hold op ``index``: the last attention starting at or before it."""
    starts = [min((*a.q_proj, a.score)) for a in model.attention]
    return max((layer for layer, start in enumerate(starts) if start <= index), default=0)


def moe_layout(graph: OpGraph, model: TransformerModel) -> MoeLayout | None:
    """The MoE layout of ``model`` (``None``: a dense model); kept per graph and model (the family
    check asks on every stage of a search, and again on refusal)."""
    return _LAYOUTS.get((graph, model), lambda: _moe_layout(graph, model))


def _moe_layout(graph: OpGraph, model: TransformerModel) -> MoeLayout | None:
    layers = find_moe_layers(graph)
    if not layers or not model.attention:
        return None
    pattern = [0] * model.num_layers
    for layer in layers:
        pattern[_layer_of(model, layer.topk_op)] = 1
    readings = {router_reading(graph, layer) for layer in layers}
    experts = {i for layer in layers for i in layer.expert_ops}
    shared = set(model.shared_experts)
    dense: list[MlpBlock] = [m for m in model.mlps if m.fc2 not in experts and m not in shared]
    shapes = {(m.ffn_hidden_size, m.gated) for m in dense}
    return MoeLayout(
        pattern=tuple(pattern), router=next(iter(readings)) if len(readings) == 1 else None,
        expert_ffn=min(layer.ffn for layer in layers), dense_ffn=dense[0].ffn_hidden_size if len(shapes) == 1 else None,
        dense_uniform=len(shapes) <= 1,
    )


_LAYOUTS: IdentityMemo[MoeLayout | None] = IdentityMemo(size=64)


def explained_irregular(model: TransformerModel, layout: MoeLayout | None) -> tuple[str, ...]:
    """``model.irregular`` less what ``--moe-layer-freq`` says: dense layers' MLPs of another size than
    the experts (one dense size), and shared experts in the MoE layers only."""
    if layout is None or all(layout.pattern):
        return model.irregular
    moe_layers = sum(layout.pattern)
    explained = {f"{model.num_layers} layers but {moe_layers} with shared experts"}
    if layout.dense_uniform:
        explained.add("the MLP blocks differ in size")
    return tuple(r for r in model.irregular if r not in explained)


def layer_norm_epsilons(graph: OpGraph) -> tuple[float, ...] | None:
    """The distinct epsilons of the model's norms, as :func:`importers.norm_eps.norm_epsilons` reads
    them from its file (``None``: not readable), the routers' divides by their top-k sum left out
    (:func:`router_norm_ops`: no norm of the layers)."""
    from importers.norm_eps import norm_epsilons

    routers = router_norm_ops(graph)
    return norm_epsilons(graph, [i for i, op in enumerate(graph.ops) if op.kind == "norm" and i not in routers])


def router_norm_ops(graph: OpGraph) -> frozenset[int]:
    """The norm ops that are a router's divide of its top-k weights by their sum (the importer reads a
    divide by a sum as a norm; they are ``k`` wide, not the model's width): not the layers' norms."""
    found = set()
    for layer in find_moe_layers(graph):
        for index in range(layer.topk_op + 1, min((*layer.expert_ops, len(graph.ops)))):
            op = graph.ops[index]
            tensor = graph.tensors.get(op.inputs[0].tensor) if op.inputs else None
            if op.kind == "norm" and tensor is not None and tensor.shape[-1:] == (layer.top_k,):
                found.add(index)
    return frozenset(found)
