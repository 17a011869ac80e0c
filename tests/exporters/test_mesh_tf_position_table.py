"""Mesh-TF lists no plan past a learned position table, and its rule against expert parallelism stays.

GPT-2 (tests/data/gpt2_tiny.onnx) holds a 128-row ``wpe`` table (read from the initializer). At
``seq=128`` Mesh-TF runs its plans; at ``seq=256`` the ONNX model cannot look its positions up and
Mesh-TensorFlow's ``Unitransformer`` would learn a 256-row ``max_length`` table (tensorflow/mesh
``mesh_tensorflow/transformer/transformer.py``), so, as DeepSpeed and DTensor, its rules list no plan
and its export refuses in one line. ``planner plan`` on 2 devices: before this change Mesh-TF was the
one launcher listed at ``seq=256``; now none is.

``exporters.mesh_tf.rules.allows`` and ``exporters.dtensor.rules.allows`` refuse ``ep > 1`` although
``Target.expert_parallel`` says the same: ``Target.runs_settings`` reads the latter, but ``--target``'s
filter (:func:`planner.plan_targets.target_filter`) reads ``allows`` alone, so without theirs a
``--target meshtf`` search at ``ep = 2`` would list plans the exporter refuses.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from exporters import export
from exporters.targets import TARGETS, runnable_plan_targets
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan_targets import target_filter
from planner.pricing import load_graph
from tests.exporters.graphs import make_cluster, make_input, spaces_for
from tests.exporters.test_refusal_suffix import GPT2, wpe_rows
from tests.planner.cli_helpers import run_cli

ROWS = wpe_rows(GPT2)  # 128


def _dp_plan(seq: int, settings: TrainingSettings | None = None):
    """Data parallelism over 2 devices (the batch split 2 ways) of GPT-2 at ``seq`` tokens."""
    graph = load_graph(GPT2, {"batch": 4, "seq": seq})
    spaces = spaces_for(graph, 2)
    choice = [space.index_of({batch[0].name: 2}) if (batch := [d for d in op.dims if d.is_batch]) else 0
              for op, space in zip(graph.ops, spaces)]
    return make_input(graph, spaces, choice, settings=settings)


def test_the_table_is_gpt2_tiny_s_128_rows():
    assert ROWS == 128


@pytest.mark.parametrize("seq, listed", [(ROWS, True), (2 * ROWS, False)])
def test_mesh_tf_families_rule_and_listing(seq, listed):
    plan = _dp_plan(seq)
    meshtf = TARGETS["meshtf"]
    families = meshtf.families(plan.graph, plan.spaces, devices=2, devices_per_node=2, pp=1)
    assert bool(families) is listed
    runs = meshtf.rule(plan.graph, plan.spaces, plan.cluster, plan.settings)
    assert runs(plan.strategy.choice) is listed
    assert ("meshtf" in runnable_plan_targets([plan])[0]) is listed


def test_mesh_tf_export_refuses_past_the_table_in_one_line():
    plan = _dp_plan(2 * ROWS)
    with pytest.raises(UnsupportedExport) as caught:
        export("meshtf", plan)
    assert caught.value.reason == (
        "Mesh-TensorFlow would train a different model: its learned position table has 128 rows and the sequence is "
        "256 tokens, so the model cannot run that long (its position lookup reads past the table), and "
        "Mesh-TensorFlow's Unitransformer would learn a 256-row table (max_length); plan with --dim seq=128 or less, "
        "or re-export the model with a longer table; export as the generic plan"
    )
    assert export("meshtf", _dp_plan(ROWS))["mesh_shape"] == "b:2"  # at the table's length: batch over 2


@pytest.mark.slow
def test_planner_plan_lists_no_launcher_past_the_table(tmp_path):
    args = ["plan", str(GPT2), "--devices", "2", "--dim", "batch=4", "--json"]
    fits = json.loads(run_cli(args + ["--dim", f"seq={ROWS}"]).stdout)
    assert "meshtf" in fits["launchers"]
    past = run_cli(args + ["--dim", f"seq={2 * ROWS}"], expected_exit_code=2)
    document = json.loads(past.stdout)
    assert document["launchers"] == [] and document["rows"] == []  # Mesh-TF's rows were the only ones
    assert set(document["refused"]) == {"megatron", "deepspeed", "meshtf", "dtensor", "torchtitan"}
    assert all(reason.endswith(("; export as the generic plan", "a longer table")) for reason in document["refused"].values())


@pytest.mark.parametrize("name", ["meshtf", "dtensor"])
def test_expert_parallelism_is_refused_by_the_rule_the_target_filter_reads(name):
    plan = _dp_plan(ROWS)
    cluster = make_cluster(1, 2)
    dense = target_filter(name)(plan.graph, plan.spaces, cluster, TrainingSettings())
    assert dense  # at ep = 1 it runs data parallelism on 2 devices
    experts = TrainingSettings(expert_parallel=2)
    assert target_filter(name)(plan.graph, plan.spaces, cluster, experts) == []
    assert TARGETS[name].expert_parallel is False  # Target.runs_settings says the same, on its paths
    assert not TARGETS[name].runs_settings(experts)
    assert name not in runnable_plan_targets([dataclasses.replace(plan, settings=experts)])[0]
