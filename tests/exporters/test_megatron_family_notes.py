"""Issue 25: what a Megatron export needs or trains differently, said in its notes (exporters/megatron/families.py,
``family_notes``): a BERT export needs Apex, and a tanh-GELU MLP is trained as erf GELU.

megatron-core 0.16.1's ``BertLMHead`` norm is Apex's ``FusedLayerNorm`` where Apex imports and
``WrappedTorchNorm`` elsewhere (``models/bert/bert_lm_head.py:10-16``); ``WrappedTorchNorm`` asserts
``layernorm_zero_centered_gamma``, ``persist_layer_norm`` and ``sequence_parallel`` off
(``transformer/torch_norm.py:26-32``), and Megatron-LM turns ``persist_layer_norm`` on unless
``--no-persist-layer-norm``. So a BERT export with ``--sequence-parallel`` runs only with Apex, and one
without it needs ``--no-persist-layer-norm`` where Apex is missing. tests/integration/test_megatron_family_notes.py
builds the head with megatron-core itself.

GPT-2's MLP is GELU's tanh approximation (``gelu_new``); Megatron-LM's core models compute ``F.gelu`` (erf),
as ``core_transformer_config_from_args`` maps no flag to the tanh form. The two differ by at most 4.7e-4
(at x = -2.70: 0.5 x (1 + erf(x / sqrt 2)) = -0.009361 and the tanh form -0.008888, by hand from the formulas;
the integration test measures it with torch).
"""

from __future__ import annotations

import pytest

from exporters.megatron.families import FamilyExport, family_notes
from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron_families import DATA, ROOT, _export, _graph

GELU_NOTE = "the model's MLP uses GELU's tanh approximation"


@pytest.fixture(scope="module")
def bert():
    return _graph(DATA / "megatron_bert_tiny.onnx")


def _apex_notes(out: dict) -> list[str]:
    return [n for n in out["notes"] if n.startswith("needs Apex")]


@pytest.mark.parametrize(("dp", "tp"), [(2, 4), (1, 4)])
def test_sequence_parallel_bert_export_says_it_needs_apex(bert, dp, tp):
    out = _export(bert, dp, tp, sp=True)
    args = parse_megatron_args(out["args"])
    # dp x tp = the 8 or 4 devices asked for, all of them tensor-parallel in groups of 4
    assert (out["model_family"], args["tensor-model-parallel-size"], args.get("sequence-parallel")) == ("bert", 4, True)
    assert out["world_size"] == dp * tp
    (note,) = _apex_notes(out)
    assert "asserts --sequence-parallel off" in note and "torch_norm.py:26-32" in note
    assert "fails when BertLMHead is built" in note


def test_plain_bert_export_names_the_flag_that_runs_it_without_apex(bert):
    out = _export(bert, 8, 1)
    assert parse_megatron_args(out["args"]).get("sequence-parallel") is None
    (note,) = _apex_notes(out)
    assert note.endswith("without Apex add --no-persist-layer-norm (megatron-core 0.16.1 transformer/torch_norm.py:30)")


def test_layernorm_1p_alone_is_named_and_both_flags_together():
    bert = FamilyExport(family="bert", script="pretrain_bert.py", args=("--apply-layernorm-1p",))
    (one,) = family_notes(bert, ["--apply-layernorm-1p"])
    (both,) = family_notes(bert, ["--sequence-parallel", "--tensor-model-parallel-size", "2", "--apply-layernorm-1p"])
    assert "asserts --apply-layernorm-1p off" in one
    assert "asserts --sequence-parallel and --apply-layernorm-1p off" in both


@pytest.mark.parametrize("family", ["gpt", "t5", "mamba"])
def test_other_families_need_no_apex(family):
    # under --transformer-impl transformer_engine (the default) their specs build every norm with TE: TENorm or
    # TELayerNormColumnParallelLinear (megatron-core 0.16.1 models/T5/t5_spec.py:86-130, gpt_layer_specs.py,
    # models/mamba/mamba_layer_specs.py, ssm/mamba_block.py:166); only BertLMHead picks Apex or torch
    assert family_notes(FamilyExport(family=family, script="x.py"), ["--sequence-parallel"]) == []


@pytest.mark.parametrize(("name", "noted"), [
    ("gpt2_dynamo_consts", True), ("gpt2_ts_consts", True),  # GPT2Config.activation_function = "gelu_new"
    ("llama_dynamo_consts", False),  # SwiGLU: --swiglu, exact
])
def test_tanh_gelu_is_named(name, noted):
    out = _export(_graph(ROOT / "tests" / "zoo" / f"{name}.onnx"), 2, 4)
    notes = [n for n in out["notes"] if n.startswith(GELU_NOTE)]
    assert len(notes) == int(noted)
    assert not noted or notes[0].endswith("differ by at most 4.7e-4, at x = -2.70")


def test_erf_gelu_bert_has_no_gelu_note(bert):
    # make_megatron_bert.py's MLP is torch.nn.functional.gelu (erf), Megatron's own
    assert not any(n.startswith(GELU_NOTE) for n in _export(bert, 8, 1)["notes"])
