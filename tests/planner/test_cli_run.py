"""`python -m planner.run`: bad plans and configs in one line (exit 2), how to launch it, the config
derived from the plan. Runs without torch; the cases that build models need the integration venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.core.errors import InputError
from planner.run import check_plan, config_from_plan, launch_command, main

ROOT = Path(__file__).resolve().parents[2]


def dtensor_plan(model: str) -> dict:
    """The 2 x 2 (dp, tp) DTensor plan of a tiny test model, exported as a user would (no torch needed)."""
    from tests.integration.plans import Case, make_plan

    plan, _ = make_plan(Case(model=model, dp=2, tp=2, vocab_embedding=True, vocab_head=model == "gpt2_tiny"))
    return plan


@pytest.fixture(scope="module")
def gpt2_plan() -> dict:
    return dtensor_plan("gpt2_tiny")


@pytest.fixture(scope="module")
def llama_plan() -> dict:
    return dtensor_plan("llama_tiny")


def run_main(args: list[str], capsys) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


class TestConfigFromPlan:
    """Checked against the configs the integration tests build these ONNX files' models from."""

    @pytest.mark.parametrize("model", ["gpt2_tiny", "llama_tiny"])
    def test_sizes_match_the_models_own_config(self, model, gpt2_plan, llama_plan):
        from tests.integration.configs import CONFIGS

        derived = config_from_plan(gpt2_plan if model == "gpt2_tiny" else llama_plan)
        truth = CONFIGS[model]
        # Llama's rotary positions hold no parameter: the plan cannot know the model's maximum, and its
        # own sequence length (16) is what the run needs
        keys = [k for k in truth if k not in ("bos_token_id", "eos_token_id", "max_position_embeddings")]
        assert {k: derived[k] for k in keys} == {k: truth[k] for k in keys}
        positions = derived.get("n_positions", derived.get("max_position_embeddings"))
        assert positions == (128 if model == "gpt2_tiny" else 16)  # GPT-2's wpe is [128, 64]

    def test_the_rotary_base_and_epsilon_come_from_the_file(self, gpt2_plan, llama_plan):
        """The configs the files were built with (tests/integration/configs.py) set neither, so transformers'
        defaults are the truth: LlamaConfig's rope_theta 10,000 and rms_norm_eps 1e-6, GPT2Config's
        layer_norm_epsilon 1e-5; the exporter reads them from the file's inv_freq and norms."""
        llama = config_from_plan(llama_plan)
        assert (llama["rope_theta"], llama["rms_norm_eps"]) == (10000.0, pytest.approx(1e-6, rel=1e-6))
        assert config_from_plan(gpt2_plan)["layer_norm_epsilon"] == pytest.approx(1e-5, rel=1e-6)
        theta = {**llama_plan, "model": {**llama_plan["model"], "rope_theta": 2_000_000.0, "norm_eps": 1e-5}}
        assert (config_from_plan(theta)["rope_theta"], config_from_plan(theta)["rms_norm_eps"]) == (2e6, 1e-5)
        unread = {**llama_plan, "model": {**llama_plan["model"], "rope_theta": None, "norm_eps": None}}
        assert "rope_theta" not in config_from_plan(unread) and "rms_norm_eps" not in config_from_plan(unread)

    def test_what_no_size_shows_is_refused(self, llama_plan):
        """Mistral's window (64 tokens, tests/zoo/zoo.json) is narrower than a 128-token sequence: a Llama config
        of its sizes would attend to the whole sequence, so the derived config is refused; at 32 tokens the
        window masks nothing and the plan runs."""
        from exporters import export
        from exporters.dtensor import rules as dtensor_rules
        from planner.plan import load_graph
        from tests.exporters.graphs import first_rows, make_input, spaces_for

        for seq, beyond in ((128, ["sliding-window attention (64 tokens, narrower than the sequence)"]), (32, [])):
            graph = load_graph(ROOT / "tests" / "zoo" / "mistral_ts_consts.onnx", {"batch": 2, "seq": seq})
            spaces = spaces_for(graph, 2)
            family = dtensor_rules.families(graph, spaces, devices=2, devices_per_node=2, pp=1)[0]
            plan = export("dtensor", make_input(graph, spaces, first_rows(family.masks)))
            assert plan["model"]["beyond_sizes"] == beyond
        with pytest.raises(InputError, match=r"^the plan's model has sliding-window attention \(64 tokens, narrower "
                                             r"than the sequence\), which a config derived from its sizes would not "
                                             r"compute; pass --config CONFIG.json"):
            config_from_plan({**llama_plan, "model": {**llama_plan["model"], "beyond_sizes": beyond or [
                "sliding-window attention (64 tokens, narrower than the sequence)"]}})

    @pytest.mark.parametrize(("name", "beyond"), [
        # tests/importers/make_rotary_cases.py: SmolLM3 with no_rope_layer_interval 2 (layers 1 and 3 of 4 skip
        # RoPE) and with no_rope_layers [1, 0, 1, 1]; Llama with rope_type llama3 (factor 8)
        ("smollm3_ts_consts.onnx", "rotary positions on some layers only (2 of 4)"),
        ("smollm3_list_ts_consts.onnx", "rotary positions on some layers only (3 of 4)"),
        ("llama31_ts_consts.onnx", "rotary frequencies that are not one geometric series (a scaled RoPE)"),
    ])
    def test_rotary_no_config_of_its_sizes_computes_is_said(self, name, beyond):
        from exporters.dtensor.export import _model_section
        from importers.transformer import analyze_transformer
        from planner.plan import load_graph

        graph = load_graph(ROOT / "tests" / "data" / "rotary_cases" / name, {"batch": 2, "seq": 32})
        assert _model_section(analyze_transformer(graph), graph)["beyond_sizes"] == [beyond]

    def test_qwen3_per_head_qk_norms_give_a_qwen3_config(self):
        """A Llama config would drop Qwen3's q_norm/k_norm (the run then failed inside the job); the oracle is the
        fixture's own config (tests/integration/make_qk_norm_fixtures.py COMMON, Qwen3Config's defaults beside it)."""
        from tests.integration.make_qk_norm_fixtures import COMMON

        from tests.integration.plans import qk_norm_plan

        config = config_from_plan(qk_norm_plan("qwen3_tiny"))
        assert config["model_type"] == "qwen3" and config["attention_bias"] is False
        keys = [k for k in COMMON if k != "max_position_embeddings"]  # the plan's sequence (16), as for Llama
        assert {k: config[k] for k in keys} == {k: COMMON[k] for k in keys}

    def test_qk_norms_of_another_kind_are_refused(self):
        from tests.integration.plans import qk_norm_plan

        plan = qk_norm_plan("qwen3_tiny")
        widened = {key: {**entry, "shape": [128]} if entry["name"].endswith("q_norm.weight") else entry
                   for key, entry in plan["params"].items()}  # OLMo-2's norm spans the whole projection
        with pytest.raises(InputError, match=r"^the plan's model normalises queries and keys \(.*q_norm.weight: "
                                             r"\[128\]\) in a way no config derived here computes"):
            config_from_plan({**plan, "params": widened})

    def test_gpt2_inner_size_is_four_times_hidden(self, gpt2_plan):
        assert config_from_plan(gpt2_plan)["n_inner"] == 4 * 64  # GPT-2's MLP: 4 x n_embd

    def test_unknown_family_and_missing_model(self, gpt2_plan):
        plan = {**gpt2_plan, "params": {"w": {"name": "encoder.block.0.weight", "shape": [4, 4], "aliases": []}}}
        with pytest.raises(InputError, match="pass --config"):
            config_from_plan(plan)
        with pytest.raises(InputError, match="records no model sizes"):
            config_from_plan({**gpt2_plan, "model": None})

    def test_launch_command_names_the_plans_process_count(self, gpt2_plan):
        assert launch_command(gpt2_plan, Path("my plan.json"), []) == (
            "torchrun --nproc-per-node 4 -m planner.run 'my plan.json'"
        )
        two_nodes = {**gpt2_plan, "world_size": 16, "nproc_per_node": 8}
        assert "--nproc-per-node 8 --nnodes 2 " in launch_command(two_nodes, Path("p.json"), [])


