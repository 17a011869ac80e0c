"""FP8 weights kept in FP8 (issue 24 item 3, the memory side of Megatron-LM's ``--fp8-param-gather``): an
FP8 linear's weight holds its FP8 data and transpose (2 B) at ZeRO 1-2 and its shard's data (1 B) at
ZeRO-3 in place of bf16's 2 B plus the cached FP8 copy's 2 B (``objectives.precision.fp8_primary_bytes``),
and ZeRO-3 gathers it at 1 B; biases, the LM head and every other state keep their bytes. Counted by hand
on a two-linear graph at dp 4, and the pipeline arrays (derived from a ZeRO-0 model) against models built
at each stage with the rule on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from objectives.memory import (
    StateBytes,
    fp8_weight_elements,
    fsdp_kept_ranges,
    fsdp_unsharded_peak,
    parameter_state_bytes,
)
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.settings import TrainingSettings
from tests.objectives.test_fp8_gather import _two_linears

ON = TrainingSettings(fp8="delayed", fp8_param_gather=True, zero_stage=1)  # bf16-mixed Adam: 4 + 2 + 12 B off


def _states(graph, index, settings, *, graph_output=False) -> tuple[float, float, float]:
    """``(params, grads, optimizer)`` bytes of op ``index`` at data parallel 4 (every parameter replicated 4 ways)."""
    op = graph.ops[index]
    space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
    row = space.index_of({"b": 4})
    got = parameter_state_bytes(op, space, tensors=graph.tensors, settings=settings, graph_output=graph_output)
    return tuple(float(a[row]) for a in got)


class TestHandCounted:
    """fc1: W1 64 x 32 = 2,048 elements (an FP8 linear's weight) + b1 32; head: W2 32 x 48 = 1,536, no bias."""

    @pytest.mark.parametrize("zero, off, on", [
        # ZeRO-1: params whole. Off: 2,080 x (2 bf16 + 2 FP8 copy) = 8,320. On: W1 2,048 x (1 data + 1
        # transpose) + b1 32 x 4 = 4,224. Gradients 2,080 x 2 = 4,160 whole; fp32 main + moments
        # 2,080 x 12 / 4 = 6,240 either way (the distributed optimizer's main shard is unchanged).
        (1, (8320.0, 4160.0, 6240.0), (4224.0, 4160.0, 6240.0)),
        # ZeRO-3: all divided by 4. Off: 8,320 / 4 = 2,080. On: W1's shard 2,048 x 1 / 4 = 512 (no
        # transpose kept sharded) + b1 128 / 4 = 32: 544. Gradients 4,160 / 4 = 1,040.
        (3, (2080.0, 1040.0, 6240.0), (544.0, 1040.0, 6240.0)),
    ])
    def test_fc1_bytes(self, zero, off, on):
        graph = _two_linears()
        settings = dataclasses.replace(ON, zero_stage=zero)
        assert _states(graph, 0, dataclasses.replace(settings, fp8_param_gather=False)) == off
        assert _states(graph, 0, settings) == on

    def test_bytes_per_fp8_weight_element(self):
        graph = _two_linears()
        # the weight alone (b1 owned apart): per element, param + grad + optimizer
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
        row = space.index_of({"b": 4})
        per = {}
        for zero in (1, 3):
            for rule in (False, True):
                s = dataclasses.replace(ON, zero_stage=zero, fp8_param_gather=rule)
                total = sum(parameter_state_bytes(op, space, tensors=graph.tensors, settings=s, owned_inputs=[1]))
                per[zero, rule] = float(total[row]) / 2048
        # ZeRO-1: off 4 + 2 + 12/4 = 9; on 2 + 2 + 3 = 7. ZeRO-3: off (4 + 2 + 12)/4 = 4.5; on (1 + 2 + 12)/4 = 3.75
        assert per == {(1, False): 9.0, (1, True): 7.0, (3, False): 4.5, (3, True): 3.75}

    @pytest.mark.parametrize("zero", [1, 3])
    def test_lm_head_keeps_bf16_and_its_copy(self, zero):
        graph = _two_linears()
        settings = dataclasses.replace(ON, zero_stage=zero)
        # W2 1,536 x 4 = 6,144 at ZeRO-1, / 4 = 1,536 at ZeRO-3: Megatron's output layer is no TE module
        params = 6144.0 if zero == 1 else 1536.0
        assert _states(graph, 1, settings, graph_output=True)[0] == params
        # the same weight read as an FP8 linear (not the graph's output) would be kept in FP8
        assert _states(graph, 1, settings)[0] == (1536.0 * 2 if zero == 1 else 1536.0 / 4)

    def test_zero_0_and_rowwise_untouched(self):
        graph = _two_linears()
        zero0 = dataclasses.replace(ON, zero_stage=0)  # no ZeRO: Megatron refuses the flag, nothing kept in FP8
        assert _states(graph, 0, zero0) == _states(graph, 0, dataclasses.replace(zero0, fp8_param_gather=False))

    def test_fp8_weight_elements(self):
        graph = _two_linears()
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
        row = space.index_of({"b": 4})
        whole, sharded = fp8_weight_elements(op, space, tensors=graph.tensors, settings=ON)
        assert (float(whole[row]), float(sharded[row])) == (2048.0, 512.0)  # W1 only; / 4 replicas
        off = fp8_weight_elements(op, space, tensors=graph.tensors, settings=dataclasses.replace(ON, fp8_param_gather=False))
        assert not off[0].any() and not off[1].any()


class TestGatheredUnits:
    PER = StateBytes(param=4.0, grad=2.0, optimizer=12.0, weight_copy=2.0)  # FP8 delayed, bf16-mixed Adam

    def test_fsdp_peak_counts_elements_apart(self):
        # two units, 1,000 elements each, 800 of them FP8 weights: gathered 800 x 1 + 200 x 2 = 1,200 B each.
        # At the second unit's backward: both whole, 2,400 B; its gradient buffers 1,000 x (2 + 4) = 6,000 B
        # (counted from the bytes, 1,200 / 2 = 600 elements, they would be 3,600)
        peak = fsdp_unsharded_peak([1200.0, 1200.0], kept=[False, False], per=self.PER, elements=[1000.0, 1000.0])
        assert (peak.params_bytes, peak.grads_bytes) == (2400.0, 6000.0)
        # without elements: the bf16 rule, bytes / 2 elements (the rule off: 2,000 B a unit)
        plain = fsdp_unsharded_peak([2000.0, 2000.0], kept=[False, False], per=self.PER)
        assert (plain.params_bytes, plain.grads_bytes) == (4000.0, 6000.0)

    def test_kept_ranges_match_the_peak_with_elements(self):
        units, elements = np.array([1200.0, 700.0, 1500.0]), np.array([1000.0, 400.0, 1000.0])
        for accumulate in (False, True):
            ranges = fsdp_kept_ranges(units, per=self.PER, accumulate=accumulate, elements=elements)
            for lo in range(3):
                for hi in range(lo, 3):
                    peak = fsdp_unsharded_peak(units[lo:hi + 1], kept=[True] * (hi + 1 - lo), per=self.PER,
                                               accumulate=accumulate, elements=elements[lo:hi + 1])
                    assert ranges[lo, hi] == pytest.approx(peak.total_bytes, rel=1e-12)
        # by hand, all three kept and accumulating: P = 3,400; at unit 0, G = 1,000 x 6 + 2,400 x 4 = 15,600
        assert fsdp_kept_ranges(units, per=self.PER, accumulate=True, elements=elements)[0, 2] == 3400.0 + 15600.0


@pytest.fixture(scope="module")
def caches():
    """GPT-2 tiny (2 layers, hidden 64: q/k/v, projections and MLP are FP8 linears; the tied head, vocab
    1,000, is not) on 8 H100s, FP8 delayed, the rule on and off."""
    from objectives.cluster import make_cluster
    from planner.pipeline import PipelineCostCache, graph_loader
    from tests.planner.test_pipeline import SEQ, TINY

    graph, cluster = graph_loader(TINY, {"seq": SEQ}), make_cluster("h100-sxm", devices=8)
    on = TrainingSettings(fp8="delayed", fp8_param_gather=True)
    return {rule: PipelineCostCache(graph, cluster=cluster, settings=dataclasses.replace(on, fp8_param_gather=rule))
            for rule in (True, False)}


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_pipeline_arrays_match_models_built_at_each_stage(caches, zero):
    """The states derived from the ZeRO-0 model equal the tables built at each stage with the rule on, and
    fall short of the rule off's by the FP8 weights' elements x (4 - fp8_primary_bytes) exactly."""
    from objectives.precision import fp8_primary_bytes

    on, off = caches[True].arrays(8, 4, zero, "none"), caches[False].arrays(8, 4, zero, "none")
    model = caches[True].model(8, 4, zero, "none")
    saved = 4.0 - fp8_primary_bytes(dataclasses.replace(ON, zero_stage=zero))  # ZeRO 1-2: 2 B; ZeRO-3: 3 B
    fp8_ops = 0
    for i, detail in enumerate(model.op_details):
        assert on.params_bytes[i] == pytest.approx(detail.memory.params_bytes, rel=1e-12)
        assert on.grads_bytes[i] == pytest.approx(off.grads_bytes[i], rel=1e-12)
        assert on.optimizer_bytes[i] == pytest.approx(off.optimizer_bytes[i], rel=1e-12)
        op, space = model.graph.ops[i], model.tables.configs[i]
        whole, sharded = fp8_weight_elements(op, space, tensors=model.graph.tensors,
                                             settings=dataclasses.replace(ON, zero_stage=zero))
        fp8_ops += bool(whole.any())
        held = sharded if zero >= 3 else whole
        assert off.params_bytes[i] - on.params_bytes[i] == pytest.approx(saved * held, rel=1e-12, abs=1e-9)
    assert fp8_ops == 8  # per layer: qkv, attention output, fc1, fc2


def test_zero3_gathers_fp8_weights_at_one_byte(caches):
    """ZeRO-3's gathered units: the FP8 weights at 1 B where the rule off holds them at 2, the elements
    (and so the gradient buffers) the same."""
    on, off = caches[True].arrays(8, 4, 3, "none"), caches[False].arrays(8, 4, 3, "none")
    assert "unsharded_elements" not in off.flat
    np.testing.assert_array_equal(on.flat["unsharded_elements"], off.flat["unsharded_bytes"] / 2.0)
    saved = off.flat["unsharded_bytes"] - on.flat["unsharded_bytes"]
    model = caches[True].model(8, 4, 3, "none")
    for i, op in enumerate(model.graph.ops):  # each gathered FP8 weight element saves 2 - 1 B
        space = model.tables.configs[i]
        whole, sharded = fp8_weight_elements(op, space, tensors=model.graph.tensors,
                                             settings=dataclasses.replace(ON, zero_stage=3))
        start = on.offsets[i]
        np.testing.assert_array_equal(saved[start:start + space.size], np.where(sharded < whole, whole, 0.0))
    assert saved.max() > 0.0


def test_zero3_peak_by_hand(caches, monkeypatch):
    """ZeRO-3 over 8 data-parallel H100s, pp 1: units [embedding, block, block, ln_f] (gpt2_tiny's, counted in
    ``tests/objectives/test_fsdp_memory.py``: EMBEDDING 64,000, BLOCK 49,984 elements). A block's FP8 weights:
    64 x 192 + 64 x 64 + 64 x 256 + 256 x 64 = 49,152 at 1 B, its 832 biases and norms at 2 B: 50,816 B.
    Rule off: block 0's backward is the peak, 2 x (49,984 + 64,000) + 6 x 49,984 = 527,872 B. Rule on: block
    0's step holds 50,816 + 128,000 + 6 x 49,984 = 478,720 B, so the embedding's own step is the peak:
    128,000 B whole and 6 x 64,000 = 384,000 B of gradient buffers (bf16 2 + fp32 reduce-scatter input 4)."""
    import objectives.pipeline_price as pipeline_price
    from objectives.memory import UnshardedPeak
    from planner.pipeline import evaluate_pipeline
    from tests.objectives.test_fsdp_memory import _replicated

    def peak(rule, bare=False):
        cache = caches[rule]
        choice = _replicated(cache.model(8, 8, 3, "none"), 8)
        with monkeypatch.context() as m:
            if bare:
                m.setattr(pipeline_price, "fsdp_unsharded_peak", lambda units, **_: UnshardedPeak(params_bytes=0.0, grads_bytes=0.0))
            point = evaluate_pipeline(cache, pp=1, batch=8, zero_stage=3, recompute="none", choice=choice,
                                      bounds=(0, 2), global_batch=8)
        return point.memory.params_bytes, point.memory.grads_bytes

    units = {rule: np.subtract(peak(rule), peak(rule, bare=True)) for rule in (False, True)}
    assert units[False] == pytest.approx([2 * (49_984 + 64_000), 6 * 49_984])
    assert units[True] == pytest.approx([2 * 64_000, 6 * 64_000])
    assert 50_816 + 128_000 + 6 * 49_984 == 478_720 < 512_000 == 8 * 64_000


def test_pipeline_cut_segments_match_the_stage_peaks(caches):
    """The pipeline search's per-cut table (``unsharded_segment_bytes``, from ``fsdp_kept_ranges``) gives each
    stage what the plan's price (``_unsharded_bytes``, from ``fsdp_unsharded_peak``) gives it with FP8 units:
    pp 2, the cut after layer 1, 4 micro-batches (every unit kept, gradients accumulated)."""
    from objectives.pipeline_price import _unsharded_bytes, unsharded_segment_bytes
    from objectives.pipeline_stages import layer_structure

    from tests.objectives.test_fsdp_memory import _replicated

    arrays = caches[True].arrays(4, 2, 3, "none")
    structure = layer_structure(arrays.model.graph)
    picks = _replicated(arrays.model, 2)  # data parallel 2 in each 4-device stage: every unit gathered
    table = unsharded_segment_bytes(arrays, structure, picks, 2, 4)
    params, grads = _unsharded_bytes(arrays, structure, structure.stage_of_ops((0, 1, 2)), picks, 2, 4)
    assert [table[0, 1], table[1, 2]] == pytest.approx((params + grads).tolist(), rel=1e-12)
    # stage 0 = [embedding 64,000 el at 2 B, block 0 50,816 B]: both whole, 178,816 B; at the embedding's
    # backward 6 x 64,000 + 4 x (64,000 + 49,984) B of gradient buffers: 1,018,752 B (from the bytes, 920,448)
    assert table[0, 1] == 128_000 + 50_816 + 6 * 64_000 + 4 * (64_000 + 49_984) == 1_018_752
