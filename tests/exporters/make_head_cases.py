"""Build ``tests/exporters/data/head_cases/``, the encoder-decoders of ``tests/exporters/test_t5_head_wording.py``
(issue 25, task H2: what a refusal says about an LM head read from a TorchScript file), with torch.

Run with the integration environment (torch CPU 2.13, transformers 5.24); no downloads, random weights, seed 0,
with ``tests/zoo/make_zoo.py``'s builders, the TorchScript export and graph-only saving (every initializer
external, the data file deleted: ``bare``)::

    .venv-integration/bin/python tests/exporters/make_head_cases.py

Each stack has 2 layers, hidden 64, 4 heads, FFN 128, vocabulary 1,000; both heads are tied to the shared word
table, and both models add ``final_logits_bias``, a registered buffer (never trained), to the logits.
TorchScript writes the tied head as a constant of its own (``onnx::MatMul_N``, the table transposed) and folds
the buffer into another (``onnx::Add_N``):

* ``pegasus_ts_bare`` (``PegasusForConditionalGeneration``): pre-LN layers, sinusoidal positions;
* ``marian_ts_bare`` (``MarianMTModel``): post-LN layers, SiLU MLPs, sinusoidal positions.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "exporters" / "data" / "head_cases"
_SEQ2SEQ = dict(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128)


def main() -> int:
    # make_zoo imports torch and transformers (the integration environment): loaded here, not at import,
    # so the unit run's doctest collection of this file needs neither
    spec = importlib.util.spec_from_file_location("make_zoo", ROOT / "tests" / "zoo" / "make_zoo.py")
    mz = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = mz
    spec.loader.exec_module(mz)
    OUT.mkdir(parents=True, exist_ok=True)
    cases = {
        "pegasus_ts_bare": ("PegasusForConditionalGeneration", "PegasusConfig",
                            dict(_SEQ2SEQ, pad_token_id=0, decoder_start_token_id=0)),
        "marian_ts_bare": ("MarianMTModel", "MarianConfig",
                           dict(_SEQ2SEQ, pad_token_id=999, decoder_start_token_id=999, activation_function="swish")),
    }
    for name, (model_cls, config_cls, config) in cases.items():
        built = mz._seq2seq(model_cls, config_cls, config, exporter="ts", fake=False, seq=16, tgt_seq=12, max_seq=128,
                            vocab=999)
        model = built.model
        tied = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
        buffers = [n for n, _ in model.named_buffers() if n.endswith("final_logits_bias")]
        path = OUT / f"{name}.onnx"
        mz.save_graph_only(mz._export(built, "ts", fake=False, data_name=path.name + ".data"), path, threshold_bytes=0)
        print(path.name, f"{path.stat().st_size:,} bytes; head tied: {tied}; buffers: {buffers}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
