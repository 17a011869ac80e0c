"""A launch target's configuration families on one pipeline stage, within the search's own masks.

Moved out of :mod:`planner.search.pipeline` (issue 22, sixth speed round) so that module stays under
the size bar; the search imports them from here. ``pricing`` is a
:class:`planner.search.pipeline.PipelinePricing` and ``rules`` a
:class:`planner.search.pipeline.TargetRules` (typed ``Any`` here: this module must not import the
search, which imports it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence, get_args

import numpy as np

from planner.core.settings import Recompute


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _TargetFamily:
    """A launch target's family on one stage, within the pipeline's own masks."""

    label: str
    tp: int | None
    masks: tuple[np.ndarray, ...]
    single: np.ndarray | None = None
    """The family's one plan when every op has one configuration in it (no DP to run)."""
    runs: frozenset[tuple[int, str]] | None = None
    """The ``(ZeRO stage, recompute)`` pairs its exporter runs it at under the search's settings
    (:func:`settings_runs`); ``None``: every pair."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _TargetFamilies:
    families: tuple[_TargetFamily, ...]
    union: tuple[np.ndarray, ...]
    """Per op, the configurations of any family (for the lower bounds; empty without families)."""


def target_families(
    pricing: Any, rules: Any, devices: int, batch: int, *, inside_node: bool,
    data_parallel: int | None,
) -> _TargetFamilies:
    """The configuration families ``rules`` runs on a ``devices``-device stage, each within the
    search's masks (``pricing.masks``); a family some op has no configuration of is dropped. Kept
    with the pair's models (``pricing.derived``)."""
    store = pricing.derived(devices, batch)
    key = ("families", rules.name, inside_node, data_parallel)
    if key not in store:
        base = pricing.masks(devices, batch, inside_node=inside_node, data_parallel=data_parallel)
        spaces = pricing.model(devices, batch, 0, "none", edges=False).tables.configs
        per_node = pricing.cluster.devices_per_node
        found = rules.families(
            pricing.graph(batch), spaces, devices=devices,
            devices_per_node=devices if devices < per_node else per_node,  # the stage's own nodes
            pp=pricing.cluster.devices // devices,
        )
        runs = settings_runs(rules, getattr(pricing, "settings", None), found, pricing.graph(batch))
        kept = [(family, ran) for family, ran in zip(found, runs) if ran is None or ran]
        store[key] = _intern_families([family for family, _ in kept], base, [ran for _, ran in kept])
    return store[key]


def settings_runs(rules: Any, settings: Any, found: Sequence[Any], graph: Any) -> list[frozenset[tuple[int, str]] | None]:
    """Per family of ``found``, the ``(ZeRO stage, recompute)`` pairs at which ``rules.settings_allows`` (its
    exporter's settings rules at the family's degrees, ``Target.settings_allows``) runs it under ``settings`` (the
    search's pricing settings: ``ep``, HSDP, offload, precision); ``None`` for each where the rules or the settings
    are not known. A family at a pair its exporter refuses is never priced: its plans, dropped from the table
    after the search, would prune the plans it runs (issue 22: torchtitan's ``tp = 2`` and ZeRO-0 plans at
    ``ep = 2``, DTensor's table families at ZeRO-3)."""
    allows = getattr(rules, "settings_allows", None)
    if allows is None or settings is None:
        return [None] * len(found)
    grid = {(zero, recompute): dataclasses.replace(settings, zero_stage=zero, recompute=recompute)
            for zero in (0, 1, 2, 3) for recompute in get_args(Recompute)}
    return [frozenset(pair for pair, at in grid.items() if allows(family, at, graph)) for family in found]


def _intern_families(found: Sequence[Any], base: Sequence[np.ndarray],
                     runs: Sequence[frozenset[tuple[int, str]] | None] | None = None) -> _TargetFamilies:
    interned: dict[bytes, np.ndarray] = {}  # equal masks as one array: tables stay shared

    def intern(mask: np.ndarray) -> np.ndarray:
        return interned.setdefault(mask.tobytes(), mask)

    # the layers' ops share their mask arrays (exporters and pricing memoise them): each distinct
    # pair is combined once, as ``(mask, rows allowed, its only row or -1)``
    combined: dict[tuple[int, int], tuple[np.ndarray, int, int]] = {}

    def combine(mask: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, int, int]:
        key = (id(mask), id(allowed))
        if key not in combined:
            both = intern(np.asarray(mask, dtype=bool) & allowed)
            count = int(both.sum())
            combined[key] = (both, count, int(both.argmax()) if count == 1 else -1)
        return combined[key]

    kept, codes = [], []
    base_ids = list(map(id, base))
    for family, ran in zip(found, runs or [None] * len(found)):
        # per op only (id, id) keys, at C speed; the pairs are combined once each, in the order
        # of their first op (so equal masks intern to the same array as op after op would)
        keys = list(zip(map(id, family.masks), base_ids))
        distinct = dict(zip(keys, zip(family.masks, base)))
        parts = {key: combine(mask, allowed) for key, (mask, allowed) in distinct.items()}
        if all(count for _, count, _ in parts.values()):
            number = {key: n for n, key in enumerate(parts)}  # each op's pair, numbered: the union's key below
            codes.append(np.fromiter(map(number.__getitem__, keys), dtype=np.int64, count=len(keys)))
            single = None
            if all(row >= 0 for _, _, row in parts.values()):
                rows_of = {key: row for key, (_, _, row) in parts.items()}
                single = np.fromiter(map(rows_of.__getitem__, keys), dtype=np.int64, count=len(keys))
            masks_of = {key: mask for key, (mask, _, _) in parts.items()}
            kept.append(_TargetFamily(label=family.label, tp=family.tp, masks=tuple(map(masks_of.__getitem__, keys)),
                                      single=single, runs=ran))
    unions: dict[tuple[int, ...], np.ndarray] = {}

    def union_of(masks: list[np.ndarray]) -> np.ndarray:
        key = tuple(id(m) for m in masks)
        if key not in unions:
            unions[key] = intern(np.logical_or.reduce(masks))
        return unions[key]

    union: list[np.ndarray] = []
    if kept and len(base):
        # an op's union reads only its pair of each family: each distinct column of pairs once, in the order of
        # its first op (so the unions intern as op after op would); per op, ~1,000 ops x every family's mask ids
        # in Python was 2 of 3.5 profiled s of this function on GPT-3 175B / 1,024 (issue 22, nineteenth round)
        _, first, inverse = np.unique(np.stack(codes), axis=1, return_index=True, return_inverse=True)
        of_column: list[np.ndarray] = [np.zeros(0, dtype=bool)] * len(first)
        for column in np.argsort(first, kind="stable").tolist():
            op = int(first[column])
            of_column[column] = union_of([f.masks[op] for f in kept])
        union = [of_column[column] for column in inverse.reshape(-1).tolist()]
    return _TargetFamilies(families=tuple(kept), union=tuple(union))
