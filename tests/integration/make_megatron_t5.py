"""Write ``tests/exporters/data/megatron_t5_tiny.onnx`` (graph only): an encoder-decoder built the way
megatron-core 0.16.1's ``T5Model`` computes it with Megatron-LM's default flags, so the Megatron exporter
has an encoder-decoder it can export exactly through ``pretrain_t5.py`` (issue 25).

Hugging Face's T5 is not one (relative-position buckets, ReLU or GeGLU MLPs, no ``1/sqrt(d)`` in the
attention, RMSNorm, a rescaled tied head): see ``exporters/megatron/t5.py``. This one follows
megatron-core's modules (``models/T5/t5_model.py``, ``models/T5/t5_spec.py``'s local specs):

* ``LanguageModelEmbedding``, one for both stacks: word + learned absolute position embeddings
  (``position_embedding_type='learned_absolute'``, ``t5_position_ids``: ``arange(s)``), summed, no norm;
* encoder ``TransformerLayer``: ``x + attn(LN(x))`` with a ``[b, 1, 1, s]`` padding mask, then
  ``x + mlp(LN(x))``; decoder ``TransformerLayer``: causal self-attention, then
  ``x + cross_attn(LN(x), encoder output)`` (``linear_q`` on the decoder, ``linear_kv`` on the encoder's
  output, a per-key padding mask), then the MLP; biases on every linear, GELU (erf) MLPs,
  ``softmax(q k^T / sqrt(d))``;
* each ``TransformerBlock``'s final norm;
* ``T5LMHead``: the output layer tied to the word embedding, with a bias
  (``ColumnParallelLinear(bias=share_embeddings_and_output_weights)``).

Sizes in :data:`SIZES`; the dynamo exporter at opset 18, weights of 1 KiB or more stripped
(``examples/make_examples.py``'s ``save``). Needs ``.venv-integration``::

    .venv-integration/bin/python tests/integration/make_megatron_t5.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import make_examples  # noqa: E402

OUT = ROOT / "tests" / "exporters" / "data"

SIZES = dict(layers=2, hidden=64, heads=4, ffn=256, vocab=1000, max_positions=128, seq=16, tgt_seq=8, batch=2)
"""The fixture's sizes: ``layers`` in each stack (the integration test reads them back from the export)."""


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, mask: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + mask) v`` over ``heads`` heads, ``[b, s, h]`` in and out."""
    b, sq, h = q.shape
    d = h // heads
    q, k, v = (t.reshape(b, t.shape[1], heads, d).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / d ** 0.5 + mask
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, sq, h)


class _Mlp(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.pre_mlp_layernorm = nn.LayerNorm(hidden)
        self.linear_fc1 = nn.Linear(hidden, ffn)
        self.linear_fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.linear_fc2(F.gelu(self.linear_fc1(self.pre_mlp_layernorm(x))))


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.input_layernorm = nn.LayerNorm(hidden)
        self.linear_qkv = nn.Linear(hidden, 3 * hidden)
        self.linear_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.linear_qkv(self.input_layernorm(x)).chunk(3, dim=-1)
        return x + self.linear_proj(_attend(q, k, v, self.heads, mask))


class _CrossAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.pre_cross_attn_layernorm = nn.LayerNorm(hidden)
        self.linear_q = nn.Linear(hidden, hidden)
        self.linear_kv = nn.Linear(hidden, 2 * hidden)
        self.linear_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, context: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        k, v = self.linear_kv(context).chunk(2, dim=-1)
        q = self.linear_q(self.pre_cross_attn_layernorm(x))
        return x + self.linear_proj(_attend(q, k, v, self.heads, mask))


class MegatronT5(nn.Module):
    """megatron-core's T5Model, in plain torch (module docstring)."""

    def __init__(self, *, layers: int, hidden: int, heads: int, ffn: int, vocab: int, max_positions: int,
                 **_: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.encoder = nn.ModuleList(nn.ModuleList([_SelfAttention(hidden, heads), _Mlp(hidden, ffn)])
                                     for _ in range(layers))
        self.encoder_final_layernorm = nn.LayerNorm(hidden)
        self.decoder = nn.ModuleList(
            nn.ModuleList([_SelfAttention(hidden, heads), _CrossAttention(hidden, heads), _Mlp(hidden, ffn)])
            for _ in range(layers))
        self.decoder_final_layernorm = nn.LayerNorm(hidden)
        self.output_bias = nn.Parameter(torch.zeros(vocab))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(ids) + self.position_embeddings(torch.arange(ids.shape[1], device=ids.device))

    def forward(self, encoder_input_ids, decoder_input_ids, encoder_attention_mask):
        padding = (1.0 - encoder_attention_mask[:, None, None, :].float()) * -10000.0  # [b, 1, 1, s]: per key
        x = self._embed(encoder_input_ids)
        for attention, mlp in self.encoder:
            x = mlp(attention(x, padding))
        context = self.encoder_final_layernorm(x)
        y = self._embed(decoder_input_ids)
        t = decoder_input_ids.shape[1]
        positions = torch.arange(t, device=y.device)
        causal = (positions[None, :] > positions[:, None]).float() * -10000.0  # key after query: masked
        for attention, cross, mlp in self.decoder:
            y = mlp(cross(attention(y, causal), context, padding))
        return self.decoder_final_layernorm(y) @ self.word_embeddings.weight.t() + self.output_bias


def build() -> tuple[nn.Module, tuple, tuple]:
    torch.manual_seed(0)
    model = MegatronT5(**SIZES).eval()
    with torch.no_grad():  # distinct values: the exporter merges equal small initializers (ones, zeros)
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    b, s, t = SIZES["batch"], SIZES["seq"], SIZES["tgt_seq"]
    args = (torch.randint(0, SIZES["vocab"], (b, s)), torch.randint(0, SIZES["vocab"], (b, t)),
            torch.ones(b, s, dtype=torch.long))
    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("seq", max=SIZES["max_positions"])
    tgt = torch.export.Dim("tgt_seq", max=SIZES["max_positions"])
    return model, args, ({0: batch, 1: seq}, {0: batch, 1: tgt}, {0: batch, 1: seq})


def main() -> int:
    model, args, shapes = build()
    with torch.no_grad():
        program = torch.onnx.export(model, args, dynamo=True, opset_version=18, dynamic_shapes=shapes)
    path = OUT / "megatron_t5_tiny.onnx"
    make_examples.save(program.model_proto, path, inline_weights=False)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {path} ({path.stat().st_size} bytes, {params} parameters)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
