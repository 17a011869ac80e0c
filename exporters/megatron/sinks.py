r"""Attention sinks: a learned logit per head joined to the attention scores before the softmax (issue 25, h25f).

GPT-OSS (transformers 5.24 ``GptOssAttention``) concatenates its ``sinks`` parameter, one value per head broadcast
to every query, as an extra key column, takes the softmax over ``keys + 1`` columns and drops that column: each
head can put weight on "no token". Both torch exporters write it as ``Softmax(Concat(scores, sinks[1, H, 1, 1]))``
(the softmax's normalised dim is one wider than the key length). megatron-core 0.16.1 computes it as
``TransformerConfig.softmax_type="learnable"`` (Megatron-LM's ``--softmax-type learnable``,
``transformer/dot_product_attention.py:118-130``); this exporter does not write that flag, so a model with sinks is
refused with it named instead of being trained without them.
"""

from __future__ import annotations

from importers.transformer import is_parameter
from planner.core.graph import OpGraph

__all__ = ["attention_sinks", "sink_refusal"]


def attention_sinks(graph: OpGraph) -> tuple[str, ...]:
    """The parameters joined to a softmax's input by a concat (a learned logit beside the scores), in graph order.

    A softmax reads a concat's output, and one of the concat's inputs is a parameter: the sink logits. The
    parameter's shape is not checked (GPT-OSS's is ``[1, heads, 1, 1]`` after the export's reshape)."""
    producer = {access.tensor: op for op in graph.ops for access in op.outputs}
    found: list[str] = []
    for op in graph.ops:
        if op.kind != "softmax" or not op.inputs:
            continue
        joined = producer.get(op.inputs[0].tensor)
        if joined is None or joined.kind != "concat":
            continue
        found += [a.tensor for a in joined.inputs if is_parameter(graph, a.tensor) and a.tensor not in found]
    return tuple(found)


def sink_refusal(graph: OpGraph | None) -> list[str]:
    """One refusal clause when ``graph``'s attention has learned sink logits (:func:`attention_sinks`), else ``[]``."""
    sinks = attention_sinks(graph) if graph is not None else ()
    if not sinks:
        return []
    return [f"its attention softmax takes a learned logit per head beside the scores ({len(sinks)} sink tensors, "
            "GPT-OSS's attention sinks) and this export does not write Megatron-LM's --softmax-type learnable "
            "(megatron-core's learnable softmax offset)"]
