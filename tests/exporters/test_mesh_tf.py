"""Tests of exporters.mesh_tf: dimension names, mesh and layout strings, refusals, and masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters.megatron import megatron_masks
from exporters.mesh_tf import default_layouts, dimension_names, export_mesh_tf, mesh_tf_masks
from exporters.validate import validate_mesh_tf
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import cnn_graph, first_rows, gpt_graph, llama_graph, make_input, set_split, spaces_for


ROOT = Path(__file__).resolve().parents[2]


def _name(graph, names, classes, op, dim):
    return names[classes.cls(graph.op_index(op), dim)]


class TestDimensionNames:
    def test_transformer_names_are_shared_by_layers(self):
        g = llama_graph()
        classes, names = dimension_names(g)
        for layer in (0, 1):
            assert _name(g, names, classes, f"score_{layer}", "b1_0") == "heads"
            assert _name(g, names, classes, f"score_{layer}", "b1_1") == "heads_inner"
            assert _name(g, names, classes, f"score_{layer}", "k") == "d_kv"
            assert _name(g, names, classes, f"down_{layer}", "k") == "d_ff"
            assert _name(g, names, classes, f"q_{layer}", "n") == "heads"  # rotary joins Q columns to heads
        assert _name(g, names, classes, "norm1_0", "d2") == "d_model"
        assert _name(g, names, classes, "norm1_0", "d0") == "batch"
        assert _name(g, names, classes, "score_0", "m") == "length"
        assert _name(g, names, classes, "tok_emb", "v") == "vocab" == _name(g, names, classes, "lm_head", "n")

    def test_other_models_get_unique_names(self):
        g = cnn_graph()
        classes, names = dimension_names(g)
        assert _name(g, names, classes, "conv", "b") == "batch"
        assert _name(g, names, classes, "conv", "co") == "co_16" == _name(g, names, classes, "relu", "d1")
        assert len({n for n in names if n != "batch"}) == len([n for n in names if n != "batch"])


class TestNodesAreNotBatch:
    """A GNN's node dim is the graph's batch dim, but not its samples (the import reads GatherND/ScatterND ops
    indexing it by ``edge_index``): Mesh-TF names it after the file's dim, ``nodes``, never ``batch`` (h31g found
    ``b:2 batch:b`` on the GAT's node rows; h32f)."""

    @pytest.fixture(scope="class")
    def gat(self):
        from planner.plan import load_graph

        return load_graph(ROOT / "tests" / "data" / "gat_cases" / "gat_dynamo_bare.onnx", {"nodes": 2708, "edges": 13264})

    def test_the_node_dim_is_named_nodes(self, gat):
        classes, names = dimension_names(gat)
        assert _name(gat, names, classes, "node_linear", "m") == "nodes" == _name(gat, names, classes, "node_sum_1", "d0")
        assert "batch" not in names

    def test_a_node_split_exports_as_nodes(self, gat):
        spaces = spaces_for(gat, 2)
        choice = [s.index_of({d.name: 2 for d in op.dims if d.is_batch}) for op, s in zip(gat.ops, spaces)]
        out = export_mesh_tf(make_input(gat, spaces, choice))
        assert (out["mesh_shape"], out["layout"]) == ("b:2", "nodes:b")
        assert out["dimensions"]["nodes"]["sizes"] == [2708] and "batch" not in out["dimensions"]
        assert default_layouts(gat, devices=2) == [({"b": 2}, {"nodes": "b"})]
        validate_mesh_tf(out["mesh_shape"], out["layout"], devices=2)


def _dp_tp_choice(graph, spaces, dp, tp):
    """Megatron's pattern without sequence parallelism: every dimension name split one way."""
    return first_rows(megatron_masks(graph, spaces, dp=dp, tp=tp))


