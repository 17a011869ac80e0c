"""Issue 25 (h27e) with megatron-core itself: the hybrid export's MoE layers (``E`` in ``--hybrid-override-pattern``
and the GPT family's MoE flags, ``exporters/megatron/mamba_moe.py``) are what megatron-core 0.16.1 builds.

Checked with megatron-core's own code: ``TransformerConfig`` accepts the export's MoE and Mamba fields together
(its ``__post_init__`` checks the router, the expert bias with the sigmoid, the shared experts);
``allocate_layers`` turns the exported pattern into the fixture's layer kinds; and ``mamba_stack_spec``'s
``moe_layer`` (a ``MoETransformerLayer`` of ``get_moe_module_spec``'s ``MoELayer``), built on CPU from that config
with megatron-core's local (non-TE) modules in a one-process gloo group (experts as ``SequentialMLP``: the same
parameters as the grouped GEMM, one linear pair per expert; ``TENorm`` as ``WrappedTorchNorm``), holds the
parameters :func:`importers.hybrid.layer_parameters` counts for an ``E`` layer, and with them the stack holds
torch's count of the transformers model (``tests/exporters/test_megatron_hybrid_experts.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from exporters.validate import parse_megatron_args
from importers.hybrid import layer_parameters
from planner.plan import load_graph
from exporters.megatron.mamba import hybrid_stack
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_hybrid_experts import CASES, CONFIG, DIMS, FILES, PATTERN, RECORD, export
from tests.integration.forked_python import run_python, run_pythons  # the build's python -c, torch and megatron-core imported once

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _config_kwargs(args: dict) -> dict:
    """core_transformer_config_from_args for the export's flags: the GPT family's fields, the mamba sizes, and
    activation_func = squared_relu under --squared-relu."""
    kwargs = _transformer_config_kwargs(args)
    kwargs.update(mamba_num_heads=args["mamba-num-heads"], mamba_head_dim=args["mamba-head-dim"],
                  mamba_num_groups=args["mamba-num-groups"], mamba_state_dim=args["mamba-state-dim"])
    return kwargs


@pytest.mark.parametrize("name", FILES)
def test_transformer_config_accepts_the_export(name: str):
    pytest.importorskip("megatron.core")
    from megatron.core.activations import squared_relu
    from megatron.core.ssm.mamba_hybrid_layer_allocation import Symbols, allocate_layers
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = parse_megatron_args(export(name)["args"])
    config = TransformerConfig(**_config_kwargs(args), activation_func=squared_relu)
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (
        CONFIG["n_routed_experts"], CONFIG["num_experts_per_tok"], CONFIG["moe_intermediate_size"])
    assert config.moe_shared_expert_intermediate_size == CONFIG["moe_shared_expert_intermediate_size"]
    assert config.moe_router_score_function == "sigmoid" and config.moe_router_enable_expert_bias
    assert config.expert_model_parallel_size == 2 and not config.gated_linear_unit
    pattern = args["hybrid-override-pattern"]
    assert "".join(allocate_layers(args["num-layers"], 0.0, 0.0, pattern)) == pattern == PATTERN
    assert pattern.count(Symbols.MOE) == CONFIG["layers_block_type"].count("moe")


_BUILD_MOE_LAYER = r"""
import json, sys, tempfile
import torch
import torch.distributed as dist
torch.cuda.current_device = lambda: "cpu"
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.activations import squared_relu
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import MoETransformerLayer, TransformerLayerSubmodules
kwargs = json.loads(sys.argv[1])
config = TransformerConfig(**kwargs, activation_func=squared_relu, params_dtype=torch.float32, use_cpu_initialization=True)
moe = get_moe_module_spec(use_te=False, num_experts=config.num_moe_experts, moe_grouped_gemm=False)
layer = MoETransformerLayer(config, TransformerLayerSubmodules(pre_mlp_layernorm=WrappedTorchNorm, mlp=moe,
                                                               mlp_bda=get_bias_dropout_add), layer_number=1)
