"""Price measured training steps with ``planner estimate``'s model, and fit its constants to them.

The roof over :mod:`objectives.calibration` (pure: rows, parameters, the fit, scores): here each
row becomes a cluster (:func:`row_cluster`), training settings (:func:`row_settings`) and a call of
:func:`planner.estimate.estimate` (:func:`price_rows`), the same call ``planner estimate`` makes at
the row's tp/pp/dp/cp, micro-batch, global batch, recompute and schedule, under its FP8 recipe if
it has one; a one-GPU row is the one-device configuration at the row's batch. ``planner calibrate`` (:func:`calibrate_steps`) and
``bench/fidelity.py`` both price rows through here, so the benchmark scores what the planner prints.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from objectives.calibration import (
    ErrorSummary,
    FitResult,
    Parameter,
    StepRow,
    calibratable_parameters,
    cluster_file_dict,
    error_summary,
    fit_parameters,
    holdout_mask,
    parameter_values,
    read_step_rows,
    with_parameters,
)
from planner.core.cluster import Cluster, Link
from planner.core.errors import InputError, PlannerError
from planner.core.settings import TrainingSettings

__all__ = ["Priced", "row_cluster", "row_settings", "price_rows", "CalibrationReport", "calibrate_steps"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Priced:
    """One row as the planner prices it."""

    row: StepRow
    time_s: float = math.inf
    """Predicted seconds per step (``inf`` when the row could not be priced)."""
    memory_bytes: float = math.inf
    """Predicted peak of PyTorch's caching allocator per device (the workspace allowance included; what
    ``torch.cuda.max_memory_reserved`` measures): the plan's memory less NCCL's buffers."""
    allocated_bytes: float = math.inf
    """Predicted peak of live tensors: ``memory_bytes`` less the workspace allowance (what
    ``torch.cuda.max_memory_allocated`` measures)."""
    nccl_bytes: float = 0.0
    """NCCL's buffers on the rank (``MemoryBreakdown.nccl_bytes``): outside the allocator, so in neither figure
    above; the verdict "does not fit" counts them beside the live tensors (``allocated_bytes + nccl_bytes`` is the
    largest stage's live tensors and NCCL's buffers: :func:`_allocator_figures`)."""
    fits: bool = False
    reason: str = ""
    """Why there is no prediction (empty when there is one)."""
    estimate_s: float = 0.0
    """Wall time of the pricing (import included)."""

    @property
    def valid(self) -> bool:
        return math.isfinite(self.time_s)


def _link(spec: str | Mapping[str, Any] | None) -> Link | None:
    if spec is None or isinstance(spec, str):
        return None
    known = {f.name for f in dataclasses.fields(Link)}
    return Link(**{k: v for k, v in spec.items() if k in known})


def row_cluster(row: StepRow, constants: tuple[Sequence[Parameter], Sequence[float]] | None = None) -> Cluster:
    """The row's cluster: its device preset, GPU count and node size, links; then ``constants``
    (fitted parameters and values) applied on top."""
    from objectives.cluster import make_cluster

    cluster = make_cluster(
        row.device,
        devices=row.devices,
        devices_per_node=row.devices_per_node,
        intra_link=row.intra_link if isinstance(row.intra_link, str) else None,
        inter_link=row.inter_link if isinstance(row.inter_link, str) else None,
    )
    custom = {k: v for k, v in (("intra_link", _link(row.intra_link)), ("inter_link", _link(row.inter_link))) if v}
    if custom:
        cluster = dataclasses.replace(cluster, **custom)
    if constants is not None:
        params, values = constants
        cluster = with_parameters(cluster, params, values)
    return cluster


def row_settings(row: StepRow, *, plain: bool = False, fsdp_units: bool = False) -> TrainingSettings:
    """bf16 mixed precision and Adam (every row's runs) with the row's FP8 recipe on its linear layers
    (``row.fp8``: ``objectives.calibration.PRECISIONS``), the row's ZeRO stage and recompute, its
    engine and attention where :class:`TrainingSettings` models them (``plain``: never), and its
    launcher's ZeRO-3 gather granularity and saved-activation rules (``row.launcher``:
    ``Target.zero3_gather``, ``Target.sequence_shard_saved``, ``Target.fused_swiglu``, ``Target.grad_accumulator``, ``Target.zero_sync``, ``Target.pipeline_buffers``,
    with ``tp_comm_overlap`` its ``Target.tp_overlap_method``; an unknown
    launcher is an input error naming the known ones), its HSDP shard group (``row.hsdp``:
    ``TrainingSettings.dp_shard``), bf16 modules without autocast (``row.autocast`` false:
    ``TrainingSettings.autocast``), its optimizer state's dtype (``row.optimizer_state_dtype``). ``fsdp_units``: ZeRO-3 priced per ``fully_shard`` unit
    (``TrainingSettings.fsdp_units``, ``bench/fidelity.py --fsdp-units``)."""
    known = {f.name for f in dataclasses.fields(TrainingSettings)}
    extra = {}
    if not plain:
        extra = {k: v for k, v in (("engine", row.engine), ("attention", row.attention), ("dropout", row.dropout),
                                                   ("fused_loss", row.fused_loss),
                                                   ("torch_loss", getattr(row, "torch_loss", False)),
                                                   ("tp_comm_overlap", getattr(row, "tp_comm_overlap", False)),
                                                   ("p2p_overlap", getattr(row, "overlap_p2p_comm", False)))
                 if k in known and v}
    launcher = getattr(row, "launcher", None)
    if launcher is not None:
        from exporters.targets import TARGETS

        if launcher not in TARGETS:
            raise InputError(f"row {row.id}: unknown layout.launcher '{launcher}'; use one of {', '.join(TARGETS)}")
        extra["zero3_gather"] = TARGETS[launcher].zero3_gather
        extra["sequence_shard_saved"] = TARGETS[launcher].sequence_shard_saved
        extra["fused_swiglu"] = TARGETS[launcher].fused_swiglu
        rule = TARGETS[launcher].grad_accumulator  # its bf16 optimizer's gradient accumulator, at the row's ZeRO and pp
        extra["grad_accumulator_bytes"] = rule(zero_stage=row.zero, pp=row.pp) if rule is not None else 0.0
        extra["pipeline_buffers"] = TARGETS[launcher].pipeline_buffers  # what its pipeline runtime holds at the cuts
        sync = TARGETS[launcher].zero_sync  # how it synchronises ZeRO-1/2 (DeepSpeed: the gather after the step)
        extra["zero_sync"] = sync(zero_stage=row.zero, precision="bf16-mixed") if sync is not None else None
        if extra.get("tp_comm_overlap"):  # its way of overlapping (torchtitan: async TP, micro-pipelined)
            extra["tp_overlap_method"] = TARGETS[launcher].tp_overlap_method
    if fsdp_units:
        extra["fsdp_units"] = True
    if not plain and not getattr(row, "autocast", True):  # bf16 modules under an FSDP MixedPrecision policy
        extra["autocast"] = False
    if getattr(row, "hsdp", None) is not None:  # hybrid sharding: the ZeRO states over this many dp ranks
        extra["dp_shard"] = row.hsdp
    if getattr(row, "optimizer_state_dtype", "fp32") != "fp32":  # the run's optimizer state in bf16
        extra["optimizer_state_dtype"] = row.optimizer_state_dtype
    return TrainingSettings(zero_stage=row.zero, recompute=row.recompute, expert_parallel=getattr(row, "ep", 1),
                            fp8=row.fp8, **extra)  # type: ignore[arg-type]


GraphFor = Callable[[StepRow], Any]
"""``row -> samples -> OpGraph`` (:func:`planner.pipeline.graph_loader`)."""


def default_graph_for() -> GraphFor:
    """Graph loaders of the rows' ONNX files (``model.path`` at ``model.dims``), one per file and dims."""
    from planner.pipeline import graph_loader

    loaders: dict[tuple, Any] = {}

    def graph_for(row: StepRow) -> Any:
        path = row.model.get("path")
        if not path:
            raise InputError(f"row {row.id} names no ONNX file (model.path); give one, or price GPT rows of "
                             "bench/fidelity/ with bench/fidelity.py --calibrate-to (it builds their models)")
        dims = dict(row.model.get("dims") or {})
        if row.model.get("kind") == "gpt":
            dims.setdefault("seq", int(row.model["seq"]))
        key = (str(path), tuple(sorted(dims.items())))
        if key not in loaders:
            if not Path(path).exists():
                raise InputError(f"row {row.id}: ONNX file '{path}' does not exist; check model.path or --models-dir")
            loaders[key] = graph_loader(path, dims)
        return loaders[key]

    return graph_for


