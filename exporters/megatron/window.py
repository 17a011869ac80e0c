r"""Sliding-window attention as Megatron-LM's flags, or the one-line reason it cannot be said (issue 25).

The file's window (:mod:`importers.sliding_window`, per attention in
:attr:`planner.core.graph.OpGraph.attention_windows`) lets query :math:`q` see keys
:math:`q - W < k \le q`. Megatron-LM says it with two flags (``megatron/training/arguments.py``,
``_add_network_size_args``: ``--window-size`` of ``tuple_type``, "1,2" -> (1, 2);
``--window-attn-skip-freq`` of ``moe_freq_type``) into megatron-core 0.16.1's
``TransformerConfig.window_size: Optional[Tuple[int, int]]`` (left, right; -1 is infinite) and
``window_attn_skip_freq``:

* ``window_size = (W - 1, 0)``: megatron-core's local path masks with
  ``get_sliding_window_causal_mask(sq, skv, window_size)`` (``transformer/utils.py``: keeps
  ``triu(diagonal=skv - sq - left)`` and ``tril(diagonal=skv - sq + right)``, so key :math:`k` with
  :math:`q - (W - 1) \le k \le q`: :math:`W` keys, itself included, and none after it), and
  TransformerEngine's ``DotProductAttention(window_size=...)`` (TE >= 1.2, asserted in
  ``extensions/transformer_engine.py``) takes FlashAttention's same (left, right) convention.
* which layers: ``is_layer_window_attention`` (``transformer/utils.py``) windows every layer when
  ``window_attn_skip_freq`` is ``None``, with an integer :math:`N` the layers whose 1-based number
  is not a multiple of :math:`N` (Gemma-2: :math:`N = 2`, Gemma-3: :math:`N = 6`, transformers'
  ``layer_types``), and with a list the layers whose entry (``list[layer_number - 1]``) is true.
  Megatron-LM's ``moe_freq_type`` reads the list from a Python list expression of digits, commas,
  brackets, ``+`` and ``*`` (``_eval_pattern``; its help: "1 indicates SWA and 0 indicates full
  attention"), one entry per layer; the export writes it run-length, ``[0]*1+[1]*2`` for Qwen2's
  ``max_window_layers = 1`` of 3 layers (``layer_types``: ``sliding_attention`` from layer index
  ``max_window_layers`` on), where no :math:`N` says the pattern. The layer number is global (the
  pipeline offset added), so a pipeline split does not move the pattern.

Refused in one line: layers of different windows (one ``window_size`` for the model), a window read
from the file whose layers the exporter cannot match to its attentions, and a window whose width the
file does not hold (:func:`importers.sliding_window.window_unread`: a dynamo graph-only file saved
with every initializer external; full causal attention would be another model and the width cannot
be written). ``transformer_config.__post_init__`` 0.16.1 checks neither field,
and context parallelism is exported with ``--cp-comm-type all_gather``, the exchange TransformerEngine
runs sliding windows with (``attn_forward_func_with_cp`` in
``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py`` asserts a2a or all_gather).
"""

from __future__ import annotations

from pathlib import Path

from importers.sliding_window import window_unread
from importers.transformer import TransformerModel
from planner.core.errors import UnsupportedExport
from planner.core.graph import OpGraph

__all__ = ["layer_windows", "unread_window_refusal", "window_refusal", "megatron_window_args"]


def layer_windows(graph: OpGraph, model: TransformerModel) -> tuple[int | None, ...]:
    """Per attention layer (in graph order), the file's sliding window, ``None`` for full causal
    attention; ``()`` when the file has no window."""
    windows = graph.attention_windows
    if not windows:
        return ()
    found = []
    for block in model.attention:
        op = graph.ops[block.softmax]
        found.append(next((windows[n] for n in op.onnx_nodes or (op.name,) if n in windows), None))
    return tuple(found)


def _skip_freq(layers: tuple[int | None, ...]) -> int | None:
    """The smallest :math:`N \\ge 2` whose ``layer_number % N != 0`` windows exactly ``layers``, else ``None``."""
    for n in range(2, len(layers) + 2):
        if all((w is not None) == ((i + 1) % n != 0) for i, w in enumerate(layers)):
            return n
    return None


def _skip_pattern(layers: tuple[int | None, ...]) -> str:
    """Megatron-LM's list form of ``--window-attn-skip-freq`` for ``layers`` (1: windowed, 0: full),
    run-length: ``(w, w, None, None, w)`` -> ``[1]*2+[0]*2+[1]*1`` (only ``_eval_pattern``'s
    characters, and a list of one entry per layer when evaluated).

    Examples
    --------
    >>> _skip_pattern((None, 8, 8))
    '[0]*1+[1]*2'
    """
    runs: list[list[int]] = []
    for w in layers:
        bit = int(w is not None)
        if runs and runs[-1][0] == bit:
            runs[-1][1] += 1
        else:
            runs.append([bit, 1])
    return "+".join(f"[{bit}]*{count}" for bit, count in runs)


def unread_window_refusal(graph: OpGraph) -> str:
    """Why a launcher that builds causal attention from flags cannot run the file: a sliding window
    whose width it does not hold (module docstring), or ""."""
    path = graph.source_path
    if not (path and Path(path).is_file() and window_unread(path, graph.source_sha256)):
        return ""
    return ("it attends within a sliding window whose width the file does not hold (a graph-only export "
            "saved every initializer external, the window's constant too); export it with its small constants "
            "inline (onnx.save(..., size_threshold=1024)) or keep its external-data file beside it")


def window_refusal(graph: OpGraph, model: TransformerModel) -> str:
    """Why Megatron-LM's window flags cannot say the file's windows (module docstring), or ""."""
    unread = unread_window_refusal(graph)
    if unread:
        return unread
    layers = layer_windows(graph, model)
    if not layers:
        return ""
    if len(graph.attention_windows) > len(model.attention) or not any(w is not None for w in layers):
        return (f"it attends within a sliding window the exporter cannot place on its {len(model.attention)} "
                "attention layers")
    sizes = sorted({w for w in layers if w is not None})
    if len(sizes) > 1:
        return (f"its layers attend within different sliding windows ({', '.join(map(str, sizes))} tokens) and "
                "Megatron-LM's --window-size is one for the model")
    return ""


def megatron_window_args(graph: OpGraph, model: TransformerModel) -> list[str]:
    """``--window-size W-1,0`` and, where some layers attend fully, ``--window-attn-skip-freq``: an
    integer :math:`N` where every :math:`N`-th layer is the full one, else the per-layer list
    (:func:`_skip_pattern`); ``[]`` without a window (module docstring).

    Raises
    ------
    UnsupportedExport
        :func:`window_refusal`'s reason.
    """
    problem = window_refusal(graph, model)
    if problem:
        raise UnsupportedExport("Megatron-LM would train a different model: " + problem)
    layers = layer_windows(graph, model)
    if not layers:
        return []
    window = next(w for w in layers if w is not None)
    args = ["--window-size", f"{window - 1},0"]
    if None in layers:
        freq = _skip_freq(layers)
        args += ["--window-attn-skip-freq", str(freq) if freq is not None else _skip_pattern(layers)]
    return args
