"""Issue 22's levers that re-did work, timed on the tree before and after in one run (medians, ratios).

* ``collapse``: one model's table at three ``--collapse`` tolerances (0, 1%, 5%). Before: a search per tolerance
  (``plan_launchable_file(collapse=)``); after: one search and :func:`planner.launchable.collapse_rows` for the
  other two (used where the tree has it).
* ``reprice``: every row of a table saved with ``--export generic`` and priced again one after another in one
  process (``planner explain`` / ``compare`` as a library; ``planner.repriced.reprice_saved``): measured with a
  memo of cost caches in the tree after (not kept: it saved nothing here, ``docs/PERFORMANCE.md``), so both trees
  now time the same code.

Each timing runs in a fresh interpreter with ``PYTHONPATH`` set to the tree (the two trees alternate, so load
drifts hit both), and reports process CPU seconds (the machine is shared; wall seconds beside) of the timed part
only, imports and the saved files' making excluded. Usage (the tree before: a ``git worktree`` of the commit)::

    .venv/bin/python bench/rework_levers.py --before /tmp/h30f/base --after . --repeat 3 [--only collapse]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
GPT2 = HERE / "tests" / "data" / "gpt2_tiny.onnx"
LLAMA = HERE / "tests" / "data" / "llama_tiny.onnx"
TOLERANCES = (0.0, 0.01, 0.05)


def _request(devices: int, per_node: int):
    from objectives.cluster import make_cluster
    from planner.plan import PlanRequest

    return PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=per_node), time_limit_s=1e6)


def _collapse() -> list[tuple]:
    """The tables at :data:`TOLERANCES` of GPT-2 tiny (batch 16, seq 64) on 8 A100s; returns what they list."""
    import planner.launchable as launchable

    dims, request = {"batch": 16, "seq": 64}, _request(8, 8)
    if hasattr(launchable, "collapse_rows"):
        every = launchable.plan_launchable_file(GPT2, dims, [request], collapse=0.0)[1][0]
        tables = [launchable.collapse_rows(every, tolerance) for tolerance in TOLERANCES]
    else:
        tables = [launchable.plan_launchable_file(GPT2, dims, [request], collapse=t)[1][0] for t in TOLERANCES]
    return [[(repr(r.time_s), repr(r.memory_bytes), r.summary) for r in table.rows] for table in tables]


def _reprice(folder: str) -> list[tuple]:
    """Every saved plan in ``folder`` priced again, in name order."""
    from planner.repriced import reprice_saved

    return [(repr(again.point.time_s), repr(again.point.memory_bytes))
            for again in map(reprice_saved, sorted(Path(folder).glob("*.json")))]


def _save_rows(folder: Path) -> int:
    """The uncollapsed tables of GPT-2 tiny (8 A100s) and the tiny Llama (8 on two nodes), every row saved as the
    generic plan (made once, by the tree this script runs in)."""
    import exporters
    from planner.launchable import plan_launchable_file, row_plan_input

    count = 0
    for path, per_node in ((GPT2, 8), (LLAMA, 4)):
        frontier = plan_launchable_file(path, {"batch": 16, "seq": 64}, [_request(8, per_node)], collapse=0.0)[1][0]
        for row in frontier.rows:
            document = exporters.export("generic", row_plan_input(row))
            document["model"]["source_path"] = str(path)
            (folder / f"{path.stem}-{count:03d}.json").write_text(json.dumps(document))
            count += 1
    return count


def _worker(what: str, folder: str) -> None:
    """Run one timed part and print ``{"cpu_s", "wall_s", "answer"}`` (imports before the clock)."""
    import planner.launchable  # noqa: F401  (the imports are not what is timed)
    import planner.repriced  # noqa: F401

    cpu, wall = time.process_time(), time.perf_counter()
    answer = _collapse() if what == "collapse" else _reprice(folder)
    print(json.dumps({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, "answer": answer}))


def _run(tree: Path, what: str, folder: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", what, "--folder", folder],
                         env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the tree before (a git worktree)")
    parser.add_argument("--after", type=Path, default=HERE)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("collapse", "reprice"))
    parser.add_argument("--worker", choices=("collapse", "reprice"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.folder)
        return
    with tempfile.TemporaryDirectory() as folder:
        print(f"saved {_save_rows(Path(folder))} rows", flush=True)
        for what in [args.only] if args.only else ["collapse", "reprice"]:
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for _ in range(args.repeat):
                for side, tree in (("before", args.before), ("after", args.after)):
                    runs[side].append(_run(tree, what, folder))
            same = all(r["answer"] == runs["before"][0]["answer"] for r in runs["before"] + runs["after"])
            cpu = {side: statistics.median(r["cpu_s"] for r in rs) for side, rs in runs.items()}
            wall = {side: statistics.median(r["wall_s"] for r in rs) for side, rs in runs.items()}
            print(f"{what}: CPU s median before {cpu['before']:.2f}, after {cpu['after']:.2f} "
                  f"(after/before {cpu['after'] / cpu['before']:.2f}); wall s {wall['before']:.2f} -> {wall['after']:.2f}; "
                  f"same answers every run: {same}", flush=True)


if __name__ == "__main__":
    if "--worker" not in sys.argv:  # a worker imports the tree its PYTHONPATH names
        sys.path.insert(0, str(HERE))
    main()
