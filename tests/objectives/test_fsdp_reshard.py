"""FSDP2's ``reshard_after_forward`` policy (``TrainingSettings.reshard_after_forward``, ``--fix reshard=...``):
``never`` keeps every ``fully_shard`` unit whole from its forward to its backward, so ZeRO-3 gathers each
parameter once per micro-batch instead of twice (recomputed or not) and the units stay in memory
(``objectives.intra_op._zero_terms``, ``objectives.fsdp_reshard.kept_units``). Checked by hand on the
2-layer GPT (``tests/objectives/test_fsdp_memory.py`` counts its units) and against brute force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.fsdp_reshard import fsdp_resharded_ranges, kept_units
from objectives.memory import StateBytes, fsdp_unsharded_peak
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000, tied head
EMBEDDING = 1000 * 64  # the tied wte (the embedding op owns it); wpe is held whole, gathers nothing
BLOCK = (2 * 64) + (64 * 192 + 192) + (64 * 64 + 64) + (2 * 64) + (64 * 256 + 256) + (256 * 64 + 64)  # 49,984
HEAD = 2 * 64  # ln_f
TENSORS = 1 + 2 * 12 + 2  # the gathered parameter tensors: wte, 12 per block (6 weights, 6 biases), ln_f's two
BF16 = StateBytes(param=2.0, grad=2.0, optimizer=12.0)
CLUSTER = make_cluster("a100-80gb", devices=8)


@pytest.fixture(scope="module")
def points():
    """``{(policy, recompute): point}``: ZeRO-3 over 8 data-parallel devices of one node, one stage, one
    micro-batch of 8 samples, every op data-parallel, under the plain roofline (nothing overlapped)."""
    out = {}
    for policy in ("always", "never"):
        cache = PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=CLUSTER,
                                  settings=TrainingSettings(reshard_after_forward=policy))
        for recompute in ("none", "full"):
            model = cache.model(8, 8, 3, recompute)
            choice = [space.index_of({batch[0]: 8}) if (batch := [d.name for d in op.dims if d.is_batch]) else 0
                      for op, space in zip(model.graph.ops, model.tables.configs)]
            out[policy, recompute] = evaluate_pipeline(cache, pp=1, batch=8, zero_stage=3, recompute=recompute,
                                                       choice=np.array(choice), bounds=(0, 2), global_batch=8)
    return out


def _one_gather_s(elements: int = EMBEDDING + 2 * BLOCK + HEAD, tensors: int = TENSORS) -> float:
    """One ring all-gather of ``tensors`` parameter tensors of ``elements`` in all over the node's 8 devices,
    bf16: ``7/8 x bytes / bw + 7 alpha`` per tensor (every gathered tensor by default)."""
    link = CLUSTER.intra_link
    return 7 / 8 * 2.0 * elements / link.collective_bandwidth_bytes_per_s + tensors * 7 * link.latency_s


def test_never_saves_the_backward_gather(points):
    # 2 gathers per micro-batch -> 1: the step is shorter by one gather of every parameter tensor
    saved = points["always", "none"].time_s - points["never", "none"].time_s
    assert saved == pytest.approx(_one_gather_s(), rel=1e-9)


def test_never_saves_one_gather_under_recompute_too(points):
    # full recomputation re-runs the blocks' ops inside their units, whose pre-backward gather serves the
    # re-run forward as well (objectives.intra_op: FSDP gathers twice recomputed or not): 2 gathers -> 1 for
    # every tensor, the blocks' as the embedding's and ln_f's
    saved = points["always", "full"].time_s - points["never", "full"].time_s
    assert saved == pytest.approx(_one_gather_s(), rel=1e-9)


def test_never_keeps_the_units_whole(points):
    # units [embedding, block 0, block 1, ln_f], bf16. always: the peak is block 0's backward,
    # 2 x (BLOCK + EMBEDDING) + 6 x BLOCK. never: block 1's backward also holds the embedding kept from
    # forward: 2 x (2 BLOCK + EMBEDDING) + 6 x BLOCK, i.e. 2 x BLOCK more parameters, the same gradients
    always, never = points["always", "none"].memory, points["never", "none"].memory
    assert never.params_bytes - always.params_bytes == pytest.approx(2 * BLOCK)
    assert never.grads_bytes == pytest.approx(always.grads_bytes)
    assert 2 * (2 * BLOCK + EMBEDDING) + 6 * BLOCK > 2 * (BLOCK + EMBEDDING) + 6 * BLOCK > 8 * EMBEDDING


def test_kept_units_follow_torchtitan():
    # get_fsdp_reshard_after_forward_policy: default = not pp_enabled for the blocks; [norm, lm_head] kept
    # unless "always"
    assert kept_units("default", 4, 1).tolist() == [False, False, False, True]
    assert kept_units("default", 4, 2).tolist() == [True] * 4
    assert kept_units("always", 4, 2).tolist() == [False] * 4
    assert kept_units("never", 4, 1).tolist() == [True] * 4


def test_resharded_ranges_match_the_peak_of_each_range():
    # brute force: every contiguous range's fsdp_unsharded_peak with no unit kept
    units = np.random.default_rng(7).uniform(1.0, 100.0, size=9)
    ranges = fsdp_resharded_ranges(units, per=BF16)
    for lo in range(units.size):
        for hi in range(units.size):
            expected = 0.0 if hi < lo else fsdp_unsharded_peak(units[lo:hi + 1], kept=[False] * (hi - lo + 1),
                                                               per=BF16).total_bytes
            assert ranges[lo, hi] == pytest.approx(expected, rel=1e-12)


def test_an_unknown_policy_is_refused():
    with pytest.raises(InputError, match="reshard must be default, always or never"):
        TrainingSettings(reshard_after_forward="sometimes")  # type: ignore[arg-type]
