"""megatron-core 0.16.1 takes the GPT-OSS-style export (issue 25, task h26e): ``TransformerConfig`` accepts the flags
of both fixtures of ``tests/data/gpt_oss_cases`` with the sinks, the quick-GEGLU gate, its clamp and offset, the
alternating window and the biases they say; and megatron-core's own functions compute what transformers 5.24's
GPT-OSS computes: ``SoftmaxOne`` with the sink logits as transformers' ``eager_attention_forward`` of
``modeling_gpt_oss``, and the quick-GEGLU gate with the exported clamp and offset as ``GptOssExperts._apply_gate``
(on fc1's columns de-interleaved: GPT-OSS's gate and linear halves alternate, Megatron's are the two halves)."""

from __future__ import annotations

import pytest

from exporters.validate import parse_megatron_args
from planner.plan import load_graph
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_gpt_oss import CASES, FILES, _export

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=FILES)
def args(request):
    return parse_megatron_args(_export(load_graph(CASES / request.param, {"batch": 8, "seq": 16}))["args"])


def test_transformer_config_takes_the_gpt_oss_export(args):
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention

    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert config.softmax_type == "learnable"
    assert config.gated_linear_unit and config.activation_func is quick_gelu and not config.bias_activation_fusion
    assert (config.activation_func_clamp_value, config.glu_linear_offset) == (7.0, 1.0)
    assert config.add_bias_linear and config.num_moe_experts == 4 and config.num_query_groups == 2
    # layer 1 windowed, layer 2 full: GptOssConfig's layer_types ["sliding_attention", "full_attention"]
    assert [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n) for n in (1, 2)] == [True, False]


def test_megatron_sink_softmax_is_gpt_oss_attention():
    from types import SimpleNamespace

    from megatron.core.fusions.fused_softmax import SoftmaxOne
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    generator = torch.Generator().manual_seed(0)
    batch, heads, seq, dim = 2, 4, 6, 8
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=generator) for _ in range(3))
    sinks = torch.randn(heads, generator=generator) * 3
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=1, training=False)
    expected, _ = eager_attention_forward(module, q, k, v, None, scaling=dim ** -0.5)  # [b, s, h, d]
    probs = SoftmaxOne(-1, sinks)(q @ k.transpose(2, 3) * dim ** -0.5)
    assert torch.allclose((probs @ v).transpose(1, 2), expected, atol=1e-6)


def test_megatron_quick_geglu_with_the_exported_clamp_and_offset_is_gpt_oss_gate(args):
    import torch._dynamo

    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from megatron.core.fusions.fused_bias_geglu import weighted_bias_quick_geglu_impl

    experts = GptOssExperts(GptOssConfig(hidden_size=64, intermediate_size=8, num_local_experts=2))
    gate_up = torch.randn(5, 16, generator=torch.Generator().manual_seed(0)) * 6  # past the clamp at 7
    halves = torch.cat([gate_up[..., ::2], gate_up[..., 1::2]], dim=-1)
    with torch._dynamo.config.patch(disable=True):  # megatron's jit_fuser is torch.compile: eager on this CPU machine
        found = weighted_bias_quick_geglu_impl(halves, None, torch.ones(5, 1), False, float(args["glu-linear-offset"]),
                                               float(args["activation-func-clamp-value"]))
    assert torch.allclose(found, experts._apply_gate(gate_up), atol=1e-6)
