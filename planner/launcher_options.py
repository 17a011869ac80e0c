"""What each launcher's search may vary: the search options and rules narrowed to the user's pins
(``--fix``) and to the recomputation modes, CPU offload, HSDP shard groups and precisions a launcher
runs (:attr:`exporters.targets.Target`), and the execution model each prices a model under, for
:func:`planner.launchable.launch_frontier`."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from objectives.execution import ExecutionModel, attention_on_device, default_execution, model_attention
from objectives.pipeline_cost import ContextSplit
from planner.core.cluster import Device
from planner.core.configs import divisors
from planner.core.degrees import Pins
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineOptions, target_rules
from planner.plan import PlanRequest

__all__ = [
    "launcher_execution",
    "alibi_note",
    "DEFAULT_RECOMPUTE",
    "pinned_options",
    "pinned_rules",
    "precision_pairs",
    "launcher_recompute",
    "launcher_offload",
    "launcher_cuda_graphs",
    "launcher_autocast",
    "launcher_autocasts",
    "launcher_jobs",
    "graph_split",
    "replays_cuda_graphs",
    "launcher_p2p_overlap",
    "hsdp_sizes",
    "hsdp_refusal",
    "check_hsdp_pin",
    "check_expert_pin",
    "launcher_hsdp",
    "hsdp_rules",
    "hybrid_groups",
    "context_split",
]


def launcher_execution(launcher: str, graph: OpGraph | None, engine: str | None,
                       attention: str | None, device: Device | None = None) -> ExecutionModel | None:
    """The launcher's execution model for ``graph``: its target's (:attr:`exporters.targets.Target.execution`;
    a launcher that states none is priced as the generic plan, fused kernels and flash attention), its
    attention as the launcher runs this model's (:func:`objectives.execution.model_attention`: ALiBi
    scores are materialised; ``graph=None``: the target's own) on ``device``
    (:func:`objectives.execution.attention_on_device`: TransformerEngine's cuDNN attention is
    FlashAttention-2 before Hopper), with ``--engine`` / ``--attention`` over it
    (:func:`objectives.execution.default_execution`)."""
    from exporters.targets import TARGETS

    base = (TARGETS.get(launcher) or TARGETS["generic"]).execution
    if base is not None and graph is not None:
        base = model_attention(base, graph.attention_biases.values())
    if base is not None and len(base) > 1:
        base = (base[0], attention_on_device(base[1], device), *base[2:])
    return default_execution(base, engine=engine, attention=attention)


def alibi_note(graph: OpGraph, attention: str | None) -> str | None:
    """What the table says of an ALiBi model's attention, priced explicit (:func:`launcher_execution`)
    unless ``--attention`` is given."""
    if attention is None and "alibi" in graph.attention_biases.values():
        return ("ALiBi attention priced with its scores materialised (explicit), as BLOOM's and MPT's modules "
                "and Megatron-DeepSpeed run it; --attention flash prices a fused kernel")
    return None


def pinned_options(options: PipelineOptions, pins: Pins) -> PipelineOptions:
    """``options`` narrowed to the pinned pipeline size, micro-batch, ZeRO stage and recomputation."""
    changes: dict[str, Any] = {}
    if pins.pp is not None:
        changes["pipeline_sizes"] = (pins.pp,)
    if pins.mb is not None:
        changes["micro_batch"] = pins.mb
    if pins.zero is not None:
        changes["zero_stages"] = (pins.zero,)
    if pins.recompute is not None:
        changes["recompute"] = (pins.recompute,)
    return dataclasses.replace(options, **changes) if changes else options


def pinned_rules(launcher: str, pins: Pins):
    """The launcher's search rules with its families narrowed to the pinned ``dp`` / ``tp`` / ``cp``."""
    rules = target_rules(launcher)
    if rules is None or (pins.dp is None and pins.tp is None and pins.cp is None):
        return rules
    families = rules.families

    def pinned(*args: Any, **kwargs: Any) -> list:
        return [f for f in families(*args, **kwargs)
                if (pins.dp is None or f.dp in (None, pins.dp)) and (pins.tp is None or f.tp in (None, pins.tp))
                and (pins.cp is None or f.cp == pins.cp)]

    return dataclasses.replace(rules, families=pinned)


