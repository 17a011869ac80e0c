r"""torchtitan 0.3.0's own checks of a config and its overrides, in pure Python.

torchtitan raises these from several places; each rule names where:

* ``ParallelDims._validate`` (``torchtitan/distributed/parallel_dims.py``): every degree at least 1
  (``data_parallel_shard_degree`` may be -1, the ranks left over) and
  ``dp_replicate x dp_shard x cp x tp x pp == WORLD_SIZE``;
* ``Trainer.Config.__post_init__`` (``torchtitan/trainer.py``): a positive pipeline micro-batch
  dividing ``training.local_batch_size`` when ``pp > 1``, and ``training.disable_cuda_graphs`` with
  ``pp > 1``;
* ``Trainer.__init__``: ``global_batch_size`` a multiple of ``local_batch_size x dp``;
  ``seq_len`` divisible by ``tp`` with sequence parallelism (and by ``2 cp`` with ``cp > 1``);
* ``Decoder.Config.update_from_config`` (``models/common/decoder.py``): ``tp`` divides ``n_heads`` and
  ``n_kv_heads``; no tied weights with ``pp > 1``;
* ``torch.distributed.pipelining.get_schedule_class`` and torchtitan's ``pipeline_parallel.py``:
  a known schedule; parts (``module_fqns_per_model_part``) a multiple of ``pp``, one per rank for a
  single-stage schedule (``GPipe``, ``1F1B``) and at least two for a looped one, exactly two for
  ``ZBVZeroBubble``; the interleaved schedules' rounds dividing the micro-batches
  (``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble``); no torch.compile under a
  zero-bubble schedule (``_check_torch_compile_compatibility``); every module of the model in
  exactly one part, in order;
* ``ParallelDims.build_mesh``: ``expert_parallel_degree`` divides ``dp_shard x cp x tp`` (the ranks
  expert parallelism borrows); ``Trainer.Config._validate_cuda_graphs``: with it above 1, the standard
  all-to-all token dispatcher needs ``training.disable_cuda_graphs``;
* ``MemoryBudgetAC`` needs ``--compile.enable``; ``CompileConfig.__post_init__``: async TP
  (``compile.enable_async_tensor_parallel``) needs ``--compile.enable`` with ``model`` in ``compile.components``
  (the default ``["model", "loss"]``, which the export keeps).

:func:`parse_torchtitan_overrides` reads the override list the exporter writes (our subset of the
flags: an unknown flag is an :class:`~planner.core.errors.InputError`); :func:`torchtitan_violations`
returns every broken rule as a one-line message and :func:`validate_torchtitan` raises
:class:`~planner.core.errors.UnsupportedExport` with all of them. ``tests/integration`` holds the
parse equal to torchtitan's own ``ConfigManager.parse_args``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from planner.core.errors import InputError, UnsupportedExport

__all__ = ["TORCHTITAN_FLAGS", "TorchtitanModel", "parse_torchtitan_overrides", "torchtitan_violations",
           "validate_torchtitan"]

_INT, _STR, _FLAG, _PARTS = "int", "str", "flag", "parts"
TORCHTITAN_FLAGS: dict[str, str] = {
    "parallelism.data_parallel_replicate_degree": _INT,
    "parallelism.data_parallel_shard_degree": _INT,
    "parallelism.tensor_parallel_degree": _INT,
    "parallelism.enable_sequence_parallel": _FLAG,
    "parallelism.pipeline_parallel_degree": _INT,
    "parallelism.pipeline_parallel_schedule": _STR,
    "parallelism.pipeline_parallel_microbatch_size": _INT,
    "parallelism.module_fqns_per_model_part": _PARTS,
    "parallelism.context_parallel_degree": _INT,
    "parallelism.context_parallel_load_balancer": _STR,
    "parallelism.expert_parallel_degree": _INT,
    "parallelism.fsdp_reshard_after_forward": _STR,
    "training.local_batch_size": _INT,
    "training.global_batch_size": _INT,
    "training.seq_len": _INT,
    "training.mixed_precision_param": _STR,
    "training.disable_cuda_graphs": _FLAG,
    "training.enable_cpu_offload": _FLAG,
    "compile.enable": _FLAG,
    "compile.enable_async_tensor_parallel": _FLAG,
}
"""The overrides the exporter writes (``--`` + section + field; a flag's negation is ``--section.no_field``)."""

_DEFAULTS: dict[str, Any] = {
    "parallelism.data_parallel_replicate_degree": 1, "parallelism.data_parallel_shard_degree": -1,
    "parallelism.tensor_parallel_degree": 1, "parallelism.enable_sequence_parallel": True,
    "parallelism.pipeline_parallel_degree": 1, "parallelism.pipeline_parallel_schedule": "1F1B",
    "parallelism.pipeline_parallel_microbatch_size": 1, "parallelism.module_fqns_per_model_part": None,
    "parallelism.context_parallel_degree": 1, "parallelism.context_parallel_load_balancer": "headtail",
    "parallelism.expert_parallel_degree": 1, "parallelism.fsdp_reshard_after_forward": "default",
    "training.local_batch_size": 1, "training.global_batch_size": -1,
    "training.seq_len": 8192, "training.mixed_precision_param": "bfloat16", "training.disable_cuda_graphs": False,
    "training.enable_cpu_offload": False, "compile.enable": False,
    "compile.enable_async_tensor_parallel": False, "activation_checkpoint": "selective",
}
"""torchtitan 0.3.0's ``llama3_8b`` values of those fields (the base of the written registry module)."""

_SINGLE_STAGE = frozenset({"1F1B", "GPipe"})

_RESHARD = frozenset({"default", "always", "never"})
"""``ParallelismConfig.fsdp_reshard_after_forward`` (``Literal["default", "always", "never"]``)."""
_BALANCERS = frozenset({"headtail", "ptrr"})
"""``ParallelismConfig.context_parallel_load_balancer``: ``headtail`` (SDPA) or ``ptrr`` (FlexAttention)."""
_LOOPED = frozenset({"Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"})
_ZERO_BUBBLE = frozenset({"InterleavedZeroBubble", "ZBVZeroBubble"})
"""torch 2.13's schedules with a B/W split, which refuse compiled stages (``_check_torch_compile_compatibility``:
"we dont support input/weight backward split with torch.compile")."""
_AC_MODES = frozenset({"none", "selective", "full", "memory-budget"})
_PRECISIONS = frozenset({"bfloat16", "float32"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchtitanModel:
    """The model sizes torchtitan's rules read."""

    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    tied_embeddings: bool = False
    moe: bool = False
    """Whether its layers route tokens to experts (the written module's standard all-to-all dispatcher)."""


def parse_torchtitan_overrides(args: Sequence[str]) -> dict[str, Any]:
    """The overrides as ``{"section.field": value}`` over torchtitan's ``llama3_8b`` values, plus
    ``activation_checkpoint`` (the subcommand's mode).

    Raises
    ------
    InputError
        For a flag outside :data:`TORCHTITAN_FLAGS`, a missing or non-integer value.

    Examples
    --------
    >>> a = parse_torchtitan_overrides(["--parallelism.tensor_parallel_degree", "2",
    ...                                 "--parallelism.no_enable_sequence_parallel", "activation-checkpoint:full"])
    >>> a["parallelism.tensor_parallel_degree"], a["parallelism.enable_sequence_parallel"], a["activation_checkpoint"]
    (2, False, 'full')
    """
    out, i = dict(_DEFAULTS), 0
    args = list(args)
    while i < len(args):
        token = args[i]
        i += 1
        if token.startswith("activation-checkpoint:"):
            out["activation_checkpoint"] = token.split(":", 1)[1]
            continue
        name = token[2:] if token.startswith("--") else ""
        section, _, field = name.partition(".")
        negated = field.startswith("no_") and f"{section}.{field[3:]}" in TORCHTITAN_FLAGS
        key = f"{section}.{field[3:]}" if negated else name
        kind = TORCHTITAN_FLAGS.get(key)
        if kind is None:
            raise InputError(f"unknown torchtitan override '{token}'; the export writes {', '.join(TORCHTITAN_FLAGS)}")
        if kind == _FLAG:
            out[key] = not negated
            continue
        values = []
        while i < len(args) and not args[i].startswith("--") and not args[i].startswith("activation-checkpoint:"):
            values.append(args[i])
            i += 1
        if not values or (kind != _PARTS and len(values) != 1):
            raise InputError(f"torchtitan override {token} needs {'values' if kind == _PARTS else 'one value'}")
        if kind == _INT:
            try:
                out[key] = int(values[0])
            except ValueError:
                raise InputError(f"torchtitan override {token} needs an integer (got {values[0]!r})") from None
        else:
            out[key] = [v.split(",") for v in values] if kind == _PARTS else values[0]
    return out


def _parallel_rules(a: dict[str, Any], world_size: int, out: list[str]) -> int:
    """ParallelDims: the degrees' product is the world; returns the data-parallel size."""
    names = ("data_parallel_replicate_degree", "context_parallel_degree", "tensor_parallel_degree",
             "pipeline_parallel_degree")
    degrees = {n: a[f"parallelism.{n}"] for n in names}
    out += [f"parallelism.{n} must be at least 1 (got {d})" for n, d in degrees.items() if d < 1]
    shard = a["parallelism.data_parallel_shard_degree"]
    if shard != -1 and shard < 1:
        out.append(f"parallelism.data_parallel_shard_degree must be -1 or at least 1 (got {shard})")
    others = max(1, degrees["data_parallel_replicate_degree"] * degrees["context_parallel_degree"]
                 * degrees["tensor_parallel_degree"] * degrees["pipeline_parallel_degree"])
    if shard == -1:
        shard = world_size // others
    if shard < 1 or others * shard != world_size:
        out.append(f"dp_replicate x dp_shard x cp x tp x pp = {others * max(shard, 0)} is not the world size {world_size}")
    return max(1, degrees["data_parallel_replicate_degree"] * max(shard, 1))


def _pipeline_rules(a: dict[str, Any], model: TorchtitanModel | None, out: list[str]) -> None:
    pp, schedule = a["parallelism.pipeline_parallel_degree"], a["parallelism.pipeline_parallel_schedule"]
    micro, local = a["parallelism.pipeline_parallel_microbatch_size"], a["training.local_batch_size"]
    if micro < 1:
        out.append("parallelism.pipeline_parallel_microbatch_size must be greater than 0")
    if pp <= 1:
        return
    if micro >= 1 and local % micro:
        out.append(f"training.local_batch_size ({local}) must be divisible by the pipeline micro-batch ({micro})")
    if not a["training.disable_cuda_graphs"]:
        out.append("CUDA graphs do not support pipeline parallelism: set --training.disable_cuda_graphs")
    if schedule not in _SINGLE_STAGE | _LOOPED:
        out.append(f"unknown pipeline schedule '{schedule}'; use {', '.join(sorted(_SINGLE_STAGE | _LOOPED))}")
    parts = a["parallelism.module_fqns_per_model_part"]
    stages = len(parts) if parts is not None else pp * (1 if schedule in _SINGLE_STAGE else 2)
    if stages % pp:
        out.append(f"{stages} model parts are not divisible by pp={pp}")
    elif schedule in _SINGLE_STAGE and stages != pp:
        out.append(f"the single-stage schedule {schedule} needs one model part per rank ({pp}), got {stages}")
    elif schedule in _LOOPED and stages < 2 * pp:
        out.append(f"the looped schedule {schedule} needs at least two model parts per rank, got {stages} for pp={pp}")
    elif schedule == "ZBVZeroBubble" and stages != 2 * pp:
        out.append(f"ZBVZeroBubble requires exactly 2 stages per rank, got {stages} model parts for pp={pp}")
    if schedule in _ZERO_BUBBLE and a["compile.enable"]:
        out.append(f"the {schedule} schedule splits the backward into input and weight passes, which torch.compile'd "
                   "stages do not support; set --compile.no_enable")
    batches = local // micro if micro >= 1 else 0
    rounds = max(1, batches // pp)
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble") and batches % rounds:
        out.append(f"{schedule} runs {batches} micro-batches in {rounds} rounds of pp={pp}, unevenly")
    if model is not None and model.tied_embeddings:
        out.append("weight tying is not supported with pipeline parallelism")
    if model is not None and parts is not None:
        expected = ["tok_embeddings", *(f"layers.{i}" for i in range(model.num_layers)), "norm", "lm_head"]
        if [name for part in parts for name in part] != expected:
            out.append("module_fqns_per_model_part must hold tok_embeddings, every layer, norm and lm_head once, in order")
        if any(not part or part == [""] for part in parts):
            out.append("every model part needs at least one module")


def _expert_rules(a: dict[str, Any], world_size: int, model: TorchtitanModel | None, out: list[str]) -> None:
    """``expert_parallel_degree``: at least 1 (``ParallelDims._validate``), dividing ``dp_shard x cp x tp``
    (``ParallelDims.build_mesh`` unflattens the world into ``pp, dp_replicate, efsdp, ep`` with
    ``efsdp = dp_shard * cp * tp // ep``: ``parallel_dims.py`` l. 277-279, 336-340), and no CUDA graph of
    the standard all-to-all dispatcher (``Trainer.Config._validate_cuda_graphs``, ``trainer.py`` l. 189-210)."""
    ep = a["parallelism.expert_parallel_degree"]
    if ep < 1:
        out.append(f"parallelism.expert_parallel_degree must be at least 1 (got {ep})")
        return
    if ep == 1:
        return
    rest = {n: a[f"parallelism.{n}"] for n in ("data_parallel_replicate_degree", "context_parallel_degree",
                                                "tensor_parallel_degree", "pipeline_parallel_degree")}
    shard = a["parallelism.data_parallel_shard_degree"]
    if shard == -1:  # ParallelDims._validate: the ranks left over
        shard = world_size // max(1, math.prod(rest.values()))
    region = shard * rest["context_parallel_degree"] * rest["tensor_parallel_degree"]
    if region % ep:
        out.append(f"expert_parallel_degree ({ep}) must divide dp_shard x cp x tp ({region}), the ranks it borrows")
    if (model is None or model.moe) and not a["training.disable_cuda_graphs"]:
        out.append("CUDA graphs do not support the standard expert-parallel token dispatcher: set "
                   "--training.disable_cuda_graphs")


def torchtitan_violations(args: Sequence[str], *, world_size: int, model: TorchtitanModel | None = None) -> list[str]:
    """Every torchtitan rule (module docstring) the overrides break at ``world_size`` processes."""
    a = parse_torchtitan_overrides(args)
    out: list[str] = []
    dp = _parallel_rules(a, world_size, out)
    tp, cp = a["parallelism.tensor_parallel_degree"], a["parallelism.context_parallel_degree"]
    local, total = a["training.local_batch_size"], a["training.global_batch_size"]
    if local < 1:
        out.append(f"training.local_batch_size must be at least 1 (got {local})")
    elif total > 0 and total % (local * dp):
        out.append(f"global batch size {total} is not a multiple of local batch size x data-parallel degree ({local} x {dp})")
    divisor = (tp if a["parallelism.enable_sequence_parallel"] else 1) * (2 * cp if cp > 1 else 1)
    if tp >= 1 and cp >= 1 and a["training.seq_len"] % divisor:
        out.append(f"training.seq_len ({a['training.seq_len']}) must be divisible by {divisor} for the sequence/context "
                   "parallelism")
    if model is not None and tp > 1:
        out += [f"tensor_parallel_degree ({tp}) must divide {what} ({n})" for what, n in
                (("n_heads", model.num_attention_heads), ("n_kv_heads", model.num_kv_heads)) if n % tp]
    balancer = a["parallelism.context_parallel_load_balancer"]
    if balancer not in _BALANCERS:
        out.append(f"unknown context_parallel_load_balancer '{balancer}'; use {', '.join(sorted(_BALANCERS))}")
    reshard = a["parallelism.fsdp_reshard_after_forward"]
    if reshard not in _RESHARD:  # get_fsdp_reshard_after_forward_policy raises ValueError on any other
        out.append(f"invalid fsdp_reshard_after_forward '{reshard}'; use {', '.join(sorted(_RESHARD))}")
    _pipeline_rules(a, model, out)
    _expert_rules(a, world_size, model, out)
    mode = a["activation_checkpoint"]
    if mode not in _AC_MODES:
        out.append(f"unknown activation-checkpoint mode '{mode}'; use {', '.join(sorted(_AC_MODES))}")
    elif mode == "memory-budget" and not a["compile.enable"]:
        out.append("memory budget activation checkpointing requires --compile.enable")
    if a["compile.enable_async_tensor_parallel"] and not a["compile.enable"]:  # CompileConfig.__post_init__
        out.append("Async TP requires 'model' in --compile.components and --compile.enable")
    if a["training.mixed_precision_param"] not in _PRECISIONS:
        out.append(f"training.mixed_precision_param must be bfloat16 or float32 (got {a['training.mixed_precision_param']})")
    return out


def validate_torchtitan(args: Sequence[str], *, world_size: int, model: TorchtitanModel | None = None) -> None:
    """Raise :class:`UnsupportedExport` listing every rule of :func:`torchtitan_violations` broken."""
    violations = torchtitan_violations(args, world_size=world_size, model=model)
    if violations:
        raise UnsupportedExport("torchtitan would reject this config: " + "; ".join(violations))
