"""FSDP2's ``reshard_after_forward`` policy exported as priced (``TrainingSettings.reshard_after_forward``):
torchtitan 0.3.0's ``parallelism.fsdp_reshard_after_forward`` (``Literal["default", "always", "never"]``,
``config/configs.py``), the DTensor plan's ``fsdp.reshard_after_forward`` on every ``fully_shard`` call, the
generic plan's ``training.reshard_after_forward``; launchers that set no such flag do not run such a plan.
``tests/integration/test_torchtitan_export.py`` hands the override to torchtitan's own ``ConfigManager``."""

from __future__ import annotations

import pytest

from exporters import export
from exporters.dtensor import dtensor_masks, export_dtensor
from exporters.generic import plan_from_dict
from exporters.targets import TARGETS
from exporters.torchtitan import parse_torchtitan_overrides, torchtitan_masks, torchtitan_violations
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import first_rows, gpt_graph, llama_graph, make_cluster, make_input, spaces_for


def _torchtitan(settings: TrainingSettings) -> list[str]:
    graph = llama_graph()
    spaces = spaces_for(graph, 4)
    plan = make_input(graph, spaces, first_rows(torchtitan_masks(graph, spaces, dp=4, tp=1)),
                      cluster=make_cluster(1, 4), settings=settings)
    return export("torchtitan", plan)["overrides"]


@pytest.mark.parametrize("policy", ["always", "never"])
def test_torchtitan_writes_the_policy(policy):
    args = _torchtitan(TrainingSettings(zero_stage=3, reshard_after_forward=policy))
    assert args[args.index("--parallelism.fsdp_reshard_after_forward") + 1] == policy
    assert parse_torchtitan_overrides(args)["parallelism.fsdp_reshard_after_forward"] == policy
    assert torchtitan_violations(args, world_size=4) == []


def test_torchtitan_leaves_its_default_unwritten():
    args = _torchtitan(TrainingSettings(zero_stage=3))
    assert "--parallelism.fsdp_reshard_after_forward" not in args
    assert parse_torchtitan_overrides(args)["parallelism.fsdp_reshard_after_forward"] == "default"


def test_torchtitan_refuses_an_unknown_policy():
    # get_fsdp_reshard_after_forward_policy raises ValueError on any other string
    args = _torchtitan(TrainingSettings(zero_stage=3)) + ["--parallelism.fsdp_reshard_after_forward", "sometimes"]
    assert any("fsdp_reshard_after_forward 'sometimes'" in v for v in torchtitan_violations(args, world_size=4))


@pytest.mark.parametrize(("policy", "flag"), [("default", True), ("always", True), ("never", False)])
def test_dtensor_sets_every_fully_shard_call(policy, flag):
    graph = gpt_graph()
    spaces = spaces_for(graph, 4)
    settings = TrainingSettings(precision="fp32", zero_stage=3, reshard_after_forward=policy)
    plan = export_dtensor(make_input(graph, spaces, first_rows(dtensor_masks(graph, spaces, dp=4, tp=1)), settings=settings))
    assert plan["fsdp"]["reshard_after_forward"] is flag and plan["fsdp"]["root"] is True


def test_only_the_fsdp2_launchers_run_a_pinned_policy():
    never = TrainingSettings(zero_stage=3, reshard_after_forward="never")
    runs = sorted(name for name, target in TARGETS.items() if target.restricts and target.runs_settings(never))
    assert runs == ["dtensor", "torchtitan"]
    assert TARGETS["deepspeed"].runs_settings(TrainingSettings(zero_stage=3))  # default: every launcher as before


def test_the_generic_plan_keeps_the_policy():
    graph = gpt_graph()
    spaces = spaces_for(graph, 4)
    settings = TrainingSettings(precision="fp32", zero_stage=3, reshard_after_forward="never")
    document = export("generic", make_input(graph, spaces, first_rows(dtensor_masks(graph, spaces, dp=4, tp=1)),
                                            settings=settings))
    assert document["training"]["reshard_after_forward"] == "never"
    assert plan_from_dict(document).settings().reshard_after_forward == "never"


@pytest.mark.parametrize("name", ["megatron", "deepspeed"])
def test_a_launcher_without_the_flag_refuses_such_a_plan(name):
    # a saved never plan re-exported elsewhere would run resharded: not as priced
    graph = gpt_graph()
    spaces = spaces_for(graph, 4)
    plan = make_input(graph, spaces, first_rows(dtensor_masks(graph, spaces, dp=4, tp=1)),
                      settings=TrainingSettings(precision="fp32", zero_stage=3, reshard_after_forward="never"))
    with pytest.raises(UnsupportedExport, match=f"{name} sets no FSDP2 reshard_after_forward"):
        export(name, plan)
