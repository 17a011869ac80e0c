"""What a launch target is (:class:`Target`) and the rules the launchers share.

A launcher is one package (``exporters/megatron/``, ``exporters/deepspeed/``, ``exporters/mesh_tf/``,
``exporters/dtensor/``) whose ``TARGET`` is a :class:`Target`; :mod:`exporters.targets` assembles
them into the registry. This module sits below both (the packages build their entry from it, the
registry imports the packages), so no package imports the registry. A target is:

* ``export``: ``PlanInput -> dict``, an exact launch plan or :class:`UnsupportedExport`;
* ``families``: the configuration families it runs (one boolean mask per op each, e.g. one per
  ``dp x tp`` with sequence parallelism on or off), on one stage of a ``pp``-stage pipeline; a
  strategy is runnable when its choice lies in one family's masks (``None``: every strategy);
* ``allows`` / ``pipeline_allows``: the exporter's refusals that do not depend on the per-op splits
  (ZeRO stage, recomputation, expert parallelism, schedule, whole nodes);
* ``stage_rule`` (targets that pipeline): the refusals of a ``pp > 1`` plan that depend on its stage
  cut and micro-batch (:meth:`Target.runs_pipeline`);
* ``execution``: the kernels its launcher runs by default, as data (``(engine, attention)``, priced
  by :mod:`objectives.execution`; exporters do not import the cost model).

The shared rules (:func:`fills_nodes`, :func:`batch_splits`, :func:`experts_fit`,
:func:`pipeline_launches`) and :func:`lazy` (an exporter loaded on its first call, so reading the
registry stays cheap) are what several packages' rules are built from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from planner.core.errors import InputError
from planner.core.settings import OFFLOAD_MIN_ZERO, ZERO_SYNC_STAGES, ZeroSync

if TYPE_CHECKING:  # the registry is read by the CLI's --help: the exporters load on first use
    from pathlib import Path

    import numpy as np

    from exporters.generic import PlanInput
    from planner.core.cluster import Cluster
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph
    from planner.core.settings import Zero3Gather
    from planner.core.settings import TrainingSettings

__all__ = [
    "Family",
    "Target",
    "Runnable",
    "lazy",
    "lazy_attributes",
    "divisors",
    "worlds",
    "CP_MIN_TOKENS",
    "context_degrees",
    "dp_cp_tp_families",
    "fills_nodes",
    "batch_splits",
    "experts_fit",
    "pipeline_launches",
]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Family:
    """One family of per-op configurations a target runs (one launch configuration)."""

    label: str
    """In the target's vocabulary, e.g. ``"dp=4 x tp=2 sp"`` or ``"b:4;m:2 batch:b;heads:m"``."""
    tp: int | None
    """Tensor-parallel degree (``None`` where the target's rules do not depend on it)."""
    masks: tuple[np.ndarray, ...]
    """Per op, a boolean array over its configurations."""
    dp: int | None = None
    """Data-parallel degree (``None`` where the target's rules do not depend on it)."""
    cp: int = 1
    """Context-parallel degree: the sequence split over ranks that hold whole weights, as
    data-parallel replicas do (Megatron-LM's ``--context-parallel-size``)."""
    sp: bool = False
    """Sequence parallelism: norms and residual ops split along the sequence (``--sequence-parallel``)."""


class FamiliesFn(Protocol):
    """``families(graph, spaces, *, devices, devices_per_node, pp, degrees=None)``: the families a
    target runs on one stage of ``devices`` devices; with ``degrees``, only those of that
    ``(dp, tp)`` as a strategy's splits read them (:func:`exporters._common.launcher_degrees`: the
    layers' non-batch split, ``cp x tp`` under context parallelism; a target whose families have no
    such degrees, Mesh-TF, ignores it)."""

    def __call__(
        self, graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, devices_per_node: int | None, pp: int,
        degrees: tuple[int, int] | None = None,
    ) -> list[Family]: ...


AllowsFn = Callable[["Family", "TrainingSettings", "Cluster", "OpGraph"], bool]
"""``allows(family, settings, cluster, graph)``: the exporter accepts these settings for a strategy of
``family`` on a plan without pipeline stages (the refusals that do not depend on the per-op splits)."""

SettingsAllowsFn = Callable[["Family", "TrainingSettings", "OpGraph"], bool]
"""``settings_allows(family, settings, graph)``: the part of :data:`AllowsFn` that holds on every stage of a pipeline
too: the settings rules at the family's degrees (ZeRO stage, recomputation, expert parallelism, HSDP), without the
cluster's whole nodes and the batch split, which a stage's family does not answer alone."""

RuleFn = Callable[["OpGraph", "Sequence[ConfigSpace]", "Cluster", "TrainingSettings"], Callable[[Sequence[int]], bool]]
"""``rule(graph, spaces, cluster, settings)`` -> ``runs(choice)``: see :attr:`Target.rule`."""

PipelineAllowsFn = Callable[..., bool]
"""``pipeline_allows(pp=, zero_stage=, recompute=, schedule=, tp=)`` (keywords)."""

StageRuleFn = Callable[["Family", "PlanInput"], bool]
"""``stage_rule(family, plan_input)``: the exporter accepts a ``pp > 1`` plan of ``family`` with this
stage cut, micro-batch and cluster (see :attr:`Target.stage_rule`)."""


