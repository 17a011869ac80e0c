"""The importer's warnings of a model loaded at several batches are said once each (helper H3's sweep:
a dynamo MobileBERT at 8 devices printed "shapes of 43 values ..." and "shapes of 129 values ..." for
its graphs at batch 16 and at a micro-batch)."""

from __future__ import annotations

from types import SimpleNamespace

from planner.pipeline import GraphLoader


def _loader(*warnings_per_batch: tuple[str, ...]) -> GraphLoader:
    loader = GraphLoader("m.onnx", {}, "batch")
    for batch, warnings in zip((16, 2, 1), warnings_per_batch):
        loader._graphs[batch] = SimpleNamespace(warnings=warnings)
    return loader


def test_a_warning_with_other_counts_is_said_once_as_the_first_graph_gave_it():
    first = "shapes of 43 values were taken from value_info (e.g. slice_1, arange_2 and 41 more)"
    again = "shapes of 129 values were taken from value_info (e.g. slice_1, arange_2 and 127 more)"
    other = "1 constant(s) read as a weight ('exp' []; 1 elements) were folded"
    assert _loader((first, other), (again,), (again, other)).warnings == (first, other)


def test_warnings_that_differ_in_a_name_are_both_said():
    one = "graph input 'input_1' is unused and has an unbound dim"
    two = "graph input 'input_2' is unused and has an unbound dim"
    assert _loader((one,), (two,)).warnings == (one, two)
