r"""Fit ``device.matmul_efficiency`` on a device's fit rows with module constants set: a diagnostic.

``planner calibrate`` / ``bench/fidelity.py --calibrate-to`` fit fields of the cluster's device and
links. Two things are module data, not fields, so they cannot be fitted that way: the fused attention
kernels' measured rates (``objectives.flash_rates.KERNEL_TFLOPS``, scaled here by ``--attention-scale``:
a stack whose kernels run slower or faster than the published FlashAttention-2 / cuDNN figures) and
``objectives.intra_op.OVERLAP_CONTENTION`` (the share of overlapped communication that still lengthens
the step). This script sets them in-process to the values given,
fits ``device.matmul_efficiency`` on the fit rows only with the same Gauss-Newton
(:func:`objectives.calibration.fit_parameters` over :func:`planner.calibrate.price_rows`), and
prints the fit rows' residuals and how they trend: the least-squares slope of the signed error on
``log2(sequence)`` among the rows at the most common GPU count, and on ``log2(GPUs)`` among the rows
at the most common sequence (percentage points per doubling). A constant that makes a model right
leaves both near 0. Held-out rows are never read::

    .venv/bin/python bench/constant_fit.py --attention-scale 0.6
    .venv/bin/python bench/constant_fit.py --contention 1.0 --json
    .venv/bin/python bench/constant_fit.py --device h100-sxm-96gb-500w   # torchtitan's fit rows, from 0.70

docs/VALIDATION.md, "Flash efficiency and overlap contention, fitted on the MPT fit rows" and "The
fits re-run after the sharded optimizer step", has the figures and what was decided from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
for _path in (REPO, REPO / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


def set_constants(*, attention_scale: float, contention: float) -> None:
    """Set the module data where the pricing reads it (each importer holds its own name): every measured
    attention rate times ``attention_scale``, and the overlap contention."""
    import objectives.flash_rates as flash_rates
    import objectives.intra_op as intra_op
    import objectives.tp_overlap as tp_overlap

    measured = flash_rates.MEASURED_KERNEL_TFLOPS
    flash_rates.KERNEL_TFLOPS = {kernel: {series: {dim: tuple(attention_scale * rate for rate in rates)
                                                   for dim, rates in by_dim.items()}
                                          for series, by_dim in by_series.items()}
                                 for kernel, by_series in measured.items()}
    for module in (intra_op, tp_overlap):
        module.OVERLAP_CONTENTION = contention


def starting_cluster(cluster):
    """``cluster`` with its device's ``matmul_efficiency`` set where the preset has none: a preset never
    fitted prices its products at :data:`objectives.compute.FAMILY_EFFICIENCY`'s figure (0.70), so the
    fit starts there (a field is calibratable only once it holds a value: ``h100-sxm-96gb-500w``'s
    fit on torchtitan's rows needs this); a fitted preset starts from its own value."""
    from objectives.compute import FAMILY_EFFICIENCY

    if cluster.device.matmul_efficiency is not None:
        return cluster
    device = dataclasses.replace(cluster.device, matmul_efficiency=FAMILY_EFFICIENCY["matmul"])
    return dataclasses.replace(cluster, device=device)


def _slope(x: Sequence[float], y: Sequence[float]) -> float:
    import numpy as np

    if len(set(x)) < 2:
        return float("nan")
    return float(np.polyfit(np.log2(np.asarray(x, dtype=float)), np.asarray(y, dtype=float), 1)[0])


def trends(rows, errors_pct: Sequence[float]) -> dict[str, float]:
    """Slopes of the signed error (points per doubling) on the sequence and on the GPU count."""
    seqs = [int(r.model.get("seq", 0)) for r in rows]
    gpus = [int(r.devices) for r in rows]
    at_gpus = Counter(gpus).most_common(1)[0][0]
    at_seq = Counter(seqs).most_common(1)[0][0]
    by_seq = [(s, e) for s, g, e in zip(seqs, gpus, errors_pct) if g == at_gpus]
    by_gpus = [(g, e) for s, g, e in zip(seqs, gpus, errors_pct) if s == at_seq]
    return {
        f"per_doubling_seq_at_{at_gpus}_gpus": _slope(*zip(*by_seq)) if by_seq else float("nan"),
        f"per_doubling_gpus_at_seq_{at_seq}": _slope(*zip(*by_gpus)) if by_gpus else float("nan"),
    }


def fit(args: argparse.Namespace) -> dict:
    """Price the fit rows, fit the matmul efficiency (unless ``--matmul`` fixes it), score the fit rows."""
    import fidelity
    import numpy as np

    from objectives.calibration import calibratable_parameters, fit_parameters, parameter_values, with_parameters
    from planner.calibrate import base_cluster, default_graph_for, price_rows

    set_constants(attention_scale=args.attention_scale, contention=args.contention)
    paths = args.runs or sorted(fidelity.DATA.glob("runs_*.jsonl"))
    rows = fidelity._with_files([r for r in fidelity.load_rows(paths) if r.device == args.device and r.split == "fit"])
    if not rows:
        raise SystemExit(f"no fit rows of device {args.device}")
    base = starting_cluster(base_cluster(rows, device=args.device, cluster_file=None))
    params = calibratable_parameters(base, ["device.matmul_efficiency"])
    graph_for = default_graph_for()

    def predict(cluster):
        constants = (params, parameter_values(cluster, params)) if params else None
        return [p.time_s for p in price_rows(rows, graph_for=graph_for, constants=constants)]

    value, evaluations = args.matmul, 0
    if params and value is None:
        result = fit_parameters(predict, base, params, [r.step_s for r in rows], rounds=args.rounds)
        value, evaluations = float(result.after[0]), result.evaluations
    cluster = with_parameters(base, params, [value]) if params and value is not None else base
    errors = [100.0 * (t / r.step_s - 1.0) for t, r in zip(predict(cluster), rows)]
    finite = np.isfinite(errors)
    kept = [r for r, ok in zip(rows, finite) if ok]
    signed = [e for e, ok in zip(errors, finite) if ok]
    return {
        "device": args.device, "attention_scale": args.attention_scale,
        "contention": args.contention, "matmul_efficiency": value, "evaluations": evaluations,
        "fit_rows": len(rows), "priced": len(kept),
        "median_abs_pct": float(np.median(np.abs(signed))), "bias_pct": float(np.median(signed)),
        "slope_pct_points": trends(kept, signed),
        "rows": {r.id: round(e, 1) for r, e in zip(rows, errors)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    from objectives.intra_op import OVERLAP_CONTENTION

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="*", default=None,
                        help="runs files (default: bench/fidelity/runs_*.jsonl)")
    parser.add_argument("--device", default="h100-sxm", help="the device whose fit rows are used (a preset name)")
    parser.add_argument("--attention-scale", type=float, default=1.0,
                        help="multiply every measured attention kernel rate (objectives.flash_rates) by this")
    parser.add_argument("--contention", type=float, default=OVERLAP_CONTENTION, help="OVERLAP_CONTENTION to price with")
    parser.add_argument("--matmul", type=float, default=None, help="fix device.matmul_efficiency instead of fitting it")
    parser.add_argument("--rounds", type=int, default=2, help="Gauss-Newton re-linearisations")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    out = fit(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['device']}: attention rates x {out['attention_scale']:.3f}, "
          f"contention {out['contention']:.3f}, matmul_efficiency {out['matmul_efficiency']:.3f} "
          f"({out['evaluations']} pricings); fit rows {out['priced']}/{out['fit_rows']}: "
          f"median |err| {out['median_abs_pct']:.1f}%, bias {out['bias_pct']:+.1f}%")
    for name, slope in out["slope_pct_points"].items():
        print(f"  slope of the signed error, {name.replace('_', ' ')}: {slope:+.1f} points")
    for row_id, err in out["rows"].items():
        print(f"  {row_id:48} {err:+6.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
