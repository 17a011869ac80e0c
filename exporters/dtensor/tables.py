r"""Embedding tables in a DTensor plan: sharded row-wise or column-wise over every rank, the rest data-parallel.

``torch.distributed.tensor.parallel`` (torch 2.13, ``style.py``) shards an ``nn.Embedding`` two ways:

* ``RowwiseParallel``: the weight ``Shard(0)`` (each rank holds ``V / dp`` rows of the vocabulary);
  the indices must be replicated; an index outside the rank's rows is looked up as row 0 and zeroed
  (``_MaskPartial``), so the output is a partial sum, which ``output_layouts=Shard(0)`` reduce-scatters
  onto the batch;
* ``ColwiseParallel``: the weight ``Shard(1)`` (each rank holds ``D / dp`` of every row's width);
  replicated indices, the output ``Shard(-1)``, which ``output_layouts=Shard(0)`` redistributes onto
  the batch (an all-to-all).

A *table family* (``DtensorFamily.tables``) shards every table one of these ways over all ``dp`` ranks
of the mesh (``dp x 1``), as TorchRec's row-wise and column-wise shardings spread a table over the
world, and runs every other op data-parallel over the same ranks: per op, the table's lookup splits
its rows (``rowwise``) or its width (``colwise``) ``dp`` ways and nothing else, every other op its
batch ``dp`` ways (:func:`table_masks`). Each rank is fed the whole step's indices of every table
(``input_layouts`` Replicate) and its own slice of the other inputs: the planner prices a graph input
as loaded where an op reads it, not as communicated. The table's output reaches the batch-split ops
through the redistribution the planner prices on that edge.

What DTensor cannot run, refused with the reason (:func:`table_problem`):

* ``nn.EmbeddingBag`` (the ``EmbeddingBag*`` ops of :mod:`importers.embedding_bag`): both styles raise
  ``NotImplementedError`` for a module other than ``nn.Linear`` / ``nn.Embedding``, and a bag whose
  weight is a sharded DTensor fails in ``aten._embedding_bag``, which has no sharding strategy
  (checked with torch 2.13 on 2 gloo ranks, ``distribute_module`` with ``Shard(0)`` and ``Shard(1)``);
* table-wise sharding (each table whole on one rank, as TorchRec places small tables): a DTensor
  lives on one mesh with one placement per mesh dim (``Shard``, ``Replicate``, ``Partial``), none of
  which puts a tensor whole on one rank of the mesh, and a tensor on a one-rank sub-mesh cannot be
  redistributed to the ranks outside it. Not exported;
* ZeRO-3 (FSDP2): ``fully_shard`` at the root would take the tables, already DTensors sharded on the
  same ``dp`` mesh dim (:func:`refuses_settings`).

Gradients: a table shard's gradient is the sum over every rank's loss (the reduce-scatter's backward
gathers every rank's output gradient), where data parallelism averages; the plan scales it by
``1 / dp`` (``table_plan.gradient_scale``) so every parameter takes the same step as in one process.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from exporters._tp import MaskResult, pure_data_parallel_masks
from importers.transformer import embedding_rows_dim, is_parameter
from planner.core.configs import ConfigSpace
from planner.core.graph import Op, OpGraph

__all__ = [
    "TABLE_STYLES",
    "is_table_family",
    "refuses_settings",
    "table_ops",
    "table_problem",
    "table_split_dim",
    "table_rows_allowed",
    "table_masks",
    "read_table_style",
    "table_plan",
]

TABLE_STYLES = ("rowwise", "colwise")
"""``RowwiseParallel`` (the vocabulary split) and ``ColwiseParallel`` (the width split) of ``nn.Embedding``."""

_LABEL_SUFFIX = " tables"


def is_table_family(label: str) -> bool:
    """Whether a family label (``"dp=8 rowwise tables"``) is a table family's."""
    return label.endswith(_LABEL_SUFFIX)


def table_label(style: str) -> str:
    """The words a table family's label ends with, e.g. ``"rowwise tables"``."""
    return style + _LABEL_SUFFIX


def refuses_settings(zero_stage: int) -> bool:
    """A table family runs ZeRO-0 only (module docstring: FSDP2's root unit would hold the tables)."""
    return zero_stage != 0


def table_ops(graph: OpGraph) -> tuple[int, ...]:
    """Indices of the embedding lookups whose table is a trainable parameter."""
    return tuple(
        index
        for index, op in enumerate(graph.ops)
        if op.kind == "embedding" and op.inputs and is_parameter(graph, op.inputs[0].tensor)
    )


