"""Activation offload leaves ``RESIDENT_LAYERS`` of a stage's block instances on the device; the credits
priced against the tables' activations (Megatron-Core's sequence-parallel input shard, the fused SwiGLU's
fc1 output) shrink with the charge they are taken from. They were taken whole from the offloaded
activations: StarCoder2-7B at tp 4, 256 x 4,096 tokens per micro-batch, showed -277.92 GiB per device and
was picked and exported (new-user sweep, task H3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from objectives.offload import RESIDENT_LAYERS
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader

GPT2 = Path(__file__).resolve().parents[2] / "examples" / "gpt2.onnx"  # 12 layers, hidden 768
LAYERS, HIDDEN, SEQ, MICRO_BATCH, TP = 12, 768, 128, 2, 2
# tp 2 with sequence parallelism: each block's qkv and fc, and the head after ln_f, keep their input's
# sequence shard (micro-batch x seq / tp x hidden x 2 B) instead of the gathered tensor (twice that)
SHARD = MICRO_BATCH * (SEQ // TP) * HIDDEN * 2
BLOCK_READERS, HEAD_READERS = 2 * LAYERS, 1


@pytest.fixture(scope="module")
def graph():
    return graph_loader(GPT2, {"seq": SEQ})


def _activations(graph, *, saved: bool, offload: str) -> float:
    settings = TrainingSettings(engine="fused", attention="flash", sequence_shard_saved=saved, offload=offload)
    found = estimate(graph, cluster=make_cluster("a100-80gb", devices=TP), tp=TP, pp=1, micro_batch=MICRO_BATCH,
                     global_batch=MICRO_BATCH, sequence_parallel=True, settings=settings)
    assert found.valid, found.reason
    return found.memory.activations_bytes


def test_the_shard_credit_shrinks_with_the_offloaded_layers(graph):
    assert _activations(graph, saved=False, offload="none") - _activations(graph, saved=True, offload="none") \
        == pytest.approx((BLOCK_READERS + HEAD_READERS) * SHARD, rel=1e-12)
    kept = RESIDENT_LAYERS / LAYERS  # each block op keeps this share on the device; the head stays whole
    offloaded = _activations(graph, saved=False, offload="activations") - _activations(graph, saved=True, offload="activations")
    assert offloaded == pytest.approx((BLOCK_READERS * kept + HEAD_READERS) * SHARD, rel=1e-12)
    assert _activations(graph, saved=True, offload="activations") > 0
