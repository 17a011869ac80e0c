"""Granite-MoE's top-k-first router against megatron-core 0.16.1's own routing (issue 25, task H1).

The importer reads ``GraniteMoeTopKRouter`` (top-k of the logits, then a softmax over the k chosen) as a
renormalised softmax router, so the Megatron export writes no router flag (``megatron_router_args`` is empty:
``moe_router_pre_softmax=False``, ``score_function="softmax"``). Here transformers' router, built from the
fixture's config with random weights, and megatron-core's ``topk_routing_with_score_function`` with those settings
route random tokens to the same experts with the same weights.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")

from exporters.megatron.moe import megatron_router_args  # noqa: E402
from importers.moe import find_moe_layers  # noqa: E402
from importers.moe_router import router_reading  # noqa: E402
from importers.transformer import moe_summary  # noqa: E402
from planner.plan import load_graph  # noqa: E402

CASES = Path(__file__).resolve().parents[2] / "tests" / "data" / "moe_router_cases"
RECORD = json.loads((CASES / "counts.json").read_text())


@pytest.mark.parametrize("name", sorted(n for n in RECORD["files"] if n.startswith("granite")))
def test_megatron_routes_as_granite_with_the_flags_read(name: str):
    graph = load_graph(CASES / name, {"batch": 4, "seq": 16})
    summary = moe_summary(graph)
    args = {arg for layer in find_moe_layers(graph)
            for arg in megatron_router_args(router_reading(graph, layer), renormalized=summary.renormalized)}
    assert args == set()  # megatron-core's defaults: softmax, moe_router_pre_softmax=False
    case = RECORD["files"][name]["case"]
    config_cls = {"granitemoe": "GraniteMoeConfig", "granitemoeshared": "GraniteMoeSharedConfig"}[case]
    modeling = importlib.import_module(f"transformers.models.{case}.modeling_{case}")
    router_cls = getattr(modeling, f"{config_cls.removesuffix('Config')}TopKRouter")
    config = getattr(transformers, config_cls)(**RECORD["configs"][case])
    torch.manual_seed(0)
    router = router_cls(config)
    torch.nn.init.normal_(router.weight, std=0.5)
    hidden = torch.randn(512, config.hidden_size, dtype=torch.float64)
    router = router.double()
    with torch.no_grad():
        logits, weights, index = router(hidden)
        probs, routing_map = moe_utils.topk_routing_with_score_function(
            logits, summary.top_k, use_pre_softmax="--moe-router-pre-softmax" in args, score_function="softmax")
    assert routing_map.sum(dim=-1).eq(summary.top_k).all()
    assert routing_map.gather(1, index).all()  # the same experts
    torch.testing.assert_close(probs.gather(1, index), weights.to(probs.dtype), rtol=1e-12, atol=1e-12)
