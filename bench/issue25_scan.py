"""Two of issue 25's done-when checks over the repository's own fixtures (h31d, docs/VALIDATION.md "Issue 25 done-when,
measured"):

* ``params``: every ONNX file beside a ``counts.json`` that records torch's parameter count
  (``sum(p.numel() for p in model.parameters())`` when the file was built) is imported, and the importer's count is
  compared with it, less the parameters torch found the exported output never reads (``unread_param_count``,
  recorded by ``tests/importers/make_unread_counts.py`` or ``make_outside_zoo.py``: not in the file, so no import
  can count them); a difference is *said* when it is the sum of some of the signed corrections the import warnings
  state (at most three, each used once: :func:`corrections`), e.g. "it is counted (64,000 parameters): ... that much
  lower" and "the parameter count is 16,384 short";
* ``megatron``: ``planner plan FILE -n 8 --target megatron --json -q`` on one file of every family the zoo, the
  exporter fixtures and the ``tests/data`` fixtures hold: rows, or the one-line reason (exit 2); anything else
  (a traceback, another exit code) is a failure.

Each writes one JSON line per file (``--out``); ``--report`` prints the summary of such a file::

    .venv/bin/python bench/issue25_scan.py params --out params.jsonl
    .venv/bin/python bench/issue25_scan.py megatron --out megatron.jsonl
    .venv/bin/python bench/issue25_scan.py megatron --out megatron.jsonl --report

Dims: every symbolic input dim of a file is bound (batch 16, seq 128, tgt_seq 64, samples 16,000, nodes 2,708 and
edges 13,264 for ``megatron``;
batch 2, seq 16 and 16 otherwise for ``params``, whose count does not depend on them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def fixture_folders() -> list[Path]:
    """The fixture folders the ``megatron`` scan reads: every folder under ``tests/data`` holding ONNX files beside a
    ``counts.json`` (each fixture route writes one), so a new fixture is scanned without naming it here."""
    data = ROOT / "tests" / "data"
    return sorted(p for p in data.iterdir() if p.is_dir() and (p / "counts.json").is_file() and any(p.glob("*.onnx")))


def _symbolic_dims(path: Path, values: dict[str, int], default: int | None) -> dict[str, int]:
    model = onnx.load(path, load_external_data=False)
    names = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    return {n: values.get(n, default) for n in sorted(names) if n in values or default is not None}


def torch_counts(counts_json: Path) -> dict[Path, int]:
    """File -> torch's count, from the ``counts.json`` layouts the fixtures use (``{"files": {name: {...}}}``,
    ``{name.onnx: {...}}``, or ``{stem: {...}}`` for the files whose name starts with the stem)."""
    return {path: entry[0] for path, entry in _count_entries(counts_json).items()}


def unread_counts(counts_json: Path) -> dict[Path, int]:
    """File -> elements of the parameters torch counts that the exported output never reads (0 where not recorded)."""
    return {path: entry[1] for path, entry in _count_entries(counts_json).items()}


def _count_entries(counts_json: Path) -> dict[Path, tuple[int, int]]:
    data = json.loads(counts_json.read_text())
    entries = data["files"] if isinstance(data.get("files"), dict) else data
    files, found = sorted(counts_json.parent.glob("*.onnx")), {}
    for key, value in entries.items():
        count = value if isinstance(value, int) else value.get("param_count") if isinstance(value, dict) else None
        if not isinstance(count, int):
            continue
        unread = value.get("unread_param_count", 0) if isinstance(value, dict) else 0
        targets = [counts_json.parent / key] if key.endswith(".onnx") else [
            f for f in files if f.stem == key or f.stem.startswith(key + "_")]
        found.update({t: (count, unread) for t in targets if t.is_file()})
    return found


_NUMBER = r"(\d[\d,]*)"
# What an import warning says of the count, with its direction: ``+`` the import counted elements that may not be
# parameters (the count may be that much above torch's), ``-`` it left out elements that may be (below torch's).
# Only these phrases are read, so a shape's or a layer's number never matches.
_CORRECTIONS = (
    (+1, re.compile(rf"counted \({_NUMBER} parameters\)[^;]*?that much lower")),  # tied copies, frozen norms, buffers
    (+1, re.compile(rf"count is {_NUMBER} lower")),  # MobileBERT's tied rows, frozen position tables
    (+1, re.compile(rf"\({_NUMBER} parameters\); a fixed \(sinusoidal\) table registered as a buffer")),
    (-1, re.compile(rf"true count is (?:up to )?{_NUMBER} higher")),
    (-1, re.compile(rf"true count is higher by {_NUMBER}")),
    (-1, re.compile(rf"parameter count is {_NUMBER} short")),  # experts no example token reached
    (-1, re.compile(rf"count is short by {_NUMBER} elements \(C per Conv, {_NUMBER} if")),  # Convs fused with BN
    (-1, re.compile(rf"not counted \({_NUMBER} elements\)")),
    (-1, re.compile(rf"\({_NUMBER} elements not counted again\)")),
    (-1, re.compile(rf"\({_NUMBER} elements for weight_norm\(dim=2\), {_NUMBER} for dim=0\)")),
    (-1, re.compile(rf"short by g's elements, .*?\({_NUMBER} at dim=0, {_NUMBER} at dim=1, {_NUMBER} at dim=2")),
)
_MAX_TERMS = 3


def corrections(warnings: list[str]) -> list[tuple[int, ...]]:
    """The signed element counts the warnings give as possible corrections of the import's count (``+``: it may be
    that much above torch's; ``-``: below), one tuple per phrase of :data:`_CORRECTIONS` found, holding its
    alternatives (a weight norm's g has one element per slice along a dim the file does not record).

    >>> corrections(["'w' [64, 1000] ... it is counted (64,000 parameters): if the model ties them, the true count is "
    ...              "that much lower", "... the parameter count is 16,384 short of the model's", "'x' [64, 64] of 4"])
    [(64000,), (-16384,)]
    """
    found = []
    for warning in warnings:
        for sign, pattern in _CORRECTIONS:
            found += [tuple(sign * int(n.replace(",", "")) for n in m.groups()) for m in pattern.finditer(warning)]
    return found


def _said(diff: int, warnings: list[str]) -> bool:
    """Whether ``diff`` (the import's count less torch's, elements) is the sum of one to three of the warnings'
    signed :func:`corrections`, each used once and with one of its alternatives: each says the count is off by that much if what it describes holds,
    so any of them may hold together (Switch's +47,616: 64,000 counted as a possible tied copy, 16,384 of an expert
    the trace lacks)."""
    terms = corrections(warnings)
    return any(diff == sum(picked) for size in range(1, _MAX_TERMS + 1)
               for chosen in itertools.combinations(terms, size) for picked in itertools.product(*chosen))


def scan_params() -> list[dict]:
    from importers import import_model

    rows = []
    for counts_json in sorted((ROOT / "tests").rglob("counts.json")):
        unread = unread_counts(counts_json)
        for path, count in sorted(torch_counts(counts_json).items()):
            row = {"file": str(path.relative_to(ROOT)), "torch": count, "unread": unread[path]}
            try:
                graph = import_model(path, _symbolic_dims(path, {"batch": 2, "seq": 16, "samples": 4000}, 16))
            except Exception as error:  # noqa: BLE001 (a refusal is recorded, not raised)
                rows.append({**row, "error": f"{type(error).__name__}: {str(error)[:200]}"})
                continue
            diff = graph.parameter_count - (count - unread[path])
            rows.append({**row, "ours": graph.parameter_count, "diff": diff,
                         "said": diff == 0 or _said(diff, list(graph.warnings))})
    return rows


def _megatron_files() -> list[Path]:
    files = sorted((ROOT / "tests" / "zoo").glob("*_dynamo_consts.onnx"))
    files += sorted((ROOT / "tests" / "exporters" / "data").glob("*.onnx"))
    for folder in fixture_folders():
        found = sorted(folder.glob("*.onnx"))
        files += ([f for f in found if "dynamo_consts" in f.name] or [f for f in found if "consts" in f.name]
                  or found)[:2]
    files += [ROOT / "tests" / "data" / f for f in ("t5_tiny.onnx", "vit_tiny.onnx", "lstm_lm.onnx", "llama_tiny.onnx",
                                                   "mixtral_tiny.onnx")]
    return files + [ROOT / "examples" / f for f in ("resnet.onnx", "bert.onnx", "mlp.onnx")]


_MEGATRON_DIMS = {"batch": 16, "seq": 128, "tgt_seq": 64, "samples": 16000, "nodes": 2708, "edges": 13264}
"""The ``megatron`` scan's dims; ``nodes`` and ``edges`` are Cora's (the GAT fixture's, h31g)."""


def scan_megatron() -> list[dict]:
    rows = []
    for path in _megatron_files():
        dims = _symbolic_dims(path, _MEGATRON_DIMS, None)
        command = [str(ROOT / ".venv" / "bin" / "planner"), "plan", str(path), "-n", "8", "--target", "megatron",
                   "--json", "-q", "--time-limit", "20", *[a for n, v in dims.items() for a in ("--dim", f"{n}={v}")]]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        row = {"file": str(path.relative_to(ROOT)), "rc": done.returncode, "traceback": "Traceback" in done.stderr}
        if done.returncode == 0:
            row["rows"] = len(json.loads(done.stdout).get("rows", []))
        else:
            lines = [l for l in done.stderr.splitlines() if l.startswith(("error", "internal error"))]
            row["error"] = lines[-1] if lines else done.stderr[-400:]
        rows.append(row)
    return rows


def report(kind: str, rows: list[dict]) -> str:
    if kind == "params":
        exact = sum(r.get("diff") == 0 for r in rows)
        said = [r for r in rows if r.get("diff") not in (0, None) and r["said"]]
        silent = [r for r in rows if r.get("diff") not in (0, None) and not r["said"]]
        errors = [r for r in rows if "error" in r]
        unread = [r for r in rows if r.get("unread")]
        lines = [f"{len(rows)} files: {exact} exact, {len(said)} off by what a warning names, {len(silent)} off "
                 f"otherwise, {len(errors)} refused; torch's count less what the exported output never reads on "
                 f"{len(unread)}"]
        lines += [f"  unread: {r['file']} {r['unread']:,}" for r in unread]
        lines += [f"  said: {r['file']} {r['diff']:+,}" for r in said]
        lines += [f"  off: {r['file']} {r['diff']:+,}" for r in silent] + [f"  refused: {r['file']} {r['error']}" for r in errors]
        return "\n".join(lines)
    ok = [r for r in rows if r["rc"] == 0]
    refused = [r for r in rows if r["rc"] == 2 and not r["traceback"]]
    bad = [r for r in rows if r not in ok and r not in refused]
    lines = [f"{len(rows)} files: {len(ok)} with rows, {len(refused)} refused in one line, {len(bad)} otherwise",
             "  rows: " + ", ".join(Path(r["file"]).stem for r in ok)]
    reasons = Counter(r["error"].split(": ", 3)[-1][:70] for r in refused)
    return "\n".join(lines + [f"  {n} x {why}" for why, n in reasons.most_common()] + [f"  FAILED: {r}" for r in bad])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("params", "megatron"))
    parser.add_argument("--out", type=Path, required=True, help="results file, one JSON line per file")
    parser.add_argument("--report", action="store_true", help="summarise --out and run nothing")
    args = parser.parse_args(argv)
    if not args.report:
        rows = scan_params() if args.kind == "params" else scan_megatron()
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(report(args.kind, [json.loads(l) for l in args.out.read_text().splitlines() if l.strip()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
