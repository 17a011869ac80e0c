"""Hugging Face configs of the models the DTensor integration tests build (``model_type`` + kwargs).

They match the ONNX files the plans are made from: ``tests/data/gpt2_tiny.onnx`` (written by
``examples/make_examples.py``, ``build_gpt2_tiny``), ``tests/data/llama_tiny.onnx``
(``tests/integration/make_llama_tiny.py``) and ``examples/llama.onnx`` (``build_llama``). Dropout is 0 so that every rank and the single-process
reference compute the same function (the exported graphs are the eval-mode graphs anyway).
"""

from __future__ import annotations

__all__ = ["CONFIGS", "ONNX"]

CONFIGS: dict[str, dict] = {
    "gpt2_tiny": {
        "model_type": "gpt2",
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "vocab_size": 1000,
        "n_positions": 128,
        "use_cache": False,
        "bos_token_id": None,
        "eos_token_id": None,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    "llama_tiny": {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "max_position_embeddings": 128,
        "use_cache": False,
        "tie_word_embeddings": False,
    },
    # examples/llama.onnx (examples/models.json): only shapes are checked, with the fake process group.
    "llama": {
        "model_type": "llama",
        "num_hidden_layers": 8,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "intermediate_size": 2816,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "use_cache": False,
        "tie_word_embeddings": False,
    },
}

ONNX: dict[str, str] = {
    "gpt2_tiny": "tests/data/gpt2_tiny.onnx",
    "llama_tiny": "tests/data/llama_tiny.onnx",
    "llama": "examples/llama.onnx",
}
