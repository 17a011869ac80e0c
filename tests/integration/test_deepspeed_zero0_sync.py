"""DeepSpeed 0.19.8's own ZeRO-0 code against ``exporters.deepspeed.zero_sync.zero_sync(zero_stage=0)``, on CPU, without
a process group or a model: which optimizer wraps a ZeRO-0 plan (the engine's own ``_do_optimizer_sanity_check`` run on
the export's precisions), the dtype it all-reduces in (the engine's ``communication_data_type`` property), how
``allreduce_no_retain`` fills its buckets (run on stand-in tensors), that the all-reduce runs after ``loss.backward()``
and, under a ``PipelineModule``, once after the last micro-batch (the ``TrainSchedule`` itself)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from exporters.deepspeed.zero_sync import BUCKET_ELEMENTS, zero_sync
from tests.integration.test_deepspeed_zero_sync import _method_source  # the engine's nvtx-wrapped methods' text

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")


def _engine_attribute(name: str):
    """An attribute of ``DeepSpeedEngine`` as its class holds it (DeepSpeed wraps some methods in an nvtx closure)."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    return inspect.getattr_static(DeepSpeedEngine, name)


@pytest.mark.parametrize("model_dtype, pipeline, wrapper", [
    ("bfloat16", False, "DDP_BFLOAT16"),  # FP16_Optimizer over bf16: param.grad in bf16
    ("bfloat16", True, "BFLOAT16"),  # BF16_Optimizer accumulating in bf16 (exporters.deepspeed.bf16_optimizer)
    ("float32", False, None),  # the bare torch optimizer
    ("float32", True, None),
])
def test_which_optimizer_wraps_a_zero0_plan(model_dtype, pipeline, wrapper):
    """No ZeRO optimizer at ZeRO-0, so nothing reduces from backward hooks: the engine's ``allreduce_gradients`` does."""
    from deepspeed.runtime import engine

    dtype = getattr(torch, model_dtype)
    fake = SimpleNamespace(get_data_types=lambda: (dtype, dtype), zero_optimization=lambda: False,
                           pipeline_parallelism=pipeline, global_rank=1)
    chosen = _engine_attribute("_do_optimizer_sanity_check")(fake, None)
    assert chosen == (getattr(engine, wrapper) if wrapper else None)
    assert chosen != engine.ZERO_OPTIMIZATION
    assert not zero_sync(zero_stage=0, precision="bf16-mixed" if model_dtype == "bfloat16" else "fp32").reduction_overlaps_backward


@pytest.mark.parametrize("bf16, dtype, element", [(True, "bfloat16", 2), (False, "float32", 4)])
def test_the_all_reduce_runs_in_the_gradients_dtype(bf16, dtype, element):
    """The export writes no ``communication_data_type``: the config leaves it ``None`` and the engine reduces in bf16
    under ``bf16.enabled``, fp32 otherwise: the gradient's bytes per element the pricing moves."""
    from deepspeed.runtime.config import get_communication_data_type

    from objectives.memory import state_bytes_per_parameter
    from planner.core.settings import TrainingSettings

    assert get_communication_data_type({}) is None
    fake = SimpleNamespace(_config=SimpleNamespace(communication_data_type=None), fp16_enabled=lambda: False,
                           bfloat16_enabled=lambda: bf16)
    reduced = _engine_attribute("communication_data_type").fget(fake)
    assert reduced == getattr(torch, dtype) and reduced.itemsize == element
    settings = TrainingSettings(precision="bf16-mixed" if bf16 else "fp32")
    assert state_bytes_per_parameter(settings).grad == element


def test_buckets_of_5e8_elements():
    """``allreduce_no_retain`` flushes a bucket once it holds more than ``MEMORY_OPT_ALLREDUCE_SIZE`` elements, the
    default ``allreduce_gradients`` and ``buffered_allreduce_fallback`` hand it: 3e8 + 3e8 + 1e8 elements go in two
    calls."""
    from deepspeed.runtime import engine

    assert engine.MEMORY_OPT_ALLREDUCE_SIZE == BUCKET_ELEMENTS
    assert "def allreduce_gradients(self, bucket_size=MEMORY_OPT_ALLREDUCE_SIZE)" in _method_source(engine, "allreduce_gradients")
    assert inspect.signature(_engine_attribute("buffered_allreduce_fallback")).parameters[
        "elements_per_buffer"].default == BUCKET_ELEMENTS
    calls: list[list[int]] = []
    fake = SimpleNamespace(allreduce_and_copy=lambda bucket, group, size: calls.append([t.numel() for t in bucket]))
    tensors = [SimpleNamespace(numel=lambda n=n: n) for n in (300_000_000, 300_000_000, 100_000_000)]
    _engine_attribute("allreduce_no_retain")(fake, tensors, None, numel_per_bucket=BUCKET_ELEMENTS)
    assert calls == [[300_000_000, 300_000_000], [100_000_000]]
    assert zero_sync(zero_stage=0, precision="fp32").bucket_elements == BUCKET_ELEMENTS


def test_after_the_backward():
    """``DeepSpeedEngine.backward`` calls ``_backward_epilogue`` once ``loss.backward()`` has returned, and the epilogue
    all-reduces; at ZeRO-0 ``allreduce_gradients`` takes ``buffered_allreduce_fallback`` at the accumulation boundary."""
    from deepspeed.runtime import engine

    backward = _method_source(engine, "backward")
    assert backward.index("loss.backward(**backward_kwargs)") < backward.index("self._backward_epilogue()")
    assert "self.allreduce_gradients()" in _method_source(engine, "_backward_epilogue")
    reduce = _method_source(engine, "allreduce_gradients")
    assert "self.buffered_allreduce_fallback(grads=grads, elements_per_buffer=bucket_size)" in reduce


def test_a_pipeline_reduces_once_after_its_last_backward():
    """``PipelineEngine`` turns the engine's all-reduce off and runs it as ``ReduceGrads``, which ``TrainSchedule`` issues
    on its last step, after every micro-batch's backward, on every stage."""
    from deepspeed.runtime.pipe import engine as pipe_engine
    from deepspeed.runtime.pipe.schedule import BackwardPass, ReduceGrads, TrainSchedule

    source = inspect.getsource(pipe_engine.PipelineEngine)
    assert "self.enable_backward_allreduce = False" in source
    assert "self.allreduce_gradients(bucket_size=MEMORY_OPT_ALLREDUCE_SIZE)" in source
    assert pipe_engine.MEMORY_OPT_ALLREDUCE_SIZE == BUCKET_ELEMENTS
    for stage in (0, 1):
        commands = [type(c) for step in TrainSchedule(micro_batches=4, stages=2, stage_id=stage).steps() for c in step]
        assert commands.count(ReduceGrads) == 1 and commands.count(BackwardPass) == 4
        assert commands.index(ReduceGrads) > max(i for i, c in enumerate(commands) if c is BackwardPass)
