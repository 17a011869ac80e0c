"""How DeepSpeed 0.19.8 synchronises its gradients at ZeRO 0-2 (:func:`zero_sync`, ``Target.zero_sync``): the
ZeRO-0 engine's all-reduce and the ZeRO-1/2 sharded optimizer, read from its source (``deepspeed/runtime/engine.py``,
``runtime/pipe/engine.py``, ``runtime/bf16_optimizer.py``, ``runtime/fp16/fused_optimizer.py``,
``runtime/zero/stage_1_and_2.py``, ``runtime/zero/config.py``, ``runtime/utils.py``). Priced by ``objectives.intra_op``
(``grad_sync_terms``, ``grad_bucket_bytes``, ``overlapped_zero_sync_s``) per plan.
"""

from __future__ import annotations

from exporters.deepspeed.bf16_optimizer import ACCUMULATE_IN_FP32
from planner.core.settings import ZERO_SYNC_STAGES, ZeroSync

__all__ = ["BUCKET_ELEMENTS", "zero_sync"]

BUCKET_ELEMENTS = 500_000_000
"""Gradient elements per reduction bucket: ``DeepSpeedZeroConfig.reduce_bucket_size`` (``runtime/zero/config.py``,
default ``5e8``), and ``MEMORY_OPT_ALLREDUCE_SIZE`` (``runtime/engine.py``, ``5e8``), the bucket of
``DeepSpeedEngine.allreduce_gradients`` which reduces every ZeRO-0 plan's gradients and ``BF16_Optimizer``'s (a
bucket is flushed once it holds more than this many elements); the export writes neither
(the defaults run). The parameter gather is priced in buckets of the same size
(``allgather_bucket_size``, default ``5e8``): with ``all_gather_into_tensor`` available (``torch.distributed``
on NCCL) ``all_gather_dp_groups`` gathers each flat parameter group in one call."""


def zero_sync(*, zero_stage: int, precision: str, offload: str = "none") -> ZeroSync | None:
    """DeepSpeed 0.19.8's gradient synchronisation of a plan the export writes at ZeRO 0-2 (``None``: ZeRO-3).

    Which optimizer runs (``DeepSpeedEngine._do_optimizer_sanity_check``): under ``bf16`` at ZeRO-1 without CPU
    offload the export asks for fp32 gradient accumulation (:mod:`exporters.deepspeed.bf16_optimizer`), which
    selects ``BF16_Optimizer``; every other ZeRO-1/2 plan runs ``DeepSpeedZeroOptimizer``. At ZeRO-0 no ZeRO
    optimizer runs: ``bf16`` is ``FP16_Optimizer`` over bf16 (``DDP_BFLOAT16``), or ``BF16_Optimizer`` with bf16
    accumulation under a ``PipelineModule``; ``fp32`` is the bare ``torch.optim`` optimizer.

    * ZeRO-0: ``DeepSpeedEngine.allreduce_gradients`` (from ``_backward_epilogue``, after ``loss.backward()``
      returns, at the gradient-accumulation boundary; ``PipelineEngine._exec_reduce_grads`` after the last
      micro-batch's backward) runs ``buffered_allreduce_fallback``: the gradients flattened into buckets of
      :data:`BUCKET_ELEMENTS` (``MEMORY_OPT_ALLREDUCE_SIZE``), each ``dist.all_reduce``-d in
      ``communication_data_type`` (unset by the export: bf16 under bf16, fp32 under fp32, the gradients' own
      dtype). Nothing runs it beside the backward (no hooks, ``overlap_comm`` is a ZeRO key): exposed.
    * ZeRO-1/2: the gradient reduction is an all-reduce of each bucket (:data:`BUCKET_ELEMENTS`), each rank
      keeping its partition: ``DeepSpeedZeroOptimizer.average_tensor`` buckets ``("allreduce", group)`` under
      ``use_multi_rank_bucket_allreduce`` (default ``True``) and ``allreduce_and_scatter`` calls ``dist.all_reduce``;
      ``BF16_Optimizer`` has no ``reduce_gradients``, so ``DeepSpeedEngine.allreduce_gradients`` runs
      ``buffered_allreduce_fallback``. Twice a reduce-scatter's bytes on the wire.
    * ``BF16_Optimizer``'s reduction runs in ``DeepSpeedEngine._backward_epilogue`` after the backward, whatever
      ``overlap_comm`` says: not overlapped. ``DeepSpeedZeroOptimizer`` reduces from backward hooks on a side
      stream when ``overlap_comm`` (default ``False`` below ZeRO-3, ``DeepSpeedZeroConfig.overlap_comm_valid``),
      which the export sets to ``TrainingSettings.overlap``: overlapped as priced.
    * The updated partitions are all-gathered after the optimizer step on the default stream
      (``DeepSpeedZeroOptimizer.step`` and ``BF16_Optimizer.update_lp_params`` call
      ``runtime/utils.all_gather_dp_groups``): never beside the next forward.
    * ZeRO-0 under ``bf16`` with a ``PipelineModule`` (``pp > 1``): ``BF16_Optimizer`` partitions the fp32 master
      weights and the optimizer state over the data-parallel group (``_setup_for_real_optimizer``:
      ``fp32_groups_flat_partition``, the ``torch.optim`` optimizer stepping that partition alone) and gathers the
      updated bf16 partitions after its step (``update_lp_params``), as at ZeRO-1; the gradients are all-reduced
      whole (``PipelineEngine._exec_reduce_grads`` -> ``_bf16_reduce_grads`` -> ``buffered_allreduce_fallback``).
      The rule says so (``pipeline_partitions_optimizer``): the pricing, which knows the pipeline degree, prices
      such a plan at ZeRO-1's states and synchronisation (``ZeroSync.partition_stage``). ``fp32`` at ZeRO-0 runs
      the bare optimizer, whole on every rank; without a pipeline ``FP16_Optimizer`` keeps every state whole.

    >>> zero_sync(zero_stage=1, precision="bf16-mixed")  # BF16_Optimizer
    ZeroSync(bucket_elements=500000000, reduction='all_reduce', reduction_overlaps_backward=False, gather_overlaps_forward=False, pipeline_partitions_optimizer=False)
    >>> zero_sync(zero_stage=2, precision="bf16-mixed").reduction_overlaps_backward, zero_sync(zero_stage=3, precision="fp32")
    (True, None)
    >>> zero_sync(zero_stage=0, precision="fp32").reduction_overlaps_backward  # the engine's all-reduce, after backward
    False
    >>> [zero_sync(zero_stage=0, precision=p).pipeline_partitions_optimizer for p in ("bf16-mixed", "fp32")]
    [True, False]
    """
    if zero_stage not in ZERO_SYNC_STAGES:
        return None
    engine_reduces = zero_stage == 0 or (
        zero_stage == ACCUMULATE_IN_FP32 and precision == "bf16-mixed" and offload == "none")  # after the backward
    pipeline_bf16 = zero_stage == 0 and precision == "bf16-mixed"  # BF16_Optimizer under a PipelineModule
    return ZeroSync(bucket_elements=BUCKET_ELEMENTS, reduction="all_reduce",
                    reduction_overlaps_backward=not engine_reduces, gather_overlaps_forward=False,
                    pipeline_partitions_optimizer=pipeline_bf16)
