"""Import time of every bundled example and test model (median of repeated runs).

Usage: .venv/bin/python bench/import_time.py [--repeats 7]
       .venv/bin/python bench/import_time.py --chain 100000 [--repeats 3]
Prints a Markdown table (the one in docs/PERFORMANCE.md). ``--chain N`` times synthetic deep graphs
instead: a chain of N Relu nodes and an MLP of N/2 MatMul+Relu layers on a [batch, 16] activation,
the shapes that made the importer recurse (issue 16); import must stay linear in N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from importers import import_model

ROOT = Path(__file__).resolve().parents[1]


def _dims(entry: dict) -> dict[str, int]:
    values = {"batch": 8, "seq": 128, "tgt_seq": 24, "src_seq": 32}
    return {name: values.get(name, 16) for name in entry.get("dims", [])}


def _chain(kind: str, nodes: int) -> onnx.ModelProto:
    """``nodes`` ONNX nodes: Relu links, or MatMul+Relu layers (two nodes each)."""
    graph_nodes, weights, value = [], [], "x"
    for i in range(nodes if kind == "relu" else nodes // 2):
        if kind == "mlp":
            weights.append(numpy_helper.from_array(np.zeros((16, 16), np.float32), f"layer{i}.weight"))
            graph_nodes.append(helper.make_node("MatMul", [value, f"layer{i}.weight"], [f"m{i}"]))
            value = f"m{i}"
        graph_nodes.append(helper.make_node("Relu", [value], [f"v{i}"]))
        value = f"v{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info(value, TensorProto.FLOAT, ["batch", 16])
    graph = helper.make_graph(graph_nodes, kind, [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _chains(nodes: int, repeats: int) -> None:
    print("| synthetic graph | ONNX nodes | coarse ops | median import (s) | max (s) | median CPU (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for kind in ("relu", "mlp"):
            path = Path(folder) / f"{kind}.onnx"
            onnx.save(_chain(kind, nodes), path)
            times, cpu = [], []
            for _ in range(repeats):
                started, started_cpu = time.perf_counter(), time.process_time()
                graph = import_model(path, {"batch": 8})
                times.append(time.perf_counter() - started)
                cpu.append(time.process_time() - started_cpu)  # what other jobs on the cores do not inflate
            label = "Relu chain" if kind == "relu" else "MatMul+Relu layers"
            print(
                f"| {label} | {graph.raw_node_count} | {len(graph.ops)} | {statistics.median(times):.2f} "
                f"| {max(times):.2f} | {statistics.median(cpu):.2f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chain", type=int, default=0, help="time synthetic chains of this many nodes instead")
    args = parser.parse_args()
    if args.chain:
        _chains(args.chain, args.repeats)
        return
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