def table_problem(graph: OpGraph, ops: Sequence[int]) -> str | None:
    """Why the tables cannot be sharded by a DTensor plan (``None``: they can)."""
    if not ops:
        return "the model has no embedding table"
    for index in ops:
        op = graph.ops[index]
        if op.op_type.startswith("EmbeddingBag"):
            return (
                f"op {op.name} is an nn.EmbeddingBag, which DTensor (torch 2.13) cannot shard: RowwiseParallel and "
                "ColwiseParallel take nn.Linear and nn.Embedding only, and aten._embedding_bag has no sharding "
                "strategy; look the table up with nn.Embedding and pool it (the same values at a fixed pooling), "
                "or export with --target generic"
            )
        if len(op.inputs[0].axes) != 2:
            return f"op {op.name} reads a table of {len(op.inputs[0].axes)} dims; nn.Embedding's weight has 2"
        table = graph.parameter_aliases.get(op.inputs[0].tensor, op.inputs[0].tensor)
        if not op.module_path or table != f"{op.module_path}.weight":
            # the styles shard a module's own weight: an nn.Embedding looks its `weight` up in its forward
            return (
                f"op {op.name} looks table {table} up outside an nn.Embedding holding it as `weight` (module "
                f"{op.module_path or 'unknown'}); a DTensor plan shards nn.Embedding modules, named by their path "
                "(torch.onnx.export(..., dynamo=True) keeps it)"
            )
    return None


def table_split_dim(graph: OpGraph, op: Op, style: str) -> str | None:
    """The dim a style splits: the table's rows (``rowwise``) or its width (``colwise``)."""
    if style == "rowwise":
        return embedding_rows_dim(graph, op)
    width = op.inputs[0].axes[1]
    return width[0] if len(width) == 1 else None


def table_rows_allowed(graph: OpGraph, op: Op, space: ConfigSpace, *, style: str, dp: int) -> np.ndarray:
    """``(K,)`` bool: the lookup's configurations splitting :func:`table_split_dim` ``dp`` ways and
    nothing else (no batch split: every rank looks the whole step's indices up), on ``dp`` devices
    where the space places copies beyond the split."""
    dim = table_split_dim(graph, op, style)
    if dim is None or dim not in space.dim_names:
        return np.zeros(space.size, dtype=bool)
    want = np.array([dp if name == dim else 1 for name in space.dim_names], dtype=np.int64)
    mask = np.all(space.factors == want[None, :], axis=1)
    filled = mask & (space.devices_held == dp)  # the lookup runs on every rank of the mesh
    return filled if filled.any() else mask


def table_masks(graph: OpGraph, spaces: Sequence[ConfigSpace], *, dp: int, style: str) -> MaskResult:
    """Per op, the configurations of the table family ``style`` on ``dp`` ranks: each table's lookup
    split by the style, every other op data-parallel (``masks`` ``None`` with the reason otherwise)."""
    if style not in TABLE_STYLES:
        return MaskResult(masks=None, reason=f"unknown table style '{style}'; use {' or '.join(TABLE_STYLES)}")
    ops = table_ops(graph)
    problem = table_problem(graph, ops)
    if problem is not None:
        return MaskResult(masks=None, reason=problem)
    base = pure_data_parallel_masks(graph, spaces, dp=dp)
    if base.masks is None:
        return base
    masks = list(base.masks)
    for index in ops:
        op = graph.ops[index]
        mask = table_rows_allowed(graph, op, spaces[index], style=style, dp=dp)
        if not mask.any():
            what = "rows" if style == "rowwise" else "width"
            return MaskResult(masks=None, reason=f"op {op.name} cannot split its table's {what} {dp} ways ({style})")
        mask.flags.writeable = False
        masks[index] = mask
    return MaskResult(masks=masks)


def read_table_style(graph: OpGraph, spaces: Sequence[ConfigSpace], choice: Sequence[int]) -> str:
    """The style a strategy applies to its tables: the one whose dim the first split table splits
    (``""``: no table is split apart from its batch). A mix is caught by the family's masks."""
    for index in table_ops(graph):
        op, space = graph.ops[index], spaces[index]
        factors = dict(zip(space.dim_names, space.factors[choice[index]].tolist()))
        if op.inputs[0].axes and len(op.inputs[0].axes) == 2:
            for style in TABLE_STYLES:
                dim = table_split_dim(graph, op, style)
                if dim is not None and factors.get(dim, 1) > 1:
                    return style
    return ""


def table_plan(graph: OpGraph, ops: Sequence[int], style: str, *, dp: int, module_of) -> dict[str, Any]:
    """The ``table_plan`` section: the mesh dim, each table module's style (the JSON vocabulary of
    ``tp_plan``) and the gradient scale. ``module_of(op, what)`` names an op's module or refuses."""
    modules: dict[str, dict[str, Any]] = {}
    for index in ops:
        op = graph.ops[index]
        modules[module_of(op, f"{style} table")] = {
            "style": style,
            "input_layouts": [["replicate"]],  # the whole step's indices on every rank (module docstring)
            "output_layouts": [["shard", 0]],  # back to the batch shards of data parallelism
            "use_local_output": True,
        }
    return {"mesh_dim": "dp", "size": dp, "modules": modules, "gradient_scale": 1.0 / dp}
