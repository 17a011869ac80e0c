r"""Megatron-LM's own checks in pure Python (``megatron-core==0.16.1`` and Megatron-LM ``core_v0.16.1``
``validate_args``; reference ``/work/shared/reference/export_targets.md`` §1.2).

The rules: world size divisible by ``tp*pp*cp`` and by ``etp*ep*pp``; experts divisible by ``ep``;
sequence parallelism needs ``tp > 1``; layers divisible by ``pp`` unless the stages are uneven; uneven
first/last stages (positive, an evenly divisible middle, divisible by the virtual pipeline size);
the pipeline layout (stages a multiple of ``pp``, embedding first and loss last, once each, one
``t`` per layer, not with the other split options); virtual pipeline rules (one option, ``pp > 1``,
divisibility, micro-batches a multiple of ``pp`` for the interleaved schedule); heads divisible
by ``tp``; query groups a multiple or a divisor of ``tp`` and dividing the heads; hidden size
divisible by the heads unless ``--kv-channels``; ``seq % 2cp`` with context parallelism;
``max_position_embeddings >= seq_length``; micro batch set and global batch divisible by
``micro * dp``; recompute flag combinations; offload not with recompute; not fp16 and bf16;
overlap-param-gather prerequisites; torch-FSDP2 and Megatron-FSDP prerequisites; zero-centred norms
(``--apply-layernorm-1p``) only with an implementation whose norms honour them;
``CUDA_DEVICE_MAX_CONNECTIONS=1`` with ``tp > 1`` or ``cp > 1`` (not with Megatron-FSDP).

:func:`megatron_violations` returns every violation as a one-line message and
:func:`validate_megatron` raises :class:`~planner.core.errors.UnsupportedExport` with all of them;
malformed input (an unknown flag) raises :class:`~planner.core.errors.InputError` instead.
:mod:`exporters.validate` re-exports these names.
"""

from __future__ import annotations

import ast
import math
import re
import shlex
from typing import Any, Mapping, Sequence

from planner.core.errors import InputError, UnsupportedExport

__all__ = [
    "MEGATRON_FLAGS",
    "parse_megatron_args",
    "parse_pipeline_layout",
    "megatron_violations",
    "validate_megatron",
]

_INT, _FLAG, _STR, _LIST, _FREQ = "int", "flag", "str", "list", "freq"

