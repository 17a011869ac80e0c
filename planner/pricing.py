"""A model file as an op graph (:func:`load_graph`) and its per-op cost tables under a request
(:func:`build_model`): what every per-op search, :func:`planner.public_form.evaluate` and a saved
plan's explanation price with.

The pairwise redistribution tables grow with the product of two ops' configuration counts
(:func:`_edge_table_cells`): above :data:`_MAX_EDGE_TABLE_CELLS`, or a quarter of the planner's
memory ceiling (``--max-memory``), each op splits at most two of its dims, then one, and past that
the request is refused with what to change.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping

from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.plan_types import PlanRequest

__all__ = ["load_graph", "build_model", "measured_lookup"]


def load_graph(path: str | Path, dims: Mapping[str, int] | None = None) -> OpGraph:
    """Import an ONNX file as an op graph with the symbolic dims bound (``{"batch": 32}``)."""
    from importers import import_model
    from importers.moe import find_moe_layers
    from objectives.moe import routed_graph

    graph = import_model(path, dict(dims or {}))
    # MoE exports that gather whole expert weights per token: the experts read their weights
    # directly (objectives.moe.routed_graph), so the gathered copies are not priced as activations
    return routed_graph(graph, find_moe_layers(graph))


def measured_lookup(graph: OpGraph | None, request: PlanRequest) -> tuple[object | None, tuple[str, ...]]:
    """Under ``--cost measured``: the profile database's timing function for the request's device
    and its notes (whose timings they are); ``(None, ())`` under another cost model.

    Raises
    ------
    InputError
        ``--cost measured`` without a profile database.
    """
    if request.cost_model != "measured":
        return None, ()
    if request.profile_db is None:
        raise InputError(
            "--cost measured needs a profile database; run `planner profile MODEL` first and pass --profile-db FILE"
        )
    from objectives.profile import open_measured

    # the timings of the cluster's device when the database has them; the notes say whose they are
    lookup = open_measured(
        request.profile_db, graph, cluster_device=request.cluster.device.name, precision=request.settings.precision
    )
    return lookup.fn, tuple(lookup.notes)


def _config_options(request: PlanRequest) -> ConfigOptions:
    cluster = request.cluster
    pase = request.cost_model == "pase"
    rule = request.product_rule or ("at_most" if pase else "divides")
    min_tile = request.min_tile if request.min_tile is not None else (4 if pase else 1)
    return ConfigOptions(
        devices=cluster.devices,
        devices_per_node=cluster.devices_per_node,
        product_rule=rule,
        min_tile=min_tile,
    )


def build_model(graph: OpGraph, request: PlanRequest):
    """Price ``graph`` on the request's cluster: an ``objectives.tables.CostModel``."""
    from objectives.tables import build_cost_model

    measured, profile_notes = measured_lookup(graph, request)
    options = _config_options(request)
    notes: tuple[str, ...] = ()
    cells = _edge_table_cells(graph, options)
    # the tables share the planner's memory ceiling (--max-memory) with the search: a quarter of it
    from planner.core.units import format_bytes
    from planner.search.budget import default_max_memory_bytes

    ceiling = request.max_memory_bytes if request.max_memory_bytes is not None else default_max_memory_bytes()
    # (never below 1e7 cells, 80 MB: below that a ceiling cannot be kept by restricting splits)
    max_cells = min(_MAX_EDGE_TABLE_CELLS, max(10_000_000, int(ceiling / 4 / 8)))
    for split_dims in (2, 1):
        if cells <= max_cells or (options.max_split_dims is not None and options.max_split_dims <= split_dims):
            continue
        # Many devices and few, small dims: every op has tens of thousands of configurations and the
        # pairwise redistribution tables would not fit in memory. Megatron-style layouts split at
        # most two dims of an op (the batch and one model dim): keep those (one, if still too many).
        all_cells = cells
        options = dataclasses.replace(options, max_split_dims=split_dims)
        cells = _edge_table_cells(graph, options)
        notes = (
            f"each op splits at most {split_dims} of its dims: more splits would need {all_cells:.2g} redistribution "
            f"table cells on {request.cluster.devices} devices ({format_bytes(8 * all_cells)})",
        )
    if cells > max_cells:
        raise InputError(
            f"{graph.name} on {request.cluster.devices} devices needs {cells:.2g} redistribution table cells "
            f"(about {8 * cells / 2**30:.0f} GiB): its ops have too many ways to split; plan fewer devices (the "
            "model is too small to use them) or pass --global-batch to plan pipeline stages"
        )
    model = build_cost_model(
        graph,
        cluster=request.cluster,
        settings=request.settings,
        config_options=options,
        cost_model=request.cost_model,
        measured=measured,
    )
    notes = profile_notes + notes
    model = dataclasses.replace(model, notes=model.notes + notes) if notes else model
    if request.cost_model != "pase":
        from importers.moe import find_moe_layers
        from objectives.moe import price_moe

        # routed-experts layers: priced by the tokens each expert gets, experts split ep ways
        model = price_moe(model, find_moe_layers(graph), capacity_factor=request.settings.capacity_factor,
                          ep=request.settings.expert_parallel)
    return model


# Above this many cells (float64: 1.6 GB) the pairwise redistribution tables are not built with
# every split of every op (see build_model).
_MAX_EDGE_TABLE_CELLS = 200_000_000


def _edge_table_cells(graph: OpGraph, options: ConfigOptions) -> int:
    """Cells of the redistribution tables of ``graph`` under ``options`` (an upper bound: op pairs
    joined by several tensors share one table)."""

    sizes = [enumerate_configs(op, options).size for op in graph.ops]
    return sum(sizes[e.producer] * sizes[e.consumer] for e in graph.edges if e.producer != e.consumer)
