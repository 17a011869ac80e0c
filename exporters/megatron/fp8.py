"""Megatron-LM's FP8 flags for a plan priced with FP8 linear layers (``TrainingSettings.fp8``).

Megatron-LM trains FP8 through Transformer Engine (``TransformerConfig.fp8`` in megatron-core 0.16.1:
"enables the use of FP8 precision through Transformer Engine"), on top of ``--bf16``: its linear layers
(``TELayerNormColumnParallelLinear``, ``TERowParallelLinear``...) run FP8 GEMMs, the output layer stays a
bf16 ``ColumnParallelLinear``. The plan is priced with delayed scaling and a 1,024-step amax history
(:mod:`objectives.precision`), so the export names them rather than leaning on Megatron's defaults
(``fp8_recipe="delayed"``, but ``fp8_amax_history_len=1`` and ``fp8_amax_compute_algo="most_recent"``
in megatron-core 0.16.1's ``TransformerConfig``): ``--fp8-format hybrid`` (e4m3 forward, e5m2 for
gradients), ``--fp8-recipe delayed``, ``--fp8-amax-history-len 1024``, ``--fp8-amax-compute-algo max``,
Transformer Engine's own ``DelayedScaling`` defaults.

A row priced with its FP8 weights all-gathered in FP8 (``TrainingSettings.gathers_fp8``: Megatron's
``Target.fp8_param_gather`` under ZeRO 1-3) also gets ``--fp8-param-gather``: Megatron-LM sets
``TransformerConfig.fp8_param`` and ``DistributedDataParallelConfig.fp8_param_gather`` from it (megatron-core
0.16.1: the weights are created as Transformer Engine FP8 tensors and the distributed optimizer casts its
fp32 main shards to them, ``fp8_utils.quantize_param_shard``, before the all-gather); Megatron-LM's
``validate_args`` asserts the distributed optimizer, torch FSDP2 or Megatron-FSDP with it, and
``TransformerConfig.__post_init__`` raises "fp8_param must be used together with fp8 mode" without
``--fp8-format``. Megatron-FSDP (ZeRO 2-3) gathers FP8 parameters with Transformer Engine 2.3 or newer only
(``fp8_utils``: "FSDP with --fp8-param-gather is not supported in TE v...").
"""

from __future__ import annotations

from planner.core.errors import UnsupportedExport

__all__ = ["megatron_fp8_args", "FP8_NOTE", "AMAX_HISTORY_LEN"]

AMAX_HISTORY_LEN = 1024
"""The amax history the plan was priced with (``objectives.precision.AMAX_HISTORY_LEN``, which exporters
do not import; ``tests/exporters/test_fp8_exports.py`` holds the two equal)."""

FP8_NOTE = ("FP8 linear layers through Transformer Engine (--fp8-format hybrid, delayed scaling): install "
            "transformer-engine with Megatron-LM and keep --transformer-impl transformer_engine (the default); "
            "--fp8-param-gather with Megatron-FSDP (ZeRO-2/3) needs Transformer Engine 2.3 or newer")
"""The note an FP8 export carries: what the launch needs beyond megatron-core."""


def megatron_fp8_args(recipe: str | None, *, param_gather: bool = False) -> list[str]:
    """The FP8 flags of ``recipe`` (``TrainingSettings.fp8``); none without FP8. ``param_gather``: the row
    was priced with FP8 weights gathered in FP8 (``TrainingSettings.gathers_fp8``): ``--fp8-param-gather``.

    >>> megatron_fp8_args("delayed")
    ['--fp8-format', 'hybrid', '--fp8-recipe', 'delayed', '--fp8-amax-history-len', '1024', '--fp8-amax-compute-algo', 'max']
    >>> megatron_fp8_args("delayed", param_gather=True)[-1]
    '--fp8-param-gather'

    Raises
    ------
    UnsupportedExport
        A recipe Megatron-LM's plan was not priced for (torchao's ``rowwise``).
    """
    if recipe is None:
        return []
    if recipe != "delayed":
        raise UnsupportedExport(f"Megatron-LM's FP8 (Transformer Engine) is priced with delayed scaling, not {recipe}; "
                                "plan again with --target megatron --dtype fp8")
    return ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", str(AMAX_HISTORY_LEN),
            "--fp8-amax-compute-algo", "max"] + (["--fp8-param-gather"] if param_gather else [])
