"""The 3-D pipeline search against the exhaustive Megatron-LM grid, with the same cost model.

For a GPT-3 1.3B-sized model (24 layers, hidden 2048, 16 heads, seq 2048; by default
``examples/large/gpt3_1p3b.onnx``) on 8, 16, 32 and 64 A100-80GB (8 per node), global batch 512:

* ours: :func:`planner.pipeline.pipeline_search` (pp, per-op splits, micro-batch, ZeRO 0-3,
  recomputation), its frontier and its fastest plan that fits;
* the grid: every Megatron-LM configuration (dp, tp <= 8, pp dividing the layers, micro-batch,
  recompute none/selective/full, distributed optimizer off/on) priced by
  :func:`planner.estimate.estimate`, the fastest that fits. ``fresh``: each configuration priced from
  scratch, as separate ``planner estimate`` runs would (its own cost model); ``shared``: one cost
  model cache for the whole grid (the cheapest any grid can be).

The model is imported once per batch size before anything is timed (both sides share those
imports). Times are wall-clock and process CPU seconds (the CPU figure is the fair one on a busy
machine), each the median of ``--repeats`` runs for the search and ``--grid-repeats`` for the grids
(a grid run is ten times longer, so one run already averages the machine's load over tens of seconds).
The search's counts say how much of its space it priced: combinations (pp, micro-batch, recompute,
ZeRO group), those pruned by their lower bounds (``PipelineOptions.prune``), intra-op DPs and cost
models built.

Usage::

    .venv/bin/python bench/pipeline_grid.py                       # 8 16 32 64 devices, both grids
    .venv/bin/python bench/pipeline_grid.py --devices 8 --grid shared
    .venv/bin/python bench/pipeline_grid.py --model other.onnx --seq 1024 --json out.json
    .venv/bin/python bench/pipeline_grid.py --no-prune --grid none  # the search without its bounds

Prints Markdown tables (the ones in docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from objectives.cluster import make_cluster
from planner.core.configs import divisors
from planner.core.units import format_bytes
from planner.estimate import megatron_grid
from planner.pipeline import PipelineOptions, graph_loader, pipeline_search

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "examples" / "large" / "gpt3_1p3b.onnx"


def _timed(fn, repeats: int = 1):
    """``(result, median wall seconds, median CPU seconds)`` of ``repeats`` runs of ``fn``."""
    walls, cpus = [], []
    for _ in range(max(1, repeats)):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return result, statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--device", default="a100-80gb")
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--grid", choices=["fresh", "shared", "both", "none"], default="both")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the search (median reported)")
    parser.add_argument("--grid-repeats", type=int, default=1, help="runs of each grid (median reported)")
    parser.add_argument("--no-prune", action="store_true", help="search without the lower-bound pruning")
    parser.add_argument("--frontier-rows", type=int, default=12)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    at_batch = graph_loader(args.model, {"seq": args.seq})
    (_, import_s, _) = _timed(lambda: [at_batch(b) for b in divisors(args.global_batch)])
    print(f"model {args.model.name}: imported at {len(divisors(args.global_batch))} batch sizes in {import_s:.1f} s "
          "(shared, not timed below)\n")
    rows, frontiers, records = [], [], []
    for devices in args.devices:
        cluster = make_cluster(args.device, devices=devices, devices_per_node=min(devices, args.devices_per_node))
        options = PipelineOptions(global_batch=args.global_batch, prune=not args.no_prune)
        ours, ours_wall, ours_cpu = _timed(
            lambda: pipeline_search(at_batch, cluster=cluster, options=options), args.repeats
        )
        record = {
            "devices": devices,
            "search_wall_s": ours_wall,
            "search_cpu_s": ours_cpu,
            "search_best_s": ours.best.time_s if ours.best else None,
            "search_best": ours.best.summary if ours.best else None,
            "search_points": len(ours.points),
            "search_combinations": ours.combinations,
            "search_pruned": ours.pruned,
            "search_intra_op_searches": ours.intra_op_searches,
            "search_cost_builds": ours.cost_builds,
        }
        grids = {}
        for mode in ("fresh", "shared"):
            if args.grid not in (mode, "both"):
                continue
            grid, wall, cpu = _timed(
                lambda: megatron_grid(
                    at_batch, cluster=cluster, global_batch=args.global_batch, share_cost_models=mode == "shared"
                ),
                args.grid_repeats,
            )
            grids[mode] = (grid, wall, cpu)
            record.update({
                f"grid_{mode}_wall_s": wall,
                f"grid_{mode}_cpu_s": cpu,
                f"grid_{mode}_configurations": len(grid.estimates) + grid.invalid,
                f"grid_{mode}_best_s": grid.best.time_s if grid.best else None,
                f"grid_{mode}_best": grid.best.config.describe() if grid.best else None,
            })
        records.append(record)
        best_grid = next(iter(grids.values()))[0].best if grids else None
        row = [
            str(devices),
            f"{ours.best.time_s:.4f}" if ours.best else "-",
            ours.best.summary if ours.best else "-",
            f"{best_grid.time_s:.4f}" if best_grid else "-",
            best_grid.config.describe() if best_grid else "-",
            f"{ours_wall:.2f} / {ours_cpu:.2f}",
        ]
        for mode in ("fresh", "shared"):
            if mode in grids:
                _, wall, cpu = grids[mode]
                row.append(f"{wall:.1f} / {cpu:.1f} ({cpu / ours_cpu:.1f}x)")
            else:
                row.append("-")
        rows.append(row)
        lines = [f"\n**{devices} devices** ({ours.combinations} combinations, {ours.pruned} pruned by their bounds, "
                 f"{ours.intra_op_searches} intra-op searches, {ours.cost_builds} cost models, {len(ours.points)} "
                 "frontier points):\n",
                 "| step (s) | memory/device | fits | plan | micro-batches | layers per stage |",
                 "|---:|---:|:---:|---|---:|---|"]
        for p in ours.points[: args.frontier_rows]:
            lines.append(f"| {p.time_s:.4f} | {format_bytes(p.memory_bytes)} | {'yes' if p.fits else 'no'} | "
                         f"{p.summary} | {p.micro_batches} | {'/'.join(map(str, p.layers_per_stage))} |")
        if len(ours.points) > args.frontier_rows:
            lines.append(f"| ... | | | {len(ours.points) - args.frontier_rows} more | | |")
        frontiers.append("\n".join(lines))
        print(f"{devices} devices: ours {row[1]} s in {ours_wall:.2f} s wall / {ours_cpu:.2f} s CPU; "
              f"grid best {row[3]} s; grid times (wall / CPU): fresh {row[6]}, shared {row[7]}", flush=True)

    print("\n| devices | ours: best step (s) | our plan | grid: best step (s) | grid's plan | "
          "search wall / CPU (s) | grid fresh wall / CPU (s) | grid shared wall / CPU (s) |")
    print("|---:|---:|---|---:|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for block in frontiers:
        print(block)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
