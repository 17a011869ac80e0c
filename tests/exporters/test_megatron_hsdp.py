"""Megatron-LM's partial distributed optimizer (``--num-distributed-optimizer-instances``) for ZeRO-1
rows priced with HSDP's shard group (``TrainingSettings.dp_shard``), and its two refusals."""

from __future__ import annotations

from exporters.megatron.export import megatron_hsdp_args
from exporters.megatron.validate import megatron_violations


def _args(instances: int, *, distributed: bool = True) -> list[str]:
    """A dp=16 GPT (16 processes, tp = pp = 1) with ``instances`` optimizer instances."""
    args = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
            "--max-position-embeddings", "128", "--micro-batch-size", "1", "--global-batch-size", "16", "--bf16",
            "--num-distributed-optimizer-instances", str(instances)]
    return args + (["--use-distributed-optimizer"] if distributed else [])


def test_instances_are_the_replicas_of_the_shard_group():
    # dp = 32 sharded over 8 ranks: 4 instances; a shard group of every rank, or ZeRO-3 / ZeRO-0: none
    assert megatron_hsdp_args(1, 8, dp=32) == ["--num-distributed-optimizer-instances", "4"]
    assert megatron_hsdp_args(1, 32, dp=32) == megatron_hsdp_args(3, 8, dp=32) == megatron_hsdp_args(1, None, dp=32) == []
    assert megatron_hsdp_args(1, 8, dp=12) == ["--num-distributed-optimizer-instances", "3"]  # gcd(12, 8) = 4 ranks


def test_megatron_core_rules():
    assert megatron_violations(_args(2), world_size=16) == []
    assert "needs --use-distributed-optimizer" in " ".join(megatron_violations(_args(2, distributed=False), world_size=16))
    assert "does not divide dp x cp = 16" in " ".join(megatron_violations(_args(3), world_size=16))
