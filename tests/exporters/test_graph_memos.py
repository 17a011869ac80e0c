"""The per-graph memos of the exporters' search-time rules (issue 22, fifteenth round, h29d): Mesh-TF's dimension
names (:func:`exporters.mesh_tf.export.dimension_names`) and Megatron-LM's attention sinks
(:func:`exporters.megatron.sinks.attention_sinks`) are kept per graph object; each answer must be the one its
uncached computation gives for that very graph, whatever graph was asked before (a search alternates between the
graphs of many micro-batch sizes)."""

from __future__ import annotations

from pathlib import Path

from exporters.megatron import sinks
from exporters.mesh_tf import export as mesh_tf_export
from planner.plan import load_graph
from tests.exporters.graphs import cnn_graph, gpt_graph, llama_graph

SINK_CASES = sorted((Path(__file__).resolve().parents[1] / "data" / "sink_cases").glob("*.onnx"))


def _names(graph):
    """The classes' membership and the names, as plain values (the memo returns the very objects it kept)."""
    classes, names = mesh_tf_export.dimension_names(graph)
    return tuple(tuple(m) for m in classes.members), tuple(dict(o) for o in classes.of), names


def _fresh_names(graph):
    classes, names = mesh_tf_export._dimension_names(graph)
    return tuple(tuple(m) for m in classes.members), tuple(dict(o) for o in classes.of), names


def test_dimension_names_per_graph_match_the_uncached_names():
    graphs = [cnn_graph(batch=8), cnn_graph(batch=6), llama_graph(), gpt_graph()]
    expected = [_fresh_names(g) for g in graphs]
    assert len({e[2] for e in expected[1:]}) == 3  # three models, three namings: a memo mixing graphs would show
    for _ in range(2):  # asked again, in turn: each graph still gets its own
        assert [_names(g) for g in graphs] == expected
    assert mesh_tf_export.dimension_names(graphs[2]) is mesh_tf_export.dimension_names(graphs[2])


def test_default_layouts_unchanged_by_the_memo(monkeypatch):
    graph = llama_graph()
    for devices in (1, 2, 4, 8):
        kept = mesh_tf_export.default_layouts(graph, devices=devices)
        # nothing kept: the names computed anew (the module's own memo is restored after the test)
        monkeypatch.setattr(mesh_tf_export, "_NAMES", type(mesh_tf_export._NAMES)(size=16))
        assert mesh_tf_export.default_layouts(graph, devices=devices) == kept


def test_attention_sinks_per_graph_match_the_uncached_sinks():
    with_sinks = load_graph(SINK_CASES[0], {"batch": 2, "seq": 16})
    graphs = [llama_graph(), with_sinks, gpt_graph()]
    expected = [sinks._attention_sinks(g) for g in graphs]
    assert expected[0] == () and len(expected[1]) == 2  # GPT-OSS's two layers each join one sink logit
    for _ in range(2):
        assert [sinks.attention_sinks(g) for g in graphs] == expected
