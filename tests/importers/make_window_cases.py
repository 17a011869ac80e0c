"""Build the sliding-window ONNX files of ``tests/importers/test_sliding_window_layers.py`` (issue 25), with torch.

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_window_cases.py

The model is transformers' ``Qwen2ForCausalLM`` at a small size (``CONFIG``) with
``use_sliding_window=True``, ``sliding_window=8`` and ``max_window_layers=1`` over 3 layers: Qwen2's
``layer_types`` (``configuration_qwen2.py``: ``"sliding_attention"`` for layer index
``i >= max_window_layers``) is full, sliding, sliding, a pattern no ``--window-attn-skip-freq N``
says (layer 1 full, layers 2 and 3 windowed). Eager attention, the sequence 16 (so the window masks
something). Each exporter's file is saved graph-only as ``make_param_cases.py`` does: every
initializer external and its data file deleted (``bare``), or the small constants inline (``consts``).
``counts.json`` records torch's parameter count and the config.

The second case is transformers' ``ModernBertForMaskedLM`` (``MODERNBERT``, issue 25's two-sided windows, h25c):
3 layers with ``global_attn_every_n_layers=3`` and ``local_attention=16``, so ``layer_types`` is full, sliding,
sliding and the local layers see the keys ``|q - k| <= 8`` (``ModernBertConfig.sliding_window`` is
``local_attention // 2``; ``masking_utils.sliding_window_bidirectional_overlay``), at a sequence of 32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "window_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import SEED, _export, _Logits, _randomise  # noqa: E402

CONFIG = dict(
    vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, use_sliding_window=True, sliding_window=8,
    max_window_layers=1, use_cache=False, tie_word_embeddings=False, attn_implementation="eager",
)
"""``Qwen2Config`` fields of the small model: layers full, sliding, sliding."""

MODERNBERT = dict(
    vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
    max_position_embeddings=64, global_attn_every_n_layers=3, local_attention=16, pad_token_id=0, bos_token_id=1,
    eos_token_id=2, cls_token_id=1, sep_token_id=2, attn_implementation="eager",
)
"""``ModernBertConfig`` fields of the small encoder: layers global, local, local (window of 8 on each side)."""

CASES = {"qwen2_swa": CONFIG, "modernbert_local": MODERNBERT}
MODELS = {"qwen2_swa": ("Qwen2Config", "Qwen2ForCausalLM", 16), "modernbert_local": ("ModernBertConfig", "ModernBertForMaskedLM", 32)}
"""Case -> (transformers config class, model class, example sequence)."""
KEEP = ("qwen2_swa_dynamo_consts.onnx", "qwen2_swa_dynamo_bare.onnx", "qwen2_swa_ts_consts.onnx",
        "modernbert_local_dynamo_consts.onnx", "modernbert_local_dynamo_bare.onnx", "modernbert_local_ts_consts.onnx")


def main() -> int:
    import make_param_cases
    import transformers

    make_param_cases.OUT = OUT  # the shared exporter writes where this script's files go
    OUT.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict] = {}
    for stem, fields in CASES.items():
        torch.manual_seed(SEED)
        config_class, model_class, seq = MODELS[stem]
        config = getattr(transformers, config_class)(**fields)
        model = _randomise(_Logits(getattr(transformers, model_class)(config)))
        ids = torch.randint(0, fields["vocab_size"], (2, seq), generator=torch.Generator().manual_seed(SEED))
        for name, count in _export(model, (ids,), ["input_ids"], ["logits"], stem, fold=True).items():
            if name in KEEP:
                records[name] = {"case": stem, "param_count": count, "layer_types": list(config.layer_types)}
            else:
                (OUT / name).unlink()
    (OUT / "counts.json").write_text(json.dumps({"configs": CASES, "files": records}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
