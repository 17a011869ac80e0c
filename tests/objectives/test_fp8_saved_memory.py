"""Transformer Engine's FP8 linear layers keep their input's FP8 cast (``objectives.memory.fp8_saved_input``,
``FP8_SAVED_INPUT_BYTES``), counted by hand on gpt2_tiny (issue 23: the NeMo FP8 rows' activations)."""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from objectives.memory import FP8_SAVED_INPUT_BYTES
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, vocab 1000
T = 2 * 128  # tokens of one micro-batch


@pytest.fixture(scope="module")
def graph():
    return graph_loader(TINY, {"seq": 128})


def _activations(graph, fp8: str | None, recompute: str = "none") -> float:
    settings = TrainingSettings(engine="fused", attention="flash", fp8=fp8, recompute=recompute)
    found = estimate(graph, cluster=make_cluster("h100-sxm", devices=1), tp=1, pp=1, micro_batch=2, global_batch=2,
                     recompute=recompute, settings=settings)
    assert found.valid, found.reason
    return found.memory.activations_bytes


def test_delayed_keeps_fp8_inputs(graph):
    # per block, the FP8 linear layers' inputs at 1 B instead of 2: qkv's (the norm's output, 64 per
    # token), fc's (64) and proj's after the GeLU (256); the attention output stays bf16 for the flash
    # kernel's backward (the attention core keeps it now) and the output projection adds its FP8 copy
    # (64 x 1 B). The head (vocab 1000, not a multiple of 16, and the LM head) stays bf16.
    assert FP8_SAVED_INPUT_BYTES == 1
    per_block = T * ((64 + 64 + 256) * (2 - 1) - 64 * 1)
    assert per_block == 81_920
    assert _activations(graph, None) - _activations(graph, "delayed") == pytest.approx(2 * per_block, rel=1e-12)


def test_selective_drops_the_bf16_attention_output(graph):
    # block 1's attention core is recomputed: it regenerates its output, so only the FP8 copy stays
    # (64 x 1 B where the projection kept 64 x 2 B); block 0 stands for the recomputation's working
    # set (charged as not recomputed, objectives.memory), as without recomputation
    working = T * ((64 + 64 + 256) * (2 - 1) - 64 * 1)
    recomputed = T * ((64 + 64 + 256) * (2 - 1) + 64 * (2 - 1))
    assert recomputed == 114_688
    assert _activations(graph, None, "selective") - _activations(graph, "delayed", "selective") \
        == pytest.approx(working + recomputed, rel=1e-12)


def test_rowwise_keeps_the_bf16_input(graph):
    # torchao's float8 saves the high-precision input and casts it again in backward
    assert _activations(graph, "rowwise") == _activations(graph, None)