def price_rows(
    rows: Sequence[StepRow],
    *,
    graph_for: GraphFor | None = None,
    constants: tuple[Sequence[Parameter], Sequence[float]] | None = None,
    plain: bool = False,
    fsdp_units: bool = False,
) -> list[Priced]:
    """Price every row with :func:`planner.estimate.estimate` (module docstring); ``fsdp_units``: as
    :func:`row_settings`.

    A row the planner refuses (an invalid configuration, an import error) gets no prediction and
    its reason; it never stops the others.
    """
    from planner.estimate import estimate

    graph_for = graph_for or default_graph_for()
    priced = []
    for row in rows:
        started = time.perf_counter()
        try:
            cluster = row_cluster(row, constants)
            result = estimate(
                graph_for(row), cluster=cluster, tp=row.tp, pp=row.pp, dp=row.dp, cp=row.cp, micro_batch=row.micro_batch,
                global_batch=row.global_batch, zero=row.zero, recompute=row.recompute,
                sequence_parallel=row.sequence_parallel, schedule=row.schedule, chunks=row.chunks,
                stage_layers=row.stage_layers, settings=row_settings(row, plain=plain, fsdp_units=fsdp_units),
            )
        except PlannerError as error:
            priced.append(Priced(row=row, reason=str(error), estimate_s=time.perf_counter() - started))
            continue
        if not result.valid:
            priced.append(Priced(row=row, reason=result.reason, estimate_s=time.perf_counter() - started))
            continue
        allocator, allocated, nccl = _allocator_figures(result)
        priced.append(Priced(row=row, time_s=float(result.time_s), memory_bytes=allocator,
                             allocated_bytes=allocated, nccl_bytes=nccl, fits=bool(result.fits),
                             estimate_s=time.perf_counter() - started))
    return priced


