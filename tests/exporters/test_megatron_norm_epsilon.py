"""The Megatron export says the file's norm epsilon (``--norm-epsilon``) when it is not Megatron-LM's
default 1e-5 (megatron-core 0.16.1 ``TransformerConfig.layernorm_epsilon``), refuses norms whose
epsilons differ, and notes a file that does not hold it.

The expected epsilons are the transformers 5.24 config defaults the zoo was built with (tests/zoo/make_zoo.py
sets none): ``LlamaConfig.rms_norm_eps``, ``MistralConfig.rms_norm_eps`` and ``Qwen2Config.rms_norm_eps`` are
1e-6, ``GPT2Config.layer_norm_epsilon`` is 1e-5.
"""

from __future__ import annotations

import pytest

from exporters.megatron import families
from exporters.validate import parse_megatron_args
from planner.core.errors import UnsupportedExport
from tests.exporters.test_megatron_families import ROOT, _export, _graph

ZOO = ROOT / "tests" / "zoo"


def _epsilon_args(out: dict) -> list[str]:
    args = out["args"]
    return [args[i + 1] for i, a in enumerate(args) if a == "--norm-epsilon"]


@pytest.mark.parametrize("name", ["llama_ts_consts", "llama_dynamo_consts", "mistral_ts_consts", "qwen2_dynamo_consts"])
def test_a_1e6_model_says_its_epsilon(name):
    out = _export(_graph(ZOO / f"{name}.onnx"), 2, 4)
    assert _epsilon_args(out) == ["1e-06"]
    assert "norm epsilon 1e-06, read from the graph" in out["notes"]


def test_a_file_without_its_epsilon_says_so():
    # a dynamo export saved with every initializer external (the zoo's "bare" style) keeps RMSNorm's
    # epsilon constant outside the graph: nothing to read, the default applies, and the note says so
    out = _export(_graph(ZOO / "llama_dynamo_bare.onnx"), 2, 4)
    assert _epsilon_args(out) == []
    assert "the norms' epsilon is not in the file: Megatron-LM's --norm-epsilon 1e-05 applies; set your model's" in out["notes"]


@pytest.mark.parametrize("name", ["gpt2_ts_consts", "gpt2_dynamo_bare"])
def test_the_default_epsilon_is_not_repeated(name):
    out = _export(_graph(ZOO / f"{name}.onnx"), 2, 4)
    assert _epsilon_args(out) == []
    assert not any("epsilon" in note for note in out["notes"])


def test_the_flag_passes_megatron_lms_parser_rules():
    out = _export(_graph(ZOO / "qwen2_ts_consts.onnx"), 8, 1)
    parsed = parse_megatron_args(out["args"])
    assert float(parsed["norm-epsilon"]) == pytest.approx(1e-6)


def test_norms_with_different_epsilons_are_refused(monkeypatch):
    monkeypatch.setattr(families, "layer_norm_epsilons", lambda graph: (1e-6, 1e-5))
    with pytest.raises(UnsupportedExport, match=r"its norms' epsilons differ \(1e-06, 1e-05\)"):
        families.norm_epsilon_args(_graph(ZOO / "llama_ts_consts.onnx"))


def test_an_unread_epsilon_is_noted(monkeypatch):
    monkeypatch.setattr(families, "layer_norm_epsilons", lambda graph: None)
    args, note = families.norm_epsilon_args(_graph(ZOO / "llama_ts_consts.onnx"))
    assert args == [] and "--norm-epsilon 1e-05 applies; set your model's" in note
