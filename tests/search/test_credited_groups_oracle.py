"""``planner.search.pipeline_bounds._credited_groups`` (each credited op's (class, mask) pair numbered at C speed
since the nineteenth round) against the op-by-op numbering before it: the same groups in the same order, so the
same states, credited activations and starts, on random stages whose ops share flat rows (a stack's layers), credit
tables (equal by content, not always by identity) and mask arrays, with one credited op and with many."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from planner.search.pipeline_bounds import _credited_groups


def _oracle_group(ops, kind, masks) -> np.ndarray:
    """The numbering as it was at 254fae9: a setdefault per credited op, in op order."""
    seen: dict[tuple[int, int], int] = {}
    return np.array([seen.setdefault((k, id(masks[op])), len(seen)) for op, k in zip(ops, kind)], dtype=np.int64)


def _case(seed: int):
    rng = np.random.default_rng(seed)
    rows = [int(rng.integers(1, 7)) for _ in range(int(rng.integers(1, 5)))]  # distinct flat rows (op shapes)
    starts = np.concatenate(([0], np.cumsum(rows)[:-1])).astype(np.int64)
    ops = int(rng.integers(1, 50))
    row_of = [int(rng.integers(len(rows))) for _ in range(ops)]
    total = int(sum(rows))
    flat = {name: rng.random(total) for name in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")}
    arrays = SimpleNamespace(offsets=starts[row_of], spaces=[SimpleNamespace(size=rows[r]) for r in row_of], flat=flat,
                             lazy={}, shared={}, twin_instances=())
    pools = [[rng.random(rows[r]) < 0.6 for _ in range(3)] for r in range(len(rows))]
    for pool in pools:
        for m in pool:
            m[0] = True
    masks = [pools[r][int(rng.integers(3))] for r in row_of]
    tables = [[rng.random(rows[r]) for _ in range(2)] for r in range(len(rows))]
    credited = sorted(rng.choice(ops, size=1 if seed % 5 == 0 else int(rng.integers(1, ops + 1)), replace=False).tolist())
    credit = {}
    for op in credited:
        table = tables[row_of[op]][int(rng.integers(2))]
        credit[op] = table.copy() if rng.random() < 0.3 else table  # equal by content: one class
    return arrays, masks, credit


@pytest.mark.parametrize("seed", range(60))
def test_the_groups_are_numbered_as_op_by_op(seed: int):
    arrays, masks, credit = _case(seed)
    ops, states, activations, starts, group = _credited_groups(arrays, masks, credit)
    _, kept_ops, kind = arrays.shared[("credit classes", id(credit))]
    want = _oracle_group(kept_ops, kind, masks)
    assert np.array_equal(group, want)
    assert ops.tolist() == sorted(credit)
    first = np.unique(want, return_index=True)[1]
    allowed = [np.flatnonzero(masks[kept_ops[i]]) for i in first]
    index = np.concatenate([arrays.offsets[kept_ops[i]] + a for i, a in zip(first, allowed)])
    flat = arrays.flat
    assert np.array_equal(states, flat["params_bytes"][index] + flat["grads_bytes"][index] + flat["optimizer_bytes"][index])
    taken = np.concatenate([credit[kept_ops[i]][a] for i, a in zip(first, allowed)])
    assert np.array_equal(activations, flat["activations_bytes"][index] - taken)
    assert np.array_equal(starts, np.concatenate(([0], np.cumsum([a.size for a in allowed])[:-1])).astype(np.int64))
