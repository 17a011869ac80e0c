"""Mesh-TensorFlow, one launcher in one package: its registry entry (:data:`TARGET`, ``meshtf``),
what it runs (:mod:`~exporters.mesh_tf.rules`), its export (:mod:`~exporters.mesh_tf.export`: the
mesh shape and layout rules) and Mesh-TF's own checks (:mod:`~exporters.mesh_tf.validate`).

Execution model: Mesh-TensorFlow compiles with XLA, which fuses elementwise chains but materialises
the attention scores: ``("fused", "explicit")``.

The exporter's and the validator's names are read from here (``from exporters.mesh_tf import
export_mesh_tf, mesh_tf_masks``) and load on first use: reading :data:`TARGET` loads neither.
"""

from __future__ import annotations

from exporters._target import Target, lazy, lazy_attributes
from exporters.mesh_tf import rules

__all__ = [
    "TARGET",
    # exporters.mesh_tf.export
    "dimension_names",
    "mesh_tf_masks",
    "default_layouts",
    "export_mesh_tf",
    # exporters.mesh_tf.validate
    "MeshTensor",
    "parse_mesh_tf_pairs",
    "mesh_tf_violations",
    "validate_mesh_tf",
]

TARGET = Target(
    name="meshtf",
    help="Mesh-TensorFlow mesh shape and layout rules",
    export=lazy("exporters.mesh_tf.export", "export_mesh_tf"),
    families=rules.families,
    allows=rules.allows,
    pipeline_allows=rules.pipeline_allows,
    rule=rules.rule,
    execution=("fused", "explicit"),
    expert_parallel=False,  # the mesh has no expert axis (rules.allows)
)
"""Mesh-TensorFlow's entry in :data:`exporters.targets.TARGETS`."""

__getattr__ = lazy_attributes(globals(), "exporters.mesh_tf.export", "exporters.mesh_tf.validate")
