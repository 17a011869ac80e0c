"""Drawing results: Rich tables on stdout, or JSON keyed like the table's columns.

Nothing here computes a cost; it formats what the library returns. ``planner plan`` has one result
type, :class:`planner.launchable.LaunchFrontier` (the launchable search's, and the per-op research
search's through :func:`planner.research.research_frontier`), and one renderer for it:
:func:`launch_table` / :func:`launch_json`, with :func:`devices_table` for a sweep and
:func:`plot_frontier` for ``--plot``. Warnings and progress go to stderr elsewhere, so stdout stays
clean for ``--json | jq``.

The console reads no Rich markup: op, dim, block and file names come from the user's input, and a
node named ``[/mm]`` or a path holding ``[link=file:///etc/passwd]`` must print as written (markup
would crash on the first and draw a terminal link for the second). Styles are given as ``style=``
arguments or :class:`rich.text.Text` spans instead. For the same reason control characters (ESC
starts a terminal's own escape sequences, links and title changes included) are shown as ``\x1b``
(:func:`printable`; :class:`SafeConsole` applies it to every string it renders).
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from typing import Any, Sequence

from rich.console import Console
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from planner.core.errors import PlannerError
from planner.core.strategy import public_form
from planner.core.units import format_bytes, format_seconds
from planner.explain_fixed import FIXED_KEYS, fixed_json, fixed_table, ops_fixed_table, per_op_plan_fixed, stage_fixed_s, step_fixed_s

__all__ = [
    "SafeConsole", "OutputError", "printable", "stdout", "print_json", "write_stdout", "flush_stdout", "summary",
    "devices_table", "plot_frontier", "launch_table", "launch_json",
]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls but tab and newline, DEL, and the C1 controls (U+009B is a one-character CSI)."""


def printable(text: str) -> str:
    r"""``text`` with control characters written as ``\xNN``, so no name from the input can send a
    terminal escape sequence.

    >>> printable("op\x1b]8;;file:///etc/passwd\x07")
    'op\\x1b]8;;file:///etc/passwd\\x07'
    """
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


class SafeConsole(Console):
    """A Rich console that renders every string through :func:`printable` (table cells and titles
    included: Rich turns them into text with :meth:`render_str`)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:  # type: ignore[override]
        return super().render_str(printable(text), **kwargs)


class OutputError(PlannerError):
    """stdout cannot be written: a full disk (``> /dev/full``), a quota, an I/O error, or a reader
    that went away (``| head``: :attr:`quiet`, nothing more to say). One line on stderr, exit code 2."""

    def __init__(self, message: str, *, quiet: bool = False) -> None:
        super().__init__(message)
        self.quiet = quiet


def _output_error(exc: OSError) -> OutputError:
    """The :class:`OutputError` for a failed write to stdout, with stdout pointed at ``/dev/null`` so
    that the interpreter's last flush of what is still buffered neither fails nor prints a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's captured stdout)
        pass
    if isinstance(exc, BrokenPipeError):
        return OutputError("stdout was closed (its reader exited)", quiet=True)
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return OutputError(f"cannot write output: {reason}; free some space, or send stdout to another file system")
    return OutputError(f"cannot write output: {reason}; check where stdout goes (a file, a pipe, a terminal)")


def write_stdout(text: str) -> None:
    """Write ``text`` on stdout and flush it; :class:`OutputError` when that fails."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        raise _output_error(exc) from None


def flush_stdout() -> None:
    """Flush stdout (the last step of every command); :class:`OutputError` when that fails."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        raise _output_error(exc) from None
    except ValueError:  # stdout closed by the caller: nothing is buffered to lose
        pass


class _StdoutConsole(SafeConsole):
    """The stdout console, whose failed writes raise :class:`OutputError` (Rich would raise the bare
    ``OSError``, an internal error, or exit with code 1 on a closed pipe). What it held is dropped."""

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except OSError as exc:
            del self._buffer[:]
            raise _output_error(exc) from None

    def on_broken_pipe(self) -> None:
        del self._buffer[:]
        raise _output_error(BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)))


TABLE_WIDTH = 140
"""Columns of a table printed to a pipe or file (a terminal's own width when wider): the launchable
table's ten columns fit without wrapping a row."""

RUN_TABLE_WIDTH = 160
"""Columns of the launchable table with a run's days, GPU-hours and cost, printed to a pipe or file."""

stdout = _StdoutConsole(highlight=False, markup=False, soft_wrap=False, width=max(TABLE_WIDTH, Console().width))


def print_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (plain, so pipes get valid JSON); :class:`OutputError` when
    stdout cannot be written."""
    write_stdout(json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def summary(model_summary: Any, *, json_out: bool) -> None:
    """Print a model summary (``importers.summary.ModelSummary``): opaque ops first, then figures."""
    data = model_summary.to_json()
    if json_out:
        print_json(data)
        return
    opaque = data.get("opaque") or []
    if opaque:
        table = Table(title="Unsupported ops (kept replicated, priced as opaque)", title_justify="left", style="yellow")
        for column in ("op type", "count", "nodes"):
            table.add_column(column)
        for entry in opaque:
            nodes = entry["nodes"]
            table.add_row(entry["op_type"], str(entry["count"]), ", ".join(nodes[:5]) + (" ..." if len(nodes) > 5 else ""))
        stdout.print(table)
    table = Table(title=f"Model {data.get('name', '')}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, value in data.items():
        if isinstance(value, (dict, list)):
            continue
        table.add_row(key.replace("_", " "), _format_value(key, value))
    for key in ("raw_op_types", "op_kinds", "dim_bindings"):
        counts = data.get(key) or {}
        table.add_row(key.replace("_", " "), ", ".join(f"{name} {count:,}" for name, count in counts.items()))
    stdout.print(table)
    blocks = data.get("blocks") or []
    if blocks:
        table = Table(title="Repeated blocks", title_justify="left")
        for column in ("name", "count", "ops per block"):
            table.add_column(column)
        for block in blocks:
            table.add_row(block["name"], str(block["count"]), str(block["ops_per_block"]))
        stdout.print(table)
    # the import's warnings went to stderr already (planner inspect), once; --json keeps them in the document


def _format_value(key: str, value: Any) -> str:
    if isinstance(value, float):
        if key.endswith("_bytes"):
            return format_bytes(value)
        if "flops" in key:
            return f"{value:.4g}"
        return f"{value:.4g}"
    if isinstance(value, int) and key.endswith("_bytes"):
        return format_bytes(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value[:8]) + (" ..." if len(value) > 8 else "")
    return str(value)


def devices_table(frontiers: Sequence[Any]) -> None:
    """How the picked row's step time falls as devices are added (``--devices 8,16,32``), one line
    per :class:`planner.launchable.LaunchFrontier`."""
    table = Table(title="Scaling with devices", title_justify="left")
    for name in ("devices", "best step time", "memory/device", "vs DP", "layout"):
        table.add_column(name)
    for frontier in frontiers:
        best = frontier.best
        if best is None:
            table.add_row(str(frontier.cluster.devices), "none fits", "-", "-", printable(frontier.message))
            continue
        speedup = frontier.speedup_vs_dp(best)
        table.add_row(str(frontier.cluster.devices), _time_text(best), format_bytes(best.memory_bytes),
                      "-" if speedup is None else f"{speedup:.2f}x", _layout_text(best))  # fmt: skip
    stdout.print(table)


def plot_frontier(frontier: Any, path: Any, *, model: str, format: str | None = None) -> None:
    """Write an image of a frontier's rows (``format``: a matplotlib file type, default from
    ``path``'s extension): step time vs memory per device, the limit as a line, the pick circled,
    the data-parallel baseline and the ``extras``' other baselines marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    gib = 2.0**30
    times = [row.time_s for row in frontier.rows]
    memories = [row.memory_bytes / gib for row in frontier.rows]
    axes.step(memories, times, where="post", color="tab:blue", alpha=0.4)
    axes.scatter(memories, times, color="tab:blue", label="frontier", zorder=3)
    best = frontier.best
    if best is not None:
        axes.scatter([best.memory_bytes / gib], [best.time_s], s=140, facecolors="none", edgecolors="tab:green",
                     linewidths=2, label=f"picked #{frontier.chosen + 1}", zorder=4)  # fmt: skip
    marked = [("data_parallel", frontier.baseline.summary, frontier.baseline.time_s, frontier.baseline.memory_bytes)
              ] if frontier.baseline is not None else []  # fmt: skip
    for name, baseline in frontier.extras.get("baselines", {}).items():
        if baseline is not None and name != "data_parallel":
            marked.append((name, baseline["label"], baseline["step_time_s"], baseline["memory_per_device_bytes"]))
    markers = {"data_parallel": "s", "best_uniform": "^", "weird_trick": "D"}
    for name, label, time_s, memory_bytes in marked:
        axes.scatter([memory_bytes / gib], [time_s], marker=markers.get(name, "x"), color="tab:orange", zorder=3,
                     label=f"{name.replace('_', ' ')} ({label})")  # fmt: skip
    axes.axvline(frontier.memory_limit_bytes / gib, color="tab:red", linestyle="--", label="memory limit")
    axes.set_xlabel("memory per device (GiB)")
    axes.set_ylabel("time per step (s)")
    axes.set_title(f"{model} on {frontier.cluster.devices} x {frontier.cluster.device.name}")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format=format)
    plt.close(figure)


