"""Build ``tests/data/post_ln_cases/``, the files of ``tests/importers/test_post_ln_cases.py`` (issue 25: where
the layers normalise, and BERT's LM-head activation), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights,
seed 0, with ``tests/zoo/make_zoo.py``'s builders and graph-only saving (every initializer external, the
data file deleted: ``bare``)::

    .venv-integration/bin/python tests/importers/make_post_ln_cases.py

Each is 2 layers, hidden 64, 4 heads, FFN 128, vocabulary 1,000, 128 positions:

* ``electra_ts_bare`` / ``electra_dynamo_bare`` (``ElectraForMaskedLM``, ``embedding_size`` 32): post-LN
  layers (``ElectraSelfOutput``: ``LayerNorm(dense(h) + input)``) whose first reads
  ``embeddings_project``, a 32 -> 64 linear after the embedding LayerNorm, not a norm's output;
* ``albert_ts_bare`` (``AlbertForMaskedLM``, ``embedding_size`` 32, one shared layer): the same with
  ``embedding_hidden_mapping_in`` (the dynamo export is ``tests/data/outside_zoo/albert_dynamo_bare.onnx``);
* ``bert_gelu_tanh_ts_bare`` (``hidden_act="gelu_pytorch_tanh"``) and ``bert_gelu_new_dynamo_bare``
  (``hidden_act="gelu_new"``): ``BertForMaskedLM`` whose MLPs and MLM head transform
  (``BertPredictionHeadTransform``: ``ACT2FN[config.hidden_act]``) both use GELU's tanh approximation. At
  opsets 17 (TorchScript) and 18 (dynamo) ONNX has no ``Gelu`` op (opset 20), so both write the ``Tanh``;
* ``megatron_bert_tanh_dynamo``: ``tests/integration/make_megatron_bert.py``'s BERT (megatron-core's ``BertModel``
  in plain torch, no binary head, its sizes), built with ``F.gelu(approximate="tanh")`` wherever it applies GELU,
  the MLPs and the LM head's transform, as a ``hidden_act="gelu_new"`` model would be; that builder's ``save``
  (weights of 1 KiB or more stripped).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "post_ln_cases"
_BASE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000,
             max_position_embeddings=128)
CASES = {
    "electra_ts": ("ElectraForMaskedLM", "ElectraConfig", dict(_BASE, embedding_size=32), "ts"),
    "electra_dynamo": ("ElectraForMaskedLM", "ElectraConfig", dict(_BASE, embedding_size=32), "dynamo"),
    "albert_ts": ("AlbertForMaskedLM", "AlbertConfig", dict(_BASE, embedding_size=32), "ts"),
    "bert_gelu_tanh_ts": ("BertForMaskedLM", "BertConfig", dict(_BASE, hidden_act="gelu_pytorch_tanh"), "ts"),
    "bert_gelu_new_dynamo": ("BertForMaskedLM", "BertConfig", dict(_BASE, hidden_act="gelu_new"), "dynamo"),
}


def main() -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import,
    # so the unit run's doctest collection of this file needs neither
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    for name, (model_cls, config_cls, cfg, exporter) in CASES.items():
        built = mz._masked_lm(model_cls, config_cls, dict(cfg), exporter=exporter, fake=False, seq=16, max_seq=128)
        path = OUT / f"{name}_bare.onnx"
        proto = mz._export(built, exporter, fake=False, data_name=path.name + ".data")
        mz.save_graph_only(proto, path, threshold_bytes=0)
        print(path.name, f"{path.stat().st_size:,} bytes", flush=True)
    _megatron_bert_tanh()
    return 0


def _megatron_bert_tanh() -> None:
    """``megatron_bert_tanh_dynamo.onnx`` (module docstring)."""
    import functools
    import types
    from unittest import mock

    import torch

    sys.path.insert(0, str(ROOT))
    from tests.integration import make_megatron_bert as mb

    tanh_gelu = types.SimpleNamespace(gelu=functools.partial(torch.nn.functional.gelu, approximate="tanh"))
    with mock.patch.object(mb, "F", tanh_gelu), torch.no_grad():  # the module's every F.gelu: MLPs and head
        model, args, shapes = mb.build(False)
        program = torch.onnx.export(model, args, dynamo=True, opset_version=18, dynamic_shapes=shapes)
    path = OUT / "megatron_bert_tanh_dynamo.onnx"
    mb.make_examples.save(program.model_proto, path, inline_weights=False)
    print(path.name, f"{path.stat().st_size:,} bytes", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
