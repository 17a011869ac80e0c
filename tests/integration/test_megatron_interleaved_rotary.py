"""megatron-core's RoPE, built as the Megatron export of ERNIE-4.5 says (--rotary-interleaved read from the graph),
rotates queries as transformers' ERNIE-4.5 does; without the flag it would not (issue 25, h30g).

Reference: transformers 5.24 ``Ernie4_5RotaryEmbedding`` and ``apply_rotary_pos_emb`` (channel pairs (2i, 2i + 1),
cos and sin ``repeat_interleave(2)``); megatron-core 0.16.1 ``RotaryEmbedding(..., rotary_interleaved=...)`` and
``rope_utils._apply_rotary_pos_emb_bshd``, the two ``TransformerConfig.rotary_interleaved`` reaches in ``GPTModel``.
File: ``tests/data/ernie_rotary_cases`` (``tests/exporters/make_ernie_rotary_case.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.megatron.families import megatron_rotary_args
from importers.transformer import analyze_transformer
from planner.plan import load_graph

pytestmark = pytest.mark.integration

CASES = Path(__file__).resolve().parents[1] / "data" / "ernie_rotary_cases"


def test_megatrons_rotation_from_the_export_is_ernies(monkeypatch):
    torch = pytest.importorskip("torch")
    rope_utils = pytest.importorskip("megatron.core.models.common.embeddings.rope_utils")
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import Ernie4_5Config
    from transformers.models.ernie4_5 import modeling_ernie4_5 as ernie

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # get_emb moves inv_freq there
    config = Ernie4_5Config(**{k: v for k, v in json.loads((CASES / "counts.json").read_text())["files"][
        "ernie4_5_dynamo_bare.onnx"]["config"].items() if not k.startswith("example_")})
    graph = load_graph(CASES / "ernie4_5_dynamo_bare.onnx", {"batch": 2, "seq": 16})
    flags, _ = megatron_rotary_args(graph, analyze_transformer(graph))
    seq, heads, dim = 16, config.num_attention_heads, config.head_dim
    torch.manual_seed(0)
    q = torch.randn(1, heads, seq, dim, dtype=torch.float64)
    cos, sin = ernie.Ernie4_5RotaryEmbedding(config)(q, torch.arange(seq)[None])
    expected, _ = ernie.apply_rotary_pos_emb(q, q, cos.double(), sin.double())

    def megatron(interleaved: bool):
        rope = RotaryEmbedding(dim, 1.0, rotary_interleaved=interleaved, rotary_base=int(config.rope_parameters[
            "rope_theta"]), use_cpu_initialization=True)
        freqs = rope.get_emb(seq).double()  # [seq, 1, 1, dim]: forward's, before its context-parallel slice
        out = rope_utils._apply_rotary_pos_emb_bshd(q.permute(2, 0, 1, 3), freqs, rotary_interleaved=interleaved)
        return out.permute(1, 2, 0, 3)

    assert "--rotary-interleaved" in flags
    torch.testing.assert_close(megatron("--rotary-interleaved" in flags), expected, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(megatron(False), expected, atol=1e-3)  # the export before: another rotation
