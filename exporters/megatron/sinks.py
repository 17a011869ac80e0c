r"""Attention sinks: a learned logit per head joined to the attention scores before the softmax (issue 25, h25f, h26e).

GPT-OSS (transformers 5.24 ``GptOssAttention``) concatenates its ``sinks`` parameter, one value per head broadcast
to every query, as an extra key column, takes the softmax over ``keys + 1`` columns and drops that column: each
head can put weight on "no token". Both torch exporters write it as ``Softmax(Concat(scores, sinks[1, H, 1, 1]))``
(the softmax's normalised dim is one wider than the key length). megatron-core 0.16.1 computes the same as
``TransformerConfig.softmax_type="learnable"`` (Megatron-LM's ``--softmax-type learnable``): ``DotProductAttention``
registers ``softmax_offset``, a parameter of ``num_attention_heads_per_partition`` values
(``transformer/dot_product_attention.py:126-136``), and ``SoftmaxOne`` concatenates it as the last key column,
takes the softmax and drops that column (``fusions/fused_softmax.py:168-176``); TransformerEngine's attention takes
it from TE 2.8 (``extensions/transformer_engine.py:1283-1288``). So sinks export as ``--softmax-type learnable``
(:func:`megatron_sink_args`) where every attention layer has one logit per head; sinks in some layers only, or of
another size, are refused (:func:`sink_refusal`): the flag gives every layer one logit per head.
"""

from __future__ import annotations

from importers.transformer import is_parameter
from planner.core.graph import OpGraph
from planner.core.memo import IdentityMemo

__all__ = ["SINK_KERNEL_NOTE", "attention_sinks", "megatron_sink_args", "sink_refusal"]


def attention_sinks(graph: OpGraph) -> tuple[str, ...]:
    """The parameters joined to a softmax's input by a concat (a learned logit beside the scores), in graph order.

    A softmax reads a concat's output, and one of the concat's inputs is a parameter: the sink logits. The
    parameter's shape is not checked (GPT-OSS's is ``[1, heads, 1, 1]`` after the export's reshape). Kept per
    graph (:data:`_SINKS`): Megatron-LM's families ask at every context-parallel degree of every stage model."""
    return _SINKS.get((graph,), lambda: _attention_sinks(graph))


_SINKS: IdentityMemo[tuple[str, ...]] = IdentityMemo(size=16)
""":func:`attention_sinks` of the graphs asked last (a search alternates between a dozen micro-batch sizes' graphs)."""


def _attention_sinks(graph: OpGraph) -> tuple[str, ...]:
    """:func:`attention_sinks`, computed."""
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


def sink_refusal(graph: OpGraph | None, heads: int, layers: int) -> list[str]:
    """One refusal clause when ``graph``'s sink logits (:func:`attention_sinks`) are not one per head (``heads``)
    in each of its ``layers`` attention layers, else ``[]`` (also without sinks)."""
    sinks = attention_sinks(graph) if graph is not None else ()
    if not sinks:
        return []
    sizes = sorted({graph.tensors[s].num_elements for s in sinks if s in graph.tensors})  # type: ignore[union-attr]
    if len(sinks) == layers and sizes == [heads]:
        return []
    return [f"its attention softmax takes learned sink logits ({len(sinks)} tensors of {', '.join(map(str, sizes))} "
            f"values, in a model of {layers} attention layers of {heads} heads) and Megatron-LM's --softmax-type "
            "learnable gives every layer one logit per head"]


SINK_KERNEL_NOTE = (
    "the plan was priced with FlashAttention-2, and TransformerEngine disables FlashAttention for --softmax-type "
    "learnable (the attention sinks): the export names cuDNN's fused attention (--attention-backend fused), which "
    "needs TransformerEngine 2.8+ and a cuDNN that takes a softmax offset; its step time may differ from the priced "
    "one (plan with --attention cudnn to price that kernel)"
)
"""The note of a sink model's export from a plan priced with flash attention (module docstring)."""


def megatron_sink_args(graph: OpGraph) -> list[str]:
    """``--softmax-type learnable`` when the attention has sink logits (module docstring), else ``[]``."""
    return ["--softmax-type", "learnable"] if attention_sinks(graph) else []
