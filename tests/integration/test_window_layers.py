"""megatron-core 0.16.1 builds the Qwen2 fixture's exported per-layer window (issue 25).

``tests/data/window_cases/qwen2_swa_ts_consts.onnx`` (``tests/importers/make_window_cases.py``): 3
layers, ``sliding_window=8``, ``max_window_layers=1``. The export writes ``--window-size 7,0`` and
``--window-attn-skip-freq [0]*1+[1]*2``; ``TransformerConfig`` takes the parsed list,
``is_layer_window_attention`` windows exactly the layers transformers' ``Qwen2Config.layer_types``
slides, and each layer's mask (megatron-core's ``get_sliding_window_causal_mask`` on the windowed
layers, causal on the others) keeps the keys transformers' eager Qwen2 attends to, read from the model
itself: the attention weights it returns are zero exactly where its mask hides a key.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_window import _export
from tests.integration.test_megatron_window import mask_utils_on_cpu

pytestmark = pytest.mark.integration

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

CASES = Path(__file__).resolve().parents[1] / "data" / "window_cases"


@pytest.fixture(scope="module")
def args():
    from planner.plan import load_graph

    graph = load_graph(CASES / "qwen2_swa_ts_consts.onnx", {"batch": 8, "seq": 32})
    return parse_megatron_args(_export(graph, dp=2)["args"])


def test_transformer_config_windows_the_layers_qwen2_slides(args):
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention
    from transformers import Qwen2Config

    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert (config.window_size, config.window_attn_skip_freq) == ((7, 0), [0, 1, 1])
    fields = json.loads((CASES / "counts.json").read_text())["configs"]["qwen2_swa"]
    types = Qwen2Config(**fields).layer_types
    windowed = [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n) for n in (1, 2, 3)]
    assert windowed == [t == "sliding_attention" for t in types] == [False, True, True]


def test_each_layer_sees_the_keys_transformers_qwen2_sees(args, monkeypatch):
    """At 16 tokens, per layer: the keys transformers' Qwen2 weights (its returned attention
    probabilities, non-zero) are the keys megatron-core's mask for that layer leaves visible."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    utils = mask_utils_on_cpu(monkeypatch)
    fields = json.loads((CASES / "counts.json").read_text())["configs"]["qwen2_swa"]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**fields)).eval()
    seq = 16
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, fields["vocab_size"], (1, seq)), output_attentions=True)
    window = tuple(int(side) for side in args["window-size"].split(","))
    for n, probabilities in enumerate(out.attentions, start=1):
        seen = probabilities[0, 0] > 0
        if utils.is_layer_window_attention(window, args["window-attn-skip-freq"], n):
            hidden = utils.get_sliding_window_causal_mask(seq, seq, window)
        else:
            hidden = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
        assert torch.equal(seen, ~hidden), f"layer {n}"
