"""The plan written back into the model (``--export onnx``), one export format in one package: its
registry entry (:data:`TARGET`), its rules (:mod:`~exporters.onnx_sharding.rules`: field and key
names, which tensors and devices), its writer (:mod:`~exporters.onnx_sharding.export`), its reader
(:mod:`~exporters.onnx_sharding.read`) and its checks (:mod:`~exporters.onnx_sharding.validate`).

It is an export format, not a launcher: it writes every strategy, so it is listed in
:data:`exporters.targets.EXPORT_FORMATS` (``--export`` / ``planner export --format``) and not in
:data:`exporters.targets.TARGETS` (the searched launchers and the ``targets`` column).
``docs/onnx-sharding.md`` describes the format.
"""

from __future__ import annotations

from exporters._target import Target, lazy, lazy_attributes

__all__ = [
    "TARGET",
    # exporters.onnx_sharding.export
    "export_onnx_sharding",
    "onnx_model_bytes",
    "annotate",
    # exporters.onnx_sharding.read
    "OpSharding",
    "read_onnx_sharding",
    "plan_document",
    "read_context",
    # exporters.onnx_sharding.validate
    "check_annotated",
    "check_round_trip",
]

TARGET = Target(
    name="onnx",
    help="a copy of the ONNX model with each node's sharding and pipeline stage (IR 11 fields, or ai.onnx.hint.* "
    "metadata on older IRs) with -o FILE.onnx; without -o the annotations as JSON",
    export=lazy("exporters.onnx_sharding.export", "export_onnx_sharding"),
    write=lazy("exporters.onnx_sharding.export", "onnx_model_bytes"),
)
"""The ONNX sharding's entry in :data:`exporters.targets.EXPORT_FORMATS` (every strategy: no families)."""

__getattr__ = lazy_attributes(
    globals(), "exporters.onnx_sharding.export", "exporters.onnx_sharding.read", "exporters.onnx_sharding.validate"
)
