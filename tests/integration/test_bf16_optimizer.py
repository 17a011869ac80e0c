"""DeepSpeed 0.19.8's own code against ``exporters.deepspeed.bf16_optimizer.grad_accumulator``, on CPU: its engine's
optimizer choice (``DeepSpeedEngine._do_optimizer_sanity_check``, run on the ``DeepSpeedConfig`` of each ds_config the
rule reads) picks ``BF16_Optimizer`` exactly where the rule prices an accumulator, and a real ``BF16_Optimizer`` over a
small bf16 model allocates ``fp32_groups_gradients_flat`` of the rule's bytes per parameter."""

from __future__ import annotations

import types

import pytest

from exporters.deepspeed.bf16_optimizer import grad_accumulator

pytestmark = pytest.mark.integration

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")


def _engine_choice(ds_config: dict, *, pipeline: bool) -> str | None:
    """The wrapper DeepSpeed's engine picks for this config (``BFLOAT16``, ``ZERO_OPTIMIZATION``, ...), by its own
    method bound to a stand-in that answers from the real ``DeepSpeedConfig``."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine

    names = ("get_data_types", "zero_optimization", "zero_optimization_stage", "zero_cpu_offload", "zero_compute_grad_norm",
             "zero_allow_untested_optimizer", "fp16_enabled", "bfloat16_enabled")
    stub = types.SimpleNamespace(_config=DeepSpeedConfig(ds_config), pipeline_parallelism=pipeline, global_rank=0)
    for name in names:
        setattr(stub, name, types.MethodType(getattr(DeepSpeedEngine, name), stub))
    basic = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])
    try:
        return DeepSpeedEngine._do_optimizer_sanity_check(stub, basic)
    except NotImplementedError:
        return "unsupported"


def _config(zero: int, accumulate: str | None, offload: bool = False) -> dict:
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": zero}, "bf16": {"enabled": True}}
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if accumulate is not None:
        config["data_types"] = {"grad_accum_dtype": accumulate}
    return config


@pytest.mark.parametrize("zero, pp, accumulate, offload", [
    (0, 1, None, False), (0, 2, None, False), (1, 1, None, False), (1, 1, "fp32", False), (1, 2, "fp32", False),
    (1, 1, "fp32", True), (2, 1, None, False), (2, 1, "fp32", False), (3, 1, None, False),
])
def test_the_engine_picks_bf16_optimizer_where_the_rule_prices_it(zero, pp, accumulate, offload):
    choice = _engine_choice(_config(zero, accumulate, offload), pipeline=pp > 1)
    rule = grad_accumulator(zero_stage=zero, pp=pp, grad_accum_dtype=accumulate or "bf16",
                            offload="optimizer" if offload else "none")
    assert (choice == "bf16") == (rule > 0), (choice, rule)  # deepspeed.runtime.constants.BFLOAT16 == "bf16"


def test_fp32_accumulation_without_zero_is_refused():
    assert _engine_choice(_config(0, "fp32"), pipeline=True) == "unsupported"  # the validator's rule too


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    """DeepSpeed's communication on one CPU rank (gloo), which its config and optimizer ask for."""
    import deepspeed
    import torch.distributed as dist

    import socket

    with socket.socket() as probe:  # a free port: modules using this group run in parallel workers (xdist)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    patch = pytest.MonkeyPatch()
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port))):
        patch.setenv(name, value)
    started = not dist.is_initialized()
    if started:
        deepspeed.init_distributed(dist_backend="gloo")
    yield dist.group.WORLD
    if started:
        dist.destroy_process_group()
    patch.undo()


@pytest.mark.parametrize("dtype_name, zero, pp", [("float32", 1, 1), ("bfloat16", 0, 2)])
def test_bf16_optimizer_allocates_the_rules_bytes(one_rank_group, dtype_name, zero, pp):
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config

    # 64 x 32 + 32 + 32 x 16 + 16 = 2,608 parameters (even: no alignment padding on one rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16)).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    assert params == 2_608
    names = {p: n for n, p in model.named_parameters()}
    optimizer = BF16_Optimizer(torch.optim.AdamW(model.parameters()), names, bfloat16_config=DeepSpeedBF16Config(enabled=True),
                               dp_process_group=one_rank_group, grad_acc_dtype=getattr(torch, dtype_name))
    flat = optimizer.fp32_groups_gradients_flat
    held = sum(t.numel() * t.element_size() for t in flat)
    assert held / params == grad_accumulator(zero_stage=zero, pp=pp)  # 4.0 fp32 (ZeRO-1), 2.0 bf16 (ZeRO-0 pipeline)
    # beside it: the fp32 master copy (4 B, partitioned over the one rank) and no bf16 gradient yet (made in backward)
    assert sum(t.numel() for t in optimizer.fp32_groups_flat_partition) == params
