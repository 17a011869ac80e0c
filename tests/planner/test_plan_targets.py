"""``plan(..., target_filter=...)`` on every bundled model and every target: rows that export, or a
one-line reason (never an internal error such as the OverflowError of issue 15)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exporters import PlanInput, export, target_masks
from objectives.cluster import make_cluster
from planner.core.errors import InputError, UnsupportedExport
from planner.export import export_point, target_filter
from planner.plan import PlanRequest, _fit_message, build_model, load_graph, plan

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ("megatron", "deepspeed", "meshtf", "dtensor")
# small bindings keep the matrix quick; the structure (what a target can run) does not depend on them, nor on
# 2 devices against 4 (each of the 56 cases took the same branch, the same 9 refused, in 58% of the time)
_DIMS = {"batch": 8, "seq": 32, "tgt_seq": 32}
_DEVICES = 2


def _models() -> list[tuple[str, Path, tuple[str, ...]]]:
    found = []
    for listing in (ROOT / "tests" / "data" / "models.json", ROOT / "examples" / "models.json"):
        for name, entry in json.loads(listing.read_text()).items():
            path = listing.parent / entry["file"]
            if path.is_file() and "large/" not in entry["file"]:  # the GPT-3 sizes: planned in bench/
                found.append((name, path, tuple(entry["dims"])))
    return found


MODELS = _models()


@pytest.fixture(scope="module")
def graphs():
    return {name: load_graph(path, {d: _DIMS[d] for d in dims}) for name, path, dims in MODELS}


def _request() -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=_DEVICES, devices_per_node=_DEVICES))


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", [m[0] for m in MODELS])
def test_every_row_exports_or_one_line_reason(graphs, name, target):
    graph = graphs[name]
    request = _request()
    spaces = build_model(graph, request).tables.configs
    # independent of plan(): does any family of the target allow a configuration of every op?
    masks = target_masks(target, graph, spaces, devices=_DEVICES, devices_per_node=_DEVICES)
    usable = [m for _label, m in masks if all(x.any() for x in m)]
    if not usable:
        with pytest.raises(InputError) as refused:
            plan(graph, request, target_filter=target_filter(target), with_targets=False)
        message = str(refused.value)
        assert message.startswith(f"--target {target} can run no strategy of {graph.name} on {_DEVICES} devices: ")
        assert "\n" not in message and message.endswith("or another target")
        # the reason is the target exporter's own refusal of the replicated strategy
        cost = build_model(graph, request)
        replicated = PlanInput(
            graph=graph, cluster=request.cluster, settings=request.settings, spaces=tuple(cost.tables.configs),
            strategy=cost.strategy([0] * len(graph.ops)), cost_model=request.cost_model,
        )  # fmt: skip
        with pytest.raises(UnsupportedExport) as exporter:
            export(target, replicated)
        reason = exporter.value.reason.rstrip(". ")  # its suffix names who runs this plan (exporters.elsewhere)
        assert (reason[:reason.rfind("; export ")] if reason.endswith("generic plan") else reason) in message
        return
    result = plan(graph, request, target_filter=target_filter(target))
    assert result.points
    for index, point in enumerate(result.points):
        assert target in point.targets
        assert isinstance(export_point(result, index, target), dict)  # the exporter really accepts it


class TestFitMessage:
    def test_infinite_smallest_gives_a_message_not_an_overflow(self):
        message = _fit_message(_request(), float("inf"), 80e9)
        assert message.startswith("no strategy of finite memory")

    def test_finite_ratio_names_the_device_factor(self):
        # 100 GB needed, 40 GB allowed: ceil(2.5) = 3x more devices
        assert "about 3x more devices" in _fit_message(_request(), 100e9, 40e9)
        assert np.ceil(100e9 / 40e9) == 3


@pytest.mark.parametrize(
    ("target", "devices", "per_node", "settings"),
    [
        ("deepspeed", 8, 8, {"zero_stage": 3}),  # AutoTP runs ZeRO 0-2: tp = 1 only
        ("deepspeed", 8, 8, {"zero_stage": 2}),
        ("megatron", 24, 8, {}),  # torchrun fills whole nodes: 12 processes (dp x tp = 12) on nodes of 8 cannot
        ("dtensor", 8, 8, {"zero_stage": 3}),
        ("dtensor", 24, 8, {"zero_stage": 3}),
    ],
)
def test_a_target_search_keeps_to_its_settings_rules(target, devices, per_node, settings):
    """``--target X`` searches only the families X's settings rules allow, so every row is one X
    runs (its targets column, and its exporter, say so) and the fastest X runs is the first row."""
    from planner.core.settings import TrainingSettings
    from planner.plan import fastest_runnable

    graph = load_graph(ROOT / "tests" / "data" / "llama_tiny.onnx", {"batch": 24, "seq": 32})
    request = PlanRequest(
        cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=per_node),
        settings=TrainingSettings(**settings),
    )
    result = plan(graph, request, target_filter=target_filter(target))
    assert result.points
    for index, point in enumerate(result.points):
        assert target in point.targets, point.summary
        assert isinstance(export_point(result, index, target), dict)
    # the oracle: the exact fastest over the families the settings allow, on the same tables (priced under the
    # target's ZeRO-1/2 rule, as plan() prices them: planner.plan_targets.target_priced)
    from planner.plan_targets import target_priced

    request = target_priced(request, target_filter(target))
    _summary, fastest = fastest_runnable(graph, request, build_model(graph, request), target)
    assert result.points[0].strategy.time_s == pytest.approx(fastest.time_s, rel=1e-9)
