"""Where the predicted step of published runs goes, and how much slower attention would have to be to meet them.

Each row of ``bench/fidelity/runs_*.jsonl`` is priced as ``bench/fidelity.py`` prices it
(:func:`planner.estimate.estimate` under the row's settings), and its predicted step is split per op
(:func:`objectives.stage_ops.stage_ops`, what ``planner explain`` lists) into

* ``attention``: the attention cores' ops (:func:`objectives.attention.find_attention_cores`: the score and
  value products, the softmax and the ops between), compute only;
* ``matmul``: every other product (linear layers, the LM head), compute only;
* ``other``: every other op's compute (norms, elementwise, embedding, loss);
* ``comm``: the ops' own collectives and the redistribution between ops (a context-parallel K/V exchange
  included), per step;
* ``tail``: what no op's row holds (the pipeline bubble, stage-to-stage transfers, fixed costs no op owns).

Each op's row holds its optimizer step and gradient synchronisation, as ``planner explain`` lists them, so
they sit in ``matmul`` and ``other``.

``attention x`` is the factor on the predicted attention time that would meet the measured step if
everything else were priced right, :func:`implied_attention_factor`; ``scaled`` first scales the rest by
what the model's row with the smallest attention share needs (:func:`reference_scales`: at a short
sequence the rest is nearly all of the step). docs/VALIDATION.md ("Context-parallel rows at 131k-262k
tokens") reads both columns.

Usage::

    .venv/bin/python bench/attention_share.py --runs bench/fidelity/runs_h100_fp8_cp.jsonl --only t2-g8
    .venv/bin/python bench/attention_share.py --runs bench/fidelity/runs_h100_cluster.jsonl --only llmfoundry-h100-mpt760m-s

Rows whose graph is not cached (``.cache/fidelity``) are skipped; ``bench/fidelity.py`` builds them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TERMS = ("attention", "matmul", "other", "comm", "tail")
"""The parts of a predicted step (module docstring), in print order."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """One row's measured step and its predicted step by part (seconds per step)."""

    id: str
    model: str
    """The row's model without its sequence length, and its devices: rows of one model on one cluster at
    several lengths share it."""
    measured_s: float
    predicted_s: float
    parts: Mapping[str, float]

    @property
    def rest_s(self) -> float:
        """The predicted step but its attention."""
        return self.predicted_s - self.parts["attention"]


def implied_attention_factor(measured_s: float, attention_s: float, rest_s: float, rest_scale: float = 1.0) -> float:
    """``(measured - rest_scale x rest) / attention``: the factor on the predicted attention time that meets the
    measured step when the rest of the prediction, times ``rest_scale``, is right; NaN without attention.

    Examples
    --------
    >>> implied_attention_factor(10.0, 4.0, 2.0)          # (10 - 2) / 4
    2.0
    >>> implied_attention_factor(10.0, 4.0, 2.0, 1.5)     # (10 - 3) / 4
    1.75
    """
    if attention_s <= 0.0:
        return math.nan
    return (measured_s - rest_scale * rest_s) / attention_s


def reference_scales(splits: Sequence[Split]) -> dict[str, float]:
    """Per model, what its row with the smallest attention share asks of the rest of the prediction, taking
    that row's attention as priced right: ``(measured - attention) / rest``.

    Examples
    --------
    >>> short = Split(id="a", model="m", measured_s=1.2, predicted_s=1.1, parts={"attention": 0.1})
    >>> long = Split(id="b", model="m", measured_s=4.0, predicted_s=2.5, parts={"attention": 1.5})
    >>> round(reference_scales([short, long])["m"], 6)   # (1.2 - 0.1) / 1.0
    1.1
    """
    best: dict[str, Split] = {}
    for split in splits:
        share = split.parts["attention"] / split.predicted_s
        kept = best.get(split.model)
        if kept is None or share < kept.parts["attention"] / kept.predicted_s:
            best[split.model] = split
    return {model: (s.measured_s - s.parts["attention"]) / s.rest_s for model, s in best.items() if s.rest_s > 0.0}


