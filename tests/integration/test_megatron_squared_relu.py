"""Issue 25 (task H6) with megatron-core itself: the Megatron export of Persimmon's squared-ReLU MLP
(``tests/data/sweep_cases/persimmon_noqk_ts_bare.onnx``) builds, from its flags, a ``GPTModel`` with exactly
transformers' ``PersimmonForCausalLM`` parameter count (``counts.json``, torch's ``sum(p.numel())``), and
``--squared-relu``'s function (megatron-core 0.16.1 ``core/activations.py:9-11``) computes transformers'
``relu2`` (``ReLUSquaredActivation``) on the same values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.importers.test_squared_relu import COUNTS, megatron_args_of_persimmon
from tests.integration.forked_python import run_python  # the build's python -c, torch and megatron-core imported once

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# megatron-core's GPTModel as pretrain_gpt.py's model_provider builds it without Transformer Engine (the local
# spec, LayerNorm, biases on: --add-bias-linear is Megatron's default), in a one-process gloo group; the
# activation is the one core_transformer_config_from_args sets for --squared-relu. Prints the parameter shapes.
_BUILD = r"""
import json, sys, tempfile
import torch
import torch.distributed as dist
torch.cuda.current_device = lambda: "cpu"
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.activations import squared_relu
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig
a = json.loads(sys.argv[1])
assert a.get("squared-relu")
config = TransformerConfig(num_layers=a["num-layers"], hidden_size=a["hidden-size"], num_attention_heads=a["num-attention-heads"],
                           ffn_hidden_size=a["ffn-hidden-size"], activation_func=squared_relu, use_cpu_initialization=True)
model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=a["vocab"],
                 max_sequence_length=a["max-position-embeddings"], position_embedding_type="rope",
                 rotary_percent=float(a["rotary-percent"]),
                 share_embeddings_and_output_weights=not a.get("untie-embeddings-and-output-weights"))
print(json.dumps({n: list(p.shape) for n, p in model.named_parameters()}))
"""


def test_the_gpt_model_from_the_export_has_persimmons_parameters():
    pytest.importorskip("megatron.core")
    args = megatron_args_of_persimmon()
    vocab = COUNTS["persimmon_noqk_ts"]["config"]["vocab_size"]
    out = run_python(_BUILD, json.dumps({**args, "vocab": vocab}), cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    shapes = json.loads(out.stdout.strip().splitlines()[-1])
    # 228,096 = 2 tables of 1,000 x 64 + 2 x (2 LayerNorms 128 + QKV 64 x 192 + 192 + dense 4,160
    #           + fc1 64 x 256 + 256 + fc2 256 x 64 + 64) + the final LayerNorm 128
    assert sum(math.prod(s) for s in shapes.values()) == COUNTS["persimmon_noqk_ts"]["param_count"] == 228_096


def test_squared_relu_is_transformers_relu2():
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.activations import squared_relu
    from transformers.activations import ACT2FN

    x = torch.linspace(-4, 4, 801)
    assert torch.equal(squared_relu(x), ACT2FN["relu2"](x))