class TestExport:
    def test_llama_dp_x_tp_is_the_transformer_default_layout(self):
        g = llama_graph()
        spaces = spaces_for(g, 4)
        out = export_mesh_tf(make_input(g, spaces, _dp_tp_choice(g, spaces, 2, 2)))
        assert out["mesh_shape"] == "b:2;m:2"
        assert out["layout"] == "batch:b;d_ff:m;heads:m;vocab:m"
        assert out["devices"] == 4
        assert out["gin"] == 'utils.run.mesh_shape = "b:2,m:2"\nutils.run.layout_rules = "batch:b,d_ff:m,heads:m,vocab:m"'
        assert out["dimensions"]["heads"]["mesh_dim"] == "m" and out["dimensions"]["d_model"]["mesh_dim"] is None
        validate_mesh_tf(out["mesh_shape"], out["layout"], devices=4)

    def test_data_parallel(self):
        g = cnn_graph()
        spaces = spaces_for(g, 4)
        choice = [s.index_of({d.name: 4 for d in op.dims if d.is_batch}) for op, s in zip(g.ops, spaces)]
        out = export_mesh_tf(make_input(g, spaces, choice))
        assert (out["mesh_shape"], out["layout"]) == ("b:4", "batch:b")

    def test_two_ops_disagree_on_a_dimension_name(self):
        g = llama_graph()
        spaces = spaces_for(g, 4)
        choice = set_split(g, spaces, _dp_tp_choice(g, spaces, 2, 2), "gate_1", {"b0": 2})
        with pytest.raises(UnsupportedExport, match=r"ops .* and gate_1 \(n split 1\) disagree on dimension 'd_ff'"):
            export_mesh_tf(make_input(g, spaces, choice))

    def test_sequence_split_attention_is_refused(self):
        g = gpt_graph()
        spaces = spaces_for(g, 2)
        choice = set_split(g, spaces, [0] * len(g.ops), "score_0", {"m": 2})
        with pytest.raises(UnsupportedExport, match="two dims named 'length'"):
            export_mesh_tf(make_input(g, spaces, choice))

    def test_zero_is_refused(self):
        g = llama_graph()
        spaces = spaces_for(g, 4)
        with pytest.raises(UnsupportedExport, match="no ZeRO"):
            export_mesh_tf(make_input(g, spaces, _dp_tp_choice(g, spaces, 2, 2), settings=TrainingSettings(zero_stage=1)))

    def test_gpt2_fused_qkv_split_is_refused(self):
        # The QKV columns are split, but the Split op that reads them cannot split that axis.
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        with pytest.raises(UnsupportedExport, match="disagree on dimension 'qkv'"):
            export_mesh_tf(make_input(g, spaces, _dp_tp_choice(g, spaces, 2, 2)))


class TestMasks:
    def test_masks_reproduce_an_exported_plan(self):
        g = llama_graph()
        spaces = spaces_for(g, 4)
        choice = _dp_tp_choice(g, spaces, 2, 2)
        out = export_mesh_tf(make_input(g, spaces, choice))
        mesh = dict(pair.split(":") for pair in out["mesh_shape"].split(";"))
        layout = dict(pair.split(":") for pair in out["layout"].split(";"))
        masks = mesh_tf_masks(g, spaces, mesh_shape={k: int(v) for k, v in mesh.items()}, layout=layout)
        assert [int(np.flatnonzero(m)[0]) for m in masks] == [spaces[i].index_of(spaces[i].describe(r)) for i, r in enumerate(choice)]
        assert all(m.sum() == 1 for m in masks)

    def test_impossible_layout(self):
        g = llama_graph()
        spaces = spaces_for(g, 8)
        # Two names of one tensor on one mesh dim, and a split not dividing the dim.
        assert mesh_tf_masks(g, spaces, mesh_shape={"m": 2}, layout={"heads": "m", "d_kv": "m"}) is None
        assert mesh_tf_masks(g, spaces, mesh_shape={"b": 8}, layout={"heads_inner": "b"}) is None

    def test_default_layouts(self):
        # 'heads' includes the 2 KV groups, which do not split 4 ways.
        assert default_layouts(llama_graph(), devices=4) == [
            ({"m": 4}, {"d_ff": "m", "vocab": "m"}),
            ({"b": 2, "m": 2}, {"batch": "b", "heads": "m", "d_ff": "m", "vocab": "m"}),
            ({"b": 4}, {"batch": "b"}),
        ]
        assert default_layouts(cnn_graph(), devices=4) == [({"b": 4}, {"batch": "b"})]
