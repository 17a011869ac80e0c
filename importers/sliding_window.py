r"""Sliding-window attention's window, read from a model file.

transformers' masks (``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``,
Mistral, Gemma-2/3, Qwen2's ``use_sliding_window``) let query :math:`q` see the keys
:math:`q - W < k \le q`: :math:`W` tokens, itself included. Both torch exporters write it as a
comparison of the key positions with the query positions minus a scalar constant,
``Greater(kv, Sub(q, W))`` (TorchScript and dynamo alike); :mod:`importers.attention_masks` classes
that mask ``causal`` (each query sees its own set of keys) without saying which set. A launcher
whose attention sees every earlier token trains another model once the sequence is longer than
:math:`W`, so the exporters that build the attention ask here (:func:`sliding_windows`). The query side
``q`` must count positions (a ``Range`` or ``CumSum`` among its producers, ``Shape`` ops not walked: sizes
are not positions), as transformers' ``cache_position`` does: Swin's shifted-window slices
(TorchScript: ``GreaterOrEqual(Range(..), Sub(size, shift))``) compare indices with a *size* minus a
constant, and are no window.

Which attentions a window masks (:func:`softmax_windows`, kept per graph as
:attr:`planner.core.graph.OpGraph.attention_windows`): the ``Softmax`` nodes the comparison's output
reaches without passing through another ``Softmax`` (the mask enters each layer's scores; a path
through an earlier layer's probabilities is that layer's, not this one's). Gemma-2 masks every other
layer, Gemma-3 five of six (transformers' ``layer_types``), Qwen2 the layers from ``max_window_layers`` on
(``use_sliding_window``), Mistral every layer.

A window whose width the file does not hold (:func:`window_unread`): a graph-only dynamo export saved
with every initializer external (``size_threshold=0``, the zoo's ``bare`` style) writes :math:`W` as a
scalar initializer (``Sub(q, val_N)``, ``val_N`` an ``INT64`` of dims ``[]``) and its data file goes
with the weights, so the comparison is there and its width is not (TorchScript keeps :math:`W` in a
``Constant`` node, read either way). Such a model is windowed, by how much no one can say: it is
priced as causal attention (its softmaxes are not in :func:`softmax_windows`), and a launcher that
builds the attention from flags refuses it, since it cannot prove full causal attention nor write the
window (:mod:`exporters.megatron.window`, :mod:`exporters.torchtitan.families`).

Two-sided windows (:func:`softmax_bands`, kept per graph as :attr:`planner.core.graph.OpGraph.attention_bands`):
an encoder's local attention lets query :math:`q` see the keys :math:`|q - k| \le w` on both sides, :math:`2 w + 1`
of them (transformers' ``sliding_window_bidirectional_overlay``: ``abs(q_idx - kv_idx) <= sliding_window``,
ModernBERT's local layers with ``sliding_window = local_attention // 2``; Longformer's sliding window, Beltagy et
al. 2020, arXiv:2004.05150, section 3.1, ``w / 2`` on each side). Both torch exporters write it as
``LessOrEqual(Abs(Sub(q, kv)), w)`` with both operands of the ``Sub`` counting positions (a ``Range`` among their
producers, as above); ``Less(Abs(..), w)`` is the half-width :math:`w - 1`, and the mirrored
``GreaterOrEqual``/``Greater(w, Abs(..))`` read the same. Which softmaxes it masks: as above, but not through a
gather's indices: T5's relative-position buckets compare ``Abs(k - q)`` with a constant too (``is_small``), to pick
the row of a bias table, which masks nothing. A half-width whose
constant the file does not hold (the ``bare`` style again: :func:`band_unread_in`) leaves those attentions
priced over every key, said once in :data:`UNREAD_BAND_NOTE`.
"""

from __future__ import annotations


import numpy as np

from importers.onnx_facts import OnnxFacts, Scalar, facts_of_model, per_reading

__all__ = ["UNREAD_BAND_NOTE", "UNREAD_WINDOW_NOTE", "band_unread_in", "sliding_windows", "softmax_bands", "softmax_windows",
           "window_unread", "window_unread_in"]

_COMPARISONS = {"Greater": 1, "GreaterOrEqual": 1, "Less": 0, "LessOrEqual": 0}
"""Comparison op type -> the operand that is ``q - W`` in ``kv > q - W`` (``Less``: ``q - W < kv``)."""

