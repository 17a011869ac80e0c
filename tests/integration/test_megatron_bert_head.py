"""Issue 25 with the libraries themselves: what ``tests/exporters/test_megatron_post_ln.py`` and
``tests/importers/test_post_ln_cases.py`` assume of megatron-core 0.16.1, transformers 5.24 and torch.

* megatron-core's ``BertLMHead`` computes ``LayerNorm(F.gelu(dense(x)))`` with erf GELU even when
  ``TransformerConfig.activation_func`` is the tanh approximation (``models/bert/bert_lm_head.py:42``), so no
  flag exports a head with tanh GELU exactly: it is trained as erf with a note, as a tanh-GELU MLP is;
* transformers' ``BertPredictionHeadTransform`` applies ``ACT2FN[config.hidden_act]``: ``gelu_new`` and
  ``gelu_pytorch_tanh`` give the tanh approximation, which differs from megatron's head;
* ELECTRA, ALBERT and ``torch.nn.Transformer`` (``norm_first=False``) are post-LN, ELECTRA and ALBERT with a
  linear from ``embedding_size`` to ``hidden_size`` before the first layer.
"""

from __future__ import annotations

import functools
import inspect

import pytest

pytestmark = pytest.mark.integration

HIDDEN = 64


def _tanh_gelu():
    import torch.nn.functional as F

    return functools.partial(F.gelu, approximate="tanh")


def test_bert_lm_head_applies_erf_gelu_whatever_the_config() -> None:
    pytest.importorskip("megatron.core")
    import torch
    import torch.nn.functional as F
    from megatron.core.models.bert.bert_lm_head import BertLMHead
    from megatron.core.transformer.transformer_config import TransformerConfig

    # persist_layer_norm off: without Apex the head's norm is WrappedTorchNorm, which asserts it (torch_norm.py:30)
    config = TransformerConfig(num_layers=2, hidden_size=HIDDEN, num_attention_heads=4, persist_layer_norm=False,
                               activation_func=_tanh_gelu())
    torch.manual_seed(0)
    head = BertLMHead(HIDDEN, config)
    x = torch.randn(2, 16, HIDDEN) * 3
    with torch.no_grad():
        dense = head.dense(x)
        norm = functools.partial(F.layer_norm, normalized_shape=(HIDDEN,), weight=head.layer_norm.weight,
                                 bias=head.layer_norm.bias, eps=config.layernorm_epsilon)
        out, erf, tanh = head(x), norm(F.gelu(dense)), norm(_tanh_gelu()(dense))
    assert torch.equal(out, erf)
    assert (out - tanh).abs().max().item() > 1e-4  # 1.07e-3 on this draw: a different model, not rounding


@pytest.mark.parametrize("act", ["gelu_new", "gelu_pytorch_tanh"])
def test_hugging_face_bert_head_follows_hidden_act(act: str) -> None:
    transformers = pytest.importorskip("transformers")
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=1000, hidden_act=act)
    transform = transformers.BertForMaskedLM(config).eval().cls.predictions.transform
    x = torch.randn(2, 16, HIDDEN) * 3
    with torch.no_grad():
        dense = transform.dense(x)
        out = transform(x)
        tanh, erf = transform.LayerNorm(_tanh_gelu()(dense)), transform.LayerNorm(F.gelu(dense))
    torch.testing.assert_close(out, tanh, rtol=0, atol=1e-6)  # gelu_new's own formula: equal up to rounding
    assert (out - erf).abs().max().item() > 1e-4


def test_electra_albert_and_nn_transformer_are_post_ln() -> None:
    transformers = pytest.importorskip("transformers")
    import torch
    from transformers.models.albert import modeling_albert
    from transformers.models.electra import modeling_electra

    sizes = dict(hidden_size=HIDDEN, embedding_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, vocab_size=1000)
    electra = transformers.ElectraModel(transformers.ElectraConfig(**sizes))
    albert = transformers.AlbertModel(transformers.AlbertConfig(**sizes))
    # the linear between the embedding norm and the first layer (what the old rule took for pre-LN)
    assert (electra.embeddings_project.in_features, electra.embeddings_project.out_features) == (32, HIDDEN)
    mapping = albert.encoder.embedding_hidden_mapping_in
    assert (mapping.in_features, mapping.out_features) == (32, HIDDEN)
    # ElectraSelfOutput: LayerNorm(dropout(dense(h)) + input), computed here from its parts
    out = electra.eval().encoder.layer[0].attention.output
    h, x = torch.randn(2, 16, HIDDEN), torch.randn(2, 16, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(out(h, x), out.LayerNorm(out.dense(h) + x), rtol=0, atol=0)
    # ALBERT: both sums normalised (transformers 5.24 modeling_albert.py)
    assert "self.LayerNorm(hidden_states + attn_output)" in inspect.getsource(modeling_albert.AlbertAttention.forward)
    assert "self.full_layer_layer_norm(ffn_output + attention_output)" in inspect.getsource(
        modeling_albert.AlbertLayer.forward)
    assert "LayerNorm(hidden_states + input_tensor)" in inspect.getsource(modeling_electra.ElectraOutput.forward)
    # examples/make_examples.py's nn_transformer_ts keeps norm_first's default: x = norm1(x + sa(x))
    for layer in (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer):
        assert inspect.signature(layer).parameters["norm_first"].default is False
