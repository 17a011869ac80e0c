"""Table -> pick -> export over a zoo: each listed launcher exports each row it is listed on (issues 22, 25).

For every model of the listings (a zoo's ``zoo.json`` or a ``models.json``, read as
``bench/zoo_plan.py`` reads them), the launchable table is planned in this process
(:func:`planner.launchable.plan_launchable_file`, ``--time-limit`` seconds of search per model) and
every row is exported for every launcher its ``targets`` column lists
(:func:`planner.launchable.export_row`), each document written as JSON into a temporary folder and
checked again from the file by the repo's own validator for that launcher:

* ``megatron``: :func:`exporters.validate.validate_megatron` on the document's ``args`` and ``env``;
* ``deepspeed``: :func:`exporters.validate.validate_deepspeed` on ``ds_config`` (world, stages);
* ``torchtitan``: :func:`exporters.validate.validate_torchtitan` on ``overrides`` (world, model sizes);
* ``meshtf``: :func:`exporters.validate.validate_mesh_tf` on ``mesh_shape`` / ``layout``;
* ``generic``: :func:`exporters.generic.read_plan` on the written file (the JSON schema and the reader);
* ``dtensor``, ``onnx_sharding``: written only (their checks run in their exporters and integration tests).

A listed launcher that refuses its row (``UnsupportedExport`` / ``InputError`` from the export or the
re-validation) is a *refusal*: a bug of the listing or of the exporter, since the table promised the
launch. Any other exception is a *crash*, kept with its traceback. A model the planner refuses with a
one-line :class:`~planner.core.errors.PlannerError` is counted as ``refused`` (not a bug by itself);
any other exception while planning is a crash too.

``--jsonl FILE`` appends one line per model (rows, exports, refusals, crashes with their messages);
the summary groups the failures into classes (launcher and message with numbers blanked).

Usage::

    nice -n 5 .venv/bin/python bench/export_sweep.py --listing tests/zoo/zoo.json --devices 8 \\
        --time-limit 10 --jsonl /tmp/sweep.jsonl

No assertion here: the counts go to docs/VALIDATION.md ("Export sweep over the zoo") with the command.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zoo_plan import DEFAULT_DIMS, read_listing  # noqa: E402

from objectives.cluster import make_cluster  # noqa: E402
from planner.core.errors import InputError, PlannerError, UnsupportedExport  # noqa: E402
from planner.launchable import export_row, plan_launchable_file  # noqa: E402
from planner.plan import PlanRequest  # noqa: E402


def revalidate(target: str, document: dict[str, Any], path: Path) -> None:
    """Check the written ``document`` (at ``path``) again with the repo's validator for ``target``.

    Raises
    ------
    UnsupportedExport, InputError
        As the validator does.
    """
    from exporters import validate

    if target == "megatron":
        validate.validate_megatron(document["args"], world_size=document["world_size"], env=document.get("env"))
    elif target == "deepspeed":
        model = document.get("model") or {}
        validate.validate_deepspeed(document["ds_config"], world_size=document["world_size"],
                                    pipeline_stages=document["degrees"]["pp"],
                                    num_attention_heads=model.get("num_attention_heads"),
                                    num_kv_heads=model.get("num_query_groups"))
    elif target == "torchtitan":
        model = document["model"]
        validate.validate_torchtitan(document["overrides"], world_size=document["world_size"],
                                     model=validate.TorchtitanModel(
                                         num_layers=model["num_layers"], num_attention_heads=model["num_attention_heads"],
                                         num_kv_heads=model["num_kv_heads"], tied_embeddings=model["tied_embeddings"],
                                         moe=model.get("experts") is not None))
    elif target == "meshtf":
        validate.validate_mesh_tf(document["mesh_shape"], document["layout"], devices=document["devices"])
    elif target == "generic":
        from exporters.generic import read_plan

        read_plan(path)


def _export_all(frontier, folder: Path, record: dict[str, Any]) -> None:
    """Export every row for every launcher it lists into ``folder``; count into ``record``."""
    for index, row in enumerate(frontier.rows):
        for target in row.targets:
            record["exports"] += 1
            where = f"row {index + 1} ({row.summary}) -> {target}"
            try:
                document = export_row(frontier, index, target)
                path = folder / f"row{index + 1}_{target}.json"
                path.write_text(json.dumps(document, default=str))
                revalidate(target, document, path)
            except (UnsupportedExport, InputError) as refusal:
                record["refusals"].append({"target": target, "where": where, "message": str(refusal).splitlines()[0]})
            except Exception as error:  # noqa: BLE001 -- a crash is what the sweep looks for
                record["crashes"].append({"target": target, "where": where, "message": f"{type(error).__name__}: {error}",
                                          "traceback": traceback.format_exc()})


def sweep_model(name: str, path: Path, dims: dict[str, int], *, devices: int, device: str, time_limit_s: float,
                launcher: str | None = None) -> dict:
    """Plan one model (for ``launcher`` alone, as ``--target`` does, or for all) and export every row
    for every launcher it lists; the model's record."""
    record: dict[str, Any] = {"model": name, "file": str(path), "dims": dims, "devices": devices, "launcher": launcher,
                              "status": "ok", "rows": 0, "exports": 0, "refusals": [], "crashes": [], "targets": {}}
    start = time.perf_counter()
    request = PlanRequest(cluster=make_cluster(device, devices=devices, devices_per_node=min(devices, 8)),
                          time_limit_s=time_limit_s)
    try:
        _, (frontier,) = plan_launchable_file(path, dims, [request], launchers=None if launcher is None else (launcher,))
    except PlannerError as refusal:
        record.update(status="refused", message=str(refusal).splitlines()[0])
    except Exception as error:  # noqa: BLE001
        record["status"] = "crash"
        record["crashes"].append({"target": "plan", "where": "planning", "message": f"{type(error).__name__}: {error}",
                                  "traceback": traceback.format_exc()})
    else:
        record["rows"] = len(frontier.rows)
        record["targets"] = dict(Counter(t for row in frontier.rows for t in row.targets))
        record["launchers_refused"] = {name: reason.splitlines()[0] for name, reason in frontier.refused}
        with tempfile.TemporaryDirectory(prefix="export_sweep_") as folder:
            _export_all(frontier, Path(folder), record)
    record["wall_s"] = round(time.perf_counter() - start, 2)
    return record