def _op_rows_json(evaluation: Any) -> list[dict[str, Any]]:
    rows = []
    for row in evaluation.ops:
        rows.append(
            {
                "op": row.name,
                "kind": row.kind,
                "op_type": row.op_type,
                "splits": dict(row.splits),
                "inter_node_splits": dict(row.inter_splits),
                "devices": row.devices,
                "time_s": row.time_s,
                "compute_s": row.compute_s,
                "comm_s": dict(row.comm_s),
                "grad_sync_s": row.grad_sync_s,
                "memory_bytes": row.memory.total_bytes,
                "memory_breakdown_bytes": _memory_json(row.memory),
            }
        )
    return rows


def explain_json(loaded: Any, *, top: int) -> dict[str, Any]:
    """A saved plan explained: totals, communication by kind and link level, per-op rows, top ops."""
    evaluation = loaded.evaluation
    rows = _op_rows_json(evaluation)
    for row, fixed in zip(rows, per_op_plan_fixed(loaded.cost, evaluation.choice)):
        row.update(fixed or {})
    fixed_s = stage_fixed_s(rows)
    return {
        "plan": str(loaded.path),
        "model": loaded.graph.name,
        "time_s": evaluation.time_s,
        "memory_bytes": evaluation.memory_bytes,
        "time_breakdown_s": {
            "compute": evaluation.time.compute_s,
            "intra_op_comm": evaluation.time.intra_op_comm_s,
            "redistribution": evaluation.time.redistribution_s,
            "grad_sync": evaluation.time.grad_sync_s,
        },
        "memory_breakdown_bytes": _memory_json(evaluation.memory),
        "fixed_costs_s": {} if fixed_s is None else {k: fixed_s[k] for k in FIXED_KEYS},
        "comm_by_kind_s": dict(evaluation.comm_by_kind_s),
        "comm_by_link_level_s": dict(evaluation.comm_by_level_s),
        "ops": rows,
        "top_by_time": [r["op"] for r in sorted(rows, key=lambda r: -r["time_s"])[:top]],
        "top_by_memory": [r["op"] for r in sorted(rows, key=lambda r: -r["memory_bytes"])[:top]],
    }


def explain(loaded: Any, *, top: int, json_out: bool, all_ops: bool) -> None:
    """Print how each op of a saved plan is split and why it costs what it costs (a plan of the
    launchable table: its stages, step-time parts and memory, priced again)."""
    if hasattr(loaded, "point"):
        _explain_repriced(loaded, json_out=json_out, top=top, all_ops=all_ops)
        return
    data = explain_json(loaded, top=top)
    if json_out:
        print_json(data)
        return
    stdout.print(
        Text.assemble(
            (printable(str(data["model"])), "bold"),
            printable(
                f": {format_seconds(data['time_s'])}/step, {format_bytes(data['memory_bytes'])}/device "
                f"({loaded.request.cluster.devices} x {loaded.request.cluster.device.name})"
            ),
        )
    )
    totals = Table(title="Where the time goes", title_justify="left")
    totals.add_column("component")
    totals.add_column("time", justify="right")
    for name, value in data["time_breakdown_s"].items():
        totals.add_row(name.replace("_", " "), format_seconds(value))
    for name, value in data["fixed_costs_s"].items():
        totals.add_row(f"  fixed cost: {name.replace('_', ' ')}", format_seconds(value))
    for name, value in data["comm_by_kind_s"].items():
        totals.add_row(f"  comm: {name.replace('_', ' ')}", format_seconds(value))
    for name, value in data["comm_by_link_level_s"].items():
        totals.add_row(f"  comm on {name}-node links", format_seconds(value))
    stdout.print(totals)
    memory = Table(title="Memory per device", title_justify="left")
    memory.add_column("component")
    memory.add_column("bytes", justify="right")
    for name, value in data["memory_breakdown_bytes"].items():
        memory.add_row(name, format_bytes(value))
    stdout.print(memory)
    rows = {r["op"]: r for r in data["ops"]}
    names = [r["op"] for r in data["ops"]] if all_ops else list(
        dict.fromkeys(data["top_by_time"] + data["top_by_memory"])
    )
    table = Table(
        title="Per op" + ("" if all_ops else f" (top {top} by time and by memory; --all for every op)"),
        title_justify="left",
    )
    for column, justify in (
        ("op", "left"), ("kind", "left"), ("split", "left"), ("devices", "right"), ("compute", "right"),
        ("comm", "right"), ("grad sync", "right"), ("memory", "right"),
    ):
        table.add_column(column, justify=justify)
    for name in names:
        r = rows[name]
        split = ", ".join(
            f"{d}={f}" + (f" ({r['inter_node_splits'][d]} across nodes)" if d in r["inter_node_splits"] else "")
            for d, f in r["splits"].items()
        ) or "replicated"
        comm = ", ".join(f"{k.replace('_', ' ')} {format_seconds(v)}" for k, v in r["comm_s"].items() if v > 0) or "-"
        table.add_row(
            name, r["kind"], split, str(r["devices"]), format_seconds(r["compute_s"]), comm,
            format_seconds(r["grad_sync_s"]), format_bytes(r["memory_bytes"]),
        )
    stdout.print(table)
    if data["fixed_costs_s"]:
        _print_natural(ops_fixed_table("Fixed costs by op (per device, inside its compute and comm; f/b/r: forward, "
                                       "backward, recomputed forward", data["ops"], "all ops",
                                       stage_fixed_s(data["ops"]), top=top, all_ops=all_ops))  # fmt: skip


