"""One helper for every CLI test: run the app in-process and check the exit code."""

from __future__ import annotations

from typer.testing import CliRunner

from planner.cli import app

_runner = CliRunner()


def run_cli(args: list[str], expected_exit_code: int = 0):
    """Run ``planner ARGS``; assert the exit code; return the result (``.stdout``, ``.stderr`` apart)."""
    result = _runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == expected_exit_code, (
        f"exit {result.exit_code} != {expected_exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        + (f"\nexception: {result.exception!r}" if result.exception else "")
    )
    return result
