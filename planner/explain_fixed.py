"""``planner explain``'s fixed costs: each op's kernel launches and its collectives' latency, the stage's and
the step's sums (issue 23 item 1; the parts are :mod:`objectives.fixed_cost_parts`'s).

Per op and micro-batch: its kernels (forward, backward, the recomputed forward), what their launches add over
the passes' bare work, and for each intra-op collective NCCL's algorithm and protocol (inside a node) with the
latency part of its time and the call's setup. A stage sums its ops per micro-batch; a step's line, as the
MoE terms' (``objectives.pipeline_price``), is the stage with the most times the micro-batches.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from planner.core.units import format_bytes, format_seconds

__all__ = ["FIXED_KEYS", "fixed_json", "stage_fixed_s", "step_fixed_s", "per_op_plan_fixed", "fixed_table",
           "ops_fixed_table", "collective_text"]

FIXED_KEYS = ("kernel_launches", "collective_latency")
"""The fixed-cost lines this module adds to ``fixed_costs_s`` (``fixed cost: kernel launches`` ...)."""


def fixed_json(fixed: Any) -> dict[str, Any]:
    """An op's :class:`objectives.fixed_cost_parts.OpFixedCosts` as explain's JSON keys (per micro-batch; a
    launch of ``None``: inside a time priced apart, ``launch_priced_apart`` says which)."""
    again = fixed.recomputed
    return {
        "kernels": {"forward": fixed.kernels_forward, "backward": fixed.kernels_backward,
                    "recomputed_forward": fixed.kernels_forward if again else 0},
        "launch_s": {"forward": fixed.launch_forward_s, "backward": fixed.launch_backward_s,
                     "recomputed_forward": fixed.launch_forward_s if again else 0.0},
        "work_s": {"forward": fixed.work_forward_s, "backward": fixed.work_backward_s,
                   "recomputed_forward": fixed.work_forward_s if again else 0.0},
        "collectives": [{
            "kind": c.kind, "collective": c.collective, "tensor": c.tensor, "bytes": c.num_bytes, "devices": c.devices,
            "nodes": c.nodes, "count": c.count, "model": c.model, "algorithm": c.algorithm, "protocol": c.protocol,
            "seconds": c.seconds, "latency_s": c.latency_s, "setup_s": c.setup_s,
        } for c in fixed.collectives],  # fmt: skip
        "launch_priced_apart": fixed.priced_apart,
        "collectives_overlapped": fixed.overlapped,
        "kernel_launches_s": fixed.launch_s,
        "kernel_launches_host_bound_s": fixed.host_bound_s,
        "collective_latency_s": fixed.collective_fixed_s,
    }


def stage_fixed_s(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Per micro-batch, the stage's kernel launches and collective latency (its op rows' sums); ``None``
    when its rows carry none (no execution model)."""
    fixed = [r for r in rows if "kernels" in r]
    if not fixed:
        return None
    return {"kernel_launches": sum(r["kernel_launches_s"] for r in fixed),
            "kernel_launches_host_bound": sum(r["kernel_launches_host_bound_s"] for r in fixed),
            "collective_latency": sum(r["collective_latency_s"] for r in fixed),
            "kernels": sum(sum(r["kernels"].values()) for r in fixed)}


def step_fixed_s(stages: list[dict[str, Any]], micro_batches: int) -> dict[str, float]:
    """The step's lines: the stage with the most of each, times the micro-batches (empty without)."""
    sums = [s["fixed_per_micro_batch_s"] for s in stages if s.get("fixed_per_micro_batch_s")]
    if not sums:
        return {}
    return {key: micro_batches * max(s[key] for s in sums) for key in FIXED_KEYS}


def per_op_plan_fixed(cost: Any, choice: Any) -> list[dict[str, Any] | None]:
    """A per-op plan's fixed costs, one entry per op of ``cost.graph`` (``None`` without an execution model)."""
    from objectives.fixed_cost_parts import op_fixed_costs

    out = []
    for index, pick in enumerate(choice):
        fixed = op_fixed_costs(cost, index, int(pick))
        out.append(None if fixed is None else fixed_json(fixed))
    return out


