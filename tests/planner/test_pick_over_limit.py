"""``--pick N --export`` of a row over the memory limit: exported as asked, with one warning that names the
row's memory per device, the limit, and the pick that fits (a launch of it would run out of memory).

Oracle: the row's bytes and ``fits`` in the same table's ``--json`` (bytes against ``memory_limit_bytes``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.core.units import format_bytes
from tests.planner.cli_helpers import run_cli

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
ARGS = [GPT2, "-n", 2, "--dim", "batch=16", "--dim", "seq=128", "--mem-limit", "318MB", "-q"]


@pytest.fixture(scope="module")
def table() -> dict:
    """The table at the 318 MB limit (each row holds about 308 MB of NCCL's buffers: its data-parallel group), planned once
    for both tests."""
    return json.loads(run_cli(["plan", *ARGS, "--json"]).stdout)


def test_a_row_over_the_limit_is_exported_with_one_warning(tmp_path, table):
    over = [row for row in table["rows"] if not row["fits"]]
    assert over and table["chosen_rank"] is not None  # the 318 MB limit leaves the fastest row (321.6 MB) over it
    row = over[0]
    assert row["memory_per_device_bytes"] > table["memory_limit_bytes"]
    out = tmp_path / "plan.json"
    result = run_cli(["plan", *ARGS, "--pick", row["rank"], "--export", "megatron", "-o", out])
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: row {row['rank']} needs {format_bytes(row['memory_per_device_bytes'])} per device, over the "
        f"{format_bytes(table['memory_limit_bytes'])} limit: a launch of it will not fit; the pick within the "
        f"limit is #{table['chosen_rank']}"]
    assert json.loads(out.read_text())  # exported as asked


def test_a_row_within_the_limit_warns_nothing(tmp_path, table):
    result = run_cli(["plan", *ARGS, "--pick", table["chosen_rank"], "--export", "megatron", "-o", tmp_path / "p.json"])
    assert not [line for line in result.stderr.splitlines() if line.startswith("warning:")]
