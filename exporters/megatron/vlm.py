r"""Vision-language models (LLaVA) and Megatron-LM: why they are refused, said precisely (issue 25, h28f).

megatron-core 0.16.1 has ``LLaVAModel`` (``models/multimodal/llava_model.py``): a ``CLIPViTModel`` vision tower
(``models/vision/clip_vit_model.py``: a patch conv, a class token, learned positions, ``ln_pre``, then a
``TransformerBlock`` of its own ``TransformerConfig``), a ``MultimodalProjector`` (``"mlp"``: ``linear_fc1``, an
activation, ``linear_fc2``, from the tower's width to the decoder's) and a ``GPTModel`` decoder, the image
embeddings written over the image token. The class takes separate configs for the three parts, but the launcher
that builds it from flags, Megatron-LM's ``pretrain_vlm.py``, does not: its vision config is
``deepcopy(language_transformer_config)`` with only ``num_layers = --encoder-num-layers`` changed, and its projector is
the decoder layer spec's MLP on another ``deepcopy`` of the decoder's config (from the tower's width to
``--ffn-hidden-size``, the decoder's activation). So ``pretrain_vlm.py`` trains a LLaVA only when the tower's layers
are the decoder's (hidden size, heads and groups, FFN, activation, norm, biases) and the projector the decoder's
MLP. LLaVA-1.5's CLIP tower (quick-GELU, LayerNorm with biases, full multi-head attention) beside a Llama decoder
(SwiGLU, RMSNorm, grouped queries) is not that. Megatron-LM's ``examples/multimodal`` builds towers from presets
only (``config.py``'s ``get_vision_model_config``: ``clip`` is ViT-L/14's 24 layers of 1024, ``siglip``,
``internvit``, ``radio``), not from flags.

:func:`vlm_refusal` reads the three parts from the transformer reader's blocks
(:func:`importers.transformer.analyze_transformer`): the attention blocks in runs of one shape (the tower's, then
the decoder's, the last run), each block's MLP (the first after it), and the MLPs between the runs (the
projector). It names what differs, so the user sees what a launcher would need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from importers.transformer import _mlp_activation_of, output_side_dims, reduction_side_dims

if TYPE_CHECKING:
    from importers.transformer import AttentionBlock, MlpBlock, TransformerModel
    from planner.core.graph import OpGraph

__all__ = ["VlmParts", "vlm_parts", "vlm_refusal"]

_ACTIVATIONS = {"scaled-sigmoid": "quick-GELU", "gelu-erf": "GELU", "gelu-tanh": "GELU (tanh)", "gelu": "GELU",
                "silu": "SiLU", "relu": "ReLU", "squared-relu": "squared ReLU"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Tower:
    """One run of equal attention layers and their MLPs, as read."""

    layers: int
    hidden: int
    heads: int
    groups: int
    head_dim: int
    seq: int
    ffn: int
    activation: str
    """As said in the refusal: ``quick-GELU``, ``SwiGLU`` (a gated SiLU), ``GELU``..."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VlmParts:
    """A vision tower, its projector and the decoder (:func:`vlm_parts`)."""

    vision: Tower
    language: Tower
    projector: tuple[int, int, int]
    """``(input width, hidden width, output width)`` of the projector's MLP."""
    projector_activation: str


def _activation(graph: OpGraph, mlp: MlpBlock) -> str:
    # as exporters.megatron.families reads a layer's: the first linears and the glue, else the second linear
    read = _mlp_activation_of(graph, (*mlp.fc1, *sorted(mlp.glue))) or _mlp_activation_of(graph, (mlp.fc2,))
    name = _ACTIVATIONS.get(read or "", "an unread activation")
    return "SwiGLU" if mlp.gated and read == "silu" else (f"gated {name}" if mlp.gated else name)


def _tower(graph: OpGraph, blocks: list[AttentionBlock], mlps: list[MlpBlock]) -> Tower:
    first = blocks[0]
    activations = sorted({_activation(graph, m) for m in mlps}) or ["no MLP"]
    return Tower(layers=len(blocks), hidden=first.hidden_size, heads=first.heads, groups=first.query_groups,
                 head_dim=first.head_dim, seq=first.seq_length, ffn=mlps[0].ffn_hidden_size if mlps else 0,
                 activation=" / ".join(activations))


