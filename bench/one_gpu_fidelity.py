r"""Predicted vs measured one-GPU training steps, per execution mode (docs/COST_MODEL.md §5).

For every row of the calibration data (``../shared/calibration/h100_steps_examples.jsonl``: one H100,
PyTorch, bf16 autocast, AdamW; see its README), the example model of ``examples/`` is imported at
the row's batch (and sequence) size and priced on one ``h100-sxm`` under the execution model of the
row's mode:

==============  =====================================  ==================
mode            what ran                               priced as
==============  =====================================  ==================
eager           PyTorch eager, explicit attention      ``--engine eager --attention explicit``
sdpa            PyTorch eager, SDPA (flash) attention  ``--engine eager --attention flash``
sdpa-compile    SDPA under ``torch.compile``           ``--engine fused --attention flash``
eager-compile   explicit attention, ``torch.compile``  ``--engine fused --attention explicit``
==============  =====================================  ==================

It prints one line per row (predicted and measured step time and peak memory, their errors) and
the median absolute error per mode, separately for the rows used to fit the device's fixed costs
and for the held-out rows. ``--fit`` re-fits ``Device.host_dispatch_s`` on the
GPT-2 rows of the fit set (:data:`HOST_FIT_MODELS`; a grid search of the median relative step-time
error) with ``kernel_overhead_s`` fixed from single-kernel timings (:data:`KERNEL_OVERHEAD_S`) and
scores every row with the fitted values; without it the defaults of
:class:`planner.core.cluster.Device` are used. Rows are split by model, never fitted and scored on
the same rows: :data:`FIT_MODELS` fit, the others are held out.

``--fixed-costs MODEL`` prints instead the fixed cost per layer per micro-batch the execution model
adds to a Megatron configuration of ``MODEL`` (``planner estimate`` with the device's
``kernel_overhead_s``, ``host_dispatch_s`` and ``collective_overhead_s`` as they are, minus the same
with all three at 0) on one node of 8 A100s, tp 1 and 8, for micro-batches of 1 and 4 sequences
(issue 14's defect 2: ~2.5 ms measured at tp 1, ~4.3 ms at tp 8).

Usage::

    .venv/bin/python bench/one_gpu_fidelity.py
    .venv/bin/python bench/one_gpu_fidelity.py --fit
    .venv/bin/python bench/one_gpu_fidelity.py --fixed-costs examples/large/gpt3_1p3b.onnx --seq 2048
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from objectives.cluster import make_cluster  # noqa: E402
from objectives.tables import build_cost_model  # noqa: E402
from planner.core.configs import ConfigOptions  # noqa: E402
from planner.core.settings import TrainingSettings  # noqa: E402
from planner.plan import load_graph  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "calibration" / "h100_steps_examples.jsonl"

MODES: dict[str, tuple[str, str]] = {
    "eager": ("eager", "explicit"),
    "sdpa": ("eager", "flash"),
    "sdpa-compile": ("fused", "flash"),
    "eager-compile": ("fused", "explicit"),
}
"""Calibration mode -> (engine, attention)."""

FIT_MODELS = frozenset({"gpt2", "resnet", "mlp"})
"""Models whose rows may be fitted on; the rows of the others (llama, bert) are held out."""

HOST_FIT_MODELS = frozenset({"gpt2"})
"""The fit rows :func:`fit` fits ``host_dispatch_s`` on: the transformer of the fit set (batch 1-32,
host- and device-bound). ResNet's and the MLP's errors come from elsewhere (convolutions and batch
norm below the roofline's efficiencies at device-bound batches; host work beyond kernel launches in
3 ms steps) and would bend the host time to cover them."""

_GRAPHS: dict[tuple, object] = {}


def _graph(model: str, batch: int, seq: int | None):
    key = (model, batch, seq)
    if key not in _GRAPHS:
        dims = {"batch": batch}
        if seq is not None:
            dims["seq"] = seq
        _GRAPHS[key] = load_graph(ROOT / "examples" / f"{model}.onnx", dims)
    return _GRAPHS[key]


def predict(row: dict, device=None) -> tuple[float, float, float]:
    """``(step seconds, peak bytes, allowance bytes)`` predicted for one calibration row on one device:
    the allowance (``objectives.memory.OTHER_FRACTION``: fragmentation, workspaces) is part of the
    peak bytes; what PyTorch's allocator hands out (``max_memory_allocated``) is the peak without it,
    what it reserves (``max_memory_reserved``) the peak with it."""
    engine, attention = MODES[row["mode"]]
    graph = _graph(row["model"], int(row["batch"]), row.get("seq"))
    cluster = make_cluster("h100-sxm", devices=1)
    if device is not None:
        cluster = dataclasses.replace(cluster, device=device)
    settings = TrainingSettings(precision="bf16-mixed", optimizer="adam", engine=engine, attention=attention)
    model = build_cost_model(
        graph, cluster=cluster, settings=settings, config_options=ConfigOptions(devices=1, devices_per_node=1)
    )
    # one device: the configuration that splits nothing
    choice = [int(np.flatnonzero(space.devices_used == 1)[0]) for space in model.tables.configs]
    evaluation = model.evaluate(np.asarray(choice))
    return float(evaluation.time_s), float(evaluation.memory_bytes), float(evaluation.memory.other_bytes)


def load_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def score(rows: list[dict], device=None) -> list[dict]:
    out = []
    for row in rows:
        time_s, memory_bytes, other = predict(row, device)
        reserved = row.get("peak_reserved_bytes")
        out.append(dict(row, pred_step_s=time_s, pred_peak_bytes=memory_bytes - other,
                        step_err=_error(time_s, row["step_s"]),
                        mem_err=_error(memory_bytes - other, row["peak_alloc_bytes"]),
                        reserved_err=_error(memory_bytes, reserved) if reserved else float("nan")))
    return out


KERNEL_OVERHEAD_S = 5.0e-6
"""Device time per kernel, not fitted here: docs/COST_MODEL.md §5 times single kernels on the same
H100 (``measured = a + c * roofline``, a = 5-7 us of which 1.2-1.6 us is the CUDA event pair)."""

HOST_GRID_S = tuple(x * 1e-6 for x in range(10, 81, 5))
"""``host_dispatch_s`` values tried by :func:`fit` (10-80 us)."""


def fit(rows: list[dict]):
    """The device with ``host_dispatch_s`` minimising the median |step error| of the
    :data:`HOST_FIT_MODELS` rows among ``rows``, its
    ``kernel_overhead_s`` fixed at :data:`KERNEL_OVERHEAD_S` (the two trade off on whole steps: fitted
    together they are ill-conditioned, so the per-kernel time comes from single-kernel timings)."""
    base = make_cluster("h100-sxm", devices=1).device
    rows = [r for r in rows if r["model"] in HOST_FIT_MODELS]
    best = None
    for host in HOST_GRID_S:
        for overhead in (KERNEL_OVERHEAD_S,):
            device = dataclasses.replace(base, host_dispatch_s=host, kernel_overhead_s=overhead)
            errors = [abs(r["step_err"]) for r in score(rows, device)]
            value = statistics.median(errors)
            if best is None or value < best[0]:
                best = (value, device)
    return best[1]


def fixed_costs(path: Path, seq: int) -> None:
    """Print the fixed cost per layer per micro-batch of Megatron configurations (module docstring)."""
    from planner.estimate import estimate
    from planner.pipeline import graph_loader

    loader = graph_loader(path, {"seq": seq})
    cluster = make_cluster("a100-80gb", devices=8)
    bare = dataclasses.replace(cluster, device=dataclasses.replace(
        cluster.device, kernel_overhead_s=0.0, host_dispatch_s=0.0, collective_overhead_s=0.0))
    settings = TrainingSettings(engine="fused", attention="flash")
    print("| tp | micro-batch | tokens / GPU / micro-batch | step ms | fixed ms per layer per micro-batch |")
    print("|---:|---:|---:|---:|---:|")
    for tp in (1, 8):
        for micro_batch in (1, 4):
            micro_batches = 4
            kwargs = dict(tp=tp, pp=1, micro_batch=micro_batch, global_batch=micro_batch * (8 // tp) * micro_batches,
                          settings=settings)
            full = estimate(loader, cluster=cluster, **kwargs)
            without = estimate(loader, cluster=bare, **kwargs)
            layers = full.point.layers_per_stage[0] if full.point.layers_per_stage else 1
            extra = (full.time_s - without.time_s) / (layers * micro_batches)
            print(f"| {tp} | {micro_batch} | {micro_batch * seq} | {full.time_s * 1e3:.0f} | {extra * 1e3:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="calibration JSONL (default: %(default)s)")
    parser.add_argument("--fit", action="store_true", help="fit the device's fixed costs on the fit rows first")
    parser.add_argument("--fixed-costs", type=Path, default=None, metavar="MODEL",
                        help="print the fixed cost per layer per micro-batch of Megatron configurations of MODEL")
    parser.add_argument("--seq", type=int, default=2048, help="sequence length for --fixed-costs")
    args = parser.parse_args(argv)
    if args.fixed_costs is not None:
        fixed_costs(args.fixed_costs, args.seq)
        return 0
    rows = [r for r in load_rows(args.data) if r["mode"] in MODES]
    fit_rows = [r for r in rows if r["model"] in FIT_MODELS]
    device = None
    if args.fit:
        device = fit(fit_rows)
        count = sum(1 for r in fit_rows if r["model"] in HOST_FIT_MODELS)
        print(f"fitted on {count} rows ({', '.join(sorted(HOST_FIT_MODELS))}): "
              f"host_dispatch_s={device.host_dispatch_s:.1e} kernel_overhead_s={device.kernel_overhead_s:.1e}")
    scored = score(rows, device)
    print("| model | batch | mode | set | step ms measured | predicted | error | peak allocated GiB | predicted | error "
          "| reserved error |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in scored:
        part = "fit" if r["model"] in FIT_MODELS else "held out"
        print(f"| {r['model']} | {r['batch']} | {r['mode']} | {part} | {r['step_s'] * 1e3:.1f} | "
              f"{r['pred_step_s'] * 1e3:.1f} | {r['step_err']:+.0%} | {r['peak_alloc_bytes'] / 2**30:.2f} | "
              f"{r['pred_peak_bytes'] / 2**30:.2f} | {r['mem_err']:+.0%} | {r['reserved_err']:+.0%} |")
    print()
    print("| mode | set | rows | median abs step error | median abs memory error (allocated) | (reserved) |")
    print("|---|---|---:|---:|---:|---:|")
    for mode in MODES:
        for part, keep in (("fit", True), ("held out", False)):
            chosen = [r for r in scored if r["mode"] == mode and (r["model"] in FIT_MODELS) == keep]
            if not chosen:
                continue
            print(f"| {mode} | {part} | {len(chosen)} | {statistics.median(abs(r['step_err']) for r in chosen):.0%} | "
                  f"{statistics.median(abs(r['mem_err']) for r in chosen):.0%} | "
                  f"{statistics.median(abs(r['reserved_err']) for r in chosen):.0%} |")
    held = [r for r in scored if r["model"] not in FIT_MODELS]
    if held:
        print(f"\nheld out, all modes: {len(held)} rows, median abs step error "
              f"{statistics.median(abs(r['step_err']) for r in held):.0%}, memory "
              f"{statistics.median(abs(r['mem_err']) for r in held):.0%} (allocated; "
              f"{statistics.median(abs(r['reserved_err']) for r in held):.0%} against reserved)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
