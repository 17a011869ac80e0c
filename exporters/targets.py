"""The launch targets, in one registry: ``TARGETS`` maps a name to a :class:`Target`.

Everything that names a target reads it from here: the CLI's ``--target`` / ``--export`` choices
and their help, the unknown-target errors, the table's ``targets`` column, the ``--target``
restriction of the plain and the pipeline search, the exporter that writes the plan, and the
execution model the roof prices a launcher's rows under (:attr:`Target.execution`).

A launcher is one package whose ``TARGET`` is its entry (:mod:`exporters._target` says what a
:class:`Target` holds: exporter, families, settings rules, stage rule, execution model):

* ``exporters/megatron/``: Megatron-LM (``__init__.py``: ``TARGET`` and the public names;
  ``rules.py``: families, settings rules, stage rule; ``export.py``: the exporter;
  ``validate.py``: Megatron-LM's own checks);
* ``exporters/deepspeed/``: DeepSpeed (the same four parts);
* ``exporters/mesh_tf/``: Mesh-TensorFlow (the same four parts; ``rules.py`` has an exact ``rule``);
* ``exporters/dtensor/``: the PyTorch DTensor plan (no ``validate.py``: its plans are run for real);
* ``exporters/torchtitan/``: torchtitan 0.3's launch (the same four parts).

``generic`` (the per-op plan JSON, :mod:`exporters.generic`) runs every strategy and is defined
below. Reading the registry loads no exporter (the CLI reads it for ``--help``): each entry's
``export`` and families import their exporter module on first use.

Runnability is a mask-membership test (a family is one mask per op), computed once per
configuration space (:meth:`Target.runnable`), never an export attempt: checking 30 frontier rows
of GPT-2 against four launchers is a few array lookups, where running each exporter on each row
took seconds.
``tests/exporters/test_targets.py`` holds the two answers equal on every frontier point of the
test models, pipeline points included (:func:`runnable_plan_targets`; the exporters stay the oracle).

Adding a launcher is one package with its ``TARGET`` and one line in :data:`TARGETS`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from exporters import deepspeed, dtensor, megatron, mesh_tf, onnx_sharding, torchtitan
from exporters._target import Family, Runnable, Target, lazy
from planner.core.errors import InputError, UnsupportedExport

if TYPE_CHECKING:  # the registry is read by the CLI's --help: the exporters load on first use
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
    "EXPORT_FORMATS",
    "FRAMEWORK_TARGETS",
    "target",
    "target_names",
    "runnable_targets_of",
    "runnable_plan_targets",
]


# ---------------------------------------------------------------------------------------------
# the registry


TARGETS: Mapping[str, Target] = {
    target.name: target
    for target in (
        Target(
            name="generic",
            help="the versioned plan JSON with every op's split (runs every strategy)",
            export=lazy("exporters.generic", "write_plan"),
            execution=("fused", "flash"),  # priced as the launchers whose rows it is compared with run
            recompute=("none", "selective", "mlp", "full", "op"),
            offload=("none", "optimizer", "activations", "parameters"),
        ),
        megatron.TARGET,
        deepspeed.TARGET,
        mesh_tf.TARGET,
        dtensor.TARGET,
        torchtitan.TARGET,
    )
}
"""Every launch target by name, in the order the CLI lists them (``generic`` first)."""

class _ExportFormats(Mapping[str, Target]):
    """Every entry of :data:`TARGETS` as it is now (a launcher registered later is exported too), then
    the formats that are no launcher."""

    def __init__(self, *formats: Target) -> None:
        self._formats = {entry.name: entry for entry in formats}

    def __getitem__(self, name: str) -> Target:
        return TARGETS[name] if name in TARGETS else self._formats[name]

    def __iter__(self):
        return iter([*TARGETS, *(name for name in self._formats if name not in TARGETS)])

    def __len__(self) -> int:
        return len(list(iter(self)))


EXPORT_FORMATS: Mapping[str, Target] = _ExportFormats(onnx_sharding.TARGET)
"""What ``--export`` and ``planner export --format`` write: every target, and the export formats that
are no launcher (``onnx``: the plan written into a copy of the model; it runs every strategy)."""

FRAMEWORK_TARGETS: tuple[str, ...] = tuple(name for name, t in TARGETS.items() if t.restricts)
"""The targets that run only some strategies (those ``--target`` restricts a search to)."""


def target_names(*, frameworks_only: bool = False, formats: bool = False) -> str:
    """``"generic, megatron, deepspeed, meshtf, dtensor or torchtitan"``: the names for a message or ``--help``
    (``formats``: those of :data:`EXPORT_FORMATS`).

    >>> target_names(frameworks_only=True)
    'megatron, deepspeed, meshtf, dtensor or torchtitan'
    """
    names = list(FRAMEWORK_TARGETS if frameworks_only else EXPORT_FORMATS if formats else TARGETS)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def target(name: str, *, flag: str = "--target") -> Target:
    """The target called ``name`` (for ``--export`` / ``--format``: the export format, :data:`EXPORT_FORMATS`).

    Raises
    ------
    InputError
        For an unknown name; the message lists the valid ones.
    """
    formats = flag in ("--export", "--format")  # what is written: the export formats too
    found = (EXPORT_FORMATS if formats else TARGETS).get(name)
    if found is None:
        raise InputError(f"unknown {flag} '{name}'; use {target_names(formats=formats)}")
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
    if settings.zero_stage == 3 and entry.allows is not None and entry.zero3_gather != settings.zero3_gather:
        return False  # it gathers ZeRO-3's parameters otherwise than the plan's memory was priced (Target.zero3_gather)
    if entry.allows is not None and (settings.sequence_shard_saved > entry.sequence_shard_saved
                                     or settings.fused_swiglu > entry.fused_swiglu):
        return False  # it keeps tensors the plan's memory was credited (Target.sequence_shard_saved, .fused_swiglu)
    if entry.allows is not None and entry.unpriced_accumulator(settings, 1 if pipeline is None else pipeline.pp):
        return False  # its optimizer keeps a gradient accumulator the plan's memory does not hold
    if entry.families is not None and entry.unpriced_sync(settings, degrees[0]):
        # it synchronises ZeRO 0-2 otherwise than the plan's time was priced (Target.zero_sync): asked of every
        # target with families, as the exporters' own refusal asks it (exporters._sync_refusal; Mesh-TF has no allows)
        return False
    if pipeline is not None and pipeline.pp > 1:
        return entry.allows_pipeline(pp=pipeline.pp, zero_stage=settings.zero_stage, recompute=settings.recompute,
                                     schedule=pipeline.schedule, tp=degrees[1])  # fmt: skip
    if entry.allows is None:
        return True
    # the splits read (dp, cp x tp): a pre-filter must pass the plan if any split of those ranks
    # between cp and tp is allowed (DeepSpeed refuses ZeRO-3 with AutoTP's tp, not with Ulysses' cp)
    from planner.core.configs import divisors  # here: configs loads numpy, which the CLI's --help needs not

    dp, model_ranks = degrees
    return any(entry.allows(Family(label="", dp=dp, tp=model_ranks // cp, cp=cp, masks=()), settings,
                            plan_input.cluster, plan_input.graph)
               for cp in divisors(model_ranks))


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
                runs = _settings_allow(entry, plan_input, degrees) and memo[key](plan_input.strategy.choice)
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
