"""DTensor plans of the tiny test models, made the way a user makes them: plan the ONNX file with the
search restricted to one DTensor family (``dtensor_masks``), then export the fastest point.

Settings are fp32 + Adam (4 + 4 + 8 bytes per parameter), the precision the launcher trains in, so
the planner's memory prediction and the tensors the ranks hold are comparable byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.dtensor import dtensor_masks, export_dtensor
from objectives.cluster import make_cluster
from planner.core.settings import TrainingSettings
from planner.export import plan_input
from planner.plan import PlanRequest, PlanResult, load_graph, plan
from tests.integration.configs import ONNX

__all__ = ["Case", "make_plan", "ROOT", "BATCH", "SEQ"]

ROOT = Path(__file__).resolve().parents[2]
BATCH = 4
"""Global batch (samples per step) of every run."""
SEQ = 16
"""Sequence length of every run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One plan to run: a model and a DTensor family, with a ZeRO stage."""

    model: str
    dp: int
    tp: int
    sp: bool = False
    vocab_embedding: bool = False
    vocab_head: bool = False
    zero: int = 0
    recompute: str = "none"
    """``full``: activation checkpointing of every transformer block."""
    hsdp: int | None = None
    """HSDP (ZeRO-3): the ranks FSDP2 shards over (``TrainingSettings.dp_shard``), replicated over the rest."""

    @property
    def name(self) -> str:
        flags = "".join(f"-{f}" for f, on in (("sp", self.sp), ("ve", self.vocab_embedding), ("vh", self.vocab_head)) if on)
        recompute = "" if self.recompute == "none" else f"-ac-{self.recompute}"
        hsdp = "" if self.hsdp is None else f"-hsdp{self.hsdp}"
        return f"{self.model}-{self.dp}x{self.tp}{flags}-zero{self.zero}{hsdp}{recompute}"


def make_plan(
    case: Case, *, batch: int = BATCH, seq: int = SEQ, devices_per_node: int | None = None
) -> tuple[dict[str, Any], PlanResult]:
    """The exported DTensor plan of ``case`` and the planner's result it came from."""
    graph = load_graph(ROOT / ONNX[case.model], {"batch": batch, "seq": seq})
    request = PlanRequest(
        cluster=make_cluster("h100-sxm", devices=case.dp * case.tp, devices_per_node=devices_per_node),
        settings=TrainingSettings(precision="fp32", optimizer="adam", zero_stage=case.zero, recompute=case.recompute,
                                  dp_shard=case.hsdp),
        method="dp",
    )

    def family(graph, spaces, cluster, settings):
        masks = dtensor_masks(
            graph,
            spaces,
            dp=case.dp,
            tp=case.tp,
            sequence_parallel=case.sp,
            vocab_parallel_embedding=case.vocab_embedding,
            vocab_parallel_head=case.vocab_head,
            devices_per_node=request.cluster.devices_per_node,
        )
        assert masks is not None, f"{case.name}: the family has no configurations"
        return [masks]

    result = plan(graph, request, target_filter=family, with_targets=False)
    return export_dtensor(plan_input(result, 0)), result


def qk_norm_plan(name: str) -> dict[str, Any]:
    """The 2-device DTensor plan (first configuration of its first family) of a QK-norm fixture
    (``tests/exporters/data``, written by ``make_qk_norm_fixtures.py``), at batch 2 and 16 tokens."""
    from exporters import export
    from exporters.dtensor import rules as dtensor_rules
    from tests.exporters.graphs import first_rows, make_input, spaces_for

    graph = load_graph(ROOT / "tests" / "exporters" / "data" / f"{name}.onnx", {"batch": 2, "seq": 16})
    spaces = spaces_for(graph, 2)
    family = dtensor_rules.families(graph, spaces, devices=2, devices_per_node=2, pp=1)[0]
    return export("dtensor", make_input(graph, spaces, first_rows(family.masks)))
