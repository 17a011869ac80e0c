r"""Pure-Python validators of the launch plans, one per target, covering every rule the libraries enforce.

The rules and where each framework enforces them are in ``/work/shared/reference/export_targets.md``
(section numbers below); each validator returns every violation as a one-line message, and the
``validate_*`` functions raise :class:`~planner.core.errors.UnsupportedExport` with all of them.
Malformed input (an unknown flag, a token without ``:``) raises
:class:`~planner.core.errors.InputError` instead.

Megatron-LM (§1.2; ``megatron-core==0.16.1`` and Megatron-LM ``core_v0.16.1`` ``validate_args``)
    world size divisible by ``tp*pp*cp`` and by ``etp*ep*pp``; experts divisible by ``ep``; sequence
    parallelism needs ``tp > 1``; layers divisible by ``pp`` unless the stages are uneven; uneven
    first/last stages (positive, an evenly divisible middle, divisible by the virtual pipeline size);
    the pipeline layout (stages a multiple of ``pp``, embedding first and loss last, once each, one
    ``t`` per layer, not with the other split options); virtual pipeline rules (one option, ``pp > 1``,
    divisibility, micro-batches a multiple of ``pp`` for the interleaved schedule); heads divisible
    by ``tp``; query groups a multiple or a divisor of ``tp`` and dividing the heads; hidden size
    divisible by the heads unless ``--kv-channels``; ``seq % 2cp`` with context parallelism;
    ``max_position_embeddings >= seq_length``; micro batch set and global batch divisible by
    ``micro * dp``; recompute flag combinations; offload not with recompute; not fp16 and bf16;
    overlap-param-gather prerequisites; torch-FSDP2 and Megatron-FSDP prerequisites;
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with ``tp > 1`` or ``cp > 1`` (not with Megatron-FSDP).

DeepSpeed (§2; ``deepspeed==0.19.8``)
    batch sizes positive integers with ``train_batch_size == micro * accumulation * world`` (the data
    parallel size, or the full world with AutoTP); ZeRO stage 0-3 and only known keys in the strict
    sections; offload devices; not fp16 and bf16; AutoTP keys, ``autotp_size`` dividing the world,
    ZeRO <= 2 with AutoTP, heads and KV heads divisible by it; ``layer_specs`` regexes, partition
    types and sub-parameter shapes; ZeRO-2/3 not with pipeline parallelism; the ``pipeline``
    section's flags booleans and its checkpoint interval a non-negative integer.

Mesh-TensorFlow (§3.2, §3.4; ``mtf.convert_to_shape`` / ``convert_to_layout_rules``)
    the same tokenizer (``[,.;]`` -> space, ``name:value``); unique mesh names, integer sizes >= 1,
    their product the device count; layout rules naming existing mesh dims, each tensor dim mapped
    to at most one mesh dim; per tensor, distinct dimension names, no mesh dim used twice and every
    split size divisible.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from planner.core.errors import InputError, UnsupportedExport

__all__ = [
    "MEGATRON_FLAGS",
    "parse_megatron_args",
    "parse_pipeline_layout",
    "megatron_violations",
    "validate_megatron",
    "deepspeed_violations",
    "validate_deepspeed",
    "parse_mesh_tf_pairs",
    "mesh_tf_violations",
    "validate_mesh_tf",
    "MeshTensor",
]

# ----------------------------------------------------------------------------------------------
# Megatron-LM

_INT, _FLAG, _STR, _LIST = "int", "flag", "str", "list"

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
    "context-parallel-size": (_INT, ()),
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
    "bf16": (_FLAG, ()),
    "fp16": (_FLAG, ()),
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
    "max-position-embeddings": (_INT, ()),
    "position-embedding-type": (_STR, ("learned_absolute", "rope", "mrope", "relative", "none")),
    "normalization": (_STR, ("LayerNorm", "RMSNorm")),
    "swiglu": (_FLAG, ()),
    "disable-bias-linear": (_FLAG, ()),
    "add-qkv-bias": (_FLAG, ()),
    "untie-embeddings-and-output-weights": (_FLAG, ()),
}

_POSITIVE_INTS = (
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "num-experts",
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
    "max-position-embeddings",
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
        elif kind == _LIST:
            parsed[name] = values
        else:
            parsed[name] = values[0]
    return parsed


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
    return out


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
    if a.get("sequence-parallel") and tp == 1:
        out.append("--sequence-parallel needs --tensor-model-parallel-size > 1")
    return dp


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
    elif method is not None or "recompute-num-layers" in a:
        out.append("--recompute-method and --recompute-num-layers need --recompute-granularity full")
    if a.get("cpu-offloading-num-layers", 0) > 0 and granularity is not None:
        out.append("CPU offloading (--cpu-offloading-num-layers) is not compatible with activation recompute")
    if a.get("distribute-saved-activations"):
        if tp == 1:
            out.append("--distribute-saved-activations needs --tensor-model-parallel-size > 1")
        if granularity != "full" or method is None:
            out.append("--distribute-saved-activations needs full recompute with a --recompute-method")
        if a.get("sequence-parallel"):
            out.append("--distribute-saved-activations is not allowed with --sequence-parallel")


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


# ----------------------------------------------------------------------------------------------
# DeepSpeed

# Keys of DeepSpeed 0.19.8's strict (pydantic, extra="forbid") config sections, with aliases.
_ZERO_KEYS = frozenset({
    "stage", "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "stage3_allgather_sequential",
    "compute_grad_norm", "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
    "elastic_checkpoint", "enable_sanity_checks", "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module", "legacy_stage1",
    "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters", "stage3_max_live_parameters",
    "max_reuse_distance", "stage3_max_reuse_distance", "memory_efficient_linear", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "module_granularity_threshold", "stage3_module_granularity_threshold",
    "offload_optimizer", "offload_param", "overlap_comm", "override_module_apply", "param_persistence_threshold",
    "stage3_param_persistence_threshold", "parameter_alignment", "pipeline_loading_checkpoint",
    "prefetch_bucket_size", "stage3_prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter",
    "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage3_gather_fp16_weights_on_model_save",
    "sub_group_size", "use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
    "use_multi_rank_bucket_allreduce", "zenflow", "zero_hpz_partition_size", "zero_quantized_gradients",
    "zero_quantized_nontrainable_weights", "zero_quantized_weights",
})
_OFFLOAD_OPTIMIZER_KEYS = frozenset({
    "buffer_count", "cpuadam_cores_perc", "device", "fast_init", "nvme_path", "pin_memory", "pipeline_read",
    "pipeline_write", "ratio", "super_offload",
})
_OFFLOAD_PARAM_KEYS = frozenset({"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"})
_BF16_KEYS = frozenset({"enabled", "bf16_master_weights_and_grads", "bf16_optimizer_states", "check_grad_overflow", "immediate_grad_update"})
_FP16_KEYS = frozenset({
    "enabled", "auto_cast", "consecutive_hysteresis", "fp16_master_weights_and_grads", "hysteresis",
    "initial_scale_power", "loss_scale", "loss_scale_window", "min_loss_scale",
})
_TP_KEYS = frozenset({
    "autotp_size", "dtype", "injection_policy_tuple", "keep_module_on_host", "partition_config", "preset_model",
    "replace_with_kernel_inject", "kernel_inject", "tensor_parallel", "tp", "tp_overlap_comm",
    "vocab_parallel_ce_backend", "vocab_parallel_lm_head",
})
_PARTITION_CONFIG_KEYS = frozenset({
    "layer_specs", "use_default_specs", "tp_size", "embedding_partition_dim", "lm_head_patterns", "strict_mode",
})
_LAYER_SPEC_KEYS = frozenset({"patterns", "partition_type", "shape", "partition_dim", "model_types", "gather_output", "grad_allreduce"})
_PRESETS = frozenset({"llama", "bloom", "chatglm", "mixtral", "deepseek_v2", "qwen2", "phi3"})
_OFFLOAD_DEVICES = frozenset({"none", "cpu", "nvme"})


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _enabled(section: Any) -> bool:
    return isinstance(section, Mapping) and bool(section.get("enabled", False))


def _layer_spec_violations(index: int, spec: Any) -> list[str]:
    where = f"tensor_parallel.partition_config.layer_specs[{index}]"
    if not isinstance(spec, Mapping):
        return [f"{where} must be an object"]
    out = [f"{where} has unknown key '{k}'" for k in spec if k not in _LAYER_SPEC_KEYS]
    patterns = spec.get("patterns")
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
        out.append(f"{where}.patterns must be a non-empty list of regular expressions")
        patterns = []
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            out.append(f"{where}.patterns: '{pattern}' is not a regular expression ({exc})")
    kind = spec.get("partition_type", "column")
    if not isinstance(kind, str) or kind.lower() not in ("row", "column", "skip"):
        out.append(f"{where}.partition_type must be row, column or skip (got {kind!r})")
        kind = "column"
    dim = spec.get("partition_dim")
    if dim is None:
        dim = 0 if kind.lower() == "column" else 1
    elif not isinstance(dim, int) or isinstance(dim, bool):
        out.append(f"{where}.partition_dim must be an integer")
        return out
    shape = spec.get("shape")
    if shape is not None:
        # deepspeed.module_inject.autotp_config.TPLayerSpec._validate_shape_format
        if not isinstance(shape, list) or not shape:
            out.append(f"{where}.shape must be a list")
            return out
        if dim < 0 or dim >= len(shape):
            out.append(f"{where}.partition_dim {dim} is out of range for shape of length {len(shape)}")
        for position, entry in enumerate(shape):
            if isinstance(entry, list):
                if position != dim:
                    out.append(f"{where}.shape: a nested list is allowed only at partition_dim ({dim})")
                if not entry or not all(_positive_int(v) for v in entry):
                    out.append(f"{where}.shape: nested sub-parameter sizes must be positive integers")
            elif not isinstance(entry, int) or isinstance(entry, bool) or entry == 0 or entry < -1:
                out.append(f"{where}.shape entries must be positive integers or -1")
    elif dim not in (0, 1):
        out.append(f"{where}.partition_dim must be 0 or 1 for a 2-D weight")
    return out


def deepspeed_violations(
    config: Mapping[str, Any],
    *,
    world_size: int,
    pipeline_stages: int = 1,
    num_attention_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> list[str]:
    """Every DeepSpeed rule (reference §2) that ``config`` breaks at ``world_size`` processes.

    Parameters
    ----------
    config:
        The ds_config dict.
    world_size:
        All processes of the job. The batch rule uses ``world_size / (autotp_size * pipeline_stages)``
        data-parallel ranks, except that config-only AutoTP checks against the full world size
        (measured, reference §2.1).
    pipeline_stages:
        Pipeline stages of the ``PipelineModule`` (1: no pipeline).
    num_attention_heads, num_kv_heads:
        Model sizes, for AutoTP's head divisibility (``None``: not checked).
    """
    out: list[str] = []
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, Mapping):
        out.append("zero_optimization must be an object")
        zero = {}
    stage = zero.get("stage", 0)
    if isinstance(stage, str) and stage.isdigit():
        stage = int(stage)  # DeepSpeed coerces "2" to 2
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        out.append(f"zero_optimization.stage must be 0, 1, 2 or 3 (got {stage!r})")
        stage = 0
    out += [f"zero_optimization has unknown key '{k}'" for k in zero if k not in _ZERO_KEYS]
    for section, keys in (("offload_optimizer", _OFFLOAD_OPTIMIZER_KEYS), ("offload_param", _OFFLOAD_PARAM_KEYS)):
        offload = zero.get(section)
        if offload is None:
            continue
        if not isinstance(offload, Mapping):
            out.append(f"zero_optimization.{section} must be an object")
            continue
        out += [f"zero_optimization.{section} has unknown key '{k}'" for k in offload if k not in keys]
        device = offload.get("device", "none")
        if device not in _OFFLOAD_DEVICES:
            out.append(f"zero_optimization.{section}.device must be none, cpu or nvme (got {device!r})")
        elif device != "none":
            if section == "offload_param" and stage != 3:
                out.append("zero_optimization.offload_param needs ZeRO stage 3")
            if section == "offload_optimizer" and stage == 0:
                out.append("zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3")
    for name, keys in (("bf16", _BF16_KEYS), ("fp16", _FP16_KEYS)):
        section = config.get(name)
        if section is not None:
            if not isinstance(section, Mapping):
                out.append(f"{name} must be an object")
            else:
                out += [f"{name} has unknown key '{k}'" for k in section if k not in keys]
    if _enabled(config.get("bf16")) and _enabled(config.get("fp16")):
        out.append("bf16 and fp16 cannot both be enabled")
    tp = 1
    tp_section = config.get("tensor_parallel")
    if tp_section is not None:
        tp, tp_out = _tensor_parallel_violations(tp_section, world_size, stage, num_attention_heads, num_kv_heads)
        out += tp_out
    if pipeline_stages > 1 and stage >= 2:
        out.append("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism; use ZeRO stage 0 or 1")
    pipe = config.get("pipeline")
    if pipe is not None:
        if not isinstance(pipe, Mapping):
            out.append("pipeline must be an object")
        else:
            # PipelineEngine asserts the two flags are booleans and compares the interval with 0.
            for key in ("pipe_partitioned", "grad_partitioned"):
                if key in pipe and not isinstance(pipe[key], bool):
                    out.append(f"pipeline.{key} must be true or false (got {pipe[key]!r})")
            interval = pipe.get("activation_checkpoint_interval", 0)
            if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
                out.append(f"pipeline.activation_checkpoint_interval must be a non-negative integer (got {interval!r})")
    if pipeline_stages < 1 or world_size < 1:
        out.append("world size and pipeline stages must be at least 1")
        return out
    data_parallel = world_size // (tp * pipeline_stages) if tp > 1 or pipeline_stages > 1 else world_size
    # Config-only AutoTP validates the batch against the whole world (reference §2.1, measured).
    batch_world = world_size if tp > 1 and pipeline_stages == 1 else data_parallel
    out += _batch_violations(config, batch_world)
    return out


def _tensor_parallel_violations(
    section: Any, world_size: int, stage: int, heads: int | None, kv_heads: int | None
) -> tuple[int, list[str]]:
    out: list[str] = []
    if not isinstance(section, Mapping):
        return 1, ["tensor_parallel must be an object"]
    out += [f"tensor_parallel has unknown key '{k}'" for k in section if k not in _TP_KEYS]
    size = section.get("autotp_size", 0)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        out.append(f"tensor_parallel.autotp_size must be a non-negative integer (got {size!r})")
        size = 0
    tp = max(size, 1)
    if tp > 1:
        if world_size % tp:
            out.append(f"world size ({world_size}) is not divisible by tensor_parallel.autotp_size ({tp})")
        if stage == 3:
            out.append("AutoTP works with ZeRO stages 0, 1 and 2 only; use zero_optimization.stage <= 2")
        if heads is not None and heads % tp:
            out.append(f"AutoTP size ({tp}) must divide the attention heads ({heads})")
        if kv_heads is not None and kv_heads % tp:
            out.append(f"AutoTP size ({tp}) must divide the key/value heads ({kv_heads})")
    preset = section.get("preset_model")
    if preset is not None and preset not in _PRESETS:
        out.append(f"tensor_parallel.preset_model must be one of {', '.join(sorted(_PRESETS))} (got {preset!r})")
    partition = section.get("partition_config")
    if partition is not None:
        if not isinstance(partition, Mapping):
            out.append("tensor_parallel.partition_config must be an object")
        else:
            out += [f"tensor_parallel.partition_config has unknown key '{k}'" for k in partition if k not in _PARTITION_CONFIG_KEYS]
            specs = partition.get("layer_specs", [])
            if not isinstance(specs, list):
                out.append("tensor_parallel.partition_config.layer_specs must be a list")
            else:
                for index, spec in enumerate(specs):
                    out += _layer_spec_violations(index, spec)
    return tp, out


def _batch_violations(config: Mapping[str, Any], world: int) -> list[str]:
    out: list[str] = []
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    values = {n: config.get(n) for n in names}
    for name, value in values.items():
        if value is not None and not _positive_int(value):
            out.append(f"{name} must be a positive integer (got {value!r})")
    if out:
        return out
    tbs, mbs, gas = values["train_batch_size"], values["train_micro_batch_size_per_gpu"], values["gradient_accumulation_steps"]
    given = sum(v is not None for v in (tbs, mbs, gas))
    if tbs is None and mbs is None:
        return ["set train_batch_size or train_micro_batch_size_per_gpu"]
    # DeepSpeedConfig._set_batch_related_parameters infers a missing value by floor division.
    if given == 2:
        if tbs is None:
            tbs = mbs * gas * world
        elif mbs is None:
            mbs = tbs // (gas * world)
        else:
            gas = tbs // (mbs * world)
    elif given == 1:
        gas = 1
        if tbs is None:
            tbs = mbs * world
        else:
            mbs = tbs // world
    if mbs is not None and mbs < 1:
        out.append(f"train_micro_batch_size_per_gpu would be {mbs}; train_batch_size is too small for {world} ranks")
    elif gas is not None and gas < 1:
        out.append(f"gradient_accumulation_steps would be {gas}; it has to be greater than 0")
    elif tbs != mbs * gas * world:
        out.append(
            f"train_batch_size ({tbs}) != train_micro_batch_size_per_gpu ({mbs}) * "
            f"gradient_accumulation_steps ({gas}) * world size ({world})"
        )
    return out


def validate_deepspeed(
    config: Mapping[str, Any],
    *,
    world_size: int,
    pipeline_stages: int = 1,
    num_attention_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> None:
    """Check a ds_config; raises :class:`UnsupportedExport` with every violated rule.

    Examples
    --------
    >>> validate_deepspeed({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
    ...                     "gradient_accumulation_steps": 1}, world_size=4)
    """
    problems = deepspeed_violations(
        config,
        world_size=world_size,
        pipeline_stages=pipeline_stages,
        num_attention_heads=num_attention_heads,
        num_kv_heads=num_kv_heads,
    )
    if problems:
        raise UnsupportedExport("DeepSpeed would reject this config: " + "; ".join(problems))


# ----------------------------------------------------------------------------------------------
# Mesh-TensorFlow

_SEPARATORS = re.compile(r"[,.;]")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshTensor:
    """A tensor as Mesh-TF lays it out: a name per dim (``None``: unnamed, never split) and sizes."""

    name: str
    dims: tuple[str | None, ...]
    shape: tuple[int, ...]


def parse_mesh_tf_pairs(text: str, *, what: str) -> list[tuple[str, str]]:
    """Split ``"b:4;m:2"`` into pairs as ``mtf.ops._parse_string_to_list_of_pairs`` does.

    Raises
    ------
    InputError
        When a token has not exactly one ``:``.

    Examples
    --------
    >>> parse_mesh_tf_pairs("batch:b;d_ff:m, heads:m", what="layout")
    [('batch', 'b'), ('d_ff', 'm'), ('heads', 'm')]
    """
    pairs = []
    for token in _SEPARATORS.sub(" ", text).split():
        parts = token.split(":")
        if len(parts) != 2:
            raise InputError(f"bad Mesh-TF {what} token '{token}'; write name:value pairs separated by ';'")
        pairs.append((parts[0], parts[1]))
    return pairs


def mesh_tf_violations(
    mesh_shape: str,
    layout: str,
    *,
    devices: int | None = None,
    tensors: Iterable[MeshTensor] = (),
) -> list[str]:
    """Every Mesh-TF rule (reference §3.2, §3.4) that the mesh and layout break.

    Parameters
    ----------
    mesh_shape:
        E.g. ``"b:4;m:2"``.
    layout:
        E.g. ``"batch:b;d_ff:m"``.
    devices:
        Devices the mesh must fill exactly (``None``: not checked).
    tensors:
        Tensors to lay out, with their dim names and sizes.
    """
    out: list[str] = []
    mesh: dict[str, int] = {}
    for name, value in parse_mesh_tf_pairs(mesh_shape, what="mesh shape"):
        try:
            size = int(value)
        except ValueError:
            out.append(f"mesh dim {name} has a non-integer size '{value}'")
            continue
        if not _IDENTIFIER.match(name):
            out.append(f"mesh dim name '{name}' is not an identifier")
        if name in mesh:
            out.append(f"mesh dim '{name}' appears twice")
        if size < 1:
            out.append(f"mesh dim {name} has size {size}; sizes must be at least 1")
        mesh[name] = size
    total = math.prod(mesh.values()) if mesh else 1
    if devices is not None and total != devices:
        out.append(f"the mesh has {total} devices, the plan needs {devices}")
    rules: dict[str, str] = {}
    for dim_name, mesh_name in parse_mesh_tf_pairs(layout, what="layout"):
        if mesh_name not in mesh:
            out.append(f"layout rule {dim_name}:{mesh_name} names no mesh dim (Mesh-TF would silently ignore it)")
            continue
        if dim_name in rules and rules[dim_name] != mesh_name:
            out.append(f"tensor dim '{dim_name}' maps to multiple mesh dims ({rules[dim_name]}, {mesh_name})")
        rules[dim_name] = mesh_name
    for tensor in tensors:
        named = [d for d in tensor.dims if d is not None]
        repeated = sorted({d for d in named if named.count(d) > 1})
        if repeated:
            out.append(f"tensor {tensor.name} repeats dimension name(s) {', '.join(repeated)} (mtf.Shape forbids it)")
        used: dict[str, str] = {}
        for dim_name, size in zip(tensor.dims, tensor.shape):
            if dim_name is None or dim_name not in rules:
                continue
            mesh_name = rules[dim_name]
            if mesh_name in used:
                out.append(
                    f"tensor {tensor.name}: dims '{used[mesh_name]}' and '{dim_name}' both map to mesh dim {mesh_name}"
                )
            used[mesh_name] = dim_name
            if size % mesh[mesh_name]:
                out.append(
                    f"tensor {tensor.name}: dim '{dim_name}' of size {size} is not divisible by mesh dim "
                    f"{mesh_name} ({mesh[mesh_name]})"
                )
    return out


def validate_mesh_tf(
    mesh_shape: str,
    layout: str,
    *,
    devices: int | None = None,
    tensors: Iterable[MeshTensor] = (),
) -> tuple[dict[str, int], dict[str, str]]:
    """Check a Mesh-TF mesh and layout; returns them parsed as ``({mesh dim: size}, {dim: mesh dim})``.

    Raises
    ------
    UnsupportedExport
        With every violated rule (see :func:`mesh_tf_violations`).

    Examples
    --------
    >>> validate_mesh_tf("b:4;m:2", "batch:b;d_ff:m", devices=8)
    ({'b': 4, 'm': 2}, {'batch': 'b', 'd_ff': 'm'})
    """
    problems = mesh_tf_violations(mesh_shape, layout, devices=devices, tensors=tensors)
    if problems:
        raise UnsupportedExport("Mesh-TensorFlow would reject this layout: " + "; ".join(problems))
    mesh = {name: int(value) for name, value in parse_mesh_tf_pairs(mesh_shape, what="mesh shape")}
    return mesh, dict(parse_mesh_tf_pairs(layout, what="layout"))