def compare_json(first: Any, second: Any) -> dict[str, Any]:
    """The cost difference of two plans of one model, by component and by op (second minus first)."""
    a, b = explain_json(first, top=0), explain_json(second, top=0)

    def diff(x: dict[str, float], y: dict[str, float]) -> dict[str, float]:
        return {k: y.get(k, 0.0) - x.get(k, 0.0) for k in dict.fromkeys([*x, *y])}

    ops_a = {r["op"]: r for r in a["ops"]}
    per_op = []
    for r in b["ops"]:
        o = ops_a[r["op"]]
        if r["splits"] != o["splits"] or abs(r["time_s"] - o["time_s"]) > 0 or r["memory_bytes"] != o["memory_bytes"]:
            per_op.append(
                {
                    "op": r["op"],
                    "splits_a": o["splits"],
                    "splits_b": r["splits"],
                    "time_delta_s": r["time_s"] - o["time_s"],
                    "memory_delta_bytes": r["memory_bytes"] - o["memory_bytes"],
                }
            )
    per_op.sort(key=lambda r: -abs(r["time_delta_s"]))
    return {
        "plan_a": a["plan"],
        "plan_b": b["plan"],
        "time_s": {"a": a["time_s"], "b": b["time_s"], "delta": b["time_s"] - a["time_s"]},
        "memory_bytes": {"a": a["memory_bytes"], "b": b["memory_bytes"], "delta": b["memory_bytes"] - a["memory_bytes"]},
        "time_breakdown_delta_s": diff(a["time_breakdown_s"], b["time_breakdown_s"]),
        "memory_breakdown_delta_bytes": diff(a["memory_breakdown_bytes"], b["memory_breakdown_bytes"]),
        "comm_by_kind_delta_s": diff(a["comm_by_kind_s"], b["comm_by_kind_s"]),
        "ops": per_op,
        "redistribution_delta_s": b["time_breakdown_s"]["redistribution"] - a["time_breakdown_s"]["redistribution"],
        "host_bound": {"a": False, "b": False},  # a per-op plan has no stage, so no host floor (planner.host_bound)
    }


def compare(first: Any, second: Any, *, json_out: bool, top: int) -> None:
    """Print the cost difference of two plans (B minus A); two launchable plans by their step-time
    parts, layout and memory (:func:`compare_repriced_json`)."""
    if hasattr(first, "point"):
        _compare_repriced(first, second, json_out=json_out, top=top)
        return
    data = compare_json(first, second)
    if json_out:
        print_json(data)
        return

    def signed_time(value: float) -> str:
        return ("+" if value >= 0 else "-") + format_seconds(abs(value))

    def signed_bytes(value: float) -> str:
        return ("+" if value >= 0 else "-") + format_bytes(abs(value))

    stdout.print(
        f"A = {data['plan_a']}: {format_seconds(data['time_s']['a'])}, {format_bytes(data['memory_bytes']['a'])}/device\n"
        f"B = {data['plan_b']}: {format_seconds(data['time_s']['b'])}, {format_bytes(data['memory_bytes']['b'])}/device\n"
        f"B - A: {signed_time(data['time_s']['delta'])}/step, {signed_bytes(data['memory_bytes']['delta'])}/device"
    )
    components = Table(title="Difference by component (B - A)", title_justify="left")
    components.add_column("component")
    components.add_column("delta", justify="right")
    for name, value in data["time_breakdown_delta_s"].items():
        components.add_row(f"time: {name.replace('_', ' ')}", signed_time(value))
    for name, value in data["comm_by_kind_delta_s"].items():
        components.add_row(f"  comm: {name.replace('_', ' ')}", signed_time(value))
    for name, value in data["memory_breakdown_delta_bytes"].items():
        components.add_row(f"memory: {name}", signed_bytes(value))
    stdout.print(components)
    table = Table(title=f"Ops that differ (top {top} by time)", title_justify="left")
    for column in ("op", "split A", "split B", "time B - A", "memory B - A"):
        table.add_column(column)
    for row in data["ops"][:top]:
        table.add_row(
            row["op"],
            ", ".join(f"{k}={v}" for k, v in row["splits_a"].items()) or "replicated",
            ", ".join(f"{k}={v}" for k, v in row["splits_b"].items()) or "replicated",
            signed_time(row["time_delta_s"]),
            signed_bytes(row["memory_delta_bytes"]),
        )
    stdout.print(table)
    stdout.print(f"redistribution between ops: {signed_time(data['redistribution_delta_s'])}")


def devices_presets(rows: list[dict[str, Any]], *, json_out: bool) -> None:
    """Print the device presets."""
    if json_out:
        print_json(rows)
        return
    table = Table(title="Device presets (--device NAME)", title_justify="left")
    # The presets hold what CUDA exposes less its context (objectives/cluster.py), a little under the
    # datasheet's "80 GB": GiB with a decimal says so, where a rounded decimal "84 GB" would read as a bigger part.
    for column in ("name", "bf16/fp16 TFLOP/s", "fp32 TFLOP/s", "usable memory", "bandwidth", "links (intra / inter)"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["name"], f"{row['half_tflops']:.0f}", f"{row['fp32_tflops']:.1f}", f"{row['memory_bytes'] / 2**30:.2f} GiB",
            f"{row['memory_bandwidth_tb_per_s']:.2f} TB/s", f"{row['intra_link']} / {row['inter_link']}",
        )
    stdout.print(table)


def _memory_json(memory: Any) -> dict[str, float] | None:
    if memory is None:
        return None
    out = {
        "params": memory.params_bytes,
        "grads": memory.grads_bytes,
        "optimizer": memory.optimizer_bytes,
        "activations": memory.activations_bytes,
        "allocator_reserve": memory.other_bytes,  # objectives.memory.OTHER_FRACTION: reserved over allocated
    }
    if getattr(memory, "graph_buffers_bytes", 0.0):  # per-layer CUDA graphs' static buffers (objectives.cuda_graph_memory)
        out["cuda_graph_buffers"] = memory.graph_buffers_bytes
    out["nccl_buffers"] = float(getattr(memory, "nccl_bytes", 0.0))  # outside PyTorch's allocator (objectives.nccl_memory)
    return out


def pipeline_point_json(point: Any, rank: int, targets: Sequence[str] | None = None) -> dict[str, Any]:
    """One point of the pipeline frontier as JSON, keyed like the table's columns."""
    return {
        "rank": rank,
        "step_time_s": point.time_s,
        "samples_per_s": point.samples_per_s,
        "memory_per_device_bytes": point.memory_bytes,
        "fits": point.fits,
        "pp": point.pp,
        "dp": point.dp,
        "tp": point.tp,
        "micro_batch": point.micro_batch,
        "micro_batches": point.micro_batches,
        "global_batch": point.global_batch,
        "zero_stage": point.zero_stage,
        "recompute": point.recompute,
        "schedule": point.schedule,
        "chunks": point.chunks,
        # a model without repeated blocks has no layers to cut (the generic export leaves the field out too)
        "layers_per_stage": list(point.layers_per_stage) if sum(point.layers_per_stage) else None,
        "bubble_fraction": point.time.bubble_fraction,
        "targets": None if targets is None else list(targets),
        "summary": point.summary,
        "memory_breakdown_bytes": _memory_json(point.memory),
        "splits": point.splits if point.graph is not None else {},
    }


def estimate_report(estimate: Any, *, json_out: bool, warnings: Sequence[str] = ()) -> None:
    """Print one Megatron-style configuration's price and rank (``planner estimate``); the JSON keeps the
    import's ``warnings`` about the model (``"warnings"``), as ``plan --json`` does."""
    data = {
        "config": estimate.config.describe(),
        "valid": estimate.valid,
        "reason": estimate.reason,
        "step_time_s": None if not estimate.valid else estimate.time_s,
        "samples_per_s": None if not estimate.valid else estimate.samples_per_s,
        "memory_per_device_bytes": None if not estimate.valid else estimate.memory_bytes,
        "memory_breakdown_bytes": _memory_json(estimate.memory),
        "fits": estimate.fits,
        "memory_limit_bytes": estimate.memory_limit_bytes,
        "rank": estimate.rank,
        "frontier_points": estimate.frontier_points,
        "fitting_points": estimate.fitting_points,
        "best_time_s": estimate.best_time_s,
        "slowdown_vs_best": estimate.slowdown_vs_best,
        "notes": list(estimate.notes),
        "warnings": list(warnings),
    }
    if json_out:
        print_json(data)
        return
    stdout.print(Text(printable(str(data["config"])), style="bold"))
    if not estimate.valid:
        return  # the reason is the command's one-line error (exit 2)
    stdout.print(
        f"step time {format_seconds(estimate.time_s)} ({estimate.samples_per_s:,.1f} samples/s), "
        f"memory {format_bytes(estimate.memory_bytes)}/device "
        + ("(fits)" if estimate.fits else f"(over the {format_bytes(estimate.memory_limit_bytes)} limit)")
    )
    table = Table(title="Memory per device (the fullest stage)", title_justify="left")
    table.add_column("component")
    table.add_column("bytes", justify="right")
    for name, value in (data["memory_breakdown_bytes"] or {}).items():
        table.add_row(name, format_bytes(value))
    stdout.print(table)
    if estimate.best_time_s:
        rank = (
            f"rank {estimate.rank} by step time among the frontier's {estimate.fitting_points} plans that fit and "
            "this one" if estimate.rank else "does not fit"
        )
        stdout.print(
            f"against the frontier: {rank}; the fastest plan that fits takes {format_seconds(estimate.best_time_s)} "
            f"({estimate.slowdown_vs_best:.2f}x faster than this)" if estimate.slowdown_vs_best else rank
        )
    for note in estimate.notes:
        stdout.print(f"note: {note}")


