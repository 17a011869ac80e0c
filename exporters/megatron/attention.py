"""The attention kernels Megatron-LM can be told to run (``--attention-backend``), read by its registry entry
(``Target.attention_kernels``) and its export (:func:`exporters.megatron.export.megatron_attention_args`)."""

from __future__ import annotations

__all__ = ["ATTENTION_BACKENDS"]

ATTENTION_BACKENDS = {"flash": "flash", "cudnn": "fused", "explicit": "unfused"}
"""``--attention-backend`` (megatron-core's ``AttnBackend``) for the kernel a plan was priced with
(:mod:`objectives.flash_rates`): TransformerEngine's cuDNN ``FusedAttention``, its FlashAttention-2 or the
unfused scores. Its keys are the kernels the launcher can be told to run."""
