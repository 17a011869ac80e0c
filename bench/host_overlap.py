"""Per-op vs per-pass host floor on the one-H100 rows: a diagnostic of issue 23 item 1 (docs/VALIDATION.md,
"One H100 at small batches: the fixed costs, term by term").

Under an execution model each op's pass is priced ``max(work + n kappa, n h)`` and the ops' prices are summed
(``objectives.compute._execution_times``): the GPU never runs ahead of the host across ops. CUDA launches are
asynchronous, so the host queues kernels while a long one runs and the GPU drains the queue while the host is
slow; over a pass that gives ``max(sum(work + n kappa), sum(n h))`` (the form ``objectives.fixed_costs.host_floor_s``
already uses per layer). This script re-prices every row of ``bench/fidelity/runs_h100.jsonl`` both ways for a
range of ``h`` (``Device.host_dispatch_s``) from each op's kernels and bare work
(``objectives.fixed_cost_parts.op_fixed_costs``), keeping the rest of the row's price (optimizer step, loss)
as the planner gives it at the preset's ``h``, and prints the fit rows' mean squared relative error and the
held-out rows' errors. Nothing here changes a price::

    .venv/bin/python bench/host_overlap.py            # about 1 minute
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fidelity  # noqa: E402  (bench/fidelity.py: rows and files)


def row_ops(row, graph_for) -> np.ndarray:
    """``(ops, 4)`` of one one-device row: forward kernels, backward kernels, bare forward and backward seconds of
    each op whose launches the formula prices (measured and MoE ops left out)."""
    from objectives.fixed_cost_parts import op_fixed_costs
    from objectives.tables import build_cost_model
    from planner.calibrate import row_cluster, row_settings
    from planner.core.configs import ConfigOptions

    graph = graph_for(row)(row.micro_batch)
    model = build_cost_model(graph, cluster=row_cluster(row), settings=row_settings(row),
                             config_options=ConfigOptions(devices=1, devices_per_node=1), price_edges=False)
    parts = [op_fixed_costs(model, i, 0) for i in range(len(graph.ops))]
    return np.array([(f.kernels_forward, f.kernels_backward, f.work_forward_s, f.work_backward_s)
                     for f in parts if f is not None and f.priced_apart is None], dtype=float).reshape(-1, 4)


def passes_s(ops: np.ndarray, *, kappa: float, host: float, per_pass: bool) -> float:
    """Forward + backward seconds of the ops: per op ``max(w + n kappa, n h)`` summed, or per pass the max of sums."""
    n_f, n_b, w_f, w_b = ops.T
    if per_pass:
        return max(float(np.sum(w_f + n_f * kappa)), float(np.sum(n_f * host))) + \
            max(float(np.sum(w_b + n_b * kappa)), float(np.sum(n_b * host)))
    return float(np.sum(np.maximum(w_f + n_f * kappa, n_f * host) + np.maximum(w_b + n_b * kappa, n_b * host)))


def activation_casts(row, graph_for) -> int:
    """Forward casts PyTorch's autocast makes of activations that the kernel count leaves out: each distinct
    non-parameter input of an op on autocast's bf16 or fp32 list whose stored dtype is the other one
    (``objectives.autocast``; its backward casts the gradient back, one kernel more)."""
    from objectives.autocast import compute_dtype, stored_dtypes
    from objectives.execution import execution_of
    from planner.calibrate import row_settings

    graph, settings = graph_for(row)(row.micro_batch), row_settings(row)
    stored = stored_dtypes(graph, settings=settings, execution=execution_of(settings))
    casts = 0
    for op in graph.ops:
        wanted = compute_dtype(op)
        names = {a.tensor for a in op.inputs if a.tensor in stored and graph.tensors[a.tensor].role != "parameter"}
        casts += sum(1 for n in names if wanted is not None and stored[n] != wanted)
    return casts


def _raw_measured() -> dict[str, dict]:
    """Each row's ``measured`` mapping as the runs file has it (fields the row reader does not keep)."""
    import json

    lines = (fidelity.DATA / "runs_h100.jsonl").read_text(encoding="utf-8").splitlines()
    return {r["id"]: r["measured"] for r in map(json.loads, filter(None, lines))}


def _phased_ids() -> set[str]:
    """Rows of the second sweep (forward, backward and optimizer timed apart: batch 8 and up)."""
    return {i for i, m in _raw_measured().items() if "fwd_s" in m}


def kernel_report(table, graph_for) -> None:
    """Kernels the planner counts per step (forward + backward) against the profiler's count of the measured step
    (``measured.cuda_kernels_per_step``: the step's every CUDA kernel, the optimizer's included)."""
    profiled = {i: m.get("cuda_kernels_per_step") for i, m in _raw_measured().items()}
    for row, ops, _, _ in table:
        measured = profiled.get(row.id)
        if measured:
            counted = int(ops[:, 0].sum() + ops[:, 1].sum())
            print(f"kernels {row.id} ({row.split}): counted {counted}, profiled {measured} "
                  f"({measured / counted:.2f}x); autocast activation casts {activation_casts(row, graph_for)} forward")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts-us", default="30,35,40,45,50,55,60", help="host_dispatch_s values to try (us)")
    args = parser.parse_args(argv)
    from planner.calibrate import default_graph_for, price_rows, row_cluster

    rows = fidelity._with_files(fidelity.load_rows([fidelity.DATA / "runs_h100.jsonl"]))
    graph_for = default_graph_for()
    table = []
    for row in rows:
        device = row_cluster(row).device
        ops = row_ops(row, graph_for)
        rest = price_rows([row], graph_for=graph_for)[0].time_s - passes_s(
            ops, kappa=device.kernel_overhead_s, host=device.host_dispatch_s, per_pass=False)
        table.append((row, ops, rest, device.kernel_overhead_s))
    kernel_report(table, graph_for)
    phased = {r.id for r, *_ in table if r.id in _phased_ids()}  # the second sweep: fwd_s / bwd_s / opt_s measured
    for per_pass in (False, True):
        for host in (float(h) * 1e-6 for h in args.hosts_us.split(",")):
            errors = {r.id: (r.split, (passes_s(ops, kappa=k, host=host, per_pass=per_pass) + rest) / r.step_s - 1.0)
                      for r, ops, rest, k in table}
            fit = np.array([e for s, e in errors.values() if s == "fit"])
            second = np.array([e for i, (s, e) in errors.items() if s == "fit" and i in phased])
            held = np.array([e for s, e in errors.values() if s != "fit"])
            print(f"{'per pass' if per_pass else 'per op  '} h={host * 1e6:.0f} us: fit mean sq. rel. error "
                  f"{np.mean(fit ** 2):.4f} (rows of the second sweep, batch 8+: {np.mean(second ** 2):.4f}), median "
                  f"|err| {100 * np.median(np.abs(fit)):.1f}%; held out median |err| "
                  f"{100 * np.median(np.abs(held)):.1f}% |",
                  " ".join(f"{i.removeprefix('h100-')} {100 * e:+.0f}" for i, (s, e) in errors.items() if s != "fit"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
