"""ZeRO shards states over the data-parallel and context-parallel ranks (issue 24 item 1).

torchtitan's FSDP mesh is ``dp_shard x cp`` and Megatron-LM's distributed optimizer runs on the
data-parallel-with-context-parallel group (``objectives.replication``'s docstring cites both): a
linear layer's or an embedding's sequence split counts toward the ZeRO shard degree, a
sequence-parallel norm's (the tensor-parallel ranks) does not. Numbers by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.intra_op import grad_sync_terms
from objectives.memory import op_memory_bytes
from objectives.replication import hsdp_groups, zero_shard_degree
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op, Tensor, TensorAccess
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import graph_loader

WEIGHT = 64 * 64
"""Elements of the tiny linear layer's weight ``w[k, n]``."""


def _linear() -> tuple[Op, dict[str, Tensor]]:
    """``y[b, m, n] = x[b, m, k] @ w[k, n]``: 8 samples of 64 tokens, a 64 x 64 weight."""
    dims = (IterDim(name="b", size=8, is_batch=True), IterDim(name="m", size=64), IterDim(name="n", size=64),
            IterDim(name="k", size=64, kind="reduction"))
    op = Op(name="fc", kind="matmul", op_type="MatMul", dims=dims, flops=2.0 * 8 * 64 * 64 * 64,
            inputs=(TensorAccess(tensor="x", axes=(("b",), ("m",), ("k",))),
                    TensorAccess(tensor="w", axes=(("k",), ("n",)))),
            outputs=(TensorAccess(tensor="y", axes=(("b",), ("m",), ("n",))),))
    tensors = {"x": Tensor(name="x", shape=(8, 64, 64), dtype="float32", role="input"),
               "w": Tensor(name="w", shape=(64, 64), dtype="float32", role="parameter"),
               "y": Tensor(name="y", shape=(8, 64, 64), dtype="float32", role="activation")}
    return op, tensors


def _norm() -> tuple[Op, dict[str, Tensor]]:
    """A LayerNorm ``y[b, s, d]`` with its weight ``g[d]``: 4 samples of 64 tokens, width 64."""
    dims = (IterDim(name="b", size=4, is_batch=True), IterDim(name="s", size=64),
            IterDim(name="d", size=64, kind="normalized"))
    op = Op(name="ln", kind="norm", op_type="LayerNormalization", dims=dims, flops=0.0,
            inputs=(TensorAccess(tensor="x", axes=(("b",), ("s",), ("d",))), TensorAccess(tensor="g", axes=(("d",),))),
            outputs=(TensorAccess(tensor="y", axes=(("b",), ("s",), ("d",))),))
    tensors = {"x": Tensor(name="x", shape=(4, 64, 64), dtype="float32", role="input"),
               "g": Tensor(name="g", shape=(64,), dtype="float32", role="parameter"),
               "y": Tensor(name="y", shape=(4, 64, 64), dtype="float32", role="activation")}
    return op, tensors


@pytest.mark.parametrize("dp, cp", [(8, 1), (4, 2), (2, 4), (1, 8)])
def test_linear_optimizer_bytes_over_dp_times_cp(dp, cp):
    """Adam under bf16 mixed precision keeps 12 optimizer bytes per parameter, 2 gradient and 2
    parameter bytes: ZeRO 1 divides the 12 by dp x cp = 8 whatever the split, ZeRO 2 also the 2
    gradient bytes, ZeRO 3 all 16."""
    op, tensors = _linear()
    space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    row = space.index_of({"b": dp, "m": cp})
    assert int(zero_shard_degree(op, space, op.inputs[1])[row]) == dp * cp
    for stage, (params, grads) in {1: (2 * WEIGHT, 2 * WEIGHT), 2: (2 * WEIGHT, 2 * WEIGHT / 8),
                                   3: (2 * WEIGHT / 8, 2 * WEIGHT / 8)}.items():
        memory = op_memory_bytes(op, space, tensors=tensors, settings=TrainingSettings(zero_stage=stage))
        assert memory.optimizer_bytes[row] == pytest.approx(12 * WEIGHT / 8)  # 6,144 bytes
        assert (memory.params_bytes[row], memory.grads_bytes[row]) == pytest.approx((params, grads))


def test_tensor_parallel_weight_split_is_not_a_zero_group():
    """dp = 2 x tp = 4 (the weight's n split): the 4 ranks hold different quarters, ZeRO divides by 2."""
    op, tensors = _linear()
    space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    row = space.index_of({"b": 2, "n": 4})
    memory = op_memory_bytes(op, space, tensors=tensors, settings=TrainingSettings(zero_stage=1))
    assert memory.optimizer_bytes[row] == pytest.approx(12 * WEIGHT / 4 / 2)


def test_sequence_parallel_norm_keeps_whole_states_over_its_sequence_split():
    """A norm's sequence split may be sequence parallelism's tensor-parallel ranks, which keep whole
    states (Megatron-LM's sequence-parallel LayerNorm weights): dp = 2 x 4 sequence ranks divides by 2."""
    op, tensors = _norm()
    space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    row = space.index_of({"b": 2, "s": 4})
    assert int(zero_shard_degree(op, space, op.inputs[1])[row]) == 2
    memory = op_memory_bytes(op, space, tensors=tensors, settings=TrainingSettings(zero_stage=1))
    assert memory.optimizer_bytes[row] == pytest.approx(12 * 64 / 2)


