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
(``--position-embedding-type none``, Nemotron-H's), MLP layers are GELU (the default), squared ReLU
(``--squared-relu``) or SwiGLU (``--swiglu``).

Refused, one clause each (:func:`hybrid_refusals`): a layer whose parameters are not what
megatron-core builds for its kind (biases, experts, a norm over other groups: the count is checked
layer by layer), a conv of other than :data:`MAMBA_CONV_KERNEL` taps, other MLP activations,
non-causal attention, rotary embeddings (the graph does not show which layers rotate), layers that
are not pre-norm. Plans: data parallelism with ZeRO-0/1 (``--use-distributed-optimizer``) or
Megatron-FSDP, one pipeline stage, no full recomputation or activation offload (:func:`settings_refusal`),
``tp = cp = 1``: megatron-core splits a mixer by heads and groups
over ``tp``, a layout the planner does not price yet, so such rows are not listed rather than
exported as something else.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from exporters._common import launcher_degrees, describe_config, samples_per_rank, torchrun_nodes
from exporters._target import Family, worlds
from exporters.megatron.families import FamilyExport
from exporters.megatron.window import unread_window_refusal
from exporters._tp import pure_data_parallel_masks
from importers.hybrid import HybridStack, analyze_hybrid
from importers.transformer import LayerFeatures
from planner.core.errors import UnsupportedExport

if TYPE_CHECKING:
    from exporters.generic import PlanInput
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph

__all__ = ["MAMBA_SCRIPT", "MAMBA_SPEC", "MAMBA_CONV_KERNEL", "hybrid_stack", "hybrid_refusals", "model_view",
           "hybrid_model_args", "hybrid_masks", "hybrid_families", "hybrid_launch", "settings_refusal"]

MAMBA_SCRIPT = "pretrain_mamba.py"
"""Megatron-LM's training script for ``MambaModel`` (repository root, core_v0.16.1)."""

MAMBA_SPEC = ("megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec")
"""``--spec``: the module and the ``ModuleSpec`` of the stack (Megatron-LM ``examples/mamba/train.sh``)."""

MAMBA_CONV_KERNEL = 4
"""``MambaMixer.__init__(d_conv=4)`` in megatron-core 0.16.1 (``ssm/mamba_mixer.py``); the stack spec
passes no other, and there is no flag for it."""

_ELSEWHERE = "; export with --target deepspeed (ZeRO data parallelism) or as the generic plan"

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


def hybrid_refusals(stack: HybridStack) -> list[str]:
    """What megatron-core 0.16.1's ``MambaModel`` cannot build of ``stack``, one clause each."""
    out = list(stack.irregular)
    if stack.mamba is not None and stack.mamba.conv_kernel != MAMBA_CONV_KERNEL:
        out.append(f"its Mamba conv spans {stack.mamba.conv_kernel} tokens and megatron-core's MambaMixer "
                   f"{MAMBA_CONV_KERNEL} (d_conv has no flag)")
    if stack.mlp in ("relu", "other"):
        out.append(f"its MLP activation ({'ReLU' if stack.mlp == 'relu' else 'neither GELU, squared ReLU nor SwiGLU'}) "
                   "is none of Megatron's GELU, --squared-relu and --swiglu")
    if not stack.causal:
        out.append("its attention is not proven causal and MambaModel's is")
    if stack.rotary:
        out.append("it computes rotary embeddings, and which of its attention layers rotate is not read "
                   "(MambaModel rotates all or none: --position-embedding-type rope or none)")
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


def hybrid_model_args(stack: HybridStack) -> list[str]:
    """The flags only the Mamba family takes: no position embeddings, the MLP's squared ReLU, the
    layer pattern, the mixer's sizes and the stack spec (module docstring)."""
    mamba = stack.mamba
    assert mamba is not None
    return ["--position-embedding-type", "none", *(["--squared-relu"] if stack.mlp == "squared-relu" else []),
            "--hybrid-override-pattern", stack.pattern,
            "--mamba-num-heads", str(mamba.num_heads), "--mamba-head-dim", str(mamba.head_dim),
            "--mamba-num-groups", str(mamba.num_groups), "--mamba-state-dim", str(mamba.state_dim),
            "--spec", *MAMBA_SPEC]


def hybrid_masks(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, dp: int, tp: int, sequence_parallel: bool = False, cp: int = 1,
) -> list[np.ndarray] | None:
    """Per op, the configurations Megatron-LM runs the stack with at ``dp`` (``tp = cp = 1`` only, module
    docstring); ``None`` when it cannot, or builds a different model."""
    stack = hybrid_stack(graph)
    if stack is None or hybrid_refusals(stack) or _window_refusal(graph) or tp > 1 or cp > 1 or sequence_parallel:
        return None
    return pure_data_parallel_masks(graph, spaces, dp=dp).masks


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
) -> list[Family]:
    """One ``dp x tp=1`` family per data-parallel size of a stage of ``devices`` (``degrees``: only
    ``(dp, 1)``)."""
    found = []
    for dp in worlds(devices, pp):
        if degrees is not None and degrees != (dp, 1):
            continue
        masks = hybrid_masks(graph, spaces, dp=dp, tp=1)
        if masks is not None:
            found.append(Family(label=f"dp={dp} x tp=1", tp=1, dp=dp, masks=tuple(masks)))
    return found


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridLaunch:
    """A checked data-parallel launch of a stack (:func:`hybrid_launch`)."""

    stack: HybridStack
    dp: int
    nnodes: int
    per_node: int
    """Processes per node (torchrun's ``--nproc-per-node``)."""
    micro_batch: int
    family: FamilyExport = FamilyExport(family="mamba", script=MAMBA_SCRIPT)
    """Read by :func:`exporters.megatron.export._command` (the script torchrun launches)."""


