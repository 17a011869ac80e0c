"""The main job's speed: the launchable default of ``planner plan`` against another tree's (issue 22).

Each case runs ``planner plan MODEL -n N --dim ... --json -q`` as a subprocess under
``/usr/bin/time -v`` (wall seconds and peak resident memory of the planner process), ``--repeat``
times; the table gives medians (wall and CPU seconds: user + system, the fairer figure on a shared
machine). With ``--against PATH`` (a checkout of an earlier commit, e.g.
``git worktree add /tmp/before 40723e3``) each case also runs that tree's ``planner plan`` with the
same arguments, interleaved with ours so both see the same machine load, and the table gives the
ratio of the medians (ours / theirs). Both use this interpreter (the same libraries).

Usage::

    .venv/bin/python bench/launchable.py --against /tmp/before --repeat 3 \\
        --case examples/gpt2.onnx:16:batch=32,seq=1024
    .venv/bin/python bench/launchable.py --case examples/large/gpt3_175b.onnx:1024:seq=2048 --global-batch 1536

No assertion here: the figures go to docs/PERFORMANCE.md with the command.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_TIME = "/usr/bin/time"


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    wall_s: float
    cpu_s: float
    """User + system seconds (less sensitive to other jobs on a shared machine than wall time)."""
    peak_bytes: float
    rows: int
    exit_code: int
    best_s: float | None


def _case(text: str) -> tuple[str, int, dict[str, int]]:
    """``MODEL:DEVICES:dim=v,dim=v``."""
    model, devices, dims = (text.split(":") + [""])[:3]
    bound = {k: int(v) for k, v in (item.split("=") for item in dims.split(",") if item)}
    return model, int(devices), bound


def _run(tree: Path, model: str, devices: int, dims: dict[str, int], extra: list[str], timeout_s: float) -> Run:
    args = [str(ROOT / model) if not Path(model).is_absolute() else model, "-n", str(devices), "--json", "-q", *extra]
    for name, value in dims.items():
        args += ["--dim", f"{name}={value}"]
    code = "import sys; from planner.cli import main; sys.argv[0] = 'planner'; main()"
    command = [_TIME, "-v", sys.executable, "-c", code, "plan", *args]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=timeout_s,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    hours, minutes, seconds = (float(g) if g else 0.0 for g in wall.groups()) if wall else (0.0, 0.0, float("nan"))
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    cpu = sum(float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", done.stderr))
    rows, best = 0, None
    try:
        data = json.loads(done.stdout)
        data = data[0] if isinstance(data, list) else data
        points = data.get("rows", data.get("points", []))
        rows = len(points)
        rank = data.get("chosen_rank") or data.get("chosen")
        if rank:
            best = points[rank - 1].get("step_time_s")
    except (json.JSONDecodeError, AttributeError, IndexError, TypeError):
        pass
    return Run(wall_s=hours * 3600 + minutes * 60 + seconds, cpu_s=cpu, peak_bytes=float(peak.group(1)) * 1024 if peak else 0.0,
               rows=rows, exit_code=done.returncode, best_s=best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", required=True, help="MODEL:DEVICES:dim=v,dim=v")
    parser.add_argument("--against", type=Path, help="another checkout to compare with (same arguments)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--global-batch", type=int)
    parser.add_argument("--extra", default="", help="more arguments for both, e.g. '--mem-limit 16GB'")
    parser.add_argument("--timeout", type=float, default=600.0)
    options = parser.parse_args()
    extra = options.extra.split() + (["--global-batch", str(options.global_batch)] if options.global_batch else [])
    print("| model | devices | ours: wall (s) | CPU (s) | peak (GiB) | rows | pick (ms) | theirs: wall (s) | CPU (s) "
          "| rows | pick (ms) | ratio (CPU) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for text in options.case:
        model, devices, dims = _case(text)
        ours, theirs = [], []
        for _ in range(options.repeat):
            ours.append(_run(ROOT, model, devices, dims, extra, options.timeout))
            if options.against is not None:
                theirs.append(_run(options.against, model, devices, dims, extra, options.timeout))
        ours_s = statistics.median(r.wall_s for r in ours)
        theirs_s = statistics.median(r.wall_s for r in theirs) if theirs else float("nan")
        ours_cpu = statistics.median(r.cpu_s for r in ours)
        theirs_cpu = statistics.median(r.cpu_s for r in theirs) if theirs else float("nan")
        last, other = ours[-1], theirs[-1] if theirs else None
        pick = lambda run: "-" if run is None or run.best_s is None else f"{run.best_s * 1e3:.2f}"  # noqa: E731
        print(f"| {Path(model).stem} | {devices} | {ours_s:.2f} | {ours_cpu:.2f} | "
              f"{max(r.peak_bytes for r in ours) / 2**30:.2f} | {last.rows} | {pick(last)} | {theirs_s:.2f} | "
              f"{theirs_cpu:.2f} | {other.rows if other else '-'} | {pick(other)} | {ours_cpu / theirs_cpu:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
