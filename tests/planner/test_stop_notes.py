"""The searches' "stopped at the time limit" notes reach the table as one line
(:func:`planner.launch_messages.merged_stop_notes`), read from the note a real search writes."""

from __future__ import annotations

from pathlib import Path

from objectives.cluster import make_cluster
from planner.launch_messages import merged_stop_notes
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.search.pipeline import search_pipeline

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"


def _stopped_note(devices: int) -> str:
    """The note of a search whose limit has passed before it starts (it stops at its first point)."""
    loader = graph_loader(GPT2, {"seq": 16})
    options = PipelineOptions(global_batch=16, recompute=("none",), time_limit_s=1e-9)
    result = search_pipeline(PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=devices)),
                             options=options)
    (note,) = [note for note in result.notes if "stopped at the time limit" in note]
    return note


def test_the_notes_of_real_searches_merge_into_one_line():
    eight, four = _stopped_note(8), _stopped_note(4)
    notes = [f"megatron: {eight}", "deepspeed: 3 per-stage intra-op searches were over the search budget",
             f"deepspeed: {four}", f"megatron: {four}"]
    merged = merged_stop_notes(notes)
    assert merged[1] == notes[1] and len(merged) == 2
    assert merged[0].startswith("3 searches stopped at their share of the time limit (1e-09 s; megatron 2, deepspeed 1)")
    # every size either search left is named once, largest first (8 devices: up to pp = 8; 4: up to 4)
    left_eight = eight.split("pipeline sizes ")[1].split(" were")[0].split(", ")
    left_four = four.split("pipeline sizes ")[1].split(" were")[0].split(", ")
    union = sorted({int(s) for s in left_eight + left_four}, reverse=True)
    assert f"pipeline sizes {', '.join(map(str, union))} were not (fully) searched in some" in merged[0]


def test_one_stop_is_left_as_it_is():
    notes = [f"megatron: {_stopped_note(8)}", "other"]
    assert merged_stop_notes(notes) == notes