def _allocator_figures(result: Any) -> tuple[float, float, float]:
    """``(allocator peak, live tensors, NCCL's buffers)`` of an estimate, like with like with the measured peaks
    (the allocator's): the stage of the most allocator memory (NCCL's buffers, which differ by stage, left out)
    and, for the verdict, the NCCL bytes that with its live tensors make the largest stage's need."""
    stages = [s.memory for s in getattr(getattr(result, "point", None), "stages", ()) or () if s.memory is not None]
    if not stages:
        breakdown = result.memory
        nccl = float(breakdown.nccl_bytes) if breakdown is not None else 0.0
        other = float(breakdown.other_bytes) if breakdown is not None else 0.0
        return float(result.memory_bytes) - nccl, float(result.memory_bytes) - nccl - other, nccl
    fullest = max(stages, key=lambda m: m.allocator_bytes)
    needed = max(m.needed_bytes for m in stages)
    return fullest.allocator_bytes, fullest.allocated_bytes, needed - fullest.allocated_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationReport:
    """What ``planner calibrate`` prints: the fit and its before/after error on held-out rows."""

    fit: FitResult
    fit_rows: tuple[str, ...]
    holdout_rows: tuple[str, ...]
    holdout_before: ErrorSummary
    holdout_after: ErrorSummary
    skipped: tuple[str, ...] = ()
    """Rows left out (another device, or priced by no configuration), with why."""
    cluster_file: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "parameters": [
                {"name": p.name, "before": float(b), "after": float(a), "identifiable": bool(ok)}
                for p, b, a, ok in zip(self.fit.params, self.fit.before, self.fit.after, self.fit.identifiable)
            ],
            "fit_rows": list(self.fit_rows),
            "holdout_rows": list(self.holdout_rows),
            "fit_before": self.fit.fit_before.as_dict(),
            "fit_after": self.fit.fit_after.as_dict(),
            "holdout_before": self.holdout_before.as_dict(),
            "holdout_after": self.holdout_after.as_dict(),
            "evaluations": self.fit.evaluations,
            "skipped": list(self.skipped),
            "notes": list(self.notes) + list(self.fit.notes),
            "cluster_file": self.cluster_file,
        }


