"""The ``targets`` column of ``plan --global-batch``: by masks and stage rules vs running every exporter.

For each case, one pipeline search (:func:`planner.pipeline.pipeline_search`) runs untimed; then the
column of its frontier is computed both ways on the same points, each ``--repeats`` times (median
wall-clock seconds):

* ``masks``: :func:`planner.pipeline.pipeline_targets` (:func:`exporters.targets.runnable_plan_targets`:
  the families of each point's degrees, built once per stage, the settings and stage rules; no
  exporter runs);
* ``exporters``: every framework exporter run on every point (:func:`exporters.runnable_targets`),
  as the column was computed before issue 17.

The two columns must be equal (the script exits 1 otherwise); the answer counts the points some
framework runs.

Usage::

    .venv/bin/python bench/pipeline_targets.py
    .venv/bin/python bench/pipeline_targets.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exporters import runnable_targets  # noqa: E402
from objectives.cluster import make_cluster  # noqa: E402
from planner.pipeline import (  # noqa: E402
    PipelineOptions,
    graph_loader,
    pipeline_plan_input,
    pipeline_search,
    pipeline_targets,
)

CASES = [
    ("gpt2", ROOT / "examples" / "gpt2.onnx", {"seq": 1024}, 16, 256),
    ("llama", ROOT / "examples" / "llama.onnx", {"seq": 1024}, 32, 256),
    ("bert", ROOT / "examples" / "bert.onnx", {"seq": 512}, 16, 256),
]


def _median_s(work, repeats: int) -> tuple[float, object]:
    times, answer = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        answer = work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), answer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| model | devices | points | run by a framework | masks (s) | exporters (s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    equal = True
    for name, path, dims, devices, global_batch in CASES:
        cluster = make_cluster("a100-80gb", devices=devices, devices_per_node=8)
        result = pipeline_search(graph_loader(path, dims), cluster=cluster, options=PipelineOptions(global_batch=global_batch))
        masks_s, by_masks = _median_s(lambda: pipeline_targets(result), args.repeats)
        exporters_s, by_exporters = _median_s(
            lambda: tuple(runnable_targets(pipeline_plan_input(result, i)) for i in range(len(result.points))),
            args.repeats,
        )
        equal &= by_masks == by_exporters
        runnable = sum(len(names) > 1 for names in by_masks)  # type: ignore[union-attr]
        print(f"| {name} | {devices} | {len(result.points)} | {runnable} | {masks_s:.3f} | {exporters_s:.3f} | "
              f"{masks_s / exporters_s:.2f} |")  # fmt: skip
    if not equal:
        print("the two columns differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
