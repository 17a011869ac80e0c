"""Megatron-Core's fused SwiGLU keeps fc1's output only (``TrainingSettings.fused_swiglu``,
``objectives.graph_facts._gated_products``), counted by hand on llama_tiny (issue 23: the NeMo and
Megatron-Bridge Llama rows' activations)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"  # 2 layers, hidden 64, ffn 128
T = 2 * 64  # tokens of one micro-batch (batch 2 x 64)


@pytest.fixture(scope="module")
def graph():
    return graph_loader(LLAMA, {"seq": 64})


def _activations(graph, fused: bool, recompute: str = "none") -> float:
    settings = TrainingSettings(engine="fused", attention="flash", recompute=recompute, fused_swiglu=fused)
    found = estimate(graph, cluster=make_cluster("a100-80gb", devices=1), tp=1, pp=1, micro_batch=2, global_batch=2,
                     recompute=recompute, settings=settings)
    assert found.valid, found.reason
    return found.memory.activations_bytes


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_the_silu_output_is_not_kept(graph, recompute):
    # per layer the product silu(gate) x up keeps up's output and not silu(gate), an ffn-wide bf16
    # tensor (128 x 2 B per token): the gate's pre-activation, which the gate keeps, is what
    # SwiGLUFunction saves and recomputes the SiLU from
    per_layer = T * 128 * 2
    assert per_layer == 32_768
    assert _activations(graph, False, recompute) - _activations(graph, True, recompute) == pytest.approx(
        2 * per_layer, rel=1e-12)


def test_full_recomputation_keeps_it_in_the_working_set_only(graph):
    # layer 1 keeps its checkpoint only; layer 0 stands for the working set of one layer re-run
    assert _activations(graph, False, "full") - _activations(graph, True, "full") == pytest.approx(T * 128 * 2)


def test_the_launchers_say_which():
    assert TARGETS["megatron"].fused_swiglu
    assert not TARGETS["torchtitan"].fused_swiglu
    assert not TrainingSettings().fused_swiglu
