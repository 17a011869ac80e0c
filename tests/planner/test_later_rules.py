"""A launcher's search keeps bounds for a later search over its cache only under keys that search may ask
(``PipelineCostCache.later_rules``, set by ``planner.launchable``; ``planner.search.pipeline._Slot._read_later``;
issue 22, eleventh round). Before, Megatron-LM's search kept DeepSpeed's ZeRO-3 bounds at every pipeline size,
though DeepSpeed runs no ZeRO-3 pipeline: GPT-3 175B at 1,024 devices kept 396 such bounds, none read.

The oracle is the same two searches with the later rules unknown (every key kept, as before): DeepSpeed's
search after Megatron-LM's finds the same points, prunes and searches the same combinations and builds no more
models; the keys left out are exactly those DeepSpeed's rules refuse at that size."""

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
    return make_cluster("a100-80gb", devices=16, devices_per_node=8)


def _run(at_batch, cluster, *, known: bool):
    """DeepSpeed's search over the cache Megatron-LM's searched first; the bounds kept after the first."""
    megatron, deepspeed = target_rules("megatron"), target_rules("deepspeed")
    cache = PipelineCostCache(at_batch, cluster=cluster)
    cache.searched_again = True
    cache.later_memory_rules = frozenset({tuple(search.search_memory_rules(deepspeed, cache).values())})
    cache.later_zero_syncs = frozenset({deepspeed.zero_sync})
    cache.later_zero3_gathers = frozenset({deepspeed.zero3_gather})
    cache.later_rules = (deepspeed,) if known else None
    first = search.search_pipeline(cache, options=OPTIONS, rules=megatron)
    kept = {key for store in cache._lasting.values() for key in store if key[0] == "bounds"}
    built = cache.builds
    seeds = [(p.time_s, p.memory_bytes) for p in first.points]
    second = search.search_pipeline(cache, options=OPTIONS, rules=deepspeed, seeds=seeds)
    return first, second, kept, cache.builds - built


def test_only_keys_a_later_search_may_ask_are_kept_and_nothing_else_moves(at_batch, cluster):
    deepspeed = target_rules("deepspeed")
    first, second, kept, builds = _run(at_batch, cluster, known=True)
    first_all, second_all, kept_all, builds_all = _run(at_batch, cluster, known=False)
    for ours, theirs in ((first, first_all), (second, second_all)):
        assert [(p.time_s, p.memory_bytes, p.summary) for p in ours.points] == \
            [(p.time_s, p.memory_bytes, p.summary) for p in theirs.points]
        assert (ours.pruned, ours.combinations, ours.intra_op_searches) == \
            (theirs.pruned, theirs.combinations, theirs.intra_op_searches)
    assert builds <= builds_all
    assert kept < kept_all  # some key left out (the filter is not inert here)
    for key in kept_all - kept:  # ("bounds", z, recompute, pp, ...): a stage DeepSpeed never pipelines at this size
        z, recompute, pp = key[1], key[2], key[3]
        assert pp > 1 and not any(deepspeed.allows(pp=pp, zero_stage=z, recompute=recompute, schedule=OPTIONS.schedule,
                                                   tp=tp) for tp in (None, 1, 2))
    assert any(key[1] == 3 for key in kept_all - kept)  # ZeRO-3 under DeepSpeed's gathers: the 175B plan's case
