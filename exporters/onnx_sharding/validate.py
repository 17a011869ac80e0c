"""The checks of an ONNX sharding export: the written model passes the ONNX checker
(:func:`check_annotated`; a graph-only model is checked without its data, its stripped initializers
as graph inputs of the same type and shape), and its sharding fields read back as the plan that was
exported (:func:`check_round_trip`: every op's split factors, inter-node parts, copies and stage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.core.errors import UnsupportedExport

if TYPE_CHECKING:
    import onnx

    from exporters.generic import PlanInput

__all__ = ["checkable", "check_annotated", "check_round_trip"]


def checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose external (stripped) initializers are graph inputs instead: the
    checker wants their data on disk; as inputs of the same dtype and dims they are fully described."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    kept = []
    for init in graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            kept.append(init)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return copy


def check_annotated(model: onnx.ModelProto) -> None:
    """Raise :class:`UnsupportedExport` unless ``onnx.checker.check_model`` accepts the annotated model."""
    import onnx

    try:
        onnx.checker.check_model(checkable(model))
    except (onnx.checker.ValidationError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else exc.__class__.__name__
        raise UnsupportedExport(f"the annotated model fails the ONNX checker ({first})") from None


def check_round_trip(model: onnx.ModelProto, plan_input: PlanInput) -> None:
    """Raise :class:`UnsupportedExport` unless ``model``'s sharding fields read back as ``plan_input``."""
    from exporters.onnx_sharding.rules import op_stages
    from exporters.onnx_sharding.read import read_onnx_sharding

    graph = plan_input.graph
    stages = op_stages(plan_input)
    read = read_onnx_sharding(model, graph)
    for op, space, row, got, stage in zip(graph.ops, plan_input.spaces, plan_input.strategy.choice, read, stages):
        want = (
            dict(zip(space.dim_names, space.factors[row].tolist())),
            dict(zip(space.dim_names, space.inter_factors[row].tolist())),
            int(space.replica_counts[row]),
            int(space.inter_replica_counts[row]),
            stage,
        )
        have = (dict(got.factors), dict(got.inter), got.replicas, got.inter_replicas, got.stage)
        if want != have:
            raise UnsupportedExport(
                f"op {op.name}: its split {want[0]} (across nodes {want[1]}, {want[2]} copies, stage {stage}) does not "
                f"read back from the model's tensors (read {have[0]}, {have[1]}, {have[2]} copies, stage {have[4]}); "
                "the ONNX sharding cannot show it"
            )
