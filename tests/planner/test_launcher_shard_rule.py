"""Megatron-LM's rows of ``planner plan`` keep a sequence-parallel linear layer's input shard, not the
gathered tensor (``Target.sequence_shard_saved``, ``objectives.saved_credits.sequence_shard_credit``): the
rule reaches the pricing per search (``TargetRules.sequence_shard_saved``), as ZeRO-3's gather rule does,
since DeepSpeed shares Megatron-LM's cost cache (one execution model) and keeps the gathered input. Each
point carries it (``PipelinePoint.sequence_shard_saved``) to its plan file, and ``planner explain``
prices the file alike. Bytes by hand on gpt2_tiny (tests/objectives/test_sequence_shard_memory.py). Likewise
Megatron-Core's fused SwiGLU (``Target.fused_swiglu``, ``objectives.gated_credit``; DeepSpeed's SwiGLU is
plain PyTorch): llama_tiny's rows, by hand as tests/objectives/test_fused_swiglu_memory.py counts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.targets import runnable_plan_targets
from objectives.cluster import make_cluster
from objectives.memory import OTHER_FRACTION
from objectives.pipeline_price import price_plan
from planner.launchable import export_row, plan_launchable_file, reprice_saved
from planner.core.settings import TrainingSettings
from planner.pipeline import point_plan_input
from planner.plan import PlanRequest
from tests.objectives.test_sequence_shard_memory import CREDIT, TINY

# tp 2 with sequence parallelism on 2 devices, micro-batch 2 x 128 tokens: 5 gathered inputs (each
# block's qkv and fc, the head after ln_f) kept as their 16,384-B shards, not 32,768 B: 81,920 B
assert CREDIT == 5 * (2 * 64 * 128 * 2 - 2 * 64 * 128 * 2 // 2) == 81_920


def _frontier(model, dims: dict):
    """Every launcher's rows of ``model`` on 2 devices, none merged."""
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2))
    _, (found,) = plan_launchable_file(model, dims, [request], collapse=0.0)
    return found


@pytest.fixture(scope="module")
def frontier():
    return _frontier(TINY, {"batch": 2, "seq": 128})


def _sp_rows(frontier):
    """Megatron's tp 2 rows of one micro-batch of 2 samples that keep the linears' inputs (no
    recomputation of them): sequence parallel, credited."""
    return [row for row in frontier.rows if row.degrees.tp == 2 and row.point.micro_batch_samples == 2
            and row.point.recompute == "none"]


def _uncredited(row, **rules):
    """The same plan priced as a launcher that keeps the gathered input prices it on the shared cache
    (DeepSpeed's search: ``sequence_shard_saved=False``; ``rules``: the others as given)."""
    point = row.point
    bounds = [s.layers[0] for s in point.stages] + [point.stages[-1].layers[1]]
    return price_plan(row.cache, pp=point.pp, batch=point.micro_batch_samples, zero_stage=point.zero_stage,
                      recompute=point.recompute, choice=point.choice, bounds=bounds, global_batch=point.global_batch,
                      zero3_gather=point.zero3_gather, **{"sequence_shard_saved": False, **rules}).point()


def test_a_megatron_sequence_parallel_row_holds_the_shard(frontier):
    rows = _sp_rows(frontier)
    assert rows and all(row.targets == ("megatron",) for row in rows)  # credited: Megatron's alone
    for row in rows:
        assert row.point.sequence_shard_saved
        plain = _uncredited(row)
        assert not plain.sequence_shard_saved
        # one micro-batch in flight on one stage: the activations hold the credit once, the allowance on top
        assert plain.memory.activations_bytes - row.point.memory.activations_bytes == pytest.approx(CREDIT, rel=1e-12)
        assert plain.memory_bytes - row.memory_bytes == pytest.approx((1 + OTHER_FRACTION) * CREDIT, rel=1e-12)
        assert plain.time_s == row.time_s  # memory only


def test_the_launchers_that_keep_the_gathered_input_do_not_run_a_credited_plan(frontier):
    row = _sp_rows(frontier)[0]
    credited = point_plan_input(row.point, row.cache)
    assert credited.settings.sequence_shard_saved
    assert runnable_plan_targets([credited]) == [("generic", "megatron")]
    # the same plan priced with the gathered input: DeepSpeed's and DTensor's rule (neither runs this
    # Megatron-style tp x sp layout, so the generic plan and Megatron-LM, which holds less than priced)
    plain = point_plan_input(_uncredited(row), row.cache)
    assert not plain.settings.sequence_shard_saved
    assert "megatron" in runnable_plan_targets([plain])[0]


def test_no_credit_without_a_gather_or_a_kept_input(frontier):
    for row in frontier.rows:
        gathered = row.degrees.tp > 1 and row.point.recompute in ("none", "selective")
        assert row.point.sequence_shard_saved == gathered, row.point.summary


