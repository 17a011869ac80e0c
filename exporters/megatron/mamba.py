r"""Megatron-LM's Mamba family: ``pretrain_mamba.py`` with megatron-core's ``MambaModel`` (core_v0.16.1)
for Mamba-2 and hybrid Mamba-2 / attention / MLP stacks (issue 25), or the one-line reason not. Its launch plan is
:func:`exporters.megatron.export.export_hybrid`'s.

The stack is read by :func:`importers.hybrid.analyze_hybrid`: its layer kinds in order become
``--hybrid-override-pattern`` (``M`` Mamba-2, ``*`` attention, ``-`` MLP; megatron-core's
``mamba_hybrid_layer_allocation.Symbols``), the mixer's sizes ``--mamba-num-heads``,
``--mamba-head-dim``, ``--mamba-num-groups`` and ``--mamba-state-dim`` (``TransformerConfig`` fields of
the same names), and the layer spec is ``--spec megatron.core.models.mamba.mamba_layer_specs
mamba_stack_spec``, the one Megatron-LM's ``examples/mamba`` scripts pass (``pretrain_mamba.py``
builds no model without a spec). Attention layers have no position embeddings
(``--position-embedding-type none``, Nemotron-H's) or rotary ones in every attention layer
(``--position-embedding-type rope``, :mod:`exporters.megatron.mamba_rotary`), MLP layers are GELU (the default), squared ReLU
(``--squared-relu``) or SwiGLU (``--swiglu``), MoE layers ``E`` with the GPT family's MoE flags
(:mod:`exporters.megatron.mamba_moe`: at ``tp > 1`` with ``--sequence-parallel`` only).

Refused, one clause each (:func:`hybrid_refusals`): a layer whose parameters are not what
megatron-core builds for its kind (biases, experts, a norm over other groups: the count is checked
layer by layer), a conv of other than :data:`MAMBA_CONV_KERNEL` taps, other MLP activations,
non-causal attention, rotary embeddings ``MambaModel`` would not compute alike (some attention layers not
rotating, frequencies no flag says: :func:`~exporters.megatron.mamba_rotary.hybrid_rotary`), layers that are not
pre-norm. Plans: data parallelism with ZeRO-0/1 (``--use-distributed-optimizer``) or
Megatron-FSDP, no full recomputation or activation offload (:func:`settings_refusal`), ``cp = 1``;
pipeline stages (1F1B, ZeRO-0/1) where ``MambaStack`` places the plan's stages: whole layers, the
middle stages even (:func:`hybrid_stage_layers`: ``--pipeline-model-parallel-size`` and the
first / last stage's count; the full ``--hybrid-override-pattern`` goes to every rank, which keeps its slice). Tensor parallelism (``tp > 1``, with or without ``--sequence-parallel``) is megatron-core's
layout of each layer kind, per op in :mod:`exporters.megatron.mamba_tp` (heads and groups of the
mixer split over ``tp``, ``in_proj`` column- and ``out_proj`` row-parallel), refused in one line
where ``tp`` does not divide what megatron-core divides (:func:`~exporters.megatron.mamba_tp.tp_refusal`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from exporters._common import describe_config, dominant_factor, samples_per_rank, torchrun_nodes
from exporters._target import Family, divisors, pipeline_launches, worlds
from exporters._moe_layout import layer_norm_epsilons
from exporters.megatron.families import MEGATRON_NORM_EPSILON, FamilyExport
from exporters.megatron.mamba_moe import moe_tp_refusal
from exporters.megatron.mamba_rotary import hybrid_rotary
from exporters.megatron.mamba_tp import hybrid_rules, tp_refusal
from exporters.megatron.window import unread_window_refusal
from exporters.elsewhere import ELSEWHERE
from exporters._tp import MaskResult, TpLayout, layout_masks, pure_data_parallel_masks
from importers.hybrid import HybridStack, analyze_hybrid
from importers.transformer import LayerFeatures
from planner.core.errors import UnsupportedExport

if TYPE_CHECKING:
    from exporters.generic import PlanInput
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph

__all__ = ["MAMBA_SCRIPT", "MAMBA_SPEC", "MAMBA_CONV_KERNEL", "hybrid_stack", "hybrid_refusals", "model_view",
           "hybrid_model_args", "hybrid_masks", "hybrid_mask_result", "hybrid_families", "hybrid_launch", "settings_refusal",
           "hybrid_stage_layers", "hybrid_stage_rule"]

MAMBA_SCRIPT = "pretrain_mamba.py"
"""Megatron-LM's training script for ``MambaModel`` (repository root, core_v0.16.1)."""