def _width(graph: OpGraph, op: int, axis: int) -> int:
    """Size of the weight's input (``axis`` 0 of ``[in, out]`` as the reader orders it) or output side."""
    operation = graph.ops[op]
    dims = reduction_side_dims(graph, operation) if axis == 0 else output_side_dims(graph, operation)
    size = 1
    for name in dims:
        size *= operation.dim(name).size
    return size


def vlm_parts(graph: OpGraph, model: TransformerModel) -> VlmParts | None:
    """The tower, projector and decoder of a LLaVA-style graph (module docstring), or ``None``: no patch conv, no LM
    head, fewer than two runs of attention layers, or no MLP between the first run and the last."""
    if model.lm_head is None or not any(op.kind == "conv" for op in graph.ops) or not model.attention:
        return None
    runs: list[list[AttentionBlock]] = []
    for block in sorted(model.attention, key=lambda b: b.score):
        shape = (block.hidden_size, block.heads, block.query_groups, block.head_dim, block.seq_length)
        last = runs[-1][0] if runs else None
        if last is not None and shape == (last.hidden_size, last.heads, last.query_groups, last.head_dim, last.seq_length):
            runs[-1].append(block)
        else:
            runs.append([block])
    if len(runs) < 2:
        return None
    vision, language = runs[0], runs[-1]
    scores = sorted(b.score for b in model.attention)
    layer_mlps: dict[int, MlpBlock] = {}
    for mlp in sorted(model.mlps, key=lambda m: min(m.fc1)):
        owner = max((s for s in scores if s < min(mlp.fc1)), default=None)
        if owner is not None and owner not in layer_mlps:
            layer_mlps[owner] = mlp
    owned = {id(m) for m in layer_mlps.values()}
    between = [m for m in model.mlps if id(m) not in owned and vision[-1].score < min(m.fc1) < language[0].score]
    if not between:
        return None
    projector = between[0]
    return VlmParts(
        vision=_tower(graph, vision, [layer_mlps[b.score] for b in vision if b.score in layer_mlps]),
        language=_tower(graph, language, [layer_mlps[b.score] for b in language if b.score in layer_mlps]),
        projector=(_width(graph, min(projector.fc1), 0), projector.ffn_hidden_size, _width(graph, projector.fc2, 1)),
        projector_activation=_activation(graph, projector),
    )


def _said(tower: Tower) -> str:
    groups = f" in {tower.groups} query groups" if tower.groups != tower.heads else ""
    return (f"{tower.layers} layers of width {tower.hidden}, {tower.heads} heads of {tower.head_dim}{groups}, "
            f"FFN {tower.ffn} {tower.activation}")


def _differences(vision: Tower, language: Tower) -> list[str]:
    fields = (("width", "hidden"), ("heads", "heads"), ("query groups", "groups"), ("head size", "head_dim"),
              ("FFN", "ffn"), ("activation", "activation"))
    return [f"{name} {getattr(vision, key)} vs {getattr(language, key)}" for name, key in fields
            if getattr(vision, key) != getattr(language, key)]


def vlm_refusal(graph: OpGraph, model: TransformerModel) -> str | None:
    """Why Megatron-LM's ``pretrain_vlm.py`` would train another model than this LLaVA-style graph, one clause
    naming the tower, the projector, the decoder and how they differ from what it builds (module docstring);
    ``None`` when the graph is not one."""
    parts = vlm_parts(graph, model)
    if parts is None:
        return None
    vision, language = parts.vision, parts.language
    wide, ffn, out = parts.projector
    differ = _differences(vision, language)
    projector_differs = (ffn != language.ffn or parts.projector_activation != language.activation)
    what = (f"its vision tower's layers differ from its decoder's ({'; '.join(differ)})" if differ else
            "it was not checked that its vision tower's norms, biases and positions are its decoder's")
    if projector_differs:
        what += (f" and its projector is {wide} -> {ffn} -> {out} {parts.projector_activation}, not the decoder's MLP "
                 f"({wide} -> {language.ffn} -> {out} {language.activation})")
    return (f"it is a vision-language model (LLaVA-style): a vision tower of {_said(vision)} over {vision.seq} patch "
            f"positions, a projector and a decoder of {_said(language)}; megatron-core 0.16.1's LLaVAModel takes "
            "separate configs for them, but Megatron-LM's pretrain_vlm.py builds the tower's layers and the projector "
            "from the decoder's config (only --encoder-num-layers differs; the projector is the decoder's MLP), and "
            f"{what}; a launcher would need its own vision and projection configs (Megatron-LM's examples/multimodal "
            "builds preset towers only, its clip ViT-L/14's 24 layers of 1024)")
