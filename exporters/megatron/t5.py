r"""Megatron-LM's encoder-decoder family: ``pretrain_t5.py`` with megatron-core 0.16.1's ``T5Model``
(``megatron/core/models/T5/t5_model.py``, ``t5_spec.py``), or the one-line reason not (issue 25: "an
exporter emits an exact equivalent or refuses with the reason, never a silently different model").

What ``T5Model`` builds with Megatron-LM's flags (core_v0.16.1):

* one ``LanguageModelEmbedding`` for both stacks: the word table and, with the default
  ``--position-embedding-type learned_absolute``, one learned position table (``t5_position_ids``:
  ``arange(s)``, ``--max-position-embeddings`` rows), summed, no norm;
* an encoder ``TransformerBlock`` of pre-LN layers (norm, bidirectional self-attention with a
  padding mask, norm, MLP) and a decoder ``TransformerBlock`` of pre-LN layers (norm, causal
  self-attention, ``pre_cross_attn_layernorm``, ``CrossAttention``: queries from the decoder, keys and
  values from the encoder's output, norm, MLP), each ending in a final norm: ``2 L_e + 3 L_d + 2``
  norms;
* both blocks of the same depth: ``pretrain_t5.py`` builds the decoder from
  ``core_transformer_config_from_args(args)``, whose ``num_layers`` Megatron-LM's ``validate_args``
  sets to ``--encoder-num-layers`` (or ``--num-layers``); the encoder's ``encoder_config.num_layers``
  is the same value, so ``--decoder-num-layers`` changes neither;
* attention ``softmax(q k^T / sqrt(kv_channels))`` (``DotProductAttention``'s default
  ``softmax_scale``); ``CrossAttention`` refuses grouped-query attention (``ValueError`` in its
  constructor);
* ``T5LMHead``: the decoder's final norm into the vocabulary projection, tied to the word table by
  default and then *with a bias* (``ColumnParallelLinear(bias=share_embeddings_and_output_weights)``),
  untied (``--untie-embeddings-and-output-weights``) without one.

The export writes ``--num-layers L`` (encoder and decoder depth), ``--seq-length`` (the encoder's
``encoder_seq_length``) and ``--decoder-seq-length`` (:func:`t5_view`, :data:`T5Export`'s ``args``);
the shared flags are the GPT family's (:func:`exporters.megatron.export.megatron_args`).

Refused, one clause each (:func:`t5_refusals`): the GPT/BERT feature refusals (an MLP activation
other than GELU, squared ReLU, SwiGLU; soft-capping; sandwich norms; ALiBi; parallel sub-layers;
post-LN, BART's), unequal depths, attentions not laid out as an encoder then decoder layers of
self- then cross-attention, an encoder without token embeddings (Whisper's convolutional front end),
two word tables, T5's relative-position buckets (megatron-core has ``--position-embedding-type
relative``, but its ``--relative-attention-max-distance`` is not in a graph-only file), no learned
position table, unscaled attention scores (T5's), an LM head that does not read the final norm (T5's
``d_model^-0.5`` rescale of a tied head), a tied head without Megatron's output bias or an untied one
with a bias (worded as the file shows it: a TorchScript head may be the tied table's copy and its bias a
buffer such as ``final_logits_bias``, :func:`_untied_biased_head`), grouped-query attention, and a norm
count other than ``2 L_e + 3 L_d + 2``.

Plans (:func:`t5_plan_refusal`): ``pp = 1`` (``pretrain_t5.py`` raises ``ValueError("Pipeline
parallelism is not supported for T5.")`` and megatron-core 0.16.1 has no encoder pipeline split) and
``cp = 1`` (``pretrain_t5.py``'s ``get_batch`` broadcasts whole sequences: no
``get_batch_on_this_cp_rank``); data and tensor parallelism as the GPT family. No sequence-parallel
row either: the planner's sequence-parallel pattern (:mod:`exporters._tp`) splits the encoder's
sequence and has no split for the decoder's norms, whose tokens are the decoder's (``tgt_seq``).

Checked with megatron-core itself (``tests/integration/test_megatron_t5.py``): ``T5Model`` built from
the exported flags has the fixture's 306,920 parameters and, loaded with its weights, computes its
logits to float32 rounding. ``--transformer-impl`` stays Megatron-LM's default ``transformer_engine``:
the local T5 block specs name ``TENorm`` for the final norms, which is ``None`` without Transformer
Engine, so ``--transformer-impl local`` would drop both stacks' final norms.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from exporters.elsewhere import ELSEWHERE
from importers.transformer import TransformerModel, embedding_rows, is_parameter
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph

__all__ = ["T5_SCRIPT", "T5Stack", "t5_stack", "t5_refusals", "check_t5", "t5_view", "t5_plan_refusal",
           "position_table_rows", "relative_bias_tables"]

T5_SCRIPT = "pretrain_t5.py"
"""Megatron-LM's training script for ``T5Model`` (repository root, core_v0.16.1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class T5Stack:
    """An encoder-decoder read from a :class:`~importers.transformer.TransformerModel`'s attentions:
    encoder self-attentions first, then per decoder layer its self-attention and its cross-attention
    (the graph's op order, as both exporters write a forward pass)."""

    encoder: tuple[int, ...]
    """Indices into ``model.attention`` of the encoder's self-attentions."""
    decoder_self: tuple[int, ...]
    decoder_cross: tuple[int, ...]
    ordered: bool
    """The attentions are ``E^Le (S C)^Ld`` in op order: one self- then one cross-attention per decoder layer."""
    encoder_seq_length: int
    decoder_seq_length: int
    """Tokens per sequence: the encoder's and the decoder self-attention's query lengths."""


