r"""Megatron-Core's model families: which Megatron-LM script trains a graph, with which of its flags,
or the one-line reason none does (issue 25: "exact or refused: no dropped features").

The family is read from what the graph proves (:class:`importers.transformer.LayerFeatures`):

* **GPT** (``pretrain_gpt.py``, ``megatron.core.models.gpt.GPTModel``): a pre-LN stack with causal
  attention and an LM head. A proven-bidirectional model (no mask, or a per-key padding mask only)
  or a post-LN one is refused: ``pretrain_gpt.py`` would train a causal, pre-LN model instead. An
  attention whose mask the importer could not prove either way (a graph-only file whose mask is
  a constant) stays a GPT, as before issue 25. Multi-latent attention (DeepSeek-V2/V3) is a GPT with
  ``--multi-latent-attention`` and its sizes (:mod:`exporters.megatron.mla`).
* **BERT** (``pretrain_bert.py``, ``megatron.core.models.bert.bert_model.BertModel``, core_v0.16.1):
  a bidirectional encoder whose layers are pre-LN (``TransformerLayer`` adds the residual to the
  *un-normalised* input; ``TransformerConfig.apply_residual_connection_post_layernorm`` exists but
  no megatron-core 0.16.1 module reads it, only Megatron-LM's legacy models), with no embedding
  norm (``LanguageModelEmbedding`` sums word, position and token-type embeddings), a final norm
  (``TransformerBlock``'s ``final_layernorm``), and ``BertLMHead``: a hidden x hidden linear, GELU
  (``torch.nn.functional.gelu``, erf, set in its constructor with no flag or config field to change it:
  ``models/bert/bert_lm_head.py:42``) and a norm before the vocabulary projection, which always has
  a bias (``ColumnParallelLinear(..., bias=True)``). A head transform with another activation is refused,
  named as such, but GELU's tanh approximation (Hugging Face's ``hidden_act="gelu_new"`` or
  ``"gelu_pytorch_tanh"``, which set the MLPs' and the head's): trained as erf with a note, as the MLPs'
  is (:func:`family_notes`). So its norms number ``2 L + 2``. With the binary
  head (Megatron-LM's default, ``--bert-no-binary-head`` turns it off) it adds ``Pooler`` (a hidden x
  hidden linear and ``tanh`` on the first token), a hidden x 2 linear, and a 2-row token-type
  embedding (``num_tokentypes = 2 if args.bert_binary_head else 0`` in ``pretrain_bert.py``).
  Hugging Face's BERT and RoBERTa are post-LN with an embedding norm, so they are refused. So is an
  RMSNorm stack: ``BertLMHead``'s norm is Apex's ``FusedLayerNorm`` wherever Apex is installed
  (``models/bert/bert_lm_head.py:10-11``; ``bert_layer_local_spec``'s norms too, ``bert_layer_specs.py:33-39``),
  which asserts ``config.normalization == "LayerNorm"`` (``fusions/fused_layer_norm.py:66-68``), so
  ``--normalization RMSNorm`` fails when the model is built (without Apex the head is ``WrappedTorchNorm``,
  which builds ``torch.nn.RMSNorm``; NVIDIA's PyTorch containers, Megatron-LM's documented setup, ship Apex).
  Every BERT export says so in its notes (:func:`family_notes`): without Apex that norm is ``WrappedTorchNorm``,
  which asserts ``persist_layer_norm`` (on in Megatron-LM unless ``--no-persist-layer-norm``), sequence
  parallelism and ``--apply-layernorm-1p`` off (``transformer/torch_norm.py:26-32``), so an export with
  ``--sequence-parallel`` or ``--apply-layernorm-1p`` runs only with Apex.

* **Mamba** (``pretrain_mamba.py``, ``megatron.core.models.mamba.MambaModel``): Mamba-2 and hybrid
  Mamba-2 / attention / MLP stacks, in :mod:`exporters.megatron.mamba` (a graph with a Mamba mixer
  never reaches the GPT or BERT checks).

* **T5** (``pretrain_t5.py``, ``megatron.core.models.T5.T5Model``): an encoder-decoder (an attention whose
  keys come from another stream than its queries) shaped as megatron-core's T5, in
  :mod:`exporters.megatron.t5`; Hugging Face's T5, BART and Whisper are refused there, each feature named.

Disentangled attention (DeBERTa: the query and the key times projected relative-position embeddings added to
the scores, :mod:`importers.attention_terms`) is refused in one line, before the family is chosen: no
megatron-core 0.16.1 model class computes such terms (``DotProductAttention`` asserts ``attention_bias is None``;
T5's ``RelativePositionEmbedding`` is a learned bias per bucket, read from no query or key).

What no megatron-core 0.16.1 model class builds is refused in one line before the GPT or BERT checks, so
it is the refusal's first reason (issue 25: ALBERT was refused for its MLM head, MPNet as "not a uniform stack"):
layers that share their weights (ALBERT's cross-layer sharing; ``TransformerBlock`` builds each layer with its
own, :func:`_shared_layers`), token embeddings narrower or wider than the layers (ALBERT's and ELECTRA's
factorised embedding; ``LanguageModelEmbedding`` is ``hidden_size`` wide, :func:`_factorised_embedding`), and a
learned relative-position bias (MPNet's buckets; only the encoder-decoder ``T5Model`` has one,
:func:`_relative_bias`). The layers' own differences from the family their mask picks follow
(:func:`family_refusals`: ALBERT's and ELECTRA's post-LN). A T5 is told the first two among its own clauses; a
model without an LM head is told that first.

Vision (ViT) models are not exported: refused in one line (megatron-core's ViT is built only inside
its multimodal models). Vision-language models (LLaVA) are refused first, naming the tower, the projector and the
decoder and what ``pretrain_vlm.py`` would build instead (:mod:`exporters.megatron.vlm`).

Zero-centred norms, ``norm(x) * (1 + w)`` (NeMo's LayerNorm1P, Gemma's RMSNorm:
:attr:`~importers.layer_features.LayerFeatures.zero_centred_norms`), are ``--apply-layernorm-1p``
(``TransformerConfig.layernorm_zero_centered_gamma``) in every family (:func:`norm_args`). Megatron-LM
builds with ``--transformer-impl transformer_engine`` unless told (``TransformerConfig.transformer_impl``'s
default, megatron-core 0.16.1 ``transformer/transformer_config.py:880``; the export never changes it), whose
norms all honour the flag: ``TENorm`` passes ``zero_centered_gamma`` to TE's ``LayerNorm`` and ``RMSNorm``
(``extensions/transformer_engine.py:450, 461``), ``TELayerNormColumnParallelLinear`` (the input norm fused
into QKV / FC1) to its norm (``:843``), and the QK-norms and GPT's final norm are ``TENorm`` too
(``extensions/transformer_engine_spec_provider.py:48-55``, ``transformer/transformer_block.py:61``); BERT's ``BertLMHead`` norm is Apex's
``FusedLayerNorm`` (``models/bert/bert_lm_head.py:11``), which applies ``weight + 1`` and starts the weight at
0 (``fusions/fused_layer_norm.py:65, 124-133``). The local implementation's RMSNorm, ``WrappedTorchNorm``,
asserts the flag off (``transformer/torch_norm.py:26-28``): a rule of
:func:`exporters.megatron.validate.megatron_violations`. A stack whose norms are not all zero-centred, or one
scaling by ``w + c`` with ``c`` not 1, is refused (:func:`family_refusals`): the flag centres every norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from exporters.megatron.mla import (
    UNSEEN_SCALING_NOTE, YARN_REFUSAL, latent_norms, mla_refusals, model_mla, rotary_channels,
)
from exporters._common import qk_norm_after_rotary, stream_scale_sites
from exporters.elsewhere import ELSEWHERE
from exporters._moe_layout import explained_irregular, layer_norm_epsilons, moe_layout, router_norm_ops
from exporters.megatron.quick_geglu import quick_geglu_args, quick_geglu_refusal
from exporters.megatron.sinks import megatron_sink_args, sink_refusal
from exporters.megatron.t5 import T5_SCRIPT, check_t5, relative_bias_tables, t5_stack
from exporters.megatron.vlm import vlm_refusal
from exporters.megatron.window import window_refusal
from importers.rotary import (LLAMA3_DEFAULTS, RotaryFrequencies, YarnScaling, rotary_frequencies, rotary_pairs,
                              rotated_layers)
from importers.transformer import TransformerModel, _mlp_activation_of, embedding_rows, is_parameter, shortfall, too_short
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph

__all__ = ["MegatronFamily", "FamilyExport", "megatron_family", "family_refusals", "family_notes", "model_args", "norm_args"]

MegatronFamily = Literal["gpt", "bert", "mamba", "t5"]

_SCRIPTS: dict[MegatronFamily, str] = {"gpt": "pretrain_gpt.py", "bert": "pretrain_bert.py", "mamba": "pretrain_mamba.py"}
"""Megatron-LM's training script per family (its repository root, core_v0.16.1)."""

