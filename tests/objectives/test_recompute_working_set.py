"""The recomputation working set in a pipeline (``objectives.memory.pipelined_activation_bytes``, applied by
``objectives.pipeline_price``): held once per stage, not once per in-flight micro-batch (issue 23: the
Korthikanti et al. 530B / 1T rows were predicted not to fit through it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.memory import pipelined_activation_bytes
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000
FUSED = TrainingSettings(engine="fused", attention="flash")  # an execution model: the tables charge a working set


def test_formula_by_hand():
    # stage 0: 10 B a micro-batch of which 6 the working set, 3 in flight: 3 x 4 + 6; stage 1 holds
    # no first instance: 2 x 4 + 6
    held = pipelined_activation_bytes(np.array([10.0, 4.0]), np.array([3.0, 2.0]), np.array([6.0, 0.0]), 6.0)
    assert held.tolist() == [18.0, 14.0]


@pytest.fixture(scope="module")
def cache():
    # one device a stage: no split, every op whole
    return PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=2),
                             settings=FUSED)


def _activations(cache, recompute: str, global_batch: int) -> list[float]:
    model = cache.model(1, 2, 0, recompute)
    choice = np.zeros(len(model.graph.ops), dtype=np.int64)
    point = evaluate_pipeline(cache, pp=2, batch=2, zero_stage=0, recompute=recompute, choice=choice,
                              bounds=(0, 1, 2), global_batch=global_batch)
    return [stage.memory.activations_bytes for stage in point.stages]


# gpt2_tiny at 2 sequences x 128 tokens (T = 256), hidden 64, 4 heads, vocab 1000, bf16 (2 B), counted by
# hand from the saved-tensor rules (objectives.memory) under fused kernels + flash attention:
T = 2 * 128
EMBEDDING = T * 8  # the int64 token ids the lookup keeps
# a block, per token: ln_1 input 128, qkv input 128, q and k 256, v 128 + 4 heads' fp32 log-sum-exp 16,
# attention output (proj input) 128, ln_2 input 128, fc input 128, GeLU input 4 x 64 x 2 = 512, proj input 512
BLOCK = T * (128 + 128 + 256 + 128 + 16 + 128 + 128 + 128 + 512 + 512)
CHECKPOINT = T * 64 * 2  # a recomputed block keeps its input
HEAD = T * 128 + T * (128 + 1000 * 6)  # ln_f input; the head's input and the logits + their fp32 gradient


def test_full_recompute_two_stages(cache):
    # 1F1B over 2 stages ([embedding, block 0], [block 1, ln_f, head]), 4 micro-batches: stage 0 keeps
    # 2 in flight, stage 1 one. Each stage holds its in-flight micro-batches' checkpoints and re-runs
    # one block at a time (the working set BLOCK - CHECKPOINT beyond its checkpoint), so
    # stage 0 = 2 (EMBEDDING + CHECKPOINT) + (BLOCK - CHECKPOINT) and stage 1 = CHECKPOINT + HEAD + (BLOCK -
    # CHECKPOINT). Before, stage 0 held 2 (EMBEDDING + BLOCK) (the working set in each micro-batch)
    # and stage 1 CHECKPOINT + HEAD (none).
    assert BLOCK == 528_384
    working = BLOCK - CHECKPOINT
    assert _activations(cache, "full", 8) == pytest.approx(
        [2 * (EMBEDDING + CHECKPOINT) + working, CHECKPOINT + HEAD + working], rel=1e-12)
    # without recomputation nothing moves: each micro-batch's activations whole
    assert _activations(cache, "none", 8) == pytest.approx([2 * (EMBEDDING + BLOCK), BLOCK + HEAD], rel=1e-12)
    # one micro-batch in flight (no pipeline to speak of): the tables' charge, the working set once
    assert _activations(cache, "full", 2) == pytest.approx(
        [EMBEDDING + BLOCK, CHECKPOINT + HEAD + working], rel=1e-12)
