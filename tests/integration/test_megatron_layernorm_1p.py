"""Issue 25 with megatron-core itself: the Megatron export of a LayerNorm1P model
(``tests/data/param_cases/nemotron_ts_consts.onnx``, transformers' ``NemotronForCausalLM``, built by
``tests/importers/make_param_cases.py``) writes ``--apply-layernorm-1p``, which megatron-core 0.16.1's own
``TransformerConfig`` field metadata maps to ``layernorm_zero_centered_gamma``; the norm that flag builds
computes transformers' ``NemotronLayerNorm1P`` for the same weights; and where megatron-core's norms refuse
the flag (the local RMSNorm, the inference-optimised implementation) the repo's validator refuses it too.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from exporters import export
from exporters.validate import megatron_violations, parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "param_cases" / "nemotron_ts_consts.onnx"
HIDDEN = 64  # make_param_cases.py: NemotronConfig(hidden_size=64, ...)


@functools.lru_cache(maxsize=2)
def _args(devices: int) -> dict:
    """The flags of the fastest Megatron row on all ``devices`` GPUs (``dp`` pinned: the check is of a launch at that
    world size, and on this tiny model the free table's fastest row may use fewer devices)."""
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8))
    _, (found,) = plan_launchable_file(FIXTURE, {"batch": 16, "seq": 16}, [request], launchers=("megatron",),
                                       pins=Pins(dp=devices))
    row = next(r for r in found.rows if "megatron" in r.targets)
    return parse_megatron_args(export("megatron", row_plan_input(row))["args"])


def _field_of(flag: str) -> str:
    """The ``TransformerConfig`` field Megatron-LM's arguments.py fills from ``flag`` (its ``argparse_meta``)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return next(f.name for f in dataclasses.fields(TransformerConfig)
                if flag in f.metadata.get("argparse_meta", {}).get("arg_names", ()))


@pytest.mark.parametrize("devices", [1, 4])
def test_transformer_config_centres_the_norms(devices):
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = _args(devices)
    assert args["apply-layernorm-1p"] is True and "transformer-impl" not in args  # Transformer Engine, the default
    field = _field_of("--apply-layernorm-1p")
    config = TransformerConfig(**_transformer_config_kwargs(args), **{field: True})
    assert config.layernorm_zero_centered_gamma is True
    assert config.normalization == "LayerNorm" and config.transformer_impl == "transformer_engine"
    assert megatron_violations(args, world_size=devices) == []


def test_the_centred_norm_is_nemotrons(monkeypatch):
    """megatron-core's ``FusedLayerNorm`` under the flag starts its weight at 0 and normalises with
    ``weight + 1`` (fused_layer_norm.py:124-133): for the same weights it is ``NemotronLayerNorm1P``.
    Apex is not installed here, so its kernel (``FusedLayerNormAffineFunction``: a layer norm with
    that weight and bias) is stood in by ``torch.nn.functional.layer_norm``; the ``+ 1`` is megatron-core's."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("transformers")
    import torch
    import torch.nn.functional as F
    from megatron.core.fusions import fused_layer_norm
    from megatron.core.transformer.transformer_config import TransformerConfig
    from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P

    class _Kernel(torch.autograd.Function):  # Apex's signature: (input, weight, bias, normalized_shape, eps)
        @staticmethod
        def forward(ctx, x, weight, bias, shape, eps):
            return F.layer_norm(x, tuple(shape), weight, bias, eps)

    monkeypatch.setattr(fused_layer_norm, "HAVE_FUSED_LAYER_NORM", True)
    monkeypatch.setattr(fused_layer_norm, "FusedLayerNormAffineFunction", _Kernel, raising=False)
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4,
                               layernorm_zero_centered_gamma=True, persist_layer_norm=False)
    megatron_norm = fused_layer_norm.FusedLayerNorm(config, HIDDEN, eps=1e-5)
    assert torch.count_nonzero(megatron_norm.weight) == 0  # zero-centred: the weight starts at 0, the scale at 1
    nemotron = NemotronLayerNorm1P(HIDDEN, eps=1e-5)
    x = torch.randn(2, 8, HIDDEN, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        nemotron.weight.zero_()
        nemotron.bias.zero_()
        torch.testing.assert_close(megatron_norm(x), nemotron(x))  # w = 0: both are the plain norm of scale 1
        torch.testing.assert_close(megatron_norm(x), F.layer_norm(x, (HIDDEN,)))
        weight = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(1))
        for module in (megatron_norm, nemotron):
            module.weight.copy_(weight)
        torch.testing.assert_close(megatron_norm(x), nemotron(x))


def test_where_megatron_core_refuses_the_flag_the_validator_does():
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import TransformerConfig

    sizes = dict(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, layernorm_zero_centered_gamma=True)
    config = TransformerConfig(**sizes, normalization="RMSNorm", persist_layer_norm=False)
    with pytest.raises(AssertionError, match="zero_centered_gamma not supported"):
        WrappedTorchNorm(config, HIDDEN)  # what --transformer-impl local builds for RMSNorm (models/backends.py)
    with pytest.raises(AssertionError):
        TransformerConfig(**sizes, normalization="RMSNorm", transformer_impl="inference_optimized", add_bias_linear=False)
    base = ["--num-layers", "1", "--hidden-size", str(HIDDEN), "--num-attention-heads", "4", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "1",
            "--apply-layernorm-1p", "--normalization", "RMSNorm"]
    for impl in ("local", "inference_optimized"):
        assert any("--apply-layernorm-1p" in v for v in megatron_violations([*base, "--transformer-impl", impl],
                                                                             world_size=1))
    assert megatron_violations(base, world_size=1) == []  # Transformer Engine's RMSNorm honours it
