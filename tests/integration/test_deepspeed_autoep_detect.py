"""DeepSpeed 0.19.8's own AutoEP and DeepSpeed-MoE gate on the configs of ``tests/data/moe_sweep_cases``: what
``exporters.deepspeed.autoep`` assumes when DeepSpeed lists no ``ep > 1`` row for Jamba and Granite-MoE,
and names a preset and pins ``route_norm`` for OLMoE and Qwen2-MoE (issue 25, task H9).

The models are the generator's configs with fresh random weights (transformers 5.24); AutoEP's
``ep_parser`` only walks ``named_modules`` (``module_inject/auto_ep.py:417-629``), so no process group is needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

from exporters.deepspeed.autoep import autoep_preset, expert_parallel_problem  # noqa: E402
from planner.plan import load_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "importers"))
from make_moe_sweep_cases import CASES  # noqa: E402

DIMS = {"batch": 8, "seq": 16}
OLD_SECTION = {"enabled": True, "autoep_size": 2, "top_k": 2}
"""What the export wrote for every softmax MoE model before task H9."""


def _specs(name: str, section: dict) -> list:
    from deepspeed.module_inject.auto_ep import AutoEP
    from deepspeed.module_inject.auto_ep_config import parse_autoep_config

    cls, config_cls, config, _ = CASES[name]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(getattr(transformers, config_cls)(**config))
    return AutoEP(model, parse_autoep_config(dict(section))).ep_parser()


@pytest.mark.parametrize("name", ["jamba", "granitemoe"])
def test_autoep_finds_no_block_where_the_planner_refuses_ep(name):
    graph = load_graph(ROOT / "tests" / "data" / "moe_sweep_cases" / f"{name}_ts_bare.onnx", DIMS)
    assert expert_parallel_problem(graph) is not None
    # deepspeed logs "AutoEP: no MoE layers detected in model." and trains every expert on every rank
    assert _specs(name, OLD_SECTION) == []


def test_olmoe_without_a_preset_is_ambiguous():
    # model_type 'olmoe' is in no preset, so all six are tried and all six match model.layers.N.mlp
    with pytest.raises(ValueError, match="ambiguous"):
        _specs("olmoe", OLD_SECTION)


@pytest.mark.parametrize("name, layers, shared", [("olmoe", 2, False), ("qwen2moe", 2, True)])
def test_the_exported_section_finds_every_block_with_the_models_routing(name, layers, shared):
    graph = load_graph(ROOT / "tests" / "data" / "moe_sweep_cases" / f"{name}_ts_bare.onnx", DIMS)
    assert expert_parallel_problem(graph) is None
    section = dict(OLD_SECTION, score_func="softmax", route_norm=False, preset_model=autoep_preset(graph))
    specs = _specs(name, section)
    # 2 layers, every one MoE (decoder_sparse_step 1); the configs' num_experts and top-k
    assert len(specs) == layers
    assert all(s.num_experts == CASES[name][2]["num_experts"] and s.top_k == 2 for s in specs)
    assert all(s.has_shared_experts == shared for s in specs)
    assert all(s.route_norm is False for s in specs)


def test_deepspeed_moe_top2_gate_renormalises():
    from deepspeed.moe.sharded_moe import top2gating

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    _, combine, _, _ = top2gating(logits, capacity_factor=4.0, min_capacity=4, top2_2nd_expert_sampling=False)
    weights = combine.sum(dim=-1)[0]
    # softmax of (2, 1, 0, -1): e^2, e^1 over e^2 + e^1 + 1 + e^-1 = 0.6439, 0.2369 (sum 0.8808, as Jamba
    # and OLMoE keep them); renormalised: e^2 / (e^2 + e) = 0.7311, e / (e^2 + e) = 0.2689
    assert weights[0].item() == pytest.approx(0.7311, abs=1e-4)
    assert weights[1].item() == pytest.approx(0.2689, abs=1e-4)
