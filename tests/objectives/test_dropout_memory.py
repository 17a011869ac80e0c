"""Dropout masks (objectives.memory, ExecutionModel.dropout): one byte per dropped element, counted
by hand from GPT-2's structure, never from the code under test."""

from __future__ import annotations

import pytest

from objectives.cluster import make_cluster
from objectives.execution import ExecutionModel, default_execution, execution_of
from objectives.memory import DROPOUT_MASK_BYTES, is_residual_add
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader

LAYERS, HIDDEN, HEADS, SEQ, BATCH = 2, 64, 4, 16, 2  # examples/make_examples.py::build_gpt2_tiny


@pytest.fixture(scope="module")
def tiny():
    return graph_loader("tests/data/gpt2_tiny.onnx", {"seq": SEQ})


def _allocated(loader, *, engine: str, attention: str, dropout: bool) -> float:
    settings = TrainingSettings(engine=engine, attention=attention, dropout=dropout)  # type: ignore[arg-type]
    result = estimate(loader, cluster=make_cluster("h100-sxm", devices=1), tp=1, pp=1, dp=1, micro_batch=BATCH,
                      global_batch=BATCH, settings=settings)
    return result.memory_bytes - result.memory.other_bytes


def test_residual_adds_are_two_per_layer(tiny):
    graph = tiny(BATCH)
    assert sum(is_residual_add(op, graph.tensors) for op in graph.ops) == 2 * LAYERS


@pytest.mark.parametrize("engine", ["eager", "fused"])
def test_flash_keeps_the_hidden_masks_only(tiny, engine):
    # two hidden dropouts per layer (attention and MLP output), each b x s x h bool
    expected = LAYERS * 2 * BATCH * SEQ * HIDDEN * DROPOUT_MASK_BYTES
    added = _allocated(tiny, engine=engine, attention="flash", dropout=True) - _allocated(
        tiny, engine=engine, attention="flash", dropout=False)
    assert added == pytest.approx(expected)


def test_explicit_attention_also_keeps_the_probability_mask(tiny):
    # + one b x heads x s x s bool mask on the probabilities per layer
    expected = LAYERS * (2 * BATCH * SEQ * HIDDEN + BATCH * HEADS * SEQ * SEQ) * DROPOUT_MASK_BYTES
    added = _allocated(tiny, engine="eager", attention="explicit", dropout=True) - _allocated(
        tiny, engine="eager", attention="explicit", dropout=False)
    assert added == pytest.approx(expected)


def test_recomputed_layers_keep_no_mask(tiny):
    def full(dropout: bool) -> float:
        settings = TrainingSettings(engine="fused", attention="flash", dropout=dropout)
        result = estimate(tiny, cluster=make_cluster("h100-sxm", devices=1), tp=1, pp=1, dp=1, micro_batch=BATCH,
                          global_batch=BATCH, recompute="full", settings=settings)
        return result.memory_bytes

    # the first layer is the re-run working set (objectives.memory): its masks are live, the other's not
    one_layer = 2 * BATCH * SEQ * HIDDEN * DROPOUT_MASK_BYTES
    assert full(True) - full(False) <= one_layer * 1.1 + 1


def test_the_knob_flows_from_settings_and_targets():
    assert execution_of(TrainingSettings(engine="fused", dropout=True)) == ExecutionModel(dropout=True)
    assert default_execution(("fused", "flash", True), engine="eager") == ExecutionModel(engine="eager", dropout=True)
    assert not default_execution(("fused", "flash")).dropout