def precision_pairs(precisions: Sequence[str], request: PlanRequest, usable: Sequence[str],
                    graph: OpGraph | None = None) -> tuple[tuple[str, str | None], ...]:
    """``(precision, fp8 recipe)`` per searched precision and recipe (``fp8``: one per recipe of the
    usable launchers; ``graph``: the model, so that the advice never names a launcher that refuses it).

    Raises
    ------
    InputError
        An unknown precision, FP8 on a device without an FP8 peak, FP8 with no launcher that trains it.
    """
    from exporters.targets import TARGETS
    from objectives.precision import require_fp8

    pairs: list[tuple[str, str | None]] = []
    for precision in precisions:
        if precision not in ("fp32", "bf16-mixed", "fp8"):
            raise InputError(f"--dtype must be fp32, bf16-mixed (bf16) or fp8 (got {precision}), e.g. --dtype bf16,fp8")
        if precision != "fp8":
            pairs.append((precision, None))
            continue
        require_fp8(request.cluster.device)
        recipes = [TARGETS[name].fp8 for name in usable if TARGETS[name].fp8 is not None]
        if not recipes:
            raise InputError(_no_fp8(usable, _refusal(graph, request)))
        pairs += [("bf16-mixed", recipe) for recipe in dict.fromkeys(recipes)]
    return tuple(dict.fromkeys(pairs))


def _refusal(graph: OpGraph | None, request: PlanRequest) -> Callable[[str], str | None]:
    """``refusal(launcher)``: why it cannot run ``graph`` (:func:`planner.plan.target_refusal`), ``None``: it
    can (or no graph is given)."""
    from planner.plan import target_refusal

    return lambda name: None if graph is None else target_refusal(graph, request.cluster, request.settings, name)


def _no_fp8(usable: Sequence[str], refusal: Callable[[str], str | None]) -> str:
    """Why no searched launcher trains FP8, ending with advice that runs: ``--target`` a launcher that trains
    FP8 and runs the model, or, when every such launcher refuses the model (``refusal``), drop fp8."""
    from exporters._fp8 import FP8_REFUSALS
    from exporters.targets import TARGETS

    why = "; ".join(FP8_REFUSALS[name] for name in usable if name in FP8_REFUSALS)
    head = f"no listed launcher trains FP8 ({', '.join(usable)}{': ' + why if why else ''})"
    trains = [name for name, target in TARGETS.items() if target.fp8 is not None]
    reasons = {name: refusal(name) for name in trains}
    runs = [name for name in trains if reasons[name] is None]
    if runs:
        return f"{head}; FP8 rows run on {' or '.join(trains)}: drop fp8 from --dtype or use --target {runs[0]}"
    # each reason without its "; export with --target ..." suffix (exporters.elsewhere): this line's advice is its own
    said = "; ".join(f"{name}: {str(reasons[name]).split('; export ')[0]}" for name in trains)
    return (f"{head}; {' and '.join(trains)}, the launchers that train FP8, do not train this model ({said}): "
            "drop fp8 from --dtype")


DEFAULT_RECOMPUTE = next(f.default for f in dataclasses.fields(PipelineOptions) if f.name == "recompute")
"""The recomputation modes a :class:`PipelineOptions` searches unless its caller narrows them."""


