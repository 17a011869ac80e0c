"""What a run costs (issue 24 item 7): ``planner plan ... --tokens 2T --price-per-gpu-hour 2.5`` adds each
row's days, GPU-hours and dollars. Every figure here is worked out by hand from the row's step time,
global batch and the cluster's device count (steps = ceil(tokens / (global batch x sequence length)))."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner.core.errors import InputError
from planner.run_cost import RunRequest, parse_count, price_run, run_request
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
GPT2 = ROOT / "examples" / "gpt2.onnx"
MLP = ROOT / "examples" / "mlp.onnx"
GPT2_PLAN = ["plan", GPT2, "-n", "2", "--dim", "batch=8", "--dim", "seq=128", "-q"]
"""GPT-2 at sequence length 128 (tokens per sample) and global batch 8, on 2 devices."""


class TestParseCount:
    @pytest.mark.parametrize("text, value", [
        ("2T", 2_000_000_000_000), ("300B", 300_000_000_000), ("1.5b", 1_500_000_000), ("10K", 10_000),
        ("7M", 7_000_000), ("300e9", 300_000_000_000), ("2_000", 2_000), ("1,000,000", 1_000_000), ("0.5K", 500),
        ("1e18", 10**18),
    ])  # fmt: skip
    def test_suffixes_are_decimal(self, text, value):
        assert parse_count(text, "--tokens") == value

    @pytest.mark.parametrize("text, needle", [
        ("0", "must be positive"), ("-5", "must be positive"), ("2X", "cannot read"), ("nan", "cannot read"),
        ("inf", "cannot read"), ("", "cannot read"), ("T", "cannot read"), ("9" * 5000, "cannot read"),
        ("1e19", r"over 10\^18"), ("0.5", "not a whole number"),
    ])  # fmt: skip
    def test_refused_with_the_fix(self, text, needle):
        with pytest.raises(InputError, match=needle) as caught:
            parse_count(text, "--tokens")
        assert "--tokens" in str(caught.value) and len(str(caught.value)) < 300


class TestPriceRun:
    def test_tokens_by_hand(self):
        """1e9 tokens, 16 samples of 128 tokens a step (2,048 tokens): 1e9 / 2,048 = 488,281.25, so
        488,282 steps; at 0.5 s a step, 244,141 s = 2.8257 days; on 8 devices 244,141 x 8 / 3,600 =
        542.5356 GPU-hours; at $2.50, $1,356.34."""
        request = RunRequest(tokens=10**9, price_per_gpu_hour=2.5)
        cost = price_run(request, step_time_s=0.5, global_batch=16, devices=8, tokens_per_sample=128)
        assert cost.steps == 488_282
        assert cost.seconds == pytest.approx(244_141.0)
        assert cost.days == pytest.approx(2.825706, rel=1e-6)
        assert cost.gpu_hours == pytest.approx(542.535556, rel=1e-6)
        assert cost.cost == pytest.approx(1356.338889, rel=1e-6)

    def test_samples_by_hand_and_no_price(self):
        """1,000 samples at 64 a step: 15.625, so 16 steps of 2 s on 4 devices: 32 s, 128 device-seconds."""
        cost = price_run(RunRequest(samples=1_000), step_time_s=2.0, global_batch=64, devices=4, tokens_per_sample=None)
        assert (cost.steps, cost.seconds, cost.cost) == (16, 32.0, None)
        assert cost.gpu_hours == pytest.approx(128 / 3600)

    @pytest.mark.parametrize("tokens, samples, price, needle", [
        (None, None, 2.5, "add its size, --tokens N"),
        ("2T", "1M", None, "not both"),
        ("2T", None, float("nan"), "--price-per-gpu-hour must be"),
        ("2T", None, float("inf"), "--price-per-gpu-hour must be"),
        ("2T", None, 0.0, "--price-per-gpu-hour must be"),
        ("2T", None, -1.0, "--price-per-gpu-hour must be"),
    ])  # fmt: skip
    def test_request_refusals(self, tokens, samples, price, needle):
        with pytest.raises(InputError, match=needle):
            run_request(tokens, samples, price)
        assert run_request(None, None, None) is None


@pytest.fixture(scope="module")
def priced() -> dict:
    """GPT-2's launchable frontier with a 2T-token run at $2.50 per GPU-hour, as JSON."""
    return json.loads(run_cli([*GPT2_PLAN, "--tokens", "2T", "--price-per-gpu-hour", "2.5", "--json"]).stdout)


