"""Interleaved pipelines whose stages' layers their model chunks do not divide: priced by `planner estimate`
and the search with each chunk as the stage's largest (objectives.schedules.chunk_pad), exported as
Megatron-LM's layout and torchtitan's model parts of the same split (objectives.schedules.chunk_layers)."""

from __future__ import annotations

import numpy as np
import pytest

from exporters import export
from exporters.validate import parse_torchtitan_overrides
from objectives.cluster import make_cluster
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import PipelineCostCache, PipelineOptions, evaluate_pipeline, pipeline_search
from tests.exporters.graphs import llama_graph, make_cluster as exporter_cluster, make_input, pipeline_spec, spaces_for
from tests.objectives.graphs import gpt2_like


def _five_layers(batch: int):
    return gpt2_like(layers=5, hidden=32, heads=4, vocab=100, positions=16, batch=batch, seq=16)


def test_estimate_prices_each_chunk_as_the_largest():
    # 5 layers on pp=2 in two chunks: stage 0's 3 layers are chunks of 2 and 1, priced as two of 2 (x 4/3),
    # stage 1's 2 layers two of 1; interleaved: (m + (S-1)/v)(max f + max b) + 2v c + 2v (m-1) c
    e = estimate(_five_layers(2), cluster=make_cluster("a100-80gb", devices=8), tp=2, pp=2, micro_batch=1,
                 global_batch=8, stage_layers=(3, 2), schedule="interleaved", chunks=2)
    assert e.valid, e.reason
    point, m, pad = e.point, 4, np.array([4 / 3, 1.0])
    f = np.array([s.forward_s for s in point.stages])
    b = np.array([s.backward_s for s in point.stages])
    c = point.time.p2p_s  # one boundary
    expected = (m + 1 / 2) * ((f * pad).max() + (b * pad).max()) + 2 * 2 * c + 2 * 2 * (m - 1) * c
    assert point.time.pipeline_s == pytest.approx(expected, rel=1e-12)
    # in flight: min(2(S-s-1) + (v-1)S + 1, mv) / v chunks, stage 0's each as the largest: 5/2 x 4/3
    assert [s.in_flight for s in point.stages] == pytest.approx([5 / 2 * 4 / 3, 3 / 2])


def test_search_cuts_unequal_chunks_at_their_price():
    # every cut of 5 layers on two stages leaves a stage its two chunks do not divide; the search's
    # fastest plan is the fastest cut of its choice as the price gives it, cut by cut
    cache = PipelineCostCache(_five_layers, cluster=make_cluster("a100-80gb", devices=4))
    options = PipelineOptions(global_batch=8, pipeline_sizes=(2,), schedule="interleaved", chunks=2, zero_stages=(0,),
                              recompute=("none",))
    result = pipeline_search(cache, cluster=cache.cluster, options=options)
    fastest = min(result.points, key=lambda p: p.time_s)
    assert fastest.pp == 2 and any(n % 2 for n in fastest.layers_per_stage)
    priced = {cut: evaluate_pipeline(cache, pp=2, batch=fastest.micro_batch_samples,
                                     zero_stage=0, recompute="none", choice=fastest.choice, bounds=(0, cut, 5),
                                     global_batch=8, schedule="interleaved", chunks=2).time_s
              for cut in range(1, 5)}
    assert fastest.time_s == pytest.approx(min(priced.values()), rel=1e-12)


def _torchtitan_input(counts, chunks, micro_batches=4):
    graph = llama_graph(layers=sum(counts))
    settings = TrainingSettings(zero_stage=3)
    spec = pipeline_spec(graph, list(counts), devices_per_stage=1, micro_batch=8, micro_batches=micro_batches,
                         schedule="interleaved", chunks=chunks, settings=settings)
    return make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops), cluster=exporter_cluster(1, 8),
                      settings=settings, global_batch=spec.global_batch, pipeline=spec)


def test_torchtitan_model_parts_hold_the_priced_chunks():
    # stages of 3 layers in two chunks: rank 0's are 1 + 2 (the embedding's chunk the lighter), rank 1's
    # 2 + 1 (the loss's); part v * pp + s is chunk v of rank s
    a = parse_torchtitan_overrides(export("torchtitan", _torchtitan_input([3, 3], 2))["overrides"])
    assert a["parallelism.module_fqns_per_model_part"] == [
        ["tok_embeddings", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "layers.4"],
        ["layers.5", "norm", "lm_head"]]


def test_torchtitan_refuses_an_empty_chunk():
    # the middle rank's one layer in two chunks leaves its second (part 1 x 3 + 1) without a module
    with pytest.raises(UnsupportedExport, match="virtual pipeline stage 4 holds no module"):
        export("torchtitan", _torchtitan_input([2, 1, 2], 2, micro_batches=6))
