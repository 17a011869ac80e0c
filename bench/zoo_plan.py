"""Plan every model of a zoo at several device counts: wall time and peak memory per case (issue 15).

Each case is one ``planner plan MODEL -n N --devices-per-node 8 --dim ... --json -q`` subprocess
run under ``/usr/bin/time -v`` (its "Maximum resident set size" is the peak RSS of the planner
process) with a wall-clock timeout; the table says per case whether it answered, in how long, with
how much memory, how many rows, and how the search degraded (its ``search:`` notes). With
``--target megatron`` each case is planned a second time with that target: it must answer with
rows or a one-line reason (exit 0 or 2), never a traceback.

Models come from listings: a zoo's ``zoo.json`` (``files: {name: {dims: [...]}}``) or a
``models.json`` (``{name: {file, dims}}``) as in ``tests/data`` and ``examples``. Dims a model
declares are bound from ``--dim`` values (default batch 16, seq and tgt_seq 512, samples 16,000).

A long run is resumable: ``--jsonl FILE`` appends one line per finished case, and a case already
in the file (same file, devices, dims, target, extra arguments) is not run again, so the same
command continues where a killed run stopped; ``--report`` prints the tables from the file alone.

Usage::

    .venv/bin/python bench/zoo_plan.py --listing tests/data/models.json --listing examples/models.json \
        --devices 8,64,256 --markdown
    .venv/bin/python bench/zoo_plan.py --listing .cache/zoo/zoo.json --devices 8,64,256 \
        --target megatron --jsonl bench/results/zoo_realistic.jsonl --markdown

No assertion here: the figures go to docs/PERFORMANCE.md ("Any model, any scale") with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIMS = {"batch": 16, "seq": 512, "tgt_seq": 512, "samples": 16000}
"""Bound only where a model declares the dim: samples is an audio model's waveform length (Wav2Vec2: 1 s at 16 kHz)."""
_TIME = "/usr/bin/time"
_GIB = 2**30


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One model at one device count, optionally for one export target."""

    name: str
    path: Path
    dims: dict[str, int]
    devices: int
    target: str | None = None
    extra: tuple[str, ...] = field(default=())

    def key(self) -> str:
        """What identifies the case in a results file (resuming skips a case whose key is there)."""
        try:
            where = str(self.path.resolve().relative_to(ROOT))
        except ValueError:
            where = str(self.path.resolve())
        dims = ",".join(f"{k}={v}" for k, v in sorted(self.dims.items()))
        return f"{where}|n={self.devices}|{dims}|target={self.target or '-'}|{' '.join(self.extra)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    case: Case
    status: str
    """``ok``, ``timeout``, ``exit N`` (the planner's one-line error) or ``crash`` (a traceback)."""
    wall_s: float
    peak_rss_bytes: float
    rows: int
    how: str
    """How the search answered: ``exact``, ``hull``, ``restricted <=k``, ``nsga2`` (the per-op frontier),
    ``complete`` or ``time limit (n searches)`` (the launchable table), or the error."""
    best_step_s: float = float("nan")
    """The fastest fitting row's step time, seconds (NaN when none fits or it did not answer)."""
    cpu_s: float = float("nan")
    """User plus system CPU seconds of the planner process (``/usr/bin/time``; NaN on timeout): unlike the
    wall clock, it does not grow with the other jobs sharing the machine's cores."""
    load_1m: float = float("nan")
    """The machine's one-minute load average when the case finished (how shared the cores were)."""

    def record(self) -> dict:
        """One line of the results file."""
        return {
            "key": self.case.key(), "model": self.case.name, "file": str(self.case.path), "devices": self.case.devices,
            "dims": self.case.dims, "target": self.case.target, "status": self.status, "wall_s": self.wall_s,
            "peak_rss_bytes": self.peak_rss_bytes, "cpu_s": self.cpu_s, "load_1m": self.load_1m, "rows": self.rows,
            "search": self.how, "best_step_s": self.best_step_s,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }  # fmt: skip


def read_listing(listing: Path, style: str | None) -> list[tuple[str, Path, tuple[str, ...]]]:
    """``(name, path, dims)`` of every model a listing names (``large/`` examples left out)."""
    data = json.loads(listing.read_text())
    found = []
    if "files" in data:  # a zoo.json
        for file_name, entry in sorted(data["files"].items()):
            if style is not None and entry.get("style") != style:
                continue
            found.append((Path(file_name).stem, listing.parent / file_name, tuple(entry.get("dims", ()))))
    else:  # a models.json
        for name, entry in sorted(data.items()):
            if "large/" in entry["file"]:
                continue  # GPT-3 sizes: their own bench (search.py)
            found.append((name, listing.parent / entry["file"], tuple(entry.get("dims", ()))))
    return [f for f in found if f[1].is_file()]


def _how(notes: list[str], order_name: str) -> str:
    text = " ".join(notes)
    if "NSGA-II" in text or order_name == "nsga2":
        return "nsga2"
    match = re.search(r"splits at most (\d) of its dims; the frontier", text)
    if match:
        return f"restricted <={match.group(1)}" + (" hull" if "hull" in order_name else "")
    if "hull" in order_name:
        return "hull" + (" (time limit)" if "time limit" in order_name else "")
    return "exact"


def run_case(case: Case, *, timeout_s: float, per_node: int, program: Sequence[str] | None = None) -> Outcome:
    """Run one case in a subprocess; a timeout, a traceback or no JSON is reported, never raised.
    ``program``: the command that takes ``planner``'s arguments (default: this environment's ``planner``)."""
    planner = list(program) if program is not None else [str(Path(sys.executable).parent / "planner")]
    command = [
        _TIME, "-v", *planner, "plan", str(case.path), "-n", str(case.devices),
        "--devices-per-node", str(min(per_node, case.devices)), "--json", "-q", *case.extra,
    ]  # fmt: skip
    if case.target is not None:
        command += ["--target", case.target]
    for name, value in case.dims.items():
        command += ["--dim", f"{name}={value}"]
    began = time.perf_counter()
    # its own process group: on timeout the planner under /usr/bin/time is killed too (killing
    # time alone left the planner running, holding GBs, beside the next case)
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return Outcome(case=case, status="timeout", wall_s=timeout_s, peak_rss_bytes=float("nan"), rows=0, how="-")
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    wall = time.perf_counter() - began
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    peak = float(rss.group(1)) * 1024 if rss else float("nan")
    seconds = [float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", done.stderr)]
    measured = {"cpu_s": sum(seconds) if len(seconds) == 2 else float("nan"), "load_1m": os.getloadavg()[0]}
    if done.returncode != 0:
        lines = [l for l in done.stderr.splitlines() if l.strip() and not l.startswith("\t")]
        message = next((l for l in lines if l.startswith(("error", "internal error"))), lines[-1] if lines else "")
        status = "crash" if "internal error" in message or "Traceback" in done.stderr else f"exit {done.returncode}"
        return Outcome(case=case, status=status, wall_s=wall, peak_rss_bytes=peak, rows=0, how=message[:200],
                       **measured)
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        return Outcome(case=case, status="crash", wall_s=wall, peak_rss_bytes=peak, rows=0, how="no JSON on stdout",
                       **measured)
    search = data.get("search", {}) if isinstance(data.get("search"), dict) else {}
    best = _best_step_s(data.get("rows", data.get("points", [])))
    if "rows" in data:  # the launchable table: its searches stop only at the time limit, and say so
        stopped = [n for n in search.get("notes", []) if "time limit" in n]
        how = f"time limit ({len(stopped)} searches)" if stopped else "complete"
        return Outcome(case=case, status="ok", wall_s=wall, peak_rss_bytes=peak, rows=len(data["rows"]), how=how,
                       best_step_s=best, **measured)
    notes = [n for n in data.get("notes", []) if n.startswith("search:")]
    order_name = str(search.get("order", ""))
    return Outcome(case=case, status="ok", wall_s=wall, peak_rss_bytes=peak, rows=len(data.get("points", [])),
                   how=_how(notes, order_name), best_step_s=best, **measured)


def _best_step_s(rows: list[dict]) -> float:
    """The fastest fitting row's ``step_time_s`` of a ``--json`` table (NaN when none fits)."""
    times = [float(r["step_time_s"]) for r in rows if r.get("fits", True) and "step_time_s" in r]
    return min(times) if times else float("nan")


def scaling(records: list[dict], ratio: int = 8) -> tuple[str, list[str]]:
    """Issue 25's check, "no model's best plan at N devices is slower than its best at N/8": per
    model and N with an N/``ratio`` run, the best step times and their ratio; the summary line and
    the offending cases (the larger mesh slower by more than 0.5%, rounding in the printed rows)."""
    latest: dict[str, dict] = {r["key"]: r for r in records}
    best = {(r["file"], r["devices"]): r.get("best_step_s", float("nan")) for r in latest.values()
            if not r.get("target") and r["status"] == "ok"}
    pairs, slower = 0, []
    for (file, devices), large in sorted(best.items()):
        small = best.get((file, devices // ratio)) if devices % ratio == 0 else None
        if small is None or small != small or large != large:
            continue
        pairs += 1
        if large > small * 1.005:
            slower.append(f"{Path(file).stem}: {devices} devices {large * 1e3:.3f} ms > "
                          f"{devices // ratio} devices {small * 1e3:.3f} ms ({large / small:.3f}x)")
    return f"scaling: {pairs} (N, N/{ratio}) pairs, {len(slower)} with the larger mesh slower", slower


def answered(record: dict) -> bool:
    """Exit 0 with rows, or the planner's one-line error (exit 2): no timeout, no traceback."""
    return record["status"] == "ok" or record["status"] == "exit 2"


def _cell(record: dict | None) -> str:
    if record is None:
        return "not run"
    gib = record["peak_rss_bytes"] / _GIB if record["peak_rss_bytes"] == record["peak_rss_bytes"] else float("nan")
    if record["status"] == "ok":
        return f"{record['wall_s']:.1f} s, {gib:.2f} GiB, {record['search']}"
    if record["status"] == "timeout":
        return f"**timeout** ({record['wall_s']:.0f} s)"
    return f"{record['status']}, {record['wall_s']:.1f} s, {gib:.2f} GiB"


def _megatron_cell(record: dict | None) -> str:
    if record is None:
        return "not run"
    if record["status"] == "ok":
        return f"{record['rows']} rows"
    if record["status"] == "exit 2":
        return "reason (exit 2)"
    return f"**{record['status']}**"


def report(records: list[dict], devices: list[int], markdown: bool = True) -> str:
    """The model x devices table of ``records`` (the last record of each key wins), with a
    megatron column when any record has a target, and the summary line."""
    latest: dict[str, dict] = {}
    for r in records:
        latest[r["key"]] = r
    plain = {(r["file"], r["devices"]): r for r in latest.values() if not r.get("target")}
    megatron = {(r["file"], r["devices"]): r for r in latest.values() if r.get("target") == "megatron"}
    files = sorted({f for f, _ in plain} | {f for f, _ in megatron}, key=lambda f: Path(f).stem)
    header = ["model", *[f"{n} devices" for n in devices]]
    if megatron:
        header.append("--target megatron (" + "/".join(str(n) for n in devices) + ")")
    rows = []
    for f in files:
        row = [Path(f).stem, *[_cell(plain.get((f, n))) for n in devices]]
        if megatron:
            row.append(" / ".join(_megatron_cell(megatron.get((f, n))) for n in devices))
        rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(x) for x in col) for col in zip(header, *rows)]
        lines = ["  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in [header, *rows]]
    line, slower = scaling(list(latest.values()))
    return "\n".join(lines) + "\n\n" + summary(list(latest.values())) + "\n" + "\n".join([line, *slower])


def summary(records: list[dict]) -> str:
    """Answered / run, wall median and max, peak RSS median and max, for plain and target runs."""
    parts = []
    for label, chosen in (("plan", [r for r in records if not r.get("target")]),
                          ("--target megatron", [r for r in records if r.get("target") == "megatron"])):  # fmt: skip
        if not chosen:
            continue
        ok = [r for r in chosen if answered(r)]
        text = f"{label}: {len(ok)}/{len(chosen)} answered"
        if ok:
            walls = [r["wall_s"] for r in chosen]
            peaks = [r["peak_rss_bytes"] / _GIB for r in chosen if r["peak_rss_bytes"] == r["peak_rss_bytes"]]
            text += f"; wall clock median {statistics.median(walls):.1f} s, max {max(walls):.1f} s"
            if peaks:
                text += f"; peak RSS median {statistics.median(peaks):.2f} GiB, max {max(peaks):.2f} GiB"
            cpus = [r["cpu_s"] for r in chosen if r.get("cpu_s", float("nan")) == r.get("cpu_s", float("nan"))]
            if cpus:
                text += f"; CPU median {statistics.median(cpus):.1f} s, max {max(cpus):.1f} s"
        over = [r for r in chosen if r["wall_s"] > 90 or r["peak_rss_bytes"] > 4 * _GIB or not answered(r)]
        text += f"; {len(over)} over 90 s or 4 GiB or unanswered"
        parts.append(text + ".")
    return "\n".join(parts)


def _load(path: Path | None) -> list[dict]:
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listing", action="append", type=Path, help="zoo.json or models.json (repeatable)")
    parser.add_argument("--style", default=None, help="zoo.json style to keep (consts, bare; default: all)")
    parser.add_argument("--only", default=None, help="regular expression on model names")
    parser.add_argument("--devices", default="8,64,256")
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--dim", action="append", default=[],
                        help="NAME=VALUE (default batch=16 seq=512 tgt_seq=512 samples=16000)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per case")
    parser.add_argument("--target", default=None, help="also plan each case with --target X (e.g. megatron)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--jsonl", type=Path, default=None, help="results file: one JSON line per case; cases in it are skipped")
    parser.add_argument("--report", action="store_true",
                        help="print the tables of --jsonl (and --also files, later lines win) and run nothing; "
                             "--listing and --style select the models shown")  # fmt: skip
    parser.add_argument("--also", action="append", type=Path, default=[], help="more results files for --report (e.g. re-runs)")
    parser.add_argument("extra", nargs="*", help="more planner plan arguments (after --)")
    args = parser.parse_args(argv)
    devices = [int(x) for x in args.devices.split(",")]
    if args.report:
        records = [r for path in (args.jsonl, *args.also) for r in _load(path)]
        if args.listing:
            folders = [str(listing.parent.resolve()) for listing in args.listing]
            records = [r for r in records if str((ROOT / r["file"]).resolve().parent) in folders]
        if args.style:
            records = [r for r in records if Path(r["file"]).stem.endswith("_" + args.style)]
        print(report(records, devices, args.markdown))
        return 0
    listings = args.listing or [ROOT / "tests" / "data" / "models.json", ROOT / "examples" / "models.json"]
    values = dict(DEFAULT_DIMS)
    for item in args.dim:
        name, _, value = item.partition("=")
        values[name] = int(value)
    models = [m for listing in listings for m in read_listing(listing, args.style)]
    if args.only:
        models = [m for m in models if re.search(args.only, m[0])]
    done = {r["key"] for r in _load(args.jsonl)}
    records = []
    for name, path, dims in models:
        for n in devices:
            for target in (None, args.target) if args.target else (None,):
                case = Case(name=name, path=path, dims={d: values[d] for d in dims if d in values}, devices=n,
                            target=target, extra=tuple(args.extra))  # fmt: skip
                if case.key() in done:
                    continue
                outcome = run_case(case, timeout_s=args.timeout, per_node=args.per_node)
                record = outcome.record()
                records.append(record)
                print(f"{name} n={n}{' --target ' + target if target else ''}: {outcome.status} {outcome.wall_s:.1f} s "
                      f"({outcome.cpu_s:.1f} CPU s, load {outcome.load_1m:.1f}) "
                      f"{outcome.peak_rss_bytes / _GIB:.2f} GiB {outcome.rows} rows {outcome.how}", file=sys.stderr, flush=True)  # fmt: skip
                if args.jsonl is not None:
                    with args.jsonl.open("a") as sink:
                        sink.write(json.dumps(record) + "\n")
    shown = _load(args.jsonl) if args.jsonl is not None else records
    print(report(shown, devices, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
