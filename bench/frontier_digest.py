"""Every frontier point of every example and pipeline case, printed exactly, to diff two trees (issue 17).

A refactor must not move a single frontier point. This prints one JSON line per case: the case's
name and, for every frontier point, its step time (s) and memory per device (bytes) as ``repr()``
of the floats (every bit), and a short digest of its strategy (the per-op splits, and for a
pipeline point pp, micro-batch, ZeRO stage, recomputation, schedule and the layers per stage), plus
the index of the chosen point. Run it on the tree before and after a change and ``diff`` the files:
any line that differs names the case and the point that moved.

Cases:

* ``plan/<model>/<devices>``: :func:`planner.plan.plan` with the default method (``frontier``) and
  cost model (roofline) on each bundled example (``examples/*.onnx``) at 8, 16 and 64 A100-80GB,
  8 per node (ResNet-50 at 8 and 16 only, :data:`SLOW`), and the 48-layer decoder of
  ``examples/large`` at 16;
* ``pipe/<model>/<devices>[/<variant>]``: :func:`planner.pipeline.pipeline_search` (``plan
  --global-batch``): the cases of ``bench/pipeline_grid.py`` (GPT-3 1.3B, seq 2048, global batch
  512, 8/16/32/64 devices) and on GPT-2 / Llama: the default search, ``--target megatron``, the
  interleaved schedule, a memory limit that binds (the Lagrangian step), no pruning, and the
  ``fused`` execution model (gradient synchronisation bucketed and overlapped with backward).

* ``launch/<model>/<devices>[/<limit>]`` (only with ``--launchable``): the default table of ``planner plan``
  (:func:`planner.launchable.plan_launchable_file`: every launcher's search, the headroom search and the
  data-parallel baseline, collapsed at the default 1%): every row's step time, memory, launchers, execution
  model and a digest of its plan, the pick and the fastest row's ranks, the headroom and the baseline. The
  README's main job (GPT-2, 16 devices, batch 32 x 1,024, 16 GB) and the Llama example at 16 devices.
  Opt-in, so the default output (the file other trees are diffed against) keeps its cases.

Time limits are set far above what any case needs, so no search degrades on a busy machine (a
degraded search returns other points, which would read as a change).

Usage (the base digest of this round is ``/tmp/digest_base.jsonl``)::

    cd /tmp && PYTHONPATH=/tmp/base /work/main/.venv/bin/python /work/main/bench/frontier_digest.py --out /tmp/digest_base.jsonl
    cd /work/main && .venv/bin/python bench/frontier_digest.py --out /tmp/digest_new.jsonl
    diff /tmp/digest_base.jsonl /tmp/digest_new.jsonl && echo identical

    .venv/bin/python bench/frontier_digest.py --only pipe/   # a subset: cases whose name contains it
    .venv/bin/python bench/frontier_digest.py --launchable --only launch/   # the default table's cases
    # a tree older than the launch/ cases: this script with PYTHONPATH at that tree (its planner, these examples)
    cd /tmp && PYTHONPATH=/tmp/base /work/main/.venv/bin/python /work/main/bench/frontier_digest.py --launchable --only launch/

The script imports the ``planner`` found on ``sys.path`` (so ``PYTHONPATH`` picks the tree) and
the examples next to this file (the same models for both trees). About 3-5 minutes on two busy
cores.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DEVICE = "a100-80gb"
PER_NODE = 8
GENEROUS_S = 3600.0
"""Time limit of every search: far above any case, so none degrades (which would change points)."""

#: example -> its symbolic dims for plan()
PLAN_MODELS: dict[str, dict[str, int]] = {
    "mlp": {"batch": 64},
    "resnet": {"batch": 64},
    "bert": {"batch": 32, "seq": 128},
    "gpt2": {"batch": 32, "seq": 1024},
    "llama": {"batch": 32, "seq": 1024},
}
PLAN_DEVICES = (8, 16, 64)
SLOW = {("resnet", 64)}
"""Left out: ResNet-50 at 64 devices runs for over ten minutes without a time limit (its exact
frontier over 53 convolutions with many configurations each)."""


def _digest(value: Any) -> str:
    """12 hex digits naming ``value`` (a JSON-able structure, keys sorted)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _plan_case(model: Path, dims: dict[str, int], devices: int) -> dict:
    from objectives.cluster import make_cluster
    from planner.plan import PlanRequest, load_graph, plan

    graph = load_graph(model, dims)
    cluster = make_cluster(DEVICE, devices=devices, devices_per_node=min(devices, PER_NODE))
    request = PlanRequest(cluster=cluster, time_limit_s=GENEROUS_S)
    try:
        result = plan(graph, request, with_targets=False)
    except TypeError:  # a tree whose plan() has no with_targets
        result = plan(graph, request)
    points = [
        [repr(float(p.strategy.time_s)), repr(float(p.strategy.memory_bytes)),
         _digest([p.strategy.splits, p.strategy.inter_splits, p.summary])]
        for p in result.points
    ]
    return {"chosen": result.chosen, "points": points}


def _pipe_case(model: Path, dims: dict[str, int], devices: int, global_batch: int, *,
               target: str | None = None, limit_bytes: float | None = None, engine: str | None = None,
               **options: Any) -> dict:
    from objectives.cluster import make_cluster
    from planner.core.settings import TrainingSettings
    from planner.pipeline import PipelineOptions, graph_loader, pipeline_search

    cluster = make_cluster(DEVICE, devices=devices, devices_per_node=min(devices, PER_NODE))
    result = pipeline_search(
        graph_loader(model, dims), cluster=cluster,
        options=PipelineOptions(global_batch=global_batch, time_limit_s=GENEROUS_S, **options),
        memory_limit_bytes=limit_bytes, target=target,
        settings=TrainingSettings(engine=engine, attention="flash" if engine else None),  # type: ignore[arg-type]
    )
    points = [
        [repr(float(p.time_s)), repr(float(p.memory_bytes)),
         _digest([p.pp, p.micro_batch_samples, p.zero_stage, p.recompute, p.schedule, p.chunks,
                  p.layers_per_stage, p.splits]),
         f"pp={p.pp} mb={p.micro_batch_samples} zero={p.zero_stage} rc={p.recompute}"]
        for p in result.points
    ]
    return {"chosen": result.chosen, "points": points}


