"""One ``planner plan`` at scale, timed (CPU, wall, peak memory), compared with another tree, profiled (issue 22).

The search-speed bars of docs/PERFORMANCE.md are CPU seconds of whole ``planner plan`` runs on the
large examples (the 1T model on 3,072 devices, GPT-3 175B on 1,024). This runs one case as a
subprocess of this interpreter (``python -P -c``: ``planner.cli.main`` of the tree on ``PYTHONPATH``,
the working directory left off ``sys.path``) and reads the child's own resource usage
(``os.wait4``): user and system CPU seconds, wall seconds, peak resident memory. From the ``--json``
it prints the rows, the (pp, micro-batch, recompute, ZeRO) combinations and intra-op searches, and the
pick (rank and step time).

``--against DIR`` runs the same case on another checkout too (``git archive COMMIT | tar -x -C DIR``;
``DIR`` goes on ``PYTHONPATH``; both use the models under this file's tree) and says whether the two
``--json`` answers are the same, compared parsed with every ``search_time_s`` dropped (the only field a
faster search may change), else the first path where they differ. The two run one after the other
(``--order``: which first), or at once with ``--side-by-side`` (the fairer CPU ratio on a shared
machine: both see the same load). The load average is printed before and after each run: CPU seconds
inflate when other jobs share the cores, so quote the ratio of runs made at one load.

``--profile DIR`` writes each run's cProfile (``DIR/<case>-<tree>.prof``; ``python -m pstats`` reads
it) and prints its ``--top`` functions by own time; a profiled run is about twice as slow.

Cases (``--case``, repeatable; or ``--args "plan MODEL ..."`` for any other):

* ``1t``: ``examples/large/gpt_1t.onnx -n 3072 --dim seq=2048 --global-batch 3072 --time-limit 3600``;
* ``175b``: ``examples/large/gpt3_175b.onnx -n 1024 --dim seq=2048 --global-batch 1536 --time-limit 1200``;
* ``gpt2``: ``examples/gpt2.onnx -n 16 --mem-limit 16GB --dim batch=32 --dim seq=1024 --time-limit 1200``;

each with ``--json -q``.

Usage::

    git archive 71ae542 | tar -x -C /tmp/base     # the tree before a change
    .venv/bin/python bench/scale_plan.py --case 1t --against /tmp/base --side-by-side
    .venv/bin/python bench/scale_plan.py --case 175b --profile /tmp/prof --top 30
    .venv/bin/python bench/scale_plan.py --args "plan examples/llama.onnx -n 64 --dim batch=64 --dim seq=2048"

No assertion: the figures go to docs/PERFORMANCE.md with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CASES: dict[str, str] = {
    "1t": "plan examples/large/gpt_1t.onnx -n 3072 --dim seq=2048 --global-batch 3072 --time-limit 3600",
    "175b": "plan examples/large/gpt3_175b.onnx -n 1024 --dim seq=2048 --global-batch 1536 --time-limit 1200",
    "gpt2": "plan examples/gpt2.onnx -n 16 --mem-limit 16GB --dim batch=32 --dim seq=1024 --time-limit 1200",
}
"""The bars' cases (docs/PERFORMANCE.md, issue 22) and the small one every lever is checked on."""

DROPPED = frozenset({"search_time_s"})
"""Fields of ``--json`` left out of the comparison: the search's own wall time, which a faster tree changes."""

_CHILD = r"""
import sys
from planner.cli import main
import os
sys.argv = ["planner", *sys.argv[1:]]
path = os.environ.get("SCALE_PLAN_PROFILE")
if not path:
    main()
else:
    import cProfile
    profile, code = cProfile.Profile(), 0
    try:
        profile.runcall(main)
    except SystemExit as stop:
        code = stop.code
    finally:
        profile.dump_stats(path)
    sys.exit(code)
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One ``planner plan`` subprocess."""

    tree: str
    user_s: float
    """CPU seconds in user mode (the child's own, ``os.wait4``)."""
    system_s: float
    """CPU seconds in the kernel."""
    wall_s: float
    peak_bytes: int
    """Peak resident set of the child (``ru_maxrss``, kB on Linux, in bytes here)."""
    exit_code: int
    load: tuple[float, float]
    """1-minute load average when the run started and when it ended."""
    answer: Any
    """The parsed ``--json`` (``None`` when it did not parse)."""
    error: str

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.system_s


