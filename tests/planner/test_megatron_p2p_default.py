"""Megatron-LM's interleaved rows priced as it launches them (issue 23, h30b): its ``--no-overlap-p2p-communication`` is
``store_false`` on ``overlap_p2p_comm`` and ``validate_args`` keeps the overlap only with virtual pipeline stages
(``megatron/training/arguments.py``), so a plan with model chunks runs its steady-state transfers beside the other
direction's chunk pass unless the export says otherwise (``Target.p2p_overlap``, ``Target.priced_p2p_overlap``).

Oracles: the overlapped makespan worked here from the waited estimate's own stage times and transfer (the rule's
arithmetic done by hand, not by ``objectives.schedules``); Megatron-LM's own rule that virtual stages without the
overlap need ``pp > 2`` (its ``validate_args``, the validator's message); the saved plan re-priced from its file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters import export
from exporters.generic import plan_from_dict, write_plan
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.degrees import parse_fix
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.pipeline import PipelineOptions, graph_loader, pipeline_plan_input, pipeline_search, pipeline_targets
from tests.objectives.graphs import gpt2_like

GPT2 = Path(__file__).resolve().parents[2] / "examples" / "gpt2.onnx"
FUSED = TrainingSettings(engine="fused", attention="flash")


def _tiny_estimate(**kwargs):
    """A 4-layer GPT on pp 2 x v 2 (one layer a chunk), tp 2 on 8 A100s, 4 micro-batches: one stage boundary."""
    graph = gpt2_like(layers=4, hidden=32, heads=4, vocab=100, positions=16, batch=2, seq=16)
    e = estimate(graph, cluster=make_cluster("a100-80gb", devices=8), tp=2, pp=2, micro_batch=1, global_batch=8, **kwargs)
    assert e.valid, e.reason
    return e.point


def test_megatron_prices_its_interleaved_row_overlapped_by_hand():
    waited = _tiny_estimate(schedule="interleaved", chunks=2, target="megatron", settings=TrainingSettings(p2p_overlap=False))
    default = _tiny_estimate(schedule="interleaved", chunks=2, target="megatron")
    m, v = 4, 2
    f = max(s.forward_s for s in waited.stages)
    b = max(s.backward_s for s in waited.stages)
    c = waited.time.p2p_s
    assert c > 0
    # steady state: waited, each chunk's two transfers 2v(m-1)c; overlapped, what each takes beyond the chunk pass
    # of the other direction it hides under, v(m-1)[(c - b/v)^+ + (c - f/v)^+]; warm-up and flush stay waited
    hidden = v * (m - 1) * (max(c - b / v, 0.0) + max(c - f / v, 0.0))
    assert default.time.pipeline_s == pytest.approx(waited.time.pipeline_s - 2 * v * (m - 1) * c + hidden, rel=1e-12)
    assert default.time.pipeline_s < waited.time.pipeline_s


def test_a_plan_without_chunks_prices_as_before():
    plain = _tiny_estimate(schedule="1f1b")
    megatron = _tiny_estimate(schedule="1f1b", target="megatron")
    assert megatron.time_s == plain.time_s and megatron.memory_bytes == plain.memory_bytes
    settings = TrainingSettings()
    assert TARGETS["megatron"].priced_settings(settings, pp=2, chunks=1) is settings  # nothing resolved, no new cache
    # the launchers that do not overlap keep the transfers waited, and run no plan priced overlapped
    assert TARGETS["torchtitan"].priced_settings(settings, pp=2, chunks=2).p2p_overlap is None
    assert not TARGETS["torchtitan"].runs_p2p(TrainingSettings(p2p_overlap=True), chunks=2)


def _search(settings: TrainingSettings, pp: int, chunks: int):
    options = PipelineOptions(global_batch=16, schedule="interleaved", chunks=chunks, pipeline_sizes=(pp,),
                              zero_stages=(1,), recompute=("none",), time_limit_s=120)
    result = pipeline_search(graph_loader(GPT2, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=8),
                             options=options, settings=settings, target="megatron")
    assert result.points
    return result


def test_the_search_lists_megatron_rows_overlapped_and_exports_no_flag(tmp_path):
    result = _search(FUSED, pp=2, chunks=2)
    assert result.cache.settings.p2p_overlap is True
    assert all("megatron" in names for names in pipeline_targets(result))
    plan_input = pipeline_plan_input(result, 0)
    assert "--no-overlap-p2p-communication" not in export("megatron", plan_input)["args"]
    # the saved plan keeps the knob and prices the same seconds again from its file
    document = json.loads(json.dumps(write_plan(plan_input)))
    assert document["training"]["p2p_overlap"] is True
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(document))
    from planner.repriced import reprice_saved

    assert plan_from_dict(document).settings().p2p_overlap is True
    assert reprice_saved(saved, model=GPT2).point.time_s == result.points[0].time_s


def test_turned_off_megatron_waits_and_says_so():
    # pp = 2: Megatron-LM's validate_args refuses virtual stages without the overlap; no row is its own
    refused = _search(TrainingSettings(engine="fused", attention="flash", p2p_overlap=False), pp=2, chunks=2)
    assert not any("megatron" in names for names in pipeline_targets(refused))
    # pp = 4: it runs them waited, as priced, and the export writes the flag that waits them
    waited = _search(TrainingSettings(engine="fused", attention="flash", p2p_overlap=False), pp=4, chunks=3)
    assert "megatron" in pipeline_targets(waited)[0]
    args = export("megatron", pipeline_plan_input(waited, 0))["args"]
    assert "--no-overlap-p2p-communication" in args
    overlapped = _search(FUSED, pp=4, chunks=3)
    assert overlapped.points[0].time_s < waited.points[0].time_s


def test_the_pin():
    assert parse_fix("p2p_overlap=off").p2p_overlap == "off"
    with pytest.raises(InputError, match="--fix p2p_overlap must be on or off"):
        parse_fix("p2p_overlap=maybe")