# --------------------------------------------------------------------------------------------
# the launchable frontier (``planner plan``'s main answer)


def launch_json(frontier: Any, *, model: str, run: Any = None, warnings: Sequence[str] = ()) -> dict[str, Any]:
    """The launchable frontier (:class:`planner.launchable.LaunchFrontier`) as JSON, keyed like the table,
    with the import's ``warnings`` about the model (``"warnings"``, a list of lines; empty when none).

    With ``run`` (a :class:`planner.run_cost.RunPricing`), each row and the baseline get ``"run"``:
    ``steps``, ``seconds``, ``days``, ``gpu_hours``, ``cost_usd`` and ``devices``, and the frontier a ``"run"``
    saying what was priced (tokens, samples, tokens per sample, devices, price per GPU-hour)."""
    def row_json(row: Any, rank: int) -> dict[str, Any]:
        data = pipeline_point_json(row.point, rank, row.targets)
        degrees = row.degrees
        data.update({
            "tp": degrees.tp, "cp": degrees.cp,  # the row's degrees: a sequence split is cp, never tp
            "degrees": {"dp": degrees.dp, "tp": degrees.tp, "pp": degrees.pp, "cp": degrees.cp, "ep": degrees.ep},
            "layout": row.layout, "execution": row.priced_as, "precision": row.cache.settings.precision_label,
            "differs": row.differs,
            "speedup_vs_dp": frontier.speedup_vs_dp(row), "summary": row.summary,
            "host_bound": row.host_bound,  # its step is the host floor's (planner.host_bound)
        })  # fmt: skip
        if row.offload != "none":  # objectives.offload; absent: nothing offloaded
            data["offload"] = row.offload
        if row.cache.settings.dp_shard is not None:  # HSDP's shard group; absent: ZeRO over every dp rank
            data["hsdp_shard"] = row.cache.settings.dp_shard
        if row.cache.settings.hpz_partition is not None:  # ZeRO++'s hpZ group (DeepSpeed); absent: none
            data["hpz_partition"] = row.cache.settings.hpz_partition
        if row.cache.settings.reshard_after_forward != "default" and row.point.zero_stage == 3:  # absent: default
            data["reshard_after_forward"] = row.cache.settings.reshard_after_forward
        if run is not None:
            data["run"] = run.rows[rank - 1].to_json()
        if row.point.graph is not None:  # the public form: evaluate(graph, request, splits, inter_splits, replicas)
            form = public_form([op.name for op in row.point.graph.ops], row.point.spaces, row.point.choice)
            data.update(splits=form.splits, inter_node_splits=form.inter_splits, replicas=form.replicas)
        return data

    cluster = frontier.cluster
    headroom = frontier.headroom
    return {
        "model": model,
        "devices": cluster.devices,
        "device": cluster.device.name,
        "global_batch": frontier.global_batch,
        "memory_limit_bytes": frontier.memory_limit_bytes,
        "feasible": frontier.chosen is not None,
        "chosen_rank": None if frontier.chosen is None else frontier.chosen + 1,
        # the exact fastest row within the limit; the pick is it or a row within 0.01% of it (planner.pick)
        "fastest_rank": None if frontier.chosen is None else (frontier.chosen if frontier.fastest is None else frontier.fastest) + 1,
        "message": frontier.message,
        "warnings": list(warnings),
        "launchers": list(frontier.launchers),
        "refused": {name: reason for name, reason in frontier.refused},
        "rows": [row_json(row, i + 1) for i, row in enumerate(frontier.rows)],
        "baseline_data_parallel": None if frontier.baseline is None else {
            "step_time_s": frontier.baseline.time_s, "memory_per_device_bytes": frontier.baseline.memory_bytes,
            "summary": frontier.baseline.summary, "execution": frontier.baseline.priced_as,
            **({} if run is None or run.baseline is None else {"run": run.baseline.to_json()}),
        },
        **({} if run is None else {"run": run.to_json()}),
        "headroom": None if headroom is None else {
            "step_time_s": headroom.time_s, "memory_per_device_bytes": headroom.memory_bytes,
            "summary": headroom.summary, "execution": headroom.execution, "cuda_graphs": headroom.cuda_graphs,
            **({"cuda_graph_scope": "layers"} if headroom.cuda_graphs and headroom.graph_scope == "layers" else {}),
        },
        "search": {
            "search_time_s": frontier.search_time_s, "combinations": frontier.combinations,
            "intra_op_searches": frontier.intra_op_searches, "collapse": frontier.collapse,
            "collapsed": frontier.collapsed, "notes": list(frontier.notes),
        },
        "extras": dict(frontier.extras),
    }  # fmt: skip


def _pase(row: Any) -> bool:
    """Priced by PaSE's tables (``--cost pase``), whose unit is FLOP-equivalents, not seconds."""
    return row.cache.cost_model == "pase"


def _time_text(row: Any) -> str:
    """A row's step time, or PaSE's FLOP-equivalents under ``--cost pase``."""
    return f"{row.time_s:.4g} FLOP-eq" if _pase(row) else format_seconds(row.time_s)


def _zero_text(row: Any) -> str:
    """The table's ZeRO cell: the stage, and the HSDP shard group where the states span only some of
    the data-parallel ranks (``"3 (hsdp 8)"``: sharded over 8, replicated over the rest), and ZeRO++'s hpZ group
    (``"3 (hpz 8)"``: sharded over every rank, a secondary parameter copy over 8)."""
    shard, reshard = row.cache.settings.dp_shard, row.cache.settings.reshard_after_forward
    text = str(row.point.zero_stage) if shard is None else f"{row.point.zero_stage} (hsdp {shard})"
    hpz = row.cache.settings.hpz_partition  # ZeRO++'s secondary group (DeepSpeed): "3 (hpz 8)"
    text = text if hpz is None else f"{text} (hpz {hpz})"
    # FSDP2's reshard_after_forward policy where pinned (--fix reshard=...): "3 (never)" keeps every unit whole
    return text if reshard == "default" or row.point.zero_stage != 3 else f"{text} ({reshard})"


def _layout_text(row: Any) -> str:
    return f"pp={row.point.pp} x {row.layout}" if row.point.pp > 1 else row.layout


