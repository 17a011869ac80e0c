"""How far past ``--time-limit`` a plan runs: wall / limit per model and limit (issue 22 / 25).

Each case is one ``planner plan MODEL -n N --devices-per-node 8 --dim ... --time-limit T --json -q``
subprocess, timed from outside (its wall clock includes the interpreter's start and the planner's
import, which the limit does not cover: ``--help``) and from inside (the plan's own ``--time-limit``
note, "... N s in all", when the limit cut something or the plan outlasted it). The table gives per
case the wall seconds, wall / limit, the seconds past the limit, the seconds outside the plan's own
clock (wall less the note's total), the CPU seconds and the note's phases; the summary the median and
the largest ratio. Models are ONNX files; the dims each declares are bound from ``--dim`` (default
batch 16, seq and tgt_seq 512, as ``bench/zoo_plan.py``).

Usage::

    nice -n 10 .venv/bin/python bench/time_limit_overrun.py --devices 32 --limits 5,15,60 \\
        tests/zoo/mamba2_dynamo_bare.onnx tests/zoo/llama_dynamo_bare.onnx -- --global-batch 256

No assertion here: the figures go to docs/PERFORMANCE.md ("--time-limit as a wall clock") with the
command and the load (``uptime``) printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIMS = {"batch": 16, "seq": 512, "tgt_seq": 512, "samples": 16000}
"""Bound only where a model declares the dim (as ``bench/zoo_plan.py`` does)."""
_CLI = "import sys; from planner.cli import main; sys.argv = ['planner'] + sys.argv[1:]; main()"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One plan's clocks."""

    model: str
    limit_s: float
    wall_s: float
    """Seconds from the subprocess's start to its exit (interpreter, import, plan, table)."""
    cpu_s: float
    """User + system CPU seconds of the subprocess."""
    status: str
    """``ok``, ``exit N`` (the planner's one-line refusal) or ``timeout``."""
    note: str
    """The plan's own ``--time-limit`` note (its phases' seconds), or ``""``."""

    @property
    def ratio(self) -> float:
        """Wall / limit."""
        return self.wall_s / self.limit_s

    @property
    def outside_s(self) -> float | None:
        """Wall seconds outside the plan's own clock (interpreter start, the planner's import, the table,
        exit): the wall less the note's "N s in all"; ``None`` without a note."""
        found = re.search(r", ([0-9.]+) s in all", self.note)
        return None if found is None else self.wall_s - float(found.group(1))


def _declared_dims(path: Path) -> list[str]:
    """The model's symbolic input dims (what ``--dim`` may bind)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return sorted({d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param})


def run_case(path: Path, devices: int, limit_s: float, dims: dict[str, int], extra: list[str], timeout_s: float) -> Outcome:
    """Plan ``path`` on ``devices`` at ``--time-limit limit_s`` in a subprocess and read its clocks."""
    bound = [f"{name}={dims[name]}" for name in _declared_dims(path) if name in dims]
    command = [sys.executable, "-c", _CLI, "plan", str(path), "-n", str(devices), "--devices-per-node", "8",
               *[arg for b in bound for arg in ("--dim", b)], "--time-limit", f"{limit_s:g}", "--json", "-q", *extra]
    started, before = time.perf_counter(), os.times()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Outcome(model=path.stem, limit_s=limit_s, wall_s=time.perf_counter() - started, cpu_s=float("nan"),
                       status="timeout", note="")
    wall = time.perf_counter() - started
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    note = ""
    if done.returncode == 0:
        try:
            answer = json.loads(done.stdout)
            notes = answer[0]["search"]["notes"] if isinstance(answer, list) else answer["search"]["notes"]
            note = next((n for n in notes if n.startswith("--time-limit")), "")
        except (ValueError, KeyError, IndexError, TypeError):
            note = "(no JSON)"
    return Outcome(model=path.stem, limit_s=limit_s, wall_s=wall, cpu_s=cpu,
                   status="ok" if done.returncode == 0 else f"exit {done.returncode}", note=note)


def _uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} / {five:.1f} / {fifteen:.1f} (1 / 5 / 15 min), {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files")
    parser.add_argument("--devices", type=int, default=32)
    parser.add_argument("--limits", default="5,15,60", help="--time-limit values, comma-separated (s)")
    parser.add_argument("--dim", action="append", default=[], help="name=value, bound where the model declares it")
    parser.add_argument("--timeout", type=float, default=900.0, help="kill a case after this many wall seconds")
    args = parser.parse_args(argv)
    dims = dict(DEFAULT_DIMS)
    dims.update({k: int(v) for k, v in (d.split("=", 1) for d in args.dim)})
    limits = [float(x) for x in args.limits.split(",")]
    print(f"# {_uptime()}; devices {args.devices}; extra {' '.join(extra) or '-'}", flush=True)
    print("| model | limit s | wall s | wall / limit | past limit s | outside the plan s | CPU s | status | the plan's note |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    outcomes = []
    for path in args.models:
        for limit in limits:
            found = run_case(path, args.devices, limit, dims, extra, args.timeout)
            outcomes.append(found)
            outside = "-" if found.outside_s is None else f"{found.outside_s:.1f}"
            print(f"| {found.model} | {limit:g} | {found.wall_s:.1f} | {found.ratio:.2f} | {found.wall_s - limit:+.1f} | "
                  f"{outside} | {found.cpu_s:.1f} | {found.status} | {found.note.split(';')[0]} |", flush=True)
    ratios = [o.ratio for o in outcomes]
    print(f"\nwall / limit over {len(ratios)} cases: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}; "
          f"seconds past the limit: max {max(o.wall_s - o.limit_s for o in outcomes):+.1f}")
    print(f"# {_uptime()}")


if __name__ == "__main__":
    main()