#: Flags the validator knows: name -> (kind, choices). Spellings from Megatron-LM
#: ``megatron/training/arguments.py`` at ``core_v0.16.1`` (reference §1.1).
MEGATRON_FLAGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tensor-model-parallel-size": (_INT, ()),
    "pipeline-model-parallel-size": (_INT, ()),
    "num-layers-per-virtual-pipeline-stage": (_INT, ()),
    "num-virtual-stages-per-pipeline-rank": (_INT, ()),
    "pipeline-model-parallel-layout": (_STR, ()),
    "decoder-first-pipeline-num-layers": (_INT, ()),
    "decoder-last-pipeline-num-layers": (_INT, ()),
    "account-for-embedding-in-pipeline-split": (_FLAG, ()),
    "account-for-loss-in-pipeline-split": (_FLAG, ()),
    "no-overlap-p2p-communication": (_FLAG, ()),
    "sequence-parallel": (_FLAG, ()),
    "tp-comm-overlap": (_FLAG, ()),
    # per-layer CUDA graphs (arguments.py: --cuda-graph-impl none|local|transformer_engine; --te-rng-tracker, which
    # validate_args turns on for them)
    "cuda-graph-impl": (_STR, ("none", "local", "transformer_engine")),
    "te-rng-tracker": (_FLAG, ()),
    "context-parallel-size": (_INT, ()),
    "attention-backend": (_STR, ("flash", "fused", "unfused", "local", "auto")),  # megatron-core's AttnBackend
    "cp-comm-type": (_LIST, ("p2p", "all_gather", "a2a", "a2a+p2p")),
    "hierarchical-context-parallel-sizes": (_LIST, ()),
    "expert-model-parallel-size": (_INT, ()),
    "expert-tensor-parallel-size": (_INT, ()),
    "num-experts": (_INT, ()),
    # MoE (TransformerConfig.moe_router_topk, moe_token_dispatcher_type, moe_grouped_gemm,
    # moe_expert_capacity_factor in megatron-core 0.16.1)
    "moe-router-topk": (_INT, ()),
    "moe-token-dispatcher-type": (_STR, ("allgather", "alltoall", "flex")),
    "moe-grouped-gemm": (_FLAG, ()),
    "moe-expert-capacity-factor": (_STR, ()),
    # the router's order and shared experts (moe_router_pre_softmax, moe_shared_expert_intermediate_size,
    # moe_shared_expert_gate in megatron-core 0.16.1)
    "moe-router-pre-softmax": (_FLAG, ()),
    "moe-shared-expert-intermediate-size": (_INT, ()),
    "moe-shared-expert-gate": (_FLAG, ()),
    # DeepSeek-V3's router and dense layers (moe_router_score_function, moe_router_enable_expert_bias,
    # moe_router_num_groups, moe_router_group_topk, moe_router_topk_scaling_factor, moe_ffn_hidden_size,
    # moe_layer_freq in megatron-core 0.16.1; arguments.py reads the frequency with moe_freq_type)
    "moe-router-score-function": (_STR, ("softmax", "sigmoid")),
    "moe-router-enable-expert-bias": (_FLAG, ()),
    "moe-router-num-groups": (_INT, ()),
    "moe-router-group-topk": (_INT, ()),
    "moe-router-topk-scaling-factor": (_STR, ()),
    "moe-ffn-hidden-size": (_INT, ()),
    "moe-layer-freq": (_FREQ, ()),
    "micro-batch-size": (_INT, ()),
    "global-batch-size": (_INT, ()),
    "rampup-batch-size": (_LIST, ()),
    "recompute-granularity": (_STR, ("full", "selective")),
    "recompute-method": (_STR, ("uniform", "block")),
    "recompute-num-layers": (_INT, ()),
    "recompute-activations": (_FLAG, ()),
    "recompute-modules": (_LIST, ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")),
    "distribute-saved-activations": (_FLAG, ()),
    "use-distributed-optimizer": (_FLAG, ()),
    "num-distributed-optimizer-instances": (_INT, ()),
    "overlap-grad-reduce": (_FLAG, ()),
    "overlap-param-gather": (_FLAG, ()),
    "use-torch-fsdp2": (_FLAG, ()),
    "use-megatron-fsdp": (_FLAG, ()),
    "data-parallel-sharding-strategy": (_STR, ("no_shard", "optim", "optim_grads", "optim_grads_params")),
    "no-gradient-accumulation-fusion": (_FLAG, ()),
    "ckpt-format": (_STR, ("torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor")),
    "cpu-offloading-num-layers": (_INT, ()),
    # the CPU optimizer (OptimizerConfig.optimizer_cpu_offload, optimizer_offload_fraction,
    # use_precision_aware_optimizer, overlap_cpu_optimizer_d2h_h2d in megatron-core 0.16.1)
    "optimizer-cpu-offload": (_FLAG, ()),
    "optimizer-offload-fraction": (_STR, ()),
    "use-precision-aware-optimizer": (_FLAG, ()),
    "overlap-cpu-optimizer-d2h-h2d": (_FLAG, ()),
    "bf16": (_FLAG, ()),
    "fp16": (_FLAG, ()),
    # FP8 through Transformer Engine (TransformerConfig.fp8, fp8_recipe, fp8_amax_history_len,
    # fp8_amax_compute_algo in megatron-core 0.16.1)
    "fp8-format": (_STR, ("e4m3", "hybrid")),
    "fp8-recipe": (_STR, ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")),
    "fp8-amax-history-len": (_INT, ()),
    "fp8-amax-compute-algo": (_STR, ("most_recent", "max")),
    "fp8-param-gather": (_FLAG, ()),  # TransformerConfig.fp8_param, DistributedDataParallelConfig.fp8_param_gather
    "optimizer": (_STR, ("adam", "sgd")),
    "distributed-backend": (_STR, ("nccl", "gloo")),
    "use-tp-pp-dp-mapping": (_FLAG, ()),
    "num-layers": (_INT, ()),
    "hidden-size": (_INT, ()),
    "ffn-hidden-size": (_INT, ()),
    "num-attention-heads": (_INT, ()),
    "num-query-groups": (_INT, ()),
    "group-query-attention": (_FLAG, ()),
    "kv-channels": (_INT, ()),
    "seq-length": (_INT, ()),
    # pretrain_t5.py: the decoder's tokens per sequence (T5MaskedWordPieceDatasetConfig.sequence_length_decoder)
    "decoder-seq-length": (_INT, ()),
    "max-position-embeddings": (_INT, ()),
    "position-embedding-type": (_STR, ("learned_absolute", "rope", "mrope", "relative", "none")),
    "rotary-base": (_INT, ()),
    "rotary-percent": (_STR, ()),
    # channel pairs (2i, 2i + 1): TransformerConfig.rotary_interleaved, megatron-core 0.16.1 rope_utils._rotate_half
    "rotary-interleaved": (_FLAG, ()),
    # Llama 3.1's scaled RoPE and layers without RoPE (RotaryEmbedding's rope_scaling / rope_scaling_factor and
    # TransformerConfig.no_rope_freq in megatron-core 0.16.1; arguments.py reads the frequency with
    # no_rope_freq_type: an integer, or a per-layer list written as a Python list expression)
    "use-rope-scaling": (_FLAG, ()),
    "rope-scaling-factor": (_STR, ()),
    "no-rope-freq": (_FREQ, ()),
    "norm-epsilon": (_STR, ()),  # TransformerConfig.layernorm_epsilon (a float)
    "normalization": (_STR, ("LayerNorm", "RMSNorm")),
    # zero-centred norm weights (TransformerConfig.layernorm_zero_centered_gamma, whose argparse_meta names
    # --apply-layernorm-1p) and the module implementation that honours it or not (transformer_impl, default
    # transformer_engine, in megatron-core 0.16.1)
    "apply-layernorm-1p": (_FLAG, ()),
    "transformer-impl": (_STR, ("local", "transformer_engine", "inference_optimized")),
    # Megatron-LM's core_transformer_config_from_args: persist_layer_norm = not args.no_persist_layer_norm; a BERT
    # without Apex needs it (WrappedTorchNorm asserts persist_layer_norm off: exporters.megatron.families.family_notes)
    "no-persist-layer-norm": (_FLAG, ()),
    "swiglu": (_FLAG, ()),
    "disable-bias-linear": (_FLAG, ()),
    "add-qkv-bias": (_FLAG, ()),
    "untie-embeddings-and-output-weights": (_FLAG, ()),
    # pretrain_bert.py: the pooler and sentence-order head off (store_false into args.bert_binary_head)
    "bert-no-binary-head": (_FLAG, ()),
    # pretrain_mamba.py (MambaModel): the layer pattern, the mixer's sizes (TransformerConfig.mamba_num_heads,
    # mamba_head_dim, mamba_num_groups, mamba_state_dim in megatron-core 0.16.1), the stack's ModuleSpec
    # (module and name), and TransformerConfig.activation_func = squared_relu
    "hybrid-override-pattern": (_STR, ()),
    "mamba-num-heads": (_INT, ()),
    "mamba-head-dim": (_INT, ()),
    "mamba-num-groups": (_INT, ()),
    "mamba-state-dim": (_INT, ()),
    "spec": (_LIST, ()),
    "squared-relu": (_FLAG, ()),
    # multi-latent attention (MLATransformerConfig.q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim,
    # v_head_dim, rope_type and TransformerConfig.multi_latent_attention, qk_layernorm in megatron-core 0.16.1)
    "multi-latent-attention": (_FLAG, ()),
    "q-lora-rank": (_INT, ()),
    "kv-lora-rank": (_INT, ()),
    "qk-head-dim": (_INT, ()),
    "qk-pos-emb-head-dim": (_INT, ()),
    "v-head-dim": (_INT, ()),
    "qk-layernorm": (_FLAG, ()),
    "rope-type": (_STR, ("rope", "yarn")),
    # sliding-window attention (TransformerConfig.window_size, window_attn_skip_freq in megatron-core 0.16.1;
    # arguments.py parses "left,right" with tuple_type and the frequency with moe_freq_type: an integer, or a
    # per-layer list written as a Python list expression)
    "window-size": (_STR, ()),
    "window-attn-skip-freq": (_FREQ, ()),
    # GPT-OSS's attention sinks and quick-GEGLU MLP (TransformerConfig.softmax_type, activation_func = quick_gelu with
    # gated_linear_unit, activation_func_clamp_value, glu_linear_offset, bias_activation_fusion in megatron-core 0.16.1;
    # arguments.py's --no-bias-gelu-fusion stores False into bias_gelu_fusion)
    "softmax-type": (_STR, ("learnable", "vanilla", "off-by-one")),
    "quick-geglu": (_FLAG, ()),
    "activation-func-clamp-value": (_STR, ()),
    "glu-linear-offset": (_STR, ()),
    "no-bias-gelu-fusion": (_FLAG, ()),
}

_POSITIVE_INTS = (
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "num-experts",
    "moe-shared-expert-intermediate-size",
    "micro-batch-size",
    "global-batch-size",
    "recompute-num-layers",
    "num-layers-per-virtual-pipeline-stage",
    "num-virtual-stages-per-pipeline-rank",
    "num-distributed-optimizer-instances",
    "num-layers",
    "hidden-size",
    "ffn-hidden-size",
    "num-attention-heads",
    "num-query-groups",
    "kv-channels",
    "seq-length",
    "decoder-seq-length",
    "max-position-embeddings",
    "fp8-amax-history-len",
    "mamba-num-heads",
    "mamba-head-dim",
    "mamba-num-groups",
    "mamba-state-dim",
    "q-lora-rank",
    "kv-lora-rank",
    "qk-head-dim",
    "qk-pos-emb-head-dim",
    "v-head-dim",
)


def parse_megatron_args(args: Sequence[str] | str) -> dict[str, Any]:
    """Parse a Megatron-LM argument list into ``{flag name: value}`` (flags without ``--``).

    Store-true flags map to ``True``, list flags to a list of strings, int flags to ``int``.

    Raises
    ------
    InputError
        For an unknown flag, a missing value, a non-integer where an integer is needed, or a value
        outside the flag's choices.

    Examples
    --------
    >>> parse_megatron_args("--tensor-model-parallel-size 2 --bf16 --recompute-modules core_attn mlp")
    {'tensor-model-parallel-size': 2, 'bf16': True, 'recompute-modules': ['core_attn', 'mlp']}
    """
    tokens = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
    parsed: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise InputError(f"Megatron argument '{token}' is not a --flag; write flags as --name value")
        name, eq, inline = token[2:].partition("=")
        if name not in MEGATRON_FLAGS:
            raise InputError(f"unknown Megatron flag --{name}; use one of the flags in exporters.validate.MEGATRON_FLAGS")
        kind, choices = MEGATRON_FLAGS[name]
        i += 1
        if kind == _FLAG:
            if eq:
                raise InputError(f"--{name} takes no value; drop '={inline}'")
            parsed[name] = True
            continue
        values = [inline] if eq else []
        if not eq:
            while i < len(tokens) and not tokens[i].startswith("--"):
                values.append(tokens[i])
                i += 1
                if kind != _LIST:
                    break
        if not values:
            raise InputError(f"--{name} needs a value")
        for value in values:
            if choices and value not in choices:
                raise InputError(f"--{name} {value} is not one of {', '.join(choices)}")
        if kind == _INT:
            try:
                parsed[name] = int(values[0])
            except ValueError:
                raise InputError(f"--{name} needs an integer (got '{values[0]}')") from None
        elif kind == _FREQ:
            parsed[name] = _freq_value(name, values[0])
        elif kind == _LIST:
            parsed[name] = values
        else:
            parsed[name] = values[0]
    return parsed


_FREQ_PATTERN_MAX = 1 << 20
"""Most entries a per-layer list may expand to: more layers than any model has (a bound on
``[1]*N``, which Megatron-LM's ``eval`` would build whatever its size)."""


def _freq_value(name: str, text: str) -> int | list[int]:
    """``text`` as Megatron-LM's ``moe_freq_type`` reads it: an integer, or (with a ``[``) a list
    expression of digits, commas, brackets, ``+`` and ``*`` (``_eval_pattern``'s characters), here
    evaluated over list and integer literals only.

    Examples
    --------
    >>> _freq_value("window-attn-skip-freq", "[0]*1+[1]*2"), _freq_value("window-attn-skip-freq", "6")
    ([0, 1, 1], 6)
    """
    if "[" not in text:
        try:
            return int(text)
        except ValueError:
            raise InputError(f"--{name} needs an integer or a list expression such as [1]*3+[0] (got '{text}')") from None

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Mult):  # bound a list's repetition before building it
                sizes = [len(v) * w for v, w in ((left, right), (right, left)) if isinstance(v, list) and isinstance(w, int)]
                if sizes and max(sizes) > _FREQ_PATTERN_MAX:
                    raise ValueError("too long")
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError("not a list expression")

    try:
        if re.search(r"[^,\d\[\]\(\)\+\*]", text):
            raise ValueError("characters")
        found = value(ast.parse(text, mode="eval").body)
        if not isinstance(found, list) or not all(type(e) is int for e in found):
            raise ValueError("not a flat list")
    except (SyntaxError, ValueError, TypeError):
        raise InputError(f"--{name} {text} is not a list expression of integers such as [1]*3+[0] (digits, commas, "
                         "brackets, + and *)") from None
    return found


