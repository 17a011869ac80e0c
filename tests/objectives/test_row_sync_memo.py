"""The per-row synchronisation memo of a (stage, micro-batch) pair (``objectives.pipeline_arrays._row_sync_s``) is
shared by the pair's recompute variants where an op keeps its detail (issue 22, fifteenth round, h29d): under an
execution model the entry is keyed by the op's ZeRO-0 detail itself, not by the recompute setting, so a variant that
takes the op's detail from the donor model (``objectives.tables._price_groups``) reads the entry the first variant
priced. The oracle is the same cache's arrays with the memo emptied before each variant (nothing shared: every row
priced by its own model), to the bit, over every column, ZeRO stage and order of the variants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.pipeline_arrays import _COLUMNS
from objectives.pipeline_cost import PipelineCostCache
from planner.core.settings import TrainingSettings, Zero3Gather
from planner.pipeline import graph_loader

DATA = Path(__file__).resolve().parents[1] / "data"
DEEPSPEED = Zero3Gather(prefetch_bucket=50_000_000, max_live=1_000_000_000, max_reuse_distance=1_000_000_000,
                       persistence_threshold=100_000, reduce_bucket=500_000_000)  # DeepSpeed 0.19.8's defaults
VARIANTS = ("none", "selective", "mlp", "full", "op")  # mlp and full both recompute the MLP linears, apart


def _cache(loader, **settings) -> PipelineCostCache:
    # 2 nodes x 4: the synchronisation crosses nodes on some configurations
    return PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=8, devices_per_node=4),
                             settings=TrainingSettings(**settings))


def _rows(cache: PipelineCostCache) -> int:
    """Entries of the pair's row memo (its keys lead with the row's op index; the digests' with a string)."""
    return sum(isinstance(key[0], int) for key in cache.derived(8, 4).get(("zero_sync",), {}))


@pytest.mark.parametrize("engine", [None, "fused", "eager"])  # None: the plain roofline (its key holds no detail)
@pytest.mark.parametrize("zero, gather", [(0, None), (1, None), (2, None), (3, None), (3, DEEPSPEED)])
@pytest.mark.parametrize("order", [VARIANTS, VARIANTS[::-1]])
def test_shared_rows_price_as_each_variant_alone(engine, zero, gather, order):
    loader = graph_loader(DATA / "gpt2_tiny.onnx", {"seq": 64})
    settings = dict(engine=engine, attention="flash") if engine else {}
    shared, apart = _cache(loader, **settings), _cache(loader, **settings)
    for recompute in order:  # both caches build the same models in the same order (the same donors)
        apart.derived(8, 4).pop(("zero_sync",), None)  # nothing kept from the variants before
        alone = apart.arrays(8, 4, zero, recompute, zero3_gather=gather)
        mine = shared.arrays(8, 4, zero, recompute, zero3_gather=gather)
        for column in _COLUMNS:
            np.testing.assert_array_equal(mine.flat[column], alone.flat[column], err_msg=f"{recompute} {column}")
    priced = sum(len(shared._parts[(8, 4, recompute)].first_op) for recompute in VARIANTS)  # rows of the variants
    assert _rows(shared) < priced  # some rows were read from another variant's entry

