r"""Vision-language models (LLaVA) and Megatron-LM: what its two launchers build, and why a LLaVA is refused, said
precisely (issue 25; h28f, h30d).

megatron-core 0.16.1 has ``LLaVAModel`` (``models/multimodal/llava_model.py``): a ``CLIPViTModel`` vision tower
(``models/vision/clip_vit_model.py``; subtype ``clip``: a patch conv without bias, a class token, learned positions,
``ln_pre``, a ``TransformerBlock`` of its own ``TransformerConfig``, no final norm), a ``MultimodalProjector``
(``"mlp"``: the ``MLP`` of the layer spec it is given, from the tower's width to the projector config's
``ffn_hidden_size`` and back to its ``hidden_size``) and a ``GPTModel`` decoder. The class takes three configs; two
Megatron-LM launchers fill them from flags (Megatron-LM at 00caa53, read 2026-12-02):

* ``pretrain_vlm.py``: the tower's config is ``deepcopy(language_transformer_config)`` with only ``num_layers =
  --encoder-num-layers``, and the projector is the decoder layer spec's MLP (``.submodules.mlp.submodules``) on another
  copy of the decoder's config (tower width -> ``--ffn-hidden-size`` -> ``--hidden-size``, the decoder's activation,
  gating and biases). Its layer specs follow ``--transformer-impl``: with ``transformer_engine`` (the default) the
  decoder spec's MLP (``llava_spec.decoder_model_with_transformer_engine_default_spec`` ->
  ``gpt_layer_specs.get_mlp_module_spec(use_te=True)``) has ``linear_fc1 = TELayerNormColumnParallelLinear``, so the
  projector normalises the tower's output (the decoder's norm type) before its first linear; with ``local`` the
  projector has no norm but the tower's layers are ``vit_layer_specs.get_vit_layer_with_local_spec``'s, whose
  attention mask is ``AttnMaskType.causal`` (the Transformer Engine ViT spec's is ``no_mask``).
* ``examples/multimodal`` (``train.py`` -> ``model.py``): the tower from a preset of ``config.py``'s
  ``get_vision_model_config`` (``--vision-model-type``: :data:`TOWER_PRESETS`), the decoder's activation, gating,
  biases and FFN from ``get_language_model_config`` (``--language-model-type``, :data:`LANGUAGE_FFN`), and the
  projector from ``get_vision_projection_config`` by the same language type (:data:`PROJECTOR_PRESETS`); the projector
  gets a norm before its first linear (``get_norm_mlp_module_spec_te``) whenever its config's ``normalization`` is set,
  which every language type leaves set but ``mistral_7b``.

So a LLaVA as transformers builds it (``LlavaMultiModalProjector``: ``linear_1`` tower width -> text width, an
activation, ``linear_2`` text width -> text width, no norm) is trained by ``pretrain_vlm.py`` only with a norm the graph
lacks or a causal tower, and by ``examples/multimodal`` only beside a ``mistral_7b``-typed decoder of width 14336
(its projector's FFN), SwiGLU of FFN 14336, without biases, its tower a preset. :func:`vlm_refusal` reads the three
parts from the transformer reader's blocks (:func:`importers.transformer.analyze_transformer`): the attention blocks
in runs of one shape (the tower's, then the decoder's, the last run), each block's MLP (the first after it), and the
MLPs between the runs (the projector), and names, for each launcher, what differs (for ``examples/multimodal`` from
the nearest tower preset).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from importers.transformer import (
    MlpBlock, _count_parameters, _find_mlps, _mlp_activation_of, _Walker, output_side_dims, reduction_side_dims,
)

if TYPE_CHECKING:
    from importers.transformer import AttentionBlock, TransformerModel
    from planner.core.graph import OpGraph

__all__ = ["LANGUAGE_FFN", "PROJECTOR_PRESETS", "TOWER_PRESETS", "Tower", "TowerPreset", "VlmParts", "nearest_preset",
           "vlm_parts", "vlm_refusal"]

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
    normalization: str = "LayerNorm"
    """``LayerNorm`` or ``RMSNorm``: the rule of :func:`importers.transformer._normalization` on the run's norms."""
    bias: bool = True
    """The output projection and the MLP's linears have biases (``--add-bias-linear``)."""
    qkv_bias: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class TowerPreset:
    """One ``--vision-model-type`` of Megatron-LM's ``examples/multimodal/config.py`` (``get_vision_model_config``,
    commit 00caa53) and the ``CLIPViTModel`` subtype it builds (megatron-core 0.16.1 ``clip_vit_model.py``)."""

    name: str
    layers: int
    hidden: int
    heads: int
    head_dim: int
    """``kv_channels``."""
    ffn: int
    activation: str
    normalization: str
    bias: bool
    qkv_bias: bool
    class_token: bool
    """``CLIPViTModel`` prepends a class token (``clip``, ``internvit``; not ``siglip``)."""


