r"""The torchtitan 0.3.0 model families the export writes, which one builds a model, and why none does.

torchtitan 0.3.0 ships ``torchtitan/models/{llama3, qwen3, qwen3_5, deepseek_v3, gpt_oss, kimi_k2_7,
muse_glimmer, flux}``; each is a ``Decoder.Config`` builder plus trainer presets in its
``config_registry``. Three build decoders the importer reads in full:

======== ============================================================ ===========================
family    what it builds (``models/<family>/__init__.py``)             told apart by
======== ============================================================ ===========================
llama3    pre-norm RMSNorm decoder, GQA with ``head_dim = dim /       no QK-norm
          n_heads``, SwiGLU, no biases, ``ComplexRoPE`` (interleaved
          pairs; torchtitan's state-dict adapter permutes Hugging
          Face's Q/K to it)
qwen3     the same with a free ``head_dim`` and a per-head RMSNorm on  a per-head QK-norm
          Q and K before the rotary embedding (``make_gqa_config(...,
          qk_norm=...)``), ``CosSinRoPE`` (rotate-half, Hugging
          Face's layout)
deepseek_ multi-latent attention (``make_mla_attention_config``: a    multi-latent attention
v3        query latent or a full-rank ``wq``, a K/V latent with its
          RMSNorm, a rotary part of ``qk_rope_head_dim`` channels,
          ``v_head_dim``), RMSNorm, ``ComplexRoPE``; its MoE layers
          start at ``n_dense_layers`` (the layer count for a dense
          model; DeepSeek-V3's routers:
          :mod:`exporters.torchtitan.moe`)
======== ============================================================ ===========================

Both take the rotary base (``RoPE.Config.theta``; llama3's ``ComplexRoPE`` also Llama 3.1's scaling,
``scaling="llama"`` with its factors fitted to the file's frequencies) and the norms' epsilon (``RMSNorm.Config.eps``),
which the export reads from the file (:mod:`importers.rotary`, :mod:`importers.norm_eps`) and, where
the file does not hold them (a hand-built graph, stripped constants), writes as the family's presets
do, saying so in a note. A routed qwen3 (Qwen3-MoE) is written with qwen3's MoE layers
(:func:`moe_refusals`: every layer routed, softmax top-k renormalised as the file reads, no shared
expert) at expert parallelism 1 or the planner's ``ep`` where torchtitan runs it as priced
(:mod:`exporters.torchtitan.experts`). A routed deepseek_v3 (DeepSeek-V3: leading dense layers, shared
experts, sigmoid scores with a bias correction, group-limited top-k, a scaling factor) is written with
its MoE layers where :func:`exporters.torchtitan.moe.deepseek_routing` finds torchtitan's router the
file's, with the same expert parallelism; the router's divide of its top-k weights by their sum, which
the importer reads as a norm (:func:`exporters._moe_layout.router_norm_ops`), is not counted as one.
A sliding window (:mod:`importers.sliding_window`) narrower than the planned sequence is refused:
every family's attention is causal over all earlier tokens. Zero-centred norms, ``norm(x) * (1 + w)``
(NeMo's LayerNorm1P, Gemma's RMSNorm: :attr:`~importers.layer_features.LayerFeatures.zero_centred_norms`),
are refused: every family's norm is ``models/common/nn_modules.py``'s ``RMSNorm``, an ``nn.RMSNorm``
scaling by its weight (initialised at 1), with no offset to set. The graph's norms are counted against the
family's (:func:`_norm_count`), so no norm the family lacks goes unseen. A per-head QK-norm the
importer reads sits between the projection and the rotary embedding (:mod:`importers.qk_norm` passes a
norm only when the projection writes it), the order torchtitan's ``GQAttention`` applies. Not
written: attention layers without RoPE (SmolLM3's NoPE layers, :func:`importers.rotary.rotated_layers`: every
family rotates every layer), ``gpt_oss``'s MoE layers, YaRN-scaled MLA (DeepSeek-V3's own: its factors are not in the
file), ``qwen3_5``'s hybrid linear attention, and the multimodal families; each is refused in one
line (:func:`family_refusals`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from exporters._common import attention_model, qk_norm_after_rotary, stream_scale_sites
from exporters.elsewhere import ELSEWHERE
from exporters._moe_layout import explained_irregular, layer_norm_epsilons, moe_layout, router_norm_ops
from exporters.torchtitan.moe import DeepSeekRouting, deepseek_routing
from importers.moe import SPARSEMIXER_ROUTER
from importers.moe_router import RouterReading
from importers.rotary import Llama3Scaling, rotary_frequencies, rotated_layers
from importers.sliding_window import sliding_windows, window_unread
from importers.transformer import LatentAttention, MoeSummary, TransformerModel, analyze_transformer, embedding_rows, moe_summary
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph

__all__ = ["FamilySpec", "FAMILIES", "TorchtitanArch", "family_of", "family_refusals", "llama_refusals", "mla_sizes",
           "torchtitan_arch"]


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilySpec:
    """What the written registry module takes from one torchtitan family."""

    name: str
    """``torchtitan.models.<name>``."""
    preset: str
    """The ``config_registry`` function whose trainer settings (data, tokenizer, optimizer) the module keeps."""
    model_class: str
    """``<name>.model.<model_class>``, the ``Decoder.Config`` subclass built."""
    rope: str
    """``torchtitan.models.common`` RoPE config class of the family."""
    theta: float
    """Rotary base written when the file does not hold one."""
    eps: float
    """RMSNorm epsilon written when the file does not hold one."""


FAMILIES = {
    # llama3: ComplexRoPE's RoPE.Config default theta (models/common/rope.py); RMSNorm.Config's default eps,
    # which _build_llama3_layers keeps (models/common/nn_modules.py)
    "llama3": FamilySpec(name="llama3", preset="llama3_8b", model_class="Llama3Model", rope="ComplexRoPE",
                         theta=10000.0, eps=1e-5),
    # qwen3: every preset's CosSinRoPE theta 1e6 but 235B-A22B's, and qwen3._EPS (models/qwen3/__init__.py)
    "qwen3": FamilySpec(name="qwen3", preset="qwen3_0_6b", model_class="Qwen3Model", rope="CosSinRoPE",
                        theta=1000000.0, eps=1e-6),
    # deepseek_v3: every preset's theta (with YaRN), and RMSNorm.Config's default eps (its norm_init sets none);
    # the debug preset keeps expert_parallel_degree 1 (the 16B and 671B presets set 8 and 32)
    "deepseek_v3": FamilySpec(name="deepseek_v3", preset="deepseek_v3_debugmodel", model_class="DeepSeekV3Model",
                              rope="ComplexRoPE", theta=10000.0, eps=1e-5),
}
"""The families written, by name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchtitanArch:
    """A model torchtitan builds exactly: its family, sizes, rotary base and norm epsilon."""

    family: FamilySpec
    model: TransformerModel
    theta: float
    """``RoPE.Config.theta``."""
    theta_read: bool
    """Whether :attr:`theta` is the file's (``False``: the family's default, said in a note)."""
    eps: float
    """``RMSNorm.Config.eps`` of every norm."""
    eps_read: bool
    """Whether :attr:`eps` is the file's."""
    moe: MoeSummary | None = None
    """The routed experts of every layer (qwen3's MoE layers), ``None`` for a dense model."""
    window: int | None = None
    """The file's sliding window (tokens), no narrower than the planned sequence; ``None``: none read."""
    routing: DeepSeekRouting | None = None
    """deepseek_v3's MoE arguments (dense layers, experts, router) of a routed MLA model, else ``None``."""
    scaling: Llama3Scaling | None = None
    """Llama 3.1's scaling of the rotary frequencies read from the file (``RoPE.Config(scaling="llama", ...)``,
    llama3's ``ComplexRoPE``), ``None``: plain geometric frequencies."""


