r"""Sliding-window attention's window, read from a model file.

transformers' masks (``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``,
Mistral, Gemma-2/3, Qwen2's ``use_sliding_window``) let query :math:`q` see the keys
:math:`q - W < k \le q`: :math:`W` tokens, itself included. Both torch exporters write it as a
comparison of the key positions with the query positions minus a scalar constant,
``Greater(kv, Sub(q, W))`` (TorchScript and dynamo alike); :mod:`importers.attention_masks` classes
that mask ``causal`` (each query sees its own set of keys) without saying which set. A launcher
whose attention sees every earlier token trains another model once the sequence is longer than
:math:`W`, so the exporters that build the attention ask here (:func:`sliding_windows`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from onnx import numpy_helper

__all__ = ["sliding_windows"]

_COMPARISONS = {"Greater": 1, "GreaterOrEqual": 1, "Less": 0, "LessOrEqual": 0}
"""Comparison op type -> the operand that is ``q - W`` in ``kv > q - W`` (``Less``: ``q - W < kv``)."""


def _scalar_int(tensor) -> int | None:
    """The value of a one-element tensor with its data in the file, if a positive whole number."""
    if tensor.external_data or int(np.prod(tensor.dims or [1])) != 1:
        return None
    value = float(numpy_helper.to_array(tensor).reshape(-1)[0])
    return int(value) if np.isfinite(value) and value >= 1 and value == int(value) else None


@functools.lru_cache(maxsize=16)
def sliding_windows(path: str, sha256: str = "") -> tuple[int, ...]:
    """The distinct windows :math:`W` (sorted) of the file's ``kv > q - W`` comparisons (module
    docstring); ``()`` when it has none. ``sha256`` (the graph's hash of the file) keys the cache.

    Examples
    --------
    >>> import tempfile
    >>> import onnx
    >>> from onnx import TensorProto as T, helper
    >>> nodes = [helper.make_node("Constant", [], ["w"], value=helper.make_tensor("w", T.INT64, [], [64])),
    ...          helper.make_node("Sub", ["q", "w"], ["start"]), helper.make_node("Greater", ["k", "start"], ["m"])]
    >>> ints = [helper.make_tensor_value_info(n, T.INT64, [8]) for n in ("q", "k")]
    >>> graph = helper.make_graph(nodes, "g", ints, [helper.make_tensor_value_info("m", T.BOOL, [8])])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(helper.make_model(graph), d + "/m.onnx")
    ...     print(sliding_windows(d + "/m.onnx"))
    (64,)
    """
    from importers.onnx_load import load_onnx

    model, _ = load_onnx(Path(path))
    scalars = {t.name: v for t in model.graph.initializer if (v := _scalar_int(t)) is not None}
    writer = {}
    for node in model.graph.node:
        for out in node.output:
            writer[out] = node
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            value = _scalar_int(node.attribute[0].t)
            if value is not None:
                scalars[node.output[0]] = value
    found = set()
    for node in model.graph.node:
        side = _COMPARISONS.get(node.op_type)
        if side is None or len(node.input) != 2:
            continue
        start = writer.get(node.input[side])
        if start is not None and start.op_type == "Sub" and len(start.input) == 2 and start.input[1] in scalars:
            found.add(scalars[start.input[1]])
    return tuple(sorted(found))
