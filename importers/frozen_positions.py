r"""Position tables of the kinds common libraries freeze, counted as trained with a warning (issue 25, task H3).

transformers freezes some sinusoidal position tables that are still ``nn.Parameter``\ s: Marian's and Pegasus'
``*SinusoidalPositionalEmbedding`` (``nn.Embedding(..., _freeze=True)``), RoFormer's (the rotary sines and cosines,
one head wide) and Whisper's encoder ``embed_positions`` (``requires_grad_(False)``). They are not trained, so
``sum(p.numel() for p in model.parameters() if p.requires_grad)`` leaves them out, while the file cannot: both
exporters write a frozen table exactly as a learned one, a named initializer gathered at ``arange`` positions
(TorchScript keeps no module class; the dynamo exporter's ``namespace`` metadata names the class, but Whisper's
frozen table is a plain ``nn.Embedding``; a graph-only file holds no values to recognise sines by). So the count
keeps them, and :func:`frozen_table_note` warns in one line where a position table
(:func:`importers.position_table.position_tables`) is shaped and used as the frozen ones are:

* narrower than the token embedding and read through slices (RoFormer: split into its sine and cosine halves
  for the rotary products, never added to the tokens);
* looked up from row 0 and added to token embeddings scaled by a constant (Marian, Pegasus: ``embed_scale``;
  transformers' learned tables with scaled tokens, BART's and BioGPT's, start at row 2).

Whisper's encoder table is read whole, not at positions: the TorchScript export folds it into an anonymous
constant, warned by :mod:`importers.parameters`; the dynamo export keeps it named, and it is counted.
"""

from __future__ import annotations

from planner.core.graph import OpGraph

__all__ = ["frozen_table_note"]


def _why_frozen(graph: OpGraph, table, token_width: int | None, scaled_tokens: bool) -> str | None:
    """The frozen kind a position table's shape and use match, else ``None`` (module docstring)."""
    width = int(graph.tensors[table.table].shape[1])
    readers = [graph.ops[e.consumer] for e in graph.edges if e.producer == table.op]
    if token_width is not None and width < token_width and readers and all(r.kind == "slice" for r in readers):
        return "one head wide and split into halves, RoFormer's rotary sines and cosines"
    if table.first_row == 0 and scaled_tokens and width == token_width:
        return "looked up from row 0 and added to token embeddings scaled by a constant, Marian's and Pegasus' sinusoids"
    return None


def frozen_table_note(graph: OpGraph) -> str | None:
    """One warning naming the position tables that match a kind common libraries freeze, ``None`` when none do.

    The token embedding is the embedding op of the most rows that is not a position table; its lookup is
    scaled when its op multiplies (``Mul`` among its node types: ``embed_scale``).
    """
    from importers.position_table import position_tables

    tables = position_tables(graph)
    if not tables:
        return None
    positions = {t.op for t in tables}
    tokens = [op for i, op in enumerate(graph.ops) if op.kind == "embedding" and i not in positions and op.inputs
              and len(graph.tensors[op.inputs[0].tensor].shape) == 2]
    rows = max((graph.tensors[op.inputs[0].tensor].shape[0] for op in tokens), default=0)
    vocab = [op for op in tokens if graph.tensors[op.inputs[0].tensor].shape[0] == rows]
    width = int(graph.tensors[vocab[0].inputs[0].tensor].shape[1]) if vocab else None
    scaled = bool(vocab) and all("Mul" in op.node_types for op in vocab)
    found = [(t, why) for t in tables if (why := _why_frozen(graph, t, width, scaled)) is not None]
    if not found:
        return None
    count = sum(t.rows * int(graph.tensors[t.table].shape[1]) for t, _ in found)
    names = ", ".join(f"{t.table!r} {list(graph.tensors[t.table].shape)}" for t, _ in found)
    kinds = "; ".join(dict.fromkeys(why for _, why in found))
    return (f"position table(s) {names} are counted as trained ({count:,} parameters), but they match tables "
            f"common libraries freeze ({kinds}); a file cannot tell a frozen table from a learned one (both are "
            f"named initializers gathered at positions), so if the model freezes them its trained count is "
            f"{count:,} lower")