def family_of(model: TransformerModel) -> FamilySpec:
    """The family that would build ``model``: deepseek_v3 for multi-latent attention, qwen3 for a
    per-head QK-norm (the only difference torchtitan's llama3 and qwen3 have besides the RoPE layout),
    llama3 otherwise."""
    if any(a.mla is not None for a in model.attention):
        return FAMILIES["deepseek_v3"]
    return FAMILIES["qwen3" if model.features.qk_norm == "per-head" else "llama3"]


def mla_sizes(mla: LatentAttention | None) -> tuple[int, int, int, int, int] | None:
    """``(q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)`` as torchtitan's
    ``make_mla_attention_config`` takes them (``q_lora_rank`` 0: a full-rank ``wq``); ``None`` without MLA."""
    if mla is None:
        return None
    return (mla.q_lora_rank or 0, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim)


def _second_table_clause(model: TransformerModel, graph: OpGraph | None) -> str:
    """What the largest embedding lookup beside the token embedding is (``model.position_table_rows``), as far
    as the graph tells: a learned position table, the word table read again (an encoder-decoder's decoder
    embeds its own tokens from it: T5, UMT5, BART) or another table."""
    rotary = "the family embeds tokens only and uses rotary positions"
    if model.position_tables:  # importers.position_table: read from its indices
        return f"it learns a position table, {rotary}"
    if graph is not None and model.token_embedding is not None:
        word = graph.ops[model.token_embedding].inputs[0].tensor
        largest = [i for i in model.position_embeddings
                   if embedding_rows(graph, graph.ops[i]) == model.position_table_rows]
        if largest and all(graph.ops[i].inputs[0].tensor == word for i in largest):
            return ("it looks its word table up a second time (an encoder-decoder's decoder embeds its own tokens), "
                    "the family embeds one token sequence")
    return (f"it learns a {model.position_table_rows}-row embedding table beside the token embedding "
            f"(a token-type or position table), {rotary}")


