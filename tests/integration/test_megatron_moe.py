"""Issue 25 with megatron-core itself: the Megatron export of a DeepSeek-V3-style MoE model
(``tests/data/megatron_moe``, built by ``tests/integration/make_megatron_moe.py``) is accepted by megatron-core
0.16.1's ``MLATransformerConfig``; megatron-core's own router function (``topk_routing_with_score_function``),
given the exported router flags, computes transformers' ``DeepseekV3TopkRouter`` weights token for token (and
would not for ``tests/data/moe_cases``' group scoring, which the export refuses); and the ``GPTModel`` the
flags build has a dense first layer, two MoE layers and exactly the torch model's parameters."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.integration.test_megatron_mla import _mla_kwargs
from tests.integration.forked_python import run_python  # the build's python -c, torch and megatron-core imported once

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "megatron_moe"
COUNTS = json.loads((CASES / "counts.json").read_text())
FILE = "deepseek_v3_megatron_ts_consts.onnx"


@functools.lru_cache(maxsize=2)
def _args(name: str = FILE) -> dict:
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8))
    # ep = 1: megatron-core 0.16.1's all-to-all dispatcher (ep > 1) makes a CUDA stream when the layer is
    # built (transformer/moe/token_dispatcher.py:445), which a CPU build cannot; the layers and their
    # parameters are the same at every ep. Pinned (--fix ep=1), the search prices no ep > 1 plan: 4.6 CPU s
    # against 17.0 for the whole frontier and its first ep = 1 row (the same row, dp = tp = pp = 1; h28b). With
    # tp = pp = 1 pinned too: 1.8 and 1.4 CPU s against 5.2 and 5.6 (FILE, SPARSE; load 12), the same exports (h29c)
    _, (found,) = plan_launchable_file(CASES / name, {"batch": 4, "seq": 16}, [request], launchers=("megatron",),
                                       pins=Pins(tp=1, pp=1, ep=1))
    row = next(r for r in found.rows if "megatron" in r.targets and r.degrees.ep == 1)
    return parse_megatron_args(export("megatron", row_plan_input(row))["args"])


def test_transformer_config_accepts_the_moe_export():
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config, args = COUNTS["config"], _args()
    built = MLATransformerConfig(**_transformer_config_kwargs(args), **_mla_kwargs(args))
    assert (built.num_moe_experts, built.moe_router_topk) == (config["n_routed_experts"], config["num_experts_per_tok"])
    assert built.moe_router_score_function == "sigmoid" and built.moe_router_enable_expert_bias
    assert (built.moe_router_num_groups, built.moe_router_group_topk) == (config["n_group"], config["topk_group"])
    assert built.moe_router_topk_scaling_factor == config["routed_scaling_factor"]
    assert (built.ffn_hidden_size, built.moe_ffn_hidden_size) == (config["intermediate_size"], config["moe_intermediate_size"])
    dense = config["first_k_dense_replace"]
    assert built.moe_layer_freq == [0] * dense + [1] * (config["num_hidden_layers"] - dense)
    assert built.moe_shared_expert_intermediate_size == config["n_shared_experts"] * config["moe_intermediate_size"]
    assert not built.moe_router_pre_softmax  # megatron-core reads it for softmax routers only


def test_every_row_at_16_devices_is_accepted():
    """Each Megatron row of the 16-device frontier with tp = ep = 1 fixed, and of the one with tp = ep = 2 and
    pp = 1 fixed: megatron-core's config takes it. On this tiny model NCCL's buffers (about 308 MB per group a
    rank joins, ``objectives.nccl_memory``) outweigh every tensor, so the free frontier holds data-parallel rows
    only (uncut: dp 1, 8 and 16 at tp = ep = 1, h28b), the tp = ep = 1 plan's. Each plan pins the degrees its
    rows are read for, so they exist at any load: a search the wall-clock ``--time-limit`` cuts still returns each
    plan it found, where the free search cut at load 10-15 had left no tp > 1 or ep > 1 row (h28b). 10.3 CPU s
    for the two against 36.1 for the free search and tp = ep = 2 with pp searched (the same rows; h29c)."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=16, devices_per_node=8))
    rows = []
    for pins in (Pins(tp=1, ep=1), Pins(tp=2, ep=2, pp=1)):
        _, (found,) = plan_launchable_file(CASES / FILE, {"batch": 32, "seq": 64}, [request], launchers=("megatron",),
                                           pins=pins)
        rows += [r for r in found.rows if "megatron" in r.targets]
    seen = set()
    for row in rows:
        args = parse_megatron_args(export("megatron", row_plan_input(row))["args"])
        built = MLATransformerConfig(**_transformer_config_kwargs(args), **_mla_kwargs(args))
        assert built.moe_layer_freq == [0, 1, 1] and built.moe_router_group_topk == COUNTS["config"]["topk_group"]
        seen.add((built.tensor_model_parallel_size, built.expert_model_parallel_size))
    assert len(seen) > 1 and max(tp for tp, _ in seen) > 1 and max(ep for _, ep in seen) > 1


