"""The pipeline sizes of a search in worker processes (``--jobs``, :mod:`planner.search.size_workers`; issue 22):
the same answers as the serial walk, to the bit.

Oracle: the serial walk itself (``jobs=1``, the code path unchanged by the workers), run on the same model and
request; the comparison is of every point's fields (seconds and bytes as floats, compared with ``==``), the pick,
the notes, and for the whole command the ``--json`` answer with only ``search_time_s`` and the work counts left
out (the workers search each size without the other sizes' points to prune by: more intra-op searches).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner.search.pipeline as pipeline_module
from objectives.cluster import make_cluster
from planner.core.errors import InputError
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.search.pipeline import search_pipeline
from planner.search.size_workers import forks
from tests.planner.cli_helpers import error_line, run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
GPT2 = DATA / "gpt2_tiny.onnx"  # 2 layers: pipelines of 1 and 2 stages
LLAMA = DATA / "llama_tiny.onnx"

pytestmark = pytest.mark.skipif(not forks(), reason="worker processes are forked")

WORK_COUNTS = ("search_time_s", "intra_op_searches", "combinations")


def _point_fields(point) -> tuple:
    """Everything a point says, but its graph and spaces (objects; the graph is checked apart)."""
    return (point.time_s, point.memory_bytes, point.pp, point.dp, point.tp, point.devices_per_stage, point.micro_batch,
            point.micro_batch_samples, point.micro_batches, point.zero_stage, point.recompute, point.schedule,
            point.chunks, point.stages, point.time, point.memory, point.fits, point.summary, point.choice, point.uniform,
            point.zero3_gather, point.sequence_shard_saved, point.fused_swiglu, point.grad_accumulator_bytes,
            point.zero_sync, [space.factors.tolist() for space in point.spaces])


def _four_layers(samples: int):
    """A hand-built 4-layer GPT (hidden 2048, seq 1024; tests/planner/test_pipeline.py's): on 16 devices its
    frontier holds pipelines of 1 and 2 stages."""
    from tests.objectives.graphs import gpt2_like

    if samples not in _FOUR_LAYERS:
        _FOUR_LAYERS[samples] = gpt2_like(layers=4, hidden=2048, heads=16, vocab=16384, positions=1024, batch=samples,
                                          seq=1024)
    return _FOUR_LAYERS[samples]


_FOUR_LAYERS: dict = {}


def _search(path: Path | None, devices: int, jobs: int, **options):
    loader = _four_layers if path is None else graph_loader(path, {"seq": 64})
    cache = PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8))
    seeds = options.pop("seeds", ())
    return cache, search_pipeline(cache, options=PipelineOptions(jobs=jobs, **options), seeds=seeds)


@pytest.mark.parametrize("path, devices, global_batch, sizes", [(None, 16, 32, 2), (LLAMA, 16, 32, 1), (GPT2, 8, 16, 1)])
def test_the_sizes_in_workers_find_the_serial_frontier(path, devices, global_batch, sizes):
    _, serial = _search(path, devices, 1, global_batch=global_batch)
    cache, forked = _search(path, devices, 2, global_batch=global_batch)
    assert len({p.pp for p in serial.points}) >= sizes  # the four-layer GPT: two sizes' points merged
    assert [_point_fields(p) for p in forked.points] == [_point_fields(p) for p in serial.points]
    assert (forked.chosen, forked.message, forked.notes, forked.unsearched_sizes) == (
        serial.chosen, serial.message, serial.notes, serial.unsearched_sizes)
    # each point's graph is this process's cache's graph of its batch, as the serial search's are
    assert all(p.graph is cache.graph(p.micro_batch_samples) for p in forked.points)


def test_past_the_deadline_with_a_seed_that_fits_no_size_starts_in_either():
    # a time-limited search: the limit is spent before the first size and a seed fits, so the serial walk
    # stops at once; the workers must stop alike (the same sizes unsearched, the same note)
    seeds = [(1e-9, 1.0)]
    _, serial = _search(LLAMA, 16, 1, global_batch=32, time_limit_s=1e-9, seeds=list(seeds))
    _, forked = _search(LLAMA, 16, 2, global_batch=32, time_limit_s=1e-9, seeds=list(seeds))
    assert serial.unsearched_sizes and serial.points == ()
    assert (forked.points, forked.unsearched_sizes, forked.notes) == (serial.points, serial.unsearched_sizes, serial.notes)


@pytest.mark.parametrize("error", [InputError, ValueError])
def test_an_error_in_one_size_is_raised_as_the_serial_walk_raises_it(monkeypatch, error):
    # the second size's stage fails: one process and two raise the same exception, with the same words
    least = pipeline_module.least_micro_batch

    def failing(pricing, options, devices, rules):
        if devices == 8:  # pp = 2 of 16 devices
            raise error(f"no micro-batch on {devices} devices")
        return least(pricing, options, devices, rules)

    monkeypatch.setattr(pipeline_module, "least_micro_batch", failing)
    raised = []
    for jobs in (1, 2):
        with pytest.raises(error) as caught:
            _search(None, 16, jobs, global_batch=32)
        raised.append((type(caught.value), str(caught.value)))
    assert raised[0] == raised[1] == (error, "no micro-batch on 8 devices")


def _plan_json(args: list[str], jobs: int) -> dict:
    answer = json.loads(run_cli(["plan", *args, "--json", "-q", "--jobs", str(jobs)]).stdout)
    answer["search"] = {k: v for k, v in answer["search"].items() if k not in WORK_COUNTS}
    return answer


@pytest.mark.parametrize("args", [
    [str(GPT2), "-n", "8", "--dim", "seq=64", "--global-batch", "16", "--time-limit", "100000"],
    [str(LLAMA), "-n", "16", "--dim", "seq=64", "--global-batch", "32", "--target", "megatron", "--time-limit", "100000"],
])
def test_plan_answers_alike_with_one_job_and_two(args):
    # rows, pick, baseline, headroom, notes: the whole --json answer but the clock and the work counts
    serial, forked = _plan_json(args, 1), _plan_json(args, 2)
    assert serial["rows"]
    assert forked == serial


@pytest.mark.parametrize("value", ["0", "-2"])
def test_jobs_below_one_is_refused_in_one_line(value):
    result = run_cli(["plan", str(GPT2), "-n", "8", "--dim", "seq=64", "--jobs", value], expected_exit_code=2)
    assert "--jobs must be at least 1" in error_line(result)


def test_options_refuse_no_job():
    with pytest.raises(InputError, match="--jobs must be at least 1"):
        PipelineOptions(global_batch=8, jobs=0)
