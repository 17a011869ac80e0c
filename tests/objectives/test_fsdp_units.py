"""ZeRO-3 priced per ``fully_shard`` unit (``TrainingSettings.fsdp_units``, ``objectives.fsdp_units``): one flat
all-gather / reduce-scatter per unit and pass, one latency each, the next unit prefetched beside this one's compute.
The recurrence by hand, then the 2-layer GPT's units priced by hand from the ring formula and its ZeRO-0 compute."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.fsdp_units import fsdp_unit_pass_s, prefetched_unit_exposure_s
from objectives.intra_op import OVERLAP_CONTENTION as KAPPA
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000, tied head
EMBEDDING = 1000 * 64  # wte (the embedding op owns it; wpe gathers nothing here: tests/objectives/test_fsdp_reshard.py)
BLOCK = (2 * 64) + (64 * 192 + 192) + (64 * 64 + 64) + (2 * 64) + (64 * 256 + 256) + (256 * 64 + 64)  # 49,984
HEAD = 2 * 64  # ln_f; the tied head's weight is the embedding's
UNITS = (EMBEDDING, BLOCK, BLOCK, HEAD)  # the slots of LayerStructure: before, block 0, block 1, after


def test_the_recurrence_by_hand():
    # forward: unit 0's gather whole, then x(g1, c0) = kappa x 1 (1 <= 1), x(g2, c1) = kappa x 3 (3 <= 4)
    # backward: unit 2's gather + unit 0's reduce-scatter whole; beside b0 = 0.5: r1 = 1 -> 0.5 + kappa x 0.5;
    # beside b1 = 5: g0 + r2 = 2 -> kappa x 2; beside b2 = 2: g1 = 2 -> kappa x 2
    forward, backward = prefetched_unit_exposure_s(
        np.array([2.0, 1.0, 3.0]), np.array([1.0, 4.0, 2.0]),
        np.array([1.0, 2.0, 1.0]), np.array([2.0, 1.0, 1.0]), np.array([0.5, 5.0, 2.0]))
    assert forward == pytest.approx(2.0 + 4.0 * KAPPA, rel=1e-12)
    assert backward == pytest.approx(1.0 + 2.0 + 0.5 + 4.5 * KAPPA, rel=1e-12)


def test_one_unit_hides_nothing():
    # FSDP gathers the root unit before its forward and reduce-scatters after its backward: all exposed
    assert prefetched_unit_exposure_s(np.array([3.0]), np.array([9.0]), np.array([2.0]), np.array([4.0]),
                                      np.array([9.0])) == pytest.approx((3.0, 6.0))


@pytest.fixture(scope="module")
def tiny():
    """ZeRO-0 and ZeRO-3 arrays of the 2-layer GPT over 8 data-parallel A100s of one node, 8 x 128 tokens,
    fused kernels (an execution model: gathers overlapped), host floors off so the stage sums are the step."""
    base = make_cluster("a100-80gb", devices=8)
    device = dataclasses.replace(base.device, layer_host_s=0.0, microbatch_host_s=0.0, p2p_overhead_s=0.0)
    cluster = dataclasses.replace(base, device=device)
    caches = {units: PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=cluster,
                                       settings=TrainingSettings(engine="fused", attention="flash", fsdp_units=units))
              for units in (False, True)}
    model = caches[False].model(8, 8, 0, "none")
    picks = np.array([space.index_of({batch[0]: 8}) if (batch := [d.name for d in op.dims if d.is_batch]) else 0
                      for op, space in zip(model.graph.ops, model.tables.configs)])
    return cluster, caches, picks


def _unit_seconds(arrays, structure, picks, column: str) -> np.ndarray:
    """``(4,)`` an array column summed per unit at ``picks``."""
    return np.bincount(structure.position + 1, weights=arrays.flat[column][arrays.offsets + picks], minlength=4)


def test_units_priced_by_hand(tiny):
    cluster, caches, picks = tiny
    cache = caches[False]
    structure = cache.structure(8)
    zero0, zero3 = cache.arrays(8, 8, 0, "none"), cache.arrays(8, 8, 3, "none")
    link = cluster.intra_link
    # one ring collective per unit over the node's 8 devices, bf16 parameters and gradients: 7/8 B / bw + 7 alpha
    ring = np.array([7 / 8 * 2.0 * e / link.collective_bandwidth_bytes_per_s + 7 * link.latency_s for e in UNITS])
    compute_f = _unit_seconds(zero0, structure, picks, "forward_s")  # ZeRO-0 moves nothing per micro-batch
    compute_b = _unit_seconds(zero0, structure, picks, "backward_s")

    def x(comm: float, compute: float) -> float:  # objectives.intra_op.exposed_under, written out
        return max(0.0, comm - compute) + KAPPA * min(comm, compute)

    forward = ring[0] + x(ring[1], compute_f[0]) + x(ring[2], compute_f[1]) + x(ring[3], compute_f[2])
    backward = (ring[3] + ring[0] + x(ring[1], compute_b[0]) + x(ring[0] + ring[2], compute_b[1])
                + x(ring[1] + ring[3], compute_b[2]) + x(ring[2], compute_b[3]))
    stage = np.zeros(len(picks), dtype=np.int64)
    per_op_f = np.array([zero3.flat["forward_s"][zero3.offsets + picks].sum()])
    per_op_b = np.array([zero3.flat["backward_s"][zero3.offsets + picks].sum()])
    got_f, got_b = fsdp_unit_pass_s(zero3, structure, stage, picks, 1, cluster, per_op_f, per_op_b)
    assert got_f[0] == pytest.approx(compute_f.sum() + forward, rel=1e-9)
    assert got_b[0] == pytest.approx(compute_b.sum() + backward, rel=1e-9)
    # the per-op pricing pays each tensor min(1, bytes / 25 MiB) of a latency, almost none on tensors this small,
    # where a unit pays one whole collective's: here the units are the slower
    assert got_f[0] > per_op_f[0] and got_b[0] > per_op_b[0]


def test_the_plan_price_follows_the_setting(tiny):
    cluster, caches, picks = tiny
    points = {units: evaluate_pipeline(cache, pp=1, batch=8, zero_stage=3, recompute="none", choice=picks,
                                       bounds=(0, 2), global_batch=8) for units, cache in caches.items()}
    cache = caches[False]
    zero3 = cache.arrays(8, 8, 3, "none")
    per_op_f = np.array([zero3.flat["forward_s"][zero3.offsets + picks].sum()])
    per_op_b = np.array([zero3.flat["backward_s"][zero3.offsets + picks].sum()])
    got_f, got_b = fsdp_unit_pass_s(zero3, cache.structure(8), np.zeros(len(picks), dtype=np.int64), picks, 1, cluster,
                                    per_op_f, per_op_b)
    moved = (got_f[0] + got_b[0]) - (per_op_f[0] + per_op_b[0])  # one micro-batch, one stage: the step moves by it
    assert points[True].time_s - points[False].time_s == pytest.approx(moved, rel=1e-6)
    assert points[True].memory_bytes == points[False].memory_bytes
    zero2 = {units: evaluate_pipeline(c, pp=1, batch=8, zero_stage=2, recompute="none", choice=picks, bounds=(0, 2),
                                      global_batch=8).time_s for units, c in caches.items()}
    assert zero2[True] == zero2[False]  # ZeRO-3 only


def test_a_non_boolean_setting_is_refused():
    with pytest.raises(InputError, match="fsdp_units must be true or false"):
        TrainingSettings(fsdp_units="yes")  # type: ignore[arg-type]