@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyExport:
    """The Megatron-LM model family of a graph and the flags only that family takes."""

    family: MegatronFamily
    script: str
    """The training script torchrun launches."""
    args: tuple[str, ...] = ()
    """The family's own flags (``--bert-no-binary-head``), beside :func:`megatron_args`' common ones."""
    binary_head: bool = False
    """BERT: the pooler and the 2-way sentence-order head are part of the model."""
    head_activation: str | None = None
    """BERT: the LM head transform's activation as read (:attr:`LayerFeatures.mlp_activation`'s names)."""


def megatron_family(graph: OpGraph, model: TransformerModel) -> FamilyExport:
    """The family that trains ``model`` exactly (module docstring).

    Raises
    ------
    UnsupportedExport
        One line: why no Megatron-LM script trains this model as it is.
    """
    if any(a.position_scores for a in model.attention):  # importers.attention_terms
        # megatron-core 0.16.1: DotProductAttention asserts attention_bias is None (transformer/dot_product_attention.py:157),
        # and T5's RelativePositionEmbedding (models/common/embeddings/relative_pos_embedding.py) is a learned
        # per-head bias looked up by bucket, computed from no query or key
        raise UnsupportedExport(
            "Megatron-LM would train a different model: its attention adds relative-position terms computed from its "
            "queries or keys to the scores (Q or K times projected relative-position embeddings, shifted or gathered "
            "per key: DeBERTa's disentangled attention, Transformer-XL's relative attention as XLNet and Funnel write "
            "it) and no Megatron-Core model class (GPT, BERT, T5) has such terms" + ELSEWHERE
        )
    stack = t5_stack(graph, model)
    vlm = vlm_refusal(graph, model) if stack is None else None  # (an encoder-decoder's cross-attention: not LLaVA)
    if vlm:  # LLaVA: pretrain_vlm.py's tower and projector are the decoder's config
        raise UnsupportedExport("Megatron-LM would train a different model: " + vlm + ELSEWHERE)
    unbuilt = _shared_layers(graph, model) + _factorised_embedding(graph, model)
    if stack is not None:  # an encoder-decoder: pretrain_t5.py's family (exporters.megatron.t5)
        args = check_t5(graph, model, stack, unbuilt + family_refusals(model, "t5", graph))
        return FamilyExport(family="t5", script=T5_SCRIPT, args=args + model_args(graph, model))
    unbuilt += _relative_bias(graph, model)  # T5's own buckets are named by exporters.megatron.t5
    if unbuilt and model.lm_head is not None:  # without an LM head, that is the first reason (vision encoders)
        # then the layers' own differences from the family their mask picks (ALBERT's and ELECTRA's post-LN)
        unbuilt += family_refusals(model, "bert" if model.features.attention_mask == "bidirectional" else "gpt", graph)
        raise UnsupportedExport("Megatron-LM would train a different model: " + "; ".join(unbuilt) + ELSEWHERE)
    if model.features.attention_mask == "bidirectional":
        return _bert(graph, model)
    irregular = explained_irregular(model, moe_layout(graph, model))  # dense layers beside MoE ones: --moe-layer-freq
    if irregular:
        raise UnsupportedExport(
            "Megatron-LM trains a uniform stack of GPT layers; this model is not one: " + "; ".join(irregular)
        )
    if model.lm_head is None:
        raise UnsupportedExport(
            "Megatron-LM's GPT model ends in an LM head (a linear layer to the vocabulary) and this model has "
            "none" + ELSEWHERE
        )
    refusals = family_refusals(model, "gpt", graph) + _gpt_norms(graph, model) + _rotary_refusal(graph, model)
    refusals += mla_refusals(model) + [p for p in (window_refusal(graph, model),) if p]
    if refusals:
        raise UnsupportedExport("Megatron-LM would train a different model: " + "; ".join(refusals) + ELSEWHERE)
    return FamilyExport(family="gpt", script=_SCRIPTS["gpt"], args=model_args(graph, model))


