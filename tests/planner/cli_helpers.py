"""One helper for every CLI test: run the app in-process and check the exit code."""

from __future__ import annotations

from typer.testing import CliRunner

import planner.cli
from planner.cli import app

_runner = CliRunner()

# The runner's stderr is not a terminal, so a command running over PLAIN_PROGRESS_AFTER_S would print
# progress lines there, and tests reading stderr would depend on the machine's speed. Progress lines
# are tested on their own (test_cli_newuser.py sets this back to 0).
planner.cli.PLAIN_PROGRESS_AFTER_S = float("inf")


def run_cli(args: list[str], expected_exit_code: int = 0):
    """Run ``planner ARGS``; assert the exit code; return the result (``.stdout``, ``.stderr`` apart)."""
    result = _runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == expected_exit_code, (
        f"exit {result.exit_code} != {expected_exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        + (f"\nexception: {result.exception!r}" if result.exception else "")
    )
    return result


def error_line(result) -> str:
    """The one ``error:`` line of a refused command's stderr (asserted: exactly one, no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr  # one line, no traceback
    assert "Traceback" not in result.stderr
    return lines[0]
