"""Issue 25 with megatron-core itself: the Megatron export of a graph-only Qwen3
(``tests/exporters/data/qwen3_tiny.onnx``, ``tests/integration/make_qk_norm_fixtures.py``) is accepted
by megatron-core 0.16.1's ``TransformerConfig`` with ``qk_layernorm``, and the ``GPTModel`` its flags
build (the local layer spec with ``qk_layernorm``, RMSNorm, SwiGLU, GQA) has exactly the parameters of
transformers' ``Qwen3ForCausalLM`` of the fixture's config: per-head ``q_layernorm`` / ``k_layernorm``
of ``head_dim`` values, as Qwen3's ``q_norm`` / ``k_norm``."""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.integration.forked_python import run_python  # the build's python -c, torch and megatron-core imported once

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "exporters" / "data" / "qwen3_tiny.onnx"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import make_qk_norm_fixtures  # noqa: E402


@functools.lru_cache(maxsize=4)
def _args(devices: int) -> dict:
    """The flags of the fastest Megatron row at ``devices`` GPUs (tensor parallel rows included)."""
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8))
    _, (found,) = plan_launchable_file(FIXTURE, {"batch": 16, "seq": 64}, [request], launchers=("megatron",))
    row = next(r for r in found.rows if "megatron" in r.targets)
    return parse_megatron_args(export("megatron", row_plan_input(row))["args"])


@pytest.mark.parametrize("devices", [1, 8])
def test_transformer_config_accepts_the_qwen3_export(devices):
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = _args(devices)
    assert args["qk-layernorm"] is True
    config = TransformerConfig(**_transformer_config_kwargs(args), qk_layernorm=True)
    common = make_qk_norm_fixtures.COMMON
    assert config.qk_layernorm and config.normalization == "RMSNorm" and config.gated_linear_unit
    assert (config.num_attention_heads, config.num_query_groups, config.kv_channels, config.hidden_size) == (
        common["num_attention_heads"], common["num_key_value_heads"], common["head_dim"], common["hidden_size"])


# Builds megatron-core's GPTModel as pretrain_gpt.py's model_provider does without Transformer Engine
# (get_gpt_layer_local_spec(qk_layernorm=..., normalization="RMSNorm")), at tp=1 in a one-process gloo group,
# and prints its parameters' shapes; RotaryEmbedding asks torch.cuda.current_device(), answered "cpu" here.
_BUILD = r"""
import json, sys, tempfile
import torch
import torch.distributed as dist
torch.cuda.current_device = lambda: "cpu"
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig
import torch.nn.functional as F
a = json.loads(sys.argv[1])
config = TransformerConfig(num_layers=a["num-layers"], hidden_size=a["hidden-size"], num_attention_heads=a["num-attention-heads"],
                           num_query_groups=a["num-query-groups"], kv_channels=a["kv-channels"],
                           ffn_hidden_size=a["ffn-hidden-size"], add_bias_linear=False, normalization="RMSNorm",
                           gated_linear_unit=True, activation_func=F.silu, qk_layernorm=True, use_cpu_initialization=True)
spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=a["vocab"],
                 max_sequence_length=a["max-position-embeddings"], position_embedding_type="rope",
                 share_embeddings_and_output_weights=not a.get("untie-embeddings-and-output-weights"))
print(json.dumps({n: list(p.shape) for n, p in model.named_parameters()}))
"""


def test_the_gpt_model_from_the_export_has_qwen3s_parameters():
    pytest.importorskip("megatron.core")
    pytest.importorskip("transformers")
    args = _args(1)
    common = make_qk_norm_fixtures.COMMON
    out = run_python(_BUILD, json.dumps({**args, "vocab": common["vocab_size"]}), cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    shapes = json.loads(out.stdout.strip().splitlines()[-1])
    qwen3 = make_qk_norm_fixtures.build("qwen3_tiny")
    expected = sum(p.numel() for p in qwen3.parameters())
    assert sum(math.prod(s) for s in shapes.values()) == expected
    attn = "decoder.layers.0.self_attention."
    head_dim = common["head_dim"]
    assert shapes[attn + "q_layernorm.weight"] == [head_dim] and shapes[attn + "k_layernorm.weight"] == [head_dim]
    # fused QKV: 4 query heads and 2 KV heads x 2 (keys, values) of 16 channels from the hidden size
    width = (common["num_attention_heads"] + 2 * common["num_key_value_heads"]) * head_dim
    assert shapes[attn + "linear_qkv.weight"] == [width, common["hidden_size"]]
