"""DeepSpeed's ZeRO-3 gather bounds: what the memory price assumes (:data:`ZERO3_GATHER`, read as
``Target.zero3_gather``) and the ``zero_optimization`` keys the export writes for them
(:func:`zero3_gather_keys`), in one place so the run holds what was priced."""

from __future__ import annotations

from typing import Any

from planner.core.settings import Zero3Gather

__all__ = ["ZERO3_GATHER", "zero3_gather_keys"]

ZERO3_GATHER = Zero3Gather(
    prefetch_bucket=50_000_000, max_live=1_000_000_000, max_reuse_distance=1_000_000_000,
    persistence_threshold=100_000, reduce_bucket=500_000_000,
)
"""How DeepSpeed's ZeRO-3 gathers parameters (``objectives.memory.deepspeed_gathered_peak``): per
sub-module, under DeepSpeed's own defaults, which the export writes into ``zero_optimization`` so the
run holds what was priced. Source: ``deepspeed/runtime/zero/config.py`` (DeepSpeed 0.19.8,
``DeepSpeedZeroConfig``): ``stage3_prefetch_bucket_size`` 5e7, ``stage3_max_live_parameters`` 1e9,
``stage3_max_reuse_distance`` 1e9, ``stage3_param_persistence_threshold`` 1e5, ``reduce_bucket_size``
5e8 (elements), ``contiguous_gradients`` true (the gradient bucket is one preallocated buffer)."""


def zero3_gather_keys(gather: Zero3Gather) -> dict[str, Any]:
    """The ``zero_optimization`` keys that set ZeRO-3's gather bounds, as the memory price reads them
    (:class:`~planner.core.settings.Zero3Gather`, elements; ``contiguous_gradients``: the reduce bucket
    is one preallocated buffer, as priced).

    >>> zero3_gather_keys(ZERO3_GATHER)["stage3_prefetch_bucket_size"], zero3_gather_keys(ZERO3_GATHER)["reduce_bucket_size"]
    (50000000, 500000000)
    """
    return {
        "stage3_prefetch_bucket_size": gather.prefetch_bucket,
        "stage3_max_live_parameters": gather.max_live,
        "stage3_max_reuse_distance": gather.max_reuse_distance,
        "stage3_param_persistence_threshold": gather.persistence_threshold,
        "reduce_bucket_size": gather.reduce_bucket,
        "contiguous_gradients": True,
    }