TOWER_PRESETS: tuple[TowerPreset, ...] = (
    # activations: megatron.core.activations.quick_gelu is x * sigmoid(1.702 x), fast_gelu the tanh approximation
    TowerPreset(name="clip", layers=24, hidden=1024, heads=16, head_dim=64, ffn=4096, activation="quick-GELU",
                normalization="LayerNorm", bias=True, qkv_bias=True, class_token=True),
    TowerPreset(name="siglip", layers=27, hidden=1152, heads=16, head_dim=72, ffn=4304, activation="GELU (tanh)",
                normalization="LayerNorm", bias=True, qkv_bias=True, class_token=False),
)
"""The presets ``examples/multimodal`` builds as a ``CLIPViTModel`` with a plain ViT layer spec (``model.py``:
``get_layer_spec(is_vit=True)`` for ``clip`` and ``siglip``). Left out: ``internvit`` (45 layers of 3200, its heads
padded to the tensor-parallel size, QK norms and layer scales: ``nvlm/internvit.py``'s spec), ``radio``/``radio-g``/
``cradio-g`` (``RADIOViTModel``, 5 to 32 class tokens) and ``internvit300M``, which ``config.py`` sizes but for which
``model.py`` picks no layer spec (its ``RuntimeError("unsupported vision model type")``)."""

LANGUAGE_FFN: dict[str, int] = {"llama3_8b": 14336, "llama3.1_8b": 14336, "mistral_7b": 14336, "yi-34b": 20480,
                                "qwen2.0_72B": 29568, "qwen2.5_7B": 18944, "qwen2.5_72B": 29568, "llama3.2_1b": 8192}
"""``get_language_model_config``'s ``ffn_hidden_size`` per ``--language-model-type``: the SwiGLU decoders that
``get_vision_projection_config`` also knows (``llama3.1_70B`` it does not: a ``ValueError``)."""

PROJECTOR_PRESETS: dict[str, tuple[int, bool, bool]] = {
    "llama3_8b": (14336, False, True), "llama3.1_8b": (4096, True, True), "mistral_7b": (14336, False, False),
    "yi-34b": (20480, False, True), "qwen2.0_72B": (29568, False, True), "qwen2.5_7B": (3584, False, True),
    "qwen2.5_72B": (29568, False, True), "llama3.2_1b": (2048, False, True)}
"""``get_vision_projection_config`` per ``--language-model-type``: ``(ffn_hidden_size, add_bias_linear, a norm before
the first linear)``; every one GELU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VlmParts:
    """A vision tower, its projector and the decoder (:func:`vlm_parts`)."""

    vision: Tower
    language: Tower
    projector: tuple[int, int, int]
    """``(input width, hidden width, output width)`` of the projector's MLP."""
    projector_activation: str
    projector_bias: bool = True
    projector_norms: int = 0
    """Norms with parameters between the tower's last layer and the projector's first linear (a final norm of the
    tower or a norm of the projector's)."""
    tower_pre_norm: bool = True
    """A norm between the patch embedding and the first layer's own (CLIP's ``pre_layrnorm``, ``ln_pre``)."""
    patch: int = 0
    """The patch conv's kernel (``--patch-dim``); the image is ``patch`` times its output rows and columns."""
    image: tuple[int, int] = (0, 0)
    tied_head: bool = False
    """The LM head is the token table (:attr:`TransformerModel.tied_embeddings`)."""


