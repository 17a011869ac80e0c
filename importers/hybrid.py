r"""Mamba-2 and hybrid Mamba-2 / attention / MLP stacks, read from the op graph (issue 25).

A launcher that builds such a model from flags (Megatron-LM's ``pretrain_mamba.py``, megatron-core's
``MambaModel``) needs its layer kinds in order and the sizes of each kind. :func:`analyze_hybrid`
reads them from the residual stream: an embedding, then layers each written ``x + f(norm(x))`` (one
residual add per layer, pre-norm), a final norm and an LM head. Each layer is one of Megatron's
``--hybrid-override-pattern`` letters (``megatron.core.ssm.mamba_hybrid_layer_allocation.Symbols``):

* ``M``: a Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060): ``in_proj``
  (hidden -> ``2 d_inner + 2 G N + H``: gate, x, B, C, dt), a depthwise causal ``Conv`` over the
  ``d_inner + 2 G N`` channels of x, B and C, the chunked scan (its ``Einsum``\ s carry the state
  size ``N`` as their operands' last axis), a gated RMSNorm over ``G`` groups of ``d_inner / G``
  (its output laid out ``[.., G, d_inner / G]``), ``out_proj`` (``d_inner`` -> hidden). ``H`` is
  ``P - d_inner - C`` for an ``in_proj`` of width ``P`` and a conv of ``C`` channels.
* ``*``: attention (a softmax between two matmuls), its heads from the scores' ``[b, heads, s, s]``,
  its head size from the output projection, its query groups from the Q/K/V widths.
* ``-``: an MLP (two linears, or three with a gate).
* ``E``: a layer routing tokens to experts (:func:`importers.moe.find_moe_layers`: a ``TopK`` or SparseMixer
  router), with a shared MLP beside the experts or not (Granite-4.0-H sums the two before the residual add,
  :func:`_residual_adds`), read as megatron-core 0.16.1 builds it (``mamba_stack_spec``'s ``moe_layer``, a
  ``MoETransformerLayer``: :mod:`importers.hybrid_moe`, :attr:`HybridStack.experts`). Its experts and shared
  experts take the MLP layers' activation (one ``TransformerConfig.activation_func``): where they differ, a clause.

A Mamba-1 mixer (a linear narrowing the conv's output: ``x_proj``) is named and refused: megatron-core builds
Mamba-2 only.

Every layer's parameters are then counted as megatron-core builds that kind of layer and compared
with the graph's (:func:`layer_parameters`): a layer whose count differs (a bias, ``D`` per channel,
an expert) is named in :attr:`HybridStack.irregular` rather than guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from importers.layer_features import (attention_mask_of, attention_scale_of, mlp_activation, mlp_activation_of,
                                      squared_relu, stream_scales, zero_centred_norms)
from importers.mamba_mixer import depthwise_weight as _depthwise_weight, has_mamba_mixer, mamba_mixers
from importers.mamba_mixer import linear_weight as _weight
from importers.hybrid_moe import Activation, HybridExperts, expert_layer_parameters, expert_sizes
from importers.moe import MoeLayer, find_moe_layers
from importers.quick_geglu import scaled_silu_inputs
from importers.param_role import is_parameter
from planner.core.graph import Op, OpGraph

__all__ = ["MambaSizes", "HybridStack", "analyze_hybrid", "has_mamba_mixer", "mamba_mixers", "layer_parameters"]

LayerKind = Literal["M", "*", "-", "E"]
HybridMlp = Activation
"""A layer's MLP activation (:data:`importers.hybrid_moe.Activation`, which its ``E`` layers' experts share)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MambaSizes:
    """One Mamba-2 mixer's sizes (megatron-core 0.16.1 ``TransformerConfig.mamba_*`` names)."""

    num_heads: int
    """``H``: SSM heads (``--mamba-num-heads``)."""
    head_dim: int
    """``d_inner / H`` (``--mamba-head-dim``)."""
    num_groups: int
    """``G``: groups of B and C and of the gated norm (``--mamba-num-groups``)."""
    state_dim: int
    """``N``: the state size per head (``--mamba-state-dim``)."""
    conv_kernel: int
    """The depthwise convolution's width in tokens."""

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.d_inner + 2 * self.num_groups * self.state_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridStack:
    """A Mamba-2 or hybrid stack as :func:`analyze_hybrid` read it (module docstring)."""

    pattern: str
    """One letter per layer, in order: ``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE."""
    hidden_size: int
    vocab_size: int
    seq_length: int
    mamba: MambaSizes | None
    num_attention_heads: int = 0
    num_query_groups: int = 0
    kv_channels: int = 0
    """Attention's head size (0 without attention layers)."""
    ffn_hidden_size: int = 0
    mlp: HybridMlp | None = None
    """The MLP layers' activation: ``squared-relu`` is ``relu(x)^2`` (Nemotron-H), ``swiglu`` a SiLU gate; the MoE
    layers' experts' where the stack has no MLP layer."""
    experts: HybridExperts | None = None
    """The ``E`` layers' sizes and router (:mod:`importers.hybrid_moe`); ``None`` without MoE layers, or where they
    differ (a clause in :attr:`irregular`)."""
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    tied_embeddings: bool = False
    causal: bool = True
    """Every attention layer's mask is proven causal (vacuous without attention)."""
    rotary: bool = False
    """The graph computes sines or cosines (rotary position embeddings somewhere)."""
    attention_scale: float | None = None
    """The factor every attention layer's scores are scaled by, read from the file
    (:func:`importers.layer_features.attention_scale_of`); ``None`` without attention or where not read."""
    stream_scales: tuple[str, ...] = ()
    """Where a constant scales the residual stream (:func:`_stream_scales`): ``"embedding"``, ``"attention output"``
    (here: some layer's branch before its residual add) and ``"logits"``, as
    :func:`importers.layer_features.stream_scales` names them; empty for none (Megatron's)."""
    irregular: tuple[str, ...] = ()
    """What the stack holds that these sizes do not describe, one clause each (empty: exact)."""
    residual_adds: tuple[int, ...] = ()
    """The op index of each layer's residual add, in order (:func:`_residual_adds`: an MoE layer's sum of its routed
    and shared experts is not one); a pipeline stage ends at one of them."""

    @property
    def num_layers(self) -> int:
        return len(self.pattern)


