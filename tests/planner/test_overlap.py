"""``--no-overlap`` (``TrainingSettings.overlap``): every collective on the critical path, the
launchers' overlap flags off, and the setting kept by a saved plan.

With overlap (the default) the pipeline's synchronisation of an op is the tables' bucketed traffic
exposed beside compute (``tests/planner/test_pipeline.py``); without it, it is exactly that bucketed
traffic, un-hidden, at every ZeRO stage (the tables' ``grad_sync_unhidden_s``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from exporters.deepspeed import export_deepspeed
from exporters.generic import read_plan, write_plan
from exporters.megatron import export_megatron
from objectives.cluster import make_cluster
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.pipeline import PipelineCostCache, graph_loader
from tests.exporters.graphs import cnn_graph, gpt_graph, make_input, spaces_for
from tests.exporters.test_deepspeed import _choice as deepspeed_choice
from tests.exporters.test_megatron import _megatron_choice

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "gpt2_tiny.onnx"


def test_overlap_must_be_a_bool():
    with pytest.raises(InputError, match="overlap must be true or false"):
        TrainingSettings(overlap="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_without_overlap_the_sync_is_the_bucketed_traffic(zero):
    fast = make_cluster("a100-80gb", devices=16, devices_per_node=8)
    # slow links: the tiny model's synchronisation outlasts its backward, so hiding would show
    cluster = dataclasses.replace(
        fast, intra_link=dataclasses.replace(fast.intra_link, bandwidth_bytes_per_s=1e8),
        inter_link=dataclasses.replace(fast.inter_link, bandwidth_bytes_per_s=1e7),
    )
    at_batch = graph_loader(TINY, {"seq": 128})
    priced = {}
    for overlap in (True, False):
        settings = TrainingSettings(engine="fused", attention="flash", overlap=overlap)
        cache = PipelineCostCache(at_batch, cluster=cluster, settings=settings)
        priced[overlap] = (cache.arrays(16, 16, zero, "none"), cache.arrays(16, 16, 0, "none"), cache.model(16, 16, zero, "none"))
    arrays, plain, model = priced[False]
    checked = hidden = 0
    for i, detail in enumerate(model.op_details):
        unhidden = sum(detail.grad_sync_unhidden_s.values(), np.zeros(detail.time_s.shape))
        # the tables built without overlap expose the bucketed traffic as it is
        np.testing.assert_allclose(sum(detail.grad_sync_s.values(), np.zeros(detail.time_s.shape)), unhidden, rtol=1e-12)
        optimizer = plain.model.op_details[i].optimizer_s
        per_step = arrays.step_s[i] - (optimizer if optimizer is not None else 0.0)
        ours = (arrays.forward_s[i] - plain.forward_s[i]) + (arrays.backward_s[i] - plain.backward_s[i]) + per_step
        np.testing.assert_allclose(ours, unhidden, rtol=1e-9, atol=1e-15)
        checked += bool(np.any(unhidden > 0))
        overlapped = priced[True][0]
        hidden += bool(np.any(overlapped.step_s[i] + overlapped.forward_s[i] + overlapped.backward_s[i]
                              < arrays.step_s[i] + arrays.forward_s[i] + arrays.backward_s[i] - 1e-12))
    assert checked > 0 and hidden > 0  # the overlap knob moves some op


def test_megatron_flags_follow_the_setting():
    g = gpt_graph()
    spaces = spaces_for(g, 8)
    for zero, overlapped in ((0, ["--overlap-grad-reduce"]), (1, ["--overlap-grad-reduce", "--overlap-param-gather"])):
        for overlap in (True, False):
            settings = TrainingSettings(zero_stage=zero, overlap=overlap)
            args = export_megatron(make_input(g, spaces, _megatron_choice(g, spaces, 4, 2), settings=settings))["args"]
            assert [a for a in args if a.startswith("--overlap")] == (overlapped if overlap else [])


def test_deepspeed_overlap_comm_follows_the_setting():
    g = cnn_graph()
    spaces = spaces_for(g, 4)
    for overlap in (True, False):
        settings = TrainingSettings(zero_stage=2, overlap=overlap)
        config = export_deepspeed(make_input(g, spaces, deepspeed_choice(g, spaces, 4, 1), settings=settings))["ds_config"]
        assert config["zero_optimization"]["overlap_comm"] is overlap


def test_a_saved_plan_keeps_the_setting(tmp_path):
    import json

    g = cnn_graph()
    spaces = spaces_for(g, 4)
    for overlap in (True, False):
        settings = TrainingSettings(zero_stage=1, overlap=overlap, engine="fused", attention="flash")
        document = write_plan(make_input(g, spaces, deepspeed_choice(g, spaces, 4, 1), settings=settings))
        assert ("overlap" in document["training"]) is (not overlap)  # absent: overlapped (older plans read alike)
        path = tmp_path / f"plan_{overlap}.json"
        path.write_text(json.dumps(document))
        assert read_plan(path).settings().overlap is overlap
