"""Each launcher accepts each row it is listed on (issue 22 "the main job"), on any model: every row of the
default launchable table goes through every launcher its ``launchers`` column lists.

Per row and launcher: the exporter (:func:`exporters.export`, which runs that launcher's validator), then the
launcher's own config code on the export, as the integration tests do for the examples
(``tests/integration/test_launchable_export.py``, ``test_torchtitan_export.py``): megatron-core's
``TransformerConfig`` (tp, pp and the layers it builds per stage) and ``ConstantNumMicroBatchesCalculator``,
DeepSpeed's ``DeepSpeedConfig`` (gradient accumulation, ``train_batch_size``), torchtitan's
``ConfigManager.parse_args`` and ``ParallelDims.from_config`` (dp, tp, pp). Mesh-TF and DTensor rows: exporter and
validator only (Mesh-TF is not installed; DTensor plans are run in ``tests/integration/test_dtensor_run.py``). The
pick is also exported as ``planner plan --pick N --export FORMAT`` does it (:func:`planner.launchable.export_row`),
to ``generic`` and ``megatron``.

Needs the integration environment (torch, megatron-core, deepspeed, torchtitan); run from the repository root::

    .venv-integration/bin/python bench/launcher_accepts.py examples/gpt2.onnx -n 16 --dim batch=32 --dim seq=1024 --mem-limit-gb 16
    .venv-integration/bin/python bench/launcher_accepts.py tests/zoo/llama_dynamo_bare.onnx -n 16 --dim batch=16 --dim seq=512

Prints one JSON line: rows, the pick and its launchers, ``accepted`` per launcher (rows accepted / rows listing
it), the failures, and the pick's two exports. No assertion here: the figures go to docs/VALIDATION.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' helpers below, from a checkout


def megatron_accepts(row, out: dict) -> None:
    """megatron-core's config and micro-batch calculator on a Megatron-LM export of ``row``."""
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig

    from exporters.validate import parse_megatron_args
    from tests.exporters.test_megatron import _megatron_layers_per_rank, _transformer_config_kwargs

    args = parse_megatron_args(out["args"])
    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (row.degrees.tp, row.point.pp)
    if row.point.pp > 1:
        assert _megatron_layers_per_rank(config) == list(row.point.layers_per_stage), "layers per stage"
    calculator = ConstantNumMicroBatchesCalculator(args["global-batch-size"], args["micro-batch-size"],
                                                   out["degrees"]["dp"], False, 0)
    assert calculator.get() == row.point.micro_batches, "micro-batches"


def deepspeed_accepts(row, out: dict) -> None:
    """DeepSpeed's ``DeepSpeedConfig`` at the export's data-parallel size (``dist`` stubbed: no process group)."""
    import deepspeed.runtime.config as ds_config

    dp = out["degrees"]["dp"]
    saved = ds_config.dist
    ds_config.dist = SimpleNamespace(get_rank=lambda *a, **k: 0, get_world_size=lambda *a, w=dp, **k: w)
    try:
        config = ds_config.DeepSpeedConfig(out["ds_config"])
    finally:
        ds_config.dist = saved
    assert config.gradient_accumulation_steps == row.point.micro_batches
    assert config.train_batch_size == config.train_micro_batch_size_per_gpu * row.point.micro_batches * dp
    assert dp == row.degrees.dp


def torchtitan_accepts(row, out: dict) -> None:
    """torchtitan's ``ConfigManager`` on the exported module and overrides, and ``ParallelDims`` at the world size."""
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims

    folder = Path(tempfile.mkdtemp(prefix="torchtitan_export_"))
    (folder / out["config_file"]["path"]).write_text(out["config_file"]["text"])
    sys.modules.pop(out["module"], None)
    sys.path.insert(0, str(folder))
    try:
        config = ConfigManager().parse_args(["--module", out["module"], "--config", out["config"], *out["overrides"]])
    finally:
        sys.path.remove(str(folder))
    p = config.parallelism
    dims = ParallelDims.from_config(p, out["world_size"])
    dp = p.data_parallel_replicate_degree * dims.dp_shard
    assert (dp, p.tensor_parallel_degree, p.pipeline_parallel_degree) == (row.degrees.dp, row.degrees.tp, row.point.pp)


