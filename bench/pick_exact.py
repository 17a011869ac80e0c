"""What the exact pick under --mem-limit costs: plan() with limits that bind, against no limit.

For each model, ``plan()`` runs once without a limit (the device's memory: the fastest point fits, so
the pick is proven by the frontier's bound at no cost) and then with limits at the 10th, 50th and
90th percentile of the listed points' memories (x 1.003, so the limit falls between listed points,
where a bucketed frontier can hide the optimum). Printed: median wall seconds of ``--repeat`` runs,
how the pick was proven, and whether it beats the fastest listed point within the limit.

    .venv/bin/python bench/pick_exact.py [--repeat 3] [--devices 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

from objectives.cluster import make_cluster
from planner.plan import PlanRequest, load_graph, plan
from planner.search.frontier import pareto_frontier
from planner.search.pareto import fastest_within

ROOT = Path(__file__).resolve().parents[1]
MODELS = (("gpt2.onnx", {"batch": 8, "seq": 128}), ("bert.onnx", {"batch": 8, "seq": 128}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args()
    print(f"{'model':<10} {'limit':>8} {'median s':>9} {'proof':<26} {'beats listed':>12}")
    for name, dims in MODELS:
        graph = load_graph(ROOT / "examples" / name, dims)
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=args.devices))
        first = plan(graph, request, with_targets=False)
        listed = pareto_frontier(first.cost.tables, epsilon=request.epsilon, max_points=request.max_points)
        memories = sorted(p.strategy.memory_bytes for p in first.points)
        cases = [("none", None)] + [
            (f"p{int(q * 100)}", memories[int(q * (len(memories) - 1))] * 1.003) for q in (0.1, 0.5, 0.9)
        ]
        for label, limit in cases:
            wall = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                result = plan(graph, dataclasses.replace(request, memory_limit_bytes=limit), with_targets=False)
                wall.append(time.perf_counter() - started)
            naive = fastest_within(listed, result.memory_limit_bytes)
            beats = result.best is not None and (not naive.feasible or result.best.strategy.time_s < naive.point.time_s)
            print(f"{name:<10} {label:>8} {statistics.median(wall):>9.2f} {result.pick_proof:<26} {str(beats):>12}")


if __name__ == "__main__":
    main()