def launcher_recompute(options: PipelineOptions, launcher: str, pins: Pins) -> PipelineOptions | None:
    """``options`` with the recomputation modes ``launcher`` runs (:attr:`exporters.targets.Target.recompute`:
    torchtitan's op-level policy for it, Megatron's attention core for the others), or the pinned one;
    ``None`` when it runs no mode left. A caller that narrowed ``options.recompute`` from its default
    keeps its narrowing (the launcher's modes within it)."""
    from exporters.targets import TARGETS

    runs = TARGETS[launcher].recompute
    narrowed = options.recompute != DEFAULT_RECOMPUTE
    wanted = (pins.recompute,) if pins.recompute is not None else options.recompute if narrowed else runs
    modes = tuple(mode for mode in wanted if mode in runs)
    return dataclasses.replace(options, recompute=modes) if modes else None


def launcher_offload(options: PipelineOptions, launcher: str, offload: str) -> PipelineOptions | None:
    """``options`` narrowed to the ZeRO stages, pipeline sizes and recomputation modes with which
    ``launcher`` runs CPU offload mode ``offload`` (:meth:`exporters.targets.Target.runs_offload`, whose
    conditions are separable: each setting is narrowed alone); ``None`` when it runs none. Without
    offload, ``options`` itself."""
    from exporters.targets import TARGETS

    if offload == "none":
        return options
    runs = TARGETS[launcher].runs_offload
    # one pipeline stage and no recomputation are allowed wherever any setting is (Target.offload_rule)
    zeros = tuple(z for z in options.zero_stages if runs(offload, zero_stage=z, pp=1, recompute="none"))
    if not zeros:
        return None
    sizes = tuple(pp for pp in (options.pipeline_sizes or ()) if runs(offload, zero_stage=zeros[0], pp=pp, recompute="none"))
    modes = tuple(r for r in options.recompute if runs(offload, zero_stage=zeros[0], pp=1, recompute=r))
    if not modes or (options.pipeline_sizes is not None and not sizes):
        return None
    return dataclasses.replace(options, zero_stages=zeros, recompute=modes, pipeline_sizes=sizes or options.pipeline_sizes)


def hsdp_sizes(request: PlanRequest, pins: Pins) -> tuple[int | None, ...]:
    """The HSDP shard groups searched (``None``: plain ZeRO over every data-parallel rank): the
    pinned one alone (``--fix hsdp=N``), else a node's devices where the devices span nodes (the
    shard group's gathers and reduce-scatters stay on the node's links, only the replicas' all-reduce
    of a ``1/N`` slice crosses nodes: torchtitan's HSDP guidance), not every divisor of ``dp``."""
    if pins.hsdp is not None:
        return (pins.hsdp,)
    per_node = request.cluster.devices_per_node
    return (None, per_node) if request.cluster.devices > per_node > 1 and request.settings.dp_shard is None else (None,)


def hsdp_refusal(pins: Pins, devices: int) -> str | None:
    """Why ``--fix hsdp=N`` leaves no row on ``devices``, with the shard groups that do; ``None`` when one may.

    An HSDP row shards over ``N`` data-parallel ranks and keeps at least two replicas of the shards
    (:func:`hsdp_rules`: ``dp`` whole replicas, more than one), and ``dp`` divides the devices left by
    the pinned ``pp x tp x cp`` (every family's world divides a stage's devices), or is the pinned ``dp``.

    >>> hsdp_refusal(Pins(hsdp=8), 8)
    '--fix hsdp=8 shards over 8 data-parallel ranks and keeps 2 or more replicas, so it needs 16 or more data-parallel ranks, a multiple of 8; 8 devices give at most 8: use --fix hsdp=2 or 4, or drop it'
    >>> hsdp_refusal(Pins(hsdp=3), 8)
    '--fix hsdp=3 shards over 3 data-parallel ranks and keeps 2 or more replicas, so it needs 6 or more data-parallel ranks, a multiple of 3; 8 devices give a divisor of 8: use --fix hsdp=2 or 4, or drop it'
    >>> hsdp_refusal(Pins(hsdp=4), 8) is None
    True
    """
    if pins.hsdp is None:
        return None
    model_ways = (pins.pp or 1) * (pins.tp or 1) * (pins.cp or 1)
    most = pins.dp if pins.dp is not None else devices // model_ways
    if most % pins.hsdp == 0 and most >= 2 * pins.hsdp:
        return None
    given = f"--fix dp={pins.dp}" if pins.dp is not None else f"{devices} devices" + (
        f" over the pinned pp x tp x cp ({model_ways})" if model_ways > 1 else "")
    gives = f"at most {most}" if most < 2 * pins.hsdp and most % pins.hsdp == 0 else (
        f"{most}" if pins.dp is not None else f"a divisor of {most}")
    groups = [n for n in divisors(most) if 1 < n and 2 * n <= most]
    fix = f"use --fix hsdp={' or '.join(map(str, groups[-2:]))}, or drop it" if groups else "drop it"
    return (f"--fix hsdp={pins.hsdp} shards over {pins.hsdp} data-parallel ranks and keeps 2 or more replicas, so it "
            f"needs {2 * pins.hsdp} or more data-parallel ranks, a multiple of {pins.hsdp}; {given} give {gives}: {fix}")


