"""What Mesh-TensorFlow runs, without exporting: its families, settings rules and exact rule.

Mesh-TF lays out any consistent naming (every dimension name split one way everywhere), so its
families (the default layouts of each mesh) are only the ones worth searching; :func:`rule` is the
exact test of a choice the exporter accepts, built once per configuration space. No ZeRO, no
expert axis, no pipeline stages, no sequence past a learned position table.
:data:`exporters.mesh_tf.TARGET` names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from exporters._target import Family, divisors

if TYPE_CHECKING:
    from planner.core.cluster import Cluster
    from planner.core.configs import ConfigSpace
    from planner.core.graph import OpGraph
    from planner.core.settings import TrainingSettings

__all__ = ["families", "allows", "pipeline_allows", "rule", "past_table"]


def families(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, devices: int, devices_per_node: int | None, pp: int,
    degrees: tuple[int, int] | None = None,
) -> list[Family]:
    """The default layouts (:func:`~exporters.mesh_tf.export.default_layouts`) of every mesh of at
    most ``devices`` devices; ``degrees`` is ignored (a layout has no ``(dp, tp)``). None when the
    sequence runs past a learned position table (:func:`~exporters.mesh_tf.export.export_mesh_tf`)."""
    if pp > 1 or past_table(graph):
        return []  # Mesh-TensorFlow has no pipeline parallelism; the model has no positions past its table
    from exporters.mesh_tf.export import OpNaming, default_layouts, mesh_tf_masks

    found = []
    naming = OpNaming.build(graph, spaces)
    for world in divisors(devices):
        for mesh, layout in default_layouts(graph, devices=world):
            masks = mesh_tf_masks(graph, spaces, mesh_shape=mesh, layout=layout, naming=naming)
            if masks is not None:
                label = ";".join(f"{k}:{v}" for k, v in mesh.items()) + " " + ";".join(f"{k}:{v}" for k, v in layout.items())
                found.append(Family(label=label.strip(), tp=None, masks=tuple(masks)))
    return found


def allows(family: Family, settings: TrainingSettings, cluster: Cluster, graph: OpGraph) -> bool:
    """No ZeRO, no expert axis."""
    # TARGET.expert_parallel (False) says the same, but only Target.runs_settings reads it: --target's
    # filter (planner.plan_targets.target_filter), the nearest plan of a refusal (fastest_runnable) and
    # runnable_plan_targets' exact rule (below) read this alone (tests/exporters/test_mesh_tf_position_table.py)
    return settings.zero_stage == 0 and settings.expert_parallel <= 1


def past_table(graph: OpGraph) -> bool:
    """The graph's sequence runs past a learned position table (:mod:`importers.position_table`): the
    export refuses it (:func:`~exporters.mesh_tf.export.export_mesh_tf`)."""
    from importers.transformer import position_tables, too_short

    return too_short(position_tables(graph)) is not None


def pipeline_allows(*, pp: int, zero_stage: int, recompute: str, schedule: str, tp: int | None) -> bool:
    """No pipeline stages, no ZeRO."""
    return pp == 1 and zero_stage == 0


def rule(
    graph: OpGraph, spaces: Sequence[ConfigSpace], cluster: Cluster, settings: TrainingSettings
) -> Callable[[Sequence[int]], bool]:
    """What :func:`~exporters.mesh_tf.export.export_mesh_tf` accepts, without writing the layout: every
    dimension name split by one factor everywhere, no op splitting two dims of one name, and the
    mesh that packs the split names (equal factors share a mesh dim unless an op splits both) no
    larger than the cluster. The names and each op's factor columns are read once."""
    import numpy as np

    from exporters.mesh_tf.export import batch_dim_label, dimension_names, is_batch_name

    if not allows(Family(label="", tp=None, masks=()), settings, cluster, graph) or past_table(graph):
        return lambda choice: False
    classes, names = dimension_names(graph)
    ids = {name: i for i, name in enumerate(dict.fromkeys(names))}
    name_list = list(ids)
    label = batch_dim_label(graph)
    batch = np.array([is_batch_name(name, label) for name in ids], dtype=bool)
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
