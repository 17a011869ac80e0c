"""The launch targets, in one registry: ``TARGETS`` maps a name to a :class:`Target`.

Everything that names a target reads it from here: the CLI's ``--target`` / ``--export`` choices
and their help, the unknown-target errors, the table's ``targets`` column, the ``--target``
restriction of the plain and the pipeline search, and the exporter that writes the plan. A target
is three things:

* ``export``: ``PlanInput -> dict``, an exact launch plan or :class:`UnsupportedExport`;
* ``families``: the configuration families it runs (one boolean mask per op each, e.g. one per
  ``dp x tp`` with sequence parallelism on or off), on one stage of a ``pp``-stage pipeline; a
  strategy is runnable when its choice lies in one family's masks (``None``: every strategy);
* ``allows`` / ``pipeline_allows``: the exporter's refusals that do not depend on the per-op splits
  (ZeRO stage, recomputation, expert parallelism, schedule, whole nodes);
* ``stage_rule`` (targets that pipeline): the refusals of a ``pp > 1`` plan that depend on its stage
  cut and micro-batch (:meth:`Target.runs_pipeline`).

Runnability is therefore a mask-membership test computed once per configuration space
(:meth:`Target.runnable`), never an export attempt: checking 30 frontier rows of GPT-2 against
four launchers is a few array lookups, where running each exporter on each row took seconds.
``tests/exporters/test_targets.py`` holds the two answers equal on every frontier point of the
test models, pipeline points included (:func:`runnable_plan_targets`; the exporters stay the oracle).

Adding a launcher is one module (its ``export_*`` and ``*_masks``) and one entry below.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from planner.core.errors import InputError, UnsupportedExport

if TYPE_CHECKING:  # the registry is read by the CLI's --help: the exporters load on first use
    import numpy as np

    from exporters.generic import PlanInput
    from planner.core.cluster import Cluster
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph
    from planner.core.settings import TrainingSettings

__all__ = [
    "Family",
    "Target",
    "Runnable",
    "TARGETS",
    "FRAMEWORK_TARGETS",
    "target",
    "target_names",
    "runnable_targets_of",
    "runnable_plan_targets",
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


class FamiliesFn(Protocol):
    """``families(graph, spaces, *, devices, devices_per_node, pp, degrees=None)``: the families a
    target runs on one stage of ``devices`` devices; with ``degrees``, only those of that
    ``(dp, tp)`` (a target whose families have no such degrees, Mesh-TF, ignores it)."""

    def __call__(
        self, graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, devices_per_node: int | None, pp: int,
        degrees: tuple[int, int] | None = None,
    ) -> list[Family]: ...


AllowsFn = Callable[["Family", "TrainingSettings", "Cluster", "OpGraph"], bool]
"""``allows(family, settings, cluster, graph)``: the exporter accepts these settings for a strategy of
``family`` on a plan without pipeline stages (the refusals that do not depend on the per-op splits)."""

RuleFn = Callable[["OpGraph", "Sequence[ConfigSpace]", "Cluster", "TrainingSettings"], Callable[[Sequence[int]], bool]]
"""``rule(graph, spaces, cluster, settings)`` -> ``runs(choice)``: see :attr:`Target.rule`."""

PipelineAllowsFn = Callable[..., bool]
"""``pipeline_allows(pp=, zero_stage=, recompute=, schedule=, tp=)`` (keywords)."""

StageRuleFn = Callable[["Family", "PlanInput"], bool]
"""``stage_rule(family, plan_input)``: the exporter accepts a ``pp > 1`` plan of ``family`` with this
stage cut, micro-batch and cluster (see :attr:`Target.stage_rule`)."""


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
        if self.rule is not None:
            return Runnable(everything=False, rule=self.rule(graph, spaces, cluster, settings))
        import numpy as np

        found = self.families(graph, spaces, devices=cluster.devices, devices_per_node=cluster.devices_per_node, pp=1)
        kept = [f for f in found if self.allows is None or self.allows(f, settings, cluster, graph)]
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
            raise InputError(f"target '{self.name}' runs every strategy; restrict with one of {', '.join(FRAMEWORK_TARGETS)}")
        return self.families(graph, spaces, devices=devices, devices_per_node=devices_per_node, pp=pp, degrees=degrees)

    def runs(self, plan_input: PlanInput, families: Sequence[Family]) -> bool:
        """Whether its exporter accepts ``plan_input`` (a plan with or without pipeline stages),
        given the families of its stage (all of them, or those of the strategy's degrees): mask
        membership and the settings rules, and with ``pp > 1`` :meth:`runs_pipeline`. A target with
        a :attr:`rule` is tested by the rule (see :func:`runnable_plan_targets`)."""
        if self.families is None:
            return True
        if plan_input.pipeline is not None and plan_input.pipeline.pp > 1:
            return self.runs_pipeline(plan_input, families)
        graph, settings, cluster = plan_input.graph, plan_input.settings, plan_input.cluster
        choice = plan_input.strategy.choice
        return any(
            (self.allows is None or self.allows(family, settings, cluster, graph))
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
        for family in families:
            allowed = self.allows_pipeline(
                pp=pipeline.pp, zero_stage=plan_input.settings.zero_stage, recompute=plan_input.settings.recompute,
                schedule=pipeline.schedule, tp=family.tp,
            )
            if allowed and all(mask[row] for mask, row in zip(family.masks, choice)) and self.stage_rule(family, plan_input):
                return True
        return False

    def allows_pipeline(self, *, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
        """Whether its exporter accepts these pipeline settings (refusals that do not depend on the
        per-op splits; :meth:`runs_pipeline` checks a whole plan).

        Examples
        --------
        >>> TARGETS["megatron"].allows_pipeline(pp=2, zero_stage=2, recompute="none", schedule="1f1b", tp=2)
        False
        >>> TARGETS["megatron"].allows_pipeline(pp=1, zero_stage=3, recompute="full", schedule="gpipe", tp=2)
        True
        >>> TARGETS["deepspeed"].allows_pipeline(pp=1, zero_stage=3, recompute="none", schedule="1f1b", tp=2)
        False
        """
        if self.pipeline_allows is None:
            return True
        return self.pipeline_allows(pp=pp, zero_stage=zero_stage, recompute=recompute, schedule=schedule, tp=tp)


# ---------------------------------------------------------------------------------------------
# the families of each framework


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported on the first call (the registry itself loads no exporter)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``{module}.{name}``, imported when first called."
    return call


def _divisors(n: int) -> list[int]:
    from planner.core.configs import divisors

    return list(divisors(n))


def _worlds(devices: int, pp: int) -> list[int]:
    """Devices a stage may use: any divisor (idle devices, as the plain search allows) without a
    pipeline; with one, every stage uses all its devices (the launchers give each stage its ranks)."""
    return _divisors(devices) if pp == 1 else [devices]


def _megatron_families(graph, spaces, *, devices, devices_per_node, pp, degrees=None) -> list[Family]:
    from exporters.megatron import megatron_masks

    found = []
    for world in _worlds(devices, pp):
        for tp in _divisors(world):
            dp = world // tp
            if degrees is not None and (dp, tp) != degrees:
                continue
            for sp in (False, True) if tp > 1 else (False,):
                masks = megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp, devices_per_node=devices_per_node)
                if masks is not None:
                    found.append(Family(label=f"dp={dp} x tp={tp}" + (" sp" if sp else ""), tp=tp, dp=dp, masks=tuple(masks)))
    return found


def _deepspeed_families(graph, spaces, *, devices, devices_per_node, pp, degrees=None) -> list[Family]:
    from exporters.deepspeed import deepspeed_masks

    found = []
    for world in _worlds(devices, pp):
        for tp in _divisors(world):
            if pp > 1 and tp > 1:
                continue  # our DeepSpeed export pipelines with tp=1 only (AutoTP is not a PipelineModule)
            dp = world // tp
            if degrees is not None and (dp, tp) != degrees:
                continue
            masks = deepspeed_masks(graph, spaces, dp=dp, tp=tp, devices_per_node=devices_per_node)
            if masks is not None:
                found.append(Family(label=f"dp={dp} x tp={tp}", tp=tp, dp=dp, masks=tuple(masks)))
    return found


def _dtensor_families(graph, spaces, *, devices, devices_per_node, pp, degrees=None) -> list[Family]:
    if pp > 1:
        return []  # a 2-D (dp, tp) mesh: no pipeline stages
    from exporters.dtensor import dtensor_families, dtensor_masks

    found = []
    for family in dtensor_families(graph, devices=devices):
        if degrees is not None and (family.dp, family.tp) != degrees:
            continue
        masks = dtensor_masks(
            graph,
            spaces,
            dp=family.dp,
            tp=family.tp,
            sequence_parallel=family.sequence_parallel,
            vocab_parallel_embedding=family.vocab_parallel_embedding,
            vocab_parallel_head=family.vocab_parallel_head,
            devices_per_node=devices_per_node,
        )
        if masks is not None:
            found.append(Family(label=family.label, tp=family.tp, dp=family.dp, masks=tuple(masks)))
    return found


def _mesh_tf_families(graph, spaces, *, devices, devices_per_node, pp, degrees=None) -> list[Family]:
    if pp > 1:
        return []  # Mesh-TensorFlow has no pipeline parallelism
    from exporters.mesh_tf import default_layouts, mesh_tf_masks

    found = []
    for world in _divisors(devices):
        for mesh, layout in default_layouts(graph, devices=world):
            masks = mesh_tf_masks(graph, spaces, mesh_shape=mesh, layout=layout)
            if masks is not None:
                label = ";".join(f"{k}:{v}" for k, v in mesh.items()) + " " + ";".join(f"{k}:{v}" for k, v in layout.items())
                found.append(Family(label=label.strip(), tp=None, masks=tuple(masks)))
    return found


# ---------------------------------------------------------------------------------------------
# the settings each framework accepts (the exporters' refusals that ignore the splits)


def _fills_nodes(family: Family, cluster: Cluster, *, pp: int = 1) -> bool:
    """torchrun starts the same number of processes on every node: ``dp x tp x pp`` fills whole nodes."""
    from exporters._common import launch_shape

    world = (family.dp or 1) * (family.tp or 1) * pp
    nodes, per_node = launch_shape(world, cluster.devices_per_node)
    return nodes * per_node == world


def _batch_splits(family: Family, graph: OpGraph) -> bool:
    """The exporters read ``dp`` off the batch split: ``dp`` must divide the samples per pass (a
    graph without a batch dim, e.g. one imported at batch 1, has one sample and runs ``dp = 1``)."""
    from exporters._common import graph_batch_size

    return graph_batch_size(graph) % (family.dp or 1) == 0


def _experts_fit(family: Family, settings: TrainingSettings, graph: OpGraph) -> bool:
    """Megatron-Core and DeepSpeed-MoE: ``ep`` divides the experts and the data-parallel size
    (the expert-parallel group lies inside the data-parallel ranks); a dense model runs ``ep = 1``."""
    from importers.transformer import moe_summary

    ep = settings.expert_parallel
    moe = moe_summary(graph)
    if moe is None:
        return ep <= 1
    return moe.num_experts % ep == 0 and (family.dp or 1) % ep == 0


def _megatron_allows(family: Family, settings: TrainingSettings, cluster: Cluster, graph: OpGraph) -> bool:
    return _fills_nodes(family, cluster) and _batch_splits(family, graph) and _experts_fit(family, settings, graph)


def _deepspeed_allows(family: Family, settings: TrainingSettings, cluster: Cluster, graph: OpGraph) -> bool:
    if (family.tp or 1) > 1 and settings.zero_stage == 3:
        return False  # AutoTP runs ZeRO 0-2
    return _fills_nodes(family, cluster) and _batch_splits(family, graph) and _experts_fit(family, settings, graph)


def _mesh_tf_allows(family: Family, settings: TrainingSettings, cluster: Cluster, graph: OpGraph) -> bool:
    return settings.zero_stage == 0 and settings.expert_parallel <= 1  # no ZeRO, no expert axis


def _dtensor_allows(family: Family, settings: TrainingSettings, cluster: Cluster, graph: OpGraph) -> bool:
    # FSDP2 shards everything at once (ZeRO-3) or nothing; torchtitan's selective AC differs from
    # ours; the mesh has no expert axis
    return (
        settings.zero_stage in (0, 3)
        and settings.recompute != "selective"
        and settings.expert_parallel <= 1
        and _fills_nodes(family, cluster)
        and _batch_splits(family, graph)
    )


def _mesh_tf_rule(
    graph: OpGraph, spaces: Sequence[ConfigSpace], cluster: Cluster, settings: TrainingSettings
) -> Callable[[Sequence[int]], bool]:
    """What :func:`~exporters.mesh_tf.export_mesh_tf` accepts, without writing the layout: every
    dimension name split by one factor everywhere, no op splitting two dims of one name, and the
    mesh that packs the split names (equal factors share a mesh dim unless an op splits both) no
    larger than the cluster. The names and each op's factor columns are read once."""
    import numpy as np

    from exporters.mesh_tf import dimension_names

    if not _mesh_tf_allows(Family(label="", tp=None, masks=()), settings, cluster, graph):
        return lambda choice: False
    classes, names = dimension_names(graph)
    ids = {name: i for i, name in enumerate(dict.fromkeys(names))}
    name_list = list(ids)
    batch = np.array([name.startswith("batch") for name in ids], dtype=bool)
    tables, op_ids, twins = [], [], []
    for index, (op, space) in enumerate(zip(graph.ops, spaces)):
        own = [ids[names[classes.of[index][d.name]]] for d in op.dims]
        columns = [space.dim_names.index(d.name) if d.name in space.dim_names else -1 for d in op.dims]
        factors = np.ones((space.size, len(columns)), dtype=np.int64)
        for k, column in enumerate(columns):
            if column >= 0:
                factors[:, k] = space.factors[:, column]
        tables.append(factors)
        op_ids.append(np.array(own, dtype=np.int64))
        repeated = [i for i, name in enumerate(own) if own.count(name) > 1]
        twins.append(np.array(repeated, dtype=np.int64))
    flat_ids = np.concatenate(op_ids) if op_ids else np.zeros(0, np.int64)
    first = np.full(len(ids), -1, dtype=np.int64)
    for position in range(len(flat_ids) - 1, -1, -1):
        first[flat_ids[position]] = position  # each name's first (op, dim) in op order
    named = first >= 0
    # names an op holds together (they need distinct mesh dims when both are split)
    together = np.zeros((len(ids), len(ids)), dtype=bool)
    for own in op_ids:
        together[np.ix_(own, own)] = True

    def runs(choice: Sequence[int]) -> bool:
        rows = [table[row] for table, row in zip(tables, choice)]
        if any(len(t) and (row[t] > 1).any() for row, t in zip(rows, twins)):
            return False  # one name twice in a tensor, split: Mesh-TF lays a name out once per tensor
        factors = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        per_name = np.ones(len(ids), dtype=np.int64)
        per_name[named] = factors[first[named]]
        if (factors != per_name[flat_ids]).any():
            return False  # two ops split one name differently
        split = sorted(np.flatnonzero(per_name > 1), key=lambda n: (not batch[n], -per_name[n], name_list[n]))
        axes: list[tuple[int, list[int]]] = []
        for name in split:
            size = int(per_name[name])
            for axis_size, members in axes:
                if axis_size == size and not together[name, members].any():
                    members.append(name)
                    break
            else:
                axes.append((size, [name]))
        return int(np.prod([size for size, _ in axes], dtype=np.int64)) <= cluster.devices

    return runs


def _megatron_pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    # Megatron-FSDP (ZeRO-2/3) is not documented with pipelines; no GPipe schedule
    return pp == 1 or (zero_stage <= 1 and schedule != "gpipe")


def _deepspeed_pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    if tp is not None and tp > 1 and zero_stage == 3:
        return False  # AutoTP runs ZeRO 0-2
    # PipelineEngine asserts ZeRO < 2 and runs TrainSchedule (1F1B) only
    return pp == 1 or (zero_stage <= 1 and schedule == "1f1b" and (tp or 1) == 1)


def _mesh_tf_pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    return pp == 1 and zero_stage == 0


def _dtensor_pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    return pp == 1 and zero_stage in (0, 3) and recompute != "selective"


def _pipeline_launches(family: Family, plan_input: PlanInput) -> bool:
    """Megatron-LM and DeepSpeed pipelines alike: ``dp x tp x pp`` processes fill whole nodes, the
    micro-batch splits evenly over the data-parallel ranks, experts fit the data-parallel size."""
    pipeline = plan_input.pipeline
    assert pipeline is not None
    return (
        _fills_nodes(family, plan_input.cluster, pp=pipeline.pp)
        and plan_input.samples_per_pass % (family.dp or 1) == 0
        and _experts_fit(family, plan_input.settings, plan_input.graph)
    )


def _megatron_stage_rule(family: Family, plan_input: PlanInput) -> bool:
    """Megatron-LM's model has the pipeline's layers; ``chunks`` model chunks divide every stage's
    layers; the micro-batch per rank is the pipeline's (``--micro-batch-size``); the global batch is
    whole micro-batches, and the interleaved schedule runs them in groups of ``pp`` (Megatron's
    ``forward_backward_pipelining_with_interleaving``: at least ``pp``, a multiple of it)."""
    from importers.transformer import analyze_transformer

    pipeline = plan_input.pipeline
    assert pipeline is not None
    dp = family.dp or 1
    per_pass, per_step = plan_input.samples_per_pass, plan_input.samples_per_step
    micro_batches = per_step // per_pass
    interleaving = pipeline.chunks == 1 or (micro_batches >= pipeline.pp and micro_batches % pipeline.pp == 0)
    return (
        _pipeline_launches(family, plan_input)
        and per_pass // dp == pipeline.micro_batch
        and per_step % per_pass == 0
        and interleaving
        and all(layers % pipeline.chunks == 0 for layers in pipeline.layers_per_stage)
        and pipeline.num_layers == analyze_transformer(plan_input.graph).num_layers
    )


def _deepspeed_stage_rule(family: Family, plan_input: PlanInput) -> bool:
    """DeepSpeed's ``PipelineModule`` cuts the model's repeated blocks."""
    return bool(plan_input.graph.blocks) and _pipeline_launches(family, plan_input)


# ---------------------------------------------------------------------------------------------
# the registry


TARGETS: Mapping[str, Target] = {
    target.name: target
    for target in (
        Target(
            name="generic",
            help="the versioned plan JSON with every op's split (runs every strategy)",
            export=_lazy("exporters.generic", "write_plan"),
        ),
        Target(
            name="megatron",
            help="Megatron-LM torchrun arguments (dp x tp x pp, sequence parallelism, ZeRO-1 as the distributed optimizer)",
            export=_lazy("exporters.megatron", "export_megatron"),
            families=_megatron_families,
            allows=_megatron_allows,
            pipeline_allows=_megatron_pipeline_allows,
            stage_rule=_megatron_stage_rule,
        ),
        Target(
            name="deepspeed",
            help="DeepSpeed ds_config.json and launch line (ZeRO data parallelism, AutoTP, PipelineModule)",
            export=_lazy("exporters.deepspeed", "export_deepspeed"),
            families=_deepspeed_families,
            allows=_deepspeed_allows,
            pipeline_allows=_deepspeed_pipeline_allows,
            stage_rule=_deepspeed_stage_rule,
        ),
        Target(
            name="meshtf",
            help="Mesh-TensorFlow mesh shape and layout rules",
            export=_lazy("exporters.mesh_tf", "export_mesh_tf"),
            families=_mesh_tf_families,
            allows=_mesh_tf_allows,
            pipeline_allows=_mesh_tf_pipeline_allows,
            rule=_mesh_tf_rule,
        ),
        Target(
            name="dtensor",
            help="PyTorch DTensor plan on a (dp, tp) mesh, FSDP2 for ZeRO-3, run by python -m planner.run",
            export=_lazy("exporters.dtensor", "export_dtensor"),
            families=_dtensor_families,
            allows=_dtensor_allows,
            pipeline_allows=_dtensor_pipeline_allows,
        ),
    )
}
"""Every launch target by name, in the order the CLI lists them (``generic`` first)."""

FRAMEWORK_TARGETS: tuple[str, ...] = tuple(name for name, t in TARGETS.items() if t.restricts)
"""The targets that run only some strategies (those ``--target`` restricts a search to)."""


def target_names(*, frameworks_only: bool = False) -> str:
    """``"generic, megatron, deepspeed, meshtf or dtensor"``: the names for a message or ``--help``.

    >>> target_names(frameworks_only=True)
    'megatron, deepspeed, meshtf or dtensor'
    """
    names = list(FRAMEWORK_TARGETS if frameworks_only else TARGETS)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def target(name: str, *, flag: str = "--target") -> Target:
    """The target called ``name``.

    Raises
    ------
    InputError
        For an unknown name; the message lists the valid ones.
    """
    found = TARGETS.get(name)
    if found is None:
        raise InputError(f"unknown {flag} '{name}'; use {target_names()}")
    return found


def runnable_targets_of(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    cluster: Cluster,
    settings: TrainingSettings,
    choices: Sequence[Sequence[int]],
) -> list[tuple[str, ...]]:
    """Per choice, the targets that run it (registry order; ``generic`` always): the table's
    ``targets`` column, from each target's families built once for ``spaces``."""
    runnable = {name: t.runnable(graph, spaces, cluster, settings) for name, t in TARGETS.items()}
    return [tuple(name for name, allowed in runnable.items() if choice in allowed) for choice in choices]


def _settings_allow(entry: Target, plan_input: PlanInput, degrees: tuple[int, int]) -> bool:
    """``entry``'s settings rules for a plan of these ``(dp, tp)`` (they read a family's degrees only)."""
    pipeline, settings = plan_input.pipeline, plan_input.settings
    if pipeline is not None and pipeline.pp > 1:
        return entry.allows_pipeline(pp=pipeline.pp, zero_stage=settings.zero_stage, recompute=settings.recompute,
                                     schedule=pipeline.schedule, tp=degrees[1])  # fmt: skip
    stub = Family(label="", dp=degrees[0], tp=degrees[1], masks=())
    return entry.allows is None or entry.allows(stub, settings, plan_input.cluster, plan_input.graph)


def runnable_plan_targets(inputs: Sequence[PlanInput]) -> list[tuple[str, ...]]:
    """Per exporter input, the targets that run it (registry order; ``generic`` always), pipeline
    plans included: the ``targets`` column of ``plan --global-batch``, with no export attempted.

    Each input's ``(dp, tp)`` is read as the launchers read it (:func:`exporters._common.launcher_degrees`),
    and only the families of those degrees are built, once per stage (inputs that share a graph and
    configuration spaces share them, as the points of one pipeline search do); a plan then runs
    when :meth:`Target.runs` says so (a target with a :attr:`Target.rule`: when the rule does).
    """
    from exporters._common import launcher_degrees
    from importers.transformer import analyze_transformer

    inputs = list(inputs)  # the memo keys on ids: every input stays alive until the end
    memo: dict[tuple, Any] = {}
    found = []
    for plan_input in inputs:
        graph, spaces, cluster = plan_input.graph, plan_input.spaces, plan_input.cluster
        stage = (id(graph), tuple(map(id, spaces)))
        if ("roles", id(graph)) not in memo:  # analyze_transformer keeps a few graphs; the points cycle through more
            try:
                memo["roles", id(graph)] = analyze_transformer(graph).roles
            except UnsupportedExport:
                memo["roles", id(graph)] = None
        degrees = launcher_degrees(graph, spaces, plan_input.strategy.choice, memo["roles", id(graph)])
        pipeline = plan_input.pipeline
        pp = 1 if pipeline is None else pipeline.pp
        devices = cluster.devices if pp == 1 else pipeline.devices_per_stage
        names = []
        for name, entry in TARGETS.items():
            if entry.rule is not None and pp == 1:
                key = (name, *stage, repr(cluster), repr(plan_input.settings))  # dicts inside: not hashable
                if key not in memo:
                    memo[key] = entry.rule(graph, spaces, cluster, plan_input.settings)
                runs = memo[key](plan_input.strategy.choice)
            elif not _settings_allow(entry, plan_input, degrees):
                runs = False  # refused whatever the splits: no families to build
            else:
                key = (name, *stage, devices, cluster.devices_per_node, pp, degrees)
                if key not in memo:
                    memo[key] = [] if not entry.restricts else entry.pipeline_families(
                        graph, spaces, devices=devices, devices_per_node=cluster.devices_per_node, pp=pp, degrees=degrees
                    )
                runs = entry.runs(plan_input, memo[key])
            if runs:
                names.append(name)
        found.append(tuple(names))
    return found
