"""DeepSpeed 0.19.8's own code against ``exporters.deepspeed.zero_sync.zero_sync``, on CPU, without a process group:
the defaults its rule reads (``reduce_bucket_size``, ``use_multi_rank_bucket_allreduce``, ``overlap_comm`` below ZeRO-3,
the engine's all-reduce bucket), the collective each optimizer reduces with, and where the parameter all-gather runs
(after the optimizer step, in ``step`` itself)."""

from __future__ import annotations

import inspect

import pytest

from exporters.deepspeed.zero_sync import BUCKET_ELEMENTS, zero_sync

pytestmark = pytest.mark.integration

pytest.importorskip("torch")
pytest.importorskip("deepspeed")


def _method_source(module, name: str) -> str:
    """A method's text in its module's source (DeepSpeed wraps the engine's methods in an nvtx closure that keeps
    no ``__wrapped__``): from ``def name`` to the next method."""
    text = inspect.getsource(module)
    start = text.index(f"    def {name}(")
    return text[start:text.index("\n    def ", start + 1)]


@pytest.mark.parametrize("stage", [1, 2])
def test_the_defaults_the_rule_reads(stage):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    config = DeepSpeedZeroConfig(stage=stage)
    assert config.reduce_bucket_size == BUCKET_ELEMENTS == config.allgather_bucket_size
    assert config.use_multi_rank_bucket_allreduce is True  # average_tensor all-reduces each bucket
    assert config.overlap_comm is False  # off below ZeRO-3 unless the config says so (the export writes it)
    assert DeepSpeedZeroConfig(stage=3).overlap_comm is True


def test_the_engine_all_reduces_bf16_optimizer_gradients_after_backward():
    """``BF16_Optimizer`` has no ``reduce_gradients``: the engine's ``allreduce_gradients`` falls back to
    ``buffered_allreduce_fallback`` in buckets of ``MEMORY_OPT_ALLREDUCE_SIZE``, called from ``_backward_epilogue``
    (after the backward, whatever ``overlap_comm`` says)."""
    from deepspeed.runtime import engine
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    assert not hasattr(BF16_Optimizer, "reduce_gradients")
    assert engine.MEMORY_OPT_ALLREDUCE_SIZE == BUCKET_ELEMENTS
    reduce = _method_source(engine, "allreduce_gradients")
    assert "'reduce_gradients'" in reduce and "buffered_allreduce_fallback" in reduce
    assert "self.allreduce_gradients()" in _method_source(engine, "_backward_epilogue")
    rule = zero_sync(zero_stage=1, precision="bf16-mixed")
    assert rule.reduction == "all_reduce" and not rule.reduction_overlaps_backward


def test_zero_optimizer_all_reduces_buckets_and_gathers_after_the_step():
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    average = inspect.getsource(DeepSpeedZeroOptimizer.average_tensor)
    assert "use_multi_rank_bucket_allreduce" in average and "allreduce_and_scatter" in average
    # each bucket through allreduce_bucket without a rank: dist.all_reduce (with one, dist.reduce)
    assert "self.allreduce_bucket(small_bucket" in inspect.getsource(DeepSpeedZeroOptimizer.allreduce_and_copy_with_multiple_ranks)
    assert "dist.all_reduce(tensor_to_allreduce" in inspect.getsource(DeepSpeedZeroOptimizer.allreduce_bucket)
    step = inspect.getsource(DeepSpeedZeroOptimizer.step)
    assert step.index("self._optimizer_step(i)") < step.index("all_gather_dp_groups(")  # after the step, in step()
    assert "all_gather_dp_groups(" in inspect.getsource(BF16_Optimizer.update_lp_params)
    assert "update_lp_params()" in inspect.getsource(BF16_Optimizer.step)
    for stage in (1, 2):
        assert not zero_sync(zero_stage=stage, precision="fp32").gather_overlaps_forward