def _hf_router(fields: dict):
    """transformers' ``DeepseekV3TopkRouter`` of ``fields`` with random weights and a random score bias."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    torch.manual_seed(0)
    router = DeepseekV3TopkRouter(transformers.DeepseekV3Config(**fields))
    with torch.no_grad():
        router.weight.normal_(0, 1)
        router.e_score_correction_bias.uniform_(-0.1, 0.1)
    return router


def _routings(fields: dict, args: dict):
    """``(transformers' weights, megatron-core's weights)``, each ``[tokens, experts]``, on 512 random tokens."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    router = _hf_router(fields)
    hidden = torch.randn(512, fields["hidden_size"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, weights, indices = router(hidden)
        theirs = torch.zeros_like(logits).scatter(1, indices, weights)
        ours, chosen = topk_routing_with_score_function(
            logits, args["moe-router-topk"], use_pre_softmax=bool(args.get("moe-router-pre-softmax")),
            num_groups=args.get("moe-router-num-groups"), group_topk=args.get("moe-router-group-topk"),
            scaling_factor=float(args["moe-router-topk-scaling-factor"]),
            score_function=args["moe-router-score-function"],
            expert_bias=router.e_score_correction_bias if args.get("moe-router-enable-expert-bias") else None)
    return theirs, ours


def test_megatron_cores_router_computes_transformers_weights():
    torch = pytest.importorskip("torch")
    theirs, ours = _routings(COUNTS["config"], _args())
    assert torch.equal(theirs != 0, ours != 0)  # the same experts for every token
    assert torch.allclose(theirs, ours, rtol=1e-6, atol=1e-7)
    # normalised, then scaled: each token's weights sum to routed_scaling_factor
    assert torch.allclose(ours.sum(-1), torch.full((512,), COUNTS["config"]["routed_scaling_factor"]))


def test_the_refused_group_scoring_would_route_differently():
    """``tests/data/moe_cases``' router (top 2 of the top 2 of 4 groups, a group scored by its top 2) through
    the flags the export would write: megatron-core scores a group by its top ``2 / 2 = 1``, and some tokens
    go to other experts; the export refuses it (``tests/exporters/test_megatron_moe.py``)."""
    torch = pytest.importorskip("torch")
    cases = json.loads((ROOT / "tests" / "data" / "moe_cases" / "counts.json").read_text())["configs"]["deepseek_v3"]
    args = {"moe-router-topk": cases["num_experts_per_tok"], "moe-router-num-groups": cases["n_group"],
            "moe-router-group-topk": cases["topk_group"], "moe-router-score-function": "sigmoid",
            "moe-router-topk-scaling-factor": str(cases["routed_scaling_factor"]), "moe-router-enable-expert-bias": True}
    theirs, ours = _routings(cases, args)
    assert not torch.equal(theirs != 0, ours != 0)


# Builds megatron-core's GPTModel as pretrain_gpt.py's model_provider does for an MoE model with
# --multi-latent-attention (MLATransformerConfig, get_gpt_decoder_block_spec: a dense or an MoE layer spec per
# --moe-layer-freq entry), at tp = ep = 1 in a one-process gloo group, and prints its parameters' shapes and
# which layers are MoE. The stand-ins are tests/integration/test_megatron_mla.py's (a CPU current device, a
# local core attention taking k_channels / v_channels); the experts are SequentialMLP (no grouped GEMM kernel
# on this CPU venv: the same parameters, one linear pair per expert). It builds every model of its argument (a JSON
# list of [flags, TransformerConfig kwargs]) in that one process, one after the other: a start of torch and
# megatron-core costs more than a build (two processes took 15.8 + 15.6 s in CI), and each GPTModel is built from its
# own config, the parallel state (tp = ep = pp = 1) being the same for both.
_BUILD = r"""
import json, sys, tempfile
import torch
import torch.distributed as dist
torch.cuda.current_device = lambda: "cpu"
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
import torch.nn.functional as F
from megatron.core.transformer import multi_latent_attention
multi_latent_attention.HAVE_TE = False
from megatron.core.transformer.dot_product_attention import DotProductAttention
class CoreAttention(DotProductAttention):
    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        super().__init__(*args, **kwargs)
def build(a, kwargs):
    kwargs.update(activation_func=F.silu, params_dtype=torch.float32, pipeline_dtype=torch.float32, bf16=False,
                  use_cpu_initialization=True, moe_grouped_gemm=False, expert_model_parallel_size=1,
                  tensor_model_parallel_size=1, pipeline_model_parallel_size=1, num_layers_in_first_pipeline_stage=None,
                  num_layers_in_last_pipeline_stage=None, sequence_parallel=False)
    config = (MLATransformerConfig if kwargs.get("multi_latent_attention") else TransformerConfig)(**kwargs)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    for layer in spec.layer_specs if config.multi_latent_attention else ():
        layer.submodules.self_attention.submodules.core_attention = CoreAttention
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=a["vocab"],
                     max_sequence_length=a["max-position-embeddings"], position_embedding_type="rope",
                     share_embeddings_and_output_weights=not a.get("untie-embeddings-and-output-weights"))
    return {"shapes": {n: list(p.shape) for n, p in model.named_parameters()},
            "moe": [type(layer.mlp).__name__ == "MoELayer" for layer in model.decoder.layers]}
print(json.dumps([build(a, kwargs) for a, kwargs in json.loads(sys.argv[1])]))
"""


SPARSE = "qwen3_moe_sparse_ts_consts.onnx"


def _build_job(name: str, vocab: int) -> list:
    """``[flags, TransformerConfig kwargs]`` of the export of ``name``, for ``_BUILD``."""
    args = _args(name)
    # --qk-layernorm is TransformerConfig.qk_layernorm (core_transformer_config_from_args); _mla_kwargs sets it for MLA
    extra = _mla_kwargs(args) if args.get("multi-latent-attention") else {"qk_layernorm": bool(args.get("qk-layernorm"))}
    kwargs = {**_transformer_config_kwargs(args), **extra}
    kwargs = {k: v for k, v in kwargs.items() if k not in ("activation_func", "params_dtype", "pipeline_dtype")}
    return [{**args, "vocab": vocab}, kwargs]


@pytest.fixture(scope="module")
def built() -> dict[str, dict]:
    """The shapes and MoE layers of the GPTModel each export builds (``_BUILD``), by file: DeepSeek-V3's
    (``FILE``) and Qwen3-MoE's interleaved one (``SPARSE``), built in one process."""
    pytest.importorskip("megatron.core")
    names = {FILE: COUNTS["config"]["vocab_size"], SPARSE: COUNTS["sparse"]["vocab_size"]}
    jobs = [_build_job(name, vocab) for name, vocab in names.items()]
    out = run_python(_BUILD, json.dumps(jobs), cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(zip(names, json.loads(out.stdout.strip().splitlines()[-1])))


def test_the_gpt_model_from_the_export_has_the_torch_parameters(built):
    built = built[FILE]
    assert built["moe"] == [False, True, True]  # first_k_dense_replace = 1
    shapes = built["shapes"]
    assert sum(math.prod(s) for s in shapes.values()) == COUNTS["files"][FILE]["param_count"]
    mlp = "decoder.layers.1.mlp."
    assert shapes[mlp + "router.weight"] == [8, 64]
    assert shapes[mlp + "experts.local_experts.0.linear_fc1.weight"] == [64, 64]  # gate and up, 2 x 32
    assert shapes[mlp + "shared_experts.linear_fc1.weight"] == [64, 64]
    assert shapes["decoder.layers.0.mlp.linear_fc1.weight"] == [256, 64]  # the dense layer: 2 x 128


def test_interleaved_moe_layers_build_the_torch_model(built):
    """Qwen3-MoE with ``decoder_sparse_step=2``: megatron-core builds dense, MoE, dense, MoE from
    ``--moe-layer-freq`` with the torch model's parameter count (the planner's rows may pipeline it: the
    build runs one stage, the same model)."""
    name = SPARSE
    built = built[name]
    assert built["moe"] == [False, True, False, True]
    assert sum(math.prod(s) for s in built["shapes"].values()) == COUNTS["files"][name]["param_count"]
    assert built["shapes"]["decoder.layers.1.mlp.router.weight"] == [4, 64]
    assert built["shapes"]["decoder.layers.0.mlp.linear_fc1.weight"] == [256, 64]  # dense: 2 x 128