MAMBA_SPEC = ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")
"""``--spec``: the module and the ``ModuleSpec`` of the stack (Megatron-LM ``examples/mamba/train.sh``)."""

MAMBA_CONV_KERNEL = 4
"""``MambaMixer.__init__(d_conv=4)`` in megatron-core 0.16.1 (``ssm/mamba_mixer.py``); the stack spec
passes no other, and there is no flag for it."""

_STACKS: "OrderedDict[int, tuple[OpGraph, HybridStack | None]]" = OrderedDict()


def hybrid_stack(graph: OpGraph) -> HybridStack | None:
    """:func:`~importers.hybrid.analyze_hybrid` of ``graph``, kept for the last few graphs (by identity,
    as ``analyze_transformer`` keeps its own: the search asks once per family)."""
    cached = _STACKS.get(id(graph))
    if cached is not None and cached[0] is graph:
        return cached[1]
    stack = analyze_hybrid(graph)
    _STACKS[id(graph)] = (graph, stack)
    while len(_STACKS) > 4:
        _STACKS.popitem(last=False)
    return stack


def hybrid_refusals(stack: HybridStack, graph: OpGraph | None = None) -> list[str]:
    """What megatron-core 0.16.1's ``MambaModel`` cannot build of ``stack``, one clause each (``graph``, where
    given, lets the rotary embedding be read: :func:`~exporters.megatron.mamba_rotary.hybrid_rotary`)."""
    out = list(stack.irregular)
    if stack.mamba is not None and stack.mamba.conv_kernel != MAMBA_CONV_KERNEL:
        out.append(f"its Mamba conv spans {stack.mamba.conv_kernel} tokens and megatron-core's MambaMixer "
                   f"{MAMBA_CONV_KERNEL} (d_conv has no flag)")
    if stack.mlp in ("relu", "other"):
        out.append(f"its MLP activation ({'ReLU' if stack.mlp == 'relu' else 'neither GELU, squared ReLU nor SwiGLU'}) "
                   "is none of Megatron's GELU, --squared-relu and --swiglu")
    if not stack.causal:
        out.append("its attention is not proven causal and MambaModel's is")
    scale = stack.attention_scale  # DotProductAttention: 1 / sqrt(kv_channels) unless TransformerConfig.softmax_scale
    if scale is not None and stack.kv_channels and not math.isclose(scale, stack.kv_channels ** -0.5, rel_tol=1e-3):
        out.append(f"it scales the attention scores by {scale:.6g}, not 1/sqrt({stack.kv_channels}) of its head size "
                   "(Granite's attention_multiplier), and MambaModel's attention as exported scales by 1/sqrt(head size)")
    if stack.stream_scales:  # megatron-core 0.16.1 models/mamba/mamba_model.py: no factor on any of them
        where = {"embedding": "the token embedding", "attention output": "a layer's output before its residual add",
                 "logits": "the logits"}
        out.append(f"it scales {' and '.join(where[w] for w in stack.stream_scales)} by a constant (Granite's "
                   "embedding_multiplier, residual_multiplier and logits_scaling), and megatron-core 0.16.1's MambaModel "
                   "scales none of them")
    if stack.rotary and (rotary := hybrid_rotary(stack, graph).refusal):
        out.append(rotary)
    epsilons = layer_norm_epsilons(graph) if graph is not None else None
    if epsilons and any(np.float32(e) != np.float32(MEGATRON_NORM_EPSILON) for e in epsilons):
        # megatron-core 0.16.1 ssm/mamba_mixer.py:355-357: the gated norm is ExtendedRMSNorm(..., eps=1e-5), no flag
        out.append(f"its norms add epsilon {', '.join(f'{e:g}' for e in epsilons)}, and megatron-core 0.16.1's "
                   f"MambaMixer builds its gated RMSNorm with eps={MEGATRON_NORM_EPSILON:g}, which no flag changes (the "
                   "hybrid export writes no --norm-epsilon either)")
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class _ModelView:
    """A stack as the fields :func:`~exporters.megatron.export.megatron_args` reads of a
    ``TransformerModel``, so the parallel, batch and size flags are the GPT family's own code."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    seq_length: int
    position_table_rows: int
    """The sequence length: no rotary flag, ``--max-position-embeddings`` the sequence."""
    gated_mlp: bool
    normalization: str
    tied_embeddings: bool
    linear_bias: bool = False
    qkv_bias: bool = False
    lm_head: int = 0
    """Any op index: the stack ends in an LM head (:func:`importers.hybrid.analyze_hybrid` checks it)."""
    features: LayerFeatures = LayerFeatures()
    """Not read from a hybrid stack (:func:`importers.hybrid.analyze_hybrid` finds sizes only): no QK-norm flag."""


def model_view(stack: HybridStack) -> _ModelView:
    """:class:`_ModelView` of ``stack``. A pure Mamba stack still passes ``--num-attention-heads``
    (``TransformerConfig`` requires it): 1, with an FFN of 4 x hidden (Megatron's default), describe no
    layer of it."""
    heads = stack.num_attention_heads or 1
    return _ModelView(
        num_layers=stack.num_layers, hidden_size=stack.hidden_size,
        ffn_hidden_size=stack.ffn_hidden_size or 4 * stack.hidden_size, num_attention_heads=heads,
        num_query_groups=stack.num_query_groups or heads, head_dim=stack.kv_channels or stack.hidden_size // heads,
        seq_length=stack.seq_length, position_table_rows=stack.seq_length, gated_mlp=stack.mlp == "swiglu",
        normalization=stack.normalization, tied_embeddings=stack.tied_embeddings,
    )


def settings_refusal(recompute: str, offload: str) -> str | None:
    """Why ``MambaModel`` does not run these settings as priced, or ``None``: megatron-core 0.16.1's
    ``MambaStack`` (``ssm/mamba_block.py``) reads no recompute setting and opens no CPU-offload context,
    so full recomputation and activation offload would run as plain training (selective recomputation
    is the attention layers' own, ``Attention.checkpoint_core_attention``)."""
    if recompute == "full":
        return ("megatron-core 0.16.1's MambaStack checkpoints no layers, so --recompute-granularity full would "
                "train without recomputation; plan with --fix recompute=selective")
    if offload == "activations":
        return ("megatron-core 0.16.1's MambaStack offloads no activations (no CPU-offload context); plan without "
                "--fix offload=activations")
    return None


def hybrid_model_args(stack: HybridStack, graph: OpGraph | None = None) -> list[str]:
    """The flags only the Mamba family takes: the position embeddings (none, or rotary as ``graph`` shows them:
    :func:`~exporters.megatron.mamba_rotary.hybrid_rotary`), the MLP's squared ReLU, the layer pattern, the
    mixer's sizes and the stack spec (module docstring)."""
    mamba = stack.mamba
    assert mamba is not None
    return [*hybrid_rotary(stack, graph).args, *(["--squared-relu"] if stack.mlp == "squared-relu" else []),
            "--hybrid-override-pattern", stack.pattern,
            "--mamba-num-heads", str(mamba.num_heads), "--mamba-head-dim", str(mamba.head_dim),
            "--mamba-num-groups", str(mamba.num_groups), "--mamba-state-dim", str(mamba.state_dim),
            "--spec", *MAMBA_SPEC]


def hybrid_masks(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, dp: int, tp: int, sequence_parallel: bool = False, cp: int = 1,
    devices_per_node: int | None = None,
) -> list[np.ndarray] | None:
    """Per op, the configurations Megatron-LM runs the stack with at ``dp x tp`` (``cp = 1`` only, module
    docstring); ``None`` when it cannot, or builds a different model (:func:`hybrid_mask_result`)."""
    stack = hybrid_stack(graph)
    if stack is None or hybrid_refusals(stack, graph) or _window_refusal(graph) or cp > 1:
        return None
    return hybrid_mask_result(graph, spaces, stack, dp=dp, tp=tp, sequence_parallel=sequence_parallel,
                              devices_per_node=devices_per_node).masks


def hybrid_mask_result(
    graph: OpGraph, spaces: Sequence[ConfigSpace], stack: HybridStack, *, dp: int, tp: int,
    sequence_parallel: bool = False, devices_per_node: int | None = None,
) -> MaskResult:
    """The masks of :func:`hybrid_masks` with the reason when there are none, and the ops priced
    replicated over ``tp`` where megatron-core splits them (:mod:`exporters.megatron.mamba_tp`). ``tp = 1``:
    every op splits its batch dims ``dp`` ways; ``tp > 1``: the rules of
    :func:`~exporters.megatron.mamba_tp.hybrid_rules`, tensor-parallel ranks innermost on a node."""
    if tp == 1 and not sequence_parallel:
        return pure_data_parallel_masks(graph, spaces, dp=dp)
    why = tp_refusal(stack, tp) or moe_tp_refusal(stack, tp, sequence_parallel)
    if why:
        return MaskResult(masks=None, reason=why)
    layout = TpLayout(target="megatron", model=None, rules=hybrid_rules(graph))  # type: ignore[arg-type]
    # (layout_masks reads the rules only; a hybrid stack has no TransformerModel)
    return layout_masks(graph, spaces, layout, dp=dp, tp=tp, sequence_parallel=sequence_parallel,
                        devices_per_node=devices_per_node or dp * tp)


def _window_refusal(graph: OpGraph) -> str:
    """A sliding window read from the file (:mod:`exporters.megatron.window`), not written for a hybrid
    stack: which of its layers ``--window-attn-skip-freq`` counts is not checked here. A window whose
    width the file does not hold is refused too (``unread_window_refusal``)."""
    if not graph.attention_windows:
        return unread_window_refusal(graph)
    return (f"its attention layers attend within a sliding window of {min(graph.attention_windows.values())} tokens "
            "and the hybrid export writes full causal attention")


def hybrid_families(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, pp: int, degrees: tuple[int, int] | None = None,
    devices_per_node: int | None = None,
) -> list[Family]:
    """One ``dp x tp`` family (``sp``: with sequence parallelism) per split of a stage of ``devices`` that
    :func:`hybrid_masks` has masks for (``degrees``: only that ``(dp, tp)``)."""
    found = []
    for world in worlds(devices, pp):
        for tp in divisors(world):
            dp = world // tp
            if degrees is not None and degrees != (dp, tp):
                continue
            for sp in (False, True) if tp > 1 else (False,):
                masks = hybrid_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp, devices_per_node=devices_per_node)
                if masks is not None:
                    found.append(Family(label=f"dp={dp} x tp={tp}" + (" sp" if sp else ""), tp=tp, dp=dp, sp=sp,
                                        masks=tuple(masks)))
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridLaunch:
    """A checked ``dp x tp x pp`` launch of a stack (:func:`hybrid_launch`)."""

    stack: HybridStack
    dp: int
    tp: int
    sequence_parallel: bool
    nnodes: int
    per_node: int
    """Processes per node (torchrun's ``--nproc-per-node``)."""
    micro_batch: int
    pp: int = 1
    stage_layers: tuple[int, ...] | None = None
    """Megatron layers (letters of ``--hybrid-override-pattern``) of each pipeline stage; ``None``: one stage."""
    replicated: tuple[str, ...] = ()
    """Ops the plan holds whole on every tp rank where megatron-core splits them (a ``Split`` of
    ``in_proj``'s or the conv's channels, :mod:`exporters.megatron.mamba_tp`; a vocabulary ``tp`` does not
    divide, which Megatron pads), for the notes."""
    family: FamilyExport = FamilyExport(family="mamba", script=MAMBA_SCRIPT)
    """Read by :func:`exporters.megatron.export._command` (the script torchrun launches)."""


def hybrid_launch(plan_input: PlanInput, stack: HybridStack) -> HybridLaunch:
    """The ``dp x tp`` launch of ``plan_input``, or :class:`UnsupportedExport` at the first rule broken."""
    why = hybrid_refusals(stack, plan_input.graph) + [p for p in (_window_refusal(plan_input.graph),) if p]
    if why:
        raise UnsupportedExport(f"Megatron-LM's MambaModel ({MAMBA_SCRIPT}) would train a different model: "
                                + "; ".join(why) + ELSEWHERE)
    unsupported = settings_refusal(plan_input.settings.recompute, plan_input.settings.offload)
    if unsupported:
        raise UnsupportedExport(unsupported)
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    rules = hybrid_rules(graph)
    pipeline = plan_input.pipeline if plan_input.pipeline is not None and plan_input.pipeline.pp > 1 else None
    stage_layers = hybrid_stage_layers(plan_input, stack) if pipeline is not None else None
    dp = dominant_factor(graph, spaces, choice, batch=True)
    # tp as the layers' linears and the conv split (the LM head may stay whole: a vocabulary tp does not divide)
    tp = dominant_factor(graph, spaces, choice, batch=False, ops=[i for i, r in enumerate(rules) if r.required])
    sp = _sequence_parallel(plan_input, rules, tp)
    shown = f"dp={dp} x tp={tp}{' with sequence parallelism' if sp else ''}"
    result = hybrid_mask_result(graph, spaces, stack, dp=dp, tp=tp, sequence_parallel=sp,
                                devices_per_node=plan_input.cluster.devices_per_node)
    if result.masks is None:
        raise UnsupportedExport(f"Megatron-LM cannot run {shown} on this model: {result.reason}")
    for index, (mask, row) in enumerate(zip(result.masks, choice)):
        if not mask[row]:
            op, space = graph.ops[index], spaces[index]
            raise UnsupportedExport(
                f"op {op.name} is split {describe_config(op, space, row)}; Megatron-LM at {shown} splits it "
                f"{describe_config(op, space, int(np.flatnonzero(mask)[0]))}")
    pp = 1 if pipeline is None else pipeline.pp
    if pipeline is not None and dp * tp != pipeline.devices_per_stage:
        raise UnsupportedExport(f"the plan runs dp={dp} x tp={tp} on stages of {pipeline.devices_per_stage} devices, "
                                "leaving some idle; Megatron-LM gives every stage dp x tp ranks")
    nnodes, per_node = torchrun_nodes(dp * tp * pp, plan_input.cluster.devices_per_node)
    replicated = tuple(graph.ops[i].name for i in result.replicated_fallbacks)
    return HybridLaunch(stack=stack, dp=dp, tp=tp, sequence_parallel=sp, nnodes=nnodes, per_node=per_node,
                        micro_batch=samples_per_rank(plan_input, dp, pipeline), replicated=replicated if tp > 1 else (),
                        pp=pp, stage_layers=stage_layers)


def _sequence_parallel(plan_input: PlanInput, rules: Sequence, tp: int) -> bool:
    """Whether the plan splits the norms and residual ops along the sequence (Megatron's
    ``--sequence-parallel``: all of them or none, and only with ``tp > 1``)."""
    spaces, choice = plan_input.spaces, plan_input.strategy.choice
    split = {i: int(spaces[i].factors[choice[i], spaces[i].dim_names.index(rule.sequence)]) > 1
             for i, rule in enumerate(rules) if rule.sequence is not None and rule.sequence_required}
    if tp == 1 or not any(split.values()):
        return False
    if not all(split.values()):
        whole = plan_input.graph.ops[next(i for i, done in split.items() if not done)]
        raise UnsupportedExport(f"the plan splits some norms, residual ops and MoE routers along the sequence and not "
                                f"others (not {whole.name}); Megatron-LM's --sequence-parallel splits every one")
    return True


def hybrid_stage_layers(plan_input: PlanInput, stack: HybridStack) -> tuple[int, ...]:
    """The layers (pattern letters) of each pipeline stage of ``plan_input`` as megatron-core 0.16.1's
    ``MambaStack._select_layers_for_pipeline_parallel`` places them, or :class:`UnsupportedExport`.

    ``MambaStack`` takes ``num_layers // pp`` layers per rank, or ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers`` on the first / last rank and the rest evenly in between; it
    asserts no virtual pipeline ("does not currently support virtual/interleaved pipeline parallelism")
    and reads no ``--pipeline-model-parallel-layout``. Every layer (the ops after one residual add up to
    the next) must lie in one stage; the stage's layers are counted by their residual adds
    (:attr:`~importers.hybrid.HybridStack.residual_adds`)."""
    pipeline = plan_input.pipeline
    assert pipeline is not None
    if pipeline.schedule != "1f1b" or pipeline.chunks > 1:
        raise UnsupportedExport(f"megatron-core 0.16.1's MambaStack runs the 1F1B schedule without virtual stages "
                                f"(not {pipeline.schedule}, {pipeline.chunks} chunk(s)); plan with --schedule 1f1b")
    if pipeline.zero_stage >= 2:
        raise UnsupportedExport("Megatron-LM runs ZeRO-2/3 as Megatron-FSDP, not with pipeline parallelism; plan with "
                                "--zero 0 or 1 for pp > 1")
    ops, ends = plan_input.graph.ops, stack.residual_adds  # an MoE layer's routed + shared sum is no layer's end
    stage_of = {op: stage.index for stage in pipeline.stages for op in stage.ops}
    counts = [0] * pipeline.pp
    start = next(i for i, op in enumerate(ops) if op.kind == "embedding") + 1
    for layer, end in enumerate(ends):
        if len({stage_of.get(i) for i in range(start, end + 1)}) != 1:
            raise UnsupportedExport(f"the pipeline cuts layer {layer} ({stack.pattern[layer]}) of the stack inside; "
                                    "MambaStack places whole layers")
        counts[stage_of[end]] += 1
        start = end + 1
    if len(ends) != stack.num_layers or 0 in counts:
        raise UnsupportedExport(f"the pipeline's stages hold {counts} of the stack's {stack.num_layers} layers; MambaStack "
                                "gives every stage at least one")
    middle = counts[1:-1]
    if len(set(middle)) > 1:
        raise UnsupportedExport(f"the stages hold {counts} layers; MambaStack splits the middle stages evenly (only the "
                                "first and last may differ: --decoder-first/last-pipeline-num-layers)")
    return tuple(counts)


def hybrid_stage_rule(family: Family, plan_input: PlanInput) -> bool:
    """:func:`exporters.megatron.rules.stage_rule` for a stack: the pipeline launches (whole nodes, the
    micro-batch split over ``dp``), its micro-batch is the plan's, whole micro-batches make the step, the
    settings run (:func:`settings_refusal`) and :func:`hybrid_stage_layers` places its stages."""
    pipeline, stack = plan_input.pipeline, hybrid_stack(plan_input.graph)
    assert pipeline is not None and stack is not None
    per_pass, dp = plan_input.samples_per_pass, family.dp or 1
    settings = plan_input.settings
    if not (pipeline_launches(family, plan_input) and per_pass // dp == pipeline.micro_batch
            and plan_input.samples_per_step % per_pass == 0 and settings_refusal(settings.recompute, settings.offload) is None):
        return False
    try:
        hybrid_stage_layers(plan_input, stack)
    except UnsupportedExport:
        return False
    return True
