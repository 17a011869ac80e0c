"""A refused ``--pick N --export TARGET`` says first which launchers the table lists row N for (issue 25,
task H8; sweep H4, findings 7e and 7f): OLMo-2's row 1 is a Mesh-TF row, and exporting it for DeepSpeed
read "op .../embed_tokens/Gather (op) is split v=8; DeepSpeed ZeRO data parallelism (dp=1) splits it
replicated", a per-op reason with no word that the row was never DeepSpeed's; Megatron-LM's refusal of the
model ended "export with --target meshtf", the picked row's launcher, where the table's note names three.

Oracle: the table's own ``launchers`` column (each row's ``targets``) of a real frontier: GPT-2 tiny on 4
devices at ZeRO-2, whose row 1 (one device) Megatron-LM and DeepSpeed run and whose row 2 (tp=2)
Megatron-LM alone runs; torchtitan's llama3 family refuses the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import listed_elsewhere
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.launchable import export_row, launch_frontier
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"


@pytest.fixture(scope="module")
def frontier():
    """The table with exact time comparisons (``TIME_TIE`` 0): on this host-bound model the one-device and tp=2
    plans step within ``planner.search.pareto.TIME_TIE`` (1e-6) of a leaner tp=4 sp row, which leaves them off
    the table since 2026-12-02; these tests are about the refusals' words for rows of different launchers."""
    import planner.launchable
    import planner.search.pipeline

    loader = graph_loader(GPT2, {"seq": 32})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4, devices_per_node=4), settings=TrainingSettings())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(planner.launchable, "TIME_TIE", 0.0)  # the table's union (the searches compare exactly)
        found = launch_frontier(loader, request, options=PipelineOptions(global_batch=8), pins=Pins(zero=2))
    assert found.rows[0].targets == ("megatron", "deepspeed") and found.rows[0].fits
    assert found.rows[1].targets == ("megatron",)
    assert "torchtitan" in dict(found.refused)
    return found


def _refusal(frontier, index: int, target: str) -> UnsupportedExport:
    with pytest.raises(UnsupportedExport) as refused:
        export_row(frontier, index, target)
    return refused.value


def test_a_per_op_refusal_of_another_launchers_row_says_whose_row_it_is(frontier):
    """Row 2 for DeepSpeed: the row is Megatron-LM's, said before DeepSpeed's own reason; the nearest
    row is still row 1, the only row the column lists for DeepSpeed."""
    refused = _refusal(frontier, 1, "deepspeed")
    assert refused.reason.startswith("the table lists row 2 for megatron, not deepspeed: ")
    assert "DeepSpeed AutoTP" in refused.reason
    assert [i for i, row in enumerate(frontier.rows) if "deepspeed" in row.targets] == [0]
    assert refused.nearest_summary.startswith("row 1: ") and refused.nearest_summary.endswith("(--pick 1)")


def test_a_refusal_of_the_model_names_the_rows_launchers_first(frontier):
    """Row 1 for torchtitan, which refuses the model: the row's two launchers first, then the model's
    reason, whose suffix names the same two."""
    refused = _refusal(frontier, 0, "torchtitan")
    assert refused.reason.startswith("the table lists row 1 for megatron and deepspeed, not torchtitan: "
                                     "torchtitan's llama3 family would train a different model")
    assert refused.reason.endswith("; export with --target megatron or deepspeed, or as the generic plan")
    assert not refused.nearest_summary


def test_a_settings_refusal_keeps_its_fix_after_the_rows_launchers(frontier):
    refused = _refusal(frontier, 1, "meshtf")
    assert refused.reason == ("the table lists row 2 for megatron, not meshtf: Mesh-TensorFlow has no ZeRO sharding "
                              "(the plan uses ZeRO-2); plan with --zero 0")


def test_a_row_the_target_runs_gets_no_preamble():
    assert listed_elsewhere(("megatron", "deepspeed"), 0, "deepspeed") == ""
    assert listed_elsewhere(("deepspeed", "meshtf", "dtensor"), 4, "megatron") == (
        "the table lists row 5 for deepspeed, meshtf and dtensor, not megatron: ")