ACCEPTS = {"megatron": megatron_accepts, "deepspeed": deepspeed_accepts, "torchtitan": torchtitan_accepts}


def row_problem(row, target: str) -> str | None:
    """``None`` when ``target`` exports ``row`` and its config code accepts it, else what went wrong."""
    from exporters import export
    from planner.launchable import row_plan_input

    try:
        out = export(target, row_plan_input(row))
    except Exception as error:  # noqa: BLE001 - a refusal of a listed row is the finding
        return f"export refused: {type(error).__name__}: {str(error)[:300]}"
    try:
        if target in ACCEPTS:
            ACCEPTS[target](row, out)
    except Exception as error:  # noqa: BLE001
        return f"{target}'s config code rejected it: {type(error).__name__}: {str(error)[:300]}"
    return None


def _pick_exports(found, out_folder: Path | None, stem: str) -> dict[str, str]:
    from planner.launchable import export_row

    done = {}
    for fmt in ("generic", "megatron"):
        try:
            document = export_row(found, found.chosen, fmt)
        except Exception as error:  # noqa: BLE001 - a refusal is an answer here
            done[fmt] = f"{type(error).__name__}: {str(error)[:300]}"
            continue
        if out_folder is not None:
            (out_folder / f"{stem}_pick_{fmt}.json").write_text(json.dumps(document, default=str))
        done[fmt] = "exported"
    return done


def check(model: Path, devices: int, dims: dict[str, int], limit_bytes: float | None, out_folder: Path | None) -> dict:
    """Plan ``model`` (a100-80gb, 8 per node, no time cut) and put every row through its launchers."""
    from objectives.cluster import make_cluster
    from planner.launchable import plan_launchable_file
    from planner.plan import PlanRequest

    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=min(devices, 8)),
                          memory_limit_bytes=limit_bytes, time_limit_s=3600.0)
    started = time.perf_counter()
    _, (found,) = plan_launchable_file(model, dims, [request])
    planned_s = time.perf_counter() - started
    tally: dict[str, list[int]] = {}
    failures = []
    for index, row in enumerate(found.rows):
        for target in (t for t in row.targets if t != "generic"):
            problem = row_problem(row, target)
            counts = tally.setdefault(target, [0, 0])
            counts[0] += problem is None
            counts[1] += 1
            if problem is not None:
                failures.append(f"row {index + 1} ({row.summary}) -> {target}: {problem}")
    best = found.best
    return {"model": str(model), "devices": devices, "dims": dims, "rows": len(found.rows), "plan_s": round(planned_s, 1),
            "pick": None if found.chosen is None else found.chosen + 1,
            "pick_launchers": None if best is None else list(best.targets),
            "pick_exports": {} if found.chosen is None else _pick_exports(found, out_folder, model.stem),
            "accepted": {t: f"{ok}/{n}" for t, (ok, n) in tally.items()}, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("-n", "--devices", type=int, required=True)
    parser.add_argument("--dim", action="append", default=[], help="NAME=VALUE, repeatable")
    parser.add_argument("--mem-limit-gb", type=float, default=None, help="memory per device, GB (1e9 bytes)")
    parser.add_argument("--out", type=Path, default=None, help="folder for the pick's generic and megatron exports")
    options = parser.parse_args()
    dims = {name: int(value) for name, value in (item.split("=") for item in options.dim)}
    limit = None if options.mem_limit_gb is None else options.mem_limit_gb * 1e9
    print(json.dumps(check(options.model, options.devices, dims, limit, options.out)), flush=True)


if __name__ == "__main__":
    main()
