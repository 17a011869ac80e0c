"""The TARGETS registry (issue 17): runnability by mask membership equals the exporters' own answer.

The oracle is each framework exporter run on the strategy (``runnable_targets``); the registry
answers from the families it built once per configuration space. Choices are drawn inside each
family (first rows and random rows), mixed across families, and fully random, under settings that
each exporter refuses for its own reasons (ZeRO stages, selective recomputation, expert
parallelism, nodes that torchrun cannot fill).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters import EXPORTERS, TARGETS, runnable_targets, target_masks
from exporters.targets import FRAMEWORK_TARGETS, runnable_targets_of, target, target_names
from importers import import_model
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import cnn_graph, first_rows, gpt_graph, llama_graph, make_cluster, make_input, spaces_for

DATA = Path(__file__).resolve().parents[1] / "data"


def _choices(graph, spaces, devices, devices_per_node, rng, random_rows=3):
    """First and random rows of every family of every framework target, some mixed, some random."""
    found = []
    families = [
        masks
        for name in FRAMEWORK_TARGETS
        for _label, masks in target_masks(name, graph, spaces, devices=devices, devices_per_node=devices_per_node)
    ]
    for masks in families:
        found.append(first_rows(masks))
        for _ in range(random_rows):
            found.append(tuple(int(rng.choice(np.flatnonzero(m))) for m in masks))
    for a, b in zip(found[::2], found[1::2]):  # half of one family's choice, half of another's
        half = len(a) // 2
        found.append(a[:half] + b[half:])
    for _ in range(5):
        found.append(tuple(int(rng.integers(s.size)) for s in spaces))
    return list(dict.fromkeys(found))


SETTINGS = [
    TrainingSettings(),
    TrainingSettings(zero_stage=1),
    TrainingSettings(zero_stage=3),
    TrainingSettings(recompute="selective"),
    TrainingSettings(zero_stage=3, recompute="op"),  # torchtitan's op-level policy: torchtitan alone
    TrainingSettings(zero_stage=1, offload="optimizer"),  # Megatron's CPU optimizer and DeepSpeed's ZeRO-Offload
    TrainingSettings(zero_stage=0, offload="optimizer"),  # ZeRO-Offload needs ZeRO 1-3, Megatron's the distributed optimizer
    TrainingSettings(offload="activations"),  # Megatron-LM alone
]


@pytest.mark.parametrize(
    ("graph", "devices", "per_node"),
    [
        (gpt_graph(), 4, 8),
        (gpt_graph(), 8, 4),
        (llama_graph(), 8, 8),
        (llama_graph(), 12, 4),  # dp x tp = 6 on nodes of 4: torchrun cannot fill them
        (cnn_graph(), 4, 8),
        (llama_graph(seq=4096, batch=4), 8, 8),  # 4,096 tokens: Megatron's and torchtitan's cp = 2 and 4 families
        # DLRM with nn.Embedding tables: DTensor's rowwise / colwise table families (issue 25)
        (import_model(DATA / "dlrm_embedding" / "dlrm_emb_bare.onnx", {"batch": 16}), 4, 8),
    ],
    ids=["gpt-4", "gpt-8-nodes-of-4", "llama-8", "llama-12-nodes-of-4", "cnn-4", "llama-8-long", "dlrm-tables-4"],
)
def test_mask_membership_equals_the_exporters(graph, devices, per_node):
    spaces = spaces_for(graph, devices, per_node)
    cluster = make_cluster(max(1, devices // per_node), min(devices, per_node))
    rng = np.random.default_rng(17)
    choices = _choices(graph, spaces, devices, per_node, rng)
    assert len(choices) > 5
    checked = 0
    for settings in SETTINGS:
        column = runnable_targets_of(graph, spaces, cluster, settings, choices)
        for choice, names in zip(choices, column):
            expected = runnable_targets(make_input(graph, spaces, choice, cluster=cluster, settings=settings))
            assert names == expected, (settings, choice)
            checked += len(names) > 1
    assert checked > 0  # some choices are runnable by a framework: the test compares both answers


def test_mask_membership_equals_the_exporters_on_moe():
    from planner.plan import PlanRequest, build_model, load_graph

    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 8, "seq": 32})
    cluster = make_cluster(1, 4)
    rng = np.random.default_rng(5)
    for ep in (1, 2, 4):
        settings = TrainingSettings(expert_parallel=ep)
        spaces = build_model(graph, PlanRequest(cluster=cluster, settings=settings)).tables.configs
        choices = _choices(graph, spaces, 4, 4, rng, random_rows=1)
        column = runnable_targets_of(graph, spaces, cluster, settings, choices)
        for choice, names in zip(choices, column):
            expected = runnable_targets(make_input(graph, spaces, choice, cluster=cluster, settings=settings))
            assert names == expected, (ep, choice)


def test_registry_is_the_one_list():
    assert list(TARGETS) == ["generic", "megatron", "deepspeed", "meshtf", "dtensor", "torchtitan"]
    assert FRAMEWORK_TARGETS == ("megatron", "deepspeed", "meshtf", "dtensor", "torchtitan")
    assert dict(EXPORTERS) == {name: t.export for name, t in TARGETS.items()}
    assert target_names() == "generic, megatron, deepspeed, meshtf, dtensor or torchtitan"
    with pytest.raises(
        InputError, match=r"^unknown --export 'nanotron'; use generic, megatron, deepspeed, meshtf, dtensor, torchtitan or onnx$"
    ):
        target("nanotron", flag="--export")


def test_generic_runs_everything_and_has_no_families():
    graph = cnn_graph()
    spaces = spaces_for(graph, 4)
    runnable = TARGETS["generic"].runnable(graph, spaces, make_cluster(1, 4), TrainingSettings())
    assert tuple(s.size - 1 for s in spaces) in runnable
    with pytest.raises(InputError, match="runs every strategy"):
        TARGETS["generic"].pipeline_families(graph, spaces, devices=4, devices_per_node=4, pp=1)


@pytest.mark.parametrize(
    ("name", "pp", "tps"),
    [
        ("megatron", 1, {1, 2, 4}),  # every dp x tp with dp x tp dividing 4
        ("megatron", 2, {1, 2, 4}),  # all 4 stage devices: dp=4 x tp=1, dp=2 x tp=2, dp=1 x tp=4
        ("deepspeed", 2, {1}),  # its pipelines run tp = 1 only
        ("meshtf", 2, set()),  # no pipelines
        ("dtensor", 2, set()),
        ("torchtitan", 2, set()),  # GPT-2 (LayerNorm, GELU, learned positions) is no llama3 model
    ],
)
def test_pipeline_families(name, pp, tps):
    graph = gpt_graph()
    spaces = spaces_for(graph, 4)
    found = TARGETS[name].pipeline_families(graph, spaces, devices=4, devices_per_node=4, pp=pp)
    assert {f.tp for f in found} == tps
    if pp > 1:
        # every stage uses all its devices: dp x tp = 4
        assert all(f.dp * f.tp == 4 for f in found)


def test_mask_membership_equals_the_exporters_without_a_batch_dim():
    # Imported at batch 1 the importer drops the batch dim: every op may be replicated over 8
    # devices, which only dp = 1 runs (the exporters read dp off the batch split; found on T5).
    from planner.plan import PlanRequest, build_model, load_graph

    graph = load_graph(DATA / "t5_tiny.onnx", {"batch": 1, "seq": 32, "tgt_seq": 16})
    assert not any(d.is_batch for op in graph.ops for d in op.dims)
    cluster = make_cluster(1, 8)
    spaces = build_model(graph, PlanRequest(cluster=cluster)).tables.configs  # the launchers' configurations
    choices = _choices(graph, spaces, 8, 8, np.random.default_rng(3))
    column = runnable_targets_of(graph, spaces, cluster, TrainingSettings(), choices)
    for choice, names in zip(choices, column):
        assert names == runnable_targets(make_input(graph, spaces, choice, cluster=cluster)), choice


# --------------------------------------------------------------------------------------------
# pipeline plans: runnable_plan_targets (the --global-batch table's column) against the exporters


def _pipeline_inputs(model: str, dims: dict, devices: int, per_node: int, options, rng, target=None) -> list:
    """Every point of a pipeline search as exporter input, each with random choices from the
    families of every framework target on its stage, and its pipeline changed (model chunks,
    a micro-batch the split does not give, the GPipe schedule)."""
    import dataclasses

    from planner.pipeline import graph_loader, pipeline_search, point_plan_input

    cluster = make_cluster(max(1, devices // per_node), min(devices, per_node))
    result = pipeline_search(graph_loader(DATA / model, dims), cluster=cluster, options=options, target=target)
    assert result.points
    inputs = []
    for point in result.points:
        base = point_plan_input(point, result.cache)
        inputs.append(base)
        for name in FRAMEWORK_TARGETS:
            families = TARGETS[name].pipeline_families(
                base.graph, base.spaces, devices=point.devices_per_stage, devices_per_node=cluster.devices_per_node,
                pp=point.pp,
            )
            for family in families[:4]:
                choice = tuple(int(rng.choice(np.flatnonzero(m))) for m in family.masks)
                moved = dataclasses.replace(base, strategy=dataclasses.replace(base.strategy, choice=choice))
                inputs.append(moved)
                if point.pp == 1:
                    # the same plan without a pipeline section, at other global batches
                    for steps in (1, 3):
                        inputs.append(dataclasses.replace(moved, pipeline=None, global_batch=base.samples_per_pass * steps))
                    # a pass that says it holds fewer samples: the exporters split those over dp
                    inputs.append(dataclasses.replace(moved, pipeline=None, micro_batch=max(1, base.samples_per_pass // 4)))
                    continue
                spec = base.pipeline
                for change in ({"schedule": "interleaved", "chunks": 2}, {"schedule": "interleaved", "chunks": 3},
                               {"micro_batch": spec.micro_batch * 2}, {"schedule": "gpipe", "chunks": 1}):
                    inputs.append(dataclasses.replace(moved, pipeline=dataclasses.replace(spec, **change)))
                for micro_batches in (1, point.pp + 1, 2 * point.pp):  # interleaving needs groups of pp
                    samples = base.samples_per_pass * micro_batches
                    interleaved = dataclasses.replace(spec, schedule="interleaved", chunks=2, micro_batches=micro_batches,
                                                      global_batch=samples)
                    inputs.append(dataclasses.replace(moved, pipeline=interleaved, global_batch=samples))
    return inputs


def _same_input(value, depth: int = 1):
    """A key equal for two exporter inputs built from the same objects with the same values: a field's
    value where it hashes, else the object's identity; a dataclass field (the strategy, the pipeline,
    the settings) one level down, as ``dataclasses.replace`` shares its unchanged fields."""
    import dataclasses

    if depth and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value),) + tuple(_same_input(getattr(value, f.name), depth - 1) for f in dataclasses.fields(value))
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


def _exporters_answers(inputs: list) -> list:
    """The oracle, :func:`runnable_targets` (every framework exporter run on the input), per input; an
    input equal to an earlier one in every field (``_pipeline_inputs``' random family rows repeat: about
    half of llama-16-megatron's 2,529 inputs) gets that input's answer, the exporters being pure functions
    of their input."""
    answers: dict = {}
    keys = [_same_input(plan_input, depth=2) for plan_input in inputs]
    for key, plan_input in zip(keys, inputs):
        if key not in answers:
            answers[key] = runnable_targets(plan_input)
    return [answers[key] for key in keys]


@pytest.mark.parametrize(
    ("model", "dims", "devices", "per_node", "options", "target", "pipelines_run"),
    [
        # pp = 2 asked for on gpt2-8 and llama-16: on these tiny models a pipeline neighbour's NCCL buffers (~308 MB,
        # objectives.nccl_memory) leave every pp > 1 point off the free frontier, and the last check needs them
        ("gpt2_tiny.onnx", {"seq": 32}, 8, 8, {"global_batch": 16, "pipeline_sizes": (2,)}, None, True),
        ("../../examples/gpt2.onnx", {"seq": 32}, 16, 4,
         {"global_batch": 64, "pipeline_sizes": (2, 4), "schedule": "interleaved", "chunks": 2}, "megatron", True),
        ("llama_tiny.onnx", {"seq": 32}, 16, 8, {"global_batch": 32, "pipeline_sizes": (2,)}, "megatron", True),
        ("mixtral_tiny.onnx", {"seq": 32}, 8, 4, {"global_batch": 32, "schedule": "gpipe"}, None, False),
        ("t5_tiny.onnx", {"seq": 32, "tgt_seq": 16}, 8, 8, {"global_batch": 16}, "deepspeed", False),
    ],
    ids=["gpt2-8", "gpt2-12-layers-16-interleaved", "llama-16-megatron", "mixtral-8-gpipe", "t5-8-deepspeed"],
)
def test_pipeline_targets_equal_the_exporters(model, dims, devices, per_node, options, target, pipelines_run):
    from exporters.targets import runnable_plan_targets
    from planner.pipeline import PipelineOptions

    inputs = _pipeline_inputs(model, dims, devices, per_node, PipelineOptions(**options), np.random.default_rng(1), target)
    column = runnable_plan_targets(inputs)
    expected = _exporters_answers(inputs)
    assert column == expected
    assert any(len(names) > 1 for names in column)  # both answers say some framework runs some point
    if pipelines_run:  # and, with pp > 1, that Megatron-LM runs some inputs and refuses others
        pipelined = {"megatron" in names for names, i in zip(column, inputs) if i.pipeline is not None and i.pipeline.pp > 1}
        assert pipelined == {True, False}


def test_pipeline_targets_run_no_exporter(monkeypatch):
    import dataclasses

    from planner.pipeline import PipelineOptions, graph_loader, pipeline_search, pipeline_targets

    def refuse(plan_input):
        raise AssertionError("an exporter ran")

    for name, entry in list(TARGETS.items()):
        monkeypatch.setitem(TARGETS, name, dataclasses.replace(entry, export=refuse))  # type: ignore[index]
    result = pipeline_search(graph_loader(DATA / "gpt2_tiny.onnx", {"seq": 32}), cluster=make_cluster(1, 8),
                             options=PipelineOptions(global_batch=16))
    column = pipeline_targets(result)
    assert len(column) == len(result.points) and all(names[0] == "generic" for names in column)
