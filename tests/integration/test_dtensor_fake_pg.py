"""A 64-rank DTensor plan checked in one process with torch's fake process group (shapes only).

``examples/llama.onnx`` (8 layers, hidden 1024, 16 heads / 4 KV heads, vocabulary 32000) is planned on
64 devices (8 nodes of 8) with the search restricted to dp=16 x tp=4 with vocabulary-parallel
embedding and LM head and ZeRO-3, and the exported plan is applied by ``planner.run`` to the Hugging
Face model built on the meta device, as rank 0 and as rank 63 of a fake 64-process world
(``torch.testing._internal.distributed.fake_pg``; collectives do nothing, tensors hold no data).
Every parameter's local shape and placements must be the plan's, and the bytes of parameters a rank
holds must be the planner's prediction (4 bytes per fp32 element).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")

from tests.integration.configs import CONFIGS  # noqa: E402
from tests.integration.plans import Case, make_plan  # noqa: E402

pytestmark = pytest.mark.integration

CASE = Case(model="llama", dp=16, tp=4, vocab_embedding=True, vocab_head=True, zero=3)


@pytest.fixture(scope="module")
def plan():
    exported, _ = make_plan(CASE, batch=32, seq=128, devices_per_node=8)
    return exported


def test_plan_is_for_64_ranks_on_8_nodes(plan):
    assert plan["world_size"] == 64 and (plan["nnodes"], plan["nproc_per_node"]) == (8, 8)
    assert plan["mesh"] == {"shape": [16, 4], "dim_names": ["dp", "tp"]}
    assert plan["batch"]["micro_batch_per_rank"] == 2


@pytest.mark.parametrize("rank", [0, 63])
def test_local_shapes_and_placements_at_64_ranks(plan, rank):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoConfig, AutoModelForCausalLM

    from planner.run import _shard_report, apply_plan, prepare_model

    kwargs = dict(CONFIGS["llama"])
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=64)
    try:
        mesh = init_device_mesh("cpu", (16, 4), mesh_dim_names=("dp", "tp"))
        assert tuple(mesh.get_coordinate()) == (rank // 4, rank % 4)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        prepare_model(model, plan)
        apply_plan(model, plan, mesh)
        shards = _shard_report(model)
    finally:
        dist.destroy_process_group()
    assert set(shards) == set(plan["params"])
    for name, entry in plan["params"].items():
        assert shards[name]["local_shape"] == entry["local_shape"], name
        held = {dim: shards[name]["placements"].get(dim, "replicate") for dim in ("dp", "tp")}
        assert held == entry["placements"], name  # a parameter on the dp mesh only is replicated over tp
    held_bytes = 4 * sum(math.prod(shard["local_shape"]) for shard in shards.values())
    assert held_bytes == plan["predicted"]["memory"]["params_bytes"]


def test_a_plan_for_another_model_is_refused():
    """planner.run checks every parameter against the plan before it parallelizes anything."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from planner.run import prepare_model

    gpt2_plan, _ = make_plan(Case(model="gpt2_tiny", dp=1, tp=2))
    kwargs = dict(CONFIGS["llama_tiny"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kwargs.pop("model_type"), **kwargs))
    with pytest.raises(ValueError, match="is not in the model; pass --config with the config of the model the plan was made for"):
        prepare_model(model, gpt2_plan)
