"""Every export of a plan that micro-batches a contrastive loss says so (issue 25, task H2, item 3).

CLIP's batch x batch similarity couples the samples: ``m`` micro-batches of a ``B``-sample step
contrast each sample with ``B / m - 1`` others, not ``B - 1``. The table said so in a note; the
DeepSpeed and DTensor exports (and every other) did not. Each export now carries the note
(:mod:`exporters.coupling`): a launcher's among its ``notes``, the generic plan as ``batch.coupling``.
The figures are counted by hand from the plan's batch: 16 samples per pass over 2 data-parallel
ranks (8 each), 2 passes per 32-sample step.
"""

from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest

from exporters import export
from exporters.targets import TARGETS as REGISTRY
from exporters.generic import plan_from_dict
from planner.core.errors import UnsupportedExport
from planner.pricing import load_graph
from tests.exporters.graphs import make_input, spaces_for

CLIP = Path(__file__).resolve().parents[2] / "tests" / "data" / "sweep_cases" / "clip_dynamo_bare.onnx"
GPT2 = Path(__file__).resolve().parents[2] / "tests" / "data" / "gpt2_tiny.onnx"
TARGETS = ("generic", "megatron", "deepspeed", "meshtf", "dtensor", "torchtitan")


def _data_parallel(graph, devices: int, **batch):
    spaces = spaces_for(graph, devices)
    choice = [space.index_of({dims[0].name: devices}) if (dims := [d for d in op.dims if d.is_batch]) and devices > 1
              else 0 for op, space in zip(graph.ops, spaces)]
    return make_input(graph, spaces, choice, **batch)


def _priced_for(name: str, plan):
    """``plan`` as ``name``'s own search prices it: under its ZeRO 0-2 synchronisation rule, if it has one (DeepSpeed
    all-reduces ZeRO-0's gradients after the backward and refuses a plan priced otherwise)."""
    return dataclasses.replace(plan, settings=REGISTRY[name].priced_settings(plan.settings))


def _notes(plan) -> dict[str, list[str]]:
    """Per target that exports ``plan``, its notes (the generic plan's ``batch.coupling`` as one)."""
    found = {}
    for name in TARGETS:
        try:
            document = export(name, _priced_for(name, plan))
        except UnsupportedExport:
            continue
        found[name] = [document["batch"]["coupling"]] if name == "generic" and "coupling" in document["batch"] else \
            [n for n in document.get("notes", []) if n.startswith("batch-coupled: ")]
    return found


@pytest.fixture(scope="module")
def clip():
    graph = load_graph(CLIP, {"batch": 16, "seq": 8})
    assert [c.kind for c in graph.batch_coupled] == ["similarity"]  # the importer's reading: one contrastive loss
    return graph


def test_every_export_of_a_micro_batched_plan_carries_the_note(clip):
    plan = _data_parallel(clip, 2, micro_batch=16, global_batch=32)
    assert plan.grad_accum == 2
    notes = _notes(plan)
    assert {"generic", "deepspeed", "dtensor"} <= set(notes)  # the launchers that run CLIP's data parallelism
    op = clip.batch_coupled[0].op
    for name, found in notes.items():
        assert len(found) == 1, name
        note = found[0]
        assert (f"this plan runs 2 micro-batches per step, so the contrastive loss ({op}) trains a different objective "
                "than one batch of 32: each sample is contrasted with the 15 others of its micro-batch, not 31") in note
        assert "gathered across the 2 data-parallel ranks" in note and "each rank contrasts only its own 8 samples" in note


def test_a_generic_plan_with_the_note_reads_back(clip):
    document = export("generic", _data_parallel(clip, 2, micro_batch=16, global_batch=32))
    assert plan_from_dict(document).data["batch"]["coupling"].startswith("batch-coupled: this plan runs 2")


def test_one_pass_on_one_rank_says_nothing_and_data_parallelism_only_the_gather(clip):
    assert not any(_notes(_data_parallel(clip, 1)).values())
    one_pass = _notes(_data_parallel(clip, 2))
    assert one_pass and all(len(found) == 1 and "micro-batches" not in found[0] and "gathered across the 2" in found[0]
                            for found in one_pass.values())


def test_a_model_without_a_contrastive_loss_has_no_note():
    graph = load_graph(GPT2, {"batch": 8, "seq": 32})
    notes = _notes(_data_parallel(graph, 2, micro_batch=8, global_batch=16))
    assert notes and not any(notes.values())