OffloadRuleFn = Callable[..., bool]
"""``offload_rule(offload, *, zero_stage, pp, recompute)``: whether the launcher runs CPU offload mode
``offload`` with this ZeRO stage, pipeline size and recomputation (Megatron-LM: the optimizer offload
on the distributed optimizer, ZeRO-1; activation offload without pipeline or recomputation). The
conditions are separable: each holds on one setting whatever the others are, which
``planner.launchable`` relies on to narrow each searched setting alone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Runnable:
    """The strategies a target runs on one configuration space: a union of mask families.

    The masks of a family are flattened into one array (``offsets`` give each op's start), so
    testing a choice is one fancy index per family.
    """

    everything: bool
    """The target runs every strategy (the generic plan)."""
    flat: tuple[np.ndarray, ...] = ()
    """Per family allowed by the settings, its masks concatenated over the ops."""
    offsets: np.ndarray | None = None
    """Start of each op's rows in a flat mask (length ``ops``)."""
    rule: Callable[[Sequence[int]], bool] | None = None
    """A target whose runnable set is not a few families (Mesh-TF: any consistent naming) tests a
    choice with this instead (built once per space, like the masks)."""

    def __contains__(self, choice: Sequence[int]) -> bool:
        if self.everything:
            return True
        if self.rule is not None:
            return self.rule(choice)
        if not self.flat or self.offsets is None:
            return False
        import numpy as np

        index = self.offsets + np.asarray(choice, dtype=np.int64)
        return any(bool(flat[index].all()) for flat in self.flat)


def plan_data_parallel(plan_input: PlanInput) -> int | None:
    """A plan's data-parallel degree as the launchers read it (``exporters._common.launcher_degrees``' ``dp``),
    where its ZeRO 0-2 synchronisation is asked about (:meth:`Target.unpriced_sync`); ``None`` elsewhere."""
    if plan_input.settings.zero_stage not in ZERO_SYNC_STAGES:
        return None
    from exporters._common import dominant_factor

    return dominant_factor(plan_input.graph, plan_input.spaces, plan_input.strategy.choice, batch=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One launch target: its exporter, the families it runs and the settings it accepts."""

    name: str
    """The CLI's name (``--target``, ``--export``)."""
    help: str
    """One line for ``--help`` and the docs."""
    export: Callable[[PlanInput], dict[str, Any]]
    """The exporter: an exact launch plan, or :class:`~planner.core.errors.UnsupportedExport`."""
    families: FamiliesFn | None = None
    """The configuration families it runs on a stage (``pp`` stages; ``None``: every strategy)."""
    allows: AllowsFn | None = None
    """Settings rules for plans without pipeline stages (``None``: every setting)."""
    settings_allows: SettingsAllowsFn | None = None
    """The part of :attr:`allows` a pipeline's stage answers too (:data:`SettingsAllowsFn`; ``None``: every setting):
    each launcher's ``allows`` calls it, and its searches read it before pricing (:meth:`runs_family`,
    ``TargetRules.settings_allows``, ``planner.search.target_masks``), so a plan its exporter refuses for its settings at a family's degrees
    (torchtitan's ``tp > 1`` or ZeRO-0 at ``ep > 1``) is never priced, and never prunes one it runs (issue 22)."""
    pipeline_allows: PipelineAllowsFn | None = None
    """Settings rules of its pipelines (``None``: every setting)."""
    rule: RuleFn | None = None
    """When the families are only the ones worth searching and the exporter runs more (Mesh-TF
    lays out any consistent naming, the families only its default layouts): the exact test of a
    choice, built once per space (``None``: membership in a family allowed by ``allows``)."""
    stage_rule: StageRuleFn | None = None
    """The exporter's refusals of a ``pp > 1`` plan that depend on more than its settings and splits:
    the stage cut (Megatron's model chunks dividing every stage's layers), the micro-batch per rank,
    whole nodes for ``dp x tp x pp`` processes, experts (``None``: no pipeline is run)."""
    execution: tuple[str, str] | None = None
    """``(engine, attention)``: the kernels its launcher runs, e.g. ``("fused", "flash")`` (the
    engines and attention implementations of :mod:`objectives.execution`, which the roof prices;
    ``None``: as the generic plan, fused kernels and flash attention)."""
    attention_kernels: tuple[str, ...] | None = None
    """The attention implementations its export can tell the launcher to run (``--attention`` names one:
    Megatron-LM's ``--attention-backend``, :data:`exporters.megatron.export.ATTENTION_BACKENDS`); a plan
    priced with another is not its row (:meth:`runs_settings`), and ``--attention`` naming another refuses
    the launcher before its search. ``None``: any."""
    zero3_gather: Zero3Gather | None = None
    """How its launcher gathers ZeRO-3's parameters (a ``planner.core.settings.Zero3Gather``: per
    sub-module under DeepSpeed's bounds, priced by ``objectives.memory.deepspeed_gathered_peak``);
    ``None``: per wrapped block, the next prefetched (FSDP2), as the generic plan is priced. The
    launcher's searches hand it to the pricing per plan (``TargetRules.zero3_gather``), sharing the cost
    cache of the launchers of its execution model; a ZeRO-3 plan priced under another rule is not its
    to run as priced (:func:`exporters.targets.runnable_plan_targets`)."""
    sequence_shard_saved: bool = False
    """Its launcher's linear layers keep their sequence-parallel input shard for backward and gather it
    again there (``TrainingSettings.sequence_shard_saved``: Megatron-Core, Transformer Engine). The
    launcher's searches hand it to the pricing per plan (``TargetRules.sequence_shard_saved``), sharing the
    cost cache of the launchers of its execution model (DeepSpeed keeps the gathered input); a plan whose
    memory holds the credit is not a launcher's without the rule (:func:`exporters.targets.runnable_plan_targets`),
    and ``planner estimate``'s rows that name the launcher read it too (``planner.calibrate.row_settings``)."""
    fused_swiglu: bool = False
    """Its launcher's gated MLPs keep fc1's output only (``TrainingSettings.fused_swiglu``: Megatron-Core's
    ``SwiGLUFunction``). Handed to the pricing per plan as :attr:`sequence_shard_saved` is
    (``TargetRules.fused_swiglu``, ``objectives.gated_credit``: DeepSpeed shares Megatron-LM's cache and
    its SwiGLU is plain PyTorch); ``planner estimate``'s rows that name the launcher build it into the
    tables (``planner.calibrate.row_settings``)."""
    grad_accumulator: Callable[..., float] | None = None
    """``grad_accumulator(*, zero_stage, pp, offload)``: bytes per parameter of the gradient accumulator its launcher's bf16
    optimizer keeps beside the gradients of every parameter a rank holds (DeepSpeed's ``BF16_Optimizer``:
    :func:`exporters.deepspeed.bf16_optimizer.grad_accumulator`); handed to the pricing per plan (``TargetRules.grad_accumulator``)
    and read by ``planner estimate``'s rows that name the launcher (``planner.calibrate.row_settings``); ``None``: none."""
    pipeline_buffers: str = "none"
    """What its pipeline runtime holds at the stage boundaries beyond the layers' tensors
    (``TrainingSettings.pipeline_buffers``, ``objectives.pipeline_buffers``): ``torch`` (``torch.distributed.pipelining``),
    ``deepspeed`` (``PipelineEngine``) or ``none`` (Megatron-LM frees its sent outputs); handed to the pricing per plan
    (``TargetRules.pipeline_buffers``) and read by ``planner estimate``'s rows that name the launcher."""
    zero_sync: Callable[..., Any] | None = None
    """``zero_sync(*, zero_stage, precision, offload)``: how its launcher synchronises the gradients at ZeRO 0-2
    (a ``planner.core.settings.ZeroSync``: bucket, collective, what overlaps; DeepSpeed's:
    :func:`exporters.deepspeed.zero_sync.zero_sync`), handed to the pricing per plan (``TargetRules.zero_sync``);
    ``None``: as Megatron-LM's distributed optimizer runs it (the pricing's own)."""
    fp8: str | None = None
    """The FP8 recipe its launcher runs linear layers with (``TrainingSettings.fp8``: ``delayed`` for
    Transformer Engine, ``rowwise`` for torchao float8); ``None``: it trains no FP8, and runs no plan
    priced with it."""
    fp8_param_gather: bool = False
    """Its launcher keeps FP8 linear weights in FP8 and ZeRO all-gathers them so, 1 byte per element
    (``TrainingSettings.fp8_param_gather``, :mod:`objectives.precision`): Megatron-LM's ``--fp8-param-gather``
    with the distributed optimizer or Megatron-FSDP. Its FP8 rows' cost caches are built with it (the FP8
    recipe is one launcher's), and its exporter writes the flag on every row priced so
    (``TrainingSettings.gathers_fp8``). torchtitan 0.3.0 has no such option (``Float8LinearConverter``)."""
    recompute: tuple[str, ...] = ("none", "selective", "full")
    """The activation recomputation modes its launcher runs (``TrainingSettings.recompute``), the ones
    searched for its plans: ``selective`` is Megatron-LM's attention core, ``op`` torchtitan's
    op-level policy (every other linear layer's output and the attention kernel's saved)."""
    offload: tuple[str, ...] = ("none",)
    """The CPU offload modes its launcher runs (``TrainingSettings.offload``, :mod:`objectives.offload`),
    searched for its plans when pinned or when nothing fits without: ``optimizer`` is DeepSpeed's
    ``offload_optimizer`` and Megatron-LM's ``--optimizer-cpu-offload``, ``activations`` Megatron-LM's
    ``--cpu-offloading-num-layers``, ``parameters`` (ZeRO-3 only) FSDP2's ``CPUOffloadPolicy`` and DeepSpeed's
    ``offload_param``."""
    hsdp: tuple[int, ...] = ()
    """The ZeRO stages its launcher runs hybrid-sharded (``TrainingSettings.dp_shard``: the states
    sharded over a group of the data-parallel ranks and replicated over the rest), searched for its
    plans where the data-parallel group spans nodes: FSDP2's ``fully_shard`` on a 2-D mesh is ZeRO-3
    (torchtitan, DTensor), Megatron-LM's ``--num-distributed-optimizer-instances`` ZeRO-1 (searched
    only under ``--fix hsdp``); ``()``: none (the generic plan runs every stage)."""
    hpz: tuple[int, ...] = ()
    """The ZeRO stages its launcher runs with ZeRO++'s hierarchical partitioning (``TrainingSettings.hpz_partition``:
    every state sharded over all the data-parallel ranks, plus a secondary parameter copy sharded within a group
    that the later gathers read), its analogue of :attr:`hsdp`, searched and pinned as HSDP is (a node's devices;
    ``--fix hsdp=N``): DeepSpeed's ``zero_hpz_partition_size`` at ZeRO-3; ``()``: none."""
    offload_rule: OffloadRuleFn | None = None
    """The settings an offload mode needs (``None``: any): see :data:`OffloadRuleFn`."""
    context_zero: tuple[int, ...] = (0, 1, 2, 3)
    """The ZeRO stages its launcher runs with context parallelism (``cp > 1``); torchtitan's FSDP2 shards
    the states over ``dp_shard x cp``, so ZeRO-3 only (its ``allows`` holds the same rule)."""
    autocast_zero: tuple[int, ...] = (0, 1, 2, 3)
    """The ZeRO stages at which its launcher runs eager ``bf16-mixed`` under ``torch.autocast`` (fp32 parameters, a cast
    kernel per parameter a product reads, norms and softmax in fp32); at the others it runs bf16 modules whose
    parameters an FSDP2 ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)`` casts, with no autocast
    (``TrainingSettings.autocast`` off, :meth:`priced_autocast`); Megatron-LM and DeepSpeed: none (bf16 modules:
    megatron-core 0.16.1's ``Float16Module`` wraps ``module.bfloat16()``, ``transformer/module.py``; DeepSpeed 0.19.8's
    ``_configure_distributed_model`` casts the parameters to bf16, ``runtime/engine.py``, its ``torch_autocast`` section
    off by default, ``runtime/constants.py``). torchtitan 0.3.0: none (``apply_fsdp_to_decoder``
    installs the policy at every shard degree, "with shard_degree=1 it is a no-op for the all-gather but still installs
    the MixedPrecisionPolicy", ``models/llama3/parallelize.py``, and its train loop enters no autocast); the DTensor
    plan: ZeRO 0-2 (``planner.run`` autocasts unless the plan has an ``fsdp`` section, written at ZeRO-3). Read only
    under the eager engine in ``bf16-mixed``: the fused engine prices no autocast."""
    context_across_nodes: bool = False
    """Its launcher runs context parallelism across nodes, ``cp`` outside ``tp`` in its rank order (Megatron-Core's
    ``tp-cp-ep-dp-pp``, torchtitan's mesh ``pp, dp_replicate, dp_shard, cp, tp``): the search then lets a stage's
    sequence split cross nodes (``planner.launcher_options.context_split``), tensor parallelism staying inside one."""
    expert_parallel: bool = True
    """Its launcher splits an MoE model's experts over ranks (``TrainingSettings.expert_parallel`` > 1);
    ``False``: its plans keep every expert on each rank (no expert axis in its mesh), so no plan it runs
    is searched at ``ep > 1``."""
    tp_comm_overlap: bool = False
    """Its launcher overlaps tensor-parallel communication with the GEMMs (``TrainingSettings.tp_comm_overlap``,
    :mod:`objectives.tp_overlap`: Megatron-LM's ``--tp-comm-overlap``, torchtitan's async TP), with sequence
    parallelism only."""
    tp_overlap_method: str = "userbuffers"
    """How it does (``TrainingSettings.tp_overlap_method``): ``userbuffers`` (Megatron-LM's Transformer Engine) or
    ``micro-pipeline`` (torchtitan's ``--compile.enable_async_tensor_parallel``, inductor's pass over compiled
    blocks: under the fused engine only); a plan priced one way is not the other launcher's row."""
    p2p_overlap: bool = False
    """Its launcher runs the interleaved schedule's steady-state sends and receives unwaited beside the other
    direction's chunk pass by default (``TrainingSettings.p2p_overlap``, :meth:`priced_p2p_overlap`): Megatron-LM,
    whose ``--no-overlap-p2p-communication`` is ``store_false`` on ``overlap_p2p_comm`` (on unless written) and whose
    ``validate_args`` keeps it only with virtual pipeline stages (``megatron/training/arguments.py``); megatron-core
    0.16.1's non-interleaved schedule refuses it (``pipeline_parallel/schedules.py``). A plan with model chunks
    priced with it is not the row of a launcher without it (:meth:`runs_p2p`); its exporter writes the flag that turns
    it off where the plan was priced waited. ``False``: transfers waited (DeepSpeed 0.19.8's ``runtime/pipe/p2p.py``
    sends and receives blocking, ``async_op`` refused; it runs no interleaved schedule)."""
    fsdp_reshard: bool = False
    """Its launcher sets FSDP2's ``reshard_after_forward`` per ``fully_shard`` unit as the plan says
    (``TrainingSettings.reshard_after_forward``: torchtitan's ``parallelism.fsdp_reshard_after_forward``, the
    DTensor plan's ``fsdp.reshard_after_forward``); a plan priced with a policy other than ``default`` is
    not the row of a launcher without it (:meth:`runs_settings`)."""
    cuda_graphs: bool = False
    """Its launcher replays each micro-batch's forward and backward as one captured CUDA graph where it can
    (``TrainingSettings.cuda_graphs``: torchtitan 0.3.0 by default without pipeline stages or expert parallelism,
    ``planner.launcher_options.launcher_cuda_graphs``); a plan priced so is not the row of a launcher without it
    (:meth:`runs_settings`)."""
    cuda_graph_scope: str | None = None
    """What its launcher captures when asked to (``TrainingSettings.cuda_graph_scope``; :meth:`captures`): ``step``,
    each micro-batch's whole forward and backward (torchtitan), ``layers``, each transformer layer's (Megatron-LM's
    ``--cuda-graph-impl transformer_engine``, off by default: ``--fix cuda_graphs=on``); ``None``: no CUDA graphs."""
    write: Callable[[dict[str, Any], Path], bytes] | None = None
    """``write(document, output)``: the bytes of the file an exported document is written as (an export
    format that writes a model, ``onnx``); ``None``: the document's JSON text."""

    @property
    def restricts(self) -> bool:
        """Whether the target runs only some strategies (``False`` for the generic plan)."""
        return self.families is not None

    def runnable(self, graph: OpGraph, spaces: Sequence[ConfigSpace], cluster: Cluster, settings: TrainingSettings) -> Runnable:
        """The strategies it runs on ``spaces`` (no pipeline stages), to test choices against.

        Built once per configuration space: the families, then the settings rules per family.
        """
        if self.families is None:
            return Runnable(everything=True)
        # ZeRO-1/2 synchronisation is asked of each family's data-parallel degree below (unpriced_sync): one rank
        # moves nothing, so a plan priced under another launcher's rule may still be this one's there
        if not self.runs_settings(settings, data_parallel=1):
            return Runnable(everything=False)
        if self.rule is not None:
            return Runnable(everything=False, rule=self.rule(graph, spaces, cluster, settings))
        import numpy as np

        found = self.families(graph, spaces, devices=cluster.devices, devices_per_node=cluster.devices_per_node, pp=1)
        kept = [f for f in found if (self.allows is None or self.allows(f, settings, cluster, graph))
                and self.runs_tp_overlap(f, settings) and not self.unpriced_sync(settings, f.dp)]
        sizes = np.array([space.size for space in spaces], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else np.zeros(0, np.int64)
        flat = tuple(np.concatenate([np.asarray(m, dtype=bool) for m in f.masks]) if f.masks else np.ones(0, bool) for f in kept)
        return Runnable(everything=False, flat=flat, offsets=offsets)

    def pipeline_families(
        self, graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, devices_per_node: int, pp: int,
        degrees: tuple[int, int] | None = None,
    ) -> list[Family]:
        """The families it runs on each stage of a ``pp``-stage pipeline (one stage's ``spaces``
        on ``devices`` devices; with ``degrees``, only those of that ``(dp, tp)``); empty when it
        runs no such pipeline.

        Raises
        ------
        InputError
            For the generic plan, which runs every strategy (nothing to restrict).
        """
        if self.families is None:
            raise InputError(f"target '{self.name}' runs every strategy; restrict with a launcher (exporters.targets.FRAMEWORK_TARGETS)")
        return self.families(graph, spaces, devices=devices, devices_per_node=devices_per_node, pp=pp, degrees=degrees)

    def runs(self, plan_input: PlanInput, families: Sequence[Family]) -> bool:
        """Whether its exporter accepts ``plan_input`` (a plan with or without pipeline stages),
        given the families of its stage (all of them, or those of the strategy's degrees): mask
        membership and the settings rules, and with ``pp > 1`` :meth:`runs_pipeline`. A target with
        a :attr:`rule` is tested by the rule (see :func:`runnable_plan_targets`)."""
        if self.families is None:
            return True
        if not self.runs_settings(plan_input.settings, plan_data_parallel(plan_input)):
            return False
        if plan_input.pipeline is not None and plan_input.pipeline.pp > 1:
            return self.runs_pipeline(plan_input, families)
        graph, settings, cluster = plan_input.graph, plan_input.settings, plan_input.cluster
        choice = plan_input.strategy.choice
        return any(
            (self.allows is None or self.allows(family, settings, cluster, graph))
            and self.runs_tp_overlap(family, settings)
            and plan_input.samples_per_pass % (family.dp or 1) == 0  # the exporters split the pass's samples
            and all(mask[row] for mask, row in zip(family.masks, choice))
            for family in families
        )

    def runs_pipeline(self, plan_input: PlanInput, families: Sequence[Family]) -> bool:
        """Whether its exporter accepts ``plan_input``, a plan with ``pp > 1`` stages whose stage
        runs one of ``families`` (:meth:`pipeline_families` of its stage): the settings rules, mask
        membership and :attr:`stage_rule`; no export is attempted."""
        pipeline = plan_input.pipeline
        if pipeline is None or self.stage_rule is None:
            return self.families is None
        choice = plan_input.strategy.choice
        settings = plan_input.settings
        if not self.runs_offload(settings.offload, zero_stage=settings.zero_stage, pp=pipeline.pp, recompute=settings.recompute):
            return False
        for family in families:
            allowed = self.allows_pipeline(
                pp=pipeline.pp, zero_stage=plan_input.settings.zero_stage, recompute=plan_input.settings.recompute,
                schedule=pipeline.schedule, tp=family.tp,
            )
            allowed = allowed and self.runs_tp_overlap(family, settings) and self.runs_p2p(settings, chunks=pipeline.chunks)
            allowed = allowed and (self.settings_allows is None or self.settings_allows(family, settings, plan_input.graph))
            if allowed and all(mask[row] for mask, row in zip(family.masks, choice)) and self.stage_rule(family, plan_input):
                return True
        return False

    def runs_family(self, family: Family, settings: TrainingSettings, graph: OpGraph) -> bool:
        """Whether its launcher runs ``family``'s plans under ``settings`` on any stage: :attr:`settings_allows` and
        :meth:`runs_tp_overlap`, what its searches ask of each family and ``(ZeRO stage, recompute)`` pair before
        pricing (``TargetRules.settings_allows``)."""
        return (self.settings_allows is None or self.settings_allows(family, settings, graph)) and self.runs_tp_overlap(
            family, settings)

    def runs_tp_overlap(self, family: Family, settings: TrainingSettings) -> bool:
        """Whether its launcher runs ``family`` with the settings' tensor-parallel communication overlap:
        always without it; with it, only a launcher that overlaps (:attr:`tp_comm_overlap`) and only a
        family with ``tp > 1`` and sequence parallelism (Megatron-LM's ``validate_args``: "Tensor parallel
        communication/GEMM overlap can happen only when sequence parallelism is enabled"); context
        parallelism may sit beside it. A ``tp = 1`` family has no tensor-parallel communication to
        overlap, so the pin leaves it out rather than list a row whose export lacks the flag. The plan's method
        must be the launcher's (:attr:`tp_overlap_method`), and the micro-pipelined one runs only in compiled
        blocks (the fused engine: torchtitan's ``--compile.enable``, which its async TP requires)."""
        if not settings.tp_comm_overlap or self.families is None:
            return True
        compiled = self.tp_overlap_method != "micro-pipeline" or (settings.engine or "fused") == "fused"
        return (self.tp_comm_overlap and settings.tp_overlap_method == self.tp_overlap_method and compiled
                and (family.tp or 1) > 1 and family.sp)

    def runs_p2p(self, settings: TrainingSettings, *, chunks: int) -> bool:
        """Whether its launcher runs a pipeline of ``chunks`` model chunks per rank with the settings' stage-to-stage
        transfers as priced: always without chunks (no transfer is overlapped) or priced waited (a launcher that
        overlaps by default is told not to: Megatron-LM's ``--no-overlap-p2p-communication``); overlapped, only a launcher
        that overlaps (:attr:`p2p_overlap`).

        >>> from exporters.targets import TARGETS
        >>> from planner.core.settings import TrainingSettings
        >>> [n for n in ("megatron", "torchtitan") if TARGETS[n].runs_p2p(TrainingSettings(p2p_overlap=True), chunks=2)]
        ['megatron']
        """
        return chunks <= 1 or not settings.p2p_overlap or self.families is None or self.p2p_overlap

    def priced_p2p_overlap(self, settings: TrainingSettings, *, pp: int, chunks: int) -> bool | None:
        """``TrainingSettings.p2p_overlap`` as its launcher runs a plan of ``pp`` stages and ``chunks`` model chunks per
        rank: the settings' own where given (``--fix p2p_overlap``), else its default (:attr:`p2p_overlap`) where the
        plan interleaves (``pp > 1``, ``chunks > 1``: Megatron-LM drops ``overlap_p2p_comm`` without virtual stages);
        ``None`` (unresolved, priced waited) elsewhere and for the generic plan.

        >>> from exporters.targets import TARGETS
        >>> from planner.core.settings import TrainingSettings
        >>> megatron = TARGETS["megatron"]
        >>> [megatron.priced_p2p_overlap(TrainingSettings(), pp=4, chunks=c) for c in (1, 2)]
        [None, True]
        >>> megatron.priced_p2p_overlap(TrainingSettings(p2p_overlap=False), pp=4, chunks=2)
        False
        """
        if settings.p2p_overlap is not None or self.families is None:
            return settings.p2p_overlap
        return True if self.p2p_overlap and pp > 1 and chunks > 1 else None

    def runs_precision(self, settings: TrainingSettings) -> bool:
        """Whether its launcher trains in the settings' precision: any without FP8, its own recipe with it.

        >>> from exporters.targets import TARGETS
        >>> from planner.core.settings import TrainingSettings
        >>> [n for n in ("megatron", "deepspeed", "torchtitan") if TARGETS[n].runs_precision(TrainingSettings(fp8="delayed"))]
        ['megatron']
        """
        return settings.fp8 is None or self.families is None or settings.fp8 == self.fp8

    def runs_settings(self, settings: TrainingSettings, data_parallel: int | None = None) -> bool:
        """Whether its launcher runs the settings' attention kernel (:attr:`attention_kernels`), precision (:meth:`runs_precision`), hybrid sharding
        (:attr:`hsdp`), expert parallelism (:attr:`expert_parallel`), recomputation mode and CPU offload
        mode (:meth:`runs_offload`), holds no gradient accumulator the plan's memory lacks
        (:meth:`unpriced_accumulator`), captures CUDA graphs as priced (:attr:`cuda_graphs`), casts as priced (:meth:`runs_autocast`) and synchronises ZeRO-1/2 as priced (:meth:`unpriced_sync`, of a plan on
        ``data_parallel`` ranks; ``None``: not known), on a plan without pipeline stages."""
        # ZeRO-0 shards nothing: a cache priced for HSDP builds its stage models at ZeRO-0 (the stages re-priced)
        hybrid = settings.dp_shard is None or self.families is None or (
            bool(self.hsdp) and (settings.zero_stage == 0 or settings.zero_stage in self.hsdp))
        hybrid = hybrid and (settings.hpz_partition is None or self.families is None or (
            bool(self.hpz) and (settings.zero_stage == 0 or settings.zero_stage in self.hpz)))
        experts = self.expert_parallel or settings.expert_parallel <= 1
        # a non-default reshard policy is FSDP2's, at ZeRO-3 (a cache's ZeRO-0 stage models are re-priced at 3)
        reshard = settings.reshard_after_forward == "default" or self.families is None or (
            self.fsdp_reshard and settings.zero_stage in (0, 3))
        graphs = self.captures(settings) and self.runs_autocast(settings)  # captured and cast as priced
        return hybrid and experts and reshard and graphs and self.runs_attention(settings.attention) and self.runs_precision(settings) and (self.families is None or settings.recompute in self.recompute) and (
            settings.offload == "none" or self.runs_offload(settings.offload, zero_stage=settings.zero_stage, pp=1,
                                                            recompute=settings.recompute)) and (
            self.families is None or not (self.unpriced_accumulator(settings, 1) or self.unpriced_sync(settings, data_parallel)))

    def runs_attention(self, attention: str | None) -> bool:
        """Whether its export can tell its launcher to run the attention kernel ``attention`` (:attr:`attention_kernels`;
        ``None``: the launcher's own)."""
        return self.attention_kernels is None or attention is None or attention in self.attention_kernels

    def unpriced_sync(self, settings: TrainingSettings, data_parallel: int | None = None) -> bool:
        """Whether its launcher synchronises the settings' ZeRO 0-2 gradients otherwise than the plan's time was priced
        (:attr:`zero_sync` against ``TrainingSettings.zero_sync``; ``None`` on both sides: Megatron-LM's): a ZeRO 0-2
        plan one launcher's search priced is not another's row when their rules differ (DeepSpeed's gather after
        the step against Megatron-LM's beside the forward; DeepSpeed's ZeRO-0 all-reduce after the backward against
        the others' beside it). A plan on one data-parallel rank (``data_parallel``, as
        the launchers read it) priced with no rule has no sharded-optimizer traffic to price otherwise (the pricing
        records no rule where it moved nothing: ``objectives.pipeline_price.price_plan``)."""
        if settings.zero_stage not in ZERO_SYNC_STAGES or (data_parallel == 1 and settings.zero_sync is None):
            return False
        return self.sync_rule(settings) != settings.zero_sync

    def sync_rule(self, settings: TrainingSettings) -> ZeroSync | None:
        """How its launcher synchronises the gradients of ``settings`` (:attr:`zero_sync` at their ZeRO stage, precision
        and offload; ``None``: no rule of its own, or ZeRO-3, whose gathers follow the wrapped blocks)."""
        if self.zero_sync is None or settings.zero_stage not in ZERO_SYNC_STAGES:
            return None
        return self.zero_sync(zero_stage=settings.zero_stage, precision=settings.precision, offload=settings.offload)

    def priced_settings(self, settings: TrainingSettings, *, pp: int = 1, cuda_graphs: bool | None = None,
                        chunks: int = 1) -> TrainingSettings:
        """``settings`` as its launcher's search prices a plan of ``pp`` stages and ``chunks`` model chunks per rank: with
        its ZeRO 0-2 synchronisation rule
        (:meth:`sync_rule`) and its CUDA-graph replay (:meth:`replays_graphs`; ``cuda_graphs``: ``--fix cuda_graphs``
        pinned, ``None``: as the launcher runs it) and its autocast at the settings' ZeRO stage (:meth:`priced_autocast`:
        torchtitan's eager bf16 modules under FSDP2's policy) and its interleaved transfers (:meth:`priced_p2p_overlap`:
        Megatron-LM's overlapped), unchanged where none applies. The one place a launcher's priced
        settings are built for a plan outside its search (``planner estimate``, ``pipeline_search(target=...)``, the
        research search's target filter), so they price its rows as the launchable search does."""
        rule = self.sync_rule(settings)
        autocast = self.priced_autocast(settings)
        graphs = self.replays_graphs(settings, pp=pp) if cuda_graphs is None else cuda_graphs
        graphs = graphs or (cuda_graphs is None and settings.cuda_graphs)  # a setting given with the plan stays
        scope = self.cuda_graph_scope if graphs and self.cuda_graph_scope is not None else settings.cuda_graph_scope
        p2p = self.priced_p2p_overlap(settings, pp=pp, chunks=chunks)
        changes = {**({} if rule is None else {"zero_sync": rule}), **({} if autocast == settings.autocast else {"autocast": autocast}),
                   **({} if p2p == settings.p2p_overlap else {"p2p_overlap": p2p}),
                   **({} if graphs == settings.cuda_graphs else {"cuda_graphs": graphs}),
                   **({} if scope == settings.cuda_graph_scope else {"cuda_graph_scope": scope})}  # what it captures
        return dataclasses.replace(settings, **changes) if changes else settings

    def priced_autocast(self, settings: TrainingSettings, zero_stage: int | None = None) -> bool:
        """``TrainingSettings.autocast`` as its launcher runs ``settings``' plans at ``zero_stage`` (``None``: theirs):
        under the eager engine in ``bf16-mixed``, whether that stage is one of :attr:`autocast_zero`; elsewhere, and for
        the generic plan (no launcher's rules), the settings' own.

        >>> from exporters.targets import TARGETS
        >>> from planner.core.settings import TrainingSettings
        >>> eager = TrainingSettings(engine="eager", attention="flash", zero_stage=3)
        >>> [TARGETS[n].priced_autocast(eager, z) for n in ("dtensor", "torchtitan") for z in (0, 3)]
        [True, False, False, False]
        >>> TARGETS["torchtitan"].priced_autocast(TrainingSettings(engine="fused", attention="flex"))
        True
        """
        if self.families is None or settings.engine != "eager" or settings.precision != "bf16-mixed":
            return settings.autocast
        return (settings.zero_stage if zero_stage is None else zero_stage) in self.autocast_zero

    def runs_autocast(self, settings: TrainingSettings) -> bool:
        """Whether its launcher runs ``settings``' plan with or without autocast as it was priced (:meth:`priced_autocast`)."""
        return settings.autocast == self.priced_autocast(settings)

    def captures(self, settings: TrainingSettings) -> bool:
        """Whether its launcher captures CUDA graphs as ``settings`` were priced: none, or its :attr:`cuda_graph_scope`
        (the generic plan, no launcher's rules: any)."""
        return not settings.cuda_graphs or self.families is None or settings.cuda_graph_scope == self.cuda_graph_scope

    def replays_graphs(self, settings: TrainingSettings, *, pp: int) -> bool:
        """Whether its launcher replays each micro-batch of a ``pp``-stage plan of ``settings`` as one captured CUDA graph
        by default (:attr:`cuda_graphs`: torchtitan 0.3.0 at ``pp = 1`` without expert parallelism), under an execution
        model only (the plain roofline prices no launch)."""
        return self.cuda_graphs and pp == 1 and settings.expert_parallel == 1 and settings.engine is not None

    def unpriced_accumulator(self, settings: TrainingSettings, pp: int) -> float:
        """Bytes per parameter of the gradient accumulator its launcher's bf16 optimizer keeps beyond what
        the plan's memory holds (:attr:`grad_accumulator` against ``TrainingSettings.grad_accumulator_bytes``,
        priced under ``bf16-mixed`` at ZeRO 0-1); 0: none. A ZeRO-1 plan another launcher's search priced
        would need DeepSpeed's ``BF16_Optimizer`` accumulator (4 B per parameter) beyond its row."""
        if self.grad_accumulator is None or not settings.keeps_grad_accumulator(settings.zero_stage):
            return 0.0
        held = self.grad_accumulator(zero_stage=settings.zero_stage, pp=pp, offload=settings.offload)
        return max(0.0, held - settings.grad_accumulator_bytes)

    def runs_offload(self, offload: str, *, zero_stage: int, pp: int, recompute: str) -> bool:
        """Whether its launcher runs CPU offload mode ``offload`` with these settings (:attr:`offload`,
        :attr:`offload_rule`; the generic plan runs every mode).

        >>> from exporters.targets import TARGETS
        >>> [n for n in ("megatron", "deepspeed", "torchtitan")
        ...  if TARGETS[n].runs_offload("optimizer", zero_stage=1, pp=1, recompute="none")]
        ['megatron', 'deepspeed']
        >>> TARGETS["megatron"].runs_offload("activations", zero_stage=1, pp=2, recompute="none")
        False
        """
        if offload == "none":
            return True
        if zero_stage < OFFLOAD_MIN_ZERO.get(offload, 0):  # parameter offload keeps a ZeRO-3 shard on the host
            return False
        if self.families is None:
            return True
        if offload not in self.offload:
            return False
        return self.offload_rule is None or self.offload_rule(offload, zero_stage=zero_stage, pp=pp, recompute=recompute)

    def allows_pipeline(self, *, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
        """Whether its exporter accepts these pipeline settings (refusals that do not depend on the
        per-op splits; :meth:`runs_pipeline` checks a whole plan).

        Examples
        --------
        >>> from exporters.targets import TARGETS
        >>> TARGETS["megatron"].allows_pipeline(pp=2, zero_stage=2, recompute="none", schedule="1f1b", tp=2)
        False
        >>> TARGETS["megatron"].allows_pipeline(pp=1, zero_stage=3, recompute="full", schedule="gpipe", tp=2)
        True
        >>> TARGETS["deepspeed"].allows_pipeline(pp=1, zero_stage=3, recompute="none", schedule="1f1b", tp=2)
        False
        """
        if self.families is not None and recompute not in self.recompute:
            return False
        if self.pipeline_allows is None:
            return True
        return self.pipeline_allows(pp=pp, zero_stage=zero_stage, recompute=recompute, schedule=schedule, tp=tp)



# ---------------------------------------------------------------------------------------------
# the rules several launchers share


def lazy(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported on the first call (the registry itself loads no exporter)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{module}.{name}``, imported when first called."
    return call


def lazy_attributes(namespace: dict[str, Any], *modules: str) -> Callable[[str], Any]:
    """A launcher package's ``__getattr__`` (PEP 562): a name of ``modules`` (its exporter, its
    validator), imported on first use and then kept in ``namespace`` (the package's globals), so
    ``from exporters.megatron import export_megatron`` works while loading the package's ``TARGET``
    (what the registry and the CLI's ``--help`` read) loads no exporter."""

    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            for module in modules:
                found = import_module(module)
                if hasattr(found, name):
                    namespace[name] = value = getattr(found, name)
                    return value
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")

    return __getattr__


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (:func:`planner.core.configs.divisors`, loaded on first use)."""
    from planner.core.configs import divisors as of

    return list(of(n))


def worlds(devices: int, pp: int) -> list[int]:
    """Devices a stage may use: any divisor (idle devices, as the plain search allows) without a
    pipeline; with one, every stage uses all its devices (the launchers give each stage its ranks)."""
    return divisors(devices) if pp == 1 else [devices]


CP_MIN_TOKENS = 1024
"""[Heuristic] Context parallelism is searched only where each of the ``cp`` ranks keeps at least this
many tokens of the sequence: it exists for long sequences (NVIDIA's Megatron-Core guide recommends
it from 8k tokens up), and below this the K/V exchange of every layer outweighs the attention it
splits, while each ``cp`` degree adds a family per ``dp x tp`` to every stage's search. GPT-2 at
1,024 tokens gets no ``cp`` family."""


def context_degrees(seq_length: int, model_ranks: int) -> list[int]:
    """The ``cp`` degrees searched for a sequence of ``seq_length`` tokens on a stage whose
    non-data-parallel ranks number ``model_ranks`` (``cp x tp``): divisors of it that cut the
    sequence into ``2 cp`` equal chunks (the causal load balance of Megatron-LM and of torchtitan's
    head-tail balancer) of at least :data:`CP_MIN_TOKENS` / 2 tokens.

    >>> context_degrees(32768, 8)
    [1, 2, 4, 8]
    >>> context_degrees(1024, 8)
    [1]
    """
    return [cp for cp in divisors(model_ranks)
            if cp == 1 or (seq_length % (2 * cp) == 0 and seq_length // cp >= CP_MIN_TOKENS)]


def dp_cp_tp_families(
    graph: OpGraph, spaces: Sequence[ConfigSpace], masks_of: Callable[..., Any], *, devices: int,
    devices_per_node: int | None, pp: int, degrees: tuple[int, int] | None = None,
) -> list[Family]:
    """One family per ``dp x cp x tp`` (``sp``: with sequence parallelism) on a stage of ``devices``,
    for a launcher that runs Megatron-LM's tensor-parallel layout with ``cp`` where each rank keeps
    :data:`CP_MIN_TOKENS` tokens (:func:`context_degrees`); ``masks_of(graph, spaces, dp=, tp=,
    sequence_parallel=, devices_per_node=, cp=)`` is its masks (``None``: no such family);
    ``degrees`` is ``(dp, cp x tp)``, as a strategy's splits read. A model that is not a
    transformer has none."""
    from importers.transformer import analyze_transformer
    from planner.core.errors import UnsupportedExport

    try:
        seq_length = analyze_transformer(graph).seq_length
    except UnsupportedExport:
        return []  # not a transformer: the layout masks have no family for it either
    found = []
    for world in worlds(devices, pp):
        for model_ranks in divisors(world):
            dp = world // model_ranks
            if degrees is not None and (dp, model_ranks) != degrees:
                continue
            for cp in context_degrees(seq_length, model_ranks):
                tp = model_ranks // cp
                for sp in (False, True) if tp > 1 else (False,):
                    masks = masks_of(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp,
                                     devices_per_node=devices_per_node, cp=cp)
                    if masks is not None:
                        label = f"dp={dp}" + (f" x cp={cp}" if cp > 1 else "") + f" x tp={tp}" + (" sp" if sp else "")
                        found.append(Family(label=label, tp=tp, dp=dp, cp=cp, sp=sp, masks=tuple(masks)))
    return found


def fills_nodes(family: Family, cluster: Cluster, *, pp: int = 1) -> bool:
    """torchrun starts the same number of processes on every node: ``dp x cp x tp x pp`` fills whole nodes."""
    from exporters._common import launch_shape

    world = (family.dp or 1) * family.cp * (family.tp or 1) * pp
    nodes, per_node = launch_shape(world, cluster.devices_per_node)
    return nodes * per_node == world


def batch_splits(family: Family, graph: OpGraph) -> bool:
    """The exporters read ``dp`` off the batch split: ``dp`` must divide the samples per pass (a
    graph without a batch dim, e.g. one imported at batch 1, has one sample and runs ``dp = 1``)."""
    from exporters._common import graph_batch_size

    return graph_batch_size(graph) % (family.dp or 1) == 0


def on_whole_nodes(settings_allows: SettingsAllowsFn) -> AllowsFn:
    """A launcher's ``allows`` (:data:`AllowsFn`) from its settings rules (:data:`SettingsAllowsFn`): those, on whole
    nodes (:func:`fills_nodes`) with ``dp`` dividing the batch (:func:`batch_splits`), the two checks a pipeline's
    stage does not answer alone."""

    def allows(family: Family, settings: TrainingSettings, cluster: Cluster, graph: OpGraph) -> bool:
        return settings_allows(family, settings, graph) and fills_nodes(family, cluster) and batch_splits(family, graph)

    allows.__doc__ = f"{settings_allows.__module__}.settings_allows, on whole nodes with ``dp`` dividing the batch."
    return allows


def experts_fit(family: Family, settings: TrainingSettings, graph: OpGraph) -> bool:
    """Megatron-Core and DeepSpeed-MoE: ``ep`` divides the experts and the data-parallel size
    (the expert-parallel group lies inside the data-parallel ranks); a dense model runs ``ep = 1``."""
    from importers.transformer import moe_summary

    ep = settings.expert_parallel
    moe = moe_summary(graph)
    if moe is None:
        return ep <= 1
    return moe.num_experts % ep == 0 and (family.dp or 1) % ep == 0


def pipeline_launches(family: Family, plan_input: PlanInput) -> bool:
    """Megatron-LM and DeepSpeed pipelines alike: ``dp x tp x pp`` processes fill whole nodes, the
    micro-batch splits evenly over the data-parallel ranks, experts fit the data-parallel size."""
    pipeline = plan_input.pipeline
    assert pipeline is not None
    return (
        fills_nodes(family, plan_input.cluster, pp=pipeline.pp)
        and plan_input.samples_per_pass % (family.dp or 1) == 0
        and experts_fit(family, plan_input.settings, plan_input.graph)
    )
