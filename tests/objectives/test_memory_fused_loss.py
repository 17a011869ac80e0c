"""A fused cross-entropy kernel (``TrainingSettings.fused_loss``; FlashAttention's, which llm-foundry's
MPT trains with) writes the logits' gradient in the logits' dtype, not fp32: counted by hand from the
tiny GPT-2 (examples/make_examples.py::build_gpt2_tiny: vocabulary 1,000, sequence 16)."""

from __future__ import annotations

import pytest

from objectives.calibration import read_step_rows
from objectives.cluster import make_cluster
from objectives.execution import ExecutionModel, execution_of
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader

VOCAB, SEQ, BATCH = 1000, 16, 2


@pytest.fixture(scope="module")
def tiny():
    return graph_loader("tests/data/gpt2_tiny.onnx", {"seq": SEQ})


def _allocated(loader, fused_loss: bool) -> float:
    settings = TrainingSettings(engine="fused", attention="flash", fused_loss=fused_loss)
    result = estimate(loader, cluster=make_cluster("h100-sxm", devices=1), tp=1, pp=1, dp=1, micro_batch=BATCH,
                      global_batch=BATCH, settings=settings)
    return result.memory_bytes - result.memory.other_bytes


def test_the_logits_gradient_is_bf16_not_fp32(tiny):
    # b x s x V logits: the gradient's 4 bytes (fp32) become 2 (bf16): 2 x 16 x 1,000 x 2 = 64,000 bytes
    saved = _allocated(tiny, False) - _allocated(tiny, True)
    assert saved == pytest.approx(BATCH * SEQ * VOCAB * (4 - 2))


def test_the_knob_flows_and_is_checked(tmp_path):
    assert execution_of(TrainingSettings(engine="fused", fused_loss=True)) == ExecutionModel(fused_loss=True)
    with pytest.raises(InputError, match="fused_loss must be true or false"):
        TrainingSettings(fused_loss="yes")  # type: ignore[arg-type]
    row = ('{"id": "r", "source": {}, "model": {"kind": "onnx", "path": "x.onnx"}, "gpus": {"device": "h100-sxm", '
           '"count": 1}, "layout": {"micro_batch": 1, "global_batch": 1, "loss": "%s"}, '
           '"measured": {"conversion": "step_s", "step_s": 1.0}}\n')
    path = tmp_path / "runs.jsonl"
    path.write_text(row % "fused")
    assert read_step_rows(path)[0].fused_loss
    path.write_text(row % "liger")
    with pytest.raises(InputError, match="layout.loss must be torch or fused"):
        read_step_rows(path)
