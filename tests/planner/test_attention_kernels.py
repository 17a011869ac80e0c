"""A launcher is offered only the attention kernels its export can name (``Target.attention_kernels``): Megatron-LM's
``--attention-backend`` takes flash, fused (cuDNN) or unfused, so a plan priced with ``--attention flex`` is no
Megatron-LM row and ``--target megatron --attention flex`` is refused in one line before any search."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters.megatron.export import ATTENTION_BACKENDS, megatron_attention_args
from exporters.targets import TARGETS
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.planner.cli_helpers import error_line, run_cli

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"


def test_megatrons_kernels_are_the_backends_its_export_writes():
    assert set(TARGETS["megatron"].attention_kernels) == set(ATTENTION_BACKENDS)
    with pytest.raises(UnsupportedExport, match="no flex attention backend"):
        megatron_attention_args("flex")


@pytest.mark.parametrize(("launcher", "attention", "runs"), [
    ("megatron", "flex", False), ("megatron", "cudnn", True), ("megatron", None, True),
    ("deepspeed", "flex", True),  # states no kernels: its model's own attention module runs
])
def test_a_row_priced_with_a_kernel_the_launcher_lacks_is_not_its(launcher, attention, runs):
    settings = dataclasses.replace(TrainingSettings(), engine="fused", attention=attention)
    assert TARGETS[launcher].runs_settings(settings, data_parallel=1) is runs


def test_the_cli_refuses_megatron_with_flex_in_one_line():
    result = run_cli(["plan", LLAMA, "-n", "2", "--dim", "batch=4", "--dim", "seq=64", "--target", "megatron",
                      "--attention", "flex", "-q"], expected_exit_code=2)
    assert "--target megatron can run no plan of llama_tiny: it runs no flex attention (its kernels: flash, cudnn, " \
           "explicit); plan with --attention flash / cudnn / explicit" in error_line(result)