def _is_cross(graph: OpGraph, model: TransformerModel, index: int) -> bool:
    """Whether attention ``index`` projects its keys from another stream than its queries (not the queries'
    own input shortened by a strided conv: SegFormer's spatial reduction, ``AttentionBlock.kv_reduction``;
    not a learned probe attending over the tokens: an attention-pooling head, :func:`_reads_a_probe`)."""
    block, ops = model.attention[index], graph.ops
    return bool(block.q_proj and block.k_proj) and block.kv_reduction is None and (
        ops[block.q_proj[0]].inputs[0].tensor != ops[block.k_proj[0]].inputs[0].tensor) and not _reads_a_probe(graph, block)


def _reads_a_probe(graph: OpGraph, block) -> bool:
    """Whether one side of the attention projects a learned probe, a parameter repeated over the batch
    (``Tile``/``Expand`` of it) or read as it is: SigLIP's ``SiglipMultiheadAttentionPoolingHead``
    (``nn.MultiheadAttention(probe.repeat(batch, 1, 1), h, h)``) pools a vision tower's tokens that way. No
    decoder stack reads it, so it is no T5 cross-attention."""
    tensors, ops = graph.tensors, graph.ops
    producer = {out.tensor: i for i, op in enumerate(ops) for out in op.outputs}
    for projection in (block.q_proj, block.k_proj):
        read = ops[projection[0]].inputs[0].tensor if projection else None
        if read is None or read not in tensors:
            continue
        if tensors[read].role == "parameter":
            return True
        source = producer.get(read)
        if source is not None and ops[source].kind == "data_movement":
            roles = [tensors[a.tensor].role for a in ops[source].inputs if a.tensor in tensors]
            if "parameter" in roles and all(r in ("parameter", "constant") for r in roles):
                return True
    return False


def t5_stack(graph: OpGraph, model: TransformerModel) -> T5Stack | None:
    """The encoder-decoder layout of ``model``, or ``None`` when no attention reads another stream
    (a decoder-only or encoder-only model)."""
    cross = [i for i in range(len(model.attention)) if _is_cross(graph, model, i)]
    if not cross:
        return None
    decoder_self = [i - 1 for i in cross]
    encoder = [i for i in range(len(model.attention)) if i not in cross and i not in decoder_self]
    # encoder first, then (self, cross) pairs: the only order in which this concatenation counts 0, 1, 2...
    ordered = encoder + [i for c in cross for i in (c - 1, c)] == list(range(len(model.attention)))
    blocks = model.attention
    return T5Stack(
        encoder=tuple(encoder), decoder_self=tuple(decoder_self), decoder_cross=tuple(cross), ordered=ordered,
        encoder_seq_length=blocks[encoder[0]].seq_length if encoder else model.seq_length,
        decoder_seq_length=blocks[decoder_self[0]].seq_length if decoder_self[0] >= 0 else model.seq_length,
    )