def check_hsdp_pin(pins: Pins, usable: Sequence[str], graph: OpGraph, request: PlanRequest) -> None:
    """:class:`InputError` when ``--fix hsdp`` is asked of launchers none of which runs HSDP (naming one that
    does and runs the model), or is a shard group no data-parallel layout of the devices holds twice
    (:func:`hsdp_refusal`)."""
    from exporters.targets import TARGETS

    if pins.hsdp is not None and not any(TARGETS[name].hsdp or TARGETS[name].hpz for name in usable):
        hybrid = [name for name, target in TARGETS.items() if target.hsdp or target.hpz]
        named = ", ".join(hybrid[:-1]) + f" and {hybrid[-1]}" if len(hybrid) > 1 else hybrid[0]
        refusal = _refusal(graph, request)
        runs = [name for name in hybrid if name not in usable and refusal(name) is None]
        fix = f"e.g. --target {runs[0]} --fix hsdp={pins.hsdp}" if runs else "none of them trains this model: drop --fix hsdp"
        raise InputError(f"--fix hsdp: no listed launcher runs HSDP ({', '.join(usable)}); {named} do, {fix}")
    impossible = hsdp_refusal(pins, request.cluster.devices)
    if impossible:
        raise InputError(impossible)


def check_expert_pin(graph: OpGraph, pins: Pins) -> None:
    """:class:`InputError` at once when ``--fix ep`` > 1 pins expert parallelism on a model without experts
    (no routed MoE layer, :func:`importers.moe.find_moe_layers`): no row has ``ep > 1`` there."""
    from importers.moe import find_moe_layers

    if pins.ep is not None and pins.ep > 1 and not find_moe_layers(graph):
        raise InputError(f"--fix ep={pins.ep} splits the experts of a Mixture-of-Experts model, and {graph.name} has "
                         "no experts (no routed MoE layer found): drop ep")


