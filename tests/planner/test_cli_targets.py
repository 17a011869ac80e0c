"""The CLI's targets come from the registry (issue 17): a launcher is one module plus one entry.

A toy launcher is registered for the test only (``monkeypatch.setitem(TARGETS, ...)``): it runs the
strategies of DeepSpeed's families (data parallelism and AutoTP) and exports a tiny document. With
nothing else changed, ``--target toy`` restricts the search, the table's column names it, and
``--export toy`` writes its plan.
"""

from __future__ import annotations

import json
from pathlib import Path

from exporters.targets import TARGETS, Target, target_names
from tests.planner.cli_helpers import run_cli

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
ARGS = ["plan", GPT2, "-n", "4", "--dim", "batch=8", "--dim", "seq=32", "-q"]


def _toy(plan_input) -> dict:
    return {"target": "toy", "choice": list(plan_input.strategy.choice)}


def _register(monkeypatch) -> None:
    deepspeed = TARGETS["deepspeed"]
    # DeepSpeed's families and its bf16 optimizer's gradient accumulator (a memory rule its rows are priced with)
    toy = Target(name="toy", help="a test launcher", export=_toy, families=deepspeed.families,
                 grad_accumulator=deepspeed.grad_accumulator)
    monkeypatch.setitem(TARGETS, "toy", toy)  # type: ignore[index]


def test_help_lists_every_registered_target():
    text = run_cli(["plan", "--help"]).stdout
    flat = " ".join(text.split())
    for name in TARGETS:
        assert name in flat
    assert target_names() == "generic, megatron, deepspeed, meshtf, dtensor or torchtitan"


def test_unknown_target_names_the_registry(monkeypatch):
    result = run_cli([*ARGS, "--target", "toy"], expected_exit_code=2)
    assert "unknown --target 'toy'; use generic, megatron, deepspeed, meshtf, dtensor or torchtitan" in result.stderr
    _register(monkeypatch)
    result = run_cli([*ARGS, "--target", "nope"], expected_exit_code=2)
    assert "use generic, megatron, deepspeed, meshtf, dtensor, torchtitan or toy" in result.stderr


def test_one_registry_entry_makes_a_launcher(monkeypatch, tmp_path):
    import planner.launchable as launchable

    _register(monkeypatch)
    # toy has no execution model of its own (objectives.execution): priced like DeepSpeed here, its
    # rows are DeepSpeed's
    priced = ["--engine", "fused", "--attention", "flash"]
    # ZeRO-2: DeepSpeed's rows reach the frontier (unpinned, Megatron-LM's leaner rows dominate them; at ZeRO-1
    # its BF16_Optimizer accumulator does), with times compared exactly: on this host-bound model they step within
    # TIME_TIE (planner.search.pareto) of Megatron-LM's leaner tensor-parallel rows, which leaves them off the table
    import planner.search.pipeline

    monkeypatch.setattr(launchable, "TIME_TIE", 0.0)  # the table's union (the searches compare exactly)
    plain = json.loads(run_cli([*ARGS, *priced, "--fix", "zero=2", "--json"]).stdout)
    assert "toy" in plain["launchers"]
    # the column: toy runs exactly the rows DeepSpeed runs without pipeline stages (same families, no
    # settings rules) and, with no stage rule, no pipeline
    rows = plain["rows"]
    assert [("toy" in p["targets"]) for p in rows] == [("deepspeed" in p["targets"] and p["pp"] == 1) for p in rows]
    assert any("toy" in p["targets"] for p in rows)
    restricted = json.loads(run_cli([*ARGS, "--target", "toy", "--json"]).stdout)
    assert restricted["launchers"] == ["toy"]
    assert restricted["rows"] and all("toy" in p["targets"] for p in restricted["rows"])
    out = tmp_path / "toy.json"
    seen = []
    search = launchable.plan_launchable_file

    def recorded(*args, **kwargs):
        warnings, frontiers = search(*args, **kwargs)
        seen.extend(frontiers)
        return warnings, frontiers

    monkeypatch.setattr(launchable, "plan_launchable_file", recorded)
    run_cli([*ARGS, "--target", "toy", "--pick", "1", "--export", "toy", "-o", out])
    (frontier,) = seen
    assert frontier.rows[0].time_s == restricted["rows"][0]["step_time_s"]
    choice = list(launchable.row_plan_input(frontier.rows[0]).strategy.choice)
    assert json.loads(out.read_text()) == {"target": "toy", "choice": choice}
