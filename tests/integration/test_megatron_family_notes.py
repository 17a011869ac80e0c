"""Issue 25, with megatron-core 0.16.1 itself: why a Megatron BERT export says it needs Apex, and why a
GPT-2 export says its GELU changes (exporters/megatron/families.py ``family_notes``;
tests/exporters/test_megatron_family_notes.py).

The exported flags go through megatron-core's ``TransformerConfig`` as Megatron-LM's
``core_transformer_config_from_args`` maps them (``persist_layer_norm = not --no-persist-layer-norm``),
and ``BertLMHead`` is built from that config: without Apex (this environment) its norm is
``WrappedTorchNorm``, which refuses the default ``persist_layer_norm`` and sequence parallelism; with
Apex stood in (tests/integration/test_megatron_bert_rmsnorm.py's ``with_apex``) it is ``FusedLayerNorm``,
which builds and marks its weights sequence-parallel.

GPT-2's export, through the same ``TransformerConfig``, gets megatron-core's default activation, ``F.gelu``
(erf); transformers' ``gelu_new`` (GPT-2's) differs from it by 4.7e-4 at most, measured on a grid with torch.
"""

from __future__ import annotations

import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_families import DATA, _export, _graph
from tests.integration.test_megatron_bert_rmsnorm import with_apex  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def _config(out: dict, *, no_persist: bool = False):
    """megatron-core's TransformerConfig of an export, with Megatron-LM's persist_layer_norm mapping."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = parse_megatron_args(out["args"] + (["--no-persist-layer-norm"] if no_persist else []))
    return TransformerConfig(**_transformer_config_kwargs(args), persist_layer_norm=not args.get("no-persist-layer-norm"))


@pytest.fixture(scope="module")
def exports():
    pytest.importorskip("megatron.core")
    graph = _graph(DATA / "megatron_bert_tiny.onnx")
    return {"sp": _export(graph, 2, 4, sp=True), "plain": _export(graph, 8, 1)}


def test_without_apex_the_sequence_parallel_export_cannot_build_its_head(exports):
    from megatron.core.models.bert import bert_lm_head

    assert any(n.startswith("needs Apex") for n in exports["sp"]["notes"])
    config = _config(exports["sp"], no_persist=True)
    assert (config.tensor_model_parallel_size, config.sequence_parallel) == (4, True)
    with pytest.raises(AssertionError, match="sequence parallel not supported by torch LayerNorm"):
        bert_lm_head.BertLMHead(64, config)


def test_without_apex_the_plain_export_needs_no_persist_layer_norm(exports):
    import torch
    from megatron.core.models.bert import bert_lm_head

    with pytest.raises(AssertionError, match="persist_layer_norm not supported by torch LayerNorm"):
        bert_lm_head.BertLMHead(64, _config(exports["plain"]))
    head = bert_lm_head.BertLMHead(64, _config(exports["plain"], no_persist=True))  # as the note says
    assert isinstance(head.layer_norm, torch.nn.LayerNorm) and head.layer_norm.normalized_shape == (64,)


def test_with_apex_the_sequence_parallel_export_builds(exports, with_apex):  # noqa: F811
    from megatron.core.fusions.fused_layer_norm import FusedLayerNorm

    head = with_apex.BertLMHead(64, _config(exports["sp"]))
    # hidden 64 is not a persistent-kernel size, so FusedLayerNorm takes Apex's plain fused kernel
    assert isinstance(head.layer_norm, FusedLayerNorm) and not head.layer_norm.persist_layer_norm
    assert head.layer_norm.weight.sequence_parallel is True and head.layer_norm.weight.shape == (64,)


def test_gpt2_export_trains_erf_gelu_within_the_noted_bound():
    pytest.importorskip("transformers")
    import torch
    import torch.nn.functional as F
    from transformers.activations import ACT2FN

    from tests.exporters.test_megatron_families import ROOT

    out = _export(_graph(ROOT / "tests" / "zoo" / "gpt2_dynamo_consts.onnx"), 2, 4)
    assert any(n.endswith("differ by at most 4.7e-4, at x = -2.70") for n in out["notes"])
    config = _config(out)
    assert config.activation_func is F.gelu and not config.gated_linear_unit
    x = torch.linspace(-10, 10, 200_001, dtype=torch.float64)
    diff = (config.activation_func(x) - ACT2FN["gelu_new"](x)).abs()
    assert diff.max().item() == pytest.approx(4.73e-4, abs=5e-7) and x[diff.argmax()].item() == pytest.approx(-2.70, abs=0.01)
