"""Write ``tests/data/llama_tiny.onnx``: a 2-layer Llama (GQA 8/4 heads, hidden 64) for the DTensor tests.

The recipe of ``examples/make_examples.py`` (its ``_llama_like`` builder, dynamo export, graph-only
save); the sizes let every tensor-parallel degree up to 4 run: 8 heads, 4 KV heads, FFN 128 and a
vocabulary of 1000 all divide by 4. The matching Hugging Face config is ``CONFIGS["llama_tiny"]`` in
``tests/integration/configs.py``. Needs the examples venv (torch, transformers, onnxscript)::

    .venv-examples/bin/python tests/integration/make_llama_tiny.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import make_examples  # noqa: E402

from tests.integration.configs import CONFIGS  # noqa: E402


def build():
    cfg = CONFIGS["llama_tiny"]
    return make_examples._llama_like(
        "LlamaForCausalLM",
        "LlamaConfig",
        layers=cfg["num_hidden_layers"],
        hidden=cfg["hidden_size"],
        heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"],
        intermediate=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        max_positions=cfg["max_position_embeddings"],
        seq=16,
    )


def main() -> int:
    example = make_examples.Example(
        name="llama_tiny", group="tests", exporter="dynamo", build=build,
        description="Llama decoder, 2 layers, hidden 64, 8 heads / 4 KV heads, vocab 1000 (graph only)",
    )
    built = build()
    proto = make_examples.export(example, built)
    path = ROOT / "tests" / "data" / "llama_tiny.onnx"
    make_examples.save(proto, path, inline_weights=False)
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(proto.graph.node)} nodes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