def plan_args(case: str | None, args: str | None) -> list[str]:
    """The ``planner`` arguments of a named case or of ``args``, with ``--json -q``; a file path that exists
    under this tree is made absolute (both trees read this tree's models)."""
    words = shlex.split(CASES[case] if case else args or "")
    if not words or words[0] != "plan":
        raise SystemExit("error: --args must start with 'plan' (e.g. --args \"plan examples/gpt2.onnx -n 16\")")
    words = [str(ROOT / w) if not w.startswith("-") and (ROOT / w).is_file() else w for w in words]
    return words + [flag for flag in ("--json", "-q") if flag not in words]


def comparable(answer: Any) -> Any:
    """``answer`` without the :data:`DROPPED` fields, at any depth."""
    if isinstance(answer, dict):
        return {key: comparable(value) for key, value in answer.items() if key not in DROPPED}
    if isinstance(answer, list):
        return [comparable(value) for value in answer]
    return answer


def first_difference(ours: Any, theirs: Any, path: str = "$") -> str | None:
    """The first path (``$.rows[3].step_time_s``) where two parsed answers differ, ``None`` if they are equal."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in list(ours) + [k for k in theirs if k not in ours]:
            if key not in ours or key not in theirs:
                return f"{path}.{key} (only in {'ours' if key in ours else 'theirs'})"
            found = first_difference(ours[key], theirs[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return f"{path} ({len(ours)} items against {len(theirs)})"
        for index, (a, b) in enumerate(zip(ours, theirs)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return None
    return None if ours == theirs and type(ours) is type(theirs) else f"{path} ({ours!r} against {theirs!r})"


def _start(tree: Path, words: list[str], out: Path, profile: Path | None) -> tuple[subprocess.Popen, float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if profile is not None:
        env["SCALE_PLAN_PROFILE"] = str(profile)
    with open(out, "w") as stdout, open(out.with_suffix(".err"), "w") as stderr:
        child = subprocess.Popen([sys.executable, "-P", "-c", _CHILD, *words], cwd=tree, env=env,
                                 stdout=stdout, stderr=stderr)
    return child, time.perf_counter(), os.getloadavg()[0]


def _reap(started: list[tuple[str, Path, Path, tuple[subprocess.Popen, float, float]]], timeout_s: float) -> dict[str, Run]:
    """Wait for the ``started`` children, each timed to the moment it ends (``os.wait4`` on whichever ends first:
    side by side, the one that ends first is not charged the other's wall time); a child past ``timeout_s`` is killed."""
    pending = {child.pid: (label, tree, out, child, t0, load) for label, tree, out, (child, t0, load) in started}
    timers = [threading.Timer(max(timeout_s - (time.perf_counter() - t0), 0.0), child.kill)
              for _, _, _, child, t0, _ in pending.values()]
    for timer in timers:
        timer.start()
    runs: dict[str, Run] = {}
    while pending:
        pid, status, usage = os.wait4(-1, 0)
        if pid not in pending:
            continue
        label, tree, out, child, t0, load = pending.pop(pid)
        child.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        try:
            answer, error = json.loads(out.read_text()), ""
        except json.JSONDecodeError:
            lines = out.with_suffix(".err").read_text().strip().splitlines()
            answer, error = None, lines[-1] if lines else f"exit {child.returncode}"
        runs[label] = Run(tree=str(tree), user_s=usage.ru_utime, system_s=usage.ru_stime, wall_s=wall,
                          peak_bytes=usage.ru_maxrss * 1024, exit_code=child.returncode,
                          load=(load, os.getloadavg()[0]), answer=answer, error=error)
    for timer in timers:
        timer.cancel()
    return runs


def run_case(name: str, words: list[str], trees: list[tuple[str, Path]], *, side_by_side: bool, keep: Path,
             profile: Path | None, timeout_s: float) -> dict[str, Run]:
    """Each tree's run of ``words``, at once (``side_by_side``) or one after the other in ``trees``' order."""
    def begin(label: str, tree: Path):
        out = keep / f"{name}-{label}.json"
        return label, tree, out, _start(tree, words, out, profile / f"{name}-{label}.prof" if profile else None)

    if side_by_side:
        return _reap([begin(label, tree) for label, tree in trees], timeout_s)
    runs: dict[str, Run] = {}
    for label, tree in trees:
        runs.update(_reap([begin(label, tree)], timeout_s))
    return runs


def _summary(run: Run) -> str:
    """Rows, combinations, intra-op searches and the pick of a run's answer."""
    if not isinstance(run.answer, dict):
        return f"failed: {run.error}"
    data, search = run.answer, run.answer.get("search") or {}
    rank = data.get("chosen_rank")
    pick = f"#{rank} {data['rows'][rank - 1]['step_time_s'] * 1e3:.2f} ms" if rank else "none"
    return (f"{len(data.get('rows', []))} rows, {search.get('combinations', '-')} combinations, "
            f"{search.get('intra_op_searches', '-')} intra-op searches, pick {pick}")


def report(name: str, runs: dict[str, Run]) -> list[str]:
    """Markdown rows of one case: each tree's figures, then the CPU ratio and whether the answers agree."""
    lines = []
    for label, run in runs.items():
        lines.append(f"| {name} | {label} | {run.cpu_s:.2f} ({run.user_s:.2f} + {run.system_s:.2f}) | {run.wall_s:.1f} | "
                     f"{run.peak_bytes / 2**30:.2f} | {run.load[0]:.1f}-{run.load[1]:.1f} | {_summary(run)} |")
    if len(runs) == 2:
        ours, theirs = runs.values()
        if ours.answer is None or theirs.answer is None:
            same = "not compared (a run failed)"
        else:
            found = first_difference(comparable(ours.answer), comparable(theirs.answer))
            same = "`--json` identical but `search_time_s`" if found is None else f"DIFFERS at {found}"
        lines.append(f"| {name} | ratio | {ours.cpu_s / theirs.cpu_s:.3f} | {ours.wall_s / theirs.wall_s:.3f} | "
                     f"{ours.peak_bytes / max(theirs.peak_bytes, 1):.2f} | | {same} |")
    return lines


def _print_profile(path: Path, top: int) -> None:
    print(f"\n{path} (top {top} by own time):")
    pstats.Stats(str(path), stream=sys.stdout).sort_stats("tottime").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="a named case (repeatable)")
    parser.add_argument("--args", help='any other case: "plan MODEL -n N ..." (--json -q are added)')
    parser.add_argument("--against", type=Path, help="another checkout to run the same case on (its PYTHONPATH)")
    parser.add_argument("--side-by-side", action="store_true", help="run the two trees at once (same load)")
    parser.add_argument("--order", choices=("ours-first", "theirs-first"), default="theirs-first")
    parser.add_argument("--profile", type=Path, help="write each run's cProfile into this folder")
    parser.add_argument("--top", type=int, default=25, help="functions of each profile to print (by own time)")
    parser.add_argument("--keep", type=Path, help="folder for the runs' JSON and stderr (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is stopped")
    options = parser.parse_args()
    if not options.case and not options.args:
        parser.error("give --case NAME or --args \"plan MODEL ...\"")
    keep = options.keep or Path(tempfile.mkdtemp(prefix="scale_plan-"))
    keep.mkdir(parents=True, exist_ok=True)
    if options.profile:
        options.profile.mkdir(parents=True, exist_ok=True)
    trees = [("ours", ROOT)]
    if options.against is not None:
        if not (options.against / "planner").is_dir():
            parser.error(f"--against {options.against}: no planner/ package there (git archive COMMIT | tar -x -C DIR)")
        trees = [("ours", ROOT), ("theirs", options.against.resolve())]
        if options.order == "theirs-first":
            trees.reverse()
    cases = [(name, plan_args(name, None)) for name in options.case or []]
    if options.args:
        cases.append(("args", plan_args(None, options.args)))
    print(f"answers and stderr in {keep}")
    print("| case | tree | CPU s (user + system) | wall s | peak GiB | load (start-end) | answer |")
    print("|---|---|---:|---:|---:|---|---|")
    for name, words in cases:
        runs = run_case(name, words, trees, side_by_side=options.side_by_side, keep=keep, profile=options.profile,
                        timeout_s=options.timeout)
        ordered = {label: runs[label] for label in ("ours", "theirs") if label in runs}
        print("\n".join(report(name, ordered)), flush=True)
    if options.profile:
        for name, _ in cases:
            for label, _ in trees:
                _print_profile(options.profile / f"{name}-{label}.prof", options.top)


if __name__ == "__main__":
    main()
