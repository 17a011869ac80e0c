"""The searches the time limit stopped reach the table as one line (:func:`planner.launch_messages.stop_note`),
built from where each real search says it stopped (``PipelineResult.unsearched_sizes``)."""

from __future__ import annotations

from pathlib import Path

from objectives.cluster import make_cluster
from planner.launch_messages import SearchStop, stop_note
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.search.pipeline import PipelineResult, search_pipeline

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"


def _stopped(devices: int) -> PipelineResult:
    """A search whose limit has passed before it starts (it stops at its first point)."""
    loader = graph_loader(GPT2, {"seq": 16})
    options = PipelineOptions(global_batch=16, recompute=("none",), time_limit_s=1e-9)
    return search_pipeline(PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=devices)), options=options)


def _own_note(result: PipelineResult) -> str:
    (note,) = [note for note in result.notes if "stopped at the time limit" in note]
    return note


def test_one_stop_reads_as_the_searchs_own_note():
    result = _stopped(8)
    assert result.unsearched_sizes
    stop = SearchStop("megatron", result.options.time_limit_s, result.unsearched_sizes)
    assert stop_note([stop]) == f"megatron: {_own_note(result)}"


def test_the_stops_of_real_searches_merge_into_one_line():
    eight, four = _stopped(8), _stopped(4)
    stops = [SearchStop("megatron", 1e-9, eight.unsearched_sizes), SearchStop("deepspeed", 1e-9, four.unsearched_sizes),
             SearchStop("megatron", 1e-9, four.unsearched_sizes)]
    merged = stop_note(stops)
    assert merged.startswith("3 searches stopped at their share of the time limit (1e-09 s; megatron 2, deepspeed 1)")
    # every size either search left is named once, largest first, read from the searches' own notes
    left = [int(size) for result in (eight, four)
            for size in _own_note(result).split("pipeline sizes ")[1].split(" were")[0].split(", ")]
    assert f"pipeline sizes {', '.join(map(str, sorted(set(left), reverse=True)))} were not (fully) searched in some" in merged


def test_a_finished_search_left_no_sizes():
    loader = graph_loader(GPT2, {"seq": 16})
    result = search_pipeline(PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=2)),
                             options=PipelineOptions(global_batch=4, recompute=("none",)))
    assert result.unsearched_sizes == () and not any("time limit" in note for note in result.notes)
