"""Issue 25 (h28f) with megatron-core and transformers themselves: the hybrid export's rotary flags
(``exporters/megatron/mamba_rotary.py``) make megatron-core 0.16.1's ``MambaModel`` rotate as the transformers model
the fixture was exported from.

Checked with their own code: ``TransformerConfig`` accepts the export with ``--position-embedding-type rope``;
``MambaModel.__init__`` takes ``position_embedding_type``, ``rotary_percent`` and ``rotary_base`` and no
``rope_scaling`` (the refusal of Llama 3.1's scaling says so); ``MambaStack.forward`` hands ``rotary_pos_emb`` to
its attention layers; and the ``RotaryEmbedding`` ``MambaModel`` builds from the exported flags
(``kv_channels``, ``rotary_percent``, ``rotary_base``) gives the angles whose cosines and sines transformers'
``GraniteMoeHybridRotaryEmbedding`` gives for the fixture's config (``MambaModel`` itself needs ``mamba_ssm``'s CUDA
kernels, absent here).
"""

from __future__ import annotations

import inspect

import pytest

from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron_hybrid_rotary import RECORD, ROPE, _export
from tests.integration.test_megatron_hybrid_experts import _config_kwargs

pytestmark = pytest.mark.integration


def test_transformer_config_accepts_the_rope_export():
    pytest.importorskip("megatron.core")
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = parse_megatron_args(_export(ROPE)["args"])
    config = TransformerConfig(**{"activation_func": F.silu, **_config_kwargs(args)})
    assert config.gated_linear_unit and args["position-embedding-type"] == "rope"


def test_mamba_model_takes_the_flags_and_no_scaling():
    pytest.importorskip("megatron.core")
    from megatron.core.models.mamba import MambaModel
    from megatron.core.ssm.mamba_block import MambaStack

    params = inspect.signature(MambaModel.__init__).parameters
    assert {"position_embedding_type", "rotary_percent", "rotary_base"} <= set(params)
    assert "rope_scaling" not in params and "rope_scaling_factor" not in params
    assert "rotary_pos_emb=rotary_pos_emb" in inspect.getsource(MambaStack.forward)


def test_megatron_cores_rotary_tables_are_transformers(monkeypatch):
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    out = _export(ROPE)
    args = parse_megatron_args(out["args"])
    seq, kv_channels = args["seq-length"], out["model"]["kv_channels"]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    rope = RotaryEmbedding(kv_channels=kv_channels, rotary_percent=float(args.get("rotary-percent", 1.0)),
                           rotary_base=args["rotary-base"], use_cpu_initialization=True)
    angles = rope.get_emb(seq)[:, 0, 0, :]  # [seq, kv_channels]: the non-interleaved halves
    torch.manual_seed(0)
    model = GraniteMoeHybridForCausalLM(GraniteMoeHybridConfig(**RECORD[ROPE]["config"])).eval()
    x = torch.zeros(1, seq, kv_channels)
    cos, sin = model.model.rotary_emb(x, torch.arange(seq)[None])
    assert angles.shape == cos[0].shape
    torch.testing.assert_close(torch.cos(angles), cos[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.sin(angles), sin[0], rtol=1e-5, atol=1e-6)
