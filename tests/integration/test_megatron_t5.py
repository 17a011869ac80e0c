"""Issue 25 with megatron-core itself: the T5 family's exports (exporters/megatron/t5.py) are accepted by
megatron-core 0.16.1's TransformerConfig, and the T5Model its flags build has exactly the fixture's
parameters (tests/integration/make_megatron_t5.py); what the exporter assumes of T5Model (its tied head's
bias, no grouped-query cross-attention, its position types, no encoder pipeline split) holds in the source."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_t5 import _export, _graph

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# Builds megatron-core's T5Model as pretrain_t5.py's model_provider does (encoder_config a copy of the
# config, both blocks config.num_layers deep, max_sequence_length = --max-position-embeddings, the head
# tied unless --untie-embeddings-and-output-weights) in a one-process gloo group, and prints its
# parameters. The local block specs name TENorm for the final norms, None without Transformer Engine
# (this CPU venv): the Transformer Engine specs pretrain_t5.py uses by default build them, so the local
# LayerNorm stands in for TENorm here.
_BUILD = r"""
import copy, dataclasses, json, sys, tempfile
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.models.T5 import t5_spec
from megatron.core.models.T5.t5_model import T5Model
from megatron.core.transformer.transformer_config import TransformerConfig
a = json.loads(sys.argv[1])
config = TransformerConfig(num_layers=a["num-layers"], hidden_size=a["hidden-size"],
                           num_attention_heads=a["num-attention-heads"], ffn_hidden_size=a["ffn-hidden-size"],
                           add_bias_linear=not a.get("disable-bias-linear"), use_cpu_initialization=True)
blocks = [dataclasses.replace(f(config.num_layers), layer_norm=t5_spec.LNImpl)
          for f in (t5_spec.get_t5_encoder_with_local_block_spec, t5_spec.get_t5_decoder_with_local_block_spec)]
model = T5Model(config=config, encoder_config=copy.deepcopy(config), transformer_encoder_layer_spec=blocks[0],
                transformer_decoder_layer_spec=blocks[1], vocab_size=a["vocab"],
                max_sequence_length=a["max-position-embeddings"],
                share_embeddings_and_output_weights=not a.get("untie-embeddings-and-output-weights"))
print(json.dumps({n: list(p.shape) for n, p in model.named_parameters()}))
"""


@pytest.mark.parametrize(("dp", "tp"), [(8, 1), (2, 4)])
def test_transformer_config_accepts_the_t5_exports(dp, tp):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    from tests.integration.make_megatron_t5 import SIZES

    args = parse_megatron_args(_export(_graph(), dp, tp)["args"])
    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert (config.num_layers, config.hidden_size, config.num_attention_heads, config.ffn_hidden_size) == (
        SIZES["layers"], SIZES["hidden"], SIZES["heads"], SIZES["ffn"])
    assert config.add_bias_linear and not config.gated_linear_unit and config.normalization == "LayerNorm"
    assert config.tensor_model_parallel_size == tp and config.softmax_scale is None  # 1/sqrt(kv_channels)
    assert (args["seq-length"], args["decoder-seq-length"]) == (SIZES["seq"], SIZES["tgt_seq"])
    assert args["max-position-embeddings"] == SIZES["max_positions"]


def test_t5_model_from_the_export_has_the_fixture_parameters():
    pytest.importorskip("megatron.core")
    graph = _graph()
    args = parse_megatron_args(_export(graph, 8, 1)["args"])
    out = subprocess.run([sys.executable, "-c", _BUILD, json.dumps({**args, "vocab": 1000})], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    shapes = json.loads(out.stdout.strip().splitlines()[-1])
    total = sum(math.prod(s) for s in shapes.values())
    assert total == graph.parameter_count == 306_920
    # the tied head: no output weight of its own, a vocabulary bias (T5LMHead's bias=share_embeddings...)
    assert shapes["lm_head.output_layer.bias"] == [1000] and "lm_head.output_layer.weight" not in shapes
    assert shapes["embedding.position_embeddings.weight"] == [128, 64]
    assert {n for n in shapes if "final_layernorm" in n} == {
        f"{stack}.final_layernorm.{p}" for stack in ("encoder", "decoder") for p in ("weight", "bias")}


def test_t5_model_is_what_the_exporter_assumes():
    pytest.importorskip("megatron.core")
    from megatron.core import parallel_state
    from megatron.core.models.T5 import t5_model
    from megatron.core.transformer import attention

    choices = typing.get_args(
        inspect.signature(t5_model.T5Model.__init__).parameters["position_embedding_type"].annotation)
    assert set(choices) == {"learned_absolute", "rope", "relative"}
    assert "bias=share_embeddings_and_output_weights" in inspect.getsource(t5_model.T5LMHead.__init__)
    assert "Group query attention is not currently supported in cross attention" in inspect.getsource(
        attention.CrossAttention.__init__)
    # no encoder pipeline in 0.16.1 (pretrain_t5.py refuses pp > 1)
    assert not [p for p in inspect.signature(parallel_state.initialize_model_parallel).parameters if "encoder" in p]
