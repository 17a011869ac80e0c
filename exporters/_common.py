"""Helpers every exporter shares: the dp x tp summary of a strategy, config descriptions, batch size."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from importers.rotary import qk_norm_places
from importers.transformer import TransformerModel, is_parameter
from importers.zero_centred import folded_norm_scales
from planner.core.configs import ConfigSpace, split_products
from planner.core.degrees import dominant_degrees
from planner.core.errors import UnsupportedExport
from planner.core.graph import Op, OpGraph

__all__ = [
    "Degrees",
    "strategy_degrees",
    "dominant_factor",
    "TP_ANCHORS",
    "launcher_degrees",
    "describe_config",
    "graph_batch_size",
    "launch_shape",
    "context_parallel_degree",
    "WHOLE_PROJECTION_TP",
    "attention_model",
    "stream_scale_sites",
    "qk_norm_after_rotary",
    "folded_norm_note",
    "torchscript_head_copy",
    "head_copy_note",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Degrees:
    """A strategy in the vocabulary of frameworks: the dominant data x context x tensor parallel degrees,
    each named for what it splits (:func:`planner.core.degrees.op_degrees`)."""

    dp: int
    """Product of the batch-dim factors of the ops carrying most FLOPs."""
    tp: int
    """Product of the factors of those ops' weight dims (heads, hidden, vocabulary) and spatial dims."""
    devices_used: int
    """Most devices any op runs on."""
    share: float
    """Fraction of forward FLOPs whose op uses exactly these degrees."""
    layouts: int
    """Distinct degrees among ops with FLOPs."""
    cp: int = 1
    """Product of the factors of those ops' sequence dims (context parallelism), never called ``tp``."""

    @property
    def summary(self) -> str:
        """E.g. ``"dp=4 x tp=2"``, ``"dp=2 x cp=4"``, ``"replicated"``; with the share when not uniform."""
        parts = [f"{name}={value}" for name, value in (("dp", self.dp), ("cp", self.cp), ("tp", self.tp)) if value > 1]
        text = " x ".join(parts) if parts else "replicated"
        if self.share < 0.995:
            text += f" ({self.share:.0%} of FLOPs), {self.layouts} layouts"
        return text


def strategy_degrees(graph: OpGraph, spaces: Sequence[ConfigSpace], choice: Sequence[int]) -> Degrees:
    """The dominant ``dp x cp x tp`` of a strategy, weighted by forward FLOPs
    (:func:`planner.core.degrees.dominant_degrees`; a convolution's spatial split counts as ``tp``).

    Examples
    --------
    >>> from planner.core.graph import IterDim, Op, OpGraph
    >>> from planner.core.configs import ConfigOptions, enumerate_configs
    >>> op = Op(name="mm", kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=1.0,
    ...         dims=(IterDim(name="b", size=8, is_batch=True), IterDim(name="n", size=4)))
    >>> space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    >>> g = OpGraph(name="g", ops=(op,), tensors={}, edges=())
    >>> strategy_degrees(g, [space], [space.index_of({"b": 4, "n": 2})]).summary
    'dp=4 x tp=2'
    """
    devices = max((batch * other for op, space, row in zip(graph.ops, spaces, choice)
                   for batch, other in [split_products(op, space, row)]), default=1)  # fmt: skip
    dominant = dominant_degrees(graph, spaces, choice)
    if dominant is None:
        return Degrees(dp=1, tp=1, devices_used=devices, share=1.0, layouts=1)
    (dp, tp, cp, spatial), share, layouts = dominant
    return Degrees(dp=dp, tp=tp * spatial, cp=cp, devices_used=devices, share=share, layouts=layouts)


def dominant_factor(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    choice: Sequence[int],
    *,
    batch: bool,
    ops: Iterable[int] | None = None,
) -> int:
    """The batch (``batch=True``) or the other split product carrying most forward FLOPs among
    ``ops`` (default: all); ops without FLOPs count when no op has any.

    A framework's degrees are read per kind: the LM head may hold most FLOPs while it stays
    replicated over ``tp`` (a vocabulary that does not divide), so ``tp`` is read from the layers'
    linears and attention only, while ``dp`` is shared by every op.
    """
    weights: Counter[int] = Counter()
    indices = range(len(graph.ops)) if ops is None else ops
    for index in indices:
        op, space, row = graph.ops[index], spaces[index], choice[index]
        batch_f, other_f = split_products(op, space, row)
        value = batch_f if batch else other_f
        weights[value] += max(op.flops, 0.0) + 1e-9  # ties and FLOP-less graphs: count ops
    return weights.most_common(1)[0][0] if weights else 1


