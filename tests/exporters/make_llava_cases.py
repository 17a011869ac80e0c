"""Build two LLaVA fixtures in ``tests/data/vlm_cases`` (issue 25, h30d), with torch and transformers 5.24.

* ``llava15_ts_consts.onnx``: LLaVA-1.5's own vision tower, CLIP ViT-L/14-336 (24 layers of width 1024, 16 heads,
  FFN 4096 quick-GELU, 336-pixel images in 14-pixel patches), read at ``vision_feature_layer=-2`` as LLaVA-1.5 reads
  it, the class token dropped; LLaVA-1.5's projector (``mlp2x_gelu``: two linears with biases and GELU); a small
  Llama decoder (``bench/unseen_archs.py``'s ``SMALL``). Megatron-LM refuses it (``exporters/megatron/vlm.py``).
* ``llava_tied_ts_consts.onnx``: a LLaVA whose tower's layers are its decoder's (a Starcoder2 decoder: LayerNorm,
  biases, full multi-head attention, an ungated GELU MLP with FFN = width, so that transformers' projector, width ->
  width -> width GELU, is the decoder's MLP): as near to what Megatron-LM's ``pretrain_vlm.py`` builds as
  transformers' LLaVA comes; refused only for the norm ``pretrain_vlm.py``'s projector puts before its first linear.

Random weights (seed 0), exported by the TorchScript exporter (the dynamo exporter fails on LLaVA, h28f) and saved
graph-only in the ``consts`` style (tensors of 1 KiB or more external, their data deleted), beside ``counts.json``
(about 3 minutes on 2 loaded cores; name the cases to build only those)::

    .venv-integration/bin/python tests/exporters/make_llava_cases.py [llava15] [llava_tied]
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "vlm_cases"

CLIP_L14_336 = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                    image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu", layer_norm_eps=1e-5)
"""openai/clip-vit-large-patch14-336's vision config (LLaVA-1.5's tower; its config.json on the Hugging Face hub)."""

TIED_TOWER = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8, projection_dim=64, hidden_act="gelu", layer_norm_eps=1e-5)
TIED_DECODER = dict(model_type="starcoder2", hidden_size=64, intermediate_size=64, num_attention_heads=4,
                    num_key_value_heads=4, num_hidden_layers=2, hidden_act="gelu", use_bias=True, norm_epsilon=1e-5,
                    sliding_window=None, vocab_size=1000, max_position_embeddings=256)
"""A Starcoder2 decoder (LayerNorm with biases, biased linears, an ungated MLP, sequential pre-norm layers, as CLIP's)
with CLIP's sizes; GPT-2 cannot be LLaVA's decoder in transformers 5.24 (``GPT2Model`` has no ``embed_tokens``)."""


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _llava(mz, vision: dict, text: dict, *, image: int, seq: int, feature_layer: int, exporter: str, fake: bool):
    import torch
    import transformers

    patches = (image // vision["patch_size"]) ** 2
    config = transformers.LlavaConfig(vision_config=dict(vision, model_type="clip_vision_model"), text_config=text,
                                      image_token_index=999, vision_feature_layer=feature_layer,
                                      vision_feature_select_strategy="default", use_cache=False)
    model = mz._make(transformers.LlavaForConditionalGeneration, config, fake=fake)
    ids = mz._ids(990, 1, seq)
    ids[:, 2:2 + patches] = 999
    tensors = {"input_ids": ids, "pixel_values": torch.randn(1, 3, image, image, generator=torch.Generator().manual_seed(0)),
               "attention_mask": torch.ones(1, seq, dtype=torch.int64)}
    dims = {"input_ids": ["batch", seq], "pixel_values": ["batch", 3, image, image], "attention_mask": ["batch", seq]}
    record = {"model_class": "LlavaForConditionalGeneration", "vision": vision, "text": text,
              "vision_feature_layer": feature_layer, "image_token_index": 999, "example_batch": 1, "example_seq": seq}
    return mz._built(model, tensors, dims, record, exporter=exporter, fake=fake)


def main() -> int:
    unseen = _load("unseen_archs", ROOT / "bench" / "unseen_archs.py")
    mz = unseen.mz
    builds = {
        "llava15": lambda *, realistic, exporter, fake: _llava(
            mz, CLIP_L14_336, dict(unseen.SMALL, model_type="llama"), image=336, seq=600, feature_layer=-2,
            exporter=exporter, fake=fake),
        "llava_tied": lambda *, realistic, exporter, fake: _llava(
            mz, TIED_TOWER, TIED_DECODER, image=32, seq=24, feature_layer=-1, exporter=exporter, fake=fake),
    }
    counts_path = OUT / "counts.json"
    counts = json.loads(counts_path.read_text())
    only = sys.argv[1:] or list(builds)
    for name, build in ((name, builds[name]) for name in only):
        with tempfile.TemporaryDirectory() as tmp:
            records, failure = mz.build_arch(mz.Arch(name=name, description=name, build=build), "ts", Path(tmp),
                                             realistic=False)
            if failure:
                raise SystemExit(f"{name}: export failed: {failure['error']}")
            file_name = f"{name}_ts_consts.onnx"
            (OUT / file_name).write_bytes((Path(tmp) / file_name).read_bytes())
        record = records[file_name]
        counts["files"][file_name] = {key: record[key] for key in ("param_count", "config", "inputs", "versions",
                                                                  "built_on", "model_class")}
        counts_path.write_text(json.dumps(counts, indent=1) + "\n")
        print(file_name, record["param_count"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