def megatron_violations(
    args: Sequence[str] | str | Mapping[str, Any],
    *,
    world_size: int,
    env: Mapping[str, str] | None = None,
    device_arch: int = 9,
) -> list[str]:
    """Every Megatron-LM rule (reference §1.2) that ``args`` breaks at ``world_size`` processes.

    Parameters
    ----------
    args:
        The argument list (or a dict from :func:`parse_megatron_args`).
    world_size:
        Processes (``WORLD_SIZE`` under torchrun).
    env:
        The launch environment (``CUDA_DEVICE_MAX_CONNECTIONS``).
    device_arch:
        GPU compute capability major (Hopper 9); from 10 (Blackwell) the
        ``CUDA_DEVICE_MAX_CONNECTIONS`` rule no longer applies.

    Returns
    -------
    list[str]
        One line per violated rule, empty when the plan is valid.
    """
    a = dict(args) if isinstance(args, Mapping) else parse_megatron_args(args)
    env = dict(env or {})
    out: list[str] = []
    for name in _POSITIVE_INTS:
        if name in a and a[name] < 1:
            out.append(f"--{name} must be at least 1 (got {a[name]})")
    if world_size < 1:
        out.append(f"world size must be at least 1 (got {world_size})")
    if out:
        return out
    dp = _megatron_parallel_rules(a, world_size, out)
    tp = a.get("tensor-model-parallel-size", 1)
    pp = a.get("pipeline-model-parallel-size", 1)
    cp = a.get("context-parallel-size", 1)
    ep = a.get("expert-model-parallel-size", 1)
    for required in ("num-layers", "hidden-size", "num-attention-heads", "max-position-embeddings", "micro-batch-size"):
        if required not in a:
            out.append(f"--{required} is required")
    layers = a.get("num-layers")
    vpp = _megatron_pipeline_rules(a, layers, pp, out)
    _megatron_attention_rules(a, tp, out)
    _megatron_size_rules(a, tp, cp, out)
    _megatron_batch_rules(a, dp, pp, vpp, out)
    _megatron_recompute_rules(a, tp, out)
    if a.get("fp16") and a.get("bf16"):
        out.append("--fp16 and --bf16 are mutually exclusive")
    _megatron_optimizer_rules(a, pp, ep, tp, cp, env, device_arch, out)
    instances = a.get("num-distributed-optimizer-instances", 1)
    if instances > 1 and not a.get("use-distributed-optimizer"):  # a partial distributed optimizer is one, sharded less
        out.append("--num-distributed-optimizer-instances needs --use-distributed-optimizer")
    if dp and (dp * cp) % instances:  # megatron-core 0.16.1 parallel_state.initialize_model_parallel's assert
        out.append(f"--num-distributed-optimizer-instances {instances} does not divide dp x cp = {dp * cp}")
    _megatron_fp8_rules(a, device_arch, out)
    _megatron_moe_rules(a, out)
    _megatron_norm_rules(a, out)
    return out


