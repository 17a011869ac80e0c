"""torchtitan 0.3.0 builds the exported DeepSeek-V3-style MoE models exactly (issue 25: "every one a launcher
trains is exported to it").

``tests/data/megatron_moe/deepseek_v3_megatron_ts_consts.onnx`` (``make_megatron_moe.py``: transformers'
``DeepseekV3ForCausalLM``, 3 layers, the first dense, 8 experts of FFN 32, top 4 of the top 2 of 4 groups,
sigmoid scores with a score bias, renormalised and scaled by 2.5, one shared expert, MLA): every torchtitan
row on 8 devices is exported, parsed by torchtitan's own ``ConfigManager`` and checked by ``ParallelDims``;
the ``DeepSeekV3Model.Config`` read back holds ``counts.json``'s config (dense layers, experts, shared
experts, router) and the model torchtitan builds on the meta device has the torch model's parameter count
(``counts.json``, the exporter's count; the score bias is a buffer in both). torchtitan's own
``TokenChoiceTopKRouter``, built from the exported router config with transformers' router weight and bias,
computes transformers' ``DeepseekV3TopkRouter`` weights token for token, also for ``tests/data/moe_cases``'
routers (top 2 of the top 2 of 4 groups: torchtitan sums each group's top 2 as transformers does, where
Megatron-LM's ``topk / group_topk = 1`` differs and its export refuses).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from exporters import export
from exporters.torchtitan.config_module import CONFIG_FUNCTION, CONFIG_MODULE, torchtitan_config_module
from exporters.torchtitan.families import torchtitan_arch
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest, load_graph
from tests.integration.test_megatron_moe import _hf_router  # transformers' router, random weight and bias
from tests.integration.test_torchtitan_export import _parse  # torchtitan's ConfigManager on the written module

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MEGATRON_MOE = ROOT / "tests" / "data" / "megatron_moe"
MOE_CASES = ROOT / "tests" / "data" / "moe_cases"
FILE = MEGATRON_MOE / "deepseek_v3_megatron_ts_consts.onnx"


# Each plan pins the degrees its rows are read for, so the rows exist at any load: a search the wall-clock
# --time-limit cuts still returns each plan it found, and a cut free search (load 10-15) had left no tp > 1 or
# no ep > 1 row (h28b). On this tiny model NCCL's buffers (about 308 MB per group a rank joins,
# ``objectives.nccl_memory``) outweigh every tensor, so the free frontier holds data-parallel rows only: its rows
# are the tp = ep = 1 plan's. Fully pinned, the three searches cost 15.4 CPU s against 46.1 for the free one and the
# tp = 2 and ep = 2 ones (h29c, 2026-12-02). (tp = 1 with ep = 2 pinned and dp free found no plan before h29i's
# rule, now each launcher's Target.settings_allows asked before pricing (h30e); its rows are at dp = 2.)
PINNED = (Pins(cuda_graphs="off", tp=1, ep=1), Pins(cuda_graphs="off", dp=4, tp=2, ep=1),
          Pins(cuda_graphs="off", dp=8, tp=1, ep=2))


@functools.lru_cache(maxsize=1)
def _rows() -> list:
    """The torchtitan rows of :data:`FILE` on 8 devices (batch 16 x 64 tokens) of each :data:`PINNED` plan, priced
    without CUDA graphs: torchtitan captures none with expert parallelism under its default dispatcher, and at
    ep = 1 its graph-priced rows are faster than every ep > 1 row."""
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8))
    rows = []
    for pins in PINNED:
        _, (found,) = plan_launchable_file(FILE, {"batch": 16, "seq": 64}, [request], launchers=["torchtitan"],
                                           collapse=0.0, pins=pins)
        rows += [row for row in found.rows if "torchtitan" in row.targets]
    return rows


def _check_layers(model, hf) -> None:
    """``model`` (a ``DeepSeekV3Model.Config``) holds ``hf``'s (a ``DeepseekV3Config``) layers."""
    dense = hf.first_k_dense_replace
    assert len(model.layers) == hf.num_hidden_layers
    for layer in model.layers[:dense]:
        assert layer.moe is None and layer.feed_forward.w1.out_features == hf.intermediate_size
    for layer in model.layers[dense:]:
        moe, router = layer.moe, layer.moe.router
        assert layer.feed_forward is None and moe.num_experts == hf.n_routed_experts
        assert moe.routed_experts.inner_experts.hidden_dim == hf.moe_intermediate_size
        # DeepseekV3MoE.shared_experts: one MLP of moe_intermediate_size x n_shared_experts
        assert moe.shared_experts.w1.out_features == hf.moe_intermediate_size * hf.n_shared_experts
        assert (router.top_k, router.score_func, router.num_expert_groups, router.num_limited_groups) == (
            hf.num_experts_per_tok, "sigmoid", hf.n_group, hf.topk_group)
        assert (router.route_norm, router.route_scale) == (hf.norm_topk_prob, hf.routed_scaling_factor)
        assert moe.load_balance_coeff == 1e-3 and router.gate.bias is False  # e_score_correction_bias; no gate bias