def calibrate_steps(
    rows: Sequence[StepRow],
    *,
    base: Cluster,
    holdout: np.ndarray,
    fields: Sequence[str] | None = None,
    rounds: int = 3,
    graph_for: GraphFor | None = None,
    plain: bool = False,
    fsdp_units: bool = False,
) -> CalibrationReport:
    """Fit ``base``'s [Empirical] constants on the rows not held out; score both sets.

    Parameters
    ----------
    rows:
        Measured steps (:func:`objectives.calibration.read_step_rows`); rows of another device than
        ``base``'s are skipped.
    base:
        The cluster whose constants are fitted and written (its device, node size and links).
    holdout:
        Per row, ``True`` for a held-out row (scored, never fitted).
    fields:
        Which constants (:func:`objectives.calibration.calibratable_parameters`); ``None``: all.
    plain, fsdp_units:
        As for :func:`row_settings`.

    Raises
    ------
    InputError
        No rows of the device, no held-out rows, or no fit rows.
    """
    from objectives.cluster import DEVICE_PRESETS

    graph_for = graph_for or default_graph_for()
    skipped = [f"{r.id}: device {r.device} is not the cluster's {base.device.name}" for r in rows
               if r.device != base.device.name]
    keep = [i for i, r in enumerate(rows) if r.device == base.device.name]
    if not keep:
        raise InputError(f"no row was measured on {base.device.name}; pass the rows' device with --device or --cluster")
    mask = np.asarray(holdout, dtype=bool)
    fit_rows = [rows[i] for i in keep if not mask[i]]
    held = [rows[i] for i in keep if mask[i]]
    if not held:
        raise InputError("no row is held out, so the fit could not be scored; pass --holdout-every N or --holdout KEY=VALUE")
    if not fit_rows:
        raise InputError("every row is held out; hold out fewer rows (--holdout-every, --holdout)")
    params = calibratable_parameters(base, fields)
    start = parameter_values(base, params)
    # Rows the planner cannot price at all are no use to the fit; find them once at the start.
    first = price_rows(fit_rows, graph_for=graph_for, constants=(params, start), plain=plain, fsdp_units=fsdp_units)
    usable = [p.row for p in first if p.valid]
    skipped += [f"{p.row.id}: {p.reason}" for p in first if not p.valid]
    if not usable:
        raise InputError(f"no fit row could be priced; the first: {first[0].reason}")
    measured = np.array([r.step_s for r in usable])

    def predict(cluster: Cluster) -> list[float]:
        values = parameter_values(cluster, params)
        return [p.time_s for p in price_rows(usable, graph_for=graph_for, constants=(params, values), plain=plain,
                                             fsdp_units=fsdp_units)]

    fit = fit_parameters(predict, with_parameters(base, params, start), params, measured, rounds=rounds)
    held_measured = [r.step_s for r in held]
    before = price_rows(held, graph_for=graph_for, constants=(params, fit.before), plain=plain, fsdp_units=fsdp_units)
    after = price_rows(held, graph_for=graph_for, constants=(params, fit.after), plain=plain, fsdp_units=fsdp_units)
    fitted = with_parameters(base, params, fit.after)
    preset = DEVICE_PRESETS.get(base.device.name)
    document = cluster_file_dict(
        fitted, preset=preset,
        note=f"planner calibrate: {len(usable)} fit rows, {len(held)} held out; median |error| on the held-out rows "
             f"{_pct(error_summary([p.time_s for p in before], held_measured).median_abs_pct)} -> "
             f"{_pct(error_summary([p.time_s for p in after], held_measured).median_abs_pct)}",
    )
    return CalibrationReport(
        fit=fit,
        fit_rows=tuple(r.id for r in usable),
        holdout_rows=tuple(r.id for r in held),
        holdout_before=error_summary([p.time_s for p in before], held_measured),
        holdout_after=error_summary([p.time_s for p in after], held_measured),
        skipped=tuple(skipped),
        cluster_file=document,
    )


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.1f}%"


def check_cluster_file(path: str | Path, params: Sequence[Parameter], values: Sequence[float]) -> list[str]:
    """Read the written file back with the planner's loader; name every fitted value it did not keep.

    A field the loader does not read yet is recorded in the file but does nothing until it does.
    """
    from objectives.cluster import load_cluster

    loaded = load_cluster(path)
    missing = []
    for p, v in zip(params, values):
        got = float(getattr(getattr(loaded, p.owner), p.field))
        if not math.isclose(got, float(v), rel_tol=1e-9, abs_tol=1e-15):
            missing.append(f"{p.name}: the cluster loader read {got:g}, not the fitted {float(v):g}; it does not "
                           "read this field from a cluster file yet, so the planner will not use the fitted value")
    return missing


def load_rows(path: str | Path, *, models_dir: str | Path | None, device: str) -> list[StepRow]:
    """The steps file's rows (``device`` names the device of rows that do not name their own)."""
    return read_step_rows(path, models_dir=models_dir, device=device)


__all__ += ["check_cluster_file", "default_graph_for", "load_rows", "holdout_mask"]