def _megatron_norm_rules(a: Mapping[str, Any], out: list[str]) -> None:
    """Where megatron-core 0.16.1 builds no norm that honours ``--apply-layernorm-1p``: ``TransformerConfig``
    asserts it off under ``inference_optimized`` (``transformer/transformer_config.py:1980-1982``), and the local
    implementation builds RMSNorm as ``WrappedTorchNorm`` (``models/backends.py:104-111``), which asserts it off
    (``transformer/torch_norm.py:26-28``). Transformer Engine's norms honour it (:mod:`exporters.megatron.families`)."""
    if not a.get("apply-layernorm-1p"):
        return
    impl = a.get("transformer-impl", "transformer_engine")
    if impl == "inference_optimized":
        out.append("--apply-layernorm-1p is not supported with --transformer-impl inference_optimized "
                   "(TransformerConfig asserts layernorm_zero_centered_gamma off)")
    elif impl == "local" and a.get("normalization") == "RMSNorm":
        out.append("--apply-layernorm-1p with --transformer-impl local and --normalization RMSNorm: the local RMSNorm "
                   "(WrappedTorchNorm) does not support zero_centered_gamma; use --transformer-impl transformer_engine")


def _megatron_moe_rules(a: Mapping[str, Any], out: list[str]) -> None:
    """``TransformerConfig.__post_init__``'s router rules (megatron-core 0.16.1) and the MoE layer pattern's
    length (``gpt_layer_specs.get_gpt_decoder_block_spec`` asserts one entry per layer)."""
    experts, topk = a.get("num-experts"), a.get("moe-router-topk", 2)  # moe_router_topk's default: 2
    moe_only = [f for f in ("moe-ffn-hidden-size", "moe-layer-freq", "moe-router-num-groups") if f in a]
    if experts is None:
        out += [f"--{f} needs --num-experts" for f in moe_only]
        return
    sigmoid = a.get("moe-router-score-function", "softmax") == "sigmoid"
    if a.get("moe-router-enable-expert-bias") and not sigmoid:
        out.append("--moe-router-enable-expert-bias only supports --moe-router-score-function sigmoid")
    if topk == 1 and not sigmoid and not a.get("moe-router-pre-softmax"):
        out.append("Please use --moe-router-pre-softmax when topk is 1.")
    groups, kept = a.get("moe-router-num-groups"), a.get("moe-router-group-topk")
    if kept and not groups:
        out.append("When using group limited routing, --moe-router-num-groups must be specified.")
    if kept and groups and (experts % groups or kept > groups):
        out.append(f"--num-experts ({experts}) must be divisible by --moe-router-num-groups ({groups}), which must be "
                   f"at least --moe-router-group-topk ({kept})")
    scale = a.get("moe-router-topk-scaling-factor")
    if scale is not None and not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", scale):
        out.append(f"--moe-router-topk-scaling-factor {scale} is not a number")
    _layer_pattern_rule(a, "moe-layer-freq", ("dense", "MoE"), out)


def _megatron_fp8_rules(a: Mapping[str, Any], device_arch: int, out: list[str]) -> None:
    """``TransformerConfig.__post_init__``'s FP8 rules (megatron-core 0.16.1) and the FP8 recipe options,
    which take no effect without ``--fp8-format`` (the export never writes them alone)."""
    fp8 = a.get("fp8-format")
    recipe = a.get("fp8-recipe", "delayed")
    options = [f for f in ("fp8-recipe", "fp8-amax-history-len", "fp8-amax-compute-algo") if f in a]
    if a.get("fp8-param-gather") and not (a.get("use-distributed-optimizer") or a.get("use-megatron-fsdp")
                                         or a.get("use-torch-fsdp2")):  # validate_args' assertion
        out.append("--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp, or inference mode")
    if fp8 is None:
        out += [f"--{f} needs --fp8-format" for f in options]
        out += ["fp8_param must be used together with fp8 mode."] if a.get("fp8-param-gather") else []
        return
    if recipe == "custom":
        out.append("fp8_quantizer_factory must be provided when fp8_recipe is 'custom'")
    if recipe == "mxfp8" and device_arch < 10:
        out.append("--fp8-recipe mxfp8 is for the Blackwell architecture only")
    if recipe == "delayed" and {"moe_act", "layernorm"} & set(a.get("recompute-modules") or ()):
        out.append("Delayed scaling does not support moe_act and layernorm recompute for fp8.")