def _activation(graph: OpGraph, mlp: MlpBlock) -> str:
    # as exporters.megatron.families reads a layer's: the first linears and the glue, else the second linear
    read = _mlp_activation_of(graph, (*mlp.fc1, *sorted(mlp.glue))) or _mlp_activation_of(graph, (mlp.fc2,))
    name = _ACTIVATIONS.get(read or "", "an unread activation")
    return "SwiGLU" if mlp.gated and read == "silu" else (f"gated {name}" if mlp.gated else name)


def _norms(graph: OpGraph, start: int, stop: int) -> list[int]:
    """The norms with parameters among ops ``start`` to ``stop`` (exclusive; ops are in the file's order)."""
    return [i for i in range(max(start, 0), stop) if graph.ops[i].kind == "norm" and _count_parameters(graph, graph.ops[i])]


def _biased(graph: OpGraph, ops: list[int]) -> bool:
    return any(_count_parameters(graph, graph.ops[i]) > 1 for i in ops)


def _tower(graph: OpGraph, blocks: list[AttentionBlock], mlps: list[MlpBlock], span: tuple[int, int]) -> Tower:
    first = blocks[0]
    activations = sorted({_activation(graph, m) for m in mlps}) or ["no MLP"]
    norms = [graph.ops[i] for i in _norms(graph, *span)]
    rms = bool(norms) and all(_count_parameters(graph, op) == 1 and not {"LayerNormalization", "Sub"} & set(op.node_types)
                              for op in norms)  # importers.transformer._normalization's rule, on this run's norms
    linears = [i for b in blocks for i in b.out_proj] + [i for m in mlps for i in (*m.fc1, m.fc2)]
    return Tower(layers=len(blocks), hidden=first.hidden_size, heads=first.heads, groups=first.query_groups,
                 head_dim=first.head_dim, seq=first.seq_length, ffn=mlps[0].ffn_hidden_size if mlps else 0,
                 activation=" / ".join(activations), normalization="RMSNorm" if rms else "LayerNorm",
                 bias=_biased(graph, linears),
                 qkv_bias=_biased(graph, [i for b in blocks for g in (b.q_proj, b.k_proj, b.v_proj) for i in g]))


def _width(graph: OpGraph, op: int, axis: int) -> int:
    """Size of the weight's input (``axis`` 0 of ``[in, out]`` as the reader orders it) or output side."""
    operation = graph.ops[op]
    dims = reduction_side_dims(graph, operation) if axis == 0 else output_side_dims(graph, operation)
    size = 1
    for name in dims:
        size *= operation.dim(name).size
    return size


def _runs(model: TransformerModel) -> list[list[AttentionBlock]]:
    """The attention blocks in runs of one shape (width, heads, groups, head size, query length), in order."""
    runs: list[list[AttentionBlock]] = []
    for block in sorted(model.attention, key=lambda b: b.score):
        shape = (block.hidden_size, block.heads, block.query_groups, block.head_dim, block.seq_length)
        last = runs[-1][0] if runs else None
        if last is not None and shape == (last.hidden_size, last.heads, last.query_groups, last.head_dim, last.seq_length):
            runs[-1].append(block)
        else:
            runs.append([block])
    return runs


def _all_mlps(graph: OpGraph, model: TransformerModel, widths: set[int]) -> list[MlpBlock]:
    """The reader's MLPs and those of the other widths: the transformer reader keeps the MLPs of its first attention's
    width only (``importers.transformer._find_mlps``), so a decoder narrower than its tower has none of its own."""
    walker = _Walker.of(graph)
    attention_ops = {i for a in model.attention for group in (a.q_proj, a.k_proj, a.v_proj, a.out_proj, a.position_proj,
                                                               a.glue) for i in group}
    candidates = [i for i in range(len(graph.ops)) if walker.param_mm[i] and i not in attention_ops]
    found = {m.fc2: m for m in model.mlps}
    for width in sorted(widths - {model.attention[0].hidden_size}):
        found.update((m.fc2, m) for m in _find_mlps(walker, candidates, width, []) if m.fc2 not in found)
    return sorted(found.values(), key=lambda m: min(m.fc1))