TP_ANCHORS = frozenset({"qkv", "attention-score", "attention-value", "out-proj", "fc1", "fc2"})
"""Transformer roles whose tensor-parallel split is never optional: a strategy's ``tp`` is read from them."""


def launcher_degrees(
    graph: OpGraph, spaces: Sequence[ConfigSpace], choice: Sequence[int], roles: Sequence[str] | None
) -> tuple[int, int]:
    """``(dp, tp)`` as the launchers read a strategy: the dominant batch split over every op, and the
    dominant other split over the ops whose role (``TransformerModel.roles``) is in
    :data:`TP_ANCHORS` (every op when ``roles`` is ``None``: a model that is not a transformer)."""
    anchors = None if roles is None else [i for i, role in enumerate(roles) if role in TP_ANCHORS]
    dp = dominant_factor(graph, spaces, choice, batch=True)
    return dp, dominant_factor(graph, spaces, choice, batch=False, ops=anchors)


def describe_config(op: Op, space: ConfigSpace, row: int) -> str:
    """A configuration as text, e.g. ``"b0=2 x n=4 (n across 2 nodes)"``; ``"replicated"`` if none.

    Examples
    --------
    >>> from planner.core.graph import IterDim, Op
    >>> from planner.core.configs import ConfigOptions, enumerate_configs
    >>> op = Op(name="mm", kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=1.0,
    ...         dims=(IterDim(name="b", size=8), IterDim(name="n", size=4)))
    >>> space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
    >>> describe_config(op, space, space.index_of({"b": 2, "n": 2}))
    'b=2 x n=2'
    """
    parts = []
    inter = []
    for name, factor, across in zip(space.dim_names, space.factors[row], space.inter_factors[row]):
        if factor > 1:
            parts.append(f"{name}={int(factor)}")
        if across > 1:
            inter.append(f"{name} across {int(across)} nodes")
    text = " x ".join(parts) if parts else "replicated"
    if inter:
        text += f" ({', '.join(inter)})"
    return text


def graph_batch_size(graph: OpGraph) -> int:
    """Samples in one step: the bound batch dim, else the smallest batch-dim size (1 if none).

    The smallest, because a flattened ``batch*seq`` axis is a batch dim too.
    """
    for name, value in graph.dim_bindings.items():
        if name.lower() in ("batch", "batch_size", "n", "bs"):
            return int(value)
    sizes = [d.size for op in graph.ops for d in op.dims if d.is_batch]
    return min(sizes) if sizes else 1