def _params(graph: OpGraph, ops: list[int]) -> dict[str, tuple[int, ...]]:
    """The parameters the ops read (each once, tied aliases by their canonical name) with their shapes."""
    out: dict[str, tuple[int, ...]] = {}
    for index in ops:
        for access in graph.ops[index].inputs:
            if is_parameter(graph, access.tensor):
                name = graph.parameter_aliases.get(access.tensor, access.tensor)
                out[name] = tuple(int(d) for d in graph.tensors[access.tensor].shape)
    return out


def _size(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _residual_adds(graph: OpGraph, stream: str, hidden_shape: tuple[int, ...]) -> list[int] | None:
    """The residual adds in order, each reading the previous one's output (the first: ``stream``);
    ``None`` when some add of the hidden shape does not chain. An add of two branches that the next
    residual add reads beside the stream is a branch sum inside a layer, not a break of the chain
    (Granite-4.0-H's routed experts plus its shared MLP: ``x + (moe(n) + shared_mlp(n))``)."""
    ops, current = graph.ops, stream
    candidates = [index for index, op in enumerate(ops) if op.kind == "elementwise" and op.node_types == ("Add",)
                  and len(op.inputs) == 2 and not any(is_parameter(graph, a.tensor) for a in op.inputs)
                  and _stream_shapes([tuple(graph.tensors[a.tensor].shape) for a in op.inputs], hidden_shape)]
    adds = []
    for position, index in enumerate(candidates):
        read = {a.tensor for a in ops[index].inputs}
        if current in read:
            adds.append(index)
            current = ops[index].outputs[0].tensor
            continue
        summed = ops[index].outputs[0].tensor
        if not any({current, summed} <= {a.tensor for a in ops[later].inputs} for later in candidates[position + 1:]):
            return None
    return adds


def _stream_shapes(shapes: list[tuple[int, ...]], hidden_shape: tuple[int, ...]) -> bool:
    """Whether an add of operands of ``shapes`` adds to the residual stream: one operand of the stream's shape,
    the other the same or a view of it with the tokens flattened (``[batch * seq, hidden]``: an MoE block's
    output, whose reshape back the coarse graph folds into the add)."""
    if hidden_shape not in shapes:
        return False
    return all(s == hidden_shape or (_size(s) == _size(hidden_shape) and s[-1:] == hidden_shape[-1:]) for s in shapes)


def analyze_hybrid(graph: OpGraph) -> HybridStack | None:
    """The stack of a graph with a Mamba-2 mixer (module docstring); ``None`` for a graph without one.

    Raises nothing: what cannot be read is in :attr:`HybridStack.irregular` (an empty pattern when
    not even the residual stream was found).
    """
    if not has_mamba_mixer(graph):
        return None
    ops = graph.ops
    embeddings = [i for i, op in enumerate(ops) if op.kind == "embedding"]
    if not embeddings:
        return _unreadable("no token embedding")
    first = embeddings[0]
    table = next((graph.tensors[a.tensor].shape for a in ops[first].inputs if is_parameter(graph, a.tensor)), None)
    out_shape = tuple(graph.tensors[ops[first].outputs[0].tensor].shape)
    if table is None or len(table) != 2 or len(out_shape) != 3:
        return _unreadable("the token embedding is not a [vocab, hidden] table read as [batch, seq, hidden]")
    vocab, hidden = int(table[0]), int(table[1])
    adds = _residual_adds(graph, ops[first].outputs[0].tensor, out_shape)
    if not adds:
        return _unreadable("no residual stream (x + f(norm(x)) per layer) from the embedding")
    irregular: list[str] = []
    if len(embeddings) > 1:
        irregular.append(f"{len(embeddings) - 1} embedding table(s) beside the tokens' (learned positions?)")
    bounds = [first, *adds]
    layers = [list(range(bounds[i] + 1, bounds[i + 1] + 1)) for i in range(len(adds))]
    moe = find_moe_layers(graph)
    reads = [_read_layer(graph, layer, hidden, ops[bounds[i]].outputs[0].tensor, moe) for i, layer in enumerate(layers)]
    kinds = "".join(r.kind for r in reads)
    sizes: dict[str, set] = {k: {r.sizes for r in reads if r.kind == k} for k in "M*-E"}
    irregular += _layer_clauses(reads)
    for kind, found in sizes.items():
        if len(found) > 1:
            irregular.append(f"the {_NAMES[kind]} layers differ in size ({len(found)} sizes); Megatron builds one")
    mamba = next(iter(sizes["M"]), None)
    attention = next(iter(sizes["*"]), (0, 0, 0))
    mlp = next(iter(sizes["-"]), (0, None))
    experts = next(iter(sizes["E"]), None) if len(sizes["E"]) == 1 else None
    mlp = (mlp[0], _common_activation(mlp[1], experts, irregular))
    tail = _read_tail(graph, adds[-1], hidden, vocab, irregular)
    norms = {r.norm for r in reads} | {tail.norm}
    if len(norms) > 1:
        irregular.append("the layers mix LayerNorm and RMSNorm")
    if zero_centred_norms(graph) != "none":  # TENorm takes --apply-layernorm-1p; MambaMixer's gated RMSNorm does not
        irregular.append("some norms scale by 1 + w (zero-centred), which megatron-core 0.16.1's MambaMixer "
                         "gated RMSNorm cannot (--apply-layernorm-1p reaches its TENorm layers only)")
    softmaxes = [i for layer, read in zip(layers, reads) if read.kind == "*" for i in layer if ops[i].kind == "softmax"]
    return HybridStack(
        pattern=kinds, hidden_size=hidden, vocab_size=vocab, seq_length=int(out_shape[1]), mamba=mamba,
        num_attention_heads=attention[0], num_query_groups=attention[1], kv_channels=attention[2],
        ffn_hidden_size=mlp[0], mlp=mlp[1], experts=experts, normalization=tail.norm, tied_embeddings=tail.tied,
        causal=not softmaxes or attention_mask_of(graph, softmaxes) == "causal",
        rotary=bool(graph.raw_op_types.get("Sin") or graph.raw_op_types.get("Cos")),
        attention_scale=attention_scale_of(graph, softmaxes) if softmaxes else None,
        stream_scales=_stream_scales(graph, adds, ops[first].outputs[0].tensor), irregular=tuple(irregular),
        residual_adds=tuple(adds),
    )


def _common_activation(mlp: HybridMlp | None, experts: HybridExperts | None, irregular: list[str]) -> HybridMlp | None:
    """The one activation megatron-core gives the MLP layers, the routed and the shared experts
    (``TransformerConfig.activation_func`` and ``gated_linear_unit``): the MLP layers', else the experts'; a clause in
    ``irregular`` where they differ."""
    found = [a for a in (mlp, experts and experts.activation, experts and experts.shared_activation) if a]
    if len(set(found)) > 1:
        irregular.append(f"its MLP layers, experts and shared experts compute {', '.join(dict.fromkeys(found))}, and "
                         "megatron-core builds them all with one activation (TransformerConfig.activation_func)")
    return found[0] if found else None


def _stream_scales(graph: OpGraph, adds: list[int], stream: str) -> tuple[str, ...]:
    """Where constants scale the residual stream: the token embedding's output, a layer's branch before its residual
    add (the op writing the add's other operand) or the LM head's output (the linears after the last add), by
    :func:`importers.layer_features.stream_scales`' rule (a ``Mul`` or ``Div`` after the op's gather or product):
    Granite-4.0-H's ``embedding_multiplier``, ``residual_multiplier`` and ``logits_scaling``."""
    ops = graph.ops
    producers = {o.tensor: i for i, op in enumerate(ops) for o in op.outputs}
    branches, current = [], stream
    for index in adds:
        branches += [producers[a.tensor] for a in ops[index].inputs if a.tensor != current and a.tensor in producers]
        current = ops[index].outputs[0].tensor
    head = [i for i in range(adds[-1] + 1, len(ops)) if _weight(graph, ops[i]) is not None]
    return stream_scales(graph, branches, head)


_NAMES = {"M": "Mamba", "*": "attention", "-": "MLP", "E": "MoE"}


def _layer_clauses(reads: list["_Layer"]) -> list[str]:
    """The layers' clauses, each said once with the layers it holds for (``layers 0 and 2 (M): ...``), in the
    order of their first layer and, within a layer, as :func:`_read_layer` found them (its kind first)."""
    where: dict[str, list[int]] = {}
    for position, read in enumerate(reads):
        for why in read.irregular:
            where.setdefault(f"({read.kind}): {why}", []).append(position)
    out = []
    for clause, positions in where.items():
        named = ", ".join(str(p) for p in positions[:-1]) + f" and {positions[-1]}" if len(positions) > 1 else ""
        out.append(f"layers {named} {clause}" if named else f"layer {positions[0]} {clause}")
    return out


def _unreadable(why: str) -> HybridStack:
    return HybridStack(pattern="", hidden_size=0, vocab_size=0, seq_length=0, mamba=None, irregular=(why,))


@dataclass(frozen=True, slots=True)
class _Layer:
    kind: LayerKind
    sizes: object
    norm: str
    irregular: tuple[str, ...]


def _norm_kind(op: Op) -> str:
    return "LayerNorm" if "LayerNormalization" in op.node_types or "Sub" in op.node_types else "RMSNorm"


def _read_layer(graph: OpGraph, layer: list[int], hidden: int, stream: str, moe: tuple[MoeLayer, ...] = ()) -> _Layer:
    """One layer's kind, sizes, input norm and what does not match megatron-core's layer of that kind.

    Pre-norm is read from the first of the layer's ops that reads the residual stream ``stream`` (ops that
    only build masks or positions may come before it in the graph's order). A layer routing its tokens to
    experts (one of ``moe``, or a ``TopK``) is ``E``, its sizes :func:`importers.hybrid_moe.expert_sizes`' (a
    ``TopK`` whose experts were not found: a clause)."""
    ops = graph.ops
    why: list[str] = []
    norm = "RMSNorm"
    entry = next((i for i in layer if any(a.tensor == stream for a in ops[i].inputs)), layer[0])
    if ops[entry].kind != "norm":
        why.append("its first op on the residual stream is not a norm (not pre-norm)")
    else:
        norm = _norm_kind(ops[entry])
    params = _params(graph, layer)
    convs = [i for i in layer if ops[i].kind == "conv"]
    softmaxes = [i for i in layer if ops[i].kind == "softmax"]
    linears = [(i, w) for i in layer if (w := _weight(graph, ops[i])) is not None]
    routed = next((m for m in moe if m.topk_op in layer), None)
    if routed is None and any("TopK" in ops[i].node_types for i in layer):
        why.insert(0, _moe_clause(routed))
        return _Layer(kind="E", sizes=None, norm=norm, irregular=tuple(why))
    if routed is not None:
        experts = expert_sizes(graph, routed, why)
        return _Layer(kind="E", sizes=experts, norm=norm, irregular=tuple(why + _counted("E", experts, params, hidden)))
    if convs and softmaxes:  # megatron-core 0.16.1's MambaStack: one mixer per layer (M or *), never both
        why.insert(0, "it runs a Mamba mixer and attention side by side on one input, their outputs summed (a parallel "
                      "hybrid layer, as Falcon-H1's), and megatron-core's MambaStack runs one mixer per layer")
        return _Layer(kind="M", sizes=None, norm=norm, irregular=tuple(why))
    if convs:
        kind, sizes = "M", _mamba_sizes(graph, layer, convs, linears, hidden, why)
    elif softmaxes:
        kind, sizes = "*", _attention_sizes(graph, layer, softmaxes, linears, hidden, why)
    else:
        kind, sizes = "-", _mlp_sizes(graph, layer, linears, hidden, why)
    # an MLP of no activation Megatron builds is refused for that (exporters.megatron.mamba): its count, gated or
    # not, would only restate it
    unbuilt = kind == "-" and sizes is not None and sizes[1] == "other"  # type: ignore[index]
    counted = _counted(kind, sizes, params, hidden) if not why and not unbuilt else []
    return _Layer(kind=kind, sizes=sizes, norm=norm, irregular=tuple(why + counted))


def _counted(kind: str, sizes: object, params: dict[str, tuple[int, ...]], hidden: int) -> list[str]:
    """A clause where the layer's parameters are not the count of megatron-core's layer of ``kind`` and ``sizes``
    (:func:`layer_parameters`); none where they are, or where the sizes were not read."""
    if sizes is None:
        return []
    expected, found = layer_parameters(kind, sizes, hidden), sum(_size(s) for s in params.values())
    if found == expected:
        return []
    return [f"{found:,} parameters where megatron-core's {_NAMES[kind]} layer of these sizes has {expected:,} "
            "(biases, or a part it does not build)"]


def _moe_clause(routed: MoeLayer | None) -> str:
    """Why an ``E`` layer whose experts were not found (``routed`` ``None``: a TopK alone) is refused: megatron-core
    0.16.1 builds such a layer, from sizes the graph did not give.

    >>> _moe_clause(None)[:52]
    'it routes each token to some experts (an MoE layer: '
    """
    what = "some experts" if routed is None else (
        f"{routed.top_k} of {routed.num_experts} experts of FFN {routed.ffn}"
        + (f" beside a shared MLP of FFN {routed.shared_ffn}" if routed.shared_ffn else ""))
    return (f"it routes each token to {what} (an MoE layer: megatron-core 0.16.1 builds one as 'E' in "
            "--hybrid-override-pattern, mamba_stack_spec's MoETransformerLayer), and the graph does not show its experts' "
            "sizes, which the export's --num-experts and --moe-ffn-hidden-size must say")


def layer_parameters(kind: str, sizes: object, hidden: int) -> int:
    """Parameters of one megatron-core 0.16.1 layer of ``kind`` (its input norm's scale included).

    ``M`` (``MambaLayer``/``MambaMixer``): ``in_proj`` without bias, the conv's weight and bias,
    ``dt_bias``, ``A_log`` and ``D`` per head (``D_has_hdim=False``), the gated norm's scale over
    ``d_inner``, ``out_proj`` without bias. ``*``: Q, K, V and the output projection without biases.
    ``-``: ``fc1`` (twice as wide with a gate) and ``fc2`` without biases. ``E``:
    :func:`importers.hybrid_moe.expert_layer_parameters`.

    >>> layer_parameters("M", MambaSizes(num_heads=8, head_dim=16, num_groups=2, state_dim=16, conv_kernel=4), 64)
    30360
    """
    if kind == "M":
        m = sizes
        assert isinstance(m, MambaSizes)
        proj = 2 * m.d_inner + 2 * m.num_groups * m.state_dim + m.num_heads
        return (hidden + hidden * proj + m.conv_channels * (m.conv_kernel + 1) + 3 * m.num_heads + m.d_inner
                + m.d_inner * hidden)
    if kind == "E":
        assert isinstance(sizes, HybridExperts)
        return expert_layer_parameters(sizes, hidden)
    if kind == "*":
        heads, groups, head_dim = sizes  # type: ignore[misc]
        return hidden + hidden * (heads + 2 * groups) * head_dim + heads * head_dim * hidden
    ffn, activation = sizes  # type: ignore[misc]
    return hidden + hidden * ffn * (3 if activation == "swiglu" else 2)


def _mamba_sizes(graph: OpGraph, layer: list[int], convs: list[int], linears: list, hidden: int,
                 why: list[str]) -> MambaSizes | None:
    ops = graph.ops
    weight = _depthwise_weight(graph, ops[convs[0]])
    selective = _projected_after_conv(graph, convs[0]) if weight is not None else None
    if selective is not None:
        narrowed = _weight(graph, ops[selective])[1]  # type: ignore[index]
        why.append(f"a Mamba-1 mixer: a linear projects the conv's {weight[0]} channels to {narrowed} (x_proj: dt, B "  # type: ignore[index]
                   "and C per token, dt widened back to every channel by dt_proj), where megatron-core 0.16.1's "
                   "MambaMixer is Mamba-2 (B, C and one dt per head split from in_proj)")
        return None
    if len(convs) != 1 or weight is None or len(linears) != 2:
        why.append(f"{len(convs)} conv(s) and {len(linears)} linear(s) where a Mamba-2 mixer has one depthwise conv, "
                   "in_proj and out_proj")
        return None
    channels, kernel = weight
    (_, (h_in, width)), (_, (d_inner, h_out)) = linears
    heads = width - d_inner - channels
    einsums = [i for i in layer if ops[i].kind == "matmul" and "Einsum" in ops[i].node_types]
    state = graph.tensors[ops[einsums[0]].inputs[0].tensor].shape[-1] if einsums else 0
    groups = (channels - d_inner) // (2 * state) if state else 0
    if (h_in, h_out) != (hidden, hidden) or heads <= 0 or d_inner % heads or not groups \
            or channels != d_inner + 2 * groups * state:
        why.append(f"in_proj {h_in} x {width}, a conv of {channels} channels, out_proj {d_inner} x {h_out} and a "
                   f"scan state of {state} do not fit a Mamba-2 mixer's z, x, B, C, dt split")
        return None
    gated = [i for i in layer if ops[i].kind == "norm" and graph.tensors[ops[i].inputs[0].tensor].shape[-1] == d_inner]
    norm_groups = 1
    if gated:
        shape = graph.tensors[ops[gated[0]].outputs[0].tensor].shape
        norm_groups = int(shape[-2]) if len(shape) >= 4 and int(shape[-1]) * int(shape[-2]) == d_inner else 1
    if not gated or norm_groups != groups:
        why.append(f"its gated norm normalises {norm_groups if gated else 'no'} group(s) of d_inner where B and C have "
                   f"{groups} (megatron-core normalises each of --mamba-num-groups groups)")
    return MambaSizes(num_heads=heads, head_dim=d_inner // heads, num_groups=groups, state_dim=int(state),
                      conv_kernel=kernel)


def _projected_after_conv(graph: OpGraph, conv: int, hops: int = 4) -> int | None:
    """The parameter linear that reads the conv's output within ``hops`` ops and narrows it (Mamba-1's ``x_proj``:
    ``d_inner -> dt_rank + 2 N``, Gu & Dao 2023, arXiv:2312.00752, Algorithm 2), else ``None``. A Mamba-2 mixer
    splits x, B and C off the conv's output and reads no weight until ``out_proj``, after the scan and the gated
    norm."""
    channels = _depthwise_weight(graph, graph.ops[conv])[0]  # type: ignore[index]
    frontier = {conv}
    for _ in range(hops):
        frontier = {e.consumer for e in graph.edges if e.producer in frontier}
        for i in sorted(frontier):
            weight = _weight(graph, graph.ops[i])
            if weight is not None and weight[0] == channels and weight[1] < channels:
                return i
        frontier = {i for i in frontier if graph.ops[i].kind not in ("matmul", "softmax")}
    return None


def _attention_sizes(graph: OpGraph, layer: list[int], softmaxes: list[int], linears: list, hidden: int,
                     why: list[str]) -> tuple[int, int, int] | None:
    ops = graph.ops
    if len(softmaxes) != 1:
        why.append(f"{len(softmaxes)} softmaxes in one attention layer")
        return None
    scores = graph.tensors[ops[softmaxes[0]].outputs[0].tensor].shape
    before = [w for i, w in linears if i < softmaxes[0]]
    after = [w for i, w in linears if i > softmaxes[0]]
    heads = int(scores[-3]) if len(scores) >= 4 else 0
    if not heads or len(after) != 1 or not before or any(w[0] != hidden for w in before) or after[0][1] != hidden:
        why.append("its projections are not Q, K, V (or one fused QKV) before the softmax and one output projection after")
        return None
    head_dim = after[0][0] // heads
    kv = sum(w[1] for w in before) - heads * head_dim
    if kv <= 0 or kv % (2 * head_dim) or heads % (kv // (2 * head_dim)):
        why.append(f"Q/K/V widths {[w[1] for w in before]} do not split into {heads} query heads of {head_dim} and "
                   "query groups dividing them")
        return None
    if any("Tanh" in ops[i].node_types for i in layer):
        why.append("a tanh in the attention (soft-capping), which megatron-core's attention has not")
    return heads, kv // (2 * head_dim), head_dim


def _mlp_sizes(graph: OpGraph, layer: list[int], linears: list, hidden: int,
               why: list[str]) -> tuple[int, HybridMlp] | None:
    ops = graph.ops
    if len(linears) not in (2, 3) or linears[-1][1][1] != hidden or any(w[0] != hidden for _, w in linears[:-1]):
        why.append(f"{len(linears)} linear(s) that are not an MLP's fc1 (and gate) and fc2 (or experts, which the "
                   "hybrid export does not read)")
        return None
    ffn = linears[-1][1][0]
    # from the first linear on: the input norm's Mul before it would read a SiLU as x * sigmoid(a x)
    types = tuple(t for i in layer[layer.index(linears[0][0]): layer.index(linears[-1][0])] for t in ops[i].node_types)
    # three linears, or one fc1 twice as wide as fc2 reads (gate and up fused, then split: Granite-4.0-H's input_linear)
    if len(linears) == 3 or linears[0][1][1] == 2 * ffn:
        read = mlp_activation(types)
        span = layer[layer.index(linears[0][0]): layer.index(linears[-1][0])]
        if read == "scaled-sigmoid" and (scales := _silu_scales(graph, span)):  # silu(a g), not g * sigmoid(a g)
            read = "silu"
            why += _gate_scale_clause(scales)
        activation: HybridMlp = "swiglu" if read == "silu" else "other"
    elif "Relu" in types:  # relu(x)^2 read by the one rule of importers.layer_features
        head = layer[: layer.index(linears[-1][0])]
        activation = "squared-relu" if any(squared_relu(ops[i].node_types) for i in head) else "relu"
    else:
        read = mlp_activation_of(graph, layer[: layer.index(linears[-1][0])])  # a Gelu's form, from the file
        activation = "gelu" if read in ("gelu-erf", "gelu") else "other"
    return ffn, activation


def _silu_scales(graph: OpGraph, span: list[int]) -> list[float]:
    """The factors :math:`a` of the SiLUs of a scaled input, :math:`\\operatorname{silu}(a g)`, among the ops ``span``
    (:func:`importers.quick_geglu.scaled_silu_inputs`, read from the graph's file); ``[]`` without the file or where
    some ``Sigmoid`` of the span is not one (a quick-GELU, :math:`g\\,\\sigma(a g)`)."""
    path = graph.source_path
    if not path or not Path(path).is_file():
        return []
    scaled = scaled_silu_inputs(str(path), getattr(graph, "source_sha256", ""))
    ops = graph.ops
    found = [scaled[n] for i in span for n in ops[i].onnx_nodes if n in scaled]
    sigmoids = sum(ops[i].node_types.count("Sigmoid") for i in span)
    return found if found and len(found) == sigmoids else []


def _gate_scale_clause(scales: list[float]) -> list[str]:
    """The clause of a SwiGLU whose gate is scaled before its SiLU (Falcon-H1's ``mlp_multipliers[0]``); none for a
    factor of 1. megatron-core 0.16.1's ``--swiglu`` computes ``silu(x W_gate) * (x W_up)`` (``core/activations.py``,
    ``fusions/fused_bias_swiglu.py``) with no factor: the same functions, trained as another parametrisation."""
    if all(a == 1.0 for a in scales):
        return []
    said = ", ".join(dict.fromkeys("a constant the file does not hold" if math.isnan(a) else f"{a:g}" for a in scales))
    return [f"it multiplies its gate projection by {said} before the SiLU (Falcon-H1's mlp_multipliers, muP), and "
            "megatron-core's --swiglu has no such factor"]


@dataclass(frozen=True, slots=True)
class _Tail:
    norm: str
    tied: bool


def _read_tail(graph: OpGraph, last_add: int, hidden: int, vocab: int, irregular: list[str]) -> _Tail:
    """The final norm and the LM head after the last residual add."""
    ops = graph.ops
    rest = list(range(last_add + 1, len(ops)))
    norms = [i for i in rest if ops[i].kind == "norm"]
    heads = [(i, w) for i in rest if (w := _weight(graph, ops[i])) is not None]
    if len(norms) != 1 or len(heads) != 1 or heads[0][1] not in ((hidden, vocab), (vocab, hidden)):
        irregular.append(f"{len(norms)} norm(s) and {len(heads)} linear(s) after the last layer where megatron-core "
                         "has a final norm and the LM head")
        return _Tail(norm="RMSNorm", tied=False)
    embedding_tables = {graph.parameter_aliases.get(a.tensor, a.tensor) for op in ops if op.kind == "embedding"
                        for a in op.inputs if is_parameter(graph, a.tensor)}
    head_weights = set(_params(graph, [heads[0][0]]))
    return _Tail(norm=_norm_kind(ops[norms[0]]), tied=bool(head_weights & embedding_tables))