def _layer_mlps(model: TransformerModel, mlps: list[MlpBlock]) -> dict[int, MlpBlock]:
    """Each attention block's MLP (keyed by its score op): the first MLP after it and before the next block."""
    scores = sorted(b.score for b in model.attention)
    layer_mlps: dict[int, MlpBlock] = {}
    for mlp in mlps:
        owner = max((s for s in scores if s < min(mlp.fc1)), default=None)
        if owner is not None and owner not in layer_mlps:
            layer_mlps[owner] = mlp
    return layer_mlps


def _projector(graph: OpGraph, mlps: list[MlpBlock], start: int, stop: int) -> MlpBlock | None:
    """The projector: the first MLP among ops ``start`` to ``stop`` (the tower's end, the decoder's first layer), else
    the first two parameter matmuls there, in series (LLaVA's ``linear_1``, an activation, ``linear_2``, from the
    tower's width to the decoder's: no MLP of one width to the reader)."""
    between = [m for m in mlps if start < min(m.fc1) < stop]
    if between:
        return between[0]
    linears = [i for i in range(start + 1, stop)
               if graph.ops[i].kind == "matmul" and _count_parameters(graph, graph.ops[i])]
    if len(linears) < 2:
        return None
    first, second = linears[:2]
    return MlpBlock(fc1=(first,), fc2=second, ffn_hidden_size=_width(graph, first, 1), gated=False,
                    glue=frozenset(range(first + 1, second)))


def vlm_parts(graph: OpGraph, model: TransformerModel) -> VlmParts | None:
    """The tower, projector and decoder of a LLaVA-style graph (module docstring), or ``None``: no patch conv, no LM
    head, fewer than two runs of attention layers, or no MLP between the first run and the last."""
    convs = [i for i, op in enumerate(graph.ops) if op.kind == "conv"]
    if model.lm_head is None or not convs or not model.attention:
        return None
    runs = _runs(model)
    if len(runs) < 2:
        return None
    vision, language = runs[0], runs[-1]
    mlps = _all_mlps(graph, model, {vision[0].hidden_size, language[0].hidden_size})
    layer_mlps = _layer_mlps(model, mlps)
    vision_mlps = [layer_mlps[b.score] for b in vision if b.score in layer_mlps]
    tower_end = max([vision_mlps[-1].fc2] if vision_mlps else [max(vision[-1].out_proj)])
    owned = {m.fc2 for m in layer_mlps.values()}
    decoder_start = min((*language[0].q_proj, *language[0].k_proj, *language[0].v_proj))
    projector = _projector(graph, [m for m in mlps if m.fc2 not in owned], tower_end, decoder_start)
    if projector is None:
        return None
    conv = graph.ops[convs[0]]
    first_linear = min((*vision[0].q_proj, *vision[0].k_proj, *vision[0].v_proj))
    return VlmParts(
        vision=_tower(graph, vision, vision_mlps, (convs[0], tower_end + 1)),
        language=_tower(graph, language, [layer_mlps[b.score] for b in language if b.score in layer_mlps],
                        (projector.fc2 + 1, len(graph.ops))),
        projector=(_width(graph, min(projector.fc1), 0), projector.ffn_hidden_size, _width(graph, projector.fc2, 1)),
        projector_activation=_activation(graph, projector),
        projector_bias=_biased(graph, [*projector.fc1, projector.fc2]),
        projector_norms=len(_norms(graph, tower_end + 1, min(projector.fc1))),
        tower_pre_norm=len(_norms(graph, convs[0] + 1, first_linear)) >= 2,
        patch=conv.dim("kh").size, tied_head=model.tied_embeddings,
        image=(conv.dim("oh").size * conv.dim("kh").size, conv.dim("ow").size * conv.dim("kw").size),
    )