def test_a_saved_megatron_plan_prices_again_with_the_shard(frontier, tmp_path: Path):
    for index, row in enumerate(frontier.rows):
        path = tmp_path / f"{index}.json"
        path.write_text(json.dumps(export_row(frontier, index, "generic")))
        saved = json.loads(path.read_text())
        assert saved["training"].get("sequence_shard_saved", False) == row.point.sequence_shard_saved
        again = reprice_saved(path, model=TINY)
        assert again.point.memory_bytes == pytest.approx(row.memory_bytes, rel=1e-12), row.point.summary
        assert again.point.memory.activations_bytes == pytest.approx(row.point.memory.activations_bytes, rel=1e-12)
        assert again.point.time_s == pytest.approx(row.time_s, rel=1e-12), row.point.summary


LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"  # 2 layers, hidden 64, ffn 128


@pytest.fixture(scope="module")
def llama():
    return _frontier(LLAMA, {"batch": 2, "seq": 64})


def test_megatrons_fused_swiglu_keeps_fc1s_output_only(llama):
    rows = [row for row in llama.rows if row.point.pp == 1 and row.degrees.tp == 2 and "megatron" in row.targets]
    assert rows and all(row.targets == ("megatron",) and row.point.fused_swiglu for row in rows)
    for row in rows:
        point = row.point
        # per layer the product keeps up's output, not silu(gate): samples x 64 tokens x ffn 128 / tp 2 x 2 B
        # (bf16); both layers where the MLP keeps its activations, the re-run layer's working set only under
        # mlp / full recomputation
        per_layer = point.micro_batch_samples * 64 * (128 // 2) * 2
        layers = 2 if point.recompute in ("none", "selective") else 1
        plain = _uncredited(row, sequence_shard_saved=point.sequence_shard_saved, fused_swiglu=False)
        assert not plain.fused_swiglu
        assert plain.memory.activations_bytes - point.memory.activations_bytes == pytest.approx(layers * per_layer,
                                                                                                rel=1e-12)


def test_torchtitans_rows_keep_the_silu_output(llama):
    rows = [row for row in llama.rows if "torchtitan" in row.targets]
    assert rows and not any(row.point.fused_swiglu or "megatron" in row.targets for row in rows)


def test_a_saved_llama_plan_prices_again_with_the_fused_swiglu(llama, tmp_path: Path):
    for index, row in enumerate(llama.rows):
        path = tmp_path / f"{index}.json"
        path.write_text(json.dumps(export_row(llama, index, "generic")))
        assert json.loads(path.read_text())["training"].get("fused_swiglu", False) == row.point.fused_swiglu
        again = reprice_saved(path, model=LLAMA)
        assert again.point.memory_bytes == pytest.approx(row.memory_bytes, rel=1e-12), row.point.summary
        assert again.point.time_s == pytest.approx(row.time_s, rel=1e-12), row.point.summary


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_memory_bounds_stay_below_every_credited_price(recompute):
    # a credit lowers memory: the pruning bounds take each op's largest (pipeline_bounds._credited_minima),
    # so they stay below every plan Megatron-LM's rules price, and lie below the bound without them
    import numpy as np

    from objectives.pipeline_cost import PipelineCostCache
    from planner.pipeline import graph_loader
    from planner.search.pipeline_bounds import _lower_bounds

    cache = PipelineCostCache(graph_loader(LLAMA, {"seq": 64}), cluster=make_cluster("a100-80gb", devices=2),
                              settings=TrainingSettings(engine="fused", attention="flash"))
    arrays, structure = cache.arrays(2, 2, 1, recompute), cache.structure(2)
    masks = cache.masks(2, 2, inside_node=True, data_parallel=None)
    rules = {"sequence_shard_saved": True, "fused_swiglu": True}
    credit = cache.activation_credit_ceiling(arrays, recompute, **rules)
    assert credit  # the fused SwiGLU's, and under "none" the shard's too

    def bound(given) -> float:
        return _lower_bounds(cache, arrays, masks, structure, pp=1, micro_batches=1, in_flight=np.ones(1),
                             p2p_floor_s=cache.p2p_floor_s(structure, 1, 2), schedule="1f1b", chunks=1,
                             credit=given)[1]

    def price(picks) -> float:  # the tables' part: NCCL's buffers are the search's own floor (_Slot.nccl_floor)
        return price_plan(cache, pp=1, batch=2, zero_stage=1, recompute=recompute, choice=picks,
                          bounds=(0, structure.num_layers), global_batch=2, **rules).point().memory.allocator_bytes

    credited, plain = bound(credit), bound(None)
    rng = np.random.default_rng(0)
    for _ in range(60):
        assert price([int(rng.choice(np.flatnonzero(mask))) for mask in masks]) >= credited
    # each op at its leanest credited configuration: a plan below the bound without the credit
    flat, leanest = arrays.flat, []
    for op, mask in enumerate(masks):
        allowed = np.flatnonzero(mask)
        index = arrays.offsets[op] + allowed
        held = sum(flat[name][index] for name in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes"))
        leanest.append(int(allowed[np.argmin(held - credit[op][allowed] if op in credit else held)]))
    assert credited <= price(leanest) < plain
