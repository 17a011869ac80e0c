"""The one-line refusal of a plan priced with FP8 linear layers by a launcher that does not train FP8."""

from __future__ import annotations

from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings

__all__ = ["refuse_fp8", "FP8_REFUSALS"]

FP8_REFUSALS = {
    "deepspeed": "DeepSpeed has no native FP8 training (its bf16/fp16 engines only; FP8 needs Transformer Engine modules "
                 "in the model)",
    "dtensor": "the DTensor plan trains the model's own PyTorch modules in bf16 autocast, without torchao's Float8Linear",
    "meshtf": "Mesh-TensorFlow has no FP8 data type",
}
"""Why each launcher that trains no FP8 refuses an FP8 row (``exporters.targets.Target.fp8`` is ``None``)."""


def refuse_fp8(settings: TrainingSettings, launcher: str) -> None:
    """Raise :class:`UnsupportedExport` when ``settings`` are FP8 (one line: why, and the launchers that run it)."""
    if settings.fp8 is not None:
        raise UnsupportedExport(f"{FP8_REFUSALS[launcher]}; export FP8 rows with --export megatron or torchtitan, "
                                "or plan with --dtype bf16")
