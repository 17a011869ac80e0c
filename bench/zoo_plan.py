"""Plan every model of a zoo at several device counts: wall time and peak memory per case (issue 15).

Each case is one ``planner plan MODEL -n N --devices-per-node 8 --dim ... --json -q`` subprocess
run under ``/usr/bin/time -v`` (its "Maximum resident set size" is the peak RSS of the planner
process) with a wall-clock timeout; the table says per case whether it answered, in how long, with
how much memory, how many rows, and how the search degraded (its ``search:`` notes).

Models come from listings: a zoo's ``zoo.json`` (``files: {name: {dims: [...]}}``) or a
``models.json`` (``{name: {file, dims}}``) as in ``tests/data`` and ``examples``. Dims a model
declares are bound from ``--dim`` values (default batch 16, seq and tgt_seq 512).

Usage::

    .venv/bin/python bench/zoo_plan.py --listing tests/data/models.json --listing examples/models.json \
        --devices 8,64,256 --markdown
    .venv/bin/python bench/zoo_plan.py --listing tests/zoo/zoo.json --style consts --devices 8,64,256

No assertion here: the figures go to docs/PERFORMANCE.md ("Any model, any scale") with the command.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIMS = {"batch": 16, "seq": 512, "tgt_seq": 512}
_TIME = "/usr/bin/time"


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One model at one device count."""

    name: str
    path: Path
    dims: dict[str, int]
    devices: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    case: Case
    status: str
    """``ok``, ``timeout``, ``exit N`` (the planner's one-line error) or ``crash``."""
    wall_s: float
    peak_rss_bytes: float
    rows: int
    how: str
    """How the search answered: ``exact``, ``hull``, ``restricted <=k``, ``nsga2``, or the error."""


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


def run_case(case: Case, *, timeout_s: float, per_node: int, extra: list[str]) -> Outcome:
    planner = Path(sys.executable).parent / "planner"
    command = [
        _TIME, "-v", str(planner), "plan", str(case.path), "-n", str(case.devices),
        "--devices-per-node", str(min(per_node, case.devices)), "--json", "-q", *extra,
    ]  # fmt: skip
    for name, value in case.dims.items():
        command += ["--dim", f"{name}={value}"]
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return Outcome(case=case, status="timeout", wall_s=timeout_s, peak_rss_bytes=float("nan"), rows=0, how="-")
    wall = time.perf_counter() - began
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    peak = float(rss.group(1)) * 1024 if rss else float("nan")
    if done.returncode != 0:
        lines = [l for l in done.stderr.splitlines() if l.strip() and not l.startswith("\t")]
        message = next((l for l in lines if l.startswith(("error", "internal error"))), lines[-1] if lines else "")
        status = "crash" if "internal error" in message or "Traceback" in done.stderr else f"exit {done.returncode}"
        return Outcome(case=case, status=status, wall_s=wall, peak_rss_bytes=peak, rows=0, how=message[:160])
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        return Outcome(case=case, status="crash", wall_s=wall, peak_rss_bytes=peak, rows=0, how="no JSON on stdout")
    notes = [n for n in data.get("notes", []) if n.startswith("search:")]
    order_name = str(data.get("search", {}).get("order", "") if isinstance(data.get("search"), dict) else "")
    return Outcome(case=case, status="ok", wall_s=wall, peak_rss_bytes=peak, rows=len(data.get("points", [])), how=_how(notes, order_name))


def _table(outcomes: list[Outcome], markdown: bool) -> str:
    header = ["model", "devices", "status", "wall s", "peak RSS", "rows", "search"]
    rows = [
        [
            o.case.name, str(o.case.devices), o.status, f"{o.wall_s:.1f}",
            "-" if o.peak_rss_bytes != o.peak_rss_bytes else f"{o.peak_rss_bytes / 2**30:.2f} GiB",
            str(o.rows), o.how,
        ]
        for o in outcomes
    ]  # fmt: skip
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(r, widths)) for r in [header, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listing", action="append", type=Path, help="zoo.json or models.json (repeatable)")
    parser.add_argument("--style", default=None, help="zoo.json style to keep (consts, bare; default: all)")
    parser.add_argument("--only", default=None, help="regular expression on model names")
    parser.add_argument("--devices", default="8,64,256")
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--dim", action="append", default=[], help="NAME=VALUE (default batch=16 seq=512 tgt_seq=512)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per case")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--jsonl", type=Path, default=None, help="append one JSON line per case")
    parser.add_argument("extra", nargs="*", help="more planner plan arguments (after --)")
    args = parser.parse_args(argv)
    listings = args.listing or [ROOT / "tests" / "data" / "models.json", ROOT / "examples" / "models.json"]
    values = dict(DEFAULT_DIMS)
    for item in args.dim:
        name, _, value = item.partition("=")
        values[name] = int(value)
    models = [m for listing in listings for m in read_listing(listing, args.style)]
    if args.only:
        models = [m for m in models if re.search(args.only, m[0])]
    outcomes = []
    for name, path, dims in models:
        for devices in (int(x) for x in args.devices.split(",")):
            case = Case(name=name, path=path, dims={d: values[d] for d in dims if d in values}, devices=devices)
            outcome = run_case(case, timeout_s=args.timeout, per_node=args.per_node, extra=args.extra)
            outcomes.append(outcome)
            print(f"{name} n={devices}: {outcome.status} {outcome.wall_s:.1f} s {outcome.peak_rss_bytes / 2**30:.2f} GiB "
                  f"{outcome.rows} rows {outcome.how}", file=sys.stderr, flush=True)
            if args.jsonl is not None:
                with args.jsonl.open("a") as sink:
                    sink.write(json.dumps({
                        "model": name, "devices": devices, "status": outcome.status, "wall_s": outcome.wall_s,
                        "peak_rss_bytes": outcome.peak_rss_bytes, "rows": outcome.rows, "search": outcome.how,
                    }) + "\n")  # fmt: skip
    print(_table(outcomes, args.markdown))
    answered = [o for o in outcomes if o.status == "ok" or o.status.startswith("exit")]
    if answered:
        print(
            f"\n{len(answered)}/{len(outcomes)} answered; wall median {statistics.median(o.wall_s for o in answered):.1f} s, "
            f"max {max(o.wall_s for o in answered):.1f} s; peak RSS max "
            f"{max(o.peak_rss_bytes for o in answered) / 2**30:.2f} GiB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
