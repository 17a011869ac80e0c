r"""Recognise the attention cores of an op graph: MatMul(Q K^T) -> [scale, mask, bias] -> Softmax -> [dropout] -> MatMul(. V).

A launcher that runs attention as a fused kernel (FlashAttention-2, PyTorch's
``scaled_dot_product_attention``, Megatron's ``--use-flash-attn`` / TransformerEngine) never writes
the :math:`s_q \times s_k` score matrix to memory: it keeps tiles of it on chip, stores the output
and one log-sum-exp per query row, and recomputes the scores in backward. To price that, the cost
model needs to know which coarse ops form one attention core; this module finds them on the coarse
:class:`~planner.core.graph.OpGraph`, whatever the exporter's style (torch.onnx dynamo with the
scale/mask folded into the score MatMul, TorchScript with a separate mask Add, T5's position-bias
Add, ``nn.MultiheadAttention``'s Gather-split heads).

A core is

* a **score product**: a ``matmul`` op without parameters whose two inputs are activations (or
  graph inputs) and whose output's last two axes are :math:`s_q \times s_k`;
* a ``softmax`` op fed (directly, or through parameter-free ``elementwise`` ops: a scale, a mask
  ``Add``/``Where``, a position bias) by the score product alone on that path;
* a **value product**: a ``matmul`` op without parameters whose first input is the softmax output
  (directly, or through parameter-free ``elementwise`` ops: a dropout, a cast).

A Softmax fed by a product with parameters (a mixture-of-experts router: ``Gemm`` -> Softmax ->
TopK) is not attention and is left out. So is one whose scores add other products of activations
(DeBERTa's disentangled attention: the query and the key times projected relative-position embeddings,
gathered per key, :mod:`importers.attention_terms`): no fused kernel computes such terms (FlashAttention
and Megatron-Core's attention take no score bias; an SDPA kernel could only take them as a materialised
bias), and Hugging Face's DeBERTa runs its attention eagerly (transformers 5.24
``modeling_deberta_v2.py``, ``DisentangledSelfAttention.forward``: ``torch.bmm``, ``masked_fill``,
``softmax``, ``torch.bmm``), so its score matrix is priced as written, whatever the execution model.

Sizes of a core (:class:`AttentionCore`): :math:`n = b \cdot h` the product of the score tensor's
leading axes, :math:`s_q, s_k` its last two, :math:`d` the score product's reduction size (the head
dim of Q and K) and :math:`d_v` the value product's output elements per (sample, head, query row)
(its last axis, or ``hidden / h`` where an export writes the heads merged).

Causal masking (:attr:`AttentionCore.mask`, from :attr:`planner.core.graph.OpGraph.attention_masks`):
a fused kernel with a causal mask skips every tile of the score matrix above the diagonal
(FlashAttention-2, Dao 2023, section 3.1 "Causal masking": "for blocks where all the column indices
are more than the row indices ... we can skip the computation of that block", about 1.7-1.8x faster;
PyTorch's ``scaled_dot_product_attention(is_causal=True)`` runs the same flash or memory-efficient
kernels; TransformerEngine / cuDNN fused attention with ``causal`` masks likewise). The kernel still
computes every tile the diagonal crosses in full and masks it, so the work done is the tiles it visits:
:func:`causal_tile_fraction` of the :math:`\lceil s_q/B_r\rceil \lceil s_k/B_c\rceil` tiles,
:math:`(n+1)/2n` for :math:`s_q = s_k = s` and :math:`n = s/B_r` row blocks (0.5 in the long-sequence limit).
:attr:`AttentionCore.flash_work` is that fraction for a causal core, 1 for a bidirectional or unknown
one; an explicit (eager) implementation writes the whole masked score matrix and pays it all.

Sliding windows (:attr:`AttentionCore.window`, from :attr:`planner.core.graph.OpGraph.attention_windows`:
Mistral, Gemma-2/3's local layers): a causal core whose query sees only its last :math:`W` keys is a band
of the grid, :math:`W (2 s - W + 1) / 2` of its :math:`s^2` scores for :math:`W \le s` (query
:math:`i` sees :math:`\min(i + 1, W)` keys), about :math:`W / s` at long sequences. FlashAttention-2's
local attention (``flash_attn_func(..., window_size=(W - 1, 0))``, flash-attn >= 2.3; megatron-core
passes ``TransformerConfig.window_size`` to TransformerEngine, whose flash backend calls it) skips the
tiles left of the band as it skips those above the diagonal: its forward kernel starts row block
:math:`m` at key block :math:`\lfloor (m B_r + s_k - s_q - W + 1) / B_c \rfloor`
(``n_block_min`` in ``csrc/flash_attn/src/flash_fwd_kernel.h``, ``Is_local``), so
:func:`causal_tile_fraction` with ``window`` counts the tiles the band crosses. An explicit
implementation still writes all :math:`s^2` scores.

Two-sided windows (:attr:`AttentionCore.band`, from :attr:`planner.core.graph.OpGraph.attention_bands`: an
encoder's local attention, ModernBERT's): query :math:`i` sees the keys :math:`|i - k| \le w`, so the
:math:`s \times s` grid holds :math:`s (2 w + 1) - w (w + 1)` visible scores for :math:`2 w + 1 \le s` (the
band's :math:`2 w + 1` diagonals less the two corner triangles of :math:`w (w + 1) / 2` each), Longformer's
:math:`O(s \cdot w)` (Beltagy et al. 2020, arXiv:2004.05150, section 3.1). FlashAttention-2's local attention
with ``window_size=(w, w)`` (transformers' ``_flash_attention_forward`` passes ``(sliding_window - 1,
sliding_window - 1)`` and ModernBERT's ``sliding_window`` is :math:`w + 1`) starts row block :math:`m` at key
block :math:`\lfloor (m B_r + s_k - s_q - w) / B_c \rfloor` and ends it at
:math:`\lceil ((m + 1) B_r + s_k - s_q + w) / B_c \rceil` (``n_block_min`` / ``n_block_max``, ``Is_local``), so
:func:`band_tile_fraction` counts the tiles the band crosses, whatever the softmax's
:data:`~planner.core.graph.AttentionMask` reads (a band is no causal triangle; its mask reads ``unknown``). Its
memory is flash's (the output and one log-sum-exp per row, no scores); an explicit implementation still
writes and computes all :math:`s^2` scores (transformers' eager and SDPA-with-mask paths do).

Masks built for the cores (:func:`mask_ops`, role ``mask``): transformers 5's decoders compute a
``[b, 1, s_q, s_k]`` mask from ``attention_mask`` and the positions (a gather at ``arange(batch)``, a
comparison for causality, a ``Where`` per layer to an additive bias) and add it to each score product.
A launcher that runs flash attention builds none: Megatron-LM and torchtitan pass the mask type
(``causal``) to the kernel, which skips or masks tiles from indices. Such an op reads no parameter,
directly or through its producers, and only the cores (or other such ops) read its outputs, a score
product reading it on the whole ``s_q x s_k`` grid (:func:`grid_inputs`). Under flash it is priced at
nothing and the score product does not read it; an explicit implementation builds and reads it.

This module is pure: it reads the graph and returns indices; it prices nothing
(:mod:`objectives.compute` and :mod:`objectives.memory` do, under an
:class:`objectives.execution.ExecutionModel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from planner.core.graph import AttentionMask, Op, OpGraph, Tensor

__all__ = ["AttentionCore", "FlashShape", "FLASH_TILES", "band_tile_fraction", "causal_tile_fraction", "find_attention_cores", "attention_roles", "mask_ops",
           "grid_inputs"]

FLASH_TILES: tuple[tuple[int, tuple[int, int]], ...] = ((64, (128, 128)), (1 << 30, (128, 64)))
"""``((max head dim, (B_r, B_c)), ...)``: the query x key tile of FlashAttention-2's forward kernel on
A100 and H100 (sm80 / sm90, no dropout) by head dim: 128 x 128 up to 64, 128 x 64 above
(``csrc/flash_attn/src/flash_fwd_launch_template.h``, ``run_mha_fwd_hdim64`` / ``hdim128`` / ``hdim192``
/ ``hdim256``; the smaller sm86/sm89 tiles and the backward's own tiles are not told apart: the
fraction moves by a few points at 1-2k tokens and not at all at long sequences)."""

_MAX_BETWEEN = 4
"""Parameter-free elementwise ops allowed between the score product and the softmax, and between
the softmax and the value product (scale, mask, bias, cast, dropout: at most 3 in the exports seen)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FlashShape:
    """What a fused kernel's speed depends on, for one attention core (:attr:`AttentionCore.flash_shape`;
    priced by :func:`objectives.flash_rates.flash_efficiencies`)."""

    tiles: float
    """Share of the score tiles the kernel visits (:attr:`AttentionCore.flash_work`)."""
    seq_k: int
    """Keys each query row sweeps (before any context-parallel split)."""
    head_dim: int
    causal: bool
    """A causal core without a sliding window: the kernel skips the tiles above the diagonal."""
    window: int | None = None
    """Keys a query row of a banded core sweeps, where fewer than ``seq_k``: a causal core's sliding window
    :math:`W`, a two-sided one's :math:`2 w + 1`; else ``None``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionCore:
    """One attention core of a graph (op indices into ``OpGraph.ops``, sizes in elements)."""

    score: int
    """The Q K^T product."""
    softmax: int
    value: int
    """The probabilities x V product."""
    between: tuple[int, ...] = ()
    """Parameter-free elementwise ops on the path score -> softmax -> value (scale, mask, dropout)."""
    batch_heads: int
    """``b * h``: product of the score tensor's leading axes."""
    seq_q: int
    seq_k: int
    head_dim: int
    """``d``: the reduction size of the score product."""
    value_dim: int
    """``d_v``: the value product's output elements per (sample, head, query row)."""
    mask: AttentionMask = "unknown"
    """Which keys each query sees (:data:`~planner.core.graph.AttentionMask`), from the graph's
    ``attention_masks`` by the softmax's ONNX nodes."""
    window: int | None = None
    """A causal core's sliding window (tokens: each query sees itself and the ``window - 1`` keys
    before it), from the graph's ``attention_windows``; ``None``: every earlier key."""
    band: int | None = None
    """A two-sided window's half-width :math:`w` (tokens: each query sees the keys within :math:`w` of it on
    either side), from the graph's ``attention_bands``; ``None``: none."""

    @property
    def flash_work(self) -> float:
        """Fraction of the score matrix's tiles a fused (flash) kernel computes: :func:`band_tile_fraction` for a
        two-sided window, :func:`causal_tile_fraction` (within the sliding window, if any) for a causal core, 1
        for a bidirectional or unknown one (module docstring)."""
        if self.band is not None:
            return band_tile_fraction(self.seq_q, self.seq_k, self.head_dim, self.band)
        if self.mask != "causal":
            return 1.0
        return causal_tile_fraction(self.seq_q, self.seq_k, self.head_dim, self.window)

    @property
    def flash_shape(self) -> FlashShape:
        """The core as a fused kernel sees it (:class:`FlashShape`)."""
        if self.band is not None:
            keys = 2 * self.band + 1
            return FlashShape(tiles=self.flash_work, seq_k=self.seq_k, head_dim=self.head_dim, causal=False,
                              window=keys if keys < self.seq_k else None)
        causal = self.mask == "causal"
        # a window no narrower than the keys is the causal triangle itself
        window = self.window if causal and self.window is not None and self.window < self.seq_k else None
        return FlashShape(tiles=self.flash_work, seq_k=self.seq_k, head_dim=self.head_dim,
                          causal=causal and window is None, window=window)

    @property
    def ops(self) -> tuple[int, ...]:
        """Every op of the core, in graph order."""
        return tuple(sorted((self.score, self.softmax, self.value, *self.between)))

    @property
    def score_elements(self) -> int:
        """``b * h * s_q * s_k``: elements of the score matrix an explicit implementation writes."""
        return self.batch_heads * self.seq_q * self.seq_k

    @property
    def flops(self) -> float:
        r"""Forward FLOPs of the two products: :math:`2 n s_q s_k (d + d_v)`."""
        return 2.0 * self.batch_heads * self.seq_q * self.seq_k * (self.head_dim + self.value_dim)


