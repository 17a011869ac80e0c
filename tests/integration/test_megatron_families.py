"""Issue 25 with megatron-core itself: the BERT family's exports are accepted by megatron-core 0.16.1's
TransformerConfig, the model they describe is BertModel's (pre-LN layers, the binary head exactly when
``--bert-no-binary-head`` is absent), and what the exporter refuses for Hugging Face's BERT (post-LN)
is what megatron-core cannot build."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_families import _export, _graph

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "exporters" / "data"


@pytest.mark.parametrize(("name", "binary", "dp", "tp", "sp"), [
    ("megatron_bert_tiny.onnx", False, 8, 1, False), ("megatron_bert_tiny.onnx", False, 2, 4, True),
    # the pooler reads the first token: the planner's sequence-parallel pattern has no split for it
    ("megatron_bert_binary_tiny.onnx", True, 8, 1, False), ("megatron_bert_binary_tiny.onnx", True, 2, 4, False),
])
def test_transformer_config_accepts_the_bert_exports(name, binary, dp, tp, sp):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    from tests.integration.make_megatron_bert import SIZES

    out = _export(_graph(DATA / name), dp, tp, sp)
    args = parse_megatron_args(out["args"])
    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert (config.num_layers, config.hidden_size, config.num_attention_heads, config.ffn_hidden_size) == (
        SIZES["layers"], SIZES["hidden"], SIZES["heads"], SIZES["ffn"])
    assert config.add_bias_linear and not config.gated_linear_unit and config.normalization == "LayerNorm"
    assert config.tensor_model_parallel_size == tp and config.sequence_parallel == sp
    # pretrain_bert.py: add_binary_head=args.bert_binary_head, the store_false of --bert-no-binary-head
    assert (not args.get("bert-no-binary-head")) == binary


def test_bert_model_is_what_the_exporter_assumes():
    pytest.importorskip("megatron.core")
    from megatron.core.models.bert import bert_layer_specs, bert_lm_head, bert_model
    from megatron.core.transformer import transformer_layer
    from megatron.core.transformer.identity_op import IdentityOp

    params = inspect.signature(bert_model.BertModel.__init__).parameters
    assert {"add_binary_head", "num_tokentypes", "share_embeddings_and_output_weights"} <= set(params)
    spec = bert_layer_specs.bert_layer_local_spec.submodules
    assert spec.input_layernorm is not IdentityOp and spec.pre_mlp_layernorm is not IdentityOp  # pre-LN
    # BertLMHead: dense, gelu, layer norm (the transform the exporter requires before the vocabulary)
    head = inspect.getsource(bert_lm_head.BertLMHead.forward)
    assert head.index("self.dense") < head.index("self.gelu") < head.index("self.layer_norm")


def test_megatron_core_cannot_build_post_ln():
    """TransformerConfig has apply_residual_connection_post_layernorm, but no megatron-core module reads
    it: TransformerLayer always adds the residual to the un-normalised input, so the Hugging Face BERT's
    post-LN is refused."""
    pytest.importorskip("megatron.core")
    import megatron.core as core

    readers = [p for p in Path(core.__file__).parent.rglob("*.py")
               if "apply_residual_connection_post_layernorm" in p.read_text(errors="ignore")
               and p.name != "transformer_config.py"]
    assert readers == []


def test_megatron_core_has_no_alibi():
    """The ALiBi refusal (exporters/megatron/families.py) holds: GPTModel's position embeddings are
    learned_absolute, rope, mrope, yarn or none, and no megatron-core 0.16.1 module mentions ALiBi."""
    pytest.importorskip("megatron.core")
    import typing

    import megatron.core as core
    from megatron.core.models.gpt.gpt_model import GPTModel

    choices = typing.get_args(inspect.signature(GPTModel.__init__).parameters["position_embedding_type"].annotation)
    assert set(choices) == {"learned_absolute", "rope", "mrope", "yarn", "none"}
    assert [p for p in Path(core.__file__).parent.rglob("*.py") if "alibi" in p.read_text(errors="ignore").lower()] == []
