"""``--fp8-param-gather`` (issue 24 item 3): Megatron-LM writes it on the FP8 rows priced with FP8 weights
gathered in FP8 (``TrainingSettings.gathers_fp8``), its validator applies Megatron-LM's rules, the
launcher rule is Megatron's alone, and a planned row carries the rule from its launcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters import export
from exporters.megatron import megatron_masks
from exporters.megatron.fp8 import megatron_fp8_args
from exporters.megatron.validate import megatron_violations, parse_megatron_args
from exporters.targets import TARGETS
from exporters.torchtitan import torchtitan_masks
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import first_rows, gpt_graph, llama_graph, make_cluster, make_input, spaces_for
from tests.planner.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
        "--max-position-embeddings", "128", "--micro-batch-size", "1", "--bf16"]


def _args(graph, masks_fn, settings, target, dp=2, tp=2):
    spaces = spaces_for(graph, dp * tp)
    choice = first_rows(masks_fn(graph, spaces, dp=dp, tp=tp))
    plan_input = make_input(graph, spaces, choice, cluster=make_cluster(1, dp * tp), settings=settings)
    return export(target, plan_input)


class TestMegatron:
    def test_written_where_priced(self):
        on = TrainingSettings(fp8="delayed", fp8_param_gather=True, zero_stage=1)
        a = parse_megatron_args(_args(gpt_graph(), megatron_masks, on, "megatron")["args"])
        assert a["fp8-param-gather"] and a["use-distributed-optimizer"] and a["fp8-format"] == "hybrid"
        # ZeRO-0 gathers nothing (and Megatron-LM refuses the flag without the distributed optimizer)
        zero0 = TrainingSettings(fp8="delayed", fp8_param_gather=True, zero_stage=0)
        assert "fp8-param-gather" not in parse_megatron_args(_args(gpt_graph(), megatron_masks, zero0, "megatron")["args"])
        plain = TrainingSettings(fp8="delayed", zero_stage=1)  # a row priced with bf16 gathers
        assert "fp8-param-gather" not in parse_megatron_args(_args(gpt_graph(), megatron_masks, plain, "megatron")["args"])

    def test_validator_rules(self):
        flags = megatron_fp8_args("delayed", param_gather=True)
        assert megatron_violations(BASE + flags + ["--use-distributed-optimizer"], world_size=1) == []
        assert megatron_violations(BASE + flags, world_size=1) == [
            "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp, or inference mode"]
        assert "fp8_param must be used together with fp8 mode." in megatron_violations(
            BASE + ["--fp8-param-gather", "--use-distributed-optimizer"], world_size=1)


class TestLauncherRule:
    def test_megatron_alone(self):
        assert {name for name, t in TARGETS.items() if t.fp8_param_gather} == {"megatron"}

    def test_torchtitan_row_gathers_bf16(self):
        # torchtitan 0.3.0's Float8LinearConverter has no FP8 all-gather option: nothing is written
        rowwise = TrainingSettings(fp8="rowwise", zero_stage=3)
        text = _args(llama_graph(), torchtitan_masks, rowwise, "torchtitan")["config_file"]["text"]
        assert "float8_all_gather" not in text and "precompute" not in text


def test_planned_megatron_row_carries_the_flag(tmp_path):
    out = tmp_path / "megatron.json"
    run_cli(["plan", ROOT / "tests" / "data" / "llama_tiny.onnx", "-n", "4", "--device", "h100-sxm", "--dim", "batch=8",
             "--dim", "seq=128", "--pp", "1", "--dtype", "fp8", "--target", "megatron", "--export", "megatron",
             "-o", out, "-q"])
    args = json.loads(out.read_text())["args"]
    assert "--fp8-param-gather" in args and "--use-distributed-optimizer" in args


def test_saved_fp8_rows_reprice_to_their_cost(tmp_path):
    """A Megatron FP8 row saved as the generic plan keeps the rule (``training.fp8_param_gather``) and prices
    again to the same seconds and bytes."""
    import exporters
    from objectives.cluster import make_cluster as preset_cluster
    from planner.core.degrees import Pins
    from planner.launchable import plan_launchable_file, reprice_saved, row_plan_input
    from planner.plan import PlanRequest

    model = ROOT / "tests" / "data" / "llama_tiny.onnx"
    request = PlanRequest(cluster=preset_cluster("h100-sxm", devices=4), settings=TrainingSettings(fp8="delayed"))
    _, (found,) = plan_launchable_file(model, {"batch": 8, "seq": 128}, [request], launchers=["megatron"],
                                       pins=Pins(pp=1), collapse=0.0)
    rows = [row for row in found.rows if row.point.zero_stage >= 1][:4]
    assert rows
    for index, row in enumerate(rows):
        document = exporters.export("generic", row_plan_input(row))
        assert document["training"]["fp8_param_gather"] is True
        document["model"]["source_path"] = str(model)
        saved = tmp_path / f"row{index}.json"
        saved.write_text(json.dumps(document))
        again = reprice_saved(saved)
        assert again.point.time_s == pytest.approx(row.time_s, rel=1e-9), row.summary
        assert again.point.memory_bytes == pytest.approx(row.memory_bytes, rel=1e-9), row.summary
