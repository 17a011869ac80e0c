"""Saved per-op plans (``planner plan ... --export generic``) read and priced again on their model:
what ``explain``, ``compare`` and ``export`` read (:class:`LoadedPlan`); a model with its plan written
in (``--export onnx``) read back as the generic plan it holds (:func:`onnx_plan_document`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.core.errors import InputError
from planner.core.graph import OpGraph
from planner.plan_types import PlanRequest
from planner.pricing import build_model, load_graph

__all__ = ["LoadedPlan", "load_plan", "load_plan_pair", "is_onnx_plan", "onnx_plan_document"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedPlan:
    """A saved generic plan, re-priced on its model: what ``explain``, ``compare`` and ``export`` read."""

    path: Path
    document: object
    """The ``exporters.generic.PlanDocument``."""
    graph: OpGraph
    request: PlanRequest
    cost: object
    """The ``objectives.tables.CostModel`` of the plan's cluster and settings."""
    choice: tuple[int, ...]

    @property
    def evaluation(self):
        """The plan's choice explained term by term (``objectives.tables.Evaluation``)."""
        return self.cost.evaluate(self.choice)


def load_plan(path: str | Path, *, model: str | Path | None = None) -> LoadedPlan:
    """Read a generic plan file and re-price it on its model.

    Parameters
    ----------
    path:
        A plan written by ``planner plan ... --export generic``.
    model:
        The ONNX file; default: the path recorded in the plan. It must be the same file (SHA-256).

    Raises
    ------
    InputError
        Unreadable, old or malformed plans; a missing or different model; pipeline plans with
        more than one stage (priced by :func:`planner.estimate.estimate`, not here).
    """
    from exporters.generic import read_plan

    document = read_plan(path)
    pipeline = document.pipeline
    if pipeline is not None and pipeline.pp > 1:
        # explain/compare price one strategy on the whole cluster; a pipeline's cost is its schedule's
        raise InputError(
            f"{path} is a {pipeline.pp}-stage pipeline plan, which explain and compare cannot price yet; "
            "price it with `planner estimate` (its --tp/--pp/--micro-batch/--global-batch flags) "
            "or re-export it with `planner export`"
        )
    data = document.data
    model_path = Path(model) if model is not None else Path(data["model"].get("source_path") or "")
    if not str(model_path) or not model_path.is_file():
        raise InputError(
            f"the plan's model '{model_path}' is not found; pass --model MODEL.onnx (the file the plan was made for)"
        )
    graph = load_graph(model_path, data["model"]["dims"])
    document.check_graph(graph)
    request = PlanRequest(
        cluster=document.cluster(),
        settings=document.settings(),  # with the execution model the plan was priced under (absent: none)
        cost_model=data.get("cost_model", "roofline"),
    )
    cost = build_model(graph, request)
    choice = []
    for op, space in zip(document.ops, cost.tables.configs):
        try:
            choice.append(op.row_in(space))
        except KeyError:
            copies = f" as {op.replicas} copies" if op.replicas else ""
            raise InputError(
                f"op {op.name}: split {dict(op.splits)} (inter-node parts {dict(op.inter_splits)}){copies} is not a "
                "configuration on this cluster; plan the model again"
            ) from None
    return LoadedPlan(path=Path(path), document=document, graph=graph, request=request, cost=cost, choice=tuple(choice))


def load_plan_pair(first: str | Path, second: str | Path, *, model: str | Path | None = None) -> tuple[LoadedPlan, LoadedPlan]:
    """Two saved plans of one model (:func:`load_plan` each), to compare.

    Raises
    ------
    InputError
        Either plan cannot be loaded, or they are for different models or ``--dim`` values.
    """
    plans = load_plan(first, model=model), load_plan(second, model=model)
    a, b = plans[0].graph, plans[1].graph
    if a.source_sha256 != b.source_sha256 or a.dim_bindings != b.dim_bindings:
        raise InputError("the two plans are for different models or --dim values; compare plans of one model")
    return plans



def is_onnx_plan(path: str | Path) -> bool:
    """Whether ``path`` names a model file (``.onnx``) rather than a plan's JSON: read by :func:`onnx_plan_document`."""
    return Path(path).suffix.lower() == ".onnx" and Path(path).is_file()


def onnx_plan_document(path: str | Path) -> dict:
    """The generic plan document of a model written by ``--export onnx``: its splits, copies and
    stages read back from the model's sharding fields (:func:`exporters.onnx_sharding.plan_document`),
    the model imported at the plan's dims; the model file itself is the plan's model.

    Raises
    ------
    InputError
        Not an ONNX file, no plan in it, or a plan that does not match its ops.
    """
    from exporters.onnx_sharding import plan_document, read_context
    from exporters.onnx_sharding.export import load_source

    model = load_source(path)
    context = read_context(model)
    if context is None:
        raise InputError(f"{path} holds no plan; write one with `planner plan MODEL.onnx ... --export onnx -o {Path(path).name}`")
    return plan_document(model, load_graph(path, context["plan"]["model"]["dims"]))