def _failure_class(failure: dict[str, Any]) -> str:
    """A failure's class: its launcher and its message with numbers and quoted names blanked."""
    message = re.sub(r"\d+(\.\d+)?", "N", re.sub(r"'[^']*'", "'…'", failure["message"]))
    return f"{failure['target']}: {message[:160]}"


def summarize(records: list[dict[str, Any]]) -> str:
    """The counts and the failure classes (with the smallest model showing each) as Markdown."""
    count = lambda key: sum(len(r[key]) for r in records)  # noqa: E731
    lines = [
        "| models | planned | refused (one line) | rows | exports | refusals | crashes | wall (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {len(records)} | {sum(r['status'] == 'ok' for r in records)} | {sum(r['status'] == 'refused' for r in records)} "
        f"| {sum(r['rows'] for r in records)} | {sum(r['exports'] for r in records)} | {count('refusals')} "
        f"| {count('crashes')} | {sum(r['wall_s'] for r in records):.0f} |",
    ]
    classes: dict[str, list[str]] = defaultdict(list)
    for record in records:
        for failure in record["refusals"] + record["crashes"]:
            classes[_failure_class(failure)].append(record["model"])
    if classes:
        lines += ["", "| failures | models | class (first model) |", "|---:|---:|---|"]
        for key, models in sorted(classes.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"| {len(models)} | {len(set(models))} | {key} ({models[0]}) |")
    refused = Counter(r.get("message", "") for r in records if r["status"] == "refused")
    lines += [f"- planner refused {n}: {message}" for message, n in refused.items()]
    empty = Counter(f"{name}: {reason[:100]}" for r in records if r["status"] == "ok" and not r["rows"]
                    for name, reason in r.get("launchers_refused", {}).items())
    lines += [f"- no rows, {n} models: {why}" for why, n in empty.most_common()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listing", type=Path, action="append", help="zoo.json or models.json (repeatable; "
                        "default tests/zoo/zoo.json)")
    parser.add_argument("--devices", default="8", help="devices of the cluster, or a comma list (default 8)")
    parser.add_argument("--launcher", action="append", help="plan for this launcher alone, as --target does "
                        "(repeatable: one plan each; default: one plan for all)")
    parser.add_argument("--device", default="a100-80gb", help="device preset (default a100-80gb)")
    parser.add_argument("--only", help="plan only models whose name matches this regular expression")
    parser.add_argument("--dim", action="append", default=[], help="NAME=VALUE for a model's dim (defaults: "
                        + ", ".join(f"{k}={v}" for k, v in DEFAULT_DIMS.items()) + ")")
    parser.add_argument("--time-limit", type=float, default=10.0, help="search seconds per model (default 10)")
    parser.add_argument("--jsonl", type=Path, help="append one line per model to this file")
    options = parser.parse_args()
    values = {**DEFAULT_DIMS, **{k: int(v) for k, v in (item.split("=", 1) for item in options.dim)}}
    listings = options.listing or [Path(__file__).resolve().parents[1] / "tests" / "zoo" / "zoo.json"]
    cases = [(name, path, dims, int(devices), launcher) for listing in listings
             for name, path, dims in read_listing(listing, None) if not options.only or re.search(options.only, name)
             for devices in options.devices.split(",") for launcher in options.launcher or [None]]
    records = []
    for name, path, dims, devices, launcher in cases:
        record = sweep_model(name, path, {d: values[d] for d in dims if d in values}, devices=devices,
                             device=options.device, time_limit_s=options.time_limit, launcher=launcher)
        records.append(record)
        print(f"{name} n={devices} {launcher or 'all'}: {record['status']} rows={record['rows']} "
              f"exports={record['exports']} "
              f"refusals={len(record['refusals'])} crashes={len(record['crashes'])} {record['wall_s']:.1f}s "
              f"{record['targets']}", flush=True)
        if options.jsonl is not None:
            with options.jsonl.open("a") as out:
                out.write(json.dumps(record) + "\n")
    print(summarize(records))


if __name__ == "__main__":
    main()