def _common_refusals(model: TransformerModel, graph: OpGraph | None) -> list[str]:
    """The clauses every family shares: what none of the decoders builds (``graph`` tells a learned
    LayerScale from a constant factor: :func:`exporters._common.stream_scale_sites`)."""
    features, out = model.features, []
    if model.irregular:
        out.append("it is not one uniform stack of layers (" + "; ".join(model.irregular) + ")")
    if model.lm_head is None or model.vocab_size is None:
        out.append("it has no LM head to the vocabulary")
    if model.normalization != "RMSNorm":
        out.append(f"it normalises with {model.normalization}, the family with RMSNorm")
    if model.mlps and (not model.gated_mlp or features.mlp_activation not in (None, "silu")):  # none read: said above
        out.append("its MLP is not SwiGLU (a SiLU-gated MLP)")
    if model.position_table_rows is not None:  # the Decoder embeds tokens only; positions are rotary
        out.append(_second_table_clause(model, graph))
    if model.linear_bias or model.qkv_bias:
        out.append("its linear layers have biases, the family's have none")
    if model.num_attention_heads % model.num_query_groups:
        out.append(f"its {model.num_query_groups} KV heads do not divide its {model.num_attention_heads} heads")
    capped = [w for w, on in (("its attention scores", features.attention_softcap),
                              ("its final logits", features.logit_softcap)) if on]
    if capped:  # Attention (sdpa / flex) and the output projection: no tanh
        out.append(f"it soft-caps {' and '.join(capped)} (cap * tanh(x / cap), Gemma-2), the family has no soft-cap")
    if features.reordered_norm:  # TransformerBlock: x + attention(attention_norm(x)), a norm on the inputs only
        out.append("it normalises the outputs of attention and the MLP and not their inputs (x + norm(f(x)), OLMo-2's "
                   "reordered norm), the family's layers normalise the inputs (pre-norm)")
    elif features.post_attention_norm or features.post_mlp_norm:
        where = " and ".join(w for w, on in (("attention", features.post_attention_norm),
                                             ("the MLP", features.post_mlp_norm)) if on)
        out.append(f"it normalises the output of {where} before the residual add (sandwich norms, Gemma-2 and -3), "
                   "the family's layers have no such norm")
    if features.post_layernorm or features.parallel_residual:  # Decoder's blocks: x + f(norm(x)), in sequence
        out.append("its sub-layers are not pre-norm in sequence (post-LN or parallel attention and MLP)")
    if features.alibi:
        out.append("it adds ALiBi biases to the attention scores")
    if any(a.position_scores for a in model.attention):  # importers.attention_terms; Attention: sdpa / flex on Q, K, V alone
        out.append("it adds relative-position terms computed from its queries or keys to the attention scores "
                   "(DeBERTa's disentangled attention, Transformer-XL's relative attention), the family's attention has none")
    if features.attention_mask == "bidirectional":
        out.append("its attention is bidirectional and the family's is causal")
    scale = features.attention_scale  # torchtitan 0.3.0 models/common/attention.py: scale=None, SDPA's 1/sqrt(head_dim)
    if scale is not None and abs(scale * model.head_dim ** 0.5 - 1) > 1e-3:
        out.append(f"it scales its attention scores by 1/sqrt({scale ** -2:.6g}), not 1/sqrt({model.head_dim}) of its "
                   "head size (known causes: Gemma's query_pre_attn_scalar, T5's unscaled scores, DeBERTa's "
                   "1/sqrt(3 d), a YaRN mscale)")
    if features.zero_centred_norms != "none":  # models/common/nn_modules.py:134: RMSNorm(nn.RMSNorm), x / rms * w
        what = {"all": "its norms scale by (1 + weight)", "mixed": "some of its norms scale by (1 + weight)",
                "other": "a norm scales by (weight + c)"}[features.zero_centred_norms]
        out.append(f"{what} (zero-centred, as LayerNorm1P and Gemma's RMSNorm), the family's RMSNorm (nn.RMSNorm) by "
                   "the weight")
    constant, learned = stream_scale_sites(model, graph)
    if constant:  # Decoder: h = x + attention(norm(x)), logits = lm_head(norm(h)), no factors
        out.append(f"it scales {' and '.join(f'the {w}' for w in constant)} by a factor (Granite's "
                   "multipliers, Gemma's embedding normaliser), the family scales none")
    if learned:  # the same: no parameter between a sub-layer and its residual add
        out.append(f"it multiplies each {' and each '.join(learned)} output by a learned per-channel vector before the "
                   "residual add (LayerScale, as BEiT's lambda_1 and lambda_2), the family's layers have no such parameter")
    return out