def test_every_row_builds_the_torch_model(tmp_path):
    pytest.importorskip("torchtitan")
    import torch
    import transformers
    from torchtitan.distributed import ParallelDims

    counts = json.loads((MEGATRON_MOE / "counts.json").read_text())
    hf = transformers.DeepseekV3Config(**counts["config"])
    rows = _rows()
    seen = set()
    for index, row in enumerate(rows):
        out = export("torchtitan", row_plan_input(row))
        config = _parse(out, tmp_path)
        p = config.parallelism
        ParallelDims.from_config(p, out["world_size"])  # torchtitan's own degree checks
        assert config.model_spec.name == "deepseek_v3"
        assert (p.tensor_parallel_degree, p.expert_parallel_degree) == (row.degrees.tp, row.degrees.ep)
        seen.add((p.tensor_parallel_degree, p.expert_parallel_degree))
        _check_layers(config.model_spec.model, hf)
        if index == 0:
            with torch.device("meta"):
                built = config.model_spec.model.build()
            assert sum(t.numel() for t in built.parameters()) == counts["files"][FILE.name]["param_count"]
    assert max(tp for tp, _ in seen) > 1 and max(ep for _, ep in seen) > 1


def _written_router(path: Path, tmp_path: Path):
    """The router config of the first MoE layer of the module written for ``path`` (no plan: the model
    lines alone), read back by torchtitan's ``ConfigManager``."""
    text = torchtitan_config_module(torchtitan_arch(load_graph(path, {"batch": 2, "seq": 16})))
    config = _parse({"config_file": {"path": f"{CONFIG_MODULE}.py", "text": text}, "module": CONFIG_MODULE,
                     "config": CONFIG_FUNCTION, "overrides": []}, tmp_path)
    return next(layer.moe for layer in config.model_spec.model.layers if layer.moe is not None)


@pytest.mark.parametrize("path, case", [
    (FILE, None),
    (MOE_CASES / "deepseek_v3_ts_consts.onnx", "deepseek_v3"),
    (MOE_CASES / "deepseek_v3_wide_dynamo_consts.onnx", "deepseek_v3_wide"),
])
def test_torchtitans_router_computes_transformers_weights(path, case, tmp_path):
    pytest.importorskip("torchtitan")
    import torch
    import transformers

    counts = json.loads((path.parent / "counts.json").read_text())
    fields = counts["config"] if case is None else counts["configs"][case]
    moe = _written_router(path, tmp_path)
    hf = transformers.DeepseekV3Config(**fields)
    assert moe.shared_experts.w1.out_features == hf.moe_intermediate_size * hf.n_shared_experts
    reference = _hf_router(fields)
    router = moe.router.build()
    with torch.no_grad():
        router.gate.weight.copy_(reference.weight)
        hidden = torch.randn(512, fields["hidden_size"], generator=torch.Generator().manual_seed(1))
        _, weights, indices = reference(hidden)
        theirs = torch.zeros(512, fields["n_routed_experts"]).scatter(1, indices, weights)
        ours_weights, ours_indices, _ = router(hidden[None], reference.e_score_correction_bias)
        ours = torch.zeros(512, fields["n_routed_experts"]).scatter(1, ours_indices[0], ours_weights[0])
    assert torch.equal(theirs != 0, ours != 0)  # the same experts for every token
    assert torch.allclose(theirs, ours, rtol=1e-6, atol=1e-7)
    # normalised, then scaled: each token's weights sum to routed_scaling_factor
    assert torch.allclose(ours.sum(-1), torch.full((512,), fields["routed_scaling_factor"]))
