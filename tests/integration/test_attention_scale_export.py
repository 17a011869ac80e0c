"""The attention scale of a transformers model exported through SDPA is read exactly (issue 25).

transformers 5.x's ``sdpa_attention_forward`` calls ``F.scaled_dot_product_attention(..., scale=
module.scaling)``; TorchScript's SDPA symbolic writes ``Cast(Sqrt(scale))`` on q and on k^T, the
dynamo exporter (torch's SDPA decomposition) ``sqrt(scale)`` as one constant on each. Before issue 25
neither was read (``features.attention_scale`` None), so a Gemma-3 with ``query_pre_attn_scalar`` other
than its head size was not refused by Megatron-LM's export for its scale. Here: a Llama
(``LlamaAttention.scaling = head_dim ** -0.5``) and a Gemma-3 (``Gemma3Attention.scaling =
query_pre_attn_scalar ** -0.5``) with random weights, each exported by both exporters, against the
config's value, and Megatron's refusal of the second.
"""

from __future__ import annotations

import pytest

from exporters.megatron.export import feature_refusals
from importers.attention_scale import attention_scales
from importers.transformer import analyze_transformer
from planner.plan import load_graph

pytestmark = pytest.mark.integration

SEQ = 16
COMMON = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=1000, max_position_embeddings=64, head_dim=16, use_cache=False)
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    # Gemma-3 (transformers 5.24 runs Gemma-2 eagerly only, whose scale was read before issue 25)
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(query_pre_attn_scalar=64, sliding_window=64)),
}


def _export(tmp_path, name: str, exporter: str):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
    model_class, config_class, extra = MODELS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**COMMON, **extra, attn_implementation="sdpa")
    model = getattr(transformers, model_class)(config).eval()
    ids = torch.randint(3, COMMON["vocab_size"], (2, SEQ))
    path = tmp_path / f"{name}_{exporter}.onnx"
    axes = {"input_ids": {0: "batch", 1: "seq"}}
    with torch.no_grad():
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            torch.onnx.export(model, (ids,), str(path), input_names=["input_ids"], dynamo=True,
                              dynamic_shapes=({0: batch, 1: seq},))
        else:  # with a mask: without one, transformers' packed-sequence check calls aten::diff, which has no symbolic
            torch.onnx.export(model, (ids, torch.ones_like(ids)), str(path), input_names=["input_ids", "attention_mask"],
                              dynamic_axes=axes | {"attention_mask": {0: "batch", 1: "seq"}}, dynamo=False,
                              opset_version=17)
    return model, path


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
@pytest.mark.parametrize(("name", "expected"), [("llama", 16 ** -0.5), ("gemma3", 64 ** -0.5)])
def test_the_config_scale_is_read(tmp_path, name, exporter, expected):
    model, path = _export(tmp_path, name, exporter)
    attention = model.model.layers[0].self_attn
    assert attention.scaling == pytest.approx(expected)  # transformers' own: head_dim or query_pre_attn_scalar
    scales = attention_scales(str(path))
    assert len(scales) == 2 and all(s == pytest.approx(expected, rel=1e-6) for s in scales.values()), scales
    graph = load_graph(path, {"batch": 2, "seq": SEQ})
    transformer = analyze_transformer(graph)
    assert transformer.head_dim == 16
    assert transformer.features.attention_scale == pytest.approx(expected, rel=1e-6)
    clause = "scales the attention scores by 1/sqrt(64), not 1/sqrt(16) of its head size"
    assert any(clause in r for r in feature_refusals(transformer)) == (name == "gemma3")
