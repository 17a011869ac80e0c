"""A linear layer keeps its sequence-parallel input shard (``objectives.memory.sequence_shard_credit``,
``TrainingSettings.sequence_shard_saved``: Megatron-Core, Transformer Engine), counted by hand on gpt2_tiny
(issue 23: the Korthikanti et al. 1T and NeMo GPT3 175B rows were predicted not to fit through it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000

# tp 2 with sequence parallelism, one micro-batch of 2 x 128 tokens: every norm's output is split over the
# sequence over the 2 devices (per device 2 samples x 64 tokens x hidden 64 x 2 B = 16,384 B) and gathered
# whole (32,768 B) for the column-parallel linear after it: each block's qkv and fc, and the head after
# ln_f: 5 inputs, each kept as its 16,384-B shard instead of the 32,768-B gathered tensor
SHARD = 2 * 64 * 64 * 2
CREDIT = 5 * (2 * SHARD - SHARD)


@pytest.fixture(scope="module")
def graph():
    return graph_loader(TINY, {"seq": 128})


def _activations(graph, *, saved: bool, recompute: str = "none", sequence_parallel: bool = True) -> float:
    settings = TrainingSettings(engine="fused", attention="flash", recompute=recompute, sequence_shard_saved=saved)
    found = estimate(graph, cluster=make_cluster("a100-80gb", devices=2), tp=2, pp=1, micro_batch=2, global_batch=2,
                     sequence_parallel=sequence_parallel, recompute=recompute, settings=settings)
    assert found.valid, found.reason
    return found.memory.activations_bytes


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_the_shard_is_kept(graph, recompute):
    assert CREDIT == 81_920
    assert _activations(graph, saved=False, recompute=recompute) - _activations(graph, saved=True, recompute=recompute) \
        == pytest.approx(CREDIT, rel=1e-12)


def test_nothing_without_a_gather_or_a_kept_input(graph):
    # no sequence parallelism: the norms' outputs are whole, nothing is gathered
    assert _activations(graph, saved=True, sequence_parallel=False) == _activations(graph, saved=False,
                                                                                    sequence_parallel=False)
    # full recomputation: the linear layers keep nothing of their own (the block's input is the checkpoint)
    assert _activations(graph, saved=True, recompute="full") == _activations(graph, saved=False, recompute="full")


def test_the_launchers_say_which():
    assert TARGETS["megatron"].sequence_shard_saved  # Megatron-Core's save_for_backward(input) before the gather
    assert not TARGETS["torchtitan"].sequence_shard_saved  # DTensor's ColwiseParallel keeps the gathered input
    assert not TrainingSettings().sequence_shard_saved
