r"""Mesh-TensorFlow exporter: a mesh shape (``"b:4;m:2"``) and layout rules (``"batch:b;d_ff:m"``).

Mesh-TF has no per-operator sharding: every tensor dimension *name* is laid out on one mesh dimension
(or none) everywhere (reference §3.1). The planner's op dims are tied to names through dimension
classes (:func:`importers.transformer.dim_classes`: a producer's output axis and every consumer's input
axis are one name). A class gets a transformer name where one is recognised (``batch``, ``length``,
``d_model``, ``heads``, ``d_kv``, ``d_ff``, ``vocab``), else ``<dim>_<size>``; batch dims that are not samples (a
GNN's nodes) take the file's name of the dim (:func:`batch_dim_label`). DeBERTa-v2's position
terms name their dims as the score does, and their table's relative positions ``relative_position``;
two of their classes are re-drawn first, as a Mesh-TF model keeps them (:func:`_term_classes`).

A strategy is expressible when every op splits every dim of a class by the same factor; the classes
split by ``f`` are then placed on mesh dims of size ``f`` (batch classes on ``b``, the others on
``m``, ``m2``..., two classes sharing a mesh dim unless some op splits both). Otherwise the export is
refused naming two ops that disagree. The result is checked with
:func:`exporters.mesh_tf.validate.validate_mesh_tf` on every tensor of the graph. Mesh-TF has no ZeRO and no
pipeline parallelism, so plans with ``zero_stage > 0`` or ``pp > 1`` are refused, as is a sequence past a
learned position table (:func:`_refuse_past_table`; its rules list no such plan).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from exporters._common import graph_batch_size
from importers.transformer import (
    DimClasses,
    TransformerModel,
    exclusive_output_dims,
    analyze_transformer,
    dim_classes,
    embedding_rows_dim,
    head_dims,
    is_parameter,
    output_side_dims,
    position_tables,
    reduction_side_dims,
    shortfall,
    too_short,
)
from exporters.elsewhere import ELSEWHERE
from exporters.generic import PlanInput
from exporters.mesh_tf.validate import MeshTensor, validate_mesh_tf
from planner.core.configs import ConfigSpace, divisors
from exporters._fp8 import refuse_fp8
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph
from planner.core.memo import IdentityMemo
from planner.core.settings import TrainingSettings

__all__ = ["batch_dim_label", "is_batch_name", "dimension_names", "mesh_tf_masks", "default_layouts", "export_mesh_tf"]


def _model(graph: OpGraph) -> TransformerModel | None:
    try:
        return analyze_transformer(graph)
    except UnsupportedExport:
        return None


def _term_classes(graph: OpGraph, model: TransformerModel) -> tuple[DimClasses, dict[int, str]]:
    """``model.classes`` with DeBERTa's position terms named as Mesh-TF would lay them out, and the
    names of the classes this adds.

    DeBERTa-v2's c2p and p2c terms (:attr:`~importers.transformer.AttentionBlock.position_scores`,
    :mod:`importers.attention_terms`) read the query or key and the projected relative-position table
    repeated over the batch (``[b h, 2k, d]``: a ``Tile`` that folds the heads into its first axis).
    Through that repeat the op graph joins two classes a Mesh-TF model keeps apart:

    * the term's reduction (the head size, as the score's) joins the projection's output columns, the
      ``heads`` class: a term would hold ``heads`` twice, which Mesh-TF cannot lay out split, so no
      layout split the heads. It goes to the score's ``d_kv`` class (same size);
    * the repeat's folded ``b h`` axis, which no exporter lets the planner split (the table has no
      batch), joins the batch class: every layout splitting the batch failed on it. It gets a class
      of its own, ``position_copies``, never laid out: each device repeats its table whole, as the
      data-parallel plans price it.

    A move that would leave a class empty, or between sizes that differ, is not made.
    """
    classes, ops = model.classes, graph.ops
    batch = {cid for cid, ms in enumerate(classes.members) if any(ops[i].dim(d).is_batch for i, d in ms)}
    to_d_kv: dict[tuple[int, str], int] = {}
    repeats: list[tuple[int, str]] = []
    for block in model.attention:
        d_kv = [d for d in ops[block.score].dims if d.kind == "reduction"]
        read = {access.tensor for access in ops[block.score].inputs}
        for term in block.position_scores:
            to_d_kv |= {(term, d.name): classes.of[block.score][d_kv[0].name] for d in ops[term].dims
                        if len(d_kv) == 1 and d.kind == "reduction" and d.size == d_kv[0].size}
            for index in sorted({e.producer for e in graph.edges if e.consumer == term and e.tensor not in read}):
                repeats += [(index, d.name) for d in ops[index].dims
                            if classes.of[index][d.name] in batch and not d.is_batch and not d.splittable]
    to_d_kv = {(i, d): cid for (i, d), cid in to_d_kv.items() if classes.of[i][d] != cid}
    left = {cid: sum(m not in to_d_kv for m in members) for cid, members in enumerate(classes.members)}
    # a batch class keeps its batch dims, which never move: only a d_kv move could empty a class
    moves = {m: cid for m, cid in to_d_kv.items() if left[classes.of[m[0]][m[1]]] > 0}
    moves |= {m: classes.count + k for k, m in enumerate(dict.fromkeys(repeats))}
    if not moves:
        return classes, {}
    of = tuple({d: moves.get((i, d), cid) for d, cid in dims.items()} for i, dims in enumerate(classes.of))
    members = [[m for m in ms if m not in moves] for ms in classes.members] + [[] for _ in dict.fromkeys(repeats)]
    for member, cid in moves.items():
        members[cid].append(member)
    added = {cid: "position_copies" for cid in range(classes.count, len(members))}
    return DimClasses(of=of, members=tuple(tuple(sorted(ms, key=lambda m: m[0])) for ms in members)), added


def _role_names(graph: OpGraph, model: TransformerModel, classes: DimClasses) -> dict[int, str]:
    """Transformer names of the classes of every layer's attention, MLP, embedding and head dims.

    Every layer's heads share the name ``heads`` (and so one layout), as in a Mesh-TF transformer;
    a position term (DeBERTa's c2p, p2c) names its dims as the score does, and its relative positions
    (the position operand's own output dim, ``2k`` of them) ``relative_position``.
    """
    ops = graph.ops
    names: dict[int, str] = {}

    def tag(op: int, dims: Sequence[str], name: str, inner: str | None = None) -> None:
        for position, dim in enumerate(dims):
            names.setdefault(classes.of[op][dim], name if position == 0 or inner is None else inner)

    for block in model.attention:
        score, value = ops[block.score], ops[block.value]
        tag(block.score, head_dims(graph, score), "heads", "heads_inner")
        tag(block.value, head_dims(graph, value), "heads", "heads_inner")
        tag(block.score, [d.name for d in score.dims if d.kind == "reduction"], "d_kv")
        queries = exclusive_output_dims(graph, score, 0)
        keys = exclusive_output_dims(graph, score, 1)
        tag(block.score, queries, "length")
        key_names = {classes.of[block.score][d] for d in keys}
        tag(block.score, keys, "length" if key_names <= {classes.of[block.score][d] for d in queries} else "memory_length")
        tag(block.value, exclusive_output_dims(graph, value, 1), "d_kv")
        read = {access.tensor for access in score.inputs}
        for term in block.position_scores:
            op = ops[term]
            tag(term, head_dims(graph, op), "heads", "heads_inner")
            tag(term, [d.name for d in op.dims if d.kind == "reduction"], "d_kv")
            position = next((k for k, a in enumerate(a for a in op.inputs if not is_parameter(graph, a.tensor))
                             if a.tensor not in read), None)
            if position is not None:
                tag(term, exclusive_output_dims(graph, op, position), "relative_position")
        for index in block.position_proj:  # the relative-position table's width: the model's
            tag(index, [d.name for d in ops[index].dims if d.kind == "reduction"], "d_model")
        for index in (*block.q_proj, *block.k_proj, *block.v_proj):
            tag(index, output_side_dims(graph, ops[index])[:1], "qkv")
            tag(index, reduction_side_dims(graph, ops[index])[:1], "d_model")
        for index in block.out_proj:
            tag(index, output_side_dims(graph, ops[index])[:1], "d_model")
    for block in model.mlps:
        for index in block.fc1:
            tag(index, output_side_dims(graph, ops[index])[:1], "d_ff")
        tag(block.fc2, reduction_side_dims(graph, ops[block.fc2])[:1], "d_ff")
        tag(block.fc2, output_side_dims(graph, ops[block.fc2])[:1], "d_model")
    if model.token_embedding is not None:
        rows = embedding_rows_dim(graph, ops[model.token_embedding])
        if rows is not None:
            tag(model.token_embedding, [rows], "vocab")
    if model.lm_head is not None:
        tag(model.lm_head, output_side_dims(graph, ops[model.lm_head])[:1], "vocab")
    return names


def dimension_names(graph: OpGraph) -> tuple[DimClasses, tuple[str, ...]]:
    """The dimension classes of ``graph`` and a Mesh-TF name for each (see module docstring).

    Transformer names are shared by the classes of every layer; other names are unique. Kept per graph
    (:data:`_NAMES`): the search's Mesh-TF families ask once per mesh size of every stage model
    (:func:`default_layouts`), and naming a 96-layer graph reads every op (issue 22, fifteenth round).
    """
    return _NAMES.get((graph,), lambda: _dimension_names(graph))


def _dimension_names(graph: OpGraph) -> tuple[DimClasses, tuple[str, ...]]:
    """:func:`dimension_names`, computed."""
    model = _model(graph)
    classes, roles = _term_classes(graph, model) if model is not None else (dim_classes(graph), {})
    roles |= _role_names(graph, model, classes) if model is not None else {}
    names: list[str] = []
    batch = batch_dim_label(graph)
    used: set[str] = set(roles.values()) | {batch}
    for cid, members in enumerate(classes.members):
        op_index, dim_name = members[0]
        if any(graph.ops[i].dim(d).is_batch for i, d in members):
            names.append(batch)
            continue
        if cid in roles:
            names.append(roles[cid])
            continue
        base = re.sub(r"\W", "_", f"{dim_name}_{graph.ops[op_index].dim(dim_name).size}")
        name, k = base, 2
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        names.append(name)
    return classes, tuple(names)


def batch_dim_label(graph: OpGraph) -> str:
    """The Mesh-TF name of the graph's batch dims: ``batch`` when they are its samples, else the file's own name of
    the dim (a GNN's ``nodes``, which the import found read across by indices from another input:
    :attr:`~planner.core.graph.BatchCoupling.dim`), so a layout never calls a dim that is not a sample dim ``batch``
    (the layouts still place it on the mesh dim ``b``: :func:`is_batch_name`).

    Examples
    --------
    >>> from planner.core.graph import BatchCoupling, OpGraph
    >>> gnn = BatchCoupling(op="gather", kind="indexed", reason="reads across 'nodes'", dim="nodes")
    >>> batch_dim_label(OpGraph(name="gat", ops=(), tensors={}, edges=(), batch_coupled=(gnn,)))
    'nodes'
    >>> batch_dim_label(OpGraph(name="mlp", ops=(), tensors={}, edges=()))
    'batch'
    """
    found = next((c.dim for c in graph.batch_coupled if c.kind == "indexed" and c.dim), "")
    label = re.sub(r"\W", "_", found)
    return label if label and not label.startswith("batch") else "batch"


def is_batch_name(name: str, label: str) -> bool:
    """Whether a dimension name is one of the batch classes' (``batch``, ``batch_2``..., or the graph's
    :func:`batch_dim_label`), which the layouts place on the mesh dim ``b``, as before the label existed."""
    return name.startswith("batch") or name == label


_NAMES: IdentityMemo[tuple[DimClasses, tuple[str, ...]]] = IdentityMemo(size=16)
""":func:`dimension_names` of the graphs asked last (a pipeline search alternates between the graphs of a dozen
micro-batch sizes); the classes and names are read, never changed, by every caller."""


@dataclass(frozen=True, slots=True)
class OpNaming:
    """The ops of a graph grouped for :func:`mesh_tf_masks`: ops whose dims carry the same names and
    whose spaces share their tables get the same mask (a layer's ops repeat in every layer)."""

    groups: tuple[tuple[int, tuple[str, ...]], ...]
    """Per group: its first op and the name of each of that op's dims."""
    group_of: tuple[int, ...]
    """Per op: its group."""

    @staticmethod
    def build(graph: OpGraph, spaces: Sequence[ConfigSpace]) -> "OpNaming":
        classes, names = dimension_names(graph)
        found: dict[tuple, int] = {}
        groups, group_of = [], []
        for index, (op, space) in enumerate(zip(graph.ops, spaces)):
            dim_names = tuple(names[classes.of[index][d.name]] for d in op.dims)
            key = (space.table_key, op.dims, dim_names)
            if key not in found:
                found[key] = len(groups)
                groups.append((index, dim_names))
            group_of.append(found[key])
        return OpNaming(groups=tuple(groups), group_of=tuple(group_of))


def mesh_tf_masks(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    *,
    mesh_shape: Mapping[str, int],
    layout: Mapping[str, str],
    naming: OpNaming | None = None,
) -> list[np.ndarray] | None:
    """Per op, the configurations that a Mesh-TF mesh and layout produce (one per op at most).

    Parameters
    ----------
    mesh_shape:
        Mesh dim -> size, e.g. ``{"b": 4, "m": 2}``.
    layout:
        Dimension name (from :func:`dimension_names`) -> mesh dim, e.g. ``{"batch": "b"}``.
    naming:
        ``OpNaming.build(graph, spaces)``, when the caller asks for many layouts of one graph.

    Returns
    -------
    list of numpy.ndarray or None
        ``None`` when some op cannot be laid out so (a dim not divisible, two of its dims on one
        mesh dim, an unsplittable dim).
    """
    naming = naming if naming is not None else OpNaming.build(graph, spaces)
    group_masks = []
    for index, dim_names in naming.groups:
        op, space = graph.ops[index], spaces[index]
        want = []
        axes_used: set[str] = set()
        for dim, name in zip(op.dims, dim_names):
            axis = layout.get(name)
            size = mesh_shape.get(axis, 1) if axis is not None else 1
            if size > 1:
                if axis in axes_used or not dim.splittable or dim.size % size:
                    return None
                axes_used.add(axis)
            want.append(size)
        mask = np.all(space.factors == np.array(want, dtype=np.int64).reshape(1, -1), axis=1)
        if not mask.any():
            return None
        mask.flags.writeable = False  # shared by every op of the group
        group_masks.append(mask)
    return [group_masks[group] for group in naming.group_of]


def default_layouts(graph: OpGraph, *, devices: int) -> list[tuple[dict[str, int], dict[str, str]]]:
    """Candidate ``(mesh_shape, layout)`` pairs: ``b`` for the batch, ``m`` for heads, d_ff and vocab.

    The model-parallel names follow Mesh-TF's transformer defaults
    (``batch:batch,d_ff:model,heads:model,vocab:model``), leaving out a name whose sizes do not
    divide by the ``m`` size; graphs without a transformer get data parallelism only.
    """
    classes, names = dimension_names(graph)
    label = batch_dim_label(graph)
    batch_names = sorted(n for n in set(names) if n in ("batch", label) or n.startswith("batch_"))
    sizes: dict[str, set[int]] = {}
    for cid, name in enumerate(names):
        sizes.setdefault(name, set()).update(graph.ops[i].dim(d).size for i, d in classes.members[cid])
    batch = graph_batch_size(graph)
    result = []
    for dp in divisors(devices):
        mp = devices // dp
        # A name whose size does not divide (a vocabulary of 50257) stays unsplit.
        model_names = [n for n in ("heads", "d_ff", "vocab") if n in sizes and all(s % mp == 0 for s in sizes[n])]
        if batch % dp or (mp > 1 and not model_names):
            continue
        mesh = {name: size for name, size in (("b", dp), ("m", mp)) if size > 1} or {"b": 1}
        rules = {n: "b" for n in batch_names} if dp > 1 else {}
        if mp > 1:
            rules.update({n: "m" for n in model_names})
        result.append((mesh, rules))
    return result


def _format(pairs: Mapping[str, Any]) -> str:
    return ";".join(f"{k}:{v}" for k, v in pairs.items())


def _check_settings(plan_input: PlanInput) -> None:
    """Refuse what Mesh-TF has no form for: pipeline stages, ZeRO sharding and expert parallelism."""
    if plan_input.pipeline is not None and plan_input.pipeline.pp > 1:
        raise UnsupportedExport(
            f"Mesh-TensorFlow has no pipeline parallelism (the plan has pp={plan_input.pipeline.pp} stages); plan "
            "with --pp 1"
        )
    if plan_input.settings.zero_stage > 0:
        raise UnsupportedExport(
            f"Mesh-TensorFlow has no ZeRO sharding (the plan uses ZeRO-{plan_input.settings.zero_stage}); plan with --zero 0"
        )
    if plan_input.settings.expert_parallel > 1:
        raise UnsupportedExport(
            f"the Mesh-TensorFlow export has no expert parallelism (the plan splits experts ep={plan_input.settings.expert_parallel} "
            "ways); pick an ep=1 row or export with --target megatron or deepspeed"
        )


def _refuse_past_table(graph: OpGraph) -> None:
    """Refuse, in one line, a sequence past a learned position table (:mod:`importers.position_table`).

    The ONNX model cannot look its positions up, and Mesh-TensorFlow's transformer, the model a layout
    is written for, learns one ``max_length``-row table: ``Unitransformer(max_length=...,
    positional_embedding=True)`` builds ``embedding_weights(mesh, max_length_dim, model_dim, ...)`` and
    slices the sequence's rows from it (tensorflow/mesh ``mesh_tensorflow/transformer/transformer.py``,
    ``Unitransformer.__init__`` and ``_call_internal``, commit 01231bb0), so training this sequence
    needs ``max_length`` past the file's rows: another model, as Megatron-LM's
    ``--max-position-embeddings`` would be.

    Raises
    ------
    UnsupportedExport
        ``"Mesh-TensorFlow would train a different model: its learned position table has ..."``
        (:func:`importers.transformer.shortfall`).
    """
    table = too_short(position_tables(graph))
    if table is not None:
        raise UnsupportedExport("Mesh-TensorFlow would train a different model: " + shortfall(
            table, f", and Mesh-TensorFlow's Unitransformer would learn a {table.tokens}-row table (max_length)"
        ) + ELSEWHERE)


def _name_factors(plan_input: PlanInput, classes: DimClasses, names: tuple[str, ...]) -> dict[str, tuple[int, int, str]]:
    """Each dimension name's split factor, with the first op (index) and dim that split it so; refused
    when one op splits a name it carries twice, or two ops split a name differently."""
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    per_op: list[list[tuple[str, str, int]]] = []
    for index, (op, space, row) in enumerate(zip(graph.ops, spaces, choice)):
        factors = dict(zip(space.dim_names, space.factors[row].tolist()))
        entries = [(names[classes.of[index][d.name]], d.name, int(factors.get(d.name, 1))) for d in op.dims]
        by_name: dict[str, list[tuple[str, int]]] = {}
        for name, dim, factor in entries:
            by_name.setdefault(name, []).append((dim, factor))
        for name, dims in by_name.items():
            if len(dims) > 1 and any(f > 1 for _, f in dims):
                raise UnsupportedExport(
                    f"op {op.name} has two dims named '{name}' ({', '.join(d for d, _ in dims)}) and splits one of "
                    "them; Mesh-TF lays out a dimension name once per tensor"
                )
        per_op.append(entries)
    factor_of: dict[str, tuple[int, int, str]] = {}
    for index, entries in enumerate(per_op):
        for name, dim, factor in entries:
            if name not in factor_of:
                factor_of[name] = (factor, index, dim)
                continue
            first, other_index, other_dim = factor_of[name]
            if first != factor:
                raise UnsupportedExport(
                    f"ops {graph.ops[other_index].name} ({other_dim} split {first}) and {graph.ops[index].name} ({dim} "
                    f"split {factor}) disagree on dimension '{name}'; Mesh-TF splits a dimension name the same way everywhere"
                )
    return factor_of


def _mesh_and_rules(
    graph: OpGraph, classes: DimClasses, names: tuple[str, ...], factor_of: dict[str, tuple[int, int, str]]
) -> tuple[dict[str, int], dict[str, str]]:
    """The mesh (axis -> size) and layout rules (name -> axis): split names of one factor share an
    axis unless some op carries both; batch names go to ``b``, the rest to ``m``, ``m2``, ..."""
    label = batch_dim_label(graph)
    split = sorted(
        (name for name, (f, _, _) in factor_of.items() if f > 1),
        key=lambda n: (not is_batch_name(n, label), -factor_of[n][0], n),
    )
    together: dict[str, set[str]] = {name: set() for name in split}
    for index in range(len(graph.ops)):
        here = {names[cid] for cid in classes.of[index].values()} & set(split)
        for name in here:
            together[name] |= here - {name}
    axes: list[tuple[int, list[str]]] = []
    for name in split:
        factor = factor_of[name][0]
        for size, members in axes:
            if size == factor and not (together[name] & set(members)):
                members.append(name)
                break
        else:
            axes.append((factor, [name]))
    mesh: dict[str, int] = {}
    rules: dict[str, str] = {}
    model_axes = 0
    for size, members in axes:
        if any(is_batch_name(n, label) for n in members) and "b" not in mesh:
            axis = "b"
        else:
            model_axes += 1
            axis = "m" if model_axes == 1 else f"m{model_axes}"
        mesh[axis] = size
        for name in members:
            rules[name] = axis
    if not mesh:
        mesh = {"b": 1}
    return mesh, rules


def _dimensions(graph: OpGraph, classes: DimClasses, names: tuple[str, ...], rules: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each dimension name's sizes, mesh axis and up to three op dims it stands for."""
    dimensions: dict[str, dict[str, Any]] = {}
    for cid, name in enumerate(names):
        entry = dimensions.setdefault(name, {"sizes": set(), "mesh_dim": rules.get(name), "examples": []})
        for i, d in classes.members[cid]:
            entry["sizes"].add(graph.ops[i].dim(d).size)
            if len(entry["examples"]) < 3:
                entry["examples"].append(f"{graph.ops[i].name}.{d}")
    for entry in dimensions.values():
        entry["sizes"] = sorted(entry["sizes"])
    return dimensions


def _notes(settings: TrainingSettings) -> list[str]:
    """How to name the model's dims, device order, and the optimizer, recomputation and precision to set."""
    notes = [
        "name the dimensions of your Mesh-TF model as in 'dimensions' (each lists op dims it stands for)",
        "devices are assumed listed node by node, so the first mesh dim spans nodes",
        f"train with {'SGD' if settings.optimizer == 'sgd' else 'Adam'} (as planned)",
    ]
    if settings.recompute != "none":
        notes.append("wrap the recomputed layers in mtf.recompute_grad (Mesh-TF has no global recompute flag)")
    if settings.precision == "bf16-mixed":
        notes.append("set activation_dtype to bfloat16 (bf16-mixed precision)")
    return notes


def export_mesh_tf(plan_input: PlanInput) -> dict[str, Any]:
    """The Mesh-TF mesh shape and layout of a strategy, or :class:`UnsupportedExport` with the reason.

    Returns
    -------
    dict
        ``target``, ``mesh_shape``, ``layout``, ``devices``, ``gin`` (two gin bindings),
        ``dimensions`` (each name's sizes, mesh dim and example op dims) and ``notes``.
    """
    graph = plan_input.graph
    _check_settings(plan_input)
    refuse_fp8(plan_input.settings, "meshtf")
    _refuse_past_table(graph)
    classes, names = dimension_names(graph)
    mesh, rules = _mesh_and_rules(graph, classes, names, _name_factors(plan_input, classes, names))
    devices = math.prod(mesh.values())
    if devices > plan_input.cluster.devices:
        raise UnsupportedExport(
            f"the layout needs a mesh of {devices} devices ({_format(mesh)}) but the cluster has {plan_input.cluster.devices}"
        )
    mesh_shape, layout = _format(mesh), _format(dict(sorted(rules.items())))
    validate_mesh_tf(mesh_shape, layout, devices=devices, tensors=_tensors(graph, classes, names))
    return {
        "target": "meshtf",
        "mesh_shape": mesh_shape,
        "layout": layout,
        "devices": devices,
        "gin": (
            f'utils.run.mesh_shape = "{mesh_shape.replace(";", ",")}"\n'
            f'utils.run.layout_rules = "{layout.replace(";", ",")}"'
        ),
        "dimensions": _dimensions(graph, classes, names, rules),
        "time_s": float(plan_input.strategy.time_s),
        "memory_bytes": float(plan_input.strategy.memory_bytes),
        "notes": _notes(plan_input.settings),
    }


def _tensors(graph: OpGraph, classes: DimClasses, names: tuple[str, ...]) -> list[MeshTensor]:
    """Every operand of every op as Mesh-TF sees it: the name of each axis's outer dim (a name that
    repeats in one tensor gets ``memory_`` prefixed, never laid out: see :func:`export_mesh_tf`)."""
    tensors = []
    for index, op in enumerate(graph.ops):
        for access in (*op.inputs, *op.outputs):
            tensor = graph.tensors.get(access.tensor)
            if tensor is None or len(tensor.shape) != len(access.axes):
                continue
            dims: list[str | None] = []
            for axis in access.axes:
                name = names[classes.of[index][axis[0]]] if axis else None
                # Mesh-TF needs distinct names in one tensor: keys are the "memory" length
                # (queries x keys scores), as in mtf.transformer.
                while name is not None and name in dims:
                    name = f"memory_{name}"
                dims.append(name)
            tensors.append(MeshTensor(name=f"{op.name}:{access.tensor}", dims=tuple(dims), shape=tensor.shape))
    return tensors
