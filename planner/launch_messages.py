"""The main job's messages: why ``planner plan`` has no row to pick, and the note on a tight pick.

* :func:`fit_message`: the one line the CLI prints (exit 2) when no row fits: the launchers that
  cannot run the model, no row found, or the smallest row over the memory limit.
* :func:`pinned_refusal`: when no row was found and the user pinned degrees or settings (``--fix``),
  what each searched launcher runs instead, read from its own rules (:data:`exporters.targets.TARGETS`:
  the families of :meth:`~exporters._target.Target.pipeline_families`, the recomputation and offload
  modes it runs, :meth:`~exporters._target.Target.allows_pipeline`, whether it runs ``ep > 1``), with the
  exporter's reason where it states one (:data:`_DEGREE_REFUSALS`), and the pin to drop or change.
* :func:`tight_pick` / :func:`tight_note`: a plan over the limit only by the allocator's reserve.

This is the roof (``planner.launchable`` calls it): it may read the exporters' rules; the search never does.
Rows are :class:`planner.launchable.Row` (typed ``Any`` here: that module imports this one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from planner.core.configs import ConfigOptions, divisors, enumerate_configs
from planner.core.degrees import Degrees, Pins
from planner.core.units import format_bytes

if TYPE_CHECKING:
    from planner.core.graph import OpGraph
    from planner.pipeline import PipelineOptions
    from planner.plan import PlanRequest

__all__ = ["fit_message", "measured_notes", "pinned_refusal", "tight_pick", "tight_note", "SearchStop", "stop_note"]


def tight_pick(rows: Sequence[Any], device_bytes: float) -> int | None:
    """The fastest row whose live tensors and NCCL's buffers fit the device though its whole prediction,
    the allocator's reserve included, does not (``None``: none). Such a plan runs unless fragmentation
    defeats the allocator's free-and-retry on a failed ``cudaMalloc`` (``objectives.memory``), so with no
    ``--mem-limit`` it is picked rather than answering "nothing fits"; NCCL's buffers are no reserve:
    NCCL allocates them itself, whatever the allocator frees (``objectives.nccl_memory``)."""
    return next((i for i, row in enumerate(rows) if row.point.memory.needed_bytes <= device_bytes), None)


def tight_note(row: Any, device_bytes: float) -> str:
    """The note on a :func:`tight_pick` (``device_bytes``: bytes per device)."""
    memory = row.point.memory
    settings = row.cache.settings
    # Megatron-LM's transformer_engine graphs assert expandable segments off unless NCCL's graph registration is
    # (megatron/training/arguments.py validate_args, under --cuda-graph-impl transformer_engine)
    expandable = ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True with NCCL_GRAPH_REGISTER=0 (Megatron-LM's CUDA "
                  "graphs refuse it without)" if settings.cuda_graphs and settings.cuda_graph_scope == "layers"
                  else "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    return (f"tight: no plan fits {format_bytes(device_bytes)} with the allocator's usual reserve; the pick's live "
            f"tensors take {format_bytes(memory.allocated_bytes)}{_nccl_part(memory)} (+{format_bytes(memory.other_bytes)} "
            "reserve), which "
            f"runs when the allocator frees its cache and retries; {expandable} cuts fragmentation, and --mem-limit "
            "makes the reserve a hard limit")


def fit_message(rows: Sequence[Any], limit_bytes: float, launchers: Sequence[str],
                refused: Sequence[tuple[str, str]] = (), model: str = "the model", named: bool = False,
                pinned: str = "") -> str:
    """Why no row is picked, ending with the fix (``limit_bytes``: bytes per device; ``refused``:
    ``(launcher, reason)`` of those that cannot run the model; ``named``: ``--target`` named them;
    ``pinned``: :func:`pinned_refusal`'s line, said instead of the general advice when no row was found)."""
    if not rows and not launchers and refused:
        # no launcher can run the model at all: say why (the table's "not listed" lines are not shown)
        if named and len(refused) == 1:
            name, reason = refused[0]
            return (f"--target {name} can run no plan of {model}: {reason}; plan without --target (every launcher) "
                    "or with --target generic (every per-op plan, exported as the generic plan)")  # fmt: skip
        reasons = "; ".join(f"{name}: {reason}" for name, reason in refused)
        return f"no launcher can run {model} ({reasons}); plan with --target generic (every per-op plan, exported as the generic plan)"
    if not rows and pinned:
        return pinned
    if not rows:
        return (
            f"no plan that {', '.join(launchers) or 'a launcher'} runs was found on these devices; "
            "plan with --target generic (every per-op plan, exported as the generic plan), or change --fix, "
            "--global-batch or the device count"
        )
    smallest = min(rows, key=lambda row: row.memory_bytes)
    return (
        f"no launchable plan fits in {format_bytes(limit_bytes)} per device; the smallest needs "
        f"{format_bytes(smallest.memory_bytes)}{_nccl_reason(rows, limit_bytes)}; try more devices, a smaller "
        f"--global-batch or --mem-limit {format_bytes(smallest.memory_bytes)}"
    )


def _nccl_part(memory: Any) -> str:
    """`` and NCCL's buffers N`` of a breakdown that holds them (``MemoryBreakdown.nccl_bytes``), else empty."""
    nccl = float(getattr(memory, "nccl_bytes", 0.0) or 0.0)
    return f" and NCCL's buffers {format_bytes(nccl)}" if nccl else ""


def _row_nccl(row: Any) -> float:
    """A row's NCCL buffer bytes (``MemoryBreakdown.nccl_bytes`` of its point; 0 where none is recorded)."""
    return float(getattr(getattr(getattr(row, "point", None), "memory", None), "nccl_bytes", 0.0) or 0.0)


def _nccl_reason(rows: Sequence[Any], limit_bytes: float) -> str:
    """Where some row would fit without NCCL's buffers, the words that say they turn it away."""
    blocked = [row for row in rows if _row_nccl(row) and row.memory_bytes - _row_nccl(row) <= limit_bytes]
    if not blocked:
        return ""
    row = min(blocked, key=lambda r: r.memory_bytes)
    return (f"; {format_bytes(row.memory_bytes)} ({getattr(row, 'summary', 'a plan')}) would fit but "
            f"for NCCL's buffers ({format_bytes(_row_nccl(row))}, outside PyTorch's allocator; they follow "
            "NCCL_BUFFSIZE: a cluster file's nccl_buffsize)")


# --------------------------------------------------------------------------------------------
# what a launcher runs instead of the pinned degrees and settings


def _megatron_tp(graph: OpGraph, tp: int) -> str | None:
    """Megatron-LM's Mamba/hybrid stack: the module that cannot split ``tp`` ways
    (:func:`exporters.megatron.mamba_tp.tp_refusal`, megatron-core 0.16.1); ``None`` for other models."""
    from exporters.megatron.mamba import hybrid_stack
    from exporters.megatron.mamba_tp import tp_refusal

    stack = hybrid_stack(graph)
    return None if stack is None else tp_refusal(stack, tp)


def _deepspeed_pp(graph: OpGraph, pp: int) -> str | None:
    """DeepSpeed's ``PipelineModule`` runs one chain of blocks (:func:`exporters.block_chain.chain_break`)."""
    from exporters.block_chain import chain_break

    return chain_break(graph)


def _deepspeed_ep(graph: OpGraph, ep: int) -> str | None:
    """DeepSpeed's AutoEP must find the MoE blocks and run their router
    (:func:`exporters.deepspeed.autoep.expert_parallel_reason`)."""
    from exporters.deepspeed.autoep import expert_parallel_reason

    return expert_parallel_reason(graph)


def _without_advice(why: str | None) -> str | None:
    """An exporter's tp reason without its closing 'plan tp=1': the message names the pin to change."""
    return None if why is None else why.removesuffix("; plan tp=1")


def _deepspeed_tp(graph: OpGraph, tp: int) -> str | None:
    """DeepSpeed's AutoTP keeps a per-head QK norm whole while a rank holds ``1/tp`` of the heads
    (:func:`exporters.deepspeed.rules.per_head_weights_tp`), and shards no projection multiplied with einsum
    (:func:`exporters._tp.linear_only_tp`)."""
    from exporters._tp import AUTOTP_LINEARS, linear_only_tp
    from exporters.deepspeed.rules import per_head_weights_tp

    return _without_advice(per_head_weights_tp(graph)) or linear_only_tp(graph, AUTOTP_LINEARS)


def _dtensor_tp(graph: OpGraph, tp: int) -> str | None:
    """A DTensor plan replicates a per-head QK norm while the colwise Q/K projections split the heads
    (:func:`exporters.dtensor.rules.per_head_weights_tp`), and its styles shard no projection multiplied with einsum
    (:func:`exporters._tp.linear_only_tp`)."""
    from exporters._tp import DTENSOR_LINEARS, linear_only_tp
    from exporters.dtensor.rules import per_head_weights_tp

    return _without_advice(per_head_weights_tp(graph)) or linear_only_tp(graph, DTENSOR_LINEARS)


def _unsplit_widths(graph: OpGraph, tp: int) -> str | None:
    """The transformer width ``tp`` does not divide, which every launcher's tensor parallelism splits ``tp``
    ways (the attention heads, the MLP's width: Megatron-LM's, AutoTP's and DTensor's colwise projections);
    ``None`` when both divide or the model is no transformer."""
    from importers.transformer import analyze_transformer
    from planner.core.errors import UnsupportedExport

    try:
        model = analyze_transformer(graph)
    except UnsupportedExport:
        return None
    if model.num_attention_heads % tp:
        return f"its {model.num_attention_heads} attention heads do not split {tp} ways"
    if model.ffn_hidden_size % tp:
        return f"its MLP width {model.ffn_hidden_size} does not split {tp} ways"
    return None


def _short_context(graph: OpGraph, cp: int, *, chunks: bool = True) -> str | None:
    """Why ``cp`` is not searched at the model's sequence length: context parallelism is searched only where
    each of the ``cp`` ranks keeps :data:`exporters._target.CP_MIN_TOKENS` tokens and, for a launcher that
    balances the causal mask (``chunks``: Megatron-LM, torchtitan), where the sequence cuts into ``2 cp``
    equal chunks (:func:`exporters._target.context_degrees`; DeepSpeed-Ulysses asks the tokens only).
    ``None`` when both hold or the model is no transformer. The fix names the ``--dim`` bound to the
    sequence where one is (a sequence-like name first where the batch has the same size)."""
    from exporters._target import CP_MIN_TOKENS
    from importers.transformer import analyze_transformer
    from planner.core.errors import UnsupportedExport

    try:
        seq = analyze_transformer(graph).seq_length
    except UnsupportedExport:
        return None
    bound = sorted((n for n, size in graph.dim_bindings.items() if size == seq),
                   key=lambda n: not any(word in n.lower() for word in ("seq", "len", "tok", "time")))
    if seq < CP_MIN_TOKENS * cp:  # floor(seq / cp) < CP_MIN_TOKENS exactly when seq < CP_MIN_TOKENS x cp
        shortest = CP_MIN_TOKENS * cp  # a multiple of 2 cp too: the chunks' rule holds there
        fix = f"--dim {bound[0]}={shortest} or longer" if bound else f"a sequence of {shortest:,} tokens or more"
        return (f"each rank would keep {seq // cp:,} of its {seq:,} tokens, and context parallelism is searched "
                f"from {CP_MIN_TOKENS:,} tokens per rank: plan with {fix}")
    if chunks and seq % (2 * cp):
        fix = f"--dim {bound[0]}" if bound else "a sequence length"
        return (f"its {seq:,} tokens do not cut into {2 * cp} equal chunks (the causal load balance of "
                f"context parallelism): plan with {fix} a multiple of {2 * cp}")
    return None


def _ulysses_short_context(graph: OpGraph, cp: int) -> str | None:
    """DeepSpeed-Ulysses' ``cp`` needs :data:`exporters._target.CP_MIN_TOKENS` tokens per rank only (its
    all-to-all splits the heads, no causal chunks: ``exporters.deepspeed.ulysses``)."""
    return _short_context(graph, cp, chunks=False)


_DEGREE_REFUSALS: dict[tuple[str, str], Callable[[OpGraph, int], str | None]] = {
    ("deepspeed", "ep"): _deepspeed_ep, ("deepspeed", "tp"): _deepspeed_tp, ("dtensor", "tp"): _dtensor_tp,
    ("megatron", "tp"): _megatron_tp, ("deepspeed", "pp"): _deepspeed_pp,
    ("megatron", "cp"): _short_context, ("torchtitan", "cp"): _short_context,
    ("deepspeed", "cp"): _ulysses_short_context}
"""``(launcher, degree) -> reason(graph, value)``: the exporters' public reasons a degree has no family
(one entry per reason an exporter states; elsewhere the message names the degrees run, without a reason)."""


def _or(values: Sequence[object]) -> str:
    """The values as a list in words.

    >>> _or([1]), _or([1, 2]), _or(["none", "selective", "full"])
    ('1', '1 or 2', 'none, selective or full')
    """
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _nearest(values: Sequence[object], pinned: object) -> object:
    """The value run nearest the pinned one (numbers: the smaller on a tie; names: the first listed)."""
    if isinstance(pinned, int):
        return min(values, key=lambda v: (abs(v - pinned), v))  # type: ignore[operator]
    return values[0]


def _settings_refusal(name: str, options: PipelineOptions, pins: Pins, devices: int) -> tuple[str, str, list] | None:
    """``(clause, pinned key, values run)`` when the launcher's settings rules refuse every pinned
    combination of recomputation, offload, ZeRO stage and pipeline size (``None``: they do not)."""
    from exporters.targets import TARGETS

    target = TARGETS[name]
    if pins.recompute is not None and pins.recompute not in target.recompute:
        return f"{name} runs recompute {_or(target.recompute)}", "recompute", list(target.recompute)
    if pins.offload not in (None, "none") and pins.offload not in target.offload:
        return f"{name} runs offload {_or(target.offload)}", "offload", list(target.offload)
    sizes = options.pipeline_sizes or tuple(divisors(devices))  # narrowed to --fix pp, or --pp's

    context = pins.cp is not None and pins.cp > 1

    def runs(pp: int, zero: int) -> bool:
        if context and zero not in target.context_zero:
            return False
        return any(target.allows_pipeline(pp=pp, zero_stage=zero, recompute=r, schedule=options.schedule, tp=pins.tp)
                   for r in options.recompute)

    if pins.zero is not None and not any(runs(pp, pins.zero) for pp in sizes):
        zeros = [z for z in (0, 1, 2, 3) if any(runs(pp, z) for pp in sizes)]
        where = f" at pp={pins.pp} with the {options.schedule} schedule" if pins.pp not in (None, 1) else ""
        where += f" with cp={pins.cp}" if context and pins.zero not in target.context_zero else ""
        if zeros:
            return f"{name} runs ZeRO {_or(zeros)}{where}", "zero", zeros
    if pins.pp is not None and not any(runs(pins.pp, z) for z in options.zero_stages):
        sizes_run = [pp for pp in divisors(devices) if any(runs(pp, z) for z in options.zero_stages)]
        if sizes_run:
            return f"{name} runs pp {_or(sizes_run)} with the {options.schedule} schedule", "pp", sizes_run
    return None


def _expert_refusal(name: str, graph: OpGraph, pins: Pins) -> tuple[str, str, list] | None:
    """``(clause, "ep", [1])`` when the launcher runs no ``ep > 1`` and ``--fix ep`` pins one: its mesh has no
    expert axis (:attr:`exporters._target.Target.expert_parallel`), or the exporter says why not on this
    model (:data:`_DEGREE_REFUSALS`: DeepSpeed's AutoEP); ``None`` otherwise."""
    from exporters.targets import TARGETS

    if pins.ep is None or pins.ep <= 1:
        return None
    if not TARGETS[name].expert_parallel:
        return f"{name} runs ep 1 (its mesh has no expert axis: every rank keeps every expert)", "ep", [1]
    why = _DEGREE_REFUSALS.get((name, "ep"), lambda graph, value: None)(graph, pins.ep)
    return None if why is None else (f"{name} runs ep 1 on this model (ep={pins.ep}: {why})", "ep", [1])


def _across_nodes(pins: Pins, devices_per_node: int, launchers: Sequence[str]) -> str:
    """The line for a pinned ``tp`` past a node, or a pinned ``cp`` whose ``tp x cp`` (the ranks that split one
    sample's layers) is more than a node holds, when no launcher of ``launchers`` runs it: the search keeps tensor parallelism inside
    a node, and lets the sequence split cross nodes for the launchers that run context parallelism across
    them only (:attr:`exporters.targets.Target.context_across_nodes`: Megatron-LM, torchtitan; DeepSpeed-Ulysses'
    heads split stays inside one, objectives.pipeline_cost's masks); ``""`` when it fits a node or runs.

    >>> _across_nodes(Pins(cp=16), 8, ["deepspeed"])
    '--fix cp=16 splits each sample 16 ways, past a node (8 devices), and of the launchers searched none runs context parallelism across nodes (megatron and torchtitan do): use --target megatron, --fix cp=8 or less, or --devices-per-node 16 if one NVLink domain joins 16 devices'
    >>> _across_nodes(Pins(cp=16), 8, ["megatron", "deepspeed"])
    ''
    >>> _across_nodes(Pins(cp=4, tp=2), 8, ["deepspeed"])
    ''
    >>> _across_nodes(Pins(tp=16), 8, ["megatron"])
    '--fix tp=16 splits each layer 16 ways and the search keeps tensor parallelism inside a node (8 devices): use --fix tp=8 or less, or --devices-per-node 16 if one NVLink domain joins 16 devices'
    >>> _across_nodes(Pins(tp=16, cp=2), 8, ["megatron"])
    '--fix tp=16,cp=2 splits each sample 32 ways and the search keeps tensor parallelism inside a node (8 devices): use --fix tp=8 or less, or --devices-per-node 16 if one NVLink domain joins 16 devices'
    """
    from exporters.targets import TARGETS

    ranks, tp = (pins.tp or 1) * (pins.cp or 1), pins.tp or 1
    pinned = ",".join(f"{key}={getattr(pins, key)}" for key in ("tp", "cp") if getattr(pins, key) not in (None, 1))
    if tp > devices_per_node:  # the families list it (they span every world size); a pinned cp crosses nodes, tp never
        split = f"each layer {tp} ways" if pins.cp in (None, 1) else f"each sample {ranks} ways"
        return (f"--fix {pinned} splits {split} and the search keeps tensor parallelism inside a node "
                f"({devices_per_node} devices): use --fix tp={devices_per_node} or less, or --devices-per-node {tp} "
                f"if one NVLink domain joins {tp} devices")
    if pins.cp in (None, 1) or ranks <= devices_per_node:
        return ""  # a pinned tp alone: the launchers' families name the degrees they run (_degree_refusal)
    across = [name for name, target in TARGETS.items() if target.context_across_nodes]
    if any(name in across for name in launchers):
        return ""
    fix = f"--fix cp={devices_per_node // tp} or less" if tp < devices_per_node else f"--fix tp={devices_per_node // 2} or less"
    return (f"--fix {pinned} splits each sample {ranks} ways, past a node ({devices_per_node} devices), and of the "
            f"launchers searched none runs context parallelism across nodes ({' and '.join(across)} do): use --target "
            f"{across[0]}, {fix}, or --devices-per-node {ranks} if one NVLink domain joins {ranks} devices")


def _degree_refusal(name: str, graph: OpGraph, request: PlanRequest, pins: Pins) -> tuple[str, str, list] | None:
    """``(clause, pinned key, values run)`` when none of the launcher's families on these devices has
    the pinned ``tp`` / ``cp`` / ``dp`` (``None``: one has, or its families name no such degrees).

    The families are the target's on the whole graph with every world size dividing the devices
    (``pp = 1``: :func:`exporters._target.worlds`), so a stage of ``devices / pp`` is among them;
    under ``--fix pp`` only that stage size's."""
    devices = request.cluster.devices
    every = _every_family(name, graph, request)
    staged = _pipeline_refusal(name, graph, request, pins) if every and pins.pp not in (None, 1) else None
    if staged is not None:
        return staged
    sized = [f for f in every if f.dp is not None and f.tp is not None
             and (pins.pp is None or f.dp * f.cp * f.tp * pins.pp == devices)]
    families = [f for f in sized if _inside_a_node(name, f, request)]
    if not families:
        return None
    where = f"on this model at {devices} devices" + (f" with pp={pins.pp}" if pins.pp not in (None, 1) else "")
    where += f", {request.cluster.devices_per_node} per node" if len(families) < len(sized) else ""
    for key in ("tp", "cp", "dp"):
        pinned = getattr(pins, key)
        values = sorted({getattr(f, key) for f in families})
        if pinned is None or pinned in values:
            continue
        why = _DEGREE_REFUSALS.get((name, key), lambda graph, value: None)(graph, pinned)
        why = why or (_unsplit_widths(graph, pinned) if key == "tp" else None)
        return f"{name} runs {key} {_or(values)} {where}" + (f" ({key}={pinned}: {why})" if why else ""), key, values
    if any(all(getattr(pins, k) in (None, getattr(f, k)) for k in ("tp", "cp", "dp")) for f in families):
        return None
    layouts = sorted({Degrees(dp=f.dp, cp=f.cp, tp=f.tp).label() for f in families})
    return f"{name} runs {_or(layouts)} {where}, none with every pinned degree", "", []


def _inside_a_node(name: str, family: Any, request: PlanRequest) -> bool:
    """Whether the search can place ``family``: its tensor parallelism inside a node, and its sequence split
    too unless the launcher runs context parallelism across nodes (:func:`_across_nodes`). The families span
    every world size (tp 16 and 32 at 64 devices), which the search does not place on 8-device nodes."""
    from exporters.targets import TARGETS

    per_node = request.cluster.devices_per_node
    split = family.tp * (1 if TARGETS[name].context_across_nodes else family.cp or 1)
    return split <= per_node


def _every_family(name: str, graph: OpGraph, request: PlanRequest) -> list:
    """The launcher's families on the whole graph, every world size dividing the devices (``pp = 1``:
    :func:`exporters._target.worlds`)."""
    from exporters.targets import TARGETS

    devices, per_node = request.cluster.devices, request.cluster.devices_per_node
    options = ConfigOptions(devices=devices, devices_per_node=min(per_node, devices))
    spaces = [enumerate_configs(op, options) for op in graph.ops]
    return TARGETS[name].pipeline_families(graph, spaces, devices=devices, devices_per_node=per_node, pp=1)


def _overlap_refusal(name: str, graph: OpGraph, request: PlanRequest, pins: Pins) -> tuple[str, str, list] | None:
    """``(clause, "tp_overlap", ["off"])`` when ``--fix tp_overlap=on`` is pinned and none of the launcher's
    families on these devices has ``tp > 1`` (the overlap hides tensor-parallel collectives: one device, or a
    model whose heads split no way); ``None`` otherwise."""
    if pins.tp_overlap != "on" or any((f.tp or 1) > 1 for f in _every_family(name, graph, request)):
        return None
    devices = request.cluster.devices
    return (f"{name} runs tp 1 only on this model at {devices} device{'s' if devices > 1 else ''}, and tp_overlap=on "
            "overlaps tensor-parallel communication, which tp 1 does not have"), "tp_overlap", ["off"]


def _pipeline_refusal(name: str, graph: OpGraph, request: PlanRequest, pins: Pins) -> tuple[str, str, list] | None:
    """``(clause, "pp", [1])`` when the launcher, which has families on one stage (its caller's check), has none
    on the pinned pipeline's stages, with the exporter's reason where it states one (a DeepSpeed model whose
    blocks are not one chain)."""
    from exporters.targets import TARGETS

    devices, per_node = request.cluster.devices, request.cluster.devices_per_node
    if devices % pins.pp:
        return None
    stage = devices // pins.pp
    spaces = [enumerate_configs(op, ConfigOptions(devices=stage, devices_per_node=min(per_node, stage))) for op in graph.ops]
    if TARGETS[name].pipeline_families(graph, spaces, devices=stage, devices_per_node=per_node, pp=pins.pp):
        return None
    why = _DEGREE_REFUSALS.get((name, "pp"), lambda graph, value: None)(graph, pins.pp)
    return f"{name} runs no pipeline on this model" + (f" ({why})" if why else ""), "pp", [1]


def pinned_refusal(graph: OpGraph, request: PlanRequest, options: PipelineOptions, pins: Pins,
                   launchers: Sequence[str]) -> str:
    """Why the searched ``launchers`` found no row under the user's pins, as one line ending with the
    pin to drop or change; ``""`` when nothing is pinned or the rules explain no launcher's empty
    search (the batch, the stage cuts or the device count may; :func:`fit_message` then gives the
    general advice). A launcher whose rules do not explain it is named as having found none either.

    ``graph``: the model at the global batch; ``options``: the search options narrowed to the pins
    (:func:`planner.launcher_options.pinned_options`)."""
    from exporters.targets import TARGETS

    if not pins.pinned:
        return ""
    across = _across_nodes(pins, request.cluster.devices_per_node, launchers)
    if across:
        return across
    clauses: list[str] = []
    unexplained: list[str] = []
    runs: dict[str, list] = {}
    for name in launchers:
        found = None if not TARGETS[name].restricts else (
            _settings_refusal(name, options, pins, request.cluster.devices) or _expert_refusal(name, graph, pins)
            or _overlap_refusal(name, graph, request, pins) or _degree_refusal(name, graph, request, pins))
        if found is None:
            unexplained.append(name)  # e.g. Mesh-TF, whose layouts name no dp x tp
            continue
        clause, key, values = found
        clauses.append(clause)
        runs.setdefault(key, [])
        runs[key] += [v for v in values if v not in runs[key]]
    if not clauses:
        return ""  # the rules explain no launcher's: the general advice
    clauses += [f"{_or(unexplained)} found no plan under these pins either"] if unexplained else []
    fixes = []
    for key, values in runs.items():
        if not key:
            fixes.append(f"--fix {','.join(f'{k}={v}' for k, v in pins.pinned.items())} leaves none: drop a pin")
            continue
        pinned = getattr(pins, key)
        fixes.append(f"--fix {key}={pinned} leaves none: drop it or use --fix {key}={_nearest(values, pinned)}")
    return "; ".join(clauses + fixes)


@dataclass(frozen=True)
class SearchStop:
    """Where the time limit stopped one search (``PipelineResult.unsearched_sizes``)."""

    who: str
    """Whose search: a launcher's name or "the headroom search"."""
    share_s: float
    """The search's share of the time limit (seconds)."""
    unsearched_sizes: tuple[int, ...]
    """Pipeline sizes it left not (fully) searched."""


_KEPT = "the points found are kept (pass a larger --time-limit or --pp to search them)"


def stop_note(stops: Sequence[SearchStop]) -> str:
    """One line for every search the time limit stopped (``""``: none did). A large model's plan runs one
    search per launcher, precision and offload (30 of them stopped on DeepSeek-V2-Lite at the default
    limit): how many stopped, whose, their shares of the limit and every pipeline size some left
    unsearched, largest first.

    Examples
    --------
    >>> stop_note([SearchStop("megatron", 12.0, (4, 2))])
    'megatron: search stopped at the time limit (12 s): pipeline sizes 4, 2 were not (fully) searched; the points found are kept (pass a larger --time-limit or --pp to search them)'
    >>> stop_note([SearchStop("megatron", 12.0, (4, 2)), SearchStop("deepspeed", 6.5, (2, 1)), SearchStop("megatron", 3.0, (8,))])
    '3 searches stopped at their share of the time limit (3-12 s; megatron 2, deepspeed 1): pipeline sizes 8, 4, 2, 1 were not (fully) searched in some; the points found are kept (pass a larger --time-limit or --pp to search them)'
    >>> stop_note([])
    ''
    """
    if not stops:
        return ""
    if len(stops) == 1:
        (stop,) = stops
        return (f"{stop.who}: search stopped at the time limit ({stop.share_s:g} s): pipeline sizes "
                f"{', '.join(map(str, stop.unsearched_sizes))} were not (fully) searched; {_KEPT}")
    shares = [stop.share_s for stop in stops]
    whose: dict[str, int] = {}
    for stop in stops:
        whose[stop.who] = whose.get(stop.who, 0) + 1
    sizes = sorted({size for stop in stops for size in stop.unsearched_sizes}, reverse=True)
    span = f"{min(shares):.3g}-{max(shares):.3g} s" if min(shares) != max(shares) else f"{shares[0]:.3g} s"
    return (f"{len(stops)} searches stopped at their share of the time limit ({span}; "
            f"{', '.join(f'{who} {count}' for who, count in whose.items())}): pipeline sizes "
            f"{', '.join(map(str, sizes))} were not (fully) searched in some; {_KEPT}")


def measured_notes(rows: Sequence[Any], batch_dim: str) -> list[str]:
    """Under ``--cost measured``: how many rows were priced partly by the roofline, because the
    profile holds no timing for their per-device shards (a micro-batch size or stage it did not see)."""
    partly = [row for row in rows if row.cache.model(row.point.devices_per_stage, row.point.micro_batch_samples,
                                                     row.point.zero_stage, row.point.recompute).fallback_configs]  # fmt: skip
    if not partly:
        return []
    first = partly[0].point
    return [
        f"--cost measured: {len(partly)} of {len(rows)} rows are priced partly by the roofline (the profile has no "
        f"timings for their op shards); profile their micro-batches too, e.g. `planner profile MODEL --dim "
        f"{batch_dim}={first.micro_batch_samples} -n {first.devices_per_stage}` for row "
        f"{rows.index(partly[0]) + 1}, or pin a profiled micro-batch with --fix mb=N"
    ]