class TestPlanCommand:
    def test_every_row_by_hand(self, priced):
        """2e12 tokens / (8 samples x 128 tokens) = 1,953,125,000 steps exactly, on every row (one global batch)."""
        assert priced["run"] == {"tokens": 2 * 10**12, "samples": 2e12 / 128, "tokens_per_sample": 128, "devices": 2,
                                 "price_per_gpu_hour": 2.5}  # fmt: skip
        assert priced["rows"]
        for row in priced["rows"]:
            devices = _launched(row, 2)
            assert row["global_batch"] == 8 and row["run"]["devices"] == devices
            steps = 2 * 10**12 // (8 * 128)
            assert steps * 8 * 128 == 2 * 10**12 and row["run"]["steps"] == steps == 1_953_125_000
            seconds = steps * row["step_time_s"]
            assert row["run"]["seconds"] == pytest.approx(seconds, rel=1e-12)
            assert row["run"]["days"] == pytest.approx(seconds / 86_400, rel=1e-12)
            assert row["run"]["gpu_hours"] == pytest.approx(seconds * devices / 3_600, rel=1e-12)
            assert row["run"]["cost_usd"] == pytest.approx(seconds * devices / 3_600 * 2.5, rel=1e-12)
        baseline = priced["baseline_data_parallel"]
        assert baseline["run"]["days"] == pytest.approx(1_953_125_000 * baseline["step_time_s"] / 86_400, rel=1e-12)

    def test_the_table_shows_the_first_row(self):
        """Days, GPU-hours and dollars worked out by hand from the step time the same row shows (4 significant
        digits, so 1.3e-4 of rounding): read from one run, the check holds whichever row a loaded machine's
        time limit leaves first (h28a saw the table's and a separate --json run's picks differ under load), picked
        (``*``) or not (a tie group's pick may be another row)."""
        table = run_cli([*GPT2_PLAN, "--tokens", "2T", "--price-per-gpu-hour", "2.5", "--top", "1"]).stdout
        line = next(line for line in table.splitlines() if re.match(r"│ 1( \*)? +│", line))
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        figure, unit = cells[1].split()[:2]
        seconds = 1_953_125_000 * float(figure) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]
        days, gpu_hours = seconds / 86_400, seconds * 2 / 3_600
        assert cells[4].startswith("$")
        shown = [float(cell.lstrip("$").replace(",", "")) for cell in cells[2:5]]
        for figure, value in zip(shown, (days, gpu_hours, gpu_hours * 2.5)):  # whole from 100 on, else 3 digits
            assert figure == pytest.approx(value, rel=5e-3, abs=0.5 if value >= 100 else 0)
        assert "run: 2T tokens (15,625,000,000 samples of 128 tokens)" in table
        assert "GPU-hours = days x 24 x 2 devices; cost = GPU-hours x $2.50" in table

    def test_samples_on_a_model_without_a_sequence(self):
        """The MLP has no attention: --tokens says to count samples; --samples 1M at its global batch 8 is
        125,000 steps."""
        args = ["plan", MLP, "-n", "2", "--dim", "batch=8", "-q"]
        result = run_cli([*args, "--tokens", "1B"], 2)
        assert "has no attention" in result.stderr and "--samples N" in result.stderr
        data = json.loads(run_cli([*args, "--samples", "1M", "--json"]).stdout)
        for row in data["rows"]:
            assert row["run"]["steps"] == 125_000 and row["run"]["cost_usd"] is None
            assert row["run"]["gpu_hours"] == pytest.approx(125_000 * row["step_time_s"] * _launched(row, 2) / 3_600,
                                                            rel=1e-12)
        assert data["run"]["tokens_per_sample"] is None and data["run"]["samples"] == 1_000_000

    def test_without_the_flags_nothing_changes(self):
        data = json.loads(run_cli(["plan", MLP, "-n", "2", "--dim", "batch=8", "-q", "--json"]).stdout)
        assert "run" not in data and all("run" not in row for row in data["rows"])

    def test_a_sweep_prices_each_count_on_its_own_devices(self):
        data = json.loads(run_cli(["plan", MLP, "-n", "2,4", "--dim", "batch=8", "-q", "--json", "--samples", "80",
                                   "--price-per-gpu-hour", "3"]).stdout)  # fmt: skip
        for frontier in data:
            devices = frontier["devices"]
            assert frontier["run"]["devices"] == devices
            for row in frontier["rows"]:
                launched = _launched(row, devices)
                assert row["run"]["cost_usd"] == pytest.approx(10 * row["step_time_s"] * launched / 3_600 * 3, rel=1e-12)

    def test_rows_on_fewer_devices_bill_those(self):
        """No launcher runs GPT-2 tiny's 2 samples on all 64 devices: the rows launch on at most 16, and
        each run bills the devices its degrees multiply to, not the 64 asked for."""
        data = json.loads(run_cli(["plan", DATA / "gpt2_tiny.onnx", "-n", "64", "--dim", "seq=64", "--global-batch", "2",
                                   "--samples", "2000", "--price-per-gpu-hour", "2", "--json", "-q"]).stdout)  # fmt: skip
        assert data["devices"] == 64 and data["rows"]
        for row in data["rows"]:
            launched = _launched(row, 64)
            assert launched <= 16 and row["run"]["devices"] == launched
            assert row["run"]["cost_usd"] == pytest.approx(1_000 * row["step_time_s"] * launched / 3_600 * 2, rel=1e-12)