class TestBadInput:
    def test_mistyped_plans(self, gpt2_plan):
        for key, value, needle in [
            ("world_size", "4", "world_size must be an int"),
            ("target", "megatron", "a megatron plan"),
            ("mesh", {"shape": [2, 3], "dim_names": ["dp", "tp"]}, "does not hold its world_size 4"),
            ("params", [], "params must be a dict"),
        ]:
            with pytest.raises(InputError, match=needle):
                check_plan({**gpt2_plan, key: value})
        with pytest.raises(InputError, match="has no 'tp_plan'"):
            check_plan({k: v for k, v in gpt2_plan.items() if k != "tp_plan"})

    @pytest.mark.parametrize("text, needle", [
        ("not json", "is not JSON"),
        ("[" * 100_000, "nested too deeply"),
        ('{"target": "dtensor", "world_size": NaN}', "is not JSON (NaN"),
        ("[1, 2]", "not a JSON object"),
    ])
    def test_bad_plan_files_one_line_exit_2(self, tmp_path, capsys, text, needle):
        path = tmp_path / "plan.json"
        path.write_text(text)
        code, err = run_main([path], capsys)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1

    def test_missing_plan_and_fifo(self, tmp_path, capsys):
        code, err = run_main([tmp_path / "none.json"], capsys)
        assert code == 2 and "does not exist" in err
        fifo = tmp_path / "fifo.json"
        os.mkfifo(fifo)
        code, err = run_main([fifo], capsys)
        assert code == 2 and "not a regular file" in err

    def test_bad_config_file(self, tmp_path, capsys, gpt2_plan):
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(gpt2_plan))
        config = tmp_path / "config.json"
        config.write_text('{"n_layer": 2}')
        code, err = run_main([plan, "--config", config], capsys)
        assert code == 2 and "has no 'model_type'" in err


