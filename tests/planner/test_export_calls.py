"""``plan --pick --export`` runs no exporter more than once per exported row (issue 17).

The table's launchers column comes from each target's families (mask membership), and a refusal's
nearest runnable plan from the rows the plan built; only the exported row meets an exporter.
Every exporter in the registry is wrapped with a counter. The launchable search asks each launcher
once whether it can run the model at all (:func:`planner.plan_targets.target_refusal`, its exporter on the
replicated one-device plan, so a refused launcher is not searched; ``--export``'s refusal before the search
asks the same and shares the answer): those probes' exporter runs are counted apart, at most one per
launcher and cluster, never one per row.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from exporters.targets import TARGETS
from tests.planner.cli_helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
GPT2 = DATA / "gpt2_tiny.onnx"


@pytest.fixture
def probes(monkeypatch) -> Counter:
    """The model-level probes' exporter runs (``target_refusal``: ``--export``'s refusal before the search and
    the search's own, which share one answer), by launcher; filled by :func:`calls`."""
    import planner.launchable as launchable
    import planner.plan_targets as plan_targets

    real = plan_targets.target_refusal

    def probe(graph, cluster, settings, target):
        _PROBING.append(target)
        try:
            return real(graph, cluster, settings, target)
        finally:
            _PROBING.pop()

    monkeypatch.setattr(launchable, "target_refusal", probe)
    monkeypatch.setattr(plan_targets, "target_refusal", probe)
    return Counter()


_PROBING: list[str] = []


@pytest.fixture
def calls(monkeypatch, probes):
    """Exporter calls outside the probes, by target (those inside are counted in ``probes``). The tables compare
    times exactly: on GPT-2 tiny the rows of other launchers than Megatron-LM step within ``TIME_TIE``
    (``planner.search.pareto``) of its leaner tensor-parallel rows, which leaves them off the table since
    2026-12-02, and these tests need rows of several launchers."""
    import planner.launchable
    import planner.search.pipeline

    monkeypatch.setattr(planner.launchable, "TIME_TIE", 0.0)  # the table's union (the searches compare exactly)
    counted: Counter[str] = Counter()
    for name, target in list(TARGETS.items()):

        def counting(plan_input, _export=target.export, _name=name):
            (probes if _PROBING else counted)[_name] += 1
            return _export(plan_input)

        monkeypatch.setitem(TARGETS, name, dataclasses.replace(target, export=counting))  # type: ignore[index]
    return counted


def _at_most_one_probe_each(probes: Counter) -> None:
    assert set(probes) <= {name for name, target in TARGETS.items() if target.restricts}
    assert all(count == 1 for count in probes.values()), probes


ARGS = ["plan", GPT2, "-n", "4", "--dim", "batch=8", "--dim", "seq=32", "-q"]
MIXED = [*ARGS, "--fix", "zero=2"]
"""A table whose rows some launchers run and others do not (at ZeRO-2 DeepSpeed runs the one-device row
only; without the pin Megatron-LM's leaner sequence-parallel rows dominate every shared one, and at ZeRO-1
DeepSpeed's BF16_Optimizer accumulator makes its rows dominated)."""


@pytest.mark.parametrize("export", ["megatron", "dtensor", "generic"])
def test_one_exporter_call_for_the_exported_row(calls, probes, export, tmp_path):
    # row 1 of --target X is a plan X runs; every row is exported as the generic plan
    out = tmp_path / "plan.json"
    listed = [] if export == "generic" else ["--target", export]
    run_cli([*ARGS, *listed, "--pick", "1", "--export", export, "-o", out])
    assert dict(calls) == {export: 1}
    _at_most_one_probe_each(probes)
    assert json.loads(out.read_text())["target"] == export if export != "generic" else out.exists()


def test_a_refusal_calls_its_exporter_once_and_names_the_nearest_plan(calls, probes):
    # --zero 1: Mesh-TF has no ZeRO, so it refuses every row; no listed row is one it runs
    result = run_cli([*ARGS, "--zero", "1", "--pp", "1", "--pick", "1", "--export", "meshtf"], expected_exit_code=2)
    assert dict(calls) == {"meshtf": 1}
    _at_most_one_probe_each(probes)
    assert "Mesh-TensorFlow has no ZeRO sharding" in result.stderr
    assert "nearest expressible plan: no listed row; `--target meshtf` lists the plans it runs" in result.stderr


def test_the_nearest_plan_is_the_fastest_listed_row_the_target_runs(calls, probes):
    """A refused row names the fastest row within the limit that the launcher runs (the oracle: the
    same frontier from :func:`planner.launchable.plan_launchable_file`), found on the rows already
    built, with no more exporter calls."""
    from objectives.cluster import make_cluster
    from planner.core.degrees import Pins
    from planner.core.settings import TrainingSettings
    from planner.core.units import format_bytes, format_seconds
    from planner.launchable import plan_launchable_file
    from planner.plan import PlanRequest

    data = json.loads(run_cli([*MIXED, "--json"]).stdout)
    rows = data["rows"]
    # a launcher that runs some listed rows and not others
    target = next(name for name in data["launchers"] if any(name in p["targets"] for p in rows)
                  and not all(name in p["targets"] for p in rows))  # fmt: skip
    refused = next(i for i, p in enumerate(rows) if target not in p["targets"])
    result = run_cli([*MIXED, "--pick", str(refused + 1), "--export", target], expected_exit_code=2)
    assert dict(calls) == {target: 1}
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4), settings=TrainingSettings())
    _, (oracle,) = plan_launchable_file(GPT2, {"batch": 8, "seq": 32}, [request], pins=Pins(zero=2))
    assert [r.time_s for r in oracle.rows] == pytest.approx([p["step_time_s"] for p in rows], rel=1e-12)
    nearest = next(i for i, r in enumerate(oracle.rows) if target in r.targets and r.fits)
    row = oracle.rows[nearest]
    assert all(row.time_s <= r.time_s for r in oracle.rows if target in r.targets and r.fits)
    line = (f"nearest expressible plan: row {nearest + 1}: {row.summary}, {format_seconds(row.time_s)}/step, "
            f"{format_bytes(row.memory_bytes)}/device (--pick {nearest + 1})")
    assert line in result.stderr


def test_the_launchers_column_runs_no_exporter(calls, probes):
    result = run_cli([*MIXED, "--json"])
    rows = json.loads(result.stdout)["rows"]
    assert len(rows) > 1 and any(len(p["targets"]) > 1 for p in rows)
    assert sum(calls.values()) == 0
    _at_most_one_probe_each(probes)


def test_the_pipeline_table_runs_no_exporter_and_exports_once(calls, probes, tmp_path):
    # --global-batch: the launchers column (masks and stage rules) and --target run no exporter; the
    # exported row meets its exporter once
    # (pp pinned: with the launchers' host costs a model this small is fastest without a pipeline)
    args = ["plan", GPT2, "-n", "8", "--dim", "seq=32", "--global-batch", "16", "-q", "--target", "megatron", "--fix", "pp=2"]
    rows = json.loads(run_cli([*args, "--json"]).stdout)["rows"]
    assert rows and all("megatron" in p["targets"] for p in rows) and any(p["pp"] > 1 for p in rows)
    assert sum(calls.values()) == 0
    out = tmp_path / "megatron.json"
    run_cli([*args, "--pick", "1", "--export", "megatron", "-o", out])
    assert dict(calls) == {"megatron": 1}
    assert json.loads(out.read_text())["target"] == "megatron"