def family_notes(
    family: FamilyExport, args: list[str] | tuple[str, ...], *, mlp_activation: str | None = None
) -> list[str]:
    """What the launch environment needs for ``family`` with these ``args`` (Megatron-LM flags), and how
    its plain MLP's activation (``mlp_activation``, :attr:`LayerFeatures.mlp_activation`) differs, as plan notes.

    GELU's tanh approximation (GPT-2's ``gelu_new``) is trained as ``F.gelu``, erf: Megatron-LM's
    ``core_transformer_config_from_args`` (core_v0.16.1) sets ``activation_func`` for ``--swiglu``,
    ``--squared-relu`` and ``--quick-geglu`` only, ``--openai-gelu`` reaches only its legacy models, and
    ``TransformerConfig.activation_func`` defaults to ``F.gelu`` (``transformer/transformer_config.py:173``).
    The two differ by at most 4.7e-4 (at x = -2.70), so the export names the difference instead of refusing.

    BERT's ``BertLMHead`` builds its norm as Apex's ``FusedLayerNorm`` where Apex imports and as
    ``WrappedTorchNorm`` elsewhere (megatron-core 0.16.1 ``models/bert/bert_lm_head.py:10-16``), and
    ``WrappedTorchNorm`` asserts ``layernorm_zero_centered_gamma`` (``--apply-layernorm-1p``),
    ``persist_layer_norm`` and ``sequence_parallel`` (``--sequence-parallel``) off
    (``transformer/torch_norm.py:26-32``). Megatron-LM sets ``persist_layer_norm = not
    args.no_persist_layer_norm`` (``megatron/training/arguments.py``, ``core_transformer_config_from_args``,
    core_v0.16.1), so without Apex even a plain BERT needs ``--no-persist-layer-norm``, and one with
    either flag cannot be built. The exporter assumes Apex, as its RMSNorm refusal does (module
    docstring), and says so; the other families build no such norm (``[]``).

    >>> bert = FamilyExport(family="bert", script="pretrain_bert.py")
    >>> family_notes(bert, ["--sequence-parallel"])[0][:71]
    "needs Apex: Megatron's BERT builds its LM head's norm as Apex's FusedLa"
    >>> family_notes(FamilyExport(family="gpt", script="pretrain_gpt.py"), ["--sequence-parallel"])
    []
    """
    notes = []
    if mlp_activation == "gelu-tanh":
        notes.append("the model's MLP uses GELU's tanh approximation (GPT-2's gelu_new) and Megatron-LM's core models "
                     "compute erf GELU (F.gelu; --openai-gelu reaches only its legacy models): the two differ by at "
                     "most 4.7e-4, at x = -2.70")
    if family.head_activation == "gelu-tanh":  # BertLMHead.__init__: self.gelu = torch.nn.functional.gelu
        notes.append("the model's LM head transform uses GELU's tanh approximation and Megatron's BertLMHead applies "
                     "erf GELU, set in its constructor with no flag to change it (megatron-core 0.16.1 "
                     "models/bert/bert_lm_head.py:42): the two differ by at most 4.7e-4, at x = -2.70")
    if family.family != "bert":
        return notes
    flags = [f for f in ("--sequence-parallel", "--apply-layernorm-1p") if f in args]
    head = ("needs Apex: Megatron's BERT builds its LM head's norm as Apex's FusedLayerNorm (NVIDIA's PyTorch "
            "containers ship Apex); without Apex it is megatron-core's WrappedTorchNorm, which asserts ")
    if flags:
        return notes + [head + f"{' and '.join(flags)} off (megatron-core 0.16.1 transformer/torch_norm.py:26-32), "
                        "so this launch fails when BertLMHead is built"]
    return notes + [head + "persist_layer_norm off, which Megatron-LM turns on: without Apex add "
                    "--no-persist-layer-norm (megatron-core 0.16.1 transformer/torch_norm.py:30)"]


MEGATRON_NORM_EPSILON = 1e-5
"""Megatron-LM's ``--norm-epsilon`` default (``TransformerConfig.layernorm_epsilon``, megatron-core 0.16.1
``transformer/transformer_config.py:150``)."""


def norm_epsilon_args(graph: OpGraph) -> tuple[list[str], str]:
    """``(--norm-epsilon E, the note)``: the epsilon the file's norms add (:func:`~exporters._moe_layout.layer_norm_epsilons`),
    said when it is not Megatron-LM's default (Qwen's and Llama's 1e-6 against 1e-5); ``[]`` with a note
    when the file does not hold it.

    Raises
    ------
    UnsupportedExport
        Norms with different epsilons: ``--norm-epsilon`` sets one for every norm.
    """
    found = layer_norm_epsilons(graph)
    if found is None:
        return [], (f"the norms' epsilon is not in the file: Megatron-LM's --norm-epsilon {MEGATRON_NORM_EPSILON:g} "
                    "applies; set your model's")
    if len(found) > 1:
        raise UnsupportedExport(f"its norms' epsilons differ ({', '.join(f'{e:g}' for e in found)}) and Megatron-LM's "
                                "--norm-epsilon sets one for every norm" + ELSEWHERE)
    if np.float32(found[0]) == np.float32(MEGATRON_NORM_EPSILON):  # the file's float32, the default's double
        return [], ""
    return ["--norm-epsilon", f"{found[0]:g}"], f"norm epsilon {found[0]:g}, read from the graph"


def model_args(graph: OpGraph, model: TransformerModel) -> tuple[str, ...]:
    """The layer flags every family takes from the graph: :func:`norm_args`, the quick-GEGLU MLP's
    (:func:`exporters.megatron.quick_geglu.quick_geglu_args`) and the attention sinks'
    (:func:`exporters.megatron.sinks.megatron_sink_args`)."""
    return norm_args(model) + tuple(quick_geglu_args(graph, model) + megatron_sink_args(graph))


def norm_args(model: TransformerModel) -> tuple[str, ...]:
    """``--apply-layernorm-1p`` when every norm of ``model`` scales by ``1 + w`` (module docstring), else ``()``."""
    return ("--apply-layernorm-1p",) if model.features.zero_centred_norms == "all" else ()


GEGLU = " (GeGLU, as Gemma's)"
_ACTIVATION_NAMES = {
    "gelu-tanh": "GELU, tanh approximation", "gelu-erf": "GELU", "gelu": "GELU", "relu": "ReLU", "squared-relu": "squared ReLU",
    "scaled-sigmoid": "x * sigmoid(a x), quick-GELU", "silu": "SiLU",
    "other": "an activation that is none of GELU, ReLU, squared ReLU and SiLU (e.g. Apertus' xIELU)",
}


