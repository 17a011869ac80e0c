"""Pinning degrees of a row the search lists keeps that row (h29i). An ``ep > 1`` search priced the families of
every ``dp x cp x tp``, also those whose ranks no launcher's expert parallelism borrows (one device, ``dp = 1``):
their points, which torchtitan does not run at ``ep = 2``, pruned every point it does, so ``--fix ep=2`` and
``--fix tp=1,ep=2`` listed nothing on DeepSeek-V3 (tiny, 8 devices) where ``--fix dp=8,tp=1,ep=2`` listed rows.

Oracles: the fully pinned ``dp=8, tp=1, ep=2`` search (a subset of the ``ep=2`` search's space: pins only remove
plans, so the wider table cannot be empty) and the ``ep=2`` table itself: each single pin and pair of pins taken
from its fastest row's degrees returns a table holding that row (a row on the frontier of a space stays on the
frontier of any subspace holding it). Pipelines are left out (``pipeline_sizes=(1,)``) to keep the searches short;
the families' rule does not depend on them.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file
from planner.plan import PlanRequest

FILE = Path(__file__).resolve().parents[2] / "tests" / "data" / "megatron_moe" / "deepseek_v3_megatron_ts_consts.onnx"
DIMS = {"batch": 16, "seq": 64}


def _rows(**pinned: int) -> list:
    """The torchtitan table of :data:`FILE` on 8 A100s at ``ep = 2`` with ``pinned`` (no CUDA graphs, one stage,
    uncut, uncollapsed)."""
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8), time_limit_s=1e6)
    pins = Pins(cuda_graphs="off", ep=2, **pinned)
    _, (found,) = plan_launchable_file(FILE, DIMS, [request], launchers=["torchtitan"], collapse=0.0, pins=pins,
                                       pipeline_sizes=(1,))
    return [row for row in found.rows if "torchtitan" in row.targets]


def _key(row) -> tuple:
    point = row.point
    return (row.degrees, point.zero_stage, point.recompute, point.micro_batch, point.micro_batches)


def _holds(rows: list, wanted) -> bool:
    return any(_key(row) == _key(wanted) and math.isclose(row.time_s, wanted.time_s, rel_tol=1e-9)
               and math.isclose(row.memory_bytes, wanted.memory_bytes, rel_tol=1e-9) for row in rows)


@pytest.fixture(scope="module")
def expert_rows() -> list:
    return _rows()


def test_a_runnable_expert_plan_is_listed_without_the_dp_pin(expert_rows):
    assert _rows(dp=8, tp=1)  # torchtitan runs dp=8, tp=1 at ep=2 (tests/integration/test_torchtitan_deepseek_moe.py)
    assert expert_rows, "--fix ep=2 listed nothing where --fix dp=8,tp=1,ep=2 lists rows"
    assert all(row.degrees.ep == 2 for row in expert_rows)


def test_pinning_a_listed_rows_degrees_keeps_it(expert_rows):
    assert expert_rows
    fastest = expert_rows[0]
    degrees = {"dp": fastest.degrees.dp, "tp": fastest.degrees.tp}
    for size in (1, 2):
        for names in itertools.combinations(degrees, size):
            pinned = {name: degrees[name] for name in names}
            assert _holds(_rows(**pinned), fastest), f"--fix {pinned} with ep=2 dropped {fastest.degrees}"
