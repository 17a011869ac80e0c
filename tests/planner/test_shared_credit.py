"""A stage's activation credit ceiling is kept once for the arrays of every ZeRO stage (issue 22, speed): it reads
the graph, the configurations and the activations, none of which ZeRO moves
(``objectives.pipeline_cost.PipelineCostCache.activation_credit_ceiling``, and the credit classes of
``planner.search.pipeline_bounds._credited_groups``). The oracle is a fresh cache asked first at each ZeRO stage,
which derives both from that stage's own arrays: the same ceilings, the same memory and time bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.pipeline_cost import PipelineCostCache
from planner.core.settings import TrainingSettings
from planner.pipeline import graph_loader
from planner.search.pipeline_bounds import _lower_bounds

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"  # 2 layers, hidden 64, ffn 128 (SwiGLU)
RULES = {"sequence_shard_saved": True, "fused_swiglu": True}


@pytest.fixture(scope="module")
def loader():
    return graph_loader(LLAMA, {"seq": 64})


def _cache(loader) -> PipelineCostCache:
    return PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=2),
                             settings=TrainingSettings(engine="fused", attention="flash"))


def _bounds(cache: PipelineCostCache, zero: int, recompute: str, credit) -> tuple[float, float]:
    structure = cache.structure(2)
    return _lower_bounds(cache, cache.arrays(2, 2, zero, recompute), cache.masks(2, 2, inside_node=True, data_parallel=None),
                         structure, pp=1, micro_batches=1, in_flight=np.ones(1), p2p_floor_s=cache.p2p_floor_s(structure, 1, 2),
                         schedule="1f1b", chunks=1, credit=credit)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_one_ceiling_for_every_zero_stage_equals_each_stages_own(loader, recompute):
    shared = _cache(loader)
    first = shared.activation_credit_ceiling(shared.arrays(2, 2, 0, recompute), recompute, **RULES)
    assert first  # the fused SwiGLU's, and under "none" the sequence shard's too
    for zero in (1, 2, 3):
        kept = shared.activation_credit_ceiling(shared.arrays(2, 2, zero, recompute), recompute, **RULES)
        assert kept is first
        fresh = _cache(loader)
        own = fresh.activation_credit_ceiling(fresh.arrays(2, 2, zero, recompute), recompute, **RULES)
        assert sorted(own) == sorted(kept) and all(np.array_equal(own[op], kept[op]) for op in own)
        _bounds(shared, zero - 1, recompute, shared.activation_credit_ceiling(
            shared.arrays(2, 2, zero - 1, recompute), recompute, **RULES))  # the classes kept at another stage first
        assert _bounds(shared, zero, recompute, kept) == _bounds(fresh, zero, recompute, own)


def test_other_rules_keep_their_own_ceiling(loader):
    cache = _cache(loader)
    arrays = cache.arrays(2, 2, 1, "none")
    both = cache.activation_credit_ceiling(arrays, "none", **RULES)
    swiglu = cache.activation_credit_ceiling(arrays, "none", sequence_shard_saved=False, fused_swiglu=True)
    assert swiglu is not both and set(swiglu) <= set(both)
    assert cache.activation_credit_ceiling(arrays, "none") is None  # no rule: no credit