def hybrid_launch(plan_input: PlanInput, stack: HybridStack) -> HybridLaunch:
    """The data-parallel launch of ``plan_input``, or :class:`UnsupportedExport` at the first rule broken."""
    why = hybrid_refusals(stack) + [p for p in (_window_refusal(plan_input.graph),) if p]
    if why:
        raise UnsupportedExport(f"Megatron-LM's MambaModel ({MAMBA_SCRIPT}) would train a different model: "
                                + "; ".join(why) + _ELSEWHERE)
    unsupported = settings_refusal(plan_input.settings.recompute, plan_input.settings.offload)
    if unsupported:
        raise UnsupportedExport(unsupported)
    pipeline = plan_input.pipeline
    if pipeline is not None and pipeline.pp > 1:
        raise UnsupportedExport(
            f"the Megatron export of a Mamba/hybrid stack runs one pipeline stage (the planner does not cut "
            f"--hybrid-override-pattern per stage yet); plan with --fix pp=1")
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    dp, other = launcher_degrees(graph, spaces, choice, None)
    if other > 1:
        raise UnsupportedExport(
            f"the plan splits the model {other} ways beyond the batch; the Megatron export of Mamba/hybrid stacks "
            "is data-parallel (megatron-core splits a mixer by heads and groups over tp, which the planner does "
            "not price yet); plan with --fix tp=1")
    result = pure_data_parallel_masks(graph, spaces, dp=dp)
    masks = result.masks
    if masks is None:
        raise UnsupportedExport(f"Megatron-LM cannot run dp={dp} on this model: {result.reason}")
    for index, (mask, row) in enumerate(zip(masks, choice)):
        if not mask[row]:
            op, space = graph.ops[index], spaces[index]
            raise UnsupportedExport(
                f"op {op.name} is split {describe_config(op, space, row)}; Megatron-LM at dp={dp} splits it "
                f"{describe_config(op, space, int(np.flatnonzero(mask)[0]))}")
    nnodes, per_node = torchrun_nodes(dp, plan_input.cluster.devices_per_node)
    return HybridLaunch(stack=stack, dp=dp, nnodes=nnodes, per_node=per_node,
                        micro_batch=samples_per_rank(plan_input, dp, None))
