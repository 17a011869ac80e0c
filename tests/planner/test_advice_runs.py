"""A refusal's advice runs (issue 25, sweep H5 findings 6, 11 and 7): each one-line error (exit 2) names
a fix, and following it plans; ``compare`` of two model files is refused; a mistyped device gets the
preset of its chip.

Oracles: torchtitan's exporter itself (it refuses ``cp > 1`` under ZeRO-0 and a search pinned to ZeRO-3
lists rows), the registry's FP8 launchers and their refusals of the model (``target_refusal``), HSDP's
rule counted by hand (a shard group of 8 kept twice needs 16 data-parallel ranks; 8 devices give 8, whose
divisors 2 and 4 are each held at least twice), the MoE layers found in the file (none in a dense Llama),
the two plan files' own ``model.sha256``, and the device preset list read by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.targets import TARGETS
from importers.moe import find_moe_layers
from objectives.cluster import DEVICE_PRESETS, make_cluster
from planner.core.degrees import Pins
from planner.core.settings import TrainingSettings
from planner.launcher_options import hsdp_refusal
from planner.pipeline import graph_loader
from planner.plan_targets import target_refusal
from tests.planner.cli_helpers import error_line, run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
LLAMA = DATA / "llama_tiny.onnx"
BERT = DATA / "bert_tiny_ts.onnx"
GPT2 = DATA / "gpt2_tiny.onnx"
LONG = ["-n", "8", "--dim", "batch=4", "--dim", "seq=4096", "-q"]
SHORT = ["-n", "8", "--dim", "batch=16", "--dim", "seq=128", "-q"]


def _rows(args: list) -> list[dict]:
    return json.loads(run_cli(["plan", *args, "--json"]).stdout)["rows"]


class TestTorchtitanContextParallelZero:
    @pytest.mark.parametrize("zero", [0, 1])
    def test_names_zero_three_and_it_runs(self, zero):
        line = error_line(run_cli(["plan", LLAMA, *LONG, "--target", "torchtitan", "--fix", "cp=2", "--zero", zero],
                              expected_exit_code=2))
        assert TARGETS["torchtitan"].context_zero == (3,)  # FSDP2 over dp_shard x cp
        assert line == (f"error: 8 devices: torchtitan runs ZeRO 3 with cp=2; --fix zero={zero} leaves none: drop it "
                        "or use --fix zero=3")

    def test_the_advice_runs(self):
        rows = _rows([LLAMA, *LONG, "--target", "torchtitan", "--fix", "cp=2", "--zero", "3"])
        assert rows and all(row["degrees"]["cp"] == 2 and row["zero_stage"] == 3 for row in rows)
        degrees = rows[0]["degrees"]
        assert degrees["dp"] * degrees["cp"] * degrees["tp"] * degrees["pp"] <= 8


class TestFp8Advice:
    def test_a_model_the_fp8_launchers_refuse_says_drop_fp8(self):
        line = error_line(run_cli(["plan", BERT, *SHORT, "--device", "h100-sxm", "--dtype", "fp8"], expected_exit_code=2))
        graph = graph_loader(BERT, {"batch": 16, "seq": 128})(16)
        cluster = make_cluster("h100-sxm", devices=8)
        trains = [name for name, target in TARGETS.items() if target.fp8 is not None]
        assert trains == ["megatron", "torchtitan"]
        for name in trains:  # both refuse the encoder: the advice must not send the user to them
            assert target_refusal(graph, cluster, TrainingSettings(), name) is not None
        assert "megatron and torchtitan, the launchers that train FP8, do not train this model (megatron: " in line
        assert line.endswith("): drop fp8 from --dtype")
        assert "--target megatron" not in line and "; export with" not in line

    def test_a_model_megatron_runs_is_sent_there_and_it_runs(self):
        line = error_line(run_cli(["plan", LLAMA, *SHORT, "--device", "h100-sxm", "--dtype", "fp8", "--target", "deepspeed"],
                              expected_exit_code=2))
        assert line.endswith("FP8 rows run on megatron or torchtitan: drop fp8 from --dtype or use --target megatron")
        rows = _rows([LLAMA, *SHORT, "--device", "h100-sxm", "--dtype", "fp8", "--target", "megatron"])
        assert rows and {row["precision"] for row in rows} == {"fp8"}


class TestHsdpPin:
    def test_the_rule_by_hand(self):
        # a shard group of 8 kept twice is 16 data-parallel ranks; 8 devices give at most 8
        assert hsdp_refusal(Pins(hsdp=8), 8) == (
            "--fix hsdp=8 shards over 8 data-parallel ranks and keeps 2 or more replicas, so it needs 16 or more "
            "data-parallel ranks, a multiple of 8; 8 devices give at most 8: use --fix hsdp=2 or 4, or drop it")
        # 3 divides no divisor of 8
        assert hsdp_refusal(Pins(hsdp=3), 8).endswith("8 devices give a divisor of 8: use --fix hsdp=2 or 4, or drop it")
        # cp=4 leaves 16 / 4 = 4 data-parallel ranks: hsdp=2 is kept twice, hsdp=4 once
        assert hsdp_refusal(Pins(hsdp=4, cp=4), 16).endswith(
            "16 devices over the pinned pp x tp x cp (4) give at most 4: use --fix hsdp=2, or drop it")
        assert hsdp_refusal(Pins(hsdp=2, cp=4), 16) is None
        assert hsdp_refusal(Pins(hsdp=4, dp=4), 16).startswith("--fix hsdp=4 ")  # dp=4 holds one group of 4
        assert hsdp_refusal(Pins(hsdp=2), 2).endswith("2 devices give at most 2: drop it")

    def test_refused_before_the_search_and_the_advice_runs(self):
        line = error_line(run_cli(["plan", LLAMA, *SHORT, "--fix", "hsdp=8"], expected_exit_code=2))
        assert line == ("error: --fix hsdp=8 shards over 8 data-parallel ranks and keeps 2 or more replicas, so it needs "
                        "16 or more data-parallel ranks, a multiple of 8; 8 devices give at most 8: use --fix hsdp=2 or "
                        "4, or drop it")
        rows = _rows([LLAMA, *SHORT, "--fix", "hsdp=4", "--time-limit", "10"])
        assert rows and all(row["degrees"]["dp"] == 8 for row in rows)  # 2 replicas of 4

    def test_a_launcher_without_hsdp_is_sent_to_one_that_runs_the_model(self):
        line = error_line(run_cli(["plan", LLAMA, *SHORT, "--fix", "hsdp=4", "--target", "meshtf"], expected_exit_code=2))
        hybrid = [name for name, target in TARGETS.items() if target.hsdp or target.hpz]  # deepspeed: ZeRO++'s hpZ
        assert line == (f"error: --fix hsdp: no listed launcher runs HSDP (meshtf); {', '.join(hybrid[:-1])} and "
                        f"{hybrid[-1]} do, e.g. --target {hybrid[0]} --fix hsdp=4")


def test_expert_parallelism_on_a_dense_model_is_refused_at_once():
    assert find_moe_layers(graph_loader(LLAMA, {"batch": 16, "seq": 128})(16)) == ()  # a dense Llama: no experts
    line = error_line(run_cli(["plan", LLAMA, *SHORT, "--fix", "ep=2"], expected_exit_code=2))
    assert line == ("error: --fix ep=2 splits the experts of a Mixture-of-Experts model, and llama_tiny has no experts "
                    "(no routed MoE layer found): drop ep")


@pytest.mark.parametrize("key", ["precision", "dtype", "fp8"])
def test_fix_precision_points_at_dtype(key):
    line = error_line(run_cli(["plan", LLAMA, *SHORT, "--fix", f"{key}=fp8"], expected_exit_code=2))
    assert line == f"error: --fix does not pin {key}: give it with --dtype, e.g. --dtype fp8 (or --dtype bf16,fp8 to search both)"


def test_compare_of_two_model_files_is_refused(tmp_path):
    paths = []
    for model in (LLAMA, GPT2):
        path = tmp_path / f"{model.stem}.json"
        # 2 devices: the refusal reads only the files' digests (a launchable row with stages is all --top needs)
        run_cli(["plan", model, *SHORT, "-n", "2", "--target", "megatron", "--time-limit", "5", "--pick", 1,
                 "--export", "generic", "-o", path])
        paths.append(path)
    shas = [json.loads(p.read_text())["model"]["sha256"] for p in paths]
    assert shas[0] != shas[1]
    line = error_line(run_cli(["compare", *paths], expected_exit_code=2))
    assert line == (f"error: the two plans are of different model files, llama_tiny (sha256 {shas[0][:12]}) vs "
                    f"gpt2_tiny (sha256 {shas[1][:12]}); compare plans of one model")
    run_cli(["compare", paths[0], paths[0]])  # one model: compared
    # --top on a plan of the launchable table lists each stage's ops (tests/planner/test_explain_stage_ops.py)
    result = run_cli(["explain", paths[0], "--top", 3])
    assert "Stage 0 by op" in result.stdout and "warning" not in result.stderr


def test_unknown_device_suggests_the_presets_of_its_chip():
    h100s = sorted(name for name in DEVICE_PRESETS if name.startswith("h100-"))
    assert h100s == ["h100-pcie", "h100-sxm", "h100-sxm-96gb-500w"]  # a100-80gb is nearer by spelling alone
    line = error_line(run_cli(["plan", LLAMA, *SHORT, "--device", "h100-80gb"], expected_exit_code=2))
    assert line.startswith("error: unknown device 'h100-80gb' (did you mean h100-sxm or h100-pcie?); use one of ")
    line = error_line(run_cli(["plan", LLAMA, *SHORT, "--device", "tpu"], expected_exit_code=2))
    assert line.startswith("error: unknown device 'tpu'; use one of ")


def test_plan_help_names_every_fix_key_and_launcher():
    from planner.core.degrees import PIN_KEYS

    text = " ".join(run_cli(["plan", "--help"], expected_exit_code=0).stdout.split())
    text = text.replace("│", " ")
    text = " ".join(text.split())
    for key in PIN_KEYS:
        assert f" {key}" in text
    assert "tp_overlap" in text and "1,024 tokens" in text and "torchtitan)" in text
