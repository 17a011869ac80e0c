r"""Rotary position embeddings' frequencies, read from a model file.

A rotary embedding (Su et al. 2021, "RoFormer", eq. 15) rotates pairs of a head's channels by the
angles :math:`p\,\theta_i`, :math:`\theta_i = b^{-2i/d}` for :math:`i = 0 \ldots d/2 - 1`, where
:math:`b` is the base (10,000 in RoFormer and Llama 2; 500,000 in Llama 3; 1,000,000 in Qwen2) and
:math:`d` the rotated channels (the head dim, or a fraction of it: GPT-NeoX's ``rotary_pct``).
Exporters write :math:`\theta` as a constant (Hugging Face's ``inv_freq`` buffer): a 1-D float
tensor of :math:`n = d/2` values that starts at 1 and falls geometrically, so
:math:`\log\theta_i = -(i/n)\log b`. A graph-only file whose constants were stripped has none (``None``);
frequencies that are not geometric are reported as such, with the Llama 3.1 scaling of a geometric series
that reproduces them where one does (:class:`Llama3Scaling`).

Which attention layers rotate is read from the graph (:func:`rotated_layers`): a rotary embedding multiplies
the queries and keys by cos / sin tables and adds their rotated halves, negated (``rotate_half`` in Hugging
Face's Llama family, ``rotate_every_two`` in GPT-J), so the ops between a layer's Q (K) projection and its score
product hold a ``Neg`` and a ``Mul``; or it writes the rotation out, :math:`(x_1 c - x_2 s,\ x_2 c + x_1 s)`
(GPT-OSS, DeepSeek-V3's interleaved form, a complex product's real and imaginary parts, hand-written rotaries):
a ``Sub`` of two products and an ``Add`` of the two crossed ones, on the same halves and tables
(:func:`_written_rotations`). SmolLM3's NoPE layers (``no_rope_layers``) have neither.

Which channels a rotation pairs is read from the same ``Neg`` (:func:`rotary_pairs`): Llama's ``rotate_half`` pairs
channel :math:`i` with :math:`i + d/2` (``x[..., :d/2]``, ``x[..., d/2:]``, ``cat(-x2, x1)``: the ``Neg`` feeds a
``Concat`` along the channels); GPT-J's ``rotate_every_two`` and ERNIE-4.5's ``rotate_half`` pair :math:`2i` with
:math:`2i + 1` (``x[..., 0::2]``, ``x[..., 1::2]``, ``stack((-x2, x1), -1).flatten(-2)``: the ``Slice`` the ``Neg``
reads steps by 2, and the ``Neg`` feeds an ``Unsqueeze``, a ``Concat`` along the new last axis and a ``Reshape``
that merges it). The two are one model up to a fixed permutation of each head's query and key channels: the same
for training from scratch, not for a checkpoint; a launcher's rotation must still be the file's to be the model
(Megatron-LM's ``--rotary-interleaved``).

Where a layer's QK-norm (:mod:`importers.qk_norm`) sits relative to its rotation is read from the same paths
(:func:`qk_norm_places`): Qwen3, OLMo-2 and Gemma-3 normalise, then rotate (the rotation reads the normed tensor:
the ops between the norm and the score product rotate); HunYuan-V1 (transformers 5.24
``HunYuanMoEV1Attention.forward``: ``apply_rotary_pos_emb``, then ``query_layernorm`` / ``key_layernorm``) rotates,
then normalises (the norm reads the rotated tensor: the ops between the projection and the norm rotate). A per-head
RMSNorm does not commute with a rotation of channel pairs unless its weights are equal within each pair, so the two
orders are different models.

The answer is kept per reading of the file (:func:`importers.onnx_facts.per_reading`: its SHA-256 when
the caller has it, else its size and modification time), so a file rewritten in place is read again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import onnx
from onnx import numpy_helper

from importers.onnx_facts import OnnxFacts, per_reading
from importers.param_role import is_parameter

if TYPE_CHECKING:
    from planner.core.graph import OpGraph

__all__ = ["LLAMA3_DEFAULTS", "Llama3Scaling", "LayerRotation", "QkNormPlace", "RotaryFrequencies", "RotaryPairs",
           "YarnScaling", "llama3_scaled", "qk_norm_places", "rotary_frequencies", "rotary_pairs", "rotated_layers",
           "yarn_scaled"]

LLAMA3_DEFAULTS = (1.0, 4.0, 8192)
"""Llama 3.1's published ``low_freq_factor``, ``high_freq_factor`` and ``original_max_position_embeddings``
(megatron-core 0.16.1 ``RotaryEmbedding._apply_scaling``'s fixed values; torchtitan 0.3.0 ``RoPE.Config``'s defaults)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Llama3Scaling:
    """Llama 3.1's scaling of a geometric rotary series (transformers' ``rope_type: llama3``): frequencies whose
    wavelength :math:`2\\pi/\\theta` is under ``original / high_freq_factor`` are kept, those over
    ``original / low_freq_factor`` divided by ``factor``, and those between interpolated."""

    base: float
    """:math:`b` of the geometric series before scaling."""
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    """Tokens; only ``original / low_freq_factor`` and ``original / high_freq_factor`` (wavelengths) show in the
    frequencies, so the fit keeps the published values where they reproduce the file's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RotaryFrequencies:
    """The rotary frequencies a model file holds."""

    pairs: int
    """Channel pairs rotated per head (:math:`d / 2`)."""
    geometric: bool
    """The frequencies fall geometrically from 1 (plain RoPE); ``False``: a scaled variant."""
    base: float | None
    """:math:`b` (``None`` unless ``geometric``)."""
    llama3: Llama3Scaling | None = None
    """Not ``geometric``: the Llama 3.1 scaling of a geometric series that reproduces the frequencies to float32
    rounding (:func:`_llama3_fit`), or ``None`` when none does."""
    yarn: YarnScaling | None = None
    """Not ``geometric`` nor Llama 3.1's: the YaRN scaling of a geometric series that reproduces the frequencies
    (:func:`_yarn_fit`), or ``None`` when none does."""


@dataclass(frozen=True, slots=True, kw_only=True)
class YarnScaling:
    r"""YaRN's scaling of a geometric rotary series (Peng et al. 2023, "YaRN", arXiv:2309.00071; transformers'
    ``_compute_yarn_parameters``, megatron-core 0.16.1 ``YarnRotaryEmbedding.get_emb``): channel pair :math:`i` of
    :math:`n` turns at :math:`\theta_i (1 - r_i) + (\theta_i / f) r_i`, with :math:`\theta_i = b^{-i/n}` and the
    ramp :math:`r_i = \operatorname{clamp}((i - l) / (h - l), 0, 1)`. The bounds :math:`l, h` come from
    ``beta_fast``, ``beta_slow`` and the original length through :math:`d \ln(L / (2\pi\beta)) / (2 \ln b)`
    (floored and ceiled unless transformers' ``truncate`` is false, GPT-OSS's), so only they show in the
    frequencies; the attention factor (``mscale``) scales cos and sin, not the frequencies."""

    base: float
    """:math:`b` of the geometric series before scaling."""
    factor: float
    """:math:`f`: the low frequencies are divided by it."""
    ramp: tuple[float, float] | None
    """``(l, h)``: the channel pairs (0-based) where the ramp starts and ends; ``None`` when fewer than two pairs
    are interpolated, so the frequencies do not fix them."""


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
    if not geometric:
        llama3 = _llama3_fit(values)
        return RotaryFrequencies(pairs=len(values), geometric=False, base=None, llama3=llama3,
                                 yarn=None if llama3 is not None else _yarn_fit(values))
    # log theta_i = -(i / n) log b: the slope over every frequency (one fp32 value raised to the n-th
    # power would carry its rounding n times)
    slope = np.polyfit(np.arange(len(values)), np.log(values), 1)[0]
    base = float(np.exp(-slope * len(values))) if geometric else None
    if base is not None and abs(base - round(base)) <= 1e-3 * base:
        base = float(round(base))  # fp32 frequencies: 499999.97 is 500,000
    return RotaryFrequencies(pairs=len(values), geometric=geometric, base=base)


def llama3_scaled(base: float, pairs: int, scaling: tuple[float, float, float, int]) -> np.ndarray:
    """The ``pairs`` frequencies :math:`b^{-2i/d}` scaled as Llama 3.1 (``scaling``: factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings), in float64: Meta's ``apply_scaling``, as transformers'
    ``_compute_llama3_parameters`` writes it.

    >>> out = llama3_scaled(500000.0, 32, (8.0, 1.0, 4.0, 8192))
    >>> float(out[0]), round(float(out[-1] * 8 / 500000.0 ** (-31 / 32)), 12)
    (1.0, 1.0)
    """
    factor, low, high, original = scaling
    theta = base ** (-np.arange(pairs) / pairs)
    wavelength = 2 * np.pi / theta
    smooth = (original / wavelength - low) / (high - low)
    medium = (1 - smooth) * theta / factor + smooth * theta
    return np.where(wavelength < original / high, theta, np.where(wavelength > original / low, theta / factor, medium))


def _matches(values: np.ndarray, base: float, scaling: tuple[float, float, float, int]) -> bool:
    return bool(np.allclose(llama3_scaled(base, len(values), scaling), values, rtol=2e-5, atol=0.0))


def _tidy(x: float) -> float:
    """``x`` rounded to 4 significant digits (``8.00002`` read from float32 is 8)."""
    return float(f"{x:.4g}")


def _llama3_fit(values: np.ndarray) -> Llama3Scaling | None:
    """The Llama 3.1 scaling of a geometric series that gives ``values``, or ``None``. The leading frequencies
    (short wavelengths) are the series itself, the trailing ones it over ``factor``: the first run of equal
    ratios gives the base, the last value the factor. Tried first: the published low/high factors and
    original length (:data:`LLAMA3_DEFAULTS`); else the wavelength bounds the interpolated frequencies give
    (:func:`_bounds`), written with ``low_freq_factor`` 1. Any answer reproduces ``values`` (:func:`_matches`)."""
    n, ratios = len(values), values[1:] / values[:-1]
    same = np.isclose(ratios, ratios[0], rtol=1e-4)
    if same.all():
        return None
    lead = int(np.argmin(same)) + 1  # values[:lead] fall geometrically
    slope = np.polyfit(np.arange(lead), np.log(values[:lead]), 1)[0] if lead > 2 else np.log(ratios[0])
    base = float(np.exp(-slope * n))
    if abs(base - round(base)) <= 1e-3 * base:
        base = float(round(base))
    factor = _tidy(float(base ** (-(n - 1) / n) / values[-1]))
    if factor <= 1.0:
        return None
    low, high, original = LLAMA3_DEFAULTS
    if _matches(values, base, (factor, low, high, int(original))):
        return Llama3Scaling(base=base, factor=factor, low_freq_factor=low, high_freq_factor=high,
                             original_max_position_embeddings=int(original))
    bounds = _bounds(values, base, factor)
    if bounds is None:
        return None
    longest, shortest = bounds  # original / low_freq_factor and original / high_freq_factor
    for original, high in ((int(round(longest)), _tidy(longest / shortest)), (int(round(longest)), longest / shortest)):
        if _matches(values, base, (factor, 1.0, high, original)):
            return Llama3Scaling(base=base, factor=factor, low_freq_factor=1.0, high_freq_factor=high,
                                 original_max_position_embeddings=original)
    return None


def yarn_scaled(base: float, pairs: int, factor: float, ramp: tuple[float, float]) -> np.ndarray:
    """The ``pairs`` frequencies :math:`b^{-2i/d}` scaled as YaRN (:class:`YarnScaling`) with ramp bounds ``ramp``,
    in float64 (a ramp of zero width is widened by 0.001, as transformers and megatron-core do).

    >>> out = yarn_scaled(150000.0, 8, 32.0, (2.0, 5.0))
    >>> [round(float(out[i] / 150000.0 ** (-i / 8)), 4) for i in range(8)]
    [1.0, 1.0, 1.0, 0.6771, 0.3542, 0.0312, 0.0312, 0.0312]
    """
    low, high = ramp
    theta = base ** (-np.arange(pairs) / pairs)
    rising = np.clip((np.arange(pairs) - low) / (high - low if high != low else 0.001), 0.0, 1.0)
    return theta * (1 - rising) + theta / factor * rising


def _yarn_fit(values: np.ndarray) -> YarnScaling | None:
    """The YaRN scaling of a geometric series that gives ``values``, or ``None``: the leading run of equal ratios
    gives the base, the last value the factor, and the interpolated pairs, whose ramp is linear in the pair's
    index, its bounds (two or more of them; with fewer the ramp is left unread and the kept and divided pairs are
    checked alone). The answer reproduces ``values`` to float32 rounding."""
    n, ratios = len(values), values[1:] / values[:-1]
    same = np.isclose(ratios, ratios[0], rtol=1e-4)
    if same.all() or not same[0]:
        return None
    lead = int(np.argmin(same)) + 1
    slope = np.polyfit(np.arange(lead), np.log(values[:lead]), 1)[0] if lead > 2 else np.log(ratios[0])
    base = float(np.exp(-slope * n))
    if abs(base - round(base)) <= 1e-3 * base:
        base = float(round(base))
    theta = base ** (-np.arange(n) / n)
    factor = _tidy(float(theta[-1] / values[-1]))
    if factor <= 1.0:
        return None
    rising = 1 - (values / theta - 1 / factor) / (1 - 1 / factor)  # the ramp r_i
    medium = np.flatnonzero((rising > 1e-4) & (rising < 1 - 1e-4))
    if medium.size < 2:
        ends = np.isclose(rising, 0.0, atol=1e-4) | np.isclose(rising, 1.0, atol=1e-4)
        return YarnScaling(base=base, factor=factor, ramp=None) if ends.sum() >= n - medium.size else None
    step, start = np.polyfit(medium, rising[medium], 1)
    if step <= 0:
        return None
    ramp = (float(-start / step), float((1 - start) / step))
    if not np.allclose(yarn_scaled(base, n, factor, ramp), values, rtol=2e-5, atol=0.0):
        return None
    return YarnScaling(base=base, factor=factor, ramp=ramp)


def _bounds(values: np.ndarray, base: float, factor: float) -> tuple[float, float] | None:
    """``(L, H)``, the wavelengths over which frequencies are divided by ``factor`` and under which they are
    kept. Between them :math:`s = (v/\\theta - 1/f) / (1 - 1/f)` is :math:`(L/w - 1) / (L/H - 1)`, linear in
    :math:`1/w`: two interpolated frequencies give both bounds; one gives H once L is put midway (in log) to the
    next wavelength; none puts both inside the gap between the last kept and the first divided one."""
    n = len(values)
    theta = base ** (-np.arange(n) / n)
    wavelength = 2 * np.pi / theta
    kept, divided = np.isclose(values, theta, rtol=2e-5), np.isclose(values, theta / factor, rtol=2e-5)
    medium = np.flatnonzero(~kept & ~divided)
    if medium.size >= 2:
        s = (values[medium] / theta[medium] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(1 / wavelength[medium], s, 1)  # s = (L / w - 1) / (L / H - 1)
        if intercept >= 0 or slope <= 0:
            return None
        longest = slope / -intercept
        return longest, longest / (1 - 1 / intercept)
    if medium.size == 1:
        i = int(medium[0])
        if i + 1 >= n:
            return None
        longest = float(np.sqrt(wavelength[i] * wavelength[i + 1]))
        s = (values[i] / theta[i] - 1 / factor) / (1 - 1 / factor)
        return longest, longest / (1 + (longest / wavelength[i] - 1) / s)
    last_kept = int(np.flatnonzero(kept)[-1]) if kept.any() else -1
    if last_kept < 0 or last_kept + 1 >= n or not divided[last_kept + 1:].all():
        return None
    w0, w1 = wavelength[last_kept], wavelength[last_kept + 1]
    return float(w0 * (w1 / w0) ** (2 / 3)), float(w0 * (w1 / w0) ** (1 / 3))


LayerRotation = Literal["both", "none", "query", "key"]
"""What one attention layer rotates: its queries and keys, neither (a NoPE layer), or only one of them."""


@per_reading
def _written_rotations(facts: OnnxFacts) -> frozenset[str]:
    """Names of the ``Sub`` nodes of rotations written out, :math:`x_1 c - x_2 s` beside :math:`x_2 c + x_1 s`:
    a ``Sub`` of two ``Mul`` s, ``{x1, c}`` and ``{x2, s}``, and an ``Add`` of two ``Mul`` s reading
    ``{x2, c}`` and ``{x1, s}`` (either order). A LayerNorm's ``x - mean`` subtracts no product; a difference of
    two products with no crossed sum beside it (a gate, a residual) is no rotation."""
    def products(node: onnx.NodeProto) -> tuple[frozenset[str], frozenset[str]] | None:
        ins = [facts.producer.get(name) for name in node.input]
        if len(ins) != 2 or any(m is None or m.op_type != "Mul" or len(set(m.input)) != 2 for m in ins):
            return None
        return frozenset(ins[0].input), frozenset(ins[1].input)

    sums = {frozenset(pair) for node in facts.nodes if node.op_type == "Add" and (pair := products(node))}
    found = set()
    for node in facts.nodes:
        pair = products(node) if node.op_type == "Sub" else None
        if pair is None:
            continue
        (first, cos), (second, sin) = tuple(pair[0]), tuple(pair[1])
        for x1, c in ((first, cos), (cos, first)):
            for x2, s in ((second, sin), (sin, second)):
                if frozenset((frozenset((x2, c)), frozenset((x1, s)))) in sums:
                    found.add(node.name)
    return frozenset(found)


def rotated_layers(graph: "OpGraph", attention: tuple) -> tuple[LayerRotation, ...]:
    """Per attention block (:class:`importers.transformer.AttentionBlock`, in layer order), whether the ops
    between its Q (K) projection and its score product rotate it: a ``Neg`` and a ``Mul`` among the fused
    nodes of its glue on that path, or the ``Sub`` of a rotation written out (:func:`_written_rotations`, read
    from the model file; module docstring)."""
    if not attention:
        return ()
    path = graph.source_path
    written = (_written_rotations(path, getattr(graph, "source_sha256", ""))
               if path and Path(path).is_file() else frozenset())
    producers: dict[tuple[int, str], list[int]] = {}
    for edge in graph.edges:
        producers.setdefault((edge.consumer, edge.tensor), []).append(edge.producer)
    inputs_of: dict[int, list[int]] = {}
    for (consumer, _), ops in producers.items():
        inputs_of.setdefault(consumer, []).extend(ops)
    out: list[LayerRotation] = []
    for block in attention:
        acts = [a for a in graph.ops[block.score].inputs if not is_parameter(graph, a.tensor)]
        if len(acts) < 2:
            out.append("none")
            continue
        turned = [_path_rotates(graph, block, producers.get((block.score, side.tensor), []), inputs_of, stop, written)
                  for side, stop in ((acts[0], block.q_proj), (acts[1], block.k_proj))]
        out.append({(True, True): "both", (True, False): "query", (False, True): "key"}.get(tuple(turned), "none"))
    return tuple(out)


def _path_rotates(graph: "OpGraph", block, starts: list[int], inputs_of: dict[int, list[int]], stop: tuple,
                  written: frozenset[str]) -> bool:
    """Whether the glue ops reached back from ``starts`` (up to the projections ``stop``) negate and multiply,
    or hold a rotation written out (``written``: its ``Sub`` nodes' names)."""
    reached = [graph.ops[i] for i in _glue_ops(block, starts, inputs_of, stop)]
    if any(written.intersection(op.onnx_nodes) for op in reached):
        return True
    return {"Neg", "Mul"} <= {kind for op in reached for kind in op.node_types}


RotaryPairs = Literal["halves", "interleaved", "mixed", "unknown"]
"""Which channels one attention layer's rotation pairs (:func:`rotary_pairs`): ``halves`` :math:`(i, i + d/2)`
(Llama's ``rotate_half``), ``interleaved`` :math:`(2i, 2i + 1)` (GPT-J, ERNIE-4.5, Megatron-LM's
``--rotary-interleaved``), ``mixed`` the query and key sides differ, ``unknown`` not read (no rotation, no file, or a
rotation written out, :func:`_written_rotations`)."""


def _neg_pairs(facts: OnnxFacts, neg: onnx.NodeProto) -> str:
    """``halves``, ``interleaved`` or ``unknown`` for one ``rotate_half`` ``Neg`` (module docstring): the step of the
    ``Slice`` it reads where the file holds it, else what reads it: a ``Concat`` (halves), or an ``Unsqueeze`` into a
    ``Concat`` that a ``Reshape`` reads (a stack of the two halves, flattened: interleaved)."""
    source = facts.producer.get(neg.input[0]) if neg.input else None
    if source is not None and source.op_type == "Slice" and len(source.input) > 4 and source.input[4]:
        step = _small_ints(facts, source.input[4])
        if step is not None and len(step) == 1 and abs(step[0]) in (1, 2):
            return "interleaved" if abs(step[0]) == 2 else "halves"
    readers = facts.readers.get(neg.output[0], [])
    if len(readers) != 1:
        return "unknown"
    reader = readers[0]
    if reader.op_type == "Concat":
        return "halves"
    if reader.op_type == "Unsqueeze":
        stacked = facts.readers.get(reader.output[0], [])
        if len(stacked) == 1 and stacked[0].op_type == "Concat" and any(
                r.op_type == "Reshape" for r in facts.readers.get(stacked[0].output[0], [])):
            return "interleaved"
    return "unknown"


def _small_ints(facts: OnnxFacts, name: str) -> list[int] | None:
    """The values of a small integer constant ``name`` (an initializer with its data, or a ``Constant`` node), or
    ``None`` when the file does not hold them."""
    for tensor in facts.initializers:
        if tensor.name == name:
            if tensor.external_data or tensor.data_location == onnx.TensorProto.EXTERNAL:
                return None
            return [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]
    node = facts.producer.get(name)
    if node is not None and node.op_type == "Constant":
        for attribute in node.attribute:
            if attribute.name == "value":
                return [int(v) for v in numpy_helper.to_array(attribute.t).reshape(-1)]
    return None


@per_reading
def _negs_pairs(facts: OnnxFacts) -> dict[str, str]:
    """``Neg`` node name -> :func:`_neg_pairs` of every ``Neg`` of the file."""
    return {node.name: _neg_pairs(facts, node) for node in facts.nodes if node.op_type == "Neg"}


def rotary_pairs(graph: "OpGraph", attention: tuple) -> tuple[RotaryPairs, ...]:
    """Per attention block (:class:`importers.transformer.AttentionBlock`, in layer order), which channels the
    rotation on its query and key paths pairs (:data:`RotaryPairs`), read from the ``Neg`` nodes of the glue ops
    between each projection and the score product (module docstring). ``unknown`` throughout without the file."""
    path = graph.source_path
    if not attention or not path or not Path(path).is_file():
        return ("unknown",) * len(attention)
    negs = _negs_pairs(path, getattr(graph, "source_sha256", ""))
    producers, inputs_of = _producer_tables(graph)
    out: list[RotaryPairs] = []
    for block in attention:
        acts = [a for a in graph.ops[block.score].inputs if not is_parameter(graph, a.tensor)][:2]
        found = set()
        for side, stop in zip(acts, (block.q_proj, block.k_proj)):
            ops = _glue_ops(block, producers.get((block.score, side.tensor), []), inputs_of, stop)
            found |= {negs[n] for i in ops for n in graph.ops[i].onnx_nodes if n in negs}
        found.discard("unknown")
        out.append(found.pop() if len(found) == 1 else "mixed" if found else "unknown")
    return tuple(out)


def _producer_tables(graph: "OpGraph") -> tuple[dict[tuple[int, str], list[int]], dict[int, list[int]]]:
    """``((consumer, tensor) -> producers, consumer -> producers)`` of the graph's edges."""
    producers: dict[tuple[int, str], list[int]] = {}
    inputs_of: dict[int, list[int]] = {}
    for edge in graph.edges:
        producers.setdefault((edge.consumer, edge.tensor), []).append(edge.producer)
        inputs_of.setdefault(edge.consumer, []).append(edge.producer)
    return producers, inputs_of


def _glue_ops(block, starts: list[int], inputs_of: dict[int, list[int]], stop: tuple) -> list[int]:
    """The glue ops of ``block`` reached back from ``starts``, stopping at the ops ``stop`` (the projections)."""
    seen: dict[int, None] = {}  # in the order reached
    frontier = list(starts)
    while frontier:
        i = frontier.pop()
        if i in seen or i in stop or i not in block.glue:
            continue
        seen[i] = None
        frontier.extend(inputs_of.get(i, ()))
    return list(seen)


QkNormPlace = Literal["none", "before-rotary", "after-rotary"]
"""Where one attention layer's QK-norm sits: ``before-rotary`` (normalise, then rotate: Qwen3, OLMo-2, Gemma-3;
megatron-core 0.16.1's ``q_layernorm`` in ``get_query_key_value_tensors`` before ``forward`` rotates, torchtitan
0.3.0's ``GQAttention.forward``), ``after-rotary`` (rotate, then normalise: HunYuan-V1), or ``none`` (no QK-norm,
or no rotation on its path)."""


def qk_norm_places(graph: "OpGraph", attention: tuple) -> tuple[QkNormPlace, ...]:
    """Per attention block (:class:`importers.transformer.AttentionBlock`, in layer order), where its QK-norms sit
    relative to its rotary embedding, read from the graph (module docstring): ``after-rotary`` when on the query or
    the key side the glue ops between the projection and the norm rotate (the norm reads the rotated tensor),
    ``before-rotary`` when those between the norm and the score product do (the rotation reads the normed one),
    ``none`` when neither side has a norm that a rotation precedes or follows."""
    if not attention:
        return ()
    path = graph.source_path
    written = (_written_rotations(path, getattr(graph, "source_sha256", ""))
               if path and Path(path).is_file() else frozenset())
    inputs_of: dict[int, list[int]] = {}
    side_inputs: dict[tuple[int, str], list[int]] = {}
    for edge in graph.edges:
        inputs_of.setdefault(edge.consumer, []).append(edge.producer)
        side_inputs.setdefault((edge.consumer, edge.tensor), []).append(edge.producer)
    out: list[QkNormPlace] = []
    for block in attention:
        acts = [a for a in graph.ops[block.score].inputs if not is_parameter(graph, a.tensor)][:2]
        places = {_side_place(graph, block, side_inputs.get((block.score, side.tensor), []), inputs_of, proj, written)
                  for side, proj in zip(acts, (block.q_proj, block.k_proj))}
        out.append("after-rotary" if "after-rotary" in places else
                   "before-rotary" if "before-rotary" in places else "none")
    return tuple(out)


def _side_place(graph: "OpGraph", block, starts: list[int], inputs_of: dict[int, list[int]], proj: tuple,
                written: frozenset[str]) -> QkNormPlace:
    """:data:`QkNormPlace` of one side (query or key) of ``block``: its norms are the glue ops of kind ``norm``
    reached back from ``starts`` (the score product's producers on that side) before the projections ``proj``."""
    norms, seen, frontier = [], set(), list(starts)
    while frontier:
        i = frontier.pop()
        if i in seen or i in proj or i not in block.glue:
            continue
        seen.add(i)
        if graph.ops[i].kind == "norm":
            norms.append(i)
            continue
        frontier.extend(inputs_of.get(i, ()))
    if not norms:
        return "none"
    upstream = [p for n in norms for p in inputs_of.get(n, ())]
    if _path_rotates(graph, block, upstream, inputs_of, tuple(proj), written):
        return "after-rotary"
    if _path_rotates(graph, block, starts, inputs_of, tuple(proj) + tuple(norms), written):
        return "before-rotary"
    return "none"
