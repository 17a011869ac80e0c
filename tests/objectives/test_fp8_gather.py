"""FP8 weights all-gathered in FP8 under ZeRO (issue 24 item 3): Megatron-LM's ``--fp8-param-gather`` priced
at 1 byte per FP8 weight element (``objectives.precision.gathered_bytes``), the bias, the LM head and every
gradient reduce-scatter at their own dtype, hand-counted on a two-linear graph."""

from __future__ import annotations

import dataclasses

import pytest

from objectives.intra_op import grad_sync_terms
from objectives.pipeline_arrays import _sync_key
from objectives.precision import FP8_PARAM_BYTES, gathered_bytes
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import GraphBuilder, linear

ON = TrainingSettings(fp8="delayed", fp8_param_gather=True, zero_stage=1)


def _two_linears():
    """fc1: h[8, 32] = x[8, 64] @ W1[64, 32] + b1[32]; head: y[8, 48] = h @ W2[32, 48] (y read by no op)."""
    g = GraphBuilder("two")
    x = g.tensor("x", (8, 64), role="input")
    sizes = {"b": 8}
    h = linear(g, "fc1", x, ("b", "k"), sizes, 32)
    linear(g, "head", h, ("b", "k"), sizes, 48, bias=False)
    return g.build()


def _terms(graph, index, settings, *, graph_output=False):
    op = graph.ops[index]
    space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
    row = space.index_of({"b": 4})  # data parallel 4: every parameter replicated 4 ways
    terms = grad_sync_terms(op, space, tensors=graph.tensors, settings=settings, graph_output=graph_output)
    return {(t.tensor, t.collective): (float(t.num_bytes[row]), t.count) for t in terms}


class TestGatheredBytes:
    def test_fp8_weight_gathers_one_byte(self):
        graph = _two_linears()
        got = _terms(graph, 0, ON)
        # W1: 64 x 32 = 2,048 elements, gathered in FP8 at 1 B each; its gradient reduce-scattered in bf16, 2 B
        assert got[("fc1.weight", "all_gather")] == (2048.0, 1.0)
        assert got[("fc1.weight", "reduce_scatter")] == (4096.0, 1.0)
        # the bias (32 elements) is no FP8 tensor: 2 B gathered
        assert got[("fc1.bias", "all_gather")] == (64.0, 1.0)

    def test_off_without_the_launcher_rule_or_zero(self):
        graph = _two_linears()
        off = _terms(graph, 0, dataclasses.replace(ON, fp8_param_gather=False))
        assert off[("fc1.weight", "all_gather")] == (4096.0, 1.0)  # 2,048 x 2 B bf16
        bf16 = _terms(graph, 0, TrainingSettings(fp8_param_gather=True, zero_stage=1))
        assert bf16[("fc1.weight", "all_gather")] == (4096.0, 1.0)  # no FP8, nothing to gather in FP8
        assert not TrainingSettings(fp8="delayed", fp8_param_gather=True, zero_stage=0).gathers_fp8

    def test_zero3_gathers_twice_at_one_byte(self):
        graph = _two_linears()
        got = _terms(graph, 0, dataclasses.replace(ON, zero_stage=3))
        # ZeRO-3: before forward and again before backward, 2,048 B each time
        assert got[("fc1.weight", "all_gather")] == (2048.0, 2.0)
        assert got[("fc1.weight", "reduce_scatter")] == (4096.0, 1.0)

    def test_lm_head_stays_bf16(self):
        graph = _two_linears()
        # W2: 32 x 48 = 1,536 elements; Megatron's output layer is no Transformer Engine module: 2 B each
        head = _terms(graph, 1, ON, graph_output=True)
        assert head[("head.weight", "all_gather")] == (3072.0, 1.0)
        assert _terms(graph, 1, ON)[("head.weight", "all_gather")] == (1536.0 * FP8_PARAM_BYTES, 1.0)

    def test_unaligned_weight_stays_bf16(self):
        g = GraphBuilder("odd")
        x = g.tensor("x", (8, 60), role="input")
        linear(g, "fc", x, ("b", "k"), {"b": 8}, 32, bias=False)  # 60 is no multiple of 16: no FP8 GEMM
        graph = g.build()
        op = graph.ops[0]
        weight = graph.tensors["fc.weight"]
        assert gathered_bytes(op, graph.tensors, ON, weight, bf16_bytes=2.0) == 2.0


def test_sync_memo_key_holds_the_rule():
    """The caches of one plan share priced synchronisation: the key must tell the FP8 gather apart."""
    graph = _two_linears()
    op = graph.ops[0]
    space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
    owned = (1, 2)
    key = lambda s, head=False: _sync_key(op, space, graph.tensors, owned, s, recomputed=False, executed=False,
                                          graph_output=head)
    assert key(ON) != key(dataclasses.replace(ON, fp8_param_gather=False))
    assert key(ON) != key(ON, head=True)
    plain = TrainingSettings(zero_stage=1)
    assert key(plain) == key(plain, head=True)  # read only where FP8 is gathered in FP8


def test_sync_memo_key_holds_the_zero3_gather_rule():
    """The priced-synchronisation memo is shared by every ZeRO-3 array of a device count, DeepSpeed's rule and the
    FSDP launchers' alike (objectives.pipeline_cost ``_priced_sync``): where the terms differ, so must the keys. A
    recomputed op gathers 3 times under DeepSpeed's rule, 2 under FSDP's (386edcb); under reshard=never 1 under FSDP's."""
    from planner.core.settings import Zero3Gather

    graph = _two_linears()
    op = graph.ops[0]
    space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
    owned = (1, 2)
    deepspeed = Zero3Gather(prefetch_bucket=50_000_000, max_live=1_000_000_000, max_reuse_distance=1_000_000_000,
                            persistence_threshold=100_000, reduce_bucket=500_000_000)  # DeepSpeed 0.19.8's defaults
    for fsdp, recomputed in ((TrainingSettings(zero_stage=3), True), (TrainingSettings(zero_stage=3, reshard_after_forward="never"), False)):
        rule = dataclasses.replace(fsdp, zero3_gather=deepspeed)
        gathers = [max(t.count for t in grad_sync_terms(op, space, tensors=graph.tensors, settings=s, owned_inputs=owned,
                                                         recomputed=recomputed) if t.collective == "all_gather")
                   for s in (fsdp, rule)]
        assert gathers == ([2.0, 3.0] if recomputed else [1.0, 2.0])
        keys = [_sync_key(op, space, graph.tensors, owned, s, recomputed=recomputed, executed=False) for s in (fsdp, rule)]
        assert keys[0] != keys[1]