class TestWriteConfig:
    def test_writes_the_derived_config_without_torch(self, tmp_path, capsys, llama_plan):
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(llama_plan))
        out = tmp_path / "config.json"
        code, err = run_main([plan, "--write-config", out], capsys)
        assert code == 0 and json.loads(out.read_text()) == config_from_plan(llama_plan)
        assert f"torchrun --nproc-per-node 4 -m planner.run {plan} --config {out}" in err
        code, err = run_main([plan, "--write-config", out], capsys)
        assert code == 2 and "pass --force" in err
        link = tmp_path / "link.json"
        link.symlink_to(tmp_path / "elsewhere.json")
        code, err = run_main([plan, "--write-config", link, "--force"], capsys)
        assert code == 2 and "symbolic link" in err and not (tmp_path / "elsewhere.json").exists()


def test_without_torch_says_to_install_it(tmp_path, gpt2_plan):
    """In the planner's own environment (no torch), a plan that is fine still needs torch: exit 2."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(gpt2_plan))
    code = "import sys; sys.modules['torch'] = None; from planner.run import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, str(plan)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "pip install torch==2.13.0" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


class TestWithTorch:
    @pytest.fixture(autouse=True)
    def _torch(self):
        pytest.importorskip("torch")
        pytest.importorskip("transformers")

    @pytest.mark.parametrize("model", ["gpt2_tiny", "llama_tiny"])
    def test_bare_run_names_the_torchrun_command(self, tmp_path, capsys, model, gpt2_plan, llama_plan, monkeypatch):
        monkeypatch.delenv("RANK", raising=False)
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(gpt2_plan if model == "gpt2_tiny" else llama_plan))
        code, err = run_main([plan], capsys)  # the derived config passed the meta-device shape check first
        assert code == 2 and f"run: torchrun --nproc-per-node 4 -m planner.run {plan}" in err

    def test_config_of_another_model_is_one_line(self, tmp_path, capsys, gpt2_plan, llama_plan, monkeypatch):
        monkeypatch.delenv("RANK", raising=False)
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(llama_plan))
        config = tmp_path / "config.json"
        config.write_text(json.dumps(config_from_plan(gpt2_plan)))
        code, err = run_main([plan, "--config", config], capsys)
        assert code == 2 and "does not build the plan's model" in err and len(err.strip().splitlines()) == 1
