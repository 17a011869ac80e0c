"""The default frontier's ``--collapse`` bound over CPU offload plans too (issue 22, "Exact": the default
frontier keeps its stated bound): on random small GPTs, on one node and on two, at a loose limit (the device's
memory), a middle one and a tight one (the leanest launchable plan without offload: a plan fits without it),
every launchable plan that fits, with or without CPU offload, has a listed row within the limit no slower and
no larger by more than 1%; and no row is over the limit.

The oracle is ``tests/planner/test_launchable_exact.py``'s brute force (every launcher's pipeline sizes,
micro-batches, families, per-op choices, cuts, ZeRO stages and recomputation, each plan priced by
:func:`objectives.pipeline_price.price_plan`), walked once more under each offload mode a launcher runs
(:meth:`exporters._target.Target.runs_offload`: ``optimizer``, ``activations``, ``parameters``), each mode's
plans priced by a cost cache of that mode, as the search prices them. It never runs the search.

Before offload was searched beside the rest (``planner.launchable._fitting``), it was searched only when nothing
fit without it: at the middle and tight limits here ``offload optimizer`` plans of each case had no row within
the limit within 1% (on one node, middle: Megatron-LM ``dp=4``, ZeRO-1, 13.36 ms at 308,352,730 B; the rows hold
NCCL's 294 MiB and the allowance, so these memories differ in the fifth digit and only a limit between them
tells), and the rows over the limit were listed. At the loose limit every plan of these models is within 1% of
the fastest row in memory, so that case held before too; the README job's offload rows (docs/VALIDATION.md)
are where it did not."""

from __future__ import annotations

import dataclasses
import itertools
from functools import lru_cache

import numpy as np
import pytest

from importers.moe import find_moe_layers
from objectives.cluster import make_cluster
from planner.launchable import OFFLOADED, launch_frontier
from planner.pipeline import PipelineCostCache, PipelineOptions
from planner.plan import PlanRequest
from tests.planner.test_launchable_exact import (
    RECOMPUTE,
    _cuts,
    _enumerate,
    _Group,
    _launchers,
    _loader,
    _model,
    _Oracle,
    _priced,
    _stages,
)

pytestmark = pytest.mark.slow  # the oracle walks four offload modes of one model

CASES = {"one-node-4": (1, 4, 4), "two-nodes-2x2": (6, 4, 2)}
"""``case -> (model seed, devices, devices per node)``: ``test_launchable_exact``'s first two cases."""


def _offloaded(loader, request: PlanRequest, global_batch: int) -> list[_Group]:
    """Every launchable-space plan under each CPU offload mode its launcher runs, priced under that mode."""
    rng = np.random.default_rng(0)
    groups = []
    for name, target, base in _launchers(loader, request, global_batch):
        for offload in OFFLOADED:
            settings = dataclasses.replace(base.settings, offload=offload)
            cache = PipelineCostCache(loader, cluster=request.cluster, settings=settings, cost_model=request.cost_model,
                                      moe_layers=find_moe_layers)
            cache.keep = True
            layers = cache.structure(global_batch).num_layers
            for pp, batch, family, masks, stage in _stages(cache, target, global_batch):
                allowed = [np.flatnonzero(m & s) for m, s in zip(masks, stage)]
                if not all(a.size for a in allowed):
                    continue
                for zero, recompute, bounds in itertools.product(range(4), RECOMPUTE, _cuts(layers, pp)):
                    if not (target.allows_pipeline(pp=pp, zero_stage=zero, recompute=recompute, schedule="1f1b",
                                                   tp=family.tp)
                            and target.runs_offload(offload, zero_stage=zero, pp=pp, recompute=recompute)):
                        continue
                    plan = dict(pp=pp, batch=batch, zero_stage=zero, recompute=recompute, bounds=bounds,
                                global_batch=global_batch, schedule="1f1b", chunks=1,
                                memory_limit_bytes=request.memory_limit_bytes, zero3_gather=target.zero3_gather,
                                sequence_shard_saved=target.sequence_shard_saved, fused_swiglu=target.fused_swiglu,
                                zero_sync=target.zero_sync)
                    choices, time_s, memory = _priced(cache, plan, allowed, rng)
                    groups.append(_Group(launcher=name, family=f"{family.label}, offload {offload}", cache=cache,
                                         plan=plan, choices=choices, time_s=time_s, memory_bytes=memory))
    return groups


@lru_cache(maxsize=None)
def _case(case: str):
    seed, devices, per_node = CASES[case]
    sizes, global_batch = _model(seed)
    loader = _loader(sizes)
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=per_node))
    plain = _Oracle(_enumerate(loader, request, global_batch))
    both = _Oracle(plain.groups + _offloaded(loader, request, global_batch))
    return loader, request, global_batch, plain, both


def _limit(plain: _Oracle, which: str) -> float | None:
    """No limit (the device's memory), the leanest launchable plan's memory without offload, or between it
    and the memory of the fastest (``test_launchable_exact._limit``)."""
    if which == "loose":
        return None
    lean = plain.memory_bytes(plain.leanest())
    return lean if which == "tight" else float(np.sqrt(lean * plain.memory_bytes(plain.fastest_within(np.inf))))


@lru_cache(maxsize=None)
def _frontier(case: str, which: str):
    loader, request, global_batch, plain, _ = _case(case)
    return launch_frontier(loader, dataclasses.replace(request, memory_limit_bytes=_limit(plain, which)),
                           options=PipelineOptions(global_batch=global_batch), headroom=False)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("which", ["loose", "middle", "tight"])
def test_every_fitting_plan_offload_or_not_is_covered_by_a_row(case: str, which: str):
    _, _, _, _, both = _case(case)
    frontier = _frontier(case, which)
    assert frontier.collapse == 0.01 and frontier.best is not None  # the default; a plan fits without offload
    # a plan within the limit is covered by a row within it: a row over the limit launches out of memory
    fitting = [row for row in frontier.rows if row.fits]
    open_, floors = both.uncovered(fitting, frontier.memory_limit_bytes, frontier.collapse)
    assert not floors, [g.describe(0) for g in floors[:3]]
    assert not open_, "plans no row within the limit covers: " + "; ".join(both.describe(k) for k in open_)
    assert len(fitting) == len(frontier.rows)  # a plan fits: the rows over the limit are not listed


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("which", ["loose", "middle", "tight"])
def test_the_fastest_row_is_the_fastest_plan_offload_or_not(case: str, which: str):
    """The fastest row within the limit is the fastest launchable plan within it, offload or not (of plans as
    fast within ``TIME_TIE`` on as many devices and ways, the leanest: ``test_launchable_exact``'s rule)."""
    _, _, _, _, both = _case(case)
    frontier = _frontier(case, which)
    best = both.fastest_within(frontier.memory_limit_bytes)
    fastest = frontier.fastest_row
    assert fastest is not None and fastest.fits
    assert fastest.time_s == pytest.approx(both.time_s(best), rel=1e-9), (
        f"fastest row {fastest.summary} ({fastest.time_s:.9g} s, {fastest.memory_bytes:.9g} B); oracle {both.describe(best)}")


@pytest.mark.parametrize("case", list(CASES))
def test_the_oracle_holds_offload_plans_leaner_than_any_without(case: str):
    """The cases are ones where offload matters: some launchable offload plan holds less than every plan
    without it (else the bound above would hold whether offload is searched or not)."""
    _, _, _, plain, both = _case(case)
    assert both.memory_bytes(both.leanest()) < plain.memory_bytes(plain.leanest())
