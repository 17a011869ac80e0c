r"""A position bias added to attention scores as a constant table (MPT's folded ALiBi; issue 25).

MPT builds its ALiBi bias once, ``slopes[h] * arange(1 - max_seq_len, 1)``, laid out ``[h, 1, max_seq_len]``
(transformers 5.24's ``build_mpt_alibi_tensor``), and each attention adds the last ``keys`` columns of it
to its scores. Both torch exporters fold that computation to a constant (the dynamo exporter's
``squeeze`` initializer, TorchScript's ``Constant``), so the ``Range`` that :func:`importers.attention_masks.
attention_biases` looks for is gone. A side input of the scores that is such a table, reached through
views and slices alone (:data:`_TABLE_VIEWS`), is read here:

* its shape is ``[h, 1, k]`` or ``[1, h, 1, k]`` (``h > 1`` heads, ``k > 1`` key positions): per head,
  per key, the same for every query, as a position bias and no mask is (a padding mask is per sample,
  a causal one per query);
* its values, when the file holds them, are linear in the key position per head (ALiBi: a slope times
  the position plus a per-head constant); a table whose values are not linear is not read as ALiBi.
  A graph-only file whose table is external has no values to check: the table is still a per-head bias
  per key position, which no flash kernel without ALiBi support takes, so it is read as ALiBi
  (:data:`UNREAD`);
* its width ``k`` is the longest sequence the model places: the attention slices the table's last
  ``keys`` columns, and past ``k`` the model as exported cannot run (transformers' MPT fails to broadcast
  a 512-wide table over 2,048 keys). :func:`bias_reach_error` says so in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

__all__ = ["BiasTable", "bias_table", "bias_reach_error", "UNREAD"]

_TABLE_VIEWS = frozenset({"Slice", "Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Expand"})
"""Ops between the table and the scores' ``Add`` that keep the table's values (their first input)."""
_MAX_HOPS = 12  # MPT's two exports: Slice, Slice (dynamo and TorchScript alike)
_HALF_TYPES = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})

_SEQUENCE_LIKE = re.compile(r"seq|len|tok|pos|key|time", re.IGNORECASE).search
"""A dim name that says sequence (``seq``, ``seq_len``, ``tokens``): named first when sizes tie."""

UNREAD = "unread"
""":attr:`BiasTable.values`' answer when the file does not hold the table's values."""


@dataclass(frozen=True, slots=True)
class BiasTable:
    """A constant per-head, per-key bias table added to the scores (module docstring)."""

    name: str
    """The constant's value name in the file."""
    heads: int
    keys: int
    """The table's key positions: the longest sequence it covers."""
    values: str
    """``linear`` (ALiBi's), ``other`` (not linear in the key position), or :data:`UNREAD`."""


def bias_table(
    side: str, producer: Mapping[str, onnx.NodeProto], constants: Mapping[str, onnx.TensorProto]
) -> BiasTable | None:
    """The constant table ``side`` (a side input of the scores) is a view or slice of, when it is laid out
    per head and per key (module docstring); ``constants``: value name -> tensor of the file's initializers
    and ``Constant`` outputs.

    Examples
    --------
    >>> slopes = np.array([0.5, 0.25])[:, None, None] * np.arange(-3, 1)[None, None, :]
    >>> table = numpy_helper.from_array(slopes.astype(np.float32), "alibi")
    >>> bias_table("alibi", {}, {"alibi": table})
    BiasTable(name='alibi', heads=2, keys=4, values='linear')
    """
    value = side
    for _ in range(_MAX_HOPS):
        node = producer.get(value)
        if node is None or node.op_type == "Constant":
            break
        if node.op_type not in _TABLE_VIEWS or not node.input:
            return None
        value = node.input[0]
    tensor = constants.get(value)
    if tensor is None:
        return None
    dims = list(tensor.dims)
    while len(dims) > 3 and dims[0] == 1:
        dims.pop(0)
    if len(dims) != 3 or dims[0] <= 1 or dims[1] != 1 or dims[2] <= 1:
        return None
    return BiasTable(name=value, heads=dims[0], keys=dims[2], values=_linearity(tensor, dims[0], dims[2]))


def _linearity(tensor: onnx.TensorProto, heads: int, keys: int) -> str:
    """``linear`` when every head's row is ``slope * position + constant`` (to the dtype's rounding),
    ``other`` when not, :data:`UNREAD` when the file does not hold the values."""
    if tensor.data_location == TensorProto.EXTERNAL or tensor.external_data:
        return UNREAD
    try:
        rows = numpy_helper.to_array(tensor).astype(np.float64).reshape(heads, keys)
    except (ValueError, TypeError):  # no data at all (a graph-only file that cleared it)
        return UNREAD
    # second differences of a line are zero; rounding leaves a few ulps of the largest value
    eps = 2.0**-7 if tensor.data_type in _HALF_TYPES else 2.0**-20
    tolerance = 4 * eps * max(float(np.abs(rows).max()), 1.0)
    return "linear" if np.abs(np.diff(rows, n=2, axis=1)).max(initial=0.0) <= tolerance else "other"


def bias_reach_error(
    tables: Mapping[str, BiasTable], key_lengths: Mapping[str, int], bindings: Mapping[str, int]
) -> str | None:
    """The one-line refusal when an attention's keys run past its bias table, ``None`` when all fit.

    ``tables``: softmax name -> its bias table; ``key_lengths``: softmax name -> keys at the bound dims;
    ``bindings``: the ``--dim`` bindings, to name the dim that sets the keys.

    >>> t = BiasTable(name="alibi", heads=8, keys=512, values="unread")
    >>> bias_reach_error({"sm": t}, {"sm": 2048}, {"batch": 64, "seq": 2048})
    "the model's position bias covers 512 tokens (alibi, 8 heads x 512 key positions); --dim seq=2048 is past it: plan with --dim seq=512 or less, or re-export the model with a longer bias table (MPT's max_seq_len)"
    >>> bias_reach_error({"sm": t}, {"sm": 600}, {"batch": 600, "seq": 600}).split("; ")[1][:19]
    '--dim seq=600 is pa'
    >>> bias_reach_error({"sm": t}, {"sm": 512}, {"seq": 512}) is None
    True
    """
    for softmax, table in tables.items():
        keys = key_lengths.get(softmax)
        if keys is None or keys <= table.keys:
            continue
        # the dim bound to the key length; where another (the batch) has the same size, a sequence-like name
        dims = sorted((name for name, size in bindings.items() if size == keys), key=lambda n: not _SEQUENCE_LIKE(n))
        dim = dims[0] if dims else None
        given = f"--dim {dim}={keys}" if dim else f"a sequence of {keys} keys"
        fix = f"--dim {dim}={table.keys}" if dim else f"a sequence of {table.keys} tokens"
        return (f"the model's position bias covers {table.keys} tokens ({table.name}, {table.heads} heads x "
                f"{table.keys} key positions); {given} is past it: plan with {fix} or less, or re-export the "
                "model with a longer bias table (MPT's max_seq_len)")
    return None
