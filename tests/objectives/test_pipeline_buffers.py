"""The bytes a pipeline runtime holds at its stage cuts (``objectives.pipeline_buffers``): the formulas counted by
hand from torch 2.13's ``torch/distributed/pipelining/stage.py`` and DeepSpeed 0.19.8's ``runtime/pipe/engine.py``,
priced on the 2-layer GPT by hand, and the launchers, search rules and estimate rows carrying the rule."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from objectives.memory import OTHER_FRACTION
from objectives.pipeline_buffers import stage_buffer_bytes
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader, target_rules
from tests.objectives.test_fsdp_memory import _replicated  # every op data-parallel: each parameter whole

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64

# the hidden state between the two blocks: 4 samples x 128 tokens x 64 x 2 bytes (bf16) over the stage's 4 devices
PER_DEVICE = 4 * 128 * 64 * 2 // 4  # 16,384


class TestFormulas:
    def test_torch_1f1b(self):
        # 3 stages, 6 micro-batches, in flight 3 / 2 / 1 (1F1B), 100 bytes in and out.
        # stage 0: 3 fwd_cache outputs + 6 gradient receive buffers = 900;
        # stage 1: 2 outputs + 6 gradient buffers + (6 - 2) receive buffers not in flight = 1,200;
        # stage 2 (the last): its 6 - 1 idle receive buffers = 500
        got = stage_buffer_bytes("torch", cut_in=[100.0] * 3, cut_out=[100.0] * 3, in_flight=[3, 2, 1], micro_batches=6)
        assert got.tolist() == [900.0, 1200.0, 500.0]

    def test_torch_reads_each_cut(self):
        # stage 1 receives 7 bytes and sends 11: 1 x 11 + 4 x 11 + (4 - 1) x 7
        got = stage_buffer_bytes("torch", cut_in=[0.0, 7.0, 11.0], cut_out=[7.0, 11.0, 0.0], in_flight=[2, 1, 1],
                                 micro_batches=4)
        assert got[1] == 11 + 44 + 21

    def test_torch_looped(self):
        # 2 ranks x 2 chunks, 4 micro-batches, 10 bytes: rank 0 holds stages 0 and 2 (stage 0 receives nothing), rank 1
        # stages 1 and 3 (stage 3 sends nothing). The interleaved order (torch's Interleaved1F1B, Megatron's) holds
        # min(2(S - r - 1) + (v - 1) S + 1, M v) chunk passes: 5 on rank 0 (in_flight 2.5), 3 on rank 1 (1.5).
        # Rank 0 at its peak: stage 0 holds min(2S, M) = 4 of them, stage 2 one. Its 5 in-flight outputs in fwd_cache,
        # 50; 2 stages x 4 gradient buffers, 80; stage 2's 4 receive buffers less its 1 in flight, 30: 160
        got = stage_buffer_bytes("torch", cut_in=[10.0] * 2, cut_out=[10.0] * 2, in_flight=[2.5, 1.5], micro_batches=4,
                                 chunks=2)
        assert got[0] == pytest.approx(160.0)
        # rank 1: stage 3 (the model's last chunk) holds 1 of the 3, stage 1 the other 2: stage 1's 2 outputs, 20;
        # its 4 gradient buffers, 40; 2 x 4 receive buffers less the 3 in flight, 50: 110
        assert got[1] == pytest.approx(20.0 + 40.0 + 50.0)

    def test_torch_looped_eight_ranks(self):
        # S = 8, v = 2, M = 16, 1 byte: rank r holds min(2(7 - r) + 9, 32) chunk passes (23, 21, ..., 9).
        # rank 0: 23 outputs + 2 x 16 gradient buffers + (16 - (23 - 16)) idle receive buffers of stage 8 = 23 + 32 + 9
        # rank 3: 17 outputs + 32 + (32 - 17) = 64; rank 7: (9 - 1) outputs + 16 + (32 - 9) = 47
        flights = [(2 * (7 - r) + 9) / 2 for r in range(8)]
        got = stage_buffer_bytes("torch", cut_in=[1.0] * 8, cut_out=[1.0] * 8, in_flight=flights, micro_batches=16,
                                 chunks=2)
        assert got[[0, 3, 7]].tolist() == [64.0, 64.0, 47.0]

    def test_deepspeed_has_no_chunks(self):
        with pytest.raises(ValueError, match="no model chunks"):
            stage_buffer_bytes("deepspeed", cut_in=[1.0] * 2, cut_out=[1.0] * 2, in_flight=[2.5, 1.5], micro_batches=4,
                               chunks=2)

    def test_deepspeed(self):
        # tensor parallel: the in-flight partitioned outputs + one gradient buffer (sending stages), one receive
        # buffer (receiving stages); without it each in-flight received input is also kept beside its clone
        tp = stage_buffer_bytes("deepspeed", cut_in=[10.0] * 3, cut_out=[10.0] * 3, in_flight=[3, 2, 1], micro_batches=6)
        assert tp.tolist() == [40.0, 40.0, 10.0]
        no_tp = stage_buffer_bytes("deepspeed", cut_in=[10.0] * 3, cut_out=[10.0] * 3, in_flight=[3, 2, 1],
                                   micro_batches=6, tensor_parallel=False)
        assert no_tp.tolist() == [40.0, 30.0 + 30.0, 20.0]

    def test_none_and_one_stage(self):
        assert stage_buffer_bytes("none", cut_in=[9.0] * 2, cut_out=[9.0] * 2, in_flight=[2, 1], micro_batches=4).tolist() == [0, 0]
        assert stage_buffer_bytes("torch", cut_in=[9.0], cut_out=[9.0], in_flight=[4], micro_batches=4).tolist() == [0]
        with pytest.raises(ValueError, match="pipeline buffers"):
            stage_buffer_bytes("megatron", cut_in=[9.0] * 2, cut_out=[9.0] * 2, in_flight=[2, 1], micro_batches=4)


@pytest.fixture(scope="module")
def cache():
    return PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=8))


class TestPricedByHand:
    """pp = 2 over 8 devices (4 data-parallel per stage), micro-batch 4, 2 micro-batches: 1F1B keeps 2 and 1 in flight."""

    @pytest.fixture()
    def kwargs(self, cache):
        choice = _replicated(cache.model(4, 4, 0, "none"), 4)
        return dict(pp=2, batch=4, zero_stage=0, recompute="none", choice=choice, bounds=(0, 1, 2), global_batch=8)

    def test_cut_is_the_hidden_state(self, cache):
        assert cache.structure(4).cut_bytes[1] == 4 * PER_DEVICE

    def test_torch(self, cache, kwargs):
        bare = evaluate_pipeline(cache, **kwargs)
        point = evaluate_pipeline(cache, **kwargs, pipeline_buffers="torch")
        added = [a.memory.activations_bytes - b.memory.activations_bytes for a, b in zip(point.stages, bare.stages)]
        # stage 0: 2 outputs in fwd_cache + 2 gradient receive buffers; stage 1: 2 receive buffers, 1 not in flight
        assert added == [4 * PER_DEVICE, PER_DEVICE] == [65_536, 16_384]
        assert point.memory_bytes - bare.memory_bytes == pytest.approx((1 + OTHER_FRACTION) * 65_536)
        assert point.time_s == bare.time_s

    def test_deepspeed_without_tensor_parallelism(self, cache, kwargs):
        point = evaluate_pipeline(cache, **kwargs, pipeline_buffers="deepspeed")
        bare = evaluate_pipeline(cache, **kwargs, pipeline_buffers="none")
        added = [a.memory.activations_bytes - b.memory.activations_bytes for a, b in zip(point.stages, bare.stages)]
        # stage 0: 2 in-flight outputs + the gradient buffer; stage 1: the receive buffer + 1 in-flight received input
        assert added == [3 * PER_DEVICE, 2 * PER_DEVICE]

    def test_the_settings_fallback(self, kwargs):
        graph, cluster = graph_loader(TINY, {"seq": 128}), make_cluster("a100-80gb", devices=8)
        torch_cache = PipelineCostCache(graph, cluster=cluster, settings=TrainingSettings(pipeline_buffers="torch"))
        by_settings = evaluate_pipeline(torch_cache, **kwargs)
        assert by_settings.memory_bytes == pytest.approx(evaluate_pipeline(torch_cache, **kwargs, pipeline_buffers="torch").memory_bytes)
        assert evaluate_pipeline(torch_cache, **kwargs, pipeline_buffers="none").memory_bytes < by_settings.memory_bytes


def test_launchers_rules_and_rows():
    from objectives.calibration import StepRow
    from planner.calibrate import row_settings

    assert target_rules("torchtitan").pipeline_buffers == "torch"
    assert target_rules("deepspeed").pipeline_buffers == "deepspeed"
    assert target_rules("megatron").pipeline_buffers == "none"
    fields = {f.name for f in dataclasses.fields(StepRow)}
    base = dict(id="r", model={}, device="a100-80gb", devices=8, devices_per_node=8, tp=1, pp=2, dp=4, micro_batch=1,
                global_batch=8, recompute="none", step_s=1.0)
    row = StepRow(**{k: v for k, v in base.items() if k in fields}, zero=1, launcher="torchtitan")
    assert row_settings(row).pipeline_buffers == "torch"
    assert row_settings(dataclasses.replace(row, launcher="deepspeed")).pipeline_buffers == "deepspeed"
    assert row_settings(dataclasses.replace(row, launcher=None)).pipeline_buffers == "none"
    with pytest.raises(InputError, match="pipeline_buffers"):
        TrainingSettings(pipeline_buffers="megatron")


@pytest.mark.parametrize("kind, schedule", [("torch", "1f1b"), ("deepspeed", "1f1b"), ("torch", "gpipe")])
def test_the_search_segments_hold_what_the_price_holds(cache, kind, schedule):
    # the search picks cuts by its segment costs (planner.search.stage_costs._step_costs): each cut's memory there
    # must be the price's, the runtime's buffers included
    from objectives.pipeline_price import price_plan
    from planner.search.stage_costs import _step_costs

    picks = _replicated(cache.model(4, 4, 0, "none"), 4)
    arrays = cache.arrays(4, 4, 0, "none")
    in_flight = cache.in_flight(schedule, stages=2, micro_batches=2, chunks=1)
    costs = _step_costs(cache, arrays, cache.structure(4), picks, pp=2, recompute="none", in_flight=in_flight,
                        schedule=schedule, micro_batches=2, chunks=1, zero_stage=0, pipeline_buffers=kind)
    bare = _step_costs(cache, arrays, cache.structure(4), picks, pp=2, recompute="none", in_flight=in_flight,
                       schedule=schedule, micro_batches=2, chunks=1, zero_stage=0)
    price = price_plan(cache, pp=2, batch=4, zero_stage=0, recompute="none", choice=picks, bounds=(0, 1, 2),
                       global_batch=8, schedule=schedule, pipeline_buffers=kind)
    assert max(costs.memory[0, 0, 1], costs.memory[1, 1, 2]) == pytest.approx(price.memory_bytes, rel=1e-12)
    assert costs.memory[0, 0, 1] > bare.memory[0, 0, 1]
