"""``--quiet`` silences progress, not what the import says about the model: its warnings still print on
stderr, and ``--json`` carries them (``"warnings"``), so a script running ``plan --json -q`` keeps the facts
a sweep found hidden (a tied head read as untied, a sequence past a position table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp.onnx"
TYPO = "--dim sequence: not a dim of the model's inputs"


@pytest.mark.parametrize("search", [[], ["--target", "generic", "--method", "dp"]], ids=["launchable", "per-op"])
def test_quiet_json_keeps_the_import_warnings(search):
    result = run_cli(["plan", MLP, "--dim", "batch=8", "--dim", "sequence=3", "-n", "2", "-q", "--json", *search])
    assert TYPO in " ".join(result.stderr.split())
    warnings = json.loads(result.stdout)["warnings"]
    assert len(warnings) == 1 and TYPO in " ".join(warnings[0].split())


def test_no_warning_no_entry():
    result = run_cli(["plan", MLP, "--dim", "batch=8", "-n", "2", "-q", "--json"])
    assert json.loads(result.stdout)["warnings"] == [] and result.stderr.strip() == ""


def test_estimate_keeps_them_too():
    result = run_cli(["estimate", MLP, "--dim", "batch=8", "--dim", "sequence=3", "-n", "2", "--tp", "1", "--pp", "1",
                      "--micro-batch", "4", "--global-batch", "8", "-q", "--json"])
    assert TYPO in " ".join(result.stderr.split())
    assert [TYPO in " ".join(w.split()) for w in json.loads(result.stdout)["warnings"]] == [True]