def family_refusals(model: TransformerModel, family: MegatronFamily = "gpt", graph: OpGraph | None = None) -> list[str]:
    """What the layers compute that Megatron-LM's ``family`` model (core_v0.16.1 flags) cannot, one
    clause each; empty when its flags reproduce the model. ``graph`` tells a learned LayerScale from a
    constant factor on the residual stream (:func:`exporters._common.stream_scale_sites`).

    Both families' gated MLP is SwiGLU (``--swiglu``: SiLU) or quick-GEGLU (``--quick-geglu``:
    ``x sigmoid(1.702 x)`` with its clamp and offset read from the file, :mod:`exporters.megatron.quick_geglu`), their plain MLP GELU
    (the default) or squared ReLU; ``TransformerConfig`` has no soft-capping field and the layer specs
    no norm after attention or the MLP, and neither model has ALiBi. GPT is causal and pre-LN; BERT is pre-LN.
    """
    features, out = model.features, []
    activation = features.mlp_activation
    if model.gated_mlp and activation == "scaled-sigmoid":  # --quick-geglu and its constants (exporters.megatron.quick_geglu)
        out += quick_geglu_refusal(graph, model)
    elif model.gated_mlp and activation not in (None, "silu"):
        out.append(
            f"its gated MLP gates with {_ACTIVATION_NAMES[activation]}{GEGLU if activation.startswith('gelu') else ''} "
            "and Megatron-LM's gated MLPs "
            "are SwiGLU (--swiglu, SiLU) and quick-GEGLU (--quick-geglu); --swiglu would train a SiLU gate"
        )
    elif not model.gated_mlp and activation not in (None, "gelu-tanh", "gelu-erf", "gelu", "squared-relu"):  # --squared-relu
        out.append(f"its MLP uses {_ACTIVATION_NAMES[activation]} and Megatron-LM's plain MLP is GELU (or --squared-relu)")
    name = {"gpt": "GPT", "t5": "T5"}.get(family, "BERT")
    table = too_short(model.position_tables)  # absolute tables only: T5's relative buckets and token types are not
    if table is not None:
        out.append(shortfall(table, f", and Megatron-LM's {name} model would learn a {table.tokens}-row table "
                                    "(--max-position-embeddings)"))
    if features.attention_softcap:
        out.append(f"it soft-caps the attention scores (cap * tanh(s / cap), Gemma-2) and Megatron-LM's {name} model "
                   "has no attention soft-capping")
    if features.logit_softcap:
        out.append(f"it soft-caps the final logits (tanh, Gemma-2) and Megatron-LM's {name} model has no final-logit "
                   "soft-capping")
    if features.reordered_norm:  # megatron-core 0.16.1's TransformerLayer: input_layernorm and pre_mlp_layernorm only
        out.append(f"it normalises the outputs of attention and the MLP and not their inputs (x + norm(f(x)), OLMo-2's "
                   f"reordered norm) and Megatron-LM's {name} layer normalises the inputs (pre-LN)")
    elif features.post_attention_norm or features.post_mlp_norm:
        where = " and ".join(w for w, on in (("attention", features.post_attention_norm),
                                             ("the MLP", features.post_mlp_norm)) if on)
        out.append(f"it normalises the output of {where} before the residual add (sandwich norms, Gemma-2 and -3) "
                   f"and Megatron-LM's {name} layer has no such norm")
    scale = features.attention_scale  # DotProductAttention: 1 / sqrt(kv_channels) unless TransformerConfig.softmax_scale
    if scale is not None and not math.isclose(scale, model.head_dim ** -0.5, rel_tol=1e-3):
        # megatron-core 0.16.1 transformer/multi_latent_attention.py:125: MLA's softmax_scale is
        # mscale ** 2 / sqrt(q_head_dim), mscale 1 at the default --mscale-all-dim 0
        out.append(f"it scales the attention scores by 1/sqrt({scale ** -2:.6g}), not 1/sqrt({model.head_dim}) of its head "
                   "size (known causes: Gemma's query_pre_attn_scalar, T5's unscaled scores, DeBERTa's 1/sqrt(3 d), a "
                   f"YaRN mscale), and Megatron-LM's {name} model as exported scales by 1/sqrt(head size) (kv_channels; "
                   "MLA's query head size)")
    constant, learned = stream_scale_sites(model, graph)
    if constant:  # TransformerConfig has no such factors (Megatron-LM's GPT: embedding, x + f(x), logits)
        out.append(f"it scales {' and '.join(f'the {w}' for w in constant)} by a factor (Granite's "
                   f"multipliers, Gemma's embedding normaliser) and Megatron-LM's {name} model scales none of them")
    if learned:  # TransformerLayer: x + dropout(attention(norm(x))), no parameter between the sub-layer and the add
        out.append(f"it multiplies each {' and each '.join(learned)} output by a learned per-channel vector before the "
                   f"residual add (LayerScale, as BEiT's lambda_1 and lambda_2) and Megatron-LM's {name} layers have no "
                   "such parameter")
    if features.qk_norm == "whole-projection":  # SelfAttention builds q_layernorm over hidden_size_per_attention_head
        out.append("it normalises its queries and keys over the whole projection (OLMo-2's q_norm / k_norm over "
                   "heads x head_dim channels) and Megatron-LM's --qk-layernorm normalises each head")
    if features.qk_norm == "per-head-weights":  # q_layernorm: one norm of hidden_size_per_attention_head for all heads
        out.append("it normalises each query and key head with its own norm weights (StableLM's StableLmLayerNormPerHead) "
                   "and Megatron-LM's --qk-layernorm shares one weight of head_dim over the heads")
    if features.alibi:
        # megatron-core 0.16.1: GPTModel's position_embedding_type is learned_absolute, rope, mrope, yarn or
        # none, and no module of megatron.core reads an ALiBi bias (tests/integration/test_megatron_families.py)
        out.append(f"it adds ALiBi position biases to the attention scores (per-head slopes x key positions: BLOOM, MPT) "
                   f"and Megatron-LM's {name} model has none (--position-embedding-type is learned_absolute, rope, "
                   "mrope, yarn or none)")
    if features.parallel_residual:
        # megatron-core 0.16.1's TransformerLayer runs attention, then the MLP on its output; no module of
        # it reads a parallel-attention setting
        out.append(f"its attention and MLP read the same input in parallel (x + attn(norm(x)) + mlp(norm(x)), as "
                   f"GPT-J, GPT-NeoX, Falcon and Phi) and Megatron-LM's {name} layer runs them in sequence")
    if family == "gpt" and features.attention_mask == "bidirectional":
        out.append("its attention is bidirectional (every token sees the whole sequence: no causal mask) and "
                   "Megatron-LM's GPT model is causal")
    if features.zero_centred_norms == "mixed":  # --apply-layernorm-1p: one TransformerConfig field for every norm
        out.append("some of its norms scale by (1 + weight) (zero-centred, as LayerNorm1P and Gemma's RMSNorm) and "
                   f"others by the weight, and Megatron-LM's {name} model centres all or none (--apply-layernorm-1p)")
    elif features.zero_centred_norms == "other":
        out.append("a norm scales by (weight + c) with c not 1 or not in the file (a graph-only export stripped it), "
                   f"and Megatron-LM's {name} model adds exactly 1 (--apply-layernorm-1p); export it with its small "
                   "constants inline")
    if features.post_layernorm:
        out.append(f"it normalises after each residual add (post-LN, as BERT, RoBERTa and BART) and Megatron-Core's "
                   f"{name} layer normalises before it (pre-LN: megatron-core 0.16.1 reads "
                   "apply_residual_connection_post_layernorm nowhere)")
    return out + sink_refusal(graph, model.num_attention_heads, model.num_layers) + qk_norm_order_refusal(graph, model)


