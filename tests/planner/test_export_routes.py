"""Every route to an export says the same thing (issue 25, task H2, item 1).

``planner.export.export_point`` (the Python API's export of a :class:`~planner.plan.PlanResult` point)
called a target's exporter directly, past :func:`exporters.export`'s settings checks and its refusal
suffix: a GPT-2 point planned with torchtitan's op-level recomputation was written out as a Megatron-LM
plan that Megatron-LM cannot run, and torchtitan's refusal of GPT-2 ended "; export as the generic plan"
where the command line names the four launchers that run it. It now goes through
:func:`exporters.export`. The oracles: the registry's own recomputation modes, and every exporter run on
the same plan (:func:`exporters.runnable_targets`) for the launchers a suffix names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import exporters
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.errors import InputError, UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.export import export_point, plan_input
from planner.launchable import export_row, launch_frontier, row_plan_input
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest, load_graph, plan

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
SUFFIX = re.compile(r"; export (?:with --target (.+?),? or )?as the generic plan$")


def _request(**settings) -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=4, devices_per_node=4),
                       settings=TrainingSettings(**settings))


def _refusal(call) -> str:
    with pytest.raises(UnsupportedExport) as refused:
        call()
    return refused.value.reason


def _named(reason: str) -> set[str]:
    found = SUFFIX.search(reason)
    assert found is not None, reason
    return set(re.split(r", | or ", found.group(1))) if found.group(1) else set()


@pytest.fixture(scope="module")
def gpt2():
    return load_graph(GPT2, {"batch": 8, "seq": 64})


def test_a_settings_refusal_reaches_the_python_api(gpt2):
    result = plan(gpt2, _request(recompute="op"))
    for name in ("megatron", "deepspeed", "meshtf", "dtensor"):
        assert "op" not in TARGETS[name].recompute  # the registry: op-level recomputation is torchtitan's alone
        via_api = _refusal(lambda: export_point(result, 0, name))
        via_door = _refusal(lambda: exporters.export(name, plan_input(result, 0)))
        assert via_api == via_door
        assert via_api.startswith(f"{name} runs activation recomputation {', '.join(TARGETS[name].recompute)}, not 'op'")


def test_a_refusal_of_the_model_names_the_same_launchers_by_every_route(gpt2):
    result = plan(gpt2, _request())
    via_api = _refusal(lambda: export_point(result, 0, "torchtitan"))
    runs = set(exporters.runnable_targets(plan_input(result, 0))) - {"generic"}  # every exporter run on the point
    assert runs and _named(via_api) == runs
    # the command line's route (the launchable table's row) refuses the same model in the same words; a
    # DTensor row (priced as torchtitan's PyTorch runs, so its settings are torchtitan's too)
    loader = graph_loader(GPT2, {"seq": 64})
    frontier = launch_frontier(loader, _request(), options=PipelineOptions(global_batch=8), launchers=("dtensor",))
    via_cli = _refusal(lambda: export_row(frontier, 0, "torchtitan"))
    row_runs = set(exporters.runnable_targets(row_plan_input(frontier.rows[0]))) - {"generic"}
    assert _named(via_cli) == row_runs
    # the row is listed for DTensor alone, and the refusal says so first (sweep H4, finding 7f)
    assert frontier.rows[0].targets == ("dtensor",)
    listed = "the table lists row 1 for dtensor, not torchtitan: "
    assert via_cli.startswith(listed)
    assert SUFFIX.sub("", via_api) == SUFFIX.sub("", via_cli.removeprefix(listed))


def test_a_row_priced_for_megatron_kernels_is_refused_where_the_column_does_not_list_it():
    """A Megatron-LM row's memory credits the sequence-parallel shard its linear layers save for backward
    (``Target.sequence_shard_saved``); DTensor's exporter wrote such a ZeRO-3 row though the table's
    ``launchers`` column (the rules) did not list DTensor. Every route now agrees with the column."""
    loader = graph_loader(GPT2, {"seq": 64})
    frontier = launch_frontier(loader, _request(), options=PipelineOptions(global_batch=8))
    credited = [row for row in frontier.rows if row_plan_input(row).settings.sequence_shard_saved]
    assert credited and not TARGETS["dtensor"].sequence_shard_saved and TARGETS["megatron"].sequence_shard_saved
    for row in credited:
        assert "dtensor" not in row.targets
        with pytest.raises(UnsupportedExport, match=r"^dtensor keeps the gathered sequence-parallel input"):
            exporters.export("dtensor", row_plan_input(row))


def test_an_unknown_target_names_the_flag(gpt2):
    result = plan(gpt2, _request())
    with pytest.raises(InputError, match=r"^unknown --export 'megatorn'; use generic, megatron"):
        export_point(result, 0, "megatorn")
