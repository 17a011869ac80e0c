"""Build ``tests/data/gelu_cases/``, the files of ``tests/importers/test_gelu_forms.py`` (issue 25: which GELU
an ONNX ``Gelu`` node computes), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24, onnxscript); no downloads, random
weights, seed 0, with ``tests/zoo/make_zoo.py``'s builders, its dynamo export at opset 20 (the first with
ONNX's ``Gelu``, whose ``approximate`` attribute is ``"none"`` or ``"tanh"``) and graph-only saving (every
initializer external, the data file deleted: ``bare``)::

    .venv-integration/bin/python tests/importers/make_gelu_cases.py

Each is 2 layers, hidden 64, 4 heads, FFN 128, vocabulary 1,000, 128 positions:

* ``bert_gelu_tanh_dynamo20_bare`` (``BertForMaskedLM``, ``hidden_act="gelu_pytorch_tanh"``): the MLPs and
  the MLM head transform write one ``Gelu`` node each with ``approximate="tanh"``;
* ``bert_gelu_dynamo20_bare`` (``hidden_act="gelu"``): the twin, ``Gelu`` nodes with ``approximate="none"``;
* ``gpt2_gelu_tanh_dynamo20_bare`` (``GPT2LMHeadModel``, ``activation_function="gelu_pytorch_tanh"``): a
  causal LM whose MLPs are tanh ``Gelu`` nodes (Megatron-LM's GPT computes erf GELU).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "gelu_cases"
OPSET = 20
"""ONNX's ``Gelu`` op is in opset 20 and later; at 18 the dynamo exporter writes its ``Tanh`` / ``Erf``."""
_BERT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
             max_position_embeddings=128)
_GPT2 = dict(n_layer=2, n_embd=64, n_head=4, n_inner=128, vocab_size=1000, n_positions=128,
             activation_function="gelu_pytorch_tanh")


def main() -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import,
    # so the unit run's doctest collection of this file needs neither
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    mz.EXPORTERS["dynamo"] = OPSET
    OUT.mkdir(parents=True, exist_ok=True)
    for name, act in (("bert_gelu_tanh", "gelu_pytorch_tanh"), ("bert_gelu", "gelu")):
        built = mz._masked_lm("BertForMaskedLM", "BertConfig", dict(_BERT, hidden_act=act), exporter="dynamo",
                              fake=False, seq=16, max_seq=128)
        _save(mz, built, OUT / f"{name}_dynamo{OPSET}_bare.onnx")
    built = mz._causal_lm("GPT2LMHeadModel", "GPT2Config", dict(_GPT2), exporter="dynamo", fake=False, seq=16,
                          max_key="n_positions")
    _save(mz, built, OUT / f"gpt2_gelu_tanh_dynamo{OPSET}_bare.onnx")
    return 0


def _save(mz, built, path: Path) -> None:
    """Export ``built`` with dynamo at :data:`OPSET` and save it graph-only at ``path``."""
    proto = mz._export(built, "dynamo", fake=False, data_name=path.name + ".data")
    mz.save_graph_only(proto, path, threshold_bytes=0)
    print(path.name, f"{path.stat().st_size:,} bytes", flush=True)


if __name__ == "__main__":
    sys.exit(main())