def _megatron_parallel_rules(a: Mapping[str, Any], world_size: int, out: list[str]) -> int:
    """The world size against tp x pp x cp and etp x ep x pp, experts against ep, and sequence
    parallelism against tp; returns the data-parallel size."""
    tp = a.get("tensor-model-parallel-size", 1)
    pp = a.get("pipeline-model-parallel-size", 1)
    cp = a.get("context-parallel-size", 1)
    ep = a.get("expert-model-parallel-size", 1)
    etp = a.get("expert-tensor-parallel-size", tp)
    model_size = tp * pp * cp
    if world_size % model_size:
        out.append(f"world size ({world_size}) is not divisible by tp*pp*cp ({model_size})")
    if world_size % (etp * ep * pp):
        out.append(f"world size ({world_size}) is not divisible by etp*ep*pp ({etp * ep * pp})")
    dp = max(1, world_size // model_size)
    if ep > 1:
        if "num-experts" not in a:
            out.append("--expert-model-parallel-size > 1 needs --num-experts")
        elif a["num-experts"] % ep:
            out.append(f"--num-experts ({a['num-experts']}) must be a multiple of --expert-model-parallel-size ({ep})")
    if a.get("softmax-type", "vanilla") != "vanilla":
        _learnable_softmax_rules(a, cp, out)
    if "num-experts" in a and not a.get("disable-bias-linear") and etp != 1:
        # TransformerConfig.__post_init__ (megatron-core 0.16.1 transformer_config.py:1588-1591); etp defaults to tp
        out.append(f"Bias in Moe is only supported when ETP==1 (the linears keep their biases: no --disable-bias-linear; "
                   f"etp is {etp})")
    if a.get("quick-geglu") and (a.get("swiglu") or a.get("squared-relu")):  # core_transformer_config_from_args asserts
        out.append("--quick-geglu does not go with --swiglu or --squared-relu")
    if a.get("sequence-parallel") and tp == 1:
        out.append("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if a.get("tp-comm-overlap") and not a.get("sequence-parallel"):
        # validate_args: "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism is enabled"
        out.append("--tp-comm-overlap needs --sequence-parallel")
    if a.get("cuda-graph-impl", "none") != "none":  # validate_args and TransformerConfig.__post_init__
        if a.get("recompute-granularity") == "full":
            out.append("recompute_granularity must not be full when CUDA Graphs are enabled")
        if a.get("cpu-offloading-num-layers", 0) > 0:
            out.append("CUDA graphs not supported with CPU offloading")
        if a.get("recompute-granularity") == "selective":
            _graphed_recompute_rules(a, out)
    return dp


def _learnable_softmax_rules(a: Mapping[str, Any], cp: int, out: list[str]) -> None:
    """A softmax with an offset (``--softmax-type learnable`` / ``off-by-one``: GPT-OSS's sinks) in TransformerEngine
    2.8+, the version megatron-core 0.16.1 asserts for it (``extensions/transformer_engine.py:1283-1288``):
    ``get_attention_backend`` disables FlashAttention for it ("Disabling FlashAttention for softmax_type"), so
    only the fused (cuDNN) and unfused backends run it, and its context parallelism is the all-to-all exchange only
    (TransformerEngine PR #2148; its ``test_attention_with_cp.py`` skips the others for non-vanilla softmax)."""
    if a.get("attention-backend") == "flash":
        out.append(f"--softmax-type {a['softmax-type']} does not run on TransformerEngine's FlashAttention (only fused "
                   "and unfused take a softmax offset); plan with --attention cudnn or explicit")
    if cp > 1 and a.get("cp-comm-type", ["p2p"]) != ["a2a"]:
        out.append(f"--softmax-type {a['softmax-type']} runs context parallelism only with --cp-comm-type a2a in "
                   "TransformerEngine")


def _graphed_recompute_rules(a: Mapping[str, Any], out: list[str]) -> None:
    """TransformerConfig.__post_init__ under whole-layer CUDA graphs (no --cuda-graph-scope): a recomputed module
    inside the graph draws no random numbers, so dropout refuses it; the flags validated here set none, so both
    dropouts are Megatron-LM's default 0.1."""
    modules = set(a.get("recompute-modules") or ["core_attn"])
    if "core_attn" in modules:
        out.append("attention dropout is not supported with graphed attention recomputation")
    if {"mlp", "moe"} & modules:
        out.append("hidden dropout is not supported with graphed MLP/MoE recomputation")


def _whole(text: str) -> bool:
    """Whether ``text`` is an integer as ``int()`` reads one (a sign, digits, spaces around)."""
    return text.strip().lstrip("+-").isdigit()


def _megatron_attention_rules(a: Mapping[str, Any], tp: int, out: list[str]) -> None:
    """Heads against tp, query groups (GQA) against tp and heads, and hidden size against heads."""
    heads = a.get("num-attention-heads")
    if heads is None:
        return
    if heads % tp:
        out.append(f"num_attention_heads ({heads}) must be a multiple of tensor_model_parallel_size ({tp})")
    groups = a.get("num-query-groups")
    if groups is not None and not a.get("group-query-attention"):
        out.append("--num-query-groups takes effect only with --group-query-attention")
    if a.get("group-query-attention"):
        if groups is None:
            out.append("--group-query-attention needs --num-query-groups")
        else:
            if groups % tp and tp % groups:
                out.append(f"num_query_groups ({groups}) must be a multiple or divisor of tensor_model_parallel_size ({tp})")
            if heads % groups:
                out.append(f"num_attention_heads ({heads}) must be a multiple of num_query_groups ({groups})")
    hidden = a.get("hidden-size")
    if hidden is not None and "kv-channels" not in a and hidden % heads:
        out.append(f"hidden_size ({hidden}) must be divisible by num_attention_heads ({heads}) unless --kv-channels is set")
    window = a.get("window-size")  # arguments.py's tuple_type: "left,right" integers, -1 infinite
    sides = window.strip("()").split(",") if window is not None else []
    if window is not None and (len(sides) != 2 or not all(_whole(side) and int(side) >= -1 for side in sides)):
        out.append(f"--window-size {window} is not two integers 'left,right' (-1: infinite)")
    if "window-attn-skip-freq" in a and window is None:
        out.append("--window-attn-skip-freq takes effect only with --window-size")
    # is_layer_window_attention reads entry layer_number - 1: one per layer, 1 windowed, 0 full
    _layer_pattern_rule(a, "window-attn-skip-freq", ("full", "windowed"), out)
    # TransformerConfig.__post_init__ (megatron-core 0.16.1 transformer_config.py:1963-1978): an integer N must
    # divide the layers, a list holds one entry per layer (1: no RoPE); Attention.forward reads layer_number - 1
    _layer_pattern_rule(a, "no-rope-freq", ("RoPE", "no RoPE"), out)
    no_rope, layers = a.get("no-rope-freq"), a.get("num-layers")
    if isinstance(no_rope, int) and no_rope >= 1 and layers is not None and layers % no_rope:
        out.append(f"--no-rope-freq {no_rope} must divide the {layers} layers")


def _layer_pattern_rule(a: Mapping[str, Any], flag: str, meanings: tuple[str, str], out: list[str]) -> None:
    """A per-layer pattern flag as :func:`_freq_value` reads it (``--moe-layer-freq``,
    ``--window-attn-skip-freq``): a number is every N-th layer, at least 1; a list holds one 0 or 1
    (``meanings``) per layer."""
    freq, layers = a.get(flag), a.get("num-layers")
    if isinstance(freq, int) and freq < 1:
        out.append(f"--{flag} must be at least 1 (got {freq})")
    if isinstance(freq, list) and (not set(freq) <= {0, 1} or (layers is not None and len(freq) != layers)):
        out.append(f"--{flag}'s list must hold one 0 ({meanings[0]}) or 1 ({meanings[1]}) per layer ({layers} layers; "
                   f"got {len(freq)} entries)")


def _megatron_size_rules(a: Mapping[str, Any], tp: int, cp: int, out: list[str]) -> None:
    """FFN size against tp, sequence length against cp and the position table, and the hierarchical
    context-parallel sizes against cp."""
    ffn = a.get("ffn-hidden-size")
    if ffn is not None and ffn % tp:
        out.append(f"ffn_hidden_size ({ffn}) must be divisible by tensor_model_parallel_size ({tp})")
    seq = a.get("seq-length")
    if cp > 1 and seq is not None and seq % (2 * cp):
        out.append(f"seq_length ({seq}) must be a multiple of 2*context_parallel_size ({2 * cp})")
    if "a2a+p2p" in a.get("cp-comm-type", []):
        sizes = [int(s) for s in a.get("hierarchical-context-parallel-sizes", [])]
        if math.prod(sizes) != cp:
            out.append(f"--hierarchical-context-parallel-sizes {sizes} must multiply to --context-parallel-size ({cp})")
    if seq is not None and "max-position-embeddings" in a and a["max-position-embeddings"] < seq:
        out.append(f"max_position_embeddings ({a['max-position-embeddings']}) must be >= seq_length ({seq})")
    decoder = a.get("decoder-seq-length")  # validate_args: max_position_embeddings >= decoder_seq_length
    if decoder is not None and "max-position-embeddings" in a and a["max-position-embeddings"] < decoder:
        out.append(f"max_position_embeddings ({a['max-position-embeddings']}) must be >= decoder_seq_length ({decoder})")


def _megatron_batch_rules(a: Mapping[str, Any], dp: int, pp: int, vpp: int | None, out: list[str]) -> None:
    """The global batch against micro-batch x dp, and the interleaved schedule's micro-batch groups of pp."""
    mbs = a.get("micro-batch-size")
    gbs = a.get("global-batch-size")
    if mbs is not None and gbs is not None and gbs % (mbs * dp):
        out.append(
            f"global batch size ({gbs}) is not divisible by micro batch size ({mbs}) times data parallel size ({dp})"
        )
    elif vpp is not None and mbs is not None and gbs is not None:
        # schedules.forward_backward_pipelining_with_interleaving: micro-batch groups of pp (the default)
        microbatches = gbs // (mbs * dp)
        if microbatches < pp or microbatches % pp:
            out.append(
                f"the interleaved schedule needs the micro-batches per step ({microbatches}) to be a multiple of "
                f"--pipeline-model-parallel-size ({pp})"
            )


_LAYOUT_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


def parse_pipeline_layout(text: str) -> list[str]:
    """Unroll a ``--pipeline-model-parallel-layout`` string into one string of layer letters per
    (virtual) stage, as ``PipelineParallelLayerLayout.parse_str_to_list`` does (megatron-core 0.16.1):
    commas are cosmetic, ``(...)*n`` and ``x*n`` repeat, ``|`` separates stages.

    Raises
    ------
    InputError
        For a letter other than ``E`` (embedding), ``t`` (transformer layer), ``m`` (MTP) or ``L`` (loss).

    Examples
    --------
    >>> parse_pipeline_layout("Et*2|(tt|)*2,t*2L")
    ['Ett', 'tt', 'tt', 'ttL']
    """
    unrolled = text.replace(",", "")
    unrolled = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), unrolled)
    unrolled = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), unrolled)
    stages = unrolled.split("|")
    for stage in stages:
        for letter in stage:
            if letter not in _LAYOUT_CHARS:
                raise InputError(
                    f"--pipeline-model-parallel-layout '{text}' has the letter '{letter}'; use E, t, m, L, |, ( )*n and x*n"
                )
    return stages