def launcher_hsdp(options: PipelineOptions, launcher: str, dp_shard: int | None, *, pinned: bool,
                  devices: int) -> PipelineOptions | None:
    """``options`` narrowed to the ZeRO stages ``launcher`` runs hybrid-sharded
    (:attr:`exporters.targets.Target.hsdp`) and to the pipeline sizes whose stages (of ``devices`` /
    ``pp`` ranks) hold at least two whole shard groups; ``None`` when it runs none or no size does.
    Without HSDP, ``options``. Unless ``pinned`` (``--fix hsdp``), only FSDP2's (ZeRO-3) is
    searched: Megatron-LM's partial distributed optimizer would repeat the costliest search (its
    pipelines) for a ZeRO-1 variant. An HSDP row differs from plain ZeRO only at ``dp > dp_shard``
    whole replicas (:func:`planner.launchable._hybrid` drops the others), and ``dp`` is at most a
    stage's ranks: a larger ``pp`` would only build models for rows that are dropped."""
    from exporters.targets import TARGETS

    if dp_shard is None:
        return options
    runs = TARGETS[launcher].hsdp or TARGETS[launcher].hpz  # DeepSpeed's hpZ: its analogue (hybrid_groups)
    zeros = tuple(z for z in options.zero_stages if z in runs and (pinned or 3 in runs))
    sizes = tuple(pp for pp in (options.pipeline_sizes or divisors(devices)) if devices // pp >= 2 * dp_shard)
    return dataclasses.replace(options, zero_stages=zeros, pipeline_sizes=sizes) if zeros and sizes else None


def hybrid_groups(launcher: str, group: int | None) -> dict[str, int | None]:
    """The settings of a search at HSDP group ``group`` (:func:`hsdp_sizes`) for ``launcher``: ``dp_shard`` (the HSDP
    shard group) for a launcher that runs HSDP, ``hpz`` (ZeRO++'s secondary partition group,
    ``TrainingSettings.hpz_partition``) for one that runs hpZ instead (:attr:`exporters.targets.Target.hpz`: DeepSpeed).

    >>> hybrid_groups("torchtitan", 8), hybrid_groups("deepspeed", 8), hybrid_groups("deepspeed", None)
    ({'dp_shard': 8}, {'hpz': 8}, {'dp_shard': None})
    """
    from exporters.targets import TARGETS

    target = TARGETS.get(launcher)
    return {"hpz": group} if group is not None and target is not None and target.hpz else {"dp_shard": group}


def hsdp_rules(rules, dp_shard: int | None):
    """``rules`` with the families narrowed to those whose ``dp`` is whole replicas of the HSDP shard
    group, more than one (where it differs from plain ZeRO: :func:`planner.launchable._hybrid`)."""
    if rules is None or dp_shard is None:
        return rules
    families = rules.families

    def hybrid(*args: Any, **kwargs: Any) -> list:
        return [f for f in families(*args, **kwargs) if f.dp is None or (f.dp > dp_shard and f.dp % dp_shard == 0)]

    return dataclasses.replace(rules, families=hybrid)


PIPELINE_START_STATE_SHARE = 0.5
"""The share of a device's memory the weights and gradients may take at the first pipeline size a
large model's searches try (:func:`pipeline_order`); the rest is left to activations, the
allocator and the launcher's buffers."""


def states_exceed_a_device(graph: OpGraph, request: PlanRequest) -> bool:
    """Whether the model's weights, gradients and optimizer state (bf16 Adam: 16 bytes per
    parameter) exceed one device's memory: a model that needs its states split to train at all."""
    from objectives.memory import state_bytes_per_parameter

    states_bytes = graph.parameter_count * state_bytes_per_parameter(request.settings).total
    return states_bytes > request.cluster.device.memory_bytes


def pipeline_order(graph: OpGraph, request: PlanRequest) -> tuple[int, ...]:
    """Every pipeline size (a divisor of the devices), in the order the searches try them.

    The order changes nothing when the searches finish; when the time limit stops them it decides
    which plans were seen. A model whose states fit one device (:func:`states_exceed_a_device`) is
    tried with the fewest stages first. A larger one starts at the fewest stages whose weights and
    gradients, split over a node's tensor-parallel ranks, take at most
    :data:`PIPELINE_START_STATE_SHARE` of the memory limit beside the optimizer state sharded over
    every device (the smallest pipelines a fast plan can use: fewer stages leave no room for
    activations, and more only add bubble), goes up from there, and tries the fewer stages last,
    the most first (their searches are the longest and their plans the slowest: a GPT-3 175B at
    1,024 devices would spend the whole limit on ``pp = 1``).
    """
    from objectives.memory import state_bytes_per_parameter

    sizes = divisors(request.cluster.devices)
    if not states_exceed_a_device(graph, request):
        return tuple(sizes)
    state = state_bytes_per_parameter(request.settings)
    limit_bytes = float(request.memory_limit_bytes or request.cluster.device.memory_bytes)
    optimizer_bytes = graph.parameter_count * state.optimizer / request.cluster.devices

    def fits(pp: int) -> bool:
        tp = min(request.cluster.devices_per_node, request.cluster.devices // pp)
        weights_bytes = graph.parameter_count * (state.param + state.grad) / (pp * tp)
        return weights_bytes + optimizer_bytes <= PIPELINE_START_STATE_SHARE * limit_bytes

    start = next((pp for pp in sizes if fits(pp)), sizes[-1])
    return tuple([pp for pp in sizes if pp >= start] + [pp for pp in reversed(sizes) if pp < start])


def context_split(launchers: Sequence[str]) -> ContextSplit | None:
    """The sequence split the search lets cross nodes (:class:`objectives.pipeline_cost.ContextSplit`: each op's
    context-parallel dim, each rank keeping ``CP_MIN_TOKENS``) when one of ``launchers`` runs context parallelism
    across nodes (:attr:`exporters.targets.Target.context_across_nodes`: Megatron-LM, torchtitan); ``None``
    otherwise: every model-parallel split then stays inside a node.

    >>> context_split(["deepspeed", "dtensor"]) is None
    True
    >>> context_split(["megatron"]).min_tokens
    1024
    """
    from exporters._target import CP_MIN_TOKENS
    from exporters._tp import context_dims
    from exporters.targets import TARGETS

    across = frozenset(name for name in launchers if name in TARGETS and TARGETS[name].context_across_nodes)
    return ContextSplit(dims=context_dims, launchers=across, min_tokens=CP_MIN_TOKENS) if across else None


def replays_cuda_graphs(launcher: str, *, execution: Any, pinned: str | None) -> bool | None:
    """``True`` where ``launcher`` replays a one-stage plan without expert parallelism as a CUDA graph, priced so
    (:attr:`exporters.targets.Target.cuda_graphs`, under an execution model, ``--fix cuda_graphs`` not pinned);
    ``None``: the request's setting."""
    from exporters.targets import TARGETS

    # Target.replays_graphs at pp = 1, ep = 1 (launcher_cuda_graphs splits the sizes), under this execution model
    return True if pinned is None and execution is not None and TARGETS[launcher].replays_graphs(
        TrainingSettings(engine=getattr(execution, "engine", "fused")), pp=1) else None


def launcher_p2p_overlap(options: PipelineOptions, launcher: str, settings: TrainingSettings) -> bool | None:
    """``TrainingSettings.p2p_overlap`` for ``launcher``'s search of ``options``, where it is not ``settings``' own:
    its interleaved transfers overlapped where it overlaps them by default and ``options`` interleave model chunks
    (:meth:`exporters.targets.Target.priced_p2p_overlap`: Megatron-LM's ``overlap_p2p_comm``); ``None``: the
    request's (every other launcher, a schedule without chunks, or ``--fix p2p_overlap`` pinned in ``settings``).

    >>> interleaved = PipelineOptions(global_batch=8, schedule="interleaved", chunks=2)
    >>> [launcher_p2p_overlap(o, n, TrainingSettings()) for o in (interleaved, PipelineOptions(global_batch=8))
    ...  for n in ("megatron", "torchtitan")]
    [True, None, None, None]
    """
    from exporters.targets import TARGETS

    pp = max(options.pipeline_sizes or (2,))  # searched sizes unknown yet: any pipeline interleaves alike
    overlap = TARGETS[launcher].priced_p2p_overlap(settings, pp=pp, chunks=options.chunks)
    return None if overlap == settings.p2p_overlap else overlap


def launcher_cuda_graphs(options: PipelineOptions, launcher: str, *, ep: int, execution: Any, pinned: str | None,
                         devices: int) -> list[tuple[bool | None, PipelineOptions]]:
    """``(cuda_graphs, options)`` for each search of ``launcher``: a launcher that replays each micro-batch as one
    captured CUDA graph where it can (:attr:`exporters.targets.Target.cuda_graphs`: torchtitan 0.3.0, whose
    ``Trainer.Config._validate_cuda_graphs`` refuses pipelines and host-syncing expert dispatchers) is searched at
    ``pp = 1`` with graphs and at ``pp > 1`` without, as it runs them; under an execution model only (the plain
    roofline prices no launch), at ``ep = 1``. ``None``: the request's setting (every other launcher, or
    ``--fix cuda_graphs`` pinned: ``pinned``).

    >>> [(g, o.pipeline_sizes) for g, o in launcher_cuda_graphs(PipelineOptions(global_batch=8), "torchtitan", ep=1, execution="fused",
    ...                                                         pinned=None, devices=4)]
    [(True, (1,)), (False, (2, 4))]
    >>> [(g, o.pipeline_sizes) for g, o in launcher_cuda_graphs(PipelineOptions(global_batch=8), "megatron", ep=1, execution="fused",
    ...                                                         pinned=None, devices=4)]
    [(None, None)]
    """
    if ep > 1 or not replays_cuda_graphs(launcher, execution=execution, pinned=pinned):
        return [(None, options)]
    return graph_split(options, devices)


def launcher_autocast(options: PipelineOptions, launcher: str, *, execution: Any, precision: str,
                      autocast: bool = True) -> list[tuple[bool | None, PipelineOptions]]:
    """``(autocast, options)`` for each search of ``launcher``: under the eager engine in ``bf16-mixed``, its ZeRO
    stages parted by whether its launcher runs them under ``torch.autocast`` or as bf16 modules under FSDP2's
    ``MixedPrecisionPolicy`` (:attr:`exporters.targets.Target.autocast_zero`: torchtitan never autocasts, the DTensor
    plan only at ZeRO 0-2), each part priced so; ``None``: the request's ``autocast`` (every other launcher, engine
    and precision: one search).

    >>> [(a, o.zero_stages) for a, o in launcher_autocast(PipelineOptions(global_batch=8), "dtensor",
    ...                                                     execution=default_execution(engine="eager"), precision="bf16-mixed")]
    [(None, (0, 1, 2)), (False, (3,))]
    >>> [(a, o.zero_stages) for a, o in launcher_autocast(PipelineOptions(global_batch=8), "torchtitan",
    ...                                                     execution=default_execution(engine="fused"), precision="bf16-mixed")]
    [(None, (0, 1, 2, 3))]
    """
    settings = TrainingSettings(precision=precision, autocast=autocast)
    parts: dict[bool | None, tuple[int, ...]] = {}
    for zero in options.zero_stages:
        on = launcher_autocasts(launcher, execution, settings, zero)
        parts[on] = (*parts.get(on, ()), zero)
    if len(parts) == 1:
        return [(next(iter(parts)), options)]
    return [(on, dataclasses.replace(options, zero_stages=zeros)) for on, zeros in parts.items()]


def launcher_autocasts(launcher: str, execution: Any, settings: TrainingSettings, zero_stage: int) -> bool | None:
    """Whether ``launcher`` runs its ZeRO-``zero_stage`` plans under ``torch.autocast`` where that is not ``settings``'
    (:meth:`exporters.targets.Target.priced_autocast` under ``execution``, in the settings' precision); ``None``: as
    ``settings``."""
    from exporters.targets import TARGETS

    if execution is None or not execution.eager or settings.precision != "bf16-mixed":
        return None
    eager = dataclasses.replace(settings, engine="eager", attention=execution.attention)
    on = TARGETS[launcher].priced_autocast(eager, zero_stage)
    return None if on == settings.autocast else on


def launcher_jobs(usable: Sequence[str], degrees: Sequence[int], options: PipelineOptions, pins: Pins,
                  executions: Any, *, precisions: Sequence[tuple[str, str | None]], offloads: Sequence[str],
                  hsdp: Sequence[int | None], devices: int, autocast: bool = True) -> list[tuple]:
    """Every launcher search of ``planner.launchable``: ``(ep, options, launcher, rules, (precision, fp8 recipe), offload,
    dp_shard, cuda_graphs, autocast)``, one per ``ep`` (dividing every stage's devices; ``ep > 1`` only for a launcher
    with an expert axis), precision (FP8 only for the launchers of that recipe), recomputation modes it runs
    (:func:`launcher_recompute`), offload mode (:func:`launcher_offload`), HSDP shard group (:func:`launcher_hsdp`),
    CUDA-graph replay (:func:`launcher_cuda_graphs`) and eager autocast (:func:`launcher_autocast`; ``autocast``: the
    request's), its options narrowed to each."""
    from exporters.targets import TARGETS

    jobs = []
    for ep in degrees:
        # experts split over a stage's ranks: ep divides every stage's devices
        sizes = tuple(pp for pp in (options.pipeline_sizes or divisors(devices)) if (devices // pp) % ep == 0)
        if sizes:
            by_ep = options if ep == 1 else dataclasses.replace(options, pipeline_sizes=sizes)
            jobs += [(ep, by_ep, name, pinned_rules(name, pins), precision) for precision in precisions
                     for name in usable if (precision[1] is None or TARGETS[name].fp8 == precision[1])
                     and (ep == 1 or TARGETS[name].expert_parallel)]  # a launcher without an expert axis: ep = 1 only
    jobs = [(ep, by_launcher, name, rules, precision) for ep, by_ep, name, rules, precision in jobs
            if (by_launcher := launcher_recompute(by_ep, name, pins)) is not None]
    jobs = [(ep, by_offload, name, rules, precision, offload) for offload in offloads
            for ep, by_ep, name, rules, precision in jobs
            if (by_offload := launcher_offload(by_ep, name, offload)) is not None]
    jobs = [(ep, by_hsdp, name, rules, precision, offload, shard) for shard in hsdp
            for ep, by_ep, name, rules, precision, offload in jobs
            if (by_hsdp := launcher_hsdp(by_ep, name, shard, pinned=pins.hsdp is not None, devices=devices)) is not None]
    # a launcher that replays each micro-batch as a CUDA graph where it can: its pp = 1 rows so priced, apart
    jobs = [(ep, by_graphs, name, rules, precision, offload, shard, graphs)
            for ep, by_ep, name, rules, precision, offload, shard in jobs
            for graphs, by_graphs in launcher_cuda_graphs(by_ep, name, ep=ep, execution=executions[name],
                                                          pinned=pins.cuda_graphs, devices=devices)]
    # eager bf16: the ZeRO stages a launcher runs under torch.autocast apart from those it runs as bf16 modules
    return [(ep, by_cast, name, rules, precision, offload, shard, graphs, cast)
            for ep, by_ep, name, rules, precision, offload, shard, graphs in jobs
            for cast, by_cast in launcher_autocast(by_ep, name, execution=executions[name], precision=precision[0],
                                                   autocast=autocast)]


def graph_split(options: PipelineOptions, devices: int) -> list[tuple[bool, PipelineOptions]]:
    """``options`` as a launcher that replays one-stage plans as a CUDA graph searches them: ``(True, pp = 1)``
    and ``(False, pp > 1)``, each where ``options`` (or ``devices``' divisors) has such sizes.

    >>> [(g, o.pipeline_sizes) for g, o in graph_split(PipelineOptions(global_batch=8, pipeline_sizes=(2,)), 4)]
    [(False, (2,))]
    """
    sizes = tuple(options.pipeline_sizes or divisors(devices))
    deeper = tuple(pp for pp in sizes if pp > 1)
    return ([(True, dataclasses.replace(options, pipeline_sizes=(1,)))] if 1 in sizes else []) + (
        [(False, dataclasses.replace(options, pipeline_sizes=deeper))] if deeper else [])
