"""Two of issue 25's done-when checks over the repository's own fixtures (h31d, docs/VALIDATION.md "Issue 25 done-when,
measured"):

* ``params``: every ONNX file beside a ``counts.json`` that records torch's parameter count
  (``sum(p.numel() for p in model.parameters())`` when the file was built) is imported, and the importer's count is
  compared with it; a difference is *said* when some import warning names it (or two warned numbers sum to it);
* ``megatron``: ``planner plan FILE -n 8 --target megatron --json -q`` on one file of every family the zoo, the
  exporter fixtures and the ``tests/data`` fixtures hold: rows, or the one-line reason (exit 2); anything else
  (a traceback, another exit code) is a failure.

Each writes one JSON line per file (``--out``); ``--report`` prints the summary of such a file::

    .venv/bin/python bench/issue25_scan.py params --out params.jsonl
    .venv/bin/python bench/issue25_scan.py megatron --out megatron.jsonl
    .venv/bin/python bench/issue25_scan.py megatron --out megatron.jsonl --report

Dims: every symbolic input dim of a file is bound (batch 16, seq 128, tgt_seq 64, samples 16,000 for ``megatron``;
batch 2, seq 16 and 16 otherwise for ``params``, whose count does not depend on them).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_FIXTURE_FOLDERS = ("mla_cases", "megatron_moe", "hybrid_cases", "hybrid_moe_cases", "vlm_cases", "dlrm_cases",
                    "param_cases", "sweep_cases", "gpt_oss_cases", "moe_v2_cases", "moe_router_cases", "mamba2_cases",
                    "shared_first_cases", "ernie_router_cases", "hunyuan_cases", "apertus_cases", "lfm2_cases",
                    "unseen_cases", "pooling_cases", "window_cases", "mpt_alibi_cases", "sparsemixer_cases",
                    "outside_zoo", "megatron_moe_loss", "deberta_static")


def _symbolic_dims(path: Path, values: dict[str, int], default: int | None) -> dict[str, int]:
    model = onnx.load(path, load_external_data=False)
    names = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    return {n: values.get(n, default) for n in sorted(names) if n in values or default is not None}


def torch_counts(counts_json: Path) -> dict[Path, int]:
    """File -> torch's count, from the ``counts.json`` layouts the fixtures use (``{"files": {name: {...}}}``,
    ``{name.onnx: {...}}``, or ``{stem: {...}}`` for the files whose name starts with the stem)."""
    data = json.loads(counts_json.read_text())
    entries = data["files"] if isinstance(data.get("files"), dict) else data
    files, found = sorted(counts_json.parent.glob("*.onnx")), {}
    for key, value in entries.items():
        count = value if isinstance(value, int) else value.get("param_count") if isinstance(value, dict) else None
        if not isinstance(count, int):
            continue
        targets = [counts_json.parent / key] if key.endswith(".onnx") else [
            f for f in files if f.stem == key or f.stem.startswith(key + "_")]
        found.update({t: count for t in targets if t.is_file()})
    return found


def _said(diff: int, warnings: list[str]) -> bool:
    """Whether ``|diff|`` (elements) is a number some import warning prints, or the sum of two such numbers: a
    lenient reading (any number of any warning counts, a shape's or a count's), so "said" is an upper bound on the
    files whose difference a warning explains, each to be read by eye."""
    numbers = {int(x.replace(",", "")) for w in warnings for x in re.findall(r"\d[\d,]*", w)}
    return abs(diff) in numbers or any(abs(diff) == a + b for a in numbers for b in numbers)


def scan_params() -> list[dict]:
    from importers import import_model

    rows = []
    for counts_json in sorted((ROOT / "tests").rglob("counts.json")):
        for path, count in sorted(torch_counts(counts_json).items()):
            row = {"file": str(path.relative_to(ROOT)), "torch": count}
            try:
                graph = import_model(path, _symbolic_dims(path, {"batch": 2, "seq": 16, "samples": 4000}, 16))
            except Exception as error:  # noqa: BLE001 (a refusal is recorded, not raised)
                rows.append({**row, "error": f"{type(error).__name__}: {str(error)[:200]}"})
                continue
            diff = graph.parameter_count - count
            rows.append({**row, "ours": graph.parameter_count, "diff": diff,
                         "said": diff == 0 or _said(diff, list(graph.warnings))})
    return rows


def _megatron_files() -> list[Path]:
    files = sorted((ROOT / "tests" / "zoo").glob("*_dynamo_consts.onnx"))
    files += sorted((ROOT / "tests" / "exporters" / "data").glob("*.onnx"))
    for folder in _FIXTURE_FOLDERS:
        found = sorted((ROOT / "tests" / "data" / folder).glob("*.onnx"))
        files += ([f for f in found if "dynamo_consts" in f.name] or [f for f in found if "consts" in f.name]
                  or found)[:2]
    files += [ROOT / "tests" / "data" / f for f in ("t5_tiny.onnx", "vit_tiny.onnx", "lstm_lm.onnx", "llama_tiny.onnx",
                                                   "mixtral_tiny.onnx")]
    return files + [ROOT / "examples" / f for f in ("resnet.onnx", "bert.onnx", "mlp.onnx")]


def scan_megatron() -> list[dict]:
    rows = []
    for path in _megatron_files():
        dims = _symbolic_dims(path, {"batch": 16, "seq": 128, "tgt_seq": 64, "samples": 16000}, None)
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
        lines = [f"{len(rows)} files: {exact} exact, {len(said)} off by what a warning names, {len(silent)} off "
                 f"otherwise, {len(errors)} refused"]
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