def _tables(graph: OpGraph, model: TransformerModel) -> tuple[str | None, list[tuple[int, str, int, int]]]:
    """``(the token table's name, [(op, table, rows, width)] of every other embedding gather)``."""
    ops = graph.ops
    token = None
    if model.token_embedding is not None:
        token = ops[model.token_embedding].inputs[0].tensor
    found = []
    for i in model.position_embeddings:
        op = ops[i]
        shape = graph.tensors[op.inputs[0].tensor].shape
        found.append((i, op.inputs[0].tensor, embedding_rows(graph, op), shape[-1] if shape else 0))
    return token, found


def relative_bias_tables(graph: OpGraph, model: TransformerModel) -> list[tuple[int, int]]:
    """``[(rows, heads)]`` of the gathered tables one column per attention head wide (not the word table):
    learned relative-position biases, one row per distance bucket (T5's and MPNet's ``relative_attention_bias``)."""
    token, tables = _tables(graph, model)
    return [(rows, width) for _, name, rows, width in tables
            if name != token and width == model.num_attention_heads != model.hidden_size]


def position_table_rows(graph: OpGraph, model: TransformerModel) -> int | None:
    """Rows of the learned position table (hidden wide, not the word table), ``None`` without one.
    ``TransformerModel.position_table_rows`` takes the largest gathered table, which in an
    encoder-decoder is the decoder's word lookup."""
    token, tables = _tables(graph, model)
    rows = [r for _, name, r, width in tables if name != token and width == model.hidden_size]
    return max(rows) if rows else None


def _rescaled_head(graph: OpGraph, head: int) -> bool:
    """Whether the LM head reads anything but a norm, or a norm with more ``Mul`` nodes than the
    model's other norms (the importer folds HF T5's ``sequence_output * d_model**-0.5`` into the
    final norm's op)."""
    ops = graph.ops
    tensors = {a.tensor for a in ops[head].inputs}
    writers = [ops[e.producer] for e in graph.edges if e.consumer == head and e.tensor in tensors]
    fewest = min((op.node_types.count("Mul") for op in ops if op.kind == "norm"), default=0)
    return any(op.kind != "norm" or op.node_types.count("Mul") > fewest for op in writers)


def _unscaled(graph: OpGraph, model: TransformerModel) -> bool:
    """Whether some attention's scores are proven unscaled: no ``Div`` or ``Mul`` in its score op nor
    in its query and key projections' ops (where exporters put ``q k^T / sqrt(d)``: on the scores, on
    ``q`` and ``k`` by ``d^-1/4`` each, or on ``q`` as Whisper's ``q_proj(x) * scaling``), read from
    the ops' ONNX node types. HF T5 scales nothing (its initialisation absorbs ``1/sqrt(d)``); a
    TorchScript SDPA export multiplies by constants whose values a graph-only file may not hold, so
    those count as scaled."""
    ops = graph.ops
    return any(not {"Div", "Mul"} & {t for i in (b.score, *b.q_proj, *b.k_proj) for t in ops[i].node_types}
               for b in model.attention)


def t5_refusals(graph: OpGraph, model: TransformerModel, stack: T5Stack) -> list[str]:
    """What megatron-core 0.16.1's ``T5Model`` (``pretrain_t5.py`` flags) cannot build of ``model`` beyond
    the layer features every family checks, one clause each (module docstring); empty when its flags
    reproduce it."""
    out = _layout_refusals(graph, model, stack)
    out += _embedding_refusals(graph, model)
    if _unscaled(graph, model):
        out.append("its attention scores are not scaled by 1/sqrt(d) (T5's) and Megatron's DotProductAttention "
                   "divides by sqrt(kv_channels)")
    if model.num_query_groups != model.num_attention_heads:
        out.append("it uses grouped-query attention and megatron-core's CrossAttention refuses it "
                   "(num_query_groups != num_attention_heads raises ValueError)")
    out += _head_refusals(graph, model)
    layers_e, layers_d = len(stack.encoder), len(stack.decoder_cross)
    norms = sum(op.kind == "norm" for op in graph.ops)
    if not model.features.post_layernorm and norms != 2 * layers_e + 3 * layers_d + 2:
        out.append(f"it has {norms} norms where Megatron's T5 of {layers_e} + {layers_d} layers has "
                   f"{2 * layers_e + 3 * layers_d + 2} (two per encoder layer, three per decoder layer, each "
                   "stack's final norm; no embedding norm)")
    return out


