"""What the parallelism of 2026 costs the default search: the zoo planned with and without it (issue 24).

Issue 24's speed bar: context parallelism, FSDP2/HSDP, FP8, offload, the torchtitan target and the
launchers' checkpointing policies together must cost the default search less than 2x its time on the
zoo at 64 devices. Each model is planned twice, in separate processes, one after the other (the order
alternates from model to model, so a load that drifts weighs on both):

* ``2026``: ``planner plan MODEL -n 64 --json -q``, the default command;
* ``2025``: the same command with those dims taken out of the space: ``--fix tp_overlap=off,offload=none``
  (no TP communication overlap, no CPU offload even when nothing fits), and, in the child process
  before the CLI runs, no context parallelism (Megatron-LM's ``cp`` degrees and DeepSpeed-Ulysses'
  are ``[1]`` / none: pinning ``cp=1`` would also skip the headroom search, which is not a 2026 dim),
  the launcher registry without torchtitan, without HSDP (``Target.hsdp = ()``) and with the
  recomputation modes of before (none, selective, full: no Megatron ``--recompute-modules mlp``, no
  torchtitan ``op``). FP8 is searched only when asked (``--dtype bf16-mixed,fp8``), so neither
  variant searches it.

Each case runs under ``/usr/bin/time -v`` (:func:`zoo_plan.run_case`): wall seconds, user + system
CPU seconds (which do not grow with the other jobs on a shared machine, unlike the wall) and peak
RSS, all in the jsonl. The summary gives per model the two walls, the two CPU times and their
ratios and both peak RSS, then the median and the largest ratio of each, the models over 2x in CPU
seconds (issue 24's bar), and how often the ``2026`` best step is faster than the ``2025`` one (the
dims' purpose). With ``--time-limit 36000`` both searches run to completion, so the ratio is of work,
not of a wall clock cut by load.

Usage::

    .venv/bin/python bench/dims_cost.py --listing tests/zoo/zoo.json --style consts --devices 64 \\
        --jsonl dims_cost.jsonl [--markdown]

No assertion here: the figures go to docs/PERFORMANCE.md with the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from zoo_plan import DEFAULT_DIMS, ROOT, Case, read_listing, run_case  # noqa: E402

WITHOUT_2026 = ("--fix", "tp_overlap=off,offload=none")
"""The ``2025`` variant's pins (the registry changes are made in :func:`_child`)."""
_RECOMPUTE_2025 = ("none", "selective", "full")


def _child(argv: list[str]) -> None:
    """Run ``planner`` with the registry of before issue 24's dims (module docstring)."""
    sys.path.insert(0, str(ROOT))
    from exporters import _target, targets
    from exporters.deepspeed import ulysses

    _target.context_degrees = lambda seq_length, model_ranks: [1]  # read by dp_cp_tp_families at call time
    ulysses.ulysses_degrees = lambda block, ranks: []  # imported at call time by the DeepSpeed families

    registry = dict(targets.TARGETS)
    registry.pop("torchtitan", None)
    for name, target in registry.items():
        registry[name] = dataclasses.replace(
            target, hsdp=(), tp_comm_overlap=False, recompute=tuple(m for m in target.recompute if m in _RECOMPUTE_2025)
        )
    targets.TARGETS.clear()  # type: ignore[attr-defined]
    targets.TARGETS.update(registry)  # type: ignore[attr-defined]
    from planner.cli import app

    sys.argv = ["planner", *argv]
    app()


def _cases(args: argparse.Namespace) -> list[tuple[Case, Case]]:
    values = dict(DEFAULT_DIMS)
    for item in args.dim:
        name, _, value = item.partition("=")
        values[name] = int(value)
    models = [m for listing in args.listing for m in read_listing(listing, args.style)]
    if args.only:
        models = [m for m in models if re.search(args.only, m[0])]
    pairs = []
    for name, path, dims in models:
        bound = {d: values[d] for d in dims if d in values}
        pairs.append((Case(name=name, path=path, dims=bound, devices=args.devices, extra=("--time-limit", str(args.time_limit))),
                      Case(name=name, path=path, dims=bound, devices=args.devices,
                           extra=("--time-limit", str(args.time_limit), *WITHOUT_2026))))  # fmt: skip
    return pairs


def _ratio(new: dict, old: dict, key: str) -> float:
    """``new[key] / old[key]`` (NaN when either is missing or NaN)."""
    top, bottom = new.get(key, float("nan")), old.get(key, float("nan"))
    return top / bottom if top == top and bottom == bottom and bottom > 0 else float("nan")