def collective_text(row: dict[str, Any]) -> str:
    """An op's collectives as a table cell: ``all reduce 2.00 MiB 8 devices ring/LL128: 36.6 us + 20.0 us setup``."""
    parts = []
    for c in row.get("collectives", ()):
        group = f"{c['devices'] * c['nodes']} devices" + (f" on {c['nodes']} nodes" if c["nodes"] > 1 else "")
        how = f"{c['algorithm']}/{c['protocol']}" if c["algorithm"] else c["model"]
        setup = f" + {format_seconds(c['setup_s'])} setup" if c["setup_s"] else ""
        parts.append(f"{c['collective'].replace('_', ' ')} {format_bytes(c['bytes'])} {group} {how}: "
                     f"{format_seconds(c['latency_s'])}{setup}")
    return "; ".join(parts) or "-"


_APART = {"moe": "in MoE price", "measured": "in measured"}
"""What a launch cell says where the op's seconds are priced apart (``launch_priced_apart``)."""


def _launch(value: float | None, apart: str | None) -> str:
    return _APART.get(apart or "", "-") if value is None else format_seconds(value)


def fixed_table(stage: dict[str, Any], *, top: int, all_ops: bool) -> Table | None:
    """A stage's fixed costs by op, per micro-batch (:func:`ops_fixed_table`); ``None`` when its rows carry none."""
    totals = stage.get("fixed_per_micro_batch_s")
    if not totals:
        return None
    title = (f"Stage {stage['index']} fixed costs by op (per device and micro-batch, inside its forward and backward; "
             "f/b/r: forward, backward, recomputed forward")
    return ops_fixed_table(title, stage["op_rows"], f"stage {stage['index']}", totals, top=top, all_ops=all_ops)


def ops_fixed_table(title: str, rows: list[dict[str, Any]], total_label: str, totals: dict[str, float], *, top: int,
                    all_ops: bool) -> Table:
    """Ops' fixed costs: every row (``all_ops``) or the ``top`` by launches plus collective latency, the rest
    summed, and ``totals`` (:func:`stage_fixed_s`) on a last row named ``total_label``; ``title`` is left open
    for the rows' selection and its closing parenthesis."""
    rows = [r for r in rows if "kernels" in r]
    shown = rows if all_ops else sorted(rows, key=lambda r: -(r["kernel_launches_s"] + r["collective_latency_s"]))[:top]
    which = "" if all_ops or len(shown) == len(rows) else f"; top {top} by launches and latency, --all for every op"
    table = Table(title=f"{title}{which})", title_justify="left")
    for column in ("op", "kernels f/b/r", "launch f/b/r", "launches", "host-bound",
                   "collectives: latency (NCCL algorithm/protocol)"):
        table.add_column(column, justify="left" if column[0] in "oc" else "right", no_wrap=True, overflow="fold")
    names = set()
    for r in shown:
        names.add(r["op"])
        k, launch, apart = r["kernels"], r["launch_s"], r["launch_priced_apart"]
        table.add_row(r["op"], f"{k['forward']}/{k['backward']}/{k['recomputed_forward']}",
                      " / ".join(_launch(launch[p], apart) for p in ("forward", "backward", "recomputed_forward")),
                      _APART[apart] if apart else format_seconds(r["kernel_launches_s"]),
                      "" if apart else format_seconds(r["kernel_launches_host_bound_s"]),
                      collective_text(r))  # fmt: skip
    rest = [r for r in rows if r["op"] not in names]
    if rest:
        table.add_row(f"the other {len(rest)} ops", str(sum(sum(r["kernels"].values()) for r in rest)), "",
                      format_seconds(sum(r["kernel_launches_s"] for r in rest)),
                      format_seconds(sum(r["kernel_launches_host_bound_s"] for r in rest)),
                      f"latency + setup {format_seconds(sum(r['collective_latency_s'] for r in rest))}")  # fmt: skip
    table.add_section()
    table.add_row(total_label, str(totals["kernels"]), "", format_seconds(totals["kernel_launches"]),
                  format_seconds(totals["kernel_launches_host_bound"]),
                  f"latency + setup {format_seconds(totals['collective_latency'])}", style="bold")  # fmt: skip
    return table