def _layout_refusals(graph: OpGraph, model: TransformerModel, stack: T5Stack) -> list[str]:
    """The stacks' shape: the layer order, equal depths, the MLPs, the masks megatron-core applies."""
    out = []
    layers_e, layers_d = len(stack.encoder), len(stack.decoder_cross)
    if not stack.ordered:
        out.append("its attentions are not an encoder stack followed by decoder layers of one self- then one "
                   "cross-attention each, the layers megatron-core's T5 specs build")
    elif layers_e != layers_d:
        out.append(f"its encoder has {layers_e} layers and its decoder {layers_d}; pretrain_t5.py builds both "
                   "with --encoder-num-layers (validate_args sets num_layers to it, and T5Model's decoder reads "
                   "config.num_layers)")
    if len(model.mlps) != layers_e + layers_d:
        out.append(f"it has {len(model.mlps)} MLPs for {layers_e + layers_d} layers and each T5 layer has one")
    masks = [graph.attention_masks.get(graph.ops[b.softmax].name, "unknown") for b in model.attention]
    if any(masks[i] == "causal" for i in stack.encoder + stack.decoder_cross):
        out.append("an encoder or cross-attention is causal and megatron-core's T5 masks them by padding only")
    if any(masks[i] == "bidirectional" for i in stack.decoder_self):
        out.append("its decoder self-attention is bidirectional and megatron-core's T5 decoder is causal")
    out += _uniformity_refusals(graph, model, stack)
    return out


def _uniformity_refusals(graph: OpGraph, model: TransformerModel, stack: T5Stack) -> list[str]:
    """Every attention of the heads, head size and width of the first, queries as long as their stack's
    sequence (the encoder's, the decoder's), every MLP alike. The importer's own check
    (``TransformerModel.irregular``) compares every attention with the first and counts one MLP per
    attention, which an encoder-decoder breaks by design, so those two of its findings are redone here."""
    ops, blocks = graph.ops, model.attention
    first = blocks[0]
    lengths = {i: stack.encoder_seq_length for i in stack.encoder}
    lengths.update({i: stack.decoder_seq_length for i in stack.decoder_self + stack.decoder_cross})
    shape = ("heads", "head_dim", "query_groups", "hidden_size")
    differ = [ops[b.score].name for i, b in enumerate(blocks)
              if any(getattr(b, f) != getattr(first, f) for f in shape) or b.seq_length != lengths.get(i)]
    why = [f"attention at {differ[0]} differs from the first one in heads, head size or width, or its queries are not "
           "its stack's sequence"] if differ else []
    if len({(m.ffn_hidden_size, m.gated, len(m.fc1)) for m in model.mlps}) > 1:
        why.append("the MLP blocks differ in size")
    why += [r for r in model.irregular if "differs from the first one" not in r and "attention blocks but" not in r]
    return ["it is not two uniform stacks of layers (" + "; ".join(why) + ")"] if why else []


def _embedding_refusals(graph: OpGraph, model: TransformerModel) -> list[str]:
    """One word table read by both stacks; one learned position table; no relative-position buckets."""
    out = []
    token, tables = _tables(graph, model)
    word_reads = 1 + sum(name == token for _, name, _, _ in tables) if token is not None else 0
    if word_reads < 2:
        out.append("its encoder reads no token embedding (a convolutional or feature front end, as Whisper's) and "
                   "Megatron's T5 embeds both stacks' tokens with one word table")
    relative = relative_bias_tables(graph, model)
    if relative:
        rows, width = relative[0]
        out.append(f"it adds learned relative-position biases to the attention scores (T5's buckets: a {rows} x "
                   f"{width} table per stack); Megatron-LM's --position-embedding-type relative buckets by "
                   "--relative-attention-max-distance, which a graph-only file does not give")
    others = [name for _, name, _, width in tables if name != token and width == model.hidden_size]
    if len(set(others)) > 1:
        out.append(f"its stacks have {len(set(others))} position or word tables beside the shared word table, and "
                   "Megatron's T5 has one LanguageModelEmbedding for both (one word and one position table)")
    if not others and not relative:
        out.append("it has no learned position table; this export writes megatron-core T5Model's default "
                   "learned_absolute positions (its rope is not read from encoder-decoder graphs)")
    return out


