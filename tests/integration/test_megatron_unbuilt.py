"""Issue 25 with megatron-core 0.16.1 and transformers themselves: what the Megatron exporter names first when it
refuses ALBERT and MPNet (``exporters/megatron/families.py``: ``_shared_layers``, ``_factorised_embedding``,
``_relative_bias``; unit tests in ``tests/exporters/test_megatron_unbuilt.py``) is what megatron-core cannot build.

* Cross-layer sharing: megatron-core's ``TransformerBlock`` of 2 layers holds two layers of weights, each its own,
  where transformers' ``AlbertForMaskedLM`` of the fixture's config holds one layer for its 2.
* Factorised embedding: ``LanguageModelEmbedding``'s word table is ``hidden_size`` wide; ALBERT's is
  ``embedding_size`` wide.
* Relative-position bias: of the model classes only ``T5Model`` takes ``position_embedding_type='relative'``.
"""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path

import pytest
from tests.integration.forked_python import run_python  # the build's python -c, torch and megatron-core imported once

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# tests/importers/make_outside_zoo.py's ALBERT (tests/data/outside_zoo/albert_dynamo_bare.onnx)
ALBERT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
              embedding_size=32, max_position_embeddings=128)

# megatron-core's TransformerBlock (local spec, as pretrain_bert.py / pretrain_gpt.py build without Transformer
# Engine) and LanguageModelEmbedding at tp=1 in a one-process gloo group; prints each layer's parameter count,
# whether the layers share any storage, and the embedding's shapes.
_BUILD = r"""
import json, sys, tempfile
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.core.transformer.transformer_config import TransformerConfig
a = json.loads(sys.argv[1])
config = TransformerConfig(num_layers=a["num_hidden_layers"], hidden_size=a["hidden_size"],
                           num_attention_heads=a["num_attention_heads"], ffn_hidden_size=a["intermediate_size"],
                           use_cpu_initialization=True)
block = TransformerBlock(config, get_gpt_layer_local_spec())
layers = [list(layer.parameters()) for layer in block.layers]
pointers = [{p.data_ptr() for p in ps} for ps in layers]
embedding = LanguageModelEmbedding(config, vocab_size=a["vocab_size"], max_sequence_length=a["max_position_embeddings"])
print(json.dumps({"layers": [sum(p.numel() for p in ps) for ps in layers], "shared": bool(pointers[0] & pointers[1]),
                  "embedding": {n: list(p.shape) for n, p in embedding.named_parameters()}}))
"""


@pytest.fixture(scope="module")
def megatron() -> dict:
    pytest.importorskip("megatron.core")
    out = run_python(_BUILD, json.dumps(ALBERT), cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def albert():
    transformers = pytest.importorskip("transformers")
    return transformers.AlbertForMaskedLM(transformers.AlbertConfig(**ALBERT))


def test_megatron_core_builds_every_layer_with_its_own_weights(megatron, albert) -> None:
    # one layer by hand: 2 norms (2 x 128), QKV 64 x 192 + 192, proj 64 x 64 + 64, fc1 64 x 128 + 128,
    # fc2 128 x 64 + 64 = 33,472
    assert megatron["layers"] == [33_472, 33_472] and not megatron["shared"]
    # ALBERT: the same 33,472 (q, k, v, dense 4 x 4,160, two norms, ffn 8,320, ffn_output 8,256) for both layers
    shared = sum(p.numel() for p in albert.albert.encoder.albert_layer_groups.parameters())
    assert shared == 33_472 == sum(megatron["layers"]) // 2


def test_megatron_core_embeds_at_the_hidden_width(megatron, albert) -> None:
    assert megatron["embedding"] == {"word_embeddings.weight": [1000, 64], "position_embeddings.weight": [128, 64]}
    assert list(albert.albert.embeddings.word_embeddings.weight.shape) == [1000, 32]
    assert list(albert.albert.encoder.embedding_hidden_mapping_in.weight.shape) == [64, 32]  # the projection


def test_only_t5_has_a_relative_position_bias() -> None:
    pytest.importorskip("megatron.core")
    from megatron.core.models.bert.bert_model import BertModel
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.models.T5.t5_model import T5Model

    def choices(cls) -> set[str]:
        return set(typing.get_args(inspect.signature(cls.__init__).parameters["position_embedding_type"].annotation))

    assert "relative" not in choices(GPTModel) | choices(BertModel)
    assert "relative" in choices(T5Model)
