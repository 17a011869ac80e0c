r"""Pure-Python validators of the launch plans, one per target, covering every rule the libraries enforce.

Each launcher's validator lives in its package (``exporters/<launcher>/validate.py``), next to the
exporter that calls it before returning a plan; this module gathers their public names in one
place (the tests and ``tests/integration`` read them from here). The rules and where each framework
enforces them are in ``/work/shared/reference/export_targets.md``; each validator returns every
violation as a one-line message, and the ``validate_*`` functions raise
:class:`~planner.core.errors.UnsupportedExport` with all of them. Malformed input (an unknown flag, a
token without ``:``) raises :class:`~planner.core.errors.InputError` instead.

* Megatron-LM (§1.2; ``megatron-core==0.16.1``): :mod:`exporters.megatron.validate`;
* DeepSpeed (§2; ``deepspeed==0.19.8``): :mod:`exporters.deepspeed.validate`;
* Mesh-TensorFlow (§3.2, §3.4; ``mtf.convert_to_shape`` / ``convert_to_layout_rules``):
  :mod:`exporters.mesh_tf.validate`;
* torchtitan (0.3.0's ``ParallelDims``, ``Trainer.Config`` and pipeline rules):
  :mod:`exporters.torchtitan.validate`.

The DTensor plan has no validator of its own: it is run for real (``python -m planner.run``,
``tests/integration/test_dtensor_run.py``).
"""

from __future__ import annotations

from exporters.deepspeed.validate import deepspeed_violations, validate_deepspeed
from exporters.megatron.validate import (
    MEGATRON_FLAGS,
    megatron_violations,
    parse_megatron_args,
    parse_pipeline_layout,
    validate_megatron,
)
from exporters.mesh_tf.validate import MeshTensor, mesh_tf_violations, parse_mesh_tf_pairs, validate_mesh_tf
from exporters.torchtitan.validate import (
    TORCHTITAN_FLAGS,
    TorchtitanModel,
    parse_torchtitan_overrides,
    torchtitan_violations,
    validate_torchtitan,
)

__all__ = [
    "MEGATRON_FLAGS",
    "parse_megatron_args",
    "parse_pipeline_layout",
    "megatron_violations",
    "validate_megatron",
    "deepspeed_violations",
    "validate_deepspeed",
    "parse_mesh_tf_pairs",
    "mesh_tf_violations",
    "validate_mesh_tf",
    "MeshTensor",
    "TORCHTITAN_FLAGS",
    "TorchtitanModel",
    "parse_torchtitan_overrides",
    "torchtitan_violations",
    "validate_torchtitan",
]
