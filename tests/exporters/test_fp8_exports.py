"""FP8 rows as the launchers take them (issue 24 item 3): Megatron-LM's Transformer Engine flags, torchtitan
0.3's Float8LinearConverter in the registry module, and the one-line refusals of the launchers without FP8."""

from __future__ import annotations

import ast

import pytest

from exporters import export
from exporters.megatron import megatron_masks
from exporters.megatron.fp8 import AMAX_HISTORY_LEN, megatron_fp8_args
from exporters.megatron.validate import megatron_violations, parse_megatron_args
from exporters.targets import TARGETS
from exporters.torchtitan import torchtitan_masks
from objectives import precision
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import first_rows, gpt_graph, llama_graph, make_cluster, make_input, spaces_for

DELAYED = TrainingSettings(fp8="delayed")
ROWWISE = TrainingSettings(fp8="rowwise", zero_stage=3)


def _input(graph, masks_fn, settings, dp=2, tp=2):
    spaces = spaces_for(graph, dp * tp)
    choice = first_rows(masks_fn(graph, spaces, dp=dp, tp=tp))
    return make_input(graph, spaces, choice, cluster=make_cluster(1, dp * tp), settings=settings)


class TestMegatron:
    def test_fp8_flags_on_top_of_bf16(self):
        out = export("megatron", _input(gpt_graph(), megatron_masks, DELAYED))
        a = parse_megatron_args(out["args"])
        assert a["bf16"] and a["fp8-format"] == "hybrid" and a["fp8-recipe"] == "delayed"
        assert a["fp8-amax-history-len"] == 1024 and a["fp8-amax-compute-algo"] == "max"
        assert any("transformer-engine" in note for note in out["notes"])
        bf16 = export("megatron", _input(gpt_graph(), megatron_masks, TrainingSettings()))
        assert "fp8-format" not in parse_megatron_args(bf16["args"])

    def test_priced_history_is_exported(self):
        assert AMAX_HISTORY_LEN == precision.AMAX_HISTORY_LEN

    def test_validator_rules(self):
        base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
                "--max-position-embeddings", "128", "--micro-batch-size", "1", "--bf16"]
        assert megatron_violations(base + megatron_fp8_args("delayed"), world_size=1) == []
        assert megatron_violations(base + ["--fp8-recipe", "delayed"], world_size=1) == ["--fp8-recipe needs --fp8-format"]
        assert any("Blackwell" in v for v in megatron_violations(
            base + ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], world_size=1))
        assert any("Delayed scaling" in v for v in megatron_violations(
            base + megatron_fp8_args("delayed") + ["--recompute-granularity", "selective", "--recompute-modules",
                                                   "layernorm"], world_size=1))

    def test_rowwise_is_not_megatrons(self):
        with pytest.raises(UnsupportedExport, match="delayed scaling"):
            megatron_fp8_args("rowwise")


class TestTorchtitan:
    def test_converter_in_the_registry_module(self):
        out = export("torchtitan", _input(llama_graph(), torchtitan_masks, ROWWISE))
        text = out["config_file"]["text"]
        ast.parse(text)  # the module the launch imports is Python
        assert "Float8LinearConverter.Config(recipe_name='rowwise', filter_fqns=[\"lm_head\"]" in text
        assert text.index("converter.build().convert(model)") < text.index("config.model_spec = ")
        assert any("torchao" in note for note in out["notes"])
        plain = export("torchtitan", _input(llama_graph(), torchtitan_masks, TrainingSettings(zero_stage=3)))
        assert "Float8" not in plain["config_file"]["text"]

    def test_delayed_is_not_torchtitans(self):
        with pytest.raises(UnsupportedExport, match="rowwise"):
            export("torchtitan", _input(llama_graph(), torchtitan_masks, TrainingSettings(fp8="delayed", zero_stage=3)))


class TestRefusals:
    @pytest.mark.parametrize("target, reason", [("deepspeed", "no native FP8"), ("dtensor", "Float8Linear"),
                                                ("meshtf", "no FP8 data type")])
    def test_one_line(self, target, reason):
        with pytest.raises(UnsupportedExport, match=reason) as caught:
            export(target, _input(gpt_graph(), megatron_masks, DELAYED, dp=4, tp=1))
        assert "\n" not in str(caught.value)

    def test_rules_agree(self):
        # the registry's recipe decides which launchers list an FP8 row
        assert {n: t.fp8 for n, t in TARGETS.items() if t.fp8} == {"megatron": "delayed", "torchtitan": "rowwise"}
        assert not TARGETS["deepspeed"].runs_precision(DELAYED) and TARGETS["generic"].runs_precision(DELAYED)
