r"""Rotary position embeddings' frequencies, read from a model file.

A rotary embedding (Su et al. 2021, "RoFormer", eq. 15) rotates pairs of a head's channels by the
angles :math:`p\,\theta_i`, :math:`\theta_i = b^{-2i/d}` for :math:`i = 0 \ldots d/2 - 1`, where
:math:`b` is the base (10,000 in RoFormer and Llama 2; 500,000 in Llama 3; 1,000,000 in Qwen2) and
:math:`d` the rotated channels (the head dim, or a fraction of it: GPT-NeoX's ``rotary_pct``).
Exporters write :math:`\theta` as a constant (Hugging Face's ``inv_freq`` buffer): a 1-D float
tensor of :math:`n = d/2` values that starts at 1 and falls geometrically, so
:math:`\log\theta_i = -(i/n)\log b`. A graph-only file whose constants were stripped has none (``None``);
frequencies that are not geometric (Llama 3.1's piecewise rope scaling) are reported as such.

The answer is kept per reading of the file (:func:`importers.onnx_facts.per_reading`: its SHA-256 when
the caller has it, else its size and modification time), so a file rewritten in place is read again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from importers.onnx_facts import OnnxFacts, per_reading

__all__ = ["RotaryFrequencies", "rotary_frequencies"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RotaryFrequencies:
    """The rotary frequencies a model file holds."""

    pairs: int
    """Channel pairs rotated per head (:math:`d / 2`)."""
    geometric: bool
    """The frequencies fall geometrically from 1 (plain RoPE); ``False``: a scaled variant."""
    base: float | None
    """:math:`b` (``None`` unless ``geometric``)."""


def _candidates(facts: OnnxFacts) -> list[tuple[str, np.ndarray]]:
    """``(name, values)`` of the 1-D float constants that start at 1 and fall strictly: the shape of
    an ``inv_freq`` (initializers with their data in the file, and ``Constant`` nodes)."""
    tensors: list[tuple[str, onnx.TensorProto]] = [(t.name, t) for t in facts.initializers if not t.external_data]
    for node in facts.nodes:
        if node.op_type == "Constant":
            tensors += [(node.output[0], a.t) for a in node.attribute if a.name == "value" and a.t.dims]
    found = []
    for name, tensor in tensors:
        if len(tensor.dims) != 1 or not 2 <= tensor.dims[0] <= 4096 or tensor.data_type not in (1, 10, 11, 16):
            continue
        values = numpy_helper.to_array(tensor).astype(np.float64)
        if values.size and abs(values[0] - 1.0) < 1e-6 and np.all(values > 0) and np.all(np.diff(values) < 0):
            found.append((name, values))
    return found


def rotary_frequencies(path: str | Path, sha256: str = "") -> RotaryFrequencies | None:
    """The rotary frequencies of the model at ``path``: the one ``inv_freq``-shaped constant (a name
    saying ``inv_freq`` or ``rotary`` wins when there are several), or ``None`` when the file holds
    none or several that disagree. ``sha256`` (the op graph's hash of the file,
    ``OpGraph.source_sha256``; "" unknown) says which version of the file is meant.

    Examples
    --------
    >>> import tempfile
    >>> from onnx import helper, TensorProto as T
    >>> theta = (500000.0 ** (-np.arange(0, 16, 2) / 16)).astype(np.float32)
    >>> const = helper.make_node("Constant", [], ["f"], value=numpy_helper.from_array(theta))
    >>> y = helper.make_tensor_value_info("f", T.FLOAT, [8])
    >>> model = helper.make_model(helper.make_graph([const], "g", [], [y]), opset_imports=[helper.make_opsetid("", 18)])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(model, d + "/m.onnx")
    ...     found = rotary_frequencies(d + "/m.onnx")
    >>> found.pairs, found.geometric, round(found.base)
    (8, True, 500000)
    """
    return _frequencies(path, sha256)


@per_reading
def _frequencies(facts: OnnxFacts) -> RotaryFrequencies | None:
    """:func:`rotary_frequencies` of one reading of a file."""
    found = _candidates(facts)
    named = [c for c in found if "inv_freq" in c[0] or "rotary" in c[0]]
    chosen = named or found
    if not chosen or any(len(v) != len(chosen[0][1]) or not np.allclose(v, chosen[0][1]) for _, v in chosen[1:]):
        return None
    values = chosen[0][1]
    ratios = values[1:] / values[:-1]
    geometric = bool(np.allclose(ratios, ratios[0], rtol=1e-3))
    # log theta_i = -(i / n) log b: the slope over every frequency (one fp32 value raised to the n-th
    # power would carry its rounding n times)
    slope = np.polyfit(np.arange(len(values)), np.log(values), 1)[0]
    base = float(np.exp(-slope * len(values))) if geometric else None
    if base is not None and abs(base - round(base)) <= 1e-3 * base:
        base = float(round(base))  # fp32 frequencies: 499999.97 is 500,000
    return RotaryFrequencies(pairs=len(values), geometric=geometric, base=base)
