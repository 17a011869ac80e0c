"""Time the PaSE DP and the FT frontier on a synthetic 48-layer transformer (K ~ 150-460 per op).

    .venv/bin/python bench/search_synthetic.py                      # 48 layers, 256 devices
    .venv/bin/python bench/search_synthetic.py --layers 12 --devices 64 --max-points 64
    .venv/bin/python bench/search_synthetic.py --no-frontier

The problem comes from :func:`planner.search.synthetic.transformer_tables`: identical layers share
their cost arrays and form one block group, so the plan solves one layer once and reuses it. CPU
seconds are reported besides wall seconds because the machine may be shared; peak memory is the
process's maximum resident set.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from planner.search.blocks import plan_elimination
from planner.search.elimination import solve_min
from planner.search.frontier import DEFAULT_EPSILON, DEFAULT_MAX_POINTS, pareto_frontier
from planner.search.synthetic import transformer_tables


def _timed(label: str, fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    print(f"{label:<28} {time.perf_counter() - wall:8.2f} s wall {time.process_time() - cpu:8.2f} s cpu")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--devices", type=int, default=256)
    parser.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    parser.add_argument("--max-points", type=int, default=DEFAULT_MAX_POINTS)
    parser.add_argument("--no-frontier", action="store_true", help="time the DP only")
    parser.add_argument("--no-blocks", action="store_true", help="disable block reuse")
    args = parser.parse_args()

    tables = _timed("build tables", lambda: transformer_tables(args.layers, devices=args.devices))
    sizes = np.array([t.size for t in tables.node_time_s])
    print(f"ops {tables.num_ops}, configurations per op {sizes.min()}..{sizes.max()} (mean {sizes.mean():.0f})")
    plan = _timed("plan", lambda: plan_elimination(tables, use_blocks=not args.no_blocks))
    print(
        f"plan {plan.name}: largest table {plan.max_table_cells:.3g} cells, total {plan.total_table_cells:.3g}"
        + (f" (plain order: {plan.plain.total_table_cells:.3g})" if plan.plain else "")
        + f", {plan.eliminated_by_reuse} ops by reuse"
    )
    dp = _timed("DP (min time)", lambda: solve_min(tables, use_blocks=not args.no_blocks))
    print(f"  min time {dp.time_s:.6g} s at {dp.memory_bytes / 2**30:.3f} GiB")
    if not args.no_frontier:
        front = _timed(
            f"frontier (eps {args.epsilon:g}, max {args.max_points})",
            lambda: pareto_frontier(
                tables, epsilon=args.epsilon, max_points=args.max_points, use_blocks=not args.no_blocks
            ),
        )
        print(f"  {len(front.points)} points; {front.bound_text()}")
        if front.points:
            fastest, smallest = front.points[0], front.points[-1]
            print(
                f"  fastest {fastest.time_s:.6g} s at {fastest.memory_bytes / 2**30:.3f} GiB; "
                f"smallest {smallest.memory_bytes / 2**30:.3f} GiB at {smallest.time_s:.6g} s"
            )
    print(f"peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
