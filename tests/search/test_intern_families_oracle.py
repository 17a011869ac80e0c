"""``planner.search.target_masks._intern_families`` against its form before the nineteenth round (the union of the
families' masks built op by op, kept below as the oracle): the same families, the same union values per op, and
the same sharing (which ops hold one union array, and which unions are a family's own mask array), on random
families whose masks the ops share as a stack of layers does, with masks equal by content but not by identity
(interned), and families some op has no row of (dropped)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np
import pytest

from planner.search.target_masks import _intern_families, _TargetFamilies, _TargetFamily


def _oracle(found: Sequence[Any], base: Sequence[np.ndarray], runs=None) -> _TargetFamilies:
    """The function as it was at 254fae9 (each op's union looked up by its families' mask ids, op after op)."""
    interned: dict[bytes, np.ndarray] = {}

    def intern(mask: np.ndarray) -> np.ndarray:
        return interned.setdefault(mask.tobytes(), mask)

    combined: dict[tuple[int, int], tuple[np.ndarray, int, int]] = {}

    def combine(mask: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, int, int]:
        key = (id(mask), id(allowed))
        if key not in combined:
            both = intern(np.asarray(mask, dtype=bool) & allowed)
            count = int(both.sum())
            combined[key] = (both, count, int(both.argmax()) if count == 1 else -1)
        return combined[key]

    kept = []
    base_ids = list(map(id, base))
    for family, ran in zip(found, runs or [None] * len(found)):
        keys = list(zip(map(id, family.masks), base_ids))
        distinct = dict(zip(keys, zip(family.masks, base)))
        parts = {key: combine(mask, allowed) for key, (mask, allowed) in distinct.items()}
        if all(count for _, count, _ in parts.values()):
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

    union = [union_of([f.masks[i] for f in kept]) for i in range(len(base))] if kept else []
    return _TargetFamilies(families=tuple(kept), union=tuple(union))


def _random_case(seed: int) -> tuple[list[SimpleNamespace], list[np.ndarray]]:
    """Ops in a few shape groups (one configuration count each); per group a few base mask arrays the ops
    share; families whose per-group masks are shared arrays, some equal by content to another's (not by id)."""
    rng = np.random.default_rng(seed)
    groups = int(rng.integers(1, 5))
    sizes = [int(rng.integers(1, 9)) for _ in range(groups)]
    ops = int(rng.integers(1, 40))
    group_of = [int(rng.integers(groups)) for _ in range(ops)]
    bases = [[rng.random(k) < 0.8 for _ in range(2)] for k in sizes]
    base = [bases[g][int(rng.integers(2))] for g in group_of]
    found = []
    for f in range(int(rng.integers(1, 6))):
        pool = [[rng.random(k) < rng.uniform(0.1, 0.7) for _ in range(int(rng.integers(1, 3)))] for k in sizes]
        if f and rng.random() < 0.4:  # content equal to the last family's, other arrays
            pool = [[m.copy() for m in masks] for masks in found[-1].pool]
        masks = tuple(pool[g][int(rng.integers(len(pool[g])))] for g in group_of)
        found.append(SimpleNamespace(label=f"f{f}", tp=f + 1, masks=masks, pool=pool))
    return found, base


def _sharing(families: _TargetFamilies) -> tuple:
    """Which ops share one union array, and which union arrays are some family's mask array at that op."""
    union = families.union
    first = {}
    partition = tuple(first.setdefault(id(u), i) for i, u in enumerate(union))
    owned = tuple(tuple(u is f.masks[i] for f in families.families) for i, u in enumerate(union))
    return partition, owned


@pytest.mark.parametrize("seed", range(120))
def test_the_families_and_their_union_are_the_oracles(seed: int):
    found, base = _random_case(seed)
    new, old = _intern_families(found, base), _oracle(found, base)
    assert [f.label for f in new.families] == [f.label for f in old.families]
    for a, b in zip(new.families, old.families):
        assert all(np.array_equal(x, y) for x, y in zip(a.masks, b.masks))
        assert (a.single is None) == (b.single is None) and (a.single is None or np.array_equal(a.single, b.single))
    assert len(new.union) == len(old.union)
    assert all(np.array_equal(x, y) for x, y in zip(new.union, old.union))
    assert _sharing(new) == _sharing(old)


def test_no_ops_and_no_families():
    assert _intern_families([], []).union == ()
    family = SimpleNamespace(label="f", tp=1, masks=())
    assert _intern_families([family], []).union == ()
