"""A strategy: one configuration per op, with what it costs, and its public form.

A configuration row of an op (:class:`~planner.core.configs.ConfigSpace`) is identified by three
things, and the public form of a strategy names all three per op (:func:`public_form`):

* ``splits``: the split factor of each split dim;
* ``inter_splits``: the part of each factor that crosses nodes (the placement, on 2+ nodes);
* ``replicas``: the redundant copies of the op's shard computation (a cheap op run on every rank of
  its group, as Megatron-LM runs a LayerNorm on every tensor-parallel rank).

The copies' own placement is not a fourth part: copies take the innermost places (the fewest nodes
crossed, :mod:`planner.core.configs`), so the three identify the row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

if TYPE_CHECKING:
    from planner.core.configs import ConfigSpace

__all__ = ["MemoryBreakdown", "TimeBreakdown", "Strategy", "OpLayout", "PublicForm", "public_form", "layout_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Memory per device (bytes), by component."""

    params_bytes: float = 0.0
    grads_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    activations_bytes: float = 0.0
    other_bytes: float = 0.0
    """The caching allocator's reserve over the live tensors: fragmentation, workspaces, transient buffers
    (``objectives.memory.OTHER_FRACTION``; shown as ``allocator_reserve``)."""
    graph_buffers_bytes: float = 0.0
    """Static buffers of per-layer CUDA graphs (Transformer Engine's, under Megatron-LM's ``--cuda-graph-impl
    transformer_engine``: ``objectives.cuda_graph_memory``; shown as ``cuda_graph_buffers``); 0 without them."""
    nccl_bytes: float = 0.0
    """NCCL's communicator buffers, which NCCL allocates itself, outside PyTorch's caching allocator
    (``objectives.nccl_memory.layout_buffer_bytes``; shown as ``nccl_buffers``); 0 on one device."""

    @property
    def total_bytes(self) -> float:
        return (
            self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.other_bytes
            + self.graph_buffers_bytes
            + self.nccl_bytes
        )

    @property
    def allocator_bytes(self) -> float:
        """What PyTorch's caching allocator holds at the peak (``torch.cuda.max_memory_reserved``): the
        total less NCCL's buffers, which are outside it."""
        return self.total_bytes - self.nccl_bytes

    @property
    def allocated_bytes(self) -> float:
        """The live tensors' peak (``torch.cuda.max_memory_allocated``): the total less the allocator's
        reserve and NCCL's buffers (outside the allocator)."""
        return self.total_bytes - self.other_bytes - self.nccl_bytes

    @property
    def needed_bytes(self) -> float:
        """What the device must hold for the run to start and not run out of memory: the live tensors
        and NCCL's buffers. On a failed ``cudaMalloc`` the allocator frees its unused cached segments and
        retries (``objectives.memory``), so the reserve is not needed; NCCL's buffers are."""
        return self.allocated_bytes + self.nccl_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    """Time per step (seconds), by component."""

    compute_s: float = 0.0
    intra_op_comm_s: float = 0.0
    """Collectives inside ops (partial-sum all-reduces, halos, statistics)."""
    redistribution_s: float = 0.0
    """Re-layout of tensors between ops (forward and backward)."""
    grad_sync_s: float = 0.0
    """Gradient all-reduce / reduce-scatter + all-gather of replicated parameters."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.intra_op_comm_s + self.redistribution_s + self.grad_sync_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """One point of the search result."""

    choice: tuple[int, ...]
    """Configuration index per op (rows of each op's ``ConfigSpace``)."""
    time_s: float
    """Time per training step (seconds)."""
    memory_bytes: float
    """Memory per device (bytes)."""
    splits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per op name, ``{dim: factor}`` of its split dims."""
    inter_splits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per op name, ``{dim: inter-node part of its factor}`` where that part is > 1."""
    memory: MemoryBreakdown | None = None
    time: TimeBreakdown | None = None
    replicas: Mapping[str, int] | None = None
    """Per op name that runs as redundant copies, how many (ops not listed run once); ``None``: not
    recorded (a strategy made without its configuration spaces), so ``splits`` may not identify the
    rows. With ``splits`` and ``inter_splits`` the strategy's public form (:func:`public_form`):
    ``planner.plan.evaluate(graph, request, strategy)`` prices it again exactly."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpLayout:
    """One configuration of one op in words: everything that identifies its row."""

    splits: Mapping[str, int] = field(default_factory=dict)
    """``{dim: factor}`` of its split dims (factors > 1)."""
    inter_splits: Mapping[str, int] = field(default_factory=dict)
    """``{dim: the part of its factor across nodes}`` (parts > 1; empty: inside one node)."""
    replicas: int = 1
    """Redundant copies of the shard computation (1: run once)."""

    def __str__(self) -> str:
        words = [", ".join(f"{d}={f}" for d, f in self.splits.items()) or "whole"]
        if self.inter_splits:
            words.append("across nodes " + ", ".join(f"{d}={e}" for d, e in self.inter_splits.items()))
        if self.replicas > 1:
            words.append(f"{self.replicas} copies")
        return "; ".join(words)


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicForm:
    """A strategy's per-op description (:func:`public_form`), as :class:`Strategy` holds it."""

    splits: dict[str, dict[str, int]]
    inter_splits: dict[str, dict[str, int]]
    replicas: dict[str, int]


def layout_of(space: "ConfigSpace", row: int) -> OpLayout:
    """The :class:`OpLayout` of one configuration row.

    Examples
    --------
    >>> from planner.core.graph import IterDim, Op
    >>> from planner.core.configs import ConfigOptions, enumerate_configs
    >>> op = Op(name="ln", kind="norm", op_type="LayerNormalization", inputs=(), outputs=(), flops=1.0,
    ...         dims=(IterDim(name="b", size=8, is_batch=True), IterDim(name="h", size=4)))
    >>> space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=4, replicate=True))
    >>> sorted({str(layout_of(space, r)) for r in range(space.size) if space.factors[r].tolist() == [2, 1]})
    ['b=2', 'b=2; across nodes b=2; 4 copies']
    """
    names = space.dim_names
    return OpLayout(
        splits={n: int(f) for n, f in zip(names, space.factors[row].tolist()) if f > 1},
        inter_splits={n: int(e) for n, e in zip(names, space.inter_factors[row].tolist()) if e > 1},
        replicas=1 if space.replicas is None else int(space.replicas[row]),  # (replica_counts: a whole (K,) of ones)
    )


def public_form(op_names: Sequence[str], spaces: Sequence["ConfigSpace"], choice: Sequence[int]) -> PublicForm:
    """The public form of ``choice`` (one row per op of ``spaces``): per op name its split factors,
    their inter-node parts and its redundant copies, each listed only where not the default (no
    split, inside one node, run once)."""
    splits: dict[str, dict[str, int]] = {}
    inter: dict[str, dict[str, int]] = {}
    replicas: dict[str, int] = {}
    for name, space, row in zip(op_names, spaces, choice):
        layout = layout_of(space, int(row))
        if layout.splits:
            splits[name] = dict(layout.splits)
        if layout.inter_splits:
            inter[name] = dict(layout.inter_splits)
        if layout.replicas > 1:
            replicas[name] = layout.replicas
    return PublicForm(splits=splits, inter_splits=inter, replicas=replicas)
