"""PyTorch DTensor, one launcher in one package: its registry entry (:data:`TARGET`), what it runs
(:mod:`~exporters.dtensor.rules`) and its export (:mod:`~exporters.dtensor.export`: a plan on a
``(dp, tp)`` mesh run by ``python -m planner.run``). It has no validator of its own: the plans are
run for real (``tests/integration/test_dtensor_run.py``).

Execution model: the plan runs the model's own PyTorch modules, which are eager, and Hugging Face
models use SDPA by default (``attn_implementation="sdpa"``): ``("eager", "flash")``.

The exporter's names are read from here (``from exporters.dtensor import export_dtensor,
dtensor_masks``) and load on first use: reading :data:`TARGET` loads no exporter.
"""

from __future__ import annotations

from exporters._target import Target, lazy, lazy_attributes
from exporters.dtensor import rules

__all__ = [
    "TARGET",
    # exporters.dtensor.export
    "TORCH_VERSION",
    "DtensorFamily",
    "dtensor_families",
    "dtensor_masks",
    "export_dtensor",
    "generalise_fqn",
]

TARGET = Target(
    name="dtensor",
    help="PyTorch DTensor plan on a (dp, tp) mesh, FSDP2 for ZeRO-3, run by python -m planner.run",
    export=lazy("exporters.dtensor.export", "export_dtensor"),
    families=rules.families,
    allows=rules.allows,
    settings_allows=rules.settings_allows,
    pipeline_allows=rules.pipeline_allows,
    execution=("eager", "flash"),
    hsdp=(3,),  # fully_shard on a ("dp_replicate", "dp_shard") mesh (export._fsdp_section)
    fsdp_reshard=True,  # fsdp.reshard_after_forward per fully_shard call (export._fsdp_section)
    autocast_zero=(0, 1, 2),  # planner.run: torch.autocast without an fsdp section; at ZeRO-3 FSDP2's bf16 policy alone
    offload=("none", "parameters"),  # fully_shard(..., offload_policy=CPUOffloadPolicy()) (export._fsdp_section)
    offload_rule=rules.offload_rule,
    expert_parallel=False,  # the mesh has no expert axis (rules.allows)
)
"""The DTensor plan's entry in :data:`exporters.targets.TARGETS`."""

__getattr__ = lazy_attributes(globals(), "exporters.dtensor.export")
