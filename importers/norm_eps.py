r"""A norm's epsilon, read from a model file.

A LayerNorm or RMSNorm divides by :math:`\sqrt{\mathrm{var} + \epsilon}` (RMSNorm: the mean square;
Zhang & Sennrich 2019, eq. 4). The epsilon changes the model a launcher builds (torchtitan's
``RMSNorm.Config.eps``: 1e-5 by default, 1e-6 in its qwen3 family; Hugging Face's ``rms_norm_eps``),
so an exporter that writes the norms must write it. ONNX files hold it in one of two places:

* the ``epsilon`` attribute of a fused norm node (``LayerNormalization``, ``RMSNormalization``,
  onnxruntime's ``SimplifiedLayerNormalization`` and ``Skip*LayerNormalization``);
* a decomposed norm's ``Add`` of a scalar constant to a ``ReduceMean``'s output (both torch exporters
  write Hugging Face's RMSNorm as ``Pow -> ReduceMean -> Add(eps) -> Sqrt / Rsqrt``).

:func:`norm_epsilons` reads them for the importer's norm ops (:attr:`planner.core.graph.Op.onnx_nodes`).
A scalar whose constant was stripped from a graph-only file is not read (``None``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from importers.onnx_facts import OnnxFacts, float_values, per_reading
from planner.core.graph import OpGraph

__all__ = ["norm_epsilons"]


@per_reading
def _file_epsilons(facts: OnnxFacts) -> dict[str, float]:
    """``{node name: epsilon}`` of the file's norm nodes (module docstring), read once per reading of
    the file (:func:`~importers.onnx_facts.per_reading`: a file rewritten in place is read again)."""
    scalars, producer = float_values(facts), facts.producer
    found: dict[str, float] = {}
    for node in facts.nodes:
        eps = [float(a.f) for a in node.attribute if a.name == "epsilon"]
        if eps and "Normalization" in node.op_type:
            found[node.name] = eps[0]
        elif node.op_type == "Add" and len(node.input) == 2:
            # variance + eps: one operand a ReduceMean's output, the other a scalar constant
            a, b = node.input
            for stat, const in ((a, b), (b, a)):
                if stat in producer and producer[stat].op_type == "ReduceMean" and const in scalars:
                    found[node.name] = scalars[const]
    return found


def norm_epsilons(graph: OpGraph, indices: Iterable[int]) -> tuple[float, ...] | None:
    """The distinct epsilons (sorted, as float32 reads them) of the norm ops ``indices`` of ``graph``;
    ``None`` when the graph has no file or one of them has none readable (module docstring).

    Examples
    --------
    >>> import tempfile
    >>> from types import SimpleNamespace
    >>> import onnx
    >>> from onnx import TensorProto as T, helper
    >>> from planner.core.graph import Op
    >>> nodes = [helper.make_node("ReduceMean", ["x"], ["m"], name="mean"),
    ...          helper.make_node("Constant", [], ["e"], value=helper.make_tensor("e", T.FLOAT, [], [1e-6])),
    ...          helper.make_node("Add", ["m", "e"], ["v"], name="add")]
    >>> onnx_graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
    ...                                [helper.make_tensor_value_info("v", T.FLOAT, None)])
    >>> op = Op(name="mean", kind="norm", op_type="LayerNormalization", dims=(), inputs=(), outputs=(), flops=1.0,
    ...         onnx_nodes=("mean", "add"))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(helper.make_model(onnx_graph), d + "/m.onnx")
    ...     g = SimpleNamespace(ops=(op,), source_path=d + "/m.onnx")
    ...     print(norm_epsilons(g, [0]))
    (1e-06,)
    """
    if not graph.source_path or not Path(graph.source_path).is_file():
        return None
    found = _file_epsilons(str(graph.source_path), getattr(graph, "source_sha256", ""))
    values: set[float] = set()
    for index in indices:
        eps = [found[name] for name in graph.ops[index].onnx_nodes if name in found]
        if not eps:
            return None
        values.add(float(f"{np.float32(eps[0]):.6g}"))  # float32 1e-6 reads 9.99999997e-07
    return tuple(sorted(values))
