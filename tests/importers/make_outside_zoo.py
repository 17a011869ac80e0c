"""Build the GPT-J, ALBERT and DINOv2 files of ``tests/importers/test_outside_zoo.py`` (issue 25), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.x); no downloads, random weights,
seed 0, with ``tests/zoo/make_zoo.py``'s builders and graph-only saving (every initializer external, the
data file deleted: ``bare``)::

    .venv-integration/bin/python tests/importers/make_outside_zoo.py

Three architectures outside the zoo whose first exports the importer counted wrong without a warning:

* ``gptj_dynamo_bare`` (``GPTJForCausalLM``): the rotary sin/cos table is a non-persistent buffer
  (``embed_positions`` [256, 8]) that the dynamo exporter writes as ``val_N``, gathered by position and
  multiplied into Q and K; it was counted as an embedding table (+2,048).
* ``albert_dynamo_bare`` (``AlbertForMaskedLM``): one shared layer called twice; the dynamo exporter
  folds each call's weight transpose into its own ``val_N``, so each Linear weight was counted twice
  (+32,768).
* ``dinov2_ts_bare`` (``Dinov2Model``): TorchScript cuts ``position_embeddings`` [1, 17, 64] into its
  class row and its 4 x 4 patch grid, interpolates the grid and joins them; the grid was not counted
  (-1,024).

``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())`` and the elements of
parameters no forward op reads (DINOv2's ``mask_token``, used only with ``bool_masked_pos``), which no
export of this forward can hold.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "outside_zoo"
_spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
mz = importlib.util.module_from_spec(_spec)
sys.modules["make_zoo"] = mz
_spec.loader.exec_module(mz)

_ENCODER = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                vocab_size=1000, embedding_size=32, max_position_embeddings=128)


def _gptj(*, realistic: bool, exporter: str, fake: bool):
    cfg = dict(n_layer=2, n_embd=64, n_head=4, rotary_dim=8, vocab_size=1000, n_positions=256,
               bos_token_id=None, eos_token_id=None)
    return mz._causal_lm("GPTJForCausalLM", "GPTJConfig", cfg, exporter=exporter, fake=fake, seq=16,
                         max_key="n_positions")


def _albert(*, realistic: bool, exporter: str, fake: bool):
    return mz._masked_lm("AlbertForMaskedLM", "AlbertConfig", dict(_ENCODER), exporter=exporter, fake=fake,
                         seq=16, max_seq=128)


def _dinov2(*, realistic: bool, exporter: str, fake: bool):
    cfg = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, mlp_ratio=2, image_size=32, patch_size=8)
    return mz._vision("Dinov2Model", "Dinov2Config", cfg, exporter=exporter, fake=fake, image=32)


CASES = {"gptj": (_gptj, "dynamo"), "albert": (_albert, "dynamo"), "dinov2": (_dinov2, "ts")}
UNREAD = {"dinov2": ("embeddings.mask_token",)}


def main() -> int:
    counts = {}
    for name, (build, exporter) in CASES.items():
        built = build(realistic=False, exporter=exporter, fake=False)
        params = dict(built.model.named_parameters())
        proto = mz._export(built, exporter, fake=False, data_name=f"{name}_{exporter}_bare.onnx.data")
        path = OUT / f"{name}_{exporter}_bare.onnx"
        mz.save_graph_only(proto, path, threshold_bytes=0)
        counts[path.name] = {
            "model_class": built.config["model_class"],
            "param_count": sum(p.numel() for p in params.values()),
            "unread_param_count": sum(params[n].numel() for n in UNREAD.get(name, ())),
            "dims": sorted({d for dims in built.input_dims.values() for d in dims if isinstance(d, str)}),
        }
        print(path.name, counts[path.name], flush=True)
    (OUT / "counts.json").write_text(json.dumps(counts, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