_BAND_COMPARISONS = {"LessOrEqual": (0, 0), "Less": (0, 1), "GreaterOrEqual": (1, 0), "Greater": (1, 1)}
"""Comparison op type -> (the operand that is ``|q - kv|``, what to subtract from the constant to get the
half-width): ``|q - kv| <= w`` and ``w >= |q - kv|`` are :math:`w`, ``|q - kv| < w`` and ``w > |q - kv|``
:math:`w - 1` (:func:`softmax_bands`)."""

_MAX_POSITION_LINEAGE = 400
"""Producers walked back from ``q`` to find its ``Range``: transformers' mask functions reach it within
about 20 (the zoo's Mistral, dynamo: ``GatherND(Expand(Unsqueeze(Range)))``); :mod:`importers.attention_masks`
walks a whole mask's lineage within 4,000."""


_UNREAD = 0
"""The width of a window whose scalar the file does not hold (:func:`_window`): no read window is
0 tokens wide (each query sees itself)."""


def _window(scalar: Scalar) -> int | None:
    """The width a one-element constant (:attr:`importers.onnx_facts.OnnxFacts.scalars`) gives, if a
    positive whole number; :data:`_UNREAD` for one whose data is external, which
    :func:`importers.onnx_load.load_onnx` leaves so only when the data file is not there (it inlines
    small integer tensors whose file is); ``None`` otherwise."""
    if scalar.value is None:
        return _UNREAD
    value = scalar.value
    return int(value) if np.isfinite(value) and value >= 1 and value == int(value) else None


UNREAD_WINDOW_NOTE = (
    "the attention masks keys with a sliding window whose width the file does not hold (a graph-only export saved "
    "every initializer external, the window's constant too): priced as causal attention, and Megatron-LM and "
    "torchtitan, which would build full causal attention, refuse it; save small constants inline "
    "(onnx.save(..., size_threshold=1024)) or keep the external-data file beside it"
)
"""The importer's warning for a file with :func:`window_unread_in` (one line)."""


@per_reading
def _file_windows(facts: OnnxFacts) -> tuple[int, ...]:
    """The distinct widths (sorted) of the file's ``kv > q - W`` comparisons, :data:`_UNREAD` among
    them, once per reading of the file (:func:`~importers.onnx_facts.per_reading`)."""
    return tuple(sorted({w for _, w in _comparisons(facts)}))


def window_unread_in(model) -> bool:
    """:func:`window_unread` of a loaded ``onnx.ModelProto`` (as :func:`importers.onnx_load.load_onnx`
    returns it: small integer tensors whose data file is there already inlined)."""
    return any(w == _UNREAD for _, w in _comparisons(facts_of_model(model)))


def sliding_windows(path: str, sha256: str = "") -> tuple[int, ...]:
    """The distinct windows :math:`W` (sorted) of the file's ``kv > q - W`` comparisons (module
    docstring) whose width the file holds; ``()`` when it has none. ``sha256`` (the graph's hash of
    the file) keys the cache.

    Examples
    --------
    >>> import tempfile
    >>> import onnx
    >>> from onnx import TensorProto as T, helper
    >>> nodes = [helper.make_node("Range", ["a", "n", "d"], ["q"]),  # the query positions (torch.arange)
    ...          helper.make_node("Constant", [], ["w"], value=helper.make_tensor("w", T.INT64, [], [64])),
    ...          helper.make_node("Sub", ["q", "w"], ["start"]), helper.make_node("Greater", ["k", "start"], ["m"])]
    >>> ints = [helper.make_tensor_value_info(n, T.INT64, d) for n, d in (("k", [8]), ("a", []), ("n", []), ("d", []))]
    >>> graph = helper.make_graph(nodes, "g", ints, [helper.make_tensor_value_info("m", T.BOOL, [8])])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(helper.make_model(graph), d + "/m.onnx")
    ...     print(sliding_windows(d + "/m.onnx"))
    (64,)
    """
    return tuple(w for w in _file_windows(path, sha256) if w != _UNREAD)


def window_unread(path: str, sha256: str = "") -> bool:
    """Whether the file has a ``kv > q - W`` comparison whose :math:`W` it does not hold (module
    docstring: a dynamo export saved with every initializer external and its data file gone).

    Examples
    --------
    >>> import tempfile
    >>> import onnx
    >>> from onnx import TensorProto as T, helper
    >>> w = helper.make_tensor("w", T.INT64, [], [0])  # its value then moved out, as size_threshold=0 saves it
    >>> w.ClearField("int64_data"); w.data_location = T.EXTERNAL
    >>> _ = w.external_data.add(key="location", value="gone.data")
    >>> nodes = [helper.make_node("Range", ["a", "n", "d"], ["q"]), helper.make_node("Sub", ["q", "w"], ["start"]),
    ...          helper.make_node("Greater", ["k", "start"], ["m"])]
    >>> ints = [helper.make_tensor_value_info(n, T.INT64, d) for n, d in (("k", [8]), ("a", []), ("n", []), ("d", []))]
    >>> graph = helper.make_graph(nodes, "g", ints, [helper.make_tensor_value_info("m", T.BOOL, [8])], [w])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(helper.make_model(graph), d + "/m.onnx")
    ...     print(window_unread(d + "/m.onnx"), sliding_windows(d + "/m.onnx"))
    True ()
    """
    return _UNREAD in _file_windows(path, sha256)


