"""Issue 25 (h28f) with megatron-core itself: the GPT family's MoE exports at tp > 1 (``exporters/_tp.py``
``_moe_token_ops``, ``exporters/megatron/export.py``) carry ``--sequence-parallel``, without which megatron-core
0.16.1's ``MoELayer.forward`` raises while training (checked on two gloo ranks in
``tests/integration/test_megatron_hybrid_experts.py``, the same ``MoETransformerLayer``). ``TransformerConfig`` accepts
Qwen2-MoE's ``dp=2 x tp=2 sp x ep=2`` export, its expert tensor-parallel size the tp size (its default), as priced.
"""

from __future__ import annotations

import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration


def test_transformer_config_accepts_qwen2_moe_at_tp2_with_sequence_parallelism():
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    from planner.plan import load_graph
    from tests.exporters.test_megatron_features import DATA, DIMS, _export

    args = parse_megatron_args(_export(load_graph(DATA / "qwen2_moe_tiny.onnx", DIMS), dp=2, tp=2, ep=2,
                                       sequence_parallel=True)["args"])
    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert (config.tensor_model_parallel_size, config.sequence_parallel, config.expert_tensor_parallel_size) == (2, True, 2)
    assert (config.num_moe_experts, config.moe_router_topk, config.expert_model_parallel_size) == (4, 2, 2)