def qk_norm_order_refusal(graph: OpGraph | None, model: TransformerModel) -> list[str]:
    """The clause for a QK-norm that follows the rotary embedding (:func:`importers.rotary.qk_norm_places`,
    HunYuan-V1: rotate, then normalise): megatron-core 0.16.1 applies ``q_layernorm`` / ``k_layernorm`` in
    ``Attention.get_query_key_value_tensors`` (``transformer/attention.py:1478-1481``) before ``forward`` rotates
    them (line 1097), and a per-head RMSNorm does not commute with the rotation, so ``--qk-layernorm`` would train
    another model. ``[]`` without a graph, without a QK-norm, for multi-latent attention, or with the norm first."""
    if graph is None or model.features.qk_norm == "none" or model_mla(model) is not None:
        return []
    return qk_norm_after_rotary(graph, model.attention, "Megatron-LM's --qk-layernorm")

def megatron_rotary_args(graph: OpGraph, model: TransformerModel) -> tuple[list[str], str]:
    """``(--rotary-base / --rotary-percent / --use-rope-scaling / --no-rope-freq, the note)`` of a model without a
    learned position table, read from its file's rotary frequencies (:func:`importers.rotary.rotary_frequencies`)
    and which layers rotate (:func:`_no_rope_args`): Megatron-LM builds ``RotaryEmbedding(kv_channels,
    rotary_percent, rotary_base=..., rope_scaling=..., rope_scaling_factor=...)`` (defaults 1.0, 10000, off, 8),
    so a base, a partial rotation or a scaling the flags do not say trains another model. ``([], "")`` with a
    learned table.

    Raises
    ------
    UnsupportedExport
        Frequencies or a per-layer pattern the flags cannot say (:func:`_rotary_of`).
    """
    if model.position_table_rows is not None:
        return [], ""
    found, problem = _rotary_of(graph, model)
    if problem:
        raise UnsupportedExport(problem + ELSEWHERE)
    no_rope, layers_note = _no_rope_args(graph, model)
    if _pair_layouts(graph, model) == {"interleaved"}:
        no_rope = ["--rotary-interleaved", *no_rope]
        layers_note += _INTERLEAVED_NOTE
    if found is None or (found.base is None and found.llama3 is None):
        return no_rope, ("the graph has no learned position table; rotary embeddings (--position-embedding-type rope) "
                         "assumed, and their base is not in the file (its frequencies were stripped): Megatron-LM's "
                         "--rotary-base 10000 applies; set your model's" + (UNSEEN_SCALING_NOTE if model_mla(model) else "")
                         + layers_note)
    base = found.base if found.llama3 is None else found.llama3.base
    rotated, channels = 2 * found.pairs, rotary_channels(model)  # MLA: the rope part of each head
    args = ["--rotary-base", str(int(base))]
    if rotated < channels:
        args += ["--rotary-percent", f"{rotated / channels:g}"]
    scaled = ""
    if found.llama3 is not None:  # RotaryEmbedding._apply_scaling(inv_freq, factor=rope_scaling_factor)
        args += ["--use-rope-scaling", "--rope-scaling-factor", f"{found.llama3.factor:g}"]
        scaled = (f", scaled as Llama 3.1's (factor {found.llama3.factor:g}, low/high frequency factors 1 and 4, "
                  "original 8192 tokens: --use-rope-scaling)")
    return args + no_rope, (f"rotary embeddings (--position-embedding-type rope) with base {int(base)} over {rotated} "
                            f"of {channels} channels per head{scaled}, read from the graph's frequencies" + layers_note)