def causal_tile_fraction(seq_q: int, seq_k: int, head_dim: int, window: int | None = None) -> float:
    r"""Fraction of the :math:`\lceil s_q/B_r\rceil \lceil s_k/B_c\rceil` score tiles a causal flash
    kernel computes, with the :data:`FLASH_TILES` tile of ``head_dim``.

    Query row block :math:`i` (rows :math:`[i B_r, (i+1) B_r)`) visits the key blocks up to its last
    visible key, :math:`\lceil \min(s_k, (i+1) B_r + s_k - s_q) / B_c \rceil` of them (the mask
    aligned to the bottom-right corner, as FlashAttention >= 2.1 and PyTorch's ``is_causal`` for
    :math:`s_q = s_k` do); a block with no visible key is skipped. With a sliding ``window`` :math:`W`
    it starts at key block :math:`\lfloor \max(0, i B_r + s_k - s_q - W + 1) / B_c \rfloor`, its
    first row's first visible key (FlashAttention-2's ``n_block_min``, module docstring).

    Examples
    --------
    >>> causal_tile_fraction(1024, 1024, 64)   # 8 x 8 tiles of 128 x 128: (1 + ... + 8) / 64
    0.5625
    >>> causal_tile_fraction(2048, 2048, 128)  # 16 row blocks of 128 x 32 column blocks of 64: 2 (1 + ... + 16) / 512
    0.53125
    >>> round(causal_tile_fraction(65536, 65536, 128), 4)
    0.501
    >>> causal_tile_fraction(1024, 1024, 64, window=256)  # row blocks visit 1, 2, 3, 3, 3, 3, 3, 3 of 8
    0.328125
    """
    if seq_q <= 0 or seq_k <= 0:
        return 1.0
    rows, cols = next(tile for limit, tile in FLASH_TILES if head_dim <= limit)
    return _band_tiles(seq_q, seq_k, rows, cols, window) / (-(-seq_q // rows) * -(-seq_k // cols))


def band_tile_fraction(seq_q: int, seq_k: int, head_dim: int, half_width: int) -> float:
    r"""Fraction of the :math:`\lceil s_q/B_r\rceil \lceil s_k/B_c\rceil` score tiles a flash kernel computes for a
    two-sided window of ``half_width`` :math:`w` (FlashAttention-2's ``window_size=(w, w)``: row block :math:`i`
    visits key blocks :math:`\lfloor \max(0, i B_r + s_k - s_q - w) / B_c \rfloor` to
    :math:`\lceil \min(s_k, (i + 1) B_r + s_k - s_q + w) / B_c \rceil`, module docstring), with the
    :data:`FLASH_TILES` tile of ``head_dim``.

    Examples
    --------
    >>> band_tile_fraction(1024, 1024, 64, 64)  # 8 x 8 tiles of 128 x 128: 2, 3, 3, 3, 3, 3, 3, 2 key blocks per row block
    0.34375
    >>> band_tile_fraction(1024, 1024, 64, 1024)  # wider than the sequence: every tile
    1.0
    """
    if seq_q <= 0 or seq_k <= 0:
        return 1.0
    rows, cols = next(tile for limit, tile in FLASH_TILES if head_dim <= limit)
    return _visited_tiles(seq_q, seq_k, rows, cols, half_width, half_width) / (-(-seq_q // rows) * -(-seq_k // cols))


def _band_tiles(seq_q: int, seq_k: int, rows: int, cols: int, window: int | None) -> int:
    """Tiles of ``rows x cols`` a causal (``window``: sliding) kernel visits (:func:`causal_tile_fraction`);
    with 1 x 1 tiles, the visible scores themselves."""
    return _visited_tiles(seq_q, seq_k, rows, cols, window - 1 if window else None, 0)


def _visited_tiles(seq_q: int, seq_k: int, rows: int, cols: int, left: int | None, right: int | None) -> int:
    """Tiles of ``rows x cols`` a flash kernel visits when query :math:`q` sees the keys from :math:`q - left` to
    :math:`q + right` (bottom-right aligned: shifted by :math:`s_k - s_q`; ``None``: unbounded on that side), as
    FlashAttention-2's ``n_block_min`` / ``n_block_max`` bound them; with 1 x 1 tiles, the visible scores."""
    visited, offset = 0, seq_k - seq_q
    for i in range(-(-seq_q // rows)):
        end = seq_k if right is None else min(seq_k, (i + 1) * rows + offset + right)
        last = -(-max(end, 0) // cols)
        first = max(0, i * rows + offset - left) // cols if left is not None else 0
        visited += max(last - first, 0)
    return visited


def _parameter_free(op: Op, tensors: Mapping[str, Tensor]) -> bool:
    return not any((t := tensors.get(a.tensor)) is not None and t.role == "parameter" for a in op.inputs)


def _float_activation_inputs(op: Op, tensors: Mapping[str, Tensor]) -> list[str]:
    out = []
    for access in op.inputs:
        tensor = tensors.get(access.tensor)
        if tensor is not None and tensor.role in ("activation", "input") and not tensor.dtype.startswith(("int", "uint", "bool")):
            out.append(access.tensor)
    return out


def _is_score_product(op: Op, tensors: Mapping[str, Tensor]) -> bool:
    if op.kind != "matmul" or not _parameter_free(op, tensors) or not op.outputs:
        return False
    out = tensors.get(op.outputs[0].tensor)
    return out is not None and len(out.shape) >= 3 and len(_float_activation_inputs(op, tensors)) >= 2


def _reduction_size(op: Op) -> int:
    size = 1
    for dim in op.dims:
        if dim.kind == "reduction":
            size *= dim.size
    return size


@dataclass(frozen=True, slots=True, kw_only=True)
class _Walk:
    """What the search for attention cores looks up: producers by tensor and consumers by op."""

    graph: OpGraph
    index: Mapping[str, int]
    """Op name -> position in ``graph.ops``."""
    consumers: Mapping[int, list[int]]
    """Op -> the ops that read its outputs (self-edges left out)."""

    @classmethod
    def of(cls, graph: OpGraph) -> _Walk:
        """The lookups of ``graph``."""
        consumers: dict[int, list[int]] = {}
        for edge in graph.edges:
            if edge.producer != edge.consumer:
                consumers.setdefault(edge.producer, []).append(edge.consumer)
        return cls(graph=graph, index={op.name: i for i, op in enumerate(graph.ops)}, consumers=consumers)

    def producer_of(self, tensor_name: str) -> int | None:
        """The op that writes ``tensor_name`` (``None``: a graph input, a constant or unknown)."""
        tensor = self.graph.tensors.get(tensor_name)
        if tensor is None or tensor.producer is None:
            return None
        return self.index.get(tensor.producer)

    def passthrough(self, op: Op) -> bool:
        """An elementwise op without parameters (a scale, a mask, dropout) may sit inside a core."""
        return op.kind == "elementwise" and _parameter_free(op, self.graph.tensors)


def _score_before(walk: _Walk, op: Op) -> tuple[int | None, list[int]]:
    """From softmax ``op`` backwards: the score product feeding it through at most
    ``_MAX_BETWEEN`` parameter-free elementwise ops, and those ops (``(None, ...)``: none found)."""
    graph, tensors = walk.graph, walk.graph.tensors
    producer_of, passthrough = walk.producer_of, walk.passthrough
    # softmax input <- [elementwise]* <- score product (followed along float activations)
    between: list[int] = []
    current = producer_of(op.inputs[0].tensor)
    score = None
    for _ in range(_MAX_BETWEEN + 1):
        if current is None:
            break
        candidate = graph.ops[current]
        if _is_score_product(candidate, tensors):
            score = current
            break
        if not passthrough(candidate):
            break
        between.append(current)
        # the scores flow through the operand shaped like the softmax input; masks and biases
        # are the other operands
        shape = tensors[op.inputs[0].tensor].shape
        nxt = None
        for name in _float_activation_inputs(candidate, tensors):
            source = producer_of(name)
            if source is not None and tensors[name].shape == shape and graph.ops[source].kind in ("matmul", "elementwise"):
                if _is_score_product(graph.ops[source], tensors) or passthrough(graph.ops[source]):
                    nxt = source
                    break
        current = nxt
    return score, between


def _adds_products(walk: _Walk, between: list[int], score: int) -> bool:
    """Whether an op between the score product and the softmax adds another product of activations,
    reached through at most ``_MAX_BETWEEN`` parameter-free ops (DeBERTa's position terms, gathered by
    relative position: module docstring); a mask or a bias from a table is no product."""
    graph, tensors = walk.graph, walk.graph.tensors
    seen, frontier = {score, *between}, list(between)
    for _ in range(_MAX_BETWEEN):
        sources = {walk.producer_of(name) for i in frontier for name in _float_activation_inputs(graph.ops[i], tensors)}
        frontier = []
        for source in sources - seen - {None}:
            seen.add(source)
            if _is_score_product(graph.ops[source], tensors):
                return True
            if graph.ops[source].kind not in ("matmul", "softmax") and _parameter_free(graph.ops[source], tensors):
                frontier.append(source)
    return False


def _value_after(walk: _Walk, s: int, op: Op) -> tuple[int | None, list[int]]:
    """From softmax ``op`` (index ``s``) forwards: the value product that takes the probabilities as
    its first input through at most ``_MAX_BETWEEN`` parameter-free elementwise ops, and those ops."""
    graph, tensors, consumers, passthrough = walk.graph, walk.graph.tensors, walk.consumers, walk.passthrough
    # softmax output -> [elementwise]* -> value product (probabilities as its first input)
    value = None
    frontier = [(s, op.outputs[0].tensor)]
    after: list[int] = []
    for _ in range(_MAX_BETWEEN + 1):
        if not frontier:
            break
        source, tensor_name = frontier.pop()
        for c in consumers.get(source, ()):
            consumer = graph.ops[c]
            names = [a.tensor for a in consumer.inputs]
            if tensor_name not in names:
                continue
            if consumer.kind == "matmul" and _parameter_free(consumer, tensors) and names[0] == tensor_name:
                value = c
                break
            if passthrough(consumer) and consumer.outputs:
                after.append(c)
                frontier.append((c, consumer.outputs[0].tensor))
        if value is not None:
            break
    return value, after


def find_attention_cores(graph: OpGraph) -> tuple[AttentionCore, ...]:
    """Every attention core of ``graph`` (module docstring), in graph order of their softmax.

    Parameters
    ----------
    graph:
        A coarse op graph.

    Returns
    -------
    tuple of AttentionCore
        One per recognised core; a graph without attention gives ``()``.

    Examples
    --------
    >>> from planner.plan import load_graph
    >>> g = load_graph("tests/data/gpt2_tiny.onnx", {"batch": 2, "seq": 16})
    >>> cores = find_attention_cores(g)
    >>> len(cores), cores[0].batch_heads, cores[0].seq_q, cores[0].head_dim
    (2, 8, 16, 16)
    """
    tensors = graph.tensors
    walk = _Walk.of(graph)
    cores = []
    for s, op in enumerate(graph.ops):
        if op.kind != "softmax" or not op.inputs or not op.outputs:
            continue
        score, between = _score_before(walk, op)
        if score is None or _adds_products(walk, between, score):
            continue
        value, after = _value_after(walk, s, op)
        if value is None:
            continue
        scores = tensors[graph.ops[score].outputs[0].tensor].shape
        out = tensors[graph.ops[value].outputs[0].tensor]
        batch_heads = 1
        for size in scores[:-2]:
            batch_heads *= size
        cores.append(
            AttentionCore(
                score=score, softmax=s, value=value, between=tuple(sorted(set(between + after))),
                batch_heads=batch_heads, seq_q=scores[-2], seq_k=scores[-1],
                head_dim=_reduction_size(graph.ops[score]),
                # per (sample, head, query): the output may hold the heads merged (b, s, h * d_v)
                value_dim=out.num_elements // max(batch_heads * scores[-2], 1),
                mask=_mask_of(graph, op),
                window=_window_of(graph, op),
                band=_entry_of(graph.attention_bands, op),
            )
        )
    return tuple(cores)


def _mask_of(graph: OpGraph, softmax: Op) -> AttentionMask:
    """The softmax's entry in ``graph.attention_masks`` (by any ONNX node it stands for), else ``unknown``."""
    for name in softmax.onnx_nodes or (softmax.name,):
        if name in graph.attention_masks:
            return graph.attention_masks[name]
    return "unknown"


def _window_of(graph: OpGraph, softmax: Op) -> int | None:
    """The softmax's entry in ``graph.attention_windows`` (by any ONNX node it stands for), else ``None``."""
    return _entry_of(graph.attention_windows, softmax)


def _entry_of(table: Mapping[str, int], softmax: Op) -> int | None:
    """``table``'s entry for the softmax (by any ONNX node it stands for), else ``None``."""
    return next((table[n] for n in softmax.onnx_nodes or (softmax.name,) if n in table), None)


def attention_roles(graph: OpGraph, cores: tuple[AttentionCore, ...] | None = None) -> dict[int, tuple[str, AttentionCore]]:
    """``{op index: (role, core)}`` with role ``score``, ``softmax``, ``value`` or ``between``.

    Examples
    --------
    >>> from planner.plan import load_graph
    >>> g = load_graph("tests/data/gpt2_tiny.onnx", {"batch": 2, "seq": 16})
    >>> sorted({role for role, _ in attention_roles(g).values()})
    ['score', 'softmax', 'value']
    """
    roles: dict[int, tuple[str, AttentionCore]] = {}
    cores = find_attention_cores(graph) if cores is None else cores
    for core in cores:
        roles[core.score] = ("score", core)
        roles[core.softmax] = ("softmax", core)
        roles[core.value] = ("value", core)
        for i in core.between:
            roles[i] = ("between", core)
    for i, core in mask_ops(graph, cores).items():
        roles[i] = ("mask", core)
    return roles


def grid_inputs(op: Op) -> tuple[int, ...]:
    """Positions of ``op``'s inputs that index both of its output's last two dims (a score product's mask,
    read on the ``s_q x s_k`` grid), not one of them (Q, K)."""
    if not op.outputs or len(op.outputs[0].axes) < 2:
        return ()
    grid = {d for axis in op.outputs[0].axes[-2:] for d in axis}
    return tuple(i for i, access in enumerate(op.inputs)
                 if grid and grid <= {d for axis in access.axes for d in axis})


def mask_ops(graph: OpGraph, cores: tuple[AttentionCore, ...]) -> dict[int, AttentionCore]:
    """``{op index: core}`` of the ops that only build the cores' masks (module docstring): no parameter in
    their lineage, every output some op reads read by a core's op or another such op, and a score product
    reading it on its grid; the core is the first that reads it (or the mask op it feeds)."""
    core_of = {i: core for core in cores for i in core.ops}
    if not core_of:
        return {}
    producer = {e.tensor: e.producer for e in graph.edges}
    readers: dict[int, list[tuple[int, str]]] = {}
    for e in graph.edges:
        readers.setdefault(e.producer, []).append((e.consumer, e.tensor))
    tensors = graph.tensors
    free: list[bool] = []
    for op in graph.ops:  # ops are in graph (topological) order: a producer's answer is known
        free.append(all(getattr(tensors.get(a.tensor), "role", None) != "parameter"
                        and (a.tensor not in producer or producer[a.tensor] < len(free) and free[producer[a.tensor]])
                        for a in op.inputs))
    found: dict[int, AttentionCore] = {}
    for i in reversed(range(len(graph.ops))):
        if i in core_of or not free[i] or not readers.get(i):
            continue
        reads = readers[i]
        if not all(c in core_of or c in found for c, _ in reads):
            continue
        if not all(c in found or any(graph.ops[c].inputs[k].tensor == t for k in grid_inputs(graph.ops[c]))
                   for c, t in reads):
            continue  # a core reads it off the grid (a per-key bias, rotary tables): real work
        first = min(c for c, _ in reads)
        found[i] = core_of[first] if first in core_of else found[first]
    return found
