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
    import torch.distributed as dist

    from tests.integration.deepspeed_gloo import init_distributed_on_gloo

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
        init_distributed_on_gloo()
    yield dist.group.WORLD
    if started:
        dist.destroy_process_group()
    patch.undo()


@pytest.mark.parametrize("dtype_name, zero, pp", [("float32", 1, 1), ("bfloat16", 0, 2)])
def test_bf16_optimizer_allocates_the_rules_bytes(one_rank_group, monkeypatch, dtype_name, zero, pp):
    from deepspeed.runtime import bf16_optimizer as module
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config

    monkeypatch.setattr(module, "see_memory_usage", lambda *args, **kwargs: None)  # a log line; its gc.collect() takes seconds

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


class _DataParallelView:
    """``deepspeed.comm`` as ``BF16_Optimizer`` sees it, its data-parallel group reported as ``ranks`` ranks of which
    this one is ``rank`` (one real gloo rank underneath: every other call goes through)."""

    def __init__(self, comm, ranks: int, rank: int) -> None:
        self._comm, self._ranks, self._rank = comm, ranks, rank

    def __getattr__(self, name: str):
        return getattr(self._comm, name)

    def get_world_size(self, group=None) -> int:
        return self._ranks

    def get_rank(self, group=None) -> int:
        return self._rank


def test_zero0_pipeline_partitions_the_optimizer_and_gathers_after_the_step(one_rank_group, monkeypatch):
    """ZeRO-0 under a bf16 ``PipelineModule`` (bf16 accumulation) on rank 1 of 4 data-parallel ranks: the fp32 master
    copy and both Adam moments hold a quarter of the parameters (12 B / 4 per parameter, the pricing's ZeRO-1 states:
    ``ZeroSync.partition_stage``), and one step all-gathers the bf16 partitions once, after the optimizer's update."""
    import inspect

    from deepspeed.runtime import bf16_optimizer as module
    from deepspeed.runtime.pipe.engine import PipelineEngine
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config

    from exporters.deepspeed.zero_sync import zero_sync
    from objectives.memory import state_bytes_per_parameter
    from planner.core.settings import TrainingSettings

    ranks, rank = 4, 1
    monkeypatch.setattr(module, "dist", _DataParallelView(module.dist, ranks, rank))
    monkeypatch.setattr(module, "see_memory_usage", lambda *args, **kwargs: None)  # a log line; its gc.collect() takes seconds
    events: list[str] = []
    gathered: list[dict] = []
    monkeypatch.setattr(module, "all_gather_dp_groups", lambda **call: (events.append("gather"), gathered.append(call)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16)).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())  # 2,608: a multiple of 2 x 4 (no alignment padding)
    adam = torch.optim.AdamW(model.parameters())
    optimizer = module.BF16_Optimizer(adam, {p: n for n, p in model.named_parameters()}, grad_acc_dtype=torch.bfloat16,
                                      bfloat16_config=DeepSpeedBF16Config(enabled=True), dp_process_group=one_rank_group)
    real_step = adam.step
    monkeypatch.setattr(adam, "step", lambda *args, **kwargs: (events.append("update"), real_step(*args, **kwargs))[1])
    master = optimizer.fp32_groups_flat_partition
    assert sum(t.numel() for t in master) == params // ranks == 652

    model(torch.randn(2, 64, dtype=torch.bfloat16)).float().square().sum().backward()
    optimizer.update_hp_grads()  # what PipelineEngine._exec_backward_pass does on a stage
    # ReduceGrads all-reduces the whole accumulator (buffered_allreduce_fallback over get_grads_for_reduction)
    reduced, _ = optimizer.get_grads_for_reduction()
    assert [t.numel() for t in reduced] == [params] and reduced[0].dtype == torch.bfloat16
    source = inspect.getsource(PipelineEngine._exec_reduce_grads) + inspect.getsource(PipelineEngine._bf16_reduce_grads)
    assert "self._bf16_reduce_grads()" in source and "buffered_allreduce_fallback(grads=None" in source
    optimizer.step()
    assert events == ["update", "gather"]  # update_lp_params, after the step, once
    state = [adam.state[t] for t in master]
    held = sum(t.numel() * t.element_size() for t in master) + sum(
        s[k].numel() * s[k].element_size() for s in state for k in ("exp_avg", "exp_avg_sq"))
    settings = TrainingSettings(precision="bf16-mixed", optimizer="adam")
    assert held == state_bytes_per_parameter(settings).optimizer * params / ranks == 7_824
    (call,) = gathered
    assert [t.numel() for t in call["groups_flat"]] == [params]  # each rank's bf16 parameters whole again
    assert [[p.numel() for p in group] for group in call["partitioned_param_groups"]] == [[params // ranks] * ranks]
    assert call["groups_flat"][0].dtype == torch.bfloat16  # 2 B per element moved, as priced (StateBytes.gathered)
    rule = zero_sync(zero_stage=0, precision="bf16-mixed")
    assert rule.partition_stage(0, pipelined=True) == 1 and not rule.gather_overlaps_forward
