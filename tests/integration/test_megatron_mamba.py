"""Issue 25 with megatron-core itself: the Mamba family's exports (exporters/megatron/mamba.py) are what
megatron-core 0.16.1 builds.

Checked with megatron-core's own code: ``TransformerConfig`` accepts each export's sizes and mamba
fields; ``mamba_hybrid_layer_allocation.allocate_layers`` turns the exported
``--hybrid-override-pattern`` into the graph's layer kinds; ``--spec`` names a real ``ModuleSpec``;
``MambaModel`` takes the pattern. Not built: ``MambaMixer`` itself, whose ``__init__`` raises without
``mamba_ssm`` (CUDA kernels, absent from the CPU integration venv), so its sizes are checked against
its source instead (the ``in_proj`` width, ``d_conv=4``), and ``MambaStack``'s source against the
recompute/offload refusals.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from exporters.megatron.mamba import MAMBA_CONV_KERNEL, MAMBA_SPEC
from exporters.validate import parse_megatron_args
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.exporters.test_megatron_mamba import DATA, DIMS, HYBRID, MAMBA2, _export
from planner.core.settings import TrainingSettings
from planner.plan import load_graph

pytestmark = pytest.mark.integration

CASES = [DATA / name for name in HYBRID] + [MAMBA2 / "mamba2_dynamo_consts.onnx", MAMBA2 / "mamba2_ts_consts.onnx"]


def _args(path: Path, settings: TrainingSettings | None = None) -> dict:
    return parse_megatron_args(_export(load_graph(path, DIMS), 2, settings)["args"])


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_transformer_config_accepts_the_exports(path):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.activations import squared_relu
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = _args(path, TrainingSettings(zero_stage=1))
    kwargs = _transformer_config_kwargs(args)
    # core_transformer_config_from_args: every TransformerConfig field of the same name, and
    # activation_func = squared_relu under --squared-relu
    kwargs.update(mamba_num_heads=args["mamba-num-heads"], mamba_head_dim=args["mamba-head-dim"],
                  mamba_num_groups=args["mamba-num-groups"], mamba_state_dim=args["mamba-state-dim"])
    if args.get("squared-relu"):
        kwargs["activation_func"] = squared_relu
    config = TransformerConfig(**kwargs)
    assert config.mamba_num_heads * config.mamba_head_dim == 128  # d_inner = 2 x hidden in both fixtures
    assert config.num_layers == len(args["hybrid-override-pattern"])
    assert not config.add_bias_linear and config.normalization == "RMSNorm"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_megatron_allocates_the_pattern(path):
    pytest.importorskip("megatron.core")
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers

    args = _args(path)
    pattern = args["hybrid-override-pattern"]
    layers = allocate_layers(args["num-layers"], 0.0, 0.0, pattern)
    assert "".join(layers) == pattern == ("M*M-" if "nemotron" in path.name else "M")


def test_spec_and_model_class():
    pytest.importorskip("megatron.core")
    from megatron.core.models.mamba import MambaModel
    from megatron.core.transformer.spec_utils import ModuleSpec

    spec = getattr(importlib.import_module(MAMBA_SPEC[0]), MAMBA_SPEC[1])
    assert isinstance(spec, ModuleSpec)
    params = inspect.signature(MambaModel.__init__).parameters
    assert {"mamba_stack_spec", "hybrid_override_pattern", "position_embedding_type"} <= set(params)


def test_mixer_sizes_are_megatrons():
    """importers.hybrid.layer_parameters and the conv width, against MambaMixer's source (not built:
    mamba_ssm is missing on CPU)."""
    pytest.importorskip("megatron.core")
    from megatron.core.ssm import mamba_mixer

    assert not mamba_mixer.HAVE_MAMBA_SSM  # the CPU venv: MambaMixer(...) raises ImportError
    assert inspect.signature(mamba_mixer.MambaMixer.__init__).parameters["d_conv"].default == MAMBA_CONV_KERNEL
    source = inspect.getsource(mamba_mixer.MambaMixer.__init__)
    assert "self.d_inner * 2 + 2 * self.ngroups * self.d_state + self.nheads" in source  # in_proj: z x B C dt
    assert "conv_dim = self.d_inner_local_tp + 2 * self.ngroups_local_tp * self.d_state" in source
    assert "assert not bias" in source  # no linear biases in the mixer


def test_mamba_stack_has_no_recompute_or_offload():
    pytest.importorskip("megatron.core")
    from megatron.core.ssm import mamba_block

    text = Path(mamba_block.__file__).read_text()
    assert "recompute" not in text and "offload" not in text
