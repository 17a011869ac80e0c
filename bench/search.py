"""Search time and peak memory for every example at several device counts, DP and frontier.

Each (model, devices, method) runs in a fresh subprocess, so its peak resident memory (ru_maxrss) is
its own. Times are end to end (import, costing, search) and the search alone; the machine is shared,
so run with --repeats 3 (medians are reported).

Usage:
    .venv/bin/python bench/search.py                       # every example, p = 4 .. 256
    .venv/bin/python bench/search.py --models gpt2 --devices 64 --methods dp,frontier
Prints Markdown tables (the ones in docs/PERFORMANCE.md): timings, and speed-ups over data parallelism.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: model -> (file, dims): realistic training shapes.
MODELS: dict[str, tuple[str, dict[str, int]]] = {
    "gpt2": ("examples/gpt2.onnx", {"batch": 32, "seq": 1024}),
    "bert": ("examples/bert.onnx", {"batch": 32, "seq": 512}),
    "llama": ("examples/llama.onnx", {"batch": 16, "seq": 2048}),
    "resnet": ("examples/resnet.onnx", {"batch": 256}),
    "mlp": ("examples/mlp.onnx", {"batch": 1024}),
    "gpt_48l": ("examples/large/gpt_48l.onnx", {"batch": 32, "seq": 1024}),
}

_CHILD = r"""
import json, resource, sys, time
started = time.perf_counter()
from objectives.cluster import make_cluster
from planner.plan import PlanRequest, load_graph, plan
path, dims, devices, method = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
graph = load_graph(path, dims)
request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices), method=method)
result = plan(graph, request, with_targets=False)
total = time.perf_counter() - started
dp = next(b for b in result.baselines if b.name == "data_parallel").point
uniform = next(b for b in result.baselines if b.name == "best_uniform").point
print(json.dumps({
    "total_s": total, "search_s": result.search_time_s, "cost_s": result.cost_time_s,
    "points": len(result.points), "best_s": result.points[0].strategy.time_s,
    "dp_s": dp.strategy.time_s if dp else None, "uniform_s": uniform.strategy.time_s if uniform else None,
    "max_table_cells": result.max_table_cells, "ops": len(graph.ops),
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}))
"""


def run_one(path: str, dims: dict[str, int], devices: int, method: str, timeout_s: float) -> dict:
    try:
        completed = subprocess.run(
            [sys.executable, "-c", _CHILD, str(ROOT / path), json.dumps(dims), str(devices), method],
            capture_output=True, text=True, cwd=ROOT, timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout_s:g} s"}
    if completed.returncode != 0:
        return {"error": completed.stderr.strip().splitlines()[-1] if completed.stderr else "failed"}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--devices", default="4,8,16,32,64,256")
    parser.add_argument("--methods", default="dp,frontier")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it is stopped")
    parser.add_argument("--json", action="store_true", help="also print raw results as JSON")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        path, dims = MODELS[model]
        if not (ROOT / path).exists():
            print(f"skipping {model}: {path} not found", file=sys.stderr)
            continue
        for devices in (int(d) for d in args.devices.split(",")):
            for method in args.methods.split(","):
                runs = [run_one(path, dims, devices, method, args.timeout) for _ in range(args.repeats)]
                good = [r for r in runs if "error" not in r]
                if not good:
                    rows.append({"model": model, "devices": devices, "method": method, "error": runs[0]["error"]})
                    print(f"{model} p={devices} {method}: {runs[0]['error']}", file=sys.stderr)
                    continue
                row = dict(good[0])
                for key in ("total_s", "search_s", "cost_s", "peak_rss_bytes"):
                    row[key] = statistics.median(r[key] for r in good)
                row.update(model=model, devices=devices, method=method, dims=dims)
                rows.append(row)
                print(f"{model} p={devices} {method}: {row['total_s']:.2f} s", file=sys.stderr)
    print("| model | dims | p | method | end to end (s) | search (s) | peak memory (MB) | points | largest table |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for row in rows:
        if "error" in row:
            print(f"| {row['model']} | | {row['devices']} | {row['method']} | error: {row['error']} | | | | |")
            continue
        dims_text = ",".join(f"{k}={v}" for k, v in row["dims"].items())
        print(
            f"| {row['model']} | {dims_text} | {row['devices']} | {row['method']} | {row['total_s']:.2f} | "
            f"{row['search_s']:.2f} | {row['peak_rss_bytes'] / 1e6:.0f} | {row['points']} | {row['max_table_cells']:,} |"
        )
    print()
    print("| model | p | best step (ms) | data parallel (ms) | speed-up over DP | best uniform dp x tp (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        if "error" in row or row["method"] != "dp":
            continue
        dp = row["dp_s"]
        uniform = row["uniform_s"]
        print(
            f"| {row['model']} | {row['devices']} | {row['best_s'] * 1e3:.2f} | "
            f"{dp * 1e3:.2f} | {dp / row['best_s']:.2f}x | {uniform * 1e3 if uniform else float('nan'):.2f} |"
        )
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