def _no_rope_args(graph: OpGraph, model: TransformerModel) -> tuple[list[str], str]:
    """``(--no-rope-freq, a note clause)`` when some attention layers rotate their queries and keys and others
    neither (:func:`importers.rotary.rotated_layers`; SmolLM3's NoPE layers). megatron-core 0.16.1's
    ``TransformerConfig.no_rope_freq`` is an integer N (RoPE skipped on every N-th layer, 1-indexed: the list
    ``([0] * (N - 1) + [1]) * (L / N)``, L a multiple of N) or one 0/1 per layer, 1 skipping RoPE
    (``transformer_config.py:1963-1978``, read by ``Attention.forward`` at ``self.layer_number - 1``); Megatron-LM's
    ``no_rope_freq_type`` takes the integer or a list expression of digits, commas, brackets, ``+`` and ``*``."""
    turned = _layer_rotations(graph, model)
    if "both" not in turned or "none" not in turned or len(turned) != model.num_layers:
        return [], ""
    skip = [int(t == "none") for t in turned]
    period = next((n for n in range(2, len(skip) + 1)
                   if len(skip) % n == 0 and skip == ([0] * (n - 1) + [1]) * (len(skip) // n)), None)
    flag = str(period) if period is not None else "[" + ",".join(map(str, skip)) + "]"
    layers = [str(i) for i, s in enumerate(skip) if s]
    which = f"layer {layers[0]} (counting from 0) has" if len(layers) == 1 else f"layers {', '.join(layers)} (counting from 0) have"
    return ["--no-rope-freq", flag], f"; {which} no RoPE, as the graph shows (--no-rope-freq {flag})"


_INTERLEAVED_NOTE = ("; it rotates channel pairs (2i, 2i + 1), as the graph shows (--rotary-interleaved; with "
                    "the default RoPE fusion megatron-core 0.16.1 asks for Transformer Engine 2.3 or newer)")
"""The note clause of an interleaved rotation: ``TransformerConfig.__post_init__`` raises for ``rotary_interleaved``
with ``apply_rope_fusion`` (Megatron-LM's default) under Transformer Engine older than 2.3.0
(``transformer/transformer_config.py:1537-1542``, megatron-core 0.16.1)."""


def _pair_layouts(graph: OpGraph, model: TransformerModel) -> set[str]:
    """The channel pairings the rotations read (:func:`importers.rotary.rotary_pairs`: ``halves``, ``interleaved``,
    ``mixed``), unread layers left out; ``set()`` for multi-latent attention (:func:`_layer_rotations`)."""
    if model_mla(model) is not None:
        return set()
    return set(rotary_pairs(graph, model.attention)) - {"unknown"}


def _pairs_refusal(graph: OpGraph, model: TransformerModel) -> str:
    """Why Megatron-LM's one ``--rotary-interleaved`` (``TransformerConfig.rotary_interleaved``, every layer's
    ``_rotate_half`` and the ``RotaryEmbedding``'s frequency layout in megatron-core 0.16.1 ``rope_utils.py:73-90``,
    ``rotary_pos_embedding.py``) cannot say the file's pairings, or ``""``."""
    layouts = _pair_layouts(graph, model)
    if len(layouts) <= 1 and "mixed" not in layouts:
        return ""
    return ("its attention layers rotate different channel pairs (some (i, i + d/2), some (2i, 2i + 1), or its "
            "queries and keys differ), and Megatron-LM's --rotary-interleaved applies one pairing to every layer")


def _layer_rotations(graph: OpGraph, model: TransformerModel) -> tuple[str, ...]:
    """:func:`importers.rotary.rotated_layers` of ``model``; ``()`` for multi-latent attention, whose rotary part
    is its own slice of channels (:mod:`exporters.megatron.mla`), not read per layer."""
    return () if model_mla(model) is not None else rotated_layers(graph, model.attention)


def _rotary_of(graph: OpGraph, model: TransformerModel) -> tuple[RotaryFrequencies | None, str]:
    """``(the file's rotary frequencies or None, why Megatron-LM's flags cannot say them or "")``:
    frequencies that are neither a geometric series nor Llama 3.1's scaling of one with the factors
    ``RotaryEmbedding._apply_scaling`` fixes (low and high frequency factors 1 and 4, original length 8192;
    ``--rope-scaling-factor`` sets only the factor), more rotated channels than a head has, a base that is not
    an integer (``--rotary-base`` is one), or a layer that rotates its queries and not its keys (or the reverse)."""
    turned = _layer_rotations(graph, model)
    if "query" in turned or "key" in turned:
        return None, ("its attention rotates the queries and not the keys (or the keys and not the queries) in layers "
                      + ", ".join(str(i) for i, t in enumerate(turned) if t in ("query", "key"))
                      + " and Megatron-LM's RoPE rotates both or neither (--no-rope-freq)")
    if pairs := _pairs_refusal(graph, model):
        return None, pairs
    path = graph.source_path
    found = rotary_frequencies(path, getattr(graph, "source_sha256", "")) if path and Path(path).is_file() else None
    if found is None:
        return None, ""
    if (not found.geometric or found.base is None) and model_mla(model) is not None:
        return found, YARN_REFUSAL
    scaling = found.llama3
    if found.yarn is not None:
        return found, _yarn_clause(found.yarn)
    if not found.geometric and scaling is None:
        return found, ("its rotary frequencies are not a geometric series nor Llama 3.1's scaling of one (a YaRN or "
                       "LongRoPE scaling); Megatron-LM's --use-rope-scaling applies Llama 3.1's")
    if scaling is not None and (scaling.low_freq_factor, scaling.high_freq_factor,
                                scaling.original_max_position_embeddings) != LLAMA3_DEFAULTS:
        return found, (f"its rotary frequencies are not a geometric series but Llama 3.1's scaling of one (base "
                       f"{scaling.base:g}, factor {scaling.factor:g}) with wavelength bounds "
                       f"{scaling.original_max_position_embeddings / scaling.low_freq_factor:g} and "
                       f"{scaling.original_max_position_embeddings / scaling.high_freq_factor:g} tokens, and "
                       "Megatron-LM's --use-rope-scaling fixes 8192 and 2048 (low/high frequency factors 1 and 4, "
                       "original 8192; --rope-scaling-factor sets only the factor)")
    base = found.base if scaling is None else scaling.base
    rotated, channels = 2 * found.pairs, rotary_channels(model)
    if rotated > channels or base != round(base):
        return found, (f"its rotary embedding turns {rotated} channels of {channels}-channel heads with base "
                       f"{base:g}; Megatron-LM's --rotary-percent / --rotary-base (an integer) cannot say it")
    return found, ""


def _yarn_clause(yarn: YarnScaling) -> str:
    """The refusal of YaRN-scaled rotary frequencies (:class:`importers.rotary.YarnScaling`) in a model without
    multi-latent attention. megatron-core 0.16.1's ``GPTModel`` builds ``YarnRotaryEmbedding`` for
    ``position_embedding_type="yarn"`` from ``yarn_*`` attributes of its config (``models/gpt/gpt_model.py:172-190``)
    that no ``TransformerConfig`` field holds, and Megatron-LM's ``--position-embedding-type`` takes
    ``learned_absolute``, ``rope``, ``mrope``, ``relative`` or ``none`` while ``core_transformer_config_from_args``
    asserts ``--rope-type rope`` without ``--multi-latent-attention`` ("Common attention only support
    rope_type='rope'"): no flag trains it."""
    ramp = (f", ramped between channel pairs {yarn.ramp[0]:.3g} and {yarn.ramp[1]:.3g}" if yarn.ramp is not None else "")
    return (f"its rotary frequencies are YaRN's scaling of a geometric series (base {yarn.base:g}, factor {yarn.factor:g}"
            f"{ramp}, as GPT-OSS's) and Megatron-LM's GPT takes YaRN from no flag (--position-embedding-type "
            "is learned_absolute, rope, mrope, relative or none; --rope-type yarn is multi-latent attention's)")


def _rotary_refusal(graph: OpGraph, model: TransformerModel) -> list[str]:
    """:func:`_rotary_of`'s reason as a clause of :func:`megatron_family`'s refusal (the rows a
    launcher is listed on are the ones it exports)."""
    if model.position_table_rows is not None:
        return []
    problem = _rotary_of(graph, model)[1]
    return [problem] if problem else []


def _gpt_norms(graph: OpGraph, model: TransformerModel) -> list[str]:
    """The GPT layers' norm count, ``2 L + 1`` in megatron-core 0.16.1's ``GPTModel`` (``TransformerLayer``'s
    input and pre-MLP norms, ``TransformerBlock``'s final norm; ``LanguageModelEmbedding`` has none),
    unless a feature already refused explains the difference (sandwich norms, parallel sub-layers, a QK-norm
    --qk-layernorm does not build: :func:`family_refusals`)."""
    features, layers = model.features, model.num_layers
    if features.qk_norm not in ("none", "per-head"):  # whole-projection or per-head weights: refused in their words
        return []
    routers = router_norm_ops(graph)  # a router's divide of its top-k weights by their sum reads as a norm
    norms = sum(op.kind == "norm" and i not in routers for i, op in enumerate(graph.ops))
    qk = 2 if features.qk_norm == "per-head" else 0  # --qk-layernorm: q_layernorm and k_layernorm per layer
    expected = 2 * layers + 1 + (latent_norms(model) + qk) * layers  # MLA: its latents' norms (--qk-layernorm)
    if norms == expected or features.post_attention_norm or features.post_mlp_norm or features.parallel_residual:
        return []
    return [f"it has {norms} norms where Megatron-LM's GPT of {layers} layers has {expected} (two per layer and "
            "the final one, and the QK-norms read from the graph: no embedding norm, as BLOOM's)"]


def _bert(graph: OpGraph, model: TransformerModel) -> FamilyExport:
    """The BERT family's checks (module docstring), in the order a user fixes them."""
    ops, why = graph.ops, family_refusals(model, "bert", graph)
    if model.normalization == "RMSNorm":  # module docstring: FusedLayerNorm asserts LayerNorm
        why.append("its norms are RMSNorm and Megatron's BERT builds its LM head's norm as Apex's FusedLayerNorm, "
                   "which takes LayerNorm only (--normalization RMSNorm fails when BertLMHead is built)")
    explained = [r for r in model.irregular if not r.startswith(f"{len(_extra_linears(model))} linear layer(s) outside")]
    if explained:
        why.append("it is not one uniform stack of layers (" + "; ".join(explained) + ")")
    if model.lm_head is None:
        raise UnsupportedExport(_headless_reason(graph, model) + ELSEWHERE)
    transform, activation = _head_transform(graph, model)
    rest = [i for i in _extra_linears(model) if i != transform]
    binary = _binary_head(graph, model, rest)
    if transform is None:
        why.append("its LM head reads the last layer directly and Megatron's BertLMHead first applies a hidden x hidden "
                   "linear, GELU and a norm")
    elif activation not in ("gelu-erf", "gelu", "gelu-tanh"):  # BertLMHead.__init__: self.gelu = F.gelu
        # GELU's tanh approximation is trained as erf with a note, as in the MLPs (family_notes)
        found = _ACTIVATION_NAMES[activation] if activation else "no activation"
        why.append(f"its LM head's transform applies {found} and Megatron's BertLMHead applies erf GELU, "
                   "torch.nn.functional.gelu set in its constructor, which no flag or config field changes "
                   "(megatron-core 0.16.1 models/bert/bert_lm_head.py:42)")
    if rest and not binary:
        why.append(f"{len(rest)} linear layer(s) beside the masked-LM head, e.g. {ops[rest[0]].name}, are not BERT's "
                   "pooler and binary head (hidden x hidden with tanh, then hidden x 2)")
    norms = sum(op.kind == "norm" for op in ops)
    if norms != 2 * model.num_layers + 2:
        why.append(f"it has {norms} norms where Megatron's BERT of {model.num_layers} layers has "
                   f"{2 * model.num_layers + 2} (two per layer, the final norm, the LM head's; no embedding norm)")
    if sum(is_parameter(graph, a.tensor) for a in ops[model.lm_head].inputs) < 2:
        why.append("its vocabulary projection has no bias and Megatron's BERT output layer always has one")
    tables = _extra_tables(graph, model)
    if binary and tables != [2]:
        why.append(f"its token-type embeddings have {tables or 'no'} rows where Megatron's BERT with the binary head "
                   "has one 2-row table")
    if not binary and tables:
        rows = f" ({tables[-1]} rows)" if tables[-1] else ""
        why.append(f"it adds a token-type embedding{rows} and Megatron's BERT has one only with the "
                   "binary head (num_tokentypes = 2 if --bert-binary-head in pretrain_bert.py)")
    if why:
        raise UnsupportedExport("Megatron-LM's BERT (pretrain_bert.py) would train a different model: "
                                + "; ".join(why) + ELSEWHERE)
    return FamilyExport(family="bert", script=_SCRIPTS["bert"], binary_head=binary, head_activation=activation,
                        args=(() if binary else ("--bert-no-binary-head",)) + model_args(graph, model))


def _shared_layers(graph: OpGraph, model: TransformerModel) -> list[str]:
    """One clause when two attention or MLP blocks read one weight matrix: cross-layer parameter sharing
    (ALBERT's one layer applied ``num_hidden_layers`` times). megatron-core 0.16.1's ``TransformerBlock``
    builds a ``TransformerLayer`` of its own parameters per layer (``transformer/transformer_block.py:367-372``,
    one ``build_module`` per layer spec) and no model class reuses one. Matrices only: the TorchScript
    exporter merges equal initializers, so a fresh model's all-zero biases or all-one norm scales read as
    shared (:mod:`importers.parameters`' shared-vector warning)."""
    ops = graph.ops
    blocks = [(a.score, (*a.q_proj, *a.k_proj, *a.v_proj, *a.out_proj)) for a in model.attention]
    blocks += [(m.fc2, (*m.fc1, m.fc2)) for m in model.mlps]
    reader: dict[str, int] = {}
    for anchor, members in blocks:
        for access in (a for i in members for a in ops[i].inputs):
            shape = graph.tensors[access.tensor].shape if access.tensor in graph.tensors else ()
            if not is_parameter(graph, access.tensor) or sum(d > 1 for d in shape) < 2:
                continue
            first = reader.setdefault(graph.parameter_aliases.get(access.tensor, access.tensor), anchor)
            if first != anchor:
                kind = "attention" if any(a.score == anchor for a in model.attention) else "MLP"
                return [f"its layers share their weights (cross-layer parameter sharing, as ALBERT's: the {kind} at "
                        f"{ops[anchor].name} reads the weights of the one at {ops[first].name}) and Megatron-Core "
                        "builds every layer with weights of its own"]
    return []


def _factorised_embedding(graph: OpGraph, model: TransformerModel) -> list[str]:
    """One clause when the token embeddings are narrower or wider than the layers: a factorised
    embedding (ALBERT's and ELECTRA's ``embedding_size``, projected to ``hidden_size`` by a linear
    layer). megatron-core 0.16.1's ``LanguageModelEmbedding`` builds its word and position tables
    ``hidden_size`` wide (``models/common/embeddings/language_model_embedding.py:56-58, 67-68``),
    the input of the first layer."""
    if model.token_embedding is None:
        return []
    out = graph.ops[model.token_embedding].outputs[0].tensor
    width = graph.tensors[out].shape[-1] if graph.tensors[out].shape else model.hidden_size
    if width == model.hidden_size:
        return []
    return [f"its token embeddings are {width} wide and its layers {model.hidden_size} (a factorised embedding, "
            "as ALBERT's: a linear layer projects them) and Megatron-Core's embedding is as wide as its layers"]


def _relative_bias(graph: OpGraph, model: TransformerModel) -> list[str]:
    """One clause for a learned relative-position bias added to the scores (MPNet's buckets,
    :func:`~exporters.megatron.t5.relative_bias_tables`): of megatron-core 0.16.1's model classes only
    the encoder-decoder ``T5Model`` has one (``position_embedding_type='relative'``,
    ``models/T5/t5_model.py:145-147, 216-229``); ``GPTModel`` takes ``learned_absolute``, ``rope``,
    ``mrope``, ``yarn`` or ``none`` (``models/gpt/gpt_model.py:99-101``) and ``BertModel``
    ``learned_absolute`` or ``rope`` (``models/bert/bert_model.py:72``)."""
    tables = relative_bias_tables(graph, model)
    if not tables:
        return []
    rows, heads = tables[0]
    return [f"its attention adds a learned relative-position bias to the scores (a {rows} x {heads} table of "
            "distance buckets, one column per head, as MPNet's) and of Megatron-Core's model classes only the "
            "encoder-decoder T5 has one (GPT's and BERT's positions are learned absolute or rotary)"]


def _extra_linears(model: TransformerModel) -> list[int]:
    """The parameter matmuls outside attention, MLP and LM head (``linear`` role), MoE routers included."""
    return [i for i, role in enumerate(model.roles) if role == "linear"]


def _writers(graph: OpGraph, index: int) -> list[int]:
    """The ops that write ``index``'s inputs."""
    tensors = {a.tensor for a in graph.ops[index].inputs}
    return sorted({e.producer for e in graph.edges if e.consumer == index and e.tensor in tensors})


def _headless_reason(graph: OpGraph, model: TransformerModel) -> str:
    """Why an encoder without a recognised LM head is refused: it has none (a vision or classification encoder), or
    its vocabulary projection multiplies by a weight computed at run time (:func:`_computed_vocab_projection`)."""
    computed = _computed_vocab_projection(graph, model)
    if computed is None:
        return ("the model is a bidirectional encoder without an LM head (a vision or classification encoder); "
                "Megatron-LM's encoder script, pretrain_bert.py (BertModel), ends in a masked-LM head, and "
                "megatron-core's ViT (CLIPViTModel) is built only inside its multimodal models")
    head, concat = (graph.ops[i] for i in computed)
    parts = ", ".join(f"'{a.tensor}' {list(graph.tensors[a.tensor].shape)}" for a in concat.inputs)
    return (f"the model's LM head ({head.name}) multiplies by a weight concatenated at run time from {parts} "
            "(MobileBERT's cat([decoder.weight.t(), dense.weight]), which projects a hidden state wider than the "
            "embedding); Megatron-LM's BERT output layer is one hidden x vocabulary linear whose weight is the "
            "word-embedding table when shared (megatron-core 0.16.1 models/bert/bert_model.py: "
            "ColumnParallelLinear(config.hidden_size, vocab_size)), so pretrain_bert.py would train a different head")


def _computed_vocab_projection(graph: OpGraph, model: TransformerModel) -> tuple[int, int] | None:
    """``(matmul, concat)``: the last matmul whose output's last dim is the vocabulary and whose other operand is a
    concatenation of parameters only (MobileBERT's LM head); ``None`` when there is none."""
    if model.vocab_size is None:
        return None
    made = {a.tensor: i for i, op in enumerate(graph.ops) if op.kind == "concat"
            and all(is_parameter(graph, b.tensor) for b in op.inputs) for a in op.outputs}
    for i in range(len(graph.ops) - 1, -1, -1):
        op = graph.ops[i]
        if op.kind != "matmul" or not op.outputs or graph.tensors[op.outputs[0].tensor].shape[-1:] != (model.vocab_size,):
            continue
        concats = [made[a.tensor] for a in op.inputs if a.tensor in made]
        if concats:
            return i, concats[0]
    return None


def _head_transform(graph: OpGraph, model: TransformerModel) -> tuple[int | None, str | None]:
    """``(the linear, its activation)`` of the LM head's transform, ``BertLMHead``'s dense: an extra linear
    whose output, through its activation (fused into the linear's op, or one elementwise op on), a norm
    turns into the LM head's input. The activation (:func:`importers.transformer._mlp_activation_of`'s name,
    ``None`` without one) is checked by the caller, so a head with GELU's tanh approximation is told
    as such, not as a head without a transform (issue 25). ``(None, None)`` without one."""
    ops = graph.ops
    norms = [w for w in _writers(graph, model.lm_head) if ops[w].kind == "norm"]  # type: ignore[arg-type]
    if len(norms) != 1:
        return None, None
    for writer in _writers(graph, norms[0]):
        chain = [writer] if model.roles[writer] == "linear" else _writers(graph, writer) + [writer]
        linear = next((i for i in chain if model.roles[i] == "linear"), None)
        if linear is None:
            continue
        return linear, _mlp_activation_of(graph, chain)
    return None, None


def _binary_head(graph: OpGraph, model: TransformerModel, rest: list[int]) -> bool:
    """Whether ``rest`` is BERT's pooler (hidden x hidden with ``tanh``) feeding a hidden x 2 linear."""
    if len(rest) != 2:
        return False
    ops = graph.ops
    pooler, head = sorted(rest)
    widths = [graph.tensors[o.tensor].shape[-1] for i in (pooler, head) for o in ops[i].outputs[:1]]
    tanh = any("Tanh" in ops[i].node_types for i in (pooler, *_writers(graph, head)))
    feeds = pooler in _writers(graph, head) or any(pooler in _writers(graph, w) for w in _writers(graph, head))
    return widths == [model.hidden_size, 2] and tanh and feeds


def _extra_tables(graph: OpGraph, model: TransformerModel) -> list[int]:
    """Rows of the embedding tables beside the token and the (largest) position table: token types."""
    rows = []
    for i in model.position_embeddings:
        rows.append(embedding_rows(graph, graph.ops[i]))
    if model.position_table_rows is not None and model.position_table_rows in rows:
        rows.remove(model.position_table_rows)
    return sorted(rows)