def _launch_case(model: Path, dims: dict[str, int], devices: int, limit_bytes: float | None = None) -> dict:
    """The default launchable table of ``model`` (what ``planner plan`` prints), digested row by row."""
    from objectives.cluster import make_cluster
    from planner.launchable import plan_launchable_file
    from planner.plan import PlanRequest

    cluster = make_cluster(DEVICE, devices=devices, devices_per_node=min(devices, PER_NODE))
    request = PlanRequest(cluster=cluster, memory_limit_bytes=limit_bytes, time_limit_s=GENEROUS_S)
    _, (found,) = plan_launchable_file(model, dims, [request])
    points = [
        [repr(float(row.time_s)), repr(float(row.memory_bytes)),
         _digest([row.point.pp, row.point.micro_batch_samples, row.point.micro_batches, row.point.zero_stage,
                  row.point.recompute, row.point.schedule, row.point.chunks, row.point.layers_per_stage,
                  row.point.splits]),
         f"{row.summary} [{','.join(row.targets)}] {row.priced_as}"]
        for row in found.rows
    ]
    seconds = lambda item: None if item is None else repr(float(item.time_s))  # noqa: E731
    return {"chosen": found.chosen, "fastest": found.fastest, "points": points,
            "headroom_s": seconds(found.headroom), "baseline_s": seconds(found.baseline)}


def launch_cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    """``(name, run)`` of the default table's cases (``--launchable``)."""
    gpt2, llama = EXAMPLES / "gpt2.onnx", EXAMPLES / "llama.onnx"
    yield "launch/gpt2/16/16GB", lambda: _launch_case(gpt2, {"batch": 32, "seq": 1024}, 16, 16e9)
    yield "launch/llama/16", lambda: _launch_case(llama, {"batch": 32, "seq": 1024}, 16)


def cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    """``(name, run)`` of every case, in a fixed order."""
    for name, dims in PLAN_MODELS.items():
        for devices in PLAN_DEVICES:
            if (name, devices) in SLOW:
                continue
            yield f"plan/{name}/{devices}", (lambda n=name, d=dims, c=devices: _plan_case(EXAMPLES / f"{n}.onnx", d, c))
    yield "plan/gpt_48l/16", lambda: _plan_case(EXAMPLES / "large" / "gpt_48l.onnx", {"batch": 8, "seq": 1024}, 16)
    big = EXAMPLES / "large" / "gpt3_1p3b.onnx"
    for devices in (8, 16, 32, 64):
        yield f"pipe/gpt3_1p3b/{devices}", (lambda c=devices: _pipe_case(big, {"seq": 2048}, c, 512))
    gpt2, llama = EXAMPLES / "gpt2.onnx", EXAMPLES / "llama.onnx"
    seq = {"seq": 1024}
    yield "pipe/gpt2/8", lambda: _pipe_case(gpt2, seq, 8, 64)
    yield "pipe/gpt2/16", lambda: _pipe_case(gpt2, seq, 16, 64)
    yield "pipe/gpt2/16/megatron", lambda: _pipe_case(gpt2, seq, 16, 64, target="megatron")
    yield "pipe/gpt2/16/deepspeed", lambda: _pipe_case(gpt2, seq, 16, 64, target="deepspeed")
    yield "pipe/gpt2/16/interleaved", lambda: _pipe_case(gpt2, seq, 16, 64, schedule="interleaved", chunks=2)
    yield "pipe/gpt2/8/no-prune", lambda: _pipe_case(gpt2, seq, 8, 64, prune=False)
    yield "pipe/llama/16", lambda: _pipe_case(llama, seq, 16, 128)
    # 3 GB binds (the fastest plans need more), so the memory-weighted search runs
    yield "pipe/llama/16/3GB", lambda: _pipe_case(llama, seq, 16, 128, limit_bytes=3e9)
    yield "pipe/bert/8", lambda: _pipe_case(EXAMPLES / "bert.onnx", {"seq": 128}, 8, 256)
    # an execution model: bucketed gradient synchronisation, overlapped with backward
    yield "pipe/gpt2/16/fused", lambda: _pipe_case(gpt2, seq, 16, 64, engine="fused")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the JSON lines here (default: stdout)")
    parser.add_argument("--only", default=None, help="run only the cases whose name contains this")
    parser.add_argument("--launchable", action="store_true",
                        help="also digest the default launchable table (launch/... cases, after the others)")
    args = parser.parse_args()
    lines = []
    for name, run in itertools.chain(cases(), launch_cases() if args.launchable else ()):
        if args.only is not None and args.only not in name:
            continue
        started = time.perf_counter()
        try:
            record = {"case": name, **run()}
        except Exception as exc:  # a case that fails is a line too: the diff shows it
            record = {"case": name, "error": f"{type(exc).__name__}: {exc}"}
        line = json.dumps(record, sort_keys=True)
        lines.append(line)
        print(f"{name}: {len(record.get('points', []))} points, {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)
        if args.out is None:
            print(line, flush=True)
    if args.out is not None:
        args.out.write_text("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()
