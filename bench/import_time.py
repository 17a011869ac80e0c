"""Import time of every bundled example and test model (median of repeated runs).

Usage: .venv/bin/python bench/import_time.py [--repeats 7]
Prints a Markdown table (the one in docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from importers import import_model

ROOT = Path(__file__).resolve().parents[1]


def _dims(entry: dict) -> dict[str, int]:
    values = {"batch": 8, "seq": 128, "tgt_seq": 24, "src_seq": 32}
    return {name: values.get(name, 16) for name in entry.get("dims", [])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for folder in (ROOT / "examples", ROOT / "tests" / "data"):
        for entry in json.loads((folder / "models.json").read_text()).values():
            path = folder / entry["file"]
            dims = _dims(entry)
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                graph = import_model(path, dims)
                times.append(time.perf_counter() - started)
            rows.append((path.relative_to(ROOT), graph.raw_node_count, len(graph.ops), statistics.median(times), max(times)))
    print("| model | ONNX nodes | coarse ops | median import (s) | max (s) |")
    print("|---|---:|---:|---:|---:|")
    for path, raw, coarse, median, worst in rows:
        print(f"| {path} | {raw} | {coarse} | {median:.3f} | {worst:.3f} |")


if __name__ == "__main__":
    main()
