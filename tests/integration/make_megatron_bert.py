"""Write ``tests/exporters/data/megatron_bert_tiny.onnx`` and ``megatron_bert_binary_tiny.onnx``
(graph only): a BERT built the way megatron-core 0.16.1's ``BertModel`` computes it, so the
Megatron exporter has a bidirectional model it can export exactly (issue 25).

Hugging Face has no such model: its BERT and RoBERTa are post-LN with an embedding norm, and its
RoBERTa-PreLayerNorm keeps the embedding norm. This one follows megatron-core's modules:

* ``LanguageModelEmbedding``: word + learned absolute position (+ a 2-row token-type table with the
  binary head) embeddings, summed, no norm;
* ``TransformerLayer`` with ``bert_layer_local_spec``: ``x + attn(LN(x))``, then ``x + mlp(LN(x))``,
  bidirectional attention with a ``[b, 1, 1, s]`` padding mask, biases on every linear, GELU (erf) MLP;
* ``TransformerBlock``'s final norm;
* ``BertLMHead``: linear hidden x hidden, GELU, norm; the output layer tied to the word embedding,
  with a bias;
* with the binary head: ``Pooler`` (linear hidden x hidden and tanh on the first token) and a
  hidden x 2 linear.

Sizes in :data:`SIZES`; the dynamo exporter at opset 18, weights of 1 KiB or more stripped
(``examples/make_examples.py``'s ``save``). Needs ``.venv-integration``::

    .venv-integration/bin/python tests/integration/make_megatron_bert.py
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

SIZES = dict(layers=2, hidden=64, heads=4, ffn=256, vocab=1000, max_positions=128, seq=16, batch=2)
"""The fixtures' sizes (the integration test reads them back from the export's flags)."""


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.input_layernorm = nn.LayerNorm(hidden)
        self.linear_qkv = nn.Linear(hidden, 3 * hidden)
        self.linear_proj = nn.Linear(hidden, hidden)
        self.pre_mlp_layernorm = nn.LayerNorm(hidden)
        self.linear_fc1 = nn.Linear(hidden, ffn)
        self.linear_fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.linear_qkv(self.input_layernorm(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5 + padding  # [b, 1, 1, s]: per key only
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.linear_proj(attn)
        return x + self.linear_fc2(F.gelu(self.linear_fc1(self.pre_mlp_layernorm(x))))


class MegatronBert(nn.Module):
    """megatron-core's BertModel, in plain torch (module docstring)."""

    def __init__(self, *, binary_head: bool, layers: int, hidden: int, heads: int, ffn: int, vocab: int,
                 max_positions: int, **_: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.tokentype_embeddings = nn.Embedding(2, hidden) if binary_head else None
        self.layers = nn.ModuleList(_Layer(hidden, heads, ffn) for _ in range(layers))
        self.final_layernorm = nn.LayerNorm(hidden)
        self.lm_dense = nn.Linear(hidden, hidden)
        self.lm_layernorm = nn.LayerNorm(hidden)
        self.output_bias = nn.Parameter(torch.zeros(vocab))
        self.pooler = nn.Linear(hidden, hidden) if binary_head else None
        self.binary_head = nn.Linear(hidden, 2) if binary_head else None

    def forward(self, input_ids, attention_mask, tokentype_ids=None):
        s = input_ids.shape[1]
        x = self.word_embeddings(input_ids) + self.position_embeddings(torch.arange(s, device=input_ids.device))
        if self.tokentype_embeddings is not None:
            x = x + self.tokentype_embeddings(tokentype_ids)
        padding = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        for layer in self.layers:
            x = layer(x, padding)
        x = self.final_layernorm(x)
        logits = self.lm_layernorm(F.gelu(self.lm_dense(x))) @ self.word_embeddings.weight.t() + self.output_bias
        if self.binary_head is None:
            return logits
        return logits, self.binary_head(torch.tanh(self.pooler(x[:, 0])))


def build(binary_head: bool) -> tuple[nn.Module, tuple, dict]:
    torch.manual_seed(0)
    model = MegatronBert(binary_head=binary_head, **SIZES).eval()
    with torch.no_grad():  # distinct values: the exporter merges equal small initializers (ones, zeros)
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    b, s = SIZES["batch"], SIZES["seq"]
    args = [torch.randint(0, SIZES["vocab"], (b, s)), torch.ones(b, s, dtype=torch.long)]
    if binary_head:
        args.append(torch.zeros(b, s, dtype=torch.long))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=SIZES["max_positions"])
    shapes = tuple({0: batch, 1: seq} for _ in args)
    return model, tuple(args), shapes


def main() -> int:
    for name, binary in (("megatron_bert_tiny", False), ("megatron_bert_binary_tiny", True)):
        model, args, shapes = build(binary)
        with torch.no_grad():
            program = torch.onnx.export(model, args, dynamo=True, opset_version=18, dynamic_shapes=shapes)
        path = OUT / f"{name}.onnx"
        make_examples.save(program.model_proto, path, inline_weights=False)
        params = sum(p.numel() for p in model.parameters())
        print(f"wrote {path} ({path.stat().st_size} bytes, {params} parameters)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