def split_row(row: Any, graph_for: Any) -> Split:
    """Price ``row`` as ``bench/fidelity.py`` does and split its predicted step (module docstring)."""
    from objectives.attention import find_attention_cores
    from objectives.pipeline_cost import PipelineCostCache
    from objectives.stage_ops import stage_ops
    from planner.calibrate import row_cluster, row_settings
    from planner.estimate import estimate

    cluster, settings = row_cluster(row), row_settings(row)
    cache = PipelineCostCache(graph_for(row), cluster=cluster, settings=settings)
    result = estimate(cache, cluster=cluster, tp=row.tp, pp=row.pp, dp=row.dp, cp=row.cp, micro_batch=row.micro_batch,
                      global_batch=row.global_batch, zero=row.zero, recompute=row.recompute,
                      sequence_parallel=row.sequence_parallel, schedule=row.schedule, chunks=row.chunks,
                      stage_layers=row.stage_layers, settings=settings)
    point = result.point
    if not result.valid or point is None:
        raise ValueError(f"row {row.id}: no prediction ({result.reason})")
    cores = {point.graph.ops[i].name for core in find_attention_cores(point.graph) for i in core.ops}
    parts: Counter = Counter({name: 0.0 for name in TERMS})
    micro_batches = point.micro_batches
    for stage in stage_ops(cache, point):
        for op in stage.ops:
            comm = micro_batches * sum(op.comm_s.values())
            kind = "attention" if op.name in cores else ("matmul" if op.kind == "matmul" else "other")
            parts[kind] += op.per_step_s(micro_batches) - comm
            parts["comm"] += comm
        parts["comm"] += micro_batches * stage.redistribution_s
    # what the op rows do not hold; rounded so that float noise prints as 0
    parts["tail"] = round(float(result.time_s) - sum(parts[name] for name in TERMS if name != "tail"), 9) + 0.0
    shape = {k: v for k, v in row.model.items() if k not in ("seq", "params", "params_b", "path", "dims")}
    model = json.dumps({**shape, "device": row.device, "devices": row.devices}, sort_keys=True)
    return Split(id=row.id, model=model, measured_s=row.step_s, predicted_s=float(result.time_s), parts=dict(parts))


def _table(splits: Sequence[Split]) -> list[str]:
    scales = reference_scales(splits)
    lines = [f"{'row':<56} {'measured':>9} {'predicted':>9} " + " ".join(f"{t:>9}" for t in TERMS)
             + f" {'attn x':>7} {'scaled':>7}"]
    for s in splits:
        factor = implied_attention_factor(s.measured_s, s.parts["attention"], s.rest_s)
        scaled = implied_attention_factor(s.measured_s, s.parts["attention"], s.rest_s, scales.get(s.model, math.nan))
        lines.append(f"{s.id:<56} {s.measured_s:>9.3f} {s.predicted_s:>9.3f} "
                     + " ".join(f"{s.parts[t]:>9.3f}" for t in TERMS) + f" {factor:>7.2f} {scaled:>7.2f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", type=Path, required=True, help="runs files (bench/fidelity/runs_*.jsonl)")
    parser.add_argument("--only", default="", help="only rows whose id contains this text")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "bench"))
    import fidelity
    from planner.calibrate import default_graph_for

    graph_for = default_graph_for()
    splits = []
    for row in fidelity._with_files([r for r in fidelity.load_rows(args.runs) if args.only in r.id]):
        path = row.model.get("path")
        if not path or not Path(path).exists():
            print(f"skipped {row.id}: its graph is not cached (bench/fidelity.py builds it)", file=sys.stderr)
            continue
        try:
            splits.append(split_row(row, graph_for))
        except ValueError as error:
            print(f"skipped {error}", file=sys.stderr)
    print("\n".join(_table(splits)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
