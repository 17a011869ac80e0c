"""Issue 25 follow-up, with megatron-core 0.16.1 itself: why the Megatron export refuses a BERT whose
norms are RMSNorm (exporters/megatron/families.py, tests/exporters/test_megatron_bert_rmsnorm.py).

``BertLMHead`` builds its norm as ``FusedLayerNorm`` whenever Apex's fused layer norm imports
(``models/bert/bert_lm_head.py:10-11``), and ``FusedLayerNorm`` asserts ``normalization == "LayerNorm"``
before it touches Apex (``fusions/fused_layer_norm.py:66-68``). This environment has no Apex, so the
test stands one in (a module with the one name ``fused_layer_norm.py`` imports) and reloads the two
modules as an Apex environment loads them; without it the head falls back to ``WrappedTorchNorm``,
which does build ``torch.nn.RMSNorm`` (the refusal is for the Apex containers Megatron-LM runs in).
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest

pytestmark = pytest.mark.integration


def _config(normalization: str):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, normalization=normalization)


@pytest.fixture
def with_apex(monkeypatch):
    """megatron-core's norm modules as they load where Apex is installed; reloaded plain afterwards."""
    pytest.importorskip("megatron.core")
    from megatron.core.fusions import fused_layer_norm
    from megatron.core.models.bert import bert_lm_head

    apex = types.ModuleType("apex")
    normalization = types.ModuleType("apex.normalization")
    fused = types.ModuleType("apex.normalization.fused_layer_norm")
    fused.FusedLayerNormAffineFunction = object  # the one name fused_layer_norm.py imports from it
    for name, module in (("apex", apex), ("apex.normalization", normalization),
                         ("apex.normalization.fused_layer_norm", fused)):
        monkeypatch.setitem(sys.modules, name, module)
    importlib.reload(fused_layer_norm)
    importlib.reload(bert_lm_head)
    yield bert_lm_head
    monkeypatch.undo()
    importlib.reload(fused_layer_norm)
    importlib.reload(bert_lm_head)


def test_with_apex_bert_lm_head_cannot_build_rmsnorm(with_apex):
    from megatron.core.fusions.fused_layer_norm import FusedLayerNorm

    assert with_apex.LNImpl is FusedLayerNorm
    with pytest.raises(AssertionError, match=r"\(RMSNorm\) is not supported in FusedLayerNorm"):
        with_apex.BertLMHead(64, _config("RMSNorm"))


def test_fused_layer_norm_takes_layernorm_only():
    pytest.importorskip("megatron.core")
    from megatron.core.fusions.fused_layer_norm import FusedLayerNorm

    with pytest.raises(AssertionError, match=r"\(RMSNorm\) is not supported in FusedLayerNorm"):
        FusedLayerNorm(config=_config("RMSNorm"), hidden_size=64)


def test_without_apex_the_head_falls_back_to_torch_rmsnorm():
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.models.bert import bert_lm_head

    assert "apex" not in sys.modules
    head = bert_lm_head.BertLMHead(64, _config("RMSNorm"))
    assert isinstance(head.layer_norm, torch.nn.RMSNorm) and head.layer_norm.normalized_shape == (64,)
