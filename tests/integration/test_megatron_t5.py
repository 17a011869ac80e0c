"""Issue 25 with megatron-core itself: the T5 family's exports (exporters/megatron/t5.py) are accepted by
megatron-core 0.16.1's TransformerConfig, and the T5Model its flags build is the fixture
(tests/integration/make_megatron_t5.py): the same parameters and, with its weights, the same logits.
What the exporter assumes of T5Model (its tied head's bias, no grouped-query cross-attention, its
position types, no encoder pipeline split) holds in the source."""

from __future__ import annotations

import inspect
import json
import math
import typing
from pathlib import Path

import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_t5 import _export, _graph
from tests.integration.forked_python import run_python  # the build's python -c, torch and megatron-core imported once

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# Builds megatron-core's T5Model as pretrain_t5.py's model_provider does (encoder_config a copy of the
# config, both blocks config.num_layers deep, max_sequence_length = --max-position-embeddings, the head
# tied unless --untie-embeddings-and-output-weights) in a one-process gloo group, prints its parameters'
# shapes, then loads the fixture module's weights into it and prints how far its logits are from the
# fixture's on the same tokens. CPU shims, none of which changes what is computed: the local block specs
# name TENorm for the final norms, None without Transformer Engine (the Transformer Engine specs
# pretrain_t5.py uses by default build them), so the local LayerNorm stands in; DotProductAttention's
# scratch buffer is allocated on CUDA, so it is allocated on the CPU; the dropout RNG fork is a no-op
# (eval mode: no dropout). Megatron's fused QKV rows are per head [q_h, k_h, v_h] (SelfAttention views
# them [.., groups, (heads / groups + 2) x d]) and linear_kv's [k_h, v_h]; the fixture's are [Q, K, V].
_BUILD = r"""
import contextlib, copy, dataclasses, json, sys, tempfile
import torch
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
from megatron.core import parallel_state, utils
from megatron.core.tensor_parallel import random
parallel_state.initialize_model_parallel(1, 1)
utils.GlobalMemoryBuffer.get_tensor = lambda self, shape, dtype, name, mem_alloc_context=None: torch.empty(shape, dtype=dtype)
random.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
from megatron.core.models.T5 import t5_spec
from megatron.core.models.T5.t5_model import T5Model
from megatron.core.transformer.transformer_config import TransformerConfig
from tests.integration.make_megatron_t5 import build
a = json.loads(sys.argv[1])
config = TransformerConfig(num_layers=a["num-layers"], hidden_size=a["hidden-size"],
                           num_attention_heads=a["num-attention-heads"], ffn_hidden_size=a["ffn-hidden-size"],
                           add_bias_linear=not a.get("disable-bias-linear"), use_cpu_initialization=True)
blocks = [dataclasses.replace(f(config.num_layers), layer_norm=t5_spec.LNImpl)
          for f in (t5_spec.get_t5_encoder_with_local_block_spec, t5_spec.get_t5_decoder_with_local_block_spec)]
model = T5Model(config=config, encoder_config=copy.deepcopy(config), transformer_encoder_layer_spec=blocks[0],
                transformer_decoder_layer_spec=blocks[1], vocab_size=a["vocab"],
                max_sequence_length=a["max-position-embeddings"],
                share_embeddings_and_output_weights=not a.get("untie-embeddings-and-output-weights")).eval()
shapes = {n: list(p.shape) for n, p in model.named_parameters()}
ref, (enc, dec, pad), _ = build()
heads, width = config.num_attention_heads, config.hidden_size
def per_head(w, parts):
    return w.reshape(parts, heads, width // heads, *w.shape[1:]).transpose(0, 1).reshape(w.shape)
state = {"embedding.word_embeddings.weight": ref.word_embeddings.weight,
         "embedding.position_embeddings.weight": ref.position_embeddings.weight,
         "lm_head.output_layer.bias": ref.output_bias}
def put(name, module, parts=0):
    for p in ("weight", "bias"):
        state[f"{name}.{p}"] = per_head(getattr(module, p), parts) if parts else getattr(module, p)
layers = [("encoder", i, att, None, mlp) for i, (att, mlp) in enumerate(ref.encoder)]
layers += [("decoder", i, att, cross, mlp) for i, (att, cross, mlp) in enumerate(ref.decoder)]
for stack, i, att, cross, mlp in layers:
    p = f"{stack}.layers.{i}."
    put(p + "input_layernorm", att.input_layernorm)
    put(p + "self_attention.linear_qkv", att.linear_qkv, 3)
    put(p + "self_attention.linear_proj", att.linear_proj)
    if cross is not None:
        put(p + "pre_cross_attn_layernorm", cross.pre_cross_attn_layernorm)
        put(p + "cross_attention.linear_q", cross.linear_q)
        put(p + "cross_attention.linear_kv", cross.linear_kv, 2)
        put(p + "cross_attention.linear_proj", cross.linear_proj)
    put(p + "pre_mlp_layernorm", mlp.pre_mlp_layernorm)
    put(p + "mlp.linear_fc1", mlp.linear_fc1)
    put(p + "mlp.linear_fc2", mlp.linear_fc2)
put("encoder.final_layernorm", ref.encoder_final_layernorm)
put("decoder.final_layernorm", ref.decoder_final_layernorm)
loaded = model.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=False)
b, s, t = enc.shape[0], enc.shape[1], dec.shape[1]
with torch.no_grad():  # masks: True = masked; the encoder's and cross padding masks mask nothing, as the fixture's
    got = model(enc, dec, torch.zeros(b, 1, s, s, dtype=torch.bool),
                torch.triu(torch.ones(t, t, dtype=torch.bool), 1).expand(b, 1, t, t),
                torch.zeros(b, 1, t, s, dtype=torch.bool))
    want = ref(enc, dec, pad)
print(json.dumps({"shapes": shapes, "missing": sorted(loaded.missing_keys), "diff": (got - want).abs().max().item(),
                  "scale": want.abs().max().item(), "shape": list(got.shape)}))
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


def test_t5_model_from_the_export_is_the_fixture():
    """The exactness check: T5Model from the exported flags has the fixture's parameters, one for one,
    and with the fixture's weights computes its logits (float32, to rounding)."""
    pytest.importorskip("megatron.core")
    graph = _graph()
    args = parse_megatron_args(_export(graph, 8, 1)["args"])
    out = run_python(_BUILD, json.dumps({**args, "vocab": 1000}), cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    shapes = found["shapes"]
    assert sum(math.prod(s) for s in shapes.values()) == graph.parameter_count == 306_920
    # the tied head: no output weight of its own, a vocabulary bias (T5LMHead's bias=share_embeddings...)
    assert shapes["lm_head.output_layer.bias"] == [1000] and "lm_head.output_layer.weight" not in shapes
    assert shapes["embedding.position_embeddings.weight"] == [128, 64]
    assert {n for n in shapes if "final_layernorm" in n} == {
        f"{stack}.final_layernorm.{p}" for stack in ("encoder", "decoder") for p in ("weight", "bias")}
    # every parameter loaded (the two missing keys are T5Model's aliases of loaded ones)
    assert found["missing"] == ["output_layer.bias", "position_embeddings.weight"]
    assert found["shape"] == [2, 8, 1000]
    # measured 7.5e-09 on logits of at most 0.078; the same run with a bidirectional decoder mask is 9.8e-05 off,
    # so the bound tells a different model from rounding
    assert found["diff"] <= 1e-6 * found["scale"] + 1e-7


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