def format_report(report: CalibrationReport, *, output: str = "") -> str:
    """The plain-text report ``planner calibrate`` prints: parameters, fit and held-out errors."""

    def line(label: str, s: ErrorSummary) -> str:
        return (f"  {label:24} {s.rows:4d} rows  median |err| {_pct(s.median_abs_pct):>7}  MAPE {_pct(s.mape_pct):>7}  "
                f"bias {('n/a' if not math.isfinite(s.bias_pct) else f'{s.bias_pct:+.1f}%'):>7}"
                + (f"  ({s.missing} not priced)" if s.missing else ""))

    out = ["fitted constants:"]
    for p, b, a, ok in zip(report.fit.params, report.fit.before, report.fit.after, report.fit.identifiable):
        out.append(f"  {p.name:34} {b:.4g} -> {a:.4g}" + ("" if ok else "   (no row depends on it: kept)"))
    out.append("step time error:")
    out.append(line("fit rows, before", report.fit.fit_before))
    out.append(line("fit rows, after", report.fit.fit_after))
    out.append(line("held-out rows, before", report.holdout_before))
    out.append(line("held-out rows, after", report.holdout_after))
    out.append(f"{len(report.fit_rows)} fit rows, {len(report.holdout_rows)} held out; {report.fit.evaluations} pricings "
               "of the fit rows")
    for text in report.skipped:
        out.append(f"skipped {text}")
    if output:
        out.append(f"wrote {output}")
    return "\n".join(out)


def parse_holdout(values: Sequence[str] | None) -> dict[str, list[str]]:
    """``--holdout KEY=VALUE[,VALUE]`` options as ``{key: [values]}``.

    Examples
    --------
    >>> parse_holdout(["model=llama,resnet", "mode=sdpa"])
    {'model': ['llama', 'resnet'], 'mode': ['sdpa']}
    """
    found: dict[str, list[str]] = {}
    for text in values or []:
        key, sep, value = text.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(f"cannot read --holdout '{text}'; write KEY=VALUE[,VALUE], e.g. --holdout model=llama")
        found.setdefault(key.strip(), []).extend(v.strip() for v in value.split(",") if v.strip())
    return found


def base_cluster(rows: Sequence[StepRow], *, device: str | None, cluster_file: str | Path | None) -> Cluster:
    """The cluster to fit: the file's, or ``device`` (default the first row's) at its largest row's size."""
    from objectives.cluster import load_cluster, make_cluster

    if cluster_file is not None:
        return load_cluster(cluster_file)
    name = device or rows[0].device
    sized = [r for r in rows if r.device == name] or list(rows)
    largest = max(sized, key=lambda r: r.devices)
    return make_cluster(name, devices=largest.devices, devices_per_node=largest.devices_per_node)


__all__ += ["format_report", "parse_holdout", "base_cluster"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRun:
    """``planner calibrate``: the report and the cluster file written."""

    report: CalibrationReport
    output: Path
    """The cluster file written (YAML)."""
    unread_fields: tuple[str, ...]
    """Fitted constants the cluster loader does not read back (one sentence each)."""


def calibrate_file(
    steps: str | Path,
    output: str | Path,
    *,
    device: str | None = None,
    cluster_file: str | Path | None = None,
    models_dir: str | Path | None = "examples",
    holdout_every: int = 3,
    holdout: Sequence[str] | None = None,
    fit: Sequence[str] | None = None,
    rounds: int = 3,
    force: bool = False,
) -> CalibrationRun:
    """``planner calibrate``: read the measured steps, hold out rows (every ``holdout_every``-th and
    those ``holdout`` names, as ``KEY=VALUE[,VALUE]``), fit ``fit`` (default every [Empirical]
    constant) by :func:`calibrate_steps`, write the fitted cluster file to ``output`` (YAML; an
    existing file only with ``force``) and read it back.

    Raises
    ------
    InputError
        An unreadable steps file or ``--holdout``, an existing ``output`` without ``force``.
    """
    import yaml

    from planner.outputs import check_output, write_output

    output = Path(output)
    check_output(output, force=force, flag="-o")
    rows = load_rows(steps, models_dir=models_dir, device=device or "")
    base = base_cluster(rows, device=device, cluster_file=cluster_file)
    mask = holdout_mask(rows, every=holdout_every, where=parse_holdout(holdout))
    report = calibrate_steps(rows, base=base, holdout=mask, fields=list(fit) if fit is not None else None, rounds=rounds)
    write_output(output, yaml.safe_dump(report.cluster_file, sort_keys=False), force=force)
    unread = check_cluster_file(output, report.fit.params, report.fit.after)
    return CalibrationRun(report=report, output=output, unread_fields=tuple(unread))


__all__ += ["CalibrationRun", "calibrate_file"]
