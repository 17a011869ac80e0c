"""The loss's transients by the kernel a launcher runs, counted by hand from the tiny GPT-2
(examples/make_examples.py::build_gpt2_tiny: vocabulary 1,000, sequence 16; batch 2, so 32,000 bf16
logits): a fused cross-entropy kernel (``TrainingSettings.fused_loss``; FlashAttention's, which
llm-foundry's MPT trains with) keeps the logits and their gradient in bf16, 2 + 2 bytes per logit;
Megatron's vocab-parallel cross entropy (the default) the logits and one fp32 tensor, 2 + 4;
PyTorch's ``cross_entropy`` on fp32 logits (``torch_loss``, torchtitan's) three fp32 tensors at its
backward, 12 (``objectives.memory.TORCH_LOSS_BYTES``)."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.calibration import read_step_rows
from objectives.cluster import make_cluster
from objectives.execution import ExecutionModel, execution_of
from objectives.memory import saved_activation_bytes
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.calibrate import row_settings
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.pipeline import graph_loader
from planner.plan import load_graph
from tests.objectives.test_loss_split import TOKENS, VOCAB as VOCAB_LM, cross_entropy_file, gather_mean_file

VOCAB, SEQ, BATCH = 1000, 16, 2


@pytest.fixture(scope="module")
def tiny():
    return graph_loader("tests/data/gpt2_tiny.onnx", {"seq": SEQ})


def _allocated(loader, fused_loss: bool, torch_loss: bool = False) -> float:
    settings = TrainingSettings(engine="fused", attention="flash", fused_loss=fused_loss, torch_loss=torch_loss)
    result = estimate(loader, cluster=make_cluster("h100-sxm", devices=1), tp=1, pp=1, dp=1, micro_batch=BATCH,
                      global_batch=BATCH, settings=settings)
    return result.memory_bytes - result.memory.other_bytes


def test_the_logits_gradient_is_bf16_not_fp32(tiny):
    # b x s x V logits: the gradient's 4 bytes (fp32) become 2 (bf16): 2 x 16 x 1,000 x 2 = 64,000 bytes
    saved = _allocated(tiny, False) - _allocated(tiny, True)
    assert saved == pytest.approx(BATCH * SEQ * VOCAB * (4 - 2))


def test_torch_cross_entropy_holds_three_fp32_logits(tiny):
    # 2 x 16 x 1,000 = 32,000 logits: 12 bytes each (log-probabilities, the NLL gradient, the input
    # gradient, all fp32) where Megatron's holds 6 (bf16 logits + fp32) and a fused kernel 4 (2 + 2)
    torch_loss = _allocated(tiny, False, torch_loss=True)
    assert torch_loss - _allocated(tiny, False) == pytest.approx(32_000 * (12 - 6))
    assert torch_loss - _allocated(tiny, True) == pytest.approx(32_000 * (12 - 4))


def _per_score(path: str, name: str) -> dict[bool, np.ndarray]:
    """Bytes per score of the op's shard it keeps, without and with ``torch_loss``, per configuration
    of 8 devices (the shard: 2,048 x 32,000 scores over the devices the op is split over)."""
    graph = load_graph(path, {"batch": TOKENS})
    op = graph.ops[graph.op_index(name)]
    space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    shard = TOKENS * VOCAB_LM / space.factors.prod(axis=1)
    return {flag: saved_activation_bytes(op, space, tensors=graph.tensors, settings=TrainingSettings(),
                                         execution=ExecutionModel(torch_loss=flag)) / shard for flag in (False, True)}


def test_a_cross_entropy_op_in_the_graph_holds_them_on_its_shard(tmp_path):
    # x[2048, 256] @ W[256, 32000] -> SoftmaxCrossEntropyLoss: under PyTorch's cross_entropy the loss
    # op holds 12 bytes per score of its shard, not the 4 of its fp32 probabilities alone
    kept = _per_score(cross_entropy_file(tmp_path), "loss")
    np.testing.assert_allclose(kept[False], 4.0)
    np.testing.assert_allclose(kept[True], 12.0)


@pytest.mark.parametrize("maker", ["nll", "gather"])
def test_a_written_out_cross_entropy_holds_them_at_its_log_softmax(tmp_path, maker):
    # LogSoftmax -> NegativeLogLikelihoodLoss (torch's exporter) or -> GatherElements -> ReduceMean:
    # under PyTorch's cross_entropy the LogSoftmax holds 12 bytes per score of its shard in place of
    # its output (the log-probabilities at the training precision, bf16: 2 bytes, otherwise)
    path = (cross_entropy_file(tmp_path, op_type="NegativeLogLikelihoodLoss") if maker == "nll"
            else gather_mean_file(tmp_path))
    kept = _per_score(path, "log_softmax")
    np.testing.assert_allclose(kept[False], 2.0)
    np.testing.assert_allclose(kept[True], 12.0)


def test_the_knob_flows_and_is_checked(tmp_path):
    assert execution_of(TrainingSettings(engine="fused", fused_loss=True)) == ExecutionModel(fused_loss=True)
    assert execution_of(TrainingSettings(engine="fused", torch_loss=True)) == ExecutionModel(torch_loss=True)
    with pytest.raises(InputError, match="either fused or PyTorch's"):
        ExecutionModel(fused_loss=True, torch_loss=True)
    with pytest.raises(InputError, match="torch_loss must be true or false"):
        TrainingSettings(torch_loss=1)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="fused_loss must be true or false"):
        TrainingSettings(fused_loss="yes")  # type: ignore[arg-type]
    row = ('{"id": "r", "source": {}, "model": {"kind": "onnx", "path": "x.onnx"}, "gpus": {"device": "h100-sxm", '
           '"count": 1}, "layout": {"micro_batch": 1, "global_batch": 1, "loss": "%s"}, '
           '"measured": {"conversion": "step_s", "step_s": 1.0}}\n')
    path = tmp_path / "runs.jsonl"
    path.write_text(row % "fused")
    assert read_step_rows(path)[0].fused_loss
    path.write_text(row % "torch")
    (read,) = read_step_rows(path)
    assert read.torch_loss and not read.fused_loss
    assert row_settings(read).torch_loss and not row_settings(read).fused_loss
    path.write_text(row % "vocab-parallel")
    assert not read_step_rows(path)[0].torch_loss and not read_step_rows(path)[0].fused_loss
    path.write_text(row % "liger")
    with pytest.raises(InputError, match="layout.loss must be vocab-parallel, torch or fused"):
        read_step_rows(path)
