"""Tests of the exporters package entry points: EXPORTERS, export(), runnable_targets(), target_masks()."""

from __future__ import annotations

import numpy as np
import pytest

from exporters import EXPORTERS, export, runnable_targets, target_masks
from exporters.megatron import megatron_masks
from planner.core.errors import InputError
from exporters.deepspeed.zero_sync import zero_sync as deepspeed_zero_sync
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import cnn_graph, first_rows, gpt_graph, llama_graph, make_input, spaces_for


def test_registry_names():
    assert list(EXPORTERS) == ["generic", "megatron", "deepspeed", "meshtf", "dtensor", "torchtitan"]


def test_unknown_target_lists_the_valid_ones():
    g = cnn_graph()
    spaces = spaces_for(g, 1)
    with pytest.raises(InputError, match="unknown export target 'nanotron'; use one of generic, megatron, deepspeed, meshtf"):
        export("nanotron", make_input(g, spaces, [0] * len(g.ops)))


DEEPSPEED_ZERO0 = deepspeed_zero_sync(zero_stage=0, precision="bf16-mixed")


@pytest.mark.parametrize(
    ("graph", "dp", "tp", "settings", "expected"),
    [
        (llama_graph(), 2, 2, TrainingSettings(), ("generic", "megatron", "meshtf", "dtensor", "torchtitan")),  # vocab-parallel: not AutoTP
        (llama_graph(), 2, 2, TrainingSettings(zero_stage=1), ("generic", "megatron")),  # no ZeRO in Mesh-TF
        # pure DP at ZeRO-0, priced with the all-reduce beside the backward: DeepSpeed runs it after the backward
        # (exporters/deepspeed/zero_sync.py), so the plan is not its row; priced under its rule, it is only its own
        (gpt_graph(), 4, 1, TrainingSettings(), ("generic", "megatron", "meshtf", "dtensor")),
        (gpt_graph(), 4, 1, TrainingSettings(zero_sync=DEEPSPEED_ZERO0), ("generic", "deepspeed")),
        (cnn_graph(), 4, 1, TrainingSettings(), ("generic", "meshtf", "dtensor")),  # not a transformer
        (cnn_graph(), 4, 1, TrainingSettings(zero_sync=DEEPSPEED_ZERO0), ("generic", "deepspeed")),
    ],
)
def test_runnable_targets(graph, dp, tp, settings, expected):
    spaces = spaces_for(graph, dp * tp)
    if graph.name == "cnn":
        choice = [s.index_of({d.name: dp for d in op.dims if d.is_batch}) for op, s in zip(graph.ops, spaces)]
    else:
        choice = first_rows(megatron_masks(graph, spaces, dp=dp, tp=tp))
    assert runnable_targets(make_input(graph, spaces, choice, settings=settings)) == expected


def test_target_masks_families():
    g = gpt_graph()
    spaces = spaces_for(g, 4)
    megatron = dict(target_masks("megatron", g, spaces, devices=4))
    assert set(megatron) == {"dp=1 x tp=1", "dp=2 x tp=1", "dp=4 x tp=1", "dp=1 x tp=2", "dp=1 x tp=2 sp", "dp=2 x tp=2", "dp=2 x tp=2 sp", "dp=1 x tp=4", "dp=1 x tp=4 sp"}
    for masks in megatron.values():
        assert len(masks) == len(g.ops) and all(isinstance(m, np.ndarray) and m.any() for m in masks)
    deepspeed = dict(target_masks("deepspeed", g, spaces, devices=4))
    assert set(deepspeed) == {"dp=1 x tp=1", "dp=2 x tp=1", "dp=4 x tp=1"}  # GPT-2's Conv1D: no AutoTP
    meshtf = dict(target_masks("meshtf", cnn_graph(), spaces_for(cnn_graph(), 4), devices=4))
    assert set(meshtf) == {"b:1", "b:2 batch:b", "b:4 batch:b"}
    with pytest.raises(InputError, match="no configuration families"):
        target_masks("generic", g, spaces, devices=4)


def _pipeline_input(graph, layers, settings=None, schedule="1f1b"):
    """Every stage on one device (ops replicated): a pure pipeline of ``layers``."""
    from tests.exporters.graphs import make_cluster, pipeline_spec

    settings = settings or TrainingSettings()
    spaces = spaces_for(graph, 1)
    spec = pipeline_spec(graph, layers, devices_per_stage=1, micro_batch=8, micro_batches=4, schedule=schedule, settings=settings)
    return make_input(graph, spaces, [0] * len(graph.ops), cluster=make_cluster(1, 8), settings=settings,
                      global_batch=spec.global_batch, pipeline=spec)


@pytest.mark.parametrize(
    ("settings", "schedule", "expected"),
    [
        # DeepSpeed's PipelineEngine keeps BF16_Optimizer's bf16 gradient accumulator at ZeRO-0 (2 B per
        # parameter) and the export asks for its fp32 one at ZeRO-1 (4 B): it runs a plan priced with it
        (TrainingSettings(grad_accumulator_bytes=2.0), "1f1b", ("generic", "megatron", "deepspeed")),
        (TrainingSettings(zero_stage=1, grad_accumulator_bytes=4.0), "1f1b", ("generic", "megatron", "deepspeed")),
        (TrainingSettings(), "1f1b", ("generic", "megatron")),  # priced without it: not DeepSpeed's
        (TrainingSettings(zero_stage=1, grad_accumulator_bytes=2.0), "1f1b", ("generic", "megatron")),
        (TrainingSettings(zero_stage=2), "1f1b", ("generic",)),  # Megatron-FSDP and PipelineEngine: no pipelines
        (TrainingSettings(), "gpipe", ("generic",)),  # neither framework has a GPipe schedule
    ],
)
def test_runnable_targets_of_pipelines(settings, schedule, expected):
    assert runnable_targets(_pipeline_input(gpt_graph(layers=4), [2, 2], settings, schedule)) == expected


@pytest.mark.parametrize(
    ("target", "message"),
    [("meshtf", "Mesh-TensorFlow has no pipeline parallelism"), ("dtensor", "builds no pipeline stages")],
)
def test_targets_without_pipelines_refuse(target, message):
    from planner.core.errors import UnsupportedExport

    with pytest.raises(UnsupportedExport, match=message):
        export(target, _pipeline_input(gpt_graph(layers=4), [2, 2]))
