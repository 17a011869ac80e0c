r"""Rotary position embeddings in Megatron-LM's hybrid export (``pretrain_mamba.py``; issue 25, h28f).

megatron-core 0.16.1's ``MambaModel`` (``models/mamba/mamba_model.py``) takes ``position_embedding_type`` (``rope``
or ``none``), ``rotary_percent`` and ``rotary_base``, which Megatron-LM's ``pretrain_mamba.py`` fills from
``--position-embedding-type``, ``--rotary-percent`` and ``--rotary-base``. With ``rope`` it builds one
``RotaryEmbedding(kv_channels, rotary_percent, rotary_base=...)`` and ``MambaStack.forward`` (``ssm/mamba_block.py``)
hands its tables to every ``TransformerLayer`` (the attention layers) and to no Mamba layer: every attention layer
rotates its queries and keys, or none does. It passes no ``rope_scaling`` (Llama 3.1's scaling, which ``GPTModel``
takes) and no per-layer skip that the export checks (``--no-rope-freq`` is the GPT family's).

So a stack whose graph computes sines or cosines is exported with ``--position-embedding-type rope`` when
(:func:`hybrid_rotary`):

* every attention block the transformer reader finds (:func:`importers.transformer.analyze_transformer`, Mamba
  mixers aside) rotates both its queries and its keys (:func:`importers.rotary.rotated_layers`), and there are as
  many as the pattern's attention layers;
* the file's frequencies are one geometric series, of an integer base, over at most a head's channels
  (:func:`exporters.megatron.families.megatron_rotary_args`, the GPT family's reading: ``--rotary-base`` and
  ``--rotary-percent``), without Llama 3.1's scaling.

Otherwise the clause names the difference. A graph-only file whose frequencies were stripped is exported with
Megatron's base 10,000 and a note, as the GPT family does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporters.elsewhere import ELSEWHERE
from exporters.megatron.families import megatron_rotary_args
from importers.hybrid import HybridStack
from importers.rotary import rotated_layers
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.core.memo import IdentityMemo

if TYPE_CHECKING:
    from planner.core.graph import OpGraph

__all__ = ["HybridRotary", "hybrid_rotary"]

_ALL_OR_NONE = ("MambaModel hands one RotaryEmbedding to every attention layer (queries and keys) or to none "
                "(--position-embedding-type rope or none)")


@dataclass(frozen=True, slots=True, kw_only=True)
class HybridRotary:
    """What the hybrid export writes for a stack's position embeddings, or why it cannot."""

    args: tuple[str, ...] = ()
    """``--position-embedding-type`` and, with ``rope``, ``--rotary-base`` / ``--rotary-percent``."""
    refusal: str = ""
    """Why ``MambaModel`` would rotate otherwise than the graph (empty: it rotates the same)."""
    note: str = ""
    """What the export read of the rotary embedding (the base, the channels turned), for the notes."""


_READ: IdentityMemo[HybridRotary] = IdentityMemo(size=8)


def hybrid_rotary(stack: HybridStack, graph: OpGraph | None) -> HybridRotary:
    """The stack's position-embedding flags, or the clause saying how ``MambaModel``'s would differ (module
    docstring). Without sines or cosines in the graph: ``--position-embedding-type none``. Kept for the last
    (stack, graph) pairs by identity: every ``dp x tp`` family of a search asks :func:`~exporters.megatron.mamba.
    hybrid_refusals` again."""
    if not stack.rotary:
        return HybridRotary(args=("--position-embedding-type", "none"))
    return _READ.get(("rotary", stack, graph), lambda: _hybrid_rotary(stack, graph))


def _hybrid_rotary(stack: HybridStack, graph: OpGraph | None) -> HybridRotary:
    """:func:`hybrid_rotary`, read again."""
    if not stack.rotary:
        return HybridRotary(args=("--position-embedding-type", "none"))
    if graph is None:
        return HybridRotary(refusal="it computes rotary embeddings, and which attention layers apply them was not read")
    try:
        model = analyze_transformer(graph)
    except UnsupportedExport:
        return HybridRotary(refusal=f"it computes rotary embeddings and no attention layer was found to say which "
                                    f"apply them; {_ALL_OR_NONE}")
    turned = rotated_layers(graph, model.attention)
    other = [i for i, t in enumerate(turned) if t != "both"]
    if other:
        what = {"none": "neither its queries nor its keys", "query": "its queries only", "key": "its keys only"}
        said = ", ".join(f"{i} {what[turned[i]]}" for i in other)
        return HybridRotary(refusal=f"it computes rotary embeddings, and of its {len(turned)} attention layers "
                                    f"(counting from 0) {said} rotate(s); {_ALL_OR_NONE}")
    if len(turned) < stack.pattern.count("*"):
        return HybridRotary(refusal=f"it computes rotary embeddings, and {len(turned)} of its "
                                    f"{stack.pattern.count('*')} attention layers were found whole to show that they "
                                    f"apply them; {_ALL_OR_NONE}")
    try:
        flags, note = megatron_rotary_args(graph, model)
    except UnsupportedExport as exc:
        return HybridRotary(refusal=exc.reason.removesuffix(ELSEWHERE).replace("Megatron-LM's", "MambaModel's"))
    if "--use-rope-scaling" in flags:  # MambaModel.__init__ takes no rope_scaling (GPTModel's)
        return HybridRotary(refusal="its rotary frequencies are Llama 3.1's scaling of a geometric series, and "
                                    "megatron-core 0.16.1's MambaModel builds its RotaryEmbedding without rope_scaling "
                                    "(pretrain_mamba.py passes no --use-rope-scaling)")
    if "--rotary-interleaved" in flags:  # MambaModel.__init__ builds RotaryEmbedding without rotary_interleaved
        return HybridRotary(refusal="it rotates channel pairs (2i, 2i + 1), and megatron-core 0.16.1's MambaModel "
                                    "builds its RotaryEmbedding without rotary_interleaved, so its frequencies would "
                                    "pair (i, i + d/2) (models/mamba/mamba_model.py:116-123)")
    return HybridRotary(args=("--position-embedding-type", "rope", *flags), note=note)
