"""The CLI parses its options and answers ``--help`` without loading the library: onnx (0.8-1.5 CPU s of
ml_dtypes' extension), numpy, networkx and the importers load only in the command that reads a model
(docs/PERFORMANCE.md, "CLI start-up (2026-12-02, task h27l)"). Each case runs in a fresh interpreter and
reads its ``sys.modules`` at exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("onnx", "onnxruntime", "numpy", "networkx", "pymoo", "importers")
PROBE = (
    "import atexit, sys\n"
    f"atexit.register(lambda: print('LOADED', sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.__stderr__))\n"
)


def _loaded(code: str, *args: str) -> tuple[int, list[str]]:
    """Exit code and the heavy modules loaded by ``code`` (run with ``args`` as ``sys.argv[1:]``)."""
    done = subprocess.run([sys.executable, "-c", PROBE + code, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    line = next(line for line in done.stderr.splitlines() if line.startswith("LOADED "))
    return done.returncode, eval(line.removeprefix("LOADED "))  # a list literal printed by the probe itself


def test_probe_sees_a_heavy_import():
    """The probe itself: importing the ONNX importers is seen (else the tests below could not fail)."""
    code, loaded = _loaded("import importers.onnx_load")
    assert code == 0 and "onnx" in loaded and "importers" in loaded


def test_import_planner_cli_loads_no_library():
    assert _loaded("import planner.cli") == (0, [])


@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"], ["export", "--help"], ["compare", "--help"]])
def test_help_loads_no_library(args):
    assert _loaded("from planner.cli import main; main()", *args) == (0, [])
