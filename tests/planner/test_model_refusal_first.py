"""``--target megatron`` on a model Megatron-LM cannot build is refused before any search (issue 25 budget, task H5).

A new-user sweep timed ``planner plan OLMoE -n 64 --global-batch 512 --target megatron`` at 172 s and 9.9 GB
only to refuse the model's whole-width QK norm. The refusal was already asked before the launchers'
search (:func:`planner.launchable.launch_frontier` -> ``_launchers`` -> :func:`planner.plan.target_refusal`);
the time was the import's ONNX shape inference at the global batch (see
``tests/importers/test_long_unsqueeze.py``). Here: the refusal of an OLMo-2 (whole-projection QK norm)
reaches the user as one line, exit 2, with exactly the words :func:`target_refusal` says of the model, and
no launcher search, data-parallel baseline or profile lookup runs first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import planner.launchable
from objectives.cluster import make_cluster
from planner.core.settings import TrainingSettings
from planner.plan import load_graph, target_refusal
from tests.planner.cli_helpers import error_line, run_cli

OLMO2 = Path(__file__).resolve().parents[1] / "exporters" / "data" / "olmo2_tiny.onnx"


@pytest.fixture
def nothing_searched(monkeypatch):
    def searched(*args, **kwargs):
        raise AssertionError("work past the refusal ran")

    for name in ("_search_launchers", "measured_lookup", "_data_parallel_baseline"):
        monkeypatch.setattr(planner.launchable, name, searched)


def test_a_whole_width_qk_norm_is_refused_for_megatron_before_the_search(nothing_searched):
    dims = {"batch": 512, "seq": 16}
    reason = target_refusal(load_graph(OLMO2, dims), make_cluster("h100-sxm", devices=64, devices_per_node=8),
                            TrainingSettings(), "megatron")
    assert reason is not None and "over the whole projection" in reason
    result = run_cli(["plan", OLMO2, "-n", "64", "--device", "h100-sxm", "--dim", "batch=1", "--dim", "seq=16",
                      "--global-batch", "512", "--target", "megatron", "-q"], expected_exit_code=2)
    line = error_line(result)
    assert line.startswith(f"error: 64 devices: --target megatron can run no plan of olmo2_tiny: {reason};")
    assert not result.stdout
