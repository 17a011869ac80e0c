"""PaSE's configurations keep every op's replicated configuration, even with dims below the cutoff.

A Conv with fewer input channels (3: RGB) or a batch smaller than the cutoff (4) used to get no
configuration at all under ``--cost pase`` ("op 0 has node tables of shapes (0,)"): a dim shorter
than the cutoff had no allowed factor, not even 1.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from objectives.cluster import make_cluster
from planner.plan import PlanRequest, build_model, plan
from tests.objectives.graphs import conv_graph

CUTOFF = 4  # PaSE's reference default (DESIGN.md section 5)


def _pase_rows(dims, devices: int) -> set[tuple[int, ...]]:
    """PaSE's rule by brute force: each factor divides its dim with dim / factor >= cutoff, or is 1;
    spatial and kernel dims unsplit; any product <= devices."""
    per_dim = []
    for d in dims:
        if d.kind == "spatial" or not d.splittable:
            per_dim.append([1])
        else:
            per_dim.append([e for e in range(1, d.size + 1) if d.size % e == 0 and (e == 1 or d.size // e >= CUTOFF)])
    return {combo for combo in itertools.product(*per_dim) if math.prod(combo) <= devices}


@pytest.mark.parametrize("devices", [8, 32])
@pytest.mark.parametrize(
    "shape",
    [
        dict(b=8, ci=3, co=32, h=32, w=32),  # RGB input: ci < cutoff
        dict(b=2, ci=16, co=8, h=8, w=8),  # batch < cutoff
        dict(b=1, ci=1, co=2, h=1, w=1, kernel=1, pad=0),  # every dim < cutoff: replicated only
        dict(b=16, ci=64, co=64, h=7, w=7),
    ],
)
def test_every_conv_keeps_its_replicated_configuration(shape: dict, devices: int) -> None:
    graph = conv_graph(**shape)
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices), cost_model="pase")
    model = build_model(graph, request)
    space = model.tables.configs[0]
    assert space.factors[0].tolist() == [1] * len(graph.ops[0].dims)
    assert {tuple(int(x) for x in row) for row in space.factors} == _pase_rows(graph.ops[0].dims, devices)
    result = plan(graph, request, with_targets=False)
    assert result.best is not None and np.isfinite(result.best.strategy.time_s)


def test_a_random_conv_network_plans_at_8_and_32_devices() -> None:
    """Seeded random conv shapes, many with a dim below the cutoff: every one plans."""
    rng = np.random.default_rng(17)
    for _ in range(12):
        shape = dict(
            b=int(rng.choice([1, 2, 3, 8])), ci=int(rng.choice([1, 3, 16])), co=int(rng.choice([2, 6, 32])),
            h=int(rng.choice([3, 7, 16])), kernel=int(rng.choice([1, 3])),
        )  # fmt: skip
        graph = conv_graph(w=shape["h"], **shape)
        for devices in (8, 32):
            request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices), cost_model="pase")
            space = build_model(graph, request).tables.configs[0]
            assert len(_pase_rows(graph.ops[0].dims, devices)) == space.size >= 1