def launch_table(frontier: Any, *, model: str, top: int | None, run: Any = None, exporting: bool = False) -> None:
    """Print the launchable frontier: one row per plan a launcher runs, priced as it runs it (each
    row's launchers name their execution model when the rows differ in it; else the line under
    the table names it). With ``run`` (a :class:`planner.run_cost.RunPricing`), each row's days,
    GPU-hours and cost of the run too, and a line under the table saying what was priced. ``exporting``:
    the command exports a row (``--pick``/``--export``), so the last line does not say how to."""
    cluster = frontier.cluster
    table = Table(
        title=(
            f"{model}: {cluster.devices} x {cluster.device.name} ({cluster.nodes} x {cluster.devices_per_node}), "
            f"global batch {frontier.global_batch}, memory limit {format_bytes(frontier.memory_limit_bytes)}"
        ),
        title_justify="left",
    )
    mixed = len({row.priced_as for row in frontier.rows}) > 1
    columns = ["#", "step time", "samples/s", "memory/device", "layout", "mb", "ZeRO", "recompute", "launchers",
               "vs row above"]  # fmt: skip
    if run is not None:  # days say what samples/s says, in the run's terms; the table keeps its width
        columns[2:3] = _run_columns(run)
    for name in columns:
        wraps = name in ("launchers", "vs row above")
        table.add_column(name, justify="left" if name in ("layout", "recompute") or wraps else "right",
                         no_wrap=not wraps, overflow="fold", min_width=12 if wraps else None)  # fmt: skip
    shown = frontier.rows if top is None else frontier.rows[:top]
    for index, row in enumerate(shown):
        point = row.point
        style = "bold green" if index == frontier.chosen else ("dim" if not row.fits else "")
        launchers = ", ".join(row.targets) + (f" ({row.priced_as})" if mixed else "")
        cells = [
            f"{index + 1}{' *' if index == frontier.chosen else ''}", _time_text(row) + (" h" if row.host_bound else ""),
            "-" if _pase(row) else f"{point.samples_per_s:,.1f}", format_bytes(row.memory_bytes) + ("" if row.fits else " >limit"),
            _layout_text(row), f"{point.micro_batch} x {point.micro_batches}", _zero_text(row),
            point.recompute if row.offload == "none" else f"{point.recompute}, offload {row.offload}",
            launchers, row.differs,
        ]  # fmt: skip
        if run is not None:
            cells[2:3] = _run_cells(run.rows[index])
        table.add_row(*cells, style=style)
    width = RUN_TABLE_WIDTH if run is not None else 0
    _wrap_layouts_to_fit(table, columns.index("layout"), [_layout_text(row) for row in shown], width)
    _print_wide(table, width)
    _launch_footer(frontier, top=top, priced_as=None if mixed or not frontier.rows else frontier.rows[0].priced_as,
                   run=run, exporting=exporting, host_bound=any(row.host_bound for row in shown))  # fmt: skip


def _wrap_layouts_to_fit(table: Table, column: int, layouts: Sequence[str], width: int) -> None:
    """Let the layout column wrap, at its spaces only, where the table would not fit in the columns
    it is printed in (:func:`_print_width`): a Mesh-TF layout (``b:2;m:2 batch:b;heads:m;d_ff:m;vocab:m``)
    is wider than the other cells, and kept on one line it pushes the last columns past the edge.
    The column narrows by what overflows, but not below its longest space-free part, so the mesh and
    the rules go on lines of their own and no rule is cut (a table still too wide is widened in a
    pipe or file, :func:`_print_wide`)."""
    fits_in = _print_width(width)
    overflow = _rendered_width(table, fits_in) - fits_in
    if overflow <= 0 or not layouts:
        return
    header = len(str(table.columns[column].header))
    longest_part = max([header] + [len(part) for layout in layouts for part in layout.split()])
    longest_cell = max([header] + [len(layout) for layout in layouts])
    table.columns[column].width = max(longest_part, longest_cell - overflow)
    table.columns[column].no_wrap = False


def _print_width(width: int) -> int:
    """The columns a table printed by :func:`_print_wide` gets: a terminal's own, else at least ``width``."""
    return stdout.width if stdout.is_terminal else max(width, stdout.width)


def _rendered_width(renderable: Any, width: int) -> int:
    """The widest line of ``renderable`` laid out in ``width`` columns, before the console crops it: a
    table whose cells cannot wrap comes out wider than ``width``."""
    lines = Segment.split_lines(stdout.render(renderable, stdout.options.update_width(width)))
    return max((Segment.get_line_length(line) for line in lines), default=0)


def _needed_width(renderable: Any, width: int) -> int:
    """``width`` where ``renderable`` lays out in it with no line past the edge, else its width with
    every cell on one line: rich narrows a table's wrapping columns to the page but not the others (nor
    a column of fixed width wider than the page), and below that it crushes every column."""
    if _rendered_width(renderable, width) <= width:
        return width
    return max(width, _rendered_width(renderable, 1 << 14))


def _print_wide(renderable: Any, width: int) -> None:
    """Print on stdout at least ``width`` columns wide unless stdout is a terminal (which keeps its
    width). A pipe or a file gets as many columns as the table needs, so no column or border is cropped."""
    before = stdout.width
    if not stdout.is_terminal:
        width = _needed_width(renderable, _print_width(width))
    if stdout.is_terminal or width <= before:
        stdout.print(renderable)
        return
    stdout.width = width
    try:
        stdout.print(renderable)
    finally:
        stdout.width = before


def _print_natural(table: Table) -> None:
    """Print ``table`` with every cell on one line where stdout is a pipe or a file (:func:`_print_wide`
    at the table's own width: op names and splits are not cut)."""
    _print_wide(table, _rendered_width(table, 1 << 14))


def _run_columns(run: Any) -> list[str]:
    """The run's columns: days, GPU-hours and, with a price, the cost."""
    return ["days", "GPU-hours"] + (["cost"] if run.request.price_per_gpu_hour is not None else [])


def _run_cells(cost: Any) -> list[str]:
    """One row's run (a :class:`planner.run_cost.RunCost`): days, GPU-hours, dollars."""
    cells = [_figure(cost.days), _figure(cost.gpu_hours)]
    return cells if cost.cost is None else [*cells, "$" + _figure(cost.cost)]


def _figure(value: float) -> str:
    """A run's figure as a reader scans it: whole numbers from 100 on, else three significant digits.

    >>> _figure(1234.5), _figure(12.345), _figure(1.0), _figure(0.04213)
    ('1,234', '12.3', '1.00', '0.0421')
    """
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:#.3g}"


def _run_line(frontier: Any, run: Any) -> str:
    """The line under the table that says what the run columns price, and how."""
    request = run.request
    price = "" if request.price_per_gpu_hour is None else f"; cost = GPU-hours x ${request.price_per_gpu_hour:,.2f}"
    per_step = "global batch" if run.tokens_per_sample is None else f"(global batch x {run.tokens_per_sample:,} tokens)"
    size = "tokens" if run.tokens_per_sample is not None else "samples"
    billed = {cost.devices for cost in run.rows}
    devices = f"{run.devices:,} devices" if billed <= {run.devices} else "the devices each row launches on"
    line = (f"run: {request.describe(run.tokens_per_sample)}; steps = {size} / {per_step}, rounded up; days = steps "
            f"x step time; GPU-hours = days x 24 x {devices}{price}")  # fmt: skip
    if frontier.baseline is not None and run.baseline is not None:
        cost = run.baseline
        line += f"; the baseline: {_figure(cost.days)} days" + ("" if cost.cost is None else f", ${_figure(cost.cost)}")
    return line


def _priced_as_words(priced_as: str) -> str:
    if priced_as == "roofline":
        return "the plain roofline, no kernel or host overheads (roofline)"
    return " + ".join(_PRICED_AS.get(part, part) for part in priced_as.split("+")) + f" ({priced_as})"


_PRICED_AS = {"fused": "fused kernels", "eager": "eager kernels (one per op)", "flash": "FlashAttention-2",
              "cudnn": "cuDNN fused attention", "flex": "FlexAttention",
              "explicit": "explicit attention scores", "no-overlap": "collectives not overlapped (--no-overlap)",
              "tp-overlap": "tensor-parallel communication under the GEMMs (--fix tp_overlap=on)",
              "cuda-graphs": "each micro-batch replayed as one CUDA graph (torchtitan at pp=1)",
              "layer-graphs": "each transformer layer replayed as a CUDA graph (Megatron-LM's transformer_engine graphs)",
              "fp8": "FP8 linear layers (--dtype fp8)"}


def _graphs_label(room: Any) -> str:
    """The headroom's CUDA-graph label, as :func:`planner.repriced.priced_label` writes a row's."""
    return "" if not room.cuda_graphs else "+layer-graphs" if room.graph_scope == "layers" else "+cuda-graphs"


