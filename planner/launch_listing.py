"""The table of a launchable frontier listed from its Pareto rows: the collapse of rows within a tolerance
(``--collapse``), each row's layout and what differs from the row above, the pick and its notes.

The collapse is a pass over a finished frontier: no search reads the tolerance (the launchers' searches,
the headroom search and the data-parallel baseline are the same at any ``--collapse``), so a frontier
keeps its uncollapsed Pareto rows (:class:`Listing`) and :func:`collapse_rows` lists them again at another
tolerance without searching (issue 22's levers, ``docs/PERFORMANCE.md``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from planner.core.cluster import Cluster
from planner.core.errors import InputError
from planner.launch_messages import measured_notes
from planner.pick import listed, pick_note, tie_pick
from planner.pipeline import PipelinePoint
from planner.repriced import execution_label

Row = Any
"""A ``planner.launchable.Row`` (that module imports this one)."""

__all__ = ["Listing", "collapse_rows", "described", "differences", "family_of", "listed_rows", "shown_label"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Listing:
    """What a frontier's table is listed from (:func:`collapse_rows`)."""

    pareto: tuple[Any, ...]
    """Every Pareto-optimal row, fastest first, before the collapse (``launchable.Row``; layouts not yet described)."""
    first_fit: int | None
    """Index in ``pareto`` of the fastest row within the limit, or of the tight pick (``None``: none)."""
    devices: int
    """The cluster's devices, which the tied pick's note compares a row's with."""
    notes: tuple[str, ...] = ()
    """The notes the listing wrote among the frontier's (the tied pick's, ``--cost measured``'s, the smaller mesh's)."""
    batch_dim: str | None = None
    """``--cost measured``: the model's batch dim, which the note on rows priced partly by the roofline names."""
    joined: Cluster | None = None
    """The smaller mesh whose pipelines joined the rows (``launchable._with_smaller_mesh``; ``None``: none)."""


def collapse_rows(frontier: Any, tolerance: float) -> Any:
    """``frontier`` (a ``launchable.LaunchFrontier``) listed at ``--collapse tolerance`` from its Pareto rows,
    without a search: the same rows, pick, fastest row and notes as a search at that tolerance, the notes the
    listing writes last. Headroom, baseline, counters and the other notes are the frontier's own.

    Raises :class:`InputError` on a tolerance outside ``[0, 1)``; :class:`ValueError` on a frontier that kept
    no Pareto rows (``planner.research``'s)."""
    if not (0 <= tolerance < 1):
        raise InputError(f"--collapse must be at least 0 and below 1 (got {tolerance}), e.g. --collapse 0.01")
    listing: Listing | None = frontier.listing
    if listing is None:
        if not frontier.rows:
            return dataclasses.replace(frontier, collapse=tolerance)
        raise ValueError("this frontier kept no Pareto rows to list again (only the launchable search's do)")
    rows, chosen, exact, note = listed_rows(listing.pareto, listing.first_fit, tolerance, listing.devices)
    written = ([note] if note else []) + (measured_notes(rows, listing.batch_dim) if listing.batch_dim else [])
    joined = [row for row in rows if listing.joined is not None and row.cache.cluster == listing.joined]
    if joined:
        written.append(_joined_note(len(joined), listing.joined, listing.devices))
    kept_notes = [n for n in frontier.notes if n not in listing.notes]
    return dataclasses.replace(
        frontier, rows=tuple(rows), chosen=chosen, fastest=None if exact == chosen else exact, collapse=tolerance,
        collapsed=len(listing.pareto) - len(rows), notes=(*kept_notes, *written),
        listing=dataclasses.replace(listing, notes=tuple(written)),
    )  # fmt: skip


def _joined_note(count: int, joined: Cluster, devices: int) -> str:
    """The note on ``count`` listed rows that are pipelines of the smaller mesh ``joined`` of ``devices``."""
    return (f"pipelines on {joined.devices} of the {devices} devices searched too "
            f"({count} row{'s' if count != 1 else ''} listed): a plan on fewer devices launches on that many")


def family_of(point: PipelinePoint, targets: Sequence[str], devices_per_node: int, memo: dict):
    """The family of the first of ``targets`` that holds the point's per-op choice (``None``: none)."""
    from exporters.targets import TARGETS

    for name in targets:
        if not TARGETS[name].restricts:
            continue  # the generic plan runs every choice: it has no families to name a layout
        key = (name, id(point.graph), tuple(map(id, point.spaces)), point.pp, point.dp, point.tp)
        if key not in memo:
            memo[key] = TARGETS[name].pipeline_families(
                point.graph, point.spaces, devices=point.devices_per_stage,
                devices_per_node=devices_per_node, pp=point.pp, degrees=(point.dp, point.tp),
            )  # fmt: skip
        for family in memo[key]:
            if all(mask[c] for mask, c in zip(family.masks, point.choice)):
                return family
    return None


