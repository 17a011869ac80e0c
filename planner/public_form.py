"""A strategy in its public form (:func:`planner.core.strategy.public_form`: per op its split
factors, inter-node parts and copies) priced again (:func:`evaluate`), and the configurations an op
may take (:func:`op_configurations`), each naming exactly one row of its configuration space.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from planner.core.configs import ConfigSpace
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.core.strategy import OpLayout, Strategy, layout_of, public_form
from planner.plan_types import PlanRequest
from planner.pricing import build_model

__all__ = ["evaluate", "op_configurations"]


def evaluate(
    graph: OpGraph,
    request: PlanRequest,
    splits: Strategy | Mapping[str, Mapping[str, int]],
    inter_splits: Mapping[str, Mapping[str, int]] | None = None,
    replicas: Mapping[str, int] | None = None,
) -> Strategy:
    """Price a strategy given in its public form (:func:`planner.core.strategy.public_form`).

    Parameters
    ----------
    splits:
        A :class:`Strategy` (its ``splits``, ``inter_splits`` and ``replicas`` are read, never its
        ``choice``), or ``{op name: {dim: factor}}`` (missing ops and dims: 1).
    inter_splits:
        ``{op name: {dim: inter-node part of its factor}}``: given, every op's placement is fixed
        (missing ops and dims: 1, inside one node); ``None``: any placement.
    replicas:
        ``{op name: redundant copies}``: given, every op's copies are fixed (missing ops: run once);
        ``None``: any number of copies.

    Each op must match exactly one configuration. A returned strategy's public form always does,
    so ``evaluate(graph, request, point.strategy)`` gives its ``time_s`` and ``memory_bytes``
    exactly; plain ``splits`` do where no op has several placements or copies of its split.

    Raises
    ------
    InputError
        An unknown op or dim, a split that is not a configuration, or one that several
        configurations share (the message lists them and says what to pass).
    """
    if isinstance(splits, Strategy):
        if inter_splits is not None or replicas is not None:
            raise InputError("pass a strategy alone or plain splits with inter_splits and replicas, not both")
        splits, inter_splits, replicas = splits.splits, splits.inter_splits, splits.replicas
    model = build_model(graph, request)
    names = {op.name: i for i, op in enumerate(graph.ops)}
    for what, given in (("splits", splits), ("inter_splits", inter_splits or {}), ("replicas", replicas or {})):
        for name in given:
            if name not in names:
                raise InputError(f"no op called '{name}' in {graph.name} ({what}); see `planner inspect --json` for names")
    choice = [0] * len(graph.ops)
    # the named ops first, so a split that is no configuration is reported before another op's ambiguity
    for index in [names[n] for n in splits] + [i for i, op in enumerate(graph.ops) if op.name not in splits]:
        name = graph.ops[index].name
        choice[index] = _row_of(
            model.tables.configs[index], name, request, factors=dict(splits.get(name, {})),
            inter=None if inter_splits is None else dict(inter_splits.get(name, {})),
            copies=None if replicas is None else int(replicas.get(name, 1)),
        )  # fmt: skip
    form = public_form([op.name for op in graph.ops], model.tables.configs, choice)
    return dataclasses.replace(model.strategy(choice), replicas=form.replicas)


def _row_of(
    space: ConfigSpace,
    name: str,
    request: PlanRequest,
    *,
    factors: Mapping[str, int],
    inter: Mapping[str, int] | None = None,
    copies: int | None = None,
) -> int:
    """The one row of ``space`` with split ``factors`` (missing dims: 1), inter-node parts ``inter``
    (``None``: any placement) and ``copies`` redundant copies (``None``: any number)."""
    for dim in [*factors, *(inter or {})]:
        if dim not in space.dim_names:
            raise InputError(f"op '{name}' has no dim '{dim}'; its dims are {', '.join(space.dim_names) or 'none'}")

    def per_dim(parts: Mapping[str, int]) -> np.ndarray:
        return np.array([int(parts.get(n, 1)) for n in space.dim_names], dtype=np.int64)

    match = np.all(space.factors == per_dim(factors), axis=1)
    if inter is not None:
        match &= np.all(space.inter_factors == per_dim(inter), axis=1)
    if copies is not None:
        match &= space.replica_counts == copies
    rows = np.flatnonzero(match)
    if rows.size == 1:
        return int(rows[0])
    asked = f"{dict(factors)}" + (f" with inter-node parts {dict(inter)}" if inter else "") + (
        f" as {copies} copies" if copies is not None and copies > 1 else "")
    where = f"on {request.cluster.devices} devices ({request.cluster.devices_per_node} per node)"
    if rows.size == 0:
        valid = "; ".join(str(layout_of(space, r)) for r in range(min(space.size, 6)))
        raise InputError(f"op '{name}' has no configuration {asked} {where}; valid ones include {valid}")
    shown = " | ".join(str(layout_of(space, r)) for r in rows[:4])
    raise InputError(
        f"op '{name}': {asked} is {rows.size} configurations {where} ({shown}); pass the strategy itself, "
        "evaluate(graph, request, strategy), or its inter_splits and replicas too"
    )


def op_configurations(graph: OpGraph, request: PlanRequest, op_name: str) -> list[OpLayout]:
    """The configurations of one op, as the request's cost model enumerates them: one
    :class:`~planner.core.strategy.OpLayout` (split factors, inter-node parts, copies) per row of
    its configuration space, in row order, so each names exactly one row.

    Raises :class:`InputError` when no op is called ``op_name``.
    """
    try:
        index = graph.op_index(op_name)
    except KeyError:
        raise InputError(f"no op called '{op_name}' in {graph.name}; see `planner inspect --json` for names") from None
    space = build_model(graph, request).tables.configs[index]
    return [layout_of(space, r) for r in range(space.size)]