def _launch_footer(frontier: Any, *, top: int | None, priced_as: str | None, run: Any = None,
                   exporting: bool = False, host_bound: bool = False) -> None:
    if top is not None and len(frontier.rows) > top:
        stdout.print(f"({len(frontier.rows) - top} more rows; --top to show more, --json for all)")
    if host_bound:  # a shown row carries the marker
        from planner.host_bound import host_note

        stdout.print(host_note(frontier.cluster.device))
    if run is not None:
        stdout.print(_run_line(frontier, run))
    if priced_as is not None:
        fused = " as a fused launcher runs it" if priced_as.startswith("fused") else ""  # eager, roofline: as they say
        who = f"the generic plan{fused}" if frontier.launchers == ("generic",) else "the launchers run them"
        stdout.print(f"priced as {who}: {_priced_as_words(priced_as)}")
    stdout.print("mb: samples per data-parallel rank x micro-batches per step; sp: sequence parallel; "
                 "each row's memory breakdown and speed-up over data parallelism: --json")  # fmt: skip
    baseline = frontier.baseline
    if baseline is not None:
        stdout.print(f"baseline data parallel ({baseline.summary}, {baseline.priced_as}): "
                     f"{_time_text(baseline)}, {format_bytes(baseline.memory_bytes)}/device")  # fmt: skip
    best, room = frontier.best, frontier.headroom
    if best is not None and room is not None and room.time_s < best.time_s * 0.995:
        stdout.print(
            f"headroom: a per-op plan no launcher runs is {best.time_s / room.time_s:.2f}x faster "
            f"({format_seconds(room.time_s)}, {room.summary}, {room.execution}{_graphs_label(room)}); "
            "per-op plans: --target generic"
            + ("" if room.execution == "fused+flash" else f" --engine {room.execution.replace('+', ' --attention ')}")
            # priced as the graph-replayed row it beats (the generic plan replays whole micro-batches, not layers)
            + (" --fix cuda_graphs=on" if room.cuda_graphs and room.graph_scope == "step" else "")
        )
    for name, reason in frontier.refused:
        stdout.print(f"not listed: {name}: {printable(reason)}")
    stdout.print(
        f"search: {format_seconds(frontier.search_time_s)}, launchers {', '.join(frontier.launchers) or 'none'}, "
        f"{frontier.combinations} (pp, micro-batch, recompute, ZeRO) combinations, {frontier.intra_op_searches} "
        f"intra-op searches" + (f"; {frontier.collapsed} rows within {frontier.collapse:.0%} of a listed row in time and "
                                "memory merged into it (--collapse 0 lists all)" if frontier.collapsed else "")
    )  # fmt: skip
    per_op = frontier.launchers == ("generic",)  # --target generic: every plan, launched or not
    why = "fastest within the limit" if per_op else "fastest within the limit that a launcher runs"
    if getattr(frontier, "fastest", None) is not None:  # a tie chose it (planner.pick; the note above says why)
        why = f"tied with #{frontier.fastest + 1}, the {why}"
    _outcome(frontier.notes, frontier.chosen, frontier.message, why, hint=not exporting)


def _outcome(notes: Sequence[str], chosen: int | None, message: str, why: str, *, hint: bool = True) -> None:
    """The last lines under a frontier table: its notes, then the pick (``hint``: with how to export a
    row) or why nothing fits."""
    for note in notes:
        stdout.print(f"note: {printable(note)}")
    if chosen is None:
        stdout.print(Text.assemble(("nothing fits:", "red"), printable(f" {message}")))
    else:
        stdout.print(f"picked #{chosen + 1} ({why})" + ("; --pick N --export FORMAT -o FILE writes a plan" if hint else ""))


def repriced_json(repriced: Any) -> dict[str, Any]:
    """A saved launchable plan priced again, keyed like ``pipeline_point_json`` plus the saved figures."""
    point = repriced.point
    data = pipeline_point_json(point, 1)
    data.update(_named_degrees(point))
    data.update({
        "saved_step_time_s": repriced.saved_time_s, "saved_memory_per_device_bytes": repriced.saved_memory_bytes,
        "execution": repriced.priced_as,
        **({"hybrid": repriced.hybrid} if getattr(repriced, "hybrid", "") else {}),  # "hpz 8", "hsdp 8"; absent: none
        "time_breakdown_s": {"pipeline": point.time.pipeline_s, "bubble": point.time.bubble_s,
                             "p2p_per_micro_batch": point.time.p2p_s, "grad_sync_tail": point.time.grad_sync_s},
        "fixed_costs_s": dict(getattr(point.time, "fixed_s", None) or {}),
        "stages": [{"index": s.index, "layers": list(s.layers), "ops": len(s.ops), "forward_s": s.forward_s,
                    "backward_s": s.backward_s, "grad_sync_s": s.grad_sync_s, "in_flight": s.in_flight,
                    "memory_bytes": s.memory_bytes} for s in point.stages],
    })  # fmt: skip
    from planner.host_bound import pass_bound

    data["host_bound"] = bool(getattr(repriced, "host_bound", False))
    for stage, (floor_f, floor_b) in zip(data["stages"], getattr(repriced, "host_floors", ())):
        stage.update(host_floor_forward_s=floor_f, host_floor_backward_s=floor_b,
                     host_bound=pass_bound(stage["forward_s"], floor_f) and pass_bound(stage["backward_s"], floor_b))
    by_index = {stage.index: stage for stage in getattr(repriced, "stage_ops", ())}
    if by_index and point.graph is not None:
        form = public_form([op.name for op in point.graph.ops], point.spaces, point.choice)
        for stage in data["stages"]:
            stage.update(_stage_ops_json(by_index[stage["index"]], form, point.micro_batches))
        data["fixed_costs_s"].update(step_fixed_s(data["stages"], point.micro_batches))
    return data


def _stage_ops_json(stage: Any, form: Any, micro_batches: int) -> dict[str, Any]:
    """A stage's per-op rows (``objectives.stage_ops.StageOps``) and the terms no op owns: per micro-batch,
    the ops' ``forward_s`` plus half the redistribution, the tied copies' and the host wait give the
    stage's ``forward_s`` (``backward_s`` alike); the ops' ``step_s`` plus the tied copies' its ``grad_sync_s``."""
    rows = [{
        "op": r.name, "kind": r.kind, "splits": form.splits.get(r.name, {}),
        "inter_node_splits": form.inter_splits.get(r.name, {}), "replicas": form.replicas.get(r.name, 1),
        "forward_s": r.forward_s, "backward_s": r.backward_s, "step_s": r.step_s, "grad_sync_s": r.grad_sync_s,
        "optimizer_step_s": r.update_s, "per_step_s": r.per_step_s(micro_batches), "comm_s": dict(r.comm_s),
        "zero_comm_s": r.zero_s, "params_bytes": r.params_bytes, "grads_bytes": r.grads_bytes,
        "optimizer_bytes": r.optimizer_bytes, "states_bytes": r.states_bytes, "activations_bytes": r.activations_bytes,
        **(fixed_json(r.fixed) if getattr(r, "fixed", None) is not None else {}),
    } for r in stage.ops]  # fmt: skip
    return {
        "op_rows": rows,
        "fixed_per_micro_batch_s": stage_fixed_s(rows),
        "other_terms_s": {
            "redistribution": stage.redistribution_s, "tied_copies_forward": stage.tied_forward_s,
            "tied_copies_backward": stage.tied_backward_s, "tied_copies_step": stage.tied_step_s,
            "host_wait_forward": stage.host_wait_forward_s, "host_wait_backward": stage.host_wait_backward_s,
            "first_forward": stage.first_forward_s},  # hpZ's first forward beyond its host wait
        # with the ops' states_bytes they give the stage's parameters, gradients and optimizer state
        "other_states_bytes": {"tied_copies": stage.tied_states_bytes, "zero3_held_whole": stage.gathered_bytes,
                               "grad_accumulator": stage.accumulator_bytes},
        "states_bytes": stage.states_bytes,
    }  # fmt: skip