def _comparisons(facts: OnnxFacts) -> list:
    """``[(comparison node, W)]`` of the graph's ``kv > q - W`` comparisons (module docstring);
    ``W`` is :data:`_UNREAD` where the file does not hold it."""
    scalars = {name: w for name, scalar in facts.scalars.items() if (w := _window(scalar)) is not None}
    writer = facts.producer
    found = []
    for node in facts.nodes:
        side = _COMPARISONS.get(node.op_type)
        if side is None or len(node.input) != 2:
            continue
        start = writer.get(node.input[side])
        if (start is not None and start.op_type == "Sub" and len(start.input) == 2 and start.input[1] in scalars
                and _counts_positions(start.input[0], writer)):
            found.append((node, scalars[start.input[1]]))
    return found


def _bands(facts: OnnxFacts) -> list:
    """``[(comparison node, w)]`` of the graph's ``|q - kv| <= w`` comparisons (module docstring, two-sided
    windows); ``w`` is :data:`_UNREAD` where the file does not hold it."""
    writer = facts.producer
    found = []
    for node in facts.nodes:
        sides = _BAND_COMPARISONS.get(node.op_type)
        if sides is None or len(node.input) != 2:
            continue
        distance, below = sides
        width = _window(facts.scalars[node.input[1 - distance]]) if node.input[1 - distance] in facts.scalars else None
        absolute = writer.get(node.input[distance])
        difference = writer.get(absolute.input[0]) if absolute is not None and absolute.op_type == "Abs" else None
        if (width is None or difference is None or difference.op_type != "Sub" or len(difference.input) != 2
                or not all(_counts_positions(name, writer) for name in difference.input)):
            continue
        found.append((node, width if width == _UNREAD else width - below))
    return found


def band_unread_in(model) -> bool:
    """Whether a loaded ``onnx.ModelProto`` has a ``|q - kv| <= w`` comparison whose :math:`w` it does not hold
    (module docstring: a two-sided window priced over every key)."""
    facts = facts_of_model(model)
    return any(w == _UNREAD and _reach(facts.readers, node, lookups=False) for node, w in _bands(facts))


UNREAD_BAND_NOTE = (
    "the attention masks keys with a two-sided window (|q - k| <= w, an encoder's local attention) whose width the "
    "file does not hold (a graph-only export saved every initializer external, the window's constant too): those "
    "attentions are priced over every key; save small constants inline (onnx.save(..., size_threshold=1024)) or "
    "keep the external-data file beside it"
)
"""The importer's warning for a file with :func:`band_unread_in` (one line)."""


def softmax_bands(model) -> dict[str, int]:
    """``{Softmax node name: w}`` of the attentions a two-sided window ``|q - kv| <= w`` masks (module
    docstring: each query sees the :math:`2 w + 1` keys within :math:`w` of it); a softmax two widths reach,
    or a width the file does not hold, is left out. ``model``: an ``onnx.ModelProto``.

    Examples
    --------
    >>> from onnx import TensorProto as T, helper
    >>> nodes = [helper.make_node("Range", ["a", "n", "d"], ["pos"]),  # ModernBERT's local layers, w = 2
    ...          helper.make_node("Unsqueeze", ["pos", "ax1"], ["q"]), helper.make_node("Unsqueeze", ["pos", "ax0"], ["k"]),
    ...          helper.make_node("Sub", ["q", "k"], ["diff"]), helper.make_node("Abs", ["diff"], ["dist"]),
    ...          helper.make_node("Constant", [], ["w"], value=helper.make_tensor("w", T.INT64, [], [2])),
    ...          helper.make_node("LessOrEqual", ["dist", "w"], ["m"]),
    ...          helper.make_node("Where", ["m", "s", "ninf"], ["masked"]),
    ...          helper.make_node("Softmax", ["masked"], ["p"], name="local")]
    >>> inits = [helper.make_tensor(n, T.INT64, [1], [v]) for n, v in (("ax0", 0), ("ax1", 1))]
    >>> ints = [helper.make_tensor_value_info(n, T.INT64, []) for n in ("a", "n", "d")]
    >>> floats = [helper.make_tensor_value_info(n, T.FLOAT, [8, 8]) for n in ("s", "ninf")]
    >>> graph = helper.make_graph(nodes, "g", ints + floats, [helper.make_tensor_value_info("p", T.FLOAT, [8, 8])], inits)
    >>> softmax_bands(helper.make_model(graph)), softmax_windows(helper.make_model(graph))
    ({'local': 2}, {})
    """
    facts = facts_of_model(model)
    return _softmaxes_reached(facts, _bands(facts), lookups=False)


