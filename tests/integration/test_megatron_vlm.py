"""Issue 25 (h28f) against megatron-core's source: what the LLaVA refusal (``exporters/megatron/vlm.py``) says of
megatron-core 0.16.1 holds. ``LLaVAModel.__init__`` takes the decoder's, the tower's and the projector's
``TransformerConfig`` separately (so the class could hold LLaVA-1.5's CLIP tower beside a Llama decoder), and
``CLIPViTModel`` (``model_subtype="clip"``) builds the patch conv, a class token, learned positions and ``ln_pre`` and
no final norm, as transformers' CLIP tower read by LLaVA (``hidden_states[-1]``, before ``post_layernorm``).
``pretrain_vlm.py`` (Megatron-LM, not installed here) ties them to the decoder's config: the refusal cites it.
"""

from __future__ import annotations

import inspect

import pytest

pytestmark = pytest.mark.integration


def test_llava_model_takes_three_configs():
    pytest.importorskip("megatron.core")
    from megatron.core.models.multimodal.llava_model import LLaVAModel

    params = inspect.signature(LLaVAModel.__init__).parameters
    assert {"language_transformer_config", "vision_transformer_config", "vision_projection_config",
            "drop_vision_class_token", "img_h", "img_w", "patch_dim"} <= set(params)
    assert params["vision_projection_type"].default == "mlp"


def test_clip_tower_is_transformers_clip_without_post_norm():
    pytest.importorskip("megatron.core")
    from megatron.core.models.vision.clip_vit_model import CLIPViTModel

    source = inspect.getsource(CLIPViTModel.__init__)
    clip = source[source.index('if model_subtype == "clip":'):source.index('elif model_subtype == "siglip":')]
    assert "self.ln_pre = build_module(" in clip and "ln_post" not in clip and "conv_bias = False" in clip
    assert "self.position_embeddings = torch.nn.Embedding(" in source and "self.class_token" in source
