"""Gated short convolutions that mix tokens in place of attention (LFM2's ``Lfm2ShortConv``), told from MLPs.

transformers 5.24's ``Lfm2ShortConv`` (``modeling_lfm2.py``, ``slow_forward``) maps the normed stream by
``in_proj`` (hidden -> 3 x hidden), splits it into ``B, C, x``, convolves ``B * x`` along the sequence with a
depthwise causal ``Conv1d`` (kernel ``conv_L_cache``), multiplies that by ``C`` and maps it back by ``out_proj``
(hidden -> hidden). Read back from ``out_proj``, the product ``C * conv(...)`` reaches ``in_proj`` through ``C``
alone (the walk stops at the conv), so the MLP reader (:func:`importers.transformer._find_mlps`: a linear writing
the hidden size whose inputs come from linears reading it) takes the pair for an MLP of FFN ``hidden``; LFM2's
round-3 file read "1 attention blocks but 5 MLP blocks" (3 MLPs and the 2 convolutions' projections) and an FFN
size of 64 (the first block, a convolution's) where the config's is 128.

A block whose glue (the elementwise and layout ops between its linears) reads the output of a convolution that is
itself computed from the block's first linear is such a mixer: an MLP maps each token on its own, and no
convolution sits between its linears. SegFormer's Mix-FFN (fc1, a depthwise conv, GELU, fc2) reaches fc1 only
through its conv, so the MLP reader never takes it for an MLP (:func:`importers.transformer._conv_inside_mlp`
names it). A Mamba mixer (``in_proj``, a depthwise conv then SiLU and the scan, times the gate ``z``, ``out_proj``)
has the same shape and is left as it was read: :func:`importers.mamba_mixer.mamba_mixers` finds its conv by the SiLU
after it, and the refusals name it in a clause of their own (Jamba's and Falcon-H1's files, the only other fixtures
in ``tests/`` where such a block is found, read as before).
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence, TypeVar

from importers.graph_walk import walk
from importers.mamba_mixer import mamba_mixers
from planner.core.graph import OpGraph

__all__ = ["without_conv_mixers"]


class _Block(Protocol):
    """What is read of an MLP block (:class:`importers.transformer.MlpBlock`)."""

    fc1: tuple[int, ...]
    fc2: int
    glue: frozenset[int]


class _Walks(Protocol):
    """What is read of the structure walker (:class:`importers.transformer._Walker`)."""

    graph: OpGraph

    def back(self, i: int) -> Iterable[int]: ...

    def param_matmul_stop(self, i: int) -> str | None: ...


Block = TypeVar("Block", bound=_Block)


def without_conv_mixers(walker: _Walks, mlps: Sequence[Block], irregular: list[str]) -> list[Block]:
    """``mlps`` less the gated short convolutions among them (module docstring); when there are any, one clause in
    ``irregular`` says how many and names the first one's output linear."""
    mamba = frozenset(mamba_mixers(walker.graph))  # said by their own clause, and read as before
    mixers = [m for m in mlps if _conv_fed_by_fc1(walker, m, mamba)]
    if mixers:
        irregular.append(
            f"{len(mixers)} gated short convolution(s) mixing tokens in place of attention, e.g. the one ending at "
            f"{walker.graph.ops[mixers[0].fc2].name} (LFM2's: a linear to 3 x hidden split into B, C, x, a depthwise "
            "conv of B * x along the sequence, times C, a linear back), read as no MLP")
    return [m for m in mlps if m not in mixers]


def _conv_fed_by_fc1(walker: _Walks, block: _Block, mamba: frozenset[int]) -> bool:
    """Whether an op of ``block``'s glue reads a convolution computed from the block's first linear(s), other than a
    Mamba mixer's (``mamba``: :func:`importers.mamba_mixer.mamba_mixers`)."""
    ops = walker.graph.ops
    convs = {p for g in block.glue for p in walker.back(g) if ops[p].kind == "conv" and p not in mamba}
    return any(_linears_behind(walker, c) & set(block.fc1) for c in convs)


def _linears_behind(walker: _Walks, op: int) -> set[int]:
    """The parameter matmuls reached back from ``op``'s inputs through ops that are no barrier (elementwise and
    layout ops), as the MLP reader walks."""
    return walk(walker.back(op), walker.back, walker.param_matmul_stop)[0]
