"""``--export LAUNCHER`` on a model that launcher trains no plan of is refused before the search (issue 25, task H3).

``planner plan examples/resnet.onnx -n 8 --dim batch=32 --export torchtitan`` searched every launcher's
plans (25 s here) and only then said torchtitan trains no ResNet; on a large model that was minutes. The
launcher's refusal of the model (:func:`planner.plan.target_refusal`, its exporter run on the replicated
plan: about the model, not a layout) is now asked as soon as the model is imported
(:func:`planner.plan_targets.refuse_export`). The oracles: the reason is exactly what ``target_refusal``
says of the model, and no launcher's search (``planner.launchable._search_launchers``) is entered.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import planner.launchable
import planner.plan
from objectives.cluster import make_cluster
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph, refuse_export, target_refusal
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "examples" / "resnet.onnx"
LSTM = ROOT / "tests" / "zoo" / "lstm_lm_ts_bare.onnx"
CASES = [(RESNET, {"batch": 32}), (LSTM, {"batch": 4, "seq": 32})]
CLUSTER = make_cluster("a100-80gb", devices=8, devices_per_node=8)


def _dims(dims: dict[str, int]) -> list[str]:
    return [a for name, value in dims.items() for a in ("--dim", f"{name}={value}")]


@pytest.fixture
def no_search(monkeypatch):
    def searched(*args, **kwargs):
        raise AssertionError("the launchers' search ran before the refusal")

    monkeypatch.setattr(planner.launchable, "_search_launchers", searched)


@pytest.mark.parametrize("launcher", ["torchtitan", "megatron"])
@pytest.mark.parametrize(("model", "dims"), CASES, ids=["resnet", "lstm_lm"])
def test_a_launcher_that_trains_no_plan_of_the_model_is_refused_before_the_search(no_search, model, dims, launcher):
    reason = target_refusal(load_graph(model, dims), CLUSTER, TrainingSettings(), launcher)
    assert reason is not None and "has no attention" in reason  # neither model is a transformer
    result = run_cli(["plan", model, "--devices", "8", *_dims(dims), "--export", launcher], expected_exit_code=2)
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: --export {launcher} can export no plan of {model.stem}: {reason}"]
    assert not result.stdout  # no table: nothing was searched


def test_the_research_search_refuses_it_before_searching_too(monkeypatch):
    # --target generic with --method: the per-op search of one step (planner.plan.plan_file), same refusal
    def searched(*args, **kwargs):
        raise AssertionError("the per-op search ran before the refusal")

    monkeypatch.setattr(planner.plan, "plan", searched)
    reason = target_refusal(load_graph(RESNET, {"batch": 32}), CLUSTER, TrainingSettings(), "torchtitan")
    result = run_cli(["plan", RESNET, "--devices", "8", "--dim", "batch=32", "--target", "generic", "--method", "dp",
                      "--export", "torchtitan"], expected_exit_code=2)
    assert result.stderr.strip().splitlines() == [f"error: --export torchtitan can export no plan of resnet: {reason}"]


def test_a_launcher_that_runs_the_model_is_not_refused():
    # DeepSpeed trains any model by ZeRO data parallelism: its exporter accepts the replicated ResNet, so
    # ``--export deepspeed`` searches and exports as before; the generic plan is never refused
    graph = load_graph(RESNET, {"batch": 32})
    assert target_refusal(graph, CLUSTER, TrainingSettings(), "deepspeed") is None
    for export in ("deepspeed", "generic", None):
        refuse_export(graph, CLUSTER, TrainingSettings(), export, None)
    with pytest.raises(UnsupportedExport, match="^--export torchtitan can export no plan of resnet: model 'resnet'"):
        refuse_export(graph, CLUSTER, TrainingSettings(), "torchtitan", ("deepspeed",))


def test_target_naming_the_launcher_keeps_its_own_refusal(no_search):
    # --target torchtitan searches nothing either; its message (launch_messages.fit_message) is kept
    result = run_cli(["plan", RESNET, "--devices", "8", "--dim", "batch=32", "--target", "torchtitan",
                      "--export", "torchtitan"], expected_exit_code=2)
    said = result.stderr.strip().splitlines()[-1]
    assert said.startswith("error: nothing to export: --target torchtitan can run no plan of resnet: model 'resnet' has no")