def _counts_positions(value: str, writer: dict) -> bool:
    """Whether ``value``'s producers hold a ``Range`` or ``CumSum`` (positions), not walking past
    ``Shape``/``Size`` (sizes), within :data:`_MAX_POSITION_LINEAGE` values."""
    stack, seen = [value], set()
    while stack and len(seen) < _MAX_POSITION_LINEAGE:
        name = stack.pop()
        node = writer.get(name)
        if name in seen or node is None or node.op_type in ("Shape", "Size"):
            continue
        seen.add(name)
        if node.op_type in ("Range", "CumSum"):
            return True
        stack.extend(i for i in node.input if i)
    return False


def softmax_windows(model) -> dict[str, int]:
    """``{Softmax node name: W}`` of the attentions a ``kv > q - W`` comparison masks (module
    docstring); a softmax two windows reach is left out (no one window says it). ``model``: an
    ``onnx.ModelProto``.

    Examples
    --------
    >>> from onnx import TensorProto as T, helper
    >>> nodes = [helper.make_node("Range", ["a", "n", "d"], ["q"]),
    ...          helper.make_node("Constant", [], ["w"], value=helper.make_tensor("w", T.INT64, [], [4])),
    ...          helper.make_node("Sub", ["q", "w"], ["start"]), helper.make_node("Greater", ["k", "start"], ["m"]),
    ...          helper.make_node("Where", ["m", "s", "ninf"], ["masked"]),
    ...          helper.make_node("Softmax", ["masked"], ["p0"], name="sm0"),
    ...          helper.make_node("Add", ["p0", "s"], ["s1"]), helper.make_node("Softmax", ["s1"], ["p1"], name="sm1")]
    >>> ints = [helper.make_tensor_value_info(n, T.INT64, d) for n, d in (("k", [8]), ("a", []), ("n", []), ("d", []))]
    >>> floats = [helper.make_tensor_value_info(n, T.FLOAT, [8]) for n in ("s", "ninf")]
    >>> graph = helper.make_graph(nodes, "g", ints + floats, [helper.make_tensor_value_info("p1", T.FLOAT, [8])])
    >>> softmax_windows(helper.make_model(graph))  # sm1 sees the mask only through sm0's probabilities
    {'sm0': 4}
    """
    facts = facts_of_model(model)
    return _softmaxes_reached(facts, _comparisons(facts))


_LOOKUPS = frozenset({"Gather", "GatherND", "GatherElements"})


def _reach(readers: dict[str, list], comparison, *, lookups: bool = True) -> set[str]:
    """The softmaxes ``comparison``'s output reaches without passing through another softmax; with ``lookups``
    off, not as the indices of a gather either: a comparison that only picks table rows is no mask (T5's
    relative-position buckets: ``Less(Abs(k - q), max_exact)`` chooses a bucket, the bias is gathered by it)."""
    stack, seen, found = list(comparison.output), set(), set()
    while stack:
        value = stack.pop()
        for reader in readers.get(value, ()):
            if id(reader) in seen or (not lookups and reader.op_type in _LOOKUPS and value in reader.input[1:]):
                continue
            seen.add(id(reader))
            if reader.op_type == "Softmax":  # this attention's mask; beyond it is the next layer's input
                found.add(reader.name)
            else:
                stack.extend(reader.output)
    return found


def _softmaxes_reached(facts: OnnxFacts, comparisons: list, *, lookups: bool = True) -> dict[str, int]:
    """``{Softmax node name: width}`` of the softmaxes each ``(comparison node, width)`` reaches (:func:`_reach`);
    a softmax two widths reach is left out, and so is an :data:`_UNREAD` width (priced over every key; the
    launchers refuse it through :func:`window_unread`)."""
    reached: dict[str, set[int]] = {}
    for comparison, window in comparisons:
        if window == _UNREAD:
            continue
        for name in _reach(facts.readers, comparison, lookups=lookups):
            reached.setdefault(name, set()).add(window)
    return {name: next(iter(ws)) for name, ws in reached.items() if len(ws) == 1}