print(json.dumps({n: list(p.shape) for n, p in layer.named_parameters()}))
"""


def test_megatron_cores_moe_layer_holds_the_counted_parameters():
    pytest.importorskip("megatron.core")
    name = FILES[0]
    args = parse_megatron_args(export(name, ep=1)["args"])
    kwargs = {k: v for k, v in _config_kwargs(args).items()
              if k not in ("activation_func", "params_dtype", "pipeline_dtype", "bf16")}
    kwargs.update(moe_grouped_gemm=False, num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None)
    out = run_python(_BUILD_MOE_LAYER, json.dumps(kwargs), cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    shapes = json.loads(out.stdout.strip().splitlines()[-1])
    h, e = CONFIG["hidden_size"], CONFIG["n_routed_experts"]
    assert shapes["mlp.router.weight"] == [e, h]
    assert shapes["mlp.shared_experts.linear_fc1.weight"] == [CONFIG["moe_shared_expert_intermediate_size"], h]
    assert shapes["mlp.experts.local_experts.0.linear_fc1.weight"] == [CONFIG["moe_intermediate_size"], h]
    built = sum(math.prod(s) for s in shapes.values())
    stack = hybrid_stack(load_graph(CASES / name, DIMS))
    assert built == layer_parameters("E", stack.experts, h)
    # every layer as megatron-core builds it, the table, the untied head and the final norm: torch's count
    sizes = {"M": stack.mamba, "*": (stack.num_attention_heads, stack.num_query_groups, stack.kv_channels),
             "-": (stack.ffn_hidden_size, stack.mlp)}
    layers = sum(built if kind == "E" else layer_parameters(kind, sizes[kind], h) for kind in stack.pattern)
    assert layers + 2 * CONFIG["vocab_size"] * h + h == RECORD["files"][name]["param_count"]


# tp > 1 (h28f): the export at tp=2 with --sequence-parallel, and megatron-core's MoE layer built on two gloo ranks.

_BUILD_MOE_LAYER_TP = r"""
import json, sys, torch
import torch.distributed as dist
torch.cuda.current_device = lambda: "cpu"
rank, store, kwargs = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(2, 1)
from megatron.core.activations import squared_relu
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import MoETransformerLayer, TransformerLayerSubmodules
out = {}
for sequence_parallel in (True, False):
    kwargs["sequence_parallel"] = sequence_parallel
    config = TransformerConfig(**kwargs, activation_func=squared_relu, params_dtype=torch.float32,
                               use_cpu_initialization=True)
    moe = get_moe_module_spec(use_te=False, num_experts=config.num_moe_experts, moe_grouped_gemm=False)
    # (the pre-MLP norm left out: WrappedTorchNorm asserts no sequence parallelism, TENorm needs a GPU)
    layer = MoETransformerLayer(config, TransformerLayerSubmodules(pre_mlp_layernorm=IdentityOp, mlp=moe,
                                                                   mlp_bda=get_bias_dropout_add), layer_number=1)
    if sequence_parallel:
        out["etp"] = config.expert_tensor_parallel_size
        out["shapes"] = {n: list(p.shape) for n, p in layer.named_parameters()}
    else:
        layer.mlp.train()
        try:
            layer.mlp(torch.zeros(8, 1, config.hidden_size))
            out["error"] = None
        except ValueError as error:
            out["error"] = str(error)
print(json.dumps(out))
"""


def _export_tp2(name: str) -> dict:
    from exporters.megatron import export_megatron, megatron_masks
    from planner.core.settings import TrainingSettings
    from tests.exporters.graphs import first_rows, make_input, spaces_for

    graph = load_graph(CASES / name, DIMS)
    spaces = spaces_for(graph, 2)
    masks = megatron_masks(graph, spaces, dp=1, tp=2, sequence_parallel=True)
    return export_megatron(make_input(graph, spaces, first_rows(masks), global_batch=16,
                                      settings=TrainingSettings(zero_stage=1)))


@pytest.mark.parametrize("name", FILES)
def test_transformer_config_accepts_the_tp2_export(name: str):
    pytest.importorskip("megatron.core")
    from megatron.core.activations import squared_relu
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = parse_megatron_args(_export_tp2(name)["args"])
    config = TransformerConfig(**_config_kwargs(args), activation_func=squared_relu)
    assert (config.tensor_model_parallel_size, config.sequence_parallel) == (2, True)
    assert config.expert_tensor_parallel_size == 2  # ModelParallelConfig's default: the tp size, as priced
    assert config.num_moe_experts == CONFIG["n_routed_experts"] and args["hybrid-override-pattern"] == PATTERN


def test_megatron_cores_moe_layer_at_tp2_splits_the_experts_and_keeps_the_router():
    """Two gloo ranks build the E layer from the tp=2 export: the router whole on each, every expert's fc1 / fc2 and
    the shared expert's halved; the two ranks together hold layer_parameters("E") less its norm (left out) plus one more
    router. The
    same layer without sequence parallelism raises, while training, the error the export's refusal quotes."""
    pytest.importorskip("megatron.core")
    import tempfile

    from exporters.megatron.mamba_moe import moe_tp_refusal

    name = FILES[0]
    args = parse_megatron_args(_export_tp2(name)["args"])
    kwargs = {k: v for k, v in _config_kwargs(args).items()
              if k not in ("activation_func", "params_dtype", "pipeline_dtype", "bf16")}
    kwargs.update(moe_grouped_gemm=False, num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None)
    store = tempfile.mktemp()
    workers = run_pythons(_BUILD_MOE_LAYER_TP, [[str(rank), store, json.dumps(kwargs)] for rank in (0, 1)], cwd=ROOT,
                          timeout=600)  # the two ranks at once
    assert all(worker.returncode == 0 for worker in workers), workers[0].stderr[-3000:] + workers[1].stderr[-3000:]
    ranks = [json.loads(worker.stdout.strip().splitlines()[-1]) for worker in workers]
    h, e, f = CONFIG["hidden_size"], CONFIG["n_routed_experts"], CONFIG["moe_intermediate_size"]
    s = CONFIG["moe_shared_expert_intermediate_size"]
    for rank in ranks:
        shapes = rank["shapes"]
        assert rank["etp"] == 2 and shapes["mlp.router.weight"] == [e, h]
        assert shapes["mlp.experts.local_experts.0.linear_fc1.weight"] == [f // 2, h]
        assert shapes["mlp.experts.local_experts.0.linear_fc2.weight"] == [h, f // 2]
        assert shapes["mlp.shared_experts.linear_fc1.weight"] == [s // 2, h]
    built = sum(math.prod(shape) for rank in ranks for shape in rank["shapes"].values())
    stack = hybrid_stack(load_graph(CASES / name, DIMS))
    assert built == layer_parameters("E", stack.experts, h) - h + e * h  # no norm built; the router on both ranks
    error = ranks[0]["error"]
    # (megatron-core's two string pieces join as "parallelismare"; the refusal quotes it with the space)
    assert error and error.rstrip(".").replace(" ", "") in moe_tp_refusal(stack, 2, False).replace(" ", "")
