r"""Small helpers on ONNX protos shared by the shape stages: dtype names, a value's concrete shape,
attributes, and short listings for messages.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

_DEFAULT_DOMAINS = ("", "ai.onnx")


# --------------------------------------------------------------------------------------------
# Small helpers on protos
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _dtype_name(elem_type: int) -> str | None:
    """numpy dtype name of an ONNX element type (``bfloat16`` stays ``bfloat16``)."""
    if elem_type == TensorProto.STRING:
        return "string"
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # UNDEFINED or an unknown code in a corrupt file
        return None


def _tensor_type(vi: onnx.ValueInfoProto) -> onnx.TypeProto.Tensor | None:
    if vi.type.WhichOneof("value") != "tensor_type":
        return None
    return vi.type.tensor_type


def _concrete_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """Shape of a value info when every dim has a value, else None."""
    tt = _tensor_type(vi)
    if tt is None or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if d.WhichOneof("value") != "dim_value":
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def _dim_text(d: onnx.TensorShapeProto.Dimension) -> str:
    which = d.WhichOneof("value")
    if which == "dim_value":
        return str(d.dim_value)
    if which == "dim_param" and d.dim_param:
        return d.dim_param
    return "?"


def _is_anonymous(d: onnx.TensorShapeProto.Dimension) -> bool:
    which = d.WhichOneof("value")
    return which is None or (which == "dim_param" and (not d.dim_param or d.dim_param.startswith("unk__")))


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def _limited(items: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` items joined, and how many more (for warnings that name a few)."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _first_line(exc: object) -> str:
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= 160 else line[:157] + "..."
