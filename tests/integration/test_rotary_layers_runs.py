"""The Megatron-LM and torchtitan exports of SmolLM3's NoPE layers and Llama 3.1's scaled RoPE, read back by the
libraries themselves (sweep H5 findings 3 and 4): megatron-core 0.16.1's ``TransformerConfig`` expands the exported
``--no-rope-freq`` to the layers transformers' ``SmolLM3Config`` leaves unrotated, its ``RotaryEmbedding`` built
from ``--rotary-base --use-rope-scaling --rope-scaling-factor`` has the file's frequencies and transformers' own
``llama3`` ones, and torchtitan 0.3.0's ``ComplexRoPE`` built from the exported module turns position 1 by them.
Fixtures: ``tests/data/rotary_cases`` (``tests/importers/make_rotary_cases.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from importers.onnx_facts import file_facts
from importers.rotary import _candidates
from objectives.cluster import make_cluster
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest

pytestmark = pytest.mark.integration
pytest.importorskip("torch")  # the fixtures' generator (its configs are the oracle) imports torch

from tests.importers import make_rotary_cases as cases  # noqa: E402
from tests.integration.test_torchtitan_export import _parse  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "rotary_cases"


def _first_export(name: str, launcher: str) -> dict:
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2, devices_per_node=2))
    _, (found,) = plan_launchable_file(DATA / f"{name}.onnx", {"batch": 4, "seq": 64}, [request], launchers=(launcher,))
    row = next(r for r in found.rows if launcher in r.targets)
    return export(launcher, row_plan_input(row))


def _held(name: str) -> np.ndarray:
    return next(v for n, v in _candidates(file_facts(DATA / f"{name}.onnx")) if "inv_freq" in n or "rotary" in n)


@pytest.mark.parametrize(("name", "config"), [
    ("smollm3_ts_consts", dict(no_rope_layer_interval=2)), ("smollm3_dynamo_consts", dict(no_rope_layer_interval=2)),
    ("smollm3_list_ts_consts", dict(no_rope_layers=[1, 0, 1, 1])),
])
def test_megatron_skips_rope_where_smollm3_does(name, config):
    pytest.importorskip("megatron.core")
    import transformers
    from megatron.core.transformer.transformer_config import TransformerConfig

    args = parse_megatron_args(_first_export(name, "megatron")["args"])
    built = TransformerConfig(num_layers=args["num-layers"], hidden_size=args["hidden-size"],
                              num_attention_heads=args["num-attention-heads"], no_rope_freq=args["no-rope-freq"])
    hf = transformers.SmolLM3Config(**cases.SIZES, **config)
    assert built.no_rope_freq == [1 - r for r in hf.no_rope_layers]  # 1: megatron skips RoPE; HF's 1 rotates


@pytest.mark.parametrize("name", ["llama31_ts_consts", "llama31_dynamo_consts"])
def test_megatrons_scaled_rotary_embedding_is_llama31s(name):
    pytest.importorskip("megatron.core")
    import transformers
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    args = parse_megatron_args(_first_export(name, "megatron")["args"])
    assert args.get("use-rope-scaling")
    kv = args.get("kv-channels", args["hidden-size"] // args["num-attention-heads"])
    embedding = RotaryEmbedding(kv, float(args.get("rotary-percent", 1.0)), rotary_base=args["rotary-base"],
                                rope_scaling=True, rope_scaling_factor=float(args["rope-scaling-factor"]),
                                use_cpu_initialization=True)
    hf = transformers.LlamaConfig(**cases.SIZES, rope_parameters=cases.LLAMA31)
    reference, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    np.testing.assert_allclose(embedding.inv_freq.numpy(), reference.numpy(), rtol=1e-6)
    np.testing.assert_allclose(embedding.inv_freq.numpy(), _held(name), rtol=1e-6)


@pytest.mark.parametrize("name", ["llama31_ts_consts", "llama31_short_ts_consts"])
def test_torchtitans_rope_turns_by_the_files_frequencies(name, tmp_path):
    pytest.importorskip("torchtitan")
    from torchtitan.models.common import ComplexRoPE

    config = _parse(_first_export(name, "torchtitan"), tmp_path)
    rope = config.model_spec.model.layers[0].attention.rope
    assert isinstance(rope, ComplexRoPE.Config) and rope.scaling == "llama"
    cache = ComplexRoPE(rope).cache  # (positions, pairs) complex: position 1 turned by each frequency
    np.testing.assert_allclose(np.angle(cache[1].numpy()), _held(name), rtol=1e-5)
