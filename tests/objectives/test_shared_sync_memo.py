"""Caches of one cluster share their priced gradient synchronisation (``PipelineCostCache(priced_sync=)``,
as ``planner.launchable`` builds them): the memo's key holds every setting the terms read, so each
cache's arrays equal those of a cache that priced everything itself, whatever priced first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.pipeline_cost import PipelineCostCache
from planner.core.settings import TrainingSettings
from planner.pipeline import graph_loader

DATA = Path(__file__).resolve().parents[1] / "data"
# execution models, an HSDP shard group and a precision: each prices some terms differently
SETTINGS = [dict(engine="fused", attention="flash"), dict(engine="eager", attention="flash"),
            dict(engine="fused", attention="flash", dp_shard=2), dict(engine="eager", attention="flash", precision="fp32"),
            dict()]


def _cache(loader, memo=None, **settings) -> PipelineCostCache:
    # 2 nodes x 4: the synchronisation crosses nodes on some configurations
    return PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=8, devices_per_node=4),
                             settings=TrainingSettings(**settings), priced_sync=memo)


@pytest.mark.parametrize("zero, recompute", [(0, "none"), (1, "selective"), (3, "full")])
def test_a_shared_memo_prices_as_a_cache_alone(zero, recompute):
    loader = graph_loader(DATA / "gpt2_tiny.onnx", {"seq": 64})
    memo: dict = {}
    shared = [_cache(loader, memo, **s) for s in SETTINGS]
    for cache in shared:  # each one's terms priced first by the others'
        cache.arrays(8, 4, zero, recompute)
    assert memo  # it was filled (and read by the later caches)
    for cache, settings in zip(shared, SETTINGS):
        alone = _cache(loader, **settings).arrays(8, 4, zero, recompute)
        mine = cache.arrays(8, 4, zero, recompute)
        for column in ("forward_s", "backward_s", "step_s"):
            np.testing.assert_array_equal(mine.flat[column], alone.flat[column], err_msg=f"{settings} {column}")


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_recompute_variants_share_the_terms_below_zero_3(zero):
    # whether an op is recomputed changes its terms from ZeRO-3 on only (it gathers the parameters once more):
    # below, the full-recompute arrays add no term to the memo the no-recompute ones filled; at ZeRO-3 the
    # recomputed ops get their own. Either way they equal those of a cache that priced full recompute alone
    loader = graph_loader(DATA / "gpt2_tiny.onnx", {"seq": 64})
    memo: dict = {}
    cache = _cache(loader, memo, engine="fused", attention="flash")
    cache.arrays(8, 4, zero, "none")
    priced = len(memo[8])
    full = cache.arrays(8, 4, zero, "full")
    assert (len(memo[8]) == priced) == (zero < 3)
    alone = _cache(loader, engine="fused", attention="flash").arrays(8, 4, zero, "full")
    for column in ("forward_s", "backward_s", "step_s"):
        np.testing.assert_array_equal(full.flat[column], alone.flat[column], err_msg=column)