def _megatron_pipeline_rules(a: Mapping[str, Any], layers: int | None, pp: int, out: list[str]) -> int | None:
    """The pipeline rules of ``validate_args`` (VA) and ``TransformerConfig`` (TC); returns the
    virtual pipeline size (``None``: no interleaving)."""
    vpp_options = [
        n
        for n in ("num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank", "pipeline-model-parallel-layout")
        if n in a
    ]
    if len(vpp_options) > 1:
        out.append(f"at most one of --{', --'.join(vpp_options)} may be set")
    first = a.get("decoder-first-pipeline-num-layers")
    last = a.get("decoder-last-pipeline-num-layers")
    accounted = [n for n in ("account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split") if a.get(n)]
    counted = None if layers is None else layers + len(accounted)
    layout = a.get("pipeline-model-parallel-layout")
    vpp_layers = a.get("num-layers-per-virtual-pipeline-stage")
    vpp: int | None = None
    if (first is not None or last is not None) and accounted:
        out.append("--decoder-first/last-pipeline-num-layers cannot be combined with --account-for-*-in-pipeline-split")
    if layout is not None:
        stages = parse_pipeline_layout(layout)
        if len(stages) % pp:
            out.append(f"the pipeline layout has {len(stages)} stages, not a multiple of --pipeline-model-parallel-size ({pp})")
        else:
            vpp = len(stages) // pp
        if first is not None or last is not None or accounted:
            out.append("--pipeline-model-parallel-layout cannot be set with other pipeline layout arguments")
        flat = "".join(stages)
        if not flat.startswith("E") or not flat.endswith("L"):
            out.append("the pipeline layout must start with the embedding (E) and end with the loss (L)")
        if flat.count("E") != 1 or flat.count("L") != 1:
            out.append("the pipeline layout must name the embedding (E) and the loss (L) exactly once")
        if layers is not None and flat.count("t") != layers:
            out.append(f"the pipeline layout has {flat.count('t')} transformer layers (t) but --num-layers is {layers}")
        if "m" in flat:
            out.append("the pipeline layout places MTP layers (m) but the model has none")
    elif vpp_layers is not None or "num-virtual-stages-per-pipeline-rank" in a:
        if "num-virtual-stages-per-pipeline-rank" in a:
            vpp = a["num-virtual-stages-per-pipeline-rank"]
        else:
            if first is not None or last is not None:
                out.append(
                    "uneven pipeline stages need --num-virtual-stages-per-pipeline-rank, not "
                    "--num-layers-per-virtual-pipeline-stage"
                )
            elif counted is not None:
                if counted % pp:
                    out.append(f"number of layers ({counted}) should be divisible by the pipeline-model-parallel size ({pp})")
                elif (counted // pp) % vpp_layers:
                    out.append(
                        f"layers per pipeline stage ({counted // pp}) must be divisible by layers per virtual stage "
                        f"({vpp_layers})"
                    )
                else:
                    vpp = counted // pp // vpp_layers
    elif counted is not None and first is None and last is None and counted % pp:
        out.append(f"number of layers ({counted}) should be divisible by the pipeline-model-parallel size ({pp})")
    if vpp is not None and vpp <= 1:
        vpp = None
    if vpp is not None or vpp_layers is not None or "num-virtual-stages-per-pipeline-rank" in a:
        minimum = 2 if a.get("no-overlap-p2p-communication") else 1
        if pp <= minimum:
            out.append(f"virtual pipeline stages need --pipeline-model-parallel-size > {minimum}")
    if layout is None and (first is not None or last is not None) and layers is not None:
        _uneven_stage_rules(layers, pp, first, last, vpp, out)
    return vpp


def _uneven_stage_rules(layers: int, pp: int, first: int | None, last: int | None, vpp: int | None, out: list[str]) -> None:
    """TransformerConfig's uneven pipeline rules (megatron-core 0.16.1)."""
    remaining_layers, remaining_stages = layers, pp
    for name, value in (("first", first), ("last", last)):
        if value is None:
            continue
        if value <= 0:
            out.append(f"--decoder-{name}-pipeline-num-layers must be larger than 0 (got {value})")
        if vpp is not None and value % vpp:
            out.append(f"layers of the {name} pipeline stage ({value}) must be divisible by the virtual pipeline size ({vpp})")
        remaining_layers -= value
        remaining_stages -= 1
    if bool(remaining_layers) != bool(remaining_stages):
        out.append(f"{remaining_layers} middle layers remain for {remaining_stages} middle pipeline stages")
    elif remaining_stages:
        if remaining_layers % remaining_stages:
            out.append(
                f"layers of the middle stages ({remaining_layers}) must be divisible by the middle stages ({remaining_stages})"
            )
        elif vpp is not None and (remaining_layers // remaining_stages) % vpp:
            out.append(
                f"layers of each middle stage ({remaining_layers // remaining_stages}) must be divisible by the virtual "
                f"pipeline size ({vpp})"
            )


def _megatron_offload_rules(a: Mapping[str, Any], out: list[str]) -> None:
    """CPU offload (megatron-core 0.16.1): ``TransformerConfig.__post_init__`` keeps the offloaded layers
    below ``num_layers`` and refuses them with pipelines; ``OptimizerConfig.__post_init__`` runs the
    precision-aware optimizer with Adam on the distributed optimizer only; the offload fraction is a
    fraction, and the optimizer's offload options take no effect without ``--optimizer-cpu-offload``."""
    offloaded = a.get("cpu-offloading-num-layers", 0)
    if offloaded > 0:
        if offloaded >= a.get("num-layers", offloaded + 1):
            out.append(f"CPU offloading can be done only for layers less than {a.get('num-layers')}")
        if a.get("pipeline-model-parallel-size", 1) > 1:
            out.append("Currently there is no support for Pipeline parallelism with CPU offloading")
    if a.get("use-precision-aware-optimizer"):
        if a.get("optimizer", "adam") != "adam":
            out.append("--use-precision-aware-optimizer only supported with adam")
        if not a.get("use-distributed-optimizer"):
            out.append("--use-precision-aware-optimizer only supported with distributed optimizer")
    fraction = a.get("optimizer-offload-fraction")
    if fraction is not None:
        try:
            valid = 0.0 <= float(fraction) <= 1.0
        except ValueError:
            valid = False
        if not valid:
            out.append(f"--optimizer-offload-fraction must be a number in [0, 1] (got {fraction!r})")
    if not a.get("optimizer-cpu-offload"):
        out += [f"--{f} needs --optimizer-cpu-offload" for f in ("optimizer-offload-fraction", "overlap-cpu-optimizer-d2h-h2d")
                if f in a]


def _megatron_recompute_rules(a: Mapping[str, Any], tp: int, out: list[str]) -> None:
    granularity = a.get("recompute-granularity")
    if a.get("recompute-activations"):
        if granularity == "full":
            out.append("--recompute-activations means selective recompute; do not combine it with --recompute-granularity full")
        granularity = "selective"
    method = a.get("recompute-method")
    if granularity == "full":
        if method is None:
            out.append("--recompute-granularity full needs --recompute-method uniform or block")
        if "recompute-num-layers" not in a:
            out.append("--recompute-granularity full needs --recompute-num-layers")
    elif granularity == "selective":
        if method is not None:
            out.append("--recompute-method is not supported with selective recompute")
        if "recompute-num-layers" in a:
            out.append("--recompute-num-layers is not supported with selective recompute")
        _megatron_recompute_module_rules(a, out)
    elif method is not None or "recompute-num-layers" in a:
        out.append("--recompute-method and --recompute-num-layers need --recompute-granularity full")
    if a.get("cpu-offloading-num-layers", 0) > 0 and granularity is not None:
        out.append("CPU offloading (--cpu-offloading-num-layers) is not compatible with activation recompute")
    _megatron_offload_rules(a, out)
    if a.get("distribute-saved-activations"):
        if tp == 1:
            out.append("--distribute-saved-activations needs --tensor-model-parallel-size > 1")
        if granularity != "full" or method is None:
            out.append("--distribute-saved-activations needs full recompute with a --recompute-method")
        if a.get("sequence-parallel"):
            out.append("--distribute-saved-activations is not allowed with --sequence-parallel")


def _megatron_recompute_module_rules(a: Mapping[str, Any], out: list[str]) -> None:
    """megatron-core 0.16.1's ``TransformerConfig.__post_init__`` on ``--recompute-modules`` (selective;
    the FP8 delayed-scaling rule is with the FP8 rules)."""
    modules = a.get("recompute-modules") or ["core_attn"]
    if "moe_act" in modules and not a.get("moe-grouped-gemm"):
        out.append("moe_act in --recompute-modules is only supported with --moe-grouped-gemm")
    if "mla_up_proj" in modules and not a.get("multi-latent-attention"):
        out.append("mla_up_proj in --recompute-modules is only supported with --multi-latent-attention")


def _megatron_optimizer_rules(
    a: Mapping[str, Any],
    pp: int,
    ep: int,
    tp: int,
    cp: int,
    env: Mapping[str, str],
    device_arch: int,
    out: list[str],
) -> None:
    dist_opt = bool(a.get("use-distributed-optimizer"))
    mfsdp = bool(a.get("use-megatron-fsdp"))
    tfsdp = bool(a.get("use-torch-fsdp2"))
    if a.get("overlap-param-gather") and not ((dist_opt or mfsdp) and a.get("overlap-grad-reduce")):
        out.append("--overlap-param-gather needs --use-distributed-optimizer (or Megatron-FSDP) and --overlap-grad-reduce")
    if mfsdp and tfsdp:
        out.append("--use-megatron-fsdp and --use-torch-fsdp2 are mutually exclusive")
    if tfsdp:
        if pp != 1 or ep != 1:
            out.append("--use-torch-fsdp2 needs pipeline and expert parallel sizes of 1")
        if dist_opt:
            out.append("--use-torch-fsdp2 is not compatible with --use-distributed-optimizer")
        if a.get("fp16"):
            out.append("--use-torch-fsdp2 is not compatible with --fp16")
        if not a.get("untie-embeddings-and-output-weights"):
            out.append("--use-torch-fsdp2 needs --untie-embeddings-and-output-weights")
        if a.get("ckpt-format", "torch_dist") not in ("torch_dist", "torch_dcp"):
            out.append("--use-torch-fsdp2 needs --ckpt-format torch_dist or torch_dcp")
    if mfsdp:
        if a.get("ckpt-format") != "fsdp_dtensor":
            out.append("Megatron-FSDP only supports --ckpt-format fsdp_dtensor")
        if env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
            out.append("Megatron-FSDP requires CUDA_DEVICE_MAX_CONNECTIONS larger than 1; do not set it to 1")
        if a.get("use-tp-pp-dp-mapping"):
            out.append("--use-tp-pp-dp-mapping is not supported with Megatron-FSDP")
    elif a.get("data-parallel-sharding-strategy", "no_shard") != "no_shard":
        out.append("--data-parallel-sharding-strategy takes effect only with --use-megatron-fsdp")
    if (tp > 1 or cp > 1) and device_arch < 10 and not (mfsdp or tfsdp):
        if env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
            out.append("tensor or context parallelism needs the environment variable CUDA_DEVICE_MAX_CONNECTIONS=1")


def validate_megatron(
    args: Sequence[str] | str | Mapping[str, Any],
    *,
    world_size: int,
    env: Mapping[str, str] | None = None,
    device_arch: int = 9,
) -> dict[str, Any]:
    """Check a Megatron-LM launch; returns the parsed flags.

    Raises
    ------
    UnsupportedExport
        With every violated rule (see :func:`megatron_violations`).
    InputError
        For malformed arguments.

    Examples
    --------
    >>> validate_megatron("--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
    ...                   "--max-position-embeddings 128 --micro-batch-size 1", world_size=8)["num-layers"]
    2
    """
    parsed = dict(args) if isinstance(args, Mapping) else parse_megatron_args(args)
    problems = megatron_violations(parsed, world_size=world_size, env=env, device_arch=device_arch)
    if problems:
        raise UnsupportedExport("Megatron-LM would reject this plan: " + "; ".join(problems))
    return parsed