def family_refusals(model: TransformerModel, family: str, graph: OpGraph | None = None) -> list[str]:
    """What ``model`` computes that torchtitan 0.3.0's ``family`` (``llama3``, ``qwen3``, ``deepseek_v3``) does not,
    one clause each (empty: the family builds it, up to the rotary base and epsilon :func:`torchtitan_arch` reads;
    ``graph``, where given, tells a learned LayerScale from a constant factor)."""
    out, qk = _common_refusals(model, graph), model.features.qk_norm
    if family == "deepseek_v3":
        # one make_mla_attention_config for every layer (build_mla_moe_layers)
        if len({mla_sizes(a.mla) for a in model.attention}) > 1:
            out.append("its layers' multi-latent attention sizes differ (or some layers have none); the family "
                       "builds every layer with one set")
        if qk != "none":  # MLA normalises its latents only (q_norm over q_lora_rank, kv_norm over kv_lora_rank)
            out.append("it normalises its queries and keys per head beside its latents, the family only the latents")
    elif family == "llama3":
        # _build_llama3_layers passes no head_dim: make_gqa_config's is dim // n_heads
        if model.head_dim * model.num_attention_heads != model.hidden_size:
            out.append(f"its head size {model.head_dim} x {model.num_attention_heads} heads is not the hidden size "
                       f"{model.hidden_size}")
        if qk != "none":  # llama3's GQAttention has no qk_norm
            out.append("it normalises its queries and keys (QK-norm, as Qwen3, OLMo-2 and Gemma-3), the family does not")
    elif qk != "per-head":  # qwen3's q_norm / k_norm: RMSNorm(head_dim), shared by the heads
        out.append("it does not normalise each head of its queries and keys (the family's per-head QK-norm)"
                   if qk == "none" else "it normalises its queries and keys over the whole projection (OLMo-2), "
                   "the family per head")
    elif graph is not None:  # GQAttention.forward: q_norm / k_norm, then self.rope (models/common/attention.py:989-993)
        out += qk_norm_after_rotary(graph, model.attention, "the family")
    return out


def llama_refusals(model: TransformerModel) -> list[str]:
    """:func:`family_refusals` of the ``llama3`` family."""
    return family_refusals(model, "llama3")