def _said(tower: Tower) -> str:
    groups = f" in {tower.groups} query groups" if tower.groups != tower.heads else ""
    return (f"{tower.layers} layers of width {tower.hidden}, {tower.heads} heads of {tower.head_dim}{groups}, "
            f"FFN {tower.ffn} {tower.activation}")


_COMPARED = (("width", "hidden"), ("heads", "heads"), ("query groups", "groups"), ("head size", "head_dim"),
             ("FFN", "ffn"), ("activation", "activation"), ("norm", "normalization"), ("linear biases", "bias"),
             ("QKV biases", "qkv_bias"))


def _differences(vision: Tower, language: Tower) -> list[str]:
    return [f"{name} {_yes(getattr(vision, key))} vs {_yes(getattr(language, key))}" for name, key in _COMPARED
            if getattr(vision, key) != getattr(language, key)]


def _preset_differences(parts: VlmParts, preset: TowerPreset) -> list[str]:
    """What of the graph's tower differs from ``preset`` (the graph's value first)."""
    vision = parts.vision
    patches = (parts.image[0] // parts.patch) * (parts.image[1] // parts.patch) if parts.patch else 0
    read = {"layers": vision.layers, "width": vision.hidden, "heads": vision.heads, "query groups": vision.groups,
            "head size": vision.head_dim, "FFN": vision.ffn, "activation": vision.activation,
            "norm": vision.normalization, "linear biases": vision.bias, "QKV biases": vision.qkv_bias,
            "class token": vision.seq == patches + 1, "ln_pre": parts.tower_pre_norm}
    wanted = {"layers": preset.layers, "width": preset.hidden, "heads": preset.heads, "query groups": preset.heads,
              "head size": preset.head_dim, "FFN": preset.ffn, "activation": preset.activation,
              "norm": preset.normalization, "linear biases": preset.bias, "QKV biases": preset.qkv_bias,
              "class token": preset.class_token, "ln_pre": preset.name == "clip"}
    said = [f"{name} {_yes(read[name])} vs {_yes(wanted[name])}" for name in read if read[name] != wanted[name]]
    if vision.layers == preset.layers - 1:  # the ONNX file holds the layers that are read, no more
        said[0] += (f" (a tower read at its second-to-last layer, LLaVA-1.5's vision_feature_layer=-2, keeps "
                    f"{vision.layers} in the file, and {preset.name} runs and projects all {preset.layers})")
    return said


def nearest_preset(parts: VlmParts) -> tuple[TowerPreset, list[str]]:
    """The ``--vision-model-type`` preset whose tower differs from the graph's in fewest fields (the first of
    :data:`TOWER_PRESETS` on a tie), and those differences."""
    found = [(preset, _preset_differences(parts, preset)) for preset in TOWER_PRESETS]
    return min(found, key=lambda pair: len(pair[1]))


def _norm_count(norms: int) -> str:
    return "it has no norm" if norms == 0 else f"it has {norms} norms"


def _yes(value: object) -> object:
    return ("yes" if value else "no") if isinstance(value, bool) else value


def _pretrain_vlm_clause(parts: VlmParts) -> str:
    """What ``pretrain_vlm.py`` builds beside this graph (module docstring), or ``""`` where it is the graph."""
    vision, language = parts.vision, parts.language
    wide, ffn, out = parts.projector
    what = []
    differ = _differences(vision, language)
    if differ:
        what.append(f"its vision tower's layers differ from its decoder's ({'; '.join(differ)})")
    if (ffn, parts.projector_activation, parts.projector_bias) != (language.ffn, language.activation, language.bias):
        what.append(f"its projector is {wide} -> {ffn} -> {out} {parts.projector_activation}, not the decoder's MLP "
                    f"({wide} -> {language.ffn} -> {out} {language.activation})")
    if parts.projector_norms != 1:
        what.append(f"{_norm_count(parts.projector_norms)} between its tower's last layer and its projector's first "
                    "linear, where pretrain_vlm.py's projector (the decoder layer spec's MLP) has one with Transformer "
                    "Engine (TELayerNormColumnParallelLinear; the default --transformer-impl) and none only with "
                    "--transformer-impl local, whose tower attends causally (get_vit_layer_with_local_spec)")
    if parts.tied_head:  # megatron-core 0.16.1 llava_model.py: share_embeddings_and_output_weights: bool = False
        what.append("its LM head is its token table, and pretrain_vlm.py never ties them (it does not pass LLaVAModel's "
                    "share_embeddings_and_output_weights, False by default)")
    return " and ".join(what)


def _projector_presets(parts: VlmParts, norms: int) -> list[str]:
    """The ``--language-model-type`` values whose projector and decoder are this graph's (module docstring)."""
    wide, ffn, out = parts.projector
    language = parts.language
    return [name for name, (preset_ffn, bias, norm) in PROJECTOR_PRESETS.items()
            if (preset_ffn, bias, int(norm)) == (ffn, parts.projector_bias, norms) and parts.projector_activation == "GELU"
            and (language.activation, language.bias, language.ffn) == ("SwiGLU", False, LANGUAGE_FFN[name])]


def _multimodal_clause(parts: VlmParts) -> str:
    """What ``examples/multimodal`` builds beside this graph, or ``""`` where a preset pair is the graph."""
    preset, differ = nearest_preset(parts)
    norms = parts.projector_norms - (preset.name == "siglip")  # SigLIP's ln_post sits in the tower
    what = [f"its tower is not a preset: the nearest, {preset.name} ({preset.layers} layers of width {preset.hidden}, "
            f"{preset.heads} heads of {preset.head_dim}, FFN {preset.ffn} {preset.activation}), differs in "
            + "; ".join(differ)] if differ else []
    if not _projector_presets(parts, norms):
        wide, ffn, out = parts.projector
        biases = "with" if parts.projector_bias else "without"
        what.append(f"no --language-model-type pairs a projector {wide} -> {ffn} -> {out} {parts.projector_activation} "
                    f"{biases} biases and {max(norms, 0)} norms before it with a decoder of FFN {parts.language.ffn} "
                    f"{parts.language.activation}: each type fixes the projector's FFN and the decoder's, and only "
                    f"mistral_7b's projector has no norm (GELU, FFN 14336, no biases, beside a SwiGLU decoder of FFN 14336)")
    return " and ".join(what)


def vlm_refusal(graph: OpGraph, model: TransformerModel) -> str | None:
    """Why neither of Megatron-LM's LLaVA launchers (``pretrain_vlm.py``, ``examples/multimodal``) trains this
    LLaVA-style graph, one clause naming the tower, the projector, the decoder and, per launcher, what it builds
    instead (module docstring); ``None`` when the graph is not one."""
    parts = vlm_parts(graph, model)
    if parts is None:
        return None
    vision, language = parts.vision, parts.language
    wide, ffn, out = parts.projector
    own, multimodal = _pretrain_vlm_clause(parts), _multimodal_clause(parts)
    said = (f"it is a vision-language model (LLaVA-style): a vision tower of {_said(vision)} over {vision.seq} "
            f"positions ({parts.patch}-pixel patches of a {parts.image[0]} x {parts.image[1]} image), a projector "
            f"{wide} -> {ffn} -> {out} {parts.projector_activation} and a decoder of {_said(language)}; megatron-core "
            "0.16.1's LLaVAModel takes separate configs for them, but Megatron-LM's launchers fill them from flags")
    if not own or not multimodal:  # the parts are one launcher's: its launch is not written by this exporter
        launcher = "pretrain_vlm.py" if not own else "examples/multimodal/train.py"
        return f"{said}; they are what {launcher} builds, but this exporter does not write its launch"
    return (f"{said}: pretrain_vlm.py builds the tower's layers and the projector from the decoder's config (only "
            f"--encoder-num-layers differs; the projector is the decoder's MLP), and {own}; examples/multimodal builds "
            f"the tower from a --vision-model-type preset and the projector and the decoder's FFN from "
            f"--language-model-type presets, and {multimodal}")
