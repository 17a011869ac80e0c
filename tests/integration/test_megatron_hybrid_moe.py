"""Issue 25 (h26d) with megatron-core itself: Granite-4.0-H's Megatron-LM refusal says megatron-core 0.16.1 builds
its MoE layers ('E', with a shared expert) and the planner's hybrid export does not write them
(``tests/exporters/test_megatron_hybrid_moe.py``). This checks the first half against megatron-core's code: the
pattern the importer reads (``ME*E``) is one ``allocate_layers`` accepts, and ``mamba_stack_spec`` builds an
``E`` layer as a ``MoETransformerLayer`` whose MoE has shared experts.
"""

from __future__ import annotations

import pytest

from exporters.megatron.mamba import hybrid_stack
from planner.plan import load_graph
from tests.exporters.test_megatron_hybrid_moe import CASES, DIMS, NAME

pytestmark = pytest.mark.integration


def test_megatron_core_builds_the_moe_layers_the_refusal_names():
    pytest.importorskip("megatron.core")
    from megatron.core.models.mamba.mamba_layer_specs import mamba_stack_spec
    from megatron.core.ssm.mamba_hybrid_layer_allocation import Symbols, allocate_layers
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP
    from megatron.core.transformer.transformer_layer import MoETransformerLayer

    pattern = hybrid_stack(load_graph(CASES / NAME, DIMS)).pattern
    assert pattern == "ME*E" and Symbols.MOE == "E"
    assert "".join(allocate_layers(len(pattern), 0.0, 0.0, pattern)) == pattern
    moe_layer = mamba_stack_spec.submodules.moe_layer
    assert moe_layer.module is MoETransformerLayer
    assert moe_layer.submodules.mlp.submodules.shared_experts.module is SharedExpertMLP