def summary(records: list[dict], markdown: bool) -> str:
    """Per model the two walls, the two CPU times and their ratios, both peak RSS; the median and
    largest ratio of each; the models over 2x in CPU seconds; best steps compared.

    >>> new = {"model": "m", "variant": "2026", "status": "ok", "wall_s": 6.0, "cpu_s": 3.0,
    ...        "peak_rss_bytes": 2**30, "best_step_s": 1.0}
    >>> old = {**new, "variant": "2025", "wall_s": 2.0, "cpu_s": 2.0, "best_step_s": 2.0}
    >>> print(summary([new, old], markdown=False).splitlines()[-1])
    1 models: wall ratio 2026/2025 median 3.00x, max 3.00x; CPU ratio median 1.50x, max 1.50x (m); \
over 2x in CPU: none; peak RSS max 1.00 GiB (2026), 1.00 GiB (2025); the 2026 best step faster on 1 of 1
    """
    by_model: dict[str, dict[str, dict]] = {}
    for record in records:
        by_model.setdefault(record["model"], {})[record["variant"]] = record
    lines = ["| model | 2026 s | 2025 s | ratio | 2026 CPU s | 2025 CPU s | CPU ratio | 2026 GiB | 2025 GiB "
             "| best step 2026 / 2025 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    walls, cpus, peaks, faster, answered = [], {}, {"2026": [], "2025": []}, 0, 0
    for model, runs in sorted(by_model.items()):
        new, old = runs.get("2026"), runs.get("2025")
        if new is None or old is None or new["status"] != "ok" or old["status"] != "ok":
            status = "/".join(r["status"] for r in (new, old) if r is not None)
            lines.append(f"| {model} | | | {status} | | | | | | |")
            continue
        walls.append(new["wall_s"] / old["wall_s"])
        cpus[model] = _ratio(new, old, "cpu_s")
        peaks["2026"].append(new["peak_rss_bytes"] / 2**30)
        peaks["2025"].append(old["peak_rss_bytes"] / 2**30)
        steps = _ratio(new, old, "best_step_s")
        answered += steps == steps
        faster += steps < 0.995
        lines.append(f"| {model} | {new['wall_s']:.1f} | {old['wall_s']:.1f} | {walls[-1]:.2f}x | "
                     f"{new.get('cpu_s', float('nan')):.2f} | {old.get('cpu_s', float('nan')):.2f} | "
                     f"{cpus[model]:.2f}x | {peaks['2026'][-1]:.2f} | {peaks['2025'][-1]:.2f} | {steps:.3f} |")  # fmt: skip
    if walls:
        lines += ["", _totals(walls, cpus, peaks) + f"; the 2026 best step faster on {faster} of {answered}"]
    text = "\n".join(lines)
    return text if markdown else text.replace("| ", "").replace(" |", "")


def _totals(walls: list[float], cpus: dict[str, float], peaks: dict[str, list[float]]) -> str:
    """The summary line: wall and CPU ratios (median, max and which model), the models over 2x in
    CPU seconds, the largest peak RSS of each variant (GiB)."""
    known = {model: ratio for model, ratio in cpus.items() if ratio == ratio}
    text = f"{len(walls)} models: wall ratio 2026/2025 median {statistics.median(walls):.2f}x, max {max(walls):.2f}x"
    if known:
        worst = max(known, key=known.__getitem__)
        over = [f"{model} {ratio:.2f}x" for model, ratio in sorted(known.items()) if ratio > 2]
        text += (f"; CPU ratio median {statistics.median(known.values()):.2f}x, max {known[worst]:.2f}x ({worst}); "
                 f"over 2x in CPU: {', '.join(over) or 'none'}")  # fmt: skip
    return text + f"; peak RSS max {max(peaks['2026']):.2f} GiB (2026), {max(peaks['2025']):.2f} GiB (2025)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listing", action="append", type=Path, required=True, help="zoo.json (repeatable)")
    parser.add_argument("--style", default=None, help="zoo.json style to keep (consts, bare; default: all)")
    parser.add_argument("--only", default=None, help="regular expression on model names")
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--dim", action="append", default=[], help="NAME=VALUE (default batch=16 seq=512 tgt_seq=512)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="planner --time-limit, seconds (its default)")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per case")
    parser.add_argument("--jsonl", type=Path, default=None, help="results file; models in it are skipped")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    done = [json.loads(line) for line in args.jsonl.read_text().splitlines()] if args.jsonl and args.jsonl.is_file() else []
    seen = {(r["model"], r["variant"]) for r in done}
    records = list(done)
    child = [sys.executable, str(Path(__file__).resolve()), "--child"]
    for position, (new, old) in enumerate(_cases(args)):
        order = [("2026", new, None), ("2025", old, child)]
        for variant, case, program in order if position % 2 == 0 else order[::-1]:
            if (case.name, variant) in seen:
                continue
            record = {**run_case(case, timeout_s=args.timeout, per_node=args.per_node, program=program).record(),
                      "variant": variant}
            records.append(record)
            print(f"{case.name} {variant}: {record['status']} {record['wall_s']:.1f} s", file=sys.stderr, flush=True)
            if args.jsonl is not None:
                with args.jsonl.open("a") as sink:
                    sink.write(json.dumps(record) + "\n")
    print(summary(records, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
