"""Issue 25 item 3 with megatron-core itself: the Megatron export of a DeepSeek-V3-style model
(``tests/data/mla_cases``, built by ``tests/importers/make_mla_cases.py``) is accepted by megatron-core
0.16.1's ``MLATransformerConfig``, and the ``GPTModel`` its flags build (the MLA layer spec with
``qk_layernorm``) has exactly the torch model's parameters, projection by projection, and the softmax
scale of the file's attention (``1 / sqrt(qk_nope + qk_rope)`` without YaRN)."""

from __future__ import annotations

import functools
import json
import math
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
CASES = ROOT / "tests" / "data" / "mla_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())


def _mla_kwargs(args: dict) -> dict:
    """``core_transformer_config_from_args`` for the MLA flags: ``MLATransformerConfig``'s fields."""
    return dict(multi_latent_attention=True, q_lora_rank=args.get("q-lora-rank"), kv_lora_rank=args["kv-lora-rank"],
                qk_head_dim=args["qk-head-dim"], qk_pos_emb_head_dim=args["qk-pos-emb-head-dim"],
                v_head_dim=args["v-head-dim"], qk_layernorm=bool(args.get("qk-layernorm")), rope_type=args["rope-type"],
                rotary_base=args.get("rotary-base", 10000))


@functools.lru_cache(maxsize=4)
def _args(name: str, devices: int = 8) -> dict:
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8))
    _, (found,) = plan_launchable_file(CASES / name, {"batch": 16, "seq": 64}, [request], launchers=("megatron",))
    row = next(r for r in found.rows if "megatron" in r.targets)
    return parse_megatron_args(export("megatron", row_plan_input(row))["args"])


# Builds megatron-core's GPTModel as pretrain_gpt.py's model_provider does for --multi-latent-attention
# (MLATransformerConfig, get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=...)), at tp=1 in
# a one-process gloo group, and prints its parameters' shapes and the first layer's softmax scale.
# MLASelfAttention builds its RotaryEmbedding without use_cpu_initialization (megatron-core 0.16.1), which
# asks torch.cuda.current_device(); this CPU venv answers "cpu" instead (the frequencies hold no parameters).
# MLASelfAttention hands its core attention k_channels / v_channels, which Transformer Engine's
# DotProductAttention takes and the local one does not: a local one that drops them stands in (it holds no
# parameters, and the softmax scale is MLASelfAttention's own). Its module reads HAVE_TE as true when
# megatron.core.extensions.transformer_engine imports without Transformer Engine: false here, as it is.
# It builds every model of its argument (a JSON list of [flags, MLA fields]) in that one process, one after the other:
# a start of torch and megatron-core costs more than a build, and each GPTModel is built from its own config.
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
from megatron.core.transformer.transformer_config import MLATransformerConfig
import torch.nn.functional as F
from megatron.core.transformer import multi_latent_attention
multi_latent_attention.HAVE_TE = False
from megatron.core.transformer.dot_product_attention import DotProductAttention
class CoreAttention(DotProductAttention):
    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        super().__init__(*args, **kwargs)
def build(a, mla):
    config = MLATransformerConfig(num_layers=a["num-layers"], hidden_size=a["hidden-size"],
                                  num_attention_heads=a["num-attention-heads"], ffn_hidden_size=a["ffn-hidden-size"],
                                  add_bias_linear=False, normalization="RMSNorm", gated_linear_unit=True,
                                  activation_func=F.silu, use_cpu_initialization=True, **mla)
    spec = get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = CoreAttention
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=a["vocab"],
                     max_sequence_length=a["max-position-embeddings"], position_embedding_type="rope",
                     share_embeddings_and_output_weights=not a.get("untie-embeddings-and-output-weights"))
    return {"shapes": {n: list(p.shape) for n, p in model.named_parameters()},
            "softmax_scale": model.decoder.layers[0].self_attention.softmax_scale}
print(json.dumps([build(a, mla) for a, mla in json.loads(sys.argv[1])]))
"""


@pytest.mark.parametrize("name", ["mla_ts_bare.onnx", "mla_lite_ts_consts.onnx"])
def test_mla_transformer_config_accepts_the_export(name):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = COUNTS["configs"][COUNTS["files"][name]["case"]]
    args = _args(name)
    mla = MLATransformerConfig(**_transformer_config_kwargs(args), **_mla_kwargs(args))
    assert mla.multi_latent_attention and mla.qk_layernorm and mla.rope_type == "rope"
    assert (mla.q_lora_rank, mla.kv_lora_rank) == (config["q_lora_rank"], config["kv_lora_rank"])
    assert (mla.qk_head_dim, mla.qk_pos_emb_head_dim, mla.v_head_dim) == (
        config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"])
    assert mla.num_attention_heads == config["num_attention_heads"] and mla.hidden_size == config["hidden_size"]


BUILT = ["mla_ts_bare.onnx", "mla_lite_ts_consts.onnx"]


@pytest.fixture(scope="module")
def gpt_models() -> dict[str, dict]:
    """The shapes and first softmax scale of the GPTModel each file of ``BUILT``'s export builds (``_BUILD``), by
    file, built in one process."""
    pytest.importorskip("megatron.core")
    jobs = []
    for name in BUILT:
        args = _args(name)
        jobs.append([{**args, "vocab": COUNTS["configs"][COUNTS["files"][name]["case"]]["vocab_size"]}, _mla_kwargs(args)])
    out = run_python(_BUILD, json.dumps(jobs), cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(zip(BUILT, json.loads(out.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("name", BUILT)
def test_the_gpt_model_from_the_export_has_the_torch_parameters(name, gpt_models):
    record = COUNTS["files"][name]
    config = COUNTS["configs"][record["case"]]
    built = gpt_models[name]
    shapes = built["shapes"]
    assert sum(math.prod(s) for s in shapes.values()) == record["param_count"]
    # DeepSeek's projections, (out, in): 4 heads x (16 + 8) queries, a 16 + 8 KV latent, 4 x (16 + 20) up
    attn = "decoder.layers.0.self_attention."
    if config["q_lora_rank"] is not None:
        assert shapes[attn + "linear_q_down_proj.weight"] == [32, 64] and shapes[attn + "linear_q_up_proj.weight"] == [96, 32]
        assert shapes[attn + "q_layernorm.weight"] == [32]
    else:
        assert shapes[attn + "linear_q_proj.weight"] == [96, 64] and attn + "q_layernorm.weight" not in shapes
    assert shapes[attn + "linear_kv_down_proj.weight"] == [24, 64] and shapes[attn + "kv_layernorm.weight"] == [16]
    assert shapes[attn + "linear_kv_up_proj.weight"] == [144, 16] and shapes[attn + "linear_proj.weight"] == [64, 80]
    # transformers' DeepseekV3Attention.scaling = qk_head_dim ** -0.5 without rope scaling
    assert built["softmax_scale"] == pytest.approx(1 / math.sqrt(16 + 8))
