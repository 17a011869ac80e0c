"""A configuration priced at a choice fixed in advance prices each edge at that choice alone (issue 22, ninth
round): :func:`planner.estimate.estimate`, which prices the pure data-parallel baseline rows
(:func:`planner.baseline_rows.data_parallel_point`), builds no edge table where the layout fixes every op, and
its point is, to the bit, the one :func:`objectives.pipeline_price.evaluate_pipeline` prices from the whole
tables (``chosen_edges=False``, as before) on a fresh cache: the oracle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from planner.baseline_rows import data_parallel_point
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
DEVICES, PER_NODE, GLOBAL_BATCH = 16, 8, 32


@pytest.fixture(scope="module")
def loader():
    return graph_loader(GPT2, {"seq": 64})


def _cache(loader) -> PipelineCostCache:
    return PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=DEVICES, devices_per_node=PER_NODE),
                             settings=TrainingSettings(engine="fused", attention="flash"))


def _against_whole_tables(loader, point, zero: int) -> float:
    """Asserts ``point`` is the whole tables' price of its choice; returns its edges' seconds."""
    batch = point.micro_batch_samples
    whole = _cache(loader)
    reference = evaluate_pipeline(whole, pp=1, batch=batch, zero_stage=zero, recompute="none", choice=point.choice,
                                  bounds=(0, whole.structure(batch).num_layers), global_batch=GLOBAL_BATCH)
    assert whole.model(DEVICES, batch, 0, "none").edges_priced
    assert (point.time_s, point.memory_bytes, point.time, point.memory) == (
        reference.time_s, reference.memory_bytes, reference.time, reference.memory)
    (stage,), (expected,) = point.stages, reference.stages
    assert (stage.forward_s, stage.backward_s, stage.grad_sync_s) == (expected.forward_s, expected.backward_s,
                                                                      expected.grad_sync_s)
    return float(whole.arrays(DEVICES, batch, zero, "none").edge_time_s(np.asarray(point.choice)).sum())


@pytest.mark.parametrize("zero", [0, 1])
def test_the_data_parallel_baseline_builds_no_edge_table(loader, zero):
    cheap = _cache(loader)
    point = data_parallel_point(cheap, global_batch=GLOBAL_BATCH, memory_limit_bytes=None, zero=zero)
    assert point is not None and (point.devices_per_stage, point.micro_batch_samples) == (DEVICES, GLOBAL_BATCH)
    assert not cheap.model(DEVICES, GLOBAL_BATCH, 0, "none", edges=False).edges_priced
    # every op splits its batch alike: nothing moves between ops, the whole tables were priced to read zeros
    assert _against_whole_tables(loader, point, zero) == 0.0


def test_a_sequence_parallel_layout_reads_its_edges_at_the_choice(loader):
    """Megatron-LM's layout leaves some of this model's ops several configurations: the intra-op choice among
    them prices the tables, and the plan's edges are read from them (the cells at random choices of a model
    without tables: tests/objectives/test_chosen_edges.py)."""
    cheap = _cache(loader)
    estimated = estimate(cheap, cluster=cheap.cluster, tp=4, pp=1, dp=4, micro_batch=8, global_batch=GLOBAL_BATCH,
                         zero=1, sequence_parallel=True, settings=cheap.settings)
    assert estimated.valid
    assert _against_whole_tables(loader, estimated.point, 1) > 0.0
