"""Build ``tests/data/einsum_attention_cases/``, the real files of ``tests/importers/test_einsum_attention.py``
(issue 25, einsum-form attention): Transformer-XL-style relative attention written with ``torch.einsum``.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
exported by TorchScript (``dynamo=False``, opset 17, dynamic batch and seq, traced at batch 2 x 64 tokens) and
saved graph-only (every initializer over 1 KiB external, its data file deleted)::

    .venv-integration/bin/python tests/importers/make_einsum_attention_cases.py

* ``xlnet_ts_bare`` (``XLNetLMHeadModel``: 2 layers, ``d_model`` 128, 4 heads of 32, ``d_inner`` 256): sequence-first
  (``[len, bsz, d]``), its sinusoid position table ``expand``-ed over the batch and projected by ``r``;
* ``funnel_ts_bare`` (``FunnelForMaskedLM``: blocks ``[1, 1]``, one decoder layer, ``d_model`` 128, 4 heads of 32,
  ``d_inner`` 256): its per-head biases folded with the scale, its token-type term against ``seg_embed``. Its
  export bakes the traced 64 tokens into some reshapes: import it at ``seq=64``.

The dynamo exporter fails on XLNet (``aten.sub``, no compatible overload) and writes Funnel in 788 KB, too big for
a fixture. ``counts.json`` records the config and torch's ``sum(p.numel())`` per file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "einsum_attention_cases"
CASES = {
    "xlnet": ("XLNetConfig", "XLNetLMHeadModel", dict(vocab_size=1000, d_model=128, n_layer=2, n_head=4, d_inner=256)),
    "funnel": ("FunnelConfig", "FunnelForMaskedLM", dict(vocab_size=1000, block_sizes=[1, 1], num_decoder_layers=1,
                                                          d_model=128, n_head=4, d_head=32, d_inner=256)),
}
"""name: (config class, model class, config)."""


def _export(torch, transformers, name: str) -> int:
    """Export ``name`` graph-only; returns torch's parameter count."""
    config_cls, model_cls, config = CASES[name]
    cfg = getattr(transformers, config_cls)(**config)
    cfg._attn_implementation, cfg.use_cache = "eager", False
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # distinct values: the TorchScript exporter merges equal initializers (fresh norms)
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))

    class Wrap(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    ids = torch.randint(3, 1000, (2, 64))
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    path = OUT / f"{name}_ts_bare.onnx"
    torch.onnx.export(Wrap().eval(), (ids, torch.ones_like(ids)), str(path), input_names=list(axes),
                      output_names=["logits"], dynamic_axes=axes, dynamo=False, opset_version=17)
    import onnx

    proto = onnx.load(str(path))
    data = path.name + ".data"
    onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data,
              size_threshold=1024)
    os.remove(OUT / data)
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    import torch
    import transformers

    OUT.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name in CASES:
        counts[f"{name}_ts_bare.onnx"] = {"params": _export(torch, transformers, name), "config": CASES[name][2]}
    (OUT / "counts.json").write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
