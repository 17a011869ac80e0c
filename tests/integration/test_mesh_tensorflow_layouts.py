"""The Mesh-TensorFlow export (tests/exporters/test_mesh_tf.py) against mesh-tensorflow itself."""

from __future__ import annotations

import pytest

from exporters.mesh_tf import dimension_names, export_mesh_tf
from tests.exporters.graphs import llama_graph, make_input, spaces_for
from tests.exporters.test_mesh_tf import _dp_tp_choice


@pytest.mark.integration
def test_mesh_tensorflow_lays_out_every_tensor_as_planned():
    """mesh-tensorflow 0.1.21 (with TensorFlow 2.12) parses the strings and slices every operand of
    every op to the per-device shape of the planned configuration."""
    mtf = pytest.importorskip("mesh_tensorflow")
    from exporters.mesh_tf import _tensors
    from planner.core.layout import shard_shape

    g = llama_graph()
    spaces = spaces_for(g, 4)
    choice = _dp_tp_choice(g, spaces, 2, 2)
    out = export_mesh_tf(make_input(g, spaces, choice))
    mesh = mtf.convert_to_shape(out["mesh_shape"])
    assert [(d.name, d.size) for d in mesh.dims] == [("b", 2), ("m", 2)]
    rules = mtf.convert_to_layout_rules(out["layout"])
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh, rules, [""] * out["devices"])
    classes, names = dimension_names(g)
    by_name = {t.name: t for t in _tensors(g, classes, names)}
    checked = 0
    for index, (op, space, row) in enumerate(zip(g.ops, spaces, choice)):
        factors = space.describe(row)
        for access in (*op.inputs, *op.outputs):
            tensor = by_name[f"{op.name}:{access.tensor}"]
            dims = [mtf.Dimension(name or f"unnamed_{i}", size) for i, (name, size) in enumerate(zip(tensor.dims, tensor.shape))]
            assert impl.slice_shape(mtf.Shape(dims)) == list(shard_shape(tensor.shape, access, factors)), tensor.name
            checked += 1
    assert checked > 50