def row_layout(row: Row, memo: dict) -> str:
    """The family of the row's first launcher that holds its per-op choice, by label, with its
    expert parallelism (the families name a stage's dp x cp x tp only)."""
    family = family_of(row.point, row.targets, row.cache.cluster.devices_per_node, memo)
    if family is not None:
        label = shown_label(family.label)
    elif "generic" in row.targets:  # a per-op plan: its dominant degrees and how uniform it is
        from planner.families import describe_choice

        label = describe_choice(row.point.graph, row.point.spaces, row.point.choice)
    else:
        label = dataclasses.replace(row.degrees, pp=1, ep=1).label()
    return label if row.degrees.ep == 1 else f"{label} x ep={row.degrees.ep}"


def shown_label(label: str) -> str:
    """A family's label as the table shows it: degrees of 1 left out, as :meth:`Degrees.label` leaves
    them (``"dp=8 x tp=1"`` -> ``"dp=8"``, ``"dp=1 x tp=4 sp"`` -> ``"tp=4 sp"``); the families keep
    theirs, which the exporters name them by.

    >>> shown_label("dp=8 x tp=1"), shown_label("dp=1 x tp=4 sp"), shown_label("dp=1 x tp=1"), shown_label("dp=2 x cp=2 x tp=1")
    ('dp=8', 'tp=4 sp', '1 device', 'dp=2 x cp=2')
    """
    return " x ".join(part for part in label.split(" x ") if part not in ("dp=1", "cp=1", "tp=1")) or "1 device"


def differences(above: Row, row: Row) -> str:
    """What changes from ``above`` to ``row``, in the table's words."""
    a, b = above.point, row.point
    changes = []
    if a.pp != b.pp:  # the layout names a stage's dp x cp x tp only
        changes.append(f"pp={b.pp}")
    if above.layout != row.layout:
        if row.layout.startswith(above.layout):
            changes.append("+" + row.layout[len(above.layout):].strip())
        elif above.layout.startswith(row.layout):
            changes.append("-" + above.layout[len(row.layout):].strip())
        else:
            changes.append(row.layout)
    if (a.micro_batch, a.micro_batches) != (b.micro_batch, b.micro_batches):
        changes.append(f"mb {b.micro_batch} x {b.micro_batches}")
    if a.zero_stage != b.zero_stage:
        changes.append(f"ZeRO-{b.zero_stage}")
    if above.cache.settings.dp_shard != row.cache.settings.dp_shard:
        changes.append("no hsdp" if row.cache.settings.dp_shard is None else f"hsdp {row.cache.settings.dp_shard}")
    if above.cache.settings.hpz_partition != row.cache.settings.hpz_partition:
        hpz = row.cache.settings.hpz_partition
        changes.append("no hpz" if hpz is None else f"hpz {hpz}")
    if a.recompute != b.recompute:
        changes.append(f"recompute {b.recompute}")
    if above.offload != row.offload:
        changes.append(f"offload {row.offload}")
    if (a.schedule, a.chunks) != (b.schedule, b.chunks):
        changes.append(f"{b.schedule} x {b.chunks}")
    if tuple(s.layers for s in a.stages) != tuple(s.layers for s in b.stages) and a.pp == b.pp:
        changes.append("layers " + "/".join(str(n) for n in b.layers_per_stage))
    if execution_label(above.execution) != execution_label(row.execution):
        changes.append(execution_label(row.execution))
    if above.cache.settings.precision_label != row.cache.settings.precision_label:
        changes.append(row.cache.settings.precision_label)
    # the same spaces objects (a ConfigSpace compares its arrays, so == between two builds is no test)
    same_spaces = len(a.spaces) == len(b.spaces) and all(x is y for x, y in zip(a.spaces, b.spaces))
    if not changes and a.graph is b.graph and same_spaces:
        moved = sum(x != y for x, y in zip(a.choice, b.choice))
        changes.append(f"{moved} op{'s' if moved != 1 else ''} placed otherwise")
    return ", ".join(changes) or "same layout"


def listed_rows(pareto: Sequence[Row], first_fit: int | None, collapse: float,
                devices: int) -> tuple[list[Row], int | None, int | None, str | None]:
    """``(rows, pick, fastest, note)``: the table's rows of ``pareto`` (collapsed, described), the
    indices among them of the pick and of the fastest that fits (``first_fit`` in ``pareto``; a tight
    pick where none fits) and the note on a tied pick (:mod:`planner.pick`; ``devices``: the cluster's)."""
    chosen = tie_pick(pareto, first_fit)
    kept = listed(pareto, (first_fit, chosen), collapse)
    rows = described([pareto[i] for i in kept])
    pick = None if chosen is None else kept.index(chosen)
    exact = None if first_fit is None else kept.index(first_fit)
    return rows, pick, exact, pick_note(rows, pick, exact, devices)


def described(rows: Sequence[Row]) -> list[Row]:
    """Each row with its layout and what differs from the row above."""
    memo: dict = {}
    laid = [dataclasses.replace(row, layout=row_layout(row, memo)) for row in rows]
    return [dataclasses.replace(row, differs="" if i == 0 else differences(laid[i - 1], row)) for i, row in enumerate(laid)]
