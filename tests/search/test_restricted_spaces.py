"""``planner.search.stage_restriction._Restricted.build``'s restricted spaces, one object per (space, mask) since the
nineteenth round, against each op's own ``space.subset(rows)`` (the form before): the same configurations, op by
op, on real spaces (:func:`planner.core.configs.enumerate_configs`) that ops share as a stack of layers does, under
masks that ops of one space share or not; and the tables restricted alike."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op
from planner.core.tables import EdgeCost
from planner.search.stage_restriction import _Restricted


def _space(sizes: tuple[int, ...], devices: int):
    dims = tuple(IterDim(name=f"d{i}", size=s, is_batch=i == 0) for i, s in enumerate(sizes))
    op = Op(name="op", kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=1.0, dims=dims)
    return enumerate_configs(op, ConfigOptions(devices=devices, devices_per_node=8, replicate=True))


def _case(seed: int):
    rng = np.random.default_rng(seed)
    devices = int(rng.choice([8, 16, 32]))
    spaces = [_space(shape, devices) for shape in [(64, 128), (32, 256, 512), (16, 8)]]
    ops = int(rng.integers(2, 30))
    of = [int(rng.integers(len(spaces))) for _ in range(ops)]
    mask_pool = [[rng.random(s.size) < 0.5 for _ in range(3)] for s in spaces]
    for pool in mask_pool:
        for m in pool:
            m[int(rng.integers(m.size))] = True  # every mask keeps a row
    masks = [mask_pool[g][int(rng.integers(3))] for g in of]
    columns = {g: [rng.random(spaces[g].size) for _ in range(7)] for g in set(of)}
    per_op = [columns[g] for g in of]
    edges = [EdgeCost(u=i, v=i + 1, time_s=rng.random((spaces[of[i]].size, spaces[of[i + 1]].size)))
             for i in range(ops - 1)]
    arrays = SimpleNamespace(
        key=tuple(of), spaces=tuple(spaces[g] for g in of), edges=tuple(edges),
        forward_s=[c[0] for c in per_op], backward_s=[c[1] for c in per_op], step_s=[c[2] for c in per_op],
        params_bytes=[c[3] for c in per_op], grads_bytes=[c[4] for c in per_op], optimizer_bytes=[c[5] for c in per_op],
        activations_bytes=[c[6] for c in per_op], model=SimpleNamespace(graph=SimpleNamespace(blocks=())),
    )
    return arrays, masks


@pytest.mark.parametrize("seed", range(30))
def test_each_ops_restricted_space_is_its_own_subset(seed: int):
    arrays, masks = _case(seed)
    found = _Restricted.build(arrays, masks)
    assert len(found.configs) == len(masks)
    for space, mask, got, rows in zip(arrays.spaces, masks, found.configs, found.index_maps):
        want = space.subset(np.flatnonzero(mask))
        assert np.array_equal(rows, np.flatnonzero(mask))
        assert got.dim_names == want.dim_names
        for a, b in ((got.factors, want.factors), (got.inter_factors, want.inter_factors),
                     (got.replica_counts, want.replica_counts), (got.inter_replica_counts, want.inter_replica_counts)):
            assert np.array_equal(a, b)
    for e, r in zip(arrays.edges, found.edges):
        assert np.array_equal(r.time_s, e.time_s[np.ix_(np.flatnonzero(masks[e.u]), np.flatnonzero(masks[e.v]))])