def _named_degrees(point: Any) -> dict[str, Any]:
    """A saved plan's ``dp``, ``tp``, ``cp`` and summary, each named for what it splits
    (:func:`planner.families.named_point`): a context-parallel plan is ``cp=8``, never ``tp=8``."""
    from planner.families import named_point

    named = named_point(point)
    return {"cp": 1} if named is None else {"dp": named[0], "tp": named[1], "cp": named[2], "summary": named[3]}


def _split_text(row: dict[str, Any]) -> str:
    """An op's configuration as the per-op tables write it: ``d=4 (2 across nodes), x 2 copies``."""
    inter = row["inter_node_splits"]
    parts = [f"{d}={f}" + (f" ({inter[d]} across nodes)" if d in inter else "") for d, f in row["splits"].items()]
    if row.get("replicas", 1) > 1:
        parts.append(f"x {row['replicas']} copies")
    return ", ".join(parts) or "replicated"


def _shows(seconds: float) -> bool:
    """Whether ``seconds`` prints as more than nothing (:func:`format_seconds` rounds to 0.1 us)."""
    return format_seconds(seconds) != format_seconds(0.0)


def _shown_ops(rows: list[dict[str, Any]], *, top: int, all_ops: bool) -> list[dict[str, Any]]:
    """Every row (``all_ops``), else the ``top`` by seconds per step and the ``top`` by memory (states and
    one micro-batch's activations), in that order."""
    if all_ops:
        return rows
    by_time = sorted(rows, key=lambda r: -r["per_step_s"])[:top]
    by_memory = sorted(rows, key=lambda r: -(r["states_bytes"] + r["activations_bytes"]))[:top]
    return list({r["op"]: r for r in [*by_time, *by_memory]}.values())


def _stage_ops_table(stage: dict[str, Any], micro_batches: int, *, top: int, all_ops: bool) -> Table:
    """One stage's per-op table: the ops shown, the rest summed, the terms no op owns and the stage's
    own figures, so each time column adds up to the stage's (``objectives.stage_ops``)."""
    rows = stage["op_rows"]
    shown = _shown_ops(rows, top=top, all_ops=all_ops)
    which = "" if all_ops or len(shown) == len(rows) else f"; top {top} by time and by memory, --all for every op"
    table = Table(title=f"Stage {stage['index']} by op (per device; forward, backward and comm per micro-batch; "
                        f"per step = {micro_batches} x (forward + backward) + once per step{which})",
                  title_justify="left")  # fmt: skip
    for column in ("op", "kind", "split", "forward", "backward", "per step", "comm", "states", "activations/mb"):
        table.add_column(column, justify="left" if column in ("op", "kind", "split", "comm") else "right", no_wrap=True,
                         overflow="fold")
    for r in shown:
        comm = [f"{kind.replace('_', ' ')} {format_seconds(v)}" for kind, v in r["comm_s"].items()]
        comm = [text for text in comm if not text.endswith(f" {format_seconds(0.0)}")]
        comm += [f"ZeRO {format_seconds(r['zero_comm_s'])}"] if _shows(r["zero_comm_s"]) else []
        comm += [f"grad sync/step {format_seconds(r['grad_sync_s'])}"] if _shows(r["grad_sync_s"]) else []
        table.add_row(r["op"], r["kind"], _split_text(r), format_seconds(r["forward_s"]), format_seconds(r["backward_s"]),
                      format_seconds(r["per_step_s"]), ", ".join(comm) or "-", format_bytes(r["states_bytes"]),
                      format_bytes(r["activations_bytes"]))  # fmt: skip
    names = {r["op"] for r in shown}
    rest = [r for r in rows if r["op"] not in names]
    if rest:
        total = {k: sum(r[k] for r in rest) for k in ("forward_s", "backward_s", "per_step_s", "states_bytes", "activations_bytes")}
        table.add_row(f"the other {len(rest)} ops", "", "", format_seconds(total["forward_s"]),
                      format_seconds(total["backward_s"]), format_seconds(total["per_step_s"]), "",
                      format_bytes(total["states_bytes"]), format_bytes(total["activations_bytes"]))  # fmt: skip
    table.add_section()
    for name, forward, backward, per_step, states in _other_terms(stage, micro_batches):
        if per_step > 0.0 or states > 0.0:
            table.add_row(name, "", "", *(format_seconds(v) if v else "" for v in (forward, backward, per_step)), "",
                          format_bytes(states) if states else "")  # fmt: skip
    stage_step = micro_batches * (stage["forward_s"] + stage["backward_s"]) + stage["grad_sync_s"]
    table.add_row(f"stage {stage['index']}", "", "", format_seconds(stage["forward_s"]), format_seconds(stage["backward_s"]),
                  format_seconds(stage_step), "", format_bytes(stage["states_bytes"]), "", style="bold")  # fmt: skip
    return table


def _other_terms(stage: dict[str, Any], micro_batches: int) -> list[tuple[str, float, float, float, float]]:
    """A stage's terms no op owns, as the per-op table's rows: ``(name, forward, backward, per step, states)``."""
    terms, states, half = stage["other_terms_s"], stage["other_states_bytes"], stage["other_terms_s"]["redistribution"] / 2
    tied_f, tied_b = terms["tied_copies_forward"], terms["tied_copies_backward"]
    wait_f, wait_b = terms["host_wait_forward"], terms["host_wait_backward"]
    return [("redistribution between its ops", half, half, micro_batches * 2.0 * half, 0.0),
            ("tied copies (owned by another stage)", tied_f, tied_b,
             micro_batches * (tied_f + tied_b) + terms["tied_copies_step"], states["tied_copies"]),
            ("host wait (fixed-cost floor)", wait_f, wait_b, micro_batches * (wait_f + wait_b), 0.0),
            ("first forward over every rank (hpZ)", 0.0, 0.0, terms["first_forward"], 0.0),
            ("ZeRO-3 units held whole", 0.0, 0.0, 0.0, states["zero3_held_whole"]),
            ("bf16 gradient accumulator", 0.0, 0.0, 0.0, states["grad_accumulator"])]  # fmt: skip


def _explain_repriced(repriced: Any, *, json_out: bool, top: int = 10, all_ops: bool = False) -> None:
    data = repriced_json(repriced)
    if json_out:
        print_json(data)
        return
    point = repriced.point
    stdout.print(Text(printable(
        f"{data['summary']}{' (' + data['hybrid'] + ')' if data.get('hybrid') else ''}, priced as "
        f"{repriced.priced_as}: {format_seconds(point.time_s)}/step, "
        f"{format_bytes(point.memory_bytes)}/device (saved: {format_seconds(repriced.saved_time_s)}, "
        f"{format_bytes(repriced.saved_memory_bytes)})"
    ), style="bold"))  # fmt: skip
    totals = Table(title="Where the time goes (one step)", title_justify="left")
    totals.add_column("component")
    totals.add_column("time", justify="right")
    for name, value in data["time_breakdown_s"].items():
        totals.add_row(name.replace("_", " "), format_seconds(value))
    for name, value in data["fixed_costs_s"].items():
        totals.add_row(f"  fixed cost: {name.replace('_', ' ')}", format_seconds(value))
    stdout.print(totals)
    stages = Table(title="Per stage (per micro-batch; memory per device)", title_justify="left")
    fixed = any(s.get("fixed_per_micro_batch_s") for s in data["stages"])
    for column in ("stage", "layers", "ops", "forward", "backward", "grad sync/step", "in flight", "memory",
                   *(("kernel launches", "collective latency") if fixed else ())):
        stages.add_column(column, justify="left" if column == "layers" else "right")
    for s in data["stages"]:
        sums = s.get("fixed_per_micro_batch_s") or {}
        stages.add_row(str(s["index"]), f"{s['layers'][0]}-{s['layers'][1]}", str(s["ops"]),
                       format_seconds(s["forward_s"]), format_seconds(s["backward_s"]), format_seconds(s["grad_sync_s"]),
                       f"{s['in_flight']:g}", format_bytes(s["memory_bytes"]),
                       *((format_seconds(sums.get("kernel_launches", 0.0)),
                          format_seconds(sums.get("collective_latency", 0.0))) if fixed else ()))  # fmt: skip
    stdout.print(stages)
    for line in _host_lines(data):
        stdout.print(line)
    memory = Table(title="Memory per device (the fullest stage)", title_justify="left")
    memory.add_column("component")
    memory.add_column("bytes", justify="right")
    for name, value in (data["memory_breakdown_bytes"] or {}).items():
        memory.add_row(name, format_bytes(value))
    stdout.print(memory)
    for stage in data["stages"]:
        if "op_rows" in stage:
            _print_natural(_stage_ops_table(stage, point.micro_batches, top=top, all_ops=all_ops))
            fixed = fixed_table(stage, top=top, all_ops=all_ops)
            if fixed is not None:
                _print_natural(fixed)


