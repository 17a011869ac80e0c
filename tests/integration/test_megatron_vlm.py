"""Issue 25 (h28f) against megatron-core's source: what the LLaVA refusal (``exporters/megatron/vlm.py``) says of
megatron-core 0.16.1 holds. ``LLaVAModel.__init__`` takes the decoder's, the tower's and the projector's
``TransformerConfig`` separately (so the class could hold LLaVA-1.5's CLIP tower beside a Llama decoder), and
``CLIPViTModel`` (``model_subtype="clip"``) builds the patch conv, a class token, learned positions and ``ln_pre`` and
no final norm, as transformers' CLIP tower read by LLaVA (``hidden_states[-1]``, before ``post_layernorm``).
``pretrain_vlm.py`` (Megatron-LM, not installed here) ties them to the decoder's config: the refusal cites it.
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


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


# ---------------------------------------------------------------------------------------------------------------
# h30d: the two launchers' constructions built at the fixtures' sizes, their parameters counted against the ONNX
# files' (tests/exporters/make_llava_cases.py). The ONNX side is counted from the file alone: each float
# initializer goes to the part whose node reads it first (/model/vision_tower, /model/multi_modal_projector, ...).

CASES = ROOT / "tests" / "data" / "vlm_cases"


def _onnx_part_counts(name: str) -> dict[str, int]:
    import onnx

    model = onnx.load(str(CASES / name), load_external_data=False)
    size = {i.name: math.prod(i.dims) for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    part: dict[str, str] = {}
    for node in model.graph.node:
        for tensor in node.input:
            if tensor in size:
                part.setdefault(tensor, "/".join(node.name.split("/")[:3]))
    counts: dict[str, int] = {}
    for tensor, where in part.items():
        counts[where] = counts.get(where, 0) + size[tensor]
    return counts


# CPU shims as test_megatron_t5.py's; CLIPViTModel's position ids (put on CUDA in its __init__) kept on the CPU; its
# ln_pre built as megatron-core's WrappedTorchNorm (a LayerNorm with a weight and a bias, as TENorm's), since without
# Transformer Engine its default is torch.nn.LayerNorm, which build_module cannot pass a config.
# 1. examples/multimodal's clip tower (config.py get_vision_model_config, "clip"), at the file's image and patch,
#    1 and 2 layers deep (shrunk in depth only; the count is linear in depth).
# 2. a MultimodalProjector ("mlp") holding LLaVA-1.5's projector: the class takes it (the launchers do not build it).
# 3. pretrain_vlm.py's construction with --transformer-impl local at the tied file's sizes: the vision config a copy
#    of the decoder's with --encoder-num-layers, the projector the local decoder spec's MLP on another copy.
_BUILD = r"""
import contextlib, copy, json, sys, tempfile
import torch
import torch.distributed as dist
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
from megatron.core import parallel_state, utils
from megatron.core.tensor_parallel import random
parallel_state.initialize_model_parallel(1, 1)
utils.GlobalMemoryBuffer.get_tensor = lambda self, shape, dtype, name, mem_alloc_context=None: torch.empty(shape, dtype=dtype)
random.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
torch.Tensor.cuda = lambda self, *args, **kwargs: self
from megatron.core.activations import quick_gelu
from megatron.core.models.multimodal import llava_spec
from megatron.core.models.multimodal.llava_model import LLaVAModel
from megatron.core.models.vision.clip_vit_model import CLIPViTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.models.multimodal import llava_model
import functools
llava_model.CLIPViTModel = functools.partial(CLIPViTModel, ln_pre_impl=WrappedTorchNorm)
a = json.loads(sys.argv[1])
count = lambda module: sum(p.numel() for p in module.parameters())
found = {}
for layers in (1, 2):
    clip = TransformerConfig(num_layers=layers, num_attention_heads=16, add_bias_linear=True, add_qkv_bias=True,
                             hidden_size=1024, hidden_dropout=0.0, attention_dropout=0.0, ffn_hidden_size=4096,
                             gated_linear_unit=False, activation_func=quick_gelu, kv_channels=64, num_query_groups=16,
                             normalization="LayerNorm", use_cpu_initialization=True)
    tower = CLIPViTModel(clip, get_vit_layer_with_local_spec(), ln_pre_impl=WrappedTorchNorm, img_h=a["image"],
                         img_w=a["image"], patch_dim=a["patch"], class_token_len=1, model_subtype="clip")
    found[f"clip_{layers}"] = count(tower)
projection = TransformerConfig(num_layers=1, hidden_size=a["text_hidden"], num_attention_heads=1,
                               ffn_hidden_size=a["text_hidden"], add_bias_linear=True, gated_linear_unit=False,
                               use_cpu_initialization=True)
mlp = llava_spec.decoder_model_with_local_default_spec().submodules.mlp.submodules
found["projector"] = count(MultimodalProjector(projection, copy.deepcopy(mlp), "mlp", 1024))
t = a["tied"]
language = TransformerConfig(num_layers=t["layers"], hidden_size=t["hidden"], num_attention_heads=t["heads"],
                             ffn_hidden_size=t["ffn"], add_bias_linear=True, use_cpu_initialization=True)
vision = copy.deepcopy(language)
vision.num_layers = t["encoder_layers"]
vision.vision_model_type = "clip"
spec = llava_spec.decoder_model_with_local_default_spec()
model = LLaVAModel(language_transformer_config=language, language_transformer_layer_spec=spec,
                   language_vocab_size=t["vocab"], language_max_sequence_length=64, vision_transformer_config=vision,
                   vision_transformer_layer_spec=get_vit_layer_with_local_spec(), drop_vision_class_token=True,
                   vision_projection_config=copy.deepcopy(language),
                   vision_projection_layer_spec=copy.deepcopy(spec.submodules.mlp.submodules),
                   vision_projection_type="mlp", language_position_embedding_type="rope", img_h=t["image"],
                   img_w=t["image"], patch_dim=t["patch"])
