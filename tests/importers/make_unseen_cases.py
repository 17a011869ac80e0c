"""Build the Cohere and Phi-3 ONNX files of ``tests/importers/test_unseen_archs.py`` (issue 25), with torch.

Run with the integration environment (torch CPU, transformers 5.x); no downloads, random weights, seed 0::

    .venv-integration/bin/python tests/importers/make_unseen_cases.py [CASE ...]

(only the named cases are rebuilt when some are given; ``counts.json`` keeps the others' records).

Two architectures that first failed to import with a wrong computed shape:

* ``phi3`` (``Phi3ForCausalLM``): fused ``qkv_proj`` cut by Slices at computed offsets, fused
  ``gate_up_proj`` chunked, and a full-width rotary (``partial_rotary_factor`` 1.0) whose
  pass-through half ``q[..., rotary_dim:]`` is an empty ``[b, h, s, 0]`` Slice concatenated back:
  a legal zero-size value the importer used to refuse.
* ``cohere`` (``CohereForCausalLM``): interleaved rotary (``repeat_interleave(freqs, 2, dim=-1)``,
  ``rotate_half`` by stack/flatten of the even/odd channels), LayerNorm without bias, attention and
  MLP in parallel. The TorchScript exporter (torch 2.13) rewrites the ``-1`` constant that
  ``repeat_interleave``'s ``dim=-1`` shares with ``view(*input_shape, -1, head_dim)`` into the
  normalised dim (2), so its file reshapes ``[b, s, 128]`` into ``[b, s, 2, 16]`` and onnxruntime
  refuses it too: ``cohere_tsbug`` keeps that file (the importer must name the Reshape);
  ``cohere`` is exported with ``torch.repeat_interleave`` given the positive dim, which computes
  the same values and leaves the ``-1`` alone.

Untied embeddings in the TorchScript files: the exporter writes a tied head as a transposed copy
that a graph-only file cannot prove tied (``importers.parameters``' warning), and the counts here
are exact. Weights are randomised (``make_param_cases._randomise``) so the exporter's
deduplication of equal initializers (every norm weight is ones at init) does not merge distinct
parameters into ``Identity`` aliases. Saved graph-only (every initializer external, its data file
deleted: ``bare``); ``counts.json`` records torch's ``sum(p.numel() for p in model.parameters())``.

``phi3_init`` is the Phi-3 at its default initialisation (not randomised), the way a user exports a
model built from a config to plan it: the exporter merges its five all-ones RMSNorm scales into one
initializer read through ``Identity`` copies, which the importer counts once and names in a warning
(``tests/importers/test_shared_vectors.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "unseen_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
sys.path.insert(0, str(ROOT / "tests" / "zoo"))
from make_param_cases import SEED, _Logits, _randomise  # noqa: E402
from make_zoo import save_graph_only  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, use_cache=False, tie_word_embeddings=False)
"""Config fields shared by both models (GQA: 4 query heads over 2 key/value heads, head_dim 16)."""

CASES = {"cohere": ("CohereConfig", "CohereForCausalLM", COMMON),
         "cohere_tsbug": ("CohereConfig", "CohereForCausalLM", COMMON),
         "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(COMMON, pad_token_id=0)),
         "phi3_init": ("Phi3Config", "Phi3ForCausalLM", dict(COMMON, pad_token_id=0))}
DEFAULT_INIT = frozenset({"phi3_init"})
"""Cases exported with the weights the model is built with (not randomised)."""


def _positive_dim_repeat_interleave():
    """``torch.repeat_interleave`` with a negative ``dim`` made positive (same values), undoing the
    TorchScript exporter's rewrite of a shared ``-1`` (module docstring). Returns the original."""
    original = torch.repeat_interleave

    def repeat_interleave(x, repeats=None, dim=None, **kwargs):
        if isinstance(dim, int) and dim < 0:
            dim += x.dim()
        return original(x, repeats, dim=dim, **kwargs)

    torch.repeat_interleave = repeat_interleave
    return original


def main(only: list[str]) -> int:
    import transformers

    OUT.mkdir(parents=True, exist_ok=True)
    counts = OUT / "counts.json"
    records: dict[str, dict] = json.loads(counts.read_text())["files"] if only and counts.exists() else {}
    for stem, (config_name, model_name, fields) in CASES.items():
        if only and stem not in only:
            continue
        torch.manual_seed(SEED)
        config = getattr(transformers, config_name)(**fields)
        config._attn_implementation = "eager"
        model = _Logits(getattr(transformers, model_name)(config))
        model = model.eval() if stem in DEFAULT_INIT else _randomise(model)
        ids = torch.randint(0, fields["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(SEED))
        original = _positive_dim_repeat_interleave() if stem == "cohere" else None
        path = OUT / f"{stem}_ts_full.onnx"
        try:
            with torch.no_grad():
                torch.onnx.export(model, (ids,), str(path), dynamo=False, opset_version=17, input_names=["input_ids"],
                                  output_names=["logits"], dynamic_axes={"input_ids": {0: "batch", 1: "seq"}})
        finally:
            if original is not None:
                torch.repeat_interleave = original
        name = f"{stem}_ts_bare.onnx"
        save_graph_only(onnx.load(str(path)), OUT / name, threshold_bytes=0)
        path.unlink()
        records[name] = {"case": stem, "param_count": sum(p.numel() for p in model.parameters())}
    counts.write_text(json.dumps({"configs": CASES, "files": records}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