def _head_refusals(graph: OpGraph, model: TransformerModel) -> list[str]:
    """``T5LMHead``: the decoder's final norm into the vocabulary projection, biased exactly when tied."""
    out = []
    head = model.lm_head
    if head is None:
        return ["it has no LM head and Megatron's T5 ends in T5LMHead (the vocabulary projection)"]
    if _rescaled_head(graph, head):
        out.append("its LM head reads the decoder's final norm scaled again (T5's d_model^-0.5 on a tied head) and "
                   "Megatron's T5LMHead reads the final norm as it is")
    weights = sorted({a.tensor for a in graph.ops[head].inputs if is_parameter(graph, a.tensor)},
                     key=lambda name: -graph.tensors[name].num_elements)  # the vocabulary matrix, then a bias
    biased = len(weights) >= 2
    if model.tied_embeddings and not biased:
        out.append("its tied vocabulary projection has no bias and Megatron's tied T5LMHead has one "
                   "(ColumnParallelLinear(bias=share_embeddings_and_output_weights))")
    if not model.tied_embeddings and biased:
        out.append(_untied_biased_head(weights[0], weights[1]))
    return out


def _untied_biased_head(weight: str, bias: str) -> str:
    """The clause for a head read as untied with a bias, true to what the file shows. A matrix the
    TorchScript exporter made (``onnx::MatMul_N``) may be the tied word table's transposed copy, and a
    file it wrote records no buffers, so the bias added after it (a folded ``onnx::Add_N`` or a named
    initializer) may be a buffer, as BART's, Pegasus' and Marian's ``final_logits_bias`` is (registered,
    never trained); a graph-only file cannot tell, where a dynamo export names the tied weight and
    records buffers (``importers.param_evidence``)."""
    maybe_copy = weight.startswith("onnx::")
    maybe_buffer = maybe_copy or bias.startswith("onnx::")
    if not maybe_buffer:
        return "its untied vocabulary projection has a bias and Megatron's untied T5LMHead has none"
    read = []
    if maybe_copy:
        read.append(f"its vocabulary matrix {weight} may be the word table's transposed copy (TorchScript "
                    "duplicates a tied weight) or a head of its own")
    read.append(f"{bias}, added to the logits, may be a buffer (as BART's and Pegasus' final_logits_bias is, never "
                "trained; TorchScript records no buffers) or a learned bias")
    return ("; ".join(read) + ": the file does not say which, and Megatron's T5LMHead is either tied with a learned "
            "bias or untied without one (a dynamo export records ties and buffers)")


def check_t5(graph: OpGraph, model: TransformerModel, stack: T5Stack, features: list[str]) -> tuple[str, ...]:
    """``pretrain_t5.py``'s own flags for ``model`` (``--decoder-seq-length``), after ``features`` (the
    GPT/BERT feature clauses, :func:`exporters.megatron.families.family_refusals` for ``"t5"``) and
    :func:`t5_refusals` found nothing.

    Raises
    ------
    UnsupportedExport
        One line: every clause found.
    """
    why = features + t5_refusals(graph, model, stack)
    if why:
        cross = graph.ops[model.attention[stack.decoder_cross[0]].score].name
        raise UnsupportedExport(
            f"the model is an encoder-decoder (cross-attention at {cross}) and Megatron-LM's T5 ({T5_SCRIPT}, "
            "megatron-core's T5Model) would train a different model: " + "; ".join(why) + ELSEWHERE)
    return ("--decoder-seq-length", str(stack.decoder_seq_length))


def t5_view(graph: OpGraph, model: TransformerModel, stack: T5Stack) -> TransformerModel:
    """``model`` as :func:`~exporters.megatron.export.megatron_args` writes a T5: ``--num-layers`` one
    stack's depth (Megatron-LM reads it as both), ``--seq-length`` the encoder's
    (``encoder_seq_length``), ``--max-position-embeddings`` the learned table's rows."""
    return dataclasses.replace(model, num_layers=len(stack.decoder_cross), seq_length=stack.encoder_seq_length,
                               position_table_rows=position_table_rows(graph, model))


def t5_plan_refusal(*, pp: int = 1, cp: int = 1) -> str | None:
    """Why ``pretrain_t5.py`` does not run these degrees, or ``None`` (module docstring)."""
    if pp > 1:
        return ("pretrain_t5.py raises 'Pipeline parallelism is not supported for T5.' (megatron-core 0.16.1 has no "
                "encoder/decoder pipeline split); plan with --fix pp=1")
    if cp > 1:
        return "pretrain_t5.py has no context parallelism (its get_batch hands every rank whole sequences)"
    return None
