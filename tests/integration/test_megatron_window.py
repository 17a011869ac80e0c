"""megatron-core 0.16.1 builds the zoo Mistral's exported window (``--window-size 63,0``) as the file's
mask: ``TransformerConfig`` takes it, every layer is windowed (``is_layer_window_attention``), and
``get_sliding_window_causal_mask`` with (63, 0) hides exactly the keys transformers'
``sliding_window_overlay`` (``kv > q - 64``) and causal mask hide. Gemma-style alternation
(``--window-attn-skip-freq 2`` / ``6``) windows the layers transformers' ``layer_types`` does."""

from __future__ import annotations

import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_window import MISTRAL, _export

pytestmark = pytest.mark.integration

pytest.importorskip("torch")
pytest.importorskip("megatron.core")


def test_transformer_config_takes_the_mistral_window():
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention

    from planner.plan import load_graph

    args = parse_megatron_args(_export(load_graph(MISTRAL, {"batch": 16, "seq": 128}), dp=2)["args"])
    config = TransformerConfig(**_transformer_config_kwargs(args))
    assert (config.window_size, config.window_attn_skip_freq) == ((63, 0), None)
    assert all(is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n) for n in (1, 2))


def test_megatron_masks_the_keys_transformers_masks(monkeypatch):
    """At 128 tokens and W = 64 (the zoo Mistral), megatron-core's local mask (True: hidden) is the
    complement of transformers' visible set kv <= q and kv > q - W."""
    import torch

    utils = mask_utils_on_cpu(monkeypatch)
    seq, window = 128, 64
    hidden = utils.get_sliding_window_causal_mask(seq, seq, (window - 1, 0))
    q, kv = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    assert torch.equal(~hidden, (kv <= q) & (kv > q - window))


@pytest.mark.parametrize(("freq", "pattern"), [(2, 2), (6, 6)])  # Gemma-2, Gemma-3's _sliding_window_pattern
def test_skip_freq_windows_transformers_layer_types(freq, pattern):
    from megatron.core.transformer.utils import is_layer_window_attention

    layers = 12
    sliding = [bool((i + 1) % pattern) for i in range(layers)]  # transformers' layer_types, 0-based i
    assert [is_layer_window_attention((7, 0), freq, n) for n in range(1, layers + 1)] == sliding


def mask_utils_on_cpu(monkeypatch):
    """megatron-core's ``transformer.utils``, its masks built on the CPU: it builds them on "cuda", and
    the rule is device-free."""
    import torch
    from megatron.core.transformer import utils

    class _Cpu:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def ones(*shape, device=None, **kwargs):
            return torch.ones(*shape, **kwargs)

    monkeypatch.setattr(utils, "torch", _Cpu())
    return utils
