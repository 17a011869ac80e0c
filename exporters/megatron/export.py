r"""Megatron-LM exporter: the torchrun command line, arguments and environment of a strategy.

Megatron-LM runs one pattern: every layer the same ``dp x tp`` on every pipeline stage, QKV and FC1
column-parallel (their weight's output dim split ``tp`` ways), the output projection and FC2
row-parallel (their reduction dim split), attention split by heads, a vocabulary-parallel embedding
and LM head, norms and residual ops replicated over ``tp`` or, with ``--sequence-parallel``, split
along the sequence. A strategy is exported only when every op's configuration is that pattern
(:mod:`exporters._tp`); otherwise :class:`~planner.core.errors.UnsupportedExport` says which op
differs and how. :func:`megatron_masks` gives the pattern as boolean masks over each op's
configurations, so the caller can search only Megatron-expressible plans and report the nearest one.

Flags (reference §1.1, §6): ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
``--sequence-parallel``, ``--micro-batch-size`` (per GPU) and ``--global-batch-size``, recompute
(``selective``, or ``full`` with ``uniform`` over 1 layer), ZeRO-1 as ``--use-distributed-optimizer``,
ZeRO-2/3 as Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` /
``optim_grads_params`` with ``--ckpt-format fsdp_dtensor``), ``--bf16``, and the model sizes read from
the graph. The whole list is checked by :func:`exporters.megatron.validate.validate_megatron` before it is
returned.

Exact or refused (issue 25): the model family (:mod:`exporters.megatron.families`) picks the script,
``pretrain_gpt.py`` for a causal pre-LN decoder, ``pretrain_bert.py`` (``--bert-no-binary-head``
without the pooler and sentence-order head) for a proven-bidirectional pre-LN encoder shaped as
megatron-core's ``BertModel``; what the layers compute beyond their sizes
(:class:`importers.transformer.LayerFeatures`) is a flag or a one-line refusal
(:func:`feature_refusals`): a gated MLP is ``--swiglu`` only when its gate is SiLU (GeGLU is refused),
attention or final-logit soft-capping and sandwich norms (Gemma-2) are refused, since
``TransformerConfig`` 0.16.1 has no field for them, and so are post-LN stacks (Hugging Face's BERT)
and, for GPT, bidirectional attention. Norms that all scale by ``1 + w`` (NeMo's LayerNorm1P, Gemma's
RMSNorm; read from the file's ``weight + 1``) are ``--apply-layernorm-1p``, which Transformer Engine's
norms, Megatron-LM's default implementation, honour for LayerNorm and RMSNorm
(:func:`exporters.megatron.families.norm_args`); a stack where only some do is refused. MoE (:mod:`exporters.megatron.moe`): shared experts are
``--moe-shared-expert-intermediate-size`` (and ``--moe-shared-expert-gate`` for Qwen2-MoE's sigmoid
gate), top-k probabilities kept unnormalised ``--moe-router-pre-softmax``; DeepSeek-V3's router, read
from the graph (:mod:`importers.moe_router`), is ``--moe-router-score-function sigmoid`` with
``--moe-router-enable-expert-bias``, ``--moe-router-num-groups`` / ``--moe-router-group-topk`` and
``--moe-router-topk-scaling-factor``, and its dense leading layers ``--moe-layer-freq`` (with
``--moe-ffn-hidden-size`` for the experts); a router megatron-core's ``topk_routing_with_score_function``
computes differently (a group scored by other than its top ``topk / group_topk``, a sigmoid top-k not
renormalised, a scaling factor a graph-only file stripped) is refused in one line.

Pipeline plans (:class:`~exporters.generic.PipelineSpec`, :func:`megatron_pipeline_args`): the
stage split becomes nothing when even, ``--decoder-first-pipeline-num-layers`` /
``--decoder-last-pipeline-num-layers`` when only the first and/or last stage differ from an even
middle, else ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` transformer layer, ``L``
loss, ``|`` between stages); the interleaved schedule adds
``--num-layers-per-virtual-pipeline-stage`` (even stages) or ``--num-virtual-stages-per-pipeline-rank``
(uneven first/last; the layout carries the virtual stages itself); a rank whose layers its model
chunks do not divide gets the layout of the chunks it was priced with (``planner.core.chunks.chunk_layers``:
30 layers on ``pp = 4`` in two chunks are ``Et*4|t*4|t*4|t*4|t*4|t*4|t*3|t*3L``). Megatron-LM's rank order puts
the pipeline outermost, so stage ``s`` runs on ranks ``[s d, (s + 1) d)`` with ``d = dp x tp``, the
planner's consecutive stages. Refused: the GPipe and zero-bubble schedules (Megatron-LM runs 1F1B
and interleaved 1F1B only), ZeRO-2/3 with ``pp > 1`` (Megatron-FSDP is documented with tensor, context and expert
parallelism, not pipelines, and torch FSDP2 requires ``pp = 1``, reference §1.2), and stages whose
devices the plan leaves idle.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from exporters._common import (
    attention_model,
    context_parallel_degree,
    describe_config,
    folded_norm_note,
    head_copy_note,
    launcher_degrees,
    samples_per_rank,
    torchrun_nodes,
)
from exporters._tp import MaskResult, TpLayout, layout_masks, tp_layout
from exporters.elsewhere import ELSEWHERE
from importers.transformer import TransformerModel, analyze_transformer, moe_summary
from exporters.generic import PipelineSpec, PlanInput
from exporters.megatron.families import (
    FamilyExport, family_notes, family_refusals, megatron_family, megatron_rotary_args, norm_epsilon_args,
)
from exporters.megatron.fp8 import FP8_NOTE, megatron_fp8_args
from exporters.megatron.mla import megatron_mla_args
from exporters.megatron.attention import ATTENTION_BACKENDS
from exporters.megatron.moe import EXPERT_BIAS_NOTE, MOE_TP_NEEDS_SP, dense_view, megatron_moe_args, moe_layout
from exporters.megatron.t5 import t5_plan_refusal, t5_stack, t5_view
from exporters.megatron import mamba
from exporters.megatron.mamba import hybrid_masks, hybrid_stack
from exporters.megatron.mamba_moe import hybrid_moe_args
from exporters.megatron.mamba_rotary import hybrid_rotary
from importers.hybrid import HybridStack
from exporters.megatron.validate import validate_megatron
from exporters.megatron.sinks import SINK_KERNEL_NOTE, attention_sinks
from exporters.megatron.window import megatron_window_args
from planner.core.chunks import chunk_layers
from planner.core.configs import ConfigSpace
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph
from planner.core.memo import IdentityMemo

__all__ = ["MEGATRON_CORE_VERSION", "megatron_masks", "megatron_pipeline_args", "megatron_args", "megatron_moe_args",
           "megatron_offload_args", "megatron_hsdp_args",
           "export_megatron", "feature_refusals"]

MEGATRON_CORE_VERSION = "0.16.1"
"""The Megatron-LM release (``core_v0.16.1``) whose flags and rules the export follows."""

def _layout(graph: OpGraph) -> TpLayout:
    """Megatron-LM's layout of ``graph``, or its one-line refusal when no Megatron-LM script trains
    it exactly; kept per graph (every family of every stage of a search asks again)."""
    return _LAYOUTS.get((graph,), lambda: _checked_layout(graph))


def _checked_layout(graph: OpGraph) -> TpLayout:
    model = attention_model(graph, (  # a Mamba mixer was looked for first (_families: hybrid_stack)
        ", so it is not a transformer, and it has no Mamba mixer: Megatron-LM has no model class that trains it "
        "(its GPT, BERT and T5 models are transformers, its MambaModel a Mamba stack)" + ELSEWHERE))
    megatron_family(graph, model)  # raises the refusal (not kept: asked again, it is raised again)
    return tp_layout(graph, model, target="megatron", moe_tokens=True)


_LAYOUTS: IdentityMemo[TpLayout] = IdentityMemo(size=64)


def feature_refusals(model: TransformerModel) -> list[str]:
    """What the layers compute that Megatron-LM's GPT model (``pretrain_gpt.py`` flags, core_v0.16.1)
    cannot, one clause each; empty when its flags reproduce the model
    (:func:`exporters.megatron.families.family_refusals` for the GPT family)."""
    return family_refusals(model, "gpt")


def _masks(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    layout: TpLayout,
    *,
    dp: int,
    tp: int,
    sequence_parallel: bool,
    devices_per_node: int | None,
    cp: int = 1,
) -> MaskResult:
    model = layout.model
    if cp > 1 and model.features.attention_mask == "bidirectional":
        # pretrain_bert.py's get_batch hands every rank the whole sequence (no get_batch_on_this_cp_rank)
        return MaskResult(masks=None, reason="pretrain_bert.py has no context parallelism (its batches are not split by cp)")
    if cp > 1 and t5_stack(graph, model) is not None:
        return MaskResult(masks=None, reason=t5_plan_refusal(cp=cp))
    if cp > 1 and model.seq_length % (2 * cp):
        # Megatron-LM balances causal attention by cutting the sequence into 2 x cp chunks
        # (rank r holds chunks r and 2 cp - 1 - r): get_batch_on_this_cp_rank needs seq % (2 cp) == 0
        return MaskResult(masks=None, reason=f"sequence length {model.seq_length} is not divisible by 2 x cp = {2 * cp}")
    if cp > 1 and attention_sinks(graph):  # TransformerEngine runs a learnable softmax's cp with a2a only (validate)
        return MaskResult(masks=None, reason="its attention sinks (--softmax-type learnable) run context parallelism in "
                          "TransformerEngine only with --cp-comm-type a2a, and the plan prices all_gather")
    if model.num_attention_heads % tp:
        return MaskResult(masks=None, reason=f"{model.num_attention_heads} attention heads are not divisible by tp={tp}")
    groups = model.num_query_groups
    if groups % tp and tp % groups:
        return MaskResult(masks=None, reason=f"{groups} query groups are neither a multiple nor a divisor of tp={tp}")
    if model.ffn_hidden_size % tp:
        return MaskResult(masks=None, reason=f"FFN size {model.ffn_hidden_size} is not divisible by tp={tp}")
    if tp > 1 and not sequence_parallel and moe_summary(graph) is not None:
        return MaskResult(masks=None, reason=MOE_TP_NEEDS_SP)
    if tp > 1 and model.linear_bias and moe_summary(graph) is not None:
        # TransformerConfig.__post_init__ (megatron-core 0.16.1 transformer_config.py:1588-1591), etp defaulting to tp
        return MaskResult(masks=None, reason=f"its experts' linears have biases and megatron-core 0.16.1 keeps them "
                          f"only at expert tensor parallelism 1 ('Bias in Moe is only supported when ETP==1'), not tp={tp}")
    shared = model.shared_experts[0].ffn_hidden_size if model.shared_experts else 0
    if shared % tp:
        return MaskResult(masks=None, reason=f"the shared experts' FFN size {shared} is not divisible by tp={tp}")
    return layout_masks(
        graph,
        spaces,
        layout,
        dp=dp,
        tp=tp,
        sequence_parallel=sequence_parallel,
        devices_per_node=devices_per_node or dp * cp * tp,
        cp=cp,
    )


def megatron_masks(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    *,
    dp: int,
    tp: int,
    sequence_parallel: bool = False,
    devices_per_node: int | None = None,
    cp: int = 1,
) -> list[np.ndarray] | None:
    """Per op, which configurations follow Megatron-LM's pattern at ``dp x cp x tp``.

    Parameters
    ----------
    graph, spaces:
        The op graph and each op's configurations.
    dp, tp:
        Data and tensor parallel degrees (``dp * tp`` processes).
    sequence_parallel:
        Norms and residual ops split along the sequence (``--sequence-parallel``) instead of
        replicated over ``tp``.
    devices_per_node:
        When given, configurations on all ``dp * cp * tp`` devices must also place the ``tp`` ranks
        innermost, then the ``cp`` ranks (Megatron's rank order); ``None``: placement is not constrained.
    cp:
        Context-parallel degree (``--context-parallel-size``): every op's sequence dim split ``cp``
        ways more, attention's query sequence only (:mod:`exporters._tp`); the sequence length must
        divide into ``2 cp`` chunks.

    Returns
    -------
    list of numpy.ndarray or None
        One boolean array per op over its configurations; ``None`` when the model is not a
        Megatron GPT model or the pattern has no configuration at these degrees (heads not divisible
        by ``tp``, a batch not divisible by ``dp``...).
    """
    if hybrid_stack(graph) is not None:  # a Mamba mixer: pretrain_mamba.py's family (exporters.megatron.mamba)
        return hybrid_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sequence_parallel, cp=cp,
                            devices_per_node=devices_per_node)
    try:
        layout = _layout(graph)
    except UnsupportedExport:
        return None
    return _masks(
        graph, spaces, layout, dp=dp, tp=tp, sequence_parallel=sequence_parallel, devices_per_node=devices_per_node,
        cp=cp,
    ).masks


def _layout_stage(layers: int) -> str:
    return "t" if layers == 1 else (f"t*{layers}" if layers > 1 else "")


def megatron_pipeline_args(layers_per_stage: Sequence[int], *, chunks: int = 1) -> list[str]:
    """The Megatron-LM flags that put ``layers_per_stage[s]`` transformer layers on pipeline rank ``s``.

    Parameters
    ----------
    layers_per_stage:
        Layers of each stage, first to last (the first stage also holds the embedding, the last the
        output layer and loss, as Megatron-LM places them).
    chunks:
        Model chunks (virtual stages) per rank of the interleaved schedule; rank ``s``'s chunks hold
        ``layers_per_stage[s] / chunks`` layers each, or where ``chunks`` does not divide them the split
        the plan was priced with (:func:`planner.core.chunks.chunk_layers`: as even as whole layers allow,
        the embedding's and the loss's chunks the lighter), written as ``--pipeline-model-parallel-layout``.

    Returns
    -------
    list of str
        ``--pipeline-model-parallel-size`` and, as needed, the uneven-split or layout flags and the
        virtual-pipeline flag (reference §1.1; rules §1.2).

    Examples
    --------
    >>> megatron_pipeline_args([3, 3, 3, 3])
    ['--pipeline-model-parallel-size', '4']
    >>> megatron_pipeline_args([2, 3, 3, 4])[2:]
    ['--decoder-first-pipeline-num-layers', '2', '--decoder-last-pipeline-num-layers', '4']
    >>> megatron_pipeline_args([3, 2, 4, 3])[2:]
    ['--pipeline-model-parallel-layout', 'Et*3|t*2|t*4|t*3L']
    >>> megatron_pipeline_args([4, 4], chunks=2)[2:]
    ['--num-layers-per-virtual-pipeline-stage', '2']
    >>> megatron_pipeline_args([8, 8, 7, 7], chunks=2)[2:]
    ['--pipeline-model-parallel-layout', 'Et*4|t*4|t*4|t*4|t*4|t*4|t*3|t*3L']
    """
    counts = [int(n) for n in layers_per_stage]
    pp = len(counts)
    if pp <= 1:
        return ["--pipeline-model-parallel-size", "1"]
    args = ["--pipeline-model-parallel-size", str(pp)]
    if any(layers % chunks for layers in counts):
        # unequal chunks: virtual stage v of rank s is entry v * pp + s of the layout (layers in model order)
        split = [chunk_layers(layers, chunks, first_stage=s == 0) for s, layers in enumerate(counts)]
        entries = [_layout_stage(split[s][v]) for v in range(chunks) for s in range(pp)]
        return args + ["--pipeline-model-parallel-layout", "|".join(["E" + entries[0], *entries[1:-1], entries[-1] + "L"])]
    if len(set(counts)) == 1:
        if chunks > 1:
            args += ["--num-layers-per-virtual-pipeline-stage", str(counts[0] // chunks)]
        return args
    first, middle, last = counts[0], counts[1:-1], counts[-1]
    even_middle = not middle or (len(set(middle)) == 1 and middle[0] > 0)
    if even_middle and first > 0 and last > 0:
        # Megatron-LM spreads the layers the two flags leave evenly over the middle stages.
        if not middle or first != middle[0]:
            args += ["--decoder-first-pipeline-num-layers", str(first)]
        if not middle or last != middle[0]:
            args += ["--decoder-last-pipeline-num-layers", str(last)]
        if chunks > 1:
            # --num-layers-per-virtual-pipeline-stage needs even stages (validate_args)
            args += ["--num-virtual-stages-per-pipeline-rank", str(chunks)]
        return args
    # Virtual stage v of rank s is entry v * pp + s of the layout (layers in model order).
    entries = [_layout_stage(counts[s] // chunks) for v in range(chunks) for s in range(pp)]
    entries[0] = "E" + entries[0]
    entries[-1] = entries[-1] + "L"
    return args + ["--pipeline-model-parallel-layout", "|".join(entries)]


def megatron_attention_args(attention: str | None) -> list[str]:
    """``--attention-backend`` naming the kernel the plan was priced with, so that TransformerEngine does not
    pick another (its ``auto`` picks cuDNN's on Hopper+, FlashAttention-2 before); none for a plan priced
    without an execution model. A kernel Megatron-LM has no backend for (``flex``: ``--attention flex``) is
    refused: the run would price otherwise.

    >>> megatron_attention_args("cudnn"), megatron_attention_args(None)
    (['--attention-backend', 'fused'], [])
    >>> megatron_attention_args("flex")
    Traceback (most recent call last):
    planner.core.errors.UnsupportedExport: Megatron-LM has no flex attention backend (--attention-backend takes flash, fused (cuDNN) or unfused): the plan was priced with --attention flex; plan with --attention flash, cudnn or explicit
    """
    if attention is not None and attention not in ATTENTION_BACKENDS:
        raise UnsupportedExport(f"Megatron-LM has no {attention} attention backend (--attention-backend takes flash, fused "
                                f"(cuDNN) or unfused): the plan was priced with --attention {attention}; plan with "
                                "--attention flash, cudnn or explicit")
    return ["--attention-backend", ATTENTION_BACKENDS[attention]] if attention is not None else []


def megatron_args(
    model: TransformerModel,
    *,
    tp: int,
    sequence_parallel: bool,
    micro_batch_size: int,
    global_batch_size: int,
    zero_stage: int,
    recompute: str,
    precision: str,
    optimizer: str = "adam",
    layers_per_stage: Sequence[int] | None = None,
    chunks: int = 1,
    overlap: bool = True,
    cp: int = 1,
    offload: str = "none",
    p2p_overlap: bool = True,
) -> list[str]:
    """The Megatron-LM argument list (flags from reference §1.1) for a model and degrees.

    ``p2p_overlap``: the interleaved schedule's transfers were priced overlapped (``TrainingSettings.p2p_overlap``,
    Megatron-LM's default with virtual stages: nothing written); ``False`` writes ``--no-overlap-p2p-communication``
    where ``chunks > 1`` (without virtual stages Megatron-LM waits every transfer whatever the flag).

    ``cp``: the context-parallel degree; above 1, ``--context-parallel-size`` with
    ``--cp-comm-type all_gather``, the exchange the plan was priced with (keys and values gathered
    before attention, their gradients reduced after it: :mod:`exporters._tp`).

    ``micro_batch_size`` is per GPU (per data-parallel rank); ``global_batch_size`` per optimizer step;
    ``layers_per_stage`` and ``chunks`` the pipeline (:func:`megatron_pipeline_args`; ``None``: one stage);
    ``overlap``: ``--overlap-grad-reduce`` / ``--overlap-param-gather``, as the plan was priced;
    ``offload``: CPU offload (:func:`megatron_offload_args`).
    """
    args = ["--tensor-model-parallel-size", str(tp)]
    args += megatron_pipeline_args(layers_per_stage or [model.num_layers], chunks=chunks)
    if chunks > 1 and not p2p_overlap:
        args.append("--no-overlap-p2p-communication")
    if sequence_parallel:
        args.append("--sequence-parallel")
    if cp > 1:
        args += ["--context-parallel-size", str(cp), "--cp-comm-type", "all_gather"]
    args += ["--micro-batch-size", str(micro_batch_size), "--global-batch-size", str(global_batch_size)]
    if recompute == "selective":
        args += ["--recompute-granularity", "selective"]  # --recompute-modules core_attn, megatron-core's default
    elif recompute == "mlp":
        args += ["--recompute-granularity", "selective", "--recompute-modules", "mlp"]
    elif recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    # ``overlap``: the plan was priced with gradient reductions overlapped with backward and ZeRO's
    # parameter gathers prefetched (objectives.pipeline_arrays): Megatron-LM does both only when asked
    if overlap:
        args.append("--overlap-grad-reduce")
    if zero_stage == 1:
        args += ["--use-distributed-optimizer", *(["--overlap-param-gather"] if overlap else [])]
    elif zero_stage in (2, 3):
        args += ["--overlap-param-gather"] if overlap else []
        strategy = "optim_grads" if zero_stage == 2 else "optim_grads_params"
        args += [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy", strategy,
            "--use-distributed-optimizer",
            "--no-gradient-accumulation-fusion",
            "--ckpt-format", "fsdp_dtensor",
        ]
    args += megatron_offload_args(offload, num_layers=model.num_layers, overlap=overlap)
    if precision == "bf16-mixed":
        args.append("--bf16")
    if optimizer == "sgd":
        args += ["--optimizer", "sgd"]
    args += [
        "--num-layers", str(model.num_layers),
        "--hidden-size", str(model.hidden_size),
        "--ffn-hidden-size", str(model.ffn_hidden_size),
        "--num-attention-heads", str(model.num_attention_heads),
    ]
    if model.num_query_groups != model.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_query_groups)]
    if model.head_dim * model.num_attention_heads != model.hidden_size:
        args += ["--kv-channels", str(model.head_dim)]
    positions = model.position_table_rows
    args += ["--seq-length", str(model.seq_length), "--max-position-embeddings", str(max(positions or 0, model.seq_length))]
    if positions is None:
        args += ["--position-embedding-type", "rope"]
    if model.gated_mlp and model.features.mlp_activation != "scaled-sigmoid":  # quick-GELU: the family's --quick-geglu
        args.append("--swiglu")
    elif model.features.mlp_activation == "squared-relu":  # megatron-core 0.16.1 core/activations.py:9-11: pow(relu, 2)
        args.append("--squared-relu")
    if model.normalization == "RMSNorm":
        args += ["--normalization", "RMSNorm"]
    if model.features.qk_norm == "per-head":  # Qwen3, Gemma-3: TransformerConfig.qk_layernorm (MLA adds its own)
        args.append("--qk-layernorm")
    if not model.linear_bias:
        args.append("--disable-bias-linear")
        if model.qkv_bias:
            args.append("--add-qkv-bias")  # biases on the QKV projections only (Qwen2)
    if model.lm_head is not None and not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args


def megatron_tp_overlap_args(tp_comm_overlap: bool, *, tp: int, sequence_parallel: bool) -> list[str]:
    """``--tp-comm-overlap`` where the plan was priced with tensor-parallel communication under the GEMMs
    (``TrainingSettings.tp_comm_overlap``, :mod:`objectives.tp_overlap`): with ``tp > 1`` only, and only
    with sequence parallelism (Megatron-LM ``validate_args``: "Tensor parallel communication/GEMM overlap
    can happen only when sequence parallelism is enabled"); :class:`UnsupportedExport` otherwise.

    >>> megatron_tp_overlap_args(True, tp=4, sequence_parallel=True), megatron_tp_overlap_args(True, tp=1, sequence_parallel=False)
    (['--tp-comm-overlap'], [])
    """
    if not tp_comm_overlap or tp == 1:
        return []
    if not sequence_parallel:
        raise UnsupportedExport("tensor-parallel communication overlap (--tp-comm-overlap) needs --sequence-parallel; "
                                "pick a row with sp")
    return ["--tp-comm-overlap"]


def megatron_cuda_graph_args(settings: Any, *, experts: bool, hybrid: bool = False) -> list[str]:
    """Megatron-LM's per-layer CUDA graphs where the plan was priced with them (``TrainingSettings.cuda_graphs``,
    ``cuda_graph_scope="layers"``: ``--fix cuda_graphs=on --target megatron``): ``--cuda-graph-impl transformer_engine``
    (Transformer Engine's ``make_graphed_callables`` per transformer layer, the default scope: the whole layer, attention
    and MLP) and ``--te-rng-tracker``, the RNG tracker graph capture needs (``validate_args`` turns it on; written so
    the launch says it). Nothing for a plan priced launched kernel by kernel (Megatron-LM's default).

    >>> from planner.core.settings import TrainingSettings
    >>> megatron_cuda_graph_args(TrainingSettings(cuda_graphs=True, cuda_graph_scope="layers"), experts=False)
    ['--cuda-graph-impl', 'transformer_engine', '--te-rng-tracker']

    Raises
    ------
    UnsupportedExport
        What Megatron-LM refuses or the plan did not price: a whole-step graph (torchtitan's), recomputation (full:
        ``validate_args``; selective and mlp: ``TransformerConfig.__post_init__`` with the default dropouts),
        activation offload, an MoE layer (its graph needs drop-and-pad experts), a hybrid Mamba stack.
    """
    if not settings.cuda_graphs:
        return []
    refused = ("the plan was priced as one CUDA graph per micro-batch (torchtitan's), not per layer"
               if settings.cuda_graph_scope != "layers" else
               f"Megatron-LM refuses recompute {settings.recompute} with per-layer CUDA graphs" if settings.recompute != "none"
               else "Megatron-LM does not capture CUDA graphs with CPU offloading" if settings.offload == "activations"
               else "Megatron-LM captures an MoE layer only with drop-and-pad experts" if experts
               else "per-layer CUDA graphs are not priced for a hybrid Mamba stack" if hybrid else None)
    if refused is not None:
        raise UnsupportedExport(f"{refused}; plan with --fix cuda_graphs=off" if settings.cuda_graph_scope == "layers"
                                else f"{refused}; plan with --target megatron --fix cuda_graphs=on")
    return ["--cuda-graph-impl", "transformer_engine", "--te-rng-tracker"]


def megatron_offload_args(offload: str, *, num_layers: int, overlap: bool = True) -> list[str]:
    """Megatron-LM's flags for CPU offload mode ``offload`` (``objectives.offload``).

    ``optimizer``: the whole optimizer on the CPU (``--optimizer-cpu-offload --optimizer-offload-fraction
    1.0``, megatron-core 0.16.1 ``OptimizerConfig``; ``--use-precision-aware-optimizer`` as Megatron-LM's
    CPU-offloading guide pairs them), the copies pipelined with the CPU step when overlapped
    (``--overlap-cpu-optimizer-d2h-h2d``). ``activations``: every layer but the last offloaded
    (``--cpu-offloading-num-layers``, which must stay below ``num_layers``; Megatron-LM's ``validate_args``
    sets ``cpu_offloading`` from it).

    >>> megatron_offload_args("activations", num_layers=8)
    ['--cpu-offloading-num-layers', '7']
    >>> megatron_offload_args("optimizer", num_layers=8, overlap=False)
    ['--optimizer-cpu-offload', '--optimizer-offload-fraction', '1.0', '--use-precision-aware-optimizer']

    Raises
    ------
    UnsupportedExport
        Activation offload of a one-layer model (no layer may be offloaded).
    """
    if offload == "optimizer":
        return ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0", "--use-precision-aware-optimizer",
                *(["--overlap-cpu-optimizer-d2h-h2d"] if overlap else [])]
    if offload == "activations":
        if num_layers < 2:
            raise UnsupportedExport("Megatron-LM offloads the activations of fewer layers than the model has "
                                    f"(cpu_offloading_num_layers < {num_layers}): none here; plan without offload")
        return ["--cpu-offloading-num-layers", str(num_layers - 1)]
    return []


def _sequence_parallel(plan_input: PlanInput, layout: TpLayout, tp: int, cp: int = 1) -> bool:
    """Whether the strategy splits norms and residual ops along the sequence (all or none) beyond
    the ``cp`` split of context parallelism."""
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    split, whole = [], []
    for index, rule in enumerate(layout.rules):
        if rule.sequence is None or not rule.sequence_required:
            continue
        space = spaces[index]
        factor = int(space.factors[choice[index], space.dim_names.index(rule.sequence)])
        (split if factor > cp else whole).append(graph.ops[index].name)
    if tp == 1 or not split:
        return False
    if whole:
        raise UnsupportedExport(
            f"op {split[0]} is split along the sequence but op {whole[0]} is not; Megatron-LM's "
            "--sequence-parallel splits every norm and residual op"
        )
    return True


def _check_choice(plan_input: PlanInput, layout: TpLayout, result: MaskResult, *, dp: int, tp: int, sp: bool,
                  cp: int = 1) -> None:
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    assert result.masks is not None
    for index, (mask, row) in enumerate(zip(result.masks, choice)):
        if mask[row]:
            continue
        op, space = graph.ops[index], spaces[index]
        expected = describe_config(op, space, int(np.flatnonzero(mask)[0]))
        raise UnsupportedExport(
            f"op {op.name} ({layout.rules[index].role}) is split {describe_config(op, space, row)}; "
            f"Megatron-LM at dp={dp}{f' x cp={cp}' if cp > 1 else ''} x tp={tp}"
            f"{' with sequence parallelism' if sp else ''} splits it {expected}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Launch:
    """The shape of a Megatron-LM run, read from a strategy and checked (:func:`_launch`)."""

    layout: TpLayout
    result: MaskResult
    """The Megatron pattern's masks at ``dp x tp`` (the notes name its replicated fallbacks)."""
    pipeline: PipelineSpec | None
    """``None`` unless the plan pipelines (``pp > 1``)."""
    dp: int
    tp: int
    pp: int
    sequence_parallel: bool
    world: int
    """Processes: ``dp x cp x tp x pp``."""
    nnodes: int
    per_node: int
    """Processes per node (torchrun's ``--nproc-per-node``)."""
    micro_batch: int
    """Samples per data-parallel rank per micro-batch (``--micro-batch-size``)."""
    cp: int = 1
    """Context-parallel degree (``--context-parallel-size``)."""
    family: FamilyExport = FamilyExport(family="gpt", script="pretrain_gpt.py")
    """The Megatron-LM model family, its script and its own flags."""


def _launch(plan_input: PlanInput) -> _Launch:
    """The degrees, processes and micro-batch of ``plan_input``, or :class:`UnsupportedExport` at the
    first rule Megatron-LM breaks (pipeline settings, the tp pattern, whole nodes, the batch split)."""
    graph, cluster = plan_input.graph, plan_input.cluster
    pipeline = plan_input.pipeline if plan_input.pipeline is not None and plan_input.pipeline.pp > 1 else None
    if pipeline is not None:
        _check_pipeline_settings(pipeline)
    layout = _layout(graph)
    dp, model_split = launcher_degrees(graph, plan_input.spaces, plan_input.strategy.choice, layout.model.roles)
    # the layers' linears split the sequence cp ways and their weights tp ways: their split is cp x tp
    cp = context_parallel_degree(graph, plan_input.spaces, plan_input.strategy.choice, layout.rules)
    cp = cp if model_split % cp == 0 else 1
    tp = model_split // cp
    sp = _sequence_parallel(plan_input, layout, tp, cp)
    result = _masks(
        graph, plan_input.spaces, layout, dp=dp, tp=tp, sequence_parallel=sp, devices_per_node=cluster.devices_per_node,
        cp=cp,
    )
    shown = f"dp={dp}{f' x cp={cp}' if cp > 1 else ''} x tp={tp}"
    if result.masks is None:
        raise UnsupportedExport(f"Megatron-LM cannot run {shown} on this model: {result.reason}")
    _check_choice(plan_input, layout, result, dp=dp, tp=tp, sp=sp, cp=cp)
    pp = 1
    family = megatron_family(graph, layout.model)
    if pipeline is not None and family.family == "t5":
        raise UnsupportedExport(t5_plan_refusal(pp=pipeline.pp) or "")
    if pipeline is not None:
        _check_pipeline_shape(pipeline, layout.model, dp=dp, tp=tp, cp=cp)
        pp = pipeline.pp
    world = dp * cp * tp * pp
    nnodes, per_node = torchrun_nodes(world, cluster.devices_per_node)
    return _Launch(
        layout=layout, result=result, pipeline=pipeline, dp=dp, tp=tp, pp=pp, sequence_parallel=sp, world=world,
        nnodes=nnodes, per_node=per_node, micro_batch=samples_per_rank(plan_input, dp, pipeline), cp=cp,
        family=family,
    )


def _command(launch: _Launch, args: list[str], env: dict[str, str]) -> str:
    """One shell line: the environment, torchrun (with the rendezvous of a multi-node run) and the script."""
    launcher = ["torchrun", "--nproc-per-node", str(launch.per_node)]
    if launch.nnodes > 1:
        launcher += ["--nnodes", str(launch.nnodes), "--node-rank", "$NODE_RANK", "--master-addr", "$MASTER_ADDR",
                     "--master-port", "6000"]
    prefix = " ".join(f"{k}={v}" for k, v in env.items())
    # $NODE_RANK and $MASTER_ADDR are for the shell to expand, so they stay unquoted
    return (prefix + " " if prefix else "") + " ".join(
        part if part.startswith("$") else shlex.quote(part) for part in [*launcher, launch.family.script, *args]
    )


def export_megatron(plan_input: PlanInput) -> dict[str, Any]:
    """The Megatron-LM launch plan of a strategy, or :class:`UnsupportedExport` with the reason.

    Returns
    -------
    dict
        ``target``, ``world_size``, ``nnodes``, ``nproc_per_node``, ``degrees``, ``args`` (list),
        ``env``, ``command`` (one shell line), ``model`` sizes, ``batch`` and ``notes``.

    Raises
    ------
    UnsupportedExport
        When no Megatron-LM family trains the model as it is or the strategy is not Megatron's pattern.
        A Mamba or hybrid stack goes to :func:`export_hybrid`.
    """
    stack = hybrid_stack(plan_input.graph)
    if stack is not None:
        return export_hybrid(plan_input, stack)
    settings = plan_input.settings
    launch = _launch(plan_input)
    model, pipeline, dp, tp, pp = launch.layout.model, launch.pipeline, launch.dp, launch.tp, launch.pp
    if launch.family.family == "t5":  # one stack's depth and the encoder's length (exporters.megatron.t5)
        model = t5_view(plan_input.graph, model, t5_stack(plan_input.graph, model))
    experts = moe_layout(plan_input.graph, model)  # which layers route, and the router (exporters.megatron.moe)
    model = dense_view(model, experts)  # --ffn-hidden-size: the dense layers' FFN where some layers are dense
    args = megatron_args(
        model,
        tp=tp,
        sequence_parallel=launch.sequence_parallel,
        micro_batch_size=launch.micro_batch,
        global_batch_size=plan_input.samples_per_step,
        zero_stage=settings.zero_stage,
        recompute=settings.recompute,
        precision=settings.precision,
        optimizer=settings.optimizer,
        layers_per_stage=pipeline.layers_per_stage if pipeline is not None else None,
        chunks=pipeline.chunks if pipeline is not None else 1,
        overlap=settings.overlap,
        cp=launch.cp,
        offload=settings.offload,
        p2p_overlap=bool(settings.p2p_overlap),  # priced waited (unresolved or off): the flag that waits them
    )
    shared = model.shared_experts[0].ffn_hidden_size if model.shared_experts else None
    args += megatron_moe_args(moe_summary(plan_input.graph), ep=settings.expert_parallel,
                              capacity_factor=settings.capacity_factor, dp=dp,
                              shared_ffn=shared, shared_gate=model.shared_expert_gate, layout=experts, model=model)
    args += megatron_rotary_args(plan_input.graph, model)[0]
    args += norm_epsilon_args(plan_input.graph)[0]  # the file's norms' epsilon (exporters.megatron.families)
    args += megatron_mla_args(model)  # multi-latent attention's sizes (exporters.megatron.mla)
    args += megatron_window_args(plan_input.graph, model)  # the file's sliding window (exporters.megatron.window)
    args += megatron_tp_overlap_args(settings.tp_comm_overlap, tp=tp, sequence_parallel=launch.sequence_parallel)
    args += megatron_cuda_graph_args(settings, experts=bool(moe_summary(plan_input.graph)))
    args += megatron_hsdp_args(settings.zero_stage, settings.dp_shard, dp=dp)
    args += list(launch.family.args)
    args += megatron_fp8_args(settings.fp8, param_gather=settings.gathers_fp8)  # on top of --bf16, as priced (objectives.precision)
    sinks = bool(attention_sinks(plan_input.graph))  # TE runs their learnable softmax on cuDNN's kernel, not flash
    args += megatron_attention_args("cudnn" if sinks and settings.attention == "flash" else settings.attention)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (tp > 1 or launch.cp > 1) and settings.zero_stage < 2 else {}
    validate_megatron(args, world_size=launch.world, env=env)
    return {
        "target": "megatron",
        "megatron_core_version": MEGATRON_CORE_VERSION,
        "model_family": launch.family.family,
        "script": launch.family.script,
        "world_size": launch.world,
        "nnodes": launch.nnodes,
        "nproc_per_node": launch.per_node,
        "degrees": {"dp": dp, "tp": tp, "pp": pp, "cp": launch.cp, "sequence_parallel": launch.sequence_parallel},
        "pipeline": None
        if pipeline is None
        else {
            "pp": pp,
            "schedule": pipeline.schedule,
            "virtual_stages": pipeline.chunks,
            "layers_per_stage": list(pipeline.layers_per_stage),
            "ranks_per_stage": dp * launch.cp * tp,
        },
        "args": args,
        "env": env,
        "command": _command(launch, args, env),
        "model": {
            "num_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "ffn_hidden_size": model.ffn_hidden_size,
            "num_attention_heads": model.num_attention_heads,
            "num_query_groups": model.num_query_groups,
            "kv_channels": model.head_dim,
            "seq_length": model.seq_length,
            "vocab_size": model.vocab_size,
        },
        **_batch_and_cost(plan_input, launch.micro_batch),
        "notes": _notes(plan_input, launch.layout, launch.result, model, tp) + family_notes(
            launch.family, args, mlp_activation=None if model.gated_mlp else model.features.mlp_activation)
        + ([FP8_NOTE] if settings.fp8 else []) + ([SINK_KERNEL_NOTE] if sinks and settings.attention == "flash" else [])
        + ([EXPERT_BIAS_NOTE] if experts is not None and experts.router is not None and experts.router.expert_bias else []),
    }


def _batch_and_cost(plan_input: PlanInput, micro_batch: int) -> dict[str, Any]:
    """The document's ``batch`` (samples per rank and per step, micro-batches), ``time_s`` and
    ``memory_bytes`` (the plan's priced step time in seconds and bytes per device)."""
    return {
        "batch": {
            "micro_batch_size": micro_batch,
            "global_batch_size": plan_input.samples_per_step,
            "num_microbatches": plan_input.samples_per_step // plan_input.samples_per_pass,
        },
        "time_s": float(plan_input.strategy.time_s),
        "memory_bytes": float(plan_input.strategy.memory_bytes),
    }


def megatron_hsdp_args(zero_stage: int, dp_shard: int | None, *, dp: int) -> list[str]:
    """``--num-distributed-optimizer-instances dp / S`` for a ZeRO-1 plan priced with HSDP's shard group
    (``TrainingSettings.dp_shard``, ``S = gcd(dp, dp_shard)``): megatron-core 0.16.1 shards the
    distributed optimizer over ``dp / instances`` ranks (``parallel_state``'s intra-partial data-parallel
    group), reduce-scatters gradients there and all-reduces them across the instances
    (``param_and_grad_buffer``), the collectives ``objectives.intra_op`` prices; ``[]`` otherwise.

    >>> megatron_hsdp_args(1, 8, dp=32), megatron_hsdp_args(1, None, dp=32), megatron_hsdp_args(1, 32, dp=32)
    (['--num-distributed-optimizer-instances', '4'], [], [])
    """
    if zero_stage != 1 or dp_shard is None or math.gcd(dp, dp_shard) == dp:
        return []
    return ["--num-distributed-optimizer-instances", str(dp // math.gcd(dp, dp_shard))]


def export_hybrid(plan_input: PlanInput, stack: HybridStack) -> dict[str, Any]:
    """The ``pretrain_mamba.py`` launch plan of a strategy on a Mamba/hybrid stack (:mod:`exporters.megatron.mamba`),
    in :func:`export_megatron`'s document shape; its flags pass :func:`validate_megatron`."""
    settings = plan_input.settings
    launch = mamba.hybrid_launch(plan_input, stack)
    tp, sp, world = launch.tp, launch.sequence_parallel, launch.dp * launch.tp * launch.pp
    args = megatron_args(
        mamba.model_view(stack), tp=tp, sequence_parallel=sp, micro_batch_size=launch.micro_batch,  # type: ignore[arg-type]
        global_batch_size=plan_input.samples_per_step, zero_stage=settings.zero_stage, recompute=settings.recompute,
        precision=settings.precision, optimizer=settings.optimizer, overlap=settings.overlap, offload=settings.offload,
        layers_per_stage=launch.stage_layers)  # MambaStack's placement (mamba.hybrid_stage_layers)
    args += mamba.hybrid_model_args(stack, plan_input.graph)
    args += hybrid_moe_args(plan_input.graph, stack, ep=settings.expert_parallel, dp=launch.dp,
                            capacity_factor=settings.capacity_factor)  # E layers (exporters.megatron.mamba_moe)
    # in_proj and out_proj are TE linears with tp_comm_buffer_name "fc1"/"fc2" (ssm/mamba_mixer.py): overlappable
    args += megatron_tp_overlap_args(settings.tp_comm_overlap, tp=tp, sequence_parallel=sp)
    args += megatron_cuda_graph_args(settings, experts=stack.experts is not None, hybrid=True)
    args += megatron_fp8_args(settings.fp8, param_gather=settings.gathers_fp8)
    args += megatron_attention_args(settings.attention)
    args += megatron_hsdp_args(settings.zero_stage, settings.dp_shard, dp=launch.dp)
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if tp > 1 and settings.zero_stage < 2 else {}
    validate_megatron(args, world_size=world, env=env)
    mixer = stack.mamba
    assert mixer is not None
    notes = [f"add your data and tokenizer flags (--data-path, --tokenizer-type, ...); Megatron pads the vocabulary "
             f"({stack.vocab_size}) to a multiple of 128{f' x tp' if tp > 1 else ''} (--make-vocab-size-divisible-by)"]
    if stack.experts is not None and stack.experts.router.expert_bias:
        notes.append(EXPERT_BIAS_NOTE)
    if rotary_note := hybrid_rotary(stack, plan_input.graph).note:
        notes.append(rotary_note)
    if not stack.num_attention_heads:
        notes.append("no attention layer: --num-attention-heads 1 and --ffn-hidden-size only satisfy TransformerConfig")
    if launch.replicated:
        notes.append(f"the planner priced {len(launch.replicated)} ops (first {launch.replicated[0]}) whole on every tp "
                     "rank: the split of in_proj's and the conv's outputs into z, x, B, C, dt is local to each rank in "
                     "megatron-core (its weights are laid out per rank) and not a contiguous split the planner can write, "
                     "and a vocabulary tp does not divide is padded; Megatron-LM runs at least as fast, in no more memory")
    return {
        "target": "megatron",
        "megatron_core_version": MEGATRON_CORE_VERSION,
        "model_family": "mamba",
        "script": mamba.MAMBA_SCRIPT,
        "world_size": world,
        "nnodes": launch.nnodes,
        "nproc_per_node": launch.per_node,
        "degrees": {"dp": launch.dp, "tp": tp, "pp": launch.pp, "cp": 1, "sequence_parallel": sp},
        "pipeline": None if plan_input.pipeline is None or launch.stage_layers is None else {
            "pp": launch.pp, "schedule": plan_input.pipeline.schedule, "virtual_stages": 1,
            "layers_per_stage": list(launch.stage_layers), "ranks_per_stage": launch.dp * tp,
        },
        "args": args,
        "env": env,
        "command": _command(launch, args, env),  # type: ignore[arg-type]
        "model": {
            "num_layers": stack.num_layers, "hybrid_override_pattern": stack.pattern,
            "hidden_size": stack.hidden_size, "ffn_hidden_size": stack.ffn_hidden_size,
            "num_attention_heads": stack.num_attention_heads, "num_query_groups": stack.num_query_groups,
            "kv_channels": stack.kv_channels, "mamba_num_heads": mixer.num_heads, "mamba_head_dim": mixer.head_dim,
            "mamba_num_groups": mixer.num_groups, "mamba_state_dim": mixer.state_dim,
            "seq_length": stack.seq_length, "vocab_size": stack.vocab_size,
            **({} if stack.experts is None else {  # the E layers' sizes (exporters.megatron.mamba_moe)
                "num_experts": stack.experts.num_experts, "moe_router_topk": stack.experts.top_k,
                "moe_ffn_hidden_size": stack.experts.ffn,
                "moe_shared_expert_intermediate_size": stack.experts.shared_ffn}),
        },
        **_batch_and_cost(plan_input, launch.micro_batch),
        "notes": notes + ([FP8_NOTE] if settings.fp8 else []),
    }


def _check_pipeline_settings(pipeline: PipelineSpec) -> None:
    """Refuse what Megatron-LM cannot pipeline (module docstring)."""
    if pipeline.schedule == "gpipe":
        raise UnsupportedExport(
            "Megatron-LM's pipeline schedules are 1F1B and interleaved 1F1B; it has no GPipe schedule (all forwards, "
            "then all backwards); plan with --schedule 1f1b"
        )
    if pipeline.schedule in ("zb-h1", "zbv"):
        # megatron-core 0.16.1's get_forward_backward_func picks forward_backward_pipelining_without_interleaving
        # or _with_interleaving: neither splits the backward into B and W passes (Qi et al.'s fork does)
        raise UnsupportedExport(
            f"megatron-core {MEGATRON_CORE_VERSION} runs no zero-bubble schedule ({pipeline.schedule}: its pipelines "
            "are 1F1B and interleaved 1F1B, no B/W split of the backward); plan with --schedule 1f1b or "
            "interleaved, or --target torchtitan"
        )
    if pipeline.zero_stage >= 2:
        raise UnsupportedExport(
            f"Megatron-LM runs ZeRO-{pipeline.zero_stage} as Megatron-FSDP, documented with tensor, context and "
            "expert parallelism but not with pipeline parallelism (and --use-torch-fsdp2 requires "
            "--pipeline-model-parallel-size 1); plan with --zero 0 or 1 (the distributed optimizer) for pp > 1"
        )


def _check_pipeline_shape(pipeline: PipelineSpec, model: TransformerModel, *, dp: int, tp: int, cp: int = 1) -> None:
    if pipeline.num_layers != model.num_layers:
        raise UnsupportedExport(
            f"the pipeline cuts {pipeline.num_layers} layers but Megatron-LM's model has {model.num_layers} "
            "transformer layers; plan the model again"
        )
    if dp * cp * tp != pipeline.devices_per_stage:
        raise UnsupportedExport(
            f"the plan runs dp={dp}{f' x cp={cp}' if cp > 1 else ''} x tp={tp} on stages of {pipeline.devices_per_stage} "
            "devices, leaving some idle; Megatron-LM gives every stage dp x cp x tp ranks"
        )


def _notes(plan_input: PlanInput, layout: TpLayout, result: MaskResult, model: TransformerModel, tp: int) -> list[str]:
    notes = [
        f"add your data and tokenizer flags (--data-path, --tokenizer-type, ...); Megatron pads the vocabulary "
        f"({model.vocab_size}) to a multiple of 128 x tp (--make-vocab-size-divisible-by)",
    ]
    fallbacks = sorted({layout.rules[i].role for i in result.replicated_fallbacks})
    if tp > 1 and fallbacks:
        notes.append(
            f"the planner kept {', '.join(fallbacks)} ops replicated over tp because their split does not divide "
            f"evenly; Megatron-LM splits them (padding the vocabulary), so it runs at least as fast as priced"
        )
    if model.position_table_rows is None:
        notes.append(megatron_rotary_args(plan_input.graph, model)[1])
    epsilon_note = norm_epsilon_args(plan_input.graph)[1]
    notes += [epsilon_note] if epsilon_note else []
    if model.features.zero_centred_norms == "none":
        notes += folded_norm_note(plan_input.graph, "if it does, add --apply-layernorm-1p")
    if plan_input.settings.zero_stage >= 2:
        notes.append("ZeRO-2/3 is Megatron-FSDP: leave CUDA_DEVICE_MAX_CONNECTIONS unset (it must not be 1)")
    return notes + head_copy_note(plan_input.graph, model, "drop --untie-embeddings-and-output-weights")