def _rotary(graph: OpGraph, model: TransformerModel, family: FamilySpec) -> tuple[float, bool, str, Llama3Scaling | None]:
    """``(theta, read from the file, why the family's RoPE cannot say it or "", Llama 3.1 scaling or None)``:
    torchtitan's RoPE turns every channel of a head of every layer by a geometric series of base ``theta``
    (``scaling="none"``) or by Llama 3.1's scaling of one (``scaling="llama"`` with ``scaling_factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``: ``ComplexRoPE`` only,
    ``CosSinRoPE`` raises ``NotImplementedError``, torchtitan 0.3.0 ``models/common/rope.py``)."""
    if any(a.position_scores for a in model.attention):  # positions from relative terms (refused in their words):
        return family.theta, False, "", None  # a geometric constant is their sinusoid table's (XLNet's inv_freq), no RoPE's
    ops = graph.ops  # a cross-attention (keys from another stream than its queries) rotates nothing by design
    own = [not (a.q_proj and a.k_proj) or ops[a.q_proj[0]].inputs[0].tensor == ops[a.k_proj[0]].inputs[0].tensor
           for a in model.attention]
    turned = rotated_layers(graph, model.attention)
    if "both" in turned and any(t != "both" for t, o in zip(turned, own) if o):  # SmolLM3's NoPE layers
        layers = [str(i) for i, (t, o) in enumerate(zip(turned, own)) if o and t != "both"]
        which = f"layer {layers[0]}" if len(layers) == 1 else f"layers {', '.join(layers)}"
        return family.theta, False, (f"in {which} (counting from 0) its attention does not rotate the queries and keys "
                                     "(NoPE layers, as SmolLM3's), and the family rotates them in every layer"), None
    path = graph.source_path
    found = rotary_frequencies(path) if path and Path(path).is_file() else None
    if found is None or (found.geometric and found.base is None):
        return family.theta, False, "", None
    scaling = found.llama3 if family.rope == "ComplexRoPE" and family.name != "deepseek_v3" else None
    if (not found.geometric or found.base is None) and scaling is None:
        what = ("a scaled RoPE such as Llama 3.1's or DeepSeek-V3's YaRN, whose factors the file does not give"
                if found.llama3 is None else f"Llama 3.1's scaling, which the family's {family.rope} does not apply")
        return family.theta, False, f"its rotary frequencies are not a geometric series ({what})", None
    base = found.base if scaling is None else scaling.base
    sizes = mla_sizes(model.attention[0].mla) if model.attention else None
    channels = sizes[3] if family.name == "deepseek_v3" and sizes else model.head_dim  # MLA: qk_rope_head_dim
    if 2 * found.pairs != channels:
        what = "rotary part" if family.name == "deepseek_v3" else "head"
        return base, True, (f"it rotates {2 * found.pairs} channels of its {channels}-channel {what} and the "
                            "family's RoPE turns all of them"), scaling
    return base, True, "", scaling


def _epsilon(graph: OpGraph, family: FamilySpec) -> tuple[float, bool, str]:
    """``(eps, read from the file, why one RMSNorm.Config.eps cannot say it or "")``."""
    found = layer_norm_epsilons(graph)
    if found is None:
        return family.eps, False, ""
    if len(found) > 1:
        return found[0], True, f"its norms' epsilons differ ({', '.join(f'{e:g}' for e in found)})"
    return found[0], True, ""


def _windows(graph: OpGraph) -> tuple[int, ...]:
    path = graph.source_path
    return sliding_windows(path, graph.source_sha256) if path and Path(path).is_file() else ()


def _window(graph: OpGraph, model: TransformerModel) -> str:
    """Why the families' causal attention (every earlier token: ``GQAttention`` and MLA with
    FlexAttention's causal mask) is not the file's, or "": a sliding window (:mod:`importers.sliding_window`)
    narrower than the planned sequence, or one whose width the file does not hold (a graph-only dynamo export
    saved with every initializer external), which no sequence length proves wide enough. At a sequence no
    longer than the window the two are one mask."""
    path = graph.source_path
    if path and Path(path).is_file() and window_unread(path, graph.source_sha256):
        return ("it attends within a sliding window whose width the file does not hold (a graph-only export saved "
                "every initializer external, the window's constant too), so the family's causal attention over every "
                "earlier token cannot be proven the same; export it with its small constants inline")
    windows = _windows(graph)
    if not windows or windows[0] >= model.seq_length:
        return ""
    return (f"it attends within a sliding window of {windows[0]} tokens (Mistral's and Gemma's sliding_window), "
            f"narrower than its {model.seq_length}-token sequence, and the family's causal attention sees every "
            "earlier token")