def test_megatron_layout_at_dp_2_x_cp_2_shards_over_four():
    """The tiny GPT-2 (vocabulary 1,000, width 64, 2 layers, FFN 256, 128 positions, tied LM head)
    priced as Megatron-LM's dp = 2 x cp = 2 under ZeRO 1 (the pipeline pricing, ``estimate``).

    Per layer the linear layers hold 64 x 192 + 192 + 64 x 64 + 64 + 64 x 256 + 256 + 256 x 64 + 64
    = 49,728 parameters; with the 64,000-entry token table (the LM head's too) that is 163,456
    sharded over dp x cp = 4. The five LayerNorms' 5 x 128 parameters split their sequence, which
    the norm's configuration cannot tell from sequence parallelism's, and keep to dp = 2; the
    position table's lookup has no batch dim and is sharded over its sequence split (2), as before.
    Optimizer: 12 x (163,456 / 4 + 640 / 2 + 8,192 / 2) = 543,360 bytes (1,033,728 when the
    sequence split was left out: 12 x (163,456 / 2 + 320 + 4,096)); at dp = 4 x cp = 1,
    12 x (163,456 / 4 + 640 / 4 + 8,192) = 590,592, unchanged by the context-parallel rule.
    """
    at = graph_loader("tests/data/gpt2_tiny.onnx", {"seq": 128})
    linears = 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64
    assert linears == 49_728
    hand = {(2, 2): 12 * ((64_000 + 2 * linears) / 4 + 640 / 2 + 8_192 / 2),
            (4, 1): 12 * ((64_000 + 2 * linears) / 4 + 640 / 4 + 8_192)}
    assert hand == {(2, 2): 543_360, (4, 1): 590_592}
    for (dp, cp), expected in hand.items():
        e = estimate(at, cluster=make_cluster("a100-80gb", devices=4), dp=dp, cp=cp, tp=1, pp=1, micro_batch=1,
                     global_batch=2 * dp, zero=1)
        assert e.valid, e.reason
        assert e.memory.optimizer_bytes == pytest.approx(expected, rel=1e-12)
        assert e.memory.params_bytes == pytest.approx(2 * (64_000 + 2 * linears + 640 + 8_192), rel=1e-12)


@pytest.mark.parametrize("dp, cp, dp_shard, shards",
                         [(8, 1, 4, 4), (4, 2, 4, 8), (4, 2, 2, 4), (2, 4, 4, 8), (1, 8, 4, 8)])
def test_hsdp_shards_the_data_parallel_part_and_keeps_cp_whole(dp, cp, dp_shard, shards):
    """Hybrid sharding (``dp_shard``): torchtitan's ``fsdp`` mesh dim is ``gcd(dp, dp_shard) x cp``
    (``dp_replicate`` the rest), Megatron's distributed optimizer ``dp x cp / instances`` with
    ``dp / gcd(dp, dp_shard)`` instances: the same count. dp = 4 x cp = 2 over ``dp_shard`` 4: 8 ranks
    (``gcd(dp x cp, dp_shard)`` would say 4); over 2: 4."""
    op, tensors = _linear()
    space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    row = space.index_of({"b": dp, "m": cp})
    assert shards == math.gcd(dp, dp_shard) * cp
    memory = op_memory_bytes(op, space, tensors=tensors, settings=TrainingSettings(zero_stage=3, dp_shard=dp_shard))
    assert memory.optimizer_bytes[row] == pytest.approx(12 * WEIGHT / shards)
    assert memory.params_bytes[row] == pytest.approx(2 * WEIGHT / shards)


def test_hsdp_gradient_groups_keep_the_cp_ranks_in_the_shard_group():
    """dp = 16 x cp = 4 on 8 nodes of 8 (the weight's replicas: 8 per node x 8 nodes), HSDP over 8:
    torchtitan reduce-scatters over ``fsdp`` = 8 x 4 = 32 ranks (a node's 8 and 4 nodes) and
    all-reduces over ``dp_replicate`` = 2 (2 nodes); without ``context`` the group of 64 split 8 / 8."""
    (s_in, s_out), (r_in, r_out) = hsdp_groups(np.array([8]), np.array([8]), 8, np.array([4]))
    assert (int(s_in[0]), int(s_out[0]), int(r_in[0]), int(r_out[0])) == (8, 4, 1, 2)
    (s_in, s_out), (r_in, r_out) = hsdp_groups(np.array([8]), np.array([8]), 8)
    assert (int(s_in[0]), int(s_out[0]), int(r_in[0]), int(r_out[0])) == (8, 1, 1, 8)


def test_hsdp_gradient_sync_terms_over_dp_shard_x_cp():
    """The linear's ZeRO-3 terms at dp = 4 x cp = 2 over ``dp_shard`` 4 on one node of 8: the
    reduce-scatter and the gathers on 8 ranks (``gcd(4, 4) x 2``), no replica all-reduce; over
    ``dp_shard`` 2: on 4 ranks, and a replica all-reduce of the 1/4 slice on 2."""
    op, tensors = _linear()
    space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    row = space.index_of({"b": 4, "m": 2})
    for dp_shard, shards, replicas in ((4, 8, 1), (2, 4, 2)):
        terms = grad_sync_terms(op, space, tensors=tensors, settings=TrainingSettings(zero_stage=3, dp_shard=dp_shard))
        sizes = {(t.collective, int(t.intra_size[row] * t.inter_size[row])) for t in terms
                 if t.intra_size[row] * t.inter_size[row] > 1}
        expected = {("reduce_scatter", shards), ("all_gather", shards)}
        if replicas > 1:
            expected.add(("all_reduce", replicas))
        assert sizes == expected