found["tied"] = {part: count(getattr(model, part)) for part in ("vision_model", "vision_projection", "language_model")}
found["tied_tower_mask"] = str(model.vision_model.decoder.layers[0].self_attention.attn_mask_type)
print(json.dumps(found))
"""


def test_llava_launchers_built_at_the_fixtures_sizes():
    """The refusals' numbers from megatron-core's own classes: examples/multimodal's clip preset is LLaVA-1.5's tower
    with one layer more (the file holds the 23 layers LLaVA-1.5 reads, ``vision_feature_layer=-2``); LLaVAModel's
    projector class holds LLaVA-1.5's projector; pretrain_vlm.py's local construction has the tied file's parameters
    one for one but a causal tower, and its Transformer Engine spec fuses a norm into the projector's first linear."""
    pytest.importorskip("megatron.core")
    from tests.integration.forked_python import run_python

    counts = json.loads((CASES / "counts.json").read_text())["files"]
    vision = counts["llava15_ts_consts.onnx"]["config"]["vision"]
    text = counts["llava15_ts_consts.onnx"]["config"]["text"]
    tied = counts["llava_tied_ts_consts.onnx"]["config"]
    sizes = {"image": vision["image_size"], "patch": vision["patch_size"], "text_hidden": text["hidden_size"],
             "tied": {"layers": tied["text"]["num_hidden_layers"], "hidden": tied["text"]["hidden_size"],
                      "heads": tied["text"]["num_attention_heads"], "ffn": tied["text"]["intermediate_size"],
                      "encoder_layers": tied["vision"]["num_hidden_layers"], "vocab": tied["text"]["vocab_size"],
                      "image": tied["vision"]["image_size"], "patch": tied["vision"]["patch_size"]}}
    out = run_python(_BUILD, json.dumps(sizes), cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    per_layer = found["clip_2"] - found["clip_1"]
    embedding = found["clip_1"] - per_layer  # the patch conv, class token, positions and ln_pre
    llava15 = _onnx_part_counts("llava15_ts_consts.onnx")
    held = vision["num_hidden_layers"] - 1  # vision_feature_layer=-2: the last layer is never read, so not exported
    assert llava15["/model/vision_tower"] == embedding + held * per_layer == 290_909_184
    assert per_layer == 12_596_224  # 4 x (1024^2 + 1024) + 2 x 1024 x 4096 + 4096 + 1024 + 2 x 2 x 1024
    assert llava15["/model/multi_modal_projector"] == found["projector"] == 1024 * 64 + 64 + 64 * 64 + 64
    tied_onnx = _onnx_part_counts("llava_tied_ts_consts.onnx")
    assert found["tied"]["vision_model"] == tied_onnx["/model/vision_tower"]
    assert found["tied"]["vision_projection"] == tied_onnx["/model/multi_modal_projector"]
    # the decoder: its layers and final norm, the token table and an output layer of its own: pretrain_vlm.py does
    # not pass share_embeddings_and_output_weights (LLaVAModel's default False), where the fixture ties its head
    # (torch's count 187,008 holds one 1000 x 64 table; the TorchScript file keeps the head as a second initializer)
    table = tied["text"]["vocab_size"] * tied["text"]["hidden_size"]
    assert tied_onnx["/model/embed_tokens"] == tied_onnx["/lm_head/MatMul"] == table
    assert found["tied"]["language_model"] == tied_onnx["/model/language_model"] + 2 * table
    assert sum(found["tied"].values()) == counts["llava_tied_ts_consts.onnx"]["param_count"] - 128 + table  # CLIP's
    # post_layernorm (2 x 64), which LLaVA never reads, is the fixture's only parameter LLaVAModel lacks
    assert found["tied_tower_mask"] == "AttnMaskType.causal"  # get_vit_layer_with_local_spec: not CLIP's attention


def test_pretrain_vlm_projector_with_transformer_engine_has_a_norm():
    """pretrain_vlm.py's projector is the decoder spec's MLP submodules; with Transformer Engine the decoder spec is
    llava_spec's, whose MLP comes from get_mlp_module_spec(use_te=True), whose linear_fc1 is the backend's
    column_parallel_layer_norm_linear when fuse_layernorm_and_linear() (TESpecProvider: True)."""
    pytest.importorskip("megatron.core")
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.models.multimodal import llava_spec
    from megatron.core.models.vision import vit_layer_specs

    spec = inspect.getsource(llava_spec.decoder_model_with_transformer_engine_default_spec)
    assert "get_mlp_module_spec(" in spec and "use_te=True" in spec
    backend = inspect.getsource(gpt_layer_specs.get_mlp_module_spec_for_backend)
    assert "if backend.fuse_layernorm_and_linear():" in backend
    assert "linear_fc1 = backend.column_parallel_layer_norm_linear()" in backend
    import megatron.core

    # read, not imported: the module imports Transformer Engine, which the integration environment lacks
    provider = (Path(megatron.core.__file__).parent / "extensions" / "transformer_engine_spec_provider.py").read_text()
    fuse = provider[provider.index("def fuse_layernorm_and_linear"):]
    assert fuse.split("return", 1)[1].split()[0] == "True"
    te_vit = inspect.getsource(vit_layer_specs.get_vit_layer_with_transformer_engine_spec)
    assert "AttnMaskType.no_mask" in te_vit and "AttnMaskType.causal" in inspect.getsource(
        vit_layer_specs.get_vit_layer_with_local_spec)
