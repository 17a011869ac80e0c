"""The gradient accumulator DeepSpeed's bf16 optimizer keeps (:func:`grad_accumulator`, ``Target.grad_accumulator``)
and the ZeRO stage at which the export asks for it (:data:`ACCUMULATE_IN_FP32`), from DeepSpeed 0.19.8's source:
``deepspeed/runtime/engine.py`` (which optimizer wraps the model) and ``deepspeed/runtime/bf16_optimizer.py``
(what ``BF16_Optimizer`` allocates). Priced by ``objectives.pipeline_price.grad_accumulator_scale``.
"""

from __future__ import annotations

__all__ = ["ACCUMULATE_IN_FP32", "grad_accumulator"]

ACCUMULATE_IN_FP32 = 1
"""The ZeRO stage at which the export asks for fp32 gradient accumulation under bf16
(``data_types.grad_accum_dtype: "fp32"``, :func:`grad_accumulator`): Megatron-DeepSpeed's bf16 path."""


def grad_accumulator(*, zero_stage: int, pp: int, grad_accum_dtype: str | None = None, offload: str = "none") -> float:
    """Bytes per parameter of the gradient accumulator DeepSpeed 0.19.8's bf16 optimizer keeps beside the
    bf16 gradients of every parameter the rank holds, for a ``bf16`` config (the pricing adds it under
    ``bf16-mixed`` only: ``objectives.pipeline_price.grad_accumulator_scale``).

    Which optimizer wraps the model (``deepspeed/runtime/engine.py``, ``_do_optimizer_sanity_check``):

    * ZeRO-1 with ``grad_accum_dtype`` fp32 and no CPU offload: ``BF16_Optimizer`` (as Megatron-DeepSpeed's
      bf16 runs, BLOOM's); ZeRO-1 otherwise, ZeRO-2 and ZeRO-3: the ZeRO optimizers, whose gradients are
      partitioned or reduced in place (no whole accumulator): 0;
    * ZeRO-0 with bf16 accumulation (the default, ``grad_accum_dtype`` unset) under a ``PipelineModule``
      (``pipeline_parallelism``): ``BF16_Optimizer`` accumulating in bf16; without one, ``FP16_Optimizer``
      in bf16 (``DDP_BFLOAT16``), no accumulator: 0; ZeRO-0 with fp32 accumulation raises
      ``NotImplementedError`` ("unsupported mix"), which the export never writes.

    ``BF16_Optimizer._setup_for_real_optimizer`` (``deepspeed/runtime/bf16_optimizer.py``) allocates
    ``fp32_groups_gradients_flat = torch.zeros_like(bf16_groups_flat, dtype=grad_acc_dtype)``: the whole
    flat group on every data-parallel rank (its fp32 master copy and optimizer state are partitioned),
    kept beside the bf16 ``param.grad`` (``immediate_grad_update`` is off by default,
    ``runtime/precision_config.py``), so 4 bytes per parameter under fp32, 2 under bf16.

    ``grad_accum_dtype``: ``"fp32"``, ``"bf16"`` or ``None``: the export's (fp32 at ZeRO
    :data:`ACCUMULATE_IN_FP32`, else unset: the bf16 default).

    Examples
    --------
    >>> grad_accumulator(zero_stage=1, pp=1)  # the export's ZeRO-1: BF16_Optimizer, fp32 accumulation
    4.0
    >>> grad_accumulator(zero_stage=0, pp=4), grad_accumulator(zero_stage=0, pp=1), grad_accumulator(zero_stage=2, pp=1)
    (2.0, 0.0, 0.0)
    """
    if grad_accum_dtype is None:
        grad_accum_dtype = "fp32" if zero_stage == ACCUMULATE_IN_FP32 and offload == "none" else "bf16"
    if zero_stage == 1 and grad_accum_dtype == "fp32" and offload == "none":
        return 4.0
    if zero_stage == 0 and pp > 1 and grad_accum_dtype == "bf16":
        return 2.0
    return 0.0