def _host_lines(data: dict[str, Any]) -> list[str]:
    """Per stage under a host floor (:mod:`planner.host_bound`): whether it is host-bound and by how much, its
    host floor against its kernels' work per micro-batch (work: the pass less the host wait, ``objectives.stage_ops``)."""
    lines = []
    for s in data["stages"]:
        if "host_floor_forward_s" not in s:
            continue
        waits = s.get("other_terms_s", {})
        work = (s["forward_s"] - waits.get("host_wait_forward", 0.0), s["backward_s"] - waits.get("host_wait_backward", 0.0))
        floors = (s["host_floor_forward_s"], s["host_floor_backward_s"])
        passes = ", ".join(f"{name} host {format_seconds(h)} vs kernels {format_seconds(w)} "
                           f"({'host' if h >= w else 'kernels'} by {format_seconds(abs(h - w))})"
                           for name, h, w in zip(("forward", "backward"), floors, work))  # fmt: skip
        state = "host-bound" if s["host_bound"] else "not host-bound"
        lines.append(f"stage {s['index']} {state} (per micro-batch): {passes}")
    if data.get("host_bound"):
        lines.append("the step is host-bound: its slowest stage waits on the host in both passes, so more devices or "
                     "a finer split do not speed it up")  # fmt: skip
    return lines


def compare_repriced_json(first: Any, second: Any) -> dict[str, Any]:
    """Two saved launchable plans priced again, and B - A by step-time part and memory component."""
    a, b = repriced_json(first), repriced_json(second)
    keys = ("pp", "dp", "cp", "tp", "micro_batch", "micro_batches", "zero_stage", "recompute", "schedule", "chunks", "execution")
    return {
        "plan_a": a["summary"], "plan_b": b["summary"],
        "time_s": {"a": a["step_time_s"], "b": b["step_time_s"], "delta": b["step_time_s"] - a["step_time_s"]},
        "memory_bytes": {"a": a["memory_per_device_bytes"], "b": b["memory_per_device_bytes"],
                         "delta": b["memory_per_device_bytes"] - a["memory_per_device_bytes"]},
        "time_breakdown_delta_s": {k: b["time_breakdown_s"][k] - v for k, v in a["time_breakdown_s"].items()},
        "memory_breakdown_delta_bytes": {k: (b["memory_breakdown_bytes"] or {}).get(k, 0.0) - v
                                         for k, v in (a["memory_breakdown_bytes"] or {}).items()},
        "settings_that_differ": {k: [a[k], b[k]] for k in keys if a[k] != b[k]},
        "ops_that_differ": _ops_that_differ(a, b),
        "host_bound": {"a": a["host_bound"], "b": b["host_bound"]},  # each step the host floor's (planner.host_bound)
    }  # fmt: skip


def _ops_that_differ(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """The ops of two explained launchable plans (:func:`repriced_json`) whose configuration differs (splits,
    inter-node parts or copies; an op only one plan's graph has too), by how much their seconds per
    step on their stage changed, largest first."""
    def ops(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {r["op"]: {**r, "stage": stage["index"]} for stage in data["stages"] for r in stage.get("op_rows", ())}

    first, second = ops(a), ops(b)
    out = []
    for name in dict.fromkeys([*first, *second]):
        x, y = first.get(name), second.get(name)
        layout = ("splits", "inter_node_splits", "replicas")
        if x is not None and y is not None and all(x[k] == y[k] for k in layout):
            continue
        out.append({
            "op": name, "stage_a": x and x["stage"], "stage_b": y and y["stage"],
            "split_a": x and _split_text(x), "split_b": y and _split_text(y),
            "per_step_s_a": x and x["per_step_s"], "per_step_s_b": y and y["per_step_s"],
            "per_step_delta_s": (y["per_step_s"] if y else 0.0) - (x["per_step_s"] if x else 0.0),
        })  # fmt: skip
    return sorted(out, key=lambda r: -abs(r["per_step_delta_s"]))


def _compare_repriced(first: Any, second: Any, *, json_out: bool, top: int = 15) -> None:
    data = compare_repriced_json(first, second)
    if json_out:
        print_json(data)
        return

    def signed(value: float, fmt: Any) -> str:
        return ("+" if value >= 0 else "-") + fmt(abs(value))

    bound = data["host_bound"]
    marks = {k: " h" if bound[k] else "" for k in ("a", "b")}  # as planner plan marks a host-bound row
    stdout.print(printable(
        f"A = {data['plan_a']}: {format_seconds(data['time_s']['a'])}{marks['a']}, {format_bytes(data['memory_bytes']['a'])}/device\n"
        f"B = {data['plan_b']}: {format_seconds(data['time_s']['b'])}{marks['b']}, {format_bytes(data['memory_bytes']['b'])}/device\n"
        f"B - A: {signed(data['time_s']['delta'], format_seconds)}/step, "
        f"{signed(data['memory_bytes']['delta'], format_bytes)}/device"
    ))  # fmt: skip
    table = Table(title="Difference by component (B - A)", title_justify="left")
    table.add_column("component")
    table.add_column("delta", justify="right")
    for name, value in data["time_breakdown_delta_s"].items():
        table.add_row(f"time: {name.replace('_', ' ')}", signed(value, format_seconds))
    for name, value in data["memory_breakdown_delta_bytes"].items():
        table.add_row(f"memory: {name}", signed(value, format_bytes))
    for name, (a, b) in data["settings_that_differ"].items():
        table.add_row(f"{name.replace('_', ' ')}", f"{a} -> {b}")
    stdout.print(table)
    differ = data["ops_that_differ"]
    ops = Table(title=f"Ops whose split differs ({len(differ)}; top {min(top, len(differ))} by the change of their seconds "
                      "per step on their stage)", title_justify="left")  # fmt: skip
    for column in ("op", "stage A", "split A", "stage B", "split B", "per step B - A"):
        ops.add_column(column, justify="right" if column.startswith(("stage", "per")) else "left", no_wrap=True,
                       overflow="fold")
    for r in differ[:top]:
        ops.add_row(r["op"], "-" if r["stage_a"] is None else str(r["stage_a"]), r["split_a"] or "(not in A)",
                    "-" if r["stage_b"] is None else str(r["stage_b"]), r["split_b"] or "(not in B)",
                    signed(r["per_step_delta_s"], format_seconds))  # fmt: skip
    _print_natural(ops)
    _compare_host_note(first, second, bound)


def _compare_host_note(first: Any, second: Any, bound: dict[str, bool]) -> None:
    """``planner plan``'s footnote on its `` h`` marker (:func:`planner.host_bound.host_note`), once, under a
    comparison where a plan's step is the host floor's; each device's constants where the two plans' differ."""
    from planner.host_bound import host_note

    shown: list[Any] = []
    for plan, key in ((first, "a"), (second, "b")):
        device = getattr(plan, "device", None)
        if bound[key] and device is not None and device not in shown:
            shown.append(device)
            stdout.print(printable(host_note(device)))
