"""A launcher's search keeps, for a later search over its cache under another ZeRO synchronisation rule
(DeepSpeed's after Megatron-LM's: ``PipelineCostCache.later_zero_syncs``, set by ``planner.launchable``), that
rule's 0-1 split, its bounds and the later memory rules' floors while the pair's models are built
(``planner.search.pipeline._Slot.keep_own_bounds``; issue 22, eighth round). Before, the later search built every
pair's models again to find them (GPT-3 175B at 1,024 devices, on c17b036: DeepSpeed's search 273 -> 57 builds).

The oracle is DeepSpeed's search on a fresh cache: the same points, pruned and searched combinations; and the
same search after Megatron-LM's that kept nothing for its rule builds more models than after one that did."""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from objectives.pipeline_cost import PipelineCostCache
from planner.pipeline import PipelineOptions, graph_loader, target_rules
from planner.search import pipeline as search

GPT2_TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64
OPTIONS = PipelineOptions(global_batch=16, pipeline_sizes=(2,))


@pytest.fixture(scope="module")
def at_batch():
    return graph_loader(GPT2_TINY, {"seq": 128})


@pytest.fixture(scope="module")
def cluster():
    return make_cluster("a100-80gb", devices=16, devices_per_node=8)  # two nodes: ZeRO-0's tree all-reduce splits 0-1


def _points(result) -> list[tuple]:
    return [(p.time_s, p.memory_bytes, p.summary) for p in result.points]


def _deepspeed_after_megatron(at_batch, cluster, *, kept: bool):
    """DeepSpeed's search over the cache Megatron-LM's searched and released, seeded with its points."""
    megatron, deepspeed = target_rules("megatron"), target_rules("deepspeed")
    cache = PipelineCostCache(at_batch, cluster=cluster)
    cache.searched_again = True
    cache.later_memory_rules = frozenset({tuple(search.search_memory_rules(deepspeed, cache).values())})
    cache.later_zero_syncs = frozenset({deepspeed.zero_sync}) if kept else None  # None: the search's own rule alone
    cache.later_zero3_gathers = frozenset({deepspeed.zero3_gather}) if kept else None  # its ZeRO-3 time rule too
    first = search.search_pipeline(cache, options=OPTIONS, rules=megatron)
    seeds = [(p.time_s, p.memory_bytes) for p in first.points]
    built = cache.builds
    return search.search_pipeline(cache, options=OPTIONS, rules=deepspeed, seeds=seeds), cache.builds - built, seeds


def test_a_later_rules_bounds_kept_change_nothing_and_build_less(at_batch, cluster):
    assert target_rules("deepspeed").zero_sync is not None and target_rules("megatron").zero_sync is None
    kept, kept_builds, seeds = _deepspeed_after_megatron(at_batch, cluster, kept=True)
    base, base_builds, _ = _deepspeed_after_megatron(at_batch, cluster, kept=False)
    fresh = search.search_pipeline(PipelineCostCache(at_batch, cluster=cluster), options=OPTIONS,
                                   rules=target_rules("deepspeed"), seeds=seeds)
    for run in (kept, base):
        assert (run.pruned, run.combinations, run.intra_op_searches) == (fresh.pruned, fresh.combinations,
                                                                          fresh.intra_op_searches)
        assert _points(run) == _points(fresh)
    assert kept.pruned > 0 and kept_builds < base_builds
