"""transformers 5.24's ``StableLmLayerNormPerHead`` on a tensor-parallel rank's heads (issue 25, task H3, item 3):
why DeepSpeed AutoTP and a DTensor plan list no tp > 1 for StableLM with ``qk_layernorm=True``
(``exporters.deepspeed.rules.per_head_weights_tp``, ``exporters.dtensor.rules.per_head_weights_tp``).

Both keep the module whole (its ``H`` LayerNorms replicated) and split ``q_proj`` / ``k_proj`` by columns, so rank
``r`` of ``tp`` feeds the module its heads ``r H/tp .. (r+1) H/tp - 1``. The module zips its norms with the heads
it is given, in order: the rank normalises its heads with heads ``0 .. H/tp - 1``'s weights. Checked here on the
real module (random weights): rank 1 at tp=2 differs from the whole model's heads 2 and 3, and equals their
normalisation under heads 0 and 1's weights."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead  # noqa: E402

HEADS, HEAD_DIM, TP = 4, 16, 2


def test_a_rank_uses_the_first_heads_norms():
    torch.manual_seed(0)
    module = StableLmLayerNormPerHead(HEAD_DIM, HEADS)
    with torch.no_grad():
        for norm in module.norms:  # distinct weights per head, as after training
            norm.weight.uniform_(0.5, 1.5)
    states = torch.randn(2, HEADS, 5, HEAD_DIM)  # [batch, heads, seq, head_dim], as StableLmAttention feeds it
    whole = module(states)
    local = HEADS // TP
    rank1 = module(states[:, local:])  # rank 1's heads 2 and 3, the module unchanged
    assert not torch.allclose(rank1, whole[:, local:], atol=1e-4)
    wrong = torch.cat([module.norms[h](states[:, local + h:local + h + 1]) for h in range(local)], dim=1)
    assert torch.allclose(rank1, wrong, atol=1e-6)
    assert torch.allclose(module(states[:, :local]), whole[:, :local], atol=1e-6)  # rank 0 is right
