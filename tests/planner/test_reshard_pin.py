"""``--fix reshard=default|always|never``: FSDP2's ``reshard_after_forward`` policy as a pinned knob (issue 24
item 2). The pin keeps ZeRO-3 rows of the launchers that set the flag (torchtitan, DTensor), names the policy
in the ZeRO column and the JSON, and is refused in one line where it cannot apply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.core.degrees import parse_fix
from planner.core.errors import InputError
from tests.planner.cli_helpers import error_line, run_cli

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
PLAN = ["plan", TINY, "-n", "2", "--dim", "batch=4", "--dim", "seq=64", "-q", "--fix", "pp=1,dp=2,mb=2"]


def test_the_pin_is_read_and_checked():
    assert parse_fix("reshard=never").reshard == "never"
    assert parse_fix("reshard=default,zero=1").reshard == "default"  # the default pins nothing to shard
    with pytest.raises(InputError, match="must be default, always or never"):
        parse_fix("reshard=sometimes")
    with pytest.raises(InputError, match="ZeRO-3 only; drop zero=1 or reshard"):
        parse_fix("reshard=never,zero=1")


def test_a_launcher_without_the_flag_is_refused_in_one_line():
    result = run_cli([*PLAN, "--target", "megatron", "--fix", "reshard=never"], expected_exit_code=2)
    assert "megatron does not set" in error_line(result)


def test_every_row_is_an_fsdp2_zero3_row_with_the_policy():
    # every launcher asked: those that set no such flag are not searched, and say why
    table = json.loads(run_cli([*PLAN, "--fix", "reshard=never,recompute=none", "--json"]).stdout)
    assert table["rows"] and table["launchers"] == ["dtensor"]  # torchtitan refuses GPT-2's LayerNorm model
    assert all("reshard_after_forward" in why for why in (table["refused"][n] for n in ("megatron", "deepspeed")))
    for row in table["rows"]:
        assert row["zero_stage"] == 3 and row["reshard_after_forward"] == "never"
        assert row["summary"].endswith("ZeRO-3, reshard never")