def _norm_count(graph: OpGraph, model: TransformerModel, family: FamilySpec) -> str:
    """Why the graph's norms are not the family's, or "": two per layer and the final one, plus qwen3's
    ``q_norm`` / ``k_norm`` and deepseek_v3's ``kv_norm`` (and ``q_norm`` with a query latent) per layer.
    Sandwich norms and a QK-norm llama3 lacks, already refused, are not counted again."""
    features, layers = model.features, model.num_layers
    if features.post_attention_norm or features.post_mlp_norm or model.normalization != "RMSNorm":
        return ""
    if family.name == "llama3" and features.qk_norm != "none":  # family_refusals' QK-norm clause says why the count differs
        return ""
    sizes = mla_sizes(model.attention[0].mla) if model.attention else None
    per_layer = 2 + {"qwen3": 2, "deepseek_v3": 1 + (sizes is not None and sizes[0] > 0)}.get(family.name, 0)
    routers = router_norm_ops(graph)  # a router's divide of its top-k weights by their sum reads as a norm
    found = sum(op.kind == "norm" and i not in routers for i, op in enumerate(graph.ops))
    expected = per_layer * layers + 1
    if found == expected:
        return ""
    return (f"it has {found} norms where torchtitan's {family.name} of {layers} layers has {expected} ({per_layer} per "
            "layer and the final one)")


def torchtitan_arch(graph: OpGraph) -> TorchtitanArch:
    """The torchtitan family, sizes, rotary base and epsilon of ``graph``'s model, or
    :class:`UnsupportedExport` naming everything the family would compute differently."""
    model = attention_model(graph, ", so it is not a transformer: torchtitan trains its own model families, and "
                            f"those it is exported to ({', '.join(FAMILIES)}) are decoder-only transformers" + ELSEWHERE)
    family = family_of(model)
    moe = moe_summary(graph)
    # deepseek_v3's dense layers beside its MoE ones are n_dense_layers, not an irregular stack
    explained = (replace(model, irregular=explained_irregular(model, moe_layout(graph, model)))
                 if moe is not None and family.name == "deepseek_v3" else model)
    refusals = family_refusals(explained, family.name, graph)
    theta, theta_read, problem, scaling = (_rotary(graph, model, family) if model.position_table_rows is None
                                           else (0.0, False, "", None))
    eps, eps_read, eps_problem = _epsilon(graph, family)
    refusals += [p for p in (problem, eps_problem, _norm_count(graph, model, family), _window(graph, model)) if p]
    routing = None
    if moe is not None and family.name == "deepseek_v3":
        routing, why = deepseek_routing(graph, model, moe)
        refusals += why
    elif moe is not None:
        layout = moe_layout(graph, model)
        refusals += moe_refusals(model, family, moe, router=layout.router if layout is not None else None)
    if refusals:
        raise UnsupportedExport(
            f"torchtitan's {family.name} family would train a different model: " + "; ".join(refusals)
            + ELSEWHERE
        )
    windows = _windows(graph)
    return TorchtitanArch(family=family, model=model, theta=theta, theta_read=theta_read, eps=eps, eps_read=eps_read,
                          moe=moe, window=windows[0] if windows else None, routing=routing, scaling=scaling)


def moe_refusals(model: TransformerModel, family: FamilySpec, moe: MoeSummary, *,
                 router: RouterReading | None = None) -> list[str]:
    """What a routed model computes that torchtitan's MoE layers as the export writes them do not, one
    clause each: qwen3's ``_build_qwen3_moe_layers`` (every layer routed; a softmax router over all
    experts, top-k, renormalised or not as the file reads; routed experts of one FFN size, their
    outputs scaled by the scores; no shared expert; with ``router``, the layers' common reading: no expert
    groups, no score bias, no factor on the weights). llama3 has no MoE layer; deepseek_v3's are
    :func:`exporters.torchtitan.moe.deepseek_routing`'s."""
    if family.name != "qwen3":
        return [f"it routes tokens to experts and torchtitan's {family.name} has no MoE layer"]
    out = []
    if moe.layers != model.num_layers:  # Qwen3-MoE's mlp_only_layers / decoder_sparse_step
        out.append(f"{moe.layers} of its {model.num_layers} layers route tokens to experts and the family's MoE "
                   "stack routes in every layer")
    if moe.score_function == "sparsemixer":
        out.append(f"its router is {SPARSEMIXER_ROUTER}, and the export writes qwen3's softmax top-k router")
    elif moe.score_function != "softmax":  # TokenChoiceTopKRouter: softmax or sigmoid; a sigmoid's rules are not read
        out.append(f"its router scores with a {moe.score_function}, and the export writes qwen3's softmax router")
    if model.shared_experts:
        out.append("it has shared experts beside the routed ones, which qwen3's MoE layers do not")
    if router is not None and (router.groups > 1 or router.expert_bias or router.scaling != 1.0):
        out.append("its router limits the choice to expert groups, adds a score bias or scales the weights, and the "
                   "export writes qwen3's plain top-k router")
    return out
