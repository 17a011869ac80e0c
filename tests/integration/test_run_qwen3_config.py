"""``planner.run`` on a Qwen3 plan: the config it derives builds the model the plan was made for.

Oracle: transformers' ``Qwen3ForCausalLM`` built from the fixture's own config (``make_qk_norm_fixtures.COMMON``):
every parameter's name and shape, q_norm/k_norm included (a Llama config, written before, had none)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from planner.run import build_model, config_from_plan  # noqa: E402
from tests.integration.make_qk_norm_fixtures import COMMON  # noqa: E402
from tests.integration.plans import qk_norm_plan  # noqa: E402

pytestmark = pytest.mark.integration


def test_the_derived_config_builds_the_fixtures_model():
    derived = build_model(config_from_plan(qk_norm_plan("qwen3_tiny")), seed=0)
    truth = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON))
    assert type(derived).__name__ == "Qwen3ForCausalLM"
    shapes = {name: tuple(p.shape) for name, p in derived.named_parameters()}
    assert shapes == {name: tuple(p.shape) for name, p in truth.named_parameters()}
    assert any(name.endswith("self_attn.q_norm.weight") for name in shapes)
