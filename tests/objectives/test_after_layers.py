"""The ops after the last layer (final norm, output layer, loss) under a looped schedule (``objectives.after_layers``):
the model's last chunk holds one micro-batch of them at its rank's peak, not the rank's average in-flight count; the
price, the search's segment costs and its bounds hold them alike; torch's looped stages keep their buffers per chunk
(``objectives.pipeline_buffers``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.pipeline_price import price_plan
from objectives.schedules import stage_orders
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader
from tests.objectives.test_fsdp_memory import _replicated  # every op data-parallel: each parameter whole

GPT2 = Path(__file__).resolve().parents[2] / "examples" / "gpt2.onnx"  # 12 layers, hidden 768, vocab 50,257

# per device (4 data-parallel devices, micro-batch 4: one sample of 128 tokens), bf16: the final LayerNorm saves its
# input, 128 x 768 x 2; lm_head saves its input, the same, and the logits with Megatron's loss (the fused engine's
# default, objectives.memory.loss_bytes_per_logit: bf16 logits + an fp32 tensor, 6 bytes) 128 x 50,257 x 6
TAIL = 128 * 768 * 2 + 128 * 768 * 2 + 128 * 50_257 * 6  # 38,990,592


def _peaks(schedule: str, stages: int, micro_batches: int, chunks: int) -> list[tuple[int, dict[int, int]]]:
    """Per stage, the most chunk passes it holds and, at the peaks, the most each virtual stage holds: replayed from
    the planner's copy of Megatron-LM's interleaved order (``objectives.schedules.stage_orders``)."""
    out = []
    for order in stage_orders(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks):
        live: dict[int, int] = {}
        best, at = -1, {}
        for item in order:
            live[item.virtual_stage] = live.get(item.virtual_stage, 0) + (1 if item.kind == "F" else -1)
            total = sum(live.values())
            if item.kind == "F" and total >= best:
                at = {} if total > best else at
                best = total
                for j, n in live.items():
                    at[j] = max(at.get(j, 0), n)
        out.append((best, at))
    return out


@pytest.mark.parametrize("stages, chunks, micro_batches", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 16), (8, 4, 64)])
def test_the_interleaved_order_holds_one_micro_batch_of_the_last_chunk(stages, chunks, micro_batches):
    peaks = _peaks("interleaved", stages, micro_batches, chunks)
    last_virtual = stages * chunks - 1
    assert peaks[-1][1][last_virtual] == 1  # the last chunk: one micro-batch at every peak of the last rank
    assert peaks[0][1][0] == min(2 * stages, micro_batches)  # the first chunk on rank 0 (the buffers' g)
    # the rank's count the pricing takes, (2(S - 1 - r) + (v - 1) S + 1) / v chunk passes
    assert [best for best, _ in peaks] == [min(2 * (stages - 1 - r) + (chunks - 1) * stages + 1, micro_batches * chunks)
                                          for r in range(stages)]


@pytest.fixture(scope="module")
def cache():
    return PipelineCostCache(graph_loader(GPT2, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=8),
                             settings=TrainingSettings(engine="fused"))


@pytest.fixture(scope="module")
def kwargs(cache):
    # pp 2, 6 layers a stage (3 a chunk), micro-batch 4, 4 micro-batches
    return dict(pp=2, batch=4, zero_stage=0, recompute="none", choice=_replicated(cache.model(4, 4, 0, "none"), 4),
                bounds=(0, 6, 12), global_batch=16)


def test_the_tail_is_the_norm_the_head_and_the_loss(cache, kwargs):
    structure, arrays = cache.structure(4), cache.arrays(4, 4, 0, "none")
    charged = arrays.flat["activations_bytes"][arrays.offsets + kwargs["choice"]]
    assert charged[structure.position >= structure.num_layers].sum() == TAIL


def test_the_last_stage_holds_one_micro_batch_of_the_tail(cache, kwargs):
    one = evaluate_pipeline(cache, **kwargs, schedule="1f1b")  # the last stage holds one micro-batch: a_1
    looped = evaluate_pipeline(cache, **kwargs, schedule="interleaved", chunks=2)
    a_0 = one.stages[0].memory.activations_bytes / 2.0  # 1F1B's first stage holds 2
    a_1 = one.stages[1].memory.activations_bytes
    assert [s.in_flight for s in looped.stages] == [2.5, 1.5]  # (2 + 2 + 1) / 2, (0 + 2 + 1) / 2
    assert looped.stages[0].memory.activations_bytes == pytest.approx(2.5 * a_0, rel=1e-12)
    # the layers' 1.5 micro-batches, the tail's one: (a_1 - t) x 1.5 + t, not a_1 x 1.5
    assert looped.stages[1].memory.activations_bytes == pytest.approx((a_1 - TAIL) * 1.5 + TAIL, rel=1e-12)


@pytest.mark.parametrize("kind", ["none", "torch"])
def test_the_search_segments_hold_what_the_price_holds(cache, kwargs, kind):
    from planner.search.stage_costs import _step_costs

    picks, arrays = kwargs["choice"], cache.arrays(4, 4, 0, "none")
    in_flight = cache.in_flight("interleaved", stages=2, micro_batches=4, chunks=2)
    costs = _step_costs(cache, arrays, cache.structure(4), picks, pp=2, recompute="none", in_flight=in_flight,
                        schedule="interleaved", micro_batches=4, chunks=2, zero_stage=0, pipeline_buffers=kind)
    price = price_plan(cache, **kwargs, schedule="interleaved", chunks=2, pipeline_buffers=kind)
    assert max(costs.memory[0, 0, 6], costs.memory[1, 6, 12]) == pytest.approx(price.memory_bytes, rel=1e-12)
    point = evaluate_pipeline(cache, **kwargs, schedule="interleaved", chunks=2, pipeline_buffers=kind)
    assert [costs.memory[0, 0, 6], costs.memory[1, 6, 12]] == pytest.approx([s.memory.total_bytes for s in point.stages],
                                                                            rel=1e-12)


def test_torch_buffers_per_chunk(cache, kwargs):
    bare = evaluate_pipeline(cache, **kwargs, schedule="interleaved", chunks=2)
    point = evaluate_pipeline(cache, **kwargs, schedule="interleaved", chunks=2, pipeline_buffers="torch")
    added = [a.memory.activations_bytes - b.memory.activations_bytes for a, b in zip(point.stages, bare.stages)]
    cut = 128 * 768 * 2  # the hidden state per device, every cut alike
    # rank 0 (stages 0, 2), 5 chunk passes, stage 0 holding min(2S, M) = 4 of them: 5 outputs + 2 x 4 gradient
    # buffers + stage 2's 4 receive buffers less its one in flight; rank 1 (stages 1, 3), 3 passes, stage 3 one:
    # 2 outputs (stage 3's output is the loss's input) + 4 gradient buffers + 2 x 4 - 3 idle receive buffers
    assert added == [(5 + 8 + 3) * cut, (2 + 4 + 5) * cut]
    assert point.time_s == bare.time_s
    # DeepSpeed's engine has no model chunks, ZB-V's same-rank stages no buffers: neither is priced looped
    for kind, schedule in (("deepspeed", "interleaved"), ("torch", "zbv")):
        other = evaluate_pipeline(cache, **kwargs, schedule=schedule, chunks=2, pipeline_buffers=kind)
        plain = evaluate_pipeline(cache, **kwargs, schedule=schedule, chunks=2)
        assert other.memory_bytes == plain.memory_bytes


def test_the_bounds_stay_below_the_price(cache, kwargs):
    # the search's memory bound and floor (planner.search.pipeline_bounds) over the plan's own choice alone: at most
    # its price at its best cut (the tail at one micro-batch, as the price holds it)
    from planner.search.pipeline_bounds import _lower_bounds, _memory_floor

    picks = kwargs["choice"]
    arrays = cache.arrays(4, 4, 0, "none", edges=False)
    masks = [np.arange(space.size) == p for space, p in zip(arrays.spaces, picks)]
    structure = cache.structure(4)
    in_flight = cache.in_flight("interleaved", stages=2, micro_batches=4, chunks=2)
    _, memory = _lower_bounds(cache, arrays, masks, structure, pp=2, micro_batches=4, in_flight=in_flight,
                              p2p_floor_s=np.zeros(1), schedule="interleaved", chunks=2)
    best = min(price_plan(cache, **{**kwargs, "bounds": (0, cut, 12)}, schedule="interleaved", chunks=2).memory_bytes
               for cut in range(1, 12))
    assert memory <= best
    floor = _memory_floor(arrays, masks, float(in_flight.min()), scale=cache.memory_scale, structure=structure)
    assert floor / 2 <= best
    # the floor charges every op at the least in-flight count (1.5) but the tail at one micro-batch: 0.5 x TAIL less
    # (times the memory allowance, lowered by the bounds' slack) than the same floor without the layers known
    plain = _memory_floor(arrays, masks, float(in_flight.min()), scale=cache.memory_scale)
    assert plain - floor == pytest.approx(cache.memory_scale * 0.5 * TAIL, rel=1e-6)
