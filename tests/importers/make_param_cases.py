"""Build the ONNX files of ``tests/importers/test_param_patterns.py`` (issue 25), with torch.

Run with the integration environment (torch CPU, transformers); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_param_cases.py

Each model is exported by both of torch's exporters, in the form that keeps the pattern under test
(the optimiser of a real-size export leaves ``weight + 1`` unfolded once the weight has more than
8,192 elements: here ``optimize=False`` / ``do_constant_folding=False`` keep it at a small size), and
saved graph-only (every initializer external, its data file deleted: ``bare``) or with its small
constants inline (``consts``). ``counts.json`` records per file torch's own parameter count
(``sum(p.numel() for p in model.parameters())``) and the elements of the parameters a folded copy
is made of (``derived_elements``: RWKV's ``time_mix_*``, read by the test of the warning).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "param_cases"
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_zoo import save_graph_only  # noqa: E402  (the zoo's graph-only writer)

SEED = 0


class _DecoderLayer(nn.Module):
    """DETR's decoder layer: queries plus their learned positions, self- then cross-attention."""

    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.n1, self.n2, self.n3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, tgt, memory, query_pos, pos):
        q = k = tgt + query_pos
        tgt = self.n1(tgt + self.self_attn(q, k, tgt, need_weights=False)[0])
        tgt = self.n2(tgt + self.cross_attn(tgt + query_pos, memory + pos, memory, need_weights=False)[0])
        return self.n3(tgt + self.fc2(torch.relu(self.fc1(tgt))))


class DetrLikeDecoder(nn.Module):
    """DETR's decoder and heads: the object queries start as zeros, their positions are a learned
    table (``query_embed``) tiled to the batch."""

    def __init__(self, d: int = 32, heads: int = 4, ffn: int = 64, layers: int = 2, queries: int = 10,
                 classes: int = 5) -> None:
        super().__init__()
        self.query_embed = nn.Embedding(queries, d)
        self.layers = nn.ModuleList(_DecoderLayer(d, heads, ffn) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.class_embed = nn.Linear(d, classes + 1)
        self.bbox = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 4))

    def forward(self, memory, pos):
        query_pos = self.query_embed.weight.unsqueeze(0).repeat(memory.shape[0], 1, 1)
        tgt = torch.zeros_like(query_pos)
        for layer in self.layers:
            tgt = layer(tgt, memory, query_pos, pos)
        h = self.norm(tgt)
        return self.class_embed(h), self.bbox(h).sigmoid()


class _Logits(nn.Module):
    """A transformers causal LM called with ``input_ids`` alone, returning the logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        # An all-ones mask: without one, transformers checks the positions with aten::diff, which
        # the TorchScript exporter cannot export (as in tests/zoo/make_zoo.py).
        mask = torch.ones_like(input_ids)
        return self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits


def _randomise(model: nn.Module) -> nn.Module:
    torch.manual_seed(SEED)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model.eval()


def _export(model: nn.Module, args: tuple, names: list[str], outputs: list[str], stem: str, *,
            fold: bool) -> dict[str, int]:
    """Both exporters, graph-only; returns file name -> torch's parameter count."""
    count = sum(p.numel() for p in model.parameters())
    dynamic = {"batch": torch.export.Dim("batch", max=64), "seq": torch.export.Dim("seq", max=64)}
    with torch.no_grad():
        program = torch.onnx.export(model, args, dynamo=True, opset_version=18, optimize=fold,
                                    dynamic_shapes=tuple({0: dynamic["batch"], 1: dynamic["seq"]} for _ in names))
    protos = {"dynamo": program.model_proto}
    path = OUT / f"{stem}_ts_full.onnx"
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17, do_constant_folding=fold,
                          input_names=names, output_names=outputs,
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in names})
    protos["ts"] = onnx.load(str(path))
    path.unlink()
    counts = {}
    for exporter, proto in protos.items():
        for style, threshold in (("bare", 0), ("consts", 1024)):
            name = f"{stem}_{exporter}_{style}.onnx"
            save_graph_only(proto, OUT / name, threshold_bytes=threshold)
            counts[name] = count
    return counts


def write_causal_lm_cases(out: Path, cases: dict[str, dict], keep: tuple[str, ...], config_class: str,
                          model_class: str) -> None:
    """Export each case of ``cases`` (stem -> config fields) as transformers' ``model_class`` built from
    ``config_class``, random weights at seed 0, traced on 2 x 16 token ids, with both exporters and both graph-only
    styles; keep the files named in ``keep`` in ``out`` beside a ``counts.json`` of the configs and each kept file's
    case and torch parameter count."""
    import transformers

    global OUT
    OUT = out  # _export writes where the calling script's files go
    out.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict] = {}
    for stem, fields in cases.items():
        torch.manual_seed(SEED)
        config = getattr(transformers, config_class)(**fields)
        model = _randomise(_Logits(getattr(transformers, model_class)(config)))
        ids = torch.randint(0, fields["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
        for name, count in _export(model, (ids,), ["input_ids"], ["logits"], stem, fold=True).items():
            if name in keep:
                records[name] = {"case": stem, "param_count": count}
            else:
                (out / name).unlink()
    (out / "counts.json").write_text(json.dumps({"configs": cases, "files": records}, indent=1, sort_keys=True) + "\n")


def main() -> int:
    import transformers

    OUT.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict[str, int]] = {}
    torch.manual_seed(SEED)
    # LayerNorm1P (Nemotron): LayerNormalization(x, weight + 1, bias); GELU so Megatron runs it.
    nemotron = transformers.NemotronConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
        hidden_act="gelu")
    model = _randomise(_Logits(transformers.NemotronForCausalLM(nemotron)))
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(SEED))
    for name, count in _export(model, (ids,), ["input_ids"], ["logits"], "nemotron", fold=False).items():
        records[name] = {"param_count": count, "derived_elements": 0}
    detr = _randomise(DetrLikeDecoder())
    memory = (torch.randn(2, 12, 32), torch.randn(2, 12, 32))
    for name, count in _export(detr, memory, ["memory", "pos"], ["logits", "boxes"], "detr", fold=True).items():
        records[name] = {"param_count": count, "derived_elements": 0}
    rwkv = transformers.RwkvConfig(vocab_size=96, hidden_size=32, attention_hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, context_length=16, use_cache=False)
    model = _randomise(_Logits(transformers.RwkvForCausalLM(rwkv)))
    mixes = sum(p.numel() for n, p in model.named_parameters() if "time_mix" in n)
    ids = torch.randint(0, 96, (2, 4), generator=torch.Generator().manual_seed(SEED))
    for name, count in _export(model, (ids,), ["input_ids"], ["logits"], "rwkv", fold=True).items():
        records[name] = {"param_count": count, "derived_elements": mixes}
    (OUT / "counts.json").write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