def launch_shape(world: int, devices_per_node: int) -> tuple[int, int]:
    """``(nodes, processes per node)`` for ``world`` processes filling nodes of ``devices_per_node``.

    Examples
    --------
    >>> launch_shape(16, 8), launch_shape(4, 8)
    ((2, 8), (1, 4))
    """
    if world <= devices_per_node:
        return 1, world
    return -(-world // devices_per_node), devices_per_node


def torchrun_nodes(world: int, devices_per_node: int) -> tuple[int, int]:
    """:func:`launch_shape` of a ``torchrun`` launch, which starts the same number of processes on
    every node: raises :class:`UnsupportedExport` when ``world`` does not fill whole nodes."""
    nnodes, per_node = launch_shape(world, devices_per_node)
    if nnodes * per_node != world:
        raise UnsupportedExport(
            f"{world} processes do not fill whole nodes of {devices_per_node} devices; torchrun starts "
            "the same number of processes on every node"
        )
    return nnodes, per_node


def samples_per_rank(plan_input, dp: int, pipeline=None) -> int:
    """Samples each of ``dp`` data-parallel ranks takes per pass (``plan_input.samples_per_pass``
    split ``dp`` ways), checked against ``pipeline``'s micro-batch when there is one; raises
    :class:`UnsupportedExport` when the split is not whole or disagrees with the pipeline."""
    micro = plan_input.samples_per_pass
    if micro % dp:
        raise UnsupportedExport(f"the micro batch of {micro} samples does not divide into {dp} data-parallel ranks")
    if pipeline is not None and micro // dp != pipeline.micro_batch:
        raise UnsupportedExport(
            f"the pipeline's micro-batch is {pipeline.micro_batch} samples per rank but its {micro} samples split "
            f"{dp} ways give {micro // dp}; export the point's own plan input"
        )
    return micro // dp


def context_parallel_degree(graph: OpGraph, spaces: Sequence[ConfigSpace], choice: Sequence[int], rules: Sequence) -> int:
    """The context-parallel degree of a strategy: how many ways the attention score products split
    their query sequence (the FLOP-heaviest split when the layers differ; 1 without attention).
    ``rules``: the ops' rules of the launchers' tensor-parallel layout (``exporters._tp.TpLayout.rules``)."""
    weights: dict[int, float] = {}
    for index, rule in enumerate(rules):
        if rule.role != "attention-score" or rule.context is None:
            continue
        space = spaces[index]
        factor = int(space.factors[choice[index], space.dim_names.index(rule.context)])
        weights[factor] = weights.get(factor, 0.0) + graph.ops[index].flops + 1e-9
    return max(weights, key=weights.__getitem__) if weights else 1


WHOLE_PROJECTION_TP = (
    "its queries and keys are normalised over the whole projection (OLMo-2's q_norm / k_norm over heads x "
    "head_dim channels), which a column-split Q/K projection's local heads cannot feed (transformers' OLMo-2 "
    "tp plan gathers the projections' outputs, colwise_gather_output); plan tp=1"
)
"""Why a launcher that splits the Q / K projections by columns and runs the model's own modules
(DeepSpeed AutoTP, a DTensor plan) cannot run a ``whole-projection`` QK-norm (:mod:`importers.qk_norm`) at tp > 1."""


def reads_per_head_weights(graph: OpGraph) -> bool:
    """Whether ``graph``'s queries and keys are normalised by one ``LayerNorm(head_dim)`` per head, each with
    its own weights (:mod:`importers.qk_norm` ``per-head-weights``, StableLM's ``StableLmLayerNormPerHead``):
    what DeepSpeed AutoTP and a DTensor plan run at tp = 1 only (their ``PER_HEAD_WEIGHTS_TP``)."""
    from importers.transformer import analyze_transformer

    try:
        model = analyze_transformer(graph)
    except UnsupportedExport:
        return False
    return model.features.qk_norm == "per-head-weights"


def attention_model(graph: OpGraph, launcher_needs: str):
    """:func:`importers.transformer.analyze_transformer` of ``graph``, with a model without attention
    refused in the refusing launcher's words: the importer's reason names Megatron-LM's and DeepSpeed's
    tensor parallelism whoever asks, so its finding (``model 'X' has no attention (matmul -> softmax ->
    matmul) ...``) is kept and ``launcher_needs`` (from ``", so it is not a transformer"`` on: what the
    launcher trains, then its fix or :data:`exporters.elsewhere.ELSEWHERE`) replaces the rest. Any other
    refusal is raised as it is."""
    from importers.transformer import analyze_transformer

    try:
        return analyze_transformer(graph)
    except UnsupportedExport as refusal:
        finding, said, _ = refusal.reason.partition(", so it is not a transformer")
        if not said or not finding.startswith(f"model '{graph.name}' has no attention"):
            raise
        raise UnsupportedExport(finding + launcher_needs) from None


def _learned_scale(graph: OpGraph, index: int, hidden: int) -> bool:
    """Whether op ``index`` (an attention's output projection or an MLP's second linear) multiplies its
    output by a learned ``hidden``-vector: it reads more parameters of ``hidden`` elements than a bias
    (at most one, added), and runs a ``Mul``."""
    from importers.transformer import is_parameter

    op = graph.ops[index]
    vectors = {a.tensor for a in op.inputs if is_parameter(graph, a.tensor) and graph.tensors[a.tensor].num_elements == hidden}
    return "Mul" in op.node_types and len(vectors) > min(op.node_types.count("Add"), 1)


def stream_scale_sites(model, graph: OpGraph | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Where ``model`` scales its residual stream or logits, as ``(constant, learned)``: ``constant`` the
    importer's :attr:`LayerFeatures.stream_scales` (``"embedding"``, ``"attention output"``, ``"logits"``:
    Granite's multipliers, Gemma's embedding normaliser), less what ``learned`` names; ``learned`` the
    sub-layers (``"attention"``, ``"MLP"``) whose output every layer multiplies by a learned per-channel
    vector before the residual add (LayerScale: BEiT's ``lambda_1`` / ``lambda_2``, CaiT's, DINOv2's
    ``gamma``), read from ``graph`` (``()`` without one). A learned scale is a parameter a launcher's
    layer must have, not a constant it could fold, so the two are refused in different words."""
    if graph is None:
        return tuple(model.features.stream_scales), ()
    softcap_only = model.lm_head is not None and _softcap_is_the_logits_scale(graph.ops[model.lm_head].node_types)
    hidden = model.hidden_size
    learned = tuple(name for name, ops in (("attention", [i for a in model.attention for i in a.out_proj]),
                                           ("MLP", [m.fc2 for m in model.mlps]))
                    if ops and all(_learned_scale(graph, i, hidden) for i in ops))
    constant = tuple(w for w in model.features.stream_scales
                     if not (w == "attention output" and "attention" in learned) and not (w == "logits" and softcap_only))
    return constant, learned


def _softcap_is_the_logits_scale(node_types: Sequence[str]) -> bool:
    """Whether the only ``Mul`` / ``Div`` after the LM head's product are a soft-cap's, ``cap * tanh(x / cap)``
    (Gemma-2's final-logit soft-capping, refused in its own words): the one right before and the one right after
    each ``Tanh``. Such logits are capped, not scaled by a factor.

    >>> _softcap_is_the_logits_scale(("MatMul", "Div", "Tanh", "Mul")), _softcap_is_the_logits_scale(("MatMul", "Div"))
    (True, False)
    >>> _softcap_is_the_logits_scale(("MatMul", "Mul", "Div", "Tanh", "Mul"))
    False
    """
    first = next((k for k, t in enumerate(node_types) if t in ("MatMul", "Gemm")), None)
    if first is None or "Tanh" not in node_types[first + 1:]:
        return False
    after = list(node_types[first + 1:])
    capping = {k + d for k, t in enumerate(after) if t == "Tanh" for d in (-1, 1)}
    return not any(t in ("Mul", "Div") and k not in capping for k, t in enumerate(after))


def folded_norm_note(graph: OpGraph, remedy: str) -> list[str]:
    """One note when the norms' scales are constants the ONNX exporter computed
    (:func:`importers.zero_centred.folded_norm_scales`), so a launcher that builds the model from flags
    cannot be told whether it scales by ``1 + w``: what the export assumes, and ``remedy``; ``[]`` otherwise."""
    folded = folded_norm_scales(graph)
    if not folded:
        return []
    more = f" and {len(folded) - 1} more" if len(folded) > 1 else ""
    return [f"the norms' scales ({folded[0]}{more}) are constants the ONNX exporter computed (constant folding), so "
            "the file cannot show whether the model scales by (1 + weight) as Nemotron's LayerNorm1P and Gemma's "
            f"RMSNorm do: exported as plain scales; {remedy} (or export the ONNX without constant folding, "
            "do_constant_folding=False or optimize=False, for the planner to read it)"]


def torchscript_head_copy(graph: OpGraph, model: TransformerModel) -> str:
    """The untied LM head's weight when its name is one the TorchScript exporter makes (``onnx::MatMul_N``)
    and its shape is the word table's transposed, so it may be the tied table's copy; ``""`` otherwise.
    Without the weights in the file the importer cannot tell a tied copy from an untied head of that shape
    (:func:`importers.parameters._find_tied_copies` counts it, with a warning), so the model reads untied."""
    if model.lm_head is None or model.tied_embeddings or model.token_embedding is None:
        return ""
    table = next((a.tensor for a in graph.ops[model.token_embedding].inputs if is_parameter(graph, a.tensor)), None)
    for access in graph.ops[model.lm_head].inputs:
        name = access.tensor
        if (table is not None and name.startswith("onnx::") and is_parameter(graph, name)
                and graph.tensors[name].shape == graph.tensors[table].shape[::-1]):
            return name
    return ""


def head_copy_note(graph: OpGraph, model: TransformerModel | None, remedy: str) -> list[str]:
    """One note when the LM head may be the tied word table's TorchScript copy (:func:`torchscript_head_copy`):
    the export writes it untied, as the file shows, and ``remedy`` says how to tie it in the launcher's terms;
    ``[]`` otherwise."""
    copy = torchscript_head_copy(graph, model) if model is not None else ""
    if not copy:
        return []
    return [f"the LM head's weight {copy} is a constant the TorchScript exporter made, which it also writes for the "
            "word table's transposed copy when the two are tied: written untied, as the file shows; if the model ties "
            f"them (GPT-2, Gemma, Llama's tie_word_embeddings), {remedy} (a dynamo export names the tied weight)"]


def qk_norm_after_rotary(graph: OpGraph, attention: tuple, theirs: str) -> list[str]:
    """The refusal clause for the layers whose QK-norm follows the rotary embedding
    (:func:`importers.rotary.qk_norm_places`: HunYuan-V1 rotates, then normalises) where ``theirs``, the launcher's
    QK-norm, normalises before rotating (a per-head RMSNorm does not commute with the rotation); ``[]`` when no layer
    does. Megatron-LM's and torchtitan's qwen3 family's refusals say it in these words."""
    late = [str(i) for i, place in enumerate(qk_norm_places(graph, attention)) if place == "after-rotary"]
    if not late:
        return []
    return [f"in layer{'s' if len(late) > 1 else ''} {', '.join(late)} (counting from 0) it normalises its queries and "
            f"keys after the rotary embedding (RoPE, then QK-norm, as HunYuan-V1) and {theirs} normalises them before "
            "rotating (QK-norm, then RoPE)"]