def _launched(row: dict, cluster_devices: int) -> int:
    """The devices a row launches on: its degrees' product for a launcher's row, the cluster's for a
    per-op plan only the generic plan runs."""
    degrees = row["degrees"]
    if set(row["targets"]) <= {"generic"}:
        return cluster_devices
    return degrees["dp"] * degrees["tp"] * degrees["pp"] * degrees.get("cp", 1)

    @pytest.mark.parametrize("extra, needle", [
        (["--tokens", "2X"], "cannot read --tokens '2X'"),
        (["--tokens", "0"], "--tokens must be positive"),
        (["--price-per-gpu-hour", "2.5"], "add its size"),
        (["--tokens", "2T", "--price-per-gpu-hour", "nan"], "--price-per-gpu-hour must be"),
        (["--tokens", "2T", "--price-per-gpu-hour", "-1"], "--price-per-gpu-hour must be"),
        (["--tokens", "2T", "--price-per-gpu-hour", "abc"], "Invalid value for '--price-per-gpu-hour'"),
        (["--tokens", "2T", "--samples", "5"], "not both"),
        (["--tokens", "2T", "--target", "generic", "--method", "dp", "--cost", "pase"], "FLOP-equivalents"),
    ])  # fmt: skip
    def test_refused_before_the_search_in_one_line(self, monkeypatch, extra, needle):
        import planner.launchable as launchable
        import planner.plan as plan_module

        def refuse(*args, **kwargs):
            raise AssertionError("searched before checking the run's flags")

        monkeypatch.setattr(launchable, "plan_launchable_file", refuse)
        monkeypatch.setattr(plan_module, "plan_file", refuse)
        result = run_cli([*GPT2_PLAN, *extra], 2)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


def test_help_shows_the_flags_and_an_example():
    text = run_cli(["plan", "--help"]).stdout
    assert "--tokens" in text and "--price-per-gpu-hour" in text and "--samples" in text
    assert "--tokens 2T --price-per-gpu-hour 2.5" in " ".join(text.split())
